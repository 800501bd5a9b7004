"""`layerdiff onnx`: two model files, or one file under two ONNX Runtime configurations."""

from __future__ import annotations

import json

import onnx
import pytest
from conftest import run_cli
from onnx import helper, numpy_helper


def load(path):
    return onnx.load(str(path))


def report_of(tmp_path, *args):
    out = tmp_path / "report.json"
    result = run_cli("onnx", *args, "--json", str(out))
    assert result.returncode in (0, 1), result.stderr
    return result, json.loads(out.read_text())


def conv_node(model, index):
    return [n for n in model.graph.node if n.op_type == "Conv"][index]


def test_identical_files_report_no_drift(resnet18_onnx, tmp_path):
    result, report = report_of(
        tmp_path, str(resnet18_onnx["dynamo"]), "--vs", str(resnet18_onnx["dynamo"])
    )
    assert result.returncode == 0
    s = report["summary"]
    assert s["drift_origin"] is None and s["layers_compared"] == s["layers_total"] == 49
    assert s["worst"]["max_abs_diff"]["value"] == 0.0
    assert (tmp_path / "report.inputs.safetensors").is_file()


def test_a_float16_file_against_itself_is_no_drift_whatever_its_pieces_do(tmp_path):
    """ONNX Runtime's CPU provider computes float16 convolutions in float32 and drops the casts
    between adjacent ones in a whole graph, so a layer re-run alone (its inputs rounded to
    float16) differs from the same layer in the whole run. Both sides here run the same file on
    the same runtime and agree bit for bit: no layer has an error of its own, and the headline
    says so (it said "precision: float16 rounding, born at `c2`")."""
    import numpy as np
    from onnx import TensorProto

    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float16), name)
        for name, shape, scale in [("w", (16, 3, 3, 3), 0.5), ("w2", (16, 16, 3, 3), 0.3),
                                   ("w3", (8, 16, 1, 1), 0.3)]
    ]  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3"], ["y"], name="conv3"),
    ]
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "half", [vi("x", TensorProto.FLOAT16, [1, 3, 32, 32])],
                              [vi("y", TensorProto.FLOAT16, None)], weights)  # fmt: skip
    path = tmp_path / "half.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=9), str(path))  # fmt: skip
    result, report = report_of(tmp_path, str(path), "--target", "ort")
    assert result.returncode == 0, result.stderr
    s = report["summary"]
    assert s["verdict"] == "no_drift", result.stderr
    assert s["drift_origin"] is None and s["layers_exceeding_locally"] == 0
    # the pieces' differences are still reported, with why they are not the target's own error
    c2 = next(layer for layer in report["layers"] if layer["name"] == "c2")
    assert c2["local"]["max_abs_diff"] > 0 and not c2["local_exceeds"]


def test_an_attribute_written_at_its_default_is_no_difference(resnet18_onnx, tmp_path):
    """The dynamo exporter writes `auto_pad` "NOTSET", `group` 1 and `dilations` [1, 1] on
    every Conv (so do ONNX Runtime 1.20 and 1.22 in the graphs they save); a file that leaves
    them unset says the same. (Where a Conv drifted for another reason, such a default was named
    as its defect: "an attribute differs: `auto_pad` (unset) → "NOTSET"", on 46 Conv nodes of
    ResNet-50 in float16 against ONNX Runtime 1.22's optimized graph; engine/group.rs tests
    the rule.)"""
    model = load(resnet18_onnx["dynamo"])
    defaults = {"auto_pad", "group", "dilations"}
    for node in model.graph.node:
        if node.op_type == "Conv":
            kept = [a for a in node.attribute if a.name not in defaults]
            del node.attribute[:]
            node.attribute.extend(kept)
    unset = tmp_path / "unset.onnx"
    onnx.save(model, str(unset))
    result, report = report_of(tmp_path, str(resnet18_onnx["dynamo"]), "--vs", str(unset))
    assert result.returncode == 0, result.stderr
    assert report["summary"]["verdict"] == "no_drift" and report["summary"]["defects"] == []
    # a value other than the default is still a difference (the first Conv padded 2 and 3, not
    # 3 and 3)
    first = conv_node(model, 0)
    kept = [a for a in first.attribute if a.name != "pads"]
    del first.attribute[:]
    first.attribute.extend([*kept, helper.make_attribute("auto_pad", "SAME_UPPER")])
    onnx.save(model, str(unset))
    result, report = report_of(tmp_path, str(resnet18_onnx["dynamo"]), "--vs", str(unset))
    assert result.returncode == 1
    assert any("`auto_pad` \"NOTSET\" → \"SAME_UPPER\"" in d["detail"]
               for d in report["summary"]["defects"]), report["summary"]["defects"]  # fmt: skip


def test_a_changed_weight_names_that_node_as_origin(resnet18_onnx, tmp_path):
    model = load(resnet18_onnx["dynamo"])
    node = conv_node(model, 9)
    init = next(i for i in model.graph.initializer if i.name == node.input[1])
    weight = numpy_helper.to_array(init).copy()
    weight[0] += 0.05
    init.CopyFrom(numpy_helper.from_array(weight, init.name))
    edited = tmp_path / "edited.onnx"
    onnx.save(model, str(edited))
    result, report = report_of(tmp_path, str(resnet18_onnx["dynamo"]), "--vs", str(edited))
    assert result.returncode == 1
    assert report["summary"]["drift_origin"] == node.output[0]
    assert f"1 defect: `{node.output[0]}` weight_mismatch" in result.stdout, result.stdout
    origin = next(x for x in report["layers"] if x["name"] == node.output[0])
    assert origin["cause"] == "weight_mismatch"
    assert f"`{init.name}` differs: max abs diff 5.000e-2" in origin["detail"]


def test_a_changed_attribute_names_that_node_as_origin(resnet18_onnx, tmp_path):
    model = load(resnet18_onnx["dynamo"])
    pool = next(n for n in model.graph.node if n.op_type == "MaxPool")
    for attr in pool.attribute:
        if attr.name == "kernel_shape":
            attr.CopyFrom(helper.make_attribute("kernel_shape", [3, 3]))
        if attr.name == "pads":
            attr.CopyFrom(helper.make_attribute("pads", [0, 0, 2, 2]))  # shifted window, same shape
    edited = tmp_path / "edited.onnx"
    onnx.save(model, str(edited))
    _, report = report_of(tmp_path, str(resnet18_onnx["dynamo"]), "--vs", str(edited))
    assert report["summary"]["drift_origin"] == pool.output[0]


def test_renamed_values_match_by_node_and_removed_values_are_listed(resnet18_onnx, tmp_path):
    model = load(resnet18_onnx["dynamo"])
    relu = next(n for n in model.graph.node if n.op_type == "Relu")
    old, new = relu.output[0], "renamed_relu"
    for n in model.graph.node:
        n.input[:] = [new if i == old else i for i in n.input]
    relu.output[0] = new
    relu.name = relu.name or "first_relu"
    edited = tmp_path / "renamed.onnx"
    onnx.save(model, str(edited))
    _, report = report_of(tmp_path, str(resnet18_onnx["dynamo"]), "--vs", str(edited))
    layer = next(x for x in report["layers"] if x["name"] == old)
    assert layer["status"] == "compared" and "`renamed_relu`" in layer["reason"]
    assert report["summary"]["drift_origin"] is None


def test_one_file_on_onnx_runtime_and_tract(resnet18_onnx, tmp_path):
    """The default: ONNX Runtime as reference, tract as target."""
    result, report = report_of(tmp_path, str(resnet18_onnx["dynamo"]))
    assert report["target"]["runtime"] == "tract"
    assert report["summary"]["layers_compared"] == 49
    # Two independent implementations of fp32 ResNet-18 kernels agree well within 1e-4.
    assert report["summary"]["drift_origin"] is None, result.stdout
    assert 0 < report["summary"]["worst"]["max_abs_diff"]["value"] < 1e-4


def test_a_dynamic_batch_is_one_and_other_dynamic_dimensions_need_a_shape(tmp_path):
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g", [x], [y])
    path = tmp_path / "dyn.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    onnx.save(model, str(path))
    one = run_cli("onnx", str(path), "--vs", str(path), "--json", str(tmp_path / "one.json"))
    assert one.returncode == 0, one.stderr
    report = json.loads((tmp_path / "one.json").read_text())
    assert report["inputs"][0]["shape"] == [1, 4]
    said = "the dynamic batch dimension of `x` (`batch`) was set to 1"
    assert any(w.startswith(said) for w in report["summary"]["warnings"]), report["summary"]
    wide = tmp_path / "wide.onnx"
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "width"
    onnx.save(model, str(wide))
    result = run_cli("onnx", str(wide), "--vs", str(wide))
    assert result.returncode == 2
    assert "dynamic dimension 1 (`width`): set it with --shape x=…" in result.stderr
    ok = run_cli(
        "onnx", str(path), "--vs", str(path), "--batch", "3", "--json", str(tmp_path / "r.json")
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads((tmp_path / "r.json").read_text())["inputs"][0]["shape"] == [3, 4]
    ok = run_cli("onnx", str(path), "--vs", str(path), "--shape", "x=2,4", "-q")
    assert ok.returncode == 0 and ok.stdout == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nothing_here.onnx", "--vs", "nothing_here.onnx"], "cannot access `nothing_here.onnx`"),
        (["{model}", "--target", "tract9"], "unknown runtime `tract9`; did you mean `tract`?"),
        (["{model}", "--vs", "{model}", "--shape", "nope=1,2"], "`nope`, which is not an input"),
        (["{model}", "--vs", "{model}", "--int-range", "5,1"], "LO <= HI"),
        (["{text}", "--vs", "{model}"], "is not a valid ONNX model"),
        (["{model}", "--max-memory", "4X"], "`4X` is not a memory size"),
        # once run at its fixed batch of 1 in silence, as if at 4
        (["{model}", "--batch", "4"], "--batch 4: no input of the model has a dynamic first"),
    ],
)
def test_bad_input_exits_2_with_a_message(resnet18_onnx, tmp_path, args, message):
    text = tmp_path / "notes.onnx"
    text.write_text("not a model")
    args = [a.format(model=resnet18_onnx["dynamo"], text=text) for a in args]
    result = run_cli("onnx", *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "panicked" not in result.stderr


def test_rust_binary_alone_runs_onnx(resnet18_onnx, tmp_path):
    """The ONNX verbs need no Python: the plain Rust binary runs them."""
    import shutil
    import subprocess

    from conftest import rust_exe

    if shutil.which("cargo") is None:
        pytest.skip("needs cargo")
    model = str(resnet18_onnx["dynamo"])
    result = subprocess.run(
        [str(rust_exe()), "onnx", model, "--vs", model], capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "no drift: all 49 compared layers" in result.stdout


def test_an_execution_provider_the_build_lacks_is_reported_unavailable(resnet18_onnx):
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this ONNX Runtime has CUDA")
    result = run_cli("onnx", str(resnet18_onnx["dynamo"]), "--target", "ort:cuda:opt=all")
    assert result.returncode == 2
    assert "execution provider `cuda` is unavailable" in result.stderr
    assert "CPUExecutionProvider" in result.stderr and "panicked" not in result.stderr


def test_provider_options_go_to_a_provider_in_onnx_runtimes_names(resnet18_onnx):
    """`ort:cuda:use_tf32=0` passes the option to the CUDA provider; an option for the CPU,
    which takes none, is a usage error that says where options go."""
    result = run_cli("onnx", str(resnet18_onnx["dynamo"]), "--target", "ort:use_tf32=0")
    assert result.returncode == 2
    assert (
        "options (use_tf32=0) are for an execution provider that takes them, such as "
        "`ort:cuda:use_tf32=0`; CPUExecutionProvider takes none"
    ) in result.stderr
    result = run_cli("onnx", str(resnet18_onnx["dynamo"]), "--target", "ort:cuda:use_tf32")
    assert result.returncode == 2
    assert "`ort:cuda:use_tf32`: unknown execution provider `use_tf32`" in result.stderr
    result = run_cli("onnx", str(resnet18_onnx["dynamo"]), "--target", "ort:opt=most")
    assert result.returncode == 2
    assert (
        "`ort:opt=most`: unknown optimization level `most` (expected disable, basic, extended or "
        "all)"
    ) in result.stderr


def _relu_model(path):
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    onnx.save(model, str(path))


@pytest.mark.parametrize("form", ["npz", "npz_compressed", "pb_folder", "safetensors"])
def test_inputs_from_a_file_are_given_byte_for_byte(tmp_path, form):
    import numpy as np
    from safetensors.numpy import load_file, save_file

    model = tmp_path / "relu.onnx"
    _relu_model(model)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    if form == "npz":
        path = tmp_path / "in.npz"
        np.savez(path, x=x)
    elif form == "npz_compressed":
        path = tmp_path / "in.npz"
        np.savez_compressed(path, x=x)
    elif form == "pb_folder":
        path = tmp_path / "test_data_set_0"
        path.mkdir()
        (path / "input_0.pb").write_bytes(numpy_helper.from_array(x).SerializeToString())
    else:
        path = tmp_path / "in.safetensors"
        save_file({"x": x}, str(path))
    out = tmp_path / "r.json"
    result = run_cli(
        "onnx", str(model), "--vs", str(model), "--inputs", str(path), "--json", str(out)
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["inputs"] == [{"name": "x", "shape": [3, 4], "dtype": "float32"}]
    assert report["seed"] is None
    saved = load_file(str(tmp_path / "r.inputs.safetensors"))
    assert saved["x"].tobytes() == x.tobytes()


def test_a_file_that_is_not_npz_is_named(tmp_path):
    model = tmp_path / "relu.onnx"
    _relu_model(model)
    bogus = tmp_path / "in.npz"
    bogus.write_text("no zip here")
    result = run_cli("onnx", str(model), "--vs", str(model), "--inputs", str(bogus))
    assert result.returncode == 2 and "is not a readable .npz file" in result.stderr


def test_expected_values_from_npz_and_the_onnx_verb_without_torch(tmp_path):
    """`layerdiff onnx` from the pip-installed entry point never imports torch."""
    import subprocess
    import sys

    import numpy as np

    model = tmp_path / "relu.onnx"
    _relu_model(model)
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    np.savez(tmp_path / "in.npz", x=x)
    y = np.maximum(x, 0)
    y[1, 3] += 0.5  # one wrong expected value
    np.savez(tmp_path / "expected.npz", y=y)
    script = (
        "import sys; sys.modules['torch'] = None\n"  # any `import torch` now fails
        "from layerdiff._cli import main\n"
        f"sys.exit(main(['onnx', {str(model)!r}, '--reference', 'expected:{tmp_path}/expected.npz',"
        f" '--target', 'tract', '--inputs', {str(tmp_path / 'in.npz')!r}]))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 1, result.stderr
    assert "1 defect: `y`" in result.stdout and "the reference is off here" in result.stdout


def test_expected_values_can_be_the_target_and_only_the_values_they_hold_are_compared(tmp_path):
    """A file of expected values is a side like any other: as the target, the values it holds
    are compared with the reference's, and the values it lacks are not asked of it."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y_info = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["h"], name="relu"),
         helper.make_node("Neg", ["h"], ["y"], name="neg")],
        "two", [x_info], [y_info],
    )  # fmt: skip
    model = tmp_path / "two.onnx"
    opsets = [helper.make_opsetid("", 17)]
    onnx.save(helper.make_model(graph, ir_version=10, opset_imports=opsets), model)
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    np.savez(tmp_path / "in.npz", x=x)
    y = -np.maximum(x, 0)
    y[0, 2] -= 0.25
    np.savez(tmp_path / "expected.npz", y=y)
    out = tmp_path / "r.json"
    result = run_cli(
        "onnx", str(model), "--reference", "ort", "--target", f"expected:{tmp_path}/expected.npz",
        "--inputs", str(tmp_path / "in.npz"), "--json", str(out),
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    report = json.loads(out.read_text())
    assert [x["name"] for x in report["layers"]] == ["y"], "`h` is not in the file: not asked"
    assert report["summary"]["drift_origin"] == "y"
    assert report["target"]["runtime"] == "expected"
    assert report["layers"][0]["accumulated"]["max_abs_diff"] == 0.25


def test_values_fused_by_an_optimizer_are_explained_not_mismatched(resnet18_onnx, tmp_path):
    """ONNX Runtime names a fused Conv+Relu after the Conv; matching by node must not pair the
    Conv's value with the fused node's (post-ReLU) output."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    onnxruntime.InferenceSession(
        str(resnet18_onnx["dynamo"]), options, providers=["CPUExecutionProvider"]
    )
    result, report = report_of(
        tmp_path, str(resnet18_onnx["dynamo"]), "--vs", str(tmp_path / "optimized.onnx")
    )
    assert result.returncode == 0, result.stdout
    fused = [x for x in report["layers"] if x["status"] == "unmapped"]
    assert len(fused) == 9 and all("is now a FusedConv" in x["reason"] for x in fused)


def test_a_node_an_optimizer_bypassed_is_explained(tmp_path):
    def save(nodes, path):
        x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])
        y = helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [2, 4])
        graph = helper.make_graph(nodes, "g", [x], [y])
        onnx.save(
            helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9),
            str(path),
        )

    save([helper.make_node("Relu", ["x"], ["r"], name="relu"),
          helper.make_node("Identity", ["r"], ["i"], name="identity"),
          helper.make_node("Neg", ["i"], ["out"], name="neg")], tmp_path / "a.onnx")  # fmt: skip
    save([helper.make_node("Relu", ["x"], ["r"], name="relu"),
          helper.make_node("Neg", ["r"], ["out"], name="neg")], tmp_path / "b.onnx")  # fmt: skip
    _, report = report_of(tmp_path, str(tmp_path / "a.onnx"), "--vs", str(tmp_path / "b.onnx"))
    identity = next(x for x in report["layers"] if x["name"] == "i")
    assert identity["status"] == "unmapped"
    assert "the target's Neg node `neg` now reads this node's inputs" in identity["reason"]
    assert report["summary"]["drift_origin"] is None


def test_timings_are_printed_and_kept_out_of_the_json_unless_asked(resnet18_onnx, tmp_path):
    src = str(resnet18_onnx["dynamo"])
    plain, report = report_of(tmp_path, src)
    assert "timings" not in report and "timings (" not in plain.stderr
    timed, report = report_of(tmp_path, src, "--timings")
    phases = {t["phase"]: t for t in report["timings"]}
    assert phases["reference run"]["by"] == "runtime" and phases["comparison"]["by"] == "layerdiff"
    assert all(t["seconds"] >= 0 for t in report["timings"])
    assert "layerdiff's own work:" in timed.stderr
    assert "rendering and writing reports" in timed.stderr


def test_an_op_onnx_runtime_lacks_on_the_target_leaves_out_its_layers(tmp_path):
    """ONNX Runtime's CPU provider has no float64 Acosh: against tract, its layer and the one
    after it are not compared, and why; the one before and the branch beside it are."""
    import onnx
    from onnx import TensorProto, helper

    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.DOUBLE, [3, 3])  # noqa: E731
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Acosh", ["a"], ["h"], name="acosh"),
        helper.make_node("Neg", ["h"], ["y"], name="neg"),
        helper.make_node("Tanh", ["a"], ["z"], name="tanh"),
    ]
    graph = helper.make_graph(nodes, "g", [vi("x")], [vi("y"), vi("z")])
    path = tmp_path / "acosh.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=10), str(path))  # fmt: skip
    out = tmp_path / "r.json"
    result = run_cli("onnx", str(path), "--reference", "tract", "--target", "ort",
                     "--json", str(out))  # fmt: skip
    assert result.returncode == 1, result.stderr
    report = json.loads(out.read_text())
    status = {x["name"]: (x["status"], x["reason"]) for x in report["layers"]}
    assert {n for n, (s, _) in status.items() if s == "compared"} == {"a", "z"}, status
    why = "onnxruntime cannot run `acosh` (Acosh: no kernel for Acosh(9) and its input types)"
    assert status["h"][1] == f"not compared: {why}, which this layer depends on"
    assert status["y"][1] == f"not compared: {why}, which this layer depends on"
    assert report["summary"]["verdict"] == "inconclusive"


def test_an_op_the_target_lacks_leaves_out_its_layers_and_compares_the_others(tmp_path):
    """tract has no Det: the layers that depend on it are reported as not compared, and why;
    the others (before it, and on a branch beside it) are compared; the run cannot say "no
    drift" (exit 1, inconclusive), whole or in segments."""
    import onnx
    from onnx import TensorProto, helper

    vi = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)  # noqa: E731
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Det", ["a"], ["d"], name="det"),
        helper.make_node("Neg", ["d"], ["y"], name="neg"),
        helper.make_node("Sigmoid", ["a"], ["s"], name="sigmoid"),
        helper.make_node("Tanh", ["s"], ["z"], name="tanh"),
    ]
    graph = helper.make_graph(nodes, "g", [vi("x", [3, 3])], [vi("y", []), vi("z", [3, 3])])
    path = tmp_path / "det.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=10), str(path))  # fmt: skip
    for extra in ([], ["--max-memory", "256"]):
        out = tmp_path / "r.json"
        result = run_cli("onnx", str(path), "--target", "tract", *extra, "--json", str(out))
        assert result.returncode == 1, result.stderr
        report = json.loads(out.read_text())
        status = {x["name"]: (x["status"], x["reason"]) for x in report["layers"]}
        assert {n for n, (s, _) in status.items() if s == "compared"} == {"a", "s", "z"}, status
        for name in ("d", "y"):
            assert status[name][1].startswith("not compared: tract cannot run `det` (Det"), status
        summary = report["summary"]
        assert summary["verdict"] == "inconclusive"
        assert "tract cannot run `det`" in summary["inconclusive"]
        assert summary["warnings"][0].startswith("tract cannot run `det` (Det")
        assert ("segments" in result.stderr) == bool(extra)
