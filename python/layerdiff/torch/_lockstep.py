"""A transformed copy of a model run in lockstep beside the main forward pass.

A thread runs the copy under the same capture as the main pass, and hands each layer's value
over one at a time, so only a layer or two of its values exist at once. The transform makes
the copy: float64 today (the numerical truth), another dtype, device or compiler tomorrow.
Gives up (``None`` from then on) where the copy cannot run or calls its layers differently,
and says why (``error``).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable

import torch
from torch import nn

from layerdiff.torch._capture import capture

#: Makes the copy and its inputs from the model and the inputs.
Transform = Callable[[nn.Module, tuple], tuple[nn.Module, tuple]]


def float64(
    model: nn.Module, inputs: tuple, whole=frozenset(), reads_outside=()
) -> tuple[nn.Module, tuple]:
    """The model and its floating-point inputs in float64: the numerical truth. The model is a
    copy that holds each module's float64 weights only while it runs
    (`layerdiff.torch._widened`); ``whole`` and ``reads_outside`` (from the listing pass) name
    the modules that hold their submodules' weights too."""
    from layerdiff.torch._widened import widened_copy

    wide = tuple(t.double() if t.is_floating_point() else t for t in inputs)
    return widened_copy(model, _to_float64, whole, reads_outside, shared="float64"), wide


def _to_float64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().double()


class Lockstep:
    """Runs ``transform(model, inputs)`` in a thread (inside ``running()``: autocast and the like
    hold per thread; ``whole``: as `capture` takes it); ``next(name)`` is its value of the layer
    ``name``, the layers asked for in the main pass's order. ``model`` is the copy. With
    ``arguments``, each functional call's non-tensor arguments come with its value (`peek`):
    what the copy's own code passed, where it computes them from the dtype or device.

    With ``turns`` the copy runs only while the main pass waits for its next layer, never beside
    it: where torch.compile compiles (a compiled side's leaves, on first call), PyTorch's
    ``torch.compiler.is_compiling()`` is one flag for the whole process, so eager code running
    in another thread meanwhile (the model's own ``forward`` between its leaves, on the
    reference or in the float64 copy) would take its compiled path."""

    _END = object()

    def __init__(
        self,
        model: nn.Module,
        inputs: tuple,
        transform: Transform,
        running=contextlib.nullcontext,
        whole=frozenset(),
        arguments=False,
        turns=False,
    ):
        self.queue: queue.Queue = queue.Queue(maxsize=1)
        # with `turns`: released once by the main pass for each layer it asks for
        self._turn = threading.Semaphore(0) if turns else None
        # the next item, taken from the queue by `peek` before `next` asks for it
        self._peeked = None
        self.arguments = arguments
        # the non-tensor arguments of the functional call the copy is making
        self._call_arguments = None
        self.stop = threading.Event()
        self.done = False
        self.error: str | None = None
        # Whether it gave up because it called other layers than the main pass (not a failure)
        self.diverged = False
        self.model: nn.Module | None = None
        try:  # the copy is made before any hook is registered on the model
            copied, given = transform(model, inputs)
        except Exception as e:
            self.done, self.thread = True, None
            self.error = f"it could not be made: {type(e).__name__}: {e}"
            return
        self.model, self.running, self.whole = copied, running, whole
        self.thread = threading.Thread(target=self._run, args=(copied, given), daemon=True)
        self.thread.start()

    def _put(self, item) -> None:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.05)
                return
            except queue.Full:
                continue
        raise _Stopped

    def _wait_turn(self) -> None:
        """With turns, waits until the main pass asks for the next layer."""
        if self._turn is None:
            return
        while not self._turn.acquire(timeout=0.05):
            if self.stop.is_set():
                raise _Stopped

    def _get(self):
        """The copy's next item, its turn given first where it runs by turns."""
        if self._turn is not None:
            self._turn.release()
        return self.queue.get()

    def _on_layer(self, index: int, layer, out: torch.Tensor) -> None:
        """Hands the copy's value of a layer over, with a functional call's non-tensor
        arguments (a subclass may also take one back)."""
        called = self._call_arguments if ":" in layer.name else None
        self._call_arguments = None
        self._put((layer.name, out.clone(), called))
        self._wait_turn()

    def _observe(self, leaf, func, args, kwargs) -> None:
        """Notes the non-tensor arguments of the functional call about to be made."""
        if func is not None:
            self._call_arguments = non_tensor_arguments(args, kwargs)

    def _run(self, copied: nn.Module, given: tuple) -> None:
        try:
            self._wait_turn()
            with self.running():
                capture(
                    copied,
                    given,
                    lambda i, layer, out, _: self._on_layer(i, layer, out),
                    rerun=self._observe if self.arguments else None,
                    whole=self.whole,
                    dataflow=False,
                )
        except _Stopped:
            pass
        except Exception as e:  # a model whose copy cannot run still gets its comparison
            self.error = f"it failed: {type(e).__name__}: {e}"
        with contextlib.suppress(_Stopped):
            self._put(self._END)

    def peek(self):
        """The copy's next layer, not yet taken: (its name, its value, a functional call's
        non-tensor arguments), or None where the copy ended or gave up."""
        if self.done:
            return None
        if self._peeked is None:
            self._peeked = self._get()
        return None if self._peeked is self._END else self._peeked

    def next(self, name: str) -> torch.Tensor | None:
        """The copy's value of the layer `name`, or None."""
        if self.done:
            return None
        item, self._peeked = (self._peeked or self._get()), None
        if item is self._END or item[0] != name:
            self.diverged = self.error is None
            self.error = self.error or (
                f"it called `{item[0]}` where the model called `{name}`"
                if item is not self._END
                else f"it ended before `{name}`"
            )
            self.close()
            return None
        return item[1]

    def close(self) -> None:
        self.done = True
        self.stop.set()
        if self.thread is not None:
            self.thread.join()


class _Stopped(Exception):
    pass


class _Tensor:
    """Where a call's tensor argument was, in its non-tensor arguments."""

    def __repr__(self) -> str:
        return "<tensor>"


TENSOR = _Tensor()


def non_tensor_arguments(args, kwargs) -> tuple:
    """A call's arguments with each tensor replaced by `TENSOR`: what its code passed besides
    the values it computes on."""
    from torch.utils._pytree import tree_map

    return tree_map(lambda a: TENSOR if isinstance(a, torch.Tensor) else a, (tuple(args), kwargs))


def diverging_modules(reference: list, target: list) -> list[str]:
    """The modules inside which a copy calls other layers than the model (``reference`` and
    ``target``: the two passes' captured layers, in order): for each stretch where the calls
    differ, the innermost module whose own ``forward`` made every differing call on both sides
    (a leaf call is made by its parent, a functional one by its owner). Compared whole, such a
    module is one layer on both sides. Empty where only the model itself is such a module."""
    import difflib

    def caller(layer) -> list[str]:
        module = layer.module if ":" in layer.name else layer.module.rpartition(".")[0]
        return module.split(".") if module else []

    found: list[str] = []
    names = ([r.name for r in reference], [t.name for t in target])
    for tag, a0, a1, b0, b1 in difflib.SequenceMatcher(None, *names, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        callers = [caller(x) for x in [*reference[a0:a1], *target[b0:b1]]]
        common = callers[0]
        for path in callers[1:]:
            same = 0
            while same < min(len(common), len(path)) and common[same] == path[same]:
                same += 1
            common = common[:same]
        if not common:
            return []
        module = ".".join(common)
        if module not in found:
            found.append(module)
    # a module inside another that is taken whole is in it already
    return [m for m in found if not any(m.startswith(f"{o}.") for o in found)]


def own_arguments(peeked, func, args, kwargs) -> tuple[tuple, dict, list[str]]:
    """A functional call's arguments as the copy made it: the main pass's tensors (``args``,
    ``kwargs``) with the non-tensor arguments the copy's own code passed (``peeked``: its next
    layer, from `Lockstep.peek`), and each number or flag that differs, in words (`` `eps`
    1e-05 → 0.5 ``). The main pass's own arguments, and nothing said, where the copy's next
    layer is not this call."""
    from torch.utils._pytree import tree_flatten, tree_unflatten

    from layerdiff.torch._capture import functional_op

    args = tuple(args)
    if peeked is None or peeked[2] is None:
        return args, kwargs, []
    name, _, theirs = peeked
    if name.rpartition(":")[2].partition("#")[0] != functional_op(func):
        return args, kwargs, []
    ours, spec = tree_flatten((args, kwargs))
    # both skeletons made alike (a torch.Size comes out of it a tuple)
    _, our_spec = tree_flatten(non_tensor_arguments(args, kwargs))
    flat, their_spec = tree_flatten(theirs)
    if (
        their_spec != our_spec
        or len(flat) != len(ours)
        or any(
            isinstance(o, torch.Tensor) != (t is TENSOR) for o, t in zip(ours, flat, strict=True)
        )
    ):
        return args, kwargs, []
    merged = [o if isinstance(o, torch.Tensor) else t for o, t in zip(ours, flat, strict=True)]
    own_args, own_kwargs = tree_unflatten(merged, spec)
    differs = [
        f"argument {i + 1} {_words(o)} → {_words(t)}"
        for i, (o, t) in enumerate(zip(args, theirs[0], strict=True))
        if _differs(o, t)
    ]
    differs += [
        f"`{k}` {_words(o)} → {_words(theirs[1][k])}"
        for k, o in kwargs.items()
        if _differs(o, theirs[1][k])
    ]
    return own_args, own_kwargs, differs


def _differs(ours, theirs) -> bool:
    """Whether a number or flag (or a tuple of them) differs; tensors, dtypes and devices are
    the sides' own business."""
    plain = (bool, int, float)
    if isinstance(ours, (tuple, list)) and isinstance(theirs, (tuple, list)):
        return len(ours) != len(theirs) or any(
            _differs(o, t) for o, t in zip(ours, theirs, strict=True)
        )
    return isinstance(ours, plain) and isinstance(theirs, plain) and ours != theirs


def _words(value) -> str:
    return repr(tuple(value)) if isinstance(value, torch.Size) else repr(value)
