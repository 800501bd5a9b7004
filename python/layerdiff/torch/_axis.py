"""`layerdiff torch MODEL --batch-sizes 1,8,32` (or `--shapes`): one model compared at several
points of an axis. The model is exported once, with the dimensions that vary dynamic (from the
largest point, so no dimension of size 1 is taken for a constant), and compared at each point
with inputs drawn like the example's; a model that will not export dynamic is exported at each
point, and the axis report says so. The points' reports make one axis report
(`layerdiff._layerdiff.AxisReport`): each point's verdict and output error, and the layers that
pass at one point and fail at another.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import torch

from layerdiff import _layerdiff
from layerdiff.torch._inputs import inputs_at


def points(inputs: tuple, batch_sizes, shapes) -> tuple[str, list[tuple[str, list]]]:
    """The axis in words and its points: each point's label and the shape of every input."""
    if batch_sizes:
        return "batch size", [
            (str(b), [(b, *t.shape[1:]) if t.dim() else () for t in inputs]) for b in batch_sizes
        ]
    out = []
    for point in shapes:
        if len(point) != len(inputs):
            raise _layerdiff.UsageError(
                f"--shapes {_label(point)}: {len(point)} shape(s) for a model with "
                f"{len(inputs)} input(s)"
            )
        for i, (shape, t) in enumerate(zip(point, inputs, strict=True)):
            if len(shape) != t.dim():
                raise _layerdiff.UsageError(
                    f"--shapes {_label(point)}: input {i} has {t.dim()} dimensions "
                    f"({'x'.join(map(str, t.shape))}), not {len(shape)}"
                )
        out.append((_label(point), [tuple(s) for s in point]))
    return "input shapes", out


def _label(point) -> str:
    return ",".join("x".join(map(str, shape)) for shape in point)


def varying(points_shapes: list[list]) -> list[list[int]]:
    """For each input, the dimensions that differ between points."""
    first = points_shapes[0]
    return [
        [d for d in range(len(shape)) if any(p[i][d] != shape[d] for p in points_shapes)]
        for i, shape in enumerate(first)
    ]


def compare_along(
    model, inputs: tuple, *, batch_sizes=(), shapes=(), onnx=None, exporter="dynamo",
    workdir=None, seed: int = 0, name=None, options=None, dtype=None, keep_fp32=(), progress=None,
    target: str = "ort", tolerance: float | str = "dtype", cache: bool = True, at_point=None,
):  # fmt: skip
    """The axis report, each point's `(label, Report)`, and notes on the run. ``target`` and
    ``tolerance`` as for :func:`layerdiff.torch.compare_torch_onnx` (``options``, already parsed,
    replaces them); ``cache`` as there. ``at_point``: called as ``at_point(label, model, inputs,
    report)`` after each point's comparison, while the file it ran exists (a repro is cut from
    it); True stops the axis there."""
    from layerdiff.torch import compare_torch, compare_torch_onnx, export_onnx
    from layerdiff.torch._running import model_notes

    if not batch_sizes and not shapes:
        raise _layerdiff.UsageError("an axis needs batch_sizes or shapes")
    if options is None:
        options = _layerdiff.Options(tolerance=tolerance, target=target)
    step = progress or (lambda message: None)
    axis, at = points(inputs, batch_sizes, shapes)
    given = [inputs_at(inputs, point_shapes, seed) for _, point_shapes in at]
    notes = model_notes(model)
    pytorch_target = options.torch_target is not None
    with contextlib.ExitStack() as stack:
        folder = (
            Path(workdir) if workdir else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        )
        folder.mkdir(parents=True, exist_ok=True)
        files: list = [onnx] * len(at)
        if not pytorch_target and onnx is None:
            dims = varying([s for _, s in at])
            largest = max(range(len(at)), key=lambda i: sum(t.numel() for t in given[i]))
            step(f"exporting to ONNX ({exporter}) with the {axis} dynamic")
            try:
                path = export_onnx(
                    model, given[largest], folder / "model.onnx", exporter=exporter, dynamic=dims,
                    cache=cache, copy=workdir is not None,
                )  # fmt: skip
                files = [path] * len(at)
            except _layerdiff.ModelError as e:
                first_line = str(e).splitlines()[0]
                notes.append(
                    f"the model does not export with a dynamic {axis} ({first_line}): "
                    "exported at each point instead"
                )
                files = []
                for (label, _), point_inputs in zip(at, given, strict=True):
                    step(f"exporting to ONNX ({exporter}) at {axis} {label}")
                    try:
                        path = export_onnx(
                            model,
                            point_inputs,
                            folder / f"model-{slug(axis, label)}.onnx",
                            exporter=exporter,
                            cache=cache,
                            copy=workdir is not None,
                        )  # fmt: skip
                    except _layerdiff.ModelError:
                        runs_at(model, axis, label, point_inputs)
                        raise
                    files.append(path)
        reports = []
        for (label, _), point_inputs, file in zip(at, given, files, strict=True):
            step(f"{axis} {label}")
            common = {"options": options, "seed": seed, "name": name, "progress": progress}
            if pytorch_target:
                report = compare_torch(model, point_inputs, keep_fp32=keep_fp32, **common)
            else:
                report = compare_torch_onnx(
                    model, point_inputs, onnx=file, dtype=dtype, keep_fp32=keep_fp32,
                    workdir=folder / slug(axis, label), **common,
                )  # fmt: skip
            reports.append((label, report))
            if at_point is not None and at_point(label, model, point_inputs, report):
                break
    native = _layerdiff.AxisReport(
        axis, [label for label, _ in reports], [r._native for _, r in reports]
    )
    return native, reports, notes


def runs_at(model, axis: str, label: str, inputs: tuple) -> None:
    """Refuses a point the model itself cannot run at (a shape its layers do not take), which
    would otherwise read as the exporter's failure there."""
    try:
        with torch.no_grad():
            model(*inputs)
    except Exception as e:
        flag = "--shapes" if axis == "input shapes" else "--batch-sizes"
        shapes = ", ".join("x".join(map(str, t.shape)) for t in inputs)
        raise _layerdiff.InputError(
            f"{flag} {label}: the model fails at these input shapes ({shapes}) in PyTorch "
            f"itself, before any export: {type(e).__name__}: {e}"
        ) from None


def slug(axis: str, label: str) -> str:
    """A point's folder name (`batch-8`, `shapes-1x3x160x160`)."""
    return ("batch-" if axis == "batch size" else "shapes-") + label.replace(",", "_")
