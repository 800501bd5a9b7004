"""`make bench`, end to end: `layerdiff torch` beside the predecessor's two-step pipeline
(`benches/predecessor.py`) and beside the work no such comparison can avoid
(`benches/limit.py`), in alternating rounds on one machine; wall time and peak RSS of each
process, medians over the rounds."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import peers

HERE = Path(__file__).resolve().parent
PY = sys.executable
LAYERDIFF = str(Path(sys.executable).parent / "layerdiff")

# `layerdiff torch`'s wall ÷ the limit's, at most: a first run, and a second (the export kept).
FIRST_RUN = 1.1
KEPT_EXPORT = 1.25


def wait_with_peak(pid: int) -> tuple[int, int]:
    """Waits for a child; returns its exit status and its own peak RSS in bytes: the high-water
    mark of its memory map (VmHWM), read while it runs. wait4's ru_maxrss cannot tell it: a
    child started by fork or vfork begins with its parent's resident set (or its peak) on
    record, and this process holds gigabytes of arrays by the time it runs them."""
    peak = 0
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status, peak
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]) * 1024)
        except (OSError, ValueError, IndexError):  # between its exit and the wait
            pass
        time.sleep(0.02)


def timed(args: list[str], env: dict | None = None) -> dict:
    """One process: wall seconds, peak RSS (bytes, see `wait_with_peak`), its stdout and
    stderr; a failure stops the bench with the process's last words."""
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(args, stdout=out, stderr=err, env={**os.environ, **(env or {})})
        status, peak = wait_with_peak(child.pid)
        seconds = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if os.waitstatus_to_exitcode(status) not in (0, 1):
        raise RuntimeError(f"{' '.join(args)} failed: {stderr.strip()[-2000:]}")
    return {"seconds": seconds, "peak": peak, "stdout": stdout, "stderr": stderr}


def predecessor(model: str, folder: Path) -> dict:
    """Export step, then compare step: the two processes' wall times add, the peak is the
    larger one's."""
    onnx, report = str(folder / "pred.onnx"), str(folder / "pred.json")
    python = str(peers.python_of("predecessor"))
    export = timed([python, str(HERE / "predecessor.py"), "export", model, onnx])
    compare = timed([python, str(HERE / "predecessor.py"), "compare", model, onnx, report])
    return {
        "seconds": export["seconds"] + compare["seconds"],
        "peak": max(export["peak"], compare["peak"]),
    }


def layerdiff(model: str, cache: Path, folder: Path) -> dict:
    run = timed(
        [LAYERDIFF, "torch", model, "--quiet", "--json", str(folder / "r.json")],
        env={"LAYERDIFF_CACHE_DIR": str(cache)},
    )
    run["report"] = json.loads((folder / "r.json").read_text())["summary"]
    return run


def limit(model: str, kept: Path | None = None) -> dict:
    args = [PY, str(HERE / "limit.py"), model]
    if kept is not None:
        args += ["--no-export", str(kept)]
    run = timed(args)
    run.update(json.loads(run.pop("stdout").strip().splitlines()[-1]))
    return run


def kept_export(cache: Path) -> Path:
    (found,) = (cache / "exports").glob("*/model.onnx")
    return found


def one_model(model: str, rounds: int, with_predecessor: bool) -> dict:
    """`rounds` alternating rounds; in each: a first run of layerdiff (an empty export cache),
    a second run (the export kept), the limit with and without the export, the predecessor."""
    runs: dict[str, list[dict]] = {}
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            cache = folder / "cache"
            measured = {
                "layerdiff, first run": layerdiff(model, cache, folder),
                "layerdiff, second run": layerdiff(model, cache, folder),
                "limit, first run": limit(model),
                "limit, second run": limit(model, kept_export(cache)),
            }
            if with_predecessor:
                measured["predecessor"] = predecessor(model, folder)
        first, second = (measured[f"layerdiff, {r} run"]["report"] for r in ("first", "second"))
        if first != second:  # a kept export must not change what the run finds
            raise RuntimeError(f"{model}: the second run's summary differs from the first's")
        for name, run in measured.items():
            runs.setdefault(name, []).append(run)
    medians = {
        name: {
            "seconds": statistics.median(r["seconds"] for r in rs),
            "peak": statistics.median(r["peak"] for r in rs),
        }
        for name, rs in runs.items()
    }
    if with_predecessor:
        medians["packages"] = peers.packages_of("predecessor")
    limit_runs = runs["limit, first run"]
    medians["float32_bytes"] = limit_runs[0]["float32_bytes"]
    medians["limit_steps"] = {
        step: statistics.median(r["steps"][step] for r in limit_runs)
        for step in limit_runs[0]["steps"]
    }
    return medians


def measure(quick: bool) -> dict:
    if quick:
        return {"resnet18": one_model("resnet18", 1, True)}
    return {
        "resnet18": one_model("resnet18", 3, True),
        "vit_b_16": one_model("vit_b_16", 3, True),
        "decoder, 581M parameters": one_model(str(HERE / "decoder_580m.py:build"), 1, False),
    }


def predecessor_environment(measured: dict) -> str:
    """The predecessor's environment as the run recorded it: its top requirements' releases and
    how many distributions they require."""
    held = next((m["packages"] for m in measured.values() if "packages" in m), None)
    if held is None:
        return "(not run)"
    top = {canonical(n) for n in peers.LINKED["predecessor"]}
    named = [p for p in held if canonical(p.split("==")[0]) in top]
    return f"{', '.join(named)} and the {len(held) - len(named)} distributions they require"


def canonical(name: str) -> str:
    return name.lower().replace("_", "-")


def lines(measured: dict) -> list[str]:
    out = [
        "## End to end, side by side",
        "",
        "`layerdiff torch MODEL` with default settings, first run (empty export cache) and",
        "second run (the export kept), beside:",
        "",
        "- *the limit*: the work any per-layer comparison with the export must do, in one",
        "  process (`benches/limit.py`): start-up and imports, building the model, the dynamo",
        "  export (first run only), one PyTorch forward pass, one ONNX Runtime run of the file;",
        "- *the predecessor*: the two-step pipeline of the per-layer validator layerdiff grew",
        "  from, rebuilt from its description in `benches/predecessor.py` (legacy exporter with",
        "  every leaf a named output, then a second process that captures the leaves and runs",
        "  ONNX Runtime), in a virtualenv of its own holding what its README installs and what",
        "  that requires, the releases layerdiff's environment holds, linked (`benches/peers.py`),",
        f"  and nothing of layerdiff's: {predecessor_environment(measured)}.",
        "",
        f"`make bench` fails where a first run passes {FIRST_RUN}× its limit, or a second run",
        f"{KEPT_EXPORT}×. The limit and `layerdiff torch` build the model alike",
        "(`benches/models.py`); the limit imports nothing of layerdiff's.",
        "",
        "Wall time and peak RSS of each process (its VmHWM); the predecessor's two processes add",
        "their times, its peak is the larger one's. Medians over alternating rounds. *Weights* is",
        "the model's parameters in float32.",
        "",
        "| model | run | wall | ÷ limit | ÷ predecessor | peak RSS | ÷ weights | ÷ predecessor |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for model, m in measured.items():
        weights = m["float32_bytes"]
        pred = m.get("predecessor")
        for run in ("layerdiff, first run", "layerdiff, second run"):
            r = m[run]
            lim = m["limit, first run" if "first" in run else "limit, second run"]
            out.append(
                f"| {model} | {run} | {r['seconds']:.2f} s | {r['seconds'] / lim['seconds']:.2f}× "
                f"| {_ratio(r['seconds'], pred and pred['seconds'])} "
                f"| {r['peak'] / 1e9:.2f} GB | {r['peak'] / weights:.1f}× "
                f"| {_ratio(r['peak'], pred and pred['peak'])} |"
            )
        for run in ("limit, first run", "limit, second run", "predecessor"):
            if run in m:
                r = m[run]
                out.append(
                    f"| {model} | {run} | {r['seconds']:.2f} s | | | {r['peak'] / 1e9:.2f} GB "
                    f"| {r['peak'] / weights:.1f}× | |"
                )
    out += ["", "The limit's steps, first run (seconds):", ""]
    steps = next(iter(measured.values()))["limit_steps"]
    out += [
        "| model | weights | " + " | ".join(steps) + " |",
        "|---|---:|" + "---:|" * len(steps),
    ]
    for model, m in measured.items():
        cells = " | ".join(f"{m['limit_steps'][s]:.2f}" for s in steps)
        out.append(f"| {model} | {m['float32_bytes'] / 1e9:.2f} GB | {cells} |")
    return [*out, ""]


def misses(measured: dict) -> list[str]:
    """Every `layerdiff torch` row past its limit's target, in words."""
    out = []
    for model, m in measured.items():
        for run, most in (("first", FIRST_RUN), ("second", KEPT_EXPORT)):
            ratio = m[f"layerdiff, {run} run"]["seconds"] / m[f"limit, {run} run"]["seconds"]
            if ratio > most:
                out.append(
                    f"layerdiff torch {model}, {run} run, at {ratio:.2f}× the limit "
                    f"(at most {most}×)"
                )
    return out


def _ratio(ours: float, theirs: float | None) -> str:
    return f"{ours / theirs:.2f}×" if theirs else ""
