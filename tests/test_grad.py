"""`layerdiff grad`: gradients of every parameter and input, in backward order, on another
precision or compiler against the model as given; the seed's Linear → GELU → Linear → LayerNorm
anchor."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, run_cli

torch = pytest.importorskip("torch")

import layerdiff  # noqa: E402
from layerdiff._sides import TorchSide  # noqa: E402

MLP = str(ROOT / "tests/builders/seed_mlp.py")
BACKWARD_ORDER = ["3.weight", "3.bias", "2.bias", "2.weight", "0.bias", "inputs[0]", "0.weight"]


@pytest.fixture(scope="module")
def mlp():
    import importlib.util

    spec = importlib.util.spec_from_file_location("seed_mlp", MLP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    return module.build()


def grads(mlp, target, **options):
    model, inputs = mlp
    return layerdiff.compare_gradients(model, inputs, target=target, seed=0, **options).data


def test_every_parameter_and_the_input_in_backward_order(mlp):
    report = grads(mlp, "torch")
    assert [x["name"] for x in report["layers"]] == BACKWARD_ORDER
    assert report["command"] == "grad"
    assert report["layers"][0]["module_type"] == "LayerNorm.weight"
    assert report["layers"][5]["module_type"] == "input"
    s = report["summary"]
    assert s["drift_origin"] is None and s["worst"]["max_abs_diff"]["value"] == 0.0


def test_bfloat16_gradients_are_precision_loss_from_the_first_in_backward_order(mlp):
    report = grads(mlp, "torch:bf16")
    s = report["summary"]
    assert s["drift_origin"] == "3.weight"
    for x in report["layers"]:
        assert x["target_dtype"] == "bfloat16"
        if x["cause"]:
            assert x["cause"] == "precision_loss", x["detail"]
    assert report["layers"][0]["float64"]["target"] > report["layers"][0]["float64"]["reference"]


def test_float16_autocast_is_a_scaled_training_step(mlp):
    """Autocast to float16 with the loss scaled as GradScaler does: the gradients are unscaled in
    float32 (what the optimizer sees) and their lower precision named."""
    report = grads(mlp, "torch:amp-fp16")
    assert "scaled by" in report["target"]["detail"]
    origin = next(x for x in report["layers"] if x["name"] == report["summary"]["drift_origin"])
    assert origin["target_dtype"] is None  # float32, like the reference's
    assert origin["cause"] == "precision_loss"
    assert "autocast to float16" in origin["detail"]


def test_compiled_gradients_stay_within_float32_tolerance(mlp):
    report = grads(mlp, "torch:compile")
    assert report["summary"]["drift_origin"] is None
    assert report["summary"]["layers_compared"] == len(BACKWARD_ORDER)


class _WrongGelu(torch.autograd.Function):
    """GELU forward, and a backward that forgets the x·φ(x) term of its derivative (Φ(x) only):
    a wrong backward kernel."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.nn.functional.gelu(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 0.5 * (1 + torch.erf(x / 2**0.5))


def test_a_wrong_backward_is_found_where_backward_first_passes_it(mlp, monkeypatch):
    prepare, made = TorchSide.prepare, []

    def faulty(self, model, inputs, whole=frozenset()):
        copied, given = prepare(self, model, inputs, whole)
        made.append(copied)
        if len(made) == 2:  # the reference's copy is made first, the target's second
            copied[1].forward = _WrongGelu.apply
        return copied, given

    monkeypatch.setattr(TorchSide, "prepare", faulty)
    model, inputs = mlp
    found = layerdiff.compare_gradients(model, inputs, target="torch", seed=0)
    report = found.data
    exceeding = [x["name"] for x in report["layers"] if x["exceeds_tol"]]
    assert any("born in the backward of `1` (GELU)" in note for note in found.notes), found.notes
    assert report["summary"]["drift_origin"] == "0.bias", exceeding
    assert not any(name.startswith(("2.", "3.")) for name in exceeding)


def test_the_command(tmp_path):
    result = run_cli("grad", f"{MLP}:build", "--target", "torch:bf16", "--out", str(tmp_path))
    assert result.returncode == 1, result.stderr
    assert "born at `3.weight`" in result.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["command"] == "grad" and report["mode"] == "accumulated"
    again = run_cli(
        "grad", f"{MLP}:build", "--target", "torch:bf16", "--json", str(tmp_path / "b.json")
    )
    assert again.returncode == 1
    assert (tmp_path / "b.json").read_bytes() == (tmp_path / "report.json").read_bytes()


def test_grad_needs_a_target():
    from test_cli import assert_usage_error

    assert_usage_error(run_cli("grad", f"{MLP}:build"), "--target")
