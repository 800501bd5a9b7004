"""A regression hunt between runtime releases, as a vendor's CI runs one: every model of a
small zoo on the ONNX Runtime and the OpenVINO layerdiff loads against earlier releases
(`ort:lib=`, `openvino:lib=`, fetched from PyPI by `layerdiff.releases`), each difference named
at the nodes whose own computation changed. ONNX Runtime with graph optimizations off and at
`all`; OpenVINO at its float32 precision and at its default on this machine.

    python scripts/release_hunt.py [--releases 1.30.0,1.22.1,1.20.1] [--openvino 2026.4.0]
                                   [--folder DIR] [--out docs/release_hunt.md]

The zoo: ResNet-18 (dynamo export), ResNet-50 (the legacy exporter, float32 and float16) and
ViT-B/16 (dynamo export), torchvision with random weights, seed 0, and a Llama-style decoder
from a transformers config (tests/builders/zoo.py, dynamo export). The page it writes names the
machine: kernels are picked per CPU, so another machine may see other differences."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from collections import defaultdict
from datetime import date
from pathlib import Path

import onnxruntime
import openvino

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benches"))

LAYERDIFF = str(Path(sys.executable).parent / "layerdiff")


def zoo(folder: Path) -> dict[str, Path]:
    """The models, built once into `folder`."""
    import torch
    import torchvision
    from layerdiff.torch import export_onnx
    from own_work import onnx_files

    names = ["resnet18", "resnet50_fp32", "resnet50_fp16"]
    if not all((folder / f"{n}.onnx").exists() for n in names):
        onnx_files(folder, quick=False)
    files = {n: folder / f"{n}.onnx" for n in names}
    vit = folder / "vit_b_16.onnx"
    if not vit.exists():
        torch.manual_seed(0)
        model = torchvision.models.vit_b_16(weights=None).eval()
        export_onnx(model, (torch.randn(1, 3, 224, 224),), vit, exporter="dynamo")
    files["vit_b_16"] = vit
    llama = folder / "llama.onnx"
    if not llama.exists():
        sys.path.insert(0, str(ROOT / "tests"))
        from builders.zoo import llama as build_llama

        torch.manual_seed(0)
        model, inputs = build_llama()
        export_onnx(model.eval(), inputs, llama, exporter="dynamo")
    files["llama"] = llama
    return files


def run(model: Path, reference: str, target: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        done = subprocess.run(
            [LAYERDIFF, "onnx", str(model), "--reference", reference, "--target", target,
             "--quiet", "--json", str(out)],
            capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        if done.returncode not in (0, 1) or not out.exists():
            raise RuntimeError(f"{model.name} {target}: {done.stderr.strip()[-1500:]}")
        return json.loads(out.read_text())


def changed(report: dict) -> str:
    """The layers whose value and own computation changed (re-run alone on the same inputs),
    by op: `LayerNormalization ×25 (up to 2.6e-6)`; or what else moved."""
    by_op: dict[str, list[float]] = defaultdict(list)
    moved = 0
    for layer in report["layers"]:
        if layer["status"] != "compared":
            continue
        local, accumulated = layer.get("local"), layer.get("accumulated")
        if not (accumulated and accumulated["max_abs_diff"] > 0):
            continue  # the same value on both releases: nothing of its own changed in the run
        moved += 1
        if local and local["max_abs_diff"] > 0:
            op = (layer.get("location") or {}).get("op") or "?"
            by_op[op].append(local["max_abs_diff"])
    if by_op:
        parts = [f"{op} ×{len(d)} (up to {max(d):.1e})" for op, d in sorted(by_op.items())]
        return ", ".join(parts)
    return f"none, {moved} values moved" if moved else "no layer changed"


def row(model: str, release: str, opt: str, report: dict, current: int | None = None) -> str:
    s = report["summary"]
    worst = max(
        (layer["accumulated"]["max_abs_diff"] for layer in report["layers"]
         if layer["status"] == "compared" and layer.get("accumulated")),
        default=0.0,
    )  # fmt: skip
    kept = f"{s['layers_compared']}" + (f" (this release: {current})" if current else "")
    return (f"| {model} | {release} | {opt} | {s['verdict']} | {kept} | {worst:.1e} "
            f"| {changed(report)} |")  # fmt: skip


def main() -> int:
    from layerdiff import releases

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--releases", default="1.30.0,1.22.1,1.20.1")
    parser.add_argument("--openvino", default="2026.4.0,2025.4.1", help="earlier OpenVINO releases")
    parser.add_argument("--folder", type=Path, default=ROOT / "target" / "release_hunt")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "release_hunt.md")
    args = parser.parse_args()
    args.folder.mkdir(parents=True, exist_ok=True)
    files = zoo(args.folder)
    libraries = {v: releases.fetch("onnxruntime", v) for v in args.releases.split(",")}
    rows = []
    for name, path in files.items():
        # how many values the optimized graph of the release layerdiff loads keeps
        kept_now = run(path, "ort:opt=all", "ort:opt=all")["summary"]["layers_compared"]
        for version, library in libraries.items():
            for opt in ("disable", "all"):
                level = "" if opt == "disable" else ":opt=all"
                report = run(path, f"ort{level}", f"ort{level}:lib={library}")
                rows.append(row(name, version, opt, report, kept_now if opt == "all" else None))
                print(rows[-1], file=sys.stderr)
    ov_libraries = {v: releases.fetch("openvino", v) for v in args.openvino.split(",")}
    ov_rows = []
    for name, path in files.items():
        for version, library in ov_libraries.items():
            for precision in ("f32", "default"):
                hint = "" if precision == "default" else f":precision={precision}"
                report = run(path, f"openvino{hint}", f"openvino{hint}:lib={library}")
                resolved = report["target"]["options"]["INFERENCE_PRECISION_HINT"]
                label = precision if precision != "default" else f"default ({resolved})"
                ov_rows.append(row(name, version, label, report))
                print(ov_rows[-1], file=sys.stderr)
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())  # fmt: skip
    flags = Path("/proc/cpuinfo").read_text()
    isa = "AVX-512" if " avx512f " in flags else "AVX2" if " avx2 " in flags else "no AVX2"
    page = [
        "# Runtime releases against each other",
        "",
        f"Written by `python scripts/release_hunt.py` on {date.today().isoformat()}. Machine: "
        f"{cpu}, {isa}, {os.cpu_count()} cores; kernels are picked per CPU, so another machine "
        "may see other differences. How to run such a hunt: "
        "[onnx.md](onnx.md#one-runtime-two-releases-ortlibpath-openvinolibpath).",
        "",
        "## ONNX Runtime",
        "",
        f"ONNX Runtime {onnxruntime.__version__} (the release layerdiff loads) as the reference, "
        "each earlier release as the target (`--target ort:lib=…`, fetched by `python -m "
        "layerdiff.releases`), graph optimizations off and at `all` on both sides.",
        "",
        "*Own computation changed*: the layers whose value differs when each side re-runs the "
        "layer alone on the same inputs (the local error), by op: where a kernel changed "
        "between the releases. *Values compared* at `all`: the values the target release's "
        "optimized graph keeps, beside how many the reference release's own keeps: a release "
        "that fuses less keeps more.",
        "",
        "| model | release | optimizations | verdict | values compared | largest difference "
        "| own computation changed |",
        "|---|---|---|---|---:|---:|---|",
        *rows,
        "",
        "## OpenVINO",
        "",
        f"OpenVINO {openvino.__version__} (the release layerdiff loads) as the reference, each "
        "earlier release as the target (`--target openvino:lib=…`, its `libopenvino_c` fetched "
        "by `python -m layerdiff.releases openvino==VERSION`), at the float32 precision hint and "
        "at the plugin's default, which this machine resolves to the precision in brackets. "
        "Every value compared is an output of the graph both releases compile (see "
        "[onnx.md](onnx.md#a-target-that-cannot-show-its-layers---opaque) for what that changes).",
        "",
        "| model | release | precision | verdict | values compared | largest difference "
        "| own computation changed |",
        "|---|---|---|---|---:|---:|---|",
        *ov_rows,
        "",
    ]
    args.out.write_text("\n".join(page))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
