"""The PyTorch adapter: everything that imports PyTorch lives in this subpackage, so the rest of
layerdiff (the ONNX verbs, reports, the comparator) imports without it.

- ``compare_torch_onnx``: a model against its ONNX export on a runtime, layer by layer
  (``_vs_onnx``: capture, export, streaming layers to the engine);
- ``compare_torch``: a model against itself on another device, precision or compiler
  (``_vs_torch``: both sides in lockstep, local re-runs of the target's modules);
- ``compare_gradients`` (``_grad``), the op matrix (``_ops``), the whole-output check
  (``_check``), the batch and shape axes (``_axis``), lower precisions (``_precision``);
- ``write_repro``: a report's headline cut down to its module alone, checked (``_repro``);
  ``compare_torch(..., bisect=True)`` finds what turns a drift on (``_bisect``);
- capture (``_capture``), the lockstep copy (``_lockstep``), the export (``_export``), PyTorch
  sides (``_sides``), the float64 baseline (``_baseline``), the models (``models``), a
  transformers checkpoint folder as a model (``_checkpoint``: ``load_checkpoint``); a decoder
  compared as it generates, step by step with its cache (``_decode``: ``compare_decoding``).
"""

from layerdiff.torch._capture import FUNCTIONAL_OPS, capture, functional_op
from layerdiff.torch._checkpoint import load_checkpoint
from layerdiff.torch._decode import compare_decoding
from layerdiff.torch._export import export_onnx
from layerdiff.torch._grad import compare_gradients
from layerdiff.torch._running import to_eval
from layerdiff.torch._vs_onnx import compare_torch_onnx
from layerdiff.torch._vs_torch import compare_torch
from layerdiff.torch.models import BUILTIN_MODELS, load_builder

__all__ = [
    "BUILTIN_MODELS",
    "FUNCTIONAL_OPS",
    "capture",
    "compare_decoding",
    "compare_gradients",
    "compare_torch",
    "compare_torch_onnx",
    "export_onnx",
    "functional_op",
    "load_builder",
    "load_checkpoint",
    "to_eval",
    "write_repro",
]


def write_repro(model, inputs, report, folder, *, target: str, reference: str = "torch",
                builder: str | None = None) -> str:  # fmt: skip
    """Writes the checked repro of the headline defect of ``report`` (a :func:`compare_torch`
    report of ``model`` on ``inputs`` with ``target`` and ``reference``) into ``folder``: the
    module alone, its weights and the reference's inputs to it, and a repro.py that runs it on
    both sides; returns what was written, in one sentence, or why nothing was (a clean run).
    ``builder`` (``path/to/file.py:build``) is imported by repro.py too, for what it sets up."""
    from layerdiff import _layerdiff
    from layerdiff.torch._repro import write_repro as write
    from layerdiff.torch._sides import TorchSide

    sides = [TorchSide.of(_layerdiff.side_spec(s)) for s in (reference, target)]
    command = f"layerdiff.torch.compare_torch(..., target={target!r}, reference={reference!r})"
    sentence, _ = write(model, inputs, report, *sides, folder, command, builder=builder)
    return sentence
