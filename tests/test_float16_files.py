"""A float32 file against the same model's float16 file (`layerdiff onnx A --vs B`): what the
float16 file holds as its own precision is no difference, and what moved beyond it is."""

from __future__ import annotations

import json

import numpy as np
import onnx
from conftest import run_cli
from onnx import helper, numpy_helper


def report_of(tmp_path, *args):
    out = tmp_path / "report.json"
    result = run_cli("onnx", *args, "--json", str(out))
    assert result.returncode in (0, 1), result.stderr
    return result, json.loads(out.read_text())


def _scaled_tanh(path, dtype, scale):
    """y = tanh(x · c) · c with `c` a Constant node's `value` of `scale` in `dtype`."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    value = numpy_helper.from_array(np.array(scale, dtype=dtype), "c")
    nodes = [
        helper.make_node("Constant", [], ["c"], name="scale", value=value),
        helper.make_node("Mul", ["x", "c"], ["m"], name="mul"),
        helper.make_node("Tanh", ["m"], ["t"], name="tanh"),
        helper.make_node("Mul", ["t", "c"], ["y"], name="out"),
    ]
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "g", [vi("x", elem, [4, 256])], [vi("y", elem, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.save(model, str(path))
    return path


def test_a_constant_stored_as_its_float16_rounding_is_no_difference_and_an_edit_is(tmp_path):
    """A float16 export holds a Constant node's value as its float16 rounding (GELU's 0.5, √2):
    that is the file's precision, not an attribute that differs (each was named a `file_differs`
    defect: "`value` tensor [] (4 bytes) → tensor [] (2 bytes)"). A value that moved beyond its
    rounding, or changed within one dtype (which the bytes' count could not show), differs. (A
    float16 MLP from torch `.half()` read "defect" for its GELU's constants; with those gone it
    read "undecided": its first layer, fed the float32 input, could not run alone.)"""
    reference = _scaled_tanh(tmp_path / "ref.onnx", np.float32, 1.4142135)
    half = _scaled_tanh(tmp_path / "half.onnx", np.float16, 1.4142135)
    result, report = report_of(tmp_path, str(reference), "--vs", str(half))
    assert result.returncode in (0, 1), result.stderr
    assert report["summary"]["defects"] == [], report["summary"]["defects"]
    assert report["summary"]["verdict"] in ("no_drift", "precision"), result.stdout
    # the layer that reads the graph's input is re-run on it as the target's whole run was fed
    # (cast to float16), not on the float32 input its file refuses
    mul = next(layer for layer in report["layers"] if layer["name"] == "m")
    assert mul.get("local_reason") is None and mul["local"] is not None, mul.get("local_reason")
    for edited, dtype in ((tmp_path / "half_edit.onnx", np.float16),
                          (tmp_path / "ref_edit.onnx", np.float32)):  # fmt: skip
        _scaled_tanh(edited, dtype, 1.5)
        result, report = report_of(tmp_path, str(reference), "--vs", str(edited))
        assert result.returncode == 1, result.stdout
        details = " ".join(d["detail"] for d in report["summary"]["defects"])
        assert "`value` differs" in details and "on `scale`" in details, details


def _dense(path, dtype, weight):
    """y = tanh(x · wᵀ), the weight `w` stored in `dtype`."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    w = numpy_helper.from_array(weight.astype(dtype), "w")
    nodes = [
        helper.make_node("Gemm", ["x", "w"], ["g"], name="dense", transB=1),
        helper.make_node("Tanh", ["g"], ["y"], name="act"),
    ]
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "g", [vi("x", elem, [8, 64])], [vi("y", elem, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.save(model, str(path))
    return path


def test_a_weight_edited_in_a_float16_file_is_the_weight_not_just_the_file(tmp_path):
    """One element of a float16 file's weight moved far beyond its rounding: the defect is that
    weight, named, where the layer's own error said only that the file computes differently
    ("file_differs ... an export that lost or changed something, a folded constant, or an
    edit")."""
    weight = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32) * 0.1
    reference = _dense(tmp_path / "ref.onnx", np.float32, weight)
    result, report = report_of(tmp_path, str(reference), "--vs",
                               str(_dense(tmp_path / "half.onnx", np.float16, weight)))  # fmt: skip
    assert report["summary"]["defects"] == [], report["summary"]["defects"]
    edited = weight.copy()
    edited[3, 5] += 0.5
    result, report = report_of(tmp_path, str(reference), "--vs",
                               str(_dense(tmp_path / "edit.onnx", np.float16, edited)))  # fmt: skip
    assert result.returncode == 1
    [defect] = report["summary"]["defects"]
    assert (defect["layer"], defect["cause"]) == ("g", "weight_mismatch"), defect
    assert "`w` differs beyond its rounding to float16" in defect["detail"], defect["detail"]
    assert "(1 of 4096 elements differ)" in defect["detail"], defect["detail"]


def _offset(path, dtype, table):
    """y = tanh(x + c), `c` a Constant node's `value` too large for a node's words to hold
    (over `COMPARED_TENSOR` elements)."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    value = numpy_helper.from_array(table.astype(dtype), "c")
    nodes = [
        helper.make_node("Constant", [], ["c"], name="table", value=value),
        helper.make_node("Add", ["x", "c"], ["s"], name="add"),
        helper.make_node("Tanh", ["s"], ["y"], name="act"),
    ]
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "g", [vi("x", elem, list(table.shape))], [vi("y", elem, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.save(model, str(path))
    return path


def test_a_large_constant_edited_at_the_same_dims_is_a_file_difference(tmp_path):
    """A Constant of 90,000 elements is told by its dims in a node's words, so an edit of its
    values at the same dims went unseen as a difference between the files. Its float16
    rounding is still no difference; an element moved beyond it, in either dtype, is named."""
    table = np.random.default_rng(1).standard_normal((300, 300)).astype(np.float32)
    reference = _offset(tmp_path / "ref.onnx", np.float32, table)
    result, report = report_of(tmp_path, str(reference), "--vs",
                               str(_offset(tmp_path / "half.onnx", np.float16, table)))  # fmt: skip
    assert report["summary"]["defects"] == [], report["summary"]["defects"]
    edited = table.copy()
    edited[7, 11] += 3.0
    for name, dtype in (("half_edit.onnx", np.float16), ("ref_edit.onnx", np.float32)):
        result, report = report_of(tmp_path, str(reference), "--vs",
                                   str(_offset(tmp_path / name, dtype, edited)))  # fmt: skip
        assert result.returncode == 1, result.stdout
        details = " ".join(d["detail"] for d in report["summary"]["defects"])
        assert "`value` differs" in details and "on `table`" in details, (name, details)
        assert "(1 of 90000 elements differ)" in details, (name, details)


def _classifier(path, dtype, select_last_index=0, op="ArgMax", keepdims=0):
    """The predicted class of 4096 rows: argmax(x · w) over 10 logits of about ±2000, where a
    float16 step is 1 or 2 and rounding the logits breaks near ties."""
    rng = np.random.default_rng(0)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    w = numpy_helper.from_array((rng.standard_normal((32, 10)) * 300).astype(dtype), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["logits"], name="head"),
        helper.make_node(
            op, ["logits"], ["class"], name="predict", axis=1, keepdims=keepdims,
            select_last_index=select_last_index,
        ),
    ]  # fmt: skip
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes, "g", [vi("x", elem, [4096, 32])], [vi("class", onnx.TensorProto.INT64, None)], [w]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.save(model, str(path))
    return path


def test_a_float16_classifiers_changed_predictions_are_its_rounding_and_a_tie_rule_is_not(
    tmp_path,
):
    """A float16 file whose output is an argmax: where rounding its logits to float16 breaks a
    near tie, the predicted class changes, and the same op computed exactly on the logits as
    the target holds them changes it too: precision (it read `undecided`: "the layer is not a
    float", so no baseline). An ArgMax that breaks ties the other way is a defect at it."""
    reference = _classifier(tmp_path / "ref.onnx", np.float32)
    half = _classifier(tmp_path / "half.onnx", np.float16)
    result, report = report_of(tmp_path, str(reference), "--vs", str(half))
    assert report["summary"]["verdict"] == "precision", result.stdout
    predict = next(layer for layer in report["layers"] if layer["name"] == "class")
    assert predict["cause"] == "precision_loss", predict
    indices = predict["baseline"]["indices"]
    assert indices["differ"] > 0 and indices["off_ideal"] == 0, indices
    assert f"{indices['differ']} of 4096" in predict["detail"], predict["detail"]
    assert "rounding to float16 breaks a near tie" in predict["detail"]
    assert report["summary"]["precision"]["dtype"] == "float16"
    # the last of equal logits: ties the float16 rounding makes are broken the other way
    last = _classifier(tmp_path / "last.onnx", np.float16, select_last_index=1)
    result = run_cli("onnx", str(reference), "--vs", str(last), "--out", str(tmp_path / "run"))
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert result.returncode == 1, result.stdout
    assert report["summary"]["verdict"] == "defect", result.stdout
    assert [d["layer"] for d in report["summary"]["defects"]] == ["class"], result.stdout
    # its repro: the float16 file's ArgMax fed the float32 reference's logits as the file
    # declares them (ONNX Runtime refused the float32 input: "bound to different types")
    # (named from inside its folder: the repro goes beside it, not beside where the
    # comparison ran)
    result = run_cli("reduce", "report.json", cwd=tmp_path / "run")
    assert result.returncode == 0, result.stderr
    assert "repro of `class`: 1 node (predict)" in result.stdout, result.stdout
    assert (tmp_path / "run" / "repro" / "repro.py").is_file()
    assert not (tmp_path / "repro").exists()
    # an ArgMin in its place: the file's edit, not the runtime's kernel (it read
    # `op_implementation`, "report it to the runtime")
    argmin = _classifier(tmp_path / "argmin.onnx", np.float16, op="ArgMin")
    result, report = report_of(tmp_path, str(reference), "--vs", str(argmin))
    (defect,) = report["summary"]["defects"]
    assert (defect["layer"], defect["cause"]) == ("class", "file_differs"), defect
    assert "`predict` ArgMin" in defect["detail"], defect["detail"]


def test_a_repro_of_an_index_kept_in_another_shape_runs(tmp_path):
    """ArgMax's `keepdims` set in the float16 file: [4096, 1] against the reference's [4096],
    the same elements. The repro said "checked", and its repro.py broadcast one against the
    other (16 million elements) and ended in an IndexError; it compares them element by
    element, as the run did, and says the shapes."""
    import subprocess
    import sys

    reference = _classifier(tmp_path / "ref.onnx", np.float32)
    kept = _classifier(tmp_path / "kept.onnx", np.float16, keepdims=1)
    result = run_cli("onnx", str(reference), "--vs", str(kept), "--out", str(tmp_path / "run"))
    assert result.returncode == 1, result.stdout
    assert run_cli("reduce", str(tmp_path / "run" / "report.json")).returncode == 0
    repro = tmp_path / "run" / "repro"
    done = subprocess.run(
        [sys.executable, "repro.py"], cwd=repro, capture_output=True, text=True, timeout=120
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert "shape [4096, 1], the reference's [4096]" in done.stdout, done.stdout
    assert "of 4096 elements beyond it" in done.stdout, done.stdout
