"""A Keras model against its PyTorch twin with the same weights (converted by each layer's kind),
paired by name or by the user's map. Runs with test_keras.py, in TensorFlow's own process."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

pytest.importorskip(
    "tensorflow", reason="TensorFlow is not installed (pip install 'layerdiff[tf]')"
)

from layerdiff.keras import compare_keras, load_keras  # noqa: E402
from test_keras import layers  # noqa: E402


@pytest.fixture(scope="module")
def twin_of():
    from layerdiff.keras.twins import twin

    def made(name):
        model, inputs = load_keras(name, 0)
        return model, inputs, twin(name, 0)

    return made


@pytest.mark.parametrize(
    ("name", "compared", "unpaired"),
    [("keras_cnn", 9, {"residual", "gap"}), ("keras_encoder", 5, {"residual1", "residual2"})],
)
def test_a_keras_model_and_its_pytorch_twin_with_copied_weights_agree_layer_by_layer(
    twin_of, name, compared, unpaired
):
    """The weights go from PyTorch to Keras converted by each layer's kind (a Conv2d's
    (O, I, H, W) kernel to (H, W, I, O), a Linear's transposed, batch norm statistics, a
    multi-head attention's packed projections split per head); the layers pair by name, the
    4-D values are compared channels-last, each module is re-run on Keras's values: no
    drift, and what has no module (a functional add, a mean) is unmapped with the reason."""
    model, inputs, torch_model = twin_of(name)
    report = compare_keras(model, inputs, torch_model=torch_model, copy_weights=True)
    s = report.data["summary"]
    assert s["verdict"] == "no_drift", s
    assert s["layers_compared"] == compared, s
    by_name = layers(report)
    assert {n for n, layer in by_name.items() if layer["status"] == "unmapped"} == unpaired
    assert "no PyTorch module pairs with" in by_name[sorted(unpaired)[0]]["reason"]
    for layer in report.data["layers"]:
        if layer["status"] == "compared":
            assert layer["local"]["max_abs_diff"] < 1e-5, layer
    assert report.data["target"]["runtime"].startswith("torch")


def test_a_copied_weight_with_its_layout_wrong_is_the_defect_at_its_layer(twin_of):
    """The pointwise conv's kernel copied with its input and output channels swapped (the
    (O, I) matrix taken for (I, O), a classic porting mistake that keeps the shape): a
    weight_mismatch at `pw`, and nothing else is a defect."""
    model, inputs, torch_model = twin_of("keras_cnn")
    from layerdiff.keras._twin import copy_weights

    copy_weights({layer.name: layer.name for layer in model.layers if layer.weights},
                 model, torch_model)  # fmt: skip
    pw = model.get_layer("pw")
    kernel, bias = pw.get_weights()
    pw.set_weights([kernel.transpose(0, 1, 3, 2), bias])
    report = compare_keras(model, inputs, torch_model=torch_model)
    s = report.data["summary"]
    assert [(d["layer"], d["cause"]) for d in s["defects"]] == [("pw", "weight_mismatch")], s
    assert "`pw/kernel`" in s["defects"][0]["detail"]
    assert s["drift_origin"] == "pw"


def test_an_attention_projection_copied_without_its_transpose_is_found_there(twin_of):
    model, inputs, torch_model = twin_of("keras_encoder")
    from layerdiff.keras._twin import copy_weights

    copy_weights({n: n for n in ("attention", "norm1", "ff1", "ff2", "norm2")}, model, torch_model)
    attention = model.get_layer("attention")
    weights = attention.get_weights()
    w_q = torch_model.attention.in_proj_weight.detach().numpy()[:32]
    weights[0] = w_q.reshape(32, 4, 8)  # (out, in) taken for (in, out): no transpose
    attention.set_weights(weights)
    report = compare_keras(model, inputs, torch_model=torch_model)
    s = report.data["summary"]
    assert [(d["layer"], d["cause"]) for d in s["defects"]] == [("attention", "weight_mismatch")], s
    assert "query/kernel" in s["defects"][0]["detail"]


def test_the_command_line_pairs_a_users_twin_by_a_weight_map(tmp_path):
    """A user's own pair: a Keras builder, a PyTorch builder whose modules are named
    otherwise, and a JSON map between them; --copy-weights converts the weights over."""
    (tmp_path / "pair.py").write_text(
        "import keras, numpy as np, torch\n"
        "def keras_model():\n"
        "    x = keras.Input((8, 8, 3), name='x')\n"
        "    y = keras.layers.Conv2D(4, 3, padding='same', name='stem')(x)\n"
        "    y = keras.layers.GlobalAveragePooling2D(name='gap')(y)\n"
        "    y = keras.layers.Dense(2, name='head')(y)\n"
        "    m = keras.Model(x, y)\n"
        "    return m, (np.random.default_rng(0).standard_normal((1, 8, 8, 3)).astype('f'),)\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.features = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1))\n"
        "        self.classifier = torch.nn.Linear(4, 2)\n"
        "    def forward(self, x):\n"
        "        return self.classifier(self.features(x).mean((2, 3)))\n"
        "def torch_model():\n"
        "    return Net()\n"
    )
    (tmp_path / "map.json").write_text(json.dumps({"stem": "features.0", "head": "classifier"}))
    out = tmp_path / "r.json"
    args = (
        "keras", f"{tmp_path}/pair.py:keras_model", "--torch", f"{tmp_path}/pair.py:torch_model",
        "--weight-map", str(tmp_path / "map.json"), "--copy-weights", "--json", str(out), "-q",
    )  # fmt: skip
    result = run_cli(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert report["summary"]["verdict"] == "no_drift"
    assert "paired by your map" in report["target"]["detail"]
    by_name = {layer["name"]: layer for layer in report["layers"]}
    assert by_name["stem"]["status"] == by_name["head"]["status"] == "compared"
    # a map that names a module the twin lacks is refused by name
    (tmp_path / "bad.json").write_text(json.dumps({"stem": "features.9"}))
    bad = run_cli(*args[:4], "--weight-map", str(tmp_path / "bad.json"), "-q")
    assert bad.returncode == 2
    assert "`features.9`, no PyTorch module" in bad.stderr
