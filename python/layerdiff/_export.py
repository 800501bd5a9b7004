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
) -> Path:
    """Exports with ``torch.onnx.export``; the exporter's chatter (the legacy one prints whole
    graphs when it fails) is kept back, and its last lines go in the error when it fails."""
    if exporter not in ("dynamo", "legacy"):
        raise _layerdiff.UsageError(f"unknown exporter `{exporter}` (expected dynamo or legacy)")
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
                    model, inputs, dynamo=True, verbose=False, opset_version=opset
                )
                program.save(str(path))
            else:
                torch.onnx.export(model, inputs, str(path), dynamo=False, opset_version=opset)
    except Exception as e:  # the exporter's own failure: report it, with what it printed
        detail = chatter.getvalue().strip().splitlines()[-5:]
        raise _layerdiff.ModelError(
            f"torch.onnx.export ({exporter}) failed: {type(e).__name__}: {e}"
            + ("\n" + "\n".join(detail) if detail else "")
        ) from e
    return path
