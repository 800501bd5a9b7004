"""The work no per-layer comparison of a PyTorch model with its ONNX export can avoid, timed in
one process (`make bench` sets it beside `layerdiff torch`): start-up and imports, building the
model, the ONNX export (dynamo, as `layerdiff torch` exports by default), one PyTorch forward
pass, and one ONNX Runtime run of the file (session included). Prints JSON: the seconds of each
step and the model's float32 bytes.

    python benches/limit.py MODEL [--no-export FILE.onnx]

MODEL is a torchvision name of layerdiff's zoo or `path/to/file.py:build`, built with seed 0 as
`layerdiff torch` builds it (`models.py`, which imports nothing of layerdiff's: its import is
no part of the limit). With `--no-export` the given file is run instead of exporting (a second
run, whose export is kept).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

START = time.perf_counter()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--no-export", metavar="FILE")
    args = parser.parse_args()
    steps: dict[str, float] = {}
    last = [START]

    def lap(step: str) -> None:
        now = time.perf_counter()
        steps[step] = now - last[0]
        last[0] = now

    import numpy as np
    import onnxruntime as ort
    import torch
    from models import build

    lap("start-up and imports")
    model, inputs = build(args.model)
    lap("building the model")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.no_export) if args.no_export else Path(tmp) / "model.onnx"
        if not args.no_export:
            torch.onnx.export(model, inputs, str(path), dynamo=True, verbose=False)
            lap("ONNX export")
        with torch.no_grad():
            model(*inputs)
        lap("one PyTorch forward pass")
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        feeds = {i.name: np.asarray(t) for i, t in zip(session.get_inputs(), inputs, strict=True)}
        session.run(None, feeds)
        lap("one ONNX Runtime run")
    weights = sum(p.numel() * 4 for p in model.parameters())
    print(json.dumps({"steps": steps, "float32_bytes": weights}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
