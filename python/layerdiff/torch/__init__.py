"""The PyTorch adapter: everything that imports PyTorch lives in this subpackage, so the rest of
layerdiff (the ONNX verbs, reports, the comparator) imports without it.

- ``compare_torch_onnx``: a model against its ONNX export on a runtime, layer by layer
  (``_vs_onnx``: capture, export, streaming layers to the engine);
- ``compare_torch``: a model against itself on another device, precision or compiler
  (``_vs_torch``: both sides in lockstep, local re-runs of the target's modules);
- ``compare_gradients`` (``_grad``), the op matrix (``_ops``), the whole-output check
  (``_check``), the batch and shape axes (``_axis``), lower precisions (``_precision``);
- capture (``_capture``), the lockstep copy (``_lockstep``), the export (``_export``), PyTorch
  sides (``_sides``), the float64 baseline (``_baseline``), the models (``models``).
"""

from layerdiff.torch._capture import FUNCTIONAL_OPS, capture, functional_op
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
    "compare_gradients",
    "compare_torch",
    "compare_torch_onnx",
    "export_onnx",
    "functional_op",
    "load_builder",
    "to_eval",
]
