"""The same-precision baseline of each layer, computed by the model's own modules: the layer in
float64 on the reference's values of its inputs as the target holds them, with the model's
weights rounded to the dtype it computes in (never the reference's where it holds them rounded
itself: a bfloat16 reference's rounding is not a float16 target's). The Rust core rounds the
result once more to the target's dtype and judges the target's own error against it
(`layerdiff_core::Baseline`).
Never the side under test: a bfloat16 target measured against itself in bfloat16 proves nothing.

Two ways, by target:

- a PyTorch target re-runs each module call on the reference's inputs (its local error); the
  same call is made in float64 on the same inputs rounded (`exact_call`);
- an ONNX target re-runs groups of its nodes that may span several modules (a Conv folded into
  its BatchNorm), so the whole model is run once more in float64 (`Replay`), in lockstep, with
  every compared layer's output replaced by the reference's value rounded as the target holds
  it: each layer's float64 value is then computed from the rounded values of the compared
  layers just before it, glue code (reshapes, views) included, as the target's group is.
"""

from __future__ import annotations

import copy
import queue

import torch
from torch import nn

from layerdiff.torch._capture import _first_tensor
from layerdiff.torch._lockstep import Lockstep, _Stopped
from layerdiff.torch._streamed import weight, weight_rows
from layerdiff.torch._widened import BAND, CHUNKED_ABOVE, widened_copy

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
_WIDTH = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24, torch.float64: 53}


def narrower(a: torch.dtype | None, b: torch.dtype | None) -> torch.dtype | None:
    """The float dtype of the two with fewer significand bits (None: the other one)."""
    if a is None or b is None:
        return b if a is None else a
    return a if _WIDTH.get(a, 53) <= _WIDTH.get(b, 53) else b


def rounded(value, dtype: torch.dtype | None):
    """A float tensor rounded to `dtype` (when narrower) and widened to float64, on the CPU;
    anything else as it is (integers on the CPU)."""
    if not isinstance(value, torch.Tensor):
        return value
    value = value.detach().to("cpu")
    if not value.is_floating_point():
        return value.clone()
    if dtype is not None and narrower(dtype, value.dtype) is dtype and dtype != value.dtype:
        value = value.to(dtype)
    return value.to(torch.float64)


def as_held(value, held, dtype: torch.dtype | None):
    """A float tensor as the target holds it (`held(value)`: the target's side converts it, a
    bfloat16 value a float16 target holds losing what float16's range cannot hold), rounded
    further to `dtype` where narrower, in float64 on the CPU; anything else as `rounded`
    leaves it."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return rounded(held(value.detach()), dtype)
    return rounded(value, None)


def plain_copy(module: nn.Module, memo: dict | None = None) -> nn.Module:
    """A copy of `module` without any hook (a capture's hooks must not fire for it);
    ``memo``: tensors the copy takes in place of the module's (by id), as `copy.deepcopy`."""
    copied = copy.deepcopy(module, memo)
    for m in copied.modules():
        for name, attribute in vars(m).items():
            if name.startswith(("_forward_", "_backward_")) and hasattr(attribute, "clear"):
                attribute.clear()
    return copied


def exact_call(module: nn.Module | None, func, args, kwargs, held, dtype: torch.dtype):
    """One call made exactly: `module` (a plain float64 copy of the model's, its weights
    rounded to `dtype`) or `func` on `args`/`kwargs`, each float tensor as the target holds it
    (`as_held`: `held(tensor)` converts it so) and rounded to `dtype` where narrower. Its
    first tensor, float64 (indices as they are), on the CPU; autocast off."""
    tree_map = torch.utils._pytree.tree_map
    given, named = (tree_map(lambda t: as_held(t, held, dtype), a) for a in (args, kwargs))
    with torch.no_grad(), no_autocast():
        if module is None:
            out = func(*given, **named)
        elif _banded(module) and len(given) == 1 and not named:
            out = _linear_in_bands(module, given[0], dtype)
        elif _gathers(module) and len(given) == 1 and not named:
            # rounding and widening are elementwise: the rows gathered, then made exact
            table = weight(module, "weight", module.weight)
            out = _rounded_weight(table.detach()[given[0]], dtype).cpu()
        else:
            out = exact_copy(module, dtype).forward(*given, **named)
    out = _first_tensor(out)
    if out is None or not out.is_floating_point():  # indices (argmax) stay integers
        return out
    return out.to(torch.float64)


def exact_copy(module: nn.Module, dtype: torch.dtype | None) -> nn.Module:
    """A plain float64 copy of `module` on the CPU, its floating weights rounded to `dtype`:
    each made straight from the module's own (a streamed model's read from its files), never a
    second copy of them in their dtype."""
    memo: dict = {}
    for m in module.modules():
        for name, t in [*m._parameters.items(), *m._buffers.items()]:
            if t is None or not t.is_floating_point() or id(t) in memo:
                continue
            own = weight(m, name, t)
            made = _rounded_weight(own, dtype).cpu()
            made = made.clone() if made.data_ptr() == own.data_ptr() else made
            memo[id(t)] = nn.Parameter(made, requires_grad=t.requires_grad) if isinstance(
                t, nn.Parameter
            ) else made  # fmt: skip
    return plain_copy(module, memo)


def _gathers(module: nn.Module) -> bool:
    """An embedding whose output is the rows it gathers (`max_norm` rewrites them)."""
    return type(module) is nn.Embedding and module.max_norm is None


def exact_reduction(module: nn.Module | None, args, held, dtype: torch.dtype):
    """The terms of a Linear's or a Conv's sums as `exact_call` makes them (its input rounded
    as the target holds it, its weight to `dtype`): how many each output element sums (its
    fan-in), and per element their root sum of squares, `√(x² ⋆ w²)` by the same op on the
    squares. None for any other module (whose terms are not measured)."""
    import torch.nn.functional as F

    x = next((a for a in args if isinstance(a, torch.Tensor)), None) if args else None
    if module is None or x is None or not x.is_floating_point():
        return None
    x = as_held(x, held, dtype) ** 2
    with torch.no_grad():
        if not isinstance(module, nn.Linear):
            if not isinstance(module, nn.Conv1d | nn.Conv2d | nn.Conv3d):
                return None
            if module.padding_mode != "zeros" or isinstance(module.padding, str):
                return None
            w = _rounded_weight(weight(module, "weight", module.weight), dtype).cpu() ** 2
            conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[w.dim() - 2]
            squares = conv(
                x, w, None, module.stride, module.padding, module.dilation, module.groups
            )
            terms = w[0].numel()
        elif _banded(module):
            squares, terms = _linear_in_bands(module, x, dtype, squared=True), module.in_features
        else:
            w = _rounded_weight(weight(module, "weight", module.weight), dtype).cpu() ** 2
            squares, terms = F.linear(x, w), module.in_features
    return terms, squares.sqrt()


def _banded(module: nn.Module) -> bool:
    """A plain linear layer whose weight in float64 passes `CHUNKED_ABOVE`: made exactly a
    band of output features at a time (a language model's head would otherwise take two
    float64 copies of its matrix at once)."""
    return type(module) is nn.Linear and module.weight.numel() * 8 > CHUNKED_ABOVE


def _linear_in_bands(module: nn.Linear, x: torch.Tensor, dtype, squared: bool = False):
    """`module` on `x` (float64) in float64, its weight and bias rounded to `dtype`, a band of
    output features at a time: each output element the same float64 dot product. ``squared``:
    the product of `x` with the squared weight, no bias (`exact_reduction`'s terms)."""
    import torch.nn.functional as F

    rows, columns = module.weight.shape
    band = max(1, BAND // (columns * 8))
    out = x.new_empty((*x.shape[:-1], rows), dtype=torch.float64)
    for start in range(0, rows, band):
        stop = min(start + band, rows)
        # a band of a streamed model's weight read alone from its files
        part = weight_rows(module, "weight", start, stop, None)
        part = _rounded_weight(part, dtype).cpu()
        part = part * part if squared else part
        bias = (
            None
            if squared or module.bias is None
            else weight_rows(module, "bias", start, stop, None)
        )
        bias = None if bias is None else _rounded_weight(bias, dtype).cpu()
        out[..., start:stop] = F.linear(x, part, bias)
    return out


def _rounded_weight(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """A weight in float64, its values rounded to `dtype` (float16, bfloat16) first, where it
    keeps its device (a float64 copy holds float16 values, as `exact_copy` makes them)."""
    t = t.detach()
    if dtype is not None and dtype not in (torch.float32, torch.float64):
        t = t.to(dtype)
    return t.to(torch.float64)


class no_autocast:
    """Autocast off on the CPU and CUDA (a reference side may run under it)."""

    def __enter__(self):
        self.contexts = [torch.autocast("cpu", enabled=False)]
        if torch.cuda.is_available():
            self.contexts.append(torch.autocast("cuda", enabled=False))
        for c in self.contexts:
            c.__enter__()

    def __exit__(self, *exc):
        for c in reversed(self.contexts):
            c.__exit__(*exc)


class Replay(Lockstep):
    """The model in float64 (its weights rounded to `precision`), run in a thread in lockstep
    with the main pass (see `Lockstep`); at every layer it hands its value over (`next`) and
    continues from the reference's value rounded as the target holds it, for the layers the
    target compares.

    ``compared``: per layer, whether it is compared and the dtype name the target holds it in."""

    def __init__(self, model, inputs, compared, precision, whole=frozenset(), reads_outside=()):
        self.back: queue.Queue = queue.Queue(maxsize=1)
        self.compared = compared
        self.precision = precision

        def rounded_copy(model, inputs):
            # each module's weights made in float64, rounded to `precision`, only while it runs
            # unrounded, the float64 truth's very weights: held once between the two
            same = precision in (None, torch.float32, torch.float64)
            copied = widened_copy(
                model, lambda t: _rounded_weight(t, precision), whole, reads_outside,
                shared="float64" if same else None,
            )  # fmt: skip
            return copied, tuple(rounded(t, precision) for t in inputs)

        super().__init__(model, inputs, rounded_copy, running=no_autocast, whole=whole)

    def _on_layer(self, index, layer, out) -> None:
        super()._on_layer(index, layer, out)
        while not self.stop.is_set():
            try:
                replacement = self.back.get(timeout=0.05)
                break
            except queue.Empty:
                continue
        else:
            raise _Stopped
        if isinstance(replacement, torch.Tensor):
            out.copy_(replacement.to(out.dtype).reshape(out.shape))

    def next(self, index: int, name: str, value: torch.Tensor) -> torch.Tensor | None:
        """The float64 value of layer `index` (`name`), computed from the rounded values before
        it; the reference's `value` of it goes back (rounded) when the target compares it."""
        exact = super().next(name)
        if exact is None:
            return None
        is_compared, held = self.compared[index] if index < len(self.compared) else (False, None)
        self.back.put(rounded(value, _DTYPES.get(held) or self.precision) if is_compared else None)
        return exact


def model_precision(compared) -> torch.dtype | None:
    """The narrow dtype most compared layers' values are held in (the target's precision), or
    None for float32."""
    counts: dict[str, int] = {}
    for is_compared, held in compared:
        if is_compared and held in ("float16", "bfloat16"):
            counts[held] = counts.get(held, 0) + 1
    if not counts:
        return None
    return _DTYPES[max(counts, key=counts.get)]
