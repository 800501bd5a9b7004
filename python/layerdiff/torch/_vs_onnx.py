"""`layerdiff torch`: a PyTorch model against its ONNX export, layer by layer. Lists the layers
(`_capture`), exports (`_export`), then streams each layer's value from the forward hooks to the
Rust engine, with the float64 copy's run in lockstep (`_lockstep`), and hands over the parameters
a cause needs."""

from __future__ import annotations

import contextlib
import tempfile
from functools import partial
from pathlib import Path

import torch

from layerdiff import _layerdiff
from layerdiff.report import Report
from layerdiff.tensors import flat
from layerdiff.torch._baseline import Replay, model_precision
from layerdiff.torch._capture import capture
from layerdiff.torch._export import export_onnx
from layerdiff.torch._lockstep import Lockstep
from layerdiff.torch._lockstep import float64 as float64_copy
from layerdiff.torch._running import (
    finished,
    model_and_inputs,
    model_name,
    model_notes,
    progress_line,
    run_model,
    timed_phases,
)
from layerdiff.torch._streamed import refuse_export


def compare_torch_onnx(
    model,
    inputs=None,
    *,
    onnx: str | Path | None = None,
    tolerance: float | str = "dtype",
    exporter: str = "dynamo",
    target: str = "ort",
    name: str | None = None,
    seed: int | None = None,
    workdir: str | Path | None = None,
    clone: bool = True,
    local: bool = True,
    float64: bool = True,
    max_memory: int | str | None = None,
    timings: bool | list = False,
    progress=None,
    options: _layerdiff.Options | None = None,
    dtype: str | None = None,
    keep_fp32: list[str] | tuple = (),
    cache: bool = True,
    beside=None,
) -> Report:
    """Compare a PyTorch model with its ONNX export under ONNX Runtime, layer by layer.

    The one model instance given is both captured and exported (or, with ``onnx=``, compared
    against that file), and both sides receive the same input bytes. ``model`` may be a
    transformers checkpoint folder (`load_checkpoint`: its inputs made from its config unless
    ``inputs`` are given). ``target`` names the runtime
    that runs the ONNX file: ``"ort"`` (CPU, optimizations off), ``"ort:opt=all"``,
    ``"ort:cuda"``…, ``"tract"``, or ``"openvino"`` (``"openvino:precision=f16"``).

    ``tolerance`` is judged per element: a number for every element, ``"dtype"`` (atol + rtol·|x|
    by the lower-precision dtype: {DEFAULT_TOLERANCE}) or ``"auto"`` ({AUTO_FACTOR:g}× PyTorch's
    own distance from the float64 run, per layer). With
    ``local`` each layer's ONNX nodes are also re-run on PyTorch's values of their inputs, so the
    report tells a layer's own error from inherited error; with ``float64`` a float64 copy of the
    model is run as the numerical truth. ``report.drift_origin`` names the layer where the drift
    is born; each exceeding layer carries a ``cause``. With ``timings`` (True, or a list of
    ``(phase, by, seconds)`` measured before the call) the report holds the time of each phase.

    Layers stream from the forward hooks: the ONNX run goes in segments, each run as soon as
    PyTorch has produced its layers, so that the values held at once stay within
    ``max_memory`` (bytes, or a size such as ``"4G"``; default: what keeps the whole process
    within half the memory it could use).
    The numbers do not depend on it.

    ``dtype`` (``"fp16"``, ``"int8"``) converts the ONNX file before the target runs it, with
    ONNX Runtime's float16 converter or its static QDQ quantizer, as a deployment would. When it
    drifts, ``report.data["keep_float32"]`` lists the layers to keep in float32, and the advice is
    checked by converting again with those layers' nodes kept and comparing once more;
    ``keep_fp32`` (layer names) keeps the given layers instead, and the report is then that of the
    model with them kept, checked against the one without.

    The export is kept in the user's cache folder (``LAYERDIFF_CACHE_DIR``, else
    ``~/.cache/layerdiff``) under a key of the weights, the model's code, the inputs and the
    exporter: a second run of the same model reuses it; ``cache=False`` exports anew.

    ``options`` (an ``Options`` already parsed, as the command line makes) replaces
    ``tolerance``, ``local``, ``float64``, ``max_memory`` and ``target``.

    Where the file given as ``onnx`` computes a layer differently from the model, an export of
    the model is set beside it to name what differs; ``beside`` (a path, or a callable that
    makes one when first needed) is that export, for a caller that compares the same model
    several times and exports it once (each decode step); by default the model is exported
    afresh (cached) on the inputs given.
    """
    phases, lap = timed_phases(timings)
    step = progress or (lambda message: None)
    if options is None:
        options = _layerdiff.Options(
            tolerance=tolerance,
            local=local,
            max_memory=max_memory,
            target=target,
            float64=float64,
        )
    model, inputs = model_and_inputs(model, inputs, seed, streams=options.streams_weights)
    if onnx is None:
        refuse_export(model)  # before the listing pass reads every weight once
    # dtype, keep_fp32 and onnx against the target: the command line's rules, kept in Rust.
    options = options.resolved(dtype=dtype, keep_fp32=bool(keep_fp32), onnx=onnx)
    if options.torch_target is not None:
        raise _layerdiff.UsageError(
            f"the target `{options.torch_target.spelling}` is PyTorch itself: "
            "use compare_torch for PyTorch sides"
        )
    notes = model_notes(model)

    step("listing PyTorch layers")
    listing = run_model(inputs, lambda: capture(model, inputs, fingerprints=True))
    listed = listing.layers
    lap("listing PyTorch layers")

    with contextlib.ExitStack() as stack:
        folder = (
            Path(workdir) if workdir else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        )
        if onnx is not None:
            onnx_path = Path(onnx)
        else:
            folder.mkdir(parents=True, exist_ok=True)
            onnx_path = export_onnx(
                model, inputs, folder / "model.onnx", exporter=exporter, cache=cache, step=step,
                copy=workdir is not None,  # a folder of the user's gets its own file
            )  # fmt: skip
            lap("ONNX export")

        compare = _FileComparison(
            model, inputs, listed, options, name or model_name(model), seed,
            phases if timings is not False else None, clone, progress, step,
            exported=onnx is None, reads_outside=listing.reads_outside,
            exporter=exporter, cache=cache, beside=beside,
        )  # fmt: skip
        if dtype is None:
            return compare(onnx_path, notes=notes)
        run = (compare, notes, step, lap)
        return _converted(onnx_path, dtype, keep_fp32, folder, inputs, seed, run)


# The tolerance's defaults in the docstring are the core's, in its words (no docstring under -OO).
if compare_torch_onnx.__doc__:
    compare_torch_onnx.__doc__ = compare_torch_onnx.__doc__.format(
        DEFAULT_TOLERANCE=_layerdiff.DEFAULT_TOLERANCE, AUTO_FACTOR=_layerdiff.AUTO_FACTOR
    )


def _converted(onnx_path, dtype, keep_fp32, folder, inputs, seed, run) -> Report:
    """The export converted to `dtype` (float16, int8) and compared (`run`: the comparison of
    a file, the notes it carries, the progress step and the phase lap), with its keep-in-float32
    advice (or `keep_fp32`) checked by converting again with those layers kept."""
    from layerdiff.torch import _precision

    compare, notes, step, lap = run
    step(f"converting the ONNX file to {_layerdiff.precision_name(dtype)}")
    folder.mkdir(parents=True, exist_ok=True)
    converted, note = _precision.convert(
        onnx_path, dtype, folder / f"model.{dtype}.onnx", inputs, seed=seed or 0
    )
    lap(f"conversion to {dtype}", "runtime")
    plain = compare(converted, note=note, notes=notes)
    if dtype == "int8":
        plain = plain.advised("int8")

    def again(kept):
        converted, note = _precision.convert(
            onnx_path, dtype, folder / f"model.{dtype}-kept.onnx", inputs,
            keep_nodes=_precision.kept_nodes(plain, kept), seed=seed or 0,
        )  # fmt: skip
        return compare(converted, note=note, notes=notes)

    name = _layerdiff.precision_name(dtype)
    return _precision.checked_advice(plain, keep_fp32, name, again, step, name)


class _FileComparison:
    """One ONNX file compared with the PyTorch model, layer by layer: the run, the stream of the
    layers from the forward hooks, the report. Called once per file (a lower precision compares
    a second, converted again with layers kept in float32)."""

    def __init__(
        self, model, inputs, listed, options, name, seed, phases, clone, progress, step,
        exported: bool, reads_outside=(), exporter: str = "dynamo", cache: bool = True,
        beside=None,
    ):  # fmt: skip
        self.model, self.inputs, self.listed, self.options = model, inputs, listed, options
        self.name, self.seed, self.phases, self.clone = name, seed, phases, clone
        self.progress, self.step, self.exported = progress, step, exported
        self.reads_outside = reads_outside
        # how a fresh export is made, where one is set beside a given file (`beside`: one
        # already made, or what makes it)
        self.exporter, self.cache, self.beside = exporter, cache, beside

    def __call__(self, onnx_path: Path, *, note: str | None = None, notes=()) -> Report:
        model, inputs, listed, options = self.model, self.inputs, self.listed, self.options
        if note is None:  # the target's line names the file compared
            note = f"{self.exporter} export" if self.exported else str(onnx_path)
        declared = _layerdiff.model_inputs(str(onnx_path))
        if len(declared) != len(inputs):
            names = ", ".join(d[0] for d in declared)
            if self.exported and len(declared) < len(inputs):
                raise _layerdiff.ModelError(
                    f"the export takes {len(declared)} input(s) ({names}) for the model's "
                    f"{len(inputs)}: the exporter made the others constants (a tensor read with "
                    ".item(), float() or int() is traced as the example's value) or dropped them "
                    "as unused, so the file computes as if they always had the example's values; "
                    "keep every input a tensor the model computes with"
                )
            raise _layerdiff.InputError(
                f"the ONNX model takes {len(declared)} input(s) ({names}), "
                f"but {len(inputs)} example input(s) were given"
            )
        warnings = _float64_inputs(model, inputs)
        onnx_inputs = [flat(decl[0], t) for decl, t in zip(declared, inputs, strict=True)]
        run = _layerdiff.CapturedRun(
            command="torch",
            model=self.name,
            onnx_path=str(onnx_path),
            inputs=onnx_inputs,
            layers=listed,
            options=options,
            seed=self.seed,
            reference_runtime="pytorch",
            reference_detail=f"torch {torch.__version__}, eager, cpu",
            target_note=note,
            timings=self.phases,
        )
        split = run.segments_text
        pieces = f" in {run.segments} segments" if split else ""
        self.step(f"running PyTorch and the ONNX model side by side{pieces}, comparing each layer")
        _stream(
            model, inputs, run, listed, float64=options.float64, clone=self.clone,
            baseline=options.float64 and options.local,
            ticker=progress_line(self.progress, len(listed)), reads_outside=self.reads_outside,
        )  # fmt: skip
        if not self.exported:
            # a file the user gives is read against the model weight by weight: an edit under
            # every tolerance moves no layer past it, and the file is not the model all the same
            run.read_every_weight()
        run.conclude()
        if not self.exported and run.file_differs():
            self._beside_a_fresh_export(run, report_notes := [])
        else:
            report_notes = []
        native = finished(run, listed, model)
        report = Report(native, inputs=onnx_inputs).warned(warnings)
        report.notes += [n for n in (*notes, split, *report_notes) if n]
        report.onnx_path = Path(onnx_path)
        return report

    def _beside_a_fresh_export(self, run, notes: list[str]) -> None:
        """The given file computes some layer differently from the model while the runtime
        computes what the file says: a fresh export of the model (cached) is set beside it, so
        the report names the attribute or constant that differs, node by node. An export that
        cannot be made leaves the file's own nodes named, and says why."""
        try:
            if self.beside is not None:
                made = self.beside() if callable(self.beside) else self.beside
                run.beside(str(made))
                return
            self.step("exporting the model afresh, to name what differs in the file")
            with tempfile.TemporaryDirectory() as folder:
                fresh = export_onnx(
                    self.model, self.inputs, Path(folder) / "fresh.onnx",
                    exporter=self.exporter, cache=self.cache, step=self.step,
                )  # fmt: skip
                run.beside(str(fresh))
        except Exception as e:  # noqa: BLE001 (any failure only leaves the file's nodes named)
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            notes.append(
                "a fresh export of the model to set beside the file could not be made "
                f"({first}): the file's own nodes are named instead of what differs"
            )


def _float64_inputs(model, inputs) -> list[str]:
    """A warning for each float64 input of a model whose parameters are float32 (numpy arrays
    are float64 by default): the export then takes float64 where a deployment feeds float32."""
    wide = [i for i, t in enumerate(inputs) if t.dtype == torch.float64]
    params = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if not wide or params != {torch.float32}:
        return []
    return [
        f"input {i} is float64 while the model's parameters are float32: the export takes it "
        "as float64, where a deployment feeds float32 (numpy arrays are float64 by default; "
        "give .float() inputs)"
        for i in wide
    ]


def _stream(
    model, inputs, run, listed, *, float64: bool, clone: bool, baseline: bool = False,
    ticker=None, reads_outside=(),
) -> None:  # fmt: skip
    """The second forward pass: each layer's value goes to the run as its hook fires, with the
    float64 run's value of the same layer and, with ``baseline``, the layer in float64 on the
    reference's values rounded as the target holds them (`layerdiff.torch._baseline.Replay`).
    ``clone=False`` instead hands the outputs over after the pass, by reference: it exists only
    so a test can show what in-place ops (``ReLU(inplace=True)``) then do to them."""
    truth = None
    if float64:
        truth = Lockstep(model, inputs, partial(float64_copy, reads_outside=reads_outside))
    replay = None
    if baseline:
        compared = run.compared_dtypes
        precision = model_precision(compared)
        replay = Replay(model, inputs, compared, precision, reads_outside=reads_outside)
    late: list = []

    def on_layer(index, layer, out, _local):
        expected = listed[index].name if index < len(listed) else None
        if layer.name != expected:
            raise _layerdiff.InputError(
                f"leaf call {index} was `{layer.name}` this time and "
                f"{f'`{expected}`' if expected else 'nothing'} when the layers were listed: "
                "the model does not run the same way twice"
            )
        wide = truth.next(layer.name) if truth is not None else None
        exact = replay.next(index, layer.name, out) if replay is not None else None
        # a float64 copy that stopped says why
        if wide is None and truth is not None and truth.error:
            run.truth_lost(truth.error)
        if exact is None and replay is not None and replay.error:
            run.baseline_lost(replay.error)
        value = flat(layer.name, out)
        _same_as_listed(listed[index], value)
        if clone:
            run.add(
                index, value, _flat_or_none(layer.name, wide),
                baseline=_flat_or_none(layer.name, exact),
            )  # fmt: skip
        else:
            late.append((index, layer.name, out, wide))
        if ticker is not None:
            ticker(index + 1)

    try:
        run_model(inputs, lambda: capture(model, inputs, on_layer, dataflow=False))
    except KeyboardInterrupt:
        # the command's Ctrl-C or SIGTERM: the run stops here, and the layers compared so far
        # make its report, marked incomplete (the engine runs no segment after the signal)
        if _layerdiff.interrupt_signal() is None:
            raise
    finally:
        if truth is not None:
            truth.close()
        if replay is not None:
            replay.close()
    for index, layer_name, out, wide in late:
        run.add(index, flat(layer_name, out), _flat_or_none(layer_name, wide))


def _same_as_listed(layer, value) -> None:
    """Refuses a model that computes other values on the same inputs than when its layers were
    listed: a random op (dropout called with training=True, torch.rand in forward) makes every
    run differ, and no export can be compared with it."""
    if layer.fingerprint is None or _layerdiff.same_run(layer.fingerprint, value):
        return
    raise _layerdiff.InputError(
        f"layer `{layer.name}` computed other values on the same inputs in a second run: the "
        "model is random (dropout called with training=True, torch.rand/randn/bernoulli in "
        "forward), so no export can be compared with it; make it deterministic in eval mode "
        "(F.dropout(x, p, training=self.training))"
    )


def _flat_or_none(name: str, tensor):
    return None if tensor is None else flat(name, tensor)
