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
import dataclasses
import io

import torch

from layerdiff import _layerdiff
from layerdiff.tensors import flat
from layerdiff.torch import _precision
from layerdiff.torch._capture import _first_tensor
from layerdiff.torch._repro import _call_inputs, _module_of
from layerdiff.torch._sides import _CAST


def _within(reference, got, bound) -> bool:
    """Whether `got` is within the layer's `bound` of `reference`: the core's allclose."""
    reference, got = reference.detach().float().cpu(), got.detach().float().cpu()
    return _layerdiff.within(
        flat("reference", reference), flat("got", got), bound["atol"], bound["rtol"]
    )


def compile_stage(model, inputs, report, plan, tgt_side, step):
    """The report with the torch.compile stage (and Inductor subsystem) that turns its headline
    on (the core's `plan`), or with a note saying why there is none."""
    name = plan.layer
    path, call = _module_of(model, name)
    eager_side = dataclasses.replace(tgt_side, compile=None)
    args, kwargs, _ = _call_inputs(model, inputs, path, call, eager_side)
    module = model.get_submodule(path)
    bound = _tolerance(report, name)
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

    backend = plan.backend
    step(f"bisecting torch.compile's stages on `{path}` alone")
    if agrees(backend):
        report.notes.append(
            f"--bisect: `{path}` alone compiled ({backend}) agrees with it eager: "
            "what differs is not the compiler's work on this module"
        )
        return report
    if plan.inductor:  # PyTorch's own bisector walks Inductor's stages and subsystems
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
        stages = plan.stages
        stage = next(s for s in stages if s == backend or not agrees(s))
        candidates, responsible = len(stages), [stage]
    before = _layerdiff.stage_before(stage)
    step(f"checking: `{path}` compiled with {before}, the stage before")
    clean = agrees(before)
    native = report._native.stages_bisected(path, candidates, responsible, clean, runs[0])
    return report._with(native)


def _tolerance(report, name: str) -> dict:
    """The tolerance `report` judged `name` by: its layer's, or, for a module whose compiled
    form differs (no layer of the report), its compile's."""
    for layer in report.layers:
        if layer["name"] == name:
            return layer["tolerance"]
    compiled = report.data["compiled_whole"]["tried"]
    return next(t["tolerance"] for t in reversed(compiled) if t["module"] == name)


def keep_float32(model, inputs, report, plan, once, listed, sides, step):
    """The report with its keep-in-float32 advice replaced by the smallest set of the core's
    candidate layers (`plan`) that brings the output within tolerance, checked by the
    comparison run again with them kept; or with a note saying why there is none. `sides`: the
    reference's and the target's."""
    ref_side, tgt_side = sides
    candidates, precision = plan.candidates, plan.precision
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
    step(f"checking: {tgt_side.spelling} again with {len(kept)} layer(s) in float32")
    with_kept = once(keep=_precision.kept_modules(listed, kept))
    native, notes = report._native.kept_bisected(
        (precision, len(candidates), plan.defects), found, everything, runs[0] + 1,
        with_kept.summary["layers_compared"], with_kept.summary["layers_exceeding"], failed,
    )  # fmt: skip
    report.notes.extend(notes)
    if everything:
        why = "found by bisection: with these kept, the output is within its tolerance"
        native = native.advised_layers(precision, [(name, why) for name in found])
    report = report._with(native)
    return report.advice_checked(with_kept, kept, False, precision)


def _forward(model, inputs):
    with torch.no_grad():
        return model(*inputs)
