"""A small Keras CNN whose two Conv2D layers each feed a BatchNormalization (one with a ReLU
between): tf2onnx folds each BatchNormalization into its Conv, names the fused Conv without a
scope (`Conv__10`) and names the input's layout Transpose after a BatchNormalization op. Both
BatchNormalizations hold the same statistics, so tf2onnx shares one bias between the Convs."""

import keras
import numpy as np


def build():
    keras.utils.set_random_seed(0)
    x = keras.Input((24, 24, 3), name="x")
    h = keras.layers.Conv2D(8, 3, padding="same", name="conv")(x)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.ReLU(name="relu")(h)
    h = keras.layers.Conv2D(8, 3, padding="same", use_bias=False, name="conv_b")(h)
    h = keras.layers.BatchNormalization(name="bn_b")(h)
    h = keras.layers.GlobalAveragePooling2D(name="gap")(h)
    y = keras.layers.Dense(4, name="fc")(h)
    model = keras.Model(x, y)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            rng = np.random.default_rng(1)
            layer.moving_mean.assign(rng.normal(size=8).astype("float32") * 0.1)
            layer.moving_variance.assign(rng.uniform(0.5, 1.5, 8).astype("float32"))
    inputs = np.random.default_rng(0).normal(size=(1, 24, 24, 3)).astype("float32")
    return model, inputs
