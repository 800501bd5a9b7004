"""`make bench`: measures the comparator (`comparator.py`), layerdiff's own work per phase
beside Polygraphy (`own_work.py`), memory (and a checkpoint larger than its budget:
`checkpoint.py`), and whole runs beside the predecessor and the work no comparison can avoid
(`side_by_side.py`), side by side in one run, and writes docs/performance.md. Every figure in
that file comes from this run. A target missed (the constants of `own_work.py` and
`checkpoint.py`) fails it, after the file is written.

    python benches/run.py [--out docs/performance.md] [--quick] [--own-only]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# OpenBLAS's idle threads spin after each call and, on a two-core machine, take a core from the
# comparator timed next: numpy in this process runs BLAS on one thread (the bandwidth probe runs
# one call per core itself). The runs this script starts see the environment as it was.
_BLAS_THREADS = os.environ.get("OPENBLAS_NUM_THREADS")
os.environ["OPENBLAS_NUM_THREADS"] = "1"

import checkpoint  # noqa: E402
import comparator  # noqa: E402
import own_work  # noqa: E402
import side_by_side  # noqa: E402
import warm  # noqa: E402

if _BLAS_THREADS is None:
    del os.environ["OPENBLAS_NUM_THREADS"]
else:
    os.environ["OPENBLAS_NUM_THREADS"] = _BLAS_THREADS

ROOT = Path(__file__).resolve().parent.parent
MIB = 1 << 20


# -- memory: a decoder whose values do not fit, with and without segments --------------------


def decoder_onnx(batch: int, tokens: int, folder: Path) -> Path:
    """The GPT-2-style decoder of tests/builders/decoder.py (GPT-2 small's shape, an 8192-token
    vocabulary, seed 0), exported once and kept under target/bench."""
    path = folder / f"decoder_b{batch}_t{tokens}.onnx"
    if path.exists():
        return path
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from builders.decoder import Config, build
    from layerdiff.torch import export_onnx

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model, inputs = build(Config(batch=batch, tokens=tokens))
    model.eval()
    export_onnx(model, inputs, path, exporter="dynamo")
    return path


def decoder_builder(batch: int, tokens: int, folder: Path) -> str:
    """A builder file for `layerdiff torch` that makes the same decoder (the CLI seeds it)."""
    path = folder / f"decoder_b{batch}_t{tokens}.py"
    path.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
        "from builders.decoder import Config, build as decoder\n\n\n"
        "def build():\n"
        f"    return decoder(Config(batch={batch}, tokens={tokens}))\n"
    )
    return f"{path}:build"


def error_line(stderr: str) -> str:
    """The `error:` line of a failed run (a `hint:` may follow it), else its last line."""
    lines = stderr.strip().splitlines() or [""]
    return next((line for line in lines if line.startswith("error:")), lines[-1])


def peak_run(args: list[str], limit: int | None = None) -> dict:
    """Runs the `layerdiff` binary; its own peak RSS (`side_by_side.wait_with_peak`), wall time,
    exit code and stderr. `limit` caps its address space, so a run that cannot fit fails instead
    of pushing the machine into swap."""
    import resource

    def cap():
        if limit:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    exe = Path(sys.executable).parent / "layerdiff"
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(
            [str(exe), *args], stdout=subprocess.DEVNULL, stderr=err, preexec_fn=cap
        )
        status, peak = side_by_side.wait_with_peak(child.pid)
        child.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        stderr = err.read()
    seconds = time.perf_counter() - start
    bound = re.search(r"the whole process within about (.+?) \(", stderr)
    found = re.search(
        r"ran in (\d+) segments to hold at most about (.+?) of values(?: and weights)? at once "
        r"\((.+?)(?: of values)? in all\)", stderr,
    )  # fmt: skip
    return {
        "rc": child.returncode,
        "peak": peak,
        "seconds": seconds,
        "segments": int(found.group(1)) if found else 1,
        "held": found.group(2) if found else None,
        "values": found.group(3) if found else None,
        "process": bound.group(1) if bound else None,
        "error": error_line(stderr) if child.returncode == 2 else None,
    }


# The torch run holds more at its finest cut than the ONNX one (PyTorch's float32 and float64
# values beside ONNX Runtime's): at 4 × 1024 tokens it cannot be cut below about 4 GB at the
# last softmax, and a budget under that is refused before the run.
TORCH_BUDGET = "6G"


def memory(quick: bool) -> dict:
    """`layerdiff onnx DECODER --target ort` on a decoder that fits (whole and in segments, whose
    reports must be the same bytes) and on one whose values are over 20 GB (in segments; whole,
    under an address-space limit below this machine's memory)."""
    folder = ROOT / "target" / "bench"
    small, big = ((1, 256), (2, 512)) if quick else ((1, 1024), (6, 1024))
    limit = 20 << 30
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        fits = decoder_onnx(*small, folder)
        runs = {}
        for budget in ("1T", "1G"):
            out = Path(tmp) / f"{budget}.json"
            runs[budget] = peak_run(
                ["onnx", str(fits), "--target", "ort", "--max-memory", budget, "--json", str(out)]
            )
            runs[budget]["report"] = out.read_bytes() if out.exists() else None
        same = bool(runs["1T"]["report"]) and runs["1T"]["report"] == runs["1G"]["report"]
        values = runs["1G"]["values"]
        rows.append({**runs["1T"], "model": small, "budget": None, "values": values})
        rows.append({**runs["1G"], "model": small, "budget": "1G", "same": same})
        large = decoder_onnx(*big, folder)
        out = Path(tmp) / "big.json"
        segmented = peak_run(
            ["onnx", str(large), "--target", "ort", "--max-memory", "4G", "--json", str(out)]
        )
        rows.append({"model": big, "budget": "4G", **segmented})
        # Default settings: the budget is half the memory available when the run starts.
        out = Path(tmp) / "default.json"
        default = peak_run(["onnx", str(large), "--target", "ort", "--json", str(out)])
        rows.append({**default, "model": big, "budget": "default"})
        whole = peak_run(
            ["onnx", str(large), "--target", "ort", "--max-memory", "1T", "-q"], limit=limit
        )
        rows.append(
            {**whole, "model": big, "budget": None, "values": segmented["values"], "limited": True}
        )
        # The PyTorch side: layers streamed from the hooks into the segmented ONNX run.
        case = (1, 256) if quick else (4, 1024)
        exported, builder = decoder_onnx(*case, folder), decoder_builder(*case, folder)
        torch_runs = {}
        for budget in ("1T", TORCH_BUDGET):
            out = Path(tmp) / f"torch{budget}.json"
            torch_runs[budget] = peak_run(
                ["torch", builder, "--onnx", str(exported), "--max-memory", budget,
                 "--json", str(out)]
            )  # fmt: skip
            torch_runs[budget]["report"] = out.read_bytes() if out.exists() else None
        # Byte-identity is only a question when the whole run wrote a report.
        same = (
            torch_runs["1T"]["report"] == torch_runs[TORCH_BUDGET]["report"]
            if torch_runs["1T"]["report"]
            else None
        )
        out = Path(tmp) / "torch_default.json"
        torch_default = peak_run(["torch", builder, "--onnx", str(exported), "--json", str(out)])
        torch_rows = [
            {**torch_runs["1T"], "model": case, "budget": None},
            {**torch_runs[TORCH_BUDGET], "model": case, "budget": TORCH_BUDGET, "same": same},
            {**torch_default, "model": case, "budget": "default"},
        ]
    return {"rows": rows, "torch": torch_rows, "limit": limit}


def memory_lines(mem: dict) -> list[str]:
    gib = 1 << 30
    total = int(Path("/proc/meminfo").read_text().split()[1]) * 1024
    lines = [
        "## Memory",
        "",
        "`layerdiff onnx DECODER --target ort --max-memory SIZE` on the GPT-2-style decoder of",
        "`tests/builders/decoder.py` (12 layers, 12 heads, width 768, 1024 tokens, random",
        "weights): every value of the graph is compared, attention scores included. *Values* is",
        "what both sides produce in all, from the graph's declared shapes. Peak RSS is the",
        f"process's own (its VmHWM), on this machine's {total / gib:.0f} GB. Without",
        "`--max-memory` (*default*), the whole process is kept within half the memory it could",
        "use when the run is planned (what is available, plus what it already holds); its values",
        "get what is left once what it holds and a runtime's copy of the weights are counted. A",
        "default run's peak RSS is set against that bound in the last column.",
        "",
        "| decoder | values (both sides) | --max-memory | segments | peak RSS | wall time "
        "| result |",
        "|---|---:|---|---:|---:|---:|---|",
    ]
    lines += [memory_row(row, mem["limit"]) for row in mem["rows"]]
    lines += [
        "",
        "A whole run holds every value of both sides at once, plus the runtime's buffers; a",
        "segmented run holds the values entering a segment and those it produces, and drops each",
        "value after its last reader (or the last local re-run fed from it).",
        "",
        "`layerdiff torch DECODER --onnx EXPORTED --max-memory SIZE` on the same decoder: the",
        "layers are listed in one forward pass, then streamed from the forward hooks (with the",
        "float64 run in lockstep, each module's weights widened while it runs) into a segmented",
        "ONNX Runtime run. *Values* is what our copies of PyTorch's layers (with their float64",
        "values) and ONNX Runtime's values take in all. The peak includes the model's weights",
        "and PyTorch's own activations, which the budget does not cover.",
        "",
        "| decoder | values | --max-memory | segments | peak RSS | wall time | result |",
        "|---|---:|---|---:|---:|---:|---|",
    ]
    values = next((row["values"] for row in mem["torch"] if row["values"]), None)
    lines += [memory_row({**row, "values": values}, mem["limit"]) for row in mem["torch"]]
    lines.append("")
    return lines


def size(text: str) -> float:
    """Bytes of a size as layerdiff prints it (`11.0 GB`, `512.0 MB`: powers of 1024)."""
    number, unit = text.split()
    return float(number) * {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}[unit]


def budget_words(row: dict) -> str:
    """What a default run's peak RSS is against its budget: the bound on the whole process."""
    if not row["process"]:
        return " in one segment (its values fit the budget)"
    ratio = row["peak"] / size(row["process"])
    verdict = "under the budget" if ratio <= 1 else "**over the budget**"
    return f"; peak RSS {ratio:.2f}× the process's budget ({row['process']}): {verdict}"


def budget_cell(row: dict) -> str:
    """The --max-memory column: the size given, or the default and what it came to."""
    if row["budget"] == "default":
        if row["process"]:
            return f"default: {row['process']} for the process, {row['held']} for values"
        return "default"
    return row["budget"] or "none (whole graph)"


def memory_row(row: dict, limit: int) -> str:
    """One run of a memory table."""
    gib = 1 << 30
    batch, tokens = row["model"]
    if row["rc"] in (0, 1):
        result = "finished"
        if row.get("same") is None and "same" in row:
            result += " (the whole run did not finish: no report to compare with)"
        elif "same" in row:
            result += (
                ", report byte-identical to the whole run"
                if row["same"]
                else ", **report differs from the whole run**"
            )
        peak = f"{row['peak'] / gib:.1f} GB"
        if row["budget"] == "default":
            result += budget_words(row)
    elif row.get("limited"):
        result = f"failed under a {limit / gib:.0f} GB address-space limit: "
        message = (row["error"] or f"exit {row['rc']}").removeprefix("error: ")
        result += message.split(":")[0]
        peak = f"over {limit / gib:.0f} GB"
    elif row["rc"] == 2 and row["error"]:
        result = "refused before running: " + row["error"].removeprefix("error: ")
        peak = f"{row['peak'] / gib:.1f} GB"
    else:
        killed = "killed by the system, out of memory" if row["rc"] == -9 else "failed"
        result = f"{killed} (exit {row['rc']}); see the segmented run"
        peak = f"{row['peak'] / gib:.1f} GB when killed"
    return (
        f"| batch {batch} × {tokens} tokens | {row['values'] or '?'} "
        f"| {budget_cell(row)} "
        f"| {row['segments'] if row['budget'] else 1} "
        f"| {peak} | {row['seconds']:.0f} s | {result} |"
    )


def render(
    machine: str, comp: list[dict], own: dict, missed: list[str], mem: dict, ends: dict,
    large: dict, warmed: dict,
) -> str:  # fmt: skip
    lines = [
        "# Performance",
        "",
        "Written by `make bench` (`benches/run.py`); every figure below comes from one run on",
        f"this machine: {machine}. Rerun it to measure yours.",
        "",
        warm.words(warmed),
        "",
        "## The comparator",
        "",
        f"Two arrays of {comp[1]['elements']:,} elements each, compared with the full",
        "statistic set of the report (max/mean abs, max rel, RMS, cosine, ten threshold counts,",
        "NaN/Inf counts, the worst element), by `layerdiff.compare_tensors` and by a numpy",
        "implementation of the same statistics (`numpy_stats` in `benches/comparator.py`: widen to",
        "float64, one vectorized pass per statistic). The machine's read bandwidth is measured in",
        "the same run by BLAS dot products over two arrays of the same size, every core reading",
        "its share at once (`read_bandwidth`), the faster of float32 and float64, just before",
        "each timing of layerdiff: the share of read bandwidth is the median of those pairs.",
        f"Median reading **{comp[0]['bandwidth']:.1f} GB/s** (from {comp[0]['spread'][0]:.1f} to",
        f"{comp[0]['spread'][1]:.1f} in this run). Compare dtypes by their element rate: a float16",
        "pair is half the bytes of a float32 pair. Rounding to float16 or bfloat16 makes larger",
        "differences, which cross more of the report's thresholds (more counting work), so the",
        "last column sets each narrow dtype's element rate against float32 arrays holding the",
        "very same values, measured in the same run: the cost of the dtype itself.",
        "",
        "| dtype | layerdiff GB/s | G elements/s | numpy GB/s | layerdiff ÷ numpy "
        "| share of read bandwidth | element rate ÷ float32, same values |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in comp[1:]:
        same = f"{100 * row['of_float32']:.0f}%" if "of_float32" in row else "–"
        lines.append(
            f"| {row['dtype']} | {row['gbps']:.1f} | {row['gelems']:.2f} | {row['numpy_gbps']:.2f} "
            f"| {row['speedup']:.0f}× | {100 * row['of_bandwidth']:.0f}% | {same} |"
        )
    lines += ["", *own_work.lines(own, missed)]
    lines += memory_lines(mem)
    lines += checkpoint.lines(large)
    lines += side_by_side.lines(ends)
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "performance.md"))
    parser.add_argument("--quick", action="store_true", help="small arrays, one model")
    parser.add_argument(
        "--own-only", action="store_true",
        help="measure only the own-work rows and Polygraphy; print them, write nothing",
    )  # fmt: skip
    args = parser.parse_args()
    warmed = warm.touch()
    if args.own_only:
        print(warm.words(warmed))
        own = own_work.measure(args.quick)
        missed = own_work.misses(own, None)
        print("\n".join(own_work.lines(own, missed)))
        return 1 if missed else 0
    elements = (4 if args.quick else 64) * MIB  # 64 Mi float32 elements: 256 MiB a side
    comp = comparator.measure_all(elements, repeat=5)
    for row in comp[1:]:
        row["elements"] = elements
    own = own_work.measure(args.quick)
    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")), platform.processor(),
    ) if Path("/proc/cpuinfo").exists() else platform.processor()  # fmt: skip
    machine = f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.machine()}"
    mem = memory(args.quick)
    large = checkpoint.measure(args.quick)
    ends = side_by_side.measure(args.quick)
    missed = own_work.misses(own, comp) + checkpoint.misses(large) + side_by_side.misses(ends)
    text = render(machine, comp, own, missed, mem, ends, large, warmed)
    Path(args.out).write_text(text + "\n")
    print(text)
    if missed:
        print(f"\nmake bench: {len(missed)} target(s) missed:", file=sys.stderr)
        for m in missed:
            print(f"  - {m}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
