"""`layerdiff check`: the whole-output quick check of an export."""

from __future__ import annotations

import json

from conftest import ROOT, run_cli

TWICE = str(ROOT / "tests/builders/twice.py")


def test_a_faithful_export_passes_with_its_numbers(tmp_path):
    result = run_cli("check", f"{TWICE}:build", "--json", str(tmp_path / "check.json"))
    assert result.returncode == 0, result.stderr
    assert (
        "on the final outputs, allclose(atol=1e-4, rtol=1e-5) and their distance from float64: "
        "pass" in result.stdout
    )
    check = json.loads((tmp_path / "check.json").read_text())
    assert check["schema"] == "layerdiff.check/1" and check["passed"]
    (output,) = check["outputs"]
    assert output["shape"] == [4, 8] and output["stats"]["rounding"]["beyond_tolerance"] == 0
    # both round the same computation: about as far from the float64 truth
    truth = output["float64"]
    assert not truth["beyond"] and truth["multiple"] < 2, truth
    assert "float64 truth: the target is" in result.stdout and ": rounding" in result.stdout


def test_an_onnx_file_of_other_weights_fails_with_the_worst_element_and_a_hint(tmp_path):
    onnx = tmp_path / "seed0" / "model.onnx"
    assert run_cli("torch", f"{TWICE}:build", "--out", str(onnx.parent)).returncode == 0
    result = run_cli("check", f"{TWICE}:build", "--seed", "1", "--onnx", str(onnx))
    assert result.returncode == 1, result.stderr
    assert ": FAIL" in result.stdout and "beyond the bound" in result.stdout
    assert "worst at [" in result.stdout and "where the reference is" in result.stdout
    assert f"hint: `layerdiff torch {TWICE}:build --onnx {onnx} --target ort`" in result.stdout


def test_the_bound_is_the_user_s(tmp_path):
    result = run_cli("check", f"{TWICE}:build", "--target", "tract", "--atol", "0", "--rtol", "0")
    assert result.returncode in (0, 1)
    assert "allclose(atol=0e0, rtol=0e0)" in result.stdout


def test_a_missing_onnx_file_is_named_with_exit_2():
    result = run_cli("check", f"{TWICE}:build", "--onnx", "missing.onnx")
    assert result.returncode == 2
    assert "ONNX file `missing.onnx` does not exist" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_file_that_computes_otherwise_within_the_bound_fails(tmp_path):
    """A GELU's `approximate` attribute edited to `tanh` in the export: every output element
    stays within 1e-4 + 1e-5·|x|, so allclose passed, while the per-layer comparison calls it
    a defect (`file_differs` at the GELU). The target is hundreds of times as far from the
    outputs computed in float64 as PyTorch's: the check fails, and says why."""
    import onnx
    from onnx import helper

    builder = str(ROOT / "tests/builders/edited_files.py") + ":build"
    assert run_cli("torch", builder, "--out", str(tmp_path / "out")).returncode == 0
    model = onnx.load(str(tmp_path / "out" / "model.onnx"))
    gelu = next(n for n in model.graph.node if n.op_type == "Gelu")
    kept = [a for a in gelu.attribute if a.name != "approximate"]
    del gelu.attribute[:]
    gelu.attribute.extend([*kept, helper.make_attribute("approximate", "tanh")])
    onnx.save(model, str(tmp_path / "tanh.onnx"))
    out = tmp_path / "check.json"
    result = run_cli("check", builder, "--onnx", str(tmp_path / "tanh.onnx"), "--json", str(out))
    assert result.returncode == 1, result.stdout + result.stderr
    (output,) = json.loads(out.read_text())["outputs"]
    assert output["stats"]["rounding"]["beyond_tolerance"] == 0, "within the bound"
    assert output["float64"]["beyond"] and output["float64"]["multiple"] > 50, output["float64"]
    assert "the target computes something else here, though every element is within the bound" in (
        result.stdout
    )


def test_a_float16_file_fails_the_bound_by_float16_s_rounding_and_says_so(tmp_path):
    """ONNX Runtime's float16 converter on the export: the outputs move past 1e-4 by float16's
    rounding. Held to float32's, the check said "the target computes something else here" while
    `layerdiff torch` said "float16 rounding only"; the file's precision is now what its distance
    is held to (the bound stays the user's)."""
    import torch
    from layerdiff.torch import _precision

    exported = tmp_path / "out" / "model.onnx"  # the export of the model as check builds it
    assert run_cli("torch", f"{TWICE}:build", "--out", str(exported.parent)).returncode == 0
    inputs = (torch.randn(4, 16),)
    half, _ = _precision.convert(exported, "fp16", tmp_path / "half.onnx", inputs)
    out = tmp_path / "check.json"
    result = run_cli("check", f"{TWICE}:build", "--onnx", str(half), "--json", str(out))
    assert result.returncode == 1, result.stdout + result.stderr
    (output,) = json.loads(out.read_text())["outputs"]
    assert output["float64"]["grid"] == "float16" and not output["float64"]["beyond"], output
    assert "it fails the bound only because the target computes in float16" in result.stdout
    assert "computes something else" not in result.stdout
