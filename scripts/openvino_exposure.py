"""What marking every value an output does to OpenVINO's compiled graph: the zoo's files
compiled for the CPU plugin as written and with every node's output a graph output, at the
default inference precision and at f32. Prints a markdown table (docs/onnx.md quotes it):
the ops the compiled graph executes, its outputs' largest difference between the two builds,
and the time per inference. Usage: python scripts/openvino_exposure.py FILE.onnx..."""

from __future__ import annotations

import sys
import time

import numpy as np
import onnx
import openvino as ov


def exposed(path: str) -> onnx.ModelProto:
    model = onnx.load(path)
    have = {o.name for o in model.graph.output}
    for node in model.graph.node:
        for out in node.output:
            if out and out not in have:
                model.graph.output.append(onnx.ValueInfoProto(name=out))
                have.add(out)
    return model


def measure(core: ov.Core, model, precision: str, feed: dict, outputs: list[str]):
    compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": precision})
    ops = len(compiled.get_runtime_model().get_ordered_ops())
    request = compiled.create_infer_request()
    request.infer(feed)
    start = time.perf_counter()
    for _ in range(5):
        result = request.infer(feed)
    seconds = (time.perf_counter() - start) / 5
    values = {o: result[compiled.output(o)] for o in outputs}
    return ops, seconds, values


def main(paths: list[str]) -> None:
    core = ov.Core()
    print(
        "| file | precision | ops as written | ops, every value an output | outputs' largest "
        "difference | ms as written | ms exposed |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for path in paths:
        written = onnx.load(path)
        outputs = [o.name for o in written.graph.output]
        feed = {}
        rng = np.random.default_rng(0)
        for i in written.graph.input:
            dims = [d.dim_value or 1 for d in i.type.tensor_type.shape.dim]
            feed[i.name] = rng.standard_normal(dims).astype(np.float32)
        capabilities = core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
        for precision in ["bf16"] * ("BF16" in capabilities) + ["f32"]:
            a = measure(core, core.read_model(path), precision, feed, outputs)
            with_all = exposed(path)
            b = measure(
                core, core.read_model(with_all.SerializeToString(), b""), precision, feed, outputs
            )
            diff = max(float(np.max(np.abs(a[2][o] - b[2][o]))) for o in outputs)
            print(
                f"| {path.rsplit('/', 1)[-1]} | {precision} | {a[0]} | {b[0]} | {diff:.3g} "
                f"| {1000 * a[1]:.1f} | {1000 * b[1]:.1f} |"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
