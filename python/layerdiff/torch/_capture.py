"""Capturing a forward pass: every leaf-module call (forward hooks) and every functional call a
module's own `forward` makes between its submodules (a `TorchFunctionMode`), in execution order,
each with where its input came from."""

from __future__ import annotations

import contextlib
import threading
import weakref
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from layerdiff import _layerdiff
from layerdiff._layerdiff import CapturedLayer  # one call or functional op, typed in the core
from layerdiff.tensors import dtype_name, flat

IDENTITY_AT_INFERENCE = (
    nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
    nn.FeatureAlphaDropout,
)  # fmt: skip


# Ops a module's own `forward` computes between its submodules that get rows of their own
# (a residual `out += identity`, an attention's `matmul` and `softmax`, the batch norm of a
# module that is a BatchNorm and holds its activation, like timm's BatchNormAct2d), by the name
# captured calls give them: `__iadd__`, `add_` and `torch.add` are all `add`.
FUNCTIONAL_OPS = frozenset(
    {"add", "sub", "mul", "div", "matmul", "bmm", "softmax", "relu", "gelu", "silu", "sigmoid",
     "tanh", "cat", "layer_norm", "batch_norm", "group_norm", "scaled_dot_product_attention",
     "argmax", "argmin"}
)  # fmt: skip
# Ops among them whose values are indices (a classifier's prediction): integers, compared
# exactly, and held to the indices of their inputs as each side holds them.
INDEX_OPS = frozenset({"argmax", "argmin"})


def functional_op(func) -> str | None:
    """The op a torch function call computes, when it is one that gets a row."""
    name = getattr(func, "__name__", "")
    if name.startswith("__") and name.endswith("__"):
        name = name[2:-2]
        if name[:1] in ("i", "r") and name[1:] in FUNCTIONAL_OPS:  # __iadd__, __radd__
            name = name[1:]
    name = name.strip("_")
    return name if name in FUNCTIONAL_OPS else None


@dataclass
class Capture:
    """Every leaf-module call of one forward pass, in execution order."""

    layers: list[CapturedLayer] = field(default_factory=list)
    output: object = None
    # Modules with submodules that were called while none of their submodules was: they
    # compute everything themselves (nn.MultiheadAttention reads its out_proj's weight).
    self_computing: list[str] = field(default_factory=list)
    # Modules whose own code reads a parameter or buffer of a module not running (a submodule
    # it does not call, or one elsewhere in the model): a copy that holds each module's
    # weights only while it runs must hold theirs for all their submodules (listing pass only).
    reads_outside: list[str] = field(default_factory=list)


def leaf_modules(model: nn.Module, whole=frozenset()) -> list[tuple[str, nn.Module]]:
    """Modules without children, and the modules named in ``whole`` (taken whole, their
    submodules left out), with their qualified names (the model itself if there are none)."""
    leaves = [
        (n, m)
        for n, m in model.named_modules()
        if n
        and not any(n.startswith(f"{w}.") for w in whole)
        and (n in whole or not any(True for _ in m.children()))
    ]
    return leaves or [(type(model).__name__, model)]


def _first_tensor(value):
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        for v in value:
            t = _first_tensor(v)
            if t is not None:
                return t
    if isinstance(value, dict):
        for v in value.values():
            t = _first_tensor(v)
            if t is not None:
                return t
    return None


def _sources(args, source) -> list[int]:
    """The layers whose outputs are among `args` (tensors, one level into lists and dicts)."""
    found: list[int] = []
    items = args.values() if isinstance(args, dict) else args
    for item in items:
        inner = item if isinstance(item, (tuple, list)) else [item]
        for t in inner:
            index = source(t) if isinstance(t, torch.Tensor) else None
            if index is not None and index not in found:
                found.append(index)
    return found


def _tensors(value, depth: int = 2):
    """The tensors in a call's arguments or result, two levels into lists, tuples and dicts."""
    if isinstance(value, torch.Tensor):
        yield value
    elif depth and isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v, depth - 1)
    elif depth and isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v, depth - 1)


class _Filing:
    """What the listing pass knows of each tensor a torch call makes: whether a model input's
    values reach it (else it is *constant*: the model's parameters, buffers and tensor
    attributes, and what calls compute from those alone, ``torch.arange`` of a length, a rotary
    table of it), and which call made it and which calls' results that one read, to tell
    afterwards which values reach the model's outputs. A tensor no call made (an input, a
    parameter) has no call; one the pass never saw counts as reached. A call that writes into an
    argument (in place, ``x[i] = y``, ``out=``) files that argument anew, and through a view its
    base too, as reading what they held."""

    def __init__(self, model: nn.Module):
        self.alive: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self.constant: dict[int, bool] = {}  # by the id of a live tensor
        self.call: dict[int, int] = {}  # by the id of a live tensor: the call that made it
        self.reads: list[list[int]] = []  # per call, the calls whose results it read
        for module in model.modules():
            own = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
            own += [t for t in vars(module).values() if isinstance(t, torch.Tensor)]
            for t in own:
                self.alive[id(t)] = t
                self.constant[id(t)] = True

    def _seen(self, t: torch.Tensor) -> bool:
        return self.alive.get(id(t)) is t

    def is_constant(self, t: torch.Tensor) -> bool:
        return self._seen(t) and self.constant.get(id(t), False)

    def made_by(self, t: torch.Tensor) -> int | None:
        return self.call.get(id(t)) if self._seen(t) else None

    def note(self, func, args, kwargs, out) -> None:
        read = list(_tensors((args, kwargs), 3))
        written = list(_tensors(out))
        if getattr(func, "__name__", "") == "__setitem__" and args:
            written.append(args[0])
        written += list(_tensors(kwargs.get("out")))
        written += [t._base for t in written if t._base is not None]
        constant = all(self.is_constant(t) for t in read)
        k = len(self.reads)
        self.reads.append(sorted({n for t in read + written if (n := self.made_by(t)) is not None}))
        for t in written:
            self.alive[id(t)] = t
            self.constant[id(t)] = constant
            self.call[id(t)] = k

    def upstream(self, value) -> set[int]:
        """Every call whose result reaches the tensors in `value` (a model's output)."""
        todo = [n for t in _tensors(value, 3) if (n := self.made_by(t)) is not None]
        seen: set[int] = set()
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo.extend(self.reads[n])
        return seen


class _FunctionalCalls(TorchFunctionMode):
    """Sees every torch function call of a forward pass: files each result with `filing`
    (when given), and hands those of `FUNCTIONAL_OPS` made by a module's own `forward` (not
    inside a leaf module) to `record(op, owner, args, output, local)`, ``local`` being
    ``rerun(func, args, kwargs)``'s outcome, made before the call (an in-place op rewrites its
    inputs)."""

    def __init__(self, stack: list, leaves: set, record, filing: _Filing | None, rerun=None):
        super().__init__()
        self.stack, self.leaves, self.record, self.rerun = stack, leaves, record, rerun
        self.filing = filing
        # id of each parameter and buffer → the modules that hold it directly, and the modules
        # seen reading one none of whose holders runs (see `Capture.reads_outside`)
        self.holders: dict[int, list[str]] = {}
        self.reads_outside: list[str] = []

    def _check_reads(self, args, kwargs) -> None:
        """Notes the running module when it reads a weight whose holder is not running (nor
        inside a running leaf, which holds all its submodules' weights)."""
        if not self.stack:
            return
        for t in _tensors((args, kwargs), 3):
            holders = self.holders.get(id(t))
            if holders is None:
                continue
            running = [path for path, _ in self.stack]
            inside = [path for path, module in self.stack if module in self.leaves]
            held = any(
                h in running or any(h.startswith(f"{w}.") or not w for w in inside) for h in holders
            )
            reader = self.stack[-1][0]
            if not held and reader not in self.reads_outside:
                self.reads_outside.append(reader)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        owner = self.stack[-1] if self.stack else None
        if self.filing is not None and self.holders:
            self._check_reads(args, kwargs or {})
        op = functional_op(func)
        # not inside a leaf (a module taken whole runs its submodules' code inside it)
        wanted = (
            op is not None
            and owner is not None
            and not any(module in self.leaves for _, module in self.stack)
        )
        local = None
        if wanted and self.rerun is not None:
            local = attempt(lambda: self.rerun(func, args, kwargs or {}))
        out = func(*args, **(kwargs or {}))
        if self.filing is not None:
            self.filing.note(func, args, kwargs or {}, out)
        if wanted and isinstance(out, torch.Tensor) and out.dim() > 0:
            if out.is_floating_point() or op in INDEX_OPS:
                self.record(op, owner[0], args, out, local)
        return out


def attempt(call) -> torch.Tensor | str:
    """`call()`'s first tensor, or why there is none (its error, in words)."""
    try:
        out = _first_tensor(call())
    except Exception as e:  # the target's own failure is a finding of that layer
        return f"{type(e).__name__}: {e}".strip()
    return out if out is not None else "it returned no tensor"


def capture(
    model: nn.Module,
    inputs: tuple,
    on_layer=None,
    *,
    fingerprints=False,
    rerun=None,
    whole=frozenset(),
    dataflow=True,
    grad=False,
) -> Capture:
    """Runs `model(*inputs)` once under `torch.no_grad()`, listing each leaf call and each
    functional call a module's own `forward` makes between its submodules (with a fingerprint
    of each output when ``fingerprints``).

    ``on_layer(index, layer, output, local)`` sees each call's output the moment the module
    returns it, before any later op can rewrite it in place; nothing is kept here, so PyTorch
    frees each activation as usual. With ``rerun``, each call is first made again elsewhere on
    its very inputs, before it runs (an in-place module rewrites them): ``rerun(leaf name, None,
    args, kwargs)`` for a leaf, ``rerun(None, func, args, kwargs)`` for a functional call;
    ``local`` is its tensor or why there is none (else None). Modules named in ``whole`` are
    leaves (see `leaf_modules`); the modules found to compute everything themselves are listed
    in the result, to be given as ``whole`` next time. With ``dataflow`` (the listing pass),
    every tensor is filed to tell each layer's ``constant`` and ``feeds_output``, and a
    functional call's ``identity`` is measured; a pass that only streams values needs none of
    it (and a compiled copy traces the mode: the less it does, the better). With ``grad`` the
    pass records autograd's graph (no ``torch.no_grad()``) and ``on_layer`` sees each output
    itself, not detached, to hook its gradient.
    """
    return _Pass(model, on_layer, fingerprints, rerun, whole, dataflow, grad).run(inputs)


class _Pass:
    """One capturing forward pass: the hooks on every module, the functional-call mode, and
    what they file as the model runs (see `capture`)."""

    def __init__(self, model, on_layer, fingerprints, rerun, whole, dataflow, grad):
        self.model, self.on_layer, self.fingerprints = model, on_layer, fingerprints
        self.rerun, self.grad = rerun, grad
        self.result = Capture()
        self.names = {m: n for n, m in leaf_modules(model, whole)}  # leaf → its name
        self.paths = {m: n for n, m in model.named_modules()}  # every module → its path
        self.calls: dict[str, int] = {}  # calls so far, by key
        # data_ptr of an output → (index of the layer that produced it, the output, weakly): an
        # address is only that layer's while its output lives, since freed memory is reused.
        self.producer: dict[int, tuple[int, weakref.ref]] = {}
        self.pending: dict = {}  # a leaf's re-run, made before it ran, until its output is seen
        self.filing = _Filing(model) if dataflow else None
        self.made_by: list[int | None] = []  # the call that made each layer's output, in `filing`
        # each running leaf's first input and its version counter, to tell a module that hands
        # its input back untouched from one that rewrote it in place (ReLU(inplace=True))
        self.given: dict = {}
        self.running: list = []  # (path, module) of each module whose forward is running
        self.called: set[str] = set()  # the paths of the modules called
        # Hooks fire in whatever thread calls a module; only this pass's thread is this
        # capture's (another thread may re-run one of these modules' code meanwhile).
        self.ours = threading.get_ident()

    def __deepcopy__(self, memo):
        # The hooks on the model are this pass's methods: a copy of the model made while it
        # runs (a side's re-run) keeps them pointing here, as plain function hooks would.
        return self

    def _source(self, tensor) -> int | None:
        index, output = self.producer.get(tensor.data_ptr(), (None, lambda: None))
        return index if output() is not None else None

    def _next_call(self, key: str) -> int:
        """The index of this call among the calls of `key` (every call counts, as the legacy
        exporter's `_N` scopes do, tensor output or not)."""
        k = self.calls.get(key, 0)
        self.calls[key] = k + 1
        return k

    def _add_layer(self, k: int, key: str, module: str, module_type: str, out, args, local, **kind):
        first_in = _first_tensor(args)
        called = key if k == 0 else f"{key}#{k + 1}"
        filing = self.filing
        layer = CapturedLayer(
            name=called,
            module=module,
            module_type=module_type,
            call_index=k,
            input_from=self._source(first_in) if first_in is not None else None,
            inputs_from=_sources(args, self._source),
            shape=list(out.shape),
            dtype=dtype_name(called, out),
            fingerprint=_layerdiff.fingerprint(flat(called, out)) if self.fingerprints else None,
            constant=filing is not None and filing.is_constant(out),
            **kind,
        )
        index = len(self.result.layers)
        self.result.layers.append(layer)
        self.made_by.append(filing.made_by(out) if filing is not None else None)
        self.producer[out.data_ptr()] = (index, weakref.ref(out))
        if self.on_layer is not None:
            self.on_layer(index, layer, out if self.grad else out.detach(), local)

    def _mine(self) -> bool:
        return threading.get_ident() == self.ours

    def _before(self, module, args, kwargs):
        if self._mine():
            self.pending[module] = attempt(
                lambda: self.rerun(self.names[module], None, args, kwargs)
            )

    def _arrive(self, module, args):
        if self._mine():
            first = _first_tensor(args)
            self.given[module] = (first, first._version) if first is not None else None

    def _leaf_returned(self, module, args, output):
        if not self._mine():
            return
        name = self.names[module]
        k = self._next_call(name)
        out = _first_tensor(output)
        local = self.pending.pop(module, None)
        first, version = self.given.pop(module, None) or (None, None)
        if out is not None:
            identity = (isinstance(module, IDENTITY_AT_INFERENCE) and not module.training) or (
                out is first and out._version == version
            )
            self._add_layer(
                k, name, name, type(module).__name__, out, args, local, identity=identity
            )

    def _function(self, op, owner, args, out, local):
        key = f"{owner}:{op}"
        first = _first_tensor(args)
        identity = (
            self.filing is not None  # a full comparison: only where the layers are listed
            and first is not None
            and out.data_ptr() != first.data_ptr()  # an in-place op rewrote its input
            and out.shape == first.shape
            and out.dtype == first.dtype
            and torch.equal(out, first)
        )
        self._add_layer(
            self._next_call(key), key, owner, f"{op}()", out, args, local, identity=identity, op=op
        )

    def _enter(self, module, args):
        if self._mine():
            self.running.append((self.paths[module], module))
            self.called.add(self.paths[module])

    def _leave(self, module, args, output):
        if self._mine():
            self.running.pop()

    def _hooks(self) -> list:
        names, paths = self.names, self.paths
        handles = [m.register_forward_pre_hook(self._enter) for m in paths]
        if self.rerun is not None:
            handles += [m.register_forward_pre_hook(self._before, with_kwargs=True) for m in names]
        handles += [m.register_forward_pre_hook(self._arrive) for m in names]
        handles += [m.register_forward_hook(self._leaf_returned) for m in names]
        handles += [m.register_forward_hook(self._leave) for m in paths]
        return handles

    def _mode(self) -> _FunctionalCalls:
        rerun = self.rerun
        rerun_call = None
        if rerun is not None:
            rerun_call = lambda func, args, kwargs: rerun(None, func, args, kwargs)  # noqa: E731
        mode = _FunctionalCalls(
            self.running, set(self.names), self._function, self.filing, rerun_call
        )
        if self.filing is not None:
            for module, path in self.paths.items():
                own = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
                # Not a streamed model's placeholders: its weights are made anew each time
                # their module runs (a read outside it meets a placeholder and fails loudly),
                # and a placeholder's id would name whatever tensor takes it later.
                for t in own:
                    if t.device.type != "meta":
                        mode.holders.setdefault(id(t), []).append(path)
        return mode

    def run(self, inputs: tuple) -> Capture:
        result, filing = self.result, self.filing
        handles = self._hooks()
        try:
            mode = self._mode()
            with contextlib.nullcontext() if self.grad else torch.no_grad(), mode:
                result.output = self.model(*inputs)
            needed = filing.upstream(result.output) if filing is not None else set()
            for layer, node in zip(result.layers, self.made_by, strict=True):
                layer.feeds_output = node is None or node in needed
        finally:
            for h in handles:
                h.remove()
        result.reads_outside = list(mode.reads_outside)
        result.self_computing = [
            n
            for n, m in self.model.named_modules()
            if n
            and n in self.called
            and m not in self.names
            and any(True for _ in m.children())
            and not any(p.startswith(f"{n}.") for p in self.called)
        ]
        return result


def module_readers(listed) -> dict[str, list[str]]:
    """For each module call of the listing, the module calls that read its output, through the
    functional calls between modules (they have no backward of their own here)."""
    direct: dict[int, list[int]] = {}
    for i, layer in enumerate(listed):
        for j in layer.inputs_from:
            direct.setdefault(j, []).append(i)

    def reading(i: int, seen: set) -> list[str]:
        found = []
        for j in direct.get(i, []):
            if j in seen:
                continue
            seen.add(j)
            if listed[j].op is None:
                found.append(listed[j].name)
            else:
                found += reading(j, seen)
        return found

    return {layer.name: reading(i, set()) for i, layer in enumerate(listed) if layer.op is None}
