"""Lower-precision targets (`--dtype`): the export converted to float16 or quantized to int8
with ONNX Runtime's own tools, or PyTorch in float16/bfloat16; the keep-in-float32 advice names
the layer that overflows, and re-running with it kept shows whether that fixes the drift."""

from __future__ import annotations

import pytest
from conftest import ROOT, run_cli

torch = pytest.importorskip("torch")

import layerdiff  # noqa: E402
from layerdiff.torch import compare_torch, compare_torch_onnx  # noqa: E402

OVERFLOW = f"{ROOT}/tests/builders/overflow.py:build"


@pytest.fixture(scope="module")
def overflow():
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from builders.overflow import build

    return build()


def keep(report) -> dict:
    return report.data["keep_float32"]


def test_float16_export_overflow_is_found_kept_in_float32_and_the_fix_checked(overflow, tmp_path):
    model, inputs = overflow
    report = compare_torch_onnx(model, inputs, dtype="fp16", workdir=tmp_path)
    assert "converted to float16" in report.data["target"]["detail"]
    assert report.drift_origin == "up"
    origin = report.layer("up")
    assert origin["cause"] == "precision_loss" and "overflow float16's range" in origin["detail"]
    advice = keep(report)
    assert advice["precision"] == "float16"
    assert [k["layer"] for k in advice["layers"]] == ["up", "norm"]
    assert advice["layers"][0]["nodes"] == [report.layer("up")["location"]["node"]]
    check = advice["check"]
    assert check["kept"] == ["up", "norm"] and check["output"] == "head"
    # the model's output was NaN in float16; with the two layers kept it is finite and close
    assert check["output_nonfinite_before"] == 40 and check["output_nonfinite_after"] == 0
    # an output all NaN differs by no finite amount: a CI gate on the figure must not pass it
    assert check["output_max_abs_diff_before"] == "inf"
    assert check["output_max_abs_diff_after"] < 1e-3
    assert check["exceeding_after"] < check["exceeding_before"]
    assert check["verdict"].startswith("keeping 2 layer(s) in float32 reduces the drift")
    # the headline names where the overflow is born, and the output is said to be NaN
    headline = report.summary_text().splitlines()[0]
    assert "overflow float16's range to ±Inf, first `up`" in headline, headline
    assert report.summary["precision"]["output_nonfinite"] == 40
    assert report.summary["precision"]["output_max_abs_diff"] == "inf"
    assert "the output `head` is NaN or ±Inf in 40 element(s)" in report.summary_text()
    # the kept file really computes the two layers in float32 from end to end
    import onnx

    kept = onnx.load(str(tmp_path / "model.fp16-kept.onnx"))
    types = {v.name: v.type.tensor_type.elem_type for v in kept.graph.value_info}
    assert types[report.layer("up")["location"]["value"]] == onnx.TensorProto.FLOAT


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_a_masks_sentinel_the_narrower_target_holds_as_its_extreme_is_no_drift(dtype):
    """float32's extreme added as a causal mask: float16 holds -65504 there, bfloat16 its own
    largest; both mean "masked". Read as differences they were 3.4e38, the mask's `add` the
    worst layer, blamed on the target's Add and advised to stay in float32."""
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from builders.masked import build

    model, inputs = build()
    if dtype == "fp16":
        report = compare_torch_onnx(model, inputs, dtype="fp16")
    else:
        report = compare_torch(model, inputs, target="torch:bf16")
    add = report.layer(":add")
    assert add["accumulated"]["sentinels"] == 2 * 16 * 15 // 2
    assert add["accumulated"]["max_abs_diff"] < 1.0 and not add["local_exceeds"], add
    assert add["cause"] in (None, "inherited"), add["detail"]
    assert report.summary["worst"]["max_abs_diff"]["value"] < 1.0
    advice = report.data.get("keep_float32") or {"layers": []}
    assert ":add" not in [k["layer"] for k in advice["layers"]]
    assert any("mask's sentinel" in w for w in report.summary["warnings"])


@pytest.mark.parametrize(
    "sides",
    [{"dtype": "fp16"}, {"target": "torch:fp16"}, {"target": "torch:bf16"},
     {"target": "torch:fp16", "reference": "torch:bf16"}],
)  # fmt: skip
def test_a_padded_decoders_rows_that_see_no_key_stay_finite(sides):
    """A left-padded batch: the first tokens' queries see no key (causal mask and padding).
    Fed to a float16 or bfloat16 re-run, float32's mask extreme read as -Inf and those rows'
    softmax came out NaN, an overflow the target's own run never makes: a clean decoder
    exited 1 on every such side. The sentinel is held as the target dtype's own extreme."""
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from builders.padded_decoder import build

    model, inputs = build()
    compare = compare_torch_onnx if "dtype" in sides else compare_torch
    report = compare(model, inputs, seed=0, **sides)
    s = report.summary
    assert s["defects"] == [] and s["precision"]["overflow"] == 0, s["precision"]
    softmax = report.layer("model.layers.0.self_attn:softmax")
    assert softmax["local"]["nan_mismatch"] == 0, softmax["local"]
    assert softmax["accumulated"]["nan_mismatch"] == 0, softmax["accumulated"]


def test_given_layers_are_kept_and_the_report_is_of_the_kept_model(overflow):
    model, inputs = overflow
    report = compare_torch_onnx(model, inputs, dtype="fp16", keep_fp32=["up", "norm"])
    assert report.layer("head")["accumulated"]["nan_mismatch"] == 0
    assert "2 node(s) kept in float32" in report.data["target"]["detail"]
    assert keep(report)["check"]["output_nonfinite_before"] == 40


def test_a_pytorch_target_keeps_modules_in_float32(overflow):
    model, inputs = overflow
    report = compare_torch(model, inputs, target="torch:fp16")
    assert report.layer("up")["target_dtype"] == "float16"
    # a layer the target overflows is not closer to float64 for it (its NaN read as 0 there)
    norm = report.layer("norm")
    assert norm["float64"]["target"] == "inf", norm["float64"]
    assert "the target is closer to the truth" not in norm["detail"], norm["detail"]
    check = keep(report)["check"]
    assert check["output_nonfinite_before"] == 40 and check["output_nonfinite_after"] == 0


@pytest.mark.parametrize("target", ["torch:fp16", "torch:amp-fp16"])
def test_a_pytorch_target_in_float16_takes_its_own_list_from_the_command_line(tmp_path, target):
    result = run_cli(
        "torch", OVERFLOW, "--target", target, "--keep-fp32", "up,norm",
        "--json", str(tmp_path / "r.json"), "-q",
    )  # fmt: skip
    assert result.returncode in (0, 1), result.stderr
    import json

    check = json.loads((tmp_path / "r.json").read_text())["keep_float32"]["check"]
    assert check["kept"] == ["up", "norm"] and check["output_nonfinite_after"] == 0


def test_under_autocast_the_advice_is_checked_with_the_modules_run_outside_it(overflow):
    """Autocast lowers op by op, yet a module can run with it off (what AMP code does for a
    sensitive block): the advice is checked that way (it was listed and left unchecked)."""
    model, inputs = overflow
    report = compare_torch(model, inputs, target="torch:amp-fp16")
    assert report.drift_origin == "up" and report.layer("up")["target_dtype"] == "float16"
    advice = keep(report)
    assert advice["precision"] == "float16" and advice["layers"][0]["layer"] == "up"
    check = advice["check"]
    assert check["output_nonfinite_before"] == 40 and check["output_nonfinite_after"] == 0
    assert check["verdict"].startswith("keeping 1 layer(s) in float32 reduces the drift")


def test_int8_quantization_names_the_layers_that_lose_most(resnet18):
    model, inputs, _ = resnet18
    report = compare_torch_onnx(model, inputs, dtype="int8")
    assert "quantized to int8" in report.data["target"]["detail"]
    s = report.summary
    # the Conv is fused with its BatchNorm at export: the first value is `bn1`'s, and no Conv
    # is paired with its BatchNorm's quantized copy
    assert s["layers_compared"] >= 46 and s["drift_origin"] == "bn1"
    convs = [x for x in report.data["layers"] if x["module_type"] == "Conv2d"]
    assert len(convs) == 20 and all(x["status"] == "unmapped" for x in convs), [
        x["name"] for x in convs if x["status"] != "unmapped"
    ]
    origin = report.layer("bn1")
    # the quantized weight is the quantization, not a different weight
    assert origin["cause"] == "precision_loss" and "int8" in origin["detail"], origin["detail"]
    advice = keep(report)
    assert advice["precision"] == "int8" and advice["layers"]
    assert all(k["nodes"] for k in advice["layers"])
    ranked = [w["layer"] for w in s["most_own_error"]]
    assert ranked and ranked[0] == advice["layers"][0]["layer"]
    assert advice["check"]["exceeding_after"] <= advice["check"]["exceeding_before"]


def test_a_conv_folded_with_its_identity_batchnorm_is_not_paired_with_the_quantized_copy():
    """A Conv whose BatchNorm (identity at initialisation) the export folds into it, then a
    HardSwish, quantized: the Conv's values look like the BatchNorm's quantized copy, which the
    quantizer computes from the BatchNorm's value. Paired with it, the HardSwish was re-run on
    the Conv's values (0.05% off the BatchNorm's) and read 'op_implementation, 758×' on a clean
    MobileNetV3. A layer never takes a value computed from a later layer's."""
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16), nn.Hardswish(),
        nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    ).eval()  # fmt: skip
    report = compare_torch_onnx(model, (torch.randn(1, 3, 64, 64),), dtype="int8", seed=0)
    s = report.summary
    assert s["verdict"] == "precision" and s["defects"] == [], report.summary_text()
    conv = report.layer("0")
    assert conv["status"] == "unmapped" and conv["reason"].startswith("fused into `1`"), conv
    assert report.layer("1")["location"]["op"] == "Conv"
    assert report.layer("2")["local_inputs"] == ["1"]
    assert report.layer("2")["cause"] != "op_implementation"


def test_a_layer_the_quantizer_cuts_inside_is_paired_with_its_last_value():
    """ConvNeXt's LayerNorm2d permutes to channels-last, normalizes and permutes back; the
    quantizer puts QuantizeLinear/DequantizeLinear (with no scope) between those nodes, so the
    first Transpose's value seemed to leave the module and was paired with the layer: a clean
    int8 ConvNeXt read `shape_mismatch` at every LayerNorm2d, and the Conv after it a weight
    mismatch against the LayerNorm's weight."""
    from torchvision.models.convnext import LayerNorm2d

    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(
        nn.Conv2d(3, 16, 4, stride=4), LayerNorm2d(16), nn.Conv2d(16, 16, 3, padding=1),
        nn.GELU(), nn.Conv2d(16, 8, 1),
    ).eval()  # fmt: skip
    report = compare_torch_onnx(model, (torch.randn(1, 3, 64, 64),), dtype="int8", seed=0)
    s = report.summary
    assert s["verdict"] == "precision" and s["defects"] == [], report.summary_text()
    norm = report.layer("1")
    assert norm["status"] == "compared" and norm["target_shape"] is None, norm["location"]
    assert report.layer("2")["cause"] != "weight_mismatch"


def test_a_dynamically_quantized_conv1d_is_paired_with_its_output_not_its_flattened_input(
    tmp_path,
):
    """GPT-2's Conv1D flattens its input, multiplies and reshapes back; ONNX Runtime's dynamic
    quantizer replaces the product with nodes of no scope, so the flattened input seemed to leave
    the module and was paired with it: `attn.c_proj` read 'file_differs, over 1000×'."""
    import onnx
    from layerdiff.torch import export_onnx
    from layerdiff.torch.models import load_builder
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model, inputs = load_builder("gpt2")(0)
    path = export_onnx(model, inputs, tmp_path / "gpt2.onnx")
    graph = onnx.load(str(path))
    del graph.graph.value_info[:]  # the quantizer infers the shapes again
    onnx.save(graph, str(tmp_path / "int8.onnx"))
    quantize_dynamic(str(tmp_path / "int8.onnx"), str(tmp_path / "int8.onnx"),
                     weight_type=QuantType.QInt8)  # fmt: skip
    graph = onnx.load(str(tmp_path / "int8.onnx"))
    graph.ir_version = min(graph.ir_version, 10)
    onnx.save(graph, str(tmp_path / "int8.onnx"))
    report = compare_torch_onnx(model, inputs, onnx=tmp_path / "int8.onnx", seed=0)
    s = report.summary
    assert s["defects"] == [] and s["precision"]["dtype"] == "int8", report.summary_text()
    projection = report.layer("model.transformer.h.0.attn.c_proj")
    assert projection["target_shape"] is None and "MatMulInteger" in {
        n.op_type for n in graph.graph.node if n.name in projection["location"]["nodes"]
    }, projection["location"]


def test_the_reports_carry_the_advice(overflow, tmp_path):
    model, inputs = overflow
    report = compare_torch_onnx(model, inputs, dtype="fp16")
    report.write(markdown=tmp_path / "r.md", html=tmp_path / "r.html")
    markdown = (tmp_path / "r.md").read_text()
    assert "## Keep in float32" in markdown and "| `up` | overflows float16's range" in markdown
    assert "**Checked** by re-running with them kept: keeping 2 layer(s)" in markdown
    html = (tmp_path / "r.html").read_text()
    assert '<ol id="keep">' in html and 'id="advice-check"' in html
    assert "keep in float32 (the target computes in float16): `up`, `norm`" in (
        report.summary_text()
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dtype", "bf16"], "ONNX Runtime has no bfloat16 conversion"),
        (["--keep-fp32", "up"], "--keep-fp32 keeps layers of a lower-precision target"),
        (["--target", "torch:bf16", "--dtype", "fp16"], "name two precisions"),
        (["--target", "torch", "--dtype", "int8"], "--dtype int8 quantizes the ONNX export"),
        (["--dtype", "fp16", "--keep-fp32", "nope"], "`nope` is not a layer of this model"),
    ],
)
def test_precisions_that_do_not_fit_are_usage_errors(args, message):
    result = run_cli("torch", OVERFLOW, *args, "-q")
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (["--dtype", "bf16"], {"dtype": "bf16"}, "ONNX Runtime has no bfloat16 conversion"),
        (["--keep-fp32", "up"], {"keep_fp32": ["up"]}, "--keep-fp32 keeps layers of a lower"),
        (
            ["--target", "torch:bf16", "--dtype", "fp16"],
            {"target": "torch:bf16", "dtype": "fp16"},
            "name two precisions",
        ),
        (
            ["--target", "torch", "--dtype", "int8"],
            {"target": "torch", "dtype": "int8"},
            "--dtype int8 quantizes the ONNX export",
        ),
        (
            ["--target", "torch:bf16", "--onnx", "model.onnx"],
            {"target": "torch:bf16", "onnx": "model.onnx"},
            "is PyTorch itself",
        ),
        (["--onnx", "missing.onnx"], {"onnx": "missing.onnx"}, "`missing.onnx` does not exist"),
    ],
)
def test_a_rule_of_the_options_says_the_same_from_both_doors(overflow, args, kwargs, message):
    """The rules of --dtype, --keep-fp32 and --onnx against the target are kept once, in Rust:
    the command line and the Python API refuse the same options with the same words."""
    result = run_cli("torch", OVERFLOW, *args, "-q")
    assert result.returncode == 2 and message in result.stderr, result.stderr
    model, inputs = overflow
    with pytest.raises(layerdiff.UsageError) as refused:
        compare_torch_onnx(model, inputs, **kwargs)
    assert message in str(refused.value)


def test_an_index_output_says_how_many_predictions_change(tmp_path):
    """A classifier whose output is its argmax, against its dynamic int8 file: some predictions
    change. The summary said "the output is off by 9.000e0 (0.0× its tolerance)", which reads
    as within it; an index is compared exactly, and the words say how many elements differ."""
    import json

    import numpy as np
    import onnx
    from onnx import helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(0)
    weights = {
        "w1": rng.standard_normal((64, 256)).astype(np.float32) / 8,
        "b1": rng.standard_normal(256).astype(np.float32) / 8,
        "w2": rng.standard_normal((256, 10)).astype(np.float32) / 16,
        "b2": rng.standard_normal(10).astype(np.float32) / 16,
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"], name="fc1/MatMul"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="fc1/Add"),
        helper.make_node("Relu", ["h1"], ["h2"], name="act"),
        helper.make_node("MatMul", ["h2", "w2"], ["l0"], name="fc2/MatMul"),
        helper.make_node("Add", ["l0", "b2"], ["logits"], name="fc2/Add"),
        helper.make_node("ArgMax", ["logits"], ["y"], name="argmax", axis=1, keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "classifier",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [512, 64])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.INT64, [512])],
        [numpy_helper.from_array(a, n) for n, a in weights.items()],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.save(model, str(tmp_path / "f32.onnx"))
    quantize_dynamic(str(tmp_path / "f32.onnx"), str(tmp_path / "int8.onnx"),
                     weight_type=QuantType.QInt8)  # fmt: skip

    out = tmp_path / "report.json"
    result = run_cli(
        "onnx", str(tmp_path / "f32.onnx"), "--vs", str(tmp_path / "int8.onnx"), "--seed", "0",
        "--json", str(out),
    )  # fmt: skip
    assert result.returncode in (0, 1), result.stderr
    report = json.loads(out.read_text())
    precision = report["summary"]["precision"]
    exact = precision["output_exact"]
    assert precision["output"] == "y" and exact["dtype"] == "int64" and exact["elements"] == 512
    assert 0 < exact["differ"] < 512
    assert (
        f"the output `y` (int64, compared exactly) differs in {exact['differ']} of 512 elements"
        in result.stdout
    ), result.stdout
