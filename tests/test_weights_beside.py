"""Models whose weights lie in files beside them (as exporters write models past 2 GB): every
side finds them from the model's folder, wherever the command runs, whichever tensors hold them
(initializers, Constant nodes, a Loop's body), and reads the same values as from the file with
every weight inside."""

from __future__ import annotations

import json

import numpy as np
import onnx
from conftest import run_cli
from onnx import helper, numpy_helper


def report_of(tmp_path, *args):
    out = tmp_path / "report.json"
    result = run_cli("onnx", *args, "--json", str(out), cwd=tmp_path)
    assert result.returncode in (0, 1), result.stderr
    return result, json.loads(out.read_text())


def _beside(model, folder, threshold):
    """`model` saved in `folder` with every tensor of `threshold` bytes or more beside it."""
    folder.mkdir()
    path = folder / "model.onnx"
    onnx.save_model(
        model, str(path), save_as_external_data=True, location="model.onnx.data",
        size_threshold=threshold,
    )  # fmt: skip
    return path


def test_weights_partly_beside_the_model_and_partly_inside_it_run_on_every_side(tmp_path):
    """A file whose large weights lie beside it and whose middling ones are inside it (onnx's
    `size_threshold` above them), as exporters write models past 2 GB: ONNX Runtime finds both,
    and reads the same values as from the file with every weight inside."""
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 512])
    big = numpy_helper.from_array(rng.standard_normal((64, 512)).astype(np.float32), "big")
    middling = numpy_helper.from_array(rng.standard_normal((1, 512)).astype(np.float32), "mid")
    nodes = [
        helper.make_node("MatMul", ["x", "big"], ["m"], name="matmul"),
        helper.make_node("Add", ["m", "mid"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(nodes, "g", [x], [y], initializer=[big, middling])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    inside = tmp_path / "inside.onnx"
    onnx.save(model, str(inside))
    # the 128 KiB weight goes beside, the 2 KiB one stays
    beside = _beside(model, tmp_path / "beside", 4096)
    assert (beside.parent / "model.onnx.data").stat().st_size == 64 * 512 * 4
    for target in ("ort", "ort:opt=all"):
        result, report = report_of(tmp_path, str(beside), "--target", target, "--float64")
        assert report["summary"]["verdict"] == "no_drift", result.stderr
    _, report = report_of(tmp_path, str(beside), "--vs", str(inside))
    assert report["summary"]["layers_compared"] == 3
    assert report["summary"]["worst"]["max_abs_diff"]["value"] == 0


def test_weights_only_a_constant_and_a_loops_body_hold_are_found_from_the_models_folder(tmp_path):
    """No initializer of the main graph lies beside the model: a Constant node's value and the
    initializer of a Loop's body do. Run from another folder, every side finds them."""
    rng = np.random.default_rng(1)
    weight = lambda name: numpy_helper.from_array(  # noqa: E731
        rng.standard_normal((32, 32)).astype(np.float32) / 8, name
    )
    v = lambda name: helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [1, 32])  # noqa: E731
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["v_in", "body_w"], ["m"], name="body_matmul"),
            helper.make_node("Tanh", ["m"], ["v_out"], name="body_tanh"),
            helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond"),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", onnx.TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", onnx.TensorProto.BOOL, []),
            v("v_in"),
        ],
        [helper.make_tensor_value_info("cond_out", onnx.TensorProto.BOOL, []), v("v_out")],
        initializer=[weight("body_w")],
    )
    nodes = [
        helper.make_node("Constant", [], ["c"], name="const", value=weight("const_w")),
        helper.make_node("MatMul", ["x", "c"], ["h"], name="matmul"),
        helper.make_node("Loop", ["trips", "go", "h"], ["y"], name="loop", body=body),
    ]
    graph = helper.make_graph(
        nodes, "g", [v("x")], [v("y")],
        initializer=[numpy_helper.from_array(np.array(3, np.int64), "trips"),
                     numpy_helper.from_array(np.array(True), "go")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    inside = tmp_path / "inside.onnx"
    onnx.save(model, str(inside))
    beside = _beside(model, tmp_path / "beside", 1024)
    kept = onnx.load(str(beside), load_external_data=False)
    assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in kept.graph.initializer)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for target in ("ort", "ort:opt=all"):
        result, report = report_of(elsewhere, str(beside), "--target", target, "--float64")
        assert report["summary"]["verdict"] == "no_drift", result.stderr
    _, report = report_of(elsewhere, str(beside), "--vs", str(inside))
    assert report["summary"]["worst"]["max_abs_diff"]["value"] == 0


def test_a_constant_reaching_out_of_the_models_folder_is_refused_before_any_runtime(tmp_path):
    """A Constant node's data is checked as an initializer's is: none may lie outside the
    model's folder (a downloaded file must not make a runtime read other files)."""
    (tmp_path / "secret.bin").write_bytes(b"\0" * 16)
    folder = tmp_path / "model"
    folder.mkdir()
    value = onnx.TensorProto(name="c", data_type=onnx.TensorProto.FLOAT, dims=[4])
    value.data_location = onnx.TensorProto.EXTERNAL
    value.external_data.add(key="location", value="../secret.bin")
    v = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])
    nodes = [
        helper.make_node("Constant", [], ["c"], name="const", value=value),
        helper.make_node("Mul", ["x", "c"], ["y"], name="mul"),
    ]
    graph = helper.make_graph(nodes, "g", [v], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    onnx.save(model, str(folder / "model.onnx"))
    result = run_cli("onnx", str(folder / "model.onnx"), "--target", "ort", cwd=folder)
    assert result.returncode == 2
    assert (
        "constant `c` keeps its data in `../secret.bin`, which leads out of the model's folder"
        in result.stderr
    ), result.stderr
