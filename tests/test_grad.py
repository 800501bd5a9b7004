"""`layerdiff grad`: gradients of every parameter, input and module call's input, in backward
order, on another precision or compiler against the model as given, each with its own error
(its module call's backward re-run alone) held against its same-precision baseline; the seed's
Linear → GELU → Linear → LayerNorm anchor, and real models with one wrong backward."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, run_cli

torch = pytest.importorskip("torch")

import layerdiff  # noqa: E402
from layerdiff.torch._sides import TorchSide  # noqa: E402

MLP = str(ROOT / "tests/builders/seed_mlp.py")
BACKWARD_ORDER = [
    "3:input", "3.weight", "3.bias", "2:input", "2.bias", "2.weight", "1:input", "0.bias",
    "inputs[0]", "0.weight",
]  # fmt: skip


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
    by_name = {x["name"]: x for x in report["layers"]}
    assert by_name["3:input"]["module_type"] == "LayerNorm (input gradient)"
    assert by_name["3.weight"]["module_type"] == "LayerNorm.weight"
    assert by_name["inputs[0]"]["module_type"] == "input"
    # each gradient's error comes in through the input gradient of the call that read its
    # module's output
    assert by_name["2.weight"]["local_inputs"] == ["3:input"]
    assert by_name["0.weight"]["local_inputs"] == ["1:input"]
    s = report["summary"]
    assert s["drift_origin"] is None and s["worst"]["max_abs_diff"]["value"] == 0.0
    assert s["verdict"] == "no_drift"


def test_bfloat16_gradients_are_rounding_only(mlp):
    """Every gradient's own error in bfloat16 is what an ideal bfloat16 backward makes: the
    verdict is precision, no defect, and the run passes."""
    report = grads(mlp, "torch:bf16")
    s = report["summary"]
    assert s["verdict"] == "precision" and s["defects"] == [], s["defects"]
    assert s["drift_origin"] == "3:input" == s["precision"]["origin"]
    assert s["precision"]["dtype"] == "bfloat16"
    for x in report["layers"]:
        assert x["target_dtype"] == "bfloat16"
        assert x["finding"] in ("precision", "inherited"), (x["name"], x["detail"])
        assert x["baseline"]["multiple"] <= 1, (x["name"], x["baseline"])
    assert report["layers"][1]["float64"]["target"] > report["layers"][1]["float64"]["reference"]


def test_float16_autocast_is_a_scaled_training_step(mlp):
    """Autocast to float16 with the loss scaled as GradScaler does: the gradients are unscaled in
    float32 (what the optimizer sees), each backward held against float16, and no defect."""
    report = grads(mlp, "torch:amp-fp16")
    assert "scaled by" in report["target"]["detail"]
    s = report["summary"]
    assert s["verdict"] == "precision" and s["defects"] == []
    linear = next(x for x in report["layers"] if x["name"] == "2:input")
    assert linear["target_dtype"] is None  # float32, like the reference's
    assert linear["baseline"]["grid"] == "float16"
    assert linear["cause"] == "precision_loss"
    assert "computes this layer in float16" in linear["detail"], linear["detail"]


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


@pytest.mark.parametrize("target", ["torch", "torch:bf16"])
def test_a_wrong_backward_is_the_defect_where_it_sits(mlp, monkeypatch, target):
    """A GELU whose backward is wrong in every dtype: its input gradient is the one defect, what
    backward computes after it inherits from it, and in bfloat16 the honest rounding of the
    other backwards does not take the headline."""
    prepare, made = TorchSide.prepare, []

    def faulty(self, model, inputs, whole=frozenset()):
        copied, given = prepare(self, model, inputs, whole)
        made.append(copied)
        if len(made) == 2:  # the reference's copy is made first, the target's second
            copied[1].forward = _WrongGelu.apply
        return copied, given

    monkeypatch.setattr(TorchSide, "prepare", faulty)
    model, inputs = mlp
    report = layerdiff.compare_gradients(model, inputs, target=target, seed=0)
    s = report.summary
    assert [(d["layer"], d["cause"]) for d in s["defects"]] == [("1:input", "op_implementation")]
    assert report.drift_origin == "1:input"
    for name in ("0.weight", "0.bias", "inputs[0]"):
        assert report.layer(name)["error_from"] == "1:input", report.layer(name)
    before = [x for x in report.layers if x["name"].startswith(("2", "3"))]
    assert all(x["finding"] in (None, "precision") for x in before)


@pytest.mark.parametrize(
    ("build", "target", "wrong"),
    [
        ("mlp_wrong_backward", "torch:bf16", "0.weight"),
        ("mlp_wrong_backward", "torch:fp16", "0.weight"),
        ("transformer_wrong_backward", "torch:bf16", "layers.1.linear1.weight"),
        ("transformer_wrong_backward", "torch:fp16", "layers.1.linear1.weight"),
        ("cnn_wrong_backward", "torch:bf16", "layer3.0.conv2.weight"),
    ],
)
def test_a_backward_off_in_a_narrow_dtype_is_told_from_its_rounding(build, target, wrong):
    """One module's backward makes its weight's gradient 2% too large in bfloat16 and float16
    only (the seed's MLP, a transformer encoder, ResNet-18): that weight is the one defect, the
    headline names it, everything else is rounding or inherited, and the run fails."""
    from builders import narrow_kernels

    model, inputs = getattr(narrow_kernels, build)()
    report = layerdiff.compare_gradients(model, inputs, target=target, seed=0)
    s = report.summary
    assert [(d["layer"], d["cause"]) for d in s["defects"]] == [(wrong, "op_implementation")]
    assert s["defects"][0]["multiple"] > 2
    assert report.drift_origin == wrong
    assert f"1 defect: `{wrong}`" in report.summary_text(), report.summary_text()
    others = [x for x in report.layers if x["name"] != wrong and x["finding"]]
    assert all(x["finding"] in ("precision", "inherited") for x in others)
    assert report.exit_code == 1
    module = wrong.rsplit(".", 1)[0]
    advised = (report.data.get("keep_float32") or {}).get("layers", [])
    assert all(a["layer"] != module for a in advised), advised  # float32 hides, not fixes, it


def test_noise_of_a_narrow_sums_size_in_a_float32_summed_gradient_is_a_defect():
    """A ViT's MLP Linear adds random noise of 5% of its weight gradient's mean magnitude to it
    in bfloat16: 7.9x what a float32-accumulating kernel explains and 0.7x what a bfloat16
    running sum does, which is what it used to be named (`narrow_accumulation`, exit 0). Its
    error is as large where the sums are short and narrow as where they are long and spread,
    which no accumulation's rounding is: a defect, beside the LayerNorms that do sum in
    bfloat16."""
    from builders import narrow_kernels

    model, inputs = narrow_kernels.vit_noisy_backward()
    report = layerdiff.compare_gradients(model, inputs, target="torch:bf16", seed=0)
    s = report.summary
    wrong = "encoder.layers.encoder_layer_1.mlp.0.weight"
    assert [(d["layer"], d["cause"]) for d in s["defects"]] == [(wrong, "op_implementation")]
    layer = report.layer(wrong)
    assert "but not its rounding: at " in layer["detail"], layer["detail"]
    narrow = layer["baseline"]["narrow"]
    assert narrow["multiple"] <= 1.25 and narrow["elements_beyond"] > 0.1 * 8192, narrow
    named = {k["layer"] for k in s["narrow_accumulation"]}
    assert named and all(".ln_" in k for k in named), named
    assert report.exit_code == 1


@pytest.fixture
def torch_threads():
    """Runs the test's PyTorch at the threads given, then as it was."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("target", ["torch:bf16", "torch:fp16"])
def test_layernorm_gradients_pytorch_sums_in_the_narrow_dtype_are_named_not_blamed(
    target, threads, torch_threads
):
    """A ConvNeXt's LayerNorm weight and bias gradients sum over every position; PyTorch's CPU
    kernels add them up in bfloat16 and float16, up to 14× what a float32-accumulating kernel
    explains. They used to be `op_implementation` defects (exit 1, "report it to the
    runtime"); they are honest for a kernel that accumulates in the narrow dtype, so they are
    named as such, with advice, and the run passes. Its blocks' own `layer_scale` gradients
    have their own error too (they read undecided, with nothing measured). At one thread
    PyTorch adds all 784 positions up one by one in bfloat16, and a bias gradient's running
    sum stalls short of it (44× what a float32-accumulating kernel explains, every element
    short): still the narrow kernel's rounding, not a defect."""
    from builders import zoo

    torch_threads(threads)
    model, inputs = zoo.tiny_convnext()
    report = layerdiff.compare_gradients(model, inputs, target=target, seed=0)
    s = report.summary
    assert s["defects"] == [] and s["verdict"] == "precision", s["defects"]
    named = {k["layer"] for k in s["narrow_accumulation"]}
    assert {"features.0.1.bias", "features.2.0.bias"} <= named, named
    for k in s["narrow_accumulation"]:
        layer = report.layer(k["layer"])
        assert layer["module_type"].startswith("LayerNorm"), layer["module_type"]
        assert layer["cause"] == "narrow_accumulation" and layer["finding"] == "precision"
        assert k["terms"] in (28 * 28, 14 * 14), k  # the positions of its stage
        assert k["multiple"] > 1.25 >= k["narrow_multiple"], k
    first = report.summary_text().splitlines()[0]
    assert "accumulate in" in first and "`features.2.0.bias`" in first, first
    for name in ("features.1.0.layer_scale", "features.3.0.layer_scale"):
        layer = report.layer(name)
        assert layer["local"] is not None and layer["baseline"] is not None, layer
    assert not [x["name"] for x in report.layers if x["finding"] == "undecided"]
    assert report.exit_code == 0


@pytest.mark.parametrize("threads", [1, 2])
def test_layernorm_sums_swamped_by_a_class_token_are_their_kernel_not_a_defect(
    threads, torch_threads
):
    """A ViT's class token comes first and its gradient is most of a LayerNorm bias gradient's
    sum: at one thread PyTorch adds the other positions to a running bfloat16 sum that large,
    and those under half its step are lost. From how many terms there are and how spread,
    that read as `op_implementation` defects (15–24×, ViT-B/16's `ln_2.bias` at 1.4× the
    narrow ideal); the LayerNorm hands over its terms, and added up one by one they err as
    much, so the run is precision, the LayerNorms named as accumulating in bfloat16."""
    from builders import zoo

    torch_threads(threads)
    model, inputs = zoo.tiny_vit()
    report = layerdiff.compare_gradients(model, inputs, target="torch:bf16", seed=0)
    s = report.summary
    assert s["defects"] == [] and s["verdict"] == "precision", s["defects"]
    assert report.exit_code == 0
    if threads == 1:
        named = {k["layer"] for k in s["narrow_accumulation"]}
        assert "encoder.layers.encoder_layer_2.ln_2.bias" in named, named


@pytest.mark.parametrize("threads", [1, 2])
def test_a_backward_short_of_its_values_beside_stalled_sums_is_still_the_defect(
    threads, torch_threads
):
    """A stalled narrow sum falls short of its values, all of its error one way; a weight
    gradient 2% short leans the same way, but its terms have mixed signs and never stall: the
    leaning the stalled LayerNorm sums beside it are allowed is not its to have."""
    from builders import narrow_kernels

    torch_threads(threads)
    model, inputs = narrow_kernels.convnext_short_backward()
    report = layerdiff.compare_gradients(model, inputs, target="torch:bf16", seed=0)
    s = report.summary
    assert [(d["layer"], d["cause"]) for d in s["defects"]] == [
        ("classifier.2.weight", "op_implementation")
    ], s["defects"]
    narrow = report.layer("classifier.2.weight")["baseline"]["narrow"]
    assert narrow["systematic"] < -0.9 and narrow.get("short", 0) < 0.1, narrow


@pytest.mark.parametrize("threads", [1, 2])
def test_a_wrong_backward_beside_narrow_accumulation_is_the_one_defect(
    tmp_path, threads, torch_threads
):
    """The same ConvNeXt with its classifier's backward 2% off in bfloat16: that weight is the one
    defect and the headline, the LayerNorms' narrow accumulation is said after it (at one
    thread too, where their sums stall); on the command line, a clean run exits 0 and 1 only
    with `--fail-on accumulation`."""
    from builders import narrow_kernels

    torch_threads(threads)
    model, inputs = narrow_kernels.convnext_wrong_backward()
    report = layerdiff.compare_gradients(model, inputs, target="torch:bf16", seed=0)
    s = report.summary
    wrong = "classifier.2.weight"
    assert [(d["layer"], d["cause"]) for d in s["defects"]] == [(wrong, "op_implementation")]
    assert s["narrow_accumulation"], s
    first = report.summary_text().splitlines()[0]
    assert first.split(": ", 1)[1].startswith(f"1 defect: `{wrong}`"), first
    assert "besides" in first and "accumulate in bfloat16" in first, first
    assert report.exit_code == 1

    clean = f"{ROOT / 'tests/builders/zoo.py'}:tiny_convnext"
    env = {"LAYERDIFF_THREADS": str(threads)}
    passed = run_cli("grad", clean, "--target", "torch:bf16", "--quiet", env=env)
    assert passed.returncode == 0, passed.stderr
    strict = run_cli("grad", clean, "--target", "torch:bf16", "--fail-on", "accumulation", env=env)
    assert strict.returncode == 1, strict.stderr
    assert "narrow accumulation at `features." in strict.stdout, strict.stdout


def test_clean_gradients_of_real_models_have_no_defect():
    from builders import encoder

    torch.manual_seed(0)
    model, inputs = encoder.build()
    for target in ("torch:bf16", "torch:fp16", "torch:amp-bf16"):
        report = layerdiff.compare_gradients(model, inputs, target=target, seed=0)
        assert report.summary["defects"] == [], (target, report.summary["defects"])
        assert report.summary["verdict"] == "precision"


@pytest.mark.parametrize("target", ["torch:fp16", "torch"])
def test_gradients_against_a_coarser_reference_blame_nothing_on_the_target(target):
    """A bfloat16 reference's gradients round coarser than a float16 (or float32) target's:
    what they round away is the reference's. Its exact backward was made from the reference's
    own bfloat16 weights and read every float16 input gradient as a defect (3.4× at
    `layer3.0.conv2:input` of ResNet-18, 21 defects)."""
    from builders import encoder

    torch.manual_seed(0)
    model, inputs = encoder.build()
    report = layerdiff.compare_gradients(
        model, inputs, target=target, reference="torch:bf16", seed=0
    ).data
    s = report["summary"]
    assert s["defects"] == [] and s["verdict"] == "precision", s["defects"]
    assert s["precision"]["dtype"] == "bfloat16", s["precision"]
    judged = [x for x in report["layers"] if x.get("baseline")]
    assert judged and all(x["baseline"]["grid"] != "bfloat16" for x in judged)


def test_the_command(tmp_path):
    result = run_cli("grad", f"{MLP}:build", "--target", "torch:bf16", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr  # rounding only
    assert "bfloat16 rounding only" in result.stdout, result.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["command"] == "grad" and report["mode"] == "local"
    again = run_cli(
        "grad", f"{MLP}:build", "--target", "torch:bf16", "--json", str(tmp_path / "b.json")
    )
    assert again.returncode == 0
    assert (tmp_path / "b.json").read_bytes() == (tmp_path / "report.json").read_bytes()
    drift = run_cli("grad", f"{MLP}:build", "--target", "torch:bf16", "--fail-on", "drift")
    assert drift.returncode == 1


def test_grad_needs_a_target():
    from test_cli import assert_usage_error

    assert_usage_error(run_cli("grad", f"{MLP}:build"), "--target")


def test_a_module_whose_half_path_skips_a_parameter_is_the_defect_at_it(tmp_path):
    """tests/builders/fused_mlp.py: in bfloat16 the MLPs call none of their submodules and never
    use `fc2.bias`, so the target's backward gives it no gradient (the first block's bias is
    zero, so its forward is right, but training would never move it). That is a finding, not
    a failure: both MLPs are differentiated whole, a missing gradient counts as zero, and each
    bias is a defect of its own, nothing else."""
    out = tmp_path / "r.json"
    done = run_cli("grad", str(ROOT / "tests/builders/fused_mlp.py") + ":build",
                   "--target", "torch:bf16", "--json", str(out))  # fmt: skip
    assert done.returncode == 1, done.stderr
    report = json.loads(out.read_text())
    defects = [(d["layer"], d["cause"]) for d in report["summary"]["defects"]]
    assert sorted(defects) == [
        ("2.mlp.fc2.bias", "op_implementation"), ("3.mlp.fc2.bias", "op_implementation"),
    ], defects  # fmt: skip
    warnings = " ".join(report["summary"]["warnings"])
    assert "`2.mlp`, `3.mlp` compared whole" in warnings
    assert "gives no gradient for `3.mlp.fc2.bias`, `2.mlp.fc2.bias`" in warnings


def test_a_module_whose_output_does_not_reach_the_loss_is_left_out():
    """BERT's pooler runs but the logits do not read it: its call has no output gradient, and
    its backward alone is not made (it was an internal error)."""

    class TwoHeads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.used, self.unused = (torch.nn.Linear(8, 8) for _ in range(3))

        def forward(self, x):
            h = torch.relu(self.body(x))
            self.unused(h)  # computed, never read: a pooler nobody asked for
            return self.used(h)

    torch.manual_seed(0)
    report = layerdiff.compare_gradients(TwoHeads(), (torch.randn(4, 8),), target="torch:bf16")
    names = [x["name"] for x in report.layers]
    assert "used.weight" in names and not any(n.startswith("unused") for n in names)
    assert report.summary["defects"] == []
