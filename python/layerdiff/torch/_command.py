"""`layerdiff torch` and `layerdiff grad` as the command line runs them: the parsed command
(options, rules and dispatch are Rust's) run on the PyTorch adapter, its repro written where
asked, and its outputs delivered by the same Rust functions as the ONNX verbs'. Run by
`layerdiff reduce` (``command.reducing``), the repro's verdict is the exit code."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from layerdiff import _layerdiff
from layerdiff._cli import _process_age
from layerdiff.torch._running import GRAD_HOLDS, GRAD_INSTEAD, whole_only


def torch(command, progress) -> int:
    """`layerdiff torch`: against the ONNX export on a runtime, or a PyTorch target; along an
    axis with `--batch-sizes`/`--shapes`, or decoding with `--decode-steps`."""
    from layerdiff import torch as lt

    along = command.batch_sizes or command.shapes or command.decode_steps
    # A checkpoint too large to hold is held one module at a time, against an ONNX file or
    # another PyTorch side (and decoded so against a decoder file given: an export needs the
    # whole model).
    decoding_a_file = command.decode_steps and command.onnx is not None
    if not along or (decoding_a_file and command.options.torch_target is None):
        streams = command.options.streams_weights
    else:
        flag = next(f for f, v in _AXES.items() if getattr(command, v))
        decode = " against its decoder file (`--onnx`)" if command.decode_steps else ""
        streams = whole_only(
            command.options, command.model, f"`{flag}` here runs the whole model at once",
            f"run it{decode} without `--target torch:…`" if decode else None,
        )  # fmt: skip
    model, inputs, common = _built(command, progress, streams)
    if along:
        return _along_axis(command, model, inputs, progress)
    if command.options.torch_target is not None:
        report = lt.compare_torch(
            model, inputs, progress=progress, keep_fp32=command.keep_fp32,
            bisect=command.bisect, **common,
        )  # fmt: skip
        said = _torch_repro(model, inputs, report, command) if command.repro else None
        return _delivered(command, report, said)
    with tempfile.TemporaryDirectory() as kept:
        # A repro is cut from the file compared: keep the export until it is written.
        workdir = command.out or (kept if command.repro is not None else None)
        report = lt.compare_torch_onnx(
            model, inputs, onnx=command.onnx, exporter=command.exporter, workdir=workdir,
            progress=progress, cache=command.cache, dtype=command.dtype,
            keep_fp32=command.keep_fp32, **common,
        )  # fmt: skip
        # a run a signal stopped writes what it compared, and nothing it would have done after
        finished = "incomplete" not in report.summary
        said = _onnx_repro(model, inputs, report, command) if command.repro and finished else None
        return _delivered(command, report, said)


def grad(command, progress) -> int:
    """`layerdiff grad`: both sides' gradients, layer by layer."""
    from layerdiff.torch._grad import compare_gradients

    model, inputs, common = _built(
        command, progress,
        whole_only(command.options, command.model, GRAD_HOLDS, GRAD_INSTEAD),
    )  # fmt: skip
    report = compare_gradients(model, inputs, loss=command.loss, progress=progress, **common)
    said = _grad_repro(model, inputs, report, command) if command.repro else None
    return _delivered(command, report, said)


#: The axes a `layerdiff torch` run may go along, by option, as the command holds them.
_AXES = {"--decode-steps": "decode_steps", "--batch-sizes": "batch_sizes", "--shapes": "shapes"}


def _built(command, progress, streams=None):
    """The model and its inputs from the command's builder (a checkpoint held one module at a
    time where ``streams`` says so of its size), and what every flow is given."""
    from layerdiff import torch as lt

    started = time.perf_counter()
    # Before this point: the interpreter's start-up and the imports (PyTorch's above all).
    start_up = [("start-up: interpreter and imports", "pytorch", _process_age())]
    builder = lt.load_builder(command.model, streams)
    progress(f"building {command.model} (seed {command.seed})")
    model, inputs = builder(command.seed)
    from layerdiff.torch._streamed import is_streamed

    if is_streamed(model):
        _layerdiff.heap_for_streaming()  # the command's own process, as `settle_heap`
    built = [*start_up, ("building the model", "pytorch", time.perf_counter() - started)]
    common = {
        "name": command.model,
        "seed": command.seed,
        "timings": built if command.timings else False,
        "options": command.options,
    }
    return model, inputs, common


def _delivered(command, report, said: tuple[str, bool] | None) -> int:
    """The outputs written and printed, the repro's sentence among the notes; or, run by
    `reduce`, the repro's sentence alone and its verdict as the exit code."""
    if command.reducing:
        sentence, reproduced = said
        if not command.quiet:  # `reduce` asked for it: no option to name
            print(sentence.removeprefix("--repro: "))
        return 0 if reproduced else 1
    if said is not None:
        report.notes.append(said[0])
    return report._native.deliver(command, report.inputs, command.seed, report.notes)


def _onnx_repro(model, inputs, report, command) -> tuple[str, bool]:
    """The repro of a PyTorch model against its ONNX file: the layer's ONNX nodes fed
    PyTorch's values, run on the target's runtime, checked."""
    from layerdiff.torch._repro import write_onnx_repro

    target = command.options.target_spelling
    return write_onnx_repro(model, inputs, report, target, command.repro, command.invocation)


def _grad_repro(model, inputs, report, command) -> tuple[str, bool]:
    """The repro of `layerdiff grad`: the headline gradient's module backward alone."""
    from layerdiff.torch._repro import write_grad_repro
    from layerdiff.torch._sides import TorchSide

    options = command.options
    sides = (TorchSide.of(options.reference), TorchSide.of(options.torch_target))
    return write_grad_repro(
        model, inputs, report, sides, command.loss, command.seed, command.repro,
        command.invocation, builder=command.model,
    )  # fmt: skip


def _torch_repro(model, inputs, report, command) -> tuple[str, bool]:
    """The repro of a PyTorch target: its headline's module alone, checked."""
    from layerdiff.torch._repro import write_repro
    from layerdiff.torch._sides import TorchSide

    options = command.options
    ref_side, tgt_side = TorchSide.of(options.reference), TorchSide.of(options.torch_target)
    return write_repro(
        model, inputs, report, ref_side, tgt_side, command.repro, command.invocation,
        builder=command.model,
    )  # fmt: skip


def _along_axis(command, model, inputs, progress) -> int:
    """`layerdiff torch --batch-sizes`/`--shapes`/`--decode-steps`: the axis report, and under
    `--out` each point's reports in its own folder."""
    from layerdiff.torch import _axis, _decode
    from layerdiff.torch._running import as_input_tuple

    at_point, said = _point_repro(command)
    common = {
        "onnx": command.onnx, "exporter": command.exporter, "workdir": command.out,
        "cache": command.cache, "seed": command.seed, "name": command.model,
        "options": command.options, "progress": progress, "at_point": at_point,
    }  # fmt: skip
    if command.decode_steps:
        axis, reports, notes = _decode.compare_decoding(
            model, inputs, steps=command.decode_steps, **common
        )
        slug = _decode.slug
    else:
        axis, reports, notes = _axis.compare_along(
            model, as_input_tuple(inputs), batch_sizes=command.batch_sizes, shapes=command.shapes,
            dtype=command.dtype, keep_fp32=command.keep_fp32, **common,
        )  # fmt: skip
        slug = lambda label: _axis.slug(axis.axis, label)  # noqa: E731
    if said:  # the point's name before its repro's sentence
        label, (sentence, reproduced) = said[0]
        where = label if label == "prefill" else f"{axis.axis} {label}"
        said[0] = (f"{where}: {sentence.removeprefix('--repro: ')}", reproduced)
    if command.reducing:
        return _delivered(command, None, said[0] if said else _no_point_repro(command))
    points = []  # each point's folder, and the files written in it
    if command.out is not None:
        for label, report in reports:
            folder = Path(command.out) / slug(label)
            written = report.write(
                json=folder / "report.json",
                markdown=folder / "report.md",
                html=folder / "report.html",
                svg=folder / "report.svg",
                node_data=folder / "report.node-data.json",
            )
            # what `layerdiff reduce folder/report.json` runs again, for this point
            report._native.write_point_inputs(
                command, folder / "report.inputs.safetensors", report.inputs, label
            )
            points.append((folder, [p.name for p in written] + ["report.inputs.safetensors"]))
        notes += _earlier_points(Path(command.out), [folder for folder, _ in points])
    for label, report in reports:
        notes += [f"{label}: {note}" for note in report.notes]
    if command.repro is not None:
        notes.append(said[0][0] if said else _no_point_repro(command)[0])
    return axis.deliver(command, notes, points)


def _earlier_points(out: Path, written: list[Path]) -> list[str]:
    """A note naming the folders in `out` that hold an earlier run's point reports (a run of
    more steps or other sizes), which this run left as they were: read beside this run's, they
    would pass for its own."""
    earlier = sorted(
        f"{child}/"
        for child in out.iterdir()
        if child.is_dir() and child not in written and (child / "report.json").is_file()
    )
    if not earlier:
        return []
    return [f"{', '.join(earlier)}: an earlier run's reports, not this run's (left as they were)"]


def _point_repro(command):
    """Along an axis, where a repro is asked for (`--repro`, or `layerdiff reduce` of one
    point's report): the hook that cuts it from its point (`command.point`, else the first
    point with a headline defect) while that point's file exists, and the list its sentence and
    verdict go in. Run by `reduce`, the axis stops at that point."""
    said: list = []

    def at_point(label, model, inputs, report) -> bool:
        if command.repro is None or said:
            return bool(said) and command.reducing
        if command.point is not None and label != command.point:
            return False
        if command.point is None and report._native.headline[0] is None:
            return False
        cut = _torch_repro if command.options.torch_target is not None else _onnx_repro
        said.append((label, cut(model, inputs, report, command)))
        return command.reducing

    return at_point, said


def _no_point_repro(command) -> tuple[str, bool]:
    """Why no point's repro was written."""
    if command.point is not None:
        return f"--repro: no repro written: the run has no point `{command.point}`", False
    return "--repro: no repro written: no point has a headline defect", False
