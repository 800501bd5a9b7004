"""`layerdiff onnx --opaque`: a target that cannot show its layers without changing what it
runs, searched by node ranges of its graph run unmodified. OpenVINO is the first such side:
its compiled graph fuses what no output reads. A weight edited in the target's file is found at
its node in about log2 of the node count range runs, with the verdict and cause the per-layer
run gives; a clean file is one check of its outputs."""

from __future__ import annotations

import math

import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install openvino)")

from faults import in_float16, scale_weight  # noqa: E402
from test_onnx_command import report_of  # noqa: E402


@pytest.mark.parametrize("target", ["openvino", "openvino:precision=f32"])
def test_a_weight_edited_in_the_target_file_is_found_at_its_node(resnet18_onnx, tmp_path, target):
    clean = resnet18_onnx["dynamo"]
    graph = onnx.load(str(clean)).graph
    conv = [n for n in graph.node if n.op_type == "Conv"][9]
    bug = scale_weight(clean, tmp_path / "bug.onnx", conv.output[0], 1.03)
    args = (str(clean), "--vs", str(bug), "--target", target)
    result, report = report_of(tmp_path, *args, "--opaque")
    assert result.returncode == 1, result.stdout + result.stderr
    search = report["opaque"]
    assert search["node"] == conv.name and search["op"] == "Conv", search
    nodes = len(graph.node)
    assert search["nodes"] == nodes
    # the check, then one range per halving
    halvings = len(search["ranges"]) - 1
    assert math.floor(math.log2(nodes)) <= halvings <= math.ceil(math.log2(nodes)), search
    assert search["runs"] > len(search["ranges"])  # and the node's own comparison
    assert search["ranges"][0]["deviates"] and search["ranges"][0]["nodes"] == nodes
    # the node alone, judged as the per-layer run judges a layer
    s = report["summary"]
    assert s["drift_origin"] == conv.output[0]
    assert [d["cause"] for d in s["defects"]] == ["weight_mismatch"], s["defects"]
    assert f"`{conv.name}` (Conv)" in result.stdout, result.stdout
    # and the per-layer run agrees
    _, per_layer = report_of(tmp_path, *args)
    assert per_layer["summary"]["drift_origin"] == conv.output[0]
    assert "opaque" not in per_layer


def test_a_clean_file_is_one_check_of_its_outputs(resnet18_onnx, tmp_path):
    result, report = report_of(
        tmp_path, str(resnet18_onnx["dynamo"]), "--target", "openvino", "--opaque"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    search = report["opaque"]
    assert len(search["ranges"]) == 1 and not search["ranges"][0]["deviates"], search
    assert "node" not in search
    s = report["summary"]
    assert s["verdict"] in ("no_drift", "precision") and not s["defects"], s
    assert [layer["name"] for layer in report["layers"]] == ["linear"]
    assert "no range was searched" in result.stdout


def test_a_node_a_conversion_runs_in_float16_is_precision_and_a_fault_beside_it_is_found(
    resnet18_onnx, tmp_path
):
    """A converted file runs one Conv in float16 between two Casts (values the reference lacks,
    computed inside each range by the target's own nodes): its rounding is judged as float16's
    wherever a range holds it, so the clean conversion searches nothing; a weight scaled in the
    same file is still found at its node."""
    clean = resnet18_onnx["dynamo"]
    convs = [n for n in onnx.load(str(clean)).graph.node if n.op_type == "Conv"]
    half = in_float16(clean, tmp_path / "half.onnx", convs[14].output[0])
    result, report = report_of(tmp_path, str(clean), "--vs", str(half), "--opaque")
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(report["opaque"]["ranges"]) == 1, report["opaque"]
    assert report["summary"]["verdict"] == "precision", report["summary"]
    bug = scale_weight(half, tmp_path / "half_bug.onnx", convs[4].output[0], 1.05)
    result, report = report_of(tmp_path, str(clean), "--vs", str(bug), "--opaque")
    assert result.returncode == 1, result.stdout + result.stderr
    assert report["opaque"]["node"] == convs[4].name, report["opaque"]
    assert report["summary"]["drift_origin"] == convs[4].output[0]


def test_reference_values_over_the_memory_budget_are_held_one_range_at_a_time(
    resnet18_onnx, tmp_path
):
    """ResNet-18's values are about 22 MB; under `--max-memory 4MB` the search holds only what
    each range reads (one reference run per range) and narrows to the same node, by the same
    ranges, and says how it held them."""
    clean = resnet18_onnx["dynamo"]
    conv = [n for n in onnx.load(str(clean)).graph.node if n.op_type == "Conv"][9]
    bug = scale_weight(clean, tmp_path / "bug.onnx", conv.output[0], 1.03)
    args = (str(clean), "--vs", str(bug), "--target", "openvino:precision=f32", "--opaque")
    _, held = report_of(tmp_path, *args)
    result, ranged = report_of(tmp_path, *args, "--max-memory", "4MB")
    assert result.returncode == 1, result.stdout + result.stderr
    assert ranged["opaque"]["node"] == held["opaque"]["node"] == conv.name
    tried = [(r["first"], r["last"], r["deviates"]) for r in ranged["opaque"]["ranges"]]
    assert tried == [(r["first"], r["last"], r["deviates"]) for r in held["opaque"]["ranges"]]
    for a, b in zip(ranged["opaque"]["ranges"], held["opaque"]["ranges"], strict=True):
        assert a["multiple"] == pytest.approx(b["multiple"], rel=1e-3, abs=1e-6), (a, b)
    assert ranged["summary"]["drift_origin"] == conv.output[0]
    warned = [w for w in ranged["summary"]["warnings"] if "one range at a time" in w]
    assert warned and "over the memory budget of 4 MB" in warned[0], ranged["summary"]["warnings"]
    assert not any("one range at a time" in w for w in held["summary"]["warnings"])


def test_opaque_takes_no_file_of_values_and_no_bisection(resnet18_onnx, tmp_path):
    model = str(resnet18_onnx["dynamo"])
    values = tmp_path / "values.safetensors"
    values.write_bytes(b"")
    result, _ = _run(model, "--target", f"expected:{values}", "--opaque")
    assert result.returncode == 2
    assert "--opaque runs the target on the reference's values" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    result, _ = _run(model, "--target", "openvino", "--opaque", "--bisect")
    assert result.returncode == 2
    assert "--bisect" in result.stderr and "--opaque" in result.stderr


def test_a_target_whose_outputs_the_reference_lacks_is_refused_not_passed(resnet18_onnx, tmp_path):
    """Outputs named otherwise leave the check nothing to compare: an error, never a clean run."""
    model = onnx.load(str(resnet18_onnx["dynamo"]))
    old = model.graph.output[0].name
    for node in model.graph.node:
        node.output[:] = ["renamed_out" if o == old else o for o in node.output]
    model.graph.output[0].name = "renamed_out"
    renamed = tmp_path / "renamed.onnx"
    onnx.save(model, str(renamed))
    result, _ = _run(str(resnet18_onnx["dynamo"]), "--vs", str(renamed), "--opaque")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "the reference computes none of them" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def _run(*args):
    from conftest import run_cli

    return run_cli("onnx", *args, "-q"), None
