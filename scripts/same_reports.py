"""Shows that a change left the reports as they were: runs the same ONNX comparisons with two
`layerdiff` binaries (the build before a change and the build after) and compares every report
they write, byte for byte, leaving out only what differs from run to run (the machine, and
timings where asked for).

    python scripts/same_reports.py BEFORE AFTER [--folder DIR] [--quick]

The corpus: ResNet-18 (dynamo export) on ONNX Runtime and on tract, optimized by ONNX Runtime
(`opt=all`), in segments (`--max-memory 40M`), and against itself with a weight edited, an
attribute edited and one node in float16; ResNet-50 (the legacy exporter) against its float16
export (ResNet-18's with `--quick`); `providers` and `audit` on ResNet-18. Each run writes
JSON, Markdown, HTML and SVG (`--out`) and prints its summary; all are compared. Models are
built once into `--folder` (random weights, seed 0) and reused.
Exit code 0 when every report is the same, 1 with the differences listed otherwise."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benches"))
sys.path.insert(0, str(ROOT / "tests"))

# What differs between two runs of one binary: where it ran and how long each part took.
VOLATILE = ("machine", "timings")


def corpus(folder: Path, quick: bool) -> dict[str, list[str]]:
    """Report name → the `layerdiff` arguments that write it (before `--out`)."""
    import faults
    from own_work import onnx_files

    big = "resnet18" if quick else "resnet50"
    names = ["resnet18", f"{big}_fp32", f"{big}_fp16"]
    if not all((folder / f"{n}.onnx").exists() for n in names):
        onnx_files(folder, quick)
    files = {n: str(folder / f"{n}.onnx") for n in names}
    r18 = files["resnet18"]
    edited = {
        "weight": faults.perturb_weight(
            r18, folder / "r18_weight.onnx", _output(r18, "Conv", 3), 0.05
        ),
        "attribute": faults.set_attribute(
            r18, folder / "r18_attribute.onnx", _output(r18, "Gemm", 0), "alpha", 1.1
        ),
        "fp16_node": faults.in_float16(r18, folder / "r18_fp16_node.onnx", _output(r18, "Conv", 7)),
    }
    runs = {
        "r18_ort": ["onnx", r18, "--target", "ort"],
        "r18_tract": ["onnx", r18, "--target", "tract"],
        "r18_opt_all": ["onnx", r18, "--target", "ort:opt=all"],
        "r18_segments": ["onnx", r18, "--target", "ort", "--max-memory", "40M"],
        f"{big}_fp16": ["onnx", files[f"{big}_fp32"], "--vs", files[f"{big}_fp16"]],
        "r18_providers": ["providers", r18],
        "r18_audit": ["audit", r18],
    }
    for name, path in edited.items():
        runs[f"r18_{name}"] = ["onnx", r18, "--vs", str(path)]
    return runs


def _output(path: str, op: str, index: int) -> str:
    """The output value of the model's `index`-th node of type `op`."""
    import onnx

    return [n for n in onnx.load(path).graph.node if n.op_type == op][index].output[0]


def scrub(path: Path) -> bytes:
    """A report's bytes, less what differs between runs (JSON: the volatile keys; the other
    formats: lines that name the machine or a timing)."""
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        if isinstance(data, dict):
            for key in VOLATILE:
                data.pop(key, None)
        return json.dumps(data, indent=1, sort_keys=True).encode()
    lines = path.read_bytes().splitlines(keepends=True)
    return b"".join(
        line for line in lines if not any(w.encode() in line.lower() for w in ("machine", "cpu:"))
    )


def run(binary: str, args: list[str], out: Path) -> int:
    """Runs `binary` with `args`, its reports into `out`, and keeps what it printed (the text
    summary) there too, as printed.txt."""
    done = subprocess.run([binary, *args, "--seed", "0", "--out", str(out)],
                          capture_output=True, text=True, timeout=3600)  # fmt: skip
    if done.returncode not in (0, 1):
        sys.exit(f"{binary} {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "printed.txt").write_text(done.stdout)
    return done.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--folder", type=Path, default=Path(tempfile.gettempdir()) / "same_reports")
    parser.add_argument("--quick", action="store_true", help="ResNet-18 in place of ResNet-50")
    a = parser.parse_args()
    a.folder.mkdir(parents=True, exist_ok=True)
    differ = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in corpus(a.folder, a.quick).items():
            # both write to the same folder (the reports name it), then it is moved aside
            here = Path(tmp) / "run" / name
            outs = [Path(tmp) / side / name for side in ("before", "after")]
            codes = []
            for binary, out in zip((a.before, a.after), outs, strict=True):
                codes.append(run(binary, args, here))
                out.parent.mkdir(exist_ok=True)
                here.rename(out)
            if codes[0] != codes[1]:
                differ.append(f"{name}: exit code {codes[0]} → {codes[1]}")
            written = [sorted(p.relative_to(o) for p in o.rglob("*") if p.is_file()) for o in outs]
            if written[0] != written[1]:
                differ.append(f"{name}: files {written[0]} → {written[1]}")
            for rel in written[0]:
                if rel in written[1] and scrub(outs[0] / rel) != scrub(outs[1] / rel):
                    differ.append(f"{name}: {rel} differs")
            print(f"{name}: {len(written[0])} reports, exit {codes[0]}", flush=True)
    for line in differ:
        print(line)
    print("the same" if not differ else f"{len(differ)} differences")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
