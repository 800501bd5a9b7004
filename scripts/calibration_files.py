"""The calibration corpus's planted faults (scripts/calibrate_baseline.py) and their files: how
each is made from a model's export (ONNX Runtime's dynamic int8 and int4 quantizers) and how
each fault edits it (an attribute, a folded constant, a weight, a weight scale, a decoder's
positions or mask)."""

from __future__ import annotations

from pathlib import Path

# planted faults: (builder in tests/builders/narrow_kernels.py, forward or grad, target,
# the layer it must be found at, the cause it must have there)
FAULTS = [
    ("cnn", "forward", "torch:bf16", "layer3.0.conv2", "narrow_accumulation"),
    ("cnn", "forward", "torch:fp16", "layer3.0.conv2", "narrow_accumulation"),
    ("transformer", "forward", "torch:bf16", "layers.1.linear1", "narrow_accumulation"),
    ("transformer", "forward", "torch:fp16", "layers.1.linear1", "narrow_accumulation"),
    ("mlp_wrong_backward", "grad", "torch:bf16", "0.weight", "op_implementation"),
    ("mlp_wrong_backward", "grad", "torch:fp16", "0.weight", "op_implementation"),
    ("cnn_wrong_backward", "grad", "torch:bf16", "layer3.0.conv2.weight", "op_implementation"),
    ("transformer_wrong_backward", "grad", "torch:bf16", "layers.1.linear1.weight",
     "op_implementation"),
    ("transformer_wrong_backward", "grad", "torch:fp16", "layers.1.linear1.weight",
     "op_implementation"),
    ("convnext_wrong_backward", "grad", "torch:bf16", "classifier.2.weight", "op_implementation"),
    # 2% short, leaning as stalled sums lean, where the sums do not stall
    ("convnext_short_backward", "grad", "torch:bf16", "classifier.2.weight", "op_implementation"),
    # noise of 5% of its mean on a Linear's weight gradient, which PyTorch sums in float32:
    # within what a bfloat16 running sum errs by, and where no running sum errs
    ("vit_noisy_backward", "grad", "torch:bf16", "encoder.layers.encoder_layer_1.mlp.0.weight",
     "op_implementation"),
    ("vit_noisy_backward", "grad", "torch:fp16", "encoder.layers.encoder_layer_1.mlp.0.weight",
     "op_implementation"),
    # a functional call's epsilon computed from the dtype (tests/builders/dtype_scalar.py)
    ("dtype_scalar", "forward", "torch:bf16", "1:layer_norm", "argument_mismatch"),
    ("dtype_scalar", "forward", "torch:fp16", "1:layer_norm", "argument_mismatch"),
    # a float16 kernel that sums in float16, against a reference that rounds coarser: the
    # reference's bfloat16 rounding, far larger, is set aside (its own, not the target's)
    ("cnn", "forward", "torch:fp16 --reference torch:bf16", "layer3.0.conv2",
     "narrow_accumulation"),
    # the model's ONNX export edited, run by ONNX Runtime as written (`file` faults, EDITS)
    ("bert", "file", "ort", "model.encoder.layer.1.attention.output.LayerNorm", "file_differs"),
    ("resnet18", "file", "ort", "fc", "file_differs"),
    ("edited_files", "file", "ort", "norm", "weight_mismatch"),
    # a squeeze-excitation weight ×1.1: its values (about 1e-3) keep the layer and all after
    # it under the absolute tolerance
    ("efficientnet_b0", "file", "ort", "features.2.0.block.2.fc1", "weight_mismatch"),
    # a Conv+BatchNorm weight ×1.05 in a legacy export, which ONNX Runtime fuses with the ReLU
    # into an NCHWc Conv on a reordered copy: found at the first value that survives
    ("resnet18 legacy", "file", "ort:opt=all", "layer2.0.relu", "weight_mismatch"),
    # a file ONNX Runtime optimized offline (a Conv, its BatchNorm and its ReLU fused into one
    # node that writes the ReLU's output), clean, and with that Conv's weight ×1.05
    ("resnet18 optimized", "file", "ort", None, None),
    ("resnet18 optimized edited", "file", "ort", "layer2.0.relu", "weight_mismatch"),
    # a dynamo export optimized offline: no scope left, paired by values, its attention's key
    # projection sorted before the query's
    ("bert optimized", "file", "ort", None, None),
    # one element of a folded Conv weight moved by 2e-5: no layer exceeds any tolerance
    ("resnet18 one element", "file", "ort", "layer2.0.bn1", "weight_mismatch"),
    # one weight scale ×1.3 in a file quantized by ONNX Runtime's dynamic quantizer
    ("bert dynamic int8", "file", "ort", "model.encoder.layer.0.attention.self.value",
     "weight_mismatch"),
    # an int8 weight's codes ×1.03 in a file quantized with int8 activations (QDQ), which ONNX
    # Runtime at opt=all fuses into a QLinearConv reading the codes, its activations in uint8
    ("resnet18 static int8", "file", "ort:opt=all", "layer2.1.bn1", "weight_mismatch"),
    # an activation's range ten times too narrow in the same file (a calibration that never
    # reached what the model computes there): a third of its values clipped, as written and
    # where ONNX Runtime runs the QDQ pairs as uint8 integer kernels
    ("resnet18 narrow range", "file", "ort", "layer2.0.relu", "quantization_range"),
    ("resnet18 narrow range", "file", "ort:opt=all", "layer2.0.relu", "quantization_range"),
    # no fault planted: tract's Erf, an approximation within every tolerance, at an MLP's
    # small activations (tests/builders/approximations.py), on the default `layerdiff onnx`
    # target
    ("approximations", "file", "file tract", "erf_1", "approximation"),
    # decoders under --decode-steps 2 (DECODE_EDITS): a dynamic int8 weight scale ×1.3, one
    # int4 block's scale ×1.3, positions one too far or a mask one token short where the file
    # is given a cache
    ("llama dynamic int8", "decode", "ort", "model.layers.0.self_attn.v_proj",
     "weight_mismatch"),
    ("qwen2 int4", "decode", "ort", "model.layers.1.mlp.down_proj", "weight_mismatch"),
    ("llama float", "decode", "ort", "model.rotary_emb", "file_differs"),
    ("gpt2 float", "decode", "ort", "transformer.h.0.attn:add", "file_differs"),
    # a block whose own code computes differently only when compiled as a whole, two levels
    # down (tests/builders/compiled_block.py), and the same fault in the first block; its
    # clean twin (no layer and no module: `None`)
    ("compiled_block", "forward", "torch:compile", "stages.1.blocks.1", "cross_module_fusion"),
    ("compiled_block:build_first", "forward", "torch:compile", "stages.0.blocks.0",
     "cross_module_fusion"),
    ("compiled_block:build_clean", "forward", "torch:compile", None, None),
    # a norm whose epsilon is 1.0 in any dtype but float32 (tests/builders/dtype_branch.py):
    # the float64 copy and the baseline take the target's path, the reference alone does not
    ("dtype_branch", "forward", "torch:bf16", "n", "op_implementation"),
    ("dtype_branch", "forward", "torch:fp16", "n", "op_implementation"),
    # a decoder on a left-padded batch: rows whose queries see no key, each side masking with
    # its own dtype's extreme (tests/builders/padded_decoder.py); clean on every side
    ("padded_decoder", "forward", "torch:bf16", None, None),
    ("padded_decoder", "forward", "torch:fp16", None, None),
    ("padded_decoder", "forward", "torch:fp16 --reference torch:bf16", None, None),
    ("padded_decoder", "forward", "--dtype fp16", None, None),
    # `vs`: an export against its float16 conversion (`layerdiff onnx EXPORT --vs FILE`), a
    # classifier whose output is its argmax: predictions a near tie's rounding changes are
    # precision (there and through PyTorch, where the argmax is a row); ties broken the other
    # way (`select_last_index`) are the file's
    ("classifier fp16", "vs", "ort", None, None),
    ("classifier", "forward", "torch:bf16", None, None),
    ("classifier", "forward", "--dtype fp16", None, None),
    ("classifier fp16 last index", "vs", "ort", "argmax", "file_differs"),
    # data-parallel training (tests/builders/rank_fault.py): rank 1 scales one weight's gradient
    # before the all-reduce; clean twins: a CNN and a transformer, and four bfloat16 ranks
    # against bfloat16 in one process (the all-reduce rounding each hop)
    ("rank_fault", "grad", "torch:ddp=2", "2.weight:rank1", "op_implementation"),
    ("resnet18", "grad", "torch:ddp=2", None, None),
    ("bert", "grad", "torch:ddp=2", None, None),
    ("resnet18", "grad", "torch:bf16:ddp=4 --reference torch:bf16", None, None),
]  # fmt: skip


def attribute(op: str, index: int, name: str, value):
    """An edit: attribute `name` of the `index`-th `op` node set to `value`."""

    def edit(model) -> None:
        from onnx import helper

        node = [n for n in model.graph.node if n.op_type == op][index]
        kept = [a for a in node.attribute if a.name != name]
        del node.attribute[:]
        node.attribute.extend([*kept, helper.make_attribute(name, value)])

    return edit


def folded_divisor(model) -> None:
    """An edit: one element of the constant a Div divides by (folded from two buffers) ×1.05."""
    from onnx import numpy_helper

    div = next(n for n in model.graph.node if n.op_type == "Div")
    folded = next(i for i in model.graph.initializer if i.name == div.input[1])
    values = numpy_helper.to_array(folded).copy()
    values[3] *= 1.05
    folded.CopyFrom(numpy_helper.from_array(values, folded.name))


def scaled(name: str, factor: float):
    """An edit: the initializer `name` scaled by `factor`."""

    def edit(model) -> None:
        from onnx import numpy_helper

        weight = next(i for i in model.graph.initializer if i.name == name)
        values = numpy_helper.to_array(weight)
        weight.CopyFrom(numpy_helper.from_array((values * factor).astype(values.dtype), name))

    return edit


def conv_weight(output: str, factor: float):
    """An edit: the weight of the Conv that writes `output` scaled by `factor`."""

    def edit(model) -> None:
        conv = next(n for n in model.graph.node if output in n.output)
        scaled(conv.input[1], factor)(model)

    return edit


def conv_element(index: int, delta: float):
    """An edit: `delta` added to the first element of the weight of the `index`-th Conv."""

    def edit(model) -> None:
        from onnx import numpy_helper

        conv = [n for n in model.graph.node if n.op_type == "Conv"][index]
        weight = next(i for i in model.graph.initializer if i.name == conv.input[1])
        values = numpy_helper.to_array(weight).copy()
        values.flat[0] += delta
        weight.CopyFrom(numpy_helper.from_array(values, weight.name))

    return edit


def dynamic_scale(index: int, factor: float):
    """An edit of a dynamically quantized file: the weight scale of its `index`-th
    MatMulInteger scaled by `factor`."""

    def edit(model) -> None:
        product = [n for n in model.graph.node if n.op_type == "MatMulInteger"][index]
        scaled(product.input[1].removesuffix("_quantized") + "_scale", factor)(model)

    return edit


def int8_codes(node: str, factor: float):
    """An edit of a statically quantized (QDQ) file: the stored int8 weight of the node named
    `node` (through its DequantizeLinear) scaled by `factor`, rounded and clipped to int8."""

    def edit(model) -> None:
        import numpy as np
        from onnx import numpy_helper

        reader = next(n for n in model.graph.node if n.name == node)
        dequantize = next(n for n in model.graph.node if n.output[0] == reader.input[1])
        weight = next(t for t in model.graph.initializer if t.name == dequantize.input[0])
        codes = numpy_helper.to_array(weight).astype(np.float64) * factor
        moved = np.clip(np.round(codes), -127, 127).astype(np.int8)
        weight.CopyFrom(numpy_helper.from_array(moved, weight.name))

    return edit


def activation_range(value: str, factor: float):
    """An edit of a statically quantized (QDQ) file: the scale the QuantizeLinear of the
    activation `value` shares with its DequantizeLinear multiplied by `factor` (below 1: its
    range too narrow, as a calibration set that never reached what the model computes there
    makes it)."""

    def edit(model) -> None:
        quantize = next(
            n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == value
        )
        scaled(quantize.input[1], factor)(model)

    return edit


# how each `file` fault makes and edits its model's file: (the model, its exporter, which of
# ONNX Runtime's quantizers quantizes the export first, if one does: `dynamic` or `static`
# (int8 QDQ), or `optimized` where its offline optimizer rewrites it, the edit): a
# LayerNorm's epsilon, a Gemm's alpha, a constant the exporter folded, weights, a weight
# scale, a quantized weight's codes
EDITS = {
    "bert": ("bert", "dynamo", None, attribute("LayerNormalization", 3, "epsilon", 0.05)),
    "resnet18": ("resnet18", "dynamo", None, attribute("Gemm", 0, "alpha", 1.01)),
    "edited_files": ("edited_files", "dynamo", None, folded_divisor),
    "efficientnet_b0": (
        "efficientnet_b0", "dynamo", None, scaled("features.2.0.block.2.fc1.weight", 1.1),
    ),
    "resnet18 legacy": (
        "resnet18", "legacy", None, conv_weight("/layer2/layer2.0/conv1/Conv_output_0", 1.05),
    ),
    "resnet18 optimized": ("resnet18", "legacy", "optimized", lambda model: None),
    "resnet18 optimized edited": (
        "resnet18", "legacy", "optimized",
        conv_weight("/layer2/layer2.0/relu/Relu_output_0", 1.05),
    ),
    "resnet18 one element": ("resnet18", "dynamo", None, conv_element(5, 2e-5)),
    "bert optimized": ("bert", "dynamo", "optimized", lambda model: None),
    "bert dynamic int8": ("bert", "dynamo", "dynamic", dynamic_scale(2, 1.3)),
    "resnet18 static int8": (
        "resnet18", "legacy", "static", int8_codes("/layer2/layer2.1/conv1/Conv", 1.03),
    ),
    "resnet18 narrow range": (
        "resnet18", "legacy", "static",
        activation_range("/layer2/layer2.0/relu/Relu_output_0", 0.1),
    ),
    "approximations": ("approximations", "dynamo", None, lambda model: None),
    "classifier fp16": ("classifier", "dynamo", "fp16", lambda model: None),
    "classifier fp16 last index": (
        "classifier", "dynamo", "fp16", attribute("ArgMax", 0, "select_last_index", 1),
    ),
}  # fmt: skip


def block_scale(value: str, factor: float):
    """An edit of an int4 file: one block's scale of the MatMulNBits that writes `value`
    scaled by `factor`."""

    def edit(model) -> None:
        from onnx import numpy_helper

        node = next(n for n in model.graph.node if n.output[0] == value)
        scales = next(i for i in model.graph.initializer if i.name == node.input[2])
        values = numpy_helper.to_array(scales).copy()
        values.flat[5] *= factor
        scales.CopyFrom(numpy_helper.from_array(values, scales.name))

    return edit


def in_file(edit):
    """`edit` (of a loaded model) as an edit of a file: `src` edited into `dst`."""

    def edit_file(src: Path, dst: Path) -> Path:
        import onnx

        model = onnx.load(str(src))
        edit(model)
        onnx.save(model, str(dst))
        return dst

    return edit_file


def positions_off(src: Path, dst: Path) -> Path:
    """A decoder's file whose position ids are one too far where it is given a cache
    (tests/faults.py)."""
    from faults import positions_off_with_cache

    return positions_off_with_cache(src, dst)


def mask_short(src: Path, dst: Path) -> Path:
    """A decoder's file whose attention mask is one token short where it is given a cache
    (tests/faults.py)."""
    from faults import mask_short_with_cache

    return mask_short_with_cache(src, dst)


# how each `decode` fault makes and edits its decoder's file: (the checkpoint, the file, the
# edit of the file)
DECODE_EDITS = {
    "llama dynamic int8": ("llama", "dynamic int8", in_file(dynamic_scale(2, 1.3))),
    "qwen2 int4": ("qwen2", "int4", in_file(block_scale("linear_13", 1.3))),
    "llama float": ("llama", "float", positions_off),
    "gpt2 float": ("gpt2", "float", mask_short),
}


def rewritten(quantizer: str | None, path: Path, folder: Path, inputs) -> Path:
    """The export at `path` as an `EDITS` entry's `quantizer` rewrites it into `folder`
    (`dynamic`, `static`, `optimized`, `fp16`), or as it is (`None`)."""
    if quantizer == "dynamic":
        return dynamic_int8(path, folder / "model.int8.onnx")
    if quantizer == "static":
        return static_int8(path, folder / "model.int8.onnx", inputs)
    if quantizer == "optimized":
        return ort_optimized(path, folder / "model.optimized.onnx")
    if quantizer == "fp16":  # ONNX Runtime's float16 converter, as `--dtype fp16` runs it
        from layerdiff.torch import _precision

        return _precision.convert(path, "fp16", folder / "model.fp16.onnx", inputs)[0]
    return path


def ort_optimized(path: Path, out: Path) -> Path:
    """`path` as ONNX Runtime's offline optimizer writes it at its extended level (fusions
    that any provider runs: a Conv with the activation after it, a MatMul with its Add)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(out)
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return out


def dynamic_int8(path: Path, out: Path) -> Path:
    """`path` quantized by ONNX Runtime's dynamic quantizer (int8 weights) into `out`."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # The dynamo exporter's value_info disagrees with what the quantizer's shape inference
    # makes of a Gemm ("Inferred shape and existing shape differ"): it is inferred again.
    model = onnx.load(str(path))
    del model.graph.value_info[:]
    onnx.save(model, str(out))
    return _quantized(
        out, lambda: quantize_dynamic(str(out), str(out), weight_type=QuantType.QInt8)
    )


def static_int8(path: Path, out: Path, inputs: tuple, per_channel: bool = False) -> Path:
    """`path` quantized by ONNX Runtime's static QDQ quantizer into `out`, activations and
    weights in int8 (as for an accelerator that takes signed int8), calibrated on `inputs` and
    their variations, each weight with one scale (or one per output channel): at `opt=all`
    ONNX Runtime's CPU provider stores those activations as uint8 and fuses the QDQ pairs into
    integer kernels (QLinearConv, QLinearMatMul)."""

    import onnx
    from layerdiff.torch._precision import _Calibration
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    names = [i.name for i in onnx.load(str(path), load_external_data=False).graph.input]
    return _quantized(out, lambda: quantize_static(
        str(path), str(out), _Calibration(names, inputs, 0), quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, per_channel=per_channel,
    ))  # fmt: skip


def _quantized(out: Path, quantize) -> Path:
    """`out`, written by `quantize()` without its advice to pre-process first (given for every
    file), in the IR version ONNX Runtime 1.31 reads."""
    import logging

    import onnx

    logging.disable(logging.WARNING)
    try:
        quantize()
    finally:
        logging.disable(logging.NOTSET)
    model = onnx.load(str(out))
    model.ir_version = min(model.ir_version, 10)
    onnx.save(model, str(out))
    return out


def int4(path: Path, out: Path) -> Path:
    """`path` quantized to 4 bits in blocks of 32 by ONNX Runtime's MatMulNBitsQuantizer, as
    int4 decoders ship."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(onnx.load(str(path)), block_size=32, is_symmetric=True)
    quantizer.process()
    model = quantizer.model.model
    model.ir_version = min(model.ir_version, 10)
    onnx.save(model, str(out))
    return out
