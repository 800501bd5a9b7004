"""Keras as a side: a functional Keras model compared layer by layer with its tf2onnx
conversion on a runtime (channels-last values against the file's channels-first ones), and with
TensorFlow computing it another way (XLA, a SavedModel loaded back, TFLite)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import run_cli

tf = pytest.importorskip(
    "tensorflow", reason="TensorFlow is not installed (pip install 'layerdiff[tf]')"
)
onnx = pytest.importorskip("onnx")
pytest.importorskip("tf2onnx")

from faults import producer, scale_weight  # noqa: E402
from layerdiff import _layerdiff  # noqa: E402
from layerdiff.keras import compare_keras, load_keras  # noqa: E402
from layerdiff.keras._targets import to_onnx  # noqa: E402


@pytest.fixture(scope="module")
def cnn():
    return load_keras("keras_cnn", 0)


@pytest.fixture(scope="module")
def cnn_onnx(cnn, tmp_path_factory):
    model, inputs = cnn
    return to_onnx(model, inputs, tmp_path_factory.mktemp("keras") / "cnn.onnx", 17)


def layers(report):
    return {layer["name"]: layer for layer in report.data["layers"]}


def test_a_clean_conversion_compares_every_layer_in_the_keras_layout(cnn, cnn_onnx):
    """tf2onnx holds the conv activations NCHW; each is compared transposed back to Keras's
    NHWC, so nothing is taken for a layout fault and no layer drifts."""
    model, inputs = cnn
    report = compare_keras(model, inputs, onnx=cnn_onnx)
    s = report.data["summary"]
    assert s["verdict"] == "no_drift", s
    assert not s["defects"]
    by_name = layers(report)
    # conv1 is folded with the batch norm after it: its own value is not in the file
    assert by_name["conv1"]["status"] == "unmapped", by_name["conv1"]
    for name in ("bn1", "relu1", "dw", "pw", "residual", "pool", "conv2", "gap", "fc"):
        layer = by_name[name]
        assert layer["status"] == "compared", layer
        assert layer["local"]["max_abs_diff"] < 1e-4, layer
        assert layer["location"]["kind"] == "onnx", layer
    # the values really were held channels-first and brought back
    assert "held channels-first, compared transposed" in report.data["target"]["detail"]
    assert by_name["pw"]["shape"] == [1, 32, 32, 16]


def test_a_conv_folded_into_its_batch_norm_is_reported_as_folded(tmp_path):
    """tf2onnx folds each BatchNormalization into its Conv2D and names the fused Conv without a
    scope, and names the input's layout Transpose after a BatchNormalization op: the Conv was
    "unmapped … or drifted too far", the BatchNormalization paired with the input's Transpose
    ("mapping problem"), and the second Conv2D paired with the ReLU before it, a false defect.
    Each fused Conv is now found by its weight's scope: the BatchNormalization is compared on
    it and the Conv2D is reported as fused into it, as docs/keras.md says."""
    from conftest import ROOT

    builder = f"{ROOT / 'tests/builders/keras_conv_bn.py'}:build"
    out = tmp_path / "r.json"
    result = run_cli("keras", builder, "--json", str(out), "-q")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert report["summary"]["verdict"] == "no_drift", report["summary"]
    by_name = {layer["name"]: layer for layer in report["layers"]}
    for conv, bn in (("conv", "bn"), ("conv_b", "bn_b")):
        assert by_name[conv]["status"] == "unmapped"
        assert by_name[conv]["reason"].startswith(f"fused with `{bn}` at export"), by_name[conv]
        assert by_name[bn]["status"] == "compared", by_name[bn]
        assert by_name[bn]["location"]["op"] == "Conv"
    assert by_name["relu"]["location"]["op"] == "Relu"
    assert not any("mapping problem" in (x.get("reason") or "") for x in report["layers"])


def test_a_weight_changed_in_the_onnx_file_is_the_one_defect_at_its_layer(cnn, cnn_onnx, tmp_path):
    model, inputs = cnn
    graph = onnx.load(str(cnn_onnx)).graph
    conv = next(n for n in graph.node if n.op_type == "Conv" and "/pw" in n.name)
    bug = scale_weight(cnn_onnx, tmp_path / "bug.onnx", conv.output[0], 1.05)
    report = compare_keras(model, inputs, onnx=bug)
    s = report.data["summary"]
    assert s["drift_origin"] == "pw", s
    assert [(d["layer"], d["cause"]) for d in s["defects"]] == [("pw", "weight_mismatch")], s
    assert "`pw/kernel`" in s["defects"][0]["detail"]
    by_name = layers(report)
    assert by_name["pw"]["local_exceeds"]
    # what follows inherits it and has no error of its own
    assert not by_name["relu2"]["local_exceeds"]
    assert producer(graph, conv.output[0]).op_type == "Conv"


@pytest.mark.parametrize("target", ["xla", "savedmodel", "tflite"])
def test_tensorflow_computing_the_model_another_way_is_compared_layer_for_layer(cnn, target):
    model, inputs = cnn
    report = compare_keras(model, inputs, target=target)
    s = report.data["summary"]
    assert not s["defects"], s
    assert s["layers_compared"] == s["layers_total"] == 11
    assert report.data["target"]["detail"]
    by_name = layers(report)
    if target == "xla":  # each layer compiled alone on Keras's values: its own error
        assert by_name["conv2"]["local"]["max_abs_diff"] < 1e-4
    elif target == "tflite":  # each layer recomputed on the interpreter's own inputs
        assert by_name["conv2"]["local"]["max_abs_diff"] < 1e-5
        assert by_name["conv2"]["baseline"]["multiple"] <= 1.0
    else:
        assert "alone" in by_name["conv2"]["local_reason"], by_name["conv2"]


def test_the_command_line_runs_a_builtin_keras_model_and_writes_its_report(tmp_path):
    out = tmp_path / "r.json"
    result = run_cli("keras", "keras_cnn", "--target", "tract", "--json", str(out), "-q")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert report["command"] == "keras"
    assert report["target"]["runtime"] == "tract"
    assert report["summary"]["verdict"] == "no_drift"


def test_quiet_is_quiet_even_where_tensorflow_logs_natively(tmp_path):
    """The TFLite converter and interpreter print from C++ (`fully_quantize: 0, …`, `INFO:
    Created TensorFlow Lite XNNPACK delegate`): with --quiet nothing reaches the terminal."""
    out = tmp_path / "r.json"
    result = run_cli("keras", "keras_cnn", "--target", "tflite:int8", "--json", str(out), "-q")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (result.stdout, result.stderr) == ("", "")
    assert json.loads(out.read_text())["summary"]["verdict"] == "precision"


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("torch:cuda", "`torch:cuda` is a PyTorch side: compare it with `layerdiff torch`"),
        ("tflite:int4", "unknown Keras side `tflite:int4`"),
    ],
)
def test_a_target_a_keras_model_cannot_have_is_refused_by_name(target, message):
    result = run_cli("keras", "keras_cnn", "--target", target)
    assert result.returncode == 2
    assert message in result.stderr, result.stderr
    with pytest.raises(_layerdiff.UsageError, match=message.split(":")[0].strip("`")):
        _layerdiff.Options(target=target, framework="Keras")


def test_a_keras_side_is_refused_by_the_pytorch_verbs_and_named():
    result = run_cli("torch", "resnet18", "--target", "xla")
    assert result.returncode == 2
    assert "`xla` is a Keras side: compare it with `layerdiff keras`" in result.stderr


def test_without_tensorflow_the_verb_says_how_to_install_it():
    code = (
        "import sys; sys.modules['tensorflow'] = None\n"
        "from layerdiff._cli import main\n"
        "sys.exit(main(['keras', 'keras_cnn']))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert "needs TensorFlow" in result.stderr
    assert "pip install 'layerdiff[tf]'" in result.stderr


def test_a_subclassed_model_is_refused_with_what_to_do():
    keras = pytest.importorskip("keras")

    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(4)

        def call(self, x):
            return self.dense(x)

    net = Net()
    x = np.zeros((1, 3), np.float32)
    net(x)
    with pytest.raises(_layerdiff.UsageError, match="functional API"):
        compare_keras(net, (x,))


# --- TFLite: float16 weights and full-integer int8, each layer on the interpreter's own inputs


def edited_tflite(edit):
    """A `Tflite.convert` that edits the flatbuffer after converting, as a faulty converter
    would: `edit(model, tensor_named)` changes the flatbuffer's object model in place."""
    from layerdiff.keras._tflite import convert
    from tensorflow.lite.tools import flatbuffer_utils

    def faulty(model, precision, inputs):
        tree = flatbuffer_utils.convert_bytearray_to_object(
            bytearray(convert(model, precision, inputs))
        )
        graph = tree.subgraphs[0]

        def tensor_named(part):
            found = [t for t in graph.tensors if t.name.decode().endswith(part)]
            assert len(found) == 1, [t.name for t in found]
            return found[0]

        edit(tree, graph, tensor_named)
        return bytes(flatbuffer_utils.convert_object_to_bytearray(tree))

    return staticmethod(faulty)


def conv_output(graph, filter_tensor):
    """The tensor a CONV_2D that reads `filter_tensor` writes."""
    index = graph.tensors.index(filter_tensor)
    op = next(op for op in graph.operators if index in list(op.inputs))
    return graph.tensors[op.outputs[0]]


def test_a_full_integer_conversion_is_judged_as_quantization_layer_by_layer(cnn):
    """int8 moves every value by steps of its scale: each layer's own error, on the values
    the interpreter itself fed it, is held to the ideal integer computation with the weights
    the file stores; nothing is a defect, every layer is measured."""
    model, inputs = cnn
    report = compare_keras(model, inputs, target="tflite:int8")
    s = report.data["summary"]
    assert s["verdict"] == "precision", s
    assert not s["defects"], s
    assert s["layers_compared"] == s["layers_total"] == 11
    assert "full-integer int8" in report.data["target"]["detail"]
    for layer in report.data["layers"]:
        grid = layer["quantization"]
        assert grid["dtype"] == "int8" and grid["saturated"] == 0, layer
        assert layer["local"] is not None, layer
        # rounding to a grid moves a value by 0.29 steps root mean square; an honest
        # kernel stays near that
        assert grid["rms_steps"] < 0.6, layer
        assert layer["baseline"]["multiple"] <= 1.0, layer
    by_name = layers(report)
    assert by_name["conv1"]["cause"] == "precision_loss"
    assert "int8 (scale" in by_name["conv1"]["detail"]


def test_a_wrong_weight_scale_in_the_int8_file_is_the_defect_at_its_layer(cnn, monkeypatch):
    """The pointwise conv's filter scales 1.5× too large: its weights dequantize to other
    values than Keras's, so `pw` is a weight_mismatch defect and nothing else is."""
    from layerdiff.keras._tflite import Tflite

    def edit(tree, graph, tensor_named):
        q = tensor_named("pw_1/convolution").quantization
        q.scale = [s * 1.5 for s in q.scale]

    monkeypatch.setattr(Tflite, "convert", edited_tflite(edit))
    model, inputs = cnn
    report = compare_keras(model, inputs, target="tflite:int8")
    s = report.data["summary"]
    assert [(d["layer"], d["cause"]) for d in s["defects"]] == [("pw", "weight_mismatch")], s
    assert "beyond its quantization" in s["defects"][0]["detail"]
    assert "`pw/kernel`" in s["defects"][0]["detail"]


def test_a_range_too_narrow_for_a_layer_is_a_calibration_defect_there(cnn, monkeypatch):
    """conv2's output scale eight times too small: its kernel is honest, yet most of what
    it computes lies outside its grid and is clipped: `quantization_range` at conv2."""
    from layerdiff.keras._tflite import Tflite

    def edit(tree, graph, tensor_named):
        out = conv_output(graph, tensor_named("conv2_1/convolution"))
        out.quantization.scale = [s / 8 for s in out.quantization.scale]

    monkeypatch.setattr(Tflite, "convert", edited_tflite(edit))
    model, inputs = cnn
    report = compare_keras(model, inputs, target="tflite:int8")
    s = report.data["summary"]
    assert [(d["layer"], d["cause"]) for d in s["defects"]] == [("conv2", "quantization_range")], s
    conv2 = layers(report)["conv2"]
    assert conv2["quantization"]["saturated"] > 0.01 * conv2["quantization"]["elements"]
    assert "too narrow" in conv2["detail"]
    assert "representative dataset" in s["defects"][0]["fix"]


def test_float16_weights_are_precision_and_an_edited_one_is_the_defect(cnn, monkeypatch):
    model, inputs = cnn
    clean = compare_keras(model, inputs, target="tflite:fp16")
    s = clean.data["summary"]
    assert s["verdict"] == "precision" and not s["defects"], s
    conv1 = layers(clean)["conv1"]
    assert conv1["cause"] == "precision_loss", conv1
    assert "float16" in conv1["detail"]

    from layerdiff.keras._tflite import Tflite

    def edit(tree, graph, tensor_named):
        weight = tensor_named("pw_1/convolution")
        data = tree.buffers[weight.buffer].data
        values = np.frombuffer(bytes(bytearray(data)), np.float16).copy()
        values[:8] *= 1.2
        tree.buffers[weight.buffer].data = np.frombuffer(values.tobytes(), np.uint8)

    monkeypatch.setattr(Tflite, "convert", edited_tflite(edit))
    report = compare_keras(model, inputs, target="tflite:fp16")
    s = report.data["summary"]
    assert [(d["layer"], d["cause"]) for d in s["defects"]] == [("pw", "weight_mismatch")], s


def test_a_layer_whose_only_constants_the_converter_stores_in_float16_is_not_a_defect():
    """A Rescaling (1/255, as Keras's EfficientNet opens) has no weights: its scale is config
    that the TFLite converter stores in float16 like every float constant. Its ideal was the
    float32 layer, and the rounded scale read "op_implementation (24.0× what precision
    explains)" on an honest conversion."""
    keras = pytest.importorskip("keras")
    keras.utils.set_random_seed(0)
    x = keras.Input((8, 8, 3))
    y = keras.layers.Rescaling(1.0 / 255.0, name="rescaling")(x)
    y = keras.layers.Conv2D(4, 3, name="conv")(y)
    model = keras.Model(x, keras.layers.GlobalAveragePooling2D(name="gap")(y))
    inputs = (np.random.default_rng(0).uniform(0, 255, (1, 8, 8, 3)).astype(np.float32),)
    report = compare_keras(model, inputs, target="tflite:fp16")
    s = report.data["summary"]
    assert not s["defects"], s["defects"]
    rescaling = layers(report)["rescaling"]
    assert rescaling.get("cause") in (None, "precision_loss", "rounding"), rescaling


def test_an_op_tf2onnx_cannot_convert_is_named_not_left_for_the_runtime(tmp_path):
    """An exact GELU becomes TensorFlow's Erfc, which tf2onnx leaves in the file as it is: the
    conversion is refused naming the op and where, with what to do, before any runtime runs."""
    model, inputs = load_keras("keras_encoder", 0)
    with pytest.raises(_layerdiff.ModelError, match="left TensorFlow op.s. Erfc") as e:
        to_onnx(model, inputs, tmp_path / "encoder.onnx", 17)
    assert "ff1" in str(e.value)
    assert not (tmp_path / "encoder.onnx").exists()


@pytest.mark.parametrize("target", ["xla", "savedmodel"])
def test_a_layer_tensorflow_computes_wrong_is_named_on_the_xla_and_savedmodel_paths(
    cnn, monkeypatch, target
):
    """A stand-in for a compiler or a reloaded graph that computes one layer wrong (its
    values 2% too large): the headline names that layer. XLA re-runs it alone, wrong too: an
    op_implementation defect; a SavedModel cannot re-run a layer, so the layer is where the
    drift is born, and nothing else is blamed."""
    from layerdiff.keras import _targets

    side = {"xla": _targets.Xla, "savedmodel": _targets.SavedModel}[target]
    model, inputs = cnn
    names = [layer.name for layer in model.layers[1:]]
    wrong = names.index("conv2")
    right_values, right_local = side.values, side.local

    def values(self, given):
        out = right_values(self, given)
        out[wrong] = out[wrong] * np.float32(1.02)
        return out

    def local(self, index, values_, given):
        found, why = right_local(self, index, values_, given)
        if found is not None and index == wrong:
            found = found * np.float32(1.02)
        return found, why

    monkeypatch.setattr(side, "values", values)
    monkeypatch.setattr(side, "local", local)
    report = compare_keras(model, inputs, target=target)
    s = report.data["summary"]
    assert s["first_exceeding"] == "conv2", s
    assert s["drift_origin"] == "conv2", s
    if target == "xla":
        assert [(d["layer"], d["cause"]) for d in s["defects"]] == [
            ("conv2", "op_implementation")
        ], s
    else:
        assert s["verdict"] in ("defect", "undecided"), s
        assert all(d["layer"] == "conv2" for d in s["defects"]), s


def test_a_savedmodel_folder_given_as_the_model_says_what_to_compare_instead(tmp_path, cnn):
    model, _ = cnn
    folder = tmp_path / "saved"
    tf.saved_model.save(tf.Module(), str(folder))
    result = run_cli("keras", str(folder))
    assert result.returncode == 2
    assert "is a SavedModel folder" in result.stderr
    assert "--target savedmodel" in result.stderr


def test_dynamic_range_quantization_is_held_to_a_bound_of_its_input_rounding(cnn, monkeypatch):
    """Dynamic range: the larger weights in int8 (conv2's, here), activations rounded to int8
    by the kernel as it runs. conv2's own error is held to the layer with its stored weights
    plus the most that rounding its input can move it: precision, well within. Its filter's
    scale 1.3× too large is a weight_mismatch at conv2."""
    model, inputs = cnn
    report = compare_keras(model, inputs, target="tflite:dynamic")
    s = report.data["summary"]
    assert s["verdict"] == "precision" and not s["defects"], s
    conv2 = layers(report)["conv2"]
    assert conv2["cause"] == "precision_loss", conv2
    assert "quantize their float inputs to int8" in conv2["detail"]
    assert conv2["baseline"]["multiple"] < 1.0
    assert "dynamic-range int8" in report.data["target"]["detail"]

    from layerdiff.keras._tflite import Tflite

    def edit(tree, graph, tensor_named):
        q = tensor_named("conv2_1/convolution").quantization
        q.scale = [s * 1.3 for s in q.scale]

    monkeypatch.setattr(Tflite, "convert", edited_tflite(edit))
    report = compare_keras(model, inputs, target="tflite:dynamic")
    s = report.data["summary"]
    assert [(d["layer"], d["cause"]) for d in s["defects"]] == [("conv2", "weight_mismatch")], s
