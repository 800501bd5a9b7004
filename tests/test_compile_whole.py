"""A torch.compile target across modules (`--target torch:compile`): the layers are compared
with each leaf compiled alone, so a block that computes differently only when compiled as a
whole (tests/builders/compiled_block.py: its own code, between its leaves, scales by 1.01 when
compiled) passes every layer. The whole model compiled at once must then be the finding: a
defect at the smallest module whose compiled form differs (the block, two levels down), found
by a search that compiles a few subtrees, not every module; its clean twin stays clean."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, run_cli

pytest.importorskip("torch")

BUILDER = ROOT / "tests/builders/compiled_block.py"


def test_a_block_that_differs_only_compiled_whole_is_found_at_that_block(tmp_path):
    """The block is the defect, named by a search that went down the tree; as the headline it
    is what `--repro` cuts out (the block alone, compiled whole on the target side, against it
    eager; checked by running its repro.py) and what `--bisect` walks the stages on."""
    report, repro = tmp_path / "r.json", tmp_path / "repro"
    done = run_cli("torch", f"{BUILDER}:build", "--target", "torch:compile", "--repro",
                   str(repro), "--bisect", "--json", str(report))  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    data = json.loads(report.read_text())
    s = data["summary"]
    assert s["verdict"] == "defect"
    # every layer, its leaf compiled alone, agrees: the finding is the module, not a layer
    assert s["layers_exceeding"] == 0
    (defect,) = s["defects"]
    assert (defect["layer"], defect["cause"]) == ("stages.1.blocks.1", "cross_module_fusion")
    assert "each of its leaves compiled alone agrees" in defect["detail"], defect["detail"]
    assert defect["fix"].startswith("compile below `stages.1.blocks.1`"), defect["fix"]
    whole = data["compiled_whole"]
    assert whole["module"] == "stages.1.blocks.1" and whole["checked"]
    tried = whole["tried"]
    assert tried[0]["module"] == "Model" and tried[0]["differs"]
    # the search went down, not across every module: below the model are 9 modules with
    # children and 18 leaves; about depth × (1 + 2·log₂ breadth) compiles
    assert len(tried) <= 14, [(t["module"], t.get("eager")) for t in tried]
    # the block's own code computes it: none of the block's submodules is needed
    assert "with" not in whole
    first = done.stdout.splitlines()[0]
    assert "1 defect: `stages.1.blocks.1` cross_module_fusion" in first, done.stdout
    assert "compiled whole: the whole model compiled at once (inductor)" in done.stdout
    assert "repro of `stages.1.blocks.1`: the module `stages.1.blocks.1` (Block) alone" in (
        done.stderr
    ), done.stderr
    readme = (repro / "README.md").read_text()
    assert readme.startswith("# Repro: `stages.1.blocks.1` (Block) on `torch:compile`")
    assert "`cross_module_fusion`" in readme
    assert data["bisection"]["over"].endswith("on `stages.1.blocks.1` alone"), data["bisection"]


def test_its_clean_twin_compiled_whole_stays_clean(tmp_path):
    report = tmp_path / "r.json"
    done = run_cli("torch", f"{BUILDER}:build_clean", "--target", "torch:compile",
                   "--json", str(report))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(report.read_text())
    assert data["summary"]["verdict"] == "no_drift" and not data["summary"]["defects"]
    (whole,) = data["compiled_whole"]["tried"]
    assert whole["module"] == "Model" and not whole["differs"]
    # inductor reorders sums: a float32 rounding, well within everything
    assert whole["tolerance_multiple"] < 1.0 and whole["float64_multiple"] < 4.0
    assert "it agrees, as rounding explains" in done.stdout


def test_the_reference_never_takes_the_compiled_path_while_the_target_compiles(tmp_path):
    """The fault in the first block: the compiled side compiles its first leaves in a thread of
    its own while the reference runs that block's code, and `torch.compiler.is_compiling()` is
    one flag for the whole process. The reference took the faulty path too and the run stopped
    ("leaf call 3 was `stages.0.blocks.0:mul` this time", exit 2): the sides now take turns, and
    the block is the finding."""
    report = tmp_path / "r.json"
    done = run_cli("torch", f"{BUILDER}:build_first", "--target", "torch:compile",
                   "--json", str(report))  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "does not run the same way twice" not in done.stderr
    data = json.loads(report.read_text())
    assert data["summary"]["layers_exceeding"] == 0 and not data["summary"]["warnings"]
    (defect,) = data["summary"]["defects"]
    assert (defect["layer"], defect["cause"]) == ("stages.0.blocks.0", "cross_module_fusion")


def test_a_search_that_fails_leaves_the_whole_model_as_the_defect(monkeypatch):
    """Where a compile of the search fails, the whole model's difference is still the finding:
    the defect is the model, and it says why it was not narrowed."""
    import sys

    import layerdiff
    from layerdiff.torch import _compiled

    def broken(self, step):
        raise RuntimeError("a backend that cannot compile this module")

    monkeypatch.setattr(_compiled._Tree, "narrowed", broken)
    sys.path.insert(0, str(ROOT / "tests"))
    from builders.compiled_block import build

    model, inputs = build()
    report = layerdiff.compare_torch(model, inputs, target="torch:compile", float64=False)
    (defect,) = report.summary["defects"]
    assert (defect["layer"], defect["cause"]) == ("Model", "cross_module_fusion")
    assert (
        "(not narrowed below the whole model: a compile of the search failed: RuntimeError: "
        "a backend that cannot compile this module)" in defect["detail"]
    ), defect["detail"]
    assert report.exit_code == 1


def test_a_leaf_that_differs_compiled_alone_stays_the_finding(tmp_path):
    """tests/builders/wrong_lowering.py: Inductor's sigmoid is wrong, so the Sigmoid leaf
    compiled alone differs; without the float64 truth its error is undecided, not a defect. The
    whole model compiled at once differs by that same error: it is no fusion across modules, and
    the leaf stays the headline (it was `Sequential` cross_module_fusion, "each of its leaves
    compiled alone agrees", which the Sigmoid's own row contradicted)."""
    report = tmp_path / "r.json"
    done = run_cli("torch", f"{ROOT / 'tests/builders/wrong_lowering.py'}:build", "--target",
                   "torch:compile", "--no-float64", "--json", str(report))  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    data = json.loads(report.read_text())
    s = data["summary"]
    assert s["verdict"] == "undecided" and not s["defects"], s
    assert s["drift_origin"] == "3"
    assert "cross_module_fusion" not in done.stdout
    whole = data["compiled_whole"]
    assert whole["tried"][0]["differs"] and "module" not in whole
    assert whole["not_searched"].startswith("the layers' own errors (`3` undecided)")
