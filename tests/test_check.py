"""`layerdiff check`: the whole-output quick check of an export."""

from __future__ import annotations

import json

from conftest import ROOT, run_cli

TWICE = str(ROOT / "tests/builders/twice.py")


def test_a_faithful_export_passes_with_its_numbers(tmp_path):
    result = run_cli("check", f"{TWICE}:build", "--json", str(tmp_path / "check.json"))
    assert result.returncode == 0, result.stderr
    assert "on the final outputs, allclose(atol=1e-4, rtol=1e-5): pass" in result.stdout
    check = json.loads((tmp_path / "check.json").read_text())
    assert check["schema"] == "layerdiff.check/1" and check["passed"]
    (output,) = check["outputs"]
    assert output["shape"] == [4, 8] and output["stats"]["rounding"]["beyond_tolerance"] == 0


def test_an_onnx_file_of_other_weights_fails_with_the_worst_element_and_a_hint(tmp_path):
    onnx = tmp_path / "seed0" / "model.onnx"
    assert run_cli("torch", f"{TWICE}:build", "--out", str(onnx.parent)).returncode == 0
    result = run_cli("check", f"{TWICE}:build", "--seed", "1", "--onnx", str(onnx))
    assert result.returncode == 1, result.stderr
    assert ": FAIL" in result.stdout and "beyond the bound" in result.stdout
    assert "worst at [" in result.stdout and "where the reference is" in result.stdout
    assert f"hint: `layerdiff torch {TWICE}:build --target ort`" in result.stdout


def test_the_bound_is_the_user_s(tmp_path):
    result = run_cli("check", f"{TWICE}:build", "--target", "tract", "--atol", "0", "--rtol", "0")
    assert result.returncode in (0, 1)
    assert "allclose(atol=0e0, rtol=0e0)" in result.stdout


def test_a_missing_onnx_file_is_named_with_exit_2():
    result = run_cli("check", f"{TWICE}:build", "--onnx", "missing.onnx")
    assert result.returncode == 2
    assert "ONNX file `missing.onnx` does not exist" in result.stderr
    assert "Traceback" not in result.stderr
