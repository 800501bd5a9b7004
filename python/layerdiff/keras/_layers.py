"""A functional Keras model layer by layer: its layers in order with where their inputs come
from, every layer's output from one run (a model that also returns them), the same in a
float64 copy of the model (the numerical truth), and one layer called again on given values."""

from __future__ import annotations

import keras
import numpy as np

from layerdiff import _layerdiff
from layerdiff.tensors import flat


class Layered:
    """`model`'s layers that produce one tensor, in the model's order, and a model returning
    each of their outputs."""

    def __init__(self, model: keras.Model):
        if not isinstance(model, keras.Model) or not hasattr(model, "_inbound_nodes"):
            raise _layerdiff.UsageError("layerdiff keras needs a Keras model")
        if not any(c.__name__ in ("Functional", "Sequential") for c in type(model).__mro__):
            raise _layerdiff.UsageError(
                f"`{model.name}` is a subclassed Keras model: its layers' outputs cannot be "
                "read from one run; build it with the functional API or keras.Sequential"
            )
        self.model = model
        self.layers = [
            layer
            for layer in model.layers
            if not isinstance(layer, keras.layers.InputLayer)
            and len(layer._inbound_nodes) == 1
            and not isinstance(layer.output, (list, tuple, dict))
        ]
        producer = {id(t): i for i, t in enumerate(layer.output for layer in self.layers)}
        self.fed_by = [
            [producer[id(t)] for t in layer._inbound_nodes[0].input_tensors if id(t) in producer]
            for layer in self.layers
        ]
        self.every = keras.Model(model.inputs, [layer.output for layer in self.layers])

    def run(self, inputs) -> list[np.ndarray]:
        """Every listed layer's output on `inputs`, at inference."""
        outputs = self.every(list(inputs), training=False)
        return [np.asarray(o) for o in outputs]

    def listed(self, values: list[np.ndarray], inputs) -> list:
        """The layers as the engine lists them, with their values' shapes and fingerprints."""
        listed = []
        for i, (layer, value) in enumerate(zip(self.layers, values, strict=True)):
            fed = self.fed_by[i]
            source = values[fed[0]] if fed else (inputs[0] if len(inputs) == 1 else None)
            identity = (
                source is not None and source.shape == value.shape and np.array_equal(source, value)
            )
            listed.append(
                _layerdiff.CapturedLayer(
                    name=layer.name,
                    module=_path(layer),
                    module_type=type(layer).__name__,
                    call_index=0,
                    identity=bool(identity),
                    input_from=fed[0] if fed else None,
                    inputs_from=fed,
                    shape=list(value.shape),
                    dtype=value.dtype.name,
                    fingerprint=_layerdiff.fingerprint(flat(layer.name, value))
                    if value.dtype.kind == "f"
                    else None,
                )
            )
        return listed

    def argument_tensors(self, index: int) -> list:
        """The Keras tensors layer `index` reads, in the order of its call."""
        return list(self.layers[index]._inbound_nodes[0].arguments.keras_tensors)

    def arguments(self, index: int, values: list, inputs) -> list:
        """The values layer `index` reads, in the order of its call's Keras tensors: from
        `values` (every listed layer's, by index) and the model's `inputs`."""
        known = {id(t): v for t, v in zip(self.every.outputs, values, strict=True)}
        known.update({id(t): v for t, v in zip(self.model.inputs, inputs, strict=True)})
        return [known[id(t)] for t in self.argument_tensors(index)]

    def call(self, index: int, given) -> np.ndarray:
        """Layer `index` called alone on `given` (its `arguments`), at inference."""
        layer = self.layers[index]
        arguments = layer._inbound_nodes[0].arguments
        args, kwargs = arguments.fill_in(
            {id(t): v for t, v in zip(arguments.keras_tensors, given, strict=True)}
        )
        if getattr(layer, "_call_has_training_arg", False):
            kwargs["training"] = False
        return layer(*args, **kwargs)


def _path(layer) -> str:
    """The layer's module path for the ONNX scopes: its name (a nested model's layers are one
    layer, the nested model)."""
    return layer.name


def float64_copy(model: keras.Model) -> keras.Model:
    """The model rebuilt with every layer in float64 and the same weights, widened."""

    def widened(config):
        if isinstance(config, dict):
            return {k: "float64" if k == "dtype" else widened(v) for k, v in config.items()}
        if isinstance(config, list):
            return [widened(v) for v in config]
        return config

    copy = model.__class__.from_config(widened(model.get_config()))
    copy.set_weights([np.asarray(w, dtype=np.float64) for w in model.get_weights()])
    return copy
