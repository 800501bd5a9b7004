"""Layout permutations injected into real ResNet-18 exports are found at exactly the edited
layer, with the permutation, in `layerdiff onnx --vs` and in `layerdiff torch --onnx`."""

from __future__ import annotations

import numpy as np
import onnx
from layerdiff import compare_torch_onnx
from onnx import helper, numpy_helper
from test_onnx_command import report_of


def _node(model, output):
    return next(n for n in model.graph.node if output in n.output)


def nhwc_output(src, dst, value="relu_16"):
    """The last block's output comes out NHWC; the pooling that reads it is adjusted to match."""
    model = onnx.load(str(src))
    relu = _node(model, value)
    relu.output[0] = f"{value}_nchw"
    transpose = helper.make_node(
        "Transpose", [f"{value}_nchw"], [value], perm=[0, 2, 3, 1], name="to_nhwc"
    )
    index = list(model.graph.node).index(relu)
    model.graph.node.insert(index + 1, transpose)
    mean = next(n for n in model.graph.node if n.op_type == "ReduceMean")
    axes = next(i for i in model.graph.initializer if i.name == mean.input[1])
    axes.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(axes) * 0 + [1, 2], axes.name))
    onnx.save(model, str(dst))


def reinterpreted(src, dst, value):
    """NCHW data laid out NHWC and read back with the NCHW shape, inside the producing module."""
    model = onnx.load(str(src))
    relu = _node(model, value)
    raw, nhwc, shape = f"{value}_raw", f"{value}_nhwc", f"{value}_shape"
    relu.output[0] = raw
    dims = [
        d.dim_value
        for d in next(
            v for v in model.graph.value_info if v.name == value
        ).type.tensor_type.shape.dim
    ]
    model.graph.initializer.append(numpy_helper.from_array(np.array(dims, "int64"), shape))
    nodes = [
        helper.make_node("Transpose", [raw], [nhwc], perm=[0, 2, 3, 1], name="bad_layout"),
        helper.make_node("Reshape", [nhwc, shape], [value], name="read_back"),
    ]
    for n in nodes:  # as if the exporter emitted them inside the module
        n.metadata_props.extend(relu.metadata_props)
    index = list(model.graph.node).index(relu)
    for offset, n in enumerate(nodes, start=1):
        model.graph.node.insert(index + offset, n)
    onnx.save(model, str(dst))


def test_an_nhwc_output_is_a_layout_permutation(resnet18_onnx, tmp_path):
    edited = tmp_path / "nhwc.onnx"
    nhwc_output(resnet18_onnx["dynamo"], edited)
    result, report = report_of(tmp_path, str(resnet18_onnx["dynamo"]), "--vs", str(edited))
    assert report["summary"]["drift_origin"] == "relu_16"
    layer = next(x for x in report["layers"] if x["name"] == "relu_16")
    assert layer["status"] == "shape_mismatch" and layer["target_shape"] == [1, 7, 7, 512]
    assert (layer["cause"], layer["permutation"]) == ("layout_permutation", [0, 2, 3, 1])
    assert "layout_permutation" in result.stdout.splitlines()[0]
    # Downstream values agree again: the pooling reads the NHWC layout correctly.
    assert next(x for x in report["layers"] if x["name"] == "mean")["exceeds_tol"] is False


def test_a_reinterpreted_layout_is_found_at_that_layer_in_both_flows(
    resnet18, resnet18_onnx, tmp_path
):
    edited = tmp_path / "reinterpreted.onnx"
    reinterpreted(resnet18_onnx["dynamo"], edited, "relu_8")
    _, report = report_of(tmp_path, str(resnet18_onnx["dynamo"]), "--vs", str(edited))
    assert report["summary"]["drift_origin"] == "relu_8"
    origin = next(x for x in report["layers"] if x["name"] == "relu_8")
    assert (
        origin["status"] == "compared"
        and "read back with the reference's shape" in origin["detail"]
    )
    assert (origin["cause"], origin["permutation"]) == ("layout_permutation", [0, 2, 3, 1])
    later = [x for x in report["layers"] if x["exceeds_tol"] and x["name"] != "relu_8"]
    assert later and all(x["cause"] == "inherited" for x in later), (
        "propagated garbage is inherited"
    )

    model, inputs, _ = resnet18
    torch_report = compare_torch_onnx(model, inputs, onnx=edited)
    layer = next(
        x for x in torch_report.layers if x["location"] and x["location"]["value"] == "relu_8"
    )
    assert torch_report.drift_origin == layer["name"]
    assert (layer["cause"], layer["permutation"]) == ("layout_permutation", [0, 2, 3, 1])
    assert "## Causes" in torch_report.to_markdown()
