"""layerdiff: find where numerical drift between two runtimes is born, layer by layer, and why.

The numeric core (comparison, analysis, ONNX handling, ONNX Runtime, reports) is Rust; this
package is the front door. PyTorch is imported only by :mod:`layerdiff.torch` (and the modules
it uses), on first use.
"""

from layerdiff._layerdiff import (
    InputError,
    LayerdiffError,
    MappingError,
    ModelError,
    OutputError,
    RuntimeFailure,
    UsageError,
    __version__,
)
from layerdiff.report import Report
from layerdiff.tensors import compare_tensors

__all__ = [
    "InputError",
    "LayerdiffError",
    "MappingError",
    "ModelError",
    "OutputError",
    "Report",
    "RuntimeFailure",
    "UsageError",
    "__version__",
    "compare_gradients",
    "compare_tensors",
    "compare_torch",
    "compare_torch_onnx",
]


def compare_torch_onnx(model, inputs, **options):
    """Compare a PyTorch model with its ONNX export, layer by layer.

    See :func:`layerdiff.torch.compare_torch_onnx` for the options.
    """
    from layerdiff.torch import compare_torch_onnx as run

    return run(model, inputs, **options)


def compare_torch(model, inputs, **options):
    """Compare a PyTorch model with itself on another device, precision or compiler, layer by
    layer (``target="torch:cuda:bf16"``).

    See :func:`layerdiff.torch.compare_torch` for the options.
    """
    from layerdiff.torch import compare_torch as run

    return run(model, inputs, **options)


def compare_gradients(model, inputs, **options):
    """Compare a PyTorch model's gradients on another device, precision or compiler, in
    backward order (``target="torch:cuda:amp-fp16"``).

    See :func:`layerdiff._grad.compare_gradients` for the options.
    """
    from layerdiff._grad import compare_gradients as run

    return run(model, inputs, **options)
