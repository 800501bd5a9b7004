"""A checkpoint larger than the memory it may use, against another PyTorch side (issue 72, part
1): `layerdiff torch FOLDER --target torch:bf16` holds the reference, the target's copy and the
float64 truth one module at a time, each module's weights read from the safetensors files in the
side's dtype when the pass reaches it. The report is the one the whole model gives, a module kept
in float32 included; a fault in one target module is found there; nothing stays held; what cannot
be streamed (a compiled side, weights in a pickled file past the budget, `grad`) is refused with
what to do."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from layerdiff import UsageError  # noqa: E402

# Below the test checkpoint's 6.5 MB of float32 weights, room for its largest segment's values.
BUDGET = "4M"


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A Llama-style checkpoint stored in float32 (a module kept in float32 then has weights a
    bfloat16 copy would have rounded), 6.5 MB of it."""
    from builders import checkpoints

    return checkpoints.save("wide", tmp_path_factory.mktemp("wide32"), stored="float32")


def _data(report) -> dict:
    data = json.loads(json.dumps(report.data))
    data.pop("timings", None)
    return data


def _streamed(folder):
    from layerdiff.torch import load_checkpoint

    model, inputs = load_checkpoint(folder, streams=lambda size: True)
    assert all(p.device.type == "meta" for p in model.parameters()), "nothing read yet"
    return model, inputs


@pytest.mark.parametrize(
    ("name", "target", "keep"),
    [
        ("llama", "torch:bf16", ()),
        ("gpt2", "torch:fp16", ()),  # gpt2: its head tied to the embedding
        ("llama", "torch:amp-bf16", ()),
        ("wide", "torch:fp16", ("model.layers.0.mlp.down_proj", "lm_head")),
        # a head tied to the embedding, kept: one parameter on both, on every run of the copy
        ("gpt2", "torch:bf16", ("lm_head",)),
    ],
)
def test_a_checkpoint_held_one_module_at_a_time_against_a_lower_precision_reports_as_whole(
    checkpoint, wide, name, target, keep
):
    from layerdiff.torch import compare_torch

    folder = wide if name == "wide" else checkpoint(name)
    whole = compare_torch(folder, target=target, seed=0, keep_fp32=list(keep))
    model, inputs = _streamed(folder)
    streamed = compare_torch(model, inputs, target=target, seed=0, keep_fp32=list(keep))
    s = streamed.summary
    assert s["layers_compared"] == s["layers_total"] > 30
    assert s["verdict"] == "precision", s
    assert _data(streamed) == _data(whole)
    # nothing is held once the run is over, on any side
    assert all(p.device.type == "meta" for p in model.parameters())


@pytest.mark.parametrize("name", ["llama", "wide"])
def test_against_a_coarser_reference_a_streamed_checkpoint_reports_as_whole(checkpoint, wide, name):
    """A bfloat16 reference of a float16 target: the exact baseline reads the model's own
    weights (from the files, where it is held one module at a time), not the reference's."""
    from layerdiff.torch import compare_torch

    folder = wide if name == "wide" else checkpoint(name)
    sides = {"target": "torch:fp16", "reference": "torch:bf16", "seed": 0}
    whole = compare_torch(folder, **sides)
    model, inputs = _streamed(folder)
    streamed = compare_torch(model, inputs, **sides)
    assert streamed.summary["defects"] == [] and streamed.summary["verdict"] == "precision"
    assert _data(streamed) == _data(whole)
    assert all(p.device.type == "meta" for p in model.parameters())


def test_a_fault_in_one_target_module_of_a_streamed_checkpoint_is_found_there(
    wide, monkeypatch, tmp_path
):
    """One module of the target's copy computes 1% off: found at that layer as the target's own
    error, the same as on the model held whole; its repro holds the module's weights as the
    files store them."""
    from layerdiff.torch import compare_torch
    from layerdiff.torch._repro import write_repro
    from layerdiff.torch._sides import TorchSide
    from safetensors.torch import load_file

    prepare = TorchSide.prepare
    faulty_layer = "model.layers.1.mlp.up_proj"

    def faulty(self, model, inputs, whole=frozenset(), reads_outside=()):
        copied, given = prepare(self, model, inputs, whole, reads_outside)
        module = copied.get_submodule(faulty_layer)
        forward = module.forward
        module.forward = lambda x: forward(x) * 1.01
        return copied, given

    monkeypatch.setattr(TorchSide, "prepare", faulty)
    whole = compare_torch(wide, target="torch:bf16", seed=0)
    model, inputs = _streamed(wide)
    streamed = compare_torch(model, inputs, target="torch:bf16", seed=0)
    defects = [(d["layer"], d["cause"]) for d in streamed.summary["defects"]]
    assert defects[:1] == [(faulty_layer, "op_implementation")], streamed.summary
    assert _data(streamed) == _data(whole)
    monkeypatch.undo()
    sides = (TorchSide.of(_spelled("torch")), TorchSide.of(_spelled("torch:bf16")))
    write_repro(model, inputs, streamed, *sides, tmp_path / "repro", "test")
    state = load_file(tmp_path / "repro" / "state.safetensors")
    stored = load_file(wide / "model.safetensors")[f"{faulty_layer}.weight"]
    assert list(state) == ["weight"] and torch.equal(state["weight"], stored)
    # the module saved loads where layerdiff is not installed: no hook of ours comes with it
    assert b"layerdiff" not in (tmp_path / "repro" / "module.pt").read_bytes()


def _spelled(side: str):
    from layerdiff import _layerdiff

    return _layerdiff.Options(target=side).torch_target


def test_the_command_line_streams_a_checkpoint_past_the_budget_against_bfloat16(wide, tmp_path):
    reports = {}
    for budget in (BUDGET, "200M"):
        out = tmp_path / f"{budget}.json"
        done = run_cli("torch", str(wide), "--target", "torch:bf16", "--max-memory", budget,
                       "--json", str(out))  # fmt: skip
        assert done.returncode == 0, done.stderr
        streamed = "in float32 one module at a time as the forward pass reaches it" in done.stderr
        assert streamed == (budget == BUDGET), done.stderr
        reports[budget] = json.loads(out.read_text())
        reports[budget].pop("timings", None)
    assert reports[BUDGET] == reports["200M"]


def test_a_compiled_side_of_a_streamed_checkpoint_is_refused_with_what_to_do(wide, tmp_path):
    from layerdiff.torch import compare_torch

    out = tmp_path / "o"
    done = run_cli("torch", str(wide), "--target", "torch:compile", "--max-memory", BUDGET,
                   "--out", str(out))  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "a compiled module must hold its weights from one call to the next" in done.stderr
    assert "Traceback" not in done.stderr and not out.exists()
    with pytest.raises(UsageError, match="give a --max-memory its weights fit in"):
        compare_torch(*_streamed(wide), target="torch:compile")


def test_a_pickled_checkpoint_past_the_budget_is_refused_with_what_to_do(wide, tmp_path):
    """Weights in pytorch_model.bin can only be loaded whole: past the budget the run says to
    convert them to safetensors, rather than load them whole in silence; within it, they load."""
    import shutil

    from safetensors.torch import load_file

    pickled = tmp_path / "pickled"
    shutil.copytree(wide, pickled)
    torch.save(load_file(pickled / "model.safetensors"), pickled / "pytorch_model.bin")
    (pickled / "model.safetensors").unlink()
    out = tmp_path / "o"
    done = run_cli("torch", str(pickled), "--target", "torch:bf16", "--max-memory", BUDGET,
                   "--out", str(out))  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "stores its weights in pytorch_model.bin (about 6 MB in float32" in done.stderr
    assert "save it as safetensors" in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()
    done = run_cli("torch", str(pickled), "--target", "torch:bf16", "--max-memory", "200M")
    assert done.returncode == 0, done.stderr


def test_grad_refuses_a_checkpoint_past_the_budget_before_loading_it(wide, tmp_path):
    """`grad` holds the whole model and its gradients: past the budget it says so and what to
    do, rather than load the model whole in silence; within it, it runs."""
    out = tmp_path / "o"
    done = run_cli("grad", str(wide), "--target", "torch:bf16", "--max-memory", BUDGET,
                   "--out", str(out))  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "`layerdiff grad` holds the whole model" in done.stderr
    assert "6 MB in float32" in done.stderr and "layerdiff torch FOLDER --target" in done.stderr
    assert "Traceback" not in done.stderr and not out.exists()
    done = run_cli("grad", str(wide), "--target", "torch:bf16", "--max-memory", "200M")
    assert done.returncode == 0, done.stderr
    import layerdiff

    with pytest.raises(UsageError, match="`layerdiff grad` holds the whole model"):
        layerdiff.compare_gradients(wide, target="torch:bf16", max_memory=BUDGET)


@pytest.mark.parametrize(
    "axis", [["--decode-steps", "1", "--target", "torch:bf16"], ["--batch-sizes", "1,2"]]
)
def test_a_run_along_an_axis_refuses_a_checkpoint_past_the_budget(wide, tmp_path, axis):
    """Along an axis the model runs whole: past the budget the run says so before loading it."""
    out = tmp_path / "o"
    done = run_cli("torch", str(wide), *axis, "--max-memory", BUDGET, "--out", str(out))
    assert done.returncode == 2, done.stderr
    assert f"`{axis[0]}` here runs the whole model at once" in done.stderr
    assert "Traceback" not in done.stderr and not out.exists()
