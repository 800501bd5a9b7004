"""Bounded memory: with `--max-memory`, `layerdiff onnx` runs the graph in segments, holding only
the values still needed, and reports exactly what a run of the whole graph at once reports: the
same bytes of JSON, the same origin, the same cause."""

from __future__ import annotations

import json
import re

import faults
import numpy as np
from conftest import run_cli

# A few nodes per segment on the small decoder (whose values take about 2 MB in all).
SMALL = "768K"


def both_ways(tmp_path, model, *args, random=False, verb="onnx", budget=SMALL):
    """The report of a whole run and of a segmented one, which must be byte-identical (for a
    model with unseeded random ops: the same exceeding layers with the same causes)."""
    runs = []
    for extra in ([], ["--max-memory", budget]):
        out = tmp_path / f"{verb}{len(runs)}.json"
        result = run_cli(verb, str(model), *args, *extra, "--json", str(out))
        assert result.returncode in (0, 1), result.stderr
        runs.append((result, out.read_bytes()))
    (whole, whole_json), (parts, parts_json) = runs
    assert "segments" not in whole.stderr
    found = re.search(r"ran in (\d+) segments to hold at most about", parts.stderr)
    assert found and int(found.group(1)) >= 3, parts.stderr
    if random:
        verdicts = lambda r: [(x["name"], x["exceeds_tol"], x["cause"]) for x in r["layers"]]  # noqa: E731
        assert verdicts(json.loads(parts_json)) == verdicts(json.loads(whole_json))
    else:
        assert parts_json == whole_json
        assert parts.stdout == whole.stdout
    return whole, json.loads(whole_json)


def test_a_segmented_run_reports_the_same_numbers_as_a_whole_run(decoder_onnx, tmp_path):
    """ONNX Runtime against tract: small, real differences at every layer, value for value."""
    _, report = both_ways(tmp_path, decoder_onnx)
    s = report["summary"]
    assert s["layers_compared"] == s["layers_total"] > 50
    assert s["worst"]["max_abs_diff"]["value"] > 0
    assert all(x["local"] for x in report["layers"]), "every layer re-run, across segments too"


def test_a_weight_fault_is_found_at_its_layer_in_segments(decoder_onnx, tmp_path):
    edited = faults.perturb_weight(decoder_onnx, tmp_path / "w.onnx", "val_80", 0.05)
    result, report = both_ways(tmp_path, decoder_onnx, "--vs", str(edited))
    origin = next(x for x in report["layers"] if x["name"] == "val_80")
    assert report["summary"]["drift_origin"] == "val_80"
    assert origin["cause"] == "weight_mismatch" and "`val_79` differs" in origin["detail"]
    later = [x for x in report["layers"][origin["index"] + 1 :] if x["exceeds_tol"]]
    assert later and all(x["cause"] == "inherited" for x in later if not x["local_exceeds"])
    assert result.returncode == 1


def test_nondeterminism_is_checked_within_a_segment(encoder_onnx, tmp_path):
    edited = faults.add_noise(encoder_onnx, tmp_path / "noise.onnx", "layer_norm_1", 1e-2)
    _, report = both_ways(tmp_path, encoder_onnx, "--vs", str(edited), random=True)
    assert report["summary"]["drift_origin"] == "layer_norm_1"
    origin = next(x for x in report["layers"] if x["name"] == "layer_norm_1")
    assert origin["cause"] == "nondeterminism"


def test_an_origin_traced_back_across_segments(resnet18_onnx, tmp_path):
    """The amplification case of test_causes: the origin lies segments before the first
    exceeding layer, whose values are long gone when the origin is decided."""
    src = resnet18_onnx["dynamo"]
    graph = __import__("onnx").load(str(src)).graph
    convs = [n.output[0] for n in graph.node if n.op_type == "Conv"]
    first, gain = convs[0], convs[1]
    reference = faults.scale_weight(src, tmp_path / "r.onnx", gain, 30.0)
    target = faults.perturb_weight(reference, tmp_path / "t.onnx", first, 2e-6)
    runs = []
    for extra in ([], ["--max-memory", "20M"]):
        out = tmp_path / f"amp{len(runs)}.json"
        result = run_cli("onnx", str(reference), "--vs", str(target), *extra, "--json", str(out))
        assert result.returncode == 1, result.stderr
        runs.append(out.read_bytes())
    assert "segments" in result.stderr
    assert runs[0] == runs[1]
    report = json.loads(runs[0])
    assert report["summary"]["drift_origin"] == first
    assert report["summary"]["first_exceeding"] == gain


def test_expected_values_as_the_reference_in_segments(decoder_onnx, tmp_path):
    """A file of expected values hands over only what it holds; the target still runs in
    segments and is compared value by value."""
    import onnx
    import onnxruntime

    model = onnx.load(str(decoder_onnx))
    wanted = ["layer_norm", "softmax", "add_2", "gelu_1", "linear_8"]
    declared = {v.name: v for v in model.graph.value_info}
    model.graph.output.extend(declared[n] for n in wanted if n in declared)
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    ids = np.random.default_rng(0).integers(0, 256, (1, 32), dtype=np.int64)
    values = dict(zip(wanted, session.run(wanted, {"ids": ids}), strict=True))
    values["softmax"] = values["softmax"] + np.float32(0.5)  # one wrong expected value
    np.savez(tmp_path / "expected.npz", **values)
    np.savez(tmp_path / "in.npz", ids=ids)
    common = ["--reference", f"expected:{tmp_path / 'expected.npz'}", "--target", "ort"]
    # facing values handed over, a segment's budget holds the weights its runtime loads too
    inputs = ("--inputs", str(tmp_path / "in.npz"))
    _, report = both_ways(tmp_path, decoder_onnx, *common, *inputs, budget="1M")
    assert [x["name"] for x in report["layers"]] == wanted
    assert report["summary"]["drift_origin"] == "softmax"


# --------------------------------------------------------------------------------------------
# The PyTorch side: layers stream from the forward hooks into a segmented ONNX run.

DECODER = "tests/builders/decoder.py:build"


def torch_both_ways(tmp_path, onnx_file):
    """`layerdiff torch` on the small decoder against `onnx_file`, whole and in segments."""
    return both_ways(tmp_path, DECODER, "--onnx", str(onnx_file), verb="torch")


def test_the_torch_side_streams_into_segments_with_the_same_numbers(decoder_onnx, tmp_path):
    """Every layer compared, re-run on PyTorch's inputs and measured against the float64 run,
    segment by segment as the hooks fire, exactly as in one piece."""
    _, report = torch_both_ways(tmp_path, decoder_onnx)
    compared = [x for x in report["layers"] if x["status"] == "compared"]
    # 17 module calls and 13 functional calls between them; `wpe` has no node of its own
    assert len(compared) == len(report["layers"]) - 1 == 30
    assert all(x["float64"] for x in compared), "the float64 run streams in lockstep"
    assert all(x["local"] for x in compared), "every layer re-run, across segments too"


def test_a_weight_fault_is_found_from_pytorch_in_segments(decoder_onnx, tmp_path):
    """The origin, its cause from PyTorch's own parameter, and the inherited layers after it."""
    fc = "blocks.1.fc"
    clean = tmp_path / "clean.json"
    run_cli("torch", DECODER, "--onnx", str(decoder_onnx), "--json", str(clean), "-q")
    value = next(x for x in json.loads(clean.read_text())["layers"] if x["name"] == fc)
    value = value["location"]["value"]
    edited = faults.perturb_weight(decoder_onnx, tmp_path / "fc.onnx", value, 0.05)
    result, report = torch_both_ways(tmp_path, edited)
    origin = next(x for x in report["layers"] if x["name"] == fc)
    assert report["summary"]["drift_origin"] == fc
    assert origin["cause"] == "weight_mismatch" and "differs" in origin["detail"]
    later = [x for x in report["layers"][origin["index"] + 1 :] if x["exceeds_tol"]]
    assert later and all(x["cause"] == "inherited" for x in later if not x["local_exceeds"])
    assert result.returncode == 1


def test_a_model_with_its_weights_beside_it_is_exported_cut_and_compared(tmp_path):
    """Models past ONNX's 2 GB keep their weights in a file beside the model: such an export (a
    small decoder forced to it) is compared from PyTorch, whole and in segments, with the same
    numbers as the export with its weights inline; and against that export, layer by layer."""
    import torch
    from builders import decoder
    from layerdiff.torch import export_onnx

    torch.manual_seed(0)
    model, inputs = decoder.build()
    outside = export_onnx(
        model.eval(), inputs, tmp_path / "outside" / "model.onnx", external_data=True
    )
    weights = outside.parent / "model.onnx.data"
    assert weights.stat().st_size > 5 * outside.stat().st_size, "the weights are beside it"
    inline = export_onnx(model, inputs, tmp_path / "inline" / "model.onnx", external_data=False)
    assert not (inline.parent / "model.onnx.data").exists()

    _, beside = torch_both_ways(tmp_path, outside)
    _, within = torch_both_ways(tmp_path, inline)
    numbers = lambda r: [(x["name"], x["accumulated"], x["local"]) for x in r["layers"]]  # noqa: E731
    assert numbers(beside) == numbers(within)
    assert beside["summary"]["verdict"] == "no_drift"

    _, report = both_ways(tmp_path, outside, "--vs", str(inline))
    assert report["summary"]["layers_compared"] > 50
    assert report["summary"]["worst"]["max_abs_diff"]["value"] == 0, "the very same computation"


def test_float16_on_the_cpu_provider_in_segments_says_it_may_round_otherwise(tmp_path):
    """ONNX Runtime's CPU provider computes float16 nodes it has no float16 kernel for in
    float32, with casts it places for each graph it is given: a segment may round a value
    differently from the whole run (ViT-B/16 in float16 did), so such a run says so."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, weights, last = [], [], "x"
    for i in range(6):
        w = f"w{i}"
        weights.append(numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float16), w))
        nodes.append(helper.make_node("MatMul", [last, w], [f"m{i}"]))
        nodes.append(helper.make_node("Erf", [f"m{i}"], [f"y{i}" if i < 5 else "y"]))
        last = f"y{i}"
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [4, 16])],
        weights,
    )
    path = tmp_path / "half.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    onnx.save(model, str(path))
    out = tmp_path / "r.json"
    result = run_cli("onnx", str(path), "--target", "ort", "--max-memory", "4K", "--json", str(out))
    assert result.returncode in (0, 1), result.stderr
    warnings = json.loads(out.read_text())["summary"]["warnings"]
    assert any("CPUExecutionProvider on float16 values" in w for w in warnings), warnings
    whole = run_cli("onnx", str(path), "--target", "ort", "--json", str(out))
    assert "on float16 values" not in whole.stdout, "a whole run owes nothing"
