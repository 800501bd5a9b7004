"""Small float32 ONNX graphs written by hand for tests: random weights from a seed, one input
and one output, saved at an IR version ONNX Runtime 1.31 loads."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def save_graph(path, nodes, x_shape, y_shape, weights: dict, *, opset=20, extra=()):
    """Saves `nodes` reading input `x` and writing output `y`; `weights` maps initializer names
    to shapes, filled from seed 0 (scaled to keep activations near 1); `extra` adds other
    initializers as they are."""
    rng = np.random.default_rng(0)
    initializers = [
        numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.3, name)
        for name, shape in weights.items()
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y_shape))],
        [*initializers, *extra],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    onnx.save(model, str(path))
    return path


def layernorm_matmul_fp16(path, rng) -> None:
    """LayerNormalization → MatMul → Add in float16, with outputs around 100 to 500 (weights
    from `rng`)."""
    d, h = 64, 96
    weights = {
        "scale": rng.uniform(0, 1, d),
        "bias": rng.uniform(0, 1, d),
        "W": rng.uniform(0, 16, (d, h)),
        "B": rng.uniform(0, 1, h),
    }
    nodes = [
        helper.make_node("LayerNormalization", ["X", "scale", "bias"], ["ln"], name="ln", axis=-1),
        helper.make_node("MatMul", ["ln", "W"], ["mm"], name="mm"),
        helper.make_node("Add", ["mm", "B"], ["Z"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "ln_matmul_add",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT16, [2, 128, d])],
        [helper.make_tensor_value_info("Z", TensorProto.FLOAT16, [2, 128, h])],
        [numpy_helper.from_array(v.astype(np.float16), k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))


def growing_convs(path, *, layers=6, channels=64, gain=3.0):
    """Conv → Relu `layers` times, each conv's weights `gain`× He's scale, so activations grow
    ×`gain` per layer: ONNX Runtime's NCHWc layout (`NchwcTransformer`, opt=all) sums the
    convolutions in another order, and that rounding grows past float32's tolerance a few
    layers in. Nothing else in the graph drifts: the one optimizer that turns it on is known."""
    rng = np.random.default_rng(0)
    nodes, initializers, previous = [], [], "x"
    for i in range(layers):
        scale = gain * np.sqrt(2 / (channels * 9))
        w = (rng.standard_normal((channels, channels, 3, 3)) * scale).astype(np.float32)
        b = (rng.standard_normal(channels) * 0.1).astype(np.float32)
        initializers += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        out = "y" if i == layers - 1 else f"relu{i}"
        nodes += [
            helper.make_node("Conv", [previous, f"w{i}", f"b{i}"], [f"conv{i}"], pads=[1] * 4),
            helper.make_node("Relu", [f"conv{i}"], [out]),
        ]
        previous = out
    shape = [1, channels, 16, 16]
    return save_graph(path, nodes, shape, shape, {}, opset=17, extra=initializers)
