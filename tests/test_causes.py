"""Each cause, injected at a known layer of a real model, is found at exactly that layer with
exactly that cause; later layers that only carry the error are `inherited`."""

from __future__ import annotations

import json

import faults
import pytest
from conftest import ROOT, run_cli

TOL = 1e-4


def onnx_report(tmp_path, reference, target=None, *extra):
    out = tmp_path / "report.json"
    vs = ["--vs", str(target)] if target else []
    result = run_cli("onnx", str(reference), *vs, *extra, "--json", str(out))
    assert result.returncode in (0, 1), result.stderr
    return result, json.loads(out.read_text())


def layer(report, name):
    return next(x for x in report["layers"] if x["name"] == name)


def conv_output(path, k):
    import onnx

    return [n.output[0] for n in onnx.load(str(path)).graph.node if n.op_type == "Conv"][k]


def assert_born_at(report, value, cause):
    """`value` is the origin with `cause`; nothing before it exceeds, locally or accumulated;
    every later exceeding layer with its own error in tolerance is `inherited`, mostly from
    `value`."""
    s = report["summary"]
    assert s["drift_origin"] == value, [
        (x["name"], x["cause"]) for x in report["layers"] if x["cause"]
    ]
    names = [x["name"] for x in report["layers"]]
    before = report["layers"][: names.index(value)]
    assert not any(x["exceeds_tol"] or x["local_exceeds"] for x in before)
    origin = layer(report, value)
    assert origin["cause"] == cause, origin["detail"]
    # Later layers that only inherit name where their error mostly comes from: the origin, or
    # a layer after it that added most of its own difference itself (rounding in every layer
    # of a reduced-precision target), which then has a cause of its own.
    sources = {value}
    for later in report["layers"][names.index(value) + 1 :]:
        if later["exceeds_tol"] and later["local"] and not later["local_exceeds"]:
            source = later["error_from"]
            assert source in sources, (later["name"], source, sources)
            assert f"mostly from `{source}`" in later["detail"], later["detail"]
        if later["cause"] not in (None, "inherited"):
            sources.add(later["name"])
    return origin


def test_a_changed_weight_is_weight_mismatch_and_what_follows_is_inherited(resnet18_onnx, tmp_path):
    src = resnet18_onnx["dynamo"]
    value = conv_output(src, 9)
    edited = faults.perturb_weight(src, tmp_path / "w.onnx", value, 0.05)
    result, report = onnx_report(tmp_path, src, edited)
    origin = assert_born_at(report, value, "weight_mismatch")
    weight = faults.producer(__import__("onnx").load(str(src)).graph, value).input[1]
    assert f"`{weight}` differs" in origin["detail"]
    inherited = [x for x in report["layers"] if x["cause"] == "inherited"]
    assert len(inherited) >= 10, "the fault propagates through the rest of the network"
    assert f"1 defect: `{value}` weight_mismatch" in result.stdout.splitlines()[0]
    assert f"defect at `{value}`: weight_mismatch" in result.stdout


def test_a_changed_epsilon_is_the_file_naming_the_attribute(encoder_onnx, tmp_path):
    """ONNX Runtime computes the edited LayerNorm as the file says: the file differs, not the
    runtime."""
    edited = faults.set_attribute(encoder_onnx, tmp_path / "eps.onnx", "layer_norm", "epsilon", 0.1)
    _, report = onnx_report(tmp_path, encoder_onnx, edited)
    origin = assert_born_at(report, "layer_norm", "file_differs")
    assert "`epsilon` 1e-5 → 0.1 on `node_layer_norm`" in origin["detail"]
    assert "the target computes what its file says" in origin["detail"]
    assert origin["as_written"]["multiple"] <= 1.0


def test_a_layer_run_in_float16_is_precision_loss(resnet18_onnx, tmp_path):
    src = resnet18_onnx["dynamo"]
    value = conv_output(src, 4)
    edited = faults.in_float16(src, tmp_path / "fp16.onnx", value)
    _, report = onnx_report(tmp_path, src, edited)
    origin = assert_born_at(report, value, "precision_loss")
    assert "float16" in origin["detail"]
    assert origin["local_exceeds"], "the layer's own error, not an inherited one"


def test_a_node_that_disagrees_with_itself_is_nondeterminism(encoder_onnx, tmp_path):
    edited = faults.add_noise(encoder_onnx, tmp_path / "noise.onnx", "layer_norm_1", 1e-2)
    _, report = onnx_report(tmp_path, encoder_onnx, edited)
    origin = assert_born_at(report, "layer_norm_1", "nondeterminism")
    assert "the target run twice disagrees with itself" in origin["detail"]


def test_a_kernel_difference_between_runtimes_is_held_to_float32_rounding(resnet18_onnx, tmp_path):
    """One file, ONNX Runtime against tract: their Conv kernels round differently, which a
    tolerance tighter than float32 accumulation shows at the very first Conv. There it is what
    an honest float32 Conv errs by on the same inputs: rounding. (Deeper Convs, K = 4608, tract
    adds one term after another and errs up to about 2× that: see docs/metrics.md.)"""
    src = resnet18_onnx["dynamo"]
    result, report = onnx_report(tmp_path, src, None, "--tolerance", "2e-7")
    first = conv_output(src, 0)
    origin = layer(report, first)
    assert origin["exceeds_tol"] and origin["cause"] == "rounding", origin["detail"]
    assert origin["baseline"]["multiple"] <= 1
    assert "honest float32 kernel" in origin["detail"], origin["detail"]
    for defect in report["summary"]["defects"]:
        assert defect["cause"] == "op_implementation" and defect["multiple"] < 3, defect


def test_an_amplified_upstream_difference_is_born_upstream(resnet18_onnx, tmp_path):
    """A weight difference too small to exceed at its own layer is amplified by a later layer
    (whose weights are scaled up on both sides): the later layer exceeds first, but only
    inherits; the origin is the upstream layer."""
    src = resnet18_onnx["dynamo"]
    first, gain = conv_output(src, 0), conv_output(src, 1)
    reference = faults.scale_weight(src, tmp_path / "r.onnx", gain, 30.0)
    target = faults.perturb_weight(reference, tmp_path / "t.onnx", first, 2e-6)
    result, report = onnx_report(tmp_path, reference, target)
    upstream = layer(report, first)
    assert not upstream["exceeds_tol"] and upstream["accumulated"]["max_abs_diff"] > 0
    s = report["summary"]
    assert s["first_exceeding"] == gain and s["drift_origin"] == first
    assert layer(report, gain)["cause"] == "inherited"
    assert upstream["cause"] == "weight_mismatch"
    assert f"amplified downstream until `{gain}` exceeds it" in upstream["detail"]
    assert f"1 defect: `{first}` weight_mismatch" in result.stdout.splitlines()[0]


def test_clean_exports_raise_no_cause(resnet18_onnx, encoder_onnx, tmp_path):
    for src in (resnet18_onnx["dynamo"], resnet18_onnx["legacy"], encoder_onnx):
        result, report = onnx_report(tmp_path, src)
        assert result.returncode == 0, result.stdout
        assert not any(x["cause"] for x in report["layers"])
        assert report["mode"] == "local"
        assert all(x["local"] for x in report["layers"] if x["status"] == "compared")


# -- the same faults seen from PyTorch (`layerdiff torch --onnx`) --------------------------------


def torch_report(resnet18, onnx_path, **options):
    from layerdiff.torch import compare_torch_onnx

    model, inputs, _ = resnet18
    return compare_torch_onnx(model, inputs, onnx=onnx_path, **options)


def test_torch_flow_names_each_cause_at_its_layer(resnet18, resnet18_onnx, tmp_path):
    src = resnet18_onnx["dynamo"]
    clean = torch_report(resnet18, src)
    assert clean.drift_origin is None and not any(x["cause"] for x in clean.layers)
    value_of = {x["name"]: x["location"]["value"] for x in clean.layers if x["location"]}

    # A folded Conv+BatchNorm weight edited in the file: PyTorch's folded weight differs.
    edited = faults.perturb_weight(src, tmp_path / "w.onnx", value_of["layer2.0.bn1"], 0.05)
    report = torch_report(resnet18, edited)
    origin = report.layer("layer2.0.bn1")
    assert (report.drift_origin, origin["cause"]) == ("layer2.0.bn1", "weight_mismatch")
    assert "`layer2.0.conv1.weight` differs" in origin["detail"]
    later = [x for x in report.layers if x["exceeds_tol"] and x["name"] != "layer2.0.bn1"]
    assert later and all(x["cause"] == "inherited" for x in later)

    # Fresh noise on every run after one ReLU.
    edited = faults.add_noise(src, tmp_path / "n.onnx", value_of["layer3.1.relu"], 1e-2)
    report = torch_report(resnet18, edited)
    origin = report.layer("layer3.1.relu")
    assert (report.drift_origin, origin["cause"]) == ("layer3.1.relu", "nondeterminism")

    # One fused Conv computed in float16.
    edited = faults.in_float16(src, tmp_path / "h.onnx", value_of["layer3.0.bn2"])
    report = torch_report(resnet18, edited)
    origin = report.layer("layer3.0.bn2")
    assert (report.drift_origin, origin["cause"]) == ("layer3.0.bn2", "precision_loss")

    # Same weights, a different computation: Gemm's alpha. ONNX Runtime computes what the
    # file says: the file differs from the model (named against a fresh export), not the
    # runtime.
    edited = faults.set_attribute(src, tmp_path / "a.onnx", value_of["fc"], "alpha", 1.01)
    report = torch_report(resnet18, edited)
    origin = report.layer("fc")
    assert (report.drift_origin, origin["cause"]) == ("fc", "file_differs"), origin["detail"]
    assert "`alpha` 1 → 1.01 on" in origin["detail"]
    assert "the target computes what its file says" in origin["detail"]
    assert "the target is further from float64" in origin["detail"]
    assert origin["local_exceeds"] and not report.layer("avgpool")["exceeds_tol"]


def test_a_weight_the_optimizer_fuses_and_reorders_is_the_weight_from_pytorch(
    resnet18, resnet18_onnx, tmp_path
):
    """`torch --onnx FILE --target ort:opt=all`: ONNX Runtime fuses the legacy export's
    Conv(+BatchNorm) and ReLU into an NCHWc Conv reading a reordered, renamed copy of the
    weight, and neither the Conv's nor the BatchNorm's value survives. An edited weight there
    read "op_implementation ... report it to the runtime" at the ReLU: the file's own nodes of
    that layer read the weight, and it is the cause."""
    src = resnet18_onnx["legacy"]
    clean = torch_report(resnet18, src)
    value = clean.layer("layer2.0.bn1")["location"]["value"]
    edited = faults.perturb_weight(src, tmp_path / "w.onnx", value, 0.05)
    report = torch_report(resnet18, edited, target="ort:opt=all")
    defects = report.summary["defects"]
    assert [(d["layer"], d["cause"]) for d in defects] == [("layer2.0.relu", "weight_mismatch")]
    assert "`layer2.0.conv1.weight`" in defects[0]["detail"], defects[0]
    assert "/layer2/layer2.0/conv1/Conv" in defects[0]["fix"], defects[0]["fix"]
    assert "report it to the runtime" not in defects[0]["fix"]
    # the clean file at the same level reads no weight as different
    clean = torch_report(resnet18, src, target="ort:opt=all")
    assert clean.drift_origin is None and not any(x["cause"] for x in clean.layers)


def test_rounding_is_told_from_a_bug_by_the_float64_truth(tmp_path):
    """A deep MLP with growing activations: float32 rounding alone crosses its tolerance. The
    float64 run shows both sides equally far from the truth, so the cause is `rounding`, not a
    kernel bug; `--tolerance auto` then finds no drift."""

    builder = f"{ROOT / 'tests/builders/deep_mlp.py'}:build"
    result = run_cli("torch", builder, "--json", str(tmp_path / "fixed.json"))
    assert result.returncode == 0, result.stderr  # rounding alone does not fail the run
    assert "float32 rounding only: no layer computes differently" in result.stdout
    report = json.loads((tmp_path / "fixed.json").read_text())
    assert report["summary"]["verdict"] == "precision" and report["summary"]["defects"] == []
    origin = layer(report, report["summary"]["drift_origin"])
    assert origin["cause"] == "rounding", "not a kernel bug: an ideal float32 layer errs as much"
    assert all(x["float64"] for x in report["layers"])
    strict = run_cli("torch", builder, "--fail-on", "drift", "--quiet")
    assert strict.returncode == 1, strict.stderr

    result = run_cli("torch", builder, "--tolerance", "auto", "--json", str(tmp_path / "auto.json"))
    assert result.returncode == 0, result.stdout
    report = json.loads((tmp_path / "auto.json").read_text())
    assert report["tolerance"] == {"policy": "auto", "abs": None, "factor": 4.0}
    for x in report["layers"]:
        assert x["tolerance"]["atol"] >= 4 * x["float64"]["reference"]
        assert x["tolerance"]["rtol"] == 0.0


def test_tolerance_options_and_the_accumulated_only_mode(resnet18_onnx, tmp_path):
    src = str(resnet18_onnx["dynamo"])
    _, report = onnx_report(tmp_path, src, None, "--no-local", "--tolerance", "3e-5")
    assert report["mode"] == "accumulated" and report["tolerance"]["abs"] == 3e-5
    fixed = {"atol": 3e-5, "rtol": 0.0}
    assert all(x["local"] is None and x["tolerance"] == fixed for x in report["layers"])


@pytest.mark.parametrize(
    "model, tolerance",
    [
        # a clean built-in other than ResNet-18 in `make test`: the quick calibration's rows
        pytest.param("mobilenet_v3_small", "dtype", marks=pytest.mark.thorough),
        pytest.param("vit_b_16", "dtype", marks=pytest.mark.thorough),
        # `auto` on a model that drifts by rounding: the rounding test above, and test_tolerance.py
        pytest.param("resnet50", "auto", marks=pytest.mark.thorough),
    ],
)
def test_clean_builtin_exports_raise_no_false_alarm(model, tolerance, tmp_path):
    """ResNet-50 with random weights crosses its float32 tolerance by rounding alone (see the
    rounding test); held to `auto`, it is clean like the others."""
    out = tmp_path / "r.json"
    result = run_cli("torch", model, "--tolerance", tolerance, "--json", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert not any(x["cause"] or x["local_exceeds"] for x in report["layers"])


def test_a_whole_model_converted_to_float16_is_held_to_float16_tolerance(resnet18_onnx, tmp_path):
    """ONNX Runtime's own float16 converter (inputs and outputs kept float32): float16 values
    are held to float16's bound, and what still exceeds is precision loss or inherited from it."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    src = resnet18_onnx["dynamo"]
    half = tmp_path / "fp16.onnx"
    onnx.save(convert_float_to_float16(onnx.load(str(src)), keep_io_types=True), str(half))
    _, report = onnx_report(tmp_path, src, half)
    compared = [x for x in report["layers"] if x["status"] == "compared"]
    f16 = {"atol": 5e-4, "rtol": 1e-3}
    assert all(x["tolerance"] == f16 for x in compared if x["target_dtype"] == "float16")
    assert layer(report, report["summary"]["drift_origin"])["cause"] == "precision_loss"
    causes = {x["cause"] for x in compared if x["exceeds_tol"]}
    assert causes <= {"precision_loss", "rounding", "inherited"}, causes
    assert report["summary"]["defects"] == [] and report["summary"]["verdict"] == "precision"


def test_quantization_is_precision_loss_not_a_kernel_bug(tmp_path):
    """A model quantized by ONNX Runtime's static QDQ quantizer (uint8 activations, int8
    weights) against its float file: every exceeding layer was `op_implementation` ("Quantize…
    computes differently"). It is int8 precision, with the scale that sets it."""
    import numpy as np
    from builders.graphs import save_graph
    from onnx import helper
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static
    from test_onnx_command import report_of

    rng = np.random.default_rng(1)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["y"], name="relu2"),
    ]
    weights = {"w1": (8, 3, 3, 3), "w2": (8, 8, 3, 3)}
    save_graph(tmp_path / "float.onnx", nodes, (1, 3, 16, 16), (1, 8, 16, 16), weights, opset=17)

    class Samples(CalibrationDataReader):
        def __init__(self):
            self.left = [{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)}] * 4

        def get_next(self):
            return self.left.pop() if self.left else None

    quantize_static(
        str(tmp_path / "float.onnx"), str(tmp_path / "qdq.onnx"), Samples(),
        quant_format=QuantFormat.QDQ,
    )  # fmt: skip
    result, report = report_of(
        tmp_path, str(tmp_path / "float.onnx"), "--vs", str(tmp_path / "qdq.onnx")
    )
    explained = [x for x in report["layers"] if x["cause"] not in (None, "inherited")]
    assert explained, result.stdout
    # Which layers lose the most to their own quantization, most first.
    ranked = report["summary"]["most_own_error"]
    own = sorted((x["local"]["mean_abs_diff"], x["name"]) for x in report["layers"] if x["local"])[
        ::-1
    ]
    assert [r["layer"] for r in ranked] == [name for _, name in own][: len(ranked)]
    assert "most error of their own" in result.stdout
    for layer in explained:
        assert layer["cause"] == "precision_loss", (layer["name"], layer["detail"])
        assert "quantize" in layer["detail"] and "scale" in layer["detail"], layer["detail"]


EDITED = f"{ROOT}/tests/builders/edited_files.py:build"


def test_a_file_that_computes_differently_from_the_model_is_the_file_not_the_runtime(tmp_path):
    """ONNX Runtime computes exactly what an edited file says: the layer is beyond what
    float32 explains against the model, within it against the file's own nodes computed
    exactly. The file is named, never the runtime: the attribute or folded constant that
    differs from a fresh export of the model, with a fix that says so."""
    import onnx
    from onnx import numpy_helper

    out = tmp_path / "clean"
    clean = run_cli("torch", EDITED, "--out", str(out))
    assert clean.returncode == 0 and "no drift" in clean.stdout, clean.stdout + clean.stderr
    exported = out / "model.onnx"

    model = onnx.load(str(exported))
    gelu = next(n for n in model.graph.node if n.op_type == "Gelu")
    gelu_edit = faults.set_attribute(
        exported, tmp_path / "tanh.onnx", gelu.output[0], "approximate", "tanh"
    )
    run = run_cli("torch", EDITED, "--onnx", str(gelu_edit), "--json", str(tmp_path / "g.json"))
    assert run.returncode == 1, run.stdout + run.stderr
    report = json.loads((tmp_path / "g.json").read_text())
    act = layer(report, "act")
    assert (report["summary"]["drift_origin"], act["cause"]) == ("act", "file_differs"), act[
        "detail"
    ]
    assert f'`approximate` "none" → "tanh" on `{gelu.name}`' in act["detail"]
    assert act["as_written"]["multiple"] <= 1.0 < act["baseline"]["multiple"]
    (defect,) = report["summary"]["defects"]
    assert "the runtime computes the file as written" in defect["fix"]
    assert "report it to the runtime" not in defect["fix"]

    # The folded divisor (`2·std`, one constant in the file) scaled by 5% in one element.
    div = next(n for n in model.graph.node if n.op_type == "Div")
    folded = next(i for i in model.graph.initializer if i.name == div.input[1])
    values = numpy_helper.to_array(folded).copy()
    values[3] *= 1.05
    folded.CopyFrom(numpy_helper.from_array(values, folded.name))
    onnx.save(model, str(tmp_path / "folded.onnx"))
    run = run_cli(
        "torch", EDITED, "--onnx", str(tmp_path / "folded.onnx"), "--json", str(tmp_path / "f.json")
    )
    assert run.returncode == 1, run.stdout + run.stderr
    report = json.loads((tmp_path / "f.json").read_text())
    norm = layer(report, "norm")
    assert (report["summary"]["drift_origin"], norm["cause"]) == ("norm", "weight_mismatch"), norm[
        "detail"
    ]
    assert f"`{folded.name}` differs" in norm["detail"]
    assert "report it to the runtime" not in report["summary"]["defects"][0]["fix"]


def test_a_weight_that_differs_under_the_tolerance_is_still_reported(encoder_onnx, tmp_path):
    """One element of a bias moved by 5e-5, under float32's absolute tolerance: no layer
    exceeds, yet the files differ, so the run names the weight and fails."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(encoder_onnx))
    bias = next(i for i in model.graph.initializer if i.name.endswith("bias") and len(i.dims) == 1)
    values = numpy_helper.to_array(bias).copy()
    values[3] += 5e-5
    bias.CopyFrom(numpy_helper.from_array(values, bias.name))
    onnx.save(model, str(tmp_path / "tiny.onnx"))
    result, report = onnx_report(tmp_path, encoder_onnx, tmp_path / "tiny.onnx")
    assert result.returncode == 1, result.stdout
    assert not any(x["exceeds_tol"] for x in report["layers"])
    (defect,) = report["summary"]["defects"]
    assert defect["cause"] == "weight_mismatch", defect
    assert defect["detail"].startswith(f"`{bias.name}` differs: max abs diff 5.0"), defect
    assert "stays within the tolerance" in defect["detail"], defect["detail"]
    assert report["summary"]["verdict"] == "defect"


def test_a_second_edit_hidden_in_inherited_drift_is_found_at_its_layer(
    resnet18, resnet18_onnx, tmp_path
):
    """Two weights of a ResNet-18 export edited: a Conv's ×1.05, which takes every later layer
    past the tolerance, and a later Conv's ×1.00001, whose own error stays within the tolerance.
    The later layer exceeded only with what it inherits and read `inherited` at 12× what float32
    explains: now it is judged on its own error, the second defect."""
    import onnx
    from layerdiff.torch import compare_torch_onnx

    model, inputs, _ = resnet18
    src = resnet18_onnx["dynamo"]
    convs = [n.output[0] for n in onnx.load(str(src)).graph.node if n.op_type == "Conv"]
    first = faults.scale_weight(src, tmp_path / "a.onnx", convs[3], 1.05)
    both = faults.scale_weight(first, tmp_path / "ab.onnx", convs[12], 1.00001)
    report = compare_torch_onnx(model, inputs, onnx=both, seed=0)
    defects = [(d["layer"], d["cause"]) for d in report.summary["defects"]]
    assert [d[0] for d in defects] == ["layer1.1.bn1", "layer3.0.downsample.1"], defects
    second = report.layer("layer3.0.downsample.1")
    assert second["exceeds_tol"] and not second["local_exceeds"], second["local"]
    assert second["cause"] in ("weight_mismatch", "file_differs"), second["cause"]
    assert "reads `layer3.0.downsample.0.weight`" in second["detail"], second["detail"]
    assert "it exceeds with what it inherits (mostly from `layer1.1.bn1`)" in second["detail"]
