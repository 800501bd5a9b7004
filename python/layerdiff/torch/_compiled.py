"""Across modules, for a torch.compile target (`--target torch:compile`).

The layer-by-layer comparison compiles each leaf module alone, so that hooks fire between
leaves; what a compiler does across modules (fusing a block's own code with its submodules)
never runs there. So the whole model is also compiled at once and its outputs judged against the
same side eager, by `layerdiff check`'s rule (the core's `ModuleSearch`: every element within
the output's tolerance, and no further from float64 than rounding explains). Where it differs
and no layer has a defect or an undecided error of its own (a leaf that differs compiled alone
explains the whole model's difference), the module tree is searched for the smallest module
whose compiled form differs: at each module, on the inputs it gets in the model's forward pass,
its submodules (those with children of their own: a leaf compiled alone agreed already) are left
eager by halves (`torch.compiler.disable` in a copy, the core's one search, `smallest_set`) to
find those the difference needs; where that is one submodule and it differs compiled alone, the
search goes down into it. About depth × (1 + 2·log₂ breadth) compiles, not one per module. The
answer is checked by compiling it once more, afresh; the core makes it the report's defect
(`cross_module_fusion`).
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import time

import torch
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map

from layerdiff import _layerdiff
from layerdiff.tensors import flat
from layerdiff.torch._lockstep import float64
from layerdiff.torch._sides import TorchSide


def across_modules(model, inputs, report, options, side: TorchSide, listing, step):
    """`report` (the layer-by-layer comparison of `model` with `side`, a compiled side) with the
    whole model's compile recorded, and, where it differs, the module the search narrowed it to
    as a defect; and a note with both speeds. `listing`: the comparison's `(whole,
    reads_outside)`, the modules taken whole and those that read weights outside themselves."""
    eager_side = dataclasses.replace(side, compile=None)
    eager, given = eager_side.prepare(model, inputs)
    search = _layerdiff.ModuleSearch(options, side.compile)
    tree = _Tree(model, (eager, given), listing, side, search, float64=options.float64)
    root = type(model).__name__
    step(f"compiling the whole model at once ({side.compile}) against it eager")
    try:
        with side.running():
            differs, compiled = tree.judge(root, "", tree.calls(""), ())
            speeds = _speeds(eager, compiled, given, side)
    except Exception as e:  # the layers' comparison stands; the note says what failed
        return report._native, f"the whole model could not be compiled at once: {_said(e)}"
    if not differs:
        return search.recorded(report._native), speeds
    own = [(d["layer"], d["cause"]) for d in report.summary["defects"]]
    own += [(la["name"], "undecided") for la in report.layers if la["finding"] == "undecided"]
    if own:  # a leaf compiled alone already differs: the whole model carries its error
        named = ", ".join(f"`{layer}` {cause}" for layer, cause in own[:3])
        why = f"the layers' own errors ({named}) come first: the whole model carries them"
        return search.recorded(report._native, not_searched=why), speeds
    try:
        with side.running():
            path, needs = tree.narrowed(step)
            step(f"checking: `{path or root}` compiled once more, afresh")
            eager_children = [c for c in tree.submodules(path) if c not in needs] if needs else ()
            checked, _ = tree.judge(path or root, path, tree.calls(path), eager_children)
    except Exception as e:  # the whole model's difference is the finding, not narrowed
        why = f"a compile of the search failed: {_said(e)}"
        found = search.recorded(report._native, module=root, checked=True, not_searched=why)
        return found, speeds
    found = search.recorded(report._native, module=path or root, needs=needs, checked=checked)
    return found, speeds


def _said(e: Exception) -> str:
    """An exception in one line."""
    first = str(e).strip().splitlines()
    return f"{type(e).__name__}: {first[0]}" if first else type(e).__name__


class _Tree:
    """The model's module tree as the search compiles it: the target side's eager copy
    (`eager`), the model as given (for the float64 truth, where `float64`: else each compile is
    judged by the tolerance alone), and what each compile is judged by (`search`)."""

    def __init__(self, model, eager, listing, side, search, float64=True):
        self.model, self.side, self.search = model, side, search
        self.eager, self._given = eager
        self.whole, self.reads_outside = listing
        # the inputs of each module's calls, by path (the model's own: its inputs)
        self._calls: dict[str, list] = {"": [(tuple(self._given), {})]}
        # each module's outputs on them, eager and in float64, by path: one run each
        self._eager: dict[str, list] = {}
        self._truths: dict[str, list | None] = {}
        self.float64 = float64

    def submodules(self, path: str) -> list[str]:
        """The submodules of `path` a search can leave eager: those with children of their own
        (a leaf compiled alone was compared already), not taken whole by the comparison."""
        module = self.eager.get_submodule(path)
        found = []
        for name, child in module.named_children():
            full = f"{path}.{name}" if path else name
            if full not in self.whole and any(True for _ in child.children()):
                found.append(full)
        return found

    def calls(self, path: str) -> list:
        """The inputs of each call `path` gets in the eager copy's forward pass, `(args,
        kwargs)`."""
        if path not in self._calls:
            self._calls[path] = _inputs_of(self.eager, self._given, path)
        return self._calls[path]

    def judge(self, name: str, path: str, calls, eager_children) -> tuple[bool, nn.Module]:
        """Compiles a copy of `path` (its submodules `eager_children` left eager), afresh (a
        copy is a module the compiler has not seen), runs it on `calls` against it eager and it
        in float64, and has the core judge it. Returns whether it differs, and the compiled
        module."""
        module = self.eager.get_submodule(path)
        if path not in self._eager:
            with torch.no_grad():
                self._eager[path] = _flat([module(*args, **kwargs) for args, kwargs in calls])
            self._truths[path] = self._truth(path, calls) if self.float64 else None
        copied = copy.deepcopy(module)
        inner = f"{path}." if path else ""
        for child in eager_children:  # run eager inside the compiled module
            left = copied.get_submodule(child.removeprefix(inner))
            left.forward = torch.compiler.disable(left.forward, recursive=True)
        compiled = torch.compile(copied, backend=self.side.compile, dynamic=False)
        with torch.no_grad():
            got = _flat([compiled(*args, **kwargs) for args, kwargs in calls])
        reference, truth = self._eager[path], self._truths[path]
        differs = self.search.judge(name, sorted(eager_children), reference, got, truth)
        return differs, compiled

    def _truth(self, path: str, calls):
        """`path`'s outputs on `calls` computed in float64 (a copy of the model's module that
        widens each weight while its module runs), or None where it does not run in float64."""
        inner = f"{path}." if path else ""
        whole = frozenset(w.removeprefix(inner) for w in self.whole if w.startswith(inner))
        reads = [r.removeprefix(inner) for r in self.reads_outside if r.startswith(inner)]
        try:
            wide, _ = float64(self.model.get_submodule(path), (), whole, reads)
            outputs = []
            with torch.no_grad():
                for args, kwargs in calls:
                    widened = tree_map(_widened, (args, kwargs))
                    outputs.append(wide(*widened[0], **widened[1]))
        except Exception:  # judged by the tolerance alone, as `layerdiff check` does
            return None
        return _flat(outputs)

    def narrowed(self, step) -> tuple[str, list[str]]:
        """The smallest module whose compiled form differs, and the submodules it needs
        compiled in it (empty: its own code and leaves), from the whole model down."""
        path = ""
        while True:
            children = self.submodules(path)
            if not children:
                return path, []
            calls = self.calls(path)
            name = path or type(self.model).__name__

            def differs(compiled: list[str], at=(name, path, calls), children=children) -> bool:
                left = [c for c in children if c not in compiled]
                said, _ = self.judge(*at, left)
                step(f"searching the module tree: {self.search.last_words}")
                return said

            needs = _layerdiff.smallest_set(children, differs)
            if len(needs) != 1:
                return path, needs
            (child,) = needs
            alone, _ = self.judge(child, child, self.calls(child), ())
            step(f"searching the module tree: {self.search.last_words}")
            if not alone:
                return path, needs
            path = child


def _inputs_of(model: nn.Module, given: tuple, path: str) -> list:
    """The `(args, kwargs)` of every call of `model`'s `path` in one forward pass on `given`,
    detached copies."""
    seen: list = []

    def keep(t):
        return t.detach().clone() if isinstance(t, torch.Tensor) else t

    def before(_module, args, kwargs):
        seen.append(tree_map(keep, (args, kwargs)))

    handle = model.get_submodule(path).register_forward_pre_hook(before, with_kwargs=True)
    try:
        with torch.no_grad():
            model(*given)
    finally:
        handle.remove()
    return seen


def _widened(t):
    if not isinstance(t, torch.Tensor):
        return t
    t = t.detach().cpu()
    return t.double() if t.is_floating_point() else t


def _flat(outputs: list) -> list:
    """The tensors of each call's output, flattened for the core (`call0_output_0`, …; the
    first call's are `output_0`, …)."""
    flats = []
    for k, out in enumerate(outputs):
        prefix = "" if k == 0 else f"call{k}_"
        tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        flats += [flat(f"{prefix}output_{i}", t.detach().cpu()) for i, t in enumerate(tensors)]
    return flats


def _speeds(eager, compiled, given, side: TorchSide, runs: int = 5) -> str:
    """The speed of the model eager and compiled whole (median of `runs` calls of each; the
    compiled one was called already, so compiling is not counted), in words for the report's
    notes."""

    def timed(call) -> float:
        if side.on_cuda:
            torch.cuda.synchronize()
        started = time.perf_counter()
        call()
        if side.on_cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - started

    # one call of each in turn, so that both meet what else the machine does alike (the
    # compiler's worker processes settling after a compile)
    eagers, compileds = [], []
    with torch.no_grad():
        for _ in range(runs):
            eagers.append(timed(lambda: eager(*given)))
            compileds.append(timed(lambda: compiled(*given)))
    t_eager, t_compiled = statistics.median(eagers), statistics.median(compileds)
    return (
        f"the whole model compiled at once ({side.compile}, fusing across modules): "
        f"{t_eager * 1e3:.1f} ms eager, {t_compiled * 1e3:.1f} ms compiled (median of {runs}): "
        f"{t_eager / t_compiled:.2f}× eager's speed"
    )
