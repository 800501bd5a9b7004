"""The TFLite interpreter's op graph, read back: which op produces each tensor, which tensor
holds each listed layer's value, and, per layer, the ops that compute it from the values of the
layers it reads (a walk back from its value), the constants they read (its stored weights,
dequantized) and how many of them round a value to a grid of its own."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# TFLite ops that compute nothing (a layer made of these is its input re-labelled).
PASSING = {"RESHAPE", "SQUEEZE", "EXPAND_DIMS"}
# Ops that only move data, which a converter may fold into the op that reads them.
MOVING = PASSING | {"PAD", "PADV2"}


@dataclass
class Walk:
    ops: list
    stages: int
    constants: list  # (op name, input position, tensor detail, value as stored, dequantized)
    boundary: set
    why: str | None = None
    computing: list | None = None  # the ops among `ops` that compute values
    hybrid: bool = False  # an op reads int8 weights and float values (dynamic range)


class Graph:
    """The interpreter's op graph: which op produces each tensor, which tensor holds each
    listed layer's value (before its DEQUANTIZE), the model inputs' tensors."""

    def __init__(self, interpreter, count: int):
        self.interpreter = interpreter
        self.details = {t["index"]: t for t in interpreter.get_tensor_details()}
        self.ops = [op for op in interpreter._get_ops_details() if op["op_name"] != "DELEGATE"]
        self.producer = {o: op for op in self.ops for o in op["outputs"]}
        runner = interpreter.get_signature_runner()
        self.input_details = list(runner.get_input_details().values())
        out = runner.get_output_details()
        # outputs are named output_0, output_1… in the order the model returns them
        self.outputs = [out[f"output_{i}"]["index"] for i in range(count)]
        self.layer_tensors = [self._before_dequantize(o) for o in self.outputs]
        self.input_tensors = [self._quantized_input(d["index"]) for d in self.input_details]
        self.known = {t: ("layer", i) for i, t in enumerate(self.layer_tensors)}
        for k, t in enumerate(self.input_tensors):
            self.known[t] = ("input", k)
            self.known[self.input_details[k]["index"]] = ("input", k)

    def _before_dequantize(self, tensor: int) -> int:
        op = self.producer.get(tensor)
        if op is not None and op["op_name"] == "DEQUANTIZE" and not self._constant(op["inputs"][0]):
            return op["inputs"][0]
        return tensor

    def _quantized_input(self, tensor: int) -> int:
        for op in self.ops:
            if op["op_name"] == "QUANTIZE" and list(op["inputs"]) == [tensor]:
                return op["outputs"][0]
        return tensor

    def _constant(self, tensor: int) -> bool:
        if tensor in self.producer:
            op = self.producer[tensor]
            return op["op_name"] == "DEQUANTIZE" and self._constant(op["inputs"][0])
        return all(tensor != d["index"] for d in self.input_details)

    def tensor_of(self, layer: int) -> int:
        return self.layer_tensors[layer]

    def input_tensor(self, k: int) -> int:
        return self.input_tensors[k]

    def held_input(self, k: int, given):
        """Model input `k` as the target holds it for its first op (quantized, dequantized)."""
        t = self.input_tensors[k]
        if t == self.input_details[k]["index"]:
            return given
        return dequantize(self.details[t], self.interpreter.get_tensor(t))

    def grid(self, layer: int):
        """`(dtype, scale, zero point)` of the value of `layer` where it is quantized."""
        detail = self.details[self.layer_tensors[layer]]
        scale, zero_point = detail["quantization"]
        if detail["dtype"] not in (np.int8, np.uint8, np.int16) or scale == 0:
            return None
        return np.dtype(detail["dtype"]).name, float(scale), int(zero_point)

    def walk(self, layer: int) -> Walk:
        """The ops that compute `layer`'s value from the values of other layers (or the model's
        inputs), the constants they read and the values they start from."""
        start = self.layer_tensors[layer]
        ops, constants, boundary, seen = [], [], set(), set()
        computing = []  # ops that round a value (not a shape or an index) to its grid
        hybrid = False
        pending = [start]
        while pending:
            tensor = pending.pop()
            if tensor in seen:
                continue
            seen.add(tensor)
            if tensor != start and tensor in self.known:
                boundary.add(tensor)
                continue
            op = self.producer.get(tensor)
            if op is None:
                if self._constant(tensor):
                    continue
                return Walk(ops, 0, constants, boundary, f"tensor {tensor} has no producer")
            ops.append(op["op_name"])
            hybrid = hybrid or self._hybrid(op)
            if op["op_name"] not in PASSING | {"QUANTIZE", "DEQUANTIZE"} and is_weight(
                self.details[op["outputs"][0]]
            ):
                computing.append(op["op_name"])
            for position, i in enumerate(op["inputs"]):
                if i < 0:
                    continue
                if self._constant(i):
                    constants.append((op["op_name"], position, *self._stored(i)))
                else:
                    pending.append(i)
        ops.reverse()
        computing.reverse()
        return Walk(ops, len(computing), constants, boundary, computing=computing, hybrid=hybrid)

    def _hybrid(self, op) -> bool:
        """Whether `op` is a hybrid kernel: int8 weights read as they are, float values in."""
        if op["op_name"] not in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"):
            return False
        values, weights = (self.details[i] for i in op["inputs"][:2])
        return np.dtype(values["dtype"]).kind == "f" and np.dtype(weights["dtype"]) == np.int8

    def _stored(self, tensor: int):
        """A constant's detail and its dequantized value (through a DEQUANTIZE of a float16
        constant to the constant itself)."""
        op = self.producer.get(tensor)
        if op is not None:  # DEQUANTIZE of a stored float16 constant
            tensor = op["inputs"][0]
        detail = self.details[tensor]
        return detail, dequantize(detail, self.interpreter.get_tensor(tensor))


def is_weight(detail) -> bool:
    """Whether a tensor holds values (a weight, an activation): a float, or an integer with a
    scale (an int8 filter or activation, an int32 bias), not a shape or an index."""
    kind = np.dtype(detail["dtype"]).kind
    return kind == "f" or (kind in "iu" and len(detail["quantization_parameters"]["scales"]) > 0)


def dequantize(detail, value) -> np.ndarray:
    """A stored tensor's real values, float64: `scale · (q − zero point)` along its quantized
    dimension for integers with a scale, widened for floats."""
    value = np.asarray(value)
    q = detail["quantization_parameters"]
    scales = np.asarray(q["scales"], dtype=np.float64)
    if value.dtype.kind in "iu" and scales.size:
        zero = np.asarray(q["zero_points"], dtype=np.float64)
        shape = [1] * value.ndim
        if scales.size > 1:
            shape[q["quantized_dimension"]] = scales.size
        return (value.astype(np.float64) - zero.reshape(shape)) * scales.reshape(shape)
    return value.astype(np.float64)


def steps(detail, shape) -> np.ndarray:
    """One quantization step per element of a stored integer tensor of `shape`."""
    q = detail["quantization_parameters"]
    scales = np.asarray(q["scales"], dtype=np.float64)
    if scales.size <= 1:
        return np.full(shape, scales.item() if scales.size else 0.0)
    view = [1] * len(shape)
    view[q["quantized_dimension"]] = scales.size
    return np.broadcast_to(scales.reshape(view), shape)
