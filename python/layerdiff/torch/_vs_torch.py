"""PyTorch against PyTorch computing differently (another device, precision or compiler), layer
by layer: `layerdiff torch MODEL --target torch:cuda:bf16`.

Both sides run from the one model instance and the same input bytes. The reference runs in the
main thread under the capture's hooks; the target, its own copy (`layerdiff.torch._sides`), runs in
lockstep in a thread (`layerdiff.torch._lockstep`), as does the float64 truth. Before each reference
call runs, the target's module (or functional op) is run on the reference's very inputs,
converted as the target holds them: that is the layer's local error. Every value streams to the
Rust engine, which compares, judges and explains as for any two sides.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial, reduce

import torch

from layerdiff import _layerdiff
from layerdiff.report import Report
from layerdiff.tensors import dtype_name, flat
from layerdiff.torch import _baseline
from layerdiff.torch._capture import INDEX_OPS, _first_tensor, capture, functional_op, leaf_modules
from layerdiff.torch._lockstep import Lockstep, float64, own_arguments
from layerdiff.torch._running import (
    finished,
    model_and_inputs,
    model_name,
    model_notes,
    progress_line,
    run_model,
    timed_phases,
)
from layerdiff.torch._sides import _CAST as _CASTS
from layerdiff.torch._sides import TorchSide, cuda_math
from layerdiff.torch._streamed import is_streamed
from layerdiff.torch._widened import held


def compare_torch(
    model,
    inputs=None,
    *,
    target: str = "torch:bf16",
    reference: str = "torch",
    tolerance: float | str = "dtype",
    local: bool = True,
    float64: bool = True,
    max_memory: int | str | None = None,
    name: str | None = None,
    seed: int | None = None,
    timings: bool | list = False,
    progress=None,
    options: _layerdiff.Options | None = None,
    keep_fp32: list[str] | tuple = (),
    bisect: bool = False,
) -> Report:
    """Compare a PyTorch model with itself on another device, precision or compiler, layer by
    layer. ``model`` may be a transformers checkpoint folder, as for
    :func:`layerdiff.torch.compare_torch_onnx`.

    ``target`` and ``reference`` are PyTorch sides, ``torch[:DEVICE][:PRECISION][:compile]``:
    ``"torch:cuda"``, ``"torch:bf16"``, ``"torch:cuda:tf32"``, ``"torch:amp-fp16"``,
    ``"torch:compile"`` (each leaf module compiled on its own, then the whole model at once:
    where that differs from it eager and no layer does, the smallest module whose compiled form
    differs is the defect, ``report.data["compiled_whole"]``); ``"torch"`` is the model as
    given (CPU, float32, eager). Tolerances, ``local`` (each layer's target module re-run on the
    reference's inputs, so its own error is told from inherited error), ``float64`` (a float64
    copy of the model as the numerical truth), ``max_memory`` and ``timings`` work as in
    :func:`layerdiff.torch.compare_torch_onnx`; ``options`` (already parsed) replaces them.

    A target in float16 or bfloat16 (cast, or under autocast) that drifts gets keep-in-float32
    advice (``report.data["keep_float32"]``), checked by running the comparison again with
    those layers' modules left in float32 (under autocast: run with it off); ``keep_fp32``
    (layer names) keeps the given layers instead, and the report is then that of the model with
    them kept, checked against the one without.

    ``bisect`` finds what turns a drift on (``report.data["bisection"]``): for a torch.compile
    target, the compiler stage and Inductor subsystem (PyTorch's own bisector) that first shows
    the headline layer's difference; for a float16 or bfloat16 target, the smallest set of
    layers to keep in float32 that brings the output within its tolerance, which then replaces
    the advice and is checked by the comparison run again with them kept.
    """
    phases, _ = timed_phases(timings)
    step = progress or (lambda message: None)
    if options is None:
        options = _layerdiff.Options(
            tolerance=tolerance,
            local=local,
            max_memory=max_memory,
            target=target,
            reference=reference,
            float64=float64,
        )
    model, inputs = model_and_inputs(model, inputs, seed, streams=options.streams_weights)
    if options.torch_target is None:
        raise _layerdiff.UsageError(
            "compare_torch compares PyTorch sides (`torch:bf16`, `torch:cuda`…); "
            "for an ONNX runtime use compare_torch_onnx"
        )
    # keep_fp32 against the target: the command line's rule, kept in Rust.
    options = options.resolved(keep_fp32=bool(keep_fp32))
    ref_side, tgt_side = TorchSide.of(options.reference), TorchSide.of(options.torch_target)
    if is_streamed(model):
        for side in (ref_side, tgt_side):
            side.refuse_streamed()
    from layerdiff.torch import _precision

    notes = model_notes(model)
    once = _Comparison(
        model, inputs, options, ref_side, tgt_side, name, seed, phases, timings, step, progress
    )  # fmt: skip
    report = once(keep=())
    if tgt_side.compile is not None:  # what compiling each leaf alone leaves out
        from layerdiff.torch import _compiled

        listing = (once.whole, once.reads_outside)
        native, speeds = _compiled.across_modules(
            model, inputs, report, once.options, tgt_side, listing, step
        )
        report = report._with(native)
        report.notes.append(speeds)
    bisected = False
    if bisect:
        from layerdiff.torch import _bisect

        module_of = [(entry.name, entry.module) for entry in once.listed]
        plan = report._native.bisection_plan(tgt_side.spelling, bool(keep_fp32), module_of)
        if isinstance(plan, _layerdiff.BisectionPlan.Stages):
            report = _bisect.compile_stage(model, inputs, report, plan, tgt_side, step)
        elif isinstance(plan, _layerdiff.BisectionPlan.KeepFloat32):
            report = _bisect.keep_float32(
                model, inputs, report, plan, once, once.listed, (ref_side, tgt_side), step
            )
            bisected = True
        else:
            report.notes.append(plan.note)
    if tgt_side.lower is not None and not bisected:
        report = _precision.checked_advice(
            report, keep_fp32, tgt_side.lower,
            lambda kept: once(keep=_precision.kept_modules(once.listed, kept)),
            step, tgt_side.spelling,
        )  # fmt: skip
    report.notes[:0] = notes
    return report


class _Comparison:
    """One run of the two PyTorch sides, layer by layer (``keep``: modules of the target left in
    float32). Called once, or twice when keep-in-float32 advice is checked."""

    def __init__(
        self, model, inputs, options, ref_side, tgt_side, name, seed, phases, timings, step,
        progress,
    ):  # fmt: skip
        self.model, self.inputs, self.options = model, inputs, options
        self.ref_side, self.tgt_side, self.name, self.seed = ref_side, tgt_side, name, seed
        self.phases, self.timings, self.step, self.progress = phases, timings, step, progress
        self.listed = None
        # Modules the target calls other layers inside than the reference: compared whole.
        self.diverging: list[str] = []
        # The modules the last run took whole (those and the self-computing ones).
        self.whole: frozenset = frozenset()
        # The modules the last listing saw read weights outside themselves.
        self.reads_outside: list[str] = []

    def __call__(self, keep) -> Report:
        """The comparison; where the target cannot be followed call by call (a module with a
        path of its own for the target's precision or device), once more with the modules
        where the calls differ compared whole."""
        last = None
        for _ in range(3):
            try:
                report = self._once(keep)
            except _Diverged as diverged:
                found = self._where_calls_differ(keep)
                if not found or set(found) <= set(self.diverging):
                    raise _layerdiff.InputError(str(diverged)) from None
                self.diverging = sorted({*self.diverging, *found})
                last = diverged
                continue
            if self.diverging:
                listed = ", ".join(f"`{m}`" for m in self.diverging)
                report = report.warned([
                    f"{listed} compared whole: the target calls other submodules or ops inside "
                    "them than the reference does (a path of their own for its precision or "
                    "device), so it cannot be followed call by call there"
                ])  # fmt: skip
            return report
        raise _layerdiff.InputError(str(last))

    def _where_calls_differ(self, keep) -> list[str]:
        """The modules inside which the target's pass calls other layers than the listing."""
        from layerdiff.torch._lockstep import diverging_modules
        from layerdiff.torch._precision import computing_modules, keep_in_float32

        tgt_side, whole = self.tgt_side, self.whole
        with cuda_math(self.ref_side, tgt_side):
            copied, given = tgt_side.prepare(self.model, self.inputs, whole, self.reads_outside)
            keep_in_float32(
                copied, keep, tgt_side.autocast_device, computing_modules(self.listed), self.model
            )
            with tgt_side.running():
                theirs = run_model(
                    self.inputs, lambda: capture(copied, given, whole=whole, dataflow=False)
                )
        return diverging_modules(self.listed, theirs.layers)

    def _once(self, keep) -> Report:
        model, inputs, options = self.model, self.inputs, self.options
        ref_side, tgt_side, step, timings = self.ref_side, self.tgt_side, self.step, self.timings
        phases, lap = timed_phases(list(self.phases) if timings is not False else False)
        name, seed = self.name, self.seed

        with cuda_math(ref_side, tgt_side):
            ref_model, ref_inputs = (
                (model, inputs) if ref_side.plain else ref_side.prepare(model, inputs, whole=())
            )
            step(f"listing PyTorch layers ({ref_side.spelling})")
            with ref_side.running():
                listing = run_model(inputs, lambda: capture(ref_model, ref_inputs))
                # A module that computes everything itself (attention reading its projections'
                # weights) is one layer: its own re-run then covers what it computes.
                whole = self.whole = frozenset([*listing.self_computing, *self.diverging])
                if whole:
                    listing = capture(ref_model, ref_inputs, whole=whole)
            listed = self.listed = listing.layers
            reads_outside = self.reads_outside = listing.reads_outside
            lap("listing PyTorch layers")

            given = [flat(f"input_{i}", t) for i, t in enumerate(inputs)]
            run = _layerdiff.CapturedRun(
                command="torch",
                model=name or model_name(model),
                inputs=given,
                layers=listed,
                options=options,
                seed=seed,
                reference_runtime="pytorch",
                reference_detail=ref_side.describe(),
                target_detail=tgt_side.describe(),
                reduced_math=tgt_side.reduced_math(),
                timings=phases if timings is not False else None,
            )
            split = run.segments_text
            pieces = f" in {run.segments} segments" if split else ""
            step(f"running {ref_side.spelling} and {tgt_side.spelling} side by side{pieces}")
            target_model = _stream(
                model, inputs, ref_model, ref_inputs, run, listed, ref_side, tgt_side, options,
                whole, keep, ticker=progress_line(self.progress, len(listed)),
                reads_outside=reads_outside,
            )  # fmt: skip
            run.conclude()
            native = finished(run, listed, ref_model, target_model)
        report = Report(native, inputs=given)
        report.notes += [split] if split else []
        return report


def _stream(
    model, inputs, ref_model, ref_inputs, run, listed, ref_side, tgt_side, options, whole, keep,
    ticker=None, reads_outside=(),
):  # fmt: skip
    """The forward pass that compares: each reference layer goes to the run with the target's
    value of it, its local re-run and the float64 value (``keep``: modules of the target left in
    float32). Returns the target's model."""
    from layerdiff.torch._precision import _cast, computes_in, computing_modules, keep_in_float32

    def prepare(m, i):
        copied, given = tgt_side.prepare(m, i, whole, reads_outside)
        keep_in_float32(copied, keep, tgt_side.autocast_device, computing_modules(listed), model)
        return copied, given

    target, truth = _copies(model, inputs, prepare, tgt_side, options.float64, whole, reads_outside)
    if target.model is None:
        raise _layerdiff.InputError(f"the target `{tgt_side.spelling}` {target.error}")
    modules = dict(leaf_modules(target.model, whole))
    # the model's own modules, for the exact baseline (never a cast reference's: its rounding)
    originals = dict(leaf_modules(ref_model if ref_side.plain else model, whole))
    # Each re-run is made twice where the side may disagree with itself: how far the two
    # disagree is its own nondeterminism at that layer, handed over with the layer.
    twice = tgt_side.may_disagree
    made = _Rerun()
    weights = _CASTS.get(tgt_side.precision)
    as_target = tgt_side.converter_from(ref_side)  # the reference's values as the target holds them

    def rerun(leaf, func, args, kwargs):
        """The target's module (or op) on the reference's inputs, as the target holds them (a
        module kept in float32 takes them cast up)."""
        convert = as_target
        call = func or modules[leaf].forward
        low = _CASTS.get(tgt_side.precision)
        computes = weights  # the dtype the call's weights are held in, where cast
        if keep and leaf is not None and low is not None:
            wanted = computes_in(modules[leaf], low)
            if wanted != low:
                # kept in float32: its inputs rounded as the target holds them, then cast up
                convert = lambda t: _cast(as_target(t), wanted)  # noqa: E731
                computes = wanted

        # a functional call takes the target's own non-tensor arguments (an epsilon its code
        # computes from the dtype), on the reference's tensors
        own_args, own_kwargs = args, kwargs
        if func is not None:
            own_args, own_kwargs, made.arguments = own_arguments(target.peek(), func, args, kwargs)

        def once():
            given = torch.utils._pytree.tree_map(convert, own_args)
            named = torch.utils._pytree.tree_map(convert, own_kwargs)
            # a streamed model's copy holds the module's weights only while it is called
            with tgt_side.running(), held(modules[leaf]) if func is None else nullcontext():
                return call(*given, **named)

        out = once()
        made.disagreed = _disagreement(out, once()) if twice else None
        first = _first_tensor(out)
        if options.float64 and first is not None and (first.is_floating_point() or _indices(func)):
            module = (modules[leaf], originals[leaf]) if func is None else None
            # the inputs' rounding is the target's (a kept module's too), its math the call's
            made.grid, made.exact, made.terms = _baseline_of(
                first, module, (func, args, kwargs), computes, as_target
            )
        return out

    def on_layer(index, layer, out, local):
        expected = listed[index].name if index < len(listed) else None
        if layer.name != expected:
            raise _layerdiff.InputError(
                f"leaf call {index} was `{layer.name}` this time and "
                f"{f'`{expected}`' if expected else 'nothing'} when the layers were listed: "
                "the model does not run the same way twice"
            )
        theirs = target.next(layer.name)
        if theirs is None:
            raise (_Diverged if target.diverged else _layerdiff.InputError)(
                f"the target `{tgt_side.spelling}` could not follow the model to `{layer.name}`: "
                f"{target.error}"
            )
        wide = truth.next(layer.name) if truth is not None else None
        grid_name = None
        if made.grid is not None:
            grid_name = dtype_name(layer.name, torch.empty(0, dtype=made.grid))
        run.add(
            index,
            flat(layer.name, out),
            float64=None if wide is None else flat(layer.name, wide),
            target=flat(layer.name, theirs),
            local=flat(layer.name, local) if isinstance(local, torch.Tensor) else None,
            local_error=_local_error(local),
            disagreement=made.disagreed,
            baseline=None if made.exact is None else flat(layer.name, made.exact),
            baseline_grid=grid_name,
            reduction=None
            if made.terms is None
            else (made.terms[0], flat(layer.name, made.terms[1])),
            arguments=made.arguments or None,
        )
        made.__init__()  # the next layer starts clean
        if ticker is not None:
            ticker(index + 1)

    try:
        with ref_side.running():
            run_model(
                inputs,
                lambda: capture(
                    ref_model,
                    ref_inputs,
                    on_layer,
                    rerun=rerun if options.local else None,
                    whole=whole,
                    dataflow=False,  # the listing pass told each layer's
                ),
            )
    finally:
        target.close()
        if truth is not None:
            truth.close()
    return target.model


def _copies(model, inputs, prepare, tgt_side, truth: bool, whole, reads_outside):
    """The target's copy (`prepare`) and the float64 truth's (where asked), each run in
    lockstep with the main pass. The target's functional calls come with their own non-tensor
    arguments (`own_arguments`). A compiled target compiles its leaves as it meets them: the
    copies then take turns with the main pass (PyTorch's is_compiling() is one flag for every
    thread; see `Lockstep`)."""
    turns = tgt_side.compile is not None
    target = Lockstep(
        model, inputs, prepare, running=tgt_side.running, whole=whole, arguments=True, turns=turns
    )
    if not truth:
        return target, None
    wide = partial(float64, whole=whole, reads_outside=reads_outside)
    return target, Lockstep(model, inputs, wide, whole=whole, turns=turns)


@dataclass
class _Rerun:
    """What a layer's local re-run made, handed over with the layer: how far it disagreed with
    itself run twice, the same call made exactly on the same inputs rounded (its
    same-precision baseline), the grid that call computes in where narrower than its result,
    a Linear's or a Conv's terms (its narrow-accumulation ideal), and a functional call's
    numbers and flags the target's own code passes otherwise, in words."""

    disagreed: float | None = None
    exact: object = None
    grid: object = None
    terms: tuple | None = None
    arguments: list | None = None


def _baseline_of(first, module, call, weights, held):
    """A re-run call's same-precision baseline: the grid it computes in where narrower than its
    result `first` (None otherwise), the call made exactly on the reference's inputs rounded as
    the target holds them (`held`), and, for a module, its reduction's terms. `module`: the
    target's module and the model's (None for a functional call); `call`: (func, args,
    kwargs); `weights`: the target's dtype for weights, where it casts them."""
    func, args, kwargs = call
    if not first.is_floating_point():  # indices (argmax): of the inputs as the target holds them
        leaves = torch.utils._pytree.tree_leaves((args, kwargs))
        # the dtype each input is held in, told by one element (exact_call converts them all)
        floats = [
            held(t.reshape(-1)[:1]).dtype
            for t in leaves
            if torch.is_tensor(t) and t.is_floating_point()
        ]
        dtype = reduce(_baseline.narrower, floats, None)
        if dtype is None:
            return None, None, None
        return dtype, _baseline.exact_call(None, func, args, kwargs, held=held, dtype=dtype), None
    # A module whose own parameters are narrower than what it returns (a module converted with
    # .half() that casts its result back) computes in their dtype.
    own = None
    if module is not None:
        params = module[0].parameters()
        own = next((p.dtype for p in params if p.is_floating_point()), None)
    dtype = _baseline.narrower(weights or torch.float32, first.dtype)
    dtype = _baseline.narrower(dtype, own)
    original = module[1] if module is not None else None
    exact = _baseline.exact_call(original, func, args, kwargs, held=held, dtype=dtype)
    terms = None
    if module is not None and exact is not None:
        terms = _baseline.exact_reduction(original, args, held=held, dtype=dtype)
    return (dtype if dtype != first.dtype else None), exact, terms


def _indices(func) -> bool:
    """Whether a re-run call is an op whose values are indices (`INDEX_OPS`: argmax)."""
    return func is not None and functional_op(func) in INDEX_OPS


def _disagreement(first, second) -> float | None:
    """The max abs diff between two runs' first tensors, where they differ."""
    a, b = _first_tensor(first), _first_tensor(second)
    if a is None or b is None or a.shape != b.shape or torch.equal(a, b):
        return None
    return float((a.double() - b.double()).abs().max())


def _local_error(local) -> str | None:
    """Why a layer has no local re-run, in the report's words."""
    if local is None or isinstance(local, torch.Tensor):
        return None
    return f"the target's module could not run on the reference's inputs: {local}"


class _Diverged(_layerdiff.InputError):
    """The target called other layers than the reference: where, in words."""
