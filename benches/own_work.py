"""`make bench`, layerdiff's own work: `layerdiff onnx` and `layerdiff torch` with the local error
and the float64 truth on, each phase timed by the run itself (`--timings`); *own* is every phase
but the runtimes' inference (float64 inference included) and PyTorch's work. Beside it,
`layerdiff onnx` against Polygraphy's save-then-compare on the same file, and the targets every
row must meet (the constants below): a miss fails `make bench`, after docs/performance.md is
written."""

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

BIN = Path(sys.executable).parent
LAYERDIFF = str(BIN / "layerdiff")
POLYGRAPHY_VERSION = "0.53.6"

# What `make bench` holds layerdiff to, each a ratio measured in the same run.
OWN_SHARE = 0.05  # own work of every `layerdiff onnx` row, at most
TORCH_OWN_SHARE = 0.10  # own work of every `layerdiff torch` row, at most (its floor: side_by_side)
POLYGRAPHY_SHARE = 0.15  # `layerdiff onnx` wall ÷ Polygraphy's save and compare, every row
NARROW_RATE = 0.5  # float16 and bfloat16 elements per second ÷ float32's


def onnx_files(folder: Path, quick: bool) -> dict[str, Path]:
    """ResNet-18 (dynamo export) and ResNet-50 (the legacy exporter, float32 and float16),
    torchvision with random weights, seed 0."""
    import onnx
    import torch
    import torchvision
    from layerdiff.torch import export_onnx

    files = {}
    torch.manual_seed(0)
    x = torch.randn(1, 3, 224, 224)
    model = torchvision.models.resnet18(weights=None).eval()
    files["resnet18"] = folder / "resnet18.onnx"
    export_onnx(model, (x,), files["resnet18"], exporter="dynamo")
    name = "resnet18" if quick else "resnet50"
    model = getattr(torchvision.models, name)(weights=None).eval()
    for label in ("fp32", "fp16"):
        path = folder / f"{name}_{label}.onnx"
        m, example = (model, x) if label == "fp32" else (model.half(), x.half())
        with torch.no_grad():
            torch.onnx.export(m, (example,), str(path), dynamo=False, opset_version=17)
        proto = onnx.load(str(path))
        proto.ir_version = 10  # ONNX Runtime 1.31 refuses the onnx wheel's newer IR
        onnx.save(proto, str(path))
        files[f"{name}_{label}"] = path
    return files


def timed_run(args: list[str], env: dict | None = None) -> tuple[float, dict]:
    """One `layerdiff` run with `--timings`: its wall seconds and its report."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        start = time.perf_counter()
        done = subprocess.run(
            [LAYERDIFF, *args, "--timings", "--quiet", "--json", str(out)],
            capture_output=True, text=True, timeout=1800, env={**os.environ, **(env or {})},
        )  # fmt: skip
        wall = time.perf_counter() - start
        if done.returncode not in (0, 1) or not out.exists():
            raise RuntimeError(f"layerdiff {' '.join(args)} failed: {done.stderr.strip()[-2000:]}")
        return wall, json.loads(out.read_text())


def row(title: str, args: list[str], rounds: int, first_run: bool = False) -> dict:
    """A row: the run whose total is the median of `rounds`, its phases and own share. A
    `first_run` (a `torch` row) exports in every round, as a new user's first run does."""
    runs = []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as cache:
            env = {"LAYERDIFF_CACHE_DIR": cache} if first_run else None
            wall, report = timed_run(args, env)
        phases = {t["phase"]: (t["by"], t["seconds"]) for t in report["timings"]}
        total = sum(s for _, s in phases.values())
        own = sum(s for by, s in phases.values() if by == "layerdiff")
        summary = report["summary"]
        runs.append({
            "title": title, "args": args, "phases": phases, "total": total, "own": own,
            "share": own / total, "wall": wall, "verdict": summary["verdict"],
            "load": os.getloadavg()[0],
            "compared": summary["layers_compared"], "exceeding": summary["layers_exceeding"],
        })  # fmt: skip
    runs.sort(key=lambda r: r["total"])
    return runs[len(runs) // 2]


# `layerdiff onnx`'s targets beside Polygraphy: the file as written on both sides (off/off), and
# the target at ONNX Runtime's full optimization (off/all).
TARGETS = {"off/off": "ort", "off/all": "ort:opt=all"}


def polygraphy(label: str, model: Path, rounds: int) -> dict:
    """Polygraphy's per-layer comparison of one file on ONNX Runtime (every value marked an
    output): one process saves the reference's values, a second runs again and compares;
    beside `layerdiff onnx` on the same file (float64 truth and local error on) at each of
    `TARGETS`, in alternating rounds (medians), with the load average when the row was done.
    Polygraphy runs in a virtualenv of its own (`peers.py`), as its users install it."""
    exe = str(peers.python_of("polygraphy").parent / "polygraphy")
    walls: dict[str, list[float]] = {"save": [], "compare": [], **{t: [] for t in TARGETS}}
    with tempfile.TemporaryDirectory() as tmp:
        saved = str(Path(tmp) / "reference.json")
        base = [exe, "run", str(model), "--onnxrt", "--onnx-outputs", "mark", "all", "-q"]
        for _ in range(rounds):
            for step, args in (
                ("save", [*base, "--save-outputs", saved]),
                ("compare", [*base, "--load-outputs", saved]),
            ):
                start = time.perf_counter()
                done = subprocess.run(args, capture_output=True, text=True, timeout=600)
                walls[step].append(time.perf_counter() - start)
                if done.returncode != 0:
                    raise RuntimeError(f"polygraphy {step} failed: {done.stderr.strip()[-2000:]}")
            for title, target in TARGETS.items():
                ours = ["onnx", str(model), "--batch", "1", "--target", target, "--float64"]
                walls[title].append(timed_run(ours)[0])
    median = {k: statistics.median(v) for k, v in walls.items()}
    theirs = median["save"] + median["compare"]
    return {
        "model": label, **median, "load": os.getloadavg()[0],
        "ratios": {t: median[t] / theirs for t in TARGETS},
    }  # fmt: skip


def measure(quick: bool) -> dict:
    rounds = 1 if quick else 3
    with tempfile.TemporaryDirectory() as tmp:
        files = onnx_files(Path(tmp), quick)
        big = "resnet18" if quick else "resnet50"
        onnx_rows = [
            row("ResNet-18, the same file on both sides (ONNX Runtime)",
                ["onnx", str(files["resnet18"]), "--batch", "1", "--target", "ort", "--float64"],
                rounds),
            row(f"{big} (legacy export) on ONNX Runtime at opt=all",
                ["onnx", str(files[f"{big}_fp32"]), "--target", "ort:opt=all", "--float64"],
                rounds),
            row(f"{big}, float32 against its float16 export",
                ["onnx", str(files[f"{big}_fp32"]), "--vs", str(files[f"{big}_fp16"]),
                 "--float64"], rounds),
        ]  # fmt: skip
        beside = [polygraphy("ResNet-18 (dynamo export)", files["resnet18"], rounds)]
        if not quick:
            beside.append(polygraphy("ResNet-50 (legacy export)", files[f"{big}_fp32"], rounds))
    decoder = str(Path(__file__).parent / "decoder_580m.py:build")
    models = ["resnet18"] if quick else ["resnet18", "vit_b_16", decoder]
    torch_rows = [
        row(f"`layerdiff torch {Path(m).name}`, first run", ["torch", m], 1, first_run=True)
        for m in models
    ]
    return {
        "rows": onnx_rows + torch_rows, "polygraphy": beside,
        "packages": peers.packages_of("polygraphy"),
    }  # fmt: skip


def share_of(row: dict) -> float:
    """The own-work share a row is held to: `layerdiff onnx`'s, or `layerdiff torch`'s."""
    return OWN_SHARE if row["args"][0] == "onnx" else TORCH_OWN_SHARE


def misses(own: dict, comparator: list[dict] | None) -> list[str]:
    """Every target this run missed, in words (the comparator's where it was measured)."""
    out = [
        f"own work {100 * r['share']:.1f}% of `{r['title']}` (at most {100 * share_of(r):.0f}%)"
        for r in own["rows"]
        if r["share"] > share_of(r)
    ]
    for p in own["polygraphy"]:
        out += [
            f"layerdiff onnx {p['model']} {title} at {ratio:.2f}× Polygraphy's wall "
            f"(at most {POLYGRAPHY_SHARE}×)"
            for title, ratio in p["ratios"].items()
            if ratio > POLYGRAPHY_SHARE
        ]
    if comparator is None:
        return out
    # The float32 rate's share of read bandwidth is measured, not held to a target: no run's
    # time is the comparator's (own work is a few percent of every row).
    rates = {r["dtype"]: r for r in comparator[1:]}
    for narrow in ("float16", "bfloat16"):
        rate = rates[narrow]["gelems"] / rates["float32"]["gelems"]
        if rate < NARROW_RATE:
            out.append(
                f"{narrow} compared at {rate:.2f}× float32's element rate (at least {NARROW_RATE}×)"
            )
    return out


def lines(own: dict, missed: list[str]) -> list[str]:
    out = [
        "## Where the time goes",
        "",
        "Each run times its own phases (`--timings`), with the local error and the float64 truth",
        "on. *Own* work is every phase but the runtimes' inference (ONNX Runtime, tract and",
        "layerdiff's float64 kernels computing the float64 truth and each layer's baseline) and",
        "PyTorch's work (building, capture, its float64 run, export). `make bench` fails where a",
        f"`layerdiff onnx` row's own work passes {100 * OWN_SHARE:.0f}%, a `layerdiff torch` row's",
        f"{100 * TORCH_OWN_SHARE:.0f}%. `layerdiff onnx` rows: the median of three runs;",
        "`layerdiff torch` rows: one first run (an empty export cache). How quiet the machine was:",
        "its load average over the last minute when the row was done.",
        "",
        "| run | layers compared (exceeding) | verdict | phases, in all | own work | share "
        "| load |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for r in own["rows"]:
        flag = "" if r["share"] <= share_of(r) else " **over**"
        out.append(
            f"| {r['title']} | {r['compared']} ({r['exceeding']}) | {r['verdict']} "
            f"| {r['total']:.2f} s | {r['own']:.3f} s | {100 * r['share']:.1f}%{flag} "
            f"| {r['load']:.2f} |"
        )
    out += [
        "",
        f"Beside Polygraphy {POLYGRAPHY_VERSION} (`polygraphy run --onnxrt --onnx-outputs mark",
        "all`, once with `--save-outputs`, then with `--load-outputs`, which compares every",
        "value) on the same file: wall time of each process, medians over alternating rounds.",
        "`layerdiff onnx` runs with the float64 truth and the local error, its target as the file",
        "is written (off/off) and at ONNX Runtime's full optimization (off/all). Polygraphy runs",
        "in a virtualenv of its own, as its users install it (`benches/peers.py`), which holds",
        f"only {', '.join(own['packages'])}. `make bench` fails where a row passes",
        f"{POLYGRAPHY_SHARE}×.",
        "",
        "| file | Polygraphy: save | Polygraphy: compare | `layerdiff onnx` off/off | ÷ theirs "
        "| `layerdiff onnx` off/all | ÷ theirs | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in own["polygraphy"]:
        ratios = p["ratios"]
        out.append(
            f"| {p['model']} | {p['save']:.2f} s | {p['compare']:.2f} s "
            f"| {p['off/off']:.2f} s | {ratios['off/off']:.2f}× "
            f"| {p['off/all']:.2f} s | {ratios['off/all']:.2f}× | {p['load']:.2f} |"
        )
    out.append("")
    if missed:
        out += ["Targets this run missed:", "", *[f"- {m}" for m in missed], ""]
    else:
        out += ["Every target was met in this run.", ""]
    for r in own["rows"]:
        out += phase_table(r)
    return out


def phase_table(r: dict) -> list[str]:
    lines = [
        f"### {r['title']}: {r['total']:.2f} s, "
        f"own work {r['own']:.3f} s ({100 * r['share']:.1f}%)",
        "",
        "| phase | by | seconds | share |",
        "|---|---|---:|---:|",
    ]
    for phase, (by, seconds) in r["phases"].items():
        lines.append(f"| {phase} | {by} | {seconds:.3f} | {100 * seconds / r['total']:.1f}% |")
    return [*lines, ""]
