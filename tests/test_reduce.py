"""Checked minimal reproductions: `--repro DIR` on a comparison and `layerdiff reduce
REPORT.json`, each repro.py run where nothing but numpy and the target's runtime is importable."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import onnx
import pytest
from conftest import run_cli
from sandbox import folder_of, run_in


def run_repro(folder: Path, packages: Path) -> subprocess.CompletedProcess:
    return run_in(folder, packages, "repro.py")


def edited_pads(src: Path, dst: Path, conv: int) -> str:
    """`src` with the `conv`-th Conv's pads shifted by one row ([1,1,1,1] → [2,1,0,1]: same
    shape, other numbers), as a faulty exporter or optimizer might; returns the conv's value."""
    model = onnx.load(str(src))
    node = [n for n in model.graph.node if n.op_type == "Conv"][conv]
    next(a for a in node.attribute if a.name == "pads").ints[:] = [2, 1, 0, 1]
    onnx.save(model, str(dst))
    return node.output[0]


def test_reduce_cuts_an_edited_attribute_deep_in_resnet18_down_to_its_node(resnet18_onnx, tmp_path):
    model = resnet18_onnx["dynamo"]
    value = edited_pads(model, tmp_path / "edited.onnx", conv=8)
    run = run_cli("onnx", str(model), "--vs", "edited.onnx", "--out", "run", "--quiet",
                  cwd=tmp_path)  # fmt: skip
    assert run.returncode == 1, run.stderr
    # From another folder, as a user handed the report would.
    done = run_cli("reduce", str(tmp_path / "run" / "report.json"), cwd=Path("/"))
    assert done.returncode == 0, done.stderr
    folder = tmp_path / "run" / "repro"
    assert f"repro of `{value}`: 1 node" in done.stdout and "checked" in done.stdout
    assert sorted(p.name for p in folder.iterdir()) == [
        "README.md", "expected.safetensors", "inputs.safetensors", "model.onnx", "repro.py",
    ]  # fmt: skip
    piece = onnx.load(str(folder / "model.onnx"))
    assert [n.op_type for n in piece.graph.node] == ["Conv"]
    assert [a.ints for a in piece.graph.node[0].attribute if a.name == "pads"] == [[2, 1, 0, 1]]
    readme = (folder / "README.md").read_text()
    # ONNX Runtime computes the Conv as the edited file says: the file differs, not the runtime
    assert "file_differs" in readme and "`pads` [1, 1, 1, 1] → [2, 1, 0, 1]" in readme
    assert "layerdiff onnx" in readme and "--vs edited.onnx" in readme
    # the piece holds the edited Conv: it is cut out of the target's file (it read the other)
    assert "layerdiff cut this out of `edited.onnx`: 1 node(s)" in readme, readme
    assert "the piece of `edited.onnx` that computes" in (folder / "repro.py").read_text()

    shown = run_repro(folder, folder_of(tmp_path, "onnxruntime"))
    assert shown.returncode == 1, shown.stderr
    assert f"`{value}` on ort: max |diff|" in shown.stdout and "reproduced" in shown.stdout
    assert "against the tolerance 0.0001 + 1e-05*|expected|" in shown.stdout


def test_repro_on_the_comparison_writes_the_same_folder(resnet18_onnx, tmp_path):
    model = resnet18_onnx["legacy"]
    value = edited_pads(model, tmp_path / "edited.onnx", conv=3)
    done = run_cli("onnx", str(model), "--vs", str(tmp_path / "edited.onnx"),
                   "--repro", str(tmp_path / "repro"))  # fmt: skip
    assert done.returncode == 1
    assert f"repro of `{value}`: 1 node" in done.stderr
    assert run_repro(tmp_path / "repro", folder_of(tmp_path, "onnxruntime")).returncode == 1


def test_a_clean_run_writes_no_repro_and_says_why(resnet18_onnx, tmp_path):
    model = resnet18_onnx["dynamo"]
    done = run_cli("onnx", str(model), "--target", "ort", "--repro", str(tmp_path / "repro"))
    assert done.returncode == 0
    assert "--repro: no repro written: no layer exceeds its tolerance" in done.stderr
    assert not (tmp_path / "repro").exists()

    run_cli("onnx", str(model), "--target", "ort", "--json", str(tmp_path / "r.json"))
    again = run_cli("reduce", str(tmp_path / "r.json"))
    assert again.returncode == 1
    assert "no repro written: no layer exceeds its tolerance" in again.stderr


def test_a_report_that_cannot_be_run_again_is_refused_by_name(tmp_path):
    report = tmp_path / "r.json"
    report.write_text(json.dumps({"schema": "layerdiff.report/4", "command": "onnx"}))
    done = run_cli("reduce", str(report))
    assert done.returncode == 2
    assert "has no `" in done.stderr and "r.inputs.safetensors` beside it" in done.stderr
    assert "hint: run the comparison again with `--repro DIR`" in done.stderr
    (tmp_path / "not.json").write_text("{")
    assert "is not a JSON report" in run_cli("reduce", str(tmp_path / "not.json")).stderr
    # Inputs saved by something other than a command (an older layerdiff, another tool).
    import numpy as np
    from layerdiff import _layerdiff
    from layerdiff.tensors import flat

    inputs = tmp_path / "r.inputs.safetensors"
    _layerdiff.write_safetensors(inputs, [flat("x", np.zeros(3, np.float32))])
    done = run_cli("reduce", str(report))
    assert done.returncode == 2 and "does not record the command that made it" in done.stderr


@pytest.mark.parametrize(
    ("runtime", "package"), [("tract", "tract"), ("openvino:precision=f32", "openvino")]
)
def test_a_repro_runs_on_the_target_runtimes_own_package(resnet18_onnx, tmp_path, runtime, package):
    """A tract or OpenVINO target's repro.py runs on that runtime's Python package and numpy
    alone, and its README says which to install."""
    model = resnet18_onnx["dynamo"]
    value = edited_pads(model, tmp_path / "edited.onnx", conv=2)
    run_cli("onnx", str(model), "--vs", str(tmp_path / "edited.onnx"), "--target", runtime,
            "--repro", str(tmp_path / "repro"), "--quiet")  # fmt: skip
    script = (tmp_path / "repro" / "repro.py").read_text()
    assert f"Needs numpy and {package}, nothing else" in script
    assert f"pip install numpy {package}" in (tmp_path / "repro" / "README.md").read_text()
    pytest.importorskip(package)
    shown = run_repro(tmp_path / "repro", folder_of(tmp_path, package))
    assert shown.returncode == 1, shown.stderr
    assert f"`{value}` on {runtime}: max |diff|" in shown.stdout


BUILDERS = Path(__file__).parent / "builders"


def test_reduce_cuts_a_wrong_module_of_a_bfloat16_target_down_to_it_alone(tmp_path):
    """One module's half-precision path is wrong (tests/builders/wrong_bf16.py): the repro is
    that module alone, its class imported from the builder's file, and its repro.py shows the
    difference with torch and numpy alone."""
    builder = f"{BUILDERS / 'wrong_bf16.py'}:build"
    run = run_cli("torch", builder, "--target", "torch:bf16", "--out", "run", "--quiet",
                  cwd=tmp_path)  # fmt: skip
    assert run.returncode == 1, run.stderr
    done = run_cli("reduce", str(tmp_path / "run" / "report.json"), "--out",
                   str(tmp_path / "repro"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "repro of `2`: the module `2` (GatedConv) alone" in done.stdout
    folder = tmp_path / "repro"
    assert sorted(p.name for p in folder.iterdir()) == [
        "README.md", "expected.safetensors", "inputs.safetensors", "module.pt", "repro.py",
        "state.safetensors",
    ]  # fmt: skip
    assert (folder / "module.pt").stat().st_size < (folder / "state.safetensors").stat().st_size
    script = (folder / "repro.py").read_text()
    assert "wrong_bf16.py" in script and "GatedConv" in script
    readme = (folder / "README.md").read_text()
    assert "op_implementation" in readme and "**Checked**" in readme
    # the command that made the report, as it records it (quoted where a shell needs it)
    made = f"layerdiff torch {builder} --target torch:bf16 --out run --quiet"
    assert f"**Produced by**: `{made}`" in readme

    shown = run_repro(folder, folder_of(tmp_path, "torch", "numpy"))
    assert shown.returncode == 1, shown.stderr
    assert "`2` on torch:bf16 against torch: max |diff|" in shown.stdout
    assert "against layerdiff's run of the whole model: max |diff| 0.000e+00" in shown.stdout


def test_a_defect_fused_away_is_narrowed_to_its_node_and_reproduced_there(resnet18_onnx, tmp_path):
    """At opt=all ONNX Runtime fuses the edited Conv with its Relu: the Conv's value is gone,
    so the defect shows at the Relu. Each node of the fused region run alone names the Conv,
    and the repro starts there: one node."""
    model = resnet18_onnx["dynamo"]
    value = edited_pads(model, tmp_path / "edited.onnx", conv=8)
    report = tmp_path / "r.json"
    done = run_cli("onnx", str(model), "--vs", str(tmp_path / "edited.onnx"),
                   "--target", "ort:opt=all", "--json", str(report),
                   "--repro", str(tmp_path / "repro"))  # fmt: skip
    assert done.returncode == 1, done.stderr
    data = json.loads(report.read_text())
    headline = data["summary"]["defects"][0]
    layer = next(la for la in data["layers"] if la["name"] == headline["layer"])
    assert layer["name"] != value  # the Conv's own value did not survive the fusion
    inside = layer["inside"]
    assert inside["value"] == value and inside["op"] == "Conv"
    assert inside["agree"] == [] or all("relu" in n.lower() for n in inside["agree"])
    assert "born inside the fused" in headline["detail"] and f"`{value}`" in headline["detail"]
    assert f"repro of `{value}`: 1 node" in done.stderr


@pytest.mark.thorough  # an inductor-only fault: test_bisect.py; reducing a module: the others
def test_an_inductor_only_fault_reduces_to_its_module_compiled(tmp_path):
    """The wrong Inductor lowering of tests/builders/wrong_lowering.py: the repro is the
    Sigmoid alone, and its repro.py, which imports the model's file for what it sets up,
    shows the difference compiled with torch and numpy alone."""
    builder = f"{BUILDERS / 'wrong_lowering.py'}:build"
    run = run_cli("torch", builder, "--target", "torch:compile", "--no-float64",
                  "--json", str(tmp_path / "r.json"), "--quiet")  # fmt: skip
    assert run.returncode == 1, run.stderr
    done = run_cli("reduce", str(tmp_path / "r.json"))
    assert done.returncode == 0, done.stderr
    assert "the module `3` (Sigmoid) alone" in done.stdout
    folder = tmp_path / "repro"
    assert "wrong_lowering.py" in (folder / "repro.py").read_text()
    shown = run_repro(folder, folder_of(tmp_path, "torch", "numpy"))
    assert shown.returncode == 1, shown.stderr
    assert "`3` on torch:compile against torch: max |diff|" in shown.stdout


def test_an_edited_weight_reduces_to_its_node(resnet18_onnx, tmp_path):
    from faults import perturb_weight

    model = resnet18_onnx["dynamo"]
    graph = onnx.load(str(model)).graph
    conv = [n for n in graph.node if n.op_type == "Conv"][12].output[0]
    perturb_weight(model, tmp_path / "edited.onnx", conv, 0.05)
    done = run_cli("onnx", str(model), "--vs", str(tmp_path / "edited.onnx"),
                   "--repro", str(tmp_path / "repro"), "--quiet")  # fmt: skip
    assert done.returncode == 1
    piece = onnx.load(str(tmp_path / "repro" / "model.onnx"))
    assert [n.op_type for n in piece.graph.node] == ["Conv"]
    assert piece.graph.node[0].output[0] == conv
    readme = (tmp_path / "repro" / "README.md").read_text()
    assert "weight_mismatch" in readme
    shown = run_repro(tmp_path / "repro", folder_of(tmp_path, "onnxruntime"))
    assert shown.returncode == 1 and "reproduced" in shown.stdout


def test_a_pytorch_model_against_a_faulty_onnx_file_reduces_to_its_nodes(resnet18_onnx, tmp_path):
    """`layerdiff torch` against an ONNX file with one edited attribute: the repro is the
    layer's ONNX nodes fed PyTorch's values, held to PyTorch's value, on the target's runtime."""
    value = edited_pads(resnet18_onnx["dynamo"], tmp_path / "edited.onnx", conv=8)
    run = run_cli("torch", "resnet18", "--onnx", "edited.onnx", "--out", "run", "--quiet",
                  cwd=tmp_path)  # fmt: skip
    assert run.returncode == 1, run.stderr
    done = run_cli("reduce", str(tmp_path / "run" / "report.json"))
    assert done.returncode == 0, done.stderr
    # the layer as the report names it (the module), and the file's value it computes
    layer = json.loads((tmp_path / "run" / "report.json").read_text())["summary"]["defects"][0]
    assert layer["layer"] != value
    assert f"repro of `{layer['layer']}` (the file's `{value}`): 1 node" in done.stdout
    folder = tmp_path / "run" / "repro"
    readme = (folder / "README.md").read_text()
    assert readme.startswith(f"# Repro: `{layer['layer']}`: `{value}`")
    assert "(`pytorch`, the whole model run on the report's inputs)" in readme
    shown = run_repro(folder, folder_of(tmp_path, "onnxruntime"))
    assert shown.returncode == 1 and f"`{value}` on ort: max |diff|" in shown.stdout


def test_a_weight_edited_below_every_tolerance_reduces_to_the_node_holding_it(
    resnet18_onnx, tmp_path
):
    """One element of a Conv's weight moved by 2e-5 in the file: the run names the weight, and
    a run of a piece may not show it (within every tolerance; on some CPUs the float32 kernel's
    own error is small enough that it does). `reduce` once said "no repro" and exited 1 on the
    defect the run reported; it writes the node that holds the weight, says that the weight is
    the defect (where no run shows it, that the weight is the evidence), and agrees with the
    run (exit 0)."""
    model = onnx.load(str(resnet18_onnx["dynamo"]))
    conv = [n for n in model.graph.node if n.op_type == "Conv"][5]
    weight = next(i for i in model.graph.initializer if i.name == conv.input[1])
    values = onnx.numpy_helper.to_array(weight).copy()
    values.flat[0] += 2e-5
    weight.CopyFrom(onnx.numpy_helper.from_array(values, weight.name))
    onnx.save(model, str(tmp_path / "edited.onnx"))
    run = run_cli("torch", "resnet18", "--onnx", "edited.onnx", "--out", "run", "--quiet",
                  cwd=tmp_path)  # fmt: skip
    assert run.returncode == 1, run.stderr
    (defect,) = json.loads((tmp_path / "run" / "report.json").read_text())["summary"]["defects"]
    assert defect["cause"] == "weight_mismatch"
    done = run_cli("reduce", str(tmp_path / "run" / "report.json"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"repro of `{defect['layer']}`" in done.stdout
    assert f"the file's weight that is the defect: `{weight.name}` differs" in done.stdout
    shown = "checked: the target differs by" in done.stdout
    assert shown or "no run shows it" in done.stdout, done.stdout
    readme = (tmp_path / "run" / "repro" / "README.md").read_text()
    assert "**The defect is a weight of the file**" in readme


BARE = """import torch


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, padding=1),
    ).eval()
    return model, torch.randn(1, 3, 16, 16)  # one bare tensor, as the docs allow
"""


def test_a_builder_that_returns_one_bare_tensor_reduces_too(tmp_path):
    """The repro's capture called the model on the builder's bare tensor unpacked (its batch
    rows as arguments): `--repro` and `reduce` ended in an internal error, exit 2, and the
    run's own exit 1 was lost."""
    import runpy

    from layerdiff.torch import export_onnx

    (tmp_path / "bare.py").write_text(BARE)
    model, x = runpy.run_path(str(tmp_path / "bare.py"))["build"]()
    export_onnx(model, (x,), tmp_path / "model.onnx")
    edited_pads(tmp_path / "model.onnx", tmp_path / "edited.onnx", conv=1)
    run = run_cli("torch", "bare.py:build", "--onnx", "edited.onnx", "--repro", "repro",
                  "--quiet", cwd=tmp_path)  # fmt: skip
    assert run.returncode == 1, run.stderr
    assert "internal error" not in run.stderr, run.stderr
    assert (tmp_path / "repro" / "repro.py").is_file()


def test_a_layer_onnx_runtime_optimized_reduces_to_the_files_own_nodes(resnet18_onnx, tmp_path):
    """A legacy export with one Conv weight scaled, run at `ort:opt=all`: ONNX Runtime fuses
    that Conv with its ReLU into an NCHWc Conv between reorders, so the layer's nodes are the
    optimized graph's, none of them in the file (reduce stopped with exit 2: "has no node
    `layerdiff/ReorderInput/…`"). The repro is the file's Conv and Relu, from PyTorch's value
    of the block's input, which ONNX Runtime fuses again when the repro runs."""
    from faults import scale_weight

    legacy = resnet18_onnx["legacy"]
    relu = "/layer2/layer2.0/relu/Relu_output_0"
    conv = next(n for n in onnx.load(str(legacy)).graph.node if n.op_type == "Conv"
                and n.output[0] == "/layer2/layer2.0/conv1/Conv_output_0")  # fmt: skip
    scale_weight(legacy, tmp_path / "edited.onnx", conv.output[0], 1.05)
    run = run_cli("torch", "resnet18", "--onnx", "edited.onnx", "--target", "ort:opt=all",
                  "--out", "run", "--quiet", cwd=tmp_path)  # fmt: skip
    assert run.returncode == 1, run.stderr
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    (defect,) = report["summary"]["defects"]
    assert (defect["layer"], defect["cause"]) == ("layer2.0.relu", "weight_mismatch")
    layer = next(la for la in report["layers"] if la["name"] == "layer2.0.relu")
    assert all(n not in {c.name for c in onnx.load(str(legacy)).graph.node}
               for n in layer["location"]["nodes"])  # fmt: skip
    done = run_cli("reduce", str(tmp_path / "run" / "report.json"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        f"repro of `layer2.0.relu` (the file's `{relu}`): 2 nodes ({conv.name}, "
        "/layer2/layer2.0/relu/Relu)" in done.stdout
    ), done.stdout
    shown = run_repro(tmp_path / "run" / "repro", folder_of(tmp_path, "onnxruntime"))
    assert shown.returncode == 1 and f"`{relu}` on ort:opt=all: max |diff|" in shown.stdout


def test_a_wrong_backward_reduces_to_that_modules_backward_alone(tmp_path):
    """tests/builders/wrong_backward.py: a block whose half-precision backward is wrong; the
    `layerdiff grad` report's repro is that block's backward alone, checked, and its repro.py
    shows it with torch and numpy alone."""
    builder = f"{BUILDERS / 'wrong_backward.py'}:build"
    run = run_cli("grad", builder, "--target", "torch:bf16", "--out", "run", "--quiet",
                  cwd=tmp_path)  # fmt: skip
    assert run.returncode == 1, run.stderr
    done = run_cli("reduce", str(tmp_path / "run" / "report.json"))
    assert done.returncode == 0, done.stderr
    assert "repro of `2:input`: the module `2` (Doubled) alone (its backward" in done.stdout
    folder = tmp_path / "run" / "repro"
    assert 'GRADIENT = {"of": "input"' in (folder / "repro.py").read_text()
    shown = run_repro(folder, folder_of(tmp_path, "torch", "numpy"))
    assert shown.returncode == 1 and shown.stdout.strip().endswith("reproduced")
    assert "`2:input` on torch:bf16 against torch: max |diff|" in shown.stdout


def test_a_defect_in_an_optimized_file_reduces_to_the_fused_node_and_what_feeds_it(
    encoder_onnx, tmp_path
):
    """An encoder with one LayerNorm's epsilon edited, then optimized by ONNX Runtime: the norm
    is now a SkipLayerNormalization among values the optimizer renamed (the reference has no
    value to feed them with), which stopped the repro; a piece grows only as a group the
    reference can feed, and here the fused node alone shows it."""
    from faults import edited_norm
    from test_optimized import ort_optimized

    norm = edited_norm(encoder_onnx, tmp_path / "edited.onnx")
    optimized = ort_optimized(tmp_path / "edited.onnx", tmp_path / "edited.opt.onnx",
                              "ORT_ENABLE_EXTENDED")  # fmt: skip
    done = run_cli("onnx", str(encoder_onnx), "--vs", str(optimized),
                   "--repro", str(tmp_path / "repro"))  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert f"repro of `{norm.output[0]}`:" in done.stderr and "checked" in done.stderr
    piece = onnx.load(str(tmp_path / "repro" / "model.onnx"))
    ops = [n.op_type for n in piece.graph.node]
    assert ops == ["SkipLayerNormalization"], ops
    shown = run_repro(tmp_path / "repro", folder_of(tmp_path, "onnxruntime"))
    assert shown.returncode == 1 and "reproduced" in shown.stdout, shown.stdout


def test_a_module_whose_half_path_calls_other_submodules_is_compared_whole_and_reduced(tmp_path):
    """tests/builders/fused_mlp.py: the second block's MLP runs a hand-written path in bfloat16
    that calls none of its submodules and drops a bias. The target cannot be followed call by
    call there, so both MLPs are compared whole: the second is the one defect, and its repro is
    that module alone."""
    builder = f"{BUILDERS / 'fused_mlp.py'}:build"
    run = run_cli("torch", builder, "--target", "torch:bf16", "--out", "run", cwd=tmp_path)
    assert run.returncode == 1, run.stderr
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    defects = [(d["layer"], d["cause"]) for d in report["summary"]["defects"]]
    assert defects == [("3.mlp", "op_implementation")], defects
    warnings = report["summary"]["warnings"]
    assert any("`2.mlp`, `3.mlp` compared whole" in w for w in warnings), warnings
    done = run_cli("reduce", str(tmp_path / "run" / "report.json"))
    assert done.returncode == 0, done.stderr
    assert "the module `3.mlp` (FusedMlp) alone" in done.stdout
    shown = run_repro(tmp_path / "run" / "repro", folder_of(tmp_path, "torch", "numpy"))
    assert shown.returncode == 1 and shown.stdout.strip().endswith("reproduced"), shown.stdout


def test_an_edited_attribute_fused_away_is_named_as_the_attribute(encoder_onnx, tmp_path):
    """One LayerNormalization's epsilon edited, compared at opt=all, where ONNX Runtime fuses the
    norm into a SkipLayerNormalization: narrowed to the norm, whose attribute differs from the
    reference's node, as the two files' own difference says: the file differs (not the
    runtime), and the fix is the attribute."""
    from faults import edited_norm

    norm = edited_norm(encoder_onnx, tmp_path / "edited.onnx")
    report = tmp_path / "r.json"
    done = run_cli("onnx", str(encoder_onnx), "--vs", str(tmp_path / "edited.onnx"),
                   "--target", "ort:opt=all", "--json", str(report))  # fmt: skip
    assert done.returncode == 1, done.stderr
    data = json.loads(report.read_text())
    (defect,) = data["summary"]["defects"]
    assert defect["layer"] == norm.output[0] and defect["cause"] == "file_differs"
    changed = f"`epsilon` 1e-5 → 0.5 on `{norm.name}`"
    assert defect["detail"].startswith(f"an attribute differs: {changed}")
    assert "born inside the fused" in defect["detail"]
    assert defect["detail"].count(changed) == 1
    assert "reference's attribute values back" in defect["fix"]
    assert "report it to the runtime" not in defect["fix"]
    layer = next(la for la in data["layers"] if la["name"] == norm.output[0])
    assert layer["inside"]["attributes"] == [changed]


def test_a_weight_edited_in_a_conv_fused_away_is_the_weight_not_the_runtime(
    resnet18_onnx, tmp_path
):
    """At opt=all ONNX Runtime fuses an edited Conv with its Relu and reorders its weight into a
    blocked layout, which no check by name can read. The narrowing to the Conv runs the file's
    own node, whose weight is the reference's edited: the headline is the weight (the file),
    never a kernel of the runtime."""
    from faults import scale_weight

    model = onnx.load(str(resnet18_onnx["legacy"]))
    conv = [n for n in model.graph.node if n.op_type == "Conv"][5]
    scale_weight(resnet18_onnx["legacy"], tmp_path / "edited.onnx", conv.output[0], 1.05)
    report = tmp_path / "r.json"
    done = run_cli("onnx", str(resnet18_onnx["legacy"]), "--vs", str(tmp_path / "edited.onnx"),
                   "--target", "ort:opt=all", "--json", str(report))  # fmt: skip
    assert done.returncode == 1, done.stderr
    data = json.loads(report.read_text())
    (headline,) = data["summary"]["defects"]  # the Conv's weight, said once
    assert headline["cause"] == "weight_mismatch", headline
    assert f"`{conv.input[1]}`" in headline["detail"], headline
    assert headline["fix"].startswith("use the reference's weights"), headline
    assert "report it to the runtime" not in done.stdout


def test_an_attribute_found_inside_a_fusion_beside_a_changed_weight_leaves_the_weight_the_cause(
    encoder_onnx, tmp_path
):
    """The first norm's epsilon and its weight both edited, at opt=all: the weight stays the
    cause and its fix; the attribute the narrowing found is said after it, never in its place."""
    from onnx import numpy_helper

    model = onnx.load(str(encoder_onnx))
    norm = next(n for n in model.graph.node if n.op_type == "LayerNormalization")
    next(a for a in norm.attribute if a.name == "epsilon").f = 0.5
    gamma = next(i for i in model.graph.initializer if i.name == norm.input[1])
    gamma.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(gamma) * 1.3, gamma.name))
    onnx.save(model, str(tmp_path / "edited.onnx"))
    report = tmp_path / "r.json"
    done = run_cli("onnx", str(encoder_onnx), "--vs", str(tmp_path / "edited.onnx"),
                   "--target", "ort:opt=all", "--json", str(report))  # fmt: skip
    assert done.returncode == 1, done.stderr
    (defect,) = json.loads(report.read_text())["summary"]["defects"]
    assert defect["layer"] == norm.output[0] and defect["cause"] == "weight_mismatch"
    assert defect["detail"].startswith(f"`{norm.input[1]}` differs")
    assert f"an attribute differs: `epsilon` 1e-5 → 0.5 on `{norm.name}`" in defect["detail"]
    assert defect["fix"].startswith("use the reference's weights")
