"""The comparator's row of `make bench`: `layerdiff.compare_tensors` on two large arrays per
dtype, beside a numpy implementation of the same statistics and the machine's read bandwidth
read just before each timing."""

from __future__ import annotations

import os
import time

import layerdiff
import numpy as np


def best_of(fn, repeat: int) -> float:
    """The fastest of `repeat` timed calls, after one warm-up call (seconds)."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def numpy_stats(r: np.ndarray, t: np.ndarray) -> dict:
    """The report's statistics the way a numpy-based tool computes them: widen to float64, then
    one vectorized pass per statistic."""
    r, t = r.astype(np.float64), t.astype(np.float64)
    nan_r, nan_t = np.isnan(r), np.isnan(t)
    ok = ~(nan_r | nan_t)
    d = np.where(r == t, 0.0, np.abs(t - r))[ok]
    finite = ok & np.isfinite(r) & np.isfinite(t)
    rf, tf = r[finite], t[finite]
    denom = np.maximum(np.abs(rf), np.abs(tf))
    diff_f = np.abs(tf - rf)
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.where(diff_f > 0, diff_f / denom, 0.0)
    return {
        "max_abs_diff": float(d.max(initial=0.0)),
        "mean_abs_diff": float(d.mean()) if d.size else 0.0,
        "max_rel_diff": float(rel.max(initial=0.0)),
        "rms_diff": float(np.sqrt(np.mean(d * d))) if d.size else 0.0,
        "cosine": float(np.dot(rf, tf) / np.sqrt(np.dot(rf, rf) * np.dot(tf, tf))),
        "abs_diff_above": [
            int(np.count_nonzero(d > x))
            for x in (0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1, 10, 100)
        ],  # fmt: skip
        "nan": (int(nan_r.sum()), int(nan_t.sum())),
        "inf": (int(np.isinf(r).sum()), int(np.isinf(t).sum())),
        "worst": int(np.argmax(np.where(ok, np.where(r == t, 0.0, np.abs(t - r)), -1.0))),
    }


def measure(name: str, r, t, elements: int, probe, repeat: int) -> dict:
    """One dtype: layerdiff and numpy on the same pair (bfloat16 arrives as torch tensors,
    which numpy widens through float32). Each timing of layerdiff is paired with a reading of
    the read bandwidth taken just before it: this machine's bandwidth wanders (by 2× within
    minutes on a shared VM), so a share is only fair against the bandwidth of its moment. The
    share reported is the median of the pairs."""
    as_numpy = (lambda x: x.float().numpy()) if name == "bfloat16" else (lambda x: x)
    nbytes = 2 * elements * (2 if name in ("float16", "bfloat16") else np.dtype(name).itemsize)
    layerdiff.compare_tensors(r, t)
    pairs = []
    for _ in range(repeat):
        bandwidth = probe()
        start = time.perf_counter()
        layerdiff.compare_tensors(r, t)
        pairs.append((time.perf_counter() - start, bandwidth))
    ours = min(s for s, _ in pairs)
    theirs = best_of(lambda: numpy_stats(as_numpy(r), as_numpy(t)), 1)
    return {
        "dtype": name,
        "gbps": nbytes / ours / 1e9,
        "gelems": elements / ours / 1e9,
        "numpy_gbps": nbytes / theirs / 1e9,
        "speedup": theirs / ours,
        "of_bandwidth": float(np.median([(nbytes / s) / bw for s, bw in pairs])),
        "bandwidths": [bw for _, bw in pairs],
    }


def read_bandwidth(nbytes: int):
    """A probe of the machine's read bandwidth (bytes/s) over two arrays of `nbytes` each: BLAS
    dot products, every core reading its share at once (the comparator splits its work across
    all cores too), the fastest of float32 and float64, best of two. The arrays are made once;
    each call of the probe reads them again. BLAS runs on one thread in the bench's process
    (`run.py`), so one call over the whole arrays is one core reading: never the measure."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(1)
    cores = os.cpu_count() or 1
    pool = ThreadPoolExecutor(cores)
    readers = []
    for dtype in (np.float32, np.float64):
        a = rng.standard_normal(nbytes // np.dtype(dtype).itemsize, dtype=dtype)
        b = a + dtype(1e-5)
        bounds = np.linspace(0, a.size, cores + 1, dtype=np.int64)
        parts = [(a[i:j], b[i:j]) for i, j in zip(bounds[:-1], bounds[1:], strict=True)]
        readers.append(lambda parts=parts: list(pool.map(lambda p: np.dot(*p), parts)))

    def probe() -> float:
        return 2 * nbytes / min(best_of(read, 2) for read in readers)

    return probe


def measure_all(elements: int, repeat: int) -> list[dict]:
    """A row per dtype, after the bandwidth's median and spread over every reading."""
    import torch

    rng = np.random.default_rng(0)
    r32 = rng.standard_normal(elements, dtype=np.float32)
    t32 = r32 + rng.standard_normal(elements, dtype=np.float32) * np.float32(1e-5)
    probe = read_bandwidth(r32.nbytes)
    rows = []
    for name in ("float32", "float16", "bfloat16", "float64"):
        if name == "bfloat16":
            r = torch.from_numpy(r32).to(torch.bfloat16)
            t = torch.from_numpy(t32).to(torch.bfloat16)
        else:
            r, t = r32.astype(name), t32.astype(name)
        row = measure(name, r, t, elements, probe, repeat)
        if name in ("float16", "bfloat16"):
            # Rounding to a narrow dtype makes larger differences, which cross more thresholds:
            # the dtype's own cost shows against float32 holding the very same values.
            wide = (
                (r.float().numpy(), t.float().numpy())
                if name == "bfloat16"
                else (r.astype(np.float32), t.astype(np.float32))
            )
            same = best_of(lambda: layerdiff.compare_tensors(*wide), repeat)  # noqa: B023
            row["of_float32"] = row["gelems"] / (elements / same / 1e9)
        rows.append(row)
    readings = [bw for row in rows for bw in row.pop("bandwidths")]
    spread = (min(readings) / 1e9, max(readings) / 1e9)
    return [{"bandwidth": float(np.median(readings)) / 1e9, "spread": spread}, *rows]
