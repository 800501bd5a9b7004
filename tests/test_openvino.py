"""OpenVINO as a side: its CPU plugin runs ONNX files with its own kernels and fusions, at an
inference-precision hint it resolves to what the machine can do. One module and one spelling
(`openvino`, `openvino:precision=f16`); `onnx`, `torch`, `providers`, `audit` and the op
matrix take it as they take `tract`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import run_cli

onnx = pytest.importorskip("onnx")
pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install openvino)")

from faults import producer, scale_weight  # noqa: E402
from layerdiff import _layerdiff  # noqa: E402
from test_onnx_command import report_of  # noqa: E402


def test_resnet18_on_openvino_is_compared_layer_by_layer(resnet18_onnx, tmp_path):
    """Every value of the file exists on OpenVINO too (asked-for values stay outputs); its own
    float32 kernels differ from ONNX Runtime's by rounding only. On a CPU with bfloat16
    arithmetic (AVX512_BF16, AMX) the plugin computes in bfloat16 by default: precision, not a
    defect, and the report says so."""
    result, report = report_of(tmp_path, str(resnet18_onnx["dynamo"]), "--target", "openvino")
    assert result.returncode == 0, result.stdout + result.stderr
    s = report["summary"]
    assert s["layers_compared"] == s["layers_total"] == 49
    assert s["verdict"] in ("no_drift", "precision") and not s["defects"]
    target = report["target"]
    assert target["runtime"] == "openvino"
    assert "OpenVINO 20" in target["detail"] and "CPU plugin" in target["detail"]
    hint = target["options"]["INFERENCE_PRECISION_HINT"]
    assert hint in ("f32", "f16", "bf16")
    assert f"inference precision {hint}" in target["detail"]
    assert 0 < s["worst"]["max_abs_diff"]["value"] < (1e-3 if hint == "f32" else 0.5)


def test_a_weight_changed_in_the_file_openvino_runs_is_the_one_defect(resnet18_onnx, tmp_path):
    clean = resnet18_onnx["dynamo"]
    graph = onnx.load(str(clean)).graph
    conv = [n for n in graph.node if n.op_type == "Conv"][9]
    bug = scale_weight(clean, tmp_path / "bug.onnx", conv.output[0], 1.03)
    result, report = report_of(tmp_path, str(clean), "--vs", str(bug), "--target", "openvino")
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"1 defect: `{conv.output[0]}` weight_mismatch" in result.stdout, result.stdout
    assert report["summary"]["drift_origin"] == conv.output[0]
    assert producer(graph, conv.output[0]).op_type == "Conv"


def test_a_precision_hint_reports_what_the_plugin_computes_in(resnet18_onnx, tmp_path):
    """Asked for bf16 on a CPU without bf16 arithmetic, the plugin computes in f32: the report
    says both, so a run is never taken for bf16 that was not."""
    result, report = report_of(
        tmp_path, str(resnet18_onnx["dynamo"]), "--target", "openvino:precision=bf16"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    resolved = report["target"]["options"]["INFERENCE_PRECISION_HINT"]
    detail = report["target"]["detail"]
    assert f"inference precision {resolved}" in detail
    if resolved != "bf16":
        assert "bf16 asked: this CPU's plugin offers" in detail, detail
        assert f"so it computes in {resolved}" in detail


def test_the_torch_verb_measures_an_export_on_openvino(tmp_path):
    """`layerdiff torch` against OpenVINO: PyTorch's modules paired with the export's values on
    OpenVINO, on a transformers model built from its config (the built-in Llama)."""
    result = run_cli(
        "torch", "llama", "--target", "openvino", "--json", str(tmp_path / "r.json"), "-q"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["target"]["runtime"] == "openvino"
    assert report["summary"]["layers_compared"] > 0 and not report["summary"]["defects"]


def test_audit_providers_and_the_op_matrix_take_openvino(resnet18_onnx, tmp_path):
    model = str(resnet18_onnx["dynamo"])
    audit = run_cli("audit", model, "--runtimes", "ort,openvino", "--out", str(tmp_path))
    assert audit.returncode == 0, audit.stderr
    table = json.loads((tmp_path / "audit.json").read_text())
    assert "openvino" in json.dumps(table["runtimes"])
    providers = run_cli(
        "providers", model, "--providers", "cpu", "--levels", "disable",
        "--runtimes", "openvino", "--out", str(tmp_path),
    )  # fmt: skip
    assert providers.returncode == 0, providers.stderr
    cells = json.loads((tmp_path / "providers.json").read_text())["cells"]
    assert [c["target"] for c in cells] == ["ort", "openvino"]
    assert cells[1]["provider"] == "openvino" and cells[1]["level"] == "–"
    assert cells[1]["verdict"] in ("no_drift", "precision"), cells[1]
    # in full float32 (a CPU with bfloat16 arithmetic computes float32 in bfloat16 by default)
    ops = run_cli(
        "ops", "--ops", "relu,matmul", "--backends", "ort,openvino:precision=f32",
        "--dtypes", "float32", "--jobs", "1", "--out", str(tmp_path),
    )  # fmt: skip
    assert ops.returncode == 0, ops.stdout + ops.stderr
    matrix = json.loads((tmp_path / "ops.json").read_text())
    on_openvino = [c for c in matrix["cells"] if c["backend"].startswith("openvino")]
    assert len(on_openvino) == 2 and all(c["status"] == "PASS" for c in on_openvino)


def _default_precision() -> str:
    import openvino as ov

    return str(ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT"))


needs_bf16 = pytest.mark.skipif(
    "bfloat16" not in _default_precision() and "bf16" not in _default_precision(),
    reason="OpenVINO's CPU plugin computes float32 in bfloat16 only on a CPU with bfloat16 "
    "arithmetic (AVX512_BF16, AMX); the CPU stand-in in crates/layerdiff-flow/tests/"
    "reduced_math.rs covers the same rule",
)


@needs_bf16
def test_at_bfloat16_every_layer_is_judged_against_an_ideal_bfloat16_computation(
    resnet18_onnx, tmp_path
):
    """At its default bf16 precision the plugin computes a float32 model in bfloat16: the
    headline says so, and each narrowed layer is within what bfloat16 explains, measured."""
    result, report = report_of(tmp_path, str(resnet18_onnx["dynamo"]), "--target", "openvino")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "bfloat16 rounding only" in result.stdout.splitlines()[0], result.stdout
    assert report["summary"]["precision"]["dtype"] == "bfloat16"
    grids = {layer["baseline"]["grid"] for layer in report["layers"] if layer.get("baseline")}
    assert "bfloat16" in grids
    worst = max(
        layer["baseline"]["multiple"] for layer in report["layers"] if layer.get("baseline")
    )
    assert worst <= 1.0, worst


@needs_bf16
def test_a_reference_computing_in_bfloat16_is_named_as_the_rounding(resnet18_onnx, tmp_path):
    """OpenVINO at bf16 as the reference, ONNX Runtime's float32 as the target: the drift is
    the reference's bfloat16 rounding. The report says the reference does not compute as its
    file says, the headline's precision is bfloat16, and no layer blames the target for
    computing in a precision it does not."""
    result, report = report_of(
        tmp_path, str(resnet18_onnx["dynamo"]), "--reference", "openvino", "--target", "ort"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    s = report["summary"]
    assert s["verdict"] == "precision" and s["precision"]["dtype"] == "bfloat16", s
    assert any(
        w.startswith("the reference does not compute as its file says") for w in s["warnings"]
    )
    details = [layer.get("detail") or "" for layer in report["layers"]]
    assert not any("the reference in float32" in d for d in details)
    origin = next(layer for layer in report["layers"] if layer["name"] == s["drift_origin"])
    assert origin["detail"].startswith("the reference computes this layer in bfloat16"), origin


@needs_bf16
def test_the_op_matrix_judges_a_cell_openvino_computes_in_bfloat16_as_bfloat16(tmp_path):
    ops = run_cli(
        "ops", "--ops", "matmul", "--backends", "ort,openvino", "--dtypes", "float32",
        "--jobs", "1", "--out", str(tmp_path),
    )  # fmt: skip
    assert ops.returncode == 0, ops.stdout + ops.stderr
    matrix = json.loads((tmp_path / "ops.json").read_text())
    cell = next(c for c in matrix["cells"] if c["backend"] == "openvino")
    assert (cell["status"], cell["computed_in"]) == ("PASS", "bfloat16"), cell
    assert "*: computed in a narrower dtype" in ops.stdout


@pytest.mark.parametrize(
    "spelling",
    [
        "openvino", "openvino:precision=f16", "openvino:precision=bf16", "openvino:f16",
        "openvino:precision=f8", "tract", "ort:opt=all", "ort:cuda:use_tf32=0", "onnxruntime",
        "torch", "torch:compile", "torch:cuda:bf16", "torch:bf16:fp16",
    ],
)  # fmt: skip
def test_a_spelling_is_accepted_by_every_door_or_by_none(spelling):
    """The command line and the Python API parse a side with the one parser: a spelling one
    door takes and the other refuses is a bug."""
    try:
        spec = _layerdiff.side_spec(spelling)
    except _layerdiff.UsageError:
        spec = None
    try:
        verb, _ = _layerdiff.parse_cli(["layerdiff", "torch", "resnet18", "--target", spelling])
        accepted = verb != "exit"
    except _layerdiff.UsageError:
        accepted = False
    assert accepted == (spec is not None), spelling
    if spec is not None:
        assert _layerdiff.side_spec(spec.spelling).spelling == spec.spelling


def test_a_file_of_values_is_a_side_that_computes_nothing():
    assert _layerdiff.side_spec("expected:run/x.safetensors").kind == "expected"
    assert _layerdiff.side_spec("openvino:precision=f16").kind == "runtime"
    assert _layerdiff.side_spec("torch:cuda:bf16").device == "cuda"


def test_an_openvino_library_that_will_not_load_is_named(resnet18_onnx, tmp_path, monkeypatch):
    not_a_library = tmp_path / "libopenvino_c.so"
    not_a_library.write_text("not a library")
    monkeypatch.setenv("LAYERDIFF_OPENVINO_LIB", str(not_a_library))
    result = run_cli("onnx", str(resnet18_onnx["dynamo"]), "--target", "openvino")
    assert result.returncode == 2
    assert f"error: cannot load OpenVINO from `{not_a_library}`" in result.stderr, result.stderr
    monkeypatch.setenv("LAYERDIFF_OPENVINO_LIB", str(tmp_path / "missing.so"))
    result = run_cli("onnx", str(resnet18_onnx["dynamo"]), "--target", "openvino")
    assert result.returncode == 2
    assert "cannot find the OpenVINO library" in result.stderr
    assert "pip install openvino" in result.stderr


def test_a_model_with_external_data_runs_on_openvino(resnet18_onnx, tmp_path):
    """Weights in a file beside the model reach OpenVINO, which refuses data a symbolic link
    resolves outside the folder it reads from."""
    model = onnx.load(str(resnet18_onnx["dynamo"]))
    path = tmp_path / "external.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="external.bin")
    result, report = report_of(
        tmp_path, str(path), "--target", "openvino:precision=f32", "--no-local"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert report["summary"]["layers_compared"] == 49


def test_an_int64_extreme_openvino_holds_as_int32s_is_no_difference(tmp_path):
    """OpenVINO's CPU plugin computes int64 in int32: a Slice's end INT64_MAX ("to the end", as
    the legacy exporter writes in every ViT block) comes back as INT32_MAX. Read as a
    difference of 9.2e18 it made each such Constant "undecided"; it is the same end."""
    from onnx import helper, numpy_helper

    big = np.array([np.iinfo(np.int64).max], np.int64)
    nodes = [
        helper.make_node("Constant", [], ["starts"], name="starts",
                         value=numpy_helper.from_array(np.array([1], np.int64))),
        helper.make_node("Constant", [], ["ends"], name="ends",
                         value=numpy_helper.from_array(big)),
        helper.make_node("Constant", [], ["axes"], name="axes",
                         value=numpy_helper.from_array(np.array([1], np.int64))),
        helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["sliced"], name="slice"),
        helper.make_node("Relu", ["sliced"], ["y"], name="relu"),
    ]  # fmt: skip
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "g", [vi("x", onnx.TensorProto.FLOAT, [4, 8])],
                              [vi("y", onnx.TensorProto.FLOAT, None)])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.save(model, str(tmp_path / "slice.onnx"))
    result, report = report_of(tmp_path, str(tmp_path / "slice.onnx"), "--target", "openvino")
    assert result.returncode == 0, result.stdout + result.stderr
    ends = next(layer for layer in report["layers"] if layer["name"] == "ends")
    assert ends["accumulated"]["max_abs_diff"] == 0, ends
    assert ends["accumulated"]["sentinels"] == 1, ends
    assert any("hold int64's extreme" in w for w in report["summary"]["warnings"]), report


def test_check_holds_a_target_computing_in_bfloat16_to_bfloat16s_rounding(tmp_path):
    """`layerdiff check --target openvino` on a CPU with bfloat16 arithmetic: OpenVINO computes
    the float32 file in bfloat16, 13000x as far from float64 as PyTorch's float32, and the
    check read "the target computes something else here: FAIL" on a clean timm EfficientNet.
    The target is held to bfloat16's rounding where it computes in it, and to float32's where
    it does not (its precision set to f32, or ONNX Runtime)."""
    from builders.graphs import save_graph
    from onnx import helper

    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    path = save_graph(tmp_path / "mm.onnx", nodes, (4, 16), (4, 8), {"w": (16, 8)})
    model = path.read_bytes()
    assert _layerdiff.runtime_computes_in(model, "openvino:precision=f32") is None
    assert _layerdiff.runtime_computes_in(model, "ort") is None
    if "bf16" in _default_precision() or "bfloat16" in _default_precision():
        grid, how = _layerdiff.runtime_computes_in(model, "openvino")
        assert grid == "bfloat16" and "`openvino:precision=f32`" in how, how
    result = run_cli("check", "bert", "--target", "openvino", "--json", str(tmp_path / "c.json"))
    # in bfloat16 the outputs may pass float32's bound (atol 1e-4) or not: the user's bound
    assert result.returncode in (0, 1), result.stdout + result.stderr
    truth = json.loads((tmp_path / "c.json").read_text())["outputs"][0]["float64"]
    assert truth["beyond"] is False, truth
    if "bf16" in _default_precision() or "bfloat16" in _default_precision():
        assert truth["grid"] == "bfloat16", truth
        assert "(the target computes in bfloat16: held to bfloat16's rounding" in result.stdout
        # and says how to have it compute as the file says: on a line of its own when the
        # outputs pass, in the failing output's sentence when bfloat16 is why it fails
        how = "OpenVINO's CPU plugin computes float32 in bf16 here (its inference precision)"
        said = "  the target: " if result.returncode == 0 else "whose rounding this is: "
        assert said + how in result.stdout, result.stdout
        assert "`openvino:precision=f32` runs it in full float32" in result.stdout
