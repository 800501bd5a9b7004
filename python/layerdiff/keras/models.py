"""Keras models to compare: built-in architectures with random weights from the seed, a saved
`.keras` file, or a user's builder (`path/to/file.py:build`, `package.module:build`)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import keras
import numpy as np

from layerdiff import _layerdiff
from layerdiff._builders import builder_function
from layerdiff._keras_zoo import KERAS_MODELS


def _cnn() -> keras.Model:
    """A small residual CNN: conv, batch norm, ReLU, depthwise conv, a residual add, pooling,
    dense."""
    image = keras.Input((32, 32, 3), name="image")
    x = keras.layers.Conv2D(16, 3, padding="same", name="conv1")(image)
    x = keras.layers.BatchNormalization(name="bn1")(x)
    x = keras.layers.ReLU(name="relu1")(x)
    y = keras.layers.DepthwiseConv2D(3, padding="same", name="dw")(x)
    y = keras.layers.Conv2D(16, 1, name="pw")(y)
    y = keras.layers.Add(name="residual")([x, y])
    y = keras.layers.ReLU(name="relu2")(y)
    y = keras.layers.MaxPooling2D(name="pool")(y)
    y = keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv2")(y)
    y = keras.layers.GlobalAveragePooling2D(name="gap")(y)
    y = keras.layers.Dense(10, name="fc")(y)
    return keras.Model(image, y, name="keras_cnn")


def _encoder() -> keras.Model:
    """A post-norm BERT-style encoder block: multi-head attention, residual, layer norm, a GELU
    feed-forward, residual, layer norm (16 tokens of width 32, 4 heads)."""
    tokens = keras.Input((16, 32), name="tokens")
    a = keras.layers.MultiHeadAttention(4, 8, name="attention")(tokens, tokens)
    x = keras.layers.Add(name="residual1")([tokens, a])
    x = keras.layers.LayerNormalization(epsilon=1e-5, name="norm1")(x)
    f = keras.layers.Dense(64, activation="gelu", name="ff1")(x)
    f = keras.layers.Dense(32, name="ff2")(f)
    y = keras.layers.Add(name="residual2")([x, f])
    y = keras.layers.LayerNormalization(epsilon=1e-5, name="norm2")(y)
    return keras.Model(tokens, y, name="keras_encoder")


def _mobilenet_v2() -> keras.Model:
    return keras.applications.MobileNetV2(
        input_shape=(96, 96, 3), alpha=0.35, weights=None, classes=100
    )


_BUILDERS = {"keras_cnn": _cnn, "keras_encoder": _encoder, "keras_mobilenet_v2": _mobilenet_v2}
# name: (what it exercises, constructor)
ZOO = {name: (KERAS_MODELS[name], build) for name, build in _BUILDERS.items()}


def _example(model: keras.Model, seed: int) -> tuple:
    """Inputs drawn from the seed, batch 1, in the shapes and dtypes the model declares."""
    rng = np.random.default_rng(seed)
    inputs = []
    for tensor in model.inputs:
        shape = [1 if d is None else d for d in tensor.shape]
        if None in tensor.shape[1:]:
            raise _layerdiff.InputError(
                f"input `{tensor.name}` has shape {tuple(tensor.shape)}: give a builder "
                "(`file.py:build` returning the model and its inputs) to fix its sizes"
            )
        inputs.append(rng.standard_normal(shape).astype(tensor.dtype))
    return tuple(inputs)


def load_keras(spec: str, seed: int):
    """`(model, inputs)` for a built-in name, a `.keras` file or a builder spec."""
    keras.utils.set_random_seed(seed)
    if spec in ZOO:
        model = ZOO[spec][1]()
        return model, _example(model, seed)
    if spec.endswith(".keras") or spec.endswith(".h5"):
        if not Path(spec).is_file():
            raise _layerdiff.UsageError(f"Keras file `{spec}` does not exist")
        if spec.endswith(".keras") and not zipfile.is_zipfile(spec):
            raise _layerdiff.ModelError(
                f"`{spec}` is not a Keras model file: a `.keras` file is a zip archive "
                '(`model.save("name.keras")` writes one), and this one is not'
            )
        try:
            model = keras.models.load_model(spec, compile=False)
        except Exception as e:
            raise _layerdiff.ModelError(f"cannot load `{spec}`: {type(e).__name__}: {e}") from e
        return model, _example(model, seed)
    if (Path(spec) / "saved_model.pb").is_file():
        raise _layerdiff.UsageError(
            f"`{spec}` is a SavedModel folder: it holds a traced graph, not Keras layers, so it "
            "cannot be compared layer by layer\nhint: compare the Keras model it was saved "
            "from (a `.keras` file or a builder) with `--target savedmodel`, which saves and "
            "reloads it"
        )
    if ":" not in spec:
        raise _layerdiff.UsageError(
            f"unknown Keras model `{spec}`: expected a built-in name ({', '.join(ZOO)}), a "
            "`.keras` file, `path/to/file.py:function` or `package.module:function`"
        )
    build = builder_function(spec)
    try:
        built = build()
        model, inputs = built
    except Exception as e:
        raise _layerdiff.ModelError(
            f"`{spec}` failed or did not return (model, example_inputs): {type(e).__name__}: {e}"
        ) from e
    if not isinstance(model, keras.Model):
        raise _layerdiff.UsageError(
            f"`{spec}` returned a {type(model).__name__}, not a Keras model"
        )
    return model, tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
