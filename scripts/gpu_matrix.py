"""layerdiff on a GPU machine: ONNX Runtime's CUDA provider against its CPU provider, and against
itself, on models built here from a seed (nothing downloaded). What it measures is what docs/gpu.md
records: the provider options that ran, where nodes ran, TF32 on and off, segmented against whole
runs, and how far the CUDA provider disagrees with itself from one session to the next.

    python scripts/gpu_matrix.py --layerdiff target/release/layerdiff \\
        --ort-lib PATH/libonnxruntime.so.1.31.1 --out DIR

Needs torch, torchvision and onnx, the onnxruntime-gpu library (`--ort-lib`) and the CUDA 13 and
cuDNN 9 libraries on LD_LIBRARY_PATH (PyTorch's wheels ship them under site-packages/nvidia).
Writes each run's JSON report and console output to DIR, and DIR/summary.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

IR_VERSION = 10  # ONNX Runtime 1.31 refuses the onnx 1.23 wheel's IR 14.


class LayerNormLinear(nn.Module):
    """LayerNormalization → MatMul → Add: the float16 case where one rounding step at |x|≈300
    was once called a kernel bug."""

    def __init__(self, width: int = 1152):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        return self.proj(self.norm(x)) * 16.0


def export(model: nn.Module, example: torch.Tensor, path: Path) -> Path:
    import onnx

    torch.backends.mha.set_fastpath_enabled(False)  # the fused kernel has no ONNX export

    model.eval()
    with torch.no_grad():
        torch.onnx.export(model, (example,), str(path), dynamo=False, opset_version=17)
    proto = onnx.load(str(path))
    proto.ir_version = min(proto.ir_version, IR_VERSION)
    onnx.save(proto, str(path))
    return path


def build_models(folder: Path, which: list[str]) -> dict[str, Path]:
    import torchvision

    torch.manual_seed(0)
    models = {}
    if "resnet50" in which:
        net = torchvision.models.resnet50(weights=None)
        x = torch.randn(1, 3, 224, 224)
        models["resnet50"] = export(net, x, folder / "resnet50.onnx")
        models["resnet50_fp16"] = export(net.half(), x.half(), folder / "resnet50_fp16.onnx")
    if "vit_b_16" in which:
        net = torchvision.models.vit_b_16(weights=None)
        models["vit_b_16"] = export(net, torch.randn(1, 3, 224, 224), folder / "vit_b_16.onnx")
    if "ln_linear" in which:
        net = LayerNormLinear()
        x = torch.randn(2, 1024, 1152)
        models["ln_linear"] = export(net, x, folder / "ln_linear.onnx")
        models["ln_linear_fp16"] = export(net.half(), x.half(), folder / "ln_linear_fp16.onnx")
    return models


def run(layerdiff: str, name: str, args: list[str], out: Path, env: dict) -> dict:
    """One `layerdiff onnx` run; its report is out/NAME.json, its console output out/NAME.txt."""
    report = out / f"{name}.json"
    command = [layerdiff, "onnx", *args, "--json", str(report), "--timings"]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    (out / f"{name}.txt").write_text(
        " ".join(command)
        + f"\n# exit {done.returncode}, {wall:.1f} s\n"
        + done.stdout
        + done.stderr
    )
    print(f"{name}: exit {done.returncode}, {wall:.1f} s", flush=True)
    result = {"name": name, "exit": done.returncode, "wall_s": wall}
    if report.exists():
        result["report"] = json.loads(report.read_text())
    else:
        result["error"] = (done.stderr or done.stdout).strip().splitlines()[-1:]
    return result


def layer_facts(report: dict) -> dict:
    layers = report["layers"]
    exceeding = [layer for layer in layers if layer.get("exceeds_tol")]
    causes: dict[str, int] = {}
    for layer in exceeding:
        cause = layer.get("cause") or "-"
        causes[cause] = causes.get(cause, 0) + 1
    diffs = [layer["accumulated"]["max_abs_diff"] for layer in layers if layer.get("accumulated")]
    return {
        "origin": report["summary"].get("drift_origin"),
        "exceeding": len(exceeding),
        "compared": report["summary"].get("layers_compared"),
        "causes": causes,
        "own_share": own_share(report),
        "max_abs": max(diffs, default=0.0),
    }


def own_share(report: dict) -> float:
    """layerdiff's own share of the timed phases (the runtimes' share is the rest)."""
    timings = report.get("timings") or []
    total = sum(t["seconds"] for t in timings)
    own = sum(t["seconds"] for t in timings if t["by"] == "layerdiff")
    return own / total if total else 0.0


def reports_agree(a: dict, b: dict) -> str:
    """Whether two reports hold the same layers with the same numbers."""
    la, lb = a["layers"], b["layers"]
    if la == lb:
        return "identical layers"
    differ = [x["name"] for x, y in zip(la, lb, strict=True) if x != y]
    return f"{len(differ)} of {len(la)} layers differ (first: {differ[:3]})"


def plan(models: dict[str, Path]) -> list[tuple[str, list[str]]]:
    """(run name, arguments after `layerdiff onnx`) for every run."""
    cuda, cpu = "ort:cuda", ["--reference", "ort"]
    runs = []
    for name, path in models.items():
        if name == "resnet50_fp16":
            continue  # compared with resnet50 by --vs
        m = str(path)
        if name == "resnet50":
            half = str(models["resnet50_fp16"])
            runs += [
                ("resnet50_vs_fp16.ort", [m, "--vs", half, *cpu, "--target", "ort"]),
                ("resnet50_vs_fp16.ort_cuda", [m, "--vs", half, *cpu, "--target", cuda]),
            ]
        heuristic = f"{cuda}:cudnn_conv_algo_search=HEURISTIC"
        runs += [
            (f"{name}.cpu_vs_cuda", [m, *cpu, "--target", cuda]),
            (f"{name}.cpu_vs_cuda_tf32_off", [m, *cpu, "--target", f"{cuda}:use_tf32=0"]),
            (f"{name}.cpu_vs_cuda_float64", [m, *cpu, "--target", cuda, "--float64"]),
            (
                f"{name}.cpu_vs_cuda_tf32_off_float64",
                [m, *cpu, "--target", f"{cuda}:use_tf32=0", "--float64"],
            ),
            (f"{name}.cpu_vs_cuda_auto", [m, *cpu, "--target", cuda, "--tolerance", "auto"]),
            (f"{name}.cuda_vs_cuda", [m, "--reference", cuda, "--target", cuda]),
            (
                f"{name}.cuda_vs_cuda_heuristic",
                [m, "--reference", heuristic, "--target", heuristic],
            ),
            (f"{name}.cpu_vs_cuda_64M", [m, *cpu, "--target", cuda, "--max-memory", "64M"]),
            (
                f"{name}.cpu_vs_cuda_tf32_off_default_conv_float64",
                [
                    m,
                    *cpu,
                    "--target",
                    f"{cuda}:use_tf32=0:cudnn_conv_algo_search=DEFAULT",
                    "--float64",
                ],
            ),
        ]
    return runs


def summary(results: list[dict], models: dict[str, Path]) -> str:
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    lines = [
        "# layerdiff on a GPU: raw results",
        "",
        f"- python {platform.python_version()}, torch {torch.__version__}, GPU {gpu}",
        f"- nvidia-smi: {smi}",
        f"- CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} logical cores",
        "",
        "| run | exit | wall s | own share | origin | exceeding / compared | causes | max abs "
        "| target detail |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "report" not in r:
            lines.append(f"| {r['name']} | {r['exit']} | {r['wall_s']:.1f} | | {r.get('error')} |")
            continue
        f = layer_facts(r["report"])
        target = r["report"]["target"]
        detail = target["detail"]
        if target.get("placement"):
            detail += " · " + ", ".join(
                f"{p['nodes']} on {p['provider']}" for p in target["placement"]
            )
        lines.append(
            f"| {r['name']} | {r['exit']} | {r['wall_s']:.1f} | {f['own_share']:.0%} "
            f"| {f['origin']} | {f['exceeding']} / {f['compared']} | {f['causes']} "
            f"| {f['max_abs']:.3g} | {detail} |"
        )
    lines += ["", "## Segmented (64M) against whole", ""]
    by_name = {r["name"]: r for r in results}
    for name in models:
        whole, seg = by_name.get(f"{name}.cpu_vs_cuda"), by_name.get(f"{name}.cpu_vs_cuda_64M")
        if whole and seg and "report" in whole and "report" in seg:
            warnings = seg["report"]["summary"].get("warnings")
            agree = reports_agree(whole["report"], seg["report"])
            lines.append(f"- {name}: {agree}; warnings: {warnings}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layerdiff", required=True)
    parser.add_argument("--ort-lib", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--models", default="resnet50,ln_linear,vit_b_16")
    parser.add_argument("--runs", default="", help="only runs whose name contains one of these")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out.parent / f"{args.out.name}_models"
    work.mkdir(exist_ok=True)
    env = dict(os.environ, LAYERDIFF_ORT_LIB=args.ort_lib)
    started = time.perf_counter()
    models = build_models(work, args.models.split(","))
    print(f"models exported in {time.perf_counter() - started:.0f} s", flush=True)
    wanted = [w for w in args.runs.split(",") if w]
    chosen = [(n, r) for n, r in plan(models) if not wanted or any(w in n for w in wanted)]
    results = [run(args.layerdiff, name, runs, args.out, env) for name, runs in chosen]
    text = summary(results, models)
    (args.out / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
