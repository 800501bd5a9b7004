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
that do so, and they hold their submodules' weights.

The widest modules of a language model, its token embedding and its output head, would each
take the most memory of any moment in float64 (a 32000 × 2048 table: 0.5 GB). So an embedding
holds the model's table as the model holds it and converts only the rows it gathers (converting
is elementwise: the same values), and a linear layer whose converted weight passes
`CHUNKED_ABOVE` computes its outputs a band of rows at a time (`_Chunked`): each output
element the same dot product, in float64. Neither applies where a parent holds the module's
weights (it may read them itself)."""

from __future__ import annotations

import contextlib
import copy
import threading
import weakref
from collections.abc import Callable

import torch
from torch import nn

from layerdiff.torch._capture import leaf_modules
from layerdiff.torch._streamed import register_copy, weight, weight_rows

#: Bytes of a linear layer's converted weight above which the copy computes it in bands.
CHUNKED_ABOVE = 64 << 20
#: Bytes of converted weight in one band.
BAND = 16 << 20


def widened_copy(
    model: nn.Module,
    convert: Callable[[torch.Tensor], torch.Tensor],
    whole=frozenset(),
    reads_outside=(),
    shared: str | None = None,
    narrow: bool = True,
) -> nn.Module:
    """The copy (see the module docs); `convert` makes a floating weight of the copy from the
    model's (`lambda t: t.double()` for the truth). Copies of one model given the same
    ``shared`` name convert alike, and hold one tensor of each weight between them while they
    run the same module (`_Made`): the float64 truth and a float32 target's baseline. Without
    ``narrow``, every module holds its whole converted weight while it runs: a side whose values
    must be the bits the model converted whole computes (a banded product may sum otherwise).

    A placeholder a caller set to another floating dtype after the copy was made (a module kept
    in float32 on a bfloat16 side) gets the model's weight in that dtype instead. A module of
    the copy holds its weights for a call made to its ``forward`` directly inside `held`, and
    `layerdiff.torch._streamed.weight` reads a weight of the copy as it would hold it."""
    sample = convert(torch.zeros(1))
    dtype = sample.dtype
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
    made = _Conversion(convert, dtype, shared, sample.device)
    # modules whose weights a parent holds: a parent may read them itself, whole and converted
    held_by_parent = {
        id(sub)
        for name, module in copied.named_modules()
        if name in recursive
        for sub in list(module.modules())[1:]
    }
    for name, module in copied.named_modules():
        original = originals[name]
        pairs = (
            list(zip(module.modules(), original.modules(), strict=True))
            if name in recursive
            else [(module, original)]
        )
        if narrow and id(module) not in held_by_parent:
            if _gathers(module):
                module.register_forward_hook(_converted_rows(made))
                made.narrow.add(id(module))
            elif _chunked(module, dtype):
                module.forward = _Chunked(module, original, made)
                made.narrow.add(id(module))
        hold, drop = _holder(pairs, made, holding), _dropper(pairs, made, holding)
        module.register_forward_pre_hook(hold)
        module.register_forward_hook(drop, always_call=True)
        _HOOKS[module] = (hold, drop)
        _converted(module, original, made)
    return copied


#: A module of a copy → its hooks that make and drop its weights (see `held`).
_HOOKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def held(module: nn.Module):
    """`module` of a copy holding its weights meanwhile, for a call to its ``forward`` made
    directly (no hooks fire then); a module of no copy as it is."""
    hooks = _HOOKS.get(module)
    if hooks is None:
        yield
        return
    hold, drop = hooks
    hold(module, ())
    try:
        yield
    finally:
        drop(module, (), None)


def _converted(module: nn.Module, original: nn.Module, made) -> None:
    """Lets `layerdiff.torch._streamed.weight` read `module`'s weights as the copy makes them."""

    def read(name: str, placeholder: torch.Tensor) -> torch.Tensor:
        t = original._parameters.get(name)
        kind = "p"
        if t is None:
            t, kind = original._buffers[name], "b"
        return made.make(original, kind, name, t, placeholder.dtype, keep=False)

    register_copy(module, read)


def _gathers(module: nn.Module) -> bool:
    """An embedding that only gathers rows (a subclass may compute with its table, and
    `max_norm` rewrites the rows it reads)."""
    return type(module) is nn.Embedding and module.max_norm is None


def _chunked(module: nn.Module, dtype: torch.dtype) -> bool:
    """A plain linear layer whose weight, converted, passes `CHUNKED_ABOVE`."""
    if type(module) is not nn.Linear:
        return False
    return module.weight.numel() * dtype.itemsize > CHUNKED_ABOVE


def _converted_rows(made):
    """A forward hook that converts the rows an embedding gathered from the model's table."""

    def convert(_module, _args, output):
        return made.convert(output)

    return convert


class _Chunked:
    """A linear layer of the copy computed a band of output features at a time, each band's
    weight converted from the model's rows (a streamed model's read from its files) and dropped
    before the next: the layer never holds its whole converted weight."""

    def __init__(self, module: nn.Linear, original: nn.Linear, made):
        self.module, self.original, self.made = module, original, made

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows, columns = self.original.weight.shape
        band = max(1, BAND // (columns * self.made.dtype.itemsize))
        bias = self.module.bias
        out = x.new_empty((*x.shape[:-1], rows))
        for start in range(0, rows, band):
            stop = min(start + band, rows)
            w = weight_rows(self.original, "weight", start, stop, self.made.dtype)
            b = None if bias is None else bias[start:stop]
            out[..., start:stop] = nn.functional.linear(x, self.made.convert(w), b)
        return out


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

    def __init__(self, convert, dtype, shared, device):
        self.convert, self.dtype, self.shared, self.device = convert, dtype, shared, device
        # the copy's own modules run in its thread and are re-run from the main pass's
        self.lock = threading.RLock()
        # id of a module of the copy holding its weights → the placeholders they replaced
        self.placeholders: dict[int, tuple[dict, dict]] = {}
        # ids of the copy's modules whose weight is not converted whole: an embedding holds the
        # model's table, a banded linear layer reads its rows as it goes
        self.narrow: set[int] = set()

    def key(self, original: nn.Module, kind: str, name: str) -> tuple | None:
        return None if self.shared is None else (id(original), kind, name, self.shared)

    def make(
        self, original: nn.Module, kind: str, name: str, t: torch.Tensor,
        dtype: torch.dtype | None = None, keep: bool = True,
    ) -> torch.Tensor:  # fmt: skip
        """The copy's weight `name` of `original` (`t`, as the model holds it), converted; in
        `dtype` instead where the copy's placeholder was set to another floating dtype (from the
        model's own values, not the converted ones). ``keep``: shared with the copies of the
        same name while it runs (else made for the caller alone)."""
        other = dtype is not None and dtype.is_floating_point and dtype != self.dtype

        def made():
            wanted = dtype if other else self.dtype
            w = weight(original, name, t, wanted) if kind == "p" else t  # streamed: files
            w = w.detach()
            if not w.is_floating_point():
                return w
            return w.to(self.device, dtype) if other else self.convert(w)

        key = None if other or not keep else self.key(original, kind, name)
        return made() if key is None else _MADE.take(key, made)

    def table(self, original: nn.Module, t: torch.Tensor) -> torch.Tensor:
        """An embedding's table as the model holds it (a streamed model's as its files store
        it, where that holds the model's values exactly), shared by every copy."""
        key = (id(original), "table")
        return _MADE.take(key, lambda: weight(original, "weight", t, None).detach())

    def drop(self, original: nn.Module, kind: str, name: str, dtype: torch.dtype) -> None:
        other = dtype.is_floating_point and dtype != self.dtype
        key = None if other else self.key(original, kind, name)
        if key is not None:
            _MADE.let_go(key)


def _holder(pairs, made: _Conversion, holding):
    """A pre-hook that makes the weights of each module of `pairs` (copy, model) from the
    model's (a streamed model's read from its files in the copy's dtype), unless a running
    module holds them already."""

    def hold(_module, _args):
        with made.lock:
            for m, o in pairs:
                holding[id(m)] = holding.get(id(m), 0) + 1
                if holding[id(m)] == 1:
                    _make(m, o, made)

    return hold


def _make(m: nn.Module, o: nn.Module, made: _Conversion) -> None:
    """The weights of `m` (of the copy) made from those of `o` (of the model), each in the dtype
    of the placeholder it replaces; the placeholders are kept to be put back (`_let_go`): a
    weight tied between two modules stays one parameter."""
    made.placeholders[id(m)] = (dict(m._parameters), dict(m._buffers))
    for name, t in o._parameters.items():
        if t is None:
            continue
        if id(m) in made.narrow and name == "weight":
            if isinstance(m, nn.Embedding):
                w = made.table(o, t)
                m._parameters[name] = nn.Parameter(w, requires_grad=False)
            continue  # a banded layer reads its rows as it goes
        w = made.make(o, "p", name, t, m._parameters[name].dtype)
        m._parameters[name] = nn.Parameter(w, requires_grad=False)
    for name, t in o._buffers.items():
        if t is not None:
            m._buffers[name] = made.make(o, "b", name, t, m._buffers[name].dtype)


def _dropper(pairs, made: _Conversion, holding):
    """A forward hook that turns the weights of each module of `pairs` back into placeholders
    once no running module holds them."""

    def drop(_module, _args, _output):
        with made.lock:
            for m, o in pairs:
                holding[id(m)] -= 1
                if holding[id(m)] == 0:
                    _let_go(m, o, made)

    return drop


def _let_go(m: nn.Module, o: nn.Module, made: _Conversion) -> None:
    """The weights of `m` back to the placeholders they replaced."""
    parameters, buffers = made.placeholders.pop(id(m))
    for name, t in m._parameters.items():
        if t is not None and t.device.type != "meta":
            if id(m) in made.narrow and name == "weight":
                _MADE.let_go((id(o), "table"))
            else:
                made.drop(o, "p", name, t.dtype)
    for name, t in m._buffers.items():
        if t is not None and t.device.type != "meta":
            made.drop(o, "b", name, t.dtype)
    m._parameters.update(parameters)
    m._buffers.update(buffers)
