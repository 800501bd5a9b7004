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
