"""A Keras model converted by the TFLite converter (float32, float16 weights, dynamic-range
int8, or full-integer int8 calibrated on a representative dataset) and run by the TFLite
interpreter, every listed layer's value kept.

The interpreter runs the converted model whole: it cannot re-run one layer on Keras's values.
Each layer's own error is therefore measured on the target's *own* values of its inputs (the
values it handed the layer, dequantized): ``exact`` is the Keras layer in float64 on them with
Keras's weights; ``ideal`` is the same with the weights the file stores (dequantized), what an
honest kernel computes before it rounds its output. The engine judges the target's value
against both (``layerdiff_core::assess_quantized`` for a quantized value).

The layer's computation in the file is found by walking back from its value to the values of
the layers it reads (`_tflite_graph`): the TFLite ops in between, and the constants they read
(the stored weights). A Conv2D, DepthwiseConv2D or Dense is one op whose filter and bias map
back onto the Keras weights; a BatchNormalization is a MUL (and an ADD) by constants that map
back onto its scale and offset.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from layerdiff import _layerdiff
from layerdiff._native_output import held_back
from layerdiff.keras._tflite_graph import MOVING, Graph, is_weight, steps

# Calibration runs of the int8 converter: the compared inputs and this many draws like them.
CALIBRATION_DRAWS = 15

PRECISIONS = {
    "tflite": "fp32",
    "tflite:fp16": "fp16",
    "tflite:int8": "int8",
    "tflite:dynamic": "dynamic",
}

_WORDS = {
    "fp32": "float32",
    "fp16": "float16 weights, float32 computation",
    "int8": "full-integer int8, calibrated on the compared inputs and "
    f"{CALIBRATION_DRAWS} draws like them",
    "dynamic": "dynamic-range int8: the larger weights in int8, activations quantized to int8 "
    "by the kernels as they run",
}
# The most an activation's rounding by a hybrid kernel can change a layer, per unit of the
# linear part's bound: the slope of the activation applied after it (ReLU, ReLU6 1, GELU and
# SiLU about 1.13).
_ACTIVATION_SLOPE = 1.25


@dataclass
class Own:
    """A layer's own error's terms: `exact` (float64, Keras weights, the target's inputs),
    `ideal` (with the stored weights, or None and `why`), the value's grid (`(dtype, scale,
    zero point)`) where the target quantizes it."""

    exact: np.ndarray | None
    ideal: np.ndarray | None = None
    grid: tuple | None = None
    why: str | None = None
    slack: np.ndarray | None = None


def convert(model, precision: str, inputs) -> bytes:
    """The flatbuffer of `model` converted at `precision` (`fp32`, `fp16`, `int8`)."""
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    if precision == "fp16":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    elif precision == "dynamic":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]  # no representative dataset
    elif precision == "int8":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.representative_dataset = lambda: iter(calibration(inputs))
    return converter.convert()


def calibration(inputs, seed: int = 0) -> list:
    """The compared inputs, then draws like them (each input's own mean and spread)."""
    rng = np.random.default_rng(seed)
    runs = [[np.asarray(x) for x in inputs]]
    for _ in range(CALIBRATION_DRAWS):
        runs.append(
            [
                (x.mean() + x.std() * rng.standard_normal(x.shape)).astype(x.dtype)
                if x.dtype.kind == "f"
                else x
                for x in runs[0]
            ]
        )
    return runs


class Tflite:
    """The model that returns every layer's output, converted and run by the interpreter."""

    runtime = f"tflite {tf.__version__}"
    # how it computes every layer below the reference's precision, where no dtype shows it
    lower_precision = None
    # replaced by `convert` in a test that edits the file as a faulty converter would
    convert = staticmethod(convert)

    def __init__(self, layered, inputs, spelling: str = "tflite"):
        self.layered = layered
        self.precision = PRECISIONS[spelling]
        if self.precision == "fp16":
            self.lower_precision = "TFLite stores its weights in float16 and computes in float32"
        elif self.precision == "dynamic":
            self.lower_precision = (
                "TFLite stores the larger weights in int8 and its kernels quantize their float "
                "inputs to int8 as they run"
            )
        self.detail = (
            f"TFLite converter and interpreter ({_WORDS[self.precision]}), "
            f"tensorflow {tf.__version__}, cpu"
        )
        printed: list[str] = []
        try:
            # the converter prints the model it saves on stdout, where reports may go
            with (
                contextlib.redirect_stdout(io.StringIO()),
                warnings.catch_warnings(),
                held_back(printed),  # the converter's own log lines ("fully_quantize: 0, …")
            ):
                warnings.simplefilter("ignore")  # "statistics for quantized inputs…": float I/O
                self.flatbuffer = type(self).convert(layered.every, self.precision, inputs)
        except Exception as e:
            last = [line for line in "".join(printed).splitlines() if line.strip()][-3:]
            raise _layerdiff.ModelError(
                f"the TFLite converter could not convert `{layered.model.name}` "
                f"({self.precision}): {type(e).__name__}: {e}"
                + (f" (it printed last: {' / '.join(last)})" if last else "")
            ) from e
        with warnings.catch_warnings(), held_back():  # "INFO: Created TensorFlow Lite XNNPACK…"
            warnings.simplefilter("ignore")  # tf.lite.Interpreter's deprecation notice
            self.interpreter = tf.lite.Interpreter(
                model_content=self.flatbuffer, experimental_preserve_all_tensors=True
            )
            self.interpreter.allocate_tensors()
        self.graph = Graph(self.interpreter, len(layered.layers))
        self.inputs = None

    def values(self, inputs) -> list[np.ndarray]:
        for detail, x in zip(self.graph.input_details, inputs, strict=True):
            self.interpreter.set_tensor(detail["index"], x)
        self.interpreter.invoke()
        self.inputs = [self.graph.held_input(k, x) for k, x in enumerate(inputs)]
        return [self.interpreter.get_tensor(i).copy() for i in self.graph.outputs]

    def own(self, index: int, theirs: list, wide) -> Own:
        """Layer `index`'s own error's terms on the target's values `theirs` (every layer's, as
        `values` returned them), computed by `wide` (the float64 copy of the model)."""
        layer = self.layered.layers[index]
        walk = self.graph.walk(index)
        if walk.why:
            return Own(None, why=walk.why)
        expected = {self.graph.tensor_of(j) for j in self.layered.fed_by[index]}
        expected |= {
            self.graph.input_tensor(k)
            for k, t in enumerate(self.layered.model.inputs)
            if any(t is a for a in self.layered.argument_tensors(index))
        }
        if walk.boundary != expected and walk.boundary != self._through_moves(index, expected):
            return Own(
                None,
                why=f"TFLite computes `{layer.name}` from other values than the layer reads "
                "(a fusion across layers)",
            )
        given = [_widened(a) for a in self.layered.arguments(index, theirs, self.inputs)]
        exact = np.asarray(wide.call(index, given))
        grid = self.graph.grid(index)
        stored, why = self.stored(index, walk)
        if stored is None and self.precision == "fp16" and wide.layers[index].weights:
            # the converter stores every float constant in float16, each rounded alone
            stored = [np.asarray(w).astype(np.float16) for w in layer.get_weights()]
            why = None
        elif stored is None and self.precision == "fp16":
            # constants of a layer without weights (a Rescaling's scale) are its config, which
            # no ideal here rounds as the file does
            rounded = sorted({op for op, _, d, *_ in walk.constants if d["dtype"] == np.float16})
            if rounded:
                why = (
                    f"TFLite stores the constants `{layer.name}` computes with "
                    f"({', '.join(rounded)}) in float16, and they are not weights of the "
                    "layer: no ideal computation here rounds them as the file does"
                )
        if why is None and grid is not None and walk.stages > 1:
            why = (
                f"TFLite computes it in {walk.stages} quantized steps "
                f"({', '.join(walk.computing)}), "
                "each rounded to a grid of its own: an ideal rounded once does not model them"
            )
        float32 = self.precision == "fp32" or (
            self.precision == "dynamic"
            and all(
                np.dtype(c[2]["dtype"]) == np.float32 for c in walk.constants if is_weight(c[2])
            )
        )
        if why is not None and float32:
            why, stored = None, None  # float32 constants are the layer's weights
        if why is not None:
            return Own(exact.astype(np.float32), None, grid, why)
        ideal = (
            exact
            if stored is None
            else _with_weights(wide.layers[index], stored, given, wide, index)
        )
        slack = None
        if walk.hybrid and stored is not None:
            slack = _input_rounding(wide.layers[index], stored, given, wide, index)
        return Own(exact.astype(np.float32), ideal, grid, slack=slack)

    def _through_moves(self, index: int, expected: set) -> set:
        """`expected` with the value of each layer that only moves data (a ZeroPadding2D's PAD)
        replaced by what that layer reads: a converter fuses such a layer into the op after it
        (a convolution padding by itself), which then reads the same values."""
        moved = set(expected)
        for j in self.layered.fed_by[index]:
            walk = self.graph.walk(j)
            if walk.ops and not walk.why and set(walk.ops) <= MOVING:
                moved.discard(self.graph.tensor_of(j))
                moved |= walk.boundary
        return moved

    def stored(self, index: int, walk=None):
        """The weights the file stores for layer `index`, dequantized, in the order and layout
        of the Keras layer's weights (None where the layer has none or they do not map back),
        and why not where they should and do not."""
        layer = self.layered.layers[index]
        if not layer.weights:
            return None, None
        walk = walk or self.graph.walk(index)
        kind = type(layer).__name__
        # the stored weights, not the shapes and indices that reshapes and gathers read
        constants = [c for c in walk.constants if is_weight(c[2])]
        ops = walk.ops
        keras = layer.get_weights()
        holders = sorted({op for op, *_ in constants})
        try:
            if (
                kind in ("Conv2D", "DepthwiseConv2D", "Dense")
                and holders in (["CONV_2D"], ["DEPTHWISE_CONV_2D"], ["FULLY_CONNECTED"])
                and ops.count(holders[0]) == 1
            ):
                # the op with the filter, with reshapes around it (a Dense on a sequence) and
                # an activation of its own after it (a softmax)
                return _filter_and_bias(kind, holders[0], constants, keras), None
            if kind == "BatchNormalization" and ops[:1] == ["MUL"] and len(ops) <= 2:
                return _batch_norm(layer, constants, keras), None
        except _Unmapped as e:
            return None, str(e)
        return None, (
            f"TFLite stores `{layer.name}`'s weights as constants of "
            f"{', '.join(holders) or 'no op'} that layerdiff does not map back onto the "
            "layer's weights"
        )

    def stored_for_checks(self, index: int):
        """Layer `index`'s stored weights (named as Keras names them) and half a step of their
        storage per element, where they map back."""
        stored, _ = self.stored(index)
        if stored is None:
            return None
        layer = self.layered.layers[index]
        walk = self.graph.walk(index)
        halves = _half_steps(layer, walk, stored)
        return list(zip(layer.weights, stored, halves, strict=True))


class _Unmapped(Exception):
    pass


def _filter_and_bias(kind: str, op: str, constants, keras: list) -> list:
    """A convolution's or a dense layer's stored filter and bias in Keras's layouts."""
    by_position = {position: (detail, value) for _, position, detail, value in constants}
    if 1 not in by_position:
        raise _Unmapped(f"the {op} op reads no stored filter")
    detail, w = by_position[1]
    if kind == "Conv2D":  # OHWI → HWIO
        kernel = w.transpose(1, 2, 3, 0)
    elif kind == "DepthwiseConv2D":  # (1, H, W, C·M) → (H, W, C, M)
        h, wd, c, m = keras[0].shape
        kernel = w.reshape(h, wd, c, m)
    else:  # FULLY_CONNECTED (O, I) → (I, O)
        kernel = w.T
    if kernel.shape != keras[0].shape:
        raise _Unmapped(f"the stored filter has shape {w.shape}, the layer's {keras[0].shape}")
    stored = [kernel]
    if len(keras) > 1:
        bias = by_position.get(2, (None, np.zeros(keras[1].shape)))[1]
        stored.append(bias.reshape(keras[1].shape))
    return stored


def _batch_norm(layer, constants, keras: list) -> list:
    """A BatchNormalization stored as `x·m (+ b)`: Keras's weights that give the same `m` and
    `b`, scale `m·√(var+ε)` and offset `b + mean·m` (mean and variance kept)."""
    names = [w.name for w in layer.weights]
    weights = dict(zip(names, keras, strict=True))
    mean, var = weights["moving_mean"].astype(np.float64), weights["moving_variance"]
    root = np.sqrt(var.astype(np.float64) + layer.epsilon)
    m = [v for op, _, _, v in constants if op == "MUL"]
    b = [v for op, _, _, v in constants if op in ("ADD", "SUB")]
    if len(m) != 1 or len(b) > 1:
        raise _Unmapped("the batch norm's stored constants are not one scale and one offset")
    m = np.broadcast_to(m[0].reshape(-1), mean.shape)
    b = np.broadcast_to(b[0].reshape(-1), mean.shape) if b else np.zeros_like(mean)
    if any(op == "SUB" for op, *_ in constants):
        b = -b
    stored = {"gamma": m * root, "beta": b + mean * m, "moving_mean": mean, "moving_variance": var}
    if "gamma" not in weights or "beta" not in weights:
        raise _Unmapped("a batch norm without scale or offset is not mapped back")
    return [np.asarray(stored[n], dtype=np.float64) for n in names]


def _half_steps(layer, walk, stored: list) -> list:
    """Half a step of each stored weight's storage, per element, in the Keras layout: its
    integer scale (a bias: its int32 scale), or the spacing of its float type."""

    def half(detail, value):
        if np.dtype(detail["dtype"]).kind in "iu":
            return steps(detail, value.shape) / 2
        return np.spacing(np.abs(value).astype(detail["dtype"])).astype(np.float64) / 2

    kind = type(layer).__name__
    constants = [c for c in walk.constants if is_weight(c[2])]
    if kind in ("Conv2D", "DepthwiseConv2D", "Dense"):
        by_position = {p: (d, v) for _, p, d, v in constants}
        halves = []
        for slot, position in ((0, 1), (1, 2))[: len(stored)]:
            if position in by_position:
                raw = half(*by_position[position])
                halves.append(_like_stored(kind, slot, raw, stored[slot].shape))
            else:  # a bias the file does not store: zero, exactly
                halves.append(np.zeros(stored[slot].shape))
        return [np.ascontiguousarray(h, dtype=np.float64) for h in halves]
    # a batch norm stored as x·m + b: its scale m·√(var+ε) and offset b + mean·m
    names = [w.name for w in layer.weights]
    keras = dict(zip(names, layer.get_weights(), strict=True))
    root = np.sqrt(keras["moving_variance"].astype(np.float64) + layer.epsilon)
    mean = np.abs(keras["moving_mean"].astype(np.float64))
    halves = {n: np.zeros(root.shape) for n in names}
    for op, _, detail, value in constants:
        h = np.broadcast_to(half(detail, value).reshape(-1), root.shape)
        if op == "MUL":
            halves["gamma"] = halves["gamma"] + h * root
            halves["beta"] = halves["beta"] + h * mean
        else:
            halves["beta"] = halves["beta"] + h
    return [np.ascontiguousarray(halves[n], dtype=np.float64) for n in names]


def _like_stored(kind: str, slot: int, raw, shape) -> np.ndarray:
    """A per-element array of the stored filter (slot 0) or bias in the Keras layout."""
    if slot == 1:
        return np.asarray(raw).reshape(shape)
    if kind == "Conv2D":
        return np.asarray(raw).transpose(1, 2, 3, 0)
    if kind == "DepthwiseConv2D":
        return np.asarray(raw).reshape(shape)
    return np.asarray(raw).T


def _input_rounding(layer, stored: list, given, wide, index: int) -> np.ndarray:
    """Per output element, the most a hybrid kernel's rounding of its float input to int8 can
    move the layer: each input element moved by up to one step of the widest such rounding
    (max |x| / 127: symmetric per tensor; asymmetric or per-row roundings step less), through
    the absolute weights, times the activation's slope. A bound, not an estimate: a kernel
    beyond it computes something else."""
    x = np.asarray(given[0], dtype=np.float64)
    step = float(np.abs(x).max()) / 127.0
    absolute = [np.abs(stored[0])] + [np.zeros_like(w) for w in stored[1:]]
    activation = getattr(layer, "activation", None)
    if activation is not None:
        layer.activation = lambda v: v  # the linear part; the slope is allowed for below
    try:
        moved = _with_weights(layer, absolute, [np.full_like(x, step)] + given[1:], wide, index)
    finally:
        if activation is not None:
            layer.activation = activation
    return np.abs(np.asarray(moved)) * _ACTIVATION_SLOPE


def _with_weights(layer, weights: list, given, wide, index: int) -> np.ndarray:
    """`wide`'s layer `index` called on `given` with `weights` in place of its own."""
    own = layer.get_weights()
    layer.set_weights([np.asarray(w, dtype=np.float64) for w in weights])
    try:
        return np.asarray(wide.call(index, given))
    finally:
        layer.set_weights(own)


def _widened(x):
    x = np.asarray(x)
    return x.astype(np.float64) if x.dtype.kind == "f" else x
