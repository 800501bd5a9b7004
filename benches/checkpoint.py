"""`make bench`, a language model larger than its memory budget: a Llama-style checkpoint of
1.1B parameters (random weights from a config, stored in bfloat16 as checkpoints ship, saved once
under target/bench with its ONNX export) compared by `layerdiff torch FOLDER --onnx FILE
--max-memory 512M`, held one module at a time, and by `layerdiff torch FOLDER --target
torch:bf16` (every PyTorch side held so); beside them, ONNX Runtime running the same file once,
the work no comparison can avoid. Peak RSS and wall time of each process; the target is a peak
below 0.6× the checkpoint's float32 bytes for both comparisons."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import side_by_side

ROOT = Path(__file__).resolve().parent.parent
#: The most a streamed comparison's peak RSS may take, as a share of the weights in float32.
PEAK_SHARE = 0.6
BUDGET = "512M"
QUICK_BUDGET = "48M"  # below the quick checkpoint's 80 MB: it is held one module at a time too
# TinyLlama's shape (1.1B parameters); the quick run's is a small one of the same kind.
FULL = {"vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632,
        "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4}  # fmt: skip
QUICK = {"vocab_size": 8000, "hidden_size": 512, "intermediate_size": 1408,
         "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2}  # fmt: skip
# A 7B Llama's shape, for the estimate from the measured run.
SEVEN_B = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
           "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 32}  # fmt: skip

_MAKE = """
import sys, torch, transformers
from layerdiff.torch import export_onnx, load_checkpoint
folder, shape = sys.argv[1], dict(__import__("json").loads(sys.argv[2]))
torch.manual_seed(0)
config = transformers.LlamaConfig(**shape, max_position_embeddings=2048, tie_word_embeddings=False)
transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder + "/checkpoint")
model, inputs = load_checkpoint(folder + "/checkpoint")
export_onnx(model, inputs, folder + "/export/model.onnx", cache=False, external_data=True)
"""

_ORT = """
import sys, onnxruntime as ort
from layerdiff.torch import load_checkpoint
inputs = load_checkpoint(sys.argv[1], streams=lambda size: True)[1]
session = ort.InferenceSession(sys.argv[2], providers=["CPUExecutionProvider"])
names = [i.name for i in session.get_inputs()]
session.run(None, {n: t.numpy() for n, t in zip(names, inputs)})
"""


def parameters(shape: dict) -> int:
    """Parameters of a Llama of `shape` with its head untied."""
    h, m, v = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    kv = h * shape["num_key_value_heads"] // shape["num_attention_heads"]
    layer = 2 * h * h + 2 * h * kv + 3 * h * m + 2 * h
    return shape["num_hidden_layers"] * layer + 2 * v * h + h


def kept(quick: bool) -> Path:
    """The checkpoint and its export, made once (in a process of its own: the export holds the
    whole model) under target/bench."""
    folder = ROOT / "target" / "bench" / ("llama_quick" if quick else "llama_1.1b")
    if not (folder / "export" / "model.onnx").exists():
        (folder / "export").mkdir(parents=True, exist_ok=True)
        shape = json.dumps(QUICK if quick else FULL)
        subprocess.run([sys.executable, "-c", _MAKE, str(folder), shape], check=True)
    return folder


def measure(quick: bool) -> dict:
    folder = kept(quick)
    checkpoint, exported = folder / "checkpoint", folder / "export" / "model.onnx"
    runtime = side_by_side.timed([sys.executable, "-c", _ORT, str(checkpoint), str(exported)])
    libraries = [sys.executable, "-c", "import layerdiff.torch, transformers, onnxruntime"]
    base = side_by_side.timed(libraries)["peak"]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        run = side_by_side.timed(
            [side_by_side.LAYERDIFF, "torch", str(checkpoint), "--onnx", str(exported),
             "--max-memory", QUICK_BUDGET if quick else BUDGET, "--json", str(out), "--timings"]
        )  # fmt: skip
        report = json.loads(out.read_text())
        # the same checkpoint against itself in bfloat16: every side held one module at a time
        sides = side_by_side.timed(
            [side_by_side.LAYERDIFF, "torch", str(checkpoint), "--target", "torch:bf16",
             "--max-memory", QUICK_BUDGET if quick else BUDGET, "--json", str(out)]
        )  # fmt: skip
        bf16 = json.loads(out.read_text())["summary"]
    shape = QUICK if quick else FULL
    stderr = run["stderr"]
    found = re.search(r"ran in (\d+) segments", stderr)
    s = report["summary"]
    return {
        "shape": shape,
        "parameters": parameters(shape),
        "float32": 4 * parameters(shape),
        "streamed": "one module at a time" in stderr,
        "run": run,
        "bf16": {
            "run": sides,
            "streamed": "one module at a time" in sides["stderr"],
            "verdict": bf16["verdict"],
            "compared": bf16["layers_compared"],
            "total": bf16["layers_total"],
            "defects": len(bf16["defects"]),
        },  # fmt: skip
        "runtime": runtime,
        "segments": int(found.group(1)) if found else 1,
        "verdict": s["verdict"],
        "compared": s["layers_compared"],
        "total": s["layers_total"],
        "defects": len(s["defects"]),
        "base": base,
        "budget": QUICK_BUDGET if quick else BUDGET,
        "quick": quick,
    }


def misses(result: dict) -> list[str]:
    """The targets this run missed, in words."""
    out = []
    for what, run in (("--onnx", result), ("--target torch:bf16", result["bf16"])):
        share = run["run"]["peak"] / result["float32"]
        if not run["streamed"]:
            out.append(f"the checkpoint was not held one module at a time ({what})")
        if share >= PEAK_SHARE and not result["quick"]:  # the libraries outweigh a quick one
            out.append(
                f"the {result['parameters'] / 1e9:.1f}B checkpoint peaked at {share:.2f}× its "
                f"float32 bytes ({what}; below {PEAK_SHARE}×)"
            )
    return out


def lines(result: dict) -> list[str]:
    gb = 1e9
    run, runtime, shape = result["run"], result["runtime"], result["shape"]
    bf16 = result["bf16"]
    share = run["peak"] / result["float32"]
    layers = shape["num_hidden_layers"]
    # A 7B's estimate: the time beyond the runtime's own run grows with the parameters per
    # decoder layer; the peak beyond the libraries' with the width (the widest modules, read
    # in float32, and the segment beside them).
    worst = max(share, bf16["run"]["peak"] / result["float32"])
    judged = "met" if worst < PEAK_SHARE else "**missed**"
    if result["quick"]:
        judged = "not judged: a quick run's libraries outweigh its weights"
    seven = parameters(SEVEN_B)
    scale = seven / result["parameters"]
    wide = SEVEN_B["hidden_size"] / shape["hidden_size"]
    seconds_7b = run["seconds"] * scale
    peak_7b = result["base"] + (run["peak"] - result["base"]) * wide
    return [
        "## A checkpoint larger than its memory budget",
        "",
        f"A Llama-style checkpoint of {result['parameters'] / 1e9:.2f}B parameters "
        f"({layers} layers, width {shape['hidden_size']},",
        f"{shape['vocab_size']} tokens; random weights from seed 0, stored in bfloat16; "
        f"{result['float32'] / gb:.1f} GB in float32),",
        "compared with its ONNX export by `layerdiff torch FOLDER --onnx FILE --max-memory "
        f"{result['budget']}`:",
        "the model held one module at a time, its weights read from the safetensors files as",
        "the forward pass reaches each module (the float64 truth and the baseline the same",
        "way), ONNX Runtime in segments that load their own weights. Beside it, ONNX Runtime",
        "running the file once on the same inputs: the work no comparison can avoid.",
        "",
        "| process | peak RSS | ÷ float32 weights | wall time | result |",
        "|---|---:|---:|---:|---|",
        f"| ONNX Runtime, the file once | {runtime['peak'] / gb:.1f} GB "
        f"| {runtime['peak'] / result['float32']:.2f}× | {runtime['seconds']:.0f} s | ran |",
        f"| `layerdiff torch` | {run['peak'] / gb:.1f} GB | {share:.2f}× "
        f"| {run['seconds']:.0f} s | {result['verdict']}: {result['compared']} of "
        f"{result['total']} layers compared, {result['defects']} defects, "
        f"{result['segments']} segments |",
        f"| `layerdiff torch --target torch:bf16` | {bf16['run']['peak'] / gb:.1f} GB "
        f"| {bf16['run']['peak'] / result['float32']:.2f}× | {bf16['run']['seconds']:.0f} s "
        f"| {bf16['verdict']}: {bf16['compared']} of {bf16['total']} layers compared, "
        f"{bf16['defects']} defects |",
        "",
        "The second `layerdiff torch` row compares the checkpoint with itself in bfloat16",
        f"(`--target torch:bf16 --max-memory {result['budget']}`): the reference, the target's",
        "bfloat16 copy and the float64 truth each read a module's weights as the pass reaches",
        "it, and the weights the causes need are handed over a layer at a time.",
        "",
        f"Target: a peak below {PEAK_SHARE}× the float32 weights, every row ({judged}). The "
        "first row's peak is set "
        "by the widest",
        "modules (the embedding and the output head, read in float32; the float64 truth",
        "widens only the rows the embedding gathers and computes the head a band of rows at a",
        "time) and the budget, beside the interpreter and libraries",
        f"({result['base'] / gb:.1f} GB before any weight is read).",
        "",
        f"A 7B Llama in bfloat16 ({seven / 1e9:.1f}B parameters: {4 * seven / gb:.0f} GB in "
        f"float32, {2 * seven / gb:.0f} GB on disk,",
        f"and a float32 export of {4 * seven / gb:.0f} GB) would take here, from these figures",
        f"(the time grows with the parameters, {scale:.1f}×; the peak above the libraries'",
        f"with the width, {wide:.0f}×): about {seconds_7b / 60:.0f} minutes and a peak near "
        f"{peak_7b / gb:.1f} GB,",
        "within this machine's memory, where the model loaded whole could not fit. Its export",
        "needs the whole model at once, on a machine where it fits.",
        "",
    ]
