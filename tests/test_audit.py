"""`layerdiff audit`: the ops a model uses and, per runtime, whether it runs each, found by
trying each op alone on the values it reads in a run of the whole model."""

from __future__ import annotations

import json

import numpy as np
import onnx
from conftest import run_cli
from onnx import TensorProto, helper, numpy_helper


def audit(tmp_path, model, *args):
    result = run_cli("audit", str(model), *args, "--out", str(tmp_path))
    path = tmp_path / "audit.json"
    return result, json.loads(path.read_text()) if path.exists() else None


def test_a_torchvision_export_runs_everywhere(resnet18_onnx, tmp_path):
    result, report = audit(tmp_path, resnet18_onnx["dynamo"])
    assert result.returncode == 0, result.stderr
    assert "every runtime runs every op" in result.stdout
    assert report["schema"] == "layerdiff.audit/1" and report["inputs_from"] == "ort"
    assert report["runtimes"] == ["ort", "tract"]
    ops = {o["op_type"]: o for o in report["ops"]}
    assert ops["Conv"]["count"] == 20 and ops["Conv"]["domain"] == "ai.onnx"
    assert report["ops"][0]["op_type"] == "Conv"  # most used first when nothing fails
    assert ops["Conv"]["inputs"][0] == "float32[1, 3, 224, 224]"
    assert all(s["status"] == "runs" for o in report["ops"] for s in o["support"])
    assert (tmp_path / "audit.md").read_text().startswith("# layerdiff audit")


def contrib_inverse(path):
    """x → MatMul → com.microsoft::Inverse → y: ONNX Runtime's contrib op, which tract lacks."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
            helper.make_node("Inverse", ["h"], ["y"], name="inv", domain="com.microsoft"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 8])],
        [w],
    )
    opsets = [helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=10), str(path))
    return path


def test_an_op_a_runtime_cannot_run_comes_first_with_its_message(tmp_path):
    model = contrib_inverse(tmp_path / "inverse.onnx")
    result, report = audit(tmp_path, model, "--runtimes", "ort,tract,ort:cuda")
    assert result.returncode == 1, result.stderr
    first = report["ops"][0]
    assert (first["domain"], first["op_type"], first["opset"]) == ("com.microsoft", "Inverse", 1)
    support = {s["runtime"]: s for s in first["support"]}
    assert support["ort"]["status"] == "runs"
    assert support["tract"]["status"] == "fails" and support["tract"]["error"]
    assert "tract cannot run Inverse (node `inv`, reading float32[8, 8])" in result.stdout
    if report["unavailable"]:  # this ONNX Runtime has no CUDA: said once, not as failures
        assert report["unavailable"][0]["runtime"] == "ort:cuda"
        assert "ort:cuda is unavailable here" in result.stdout


def custom(path, then_relu: bool):
    """x → example.custom::Frobnicate (→ Relu) → y: an op no runtime knows."""
    nodes = [
        helper.make_node("Frobnicate", ["x"], ["h" if then_relu else "y"], domain="example.custom")
    ]
    if then_relu:
        nodes.append(helper.make_node("Relu", ["h"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    opsets = [helper.make_opsetid("", 20), helper.make_opsetid("example.custom", 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=10), str(path))
    return path


def test_an_op_no_runtime_knows_fails_on_each(tmp_path):
    """Its inputs are the model's: it is tried anyway, and fails on both runtimes."""
    result, report = audit(tmp_path, custom(tmp_path / "custom.onnx", then_relu=False))
    assert result.returncode == 1, result.stderr
    (op,) = report["ops"]
    assert [s["status"] for s in op["support"]] == ["fails", "fails"]


def test_a_model_no_runtime_runs_whole_cannot_be_audited(tmp_path):
    """The Relu after the unknown op reads a value only a run of the whole model gives."""
    result = run_cli("audit", str(custom(tmp_path / "custom.onnx", then_relu=True)))
    assert result.returncode == 2
    assert "cannot take each op's inputs from a run of the whole model" in result.stderr
    assert "Traceback" not in result.stderr and "panicked" not in result.stderr
