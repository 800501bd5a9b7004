"""The Keras adapter: a Keras model compared layer by layer with its ONNX conversion (tf2onnx)
on a runtime, or with TensorFlow computing it another way (XLA, a SavedModel loaded back,
TFLite), on the one engine. TensorFlow is imported only here (``pip install 'layerdiff[tf]'``).

Keras holds activations channels-last (NHWC); tf2onnx's ONNX file holds most of them
channels-first (NCHW). The engine is told so and compares each such value transposed back, so
the converter's layout is never taken for a fault.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from layerdiff._native_chatter import dropped  # noqa: E402

with dropped():  # TensorFlow's start-up lines, written below Python as it loads
    import keras
    import tensorflow as tf
import numpy as np  # noqa: E402

tf.get_logger().setLevel("ERROR")  # retracing notices: each layer compiled alone is traced once

from layerdiff import _layerdiff  # noqa: E402
from layerdiff.keras._layers import Layered, float64_copy  # noqa: E402
from layerdiff.keras._targets import SIDES, device, to_onnx  # noqa: E402
from layerdiff.keras.models import ZOO, load_keras  # noqa: E402
from layerdiff.report import Report  # noqa: E402
from layerdiff.tensors import flat  # noqa: E402

__all__ = ["ZOO", "compare_keras", "load_keras"]


def compare_keras(
    model,
    inputs,
    *,
    target: str = "ort",
    onnx=None,
    opset: int = 17,
    tolerance=None,
    local: bool = True,
    float64: bool = True,
    max_memory=None,
    name: str | None = None,
    seed: int | None = None,
    workdir=None,
    progress=None,
    options=None,
    torch_model=None,
    weight_map: dict | None = None,
    copy_weights: bool = False,
) -> Report:
    """Compares a functional Keras model, layer by layer, with ``target``: a runtime for its
    ONNX file (``"ort"``, ``"ort:opt=all"``, ``"tract"``, ``"openvino"``; the file converted by
    tf2onnx at ``opset``, or ``onnx``), or ``"xla"``, ``"savedmodel"``, ``"tflite"``,
    ``"tflite:fp16"``, ``"tflite:int8"``, ``"tflite:dynamic"``.

    ``tolerance``, ``local``, ``float64`` and ``max_memory`` are as for
    ``layerdiff.torch.compare_torch_onnx``: the float64 truth is a copy of the model rebuilt in
    float64 with the same weights. ``options`` (an ``Options`` already parsed) replaces them.

    ``torch_model``: compare with the model's PyTorch twin instead (it takes the inputs
    channels-first): Keras layers pair with its modules by ``weight_map`` (Keras layer name →
    module name), by name, then in order among the layers holding weights; ``copy_weights``
    copies its weights into the Keras model first, converted layer by layer.
    """
    step = progress or (lambda message: None)
    inputs = tuple(
        np.asarray(x) for x in (inputs if isinstance(inputs, (tuple, list)) else (inputs,))
    )
    if options is None:
        options = _layerdiff.Options(
            tolerance=tolerance, local=local, max_memory=max_memory, target=target,
            float64=float64, framework="Keras",
        )  # fmt: skip
    options.check_file(onnx)  # the command line's rule for --onnx, kept in Rust
    layered = Layered(model)
    twin = None
    if torch_model is not None:
        from layerdiff.keras._twin import TorchTwin
        from layerdiff.keras._twin import copy_weights as copy_into

        twin = TorchTwin(layered, inputs, torch_model, weight_map)
        if copy_weights:
            step("copying the PyTorch twin's weights into the Keras model")
            copy_into(twin.paired_names(), model, torch_model)
    if len(inputs) != len(model.inputs):
        raise _layerdiff.InputError(
            f"the model takes {len(model.inputs)} input(s), but {len(inputs)} were given"
        )
    step("running the Keras model, every layer's output kept")
    values = layered.run(inputs)
    listed = layered.listed(values, inputs)
    name = name or model.name
    reference_detail = (
        f"keras {keras.__version__}, tensorflow {tf.__version__}, {device()}, float32"
    )
    with contextlib.ExitStack() as stack:
        folder = (
            Path(workdir) if workdir else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        )
        common = dict(
            command="keras", model=name, layers=listed, options=options, seed=seed,
            reference_runtime=f"keras {keras.__version__}", reference_detail=reference_detail,
            channels_last=True,
        )  # fmt: skip
        keras_side = options.keras_target
        if twin is not None:
            flat_inputs = [flat(t.name, x) for t, x in zip(model.inputs, inputs, strict=True)]
            step("running the PyTorch twin, every paired module's output kept")
            side = twin
            twin.values(inputs)  # before the run is made: the modules not called are unpaired
            run = _layerdiff.CapturedRun(
                inputs=flat_inputs, target_runtime=side.runtime, target_detail=side.detail,
                pushed=True, unpaired=sorted(side.unpaired.items()), **common,
            )  # fmt: skip
        elif keras_side is None:
            if onnx is None:
                folder.mkdir(parents=True, exist_ok=True)
                step(f"converting to ONNX with tf2onnx (opset {opset})")
                onnx = to_onnx(model, inputs, folder / "model.onnx", opset)
            declared = _layerdiff.model_inputs(str(onnx))
            if len(declared) != len(inputs):
                raise _layerdiff.InputError(
                    f"the ONNX model takes {len(declared)} input(s), but the Keras model "
                    f"{len(inputs)}"
                )
            flat_inputs = [flat(d[0], x) for d, x in zip(declared, inputs, strict=True)]
            run = _layerdiff.CapturedRun(inputs=flat_inputs, onnx_path=str(onnx), **common)
            side = None
        else:
            flat_inputs = [flat(t.name, x) for t, x in zip(model.inputs, inputs, strict=True)]
            step(f"preparing the target ({keras_side.spelling})")
            side = SIDES[keras_side.spelling](layered, inputs)
            run = _layerdiff.CapturedRun(
                inputs=flat_inputs, target_runtime=side.runtime, target_detail=side.detail,
                lower_precision=getattr(side, "lower_precision", None), **common,
            )  # fmt: skip
        step("comparing each layer")
        _stream(run, layered, values, inputs, side, options, step)
        needed = run.conclude()
        stored, halves = _stored_weights(side, needed)
        report = Report(run.finish(_weights(layered, needed), stored, halves), inputs=flat_inputs)
    return report


def _stream(run, layered, values, inputs, side, options, step) -> None:
    """Hands each layer's value over with the float64 copy's and, for a target computed here,
    its value there and its own error's terms: the layer re-run there on the reference's
    inputs, or (a side that runs its model whole) recomputed on the side's own inputs."""
    truth, wide = None, None
    if options.float64:
        try:
            wide = Layered(float64_copy(layered.model))
            truth = wide.run(tuple(_widened(x) for x in inputs))
        except Exception as e:
            why = f"the float64 copy of the model failed: {type(e).__name__}: {e}"
            run.truth_lost(why)
            if options.local:
                run.baseline_lost(why)
    baseline = truth is not None and options.local
    theirs = side.values(inputs) if side is not None else None
    # a side that runs its model whole: each layer's own error on its own inputs
    whole = hasattr(side, "own")
    for index, layer in enumerate(layered.layers):
        extra = {}
        if side is not None and theirs[index] is not None:  # a twin may lack the layer
            extra["target"] = flat(layer.name, theirs[index])
            if options.local and whole:
                extra.update(_own(side, index, theirs, wide, layer.name))
            elif options.local:
                local, why = side.local(index, values, inputs)
                if local is not None:
                    extra["local"] = flat(layer.name, local)
                else:
                    extra["local_error"] = why
        if baseline and not whole and values[index].dtype.kind == "f":
            # the same-precision baseline: the layer in float64 on Keras's (float32) values of
            # its inputs, what an exact kernel fed the same values computes
            given = [_widened(a) for a in layered.arguments(index, values, inputs)]
            try:
                extra["baseline"] = flat(layer.name, np.asarray(wide.call(index, given)))
            except Exception as e:
                # the layers after it have no baseline and say why; the truth goes on
                run.baseline_lost(f"`{layer.name}` in float64 failed: {type(e).__name__}: {e}")
                baseline = False
        exact = flat(layer.name, truth[index]) if truth is not None else None
        run.add(index, flat(layer.name, values[index]), exact, **extra)


def _own(side, index, theirs, wide, name) -> dict:
    """What `run.add` takes of layer `index`'s own error on the target's own inputs."""
    if wide is None:
        return {"local_error": "its own error on the target's inputs needs the float64 copy "
                "of the model (without --no-float64)"}  # fmt: skip
    try:
        own = side.own(index, theirs, wide)
    except Exception as e:  # one layer that cannot be recomputed says so in the report
        return {"local_error": f"`{name}` in float64 failed: {type(e).__name__}: {e}"}
    if own.exact is None:
        return {"local_error": own.why}
    extra = {"own_exact": flat(name, own.exact), "quantization": own.grid}
    if own.ideal is not None:
        extra["own_ideal"] = flat(name, own.ideal)
        if own.slack is not None:
            extra["own_slack"] = flat(name, own.slack)
    else:
        extra["own_why"] = own.why
    return extra


def _weights(layered, needed) -> dict:
    """The weights of the layers `needed` for their causes, in ONNX's layouts. A
    BatchNormalization fed by a convolution also lists the convolution's kernel and bias folded
    with it, under the convolution's names: the form tf2onnx writes when it fuses the two."""
    out = {}
    for index in needed:
        layer = layered.layers[index]
        own = [_onnx_form(w, np.asarray(w)) for w in layer.weights]
        fed = layered.fed_by[index]
        conv = layered.layers[fed[0]] if len(fed) == 1 else None
        if isinstance(layer, keras.layers.BatchNormalization) and isinstance(conv, _CONVS):
            own += _folded(layer, conv)
        out[index] = own
    return out


_CONVS = (keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.DepthwiseConv2D)


def _folded(norm, conv) -> list:
    """`conv`'s kernel (and bias) with `norm` folded into them (inference: its moving
    statistics), and the kernel as it is, in ONNX's layouts under `conv`'s weight paths."""

    def by_name(layer):
        return {getattr(w, "path", w.name).rsplit("/", 1)[-1]: w for w in layer.weights}

    weights, stats = by_name(conv), by_name(norm)
    kernel_weight = weights.get("kernel", weights.get("depthwise_kernel"))
    kernel = np.asarray(kernel_weight)
    scale = 1.0 / np.sqrt(np.asarray(stats["moving_variance"], np.float64) + norm.epsilon)
    if "gamma" in stats:
        scale = scale * np.asarray(stats["gamma"], np.float64)
    shift = -np.asarray(stats["moving_mean"], np.float64) * scale
    if "beta" in stats:
        shift = shift + np.asarray(stats["beta"], np.float64)
    # the output channels are the kernel's last axis; a depthwise kernel's are its last two
    per_output = scale.reshape(kernel.shape[2:]) if kernel.ndim == 4 and "depthwise_kernel" in \
        weights else scale  # fmt: skip
    forms = [
        _onnx_form(kernel_weight, (kernel * per_output).astype(kernel.dtype)),
        _onnx_form(kernel_weight, kernel),
    ]
    if "bias" in weights:
        bias = np.asarray(weights["bias"], np.float64) * scale + shift
        forms.append(_onnx_form(weights["bias"], bias.astype(kernel.dtype)))
    return forms


def _stored_weights(side, needed) -> tuple[dict, dict]:
    """The weights the target stores for the layers `needed` (dequantized), and half a step of
    their storage per element, in the forms of `_weights`."""
    stored, halves = {}, {}
    for index in needed:
        found = side.stored_for_checks(index) if hasattr(side, "stored_for_checks") else None
        if found:
            stored[index] = [_onnx_form(w, value) for w, value, _ in found]
            if all(half is not None for *_, half in found):
                halves[index] = [_onnx_form(w, half) for w, _, half in found]
    return stored, halves


def _onnx_form(weight, array):
    """A Keras weight's `array` as ONNX holds it, under the weight's path: a convolution's kernel
    (H, W, in, out) as (out, in, H, W), a depthwise one (H, W, C, M) as (C·M, 1, H, W)."""
    name = getattr(weight, "path", weight.name)
    if array.ndim == 4 and "depthwise" in name:
        h, w, c, m = array.shape
        array = array.transpose(2, 3, 0, 1).reshape(c * m, 1, h, w)
    elif array.ndim >= 3:
        array = array.transpose(array.ndim - 1, array.ndim - 2, *range(array.ndim - 2))
    return flat(name, np.ascontiguousarray(array.astype(np.asarray(weight).dtype)))


def load_twin(command):
    """The PyTorch twin `--torch` names (a built-in model's `twin`, or a builder returning a
    module) and the `--weight-map`, read."""
    import json

    try:
        import torch
    except ImportError as e:
        raise _layerdiff.UsageError(
            "--torch compares with a PyTorch model and needs PyTorch\n"
            "hint: pip install 'layerdiff[torch]'"
        ) from e

    from layerdiff._builders import builder_function

    if command.torch_twin == "twin":
        from layerdiff.keras.twins import twin

        model = twin(command.model, command.seed)
    else:
        build = builder_function(command.torch_twin)
        try:
            torch.manual_seed(command.seed)
            model = build()
        except Exception as e:
            raise _layerdiff.ModelError(
                f"`{command.torch_twin}` failed: {type(e).__name__}: {e}"
            ) from e
        if isinstance(model, (tuple, list)):
            model = model[0]
        if not isinstance(model, torch.nn.Module):
            raise _layerdiff.UsageError(
                f"`{command.torch_twin}` returned a {type(model).__name__}, not a PyTorch module"
            )
    weight_map = None
    if command.weight_map is not None:
        try:
            weight_map = json.loads(open(command.weight_map).read())
        except (OSError, ValueError) as e:
            raise _layerdiff.UsageError(
                f"cannot read the weight map `{command.weight_map}`: {e}"
            ) from e
        if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
        ):
            raise _layerdiff.UsageError(
                f"the weight map `{command.weight_map}` must be a JSON object of Keras layer "
                "names to PyTorch module names"
            )
    return model, weight_map


def _widened(x):
    x = np.asarray(x)
    return x.astype(np.float64) if x.dtype.kind == "f" else x


def run_command(command, progress) -> int:
    """`layerdiff keras` as parsed: build or load the model, compare, deliver the report."""
    progress(f"loading {command.model} (seed {command.seed})")
    model, inputs = load_keras(command.model, command.seed)
    twin, weight_map, copy = None, None, command.copy_weights
    if command.torch_twin is not None:
        twin, weight_map = load_twin(command)
        copy = copy or command.torch_twin == "twin"
    report = compare_keras(
        model, inputs, onnx=command.onnx, opset=command.opset, name=command.model,
        seed=command.seed, workdir=command.out, progress=progress, options=command.options,
        torch_model=twin, weight_map=weight_map, copy_weights=copy,
    )  # fmt: skip
    return report._native.deliver(command, report.inputs, command.seed, report.notes)
