"""What a Keras model is compared with, computed by TensorFlow: its ONNX conversion (tf2onnx),
and each listed layer's value under XLA, in a SavedModel loaded back, or in the TFLite
interpreter (``_tflite``). Each runs the model that returns every listed layer's output, so
the values are the layers' by construction (which may keep a converter from fusing a layer
into the next)."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import numpy as np
import tensorflow as tf

from layerdiff import _layerdiff
from layerdiff.keras._tflite import PRECISIONS, Tflite


def device() -> str:
    """Where TensorFlow places the model's ops by default: its first GPU where it sees one
    (a GPU build of TensorFlow), else the CPU."""
    gpus = tf.config.list_logical_devices("GPU")
    return f"gpu ({gpus[0].name})" if gpus else "cpu"


def signature(model, inputs) -> list:
    return [
        tf.TensorSpec(x.shape, tf.as_dtype(x.dtype), name=t.name.split(":")[0])
        for t, x in zip(model.inputs, inputs, strict=True)
    ]


def to_onnx(model, inputs, path: Path, opset: int) -> Path:
    """The model converted by tf2onnx at `opset`, written to `path`."""
    try:
        import tf2onnx
    except ImportError as e:
        raise _layerdiff.UsageError(
            "converting a Keras model to ONNX needs tf2onnx\nhint: pip install 'layerdiff[tf]'"
        ) from e
    try:
        proto, _ = tf2onnx.convert.from_keras(
            model, input_signature=signature(model, inputs), opset=opset
        )
    except Exception as e:
        raise _layerdiff.ModelError(
            f"tf2onnx could not convert `{model.name}`: {type(e).__name__}: {e}"
        ) from e
    # tf2onnx leaves an op it cannot convert in the file as it is, under TensorFlow's name
    import onnx

    missing = [
        n
        for n in proto.graph.node
        if not onnx.defs.has(n.op_type, n.domain or "") and n.domain in ("", "ai.onnx")
    ]
    if missing:
        ops = sorted({n.op_type for n in missing})
        raise _layerdiff.ModelError(
            f"tf2onnx could not convert `{model.name}` to ONNX (opset {opset}): it left "
            f"TensorFlow op(s) {', '.join(ops)} that ONNX has no such op for, at "
            f"`{missing[0].name}`\nhint: compare with TensorFlow itself (--target xla, "
            "savedmodel, tflite) or build the layer from ops tf2onnx converts (an exact GELU's "
            "Erfc: use `approximate=True`)"
        )
    path.write_bytes(proto.SerializeToString())
    return path


class Xla:
    """The model under `tf.function(jit_compile=True)`; a layer alone is compiled the same way."""

    runtime = f"tensorflow {tf.__version__}"

    def __init__(self, layered, inputs):
        self.detail = f"XLA (jit_compile=True), tensorflow {tf.__version__}, {device()}"
        self.layered = layered
        every = layered.every
        self.compiled = tf.function(lambda *xs: every(list(xs), training=False), jit_compile=True)

    def values(self, inputs) -> list[np.ndarray]:
        return [np.asarray(v) for v in self.compiled(*inputs)]

    def local(self, index: int, values: list, inputs):
        """Layer `index` compiled alone and run on the reference's values of its inputs."""
        layer = self.layered.layers[index]
        call = tf.function(lambda *given: self.layered.call(index, given), jit_compile=True)
        try:
            return np.asarray(call(*self.layered.arguments(index, values, inputs))), None
        except Exception as e:  # a layer XLA cannot compile alone says so in the report
            return None, f"XLA could not compile `{layer.name}` alone: {type(e).__name__}: {e}"


class SavedModel:
    """The model that returns every layer's output, saved as a SavedModel and loaded back."""

    runtime = f"tensorflow {tf.__version__}"
    detail = f"SavedModel saved and loaded back (tf.saved_model.load), tensorflow {tf.__version__}"

    def __init__(self, layered, inputs):
        self.folder = tempfile.TemporaryDirectory()
        path = str(Path(self.folder.name) / "saved")
        every = layered.every
        serve = tf.function(lambda *xs: every(list(xs), training=False))
        module = tf.Module()
        module.every = every
        module.serve = serve.get_concrete_function(*signature(layered.model, inputs))
        tf.saved_model.save(module, path, signatures=module.serve)
        self.loaded = tf.saved_model.load(path)

    def values(self, inputs) -> list[np.ndarray]:
        return [np.asarray(v) for v in self.loaded.serve(*[tf.constant(x) for x in inputs])]

    def local(self, index, values, inputs):
        return None, "a SavedModel loaded back has no layers of its own to call alone"


SIDES = {
    "xla": Xla,
    "savedmodel": SavedModel,
    **{spelling: functools.partial(Tflite, spelling=spelling) for spelling in PRECISIONS},
}
