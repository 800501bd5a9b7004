"""Rounding is judged at each value's magnitude, per element: one float16 step of a value near
300 is not a kernel bug, while a 1e-3 error on a float16 value near 1e-2 is drift."""

from __future__ import annotations

import json

import numpy as np
import onnx
from builders.graphs import layernorm_matmul_fp16
from conftest import run_cli
from onnx import TensorProto, helper, numpy_helper


def _report(tmp_path, *args) -> tuple:
    out = tmp_path / "r.json"
    result = run_cli("onnx", *args, "--json", str(out))
    assert result.returncode in (0, 1), result.stderr
    return result, json.loads(out.read_text())


def test_one_float16_step_at_large_magnitude_is_rounding_not_a_kernel_bug(tmp_path):
    """ONNX Runtime and tract on float16 LayerNormalization → MatMul → Add: the outputs differ
    by one float16 step (0.25 near 300). Held to an absolute 1e-2 (the old float16 default)
    that was drift born at the Add; judged per element at its magnitude it is rounding."""
    rng = np.random.default_rng(0)
    model = tmp_path / "ln_matmul_add.onnx"
    layernorm_matmul_fp16(model, rng)
    np.savez(tmp_path / "in.npz", X=rng.uniform(-60, 60, (2, 128, 64)).astype(np.float16))
    inputs = ["--inputs", str(tmp_path / "in.npz"), "--target", "tract"]

    result, report = _report(tmp_path, str(model), *inputs)
    assert result.returncode == 0, result.stdout
    z = next(x for x in report["layers"] if x["name"] == "Z")
    assert z["accumulated"]["max_abs_diff"] == 0.25, "the two kernels do round differently"
    rounding = z["accumulated"]["rounding"]
    assert rounding["grid"] == "float16" and rounding["max_ulp_diff"] == 1.0
    assert rounding["beyond_tolerance"] == 0 and rounding["tolerance_needed"] <= 1.0
    assert z["tolerance"] == {"atol": 5e-4, "rtol": 1e-3}

    # Held to an absolute 1e-2 the Add exceeds, and the same-precision baseline still calls it
    # what it is: float16 rounding, which passes unless drift is asked to fail.
    result, report = _report(tmp_path, str(model), *inputs, "--tolerance", "1e-2")
    assert result.returncode == 0, result.stdout
    assert report["summary"]["drift_origin"] == "Z"
    assert report["summary"]["verdict"] == "precision"
    z = next(x for x in report["layers"] if x["name"] == "Z")
    assert z["cause"] == "rounding", z["detail"]
    assert z["accumulated"]["rounding"]["tolerance_needed"] > 1.0
    strict, _ = _report(tmp_path, str(model), *inputs, "--tolerance", "1e-2", "--fail-on", "drift")
    assert strict.returncode == 1


def test_a_1e_3_error_on_float16_values_near_1e_2_is_drift(tmp_path):
    """The other side of the same bound: small values are held to their own steps."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, [64])

    def save(path, shift):
        graph = helper.make_graph(
            [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "c"], ["y"], name="add")],
            "small", [x], [y],
            [numpy_helper.from_array(np.full(64, shift, np.float16), "c")],
        )  # fmt: skip
        model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])
        onnx.save(model, str(path))

    save(tmp_path / "a.onnx", 0.0)
    save(tmp_path / "b.onnx", 1e-3)
    values = np.linspace(0.008, 0.012, 64).astype(np.float16)
    np.savez(tmp_path / "in.npz", x=values)
    result, report = _report(
        tmp_path, str(tmp_path / "a.onnx"), "--vs", str(tmp_path / "b.onnx"),
        "--inputs", str(tmp_path / "in.npz"),
    )  # fmt: skip
    assert result.returncode == 1, result.stdout
    assert report["summary"]["drift_origin"] == "y"
    y_layer = next(x for x in report["layers"] if x["name"] == "y")
    assert y_layer["accumulated"]["rounding"]["beyond_tolerance"] == 64
    assert y_layer["cause"] == "weight_mismatch"


def test_the_onnx_flow_measures_both_sides_against_a_float64_truth(tmp_path):
    """`layerdiff onnx --float64` runs the reference graph in float64: a layer whose kernels
    differ only by rounding is `rounding`, not `op_implementation`, and `--tolerance auto`
    (which implies it) turns the truth into tolerances, as `layerdiff torch` does."""
    import importlib

    import torch
    from layerdiff.torch import export_onnx

    torch.manual_seed(0)  # as `layerdiff torch tests/builders/deep_mlp.py:build` seeds it
    model, inputs = importlib.import_module("builders.deep_mlp").build()
    onnx_file = export_onnx(model.eval(), inputs, tmp_path / "mlp.onnx")
    args = [str(onnx_file), "--target", "tract"]
    result, report = _report(tmp_path, *args, "--float64", "--tolerance", "1e-6")
    assert result.returncode == 0, result.stdout  # float32 rounding only
    assert report["summary"]["verdict"] == "precision" and report["summary"]["defects"] == []
    assert all(x["float64"] for x in report["layers"]), "every value has its truth"
    origin = next(x for x in report["layers"] if x["name"] == report["summary"]["drift_origin"])
    assert origin["cause"] == "rounding", origin["detail"]
    assert report["summary"]["warnings"] == []

    assert report["truth"]["detail"].startswith("float64 copy of mlp.onnx · onnxruntime")

    result, report = _report(tmp_path, *args, "--tolerance", "auto")
    assert result.returncode == 0, result.stdout
    for x in report["layers"]:
        assert x["tolerance"]["atol"] >= 4 * x["float64"]["reference"]
    # The truth runs in the reference's segments, fed from its own values: same numbers.
    result, split = _report(tmp_path, *args, "--tolerance", "auto", "--max-memory", "128K")
    assert "segments" in result.stderr
    assert [x["float64"] for x in split["layers"]] == [x["float64"] for x in report["layers"]]


def test_a_cnn_gets_its_float64_truth_node_by_node(resnet18_onnx):
    """Neither ONNX Runtime (no float64 Conv) nor tract (no float64 Gemm with a bias) runs
    ResNet-18 whole in float64; each of its nodes runs on one of them, so the truth is computed
    node by node, and every layer is measured against it."""
    out = resnet18_onnx["dynamo"].parent / "truth.json"
    result = run_cli("onnx", str(resnet18_onnx["dynamo"]), "--float64", "--json", str(out))
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["truth"]["runtime"] == "per-node", report["truth"]
    assert "onnxruntime, tract" in report["truth"]["detail"]
    assert all(x["float64"] is not None for x in report["layers"])
    assert not any("no float64 truth" in w for w in report["summary"]["warnings"])


def test_a_float16_file_on_both_sides_loses_no_precision_to_itself(tmp_path):
    """The same float16 file on ONNX Runtime and tract: its float16 bias is on both sides, so
    it is no evidence of lost precision. The Add where the two round differently is the source:
    its own error stays within what an honest float16 kernel makes, so it is rounding, and the
    ×16 downstream, where the output exceeds, is the origin; the run passes."""
    import torch
    from torch import nn

    class LayerNormLinear(nn.Module):
        def __init__(self, width=256):
            super().__init__()
            self.norm, self.proj = nn.LayerNorm(width), nn.Linear(width, width)

        def forward(self, x):
            return self.proj(self.norm(x)) * 16.0

    torch.manual_seed(0)
    model = LayerNormLinear().half().eval()
    path = tmp_path / "ln16.onnx"
    with torch.no_grad():
        torch.onnx.export(model, (torch.randn(2, 64, 256).half(),), str(path), dynamo=False)
    proto = onnx.load(str(path))
    proto.ir_version = 10
    onnx.save(proto, str(path))

    result, report = _report(tmp_path, str(path), "--target", "tract")
    assert result.returncode == 0, result.stdout
    assert "float16 rounding only: no layer computes differently" in result.stdout
    # the ×16 is where the drift first passes a tolerance (the origin), the Add's rounding
    # what it amplifies (the source)
    s = report["summary"]
    assert s["drift_origin"] == "10" and s["precision"]["source"] == "/proj/Add_output_0", s
    assert (
        "first past its tolerance at `10`, from the rounding of `/proj/Add_output_0`"
        in (result.stdout.splitlines()[0])
    )
    source = next(x for x in report["layers"] if x["name"] == "/proj/Add_output_0")
    assert source["cause"] == "rounding", source["detail"]
    # the float16 bias both sides hold is no lost precision: an honest float16 kernel's rounding
    assert source["detail"].startswith("the target rounds as an honest float16 kernel does")
    assert "amplified downstream until `10` exceeds it" in source["detail"]

    result, report = _report(tmp_path, str(path), "--target", "tract", "--float64")
    source = next(x for x in report["layers"] if x["name"] == "/proj/Add_output_0")
    assert source["cause"] == "rounding", source["detail"]
    assert report["summary"]["precision"]["source"] == "/proj/Add_output_0"


def test_gelu_and_erf_get_their_float64_truth_from_layerdiffs_own_kernels(tmp_path):
    """ONNX Runtime has no float64 Conv, Erf or Gelu, tract no float64 Erf or Gelu: those nodes
    run on layerdiff's own float64 kernels, and every layer still has its truth."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
         helper.make_node("Gelu", ["c"], ["g"], name="gelu"),
         helper.make_node("Gelu", ["g"], ["t"], name="gelu_tanh", approximate="tanh"),
         helper.make_node("Erf", ["t"], ["y"], name="erf")],
        "gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
        [numpy_helper.from_array(rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "w")],
    )  # fmt: skip
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 20)])
    path = tmp_path / "gelu.onnx"
    onnx.save(model, str(path))
    result, report = _report(tmp_path, str(path), "--vs", str(path), "--float64")
    assert result.returncode == 0, result.stdout
    assert report["truth"]["detail"].endswith(
        "on the first of layerdiff, onnxruntime, tract that computes it"
    )
    assert [x["name"] for x in report["layers"]] == ["c", "g", "t", "y"]
    assert all(x["float64"] is not None for x in report["layers"]), report["summary"]["warnings"]
