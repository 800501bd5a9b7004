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
    return widened_copy(model, _to_float64, whole, reads_outside), wide


def _to_float64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().double()


class Lockstep:
    """Runs ``transform(model, inputs)`` in a thread (inside ``running()``: autocast and the like
    hold per thread; ``whole``: as `capture` takes it); ``next(name)`` is its value of the layer
    ``name``, the layers asked for in the main pass's order. ``model`` is the copy."""

    _END = object()

    def __init__(
        self,
        model: nn.Module,
        inputs: tuple,
        transform: Transform,
        running=contextlib.nullcontext,
        whole=frozenset(),
    ):
        self.queue: queue.Queue = queue.Queue(maxsize=1)
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

    def _on_layer(self, index: int, layer, out: torch.Tensor) -> None:
        """Hands the copy's value of a layer over (a subclass may also take one back)."""
        self._put((layer.name, out.clone()))

    def _run(self, copied: nn.Module, given: tuple) -> None:
        try:
            with self.running():
                capture(
                    copied,
                    given,
                    lambda i, layer, out, _: self._on_layer(i, layer, out),
                    whole=self.whole,
                    dataflow=False,
                )
        except _Stopped:
            pass
        except Exception as e:  # a model whose copy cannot run still gets its comparison
            self.error = f"it failed: {type(e).__name__}: {e}"
        with contextlib.suppress(_Stopped):
            self._put(self._END)

    def next(self, name: str) -> torch.Tensor | None:
        """The copy's value of the layer `name`, or None."""
        if self.done:
            return None
        item = self.queue.get()
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
