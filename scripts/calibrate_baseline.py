"""Calibrates the same-precision baseline on honest kernels: every built-in model (seeded random
weights) converted to float16 by ONNX Runtime's converter and against PyTorch, and as PyTorch
targets in bfloat16 and autocast bfloat16; the seed's MLP gradients in bfloat16 and float16.
Each run's verdict, defects and the largest multiple of what precision explains go into the
table of docs/metrics.md (between its calibration markers). A defect in any of these runs is a
wrong headline: the script exits 1.

    python scripts/calibrate_baseline.py [--models resnet18,bert] [--no-write] [--from-reports]

With `--from-reports` the float16 and bfloat16 rows are read from examples/reports/ (`make
reports` makes exactly those runs: `layerdiff torch NAME --seed 0 --dtype fp16`, and
`--target torch --dtype bf16`) instead of being run again.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import layerdiff
import torch
from layerdiff.torch import compare_torch_onnx
from layerdiff.torch.models import ZOO, load_builder

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs/metrics.md"
BEGIN, END = "<!-- calibration: begin -->", "<!-- calibration: end -->"
TARGETS = ("onnx fp16", "torch:bf16", "torch:amp-bf16")
REPORTS = {"onnx fp16": "fp16", "torch:bf16": "bf16"}  # examples/reports/NAME_SUFFIX.json


class _Committed:
    """A report `make reports` wrote, read back (what `row` needs of it)."""

    def __init__(self, path: Path):
        data = json.loads(path.read_text())
        self.summary, self.layers = data["summary"], data["layers"]


def run(name: str, target: str):
    model, inputs = load_builder(name)(0)
    if target == "onnx fp16":
        return compare_torch_onnx(model, inputs, dtype="fp16", seed=0)
    return layerdiff.compare_torch(model, inputs, target=target, seed=0)


def grad(target: str):
    sys.path.insert(0, str(ROOT / "tests"))
    from builders import seed_mlp

    torch.manual_seed(0)
    model, inputs = seed_mlp.build()
    return layerdiff.compare_gradients(model, inputs, target=target, seed=0)


def row(what: str, target: str, report, seconds: float) -> tuple[str, bool]:
    s = report.summary
    # an infinite multiple (own error where the ideal has none) is written as a string
    multiples = [float(x["baseline"]["multiple"]) for x in report.layers if x.get("baseline")]
    worst = max(multiples, default=0.0)
    defects = ", ".join(f"`{d['layer']}`" for d in s["defects"]) or "none"
    took = "`make reports`" if isinstance(report, _Committed) else f"{seconds:.0f} s"
    line = (
        f"| {what} | {target} | {s['verdict']} | {defects} | {worst:.2f} | "
        f"{len(multiples)} | {took} |"
    )
    return line, bool(s["defects"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(ZOO))
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--from-reports", action="store_true")
    args = parser.parse_args()
    lines = [
        "| model | target | verdict | defects | largest multiple | layers with a baseline | time |",
        "|---|---|---|---|---|---|---|",
    ]
    failed = False

    def job(m: str, t: str):
        if args.from_reports and t in REPORTS:
            committed = ROOT / "examples" / "reports" / f"{m}_{REPORTS[t]}.json"
            return lambda: _Committed(committed)
        return lambda: run(m, t)

    jobs = [(m, t, job(m, t)) for m in args.models.split(",") for t in TARGETS]
    jobs += [("seed MLP gradients", t, lambda t=t: grad(t)) for t in ("torch:bf16", "torch:fp16")]
    for what, target, job in jobs:
        start = time.perf_counter()
        try:
            report = job()
        except Exception as e:  # a run that breaks is a row, not the end of the table
            lines.append(f"| {what} | {target} | broke: {type(e).__name__} | | | | |")
            failed = True
            print(lines[-1], flush=True)
            continue
        line, defect = row(what, target, report, time.perf_counter() - start)
        failed |= defect
        lines.append(line)
        print(line, flush=True)
    table = "\n".join(lines)
    if not args.no_write:
        text = DOC.read_text()
        block = f"{BEGIN}\n{table}\n{END}"
        text = re.sub(f"{re.escape(BEGIN)}.*?{re.escape(END)}", lambda _: block, text, flags=re.S)
        DOC.write_text(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
