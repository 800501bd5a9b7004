"""Regenerates examples/validation/ (`make validation`): the op matrix on this machine's
backends; the execution-provider table and op audit of ResNet-50 and of a GPT-2-style decoder
(transformers, from a config), and which of ONNX Runtime's opt=all optimizers turns on
ResNet-50's drift (`--bisect`); both models with seeded random weights, exported with
torch.onnx.export (dynamo). Each verb is run as a user runs it, through the `layerdiff` command;
exit code 1 (a finding) is an answer, not a failure of this script."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from layerdiff.torch._export import export_onnx

OUT = Path(__file__).resolve().parent.parent / "examples" / "validation"


def resnet50():
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.resnet50(weights=None).eval(), (torch.randn(1, 3, 224, 224),)


class _Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, use_cache=False).logits


def gpt2_decoder():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=8192, n_embd=256, n_layer=4, n_head=4, n_positions=128,
        bos_token_id=0, eos_token_id=0, attn_implementation="eager",
    )  # fmt: skip
    return _Logits(GPT2LMHeadModel(config)).eval(), (torch.randint(0, 8192, (1, 64)),)


def layerdiff(*args: str) -> None:
    print("$ layerdiff", " ".join(args), flush=True)
    done = subprocess.run([sys.executable, "-m", "layerdiff", *args])
    if done.returncode not in (0, 1):
        sys.exit(f"layerdiff {args[0]} failed with exit code {done.returncode}")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        for name, build, int_range in (
            ("resnet50", resnet50, None),
            ("gpt2_decoder", gpt2_decoder, "0,8191"),
        ):
            model, inputs = build()
            path = Path(work) / f"{name}.onnx"
            export_onnx(model, inputs, path, exporter="dynamo")
            extra = ["--int-range", int_range] if int_range else []
            for verb in ("providers", "audit"):
                layerdiff(
                    verb, str(path), *extra, "--quiet",
                    "--json", str(OUT / f"{name}.{verb}.json"),
                    "--markdown", str(OUT / f"{name}.{verb}.md"),
                )  # fmt: skip
            if name != "resnet50":
                continue
            # Which of ONNX Runtime's optimizers turns on the drift its opt=all cell shows.
            layerdiff(
                "onnx", str(path), *extra, "--quiet", "--target", "ort:opt=all", "--bisect",
                "--json", str(OUT / f"{name}.bisect.json"),
                "--markdown", str(OUT / f"{name}.bisect.md"),
            )  # fmt: skip
    layerdiff("ops", "--quiet", "--out", str(OUT / "ops"))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
