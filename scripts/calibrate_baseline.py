"""`make calibrate`: calibrates the rule that tells a defect from precision on honest kernels and on
planted faults. Clean runs: every built-in PyTorch model (seeded random weights) against its ONNX
export converted to float16 by ONNX Runtime's converter, quantized to int8 by its static QDQ
quantizer (one scale per weight, or per channel) and by its dynamic quantizer (MatMulInteger,
ConvInteger; the legacy export's too), and run by OpenVINO at its default inference precision; the
export in int8 activations against itself at ONNX Runtime's opt=all; as PyTorch targets in bfloat16
and autocast bfloat16, and in float16 and float32 against a bfloat16 reference, forward; every
model's gradients (`layerdiff grad`) in bfloat16 and float16, and in float16 against a bfloat16
reference; every built-in Keras model against its tf2onnx file on ONNX Runtime and OpenVINO, XLA,
and TFLite in float32, float16, full-integer int8 and dynamic-range int8. Faults: kernels planted
in real models (tests/builders/narrow_kernels.py) that accumulate in the narrow dtype (to be named
`narrow_accumulation` at their layer, not a defect), backwards off by 2% in the narrow dtype (to be
the one defect, at their weight), a functional call's epsilon computed from the dtype
(`argument_mismatch` at that call), and a model's ONNX export edited (an attribute, a folded
constant, a weight whose layer stays under the absolute tolerance, a weight ONNX Runtime's
optimizer fuses and reorders, a dynamic int8 file's weight scale, a static int8 file's codes) and
run by ONNX Runtime (`file_differs` or `weight_mismatch` at its layer: the file, never the
runtime); a block whose own code computes differently only when torch.compile compiles it whole
(`cross_module_fusion` at that block), its clean twin and models compiled by `torch:compile`; a
rank that scales one weight's gradient under DistributedDataParallel (the defect at that weight on
that rank) and clean data-parallel twins (`torch:ddp=N`). Each run's verdict, defects, the layers
that accumulate in the narrow dtype and the largest multiple of what precision explains go into the
table of docs/metrics.md (between its calibration markers). A defect in a clean run, or a fault not
found at its layer with its cause, is a wrong headline: the script exits 1.

    python scripts/calibrate_baseline.py [--models resnet18,bert] [--keras keras_cnn]
                                         [--no-write] [--from-reports] [--no-grad]
                                         [--no-faults] [--quick] [--again]

With `--from-reports` the float16 and bfloat16 forward rows are read from examples/reports/
(`make reports` makes exactly those runs: `layerdiff torch NAME --seed 0 --dtype fp16`, and
`--target torch --dtype bf16`) instead of being run again. `--quick` runs the subset `make
test` runs (tests/test_calibration.py): one clean row of each kind of side and the faults that
take seconds; it writes nothing. `--again` runs only the rows of the table in docs/metrics.md
that broke or were missed (a whole run takes over an hour on 2 cores) and writes the table with
them run again, the others as they were."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import layerdiff
from layerdiff._keras_zoo import KERAS_MODELS as KERAS_ZOO
from layerdiff.torch import compare_torch_onnx
from layerdiff.torch.models import ZOO, load_builder

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration_table  # noqa: E402
from calibration_files import (  # noqa: E402
    DECODE_EDITS,
    EDITS,
    FAULTS,
    dynamic_int8,
    int4,
    rewritten,
    static_int8,  # noqa: E402
)
from calibration_table import found, headline, row  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TARGETS = (
    "onnx fp16", "onnx int8", "onnx dynamic int8", "openvino", "torch:bf16", "torch:amp-bf16",
    "file tract", "file ort:opt=all", "int8 file ort:opt=all", "onnx int8 per-channel",
    "onnx dynamic int8 legacy", "torch:fp16 --reference torch:bf16",
    "torch --reference torch:bf16",
)  # fmt: skip
# `TARGET --reference SIDE`: a reference that rounds coarser than the target (bfloat16 against
# float16, or float32): what the reference rounds away is its own, never the target kernel's
# the export quantized by ONNX Runtime's dynamic quantizer, or its static one with a scale per
# channel (int8 QDQ), against PyTorch; `legacy`: the legacy exporter's file, BatchNorms folded
QUANTIZED = ("onnx dynamic int8", "onnx int8 per-channel", "onnx dynamic int8 legacy")
# `file RUNTIME`: `layerdiff onnx EXPORT --target RUNTIME`, the export against itself on ONNX
# Runtime (its default target is tract): what a user runs first on a file, whose runtimes'
# kernels approximate (tract's Erf, Tanh and Exp; ONNX Runtime's fused kernels at opt=all)
# and add long reductions up in other orders (tract's Conv with K = 4608 in ResNet-50);
# `int8 file ort:opt=all`: the export quantized to int8 activations and weights (QDQ) against
# itself at opt=all, where ONNX Runtime re-encodes int8 activations as uint8 and computes in
# integer kernels
KERAS_TARGETS = (
    "ort", "openvino", "xla", "tflite", "tflite:fp16", "tflite:int8", "tflite:dynamic",
)  # fmt: skip
# sides a Keras model has none of: tf2onnx does not convert keras_encoder's exact GELU (Erfc),
# which `layerdiff keras` says with exit 2 and a hint
NO_ONNX = {"keras_encoder"}
GRAD_TARGETS = ("torch:bf16", "torch:fp16", "torch:fp16 --reference torch:bf16")
# each gradient row (clean and planted) at the machine's threads and at one: PyTorch's CPU
# kernels split a sum by thread, and at one thread a LayerNorm's gradient adds every position
# up one by one in the narrow dtype (OMP_NUM_THREADS=1, a CI runner, LAYERDIFF_THREADS=1)
GRAD_THREADS = (None, 1)
# `layerdiff torch CHECKPOINT --decode-steps 2 --onnx FILE`: a transformers decoder
# (tests/builders/checkpoints.py) against its own export (`float`), that export quantized by
# ONNX Runtime's dynamic quantizer (int8 weights, MatMulInteger) and by its MatMulNBits
# quantizer (int4 in blocks of 32), at the prefill and two steps that read the cache
DECODERS = ("llama", "qwen2", "gpt2")
DECODE_FILES = ("float", "dynamic int8", "int4")
REPORTS = {"onnx fp16": "fp16", "torch:bf16": "bf16"}  # examples/reports/NAME_SUFFIX.json
# built-in models whose whole compile must agree with it eager (`torch:compile`, clean rows)
COMPILED = ("resnet18", "bert", "gpt2")
# the subset `--quick` runs: (model, target) clean rows, Keras rows, gradients, faults by index
QUICK = {
    "forward": [("mobilenet_v3_small", "onnx fp16"), ("bert", "onnx dynamic int8"),
                ("bert", "openvino"), ("gpt2", "torch:bf16")],
    "keras": [("keras_cnn", "tflite:int8")],
    "grad": [("bert", "torch:bf16", 1)],
    # by (builder, target): a fault added to FAULTS moves the others' places
    "faults": [("dtype_scalar", "torch:bf16"), ("efficientnet_b0", "ort"),
               ("bert dynamic int8", "ort")],
    "decode": [("llama", "dynamic int8")],
}  # fmt: skip


class _Committed:
    """A report written as JSON, read back (what `row` needs of it): one `make reports` wrote
    (`committed`), or a run of the command line."""

    def __init__(self, path: Path, committed: bool = True, exit: int | None = None):
        data = json.loads(path.read_text())
        self.summary, self.layers = data["summary"], data["layers"]
        self.committed, self.path, self.exit = committed, path, exit


def _layerdiff(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`layerdiff ARGS` in a process of its own, with `env`'s variables set."""
    command = [sys.executable, "-m", "layerdiff", *args]
    return subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, **(env or {})}
    )


def _cli(*args: str, out: Path | None = None, env: dict | None = None) -> _Committed:
    """`layerdiff ARGS --json …` (or `--out OUT`, its report kept there for `reduce`), in a
    process of its own: its report, read back, with its exit code."""
    with tempfile.TemporaryDirectory() as folder:
        written = ["--out", str(out)] if out is not None else ["--json", f"{folder}/r.json"]
        report = out / "report.json" if out is not None else Path(folder) / "r.json"
        done = _layerdiff(*args, *written, "--quiet", env=env)
        if done.returncode not in (0, 1) or not report.is_file():
            said = done.stderr.strip().splitlines()
            raise RuntimeError(said[-1] if said else f"exit {done.returncode}, no report")
        return _Committed(report, committed=False, exit=done.returncode)


def run(name: str, target: str):
    model, inputs = load_builder(name)(0)
    if target.startswith(("file ", "int8 file ")):
        from layerdiff.torch import export_onnx

        with tempfile.TemporaryDirectory() as folder:
            path = export_onnx(model, inputs, Path(folder) / "model.onnx")
            if target.startswith("int8 "):
                path = static_int8(path, Path(folder) / "model.int8.onnx", inputs)
            return _cli("onnx", str(path), "--target", target.split()[-1], "--seed", "0")
    if target in ("onnx fp16", "onnx int8"):
        return compare_torch_onnx(model, inputs, dtype=target.split()[1], seed=0)
    if target == "openvino":
        return compare_torch_onnx(model, inputs, target="openvino", seed=0)
    if target in QUANTIZED:
        from layerdiff.torch import export_onnx

        exporter = "legacy" if target.endswith(" legacy") else "dynamo"
        with tempfile.TemporaryDirectory() as folder:
            path = export_onnx(model, inputs, Path(folder) / "model.onnx", exporter=exporter)
            out = Path(folder) / "model.int8.onnx"
            quantized = (
                static_int8(path, out, inputs, per_channel=True)
                if "per-channel" in target
                else dynamic_int8(path, out)
            )
            return compare_torch_onnx(model, inputs, onnx=quantized, seed=0)
    target, *reference = target.split(" --reference ")
    sides = {"reference": reference[0]} if reference else {}
    return layerdiff.compare_torch(model, inputs, target=target, seed=0, **sides)


def keras_run(name: str, target: str):
    """`layerdiff keras NAME --target TARGET`, in a process of its own: TensorFlow and PyTorch
    do not share one (tests/conftest.py)."""
    return _cli("keras", name, "--target", target, "--seed", "0")


class _Steps:
    """The reports of a decoder's points (`layerdiff torch … --decode-steps --out DIR`) read as
    one for a row: the worst verdict, every distinct defect, every layer."""

    ORDER = ("defect", "undecided", "inconclusive", "precision", "no_drift")

    def __init__(self, folder: Path):
        reports = sorted(folder.glob("*/report.json"))
        points = [_Committed(report, committed=False) for report in reports]
        verdicts = [p.summary["verdict"] for p in points]
        defects, seen = [], set()
        for d in (d for p in points for d in p.summary["defects"]):
            if (d["layer"], d["cause"]) not in seen:
                seen.add((d["layer"], d["cause"]))
                defects.append(d)
        narrow = [k for p in points for k in p.summary.get("narrow_accumulation", [])]
        self.summary = {
            "verdict": min(verdicts, key=self.ORDER.index),
            "defects": defects,
            "narrow_accumulation": narrow,
        }
        self.summary["approximations"] = [
            a for p in points for a in p.summary.get("approximations", [])
        ]
        self.layers = [layer for p in points for layer in p.layers]
        self.committed, self.points, self.exit = False, reports, None


def decoded(name: str, file: str, edit=None, folder: Path | None = None) -> _Steps:
    """`layerdiff torch CHECKPOINT --decode-steps 2 --onnx FILE`, FILE the checkpoint's own
    decoder export as `file` makes it (`float`, `dynamic int8`, `int4`), edited by `edit`; its
    step reports in `folder`/run (a folder of its own where none is given)."""
    if folder is None:
        with tempfile.TemporaryDirectory() as kept:
            return decoded(name, file, edit, Path(kept))
    sys.path.insert(0, str(ROOT / "tests"))
    from builders import checkpoints

    checkpoint = checkpoints.save(name, folder / "checkpoint")
    command = ["torch", str(checkpoint), "--decode-steps", "2", "--quiet"]
    done = _layerdiff(*command, "--out", str(folder / "clean"))
    if done.returncode != 0:
        raise RuntimeError(f"the float decoder is not clean (exit {done.returncode})")
    path = folder / "clean" / "model.onnx"
    if file == "dynamic int8":
        path = dynamic_int8(path, folder / "model.int8.onnx")
    elif file == "int4":
        path = int4(path, folder / "model.int4.onnx")
    if edit is not None:
        path = edit(path, folder / "edited.onnx")
    done = _layerdiff(*command, "--onnx", str(path), "--out", str(folder / "run"))
    if done.returncode not in (0, 1):
        said = done.stderr.strip().splitlines()
        raise RuntimeError(said[-1] if said else f"exit {done.returncode}")
    steps = _Steps(folder / "run")
    steps.exit = done.returncode
    return steps


def grad(name: str, target: str, threads: int | None):
    import torch

    model, inputs = load_builder(name)(0)
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    target, *reference = target.split(" --reference ")
    sides = {"reference": reference[0]} if reference else {}
    try:
        return layerdiff.compare_gradients(model, inputs, target=target, seed=0, **sides)
    finally:
        torch.set_num_threads(before)


def _threads(target: str, threads: int | None) -> str:
    """A gradient row's target, with its threads where they are set (`torch:bf16 · 1 thread`)."""
    return target if threads is None else f"{target} · {threads} thread{'s' * (threads > 1)}"


def _spec(name: str) -> str:
    """A model of the corpus as the command line names it: a built-in, or a builder in
    tests/builders/ (`name` for its `build`, `name:function`; narrow_kernels' by function)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from builders import narrow_kernels

    if name in ZOO:
        return name
    if hasattr(narrow_kernels, name):
        return f"{ROOT}/tests/builders/narrow_kernels.py:{name}"
    module, _, function = name.partition(":")
    return f"{ROOT}/tests/builders/{module}.py:{function or 'build'}"


def fault(builder: str, kind: str, target: str, threads: int | None, folder: Path):
    """A planted fault's run on the command line, its report kept in `folder`/run for
    `reduce`; with the arguments of `layerdiff check` on the same files (`None` where check
    does not apply: a PyTorch target, a gradient, a decoder's steps)."""
    if kind == "decode":
        name, file, edit = DECODE_EDITS[builder]
        return decoded(name, file, edit, folder), None
    seed = ("--seed", "0")
    if kind in ("file", "vs"):
        import importlib

        import onnx
        from layerdiff.torch import export_onnx

        name, exporter, quantizer, edit = EDITS[builder]
        sys.path.insert(0, str(ROOT / "tests"))  # (a row run first has no builder imported)
        built = load_builder(name) if name in ZOO else importlib.import_module(f"builders.{name}")
        model, inputs = built(0) if name in ZOO else built.build()
        export = export_onnx(model, inputs, folder / "model.onnx", exporter=exporter)
        path = rewritten(quantizer, export, folder, inputs)
        edited = onnx.load(str(path))
        edit(edited)
        onnx.save(edited, str(path))
        if kind == "vs":  # `layerdiff onnx EXPORT --vs FILE`: no PyTorch model to check
            return _cli("onnx", str(export), "--vs", str(path), "--target", target, *seed,
                        out=folder / "run"), None  # fmt: skip
        runtime = target.removeprefix("file ")
        check = ("check", _spec(name), "--onnx", str(path), "--target", runtime,
                 "--exporter", exporter, *seed)  # fmt: skip
        if target.startswith("file "):  # `layerdiff onnx FILE --target RUNTIME`
            report = _cli("onnx", str(path), "--target", runtime, *seed, out=folder / "run")
        else:
            report = _cli("torch", _spec(name), "--onnx", str(path), "--target", target, *seed,
                          out=folder / "run")  # fmt: skip
        return report, check
    verb = "grad" if kind == "grad" else "torch"
    env = {"LAYERDIFF_THREADS": str(threads)} if threads else None
    target, *reference = target.split(" --reference ")  # a data-parallel side's own precision
    sides = ("--target", target, *(("--reference", *reference) if reference else ()))
    if target.startswith("--dtype "):  # against its export in that dtype, on ONNX Runtime
        sides = tuple(target.split())
    report = _cli(verb, _spec(builder), *sides, *seed, out=folder / "run", env=env)
    report.target = target
    return report, None


def doors(report, check, fault: tuple[str, str]) -> str:
    """The same run through every door, in words (`exit 1 · check FAIL · reduce LAYER`),
    and `!` before each that disagrees with the report's decision: a defect exits 1, fails
    `check` and is cut down by `reduce` to a repro of its layer; an approximation exits 0,
    passes `check` and is cut down too; a narrow accumulation exits 0 and passes."""
    layer, cause = fault
    defect = cause not in ("narrow_accumulation", "approximation")
    said = []
    exit = getattr(report, "exit", None)
    said.append(("" if exit == int(defect) else "!") + f"exit {exit}")
    if check is not None:
        done = _layerdiff(*check, "--quiet")
        agrees = done.returncode == int(defect)
        said.append(("" if agrees else "!") + f"check {['pass', 'FAIL'][done.returncode == 1]}")
    if ":ddp=" in getattr(report, "target", ""):
        said.append("reduce n/a (data-parallel)")  # it says so, exit 2 (docs/torch.md)
    elif cause != "narrow_accumulation":
        # a decoder's step whose headline it is
        points = getattr(report, "points", None) or [report.path]
        leading = [p for p in points if headline(json.loads(p.read_text())) == layer]
        done = _layerdiff("reduce", str((leading or points)[0]))
        reproduced = done.returncode == 0 and f"`{layer}`" in done.stdout
        said.append(f"reduce `{layer}`" if reproduced else f"!reduce exit {done.returncode}")
    return " · ".join(said)


def evaluate(job: tuple) -> tuple[str, bool]:
    """One row of the table and whether it is wrong: `job` is (kind, what, target, expected,
    the check a fault must pass, the run's arguments). A fault's run goes through every door
    too (`doors`). A run that breaks is a row too."""
    kind, what, target, expected, check, arguments = job
    start = time.perf_counter()
    said = "—"
    try:
        with tempfile.TemporaryDirectory() as folder:
            if kind == "committed":
                report = _Committed(arguments[0])
            elif kind == "fault":
                report, check_args = fault(*arguments, Path(folder))
                seconds = time.perf_counter() - start
                if check is not None and found(report, *check):
                    said = doors(report, check_args, check)
            else:
                runs = {"forward": run, "keras": keras_run, "grad": grad, "decode": decoded}
                report = runs[kind](*arguments)
            if kind != "fault":
                seconds = time.perf_counter() - start
    except Exception as e:
        return f"| {what} | {target} | {expected} | broke: {type(e).__name__}: {e} |||||||", True
    line = row(what, target, report, seconds, expected, said)
    wrong = "!" in said
    if kind == "keras" and target == "tflite:int8":
        # the headline names the precision that ran: the int8 the target quantizes to
        precision = report.summary.get("precision") or {}
        if precision and precision.get("dtype") != "int8":
            return line + f" **headline says {precision.get('dtype')}**", True
    if check is None:
        unclean = calibration_table.unclean(report, target)
        return line + unclean, bool(report.summary["defects"] or unclean) or wrong
    if not found(report, *check):
        return line + " **missed**", True
    return line + (" **a door disagrees**" if wrong else ""), wrong


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(ZOO))
    parser.add_argument("--keras", default=",".join(KERAS_ZOO), help="the Keras models")
    parser.add_argument(
        "--targets", default=",".join(TARGETS),
        help="the forward targets of the PyTorch models (`onnx int8,onnx dynamic int8`); a "
        "subset does not write docs/metrics.md",
    )  # fmt: skip
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--from-reports", action="store_true")
    parser.add_argument("--no-grad", action="store_true", help="leave out the gradient rows")
    parser.add_argument("--no-faults", action="store_true", help="leave out the planted faults")
    parser.add_argument(
        "--no-decode", action="store_true", help="leave out the decoders' --decode-steps rows"
    )
    parser.add_argument("--quick", action="store_true", help="the subset `make test` runs")
    parser.add_argument(
        "--again", action="store_true",
        help="run only the rows of docs/metrics.md's table that broke or were missed",
    )  # fmt: skip
    parser.add_argument(
        "--executor", choices=("local", "ray"), default="local",
        help="where the runs go: here, one after another, or a Ray cluster (RAY_ADDRESS, else "
        "one started on this machine), each run a task",
    )  # fmt: skip
    args = parser.parse_args(argv)
    lines = [
        "| model | target | expected | verdict | defects | narrow accumulation | approximations | "
        "exit · check · reduce | largest multiple | layers with a baseline | time |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    names = [m for m in args.models.split(",") if m]  # `--models ""`: the faults alone
    targets = [t for t in args.targets.split(",") if t]
    if unknown := [t for t in targets if t not in TARGETS]:
        parser.error(f"unknown target(s) {', '.join(unknown)}: one of {', '.join(TARGETS)}")
    forward = [(m, t) for m in names for t in targets]
    args.no_write |= set(targets) != set(TARGETS)
    keras = [
        (m, t)
        for m in args.keras.split(",")
        if m
        for t in KERAS_TARGETS
        if not (m in NO_ONNX and t in ("ort", "openvino"))
    ]
    grads = (
        []
        if args.no_grad
        else [(m, t, n) for m in names for t in GRAD_TARGETS for n in GRAD_THREADS]
    )
    decodes = [] if args.no_decode else [(m, f) for m in DECODERS for f in DECODE_FILES]
    faults = [] if args.no_faults else list(range(len(FAULTS)))
    if args.quick:
        forward, keras, grads, quick, decodes = (
            QUICK[k] for k in ("forward", "keras", "grad", "faults", "decode")
        )
        faults = [i for i, f in enumerate(FAULTS) if (f[0], f[2]) in quick]
        args.no_write = True

    def clean(m: str, t: str) -> tuple:
        if args.from_reports and t in REPORTS:
            committed = ROOT / "examples" / "reports" / f"{m}_{REPORTS[t]}.json"
            return ("committed", m, t, "no defect", None, (committed,))
        return ("forward", m, t, "no defect", None, (m, t))

    jobs = [clean(m, t) for m, t in forward]
    if not args.quick and set(targets) == set(TARGETS):
        jobs += [clean(m, "torch:compile") for m in COMPILED if m in names]
    jobs += [("keras", m, t, "no defect", None, (m, t)) for m, t in keras]
    jobs += [
        ("grad", f"{m} gradients", _threads(t, n), "no defect", None, (m, t, n))
        for m, t, n in grads
    ]
    jobs += [
        ("decode", f"{m} {f} decoder", "--decode-steps 2", "no defect", None, (m, f))
        for m, f in decodes
    ]
    for b, kind, t, layer, cause in (FAULTS[i] for i in faults):
        for n in GRAD_THREADS if kind == "grad" else (None,):
            shown, arguments = _threads(t, n), (b, kind, t, n)
            if layer is None:  # a clean twin
                jobs.append(("fault", f"{b} ({kind})", shown, "no defect", None, arguments))
                continue
            expected = f"`{layer}` {cause}"
            jobs.append(("fault", f"{b} ({kind})", shown, expected, (layer, cause), arguments))
    failed = False
    if args.again:
        jobs = calibration_table.again(jobs, lines)
    todo = [job for job in jobs if job[0] != "kept"]
    if args.executor == "ray":
        from layerdiff._executor import mapped

        with mapped("ray", len(todo)) as run_all:
            results = iter(run_all(evaluate, todo))
    else:
        results = (evaluate(job) for job in todo)  # one after another, each printed as it ends
    for job in jobs:
        line, wrong = (job[1], False) if job[0] == "kept" else next(results)
        print(line, flush=True)
        lines.append(line)
        failed |= wrong
    table = "\n".join(lines)
    if not args.no_write:
        calibration_table.write(table)
    print("calibration: " + ("FAILED (see the rows above)" if failed else "every row as expected"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
