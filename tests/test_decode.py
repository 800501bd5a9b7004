"""`layerdiff torch MODEL --decode-steps N`: a transformers decoder compared as it generates, the
prefill and then single-token steps that read the key/value cache, both sides fed the
reference's tokens and cache. Clean checkpoints are clean at every step on ONNX Runtime, in
bfloat16 and compiled; a fault only in the cached path of the file (positions one too far, a
mask one token short) is the headline at step 1 at its layer, and the prefill passes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import run_cli

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnx")

from faults import mask_short_with_cache, positions_off_with_cache  # noqa: E402


def axis_of(path):
    return json.loads(path.read_text())


def test_a_checkpoint_decodes_four_steps_clean_against_its_export(checkpoint, tmp_path):
    out = tmp_path / "run"
    done = run_cli("torch", str(checkpoint("llama")), "--decode-steps", "4", "--out", str(out))
    assert done.returncode == 0, done.stderr
    axis = axis_of(out / "axis.json")
    assert axis["axis"] == "decode step"
    assert [p["point"] for p in axis["points"]] == ["prefill", "1", "2", "3", "4"]
    for point in axis["points"]:
        assert point["verdict"] == "no_drift" and point["layers_compared"] == 60, point
    # the prefill runs the same file with an empty cache; each step adds one token to it
    shapes = [{i["name"]: i["shape"] for i in p["inputs"]} for p in axis["points"]]
    assert shapes[0]["input_ids"] == [1, 32] and shapes[0]["past_key_values_0_key"][2] == 0
    assert shapes[4]["input_ids"] == [1, 1] and shapes[4]["past_key_values_0_key"][2] == 35
    assert shapes[4]["attention_mask"] == [1, 36]
    # every layer of every step, the cache entries the attention writes among them
    step = json.loads((out / "step-1" / "report.json").read_text())
    names = [layer["name"] for layer in step["layers"]]
    assert "model.layers.1.self_attn:cat" in names and "lm_head" in names
    assert (out / "prefill" / "report.md").is_file()
    # the run says where each step's reports are
    wrote = next(line for line in done.stderr.splitlines() if "each point's reports" in line)
    assert "report.json, report.md, report.html" in wrote, wrote
    for step in ["prefill", "step-1", "step-4"]:
        assert f"{out / step}/" in wrote, wrote
    assert "both sides fed the reference's greedy tokens and its key/value cache" in done.stderr
    assert "its cache off" not in done.stderr
    # a shorter run into the same folder says which step folders are not its own
    again = run_cli("torch", str(checkpoint("llama")), "--decode-steps", "2", "--out", str(out))
    assert again.returncode == 0, again.stderr
    assert f"{out / 'step-3'}/, {out / 'step-4'}/: an earlier run's reports" in again.stderr
    # ... and reuses the export: it does not depend on how many steps are decoded
    assert "the same model's, kept from an earlier run" in again.stderr, again.stderr


# gpt2 compiled: `make test-all` (a PyTorch target's decoding: qwen2 in bfloat16; a compiled
# decoder's modules: test_compile_whole.py)
@pytest.mark.parametrize(
    ("name", "target"),
    [("qwen2", "torch:bf16"), pytest.param("gpt2", "torch:compile", marks=pytest.mark.thorough)],
)
def test_a_pytorch_target_decodes_without_a_defect(checkpoint, name, target, tmp_path):
    out = tmp_path / "axis.json"
    args = ("torch", str(checkpoint(name)), "--decode-steps", "2", "--target", target)
    done = run_cli(*args, "--json", str(out))
    assert done.returncode == 0, done.stderr
    axis = axis_of(out)
    assert [p["fails"] for p in axis["points"]] == [False] * 3, axis["points"]
    if name == "gpt2":  # 16 positions: the prompt makes room for the steps
        assert "the prompt cut from 16 to 14 tokens" in done.stderr
        assert axis["points"][0]["inputs"][0]["shape"] == [1, 14]


@pytest.mark.parametrize(
    ("fault", "layer"),
    [
        (positions_off_with_cache, "model.rotary_emb"),
        (mask_short_with_cache, "model.layers.0.self_attn:add#3"),  # the mask onto the scores
    ],
)
def test_a_fault_only_in_the_cached_path_is_the_headline_at_step_1(
    checkpoint, fault, layer, tmp_path
):
    """And `reduce` of step 1's report cuts that step's repro: the file's nodes from
    PyTorch's values at the layer's inputs to its value, the edit's own nodes among them (no
    layer maps to them), checked on the step's inputs (it exited 2: a step kept no inputs)."""
    folder = checkpoint("llama")
    clean = tmp_path / "clean"
    assert run_cli("torch", str(folder), "--decode-steps", "2", "--out", str(clean)).returncode == 0
    edited = fault(clean / "model.onnx", tmp_path / "edited.onnx")
    run = tmp_path / "run"
    args = ("torch", str(folder), "--decode-steps", "2", "--onnx", str(edited))
    done = run_cli(*args, "--out", str(run))
    assert done.returncode == 1, done.stderr
    points = axis_of(run / "axis.json")["points"]
    assert points[0]["verdict"] == "no_drift", "the prefill never reads the cache"
    assert [(p["drift_origin"], p["cause"]) for p in points[1:]] == [(layer, "file_differs")] * 2
    assert f"first fails at decode step 1: born at `{layer}` (file_differs)" in done.stdout
    axis = run_cli("reduce", str(run / "axis.json"))
    assert axis.returncode == 2 and "reduce one point's report" in axis.stderr, axis.stderr
    reduced = run_cli("reduce", str(run / "step-1" / "report.json"))
    assert reduced.returncode == 0, reduced.stdout + reduced.stderr
    assert reduced.stdout.startswith(f"decode step 1: repro of `{layer}`"), reduced.stdout
    edit = "po_positions" if fault is positions_off_with_cache else "ms_mask"
    assert f"→{edit}" in reduced.stdout, reduced.stdout
    assert "running the report's command again (at 1)" in reduced.stderr
    # only as far as the step: the second is not decoded again
    assert "decode step 2…" not in reduced.stderr
    shown = subprocess.run([sys.executable, "repro.py"], cwd=run / "step-1" / "repro",
                           capture_output=True, text=True)  # fmt: skip
    assert shown.returncode == 1, shown.stdout + shown.stderr


def test_decoding_is_refused_for_a_model_without_a_cache_and_beside_an_axis(tmp_path):
    done = run_cli("torch", "resnet18", "--decode-steps", "2")
    assert done.returncode == 2
    assert "--decode-steps needs a transformers decoder with a key/value cache" in done.stderr
    assert "`ResNet` is not one" in done.stderr and "Traceback" not in done.stderr
    done = run_cli("torch", "llama", "--decode-steps", "2", "--batch-sizes", "1,2")
    assert done.returncode == 2 and "cannot be used with" in done.stderr
    done = run_cli("torch", "llama", "--decode-steps", "0")
    assert done.returncode == 2 and "`0` is not a size above zero" in done.stderr


def test_a_file_without_the_cache_as_inputs_is_refused_with_the_layout_it_needs(
    checkpoint, tmp_path
):
    from layerdiff.torch import export_onnx, load_checkpoint

    one_pass = export_onnx(*load_checkpoint(checkpoint("llama")), tmp_path / "one_pass.onnx")
    done = run_cli(
        "torch", str(checkpoint("llama")), "--decode-steps", "1", "--onnx", str(one_pass)
    )
    assert done.returncode == 2, done.stderr
    assert "takes 3 input(s) (input_ids, attention_mask, position_ids)" in done.stderr
    assert "each of the 2 layers' cached keys and values (7 inputs, in that order)" in done.stderr


def test_an_int4_decoder_is_quantization_and_a_block_scale_off_is_the_headline(
    checkpoint, tmp_path
):
    """The decoder's file quantized to 4 bits in blocks of 32 by ONNX Runtime's
    MatMulNBitsQuantizer, as int4 decoders ship: the quantizer drops the nodes' scopes, and
    every projection is still compared (paired by its input, or by its place after a copy),
    its error the quantization's; one block's scale off by 30% is the defect at its layer."""
    import numpy as np
    import onnx
    from onnx import numpy_helper
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    folder = checkpoint("llama")
    clean = tmp_path / "clean"
    assert run_cli("torch", str(folder), "--decode-steps", "1", "--out", str(clean)).returncode == 0
    quantizer = MatMulNBitsQuantizer(
        onnx.load(str(clean / "model.onnx")), block_size=32, is_symmetric=True
    )
    quantizer.process()
    int4 = quantizer.model.model
    int4.ir_version = min(int4.ir_version, 10)
    onnx.save(int4, str(tmp_path / "int4.onnx"))
    out = tmp_path / "int4.json"
    args = ("torch", str(folder), "--decode-steps", "1", "--out", str(tmp_path / "q"))
    done = run_cli(*args, "--onnx", str(tmp_path / "int4.onnx"), "--json", str(out))
    assert done.returncode == 0, done.stderr
    for point in axis_of(out)["points"]:
        assert point["verdict"] == "precision" and point["layers_compared"] == 60, point
    step = json.loads((tmp_path / "q" / "step-1" / "report.json").read_text())
    down = next(x for x in step["layers"] if x["name"] == "model.layers.1.mlp.down_proj")
    assert down["location"]["op"] == "MatMulNBits" and down["cause"] == "precision_loss", down
    assert "quantized: every element within half a scale step" in down["detail"]

    node = next(n for n in int4.graph.node if n.output[0] == down["location"]["value"])
    scales = next(i for i in int4.graph.initializer if i.name == node.input[2])
    values = numpy_helper.to_array(scales).copy()
    values.flat[5] *= np.float32(1.3)
    scales.CopyFrom(numpy_helper.from_array(values, scales.name))
    onnx.save(int4, str(tmp_path / "bug.onnx"))
    done = run_cli(*args[:4], "--onnx", str(tmp_path / "bug.onnx"), "--json", str(out))
    assert done.returncode == 1, done.stderr
    for point in axis_of(out)["points"]:
        assert (point["drift_origin"], point["cause"]) == (
            "model.layers.1.mlp.down_proj",
            "weight_mismatch",
        ), point


def _dynamic_int8(src, dst):
    """`src` quantized by ONNX Runtime's dynamic quantizer (int8 weights), as a user does it:
    it sorts the graph again, stores the embedding table in int8 and renames the weights."""
    import logging

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(src))
    del model.graph.value_info[:]
    onnx.save(model, str(dst))
    logging.disable(logging.WARNING)
    try:
        quantize_dynamic(str(dst), str(dst), weight_type=QuantType.QInt8)
    finally:
        logging.disable(logging.NOTSET)
    model = onnx.load(str(dst))
    model.ir_version = min(model.ir_version, 10)
    onnx.save(model, str(dst))
    return model


@pytest.mark.parametrize("name", ["llama", pytest.param("qwen2", marks=pytest.mark.thorough)])
def test_an_honest_dynamic_int8_decoder_is_its_quantization_at_every_step(
    checkpoint, name, tmp_path
):
    """The decoder's own export quantized by `quantize_dynamic`: its rounding, at every step.
    It read "22 defects" (Qwen2: 28): the quantizer's sorted graph paired the rotary `cat`
    with the cache's (a GQA `shape_mismatch`), RMSNorm's epsilon was held to a constant of
    the same generated name in an export made for one step's shapes ("`val_69` differs: max
    abs diff 8.0"), and "52 of 51 layers exceeding". A weight scale off by 30% is then the
    one defect, at its layer, at every step, and the decoder is exported once to name it,
    not again at each step."""
    import onnx
    from onnx import numpy_helper

    folder = checkpoint(name)
    clean = tmp_path / "clean"
    assert run_cli("torch", str(folder), "--decode-steps", "2", "--out", str(clean)).returncode == 0
    int8 = _dynamic_int8(clean / "model.onnx", tmp_path / "int8.onnx")
    out = tmp_path / "int8.json"
    args = ("torch", str(folder), "--decode-steps", "2", "--json", str(out))
    done = run_cli(*args, "--onnx", str(tmp_path / "int8.onnx"))
    assert done.returncode == 0, done.stdout + done.stderr
    for point in axis_of(out)["points"]:
        assert point["verdict"] == "precision", point
        assert point["layers_exceeding"] <= point["layers_compared"], point
    assert "exporting" not in done.stderr  # a file that computes as the model: nothing to name

    # the third MatMulInteger's weight scale ×1.3: v_proj of the first layer
    product = [n for n in int8.graph.node if n.op_type == "MatMulInteger"][2]
    scale_name = product.input[1].removesuffix("_quantized") + "_scale"
    scale = next(i for i in int8.graph.initializer if i.name == scale_name)
    scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale) * 1.3, scale_name))
    onnx.save(int8, str(tmp_path / "bug.onnx"))
    done = run_cli(*args, "--onnx", str(tmp_path / "bug.onnx"))
    assert done.returncode == 1, done.stdout + done.stderr
    for point in axis_of(out)["points"]:
        assert (point["drift_origin"], point["cause"]) == (
            "model.layers.0.self_attn.v_proj",
            "weight_mismatch",
        ), point
    assert done.stderr.count("exporting") <= 1, done.stderr
