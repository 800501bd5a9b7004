"""A transformers checkpoint folder as the model: `layerdiff torch path/to/folder` and the Python
API load what `save_pretrained` wrote (Llama-, Qwen2- and GPT-2-style configs, random weights
stored in bfloat16) from local files, make its inputs from the config, and compare it with no
builder; a weight edited in its export is found at its layer; a folder that is no checkpoint
is refused by name."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
onnx = pytest.importorskip("onnx")

from builders.checkpoints import CHECKPOINTS  # noqa: E402
from faults import producer, scale_weight  # noqa: E402
from layerdiff import UsageError  # noqa: E402


# gpt2's checkpoint (its head tied to the embedding): test_streamed.py here, by path in test-all
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=[pytest.mark.thorough] * (n == "gpt2")) for n in CHECKPOINTS]
)
def test_a_checkpoint_folder_runs_by_path_against_its_export(checkpoint, name, tmp_path):
    out = tmp_path / "r.json"
    done = run_cli("torch", str(checkpoint(name)), "--json", str(out))
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    s = report["summary"]
    assert s["verdict"] == "no_drift" and s["layers_compared"] == s["layers_total"] > 30, s
    names = [layer["name"] for layer in report["layers"]]
    # the checkpoint's own module names, not a wrapper's
    assert "lm_head" in names and not any(n.startswith("model.model.") for n in names), names
    head = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "gpt2": "GPT2LMHeadModel"}
    said = f"{head[name]} from local files, its weights stored in bfloat16, loaded in float32"
    # how it was loaded is said beside the summary, with the run's other notes (stderr)
    assert said in done.stderr, done.stderr
    assert "its cache off (use_cache=False)" in done.stderr
    # GPT-2's positions end at 16: the prompt is no longer than they are
    tokens = 16 if name == "gpt2" else 32
    assert f"run on {tokens} token ids" in done.stderr


def test_the_python_api_takes_a_checkpoint_folder_and_runs_it_in_bfloat16(checkpoint):
    from layerdiff.torch import compare_torch, load_checkpoint

    report = compare_torch(checkpoint("qwen2"), target="torch:bf16")
    s = report.summary
    assert s["defects"] == [] and s["verdict"] in ("precision", "no_drift"), s
    assert report.notes[0].startswith(f"checkpoint `{checkpoint('qwen2')}`: Qwen2ForCausalLM")
    model, inputs = load_checkpoint(checkpoint("qwen2"), seed=3)
    assert [tuple(t.shape) for t in inputs] == [(1, 32)] * 3  # ids, mask, positions
    assert next(model.parameters()).dtype == torch.float32
    with pytest.raises(UsageError, match="is not a folder: a model is an nn.Module"):
        compare_torch(str(checkpoint("qwen2") / "missing"))
    again = load_checkpoint(checkpoint("qwen2"), seed=3)[1]
    assert all(torch.equal(a, b) for a, b in zip(inputs, again, strict=True)), "from the seed"


def test_a_weight_edited_in_the_export_is_the_defect_at_its_layer(checkpoint, tmp_path):
    from layerdiff.torch import export_onnx, load_checkpoint

    folder = checkpoint("llama")
    clean = export_onnx(*load_checkpoint(folder), tmp_path / "model.onnx")
    first = tmp_path / "clean.json"
    assert run_cli("torch", str(folder), "--onnx", str(clean), "--json", str(first)).returncode == 0
    down = next(
        layer for layer in json.loads(first.read_text())["layers"]
        if layer["name"] == "model.layers.1.mlp.down_proj"
    )  # fmt: skip
    value = down["location"]["value"]
    graph = onnx.load(str(clean)).graph
    assert producer(graph, value).op_type == "MatMul", "the weight is the node's second input"
    edited = scale_weight(clean, tmp_path / "edited.onnx", value, 1.05)
    out = tmp_path / "edited.json"
    done = run_cli("torch", str(folder), "--onnx", str(edited), "--json", str(out))
    assert done.returncode == 1, done.stderr
    s = json.loads(out.read_text())["summary"]
    assert s["drift_origin"] == "model.layers.1.mlp.down_proj", s
    assert [(d["layer"], d["cause"]) for d in s["defects"]] == [
        ("model.layers.1.mlp.down_proj", "weight_mismatch")
    ], s


def test_a_folder_that_is_no_checkpoint_is_refused_with_what_is_missing(checkpoint, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    done = run_cli("torch", str(empty))
    assert done.returncode == 2
    assert f"`{empty}` is a folder without a config.json" in done.stderr
    assert "Traceback" not in done.stderr

    weightless = tmp_path / "weightless"
    weightless.mkdir()
    (weightless / "config.json").write_text((checkpoint("gpt2") / "config.json").read_text())
    done = run_cli("torch", str(weightless))
    assert done.returncode == 2
    assert f"transformers cannot load the weights in `{weightless}`" in done.stderr

    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"model_type": "no-such-model"}))
    done = run_cli("grad", str(unknown), "--target", "torch:bf16")
    assert done.returncode == 2
    assert f"cannot read `{unknown}/config.json`" in done.stderr
    assert "Traceback" not in done.stderr
