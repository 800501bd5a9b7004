"""Writes the fuzzers' seeds (fuzz/seeds/TARGET/): small valid files of each kind, which the
fuzzers mutate from. `make fuzz` runs it; the files are not checked in.

    python fuzz/seeds.py fuzz/seeds
"""

from __future__ import annotations

import io
import struct
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _model(nodes, inputs, outputs, initializers=(), opset=17, functions=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("local", 1)],
        ir_version=10,
        functions=list(functions),
    )


def _vi(name, dtype=TensorProto.FLOAT, shape=(1, 4)):
    return helper.make_tensor_value_info(name, dtype, list(shape))


def onnx_models() -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    mlp = _model(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
            helper.make_node("Add", ["h", "b"], ["a"], name="add"),
            helper.make_node("Relu", ["a"], ["r"], name="relu"),
            helper.make_node("Softmax", ["r"], ["y"], name="sm", axis=-1),
        ],
        [_vi("x")],
        [_vi("y")],
        [w, b],
    )
    conv_w = numpy_helper.from_array(rng.standard_normal((2, 1, 3, 3)).astype(np.float32), "cw")
    conv = _model(
        [
            helper.make_node("Conv", ["x", "cw"], ["c"], name="conv", pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", ["c", "s", "o", "m", "v"], ["n"], name="bn"),
            helper.make_node("GlobalAveragePool", ["n"], ["y"], name="pool"),
        ],
        [_vi("x", shape=(1, 1, 5, 5))],
        [_vi("y", shape=(1, 2, 1, 1))],
        [conv_w]
        + [
            numpy_helper.from_array(np.ones(2, np.float32) * k, n)
            for k, n in ((1, "s"), (0, "o"), (0, "m"), (1, "v"))
        ],  # fmt: skip
    )
    half = _model(
        [
            helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16, name="down"),
            helper.make_node("LayerNormalization", ["h", "g", "b16"], ["l"], name="ln", axis=-1),
            helper.make_node("Cast", ["l"], ["y"], to=TensorProto.FLOAT, name="up"),
        ],
        [_vi("x")],
        [_vi("y")],
        [
            numpy_helper.from_array(np.ones(4, np.float16), "g"),
            numpy_helper.from_array(np.zeros(4, np.float16), "b16"),
        ],
    )
    external = _model(
        [helper.make_node("Mul", ["x", "e"], ["y"], name="mul")], [_vi("x")], [_vi("y")]
    )
    e = TensorProto(name="e", data_type=TensorProto.FLOAT, dims=[4])
    e.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "weights.bin"), ("offset", "0"), ("length", "16")):
        e.external_data.add(key=key, value=value)
    external.graph.initializer.append(e)
    then = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [], [_vi("t")])
    other = helper.make_graph([helper.make_node("Abs", ["x"], ["o"])], "else", [], [_vi("o")])
    branch = _model(
        [
            helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="sum"),
            helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
            helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if"),
        ],
        [_vi("x")],
        [_vi("y")],
        [numpy_helper.from_array(np.array(0, np.float32), "zero")],
    )
    function = helper.make_function(
        "local", "Twice", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])],
        opset_imports=[helper.make_opsetid("", 17)],
    )  # fmt: skip
    local = _model(
        [helper.make_node("Twice", ["x"], ["y"], domain="local", name="twice")],
        [_vi("x")],
        [_vi("y")],
        functions=[function],
    )
    return {
        name: m.SerializeToString()
        for name, m in (
            ("mlp", mlp),
            ("conv", conv),
            ("half", half),
            ("external", external),
            ("branch", branch),
            ("function", local),
        )  # fmt: skip
    }


def input_files() -> dict[str, bytes]:
    """Each reader's file behind its selector byte (0 safetensors, 1 npz, 2 tensor .pb)."""
    arrays = {
        "x": np.arange(12, dtype=np.float32).reshape(3, 4),
        "ids": np.arange(5, dtype=np.int64),
        "h": np.ones((2, 2), np.float16),
    }
    header = {}
    data = b""
    for name, a in arrays.items():
        dtype = {"float32": "F32", "int64": "I64", "float16": "F16"}[str(a.dtype)]
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [len(data), len(data) + a.nbytes]}  # fmt: skip
        data += a.tobytes()
    import json

    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    safetensors = struct.pack("<Q", len(text)) + text + data
    npz = io.BytesIO()
    np.savez(npz, **arrays)
    compressed = io.BytesIO()
    np.savez_compressed(compressed, **arrays)
    pb = numpy_helper.from_array(arrays["x"], "x").SerializeToString()
    pb16 = numpy_helper.from_array(arrays["h"], "h").SerializeToString()
    return {
        "safetensors": b"\0" + safetensors,
        "npz": b"\1" + npz.getvalue(),
        "npz_compressed": b"\1" + compressed.getvalue(),
        "pb": b"\2" + pb,
        "pb_half": b"\2" + pb16,
    }


def comparisons() -> dict[str, bytes]:
    """dtype bytes (float32 = DType::ALL[1], float16 = [2]), shape, judge, then both sides."""
    r = np.linspace(-3, 3, 64, dtype=np.float32)
    t = r + np.float32(1e-4)
    t[7] = np.nan
    return {
        "f32": bytes([1, 1, 0, 3, 5]) + r.tobytes() + t.tobytes(),
        "f16": bytes([2, 2, 2, 5, 9])
        + r.astype(np.float16).tobytes() * 2
        + t.astype(np.float16).tobytes() * 2,
    }


def main(folder: str) -> None:
    for target, files in (("onnx_model", onnx_models()), ("inputs", input_files()),
                          ("comparison", comparisons())):  # fmt: skip
        out = Path(folder) / target
        out.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (out / name).write_bytes(data)
    onnx.checker.check_model(onnx.load_from_string(onnx_models()["mlp"]))


if __name__ == "__main__":
    main(sys.argv[1])
