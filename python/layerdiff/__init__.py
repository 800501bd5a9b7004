"""layerdiff: find where numerical drift between two runtimes is born, layer by layer, and why.

The numeric core (comparison, analysis, ONNX handling, ONNX Runtime, reports) is Rust; this
package is the front door. PyTorch is imported only by :mod:`layerdiff.torch` (and the modules
it uses), on first use; NumPy with :class:`Report` or :func:`compare_tensors`, so that importing
the package (as the `layerdiff` command does before it can catch Ctrl-C) is quick.
"""

from layerdiff import _layerdiff, _ort
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

_ort.point_at_openvino()
# the core loads the ONNX Runtime of this interpreter's wheel, chosen once here
_layerdiff.use_ort_library(_ort.library())

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
    "check_ops",
    "compare_along",
    "compare_gradients",
    "compare_tensors",
    "compare_torch",
    "compare_torch_onnx",
]


def __getattr__(name: str):
    """`Report` and `compare_tensors`, imported (with NumPy) on first use."""
    if name == "Report":
        from layerdiff.report import Report

        return Report
    if name == "compare_tensors":
        from layerdiff.tensors import compare_tensors

        return compare_tensors
    raise AttributeError(f"module 'layerdiff' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def compare_torch_onnx(model, inputs=None, **options):
    """Compare a PyTorch model with its ONNX export, layer by layer. ``model`` may be a
    transformers checkpoint folder's path, whose inputs are made from its config.

    See :func:`layerdiff.torch.compare_torch_onnx` for the options.
    """
    from layerdiff.torch import compare_torch_onnx as run

    return run(model, inputs, **options)


def compare_torch(model, inputs=None, **options):
    """Compare a PyTorch model with itself on another device, precision or compiler, layer by
    layer (``target="torch:cuda:bf16"``).

    See :func:`layerdiff.torch.compare_torch` for the options.
    """
    from layerdiff.torch import compare_torch as run

    return run(model, inputs, **options)


def compare_along(model, inputs, *, batch_sizes=(), shapes=(), **options):
    """Compare a PyTorch model with its export (or a PyTorch target) at several batch sizes
    (``batch_sizes=(1, 8, 32)``) or input shapes (``shapes=[[(1, 3, 224, 224)], ...]``, one list
    of input shapes per point), from one export with the varying dimensions dynamic. Returns
    ``(axis, reports)``: the axis report (``axis.data``, ``to_markdown()``, ``write()``; which
    points drift, which layers change verdict) and each point's :class:`Report` by its label.
    Other options as for :func:`layerdiff.torch.compare_torch_onnx` (``target``, ``tolerance``,
    ``exporter``, ``dtype``, ``seed``, ``name``).
    """
    from layerdiff.torch._axis import compare_along as run
    from layerdiff.torch._running import as_input_tuple

    axis, reports, _ = run(
        model, as_input_tuple(inputs), batch_sizes=batch_sizes, shapes=shapes, **options
    )
    return axis, dict(reports)


def compare_gradients(model, inputs=None, **options):
    """Compare a PyTorch model's gradients on another device, precision or compiler, in
    backward order (``target="torch:cuda:amp-fp16"``).

    See :func:`layerdiff.torch._grad.compare_gradients` for the options.
    """
    from layerdiff.torch._grad import compare_gradients as run

    return run(model, inputs, **options)


def check_ops(ops=None, backends=None, dtypes=None, *, out=None, **options) -> dict:
    """The op matrix: each case matching ``ops`` (names or ``*`` patterns; all by default) on
    each backend (``"torch"``, ``"torch:compile"``, ``"ort:opt=all"``, ``"tract"``,
    ``"openvino"``…) and dtype (``"float32"``, ``"float16"``, ``"bfloat16"``), each cell judged
    against a float64 computation of the op on the same rounded inputs. Returns the report as a
    dict (schema ``layerdiff.ops/1``); ``out`` writes ops.json, ops.md and ops.html into that
    folder.

    Options: ``opset``, ``exporter`` (``"dynamo"``/``"legacy"``), ``seed``, ``jobs`` (processes
    at once; 1 runs in this process), ``executor`` (``"local"`` or ``"ray"``), and
    ``custom_backends``: a name → ``(case, args) -> tensor`` map computing cases some other way.
    """
    import json
    from pathlib import Path

    from layerdiff import _layerdiff
    from layerdiff.torch import _ops

    run = _ops.check_ops(ops, backends, dtypes, **options)
    paths = [None, None, None]
    if out is not None:
        paths = [Path(out) / f"ops.{ext}" for ext in ("json", "md", "html")]
    return json.loads(_layerdiff.ops_report(run, *paths))
