"""`--bisect`: what turns a difference on, found by halves and checked by a run."""

from __future__ import annotations

import json
from pathlib import Path

from builders.graphs import growing_convs
from conftest import run_cli


def test_the_optimizer_behind_opt_all_drift_is_named_and_disabling_it_is_checked(tmp_path):
    model = growing_convs(tmp_path / "convs.onnx")
    report = tmp_path / "r.json"
    done = run_cli("onnx", str(model), "--reference", "ort", "--target", "ort:opt=all",
                   "--bisect", "--json", str(report))  # fmt: skip
    assert done.returncode == 0, done.stderr  # rounding drift only
    found = json.loads(report.read_text())["bisection"]
    assert found["found"] and found["responsible"] == ["NchwcTransformer"]
    assert found["check"]["exceeding_before"] > 0 and found["check"]["exceeding_after"] == 0
    assert found["spelling"] == "ort:opt=all:without=NchwcTransformer"
    assert found["runs"] <= 1 + 2 * 6, found["runs"]  # by halves, not one optimizer at a time
    assert "bisected: turned on by 1 of" in done.stdout and "`NchwcTransformer`" in done.stdout

    # The spelling it prints is a target a user can run: clean.
    again = run_cli("onnx", str(model), "--target", found["spelling"], "--json",
                    str(tmp_path / "again.json"))  # fmt: skip
    assert again.returncode == 0, again.stderr
    summary = json.loads((tmp_path / "again.json").read_text())["summary"]
    assert summary["layers_exceeding"] == 0
    assert "without NchwcTransformer" in again.stdout


def test_drift_the_optimizers_do_not_cause_is_not_blamed_on_them(tmp_path):
    """Against tract, ONNX Runtime's own kernels drift with every optimizer disabled: no
    optimizer is named, and the run that shows it is in the report."""
    model = growing_convs(tmp_path / "convs.onnx", gain=4.0)
    report = tmp_path / "r.json"
    run_cli("onnx", str(model), "--reference", "tract", "--target", "ort:opt=all", "--bisect",
            "--json", str(report))  # fmt: skip
    found = json.loads(report.read_text())["bisection"]
    assert not found["found"] and found["responsible"] == [] and found["runs"] == 1
    assert found["check"]["exceeding_after"] > 0

    done = run_cli("onnx", str(model), "--reference", "ort", "--target", "tract", "--bisect")
    assert "--bisect: nothing to bisect, the target (`tract`) does not optimize" in done.stderr


def test_nothing_to_bisect_names_the_target_a_vs_run_compares_on(tmp_path):
    """Against another file (`--vs`) the target is ONNX Runtime on the CPU, not tract: the
    note names the runtime the run compared on."""
    a = growing_convs(tmp_path / "a.onnx", layers=3)
    b = growing_convs(tmp_path / "b.onnx", layers=3, gain=3.3)
    done = run_cli("onnx", str(a), "--vs", str(b), "--bisect")
    assert done.returncode == 1, done.stderr  # the weights differ
    assert "--bisect: nothing to bisect, the target (`ort`) does not optimize" in done.stderr


def test_a_clean_run_has_nothing_to_bisect(tmp_path):
    model = growing_convs(tmp_path / "convs.onnx", layers=2)
    done = run_cli("onnx", str(model), "--target", "ort:opt=all", "--bisect")
    assert done.returncode == 0, done.stderr
    assert "--bisect: nothing to bisect, no layer exceeds its tolerance" in done.stderr


def test_layers_given_to_keep_in_float32_are_not_bisected_again_and_it_says_so():
    """With --keep-fp32 the layers kept are the user's: the search would replace them, so
    there is none, and the note survives the run again with them kept."""
    done = run_cli("torch", "resnet18", "--target", "torch:fp16", "--keep-fp32", "fc", "--bisect")
    assert done.returncode == 0, done.stderr
    assert "--bisect: nothing to bisect: the layers kept in float32 are given" in done.stderr
    assert "checked: keeping 1 layer(s) in float32" in done.stdout


def test_disabling_optimizers_needs_a_level_that_runs_them(tmp_path):
    model = growing_convs(tmp_path / "convs.onnx", layers=1)
    done = run_cli("onnx", str(model), "--target", "ort:without=NchwcTransformer")
    assert done.returncode == 2
    assert "`without=` disables ONNX Runtime graph optimizers, which run only at" in done.stderr


BUILDERS = Path(__file__).parent / "builders"


def test_an_inductor_only_fault_is_named_down_to_its_lowering(tmp_path):
    """tests/builders/wrong_lowering.py patches Inductor's sigmoid lowering: eager is right,
    compiled is off at the Sigmoid; PyTorch's bisector, driven on that module alone, names
    Inductor's lowerings at sigmoid, and the stage before Inductor is checked to agree."""
    report = tmp_path / "r.json"
    done = run_cli("torch", f"{BUILDERS / 'wrong_lowering.py'}:build", "--target",
                   "torch:compile", "--bisect", "--json", str(report))  # fmt: skip
    assert done.returncode == 1, done.stderr
    data = json.loads(report.read_text())
    assert data["summary"]["defects"][0]["layer"] == "3"
    found = data["bisection"]
    assert found["action"] == "first shown by" and found["found"]
    assert found["responsible"][0] == "inductor"
    assert found["responsible"][1].startswith("lowerings (bisect number")
    assert found["responsible"][1].endswith(": sigmoid)")
    assert "bisected: first shown by `inductor`, `lowerings" in done.stdout


def test_the_smallest_keep_in_float32_set_is_found_and_checked(tmp_path):
    """float16 overflows in `up` and the norm after it (tests/builders/overflow.py): keeping
    exactly those two brings the output within its tolerance, checked by the whole comparison
    run again with them kept; the advice is that set."""
    report = tmp_path / "r.json"
    done = run_cli("torch", f"{BUILDERS / 'overflow.py'}:build", "--target", "torch:fp16",
                   "--bisect", "--json", str(report))  # fmt: skip
    assert done.returncode == 1, done.stderr
    data = json.loads(report.read_text())
    found = data["bisection"]
    assert found["found"] and found["responsible"] == ["up", "norm"]
    assert found["candidates"] == 6 and found["runs"] < 2**6
    assert [k["layer"] for k in data["keep_float32"]["layers"]] == ["up", "norm"]
    check = data["keep_float32"]["check"]
    assert check["kept"] == ["up", "norm"] and check["output_nonfinite_after"] == 0
    assert "keeping `up`, `norm` in float32 (2 of 6 layers" in done.stdout


def test_a_defect_is_not_hidden_by_the_keep_in_float32_search(tmp_path):
    """The wrong half-precision block (tests/builders/wrong_bf16.py) is a defect: it is no
    candidate, so no set of the others brings the output within tolerance, and it says so."""
    report = tmp_path / "r.json"
    run_cli("torch", f"{BUILDERS / 'wrong_bf16.py'}:build", "--target", "torch:bf16",
            "--bisect", "--json", str(report))  # fmt: skip
    found = json.loads(report.read_text())["bisection"]
    assert not found["found"] and found["responsible"] == []
    assert "those with a defect left out (1)" in found["over"]


def test_the_keep_in_float32_set_of_a_t5_that_overflows_float16_is_found_and_checked(tmp_path):
    """tests/builders/t5_overflow.py: the feed-forward of one T5 block overflows float16 and the
    residual stream carries the overflow on. A layer kept in float32 hands its float32 value on
    through the blocks that only route it (cast down only where a module computes), so a set
    of kept layers brings the output within its tolerance, checked by the comparison run
    again."""
    report = tmp_path / "r.json"
    done = run_cli("torch", f"{BUILDERS / 't5_overflow.py'}:build", "--target", "torch:fp16",
                   "--bisect", "--tolerance", "1e-2", "--json", str(report))  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    assert "could not run" not in done.stderr  # float32 values meet float16 ones and promote
    data = json.loads(report.read_text())
    found = data["bisection"]
    assert found["found"], found
    # the overflowing layer and what carries its value on to the encoder's last norm; nothing
    # of the decoder, which only reads the normed encoder output
    assert found["responsible"][0] == "m.encoder.block.1.layer.1.DenseReluDense.wo", found
    assert found["responsible"][-1] == "m.encoder.final_layer_norm", found
    assert len(found["responsible"]) < 20
    check = data["keep_float32"]["check"]
    assert check["output_nonfinite_after"] == 0, check
    assert found["check"]["exceeding_after"] < found["check"]["exceeding_before"] / 4
