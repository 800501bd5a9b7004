"""A plain numpy implementation of the comparator, written from docs/metrics.md, used only by
tests: the Rust kernel must give byte-identical JSON.

It reproduces the documented summation order: blocks of 4096 elements, 8 interleaved f64 lanes
per block summed sequentially, lanes combined ((0+1)+(2+3))+((4+5)+(6+7)), blocks added in order.
"""

from __future__ import annotations

import json
import math

import numpy as np

BLOCK = 4096
LANES = 8
THRESHOLDS = [(0.0, "0"), (1e-6, "1e-6"), (1e-5, "1e-5"), (1e-4, "1e-4"), (1e-3, "1e-3"),
              (1e-2, "1e-2"), (1e-1, "1e-1"), (1.0, "1"), (10.0, "10"), (100.0, "100")]  # fmt: skip


def widen(dtype: str, raw: np.ndarray) -> np.ndarray:
    """Flat uint8 bytes of `dtype` → float64."""
    if dtype == "bfloat16":
        bits = raw.view(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).astype(np.float64)
    return raw.view(np.dtype(dtype)).astype(np.float64)


def _lane_sum(values: np.ndarray) -> float:
    total = 0.0
    for start in range(0, values.size, BLOCK):
        block = values[start : start + BLOCK]
        padded = np.zeros(-(-block.size // LANES) * LANES)
        padded[: block.size] = block
        lanes = np.cumsum(padded.reshape(-1, LANES), axis=0)[-1]
        total += ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + (
            (lanes[4] + lanes[5]) + (lanes[6] + lanes[7])
        )
    return float(total)


def stats(r: np.ndarray, t: np.ndarray, shape: list[int]) -> dict:
    r, t = r.reshape(-1), t.reshape(-1)
    r_nan, t_nan = np.isnan(r), np.isnan(t)
    compared = ~(r_nan | t_nan)
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.where(r == t, 0.0, np.abs(t - r))
    d = np.where(compared, d, 0.0)
    finite = compared & np.isfinite(r) & np.isfinite(t)
    rf, tf = np.where(finite, r, 0.0), np.where(finite, t, 0.0)
    n_compared = int(compared.sum())
    with np.errstate(over="ignore", invalid="ignore"):
        sum_abs = _lane_sum(d)
        sum_sq = _lane_sum(d * d)
        dot, norm_r, norm_t = _lane_sum(rf * tf), _lane_sum(rf * rf), _lane_sum(tf * tf)
        denom = np.maximum(np.abs(rf), np.abs(tf))
        rel = np.where(finite & (d > 0), d / np.where(denom == 0, 1.0, denom), 0.0)

    def mean(s):
        return s / n_compared if n_compared else 0.0

    if norm_r == 0.0 and norm_t == 0.0:
        cosine = 1.0
    elif norm_r == 0.0 or norm_t == 0.0:
        cosine = 0.0
    else:
        cosine = min(1.0, max(-1.0, dot / (math.sqrt(norm_r) * math.sqrt(norm_t))))
    worst = None
    if n_compared:
        index = int(np.argmax(np.where(compared, d, -1.0)))
        position = [int(p) for p in np.unravel_index(index, shape)] if shape else []
        worst = {"index": index, "position": position, "reference": float(r[index]),
                 "target": float(t[index])}  # fmt: skip
    return {
        "elements": int(r.size),
        "compared": n_compared,
        "max_abs_diff": float(d.max()) if r.size else 0.0,
        "mean_abs_diff": mean(sum_abs),
        "max_rel_diff": float(rel.max()) if r.size else 0.0,
        "rms_diff": math.sqrt(mean(sum_sq)),
        "cosine": cosine,
        "abs_diff_above": {label: int((compared & (d > x)).sum()) for x, label in THRESHOLDS},
        "nan_reference": int(r_nan.sum()),
        "nan_target": int(t_nan.sum()),
        "inf_reference": int(np.isinf(r).sum()),
        "inf_target": int(np.isinf(t).sum()),
        "nan_mismatch": int((r_nan != t_nan).sum()),
        "worst": worst,
        "rounding": None,  # measured against a layer's bound when it is judged, not here
    }


def format_float(x: float) -> str:
    """The report's float format: shortest round-trip digits in scientific notation."""
    if math.isnan(x):
        return '"nan"'
    if math.isinf(x):
        return '"inf"' if x > 0 else '"-inf"'
    text = np.format_float_scientific(x, unique=True, trim="-", exp_digits=1)
    return text.replace("e+", "e")


def to_json(value) -> str:
    """Deterministic JSON as the Rust renderer writes it (2-space indent, formatted floats)."""
    floats: list[float] = []

    def mark(v):
        if isinstance(v, float):
            floats.append(v)
            return f"\x00{len(floats) - 1}\x00"
        if isinstance(v, dict):
            return {k: mark(x) for k, x in v.items()}
        if isinstance(v, list):
            return [mark(x) for x in v]
        return v

    text = json.dumps(mark(value), indent=2)
    for i, f in enumerate(floats):
        text = text.replace(f'"\\u0000{i}\\u0000"', format_float(f), 1)
    return text + "\n"
