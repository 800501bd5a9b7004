"""Defects stand out from rounding in reduced precision. A layer's own error is judged against
what an ideal implementation in the target's dtype gets wrong on the same inputs (the layer in
float64 on the reference's inputs rounded to that dtype, rounded once): within it, precision;
beyond it, a defect. The headline names the defects; the rounding is summarised after them."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import ROOT, run_cli

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from faults import scale_weight  # noqa: E402
from layerdiff.torch import (  # noqa: E402
    _precision,
    compare_torch,
    compare_torch_onnx,
    export_onnx,
)

RESNET160 = f"{ROOT}/tests/builders/zoo.py:resnet18_160"


def resnet18_160():
    sys.path.insert(0, str(ROOT / "tests"))
    from builders.zoo import resnet18_160

    return resnet18_160()


@pytest.fixture(scope="module")
def float16_files(tmp_path_factory):
    """ResNet-18 (160×160) exported by the legacy exporter, converted to float16 by ONNX
    Runtime's converter (inputs and outputs kept float32), and the same file with the weight of
    `/layer2/layer2.1/conv1/Conv` multiplied by 1.03."""
    folder = tmp_path_factory.mktemp("fp16")
    model, inputs = resnet18_160()
    exported = export_onnx(model, inputs, folder / "legacy.onnx", exporter="legacy")
    clean, _ = _precision.convert(exported, "fp16", folder / "clean.onnx", inputs)
    graph = onnx.load(str(clean)).graph
    conv = next(n for n in graph.node if n.name == "/layer2/layer2.1/conv1/Conv")
    bug = scale_weight(clean, folder / "bug.onnx", conv.output[0], 1.03)
    return {"clean": clean, "bug": bug, "legacy": exported}


@pytest.fixture(scope="module")
def int8_files(float16_files, tmp_path_factory):
    """The legacy export quantized to int8 (QDQ, ONNX Runtime's static quantizer), and the same
    file with the stored int8 weight of `/layer2/layer2.1/conv1/Conv` multiplied by 1.03."""
    import numpy as np
    from onnx import numpy_helper

    folder = tmp_path_factory.mktemp("int8")
    _, inputs = resnet18_160()
    clean, _ = _precision.convert(float16_files["legacy"], "int8", folder / "int8.onnx", inputs)
    model = onnx.load(str(clean))
    graph = model.graph
    conv = next(n for n in graph.node if n.name == "/layer2/layer2.1/conv1/Conv")
    dequantize = next(n for n in graph.node if n.output[0] == conv.input[1])
    weight = next(t for t in graph.initializer if t.name == dequantize.input[0])
    values = numpy_helper.to_array(weight)
    moved = np.clip(np.round(values.astype(np.float64) * 1.03), -127, 127).astype(values.dtype)
    weight.CopyFrom(numpy_helper.from_array(moved, weight.name))
    onnx.save(model, str(folder / "bug.onnx"))
    return {"float": float16_files["legacy"], "clean": clean, "bug": folder / "bug.onnx"}


def _against_float(files, which: str, tmp_path) -> tuple:
    """`layerdiff onnx FLOAT --vs WHICH`: the run, its summary's first line and its summary."""
    out = tmp_path / "r.json"
    run = run_cli("onnx", str(files["float"]), "--vs", str(files[which]), "--json", str(out))
    first = run.stdout.splitlines()[0] if run.stdout else run.stderr
    return run, first, json.loads(out.read_text())["summary"]


def test_a_clean_int8_file_is_quantization_only(int8_files, tmp_path):
    run, first, s = _against_float(int8_files, "clean", tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "int8 rounding only: no layer computes differently" in first, first
    assert s["verdict"] == "precision" and s["defects"] == [] and s["precision"]["dtype"] == "int8"


def test_a_weight_changed_in_an_int8_file_is_the_headline_defect(int8_files, tmp_path):
    """The stored int8 weight is checked dequantized against the float file's, to half its
    scale step: the quantization is not a different weight, the edit is."""
    run, first, s = _against_float(int8_files, "bug", tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 defect: `/layer2/layer2.1/conv1/Conv_output_0` weight_mismatch" in first, first
    [defect] = s["defects"]
    assert "differs beyond its quantization" in defect["detail"], defect
    assert s["precision"]["dtype"] == "int8"


def test_a_weight_changed_in_a_float16_file_is_the_headline_defect(float16_files):
    model, inputs = resnet18_160()
    report = compare_torch_onnx(model, inputs, onnx=float16_files["bug"])
    s = report.summary
    assert s["verdict"] == "defect", s
    assert [d["layer"] for d in s["defects"]] == ["layer2.1.bn1"], s["defects"]
    defect = s["defects"][0]
    assert defect["cause"] == "weight_mismatch"
    assert "/layer2/layer2.1/conv1/Conv" in defect["fix"] or "weight" in defect["fix"]
    assert report.drift_origin == "layer2.1.bn1"
    layer = report.layer("layer2.1.bn1")
    assert layer["finding"] == "defect"
    assert layer["baseline"]["multiple"] > 5, layer["baseline"]
    # what comes after it inherits mostly from it, not from the first rounding upstream
    out = report.layers[-1]
    assert out["error_from"] == "layer2.1.bn1", out
    # the rounding besides is summarised, and the advice keeps no defect in float32
    assert s["precision"]["dtype"] == "float16"
    advice = report.data.get("keep_float32") or {"layers": []}
    assert "layer2.1.bn1" not in [k["layer"] for k in advice["layers"]]
    assert report.exit_code == 1


def test_a_clean_float16_file_is_rounding_only(float16_files):
    model, inputs = resnet18_160()
    report = compare_torch_onnx(model, inputs, onnx=float16_files["clean"])
    s = report.summary
    assert s["verdict"] == "precision" and s["defects"] == [], s["defects"]
    # every layer whose own error exceeds the tolerance is what float16 explains
    own = [x for x in report.layers if x["local_exceeds"]]
    assert own and all(x["finding"] == "precision" for x in own)
    assert all(x["baseline"]["multiple"] <= 1 for x in report.layers if x.get("baseline"))
    assert s["precision"]["origin"] == report.drift_origin
    assert report.exit_code == 0
    assert "float16 rounding only: no layer computes differently" in report.summary_text()


@pytest.mark.thorough  # the headline: the next test; the exit codes: test_cli.py
def test_the_command_fails_on_defects_and_on_drift_when_asked(float16_files, tmp_path):
    bug = run_cli("torch", RESNET160, "--onnx", str(float16_files["bug"]))
    assert bug.returncode == 1, bug.stderr
    first = bug.stdout.splitlines()[0]
    assert "1 defect" in first and "layer2.1.bn1" in first and "weight_mismatch" in first, first
    clean = run_cli("torch", RESNET160, "--onnx", str(float16_files["clean"]))
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "float16 rounding only" in clean.stdout.splitlines()[0]
    strict = run_cli(
        "torch", RESNET160, "--onnx", str(float16_files["clean"]), "--fail-on", "drift",
        "--json", str(tmp_path / "r.json"), "--quiet",
    )  # fmt: skip
    assert strict.returncode == 1, strict.stderr
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["summary"]["verdict"] == "precision"


@pytest.mark.parametrize("builder", ["cnn", "transformer"])
@pytest.mark.parametrize("target", ["torch:bf16", "torch:fp16"])
def test_a_kernel_that_accumulates_in_the_narrow_dtype_is_named_in_the_headline(builder, target):
    """A Conv (ResNet-18) or a Linear (a transformer encoder) that adds its products up one by
    one in bfloat16 or float16: far beyond what a float32-accumulating kernel explains, within
    what one accumulating in the narrow dtype does. It is named, in the verdict's line and the
    summary, with advice, and is not a defect: exit 0, unless `--fail-on accumulation`."""
    sys.path.insert(0, str(ROOT / "tests"))
    from builders import narrow_kernels

    model, inputs = getattr(narrow_kernels, builder)()
    wrong = {"cnn": "layer3.0.conv2", "transformer": "layers.1.linear1"}[builder]
    report = compare_torch(model, inputs, target=target)
    s = report.summary
    assert s["verdict"] == "precision", s
    assert s["defects"] == [], s["defects"]
    assert [k["layer"] for k in s["narrow_accumulation"]] == [wrong], s["narrow_accumulation"]
    kernel = s["narrow_accumulation"][0]
    assert kernel["multiple"] > 1.25 >= kernel["narrow_multiple"], kernel
    assert "float32" in kernel["fix"] and "autocast" in kernel["fix"]
    layer = report.layer(wrong)
    assert layer["cause"] == "narrow_accumulation" and layer["finding"] == "precision"
    assert layer["baseline"]["narrow"]["terms"] == {"cnn": 256 * 9, "transformer": 64}[builder]
    first = report.summary_text().splitlines()[0]
    assert f"`{wrong}`" in first and "accumulate in" in first, first
    # the layers that read it take its error on and name it as where it comes from
    readers = [x for x in report.layers if x["local_inputs"] == [wrong]]
    assert readers and all(x["error_from"] == wrong for x in readers), readers
    if builder == "cnn":  # nothing else in a ResNet comes close: the output's error is its
        assert report.layers[-1]["error_from"] == wrong
    assert report.exit_code == 0


@pytest.mark.parametrize("target", ["torch:bf16", "torch:amp-bf16", "torch:fp16"])
def test_the_same_models_without_the_planted_kernel_have_no_defect(target):
    sys.path.insert(0, str(ROOT / "tests"))
    from builders import encoder

    torch.manual_seed(0)
    model, inputs = encoder.build()
    report = compare_torch(model.eval(), inputs, target=target)
    assert report.summary["defects"] == [], report.summary["defects"]
    assert report.exit_code == 0


def test_float16_onnx_on_two_runtimes_is_rounding_by_default(tmp_path):
    """A float16 LayerNorm → MatMul → Add, ONNX Runtime against tract, held to 1e-2: the two
    round `Z` one float16 step apart (0.25 near 300). Without a float64 baseline the kernel was
    blamed (`op_implementation` at `Z`); the baseline runs by default and calls it rounding."""
    import numpy as np
    from builders.graphs import layernorm_matmul_fp16

    rng = np.random.default_rng(0)
    model = tmp_path / "ln_matmul_add.onnx"
    layernorm_matmul_fp16(model, rng)
    np.savez(tmp_path / "in.npz", X=rng.uniform(-60, 60, (2, 128, 64)).astype(np.float16))
    out = tmp_path / "r.json"
    done = run_cli(
        "onnx", str(model), "--inputs", str(tmp_path / "in.npz"), "--target", "tract",
        "--tolerance", "1e-2", "--json", str(out), "--quiet",
    )  # fmt: skip
    data = json.loads(out.read_text())
    z = next(x for x in data["layers"] if x["name"] == "Z")
    assert z["exceeds_tol"] and z["finding"] == "precision", z
    assert z["cause"] == "rounding", z["detail"]
    assert data["summary"]["defects"] == [] and data["summary"]["verdict"] == "precision"
    assert done.returncode == 0, done.stderr


class _NoFloat64(torch.nn.Module):
    """A model with an op that has no float64 kernel (as some custom ops have none)."""

    def __init__(self):
        super().__init__()
        self.fc, self.head = torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        h = self.fc(x)
        if h.dtype == torch.float64:
            raise RuntimeError("no float64 kernel for this op")
        return self.head(torch.relu(h))


def test_a_model_that_cannot_run_in_float64_says_why_its_layers_have_no_baseline(tmp_path):
    """Where the float64 copy stops, the layers after it have no truth and no baseline, and the
    report says why rather than leaving them silently unjudged."""
    torch.manual_seed(0)
    report = compare_torch_onnx(_NoFloat64(), (torch.randn(2, 16),), dtype="fp16", workdir=tmp_path)
    first, *after = report.layers
    assert first["baseline"] is not None and first["float64"] is not None
    for x in after:
        assert x["baseline"] is None and x["float64"] is None, x["name"]
        assert x["baseline_reason"] == (
            "the float64 run of the model stopped before it: it failed: RuntimeError: "
            "no float64 kernel for this op"
        )
    [warning] = report.summary["warnings"]
    assert warning.startswith("no float64 truth for the layers from where it stopped")


class _WrongInBfloat16(torch.nn.Linear):
    """A Linear whose kernel is 3% low in bfloat16 only."""

    def forward(self, x):
        out = super().forward(x)
        return out * 0.97 if out.dtype == torch.bfloat16 else out


@pytest.mark.thorough  # the zoo's ViT: make calibrate; a bfloat16 kernel bug: test_torch_sides
def test_a_timm_vit_is_rounding_only_and_a_bfloat16_kernel_bug_in_it_is_the_headline(tmp_path):
    """A model nobody tuned the baseline on (timm's ViT-Tiny, random weights): its float16
    export is rounding only (its PatchEmbed's Identity norm, which reads the Conv's output
    reshaped, is not paired with the Conv's value), and one MLP Linear that is 3% low in
    bfloat16 only is the one defect."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=96).eval()
    inputs = (torch.randn(1, 3, 96, 96),)
    report = compare_torch_onnx(model, inputs, dtype="fp16", workdir=tmp_path)
    assert report.summary["verdict"] == "precision" and report.summary["defects"] == []
    assert "reshaped between them" in report.layer("patch_embed.norm")["reason"]

    fc2 = model.blocks[5].mlp.fc2
    wrong = _WrongInBfloat16(fc2.in_features, fc2.out_features)
    wrong.load_state_dict(fc2.state_dict())
    model.blocks[5].mlp.fc2 = wrong
    s = compare_torch(model, inputs, target="torch:bf16").summary
    assert [(d["layer"], d["cause"]) for d in s["defects"]] == [
        ("blocks.5.mlp.fc2", "op_implementation")
    ]


def test_a_dynamically_quantized_file_has_its_weights_checked_against_their_scales(
    encoder_onnx, tmp_path
):
    """ONNX Runtime's `quantize_dynamic` stores each MatMul's weight as int8 for a
    MatMulInteger, its scale applied after the product. The clean file's weights are each
    within half a scale step of the float file's (quantization, exit 0); one weight scale off by
    30% is that layer's weight_mismatch, the one defect, not "int8 rounding only"."""
    import numpy as np
    from onnx import numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    clean = tmp_path / "dynamic.onnx"
    quantize_dynamic(str(encoder_onnx), str(clean), weight_type=QuantType.QInt8)
    model = onnx.load(str(clean))
    model.ir_version = min(model.ir_version, 10)
    onnx.save(model, str(clean))
    products = [n for n in model.graph.node if n.op_type == "MatMulInteger"]
    assert len(products) > 3, "the encoder's MatMuls are quantized"

    out = tmp_path / "clean.json"
    run = run_cli("onnx", str(encoder_onnx), "--vs", str(clean), "--json", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    summary = json.loads(out.read_text())["summary"]
    assert summary["defects"] == [] and summary["verdict"] != "undecided", summary["verdict"]

    # the third product's weight scale, 1.3× in the file
    product = products[2]
    scale_name = product.input[1].removesuffix("_quantized") + "_scale"
    scale = next(i for i in model.graph.initializer if i.name == scale_name)
    values = numpy_helper.to_array(scale).astype(np.float32) * np.float32(1.3)
    scale.CopyFrom(numpy_helper.from_array(values, scale.name))
    onnx.save(model, str(tmp_path / "bug.onnx"))
    out = tmp_path / "bug.json"
    run = run_cli("onnx", str(encoder_onnx), "--vs", str(tmp_path / "bug.onnx"), "--json", str(out))
    assert run.returncode == 1, run.stdout + run.stderr
    (defect,) = json.loads(out.read_text())["summary"]["defects"]
    assert defect["cause"] == "weight_mismatch", defect
    assert f"`{product.input[1]}` differs beyond its quantization" in defect["detail"]


def test_an_edited_weight_the_quantizer_stored_transposed_counts_the_elements_edited(tmp_path):
    """`quantize_dynamic` stores a Gemm's `transB` weight transposed for its MatMulInteger. One
    stored row of it moved by 40 steps: 128 elements differ, and the report said "8096 of 8192
    elements moved": the stored form was judged untransposed, every element off."""
    import numpy as np
    from onnx import helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    weight = np.random.default_rng(0).standard_normal((128, 64)).astype(np.float32) * 0.1
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w"], ["g"], name="dense", transB=1),
         helper.make_node("Tanh", ["g"], ["y"], name="act")],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight, "w")],
    )  # fmt: skip
    reference = tmp_path / "dense.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=9), str(reference))  # fmt: skip
    quantized = tmp_path / "int8.onnx"
    quantize_dynamic(str(reference), str(quantized), weight_type=QuantType.QInt8)
    model = onnx.load(str(quantized))
    stored = next(i for i in model.graph.initializer if i.name == "w_quantized")
    values = numpy_helper.to_array(stored).astype(np.int32)
    assert values.shape == (64, 128), "stored transposed"
    values[5, :] = np.clip(values[5, :] + 40, -127, 127)
    stored.CopyFrom(numpy_helper.from_array(values.astype(np.int8), stored.name))
    onnx.save(model, str(tmp_path / "edit.onnx"))
    out = tmp_path / "edit.json"
    run = run_cli("onnx", str(reference), "--vs", str(tmp_path / "edit.onnx"), "--json", str(out))
    assert run.returncode == 1, run.stdout + run.stderr
    (defect,) = json.loads(out.read_text())["summary"]["defects"]
    assert defect["cause"] == "weight_mismatch", defect
    assert "`w_quantized` differs beyond its quantization: 128 of 8192 elements" in defect["detail"]


def test_an_int4_file_is_quantization_and_a_block_scale_off_is_the_defect(tmp_path):
    """A Qwen2-style decoder (transformers, from a config) exported by dynamo and quantized to
    4 bits in blocks of 32 by ONNX Runtime's MatMulNBitsQuantizer: against its float file, every
    MatMulNBits layer is int4 quantization (its weights, dequantized block by block, within
    their steps; a value clipped at the range's end within one), never "op_implementation over
    1000×". One block's scale off by 30% is that layer's weight_mismatch, the one defect."""
    import numpy as np
    from onnx import numpy_helper
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        use_cache=False,
    )  # fmt: skip
    model = transformers.Qwen2Model(config).eval()
    path = export_onnx(model, (torch.randint(0, 128, (1, 16)),), tmp_path / "float.onnx")
    quantizer = MatMulNBitsQuantizer(onnx.load(str(path)), block_size=32, is_symmetric=True)
    quantizer.process()
    int4 = quantizer.model.model
    int4.ir_version = min(int4.ir_version, 10)
    onnx.save(int4, str(tmp_path / "int4.onnx"))

    out = tmp_path / "clean.json"
    run = run_cli("onnx", str(path), "--vs", str(tmp_path / "int4.onnx"), "--json", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("float.onnx: int4 rounding only"), run.stdout
    assert json.loads(out.read_text())["summary"]["defects"] == []

    product = [n for n in int4.graph.node if n.op_type == "MatMulNBits"][3]
    scales = next(i for i in int4.graph.initializer if i.name == product.input[2])
    values = numpy_helper.to_array(scales).copy()
    values.flat[5] *= np.float32(1.3)
    scales.CopyFrom(numpy_helper.from_array(values, scales.name))
    onnx.save(int4, str(tmp_path / "bug.onnx"))
    out = tmp_path / "bug.json"
    run = run_cli("onnx", str(path), "--vs", str(tmp_path / "bug.onnx"), "--json", str(out))
    assert run.returncode == 1, run.stdout + run.stderr
    (defect,) = json.loads(out.read_text())["summary"]["defects"]
    assert defect["cause"] == "weight_mismatch", defect
    assert f"`{product.input[1]}` differs beyond its quantization" in defect["detail"]


def test_torch_against_an_int8_legacy_export_pairs_each_norm_with_its_folded_conv(int8_files):
    """The legacy exporter folds each BatchNorm into the Conv before it, and the quantizer puts
    a QuantizeLinear and DequantizeLinear after that Conv: the norm's value is the dequantized
    one. Paired with the Conv's module instead (its output before the norm), each residual Add
    re-run on those values erred by the norm's scale (random weights: 1/√(1 + 1e-5)) and read
    as 8 defects."""
    model, inputs = resnet18_160()
    report = compare_torch_onnx(model, inputs, onnx=int8_files["clean"])
    s = report.summary
    assert s["verdict"] == "precision" and s["defects"] == [], s["defects"]
    norm, conv = report.layer("layer2.0.bn2"), report.layer("layer2.0.conv2")
    assert norm["status"] == "compared", norm
    assert norm["location"]["value"].endswith("Conv_output_0_DequantizeLinear_Output"), norm
    assert conv["status"] == "unmapped" and "fused with `layer2.0.bn2`" in conv["reason"], conv
    assert report.layer("layer2.0:add")["finding"] != "defect"


@pytest.fixture(scope="module")
def quantized_otherwise(float16_files, tmp_path_factory):
    """The legacy export quantized with a scale per output channel (QDQ) and by ONNX Runtime's
    dynamic quantizer (ConvInteger, its input quantized by a DynamicQuantizeLinear named after
    the value it reads)."""
    from onnxruntime.quantization import QuantFormat, quantize_dynamic, quantize_static

    folder = tmp_path_factory.mktemp("quantized")
    source = str(float16_files["legacy"])
    _, inputs = resnet18_160()
    names = [i.name for i in onnx.load(source).graph.input]
    files = {"per_channel": folder / "pc.onnx", "dynamic": folder / "dyn.onnx"}
    calibration = _precision._Calibration(names, inputs, 0)
    quantize_static(
        source, str(files["per_channel"]), calibration, quant_format=QuantFormat.QDQ,
        per_channel=True,
    )  # fmt: skip
    quantize_dynamic(source, str(files["dynamic"]))
    for path in files.values():
        model = onnx.load(str(path))
        model.ir_version = 10  # what ONNX Runtime 1.31 reads
        onnx.save(model, str(path))
    return files


def test_a_scale_per_channel_is_no_weight_of_the_model(quantized_otherwise):
    """A weight's scales, one per output channel, have the shape of the layer's bias: matched
    to it by shape, they read as `fc` weight_mismatch on a clean file (exit 1)."""
    model, inputs = resnet18_160()
    report = compare_torch_onnx(model, inputs, onnx=quantized_otherwise["per_channel"])
    s = report.summary
    assert s["verdict"] == "precision" and s["defects"] == [], s["defects"]
    assert "matched by shape" not in json.dumps(report.layer("fc"))


def test_a_dynamically_quantized_legacy_export_pairs_norms_and_activations(quantized_otherwise):
    """Each Conv+BatchNorm is an integer product cast back, scaled and biased, and each product's
    input is quantized by a DynamicQuantizeLinear the quantizer names after the value (so it sat
    in the activation's scope): the norm went unpaired, the Relu was paired with that node's
    scale, and the Relu re-run on pre-norm values read as 9 file_differs defects."""
    model, inputs = resnet18_160()
    report = compare_torch_onnx(model, inputs, onnx=quantized_otherwise["dynamic"])
    s = report.summary
    assert s["verdict"] == "precision" and s["defects"] == [], s["defects"]
    assert report.layer("layer1.0.bn1")["location"]["value"].endswith("conv1/Conv_output_0")
    assert "fused with `layer1.0.bn1`" in report.layer("layer1.0.conv1")["reason"]
    relu = report.layer("layer1.0.relu")
    assert relu["status"] == "compared", relu
    assert relu["location"]["value"] == "/layer1/layer1.0/relu/Relu_output_0", relu


def test_an_int8_weight_edited_in_a_dynamically_quantized_file_is_the_defect(
    quantized_otherwise, tmp_path
):
    """Two dynamically quantized files, one with a ConvInteger's int8 codes scaled by 1.05: both
    quantize alike, so their quantization explains nothing between them. The codes are checked
    dequantized with the scale found past the product; unchecked, the edit read as "int8
    rounding only", exit 0."""
    import numpy as np
    from onnx import numpy_helper

    model = onnx.load(str(quantized_otherwise["dynamic"]))
    conv = [n for n in model.graph.node if n.op_type == "ConvInteger"][10]
    weight = next(t for t in model.graph.initializer if t.name == conv.input[1])
    codes = numpy_helper.to_array(weight)
    moved = np.clip(np.round(codes.astype(np.float64) * 1.05), -127, 127).astype(codes.dtype)
    weight.CopyFrom(numpy_helper.from_array(moved, weight.name))
    onnx.save(model, str(tmp_path / "edited.onnx"))
    run, first, s = _against_float(
        {"float": quantized_otherwise["dynamic"], "edited": tmp_path / "edited.onnx"},
        "edited", tmp_path,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr
    [defect] = s["defects"]
    assert defect["cause"] == "weight_mismatch" and defect["layer"] == conv.output[0], defect
    changed = int(np.count_nonzero(moved != codes))
    assert f"{changed} of {codes.size} elements moved" in defect["detail"], defect["detail"]
