"""A runtime that dies in native code (a vendor's custom-op library that aborts or segfaults on
one node) costs only the layers that depend on that node: the side runs in a worker process,
the node is named, the other layers are compared, and the run says it is inconclusive (exit 1).
The library here is `faulty_ops` (crates/layerdiff-runtime/examples): its `layerdiff.test`
Sigmoid computes the sigmoid, or aborts or segfaults when its node's `fault` attribute says so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import faulty_ops_library, run_cli, rust_exe
from onnx import TensorProto, helper, numpy_helper

DOMAIN = "layerdiff.test"


@pytest.fixture(scope="module")
def faulty_ops() -> Path:
    return faulty_ops_library()


def _gated(path: Path, fault: str | None) -> Path:
    """x → conv → relu → conv2 → gate (Sigmoid) → mul(·, relu) → add(·, tanh(relu)) → y, and
    side_mean = mean(tanh(relu)) beside it. `fault`: None for the standard Sigmoid, else the
    vendor's, with that fault ("" for none)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3, "w")
    w2 = numpy_helper.from_array(rng.standard_normal((4, 4, 1, 1)).astype(np.float32) * 0.3, "w2")
    if fault is None:
        gate = helper.make_node("Sigmoid", ["c2"], ["s"], name="gate")
    else:
        attributes = {"fault": fault} if fault else {}
        gate = helper.make_node("Sigmoid", ["c2"], ["s"], name="gate", domain=DOMAIN, **attributes)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w2"], ["c2"], name="conv2"),
        gate,
        helper.make_node("Mul", ["s", "r"], ["m"], name="mul"),
        helper.make_node("Tanh", ["r"], ["t"], name="side"),
        helper.make_node("Add", ["m", "t"], ["y"], name="add"),
        helper.make_node("ReduceMean", ["t"], ["side_mean"], name="side_mean", keepdims=0),
    ]
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes, "gated", [vi("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [vi("y", TensorProto.FLOAT, None), vi("side_mean", TensorProto.FLOAT, None)], [w, w2],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17)]
    if fault is not None:
        opsets.append(helper.make_opsetid(DOMAIN, 1))
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=9), str(path))
    return path


def _report(result: subprocess.CompletedProcess, out: Path) -> dict:
    assert "Traceback" not in result.stderr and "panicked" not in result.stderr, result.stderr
    return json.loads(out.read_text())


def test_an_honest_custom_op_library_is_compared_like_any_runtime(tmp_path, faulty_ops):
    reference = _gated(tmp_path / "ref.onnx", None)
    vendor = _gated(tmp_path / "vendor.onnx", "")
    out = tmp_path / "r.json"
    result = run_cli("onnx", str(reference), "--vs", str(vendor),
                     "--target", f"ort:custom_ops={faulty_ops}", "--json", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = _report(result, out)
    assert report["summary"]["verdict"] == "no_drift"
    assert report["summary"]["layers_compared"] == 8
    runtime = report["target"]["detail"]
    assert f"custom ops from {faulty_ops}" in runtime and "in a worker process" in runtime, runtime


@pytest.mark.parametrize(
    ("fault", "signal"),
    [("abort", "SIGABRT, an abort"), ("segfault", "SIGSEGV, a segmentation fault")],
)
@pytest.mark.parametrize("door", ["python", "rust"])
def test_a_runtime_that_dies_on_one_node_costs_only_the_layers_that_depend_on_it(
    tmp_path, faulty_ops, fault, signal, door
):
    """Whole and in segments, from the pip package's command and from the Rust binary (whose
    worker is itself): the layers before the node and beside it are compared; the node's and
    those after it are not, each saying which node the runtime died on and how."""
    exe = rust_exe() if door == "rust" else None
    reference = _gated(tmp_path / "ref.onnx", None)
    vendor = _gated(tmp_path / "vendor.onnx", fault)
    for extra in ([], ["--max-memory", "8K"]):
        out = tmp_path / "r.json"
        args = ["onnx", str(reference), "--vs", str(vendor),
                "--target", f"ort:custom_ops={faulty_ops}", "--json", str(out), *extra]  # fmt: skip
        if door == "python":
            result = run_cli(*args)
        else:
            result = subprocess.run([str(exe), *args], capture_output=True, text=True)
        assert result.returncode == 1, result.stderr
        report = _report(result, out)
        status = {x["name"]: (x["status"], x["reason"]) for x in report["layers"]}
        compared = {n for n, (s, _) in status.items() if s == "compared"}
        assert compared == {"c", "r", "c2", "t", "side_mean"}, status
        why = f"onnxruntime cannot run `gate` ({DOMAIN}.Sigmoid: crashed with {signal})"
        for name in ("s", "m", "y"):
            assert status[name][1] == f"not compared: {why}, which this layer depends on"
        summary = report["summary"]
        assert (summary["layers_unmapped"], summary["layers_not_run"]) == (0, 3)
        assert "8 total, 5 compared, 0 without an ONNX counterpart, 3 the target could not run" in (
            result.stdout
        )
        assert summary["verdict"] == "inconclusive"
        assert why in summary["inconclusive"] and summary["warnings"][0].startswith(why)
        assert ("segments" in result.stderr) == bool(extra)


def test_a_real_network_that_crashes_mid_way_keeps_every_layer_before(
    resnet18_onnx, tmp_path, faulty_ops
):
    """ResNet-18 (the dynamo export) whose one Relu in its third stage is the vendor's
    Sigmoid, which segfaults, against the same file with the standard Sigmoid there: the target
    optimized by ONNX Runtime (`opt=all`, done in the worker too). Every layer that does not
    depend on the node is compared and clean; every one that does is named."""
    model = onnx.load(str(resnet18_onnx["dynamo"]))
    relus = [n for n in model.graph.node if n.op_type == "Relu"]
    node = relus[len(relus) // 2]
    node.op_type = "Sigmoid"
    onnx.save(model, str(tmp_path / "ref.onnx"))
    node.domain = DOMAIN
    node.attribute.append(helper.make_attribute("fault", "segfault"))
    model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    onnx.save(model, str(tmp_path / "vendor.onnx"))
    out = tmp_path / "r.json"
    result = run_cli("onnx", str(tmp_path / "ref.onnx"), "--vs", str(tmp_path / "vendor.onnx"),
                     "--target", f"ort:opt=all:custom_ops={faulty_ops}",
                     "--json", str(out))  # fmt: skip
    assert result.returncode == 1, result.stderr
    report = _report(result, out)
    layers = report["layers"]
    position = next(i for i, x in enumerate(layers) if x["name"] == node.output[0])
    before = [x for x in layers[:position] if x["status"] == "compared"]
    assert len(before) > 20, [x["name"] for x in layers[:position]]
    left_out = [x for x in layers if (x["reason"] or "").startswith("not compared: ")]
    assert layers[position] in left_out and layers[-1] in left_out
    assert all(f"`{node.name}` ({DOMAIN}.Sigmoid: crashed with SIGSEGV" in x["reason"]
               for x in left_out)  # fmt: skip
    assert report["summary"]["verdict"] == "inconclusive"
    assert report["summary"]["layers_exceeding"] == 0


@pytest.mark.parametrize("target", ["ort:opt=all", "tract"])
def test_a_side_in_a_worker_gives_the_values_it_gives_in_this_process(
    resnet18_onnx, tmp_path, target
):
    """`--isolate always` moves every value through a pipe: the report must be the same, value
    for value, as the run in one process (the target's description aside)."""
    reports = []
    for isolate in ("never", "always"):
        out = tmp_path / f"{isolate}.json"
        result = run_cli("onnx", str(resnet18_onnx["dynamo"]), "--target", target,
                         "--isolate", isolate, "--json", str(out))  # fmt: skip
        assert result.returncode in (0, 1), result.stderr
        reports.append(_report(result, out))
    never, always = reports
    assert always["target"]["detail"].endswith(", in a worker process")
    assert [x for x in never["layers"]] == [x for x in always["layers"]]
    assert never["summary"] == always["summary"]


def test_custom_op_libraries_that_cannot_be_loaded_are_named(tmp_path, faulty_ops):
    model = _gated(tmp_path / "vendor.onnx", "")
    missing = run_cli("onnx", str(model), "--target", "ort:custom_ops=/no/such/libops.so")
    assert missing.returncode == 2
    assert "custom-op library `/no/such/libops.so` is not a file" in missing.stderr
    not_a_library = tmp_path / "libnot.so"
    not_a_library.write_text("not a library")
    broken = run_cli("onnx", str(model), "--reference", f"ort:custom_ops={faulty_ops}",
                     "--target", f"ort:custom_ops={not_a_library}")  # fmt: skip
    assert broken.returncode == 2
    assert f"custom-op library `{not_a_library}`" in broken.stderr, broken.stderr
    assert "Traceback" not in broken.stderr and "panicked" not in broken.stderr


def test_a_worker_left_alone_ends(tmp_path, faulty_ops):
    """A worker whose command is gone (its input closed) leaves at once, with no output."""
    worker = subprocess.run(
        [sys.executable, "-m", "layerdiff", "__worker", "--runtime",
         f"ort:custom_ops={faulty_ops}"],
        input=b"", capture_output=True, timeout=60,
    )  # fmt: skip
    assert worker.returncode == 0 and worker.stdout == b"", worker.stderr


def test_an_audit_marks_the_op_a_runtime_crashes_on_and_goes_on(tmp_path, faulty_ops):
    """`layerdiff audit` runs each op alone on each runtime: the vendor's op that aborts fails,
    with how, and every other op is still tried on that runtime."""
    model = _gated(tmp_path / "vendor.onnx", "abort")
    out = tmp_path / "audit.json"
    result = run_cli("audit", str(model), "--runtimes", f"ort:custom_ops={faulty_ops},tract",
                     "--json", str(out))  # fmt: skip
    assert result.returncode in (0, 1), result.stderr
    audit = _report(result, out)
    runtime = f"ort:custom_ops={faulty_ops}"
    support = {
        op["op_type"]: next(s for s in op["support"] if s["runtime"] == runtime)
        for op in audit["ops"]
    }
    assert support["Sigmoid"]["status"] == "fails"
    assert "crashed in its worker process (SIGABRT, an abort)" in support["Sigmoid"]["error"]
    assert {op: s["status"] for op, s in support.items() if op != "Sigmoid"} == dict.fromkeys(
        ["Conv", "Relu", "Mul", "Tanh", "Add", "ReduceMean"], "runs"
    )
