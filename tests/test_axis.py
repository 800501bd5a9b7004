"""A model along a batch or shape axis (`--batch-sizes`, `--shapes`): exported once with the
varying dimensions dynamic, compared at each point; the axis report names the points that drift
and the layers that pass at one point and fail at another."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, run_cli

torch = pytest.importorskip("torch")

from layerdiff import _layerdiff  # noqa: E402

BAKED = f"{ROOT}/tests/builders/baked_batch.py:build"


def test_an_export_that_baked_its_batch_passes_at_that_batch_only(tmp_path):
    out = tmp_path / "run"
    result = run_cli(
        "torch", BAKED, "--exporter", "legacy", "--batch-sizes", "1,8", "--out", str(out)
    )
    assert result.returncode == 1, result.stderr
    axis = json.loads((out / "axis.json").read_text())
    assert axis["schema"] == "layerdiff.axis/1" and axis["axis"] == "batch size"
    one, eight = axis["points"]
    assert (one["point"], one["verdict"]) == ("1", "defect")
    assert (eight["point"], eight["verdict"]) == ("8", "no_drift")
    assert one["inputs"][0]["shape"] == [1, 16] and eight["inputs"][0]["shape"] == [8, 16]
    assert one["output"] == "fc2" and "[8, 4] on the target" in one["output_note"]
    assert eight["output_max_abs_diff"] < 1e-5
    assert axis["findings"][0] == (
        "passes at batch size 8 and drifts at 1: a check at 8 alone would have missed it"
    )
    assert [layer["layer"] for layer in axis["changing"]] == ["fc2"]
    assert axis["changing"][0]["exceeds"] == [True, False]
    # one export, dynamic in the batch; each point's own reports beside the axis
    declared = _layerdiff.model_inputs(str(out / "model.onnx"))
    assert isinstance(declared[0][2][0], str), declared
    for point in ("batch-1", "batch-8"):
        assert {p.name for p in (out / point).iterdir()} >= {"report.json", "report.html"}
    assert "`fc2` passes at 8 and exceeds at 1" in result.stdout
    assert "| `fc2` | **not comparable** | 0.00 |" in (out / "axis.md").read_text()


def test_a_clean_cnn_is_clean_at_every_batch_size_with_one_dynamic_export(tmp_path):
    result = run_cli(
        "torch", f"{ROOT}/tests/builders/seed_mlp.py:build", "--batch-sizes", "1,3",
        "--json", str(tmp_path / "axis.json"), "-q",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    axis = json.loads((tmp_path / "axis.json").read_text())
    assert [p["verdict"] for p in axis["points"]] == ["no_drift", "no_drift"]
    assert axis["changing"] == [] and axis["findings"] == ["no drift at any batch size (1, 3)"]


def test_shapes_name_each_point_and_must_fit_the_inputs(tmp_path):
    result = run_cli(
        "torch", f"{ROOT}/tests/builders/seed_mlp.py:build", "--shapes", "2x64",
        "--shapes", "5x64", "--json", str(tmp_path / "a.json"), "-q",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    axis = json.loads((tmp_path / "a.json").read_text())
    assert axis["axis"] == "input shapes"
    assert [p["point"] for p in axis["points"]] == ["2x64", "5x64"]
    bad = run_cli("torch", f"{ROOT}/tests/builders/seed_mlp.py:build", "--shapes", "2x3x64")
    assert bad.returncode == 2 and "input 0 has 2 dimensions" in bad.stderr
    worse = run_cli("torch", "resnet18", "--shapes", "1x3xa")
    assert worse.returncode == 2 and "is not a shape such as 1x3x224x224" in worse.stderr
    both = run_cli("torch", "resnet18", "--shapes", "1x3x8x8", "--batch-sizes", "2")
    assert both.returncode == 2 and "cannot be used with" in both.stderr
    # a shape the model itself cannot take (64 features, given 48) is the user's, not the
    # exporter's: it read "torch.onnx.export (dynamo) failed: RuntimeError: …"
    unfit = run_cli(
        "torch", f"{ROOT}/tests/builders/seed_mlp.py:build", "--shapes", "2x64", "--shapes", "2x48"
    )
    assert unfit.returncode == 2, unfit.stderr
    said = unfit.stderr.strip().splitlines()[-1]
    assert said.startswith("error: --shapes 2x48: the model fails at these input shapes"), said
    assert "torch.onnx.export" not in said and "RuntimeError" in said


def test_the_python_api_gives_the_axis_and_each_points_report():
    import sys

    import layerdiff

    sys.path.insert(0, str(ROOT / "tests"))
    from builders.seed_mlp import build

    torch.manual_seed(0)
    model, inputs = build()
    axis, reports = layerdiff.compare_along(model, inputs, batch_sizes=(2, 4), seed=1)
    assert axis.axis == "batch size" and axis.exit_code == 0
    assert [p["point"] for p in axis.data["points"]] == ["2", "4"]
    assert set(reports) == {"2", "4"}
    assert reports["4"].data["inputs"][0]["shape"] == [4, 64]
    assert "no drift at any batch size (2, 4)" in axis.summary_text()
    with pytest.raises(layerdiff.UsageError, match="needs batch_sizes or shapes"):
        layerdiff.compare_along(model, inputs)
