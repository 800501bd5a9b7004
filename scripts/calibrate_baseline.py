"""`make calibrate`: calibrates the rule that tells a defect from precision on honest kernels and
on planted faults. Clean runs: every built-in model (seeded random weights) converted to
float16 by ONNX Runtime's converter against PyTorch, and as PyTorch targets in bfloat16 and
autocast bfloat16, forward; and every built-in model's gradients (`layerdiff grad`) in bfloat16
and float16. Faults: kernels planted in real models (tests/builders/narrow_kernels.py) that
accumulate in the narrow dtype (to be named `narrow_accumulation` at their layer, not a
defect), backwards off by 2% in the narrow dtype (to be the one defect, at their weight), a
functional call's epsilon computed from the dtype (`argument_mismatch` at that call), and a
model's ONNX export edited (an attribute, a folded constant) and run by ONNX Runtime as written
(`file_differs` or `weight_mismatch` at its layer: the file, never the runtime).
Each run's verdict, defects, the layers that accumulate in the narrow dtype and the largest
multiple of what precision explains go into the table of docs/metrics.md (between its
calibration markers). A defect in a clean run, or a fault not found at its layer with its
cause, is a wrong headline: the script exits 1.

    python scripts/calibrate_baseline.py [--models resnet18,bert] [--no-write] [--from-reports]
                                         [--no-grad] [--no-faults]

With `--from-reports` the float16 and bfloat16 forward rows are read from examples/reports/
(`make reports` makes exactly those runs: `layerdiff torch NAME --seed 0 --dtype fp16`, and
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
from layerdiff.torch import compare_torch_onnx
from layerdiff.torch.models import ZOO, load_builder

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs/metrics.md"
BEGIN, END = "<!-- calibration: begin -->", "<!-- calibration: end -->"
TARGETS = ("onnx fp16", "torch:bf16", "torch:amp-bf16")
GRAD_TARGETS = ("torch:bf16", "torch:fp16")
REPORTS = {"onnx fp16": "fp16", "torch:bf16": "bf16"}  # examples/reports/NAME_SUFFIX.json
# planted faults: (builder in tests/builders/narrow_kernels.py, forward or grad, target,
# the layer it must be found at, the cause it must have there)
FAULTS = [
    ("cnn", "forward", "torch:bf16", "layer3.0.conv2", "narrow_accumulation"),
    ("cnn", "forward", "torch:fp16", "layer3.0.conv2", "narrow_accumulation"),
    ("transformer", "forward", "torch:bf16", "layers.1.linear1", "narrow_accumulation"),
    ("transformer", "forward", "torch:fp16", "layers.1.linear1", "narrow_accumulation"),
    ("mlp_wrong_backward", "grad", "torch:bf16", "0.weight", "op_implementation"),
    ("mlp_wrong_backward", "grad", "torch:fp16", "0.weight", "op_implementation"),
    ("cnn_wrong_backward", "grad", "torch:bf16", "layer3.0.conv2.weight", "op_implementation"),
    ("transformer_wrong_backward", "grad", "torch:bf16", "layers.1.linear1.weight",
     "op_implementation"),
    ("transformer_wrong_backward", "grad", "torch:fp16", "layers.1.linear1.weight",
     "op_implementation"),
    ("convnext_wrong_backward", "grad", "torch:bf16", "classifier.2.weight", "op_implementation"),
    # a functional call's epsilon computed from the dtype (tests/builders/dtype_scalar.py)
    ("dtype_scalar", "forward", "torch:bf16", "1:layer_norm", "argument_mismatch"),
    ("dtype_scalar", "forward", "torch:fp16", "1:layer_norm", "argument_mismatch"),
    # the model's ONNX export edited, run by ONNX Runtime as written (`file` faults, EDITS)
    ("bert", "file", "ort", "model.encoder.layer.1.attention.output.LayerNorm", "file_differs"),
    ("resnet18", "file", "ort", "fc", "file_differs"),
    ("edited_files", "file", "ort", "norm", "weight_mismatch"),
]  # fmt: skip


def _attribute(op: str, index: int, name: str, value):
    """An edit: attribute `name` of the `index`-th `op` node set to `value`."""

    def edit(model) -> None:
        from onnx import helper

        node = [n for n in model.graph.node if n.op_type == op][index]
        kept = [a for a in node.attribute if a.name != name]
        del node.attribute[:]
        node.attribute.extend([*kept, helper.make_attribute(name, value)])

    return edit


def _folded_divisor(model) -> None:
    """An edit: one element of the constant a Div divides by (folded from two buffers) ×1.05."""
    from onnx import numpy_helper

    div = next(n for n in model.graph.node if n.op_type == "Div")
    folded = next(i for i in model.graph.initializer if i.name == div.input[1])
    values = numpy_helper.to_array(folded).copy()
    values[3] *= 1.05
    folded.CopyFrom(numpy_helper.from_array(values, folded.name))


# how each `file` fault edits its model's export: a LayerNorm's epsilon, a Gemm's alpha, a
# constant the exporter folded
EDITS = {
    "bert": _attribute("LayerNormalization", 3, "epsilon", 0.05),
    "resnet18": _attribute("Gemm", 0, "alpha", 1.01),
    "edited_files": _folded_divisor,
}


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


def grad(name: str, target: str):
    model, inputs = load_builder(name)(0)
    return layerdiff.compare_gradients(model, inputs, target=target, seed=0)


def fault(builder: str, kind: str, target: str):
    sys.path.insert(0, str(ROOT / "tests"))
    import importlib

    from builders import narrow_kernels

    if kind == "file":
        import tempfile

        import onnx
        from layerdiff.torch import export_onnx

        model, inputs = (
            load_builder(builder)(0)
            if builder in ZOO
            else importlib.import_module(f"builders.{builder}").build()
        )
        with tempfile.TemporaryDirectory() as folder:
            path = export_onnx(model, inputs, Path(folder) / "model.onnx")
            edited = onnx.load(str(path))
            EDITS[builder](edited)
            onnx.save(edited, str(path))
            return compare_torch_onnx(model, inputs, onnx=path, seed=0)
    if hasattr(narrow_kernels, builder):
        model, inputs = getattr(narrow_kernels, builder)()
    else:
        model, inputs = importlib.import_module(f"builders.{builder}").build()
    if kind == "grad":
        return layerdiff.compare_gradients(model, inputs, target=target, seed=0)
    return layerdiff.compare_torch(model, inputs, target=target, seed=0)


def row(what: str, target: str, report, seconds: float, expected: str = "no defect") -> str:
    s = report.summary
    # an infinite multiple (own error where the ideal has none) is written as a string
    multiples = [float(x["baseline"]["multiple"]) for x in report.layers if x.get("baseline")]
    worst = max(multiples, default=0.0)
    defects = ", ".join(f"`{d['layer']}` {d['cause']}" for d in s["defects"]) or "none"
    kernels = [f"`{k['layer']}`" for k in s.get("narrow_accumulation", [])]
    narrow = ", ".join(kernels[:3]) + (f" and {len(kernels) - 3} more" if len(kernels) > 3 else "")
    took = "`make reports`" if isinstance(report, _Committed) else f"{seconds:.0f} s"
    return (
        f"| {what} | {target} | {expected} | {s['verdict']} | {defects} | {narrow or 'none'} | "
        f"{worst:.2f} | {len(multiples)} | {took} |"
    )


def found(report, layer: str, cause: str) -> bool:
    """Whether a planted fault is the headline: the one defect at its layer with its cause, or
    (a kernel that accumulates in the narrow dtype) named as such there, with no defect."""
    s = report.summary
    if cause == "narrow_accumulation":
        named = [k["layer"] for k in s.get("narrow_accumulation", [])]
        return named == [layer] and not s["defects"]
    return [(d["layer"], d["cause"]) for d in s["defects"]] == [(layer, cause)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(ZOO))
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--from-reports", action="store_true")
    parser.add_argument("--no-grad", action="store_true", help="leave out the gradient rows")
    parser.add_argument("--no-faults", action="store_true", help="leave out the planted faults")
    args = parser.parse_args()
    lines = [
        "| model | target | expected | verdict | defects | narrow accumulation | "
        "largest multiple | layers with a baseline | time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    failed = False

    def job(m: str, t: str):
        if args.from_reports and t in REPORTS:
            committed = ROOT / "examples" / "reports" / f"{m}_{REPORTS[t]}.json"
            return lambda: _Committed(committed)
        return lambda: run(m, t)

    names = [m for m in args.models.split(",") if m]  # `--models ""`: the faults alone
    # (what, target, run, expected, the check it must pass)
    jobs = [(m, t, job(m, t), "no defect", None) for m in names for t in TARGETS]
    if not args.no_grad:
        jobs += [
            (f"{m} gradients", t, lambda m=m, t=t: grad(m, t), "no defect", None)
            for m in names
            for t in GRAD_TARGETS
        ]
    if not args.no_faults:
        jobs += [
            (
                f"{b} ({kind})", t, lambda b=b, kind=kind, t=t: fault(b, kind, t),
                f"`{layer}` {cause}", (layer, cause),
            )
            for b, kind, t, layer, cause in FAULTS
        ]  # fmt: skip
    for what, target, job, expected, check in jobs:
        start = time.perf_counter()
        try:
            report = job()
        except Exception as e:  # a run that breaks is a row, not the end of the table
            lines.append(f"| {what} | {target} | {expected} | broke: {type(e).__name__} |||||")
            failed = True
            print(lines[-1], flush=True)
            continue
        lines.append(row(what, target, report, time.perf_counter() - start, expected))
        if check is None:
            failed |= bool(report.summary["defects"])
        elif not found(report, *check):
            failed = True
            lines[-1] += " **missed**"
        print(lines[-1], flush=True)
    table = "\n".join(lines)
    if not args.no_write:
        text = DOC.read_text()
        block = f"{BEGIN}\n{table}\n{END}"
        text = re.sub(f"{re.escape(BEGIN)}.*?{re.escape(END)}", lambda _: block, text, flags=re.S)
        DOC.write_text(text)
    print("calibration: " + ("FAILED (see the rows above)" if failed else "every row as expected"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
