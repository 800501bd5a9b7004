"""`layerdiff providers`: one model on every execution provider and optimization level, each
against the CPU provider with optimizations off; one verdict per cell, the origin of a failing
cell, unavailable providers listed once with the reason."""

from __future__ import annotations

import json

from conftest import run_cli


def run(tmp_path, model, *args):
    result = run_cli("providers", str(model), *args, "--out", str(tmp_path))
    table = json.loads((tmp_path / "providers.json").read_text())
    return result, table


def test_every_optimization_level_of_the_cpu_provider(resnet18_onnx, tmp_path):
    result, table = run(tmp_path, resnet18_onnx["dynamo"], "--providers", "cpu")
    assert result.returncode == 0, result.stderr
    assert table["schema"] == "layerdiff.providers/1"
    cells = {c["target"]: c for c in table["cells"]}
    assert list(cells) == ["ort", "ort:opt=basic", "ort:opt=extended", "ort:opt=all"]
    assert all(c["verdict"] == "no_drift" for c in cells.values())
    # the reference against itself compares every value; the optimized graph fewer, as it ships
    assert cells["ort"]["layers_compared"] == cells["ort"]["layers_total"]
    assert cells["ort:opt=all"]["layers_compared"] < cells["ort"]["layers_compared"]
    assert "optimized" in cells["ort:opt=all"]["reason"]
    for name in ("ort", "ort-opt-all"):
        report = json.loads((tmp_path / "cells" / f"{name}.json").read_text())
        assert report["command"] == "onnx"
    assert "| `ort:opt=all` | no drift |" in (tmp_path / "providers.md").read_text()


def test_a_drifting_cell_names_its_origin_and_the_exit_code_says_so(resnet18_onnx, tmp_path):
    """ONNX Runtime's fused float32 kernels against its unfused ones, held to 1e-9: float32
    rounding in another order, no defect. That passes unless drift is asked to fail."""
    args = ["--providers", "cpu", "--levels", "disable,all", "--tolerance", "1e-9"]
    result, table = run(tmp_path, resnet18_onnx["dynamo"], *args)
    assert result.returncode == 0, result.stderr
    clean, optimized = table["cells"]
    assert clean["verdict"] == "no_drift"
    assert optimized["verdict"] == "precision", optimized
    assert optimized["drift_origin"] and optimized["cause"] == "rounding"
    assert f"precision: {optimized['layers_exceeding']} of" in result.stdout
    assert f"born at `{optimized['drift_origin']}`" in result.stdout
    strict, _ = run(tmp_path, resnet18_onnx["dynamo"], *args, "--fail-on", "drift")
    assert strict.returncode == 1, strict.stderr


def test_an_unavailable_provider_is_one_cell_with_the_reason(resnet18_onnx, tmp_path):
    result, table = run(tmp_path, resnet18_onnx["dynamo"], "--providers", "cpu,cuda")
    cuda = [c for c in table["cells"] if c["provider"] == "CUDAExecutionProvider"]
    if cuda and cuda[0]["verdict"] != "unavailable":
        return  # this ONNX Runtime has CUDA: its cells ran
    assert result.returncode == 0, result.stderr
    (cell,) = cuda
    assert cell["level"] == "any" and "CUDAExecutionProvider" in cell["reason"]
    # the text names what the build lacks in one line, no row of its own; the report says
    # which build has it; the progress counts 5 cells
    assert "  not in this ONNX Runtime build: ort:cuda (" in result.stdout, result.stdout
    assert "unavailable" not in result.stdout, result.stdout
    assert "the onnxruntime-gpu wheel has it" in cell["reason"], cell
    assert "cell 5/5: ort:cuda…" in result.stderr, result.stderr


def test_nothing_that_can_run_is_exit_2(resnet18_onnx, tmp_path):
    result = run_cli("providers", str(resnet18_onnx["dynamo"]), "--providers", "coreml")
    assert result.returncode == 2
    assert "no provider could run the model" in result.stderr
    bad = run_cli("providers", str(resnet18_onnx["dynamo"]), "--levels", "max")
    assert bad.returncode == 2 and "unknown optimization level `max`" in bad.stderr
