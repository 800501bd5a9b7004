"""`layerdiff check`: a PyTorch model's final outputs against its ONNX export on a runtime,
judged by the core (`layerdiff_flow::check`): allclose, the largest errors, the worst element,
and both sides' distance from the outputs computed in float64."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch.utils._pytree import tree_leaves

from layerdiff import _layerdiff
from layerdiff.tensors import flat
from layerdiff.torch._export import export_onnx
from layerdiff.torch._running import as_input_tuple, model_notes, run_model
from layerdiff.torch.models import load_builder


def run_command(command, progress) -> int:
    builder = load_builder(command.model)
    progress(f"building {command.model} (seed {command.seed})")
    model, inputs = builder(command.seed)
    inputs = as_input_tuple(inputs)
    notes = model_notes(model)  # what it does (eval mode, the cache off) holds with --quiet too
    for note in notes if not command.quiet else []:
        print(f"note: {note}", file=sys.stderr)
    with torch.no_grad():
        out = run_model(inputs, lambda: model(*inputs))
    reference = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    truth = _float64_outputs(model, inputs, len(reference), progress, command.quiet)
    export = None
    with tempfile.TemporaryDirectory() as work:
        if command.onnx is not None:
            path = Path(command.onnx)
            if not path.is_file():
                raise _layerdiff.UsageError(f"ONNX file `{command.onnx}` does not exist")
            export = _own_export(command, model, inputs, Path(work), progress)
        else:
            path = export_onnx(
                model, inputs, Path(work) / "model.onnx", exporter=command.exporter,
                cache=command.cache, step=progress, copy=False,
            )  # fmt: skip
        names = [name for name, _, _ in _layerdiff.model_inputs(path)]
        if len(names) != len(inputs):
            raise _layerdiff.InputError(
                f"the ONNX file reads {len(names)} inputs ({', '.join(names)}) where the model "
                f"takes {len(inputs)} tensors"
            )
        progress(f"running the ONNX file on {command.target}")
        model_bytes = path.read_bytes()
        outputs = _layerdiff.run_model(
            model_bytes,
            command.target,
            [flat(n, x) for n, x in zip(names, inputs, strict=True)],
        )
        # a runtime that computes float32 in a narrower dtype (OpenVINO's bf16) is held to it
        computed_in = _layerdiff.runtime_computes_in(model_bytes, command.target)
        target = [(n, d, s, np.frombuffer(b, dtype=np.uint8)) for n, d, s, b in outputs]
        names_out = [name for name, *_ in outputs] + [
            f"output_{i}" for i in range(len(outputs), len(reference))
        ]
        reference_flat = [flat(names_out[i], t) for i, t in enumerate(reference)]
        truth_flat = None if truth is None else [flat(names_out[i], t) for i, t in enumerate(truth)]
        sides = (f"PyTorch {torch.__version__} (eager, cpu)", command.target)
        return _layerdiff.deliver_check(
            command, sides, reference_flat, target, truth_flat, computed_in, export
        )


def _own_export(command, model, inputs, work: Path, progress) -> Path | None:
    """The model exported afresh (kept in the export cache), to read the file given against:
    a weight, constant or attribute that differs fails the check whatever the outputs show, as
    the per-layer run reports it. `None`, said on stderr, where the model does not export."""
    progress(f"exporting the model ({command.exporter}) to read the file against")
    try:
        return export_onnx(
            model, inputs, work / "export.onnx", exporter=command.exporter,
            cache=command.cache, step=progress, copy=False,
        )  # fmt: skip
    except Exception as e:  # the outputs still judge the file
        if not command.quiet:
            print(
                f"note: the file is judged by its outputs alone: the model's own export failed "
                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})",
                file=sys.stderr,
            )
        return None


def _float64_outputs(model, inputs, count: int, progress, quiet: bool):
    """The model's outputs computed in float64 (a copy of it, its floating inputs widened): the
    truth both sides round. `None`, said on stderr, where the model does not run in float64."""
    import copy

    progress("computing the outputs in float64")
    wide = tuple(t.double() if t.is_floating_point() else t for t in inputs)
    try:
        exact = copy.deepcopy(model).double()
        with torch.no_grad():
            out = exact(*wide)
    except Exception as e:  # a model that cannot run in float64 is checked by the bound alone
        if not quiet:
            print(
                f"note: the outputs are judged by the bound alone: the model does not run in "
                f"float64 ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})",
                file=sys.stderr,
            )
        return None
    truth = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    return truth if len(truth) == count else None
