"""The predecessor's two-step pipeline, rebuilt for side-by-side timing (`make bench`): the
per-layer validator of ../shared/seeds/000 as it describes itself, written here from that
description. Step one exports the model with every leaf module's output as a named graph
output (the legacy exporter, opset 17, no constant folding, a clone per leaf); step two, a
second process, builds the model again, captures the leaves with forward hooks, runs ONNX
Runtime on the file (optimizations off) and writes each leaf's max/mean abs difference and the
first leaf over the tolerance (the drift origin).

    python benches/predecessor.py export MODEL FILE.onnx
    python benches/predecessor.py compare MODEL FILE.onnx REPORT.json

MODEL is a torchvision name of layerdiff's zoo or `path/to/file.py:build`, built with seed 0
as `layerdiff torch` builds it (`models.py`), so both tools see the same weights and inputs.
It runs in an environment of its own, as its README sets it up (`peers.py`): nothing of
layerdiff's is imported.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from torch import nn

TOLERANCE = 1e-4


def build(spec: str):
    from models import build as built

    torch.backends.mha.set_fastpath_enabled(False)  # the legacy exporter cannot write it
    return built(spec)


def leaves(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if n and not any(m.children())]


class NamedOutputs(nn.Module):
    """Returns the model's output and every leaf's output (cloned: an in-place op after a leaf
    would otherwise change the value the graph output names)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.names: list[str] = []
        self._seen: list[torch.Tensor] = []
        for name, leaf in leaves(model):
            leaf.register_forward_hook(self._hook(name))

    def _hook(self, name: str):
        def hook(_module, _args, out):
            if isinstance(out, torch.Tensor):
                self._seen.append(out.clone())
                self.names.append(name)

        return hook

    def forward(self, *inputs):
        self._seen, self.names = [], []
        out = self.model(*inputs)
        return (out, *self._seen)


def export(spec: str, path: str) -> None:
    model, inputs = build(spec)
    wrapped = NamedOutputs(model)
    with torch.no_grad():
        wrapped(*inputs)
    names = list(wrapped.names)
    unique = [f"{n}#{i}" for i, n in enumerate(names)]
    torch.onnx.export(
        wrapped, inputs, path, dynamo=False, opset_version=17, do_constant_folding=False,
        input_names=[f"input_{i}" for i in range(len(inputs))],
        output_names=["output", *unique],
    )  # fmt: skip


def compare(spec: str, path: str, report: str) -> None:
    import numpy as np
    import onnxruntime as ort

    model, inputs = build(spec)
    captured: list[tuple[str, np.ndarray]] = []
    for name, leaf in leaves(model):
        leaf.register_forward_hook(
            lambda _m, _a, out, name=name: captured.append((name, out.detach().clone().numpy()))
            if isinstance(out, torch.Tensor) else None
        )  # fmt: skip
    with torch.no_grad():
        model(*inputs)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feeds = {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs, strict=True)}
    outputs = session.run(None, feeds)[1:]
    layers, origin = [], None
    for (name, ours), theirs in zip(captured, outputs, strict=True):
        diff = np.abs(ours.astype(np.float64) - theirs.astype(np.float64))
        row = {"layer": name, "max_abs_diff": float(diff.max(initial=0.0)),
               "mean_abs_diff": float(diff.mean()) if diff.size else 0.0}  # fmt: skip
        if origin is None and row["max_abs_diff"] > TOLERANCE:
            origin = name
        layers.append(row)
    with open(report, "w") as f:
        json.dump({"tolerance": TOLERANCE, "drift_origin": origin, "layers": layers}, f, indent=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["export", "compare"])
    parser.add_argument("model")
    parser.add_argument("onnx")
    parser.add_argument("report", nargs="?")
    args = parser.parse_args()
    if args.step == "export":
        export(args.model, args.onnx)
    else:
        compare(args.model, args.onnx, args.report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
