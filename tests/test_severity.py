"""One verdict per run, whichever door asks: the headline, the exit code, `layerdiff check`,
`layerdiff reduce` and `--opaque` agree on the same files. A kernel beyond what its precision
explains whose effect stays within every tolerance (tract's Erf at an MLP's small activations,
tests/builders/approximations.py) is named as an approximation, exit 0 unless `--fail-on
approximation`, and `reduce` cuts it down to a repro judged by the same measure; a file edited
where the values are small (a defect within the tolerance) fails everywhere; the clean file
passes everywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT, run_cli
from sandbox import folder_of, run_in

pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

BUILDER = str(ROOT / "tests" / "builders" / "approximations.py") + ":build"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The builder's dynamo export, and the same file with the last GELU's `erf` constant
    √2 edited by 2e-5 of itself (`edited.onnx`): a folded constant off by far more than
    float32 rounds it, while every value stays within its tolerance."""
    folder = tmp_path_factory.mktemp("severity")
    done = run_cli("torch", BUILDER, "--out", str(folder / "export"), "--quiet")
    assert done.returncode == 0, done.stderr
    clean = folder / "export" / "model.onnx"
    model = onnx.load(str(clean))
    from onnx import numpy_helper

    div = [n for n in model.graph.node if n.op_type == "Div"][-1]
    constant = next(i for i in model.graph.initializer if i.name == div.input[1])
    value = numpy_helper.to_array(constant).copy()
    value *= 1 + 2e-5
    constant.CopyFrom(numpy_helper.from_array(value, constant.name))
    onnx.save(model, str(folder / "edited.onnx"))
    return folder, clean, folder / "edited.onnx"


def verdicts(folder: Path, *args: str) -> dict:
    """The same comparison through every door: `onnx` (its headline, exit code and JSON),
    `onnx --opaque`, `reduce` of its report, and the repro's own run."""
    out = folder / "run"
    compared = run_cli("onnx", *args, "--out", str(out))
    opaque = run_cli("onnx", *args, "--opaque", "--quiet")
    reduced = run_cli("reduce", str(out / "report.json"))
    repro = None
    if (out / "repro" / "repro.py").is_file():
        packages = folder_of(folder, "onnxruntime", "tract")
        repro = run_in(out / "repro", packages, "repro.py")
    return {
        "headline": compared.stdout.splitlines()[0] if compared.stdout else compared.stderr,
        "exit": compared.returncode,
        "report": json.loads((out / "report.json").read_text()),
        "opaque": opaque.returncode,
        "reduce": reduced,
        "repro": repro,
    }


def test_an_approximation_within_every_tolerance_is_named_and_passes_at_every_door(files, tmp_path):
    folder, clean, _ = files
    seen = verdicts(tmp_path, str(clean))  # the default target: tract
    s = seen["report"]["summary"]
    assert seen["exit"] == 0, seen["headline"]
    assert s["verdict"] == "no_drift" and not s["defects"], s
    (approximation,) = s["approximations"]
    assert approximation["ops"] == "Erf" and float(approximation["multiple"]) > 10, approximation
    assert float(approximation["tolerance_multiple"]) < 1
    layer = approximation["layer"]
    named = "approximate beyond what an honest float32 kernel explains, within every tolerance"
    assert f"{named}: `{layer}` Erf" in seen["headline"], seen["headline"]
    assert seen["opaque"] == 0
    # reduce cuts the approximation down, checked by what the report judged it by
    assert seen["reduce"].returncode == 0, seen["reduce"].stdout + seen["reduce"].stderr
    assert f"repro of `{layer}`: 1 node" in seen["reduce"].stdout
    assert "× what float32 explains" in seen["reduce"].stdout, seen["reduce"].stdout
    assert seen["repro"].returncode == 1 and "reproduced" in seen["repro"].stdout
    assert "x what float32 explains" in seen["repro"].stdout, seen["repro"].stdout
    # the strict reading fails on it, and says so under the "no drift" headline
    strict = run_cli("onnx", str(clean), "--fail-on", "approximation")
    assert strict.returncode == 1
    assert strict.stdout.startswith(seen["headline"])
    assert (
        "exit 1: `--fail-on approximation` fails on the 1 approximation named above; without it "
        "this run passes" in strict.stderr
    ), strict.stderr
    # the PyTorch model against its file on tract, and the whole-output check, agree: exit 0
    torch_side = run_cli("torch", BUILDER, "--onnx", str(clean), "--target", "tract", "--quiet")
    assert torch_side.returncode == 0, torch_side.stderr
    check = run_cli("check", BUILDER, "--onnx", str(clean), "--target", "tract", "--quiet")
    assert check.returncode == 0, check.stderr


def test_a_defect_within_the_tolerance_fails_at_every_door(files, tmp_path):
    folder, clean, edited = files
    seen = verdicts(tmp_path, str(clean), "--vs", str(edited), "--target", "ort")
    s = seen["report"]["summary"]
    assert seen["exit"] == 1, seen["headline"]
    # the edited constant is an initializer of the file: a weight that differs
    assert [d["cause"] for d in s["defects"]] == ["weight_mismatch"], s["defects"]
    assert float(s["defects"][0]["tolerance_multiple"]) < 1, s["defects"]
    assert seen["opaque"] == 1
    assert seen["reduce"].returncode == 0, seen["reduce"].stdout + seen["reduce"].stderr
    assert seen["repro"].returncode == 1 and "reproduced" in seen["repro"].stdout
    torch_side = run_cli("torch", BUILDER, "--onnx", str(edited), "--quiet")
    assert torch_side.returncode == 1, torch_side.stdout
    check = run_cli("check", BUILDER, "--onnx", str(edited), "--quiet")
    assert check.returncode == 1, check.stdout


def test_the_clean_file_passes_at_every_door(files, tmp_path):
    folder, clean, _ = files
    seen = verdicts(tmp_path, str(clean), "--target", "ort")
    assert seen["exit"] == 0 and seen["report"]["summary"]["verdict"] == "no_drift"
    assert "approximations" not in seen["report"]["summary"]
    assert seen["opaque"] == 0
    assert seen["reduce"].returncode == 1 and "no repro written" in seen["reduce"].stderr
    check = run_cli("check", BUILDER, "--onnx", str(clean), "--quiet")
    assert check.returncode == 0, check.stdout
