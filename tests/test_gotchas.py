"""Export gotchas caught before they mislead: a random model (every run differs) is refused, an
input the exporter made a constant is named, float64 inputs to a float32 model are warned of;
and the node data that colours the graph in Model Explorer."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, run_cli

torch = pytest.importorskip("torch")

GOTCHAS = f"{ROOT}/tests/builders/gotchas.py"


def test_a_random_model_is_refused_at_the_layer_that_differs():
    result = run_cli("torch", f"{GOTCHAS}:build_random", "-q")
    assert result.returncode == 2, result.stderr
    assert "computed other values on the same inputs in a second run" in result.stderr
    assert "dropout called with training=True" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_input_the_legacy_exporter_baked_is_named():
    result = run_cli("torch", f"{GOTCHAS}:build_scaled", "--exporter", "legacy", "-q")
    assert result.returncode == 2, result.stderr
    assert "the export takes 1 input(s)" in result.stderr
    assert "the exporter made the others constants" in result.stderr


def test_an_input_no_node_reads_is_a_warning_in_the_report(tmp_path):
    result = run_cli("torch", f"{GOTCHAS}:build_ignores", "--json", str(tmp_path / "r.json"))
    assert result.returncode == 0, result.stderr
    warnings = json.loads((tmp_path / "r.json").read_text())["summary"]["warnings"]
    assert any("is read by no node" in w for w in warnings), warnings
    assert "is read by no node" in result.stdout


def test_float64_inputs_to_a_float32_model_are_a_warning(tmp_path):
    result = run_cli("torch", f"{GOTCHAS}:build_float64", "--json", str(tmp_path / "r.json"))
    assert result.returncode == 0, result.stderr
    warnings = json.loads((tmp_path / "r.json").read_text())["summary"]["warnings"]
    assert any("input 0 is float64 while the model's parameters are float32" in w for w in warnings)


def test_node_data_colours_each_onnx_node_by_its_layers_own_error(tmp_path):
    path = tmp_path / "nd.json"
    result = run_cli(
        "torch", f"{ROOT}/tests/builders/overflow.py:build", "--dtype", "fp16",
        "--node-data", str(path), "--json", str(tmp_path / "r.json"), "-q",
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    data = json.loads(path.read_text())
    report = json.loads((tmp_path / "r.json").read_text())
    up = next(x for x in report["layers"] if x["name"] == "up")
    # the node that overflows is off the scale; the first Linear is within its tolerance
    assert data["results"][up["location"]["node"]]["value"] > 1e300
    embed = next(x for x in report["layers"] if x["name"] == "embed")
    assert data["results"][embed["location"]["node"]]["value"] <= 1.0
    assert [t["value"] for t in data["thresholds"]][:4] == [0.1, 0.5, 1.0, 10.0]
    assert all(t["bgColor"].startswith("#") for t in data["thresholds"])
