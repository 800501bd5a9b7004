"""Flattening arrays to `(name, dtype, shape, uint8 buffer)` before Rust sees them (zero-copy
where the memory allows), and the public tensor comparator."""

from __future__ import annotations

import json
import sys

import numpy as np

from layerdiff import _layerdiff

_NUMPY_DTYPES = {
    "float64", "float32", "float16", "int64", "int32", "int16", "int8",
    "uint64", "uint32", "uint16", "uint8", "bool",
}  # fmt: skip


def flat(name: str, array) -> tuple[str, str, list[int], np.ndarray]:
    """A numpy array or torch tensor as a flat tuple; bfloat16 travels as its raw bytes."""
    if type(array).__module__.startswith("torch"):
        return _flat_torch(name, array)
    array = np.asarray(array)
    dtype = array.dtype.name
    if dtype not in _NUMPY_DTYPES:
        if dtype == "bfloat16":  # ml_dtypes
            return name, "bfloat16", list(array.shape), _bytes(array)
        raise _layerdiff.InputError(
            f"tensor `{name}` has dtype {dtype}, which layerdiff cannot compare"
        )
    if sys.byteorder != "little" and array.dtype.byteorder not in "<|":
        array = array.astype(array.dtype.newbyteorder("<"))
    return name, dtype, list(array.shape), _bytes(array)


def _bytes(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def dtype_name(name: str, tensor) -> str:
    """layerdiff's name of a torch tensor's dtype (`float32`); names the tensor if it has none."""
    import torch  # only reached when handed a torch tensor

    names = {
        torch.float64: "float64", torch.float32: "float32", torch.float16: "float16",
        torch.bfloat16: "bfloat16", torch.int64: "int64", torch.int32: "int32",
        torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool",
    }  # fmt: skip
    if tensor.dtype not in names:
        raise _layerdiff.InputError(
            f"tensor `{name}` has dtype {tensor.dtype}, which layerdiff cannot compare"
        )
    return names[tensor.dtype]


def _flat_torch(name: str, tensor):
    import torch  # only reached when handed a torch tensor

    dtype = dtype_name(name, tensor)
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    buffer = t.reshape(-1).view(torch.uint8).numpy()
    return name, dtype, list(t.shape), buffer


def compare_tensors(reference, target) -> dict:
    """Every statistic of a layer comparison for two arrays (numpy arrays or torch tensors).

    Returns a dict: ``max_abs_diff``, ``mean_abs_diff``, ``max_rel_diff``, ``rms_diff``,
    ``cosine``, ``abs_diff_above`` (counts per threshold), NaN/Inf counts, ``nan_mismatch``,
    and ``worst`` (index, position and both values). See docs/metrics.md for definitions.
    """
    text = _layerdiff.compare_tensors_json(flat("reference", reference), flat("target", target))
    return json.loads(text)
