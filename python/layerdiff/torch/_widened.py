"""A copy of a model that holds each module's weights only while that module runs: the float64
truth and the baseline's replay without a float64 copy of the whole model in memory.

The copy has the model's structure; its parameters and buffers are placeholders on the `meta`
device, in the dtype they will have (a module's code that asks for `self.weight.dtype` is told
float64). Before a module runs, its own weights are made from the model's (`convert`: widened,
rounded); a leaf module (and one taken whole, or one whose code reads its submodules' weights
itself: `Capture.reads_outside`) gets all of its submodules' too. After it returns, they go back
to placeholders. At any moment the copy holds the weights of the modules running, one block of
a transformer rather than all of them. Weights read by a module that is not running would be
placeholders, and fail loudly rather than compute wrong: the listing pass names the modules
that do so, and they hold their submodules' weights."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable

import torch
from torch import nn

from layerdiff.torch._capture import leaf_modules
from layerdiff.torch._streamed import weight


def widened_copy(
    model: nn.Module,
    convert: Callable[[torch.Tensor], torch.Tensor],
    whole=frozenset(),
    reads_outside=(),
    shared: str | None = None,
) -> nn.Module:
    """The copy (see the module docs); `convert` makes a floating weight of the copy from the
    model's (`lambda t: t.double()` for the truth). Copies of one model given the same
    ``shared`` name convert alike, and hold one tensor of each weight between them while they
    run the same module (`_Made`): the float64 truth and a float32 target's baseline."""
    dtype = convert(torch.zeros(1)).dtype
    memo: dict = {}
    for module in model.modules():
        for t in [*module._parameters.values(), *module._buffers.values()]:
            if t is None or id(t) in memo:
                continue
            held = dtype if t.is_floating_point() else t.dtype
            placeholder = torch.empty(t.shape, dtype=held, device="meta")
            memo[id(t)] = nn.Parameter(placeholder, False) if isinstance(t, nn.Parameter) else (
                placeholder
            )  # fmt: skip
    copied = copy.deepcopy(model, memo)
    originals = dict(model.named_modules())
    recursive = {name for name, _ in leaf_modules(copied, whole)} | set(reads_outside)
    holding: dict[int, int] = {}  # id of a module of the copy → how many running hold it
    made = _Conversion(convert, dtype, shared)
    for name, module in copied.named_modules():
        original = originals[name]
        pairs = (
            list(zip(module.modules(), original.modules(), strict=True))
            if name in recursive
            else [(module, original)]
        )
        module.register_forward_pre_hook(_holder(pairs, made, holding))
        module.register_forward_hook(_dropper(pairs, made, holding), always_call=True)
    return copied


class _Made:
    """Weights made from the model's that copies converting alike share: each made once, by the
    first copy to run its module, and dropped when the last copy holding it lets go."""

    def __init__(self):
        self.lock = threading.Lock()  # the copies run in threads of their own
        self.held: dict[tuple, list] = {}

    def take(self, key: tuple, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        with self.lock:
            entry = self.held.get(key)
            if entry is None:
                entry = self.held[key] = [make(), 0]
            entry[1] += 1
            return entry[0]

    def let_go(self, key: tuple) -> None:
        with self.lock:
            entry = self.held[key]
            entry[1] -= 1
            if entry[1] == 0:
                del self.held[key]


_MADE = _Made()


class _Conversion:
    """How a copy makes a weight from the model's (`convert`, into `dtype`), shared with the
    copies of the same ``shared`` name."""

    def __init__(self, convert, dtype, shared):
        self.convert, self.dtype, self.shared = convert, dtype, shared

    def key(self, original: nn.Module, kind: str, name: str) -> tuple | None:
        return None if self.shared is None else (id(original), kind, name, self.shared)

    def make(self, original: nn.Module, kind: str, name: str, t: torch.Tensor) -> torch.Tensor:
        def made():
            w = weight(original, name, t, self.dtype) if kind == "p" else t  # streamed: files
            w = w.detach()
            return self.convert(w) if w.is_floating_point() else w

        key = self.key(original, kind, name)
        return made() if key is None else _MADE.take(key, made)

    def drop(self, original: nn.Module, kind: str, name: str) -> None:
        key = self.key(original, kind, name)
        if key is not None:
            _MADE.let_go(key)


def _holder(pairs, made: _Conversion, holding):
    """A pre-hook that makes the weights of each module of `pairs` (copy, model) from the
    model's (a streamed model's read from its files in the copy's dtype), unless a running
    module holds them already."""

    def hold(_module, _args):
        for m, o in pairs:
            holding[id(m)] = holding.get(id(m), 0) + 1
            if holding[id(m)] > 1:
                continue
            for name, t in o._parameters.items():
                if t is not None:
                    w = made.make(o, "p", name, t)
                    m._parameters[name] = nn.Parameter(w, requires_grad=False)
            for name, t in o._buffers.items():
                if t is not None:
                    m._buffers[name] = made.make(o, "b", name, t)

    return hold


def _dropper(pairs, made: _Conversion, holding):
    """A forward hook that turns the weights of each module of `pairs` back into placeholders
    once no running module holds them."""

    def drop(_module, _args, _output):
        for m, o in pairs:
            holding[id(m)] -= 1
            if holding[id(m)] > 0:
                continue
            for name, t in m._parameters.items():
                if t is not None and t.device.type != "meta":
                    m._parameters[name] = nn.Parameter(t.to("meta"), requires_grad=False)
                    made.drop(o, "p", name)
            for name, t in m._buffers.items():
                if t is not None and t.device.type != "meta":
                    m._buffers[name] = t.to("meta")
                    made.drop(o, "b", name)

    return drop
