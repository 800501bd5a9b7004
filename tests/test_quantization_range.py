"""A calibration that does not cover what the model computes is a defect of the file, not its
rounding: the ranges ONNX Runtime's quantizer fixes for each activation clip the values the
model computes beyond them. Counted on the reference's values (what the model computes), so
values a defect upstream pushed out of range stay that defect's."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, run_cli

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from builders.zoo import resnet18_160  # noqa: E402
from layerdiff.torch import _precision, compare_torch_onnx, export_onnx  # noqa: E402

RESNET160 = f"{ROOT}/tests/builders/zoo.py:resnet18_160"


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """ResNet-18 (160×160), its legacy export quantized to int8 (QDQ) by ONNX Runtime's static
    quantizer: calibrated on the compared inputs (`fit`), and on those inputs ×0.1 (`narrow`:
    every activation's range ten times too narrow, the input's clipping about 60% of it)."""
    folder = tmp_path_factory.mktemp("calibrated")
    model, inputs = resnet18_160()
    exported = export_onnx(model, inputs, folder / "legacy.onnx", exporter="legacy")
    fit, _ = _precision.convert(exported, "int8", folder / "fit.onnx", inputs)
    small = tuple(t * 0.1 for t in inputs)
    narrow, _ = _precision.convert(exported, "int8", folder / "narrow.onnx", small)
    return {"float": exported, "fit": fit, "narrow": narrow}


def test_a_calibration_too_narrow_is_the_defect_where_it_first_clips(calibrated):
    """The input's range is the first to clip: `bn1` (the Conv that reads it) is the origin,
    a quantization_range defect, and so is every activation after it whose range clips (the
    worst of them first). Before, every layer read as "int8 rounding only", exit 0, while the
    logits were off by 5."""
    model, inputs = resnet18_160()
    report = compare_torch_onnx(model, inputs, onnx=calibrated["narrow"])
    s = report.summary
    assert s["verdict"] == "defect" and s["drift_origin"] == "bn1", s
    assert {d["cause"] for d in s["defects"]} == {"quantization_range"}, s["defects"]
    (first,) = [d for d in s["defects"] if d["layer"] == "bn1"]
    assert "of the input `input.1`" in first["detail"], first
    assert "lie outside the range of its grid int8" in first["detail"], first
    assert first["fix"].startswith("the target's node(s) `input.1_QuantizeLinear` clip"), first
    # each activation after it clips too: its own range, not an error it inherited
    relu = report.layer("relu")
    assert relu["cause"] == "quantization_range", relu
    assert "values of this layer" in relu["detail"], relu


def test_a_calibration_that_covers_the_inputs_is_rounding_only(calibrated):
    model, inputs = resnet18_160()
    report = compare_torch_onnx(model, inputs, onnx=calibrated["fit"])
    s = report.summary
    assert s["verdict"] == "precision" and s["defects"] == [], s["defects"]


def test_every_door_says_the_narrow_calibration_is_a_defect(calibrated, tmp_path):
    """The command line, the float file against the quantized one, and `check`: exit 1 each."""
    out = tmp_path / "r.json"
    run = run_cli("torch", RESNET160, "--onnx", str(calibrated["narrow"]), "--json", str(out))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "quantization_range" in run.stdout.splitlines()[0], run.stdout
    run = run_cli(
        "onnx", str(calibrated["float"]), "--vs", str(calibrated["narrow"]), "--json", str(out)
    )
    assert run.returncode == 1, run.stdout + run.stderr
    causes = {d["cause"] for d in json.loads(out.read_text())["summary"]["defects"]}
    assert causes == {"quantization_range"}, causes
    run = run_cli("check", RESNET160, "--onnx", str(calibrated["narrow"]), "--exporter", "legacy")
    assert run.returncode == 1, run.stdout + run.stderr


def test_check_holds_a_quantized_file_to_the_bound_alone_and_says_why(calibrated, tmp_path):
    """Held to float32's rounding, every int8 file "computes something else" by the float64
    truth (75000× as far as PyTorch), which `layerdiff torch` calls int8 rounding. A quantized
    file's distance is its quantization's, which the whole output cannot tell from a defect:
    the bound judges it, the line says so and names the per-layer run. Within a bound wide
    enough for its quantization the well calibrated file passes and the narrow one fails."""
    out = tmp_path / "check.json"
    check = ("check", RESNET160, "--exporter", "legacy", "--json", str(out), "--onnx")
    result = run_cli(*check, str(calibrated["fit"]))
    assert result.returncode == 1, result.stdout + result.stderr
    (output,) = json.loads(out.read_text())["outputs"]
    assert output["float64"]["grid"] == "int8" and not output["float64"]["beyond"], output
    assert "computes something else" not in result.stdout, result.stdout
    assert "the file quantizes to int8: float32's rounding does not bound" in result.stdout
    fit = calibrated["fit"]
    assert f"`layerdiff torch {RESNET160} --onnx {fit}` does, layer by layer" in result.stdout
    loose = ("--atol", "0.5", "--rtol", "0")
    assert run_cli(*check, str(calibrated["fit"]), *loose).returncode == 0
    assert run_cli(*check, str(calibrated["narrow"]), *loose).returncode == 1


def test_the_float_file_s_relu_is_paired_with_the_value_the_quantizer_clamps(calibrated, tmp_path):
    """ONNX Runtime's quantizer drops each Relu whose output it quantizes: the Conv before it
    writes its own value under the Relu's name, and the QuantizeLinear clamps at zero instead.
    `--vs` paired the float file's Relu with that value (negative where the Relu's is zero, 2.8
    apart on a small CNN) and called it rounding; the Relu's value is the DequantizeLinear's."""
    out = tmp_path / "r.json"
    run = run_cli(
        "onnx", str(calibrated["float"]), "--vs", str(calibrated["fit"]), "--json", str(out)
    )
    assert run.returncode == 0, run.stdout + run.stderr
    layers = {layer["name"]: layer for layer in json.loads(out.read_text())["layers"]}
    relu = layers["/relu/Relu_output_0"]
    assert relu["status"] == "compared", relu
    assert "the target calls it `/relu/Relu_output_0_DequantizeLinear_Output`" in relu["reason"]
    assert relu["accumulated"]["max_abs_diff"] < 0.1, relu
