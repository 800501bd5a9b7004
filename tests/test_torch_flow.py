"""The PyTorch ⇄ ONNX Runtime flow on real models: the drift origin is found at the right layer,
clean exports raise no alarm, and the capture rules (clone, repeated calls) hold."""

from __future__ import annotations

import json

import onnx
import pytest
from conftest import run_cli
from layerdiff import compare_torch_onnx
from layerdiff.torch import capture
from onnx import numpy_helper

RESNET18_LEAF_CALLS = 60  # 52 leaf modules; each BasicBlock calls its ReLU twice (+8)


@pytest.mark.parametrize("exporter", ["dynamo", "legacy"])
def test_clean_resnet18_export_has_no_drift(resnet18, resnet18_onnx, exporter):
    model, inputs, _ = resnet18
    report = compare_torch_onnx(model, inputs, onnx=resnet18_onnx[exporter], tolerance=1e-4)
    s = report.summary
    assert report.drift_origin is None
    assert s["layers_total"] == RESNET18_LEAF_CALLS + 8  # and 8 residual adds
    # Both exporters fold each of the 20 Conv+BatchNorm pairs into one Conv.
    assert (s["layers_compared"], s["layers_unmapped"]) == (48, 20)
    assert s["worst"]["max_abs_diff"]["value"] < 1e-4
    assert all(
        layer["accumulated"]["cosine"] > 0.999999 for layer in report.layers if layer["accumulated"]
    )


def test_bn_maps_to_the_fused_conv_and_the_conv_is_explained(resnet18, resnet18_onnx):
    model, inputs, _ = resnet18
    for exporter in ("dynamo", "legacy"):
        report = compare_torch_onnx(model, inputs, onnx=resnet18_onnx[exporter])
        bn, conv = report.layer("layer2.0.bn1"), report.layer("layer2.0.conv1")
        assert bn["status"] == "compared" and bn["location"]["op"] == "Conv"
        assert conv["status"] == "unmapped" and "fused" in conv["reason"]


def perturb_weight(src, dst, node_name: str, delta: float):
    """Adds `delta` to the first output filter of node `node_name`'s weight (a whole filter, so
    the fault shows even where single input channels are dead after a ReLU)."""
    model = onnx.load(str(src))
    node = next(n for n in model.graph.node if n.name == node_name)
    init = next(i for i in model.graph.initializer if i.name == node.input[1])
    weight = numpy_helper.to_array(init).copy()
    weight[0] += delta
    init.CopyFrom(numpy_helper.from_array(weight, init.name))
    onnx.save(model, str(dst))


@pytest.mark.parametrize("target", ["layer2.0.bn1", "layer3.1.bn2", "fc"])
def test_injected_weight_fault_is_the_drift_origin(resnet18, resnet18_onnx, tmp_path, target):
    model, inputs, _ = resnet18
    clean = compare_torch_onnx(model, inputs, onnx=resnet18_onnx["dynamo"])
    node = clean.layer(target)["location"]["node"]
    edited = tmp_path / "edited.onnx"
    perturb_weight(resnet18_onnx["dynamo"], edited, node, delta=0.05)
    report = compare_torch_onnx(model, inputs, onnx=edited)
    assert report.drift_origin == target
    names = [layer["name"] for layer in report.layers]
    before = names[: names.index(target)]
    assert not any(report.layer(n)["exceeds_tol"] for n in before)


def _moved_one_element(src, dst, name: str, delta: float) -> None:
    """Adds `delta` to the first element of the file's initializer `name`."""
    model = onnx.load(str(src))
    init = next(i for i in model.graph.initializer if i.name == name)
    values = numpy_helper.to_array(init).copy()
    values.flat[0] += delta
    init.CopyFrom(numpy_helper.from_array(values, init.name))
    onnx.save(model, str(dst))


@pytest.mark.parametrize("exporter", ["dynamo", "legacy"])
@pytest.mark.parametrize("layer", ["fc", "layer2.0.bn1"])
def test_a_weight_the_file_changed_within_the_tolerance_is_a_defect(
    resnet18, resnet18_onnx, tmp_path, exporter, layer
):
    """One element of a weight in the file moved by 2e-5, `fc`'s bias or the Conv a BatchNorm
    is folded into: no layer exceeds, and the run said "no drift" with exit 0 while
    `layerdiff check` failed the same file and sent the user here. The file's weights are read
    against the model's parameters at every layer, not only where a layer drifts."""
    model, inputs, _ = resnet18
    src = resnet18_onnx[exporter]
    clean = compare_torch_onnx(model, inputs, onnx=src)
    assert clean.summary["defects"] == [] and clean.summary["verdict"] != "defect"
    node = clean.layer(layer)["location"]["node"]
    graph = onnx.load(str(src)).graph
    name = next(n for n in graph.node if n.name == node).input[2 if layer == "fc" else 1]
    edited = tmp_path / "edited.onnx"
    _moved_one_element(src, edited, name, 2e-5)
    report = compare_torch_onnx(model, inputs, onnx=edited)
    assert not any(x["exceeds_tol"] for x in report.layers)
    (defect,) = report.summary["defects"]
    assert (defect["layer"], defect["cause"]) == (layer, "weight_mismatch"), defect
    assert defect["detail"].startswith(f"`{name}` differs"), defect["detail"]
    assert report.summary["verdict"] == "defect"


BARE_LINEAR = """import torch


def build():
    torch.manual_seed(0)
    return torch.nn.Linear(8, 4).eval(), torch.randn(2, 8)
"""


@pytest.mark.parametrize(
    "verb", [("torch",), ("torch", "--target", "torch:bf16"), ("grad", "--target", "torch:bf16")]
)
def test_a_model_that_is_one_bare_module_is_its_one_layer(tmp_path, verb):
    """A bare nn.Linear as the whole model: `torch` said it "compared no layer" and asked
    whether the file was an export of this model, and `grad` failed on an internal KeyError.
    It is one layer, `Linear` (its gradients `Linear.weight`…), compared as any other."""
    (tmp_path / "bare.py").write_text(BARE_LINEAR)
    done = run_cli(*verb, "bare.py:build", "--json", "r.json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert any(x["name"].startswith("Linear") for x in report["layers"]), report["layers"]
    assert report["summary"]["layers_compared"] >= 1 and report["summary"]["defects"] == []


def test_without_cloning_inplace_relu_corrupts_batchnorm_captures(resnet18, resnet18_onnx):
    """Guards the reason for the clone: ReLU(inplace=True) rewrites the BatchNorm output."""
    model, inputs, _ = resnet18
    path = resnet18_onnx["dynamo"]

    def bns(report):
        return [x for x in report.layers if x["module_type"] == "BatchNorm2d" and x["accumulated"]]

    cloned = compare_torch_onnx(model, inputs, onnx=path, clone=True)
    assert not any(layer["exceeds_tol"] for layer in bns(cloned))
    aliased = compare_torch_onnx(model, inputs, onnx=path, clone=False)
    # Every BatchNorm output is later rewritten in place (by ReLU(inplace=True), or by the block's
    # `out += identity`) except the downsample branch's, which nothing modifies.
    exceeding = {layer["name"] for layer in bns(aliased) if layer["exceeds_tol"]}
    expected = {layer["name"] for layer in bns(aliased) if "downsample" not in layer["name"]}
    assert len(expected) == 17 and exceeding == expected


def test_module_called_twice_gives_numbered_layers_in_execution_order():
    torch = pytest.importorskip("torch")
    from builders.twice import build

    torch.manual_seed(0)
    model, inputs = build()
    model.eval()
    names = [layer.name for layer in capture(model, inputs).layers]
    assert names == ["fc1", "act", "drop", "fc2", "act#2"]
    report = compare_torch_onnx(model, inputs)
    assert report.drift_origin is None
    act, act2 = report.layer("act"), report.layer("act#2")
    assert act["location"]["value"] != act2["location"]["value"]
    assert report.layer("drop")["status"] == "compared"  # identity: compared against `act`
    assert report.layer("drop")["location"]["value"] == act["location"]["value"]


def test_an_identity_after_the_drift_only_inherits_it(tmp_path):
    """A Dropout at inference holds the value of the layer before it on both sides: past a
    fault, its own error is none and it only inherits the drift (it once read `unknown`)."""
    torch = pytest.importorskip("torch")
    from builders.twice import build
    from faults import perturb_weight as perturb
    from layerdiff.torch._export import export_onnx

    torch.manual_seed(0)
    model, inputs = build()
    model.eval()
    clean = export_onnx(model, inputs, tmp_path / "twice.onnx", exporter="legacy")
    fc1 = compare_torch_onnx(model, inputs, onnx=clean).layer("fc1")["location"]["value"]
    faulty = perturb(clean, tmp_path / "faulty.onnx", fc1, 0.5)
    report = compare_torch_onnx(model, inputs, onnx=faulty)
    assert report.drift_origin == "fc1"
    drop = report.layer("drop")
    assert drop["exceeds_tol"] and drop["cause"] == "inherited", drop["detail"]
    assert drop["local"]["max_abs_diff"] == 0.0


def test_the_capture_tells_calls_that_change_nothing_and_values_no_input_reaches():
    """What the mapping leans on where an export drops or folds a call: a module that hands
    its input back (StochasticDepth at inference) or a call like `x * 1.0` changed nothing, a
    ReLU(inplace=True) did; a position table computed from `arange` and a buffer is reached
    by no input, and an in-place add of the input makes a constant reached; a module whose
    output nothing returns feeds no output."""
    torch = pytest.importorskip("torch")
    from torch import nn

    class PassThrough(nn.Module):
        def forward(self, x):
            return x

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.skip = PassThrough()
            self.act = nn.ReLU(inplace=True)
            self.unused = nn.Linear(4, 4)  # called, its output returned by nothing
            self.register_buffer("freq", torch.tensor([0.5, 1.0, 2.0, 4.0]))

        def forward(self, x):
            self.unused(x)
            y = self.skip(self.fc(x))
            table = torch.arange(3.0)[:, None] * self.freq  # (3, 4), from constants only
            scores = y * 1.0
            mixed = torch.zeros(3, 4) + table
            mixed += x  # an input reaches it now
            return self.act(scores + table), mixed

    torch.manual_seed(0)
    layers = {layer.name: layer for layer in capture(Block().eval(), (torch.randn(3, 4),)).layers}
    assert layers["skip"].identity and not layers["act"].identity
    assert layers[":mul#2"].identity and not layers[":mul"].identity
    assert layers[":mul"].constant and layers[":add"].constant
    assert not layers[":mul#2"].constant and not layers["fc"].constant
    assert not layers[":add#2"].constant  # the in-place `+= x`
    assert not layers[":add#3"].constant and not layers["act"].constant
    # what the outputs need: all but the unused Linear (the in-place ReLU's input included)
    assert [n for n, layer in layers.items() if not layer.feeds_output] == ["unused"]


def test_model_with_external_data(resnet18, resnet18_onnx, tmp_path):
    """Weights stored beside the model (as for models over 2 GB) are found from its folder."""
    model, inputs, _ = resnet18
    proto = onnx.load(str(resnet18_onnx["dynamo"]))
    folder = tmp_path / "external"
    folder.mkdir()
    onnx.save_model(
        proto,
        str(folder / "model.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=1024,  # as exporters do: small constants stay inline
    )
    assert (folder / "weights.bin").stat().st_size > 40_000_000
    assert (folder / "model.onnx").stat().st_size < 1_000_000
    report = compare_torch_onnx(model, inputs, onnx=folder / "model.onnx")
    assert report.drift_origin is None and report.summary["layers_compared"] == 48


def test_a_model_that_runs_differently_each_time_is_named(tmp_path):
    """Layers are listed in one forward pass and streamed in a second: a model whose leaf calls
    change between passes gets a clear error, not a wrong comparison."""
    torch = pytest.importorskip("torch")
    from layerdiff import InputError
    from layerdiff.torch import export_onnx

    class Flaky(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.act, self.calls = torch.nn.Linear(4, 4), torch.nn.ReLU(), 0

        def forward(self, x):
            self.calls += 1
            x = self.fc(x)
            return self.act(x) if self.calls % 2 else x

    torch.manual_seed(0)
    model, inputs = Flaky().eval(), (torch.randn(2, 4),)
    path = export_onnx(model, inputs, tmp_path / "flaky.onnx")
    model.calls = 0
    with pytest.raises(InputError, match="does not run the same way twice"):
        compare_torch_onnx(model, inputs, onnx=path)


def test_the_zoo_lists_real_architectures_with_their_size():
    result = run_cli("zoo")
    assert result.returncode == 0, result.stderr
    for name in ("resnet50", "efficientnet_b0", "convnext_tiny", "vit_b_16", "bert", "gpt2"):
        assert name in result.stdout
    assert "grouped-query attention" in result.stdout  # llama
    assert "encoder-decoder" in result.stdout  # t5
    assert "86.6M" in result.stdout  # vit_b_16, counted without allocating it
    # the Keras built-ins too, listed without importing TensorFlow
    for name in ("keras_cnn", "keras_encoder", "keras_mobilenet_v2"):
        assert name in result.stdout
    assert "--torch twin" in result.stdout


def test_a_model_registered_as_the_zoo_says_is_listed_and_runs(tmp_path):
    """A plugin author follows `layerdiff zoo`'s own words: the entry-point group it names is
    the one read, so the model is listed and runs by its name."""
    import re

    group = re.search(r"register one under the `([\w.]+)` entry-point group", run_cli("zoo").stdout)
    assert group, run_cli("zoo").stdout
    (tmp_path / "tinyplug.py").write_text(
        "import torch\n"
        "def build():\n"
        "    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()\n"
        "    return model, (torch.randn(2, 8),)\n"
    )
    info = tmp_path / "tinyplug-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tinyplug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{group.group(1)}]\ntiny_mlp = tinyplug:build\n")
    env = {"PYTHONPATH": str(tmp_path)}
    zoo = run_cli("zoo", env=env)
    row = next(line for line in zoo.stdout.splitlines() if line.startswith("tiny_mlp "))
    assert row.split() == ["tiny_mlp", "plugin", "tinyplug:build"], row
    run = run_cli("torch", "tiny_mlp", env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("tiny_mlp: no drift"), run.stdout


def test_a_given_onnx_file_is_named_on_the_target_line(resnet18_onnx, tmp_path):
    given = run_cli("torch", "resnet18", "--onnx", str(resnet18_onnx["dynamo"]), "--quiet",
                    "--json", str(tmp_path / "given.json"))  # fmt: skip
    assert given.returncode == 0, given.stderr
    detail = json.loads((tmp_path / "given.json").read_text())["target"]["detail"]
    assert detail.startswith(f"{resnet18_onnx['dynamo']} · onnxruntime "), detail


def test_a_report_prints_as_the_command_prints_it(resnet18, resnet18_onnx):
    model, inputs, _ = resnet18
    report = compare_torch_onnx(model, inputs, onnx=resnet18_onnx["dynamo"])
    assert str(report) == report.summary_text().rstrip("\n")
    assert str(report).startswith("ResNet: no drift"), str(report)
    assert repr(report).startswith("<layerdiff.Report ")


def test_a_zoo_encoder_decoder_runs_through_both_exporters_without_false_drift(tmp_path):
    for exporter in ("dynamo", "legacy"):
        out = tmp_path / exporter
        result = run_cli("torch", "t5", "--exporter", exporter, "--out", str(out), "--quiet")
        assert result.returncode == 0, result.stderr
        summary = json.loads((out / "report.json").read_text())["summary"]
        assert summary["drift_origin"] is None
        assert summary["layers_compared"] >= 100


def test_the_runtime_runs_the_whole_graph_before_the_layers_are_captured(resnet18, tmp_path):
    """Memory: a target that runs the whole graph runs it first, so the runtime's copy of the
    model is gone before PyTorch's layers (and their float64 values) are held, which are then
    compared in stretches as they come; in segments, each segment runs once PyTorch has produced
    its layers. The numbers are the same either way, and a whole run still says it was one."""
    model, inputs, _ = resnet18
    order = {}
    reports = {}
    for budget in (None, "64M"):
        report = compare_torch_onnx(model, inputs, max_memory=budget, timings=True)
        phases = [t["phase"] for t in report.data["timings"]]
        order[budget] = phases.index("target run") < phases.index("capturing PyTorch layers")
        reports[budget] = [(x["name"], x["accumulated"], x["local"]) for x in report.layers]
        split = [n for n in report.notes if "segments" in n]
        assert bool(split) == (budget is not None), report.notes
    assert order == {None: True, "64M": False}
    assert reports[None] == reports["64M"]
