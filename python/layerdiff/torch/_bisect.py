"""`--bisect` for a PyTorch target: what turns its difference on.

- A torch.compile target: the headline layer's module alone, compiled, against the same side
  eager; PyTorch's own bisector (torch._inductor.compiler_bisector) then walks the stages
  (eager → aot_eager → aot_eager_decomp_partition → inductor) and Inductor's subsystems (its
  graph passes, its lowerings one by one, its configs) to the first one that shows it. Other
  backends are tried stage by stage.
- A float16 or bfloat16 target: the smallest set of layers to keep in float32 that brings the
  model's output within its tolerance, by halves (the engine's one search), each candidate set
  a forward pass; the answer replaces the advice and is checked by the whole comparison run
  again with those layers kept.
"""

from __future__ import annotations

import contextlib
import copy
import io

import torch

from layerdiff import _layerdiff
from layerdiff.torch import _precision
from layerdiff.torch._capture import _first_tensor
from layerdiff.torch._repro import _call_inputs, _module_call
from layerdiff.torch._sides import _CAST

_STAGES = ["eager", "aot_eager", "aot_eager_decomp_partition", "inductor"]


def _within(reference, got, bound) -> bool:
    reference, got = reference.double().cpu(), got.double().cpu()
    if reference.shape != got.shape:
        return False
    diff = (got - reference).abs()
    return bool((diff <= bound["atol"] + bound["rtol"] * reference.abs()).all())


def compile_stage(model, inputs, report, tgt_side, step):
    """The report with the torch.compile stage (and Inductor subsystem) that turns its headline
    on, or with a note saying why there is none."""
    name, why = report._native.headline
    if name is None:
        report.notes.append(f"--bisect: nothing to bisect: {why}")
        return report
    path, call = _module_call(name)
    eager_side = type(tgt_side)(tgt_side.spelling, tgt_side.device, tgt_side.precision, None)
    args, kwargs, _ = _call_inputs(model, inputs, path, call, eager_side)
    module = model.get_submodule(path)
    bound = report.layer(name)["tolerance"]
    dtype = _CAST.get(tgt_side.precision)

    def convert(t):
        return eager_side.convert(t) if isinstance(t, torch.Tensor) else t

    def output(backend):
        copied = copy.deepcopy(module).to(tgt_side.device)
        if dtype is not None:
            copied = copied.to(dtype)
        if backend is not None:
            torch._dynamo.reset()
            copied.forward = torch.compile(copied.forward, backend=backend, dynamic=False)
        given = torch.utils._pytree.tree_map(convert, (args, kwargs))
        with torch.no_grad(), eager_side.running():
            return _first_tensor(copied(*given[0], **given[1]))

    eager = output(None)
    runs = [0]

    def agrees(backend) -> bool:
        runs[0] += 1
        return _within(eager, output(backend), bound)

    step(f"bisecting torch.compile's stages on `{path}` alone")
    if agrees(tgt_side.compile):
        report.notes.append(
            f"--bisect: `{path}` alone compiled ({tgt_side.compile}) agrees with it eager: "
            "what differs is not the compiler's work on this module"
        )
        return report
    if tgt_side.compile == "inductor":
        from torch._inductor.compiler_bisector import BACKENDS, CompilerBisector

        said = io.StringIO()
        with contextlib.redirect_stdout(said):
            found = CompilerBisector.do_bisect(lambda: agrees("inductor"))
        if found is None:
            report.notes.append("--bisect: PyTorch's compiler bisector found no stage")
            return report
        stage = found.backend
        candidates = len(BACKENDS) + sum(len(s) for s in BACKENDS.values())
        responsible = [stage]
        if found.subsystem:
            at = f": {found.debug_info}" if found.debug_info else ""
            which = found.subsystem
            if found.bisect_number is not None:
                which += f" (bisect number {found.bisect_number}{at})"
            responsible.append(which)
    else:
        stages = _STAGES[: _STAGES.index(tgt_side.compile)] if tgt_side.compile in _STAGES else []
        stages = [*stages, tgt_side.compile]
        stage = next(s for s in stages if s == tgt_side.compile or not agrees(s))
        candidates, responsible = len(stages), [stage]
    before = _STAGES[_STAGES.index(stage) - 1] if stage in _STAGES[1:] else "eager"
    step(f"checking: `{path}` compiled with {before}, the stage before")
    clean = agrees(before)
    native = report._native.bisected(
        over=f"stages of torch.compile and subsystems of Inductor, on `{path}` alone",
        action="first shown by",
        candidates=candidates,
        responsible=responsible,
        found=clean,
        runs=runs[0],
        compared=1,
        exceeding_before=1,
        exceeding_after=0 if clean else 1,
        spelling=None,
    )
    return report._with(native)


def keep_float32(model, inputs, report, once, listed, sides, precision, step):
    """The report with its keep-in-float32 advice replaced by the smallest set of layers that
    brings the output within tolerance, checked by the comparison run again with them kept;
    or with a note saying why there is none. `sides`: the reference's and the target's."""
    ref_side, tgt_side = sides
    if report.summary["layers_exceeding"] == 0:
        report.notes.append("--bisect: nothing to bisect, no layer exceeds its tolerance")
        return report
    defects = {d["layer"] for d in report.summary["defects"]}
    candidates, modules = [], set()
    for layer in report.layers:
        name = layer["name"]
        module = next((entry.module for entry in listed if entry.name == name), None)
        if ":" in name or name in defects or module is None or module in modules:
            continue
        modules.add(module)
        candidates.append(name)
    output = next(
        layer for layer in reversed(report.layers) if layer.get("accumulated") is not None
    )
    ref_model, ref_inputs = (model, inputs) if ref_side.plain else ref_side.prepare(model, inputs)
    with ref_side.running():
        reference = _first_tensor(_forward(ref_model, ref_inputs))
    runs, failed = [0], []
    computing = _precision.computing_modules(listed)

    def clean(kept: list[str]) -> bool:
        """Whether the output is within its tolerance with `kept` in float32; a set with which
        the model cannot run (dtypes that meet in an op) is not."""
        runs[0] += 1
        copied, given = tgt_side.prepare(model, inputs)
        _precision.keep_in_float32(
            copied,
            _precision.kept_modules(listed, kept),
            tgt_side.autocast_device,
            computing,
            model,
        )
        try:
            with tgt_side.running():
                got = _first_tensor(_forward(copied, given))
        except Exception as e:  # that set is no answer; the search goes on
            failed.append(f"{type(e).__name__}: {e}".strip())
            return False
        return _within(reference, got, output["tolerance"])

    step(f"bisecting the layers to keep in float32 ({len(candidates)} candidates)")
    everything = clean(candidates)
    if not everything and failed:
        report.notes.append(
            f"--bisect: with all {len(candidates)} candidate layers kept in float32 the model "
            f"does not run: {failed[0]}"
        )
        return report
    found = _layerdiff.smallest_set(candidates, clean) if everything else []
    kept = found if everything else candidates
    if len(found) > len(candidates) / 2:
        report.notes.append(
            f"--bisect: {len(found)} of {len(candidates)} layers must stay in float32 for the "
            f"output to meet its tolerance: {precision}'s own rounding in the rest exceeds it; "
            "`--tolerance` with the output error you can accept finds the layers that matter"
        )
    if failed:
        report.notes.append(
            f"--bisect: {len(failed)} of the {runs[0]} sets tried could not run (counted as "
            f"not enough): {failed[0]}"
        )
    step(f"checking: {tgt_side.spelling} again with {len(kept)} layer(s) in float32")
    with_kept = once(keep=_precision.kept_modules(listed, kept))
    excluded = f", those with a defect left out ({len(defects)})" if defects else ""
    native = report._native.bisected(
        over=f"layers of the {precision} target{excluded}",
        action="kept in float32",
        candidates=len(candidates),
        responsible=found,
        found=everything,
        runs=runs[0] + 1,
        compared=with_kept.summary["layers_compared"],
        exceeding_before=report.summary["layers_exceeding"],
        exceeding_after=with_kept.summary["layers_exceeding"],
        spelling=None,
    )
    if everything:
        why = "found by bisection: with these kept, the output is within its tolerance"
        native = native.advised_layers(precision, [(name, why) for name in found])
    report = report._with(native)
    return report.checked(report, with_kept, kept, precision)


def _forward(model, inputs):
    with torch.no_grad():
        return model(*inputs)
