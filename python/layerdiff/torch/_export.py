"""Exporting a model to ONNX with either `torch.onnx.export` path."""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path

import torch
from torch import nn

from layerdiff import _layerdiff


def export_onnx(
    model: nn.Module,
    inputs: tuple,
    path: Path,
    *,
    exporter: str = "dynamo",
    opset: int | None = None,
    dynamic: list[list[int]] | None = None,
) -> Path:
    """Exports with ``torch.onnx.export``; the exporter's chatter (the legacy one prints whole
    graphs when it fails) is kept back, and its last lines go in the error when it fails.
    ``dynamic``: for each input, the dimensions exported dynamic (a batch or shape axis)."""
    dynamic_shapes = dynamic_axes = input_names = None
    if dynamic is not None and any(dynamic):
        dynamic_shapes = tuple({d: torch.export.Dim.DYNAMIC for d in dims} for dims in dynamic)
        input_names = [f"input_{i}" for i in range(len(dynamic))]
        dynamic_axes = {
            name: {d: f"{name}_dim{d}" for d in dims}
            for name, dims in zip(input_names, dynamic, strict=True)
            if dims
        }
    exporter = _layerdiff.choice("exporter", exporter)
    chatter = io.StringIO()
    try:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(chatter),
            contextlib.redirect_stderr(chatter),
        ):
            warnings.simplefilter("ignore")
            if exporter == "dynamo":
                program = torch.onnx.export(
                    model, inputs, dynamo=True, verbose=False, opset_version=opset,
                    dynamic_shapes=dynamic_shapes,
                )  # fmt: skip
                program.save(str(path))
            else:
                torch.onnx.export(
                    model, inputs, str(path), dynamo=False, opset_version=opset,
                    input_names=input_names, dynamic_axes=dynamic_axes,
                )  # fmt: skip
    except Exception as e:  # the exporter's own failure: report it, with what it printed
        detail = chatter.getvalue().strip().splitlines()[-5:]
        raise _layerdiff.ModelError(
            f"torch.onnx.export ({exporter}) failed: {type(e).__name__}: {e}"
            + ("\n" + "\n".join(detail) if detail else "")
        ) from e
    return path
