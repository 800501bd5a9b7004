"""A Keras model's PyTorch twin as its target: the same architecture in PyTorch, compared layer
by layer on the same inputs, each Keras layer paired with a PyTorch module by name (or by the
user's map, or in order among the layers that hold weights), the weights checked across the
two layouts, and each module re-run on Keras's values of its inputs for its own error.

Layouts are handled explicitly, never guessed from shapes: PyTorch's 4-D values are
channels-first (NCHW) and Keras's channels-last (NHWC), so every 4-D value is transposed at the
boundary (a 3-D one where the module is a 1-D convolution, pooling or batch norm); a kernel is
converted by its layer's kind (`keras_weights`).
"""

from __future__ import annotations

import numpy as np
import torch

from layerdiff import _layerdiff

# 3-D values of these modules are channels-first (N, C, L); others' are (N, T, C) as in Keras.
_CHANNELS_FIRST_1D = ("Conv1d", "MaxPool1d", "AvgPool1d", "BatchNorm1d", "AdaptiveAvgPool1d")


def keras_weights(layer, module) -> list[np.ndarray]:
    """`module`'s parameters in the order and layouts of the Keras `layer`'s weights (a
    Conv2d's (O, I, H, W) as (H, W, I, O), a Linear's (O, I) as (I, O), a multi-head
    attention's packed projections split per head)."""
    kind = type(layer).__name__
    module = _holding(module)
    p = {n: t.detach().double().numpy() for n, t in module.named_parameters(recurse=False)}
    p.update({n: t.detach().double().numpy() for n, t in module.named_buffers(recurse=False)})
    bias = [p["bias"]] if p.get("bias") is not None and len(layer.weights) > 1 else []
    if kind == "Conv2D":
        return [p["weight"].transpose(2, 3, 1, 0), *bias]
    if kind == "Conv1D":
        return [p["weight"].transpose(2, 1, 0), *bias]
    if kind == "DepthwiseConv2D":
        w = p["weight"]  # (C·M, 1, H, W)
        channels = layer.weights[0].shape[2]
        h, wd = w.shape[2:]
        return [w.reshape(channels, -1, h, wd).transpose(2, 3, 0, 1), *bias]
    if kind == "Dense":
        return [p["weight"].T, *bias]
    if kind == "BatchNormalization":
        found = {
            "gamma": p.get("weight"),
            "beta": p.get("bias"),
            "moving_mean": p["running_mean"],
            "moving_variance": p["running_var"],
        }
        return [found[w.name] for w in layer.weights]
    if kind == "LayerNormalization":
        return [{"gamma": p["weight"], "beta": p.get("bias")}[w.name] for w in layer.weights]
    if kind == "MultiHeadAttention":
        return _attention_weights(layer, p)
    raise _layerdiff.UsageError(
        f"layerdiff does not convert a PyTorch `{type(module).__name__}`'s weights into a Keras "
        f"`{kind}` (`{layer.name}`)"
    )


def _attention_weights(layer, p) -> list[np.ndarray]:
    """nn.MultiheadAttention's packed `in_proj_weight` (3·E, E) and `out_proj` as Keras's
    query/key/value kernels (E, heads, d) and biases (heads, d), output kernel (heads, d, E)."""
    heads, d = layer.weights[0].shape[1], layer.weights[0].shape[2]
    e = heads * d
    w, b = p["in_proj_weight"], p.get("in_proj_bias")
    out = []
    for k in range(3):
        out.append(w[k * e : (k + 1) * e].T.reshape(-1, heads, d))
        if b is not None:
            out.append(b[k * e : (k + 1) * e].reshape(heads, d))
    out.append(p["out_weight"].T.reshape(heads, d, -1))
    if p.get("out_bias") is not None:
        out.append(p["out_bias"])
    return out


def copy_weights(pairs: dict, keras_model, torch_model) -> None:
    """Copies every paired PyTorch module's weights into its Keras layer (`pairs`: Keras layer
    name → PyTorch module name), converted by `keras_weights`."""
    modules = dict(torch_model.named_modules())
    for name, qualified in pairs.items():
        layer = keras_model.get_layer(name)
        if layer.weights:
            layer.set_weights(keras_weights(layer, modules[qualified]))


def _holding(module):
    """The module holding the parameters: itself, else its first child that holds some (a
    Sequential of a convolution and its activation); an attention's output projection is
    gathered with it."""
    if type(module).__name__ == "MultiheadAttention":
        return _Attention(module)
    if any(True for _ in module.parameters(recurse=False)):
        return module
    for child in module.modules():
        if any(True for _ in child.parameters(recurse=False)):
            return child
    return module


class _Attention(torch.nn.Module):
    """nn.MultiheadAttention's parameters flat, the output projection's as out_*."""

    def __init__(self, attention):
        super().__init__()
        self.in_proj_weight = attention.in_proj_weight
        self.in_proj_bias = attention.in_proj_bias
        self.out_weight = attention.out_proj.weight
        self.out_bias = attention.out_proj.bias


def pair_layers(layered, torch_model, given: dict | None = None) -> tuple[dict, dict]:
    """`({keras layer index: PyTorch module name}, {index: why unpaired})`: the user's map first,
    then the same name (`block1_conv` or `block1.conv`), then in order among the layers that
    hold weights and the modules that do."""
    modules = dict(torch_model.named_modules())
    modules.pop("", None)
    by_index, unpaired = {}, {}
    names = [layer.name for layer in layered.layers]
    for keras_name, qualified in (given or {}).items():
        if keras_name not in names:
            raise _layerdiff.UsageError(f"the weight map names `{keras_name}`, no Keras layer")
        if qualified not in modules:
            raise _layerdiff.UsageError(f"the weight map names `{qualified}`, no PyTorch module")
        by_index[names.index(keras_name)] = qualified
    taken = set(by_index.values())
    for i, name in enumerate(names):
        if i in by_index:
            continue
        for candidate in (name, name.replace("_", ".")):
            if candidate in modules and candidate not in taken:
                by_index[i] = candidate
                taken.add(candidate)
                break
    weighted = [i for i, layer in enumerate(layered.layers) if layer.weights and i not in by_index]
    holders = [
        n
        for n, m in modules.items()
        if n not in taken
        and not any(n.startswith(t + ".") for t in taken)
        and any(True for _ in m.parameters(recurse=False))
    ]
    if weighted and len(weighted) == len(holders):
        by_index.update(zip(weighted, holders, strict=True))
    for i, name in enumerate(names):
        if i not in by_index:
            unpaired[i] = (
                f"no PyTorch module pairs with `{name}` (by the map, by name, or in order among "
                "the layers with weights): computed by the twin outside its modules"
            )
    return by_index, unpaired


def to_torch_layout(x: np.ndarray, channels_first_1d: bool = False) -> torch.Tensor:
    x = np.asarray(x)
    if x.ndim == 4:
        x = x.transpose(0, 3, 1, 2)
    elif x.ndim == 3 and channels_first_1d:
        x = x.transpose(0, 2, 1)
    return torch.from_numpy(np.array(x, order="C", copy=True))  # TF hands read-only arrays


def to_keras_layout(y: torch.Tensor, channels_first_1d: bool = False) -> np.ndarray:
    if isinstance(y, (tuple, list)):
        y = y[0]  # nn.MultiheadAttention: (output, weights)
    y = y.detach().numpy()
    if y.ndim == 4:
        y = y.transpose(0, 2, 3, 1)
    elif y.ndim == 3 and channels_first_1d:
        y = y.transpose(0, 2, 1)
    return np.ascontiguousarray(y)


class TorchTwin:
    """The PyTorch twin of a Keras model, handing over each paired layer's value (in Keras's
    layout) and its module re-run on Keras's values of its inputs."""

    runtime = f"torch {torch.__version__}"

    def __init__(self, layered, inputs, torch_model, weight_map: dict | None = None):
        self.layered = layered
        self.model = torch_model.eval()
        self.pairs, self.unpaired = pair_layers(layered, torch_model, weight_map)
        self.modules = dict(torch_model.named_modules())
        how = "your map" if weight_map else "name and order"
        self.detail = (
            f"PyTorch {torch.__version__} eager, cpu, float32: `{type(torch_model).__name__}`, "
            f"{len(self.pairs)} of {len(layered.layers)} layers paired by {how}"
        )
        self.calls = {}
        self._values = None

    def paired_names(self) -> dict:
        """Keras layer name → the PyTorch module name it pairs with."""
        return {self.layered.layers[i].name: name for i, name in self.pairs.items()}

    def _first_1d(self, index: int) -> bool:
        module = self.modules[self.pairs[index]]
        return type(_holding(module)).__name__ in _CHANNELS_FIRST_1D

    def values(self, inputs) -> list:
        if self._values is None:
            self._values = self._run(inputs)
        return self._values

    def _run(self, inputs) -> list:
        calls = {}
        hooks = []
        for index, name in self.pairs.items():

            def hook(module, args, kwargs, output, index=index):
                calls.setdefault(index, (args, kwargs, output))

            hooks.append(self.modules[name].register_forward_hook(hook, with_kwargs=True))
        try:
            with torch.no_grad():
                self.model(*[to_torch_layout(x) for x in inputs])
        finally:
            for h in hooks:
                h.remove()
        self.calls = calls
        out = []
        for index in range(len(self.layered.layers)):
            if index not in calls:
                if index in self.pairs:
                    self.unpaired[index] = (
                        f"the PyTorch module `{self.pairs[index]}` paired with it was not called"
                    )
                out.append(None)
                continue
            out.append(to_keras_layout(calls[index][2], self._first_1d(index)))
        return out

    def local(self, index: int, values: list, inputs):
        """Its module run alone on Keras's values of the layer's inputs, in PyTorch's layout."""
        args, kwargs, _ = self.calls[index]
        given = self.layered.arguments(index, values, inputs)
        first_1d = self._first_1d(index)
        fed = [to_torch_layout(a, first_1d) for a in given]
        if len(fed) != len(args):
            if type(self.modules[self.pairs[index]]).__name__ == "MultiheadAttention" and len(
                fed
            ) in (1, 2):
                fed = [fed[0], fed[-1], fed[-1]]  # Keras: (query, value), key = value
            else:
                return None, (
                    f"`{self.pairs[index]}` took {len(args)} input(s), the Keras layer "
                    f"{len(fed)}: it cannot be fed Keras's values"
                )
        try:
            with torch.no_grad():
                out = self.modules[self.pairs[index]](*fed, **kwargs)
        except Exception as e:
            return None, f"`{self.pairs[index]}` on Keras's values failed: {type(e).__name__}: {e}"
        return to_keras_layout(out, first_1d), None

    def stored_for_checks(self, index: int):
        """The paired module's weights in the Keras layer's layouts, for the weight check."""
        layer = self.layered.layers[index]
        if index not in self.pairs or not layer.weights:
            return None
        try:
            converted = keras_weights(layer, self.modules[self.pairs[index]])
        except _layerdiff.UsageError:
            return None
        if len(converted) != len(layer.weights):
            return None
        return [
            (w, np.asarray(value, dtype=np.float64), None)
            for w, value in zip(layer.weights, converted, strict=True)
        ]
