"""Regenerates examples/reports/ (`make reports`): every built-in model (`layerdiff zoo`) against
its ONNX export at float32, against the export converted to float16, and against PyTorch in
bfloat16 (ONNX Runtime has no bfloat16 conversion), each with seeded random weights and inputs;
the batch axis (1, 8, 32) of ResNet-50 and of the GPT-2-style decoder; the Keras models on each
of `layerdiff keras`'s paths (tf2onnx on ONNX Runtime, XLA, TFLite float16 and int8, the PyTorch
twin); and the summary table in docs/results.md, between its `reports` markers. Each run is
the `layerdiff` command as a user runs it; exit code 1 (a defect found) is an answer, not a
failure of this script.

`python scripts/reports.py t5 gpt2` regenerates those models' reports only (`keras`: the Keras
ones); `--table` only rewrites that table from the committed JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from validation_examples import layerdiff

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "examples" / "reports"
RESULTS = ROOT / "docs" / "results.md"
START, END = "<!-- reports:start -->", "<!-- reports:end -->"
PRECISIONS = {
    "fp32": [],
    "fp16": ["--dtype", "fp16"],
    "bf16": ["--target", "torch", "--dtype", "bf16"],
}
AXES = {"resnet50": "1,8,32", "gpt2": "1,8,32"}
# `layerdiff keras` on each of its paths: report name → arguments.
KERAS = {
    "keras_mobilenet_v2_onnx": ["keras_mobilenet_v2"],
    "keras_mobilenet_v2_xla": ["keras_mobilenet_v2", "--target", "xla"],
    "keras_mobilenet_v2_tflite_fp16": ["keras_mobilenet_v2", "--target", "tflite:fp16"],
    "keras_mobilenet_v2_tflite_int8": ["keras_mobilenet_v2", "--target", "tflite:int8"],
    "keras_encoder_tflite_int8": ["keras_encoder", "--target", "tflite:int8"],
    "keras_cnn_tflite_dynamic": ["keras_cnn", "--target", "tflite:dynamic"],
    "keras_cnn_torch_twin": ["keras_cnn", "--torch", "twin"],
    "keras_encoder_torch_twin": ["keras_encoder", "--torch", "twin"],
}


def models() -> list[str]:
    from layerdiff.torch.models import ZOO

    return list(ZOO)


def run_keras() -> None:
    """Each Keras path, as `layerdiff keras` runs it (TensorFlow in its own process)."""
    for stem, args in KERAS.items():
        path = OUT / stem
        layerdiff(
            "keras", *args, "--seed", "0", "-q",
            "--json", f"{path}.json", "--markdown", f"{path}.md",
            "--html", f"{path}.html", "--svg", f"{path}.svg",
        )  # fmt: skip
        Path(f"{path}.inputs.safetensors").unlink(missing_ok=True)


def run_all(only: list[str]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    if not only or "keras" in only:
        run_keras()
    only = [name for name in only if name != "keras"] if only else only
    if only == [] and sys.argv[1:]:
        return
    for name in only or models():
        for precision, flags in PRECISIONS.items():
            stem = OUT / f"{name}_{precision}"
            layerdiff(
                "torch", name, "--seed", "0", *flags, "-q",
                "--json", f"{stem}.json", "--markdown", f"{stem}.md",
                "--html", f"{stem}.html", "--svg", f"{stem}.svg",
            )  # fmt: skip
            # The inputs follow from the seed; one set is kept (`make pipeline`'s).
            if stem.name != "resnet18_fp32":
                Path(f"{stem}.inputs.safetensors").unlink(missing_ok=True)
    for name, sizes in AXES.items():
        if only and name not in only:
            continue
        stem = OUT / f"{name}_batch"
        layerdiff(
            "torch", name, "--seed", "0", "--batch-sizes", sizes, "-q",
            "--json", f"{stem}.json", "--markdown", f"{stem}.md",
        )  # fmt: skip


def _sci(v) -> str:
    return "—" if v is None else f"{v:.2e}"


def _row(path: Path, name: str, label: str, r: dict) -> str:
    """One report's row: its model (linked), `label`, and its summary's numbers."""
    s = r["summary"]
    worst = s["worst"]["max_abs_diff"]
    worst = f"{_sci(worst['value'])} `{worst['layer']}`" if worst else "—"
    origin = s["drift_origin"]
    cause = next((x["cause"] for x in r["layers"] if x["name"] == origin), None)
    return (
        f"| [{name}](../{path.relative_to(ROOT).with_suffix('.md')}) | {label} "
        f"| {s['layers_total']} | {s['layers_compared']} | {s['layers_exceeding']} "
        f"| {s['verdict'].replace('_', ' ')} | {len(s['defects'])} "
        f"| {worst} | {f'`{origin}`' if origin else 'none'} | {cause or '—'} |"
    )


def table(folder: Path = OUT) -> str:
    """The summary table of docs/results.md, from the committed reports (links from docs/)."""
    rows = [
        "| model | precision | layers | compared | exceeding | verdict | defects "
        "| worst (max abs diff) | drift origin | cause | keep in float32: checked |",
        "|---|---|---:|---:|---:|---|---:|---|---|---|---|",
    ]
    for name in models():
        for precision in PRECISIONS:
            path = folder / f"{name}_{precision}.json"
            if not path.exists():
                continue
            r = json.loads(path.read_text())
            check = (r.get("keep_float32") or {}).get("check")
            kept = "—"
            if check:
                kept = check["verdict"].split(":")[0].replace("keeping ", "")
            rows.append(f"{_row(path, name, precision, r)} {kept} |")
    rows += [
        "\n| Keras model | target | layers | compared | exceeding | verdict | defects "
        "| worst (max abs diff) | drift origin | cause |",
        "|---|---|---:|---:|---:|---|---:|---|---|---|",
    ]
    for stem, args in KERAS.items():
        path = folder / f"{stem}.json"
        if path.exists():
            target = " ".join(args[1:]) or "--target ort (tf2onnx)"
            rows.append(_row(path, args[0], f"`{target}`", json.loads(path.read_text())))
    for name in AXES:
        path = folder / f"{name}_batch.json"
        if not path.exists():
            continue
        axis = json.loads(path.read_text())
        points = ", ".join(
            f"{p['point']}: {p['verdict'].replace('_', ' ')} ({_sci(p['output_max_abs_diff'])})"
            for p in axis["points"]
        )
        rows.append(
            f"\nBatch axis of [{name}](../{path.relative_to(ROOT).with_suffix('.md')}), "
            f"output max abs diff per batch size: {points}."
        )
    return "\n".join(rows) + "\n"


def write_table() -> None:
    text = RESULTS.read_text()
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    RESULTS.write_text(f"{head}{START}\n{table()}{END}{tail}")
    print(f"wrote the table in {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    if "--table" not in sys.argv:
        run_all([a for a in sys.argv[1:] if not a.startswith("-")])
    write_table()
