"""Measuring the graph that ships: an optimized target is compared where the optimized graph
has values, values ONNX Runtime renamed into its blocked NCHWc layout are traced back to their
origins, and no value in a blocked layout is ever compared with one in NCHW."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from builders.graphs import save_graph
from onnx import helper, numpy_helper
from test_onnx_command import report_of

onnxruntime = pytest.importorskip("onnxruntime")


def ort_optimized(source, path, level="ORT_ENABLE_ALL"):
    """The file ONNX Runtime writes when it optimizes `source` at `level` on the CPU."""
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = getattr(onnxruntime.GraphOptimizationLevel, level)
    options.optimized_model_filepath = str(path)
    onnxruntime.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    return path


def layer(report, name):
    return next(x for x in report["layers"] if x["name"] == name)


def test_opt_all_is_compared_in_the_graph_that_ships(resnet18_onnx, tmp_path):
    """Exposing every value of the file would keep ONNX Runtime from fusing (17 Relu and 8 Add
    survived beside the NCHWc Convs): the optimized graph is compared instead, and the report
    says how much of it could be, and that exposing changed no output bit."""
    result, report = report_of(tmp_path, str(resnet18_onnx["dynamo"]), "--target", "ort:opt=all")
    assert result.returncode == 0, result.stdout
    graph = report["target_graph"]
    assert graph["nodes_optimized"] < 0.6 * graph["nodes_in_file"]  # the fused graph ran
    assert graph["outputs_checked"] == graph["outputs_identical"] == 1
    assert graph["outputs_max_abs_diff"] == 0
    assert graph["values_surviving"] == report["summary"]["layers_compared"] == 24
    assert graph["values_restored"] == 20
    assert "applied once" in report["target"]["detail"]
    assert "target graph:" in result.stdout and "bit-identical" in result.stdout
    # A residual block fused into one NCHWc Conv: its output compared, its inside explained.
    fused_block = layer(report, "relu_2")
    assert fused_block["status"] == "compared"
    assert "(Conv + Add + Relu) computes it in NCHWc layout" in fused_block["reason"]
    residual = layer(report, "add")
    assert residual["status"] == "unmapped"
    assert "fused or removed: the target's Conv node" in residual["reason"]
    assert "produces `relu_2` without it" in residual["reason"]
    # Fusion is the point of an optimized graph, not a gap in coverage.
    assert not any(w.startswith("low coverage") for w in report["summary"]["warnings"])
    assert report["summary"]["drift_origin"] is None


def test_vs_an_ort_optimized_file_finds_the_renamed_values(resnet18_onnx, tmp_path):
    """Against ONNX Runtime's own saved `opt=all` file, 3 of 65 values used to be found; the
    rest were 'not in the target' although they were there, renamed `reorder_token_N`."""
    for exporter, compared in (("dynamo", 24), ("legacy", 24)):
        source = resnet18_onnx[exporter]
        optimized = ort_optimized(source, tmp_path / f"{exporter}.opt.onnx")
        result, report = report_of(tmp_path, str(source), "--vs", str(optimized))
        assert result.returncode == 0, result.stdout
        assert report["summary"]["layers_compared"] == compared, exporter
        restored = [
            x for x in report["layers"] if "renamed by the optimizer" in (x["reason"] or "")
        ]
        assert len(restored) >= 20 and all(x["status"] == "compared" for x in restored)
        assert "target_graph" not in report  # no unmodified file to check against


def test_drift_inside_an_optimized_file_is_born_at_the_fused_node(resnet18_onnx, tmp_path):
    """A wrong filter in one fused NCHWc Conv: the origin is the value that node computes (its
    local error is its own), not a layer downstream."""
    optimized = onnx.load(str(ort_optimized(resnet18_onnx["dynamo"], tmp_path / "opt.onnx")))
    node = next(n for n in optimized.graph.node if n.name == "relu_5_nchwc")
    weight = next(t for t in optimized.graph.initializer if t.name == node.input[1])
    values = numpy_helper.to_array(weight).copy()
    values[0] *= 1.5
    weight.CopyFrom(numpy_helper.from_array(values, weight.name))
    onnx.save(optimized, str(tmp_path / "faulty.onnx"))
    result, report = report_of(
        tmp_path, str(resnet18_onnx["dynamo"]), "--vs", str(tmp_path / "faulty.onnx")
    )
    assert result.returncode == 1
    assert report["summary"]["drift_origin"] == "relu_5"
    assert layer(report, "relu_5")["local_exceeds"]
    assert not layer(report, "relu_6")["local_exceeds"]  # inherited, not its own


def _conv_gelu_conv(path):
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Gelu", ["c1"], ["g"], name="gelu"),
        helper.make_node("Conv", ["g", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["y"], name="relu"),
    ]
    weights = {"w1": (16, 8, 3, 3), "w2": (16, 16, 3, 3)}
    return save_graph(path, nodes, (1, 8, 16, 16), (1, 16, 16, 16), weights)


def test_an_elementwise_op_on_blocked_data_is_not_false_drift(tmp_path):
    """ONNX Runtime runs a Gelu between two NCHWc Convs on the blocked data, keeping the node's
    name; pairing by node name compared NCHW numbers with blocked ones and reported drift born
    at the Gelu (as on a timm ConvNeXt). Its value is given back in NCHW instead."""
    source = _conv_gelu_conv(tmp_path / "m.onnx")
    optimized = ort_optimized(source, tmp_path / "m.opt.onnx")
    assert any(n.op_type == "Gelu" and n.input[0].startswith("reorder_token")
               for n in onnx.load(str(optimized)).graph.node)  # fmt: skip
    result, report = report_of(tmp_path, str(source), "--vs", str(optimized))
    assert result.returncode == 0, result.stdout
    gelu = layer(report, "g")
    assert gelu["status"] == "compared" and "`gelu` (Gelu)" in gelu["reason"]
    assert gelu["accumulated"]["max_abs_diff"] < 1e-5
    assert report["summary"]["layers_compared"] == 3


def test_a_weight_edited_where_the_optimizer_reorders_it_is_the_weight(tmp_path):
    """At opt=all ONNX Runtime runs `conv1` as an NCHWc Conv on a reordered copy of its weight,
    which the run cannot find by name: its value still survives and exceeds, and the kernel was
    blamed ("report it to the runtime"). The two files differ in that weight: it is the cause."""
    source = _conv_gelu_conv(tmp_path / "m.onnx")
    model = onnx.load(str(source))
    w1 = next(t for t in model.graph.initializer if t.name == "w1")
    w1.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w1) * 1.1, "w1"))
    onnx.save(model, str(tmp_path / "edited.onnx"))
    result, report = report_of(
        tmp_path, str(source), "--vs", str(tmp_path / "edited.onnx"), "--target", "ort:opt=all"
    )
    assert result.returncode == 1, result.stdout
    defects = report["summary"]["defects"]
    assert [(d["layer"], d["cause"]) for d in defects] == [("c1", "weight_mismatch")], defects
    assert "`w1`" in defects[0]["detail"] and "report it to the runtime" not in defects[0]["fix"]
    assert layer(report, "c1")["cause"] == "weight_mismatch"


def test_layerdiff_torch_against_opt_all_compares_module_outputs_that_survive(tmp_path):
    """`layerdiff torch --target ort:opt=all`: layers are mapped on the export, then found in
    the graph ONNX Runtime optimized; a BatchNorm fused into its Conv says so."""
    from conftest import run_cli

    out = tmp_path / "r.json"
    result = run_cli("torch", "resnet18", "--target", "ort:opt=all", "--json", str(out))
    assert result.returncode == 0, result.stderr
    import json

    report = json.loads(out.read_text())
    graph = report["target_graph"]
    assert graph["outputs_identical"] == graph["outputs_checked"] == 1
    assert graph["values_restored"] >= 20
    assert report["summary"]["layers_compared"] == graph["values_surviving"]
    block = layer(report, "layer1.0.relu#2")  # the ReLU after the residual add
    assert block["status"] == "compared" and "renamed by the optimizer" in block["reason"]
    bn = layer(report, "layer1.0.bn2")
    assert bn["status"] == "unmapped" and "fused or removed by the optimizer" in bn["reason"]


def test_a_layer_the_optimizer_folds_into_a_constant_is_explained():
    """ONNX Runtime folds BERT's token-type embedding (a Gather of constant all-zero type ids)
    into an initializer: the layer has no computed value in the graph that runs, which must be said,
    not requested from the run (that was a crash)."""
    pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from builders import zoo
    from layerdiff import compare_torch_onnx

    torch.manual_seed(0)
    model, inputs = zoo.bert()
    report = compare_torch_onnx(model.eval(), inputs, target="ort:opt=all")
    folded = [
        x for x in report.layers if "folded into a constant by the optimizer" in (x["reason"] or "")
    ]
    assert [x["name"] for x in folded] == ["model.embeddings.token_type_embeddings"]
    graph = report.target_graph
    assert graph["outputs_identical"] == graph["outputs_checked"] == 1
    assert report.drift_origin is None and report.summary["inconclusive"] is None


def test_a_blocked_value_onnx_runtime_cannot_convert_back_still_runs(tmp_path):
    """A squeeze-excitation's 6 reduced channels: ONNX Runtime computes them blocked (its Conv,
    then the SiLU on blocked data), but its ReorderInput converts only multiples of 4
    channels, and the run failed (EfficientNet at `opt=all`). Such a value is given back for
    comparison while its readers keep reading the blocked one."""
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
        helper.make_node("ReduceMean", ["c0", "axes"], ["pooled"], name="mean"),
        helper.make_node("Conv", ["pooled", "w1"], ["reduced"], name="reduce"),
        helper.make_node("Sigmoid", ["reduced"], ["s"], name="sigmoid_1"),
        helper.make_node("Mul", ["reduced", "s"], ["silu"], name="silu"),
        helper.make_node("Conv", ["silu", "w2"], ["expanded"], name="expand"),
        helper.make_node("Sigmoid", ["expanded"], ["gate"], name="sigmoid_2"),
        helper.make_node("Mul", ["c0", "gate"], ["y"], name="scale"),
    ]
    weights = {"w0": (16, 16, 3, 3), "w1": (6, 16, 1, 1), "w2": (16, 6, 1, 1)}
    axes = numpy_helper.from_array(np.array([2, 3], np.int64), "axes")
    shape = (1, 16, 8, 8)
    save_graph(tmp_path / "se.onnx", nodes, shape, shape, weights, extra=[axes])
    optimized = onnx.load(str(ort_optimized(tmp_path / "se.onnx", tmp_path / "se.opt.onnx")))
    assert any(n.name == "reduced_nchwc" for n in optimized.graph.node)  # blocked, 6 channels
    result, report = report_of(tmp_path, str(tmp_path / "se.onnx"), "--target", "ort:opt=all")
    assert result.returncode == 0, result.stdout
    graph = report["target_graph"]
    assert graph["outputs_identical"] == graph["outputs_checked"] == 1
    reduced = layer(report, "reduced")
    assert reduced["status"] == "compared" and "renamed by the optimizer" in reduced["reason"]
    assert reduced["shape"] == [1, 6, 1, 1]


def test_an_optimizing_reference_says_it_is_not_the_graph_that_ships(resnet18_onnx, tmp_path):
    """Only the target is optimized first: values exposed on an optimizing reference keep it from
    fusing, which the summary must say rather than name `opt=all` as if it had run."""
    result, report = report_of(
        tmp_path, str(resnet18_onnx["dynamo"]), "--reference", "ort:opt=all", "--target", "ort"
    )
    assert any(
        w.startswith("the reference (onnxruntime") and "--target" in w
        for w in report["summary"]["warnings"]
    ), report["summary"]["warnings"]
    assert "not the graph that ships" in result.stdout


def test_a_node_the_transpose_optimizer_rewired_is_not_paired_by_its_name(encoder_onnx, tmp_path):
    """ONNX Runtime's transpose optimizer moves the Transpose before each attention head's
    Reshape into the MatMul after it (FusedMatMul's transBatch): the Reshape keeps its node
    name but reads another value and computes another one. Paired by that name, a clean
    encoder showed 9 `layout_permutation` defects at `--target ort:opt=extended` and against
    the saved file; now it has none, and the Reshape says why it has no counterpart."""
    optimized = ort_optimized(encoder_onnx, tmp_path / "enc.opt.onnx", "ORT_ENABLE_EXTENDED")
    for args in (("--vs", str(optimized)), ("--target", "ort:opt=extended")):
        result, report = report_of(tmp_path, str(encoder_onnx), *args)
        assert result.returncode == 0, result.stdout
        assert report["summary"]["defects"] == [], args
        head = layer(report, "view_4")
        assert head["status"] == "unmapped", args
        assert "reads `view_1` where the reference's reads `transpose_2`" in head["reason"]


def test_an_edited_norm_in_an_optimized_file_is_the_one_defect(encoder_onnx, tmp_path):
    """One LayerNormalization's epsilon edited, then the file optimized by ONNX Runtime (the
    norm fused into a SkipLayerNormalization): that norm is the one defect."""
    from faults import edited_norm

    norm = edited_norm(encoder_onnx, tmp_path / "edited.onnx")
    optimized = ort_optimized(tmp_path / "edited.onnx", tmp_path / "edited.opt.onnx",
                              "ORT_ENABLE_EXTENDED")  # fmt: skip
    result, report = report_of(tmp_path, str(encoder_onnx), "--vs", str(optimized))
    assert result.returncode == 1, result.stdout
    defects = report["summary"]["defects"]
    assert [(d["layer"], d["cause"]) for d in defects] == [(norm.output[0], "file_differs")]
    assert "the runtime is not at fault" in defects[0]["fix"], defects[0]["fix"]


def test_a_conv_that_absorbed_the_mul_after_it_is_not_taken_for_the_conv(tmp_path):
    """ONNX Runtime's basic level fuses a Conv and the Mul by a constant after it (ConvNeXt's
    layer scale) into the Conv node, which keeps its name and now writes the Mul's value. The
    Conv's value was paired with it by node name ("matched by node: the target calls it
    `mul`"), and a timm ConvNeXt read "12 defects: op_implementation, over 1000×" on a clean
    run. The Conv's value is fused away; the Mul's is compared."""
    gamma = numpy_helper.from_array(np.full((1, 8, 1, 1), 1e-1, np.float32), "gamma")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["conv"], name="conv_node", pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["conv", "gamma"], ["scaled"], name="scale_node"),
        helper.make_node("Relu", ["scaled"], ["y"], name="relu_node"),
    ]
    model = save_graph(tmp_path / "m.onnx", nodes, (1, 4, 8, 8), (1, 8, 8, 8),
                       {"w": (8, 4, 3, 3)}, extra=[gamma])  # fmt: skip
    result, report = report_of(tmp_path, str(model), "--target", "ort:opt=basic")
    assert result.returncode == 0, result.stdout
    assert report["summary"]["defects"] == [], report["summary"]["defects"]
    conv = layer(report, "conv")
    assert conv["status"] == "unmapped", conv
    assert "`conv_node`" in conv["reason"] and "`scaled`" in conv["reason"], conv["reason"]
    assert layer(report, "scaled")["status"] == "compared"


def test_a_node_the_transpose_optimizer_rewired_is_no_file_difference(tmp_path):
    """ONNX Runtime's transpose optimizer (basic level) moves a Transpose across a Split: the
    Split keeps its name, reads the value before the Transpose, and splits another axis. In a
    timm ViT's file against its basic-optimized file (attention's qkv unbound) that read "20
    defects: `…/attn/Split` file_differs: an attribute differs: `axis` 0 → 2". A node that reads
    other values is another computation under its old name, not an edited attribute."""
    shape = numpy_helper.from_array(np.array([1, 4, 3, 2, 2], np.int64), "shape")
    split = numpy_helper.from_array(np.array([1, 1, 1], np.int64), "sizes")
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
        helper.make_node("Transpose", ["r"], ["t"], name="tr", perm=[2, 0, 3, 1, 4]),
        helper.make_node("Split", ["t", "sizes"], ["q", "k", "v"], name="split", axis=0),
        *[helper.make_node("Squeeze", [n, "zero"], [f"{n}s"], name=f"sq_{n}") for n in "qkv"],
        helper.make_node("Add", ["qs", "ks"], ["qk"], name="add1"),
        helper.make_node("Add", ["qk", "vs"], ["y"], name="add2"),
    ]
    zero = numpy_helper.from_array(np.array([0], np.int64), "zero")
    model = save_graph(tmp_path / "m.onnx", nodes, (1, 4, 12), (1, 2, 4, 2), {},
                       opset=17, extra=[shape, split, zero])  # fmt: skip
    optimized = ort_optimized(model, tmp_path / "m.basic.onnx", "ORT_ENABLE_BASIC")
    moved = next(n for n in onnx.load(str(optimized)).graph.node if n.name == "split")
    assert moved.input[0] != "t", "the optimizer moved the Transpose after the Split"
    result, report = report_of(tmp_path, str(model), "--vs", str(optimized))
    assert result.returncode == 0, result.stdout
    assert report["summary"]["defects"] == [], report["summary"]["defects"]


@pytest.fixture(scope="module")
def int8_activations(resnet18_onnx, tmp_path_factory):
    """The legacy export quantized with int8 activations and weights (QDQ, ONNX Runtime's
    static quantizer, as for an accelerator that takes signed int8), and that file with the
    stored int8 weight of `/layer2/layer2.1/conv1/Conv` scaled by 1.03: at `opt=all` ONNX
    Runtime turns int8 activations into uint8 (zero point + 128) under the node's name."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    folder = tmp_path_factory.mktemp("int8_activations")
    source = onnx.load(str(resnet18_onnx["legacy"]))
    [given] = source.graph.input
    shape = [d.dim_value for d in given.type.tensor_type.shape.dim]

    class Samples(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.left = [{given.name: rng.standard_normal(shape).astype(np.float32)}] * 2

        def get_next(self):
            return self.left.pop() if self.left else None

    clean = folder / "s8s8.onnx"
    quantize_static(
        str(resnet18_onnx["legacy"]), str(clean), Samples(), quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
    )  # fmt: skip
    model = onnx.load(str(clean))
    model.ir_version = 10  # what ONNX Runtime 1.31 reads
    onnx.save(model, str(clean))
    conv = next(n for n in model.graph.node if n.name == "/layer2/layer2.1/conv1/Conv")
    dequantize = next(n for n in model.graph.node if n.output[0] == conv.input[1])
    weight = next(t for t in model.graph.initializer if t.name == dequantize.input[0])
    codes = numpy_helper.to_array(weight)
    moved = np.clip(np.round(codes.astype(np.float64) * 1.03), -127, 127).astype(codes.dtype)
    weight.CopyFrom(numpy_helper.from_array(moved, weight.name))
    onnx.save(model, str(folder / "bug.onnx"))
    changed = int(np.count_nonzero(moved != codes))
    files = {"clean": clean, "bug": folder / "bug.onnx", "weight": dequantize.output[0]}
    return {**files, "changed": changed, "codes": codes.size}


def test_int8_activations_optimized_to_uint8_are_not_compared_as_stored(int8_activations, tmp_path):
    """ONNX Runtime's optimizer stores each int8 activation as uint8, 128 higher, and keeps the
    QuantizeLinear's name: those codes stand for the same numbers, and the model's outputs stay
    bit-identical. Paired by the node's name they read as a 128 drift (21 defects, exit 1)."""
    result, report = report_of(tmp_path, str(int8_activations["clean"]), "--target", "ort:opt=all")
    assert result.returncode == 0, result.stdout
    assert report["summary"]["defects"] == [], report["summary"]["defects"]
    assert report["target_graph"]["outputs_identical"] == 1
    quantized = layer(report, "input.1_QuantizeLinear_Output")
    assert quantized["status"] == "unmapped"
    assert "uint8" in quantized["reason"] and "int8" in quantized["reason"], quantized["reason"]
    # the numbers they stand for are compared where they are dequantized
    assert layer(report, "/relu/Relu_output_0_DequantizeLinear_Output")["status"] == "compared"


def test_an_int8_weight_edited_is_checked_against_the_optimized_files_codes(
    int8_activations, tmp_path
):
    """The edited file, optimized: its QLinearConv reads the int8 codes themselves. They are
    dequantized with the target's own scale and zero point before the reference's weight is
    checked against them: only the codes the edit moved differ, not every element (read
    against the codes themselves, every element had moved)."""
    clean, bug = str(int8_activations["clean"]), str(int8_activations["bug"])
    result, report = report_of(tmp_path, clean, "--vs", bug, "--target", "ort:opt=all")
    assert result.returncode == 1, result.stdout
    [defect] = report["summary"]["defects"]
    assert defect["cause"] == "weight_mismatch", defect
    # the first value the edit reaches: the weight, dequantized
    assert defect["layer"] == int8_activations["weight"], defect
    changed, codes = int8_activations["changed"], int8_activations["codes"]
    assert f"{changed} of {codes} elements moved" in defect["detail"], (changed, defect["detail"])
