"""Which ONNX value each PyTorch layer is compared with, on files users really have: the legacy
exporter's scopes through ModuleList, constants an exporter files under a module, files that
name no module scope at all, and runs that pair nothing. A wrong pairing must never read as a
clean result."""

from __future__ import annotations

import importlib

import numpy as np
import onnx
import pytest
from builders.strip_scopes import strip_scopes
from conftest import run_cli
from layerdiff import MappingError, compare_torch_onnx
from layerdiff.torch import export_onnx
from onnx import numpy_helper


def built(name: str):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model, inputs = importlib.import_module(f"builders.{name}").build()
    return model.eval(), inputs


@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
def test_blocks_in_a_module_list_are_mapped_from_both_exporters(tmp_path, exporter):
    model, inputs = built("decoder")
    path = export_onnx(model, inputs, tmp_path / "m.onnx", exporter=exporter)
    report = compare_torch_onnx(model, inputs, onnx=path)
    s = report.summary
    # 18 module calls and 13 functional calls between them (the attention's matmuls, scaling
    # and softmax, the residual adds); `wpe` reads a constant position index, so both
    # exporters fold it into a constant.
    assert (s["layers_total"], s["layers_compared"]) == (31, 30), report.summary_text()
    assert report.layer("blocks.1:softmax")["status"] == "compared"
    assert report.layer("wpe")["status"] == "unmapped"
    assert report.layer("blocks.1.fc")["location"]["op"] in ("Add", "Gemm", "MatMul")
    assert report.drift_origin is None and s["warnings"] == []


def test_a_constant_in_a_modules_scope_is_not_its_output():
    """The legacy exporter files a shared int64 Constant under `conv_proj` (ViT-B/16's, and this
    two-block ViT's of the same class); pairing the layer with it reported a shape mismatch as
    the drift origin."""
    torch = pytest.importorskip("torch")
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(
        image_size=32, patch_size=16, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64
    )
    inputs = (torch.randn(1, 3, 32, 32),)
    report = compare_torch_onnx(model.eval(), inputs, exporter="legacy", local=False)
    layer = report.layer("conv_proj")
    assert layer["status"] == "compared" and layer["location"]["op"] == "Conv"
    assert report.drift_origin is None
    # 20 module calls and 6 functional calls: the class token `cat`, the position embedding
    # `add`, two residual adds per encoder block. The blocks' 2 Dropouts are removed; the
    # encoder's own, after the position `add`, is compared against that add's value.
    assert report.summary["layers_compared"] == 26 - 2
    assert report.layer("encoder.dropout")["status"] == "compared"


def test_a_blocks_residual_adds_in_a_quantized_legacy_file_pair_by_position(tmp_path):
    """In a legacy export a ViT block's residual adds sit beside its MultiheadAttention's own
    adds (`…/encoder_layer_1/self_attention/Add`), a module no layer is captured from. Counted
    as the block's, they outnumbered its two calls and were paired by values, which a dynamic
    int8 file does not hold: the adds went unmapped, each block's local re-run reached back
    further, and ViT-B/16 read 'undecided' (more than 256 nodes to re-run) instead of its
    int8 rounding."""
    torch = pytest.importorskip("torch")
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(
        image_size=32, patch_size=16, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64
    ).eval()
    inputs = (torch.randn(1, 3, 32, 32),)
    path = export_onnx(model, inputs, tmp_path / "m.onnx", exporter="legacy")
    quantize_dynamic(str(path), str(tmp_path / "q.onnx"), weight_type=QuantType.QInt8)
    report = compare_torch_onnx(model, inputs, onnx=tmp_path / "q.onnx")
    for block in (0, 1):
        for call, node in ((":add", "Add"), (":add#2", "Add_1")):
            layer = report.layer(f"encoder.layers.encoder_layer_{block}{call}")
            assert layer["status"] == "compared", layer["reason"]
            assert layer["location"]["node"] == f"/encoder/layers/encoder_layer_{block}/{node}"
    assert report.summary["layers_compared"] == 26 - 2


@pytest.fixture(scope="module")
def stripped_resnet18(resnet18, resnet18_onnx, tmp_path_factory):
    path = tmp_path_factory.mktemp("stripped") / "resnet18.onnx"
    strip_scopes(resnet18_onnx["dynamo"], path)
    return path


def test_a_file_without_scopes_is_paired_by_values(resnet18, stripped_resnet18):
    model, inputs, _ = resnet18
    report = compare_torch_onnx(model, inputs, onnx=stripped_resnet18)
    assert report.drift_origin is None and report.summary["inconclusive"] is None
    # The same 40 layers as with the exporter's scopes: each BatchNorm's value is its folded
    # Conv, which the Conv (an identity BatchNorm after it) also looks like.
    assert report.summary["layers_compared"] == 40
    bn = report.layer("layer2.0.bn1")
    assert bn["location"]["op"] == "Conv" and bn["reason"].startswith("matched by values")
    assert report.layer("avgpool")["location"]["op"] == "ReduceMean"  # not the Reshape after it
    assert report.layer("fc")["location"]["op"] == "Gemm"


def test_a_linear_is_not_paired_with_the_matmul_before_its_bias(tmp_path):
    """Pairing by values on the decoder's legacy export with its scopes stripped: each Linear's
    MatMul (before the bias) is close to the Linear's output, and taking it reported drift."""
    model, inputs = built("decoder")
    export_onnx(model, inputs, tmp_path / "m.onnx", exporter="legacy")
    strip_scopes(tmp_path / "m.onnx", tmp_path / "stripped.onnx")
    report = compare_torch_onnx(model, inputs, onnx=tmp_path / "stripped.onnx")
    assert report.drift_origin is None, report.summary_text()
    assert report.summary["layers_compared"] == 17  # `wpe` is folded into a constant
    for name in ("blocks.0.qkv", "blocks.1.qkv", "blocks.1.fc"):
        assert report.layer(name)["location"]["op"] == "Add", name


def perturbed(src, dst, weight: str, delta: float):
    model = onnx.load(str(src))
    init = next(i for i in model.graph.initializer if i.name == weight)
    array = numpy_helper.to_array(init).copy()
    array[0] += delta
    init.CopyFrom(numpy_helper.from_array(array, init.name))
    onnx.save(model, str(dst))
    return dst


def test_drift_in_a_file_without_scopes_is_found_at_its_layer(
    resnet18, stripped_resnet18, tmp_path
):
    model, inputs, _ = resnet18
    edited = perturbed(stripped_resnet18, tmp_path / "e.onnx", "layer3.1.conv2.weight", 0.002)
    report = compare_torch_onnx(model, inputs, onnx=edited)
    assert report.drift_origin == "layer3.1.conv2"
    assert report.layer("layer3.1.conv2")["cause"] == "weight_mismatch"


def test_drift_beyond_recognition_is_inconclusive_never_clean(stripped_resnet18, tmp_path):
    edited = perturbed(stripped_resnet18, tmp_path / "e.onnx", "layer3.1.conv2.weight", 0.05)
    result = run_cli("torch", "resnet18", "--onnx", str(edited), "--json", str(tmp_path / "r.json"))
    assert result.returncode == 1, result.stderr
    assert "inconclusive" in result.stdout and "no drift" not in result.stdout
    assert "from `layer3.1.conv2` on no layer could be paired" in result.stdout
    assert "warning: low coverage" in result.stdout


def test_a_run_that_pairs_nothing_exits_2(tmp_path):
    """An ONNX file of another model (same architecture, other weights, no scopes): nothing
    can be paired, and that is an error, not a clean result."""
    torch = pytest.importorskip("torch")
    model, inputs = built("deep_mlp")
    torch.manual_seed(1)
    other, _ = importlib.import_module("builders.deep_mlp").build()
    export_onnx(other.eval(), inputs, tmp_path / "other.onnx", exporter="dynamo")
    strip_scopes(tmp_path / "other.onnx", tmp_path / "other_stripped.onnx")
    with pytest.raises(MappingError, match="compared no layer"):
        compare_torch_onnx(model, inputs, onnx=tmp_path / "other_stripped.onnx")
    report = tmp_path / "r.json"
    result = run_cli(
        "torch",
        "tests/builders/deep_mlp.py:build",
        "--onnx",
        str(tmp_path / "other_stripped.onnx"),
        "--json",
        str(report),
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "error: compared no layer" in result.stderr and "hint:" in result.stderr
    assert "Traceback" not in result.stderr and not report.exists()


# Layers no export computes, and why: values computed from constants only (embeddings of
# constant positions, rotary tables, T5's relative-position arithmetic), which exporters fold
# into constants; BERT's pooler (dead code when only hidden states are returned, which the
# capture tells; it was once "folded" into the LayerNorm before it and reported as drift).
FOLDED = "computed from constants only"
POOLER = {
    "model.pooler.dense": "its output reaches none of the model's outputs",
    "model.pooler.activation": "its output reaches none of the model's outputs",
}
T5_FOLDED = {
    f"model.{stack}.block.0.layer.0.SelfAttention{call}": FOLDED
    for stack in ("encoder", "decoder")
    for call in (":div", ":div#2", ":mul", ".relative_attention_bias")
}
NO_COUNTERPART = {
    ("bert", "dynamo"): {"model.embeddings.position_embeddings": FOLDED, **POOLER},
    ("bert", "legacy"): POOLER,
    ("gpt2", "dynamo"): {"model.transformer.wpe": FOLDED},
    ("llama", "dynamo"): {"model.model.rotary_emb": FOLDED},
    ("timm_convnext", "dynamo"): {},
    ("timm_convnext", "legacy"): {},
    ("timm_efficientnet", "dynamo"): {},
    ("timm_efficientnet", "legacy"): {},
    # The built-in ones: Llama with an attention mask (the legacy exporter writes a shape
    # computation's `Mul` among the rotary `mul`s), T5 (dynamo folds the relative positions,
    # drops the scores' `* 1.0` and adds the attention mask PyTorch skipped).
    ("zoo:llama", "legacy"): {},
    ("zoo:t5", "dynamo"): T5_FOLDED,
    ("zoo:t5", "legacy"): {},
}


# timm's models through the legacy exporter, and EfficientNet's through dynamo: `make test-all`
# (the legacy exporter's scopes are checked on the zoo's T5 and Llama here, timm's models
# through dynamo on ConvNeXt)
SLOW = {
    ("timm_convnext", "legacy"),
    ("timm_efficientnet", "legacy"),
    ("timm_efficientnet", "dynamo"),
}


@pytest.mark.parametrize(
    ("name", "exporter"),
    [pytest.param(*k, marks=[pytest.mark.thorough] * (k in SLOW)) for k in NO_COUNTERPART],
)
def test_real_architectures_map_with_no_false_drift(name, exporter):
    """transformers models from configs and timm models: every layer that an export computes
    is compared (identities at inference and Convs fused into their batch norm aside), those
    it does not are explained, and a clean export shows no drift."""
    pytest.importorskip("transformers")
    pytest.importorskip("timm")
    torch = pytest.importorskip("torch")
    from builders import zoo
    from layerdiff.torch.models import ZOO

    torch.manual_seed(0)
    if name.startswith("zoo:"):
        model, inputs = ZOO[name.removeprefix("zoo:")](0)
    else:
        model, inputs = getattr(zoo, name)()
    report = compare_torch_onnx(model.eval(), inputs, exporter=exporter)
    not_compared = {
        layer["name"]: layer["reason"]
        for layer in report.layers
        if layer["status"] != "compared"
        and not layer["reason"].startswith(("identity at inference", "fused"))
    }
    expected = NO_COUNTERPART[(name, exporter)]
    assert set(not_compared) == set(expected), report.summary_text()
    for layer, why in expected.items():
        assert not_compared[layer].startswith(why), (layer, not_compared[layer])
    s = report.summary
    assert report.drift_origin is None and s["inconclusive"] is None, report.summary_text()


@pytest.mark.parametrize("exporter", ["dynamo", "legacy"])
def test_residual_adds_between_modules_have_rows_of_their_own(resnet18, resnet18_onnx, exporter):
    """ResNet's `out += identity` is no module call: the worst value of the run (`add_7`,
    3.5e-5) was absent from the report."""
    model, inputs, _ = resnet18
    report = compare_torch_onnx(model, inputs, onnx=resnet18_onnx[exporter])
    adds = [x for x in report.layers if x["module_type"] == "add()"]
    assert [x["name"] for x in adds] == [f"layer{i}.{j}:add" for i in range(1, 5) for j in (0, 1)]
    assert all(x["status"] == "compared" and x["location"]["op"] == "Add" for x in adds)
    assert report.summary["worst"]["max_abs_diff"]["layer"] == "layer4.1:add"
    assert report.drift_origin is None


def test_drift_born_in_a_functional_call_is_placed_there(resnet18, resnet18_onnx, tmp_path):
    """The export's residual add of `layer2.0` scales its shortcut by 1.05: the origin is that
    add, not the ReLU module after it."""
    from onnx import helper

    model, inputs, _ = resnet18
    edited = onnx.load(str(resnet18_onnx["dynamo"]))
    graph = edited.graph
    at, add = next((i, n) for i, n in enumerate(graph.node) if n.output[0] == "add_2")
    graph.initializer.append(numpy_helper.from_array(np.array(1.05, np.float32), "scale"))
    scale = helper.make_node("Mul", [add.input[1], "scale"], ["scaled"], name="node_add_2_scale")
    scale.metadata_props.extend(add.metadata_props)  # part of the same call, as a lowering is
    graph.node.insert(at, scale)
    add.input[1] = "scaled"
    onnx.save(edited, str(tmp_path / "edited.onnx"))
    report = compare_torch_onnx(model, inputs, onnx=tmp_path / "edited.onnx")
    assert report.drift_origin == "layer2.0:add"
    assert report.layer("layer2.0:add")["local_exceeds"]


@pytest.mark.parametrize("exporter", ["dynamo", "legacy"])
def test_a_batch_norm_its_own_module_computes_is_not_taken_for_the_conv(exporter):
    """timm's BatchNormAct2d is a BatchNorm that holds its activation, so its batch norm is no
    leaf call. The legacy exporter folds it into the Conv before it, and the Conv was compared
    with that folded value, which holds the batch norm's output: false drift at the Conv
    wherever the running statistics are not trivial (here they are random)."""
    timm_layers = pytest.importorskip("timm.layers")
    torch = pytest.importorskip("torch")
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3), timm_layers.BatchNormAct2d(8), nn.Conv2d(8, 8, 3),
        timm_layers.BatchNormAct2d(8),
    )  # fmt: skip
    with torch.no_grad():
        for bn in (model[1], model[3]):
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
            bn.bias.uniform_(-0.5, 0.5)
    report = compare_torch_onnx(model.eval(), (torch.randn(1, 3, 16, 16),), exporter=exporter)
    assert report.drift_origin is None, report.summary_text()
    conv = report.layer("0")
    assert (
        conv["status"] == "unmapped"
        and "fused" in conv["reason"]
        and "`1:batch_norm`" in conv["reason"]
    )
    assert report.layer("1:batch_norm")["status"] == "compared"
    assert report.layer("1.act")["status"] == "compared"


def test_a_no_op_cast_of_the_input_read_outside_a_module_is_not_its_output():
    # T5's layer norm under the legacy exporter: its scope's no-op Cast of the input also feeds
    # the residual Add, and was taken for the norm's output (a false drift of ~13%, "born" at
    # the first norm, cause op_implementation).
    from builders.pass_through import build

    model, inputs = build()
    report = compare_torch_onnx(model, inputs, exporter="legacy")
    norm = next(layer for layer in report.layers if layer["name"] == "norm")
    assert norm["location"]["op"] == "Mul", norm["location"]
    assert report.summary["drift_origin"] is None
