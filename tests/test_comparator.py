"""The Rust comparator against a plain numpy reference: byte-identical JSON on random and
adversarial tensors, in every float dtype."""

from __future__ import annotations

import numpy as np
import pytest
from comparator_reference import stats, to_json, widen
from layerdiff import _layerdiff, compare_tensors
from layerdiff.tensors import flat


def bf16(values: np.ndarray) -> np.ndarray:
    """float32 → bfloat16 bits (round to nearest even), as uint16."""
    values = values.reshape(-1)
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(values)
    return np.where(nan, 0x7FC0, rounded).astype(np.uint16)


def rust_json(dtype: str, shape, r_raw: np.ndarray, t_raw: np.ndarray) -> str:
    return _layerdiff.compare_tensors_json(
        ("reference", dtype, list(shape), r_raw), ("target", dtype, list(shape), t_raw)
    )


def check(dtype: str, r: np.ndarray, t: np.ndarray):
    shape = list(r.shape)
    if dtype == "bfloat16":
        r_raw, t_raw = bf16(r).view(np.uint8), bf16(t).view(np.uint8)
    else:
        r_raw = np.ascontiguousarray(r.astype(dtype)).reshape(-1).view(np.uint8)
        t_raw = np.ascontiguousarray(t.astype(dtype)).reshape(-1).view(np.uint8)
    expected = to_json(stats(widen(dtype, r_raw), widen(dtype, t_raw), shape))
    assert rust_json(dtype, shape, r_raw, t_raw) == expected


rng = np.random.default_rng(1234)
DTYPES = ["float32", "float64", "float16", "bfloat16"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5, 11), (2, 4096 + 9), (1, 64, 56, 56)])
def test_random_tensors_match_reference_bytes(dtype, shape):
    r = rng.standard_normal(shape) * 3
    t = r + rng.standard_normal(shape) * 1e-3
    check(dtype, r, t)


@pytest.mark.parametrize("dtype", DTYPES)
def test_adversarial_values_match_reference_bytes(dtype):
    tiny = np.finfo(np.float32).smallest_subnormal if dtype != "float16" else 6e-8
    r = np.array(
        [np.nan, np.nan, np.inf, -np.inf, np.inf, 0.0, -0.0, tiny, 1.0, -2.5, 0.0, 5.0] * 700
    )
    t = np.array(
        [np.nan, 1.0, np.inf, np.inf, 3.0, 0.0, 0.0, 0.0, np.nan, -2.5, 1e-30, 5.0001] * 700
    )
    check(dtype, r, t)


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_zeros_and_empty(dtype):
    check(dtype, np.zeros((4, 4)), np.zeros((4, 4)))
    check(dtype, np.zeros((0, 3)), np.zeros((0, 3)))


def test_public_api_on_numpy_and_torch():
    torch = pytest.importorskip("torch")
    a = np.linspace(-1, 1, 1000, dtype=np.float32)
    b = a.copy()
    b[123] += 0.5
    s = compare_tensors(a, b)
    assert s["worst"]["index"] == 123 and s["abs_diff_above"]["1e-1"] == 1
    assert compare_tensors(torch.from_numpy(a), torch.from_numpy(b)) == s
    bf = compare_tensors(torch.from_numpy(a).bfloat16(), torch.from_numpy(b).bfloat16())
    assert bf["worst"]["index"] == 123


def test_different_element_counts_are_an_error_that_names_both_shapes():
    with pytest.raises(_layerdiff.InputError, match=r"\[3\] and \[4\]"):
        compare_tensors(np.zeros(3, np.float32), np.zeros(4, np.float32))


def test_flat_is_zero_copy_for_contiguous_arrays():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    _, dtype, shape, buffer = flat("a", a)
    assert (dtype, shape) == ("float32", [3, 4])
    assert np.shares_memory(buffer, a)
