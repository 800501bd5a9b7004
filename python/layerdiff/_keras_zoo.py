"""The built-in Keras models by name, with what each exercises and whether it has a PyTorch
twin: what `layerdiff zoo` lists without importing TensorFlow (`layerdiff.keras.models` builds
them)."""

from __future__ import annotations

KERAS_MODELS = {
    "keras_cnn": "conv, batch norm, depthwise conv, a residual add, pooling (PyTorch twin)",
    "keras_encoder": (
        "a BERT-style encoder block: multi-head attention, layer norm, GELU feed-forward "
        "(PyTorch twin)"
    ),
    "keras_mobilenet_v2": (
        "keras.applications' MobileNetV2 (alpha 0.35, 96×96): inverted residuals, ReLU6"
    ),
}
