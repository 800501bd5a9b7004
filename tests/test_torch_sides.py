"""PyTorch against PyTorch computing differently (`--target torch:bf16`, `torch:compile`…):
where a precision or a compiler changes the numbers, layer by layer, with causes; faults
injected into one module of the target are found at that module."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import ROOT, run_cli
from test_causes import assert_born_at, layer

torch = pytest.importorskip("torch")

import layerdiff  # noqa: E402
from layerdiff.torch._sides import TorchSide  # noqa: E402

ENCODER = str(ROOT / "tests/builders/encoder.py")


@pytest.fixture(scope="module")
def encoder():
    sys.path.insert(0, str(ROOT / "tests"))
    from builders.encoder import build

    torch.manual_seed(0)
    model, inputs = build()
    return model.eval(), inputs


def compare(model, inputs, target, **options):
    return layerdiff.compare_torch(model, inputs, target=target, **options).data


def inject(monkeypatch, fault, side=None):
    """Every copy made from here on gets `fault(copied_model)` applied (`side`: only that
    side's, by its spelling, where the reference is a copy too)."""
    prepare = TorchSide.prepare

    def faulty(self, model, inputs, whole=frozenset(), reads_outside=()):
        copied, given = prepare(self, model, inputs, whole, reads_outside)
        if side in (None, self.spelling):
            fault(copied)
        return copied, given

    monkeypatch.setattr(TorchSide, "prepare", faulty)


def test_bfloat16_resnet18_is_precision_loss_against_the_float64_truth(resnet18):
    model, inputs, _ = resnet18
    report = compare(model, inputs, "torch:bf16")
    assert "bfloat16" in report["target"]["detail"]
    assert report["truth"]["runtime"] == "pytorch"
    s = report["summary"]
    assert s["drift_origin"] is not None and s["layers_compared"] == s["layers_total"] == 68
    origin = layer(report, s["drift_origin"])
    assert origin["cause"] == "precision_loss", origin["detail"]
    assert origin["target_dtype"] == "bfloat16"
    causes = {x["cause"] for x in report["layers"] if x["cause"]}
    assert causes <= {"precision_loss", "inherited"}, causes
    # local error was measured for every layer: the target's own module on our inputs
    assert all(x["local"] is not None for x in report["layers"])


def test_modules_that_compute_everything_themselves_are_found(resnet18, encoder):
    """A module is taken whole only when none of its submodules runs: attention reading its
    out_proj's weight, not a container whose items run (BERT's encoder), nor the model."""
    from layerdiff.torch._capture import capture

    model, inputs = encoder
    assert capture(model, inputs).self_computing == ["layers.0.self_attn", "layers.1.self_attn"]
    assert capture(resnet18[0], resnet18[1]).self_computing == []


def test_attention_under_autocast_is_one_layer_and_the_origin(encoder):
    """nn.MultiheadAttention computes its projections itself (its out_proj is never called):
    it is compared whole, and its bfloat16 rounding, within its own tolerance, is what the
    float32 residual add after it exceeds with: the add is where the drift first passes a
    tolerance (the origin), the attention whose rounding it is (the source)."""
    model, inputs = encoder
    report = compare(model, inputs, "torch:amp-bf16")
    s = report["summary"]
    assert s["drift_origin"] == "layers.0:add", s
    assert s["precision"]["origin"] == "layers.0:add"
    assert s["precision"]["source"] == "layers.0.self_attn"
    attention = layer(report, "layers.0.self_attn")
    assert attention["module_type"] == "MultiheadAttention"
    assert attention["cause"] == "precision_loss" and not attention["exceeds_tol"]
    assert "computes in a wider dtype again" in attention["detail"], attention["detail"]
    add = layer(report, "layers.0:add")
    assert add["exceeds_tol"] and add["cause"] == "inherited"
    assert add["error_from"] == "layers.0.self_attn"
    assert add["local"]["max_abs_diff"] == 0.0


@pytest.mark.parametrize("which", ["resnet18", "encoder"])
def test_float32_against_itself_raises_nothing(which, resnet18, encoder):
    model, inputs = (resnet18[0], resnet18[1]) if which == "resnet18" else encoder
    for tolerance in ("dtype", "auto"):
        report = compare(model, inputs, "torch", tolerance=tolerance)
        s = report["summary"]
        assert s["drift_origin"] is None and s["layers_exceeding"] == 0
        assert s["worst"]["max_abs_diff"]["value"] == 0.0
        assert not any(x["cause"] for x in report["layers"])


@pytest.mark.parametrize("which", [pytest.param("resnet18", marks=pytest.mark.thorough), "encoder"])
def test_compiled_leaves_are_compared_one_by_one(which, resnet18, encoder):
    """torch.compile per leaf module: every layer is compared and really compiled (a graph
    per leaf that computes, none silently left eager; a Dropout at inference computes nothing,
    so it makes no graph), and inductor's float32 kernels stay within float32 tolerance."""
    from torch._dynamo.utils import counters

    model, inputs = (resnet18[0], resnet18[1]) if which == "resnet18" else encoder
    before = counters["stats"]["unique_graphs"]
    report = compare(model, inputs, "torch:compile", float64=False)
    compiled = counters["stats"]["unique_graphs"] - before
    leaves = {
        x["name"].split("#")[0]
        for x in report["layers"]
        if ":" not in x["name"] and x["module_type"] != "Dropout"
    }
    assert compiled >= len(leaves), (compiled, len(leaves))
    assert "compiled (inductor, each leaf module)" in report["target"]["detail"]
    s = report["summary"]
    assert s["layers_compared"] == s["layers_total"] and s["drift_origin"] is None


def test_the_whole_model_compiled_is_measured_beside_the_layers(encoder):
    """Per-leaf compiles leave fusion across modules out: the whole model is also compiled at
    once, its output judged against the same side eager (an honest Inductor agrees), and both
    timed."""
    model, inputs = encoder
    report = layerdiff.compare_torch(model, inputs, target="torch:compile", float64=False)
    (note,) = [n for n in report.notes if n.startswith("the whole model compiled at once")]
    assert "× eager's speed" in note
    (whole,) = report.data["compiled_whole"]["tried"]
    assert whole["module"] == "TransformerEncoder" and not whole["differs"], whole
    assert report.summary["verdict"] == "no_drift"


def test_a_changed_weight_in_one_target_module_is_weight_mismatch(resnet18, monkeypatch):
    model, inputs, _ = resnet18

    def fault(copied):
        with torch.no_grad():
            copied.layer2[0].conv1.weight[0] += 0.05

    inject(monkeypatch, fault)
    for target in ("torch", "torch:bf16"):
        report = compare(model, inputs, target)
        if target == "torch":
            origin = assert_born_at(report, "layer2.0.conv1", "weight_mismatch")
        else:  # bfloat16 drifts from the start; the weight still stands out as changed
            origin = layer(report, "layer2.0.conv1")
            assert origin["cause"] == "weight_mismatch", origin["detail"]
            assert "beyond its rounding to bfloat16" in origin["detail"]
        assert "`layer2.0.conv1.weight`" in origin["detail"]


def test_one_module_run_in_float16_is_precision_loss_at_that_module(resnet18, monkeypatch):
    model, inputs, _ = resnet18

    def fault(copied):
        conv = copied.layer3[0].conv2.half()
        forward = conv.forward
        conv.forward = lambda x: forward(x.half()).float()

    inject(monkeypatch, fault)
    report = compare(model, inputs, "torch")
    origin = assert_born_at(report, "layer3.0.conv2", "precision_loss")
    assert "float16" in origin["detail"], origin["detail"]


def test_a_different_kernel_in_one_module_is_op_implementation(encoder, monkeypatch):
    model, inputs = encoder

    def fault(copied):
        norm = copied.layers[1].norm1
        norm.forward = lambda x: torch.nn.functional.layer_norm(
            x, norm.normalized_shape, norm.weight, norm.bias, 1e-1
        )

    inject(monkeypatch, fault)
    report = compare(model, inputs, "torch")
    origin = assert_born_at(report, "layers.1.norm1", "op_implementation")
    assert "LayerNorm computes differently" in origin["detail"], origin["detail"]


def test_a_bfloat16_kernel_bug_is_told_from_bfloat16_rounding(encoder, monkeypatch):
    """In bfloat16 a layer may differ by its rounding (precision_loss); a Linear that drops its
    bias differs by far more than bfloat16 explains: the kernel computes something else."""
    model, inputs = encoder

    def fault(copied):
        linear = copied.layers[1].linear2
        linear.forward = lambda x: torch.nn.functional.linear(x, linear.weight)

    inject(monkeypatch, fault)
    report = compare(model, inputs, "torch:bf16")
    broken = layer(report, "layers.1.linear2")
    assert broken["cause"] == "op_implementation", broken["detail"]
    assert "what bfloat16 explains" in broken["detail"], broken["detail"]
    assert "the target's Linear computes differently" in broken["detail"]
    assert report["summary"]["verdict"] == "defect"
    assert [d["layer"] for d in report["summary"]["defects"]] == ["layers.1.linear2"]
    honest = [x for x in report["layers"] if x["cause"] and x["name"] != "layers.1.linear2"]
    assert {x["cause"] for x in honest} <= {"precision_loss", "inherited"}


@pytest.mark.parametrize("target", ["torch:bf16", "torch:fp16"])
def test_a_norm_whose_epsilon_depends_on_the_dtype_is_a_defect_not_rounding(target, tmp_path):
    """The norm's epsilon is 1.0 in any dtype but float32 (tests/builders/dtype_branch.py): its
    float64 copy and its same-precision baseline take the target's path, so the baseline alone
    called it 1.0× what the precision explains; the truth, 400 times further from the float32
    reference than from the target, shows that no rounding makes it."""
    builder = f"{ROOT / 'tests/builders/dtype_branch.py'}:build"
    done = run_cli("torch", builder, "--target", target, "--out", str(tmp_path), "--quiet")
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["summary"]["drift_origin"] == "n"
    assert [(d["layer"], d["cause"]) for d in report["summary"]["defects"]] == [
        ("n", "op_implementation")
    ]
    norm = layer(report, "n")
    assert "the model's float64 copy computes this layer as the target does" in norm["detail"]
    assert report["summary"]["defects"][0]["fix"].startswith(
        "make the code of the target's `n` (EpsNorm) compute the same for every dtype"
    )


class _Noisy(torch.nn.Module):
    """A layer that gives other bits each call (as atomics can on a GPU)."""

    def forward(self, x):
        return x + 1e-2 * torch.randn_like(x)


def test_a_target_that_disagrees_with_itself_is_nondeterminism(monkeypatch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), _Noisy(), torch.nn.Linear(8, 4)).eval()
    monkeypatch.setattr(TorchSide, "may_disagree", property(lambda self: True))
    report = compare(model, torch.randn(2, 8), "torch", float64=False)
    origin = layer(report, "1")
    assert origin["cause"] == "nondeterminism", origin["detail"]
    assert "the target run twice disagrees" in origin["detail"]


@pytest.mark.thorough  # a PyTorch model in segments: test_segments.py, in float32
def test_segments_give_the_same_numbers(resnet18):
    model, inputs, _ = resnet18
    whole = compare(model, inputs, "torch:bf16")
    pieces = layerdiff.compare_torch(model, inputs, target="torch:bf16", max_memory="64M")
    assert any("segments" in note for note in pieces.notes)
    assert pieces.data["layers"] == whole["layers"]


def test_the_command_compares_a_pytorch_target(tmp_path):
    result = run_cli(
        "torch", f"{ENCODER}:build", "--target", "torch:amp-bf16", "--out", str(tmp_path)
    )
    # Autocast's bfloat16 rounding alone: not a failure unless asked (--fail-on drift).
    assert result.returncode == 0, result.stderr
    assert "bfloat16 rounding only: no layer computes differently" in result.stdout
    first = "first past its tolerance at `layers.0:add`, from the rounding of `layers.0.self_attn`"
    assert first in result.stdout.splitlines()[0]
    assert "without a counterpart" in result.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["target"]["runtime"] == "pytorch"
    assert "autocast to bfloat16" in report["target"]["detail"]
    assert not (tmp_path / "model.onnx").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "torch:bf16:fp16"], "two precisions"),
        (["--target", "torch:cpu:tf32"], "TF32 is a CUDA math mode"),
        (
            ["--target", "torch:nosuchdevice"],
            "is neither a precision (fp32, tf32, fp16, bf16, amp-fp16, amp-bf16) nor a device "
            "PyTorch knows",
        ),
        (["--reference", "torch:bf16"], "is for a PyTorch target"),
        (["--target", "torch:bf16", "--onnx", "model.onnx"], "is PyTorch itself"),
        (["--target", "torch:compile=nosuchbackend"], "not a torch.compile backend"),
    ],
)
def test_bad_pytorch_sides_are_usage_errors(args, message):
    from test_cli import assert_usage_error

    assert_usage_error(run_cli("torch", f"{ENCODER}:build", *args), message)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_a_cuda_side_without_cuda_says_so():
    from test_cli import assert_usage_error

    result = run_cli("torch", f"{ENCODER}:build", "--target", "torch:cuda:bf16")
    assert_usage_error(result, "PyTorch sees no CUDA device here")


def test_the_module_a_target_calls_its_layers_differently_in_is_found():
    """Where a target's pass calls other layers than the model's, the innermost module whose own
    forward made every differing call on both sides (a leaf call is its parent's, a functional
    one its owner's); none where the model itself calls differently."""
    from types import SimpleNamespace

    from layerdiff.torch._lockstep import diverging_modules

    def calls(*names):
        return [SimpleNamespace(name=n, module=n.split(":")[0].split("#")[0]) for n in names]

    model = calls("embed", "b.1.mlp.fc1", "b.1.mlp.act", "b.1.mlp.fc2", "b.1:add", "b.2.mlp.fc1")
    fused = calls("embed", "b.1.mlp:gelu", "b.1:add", "b.2.mlp.fc1")
    assert diverging_modules(model, fused) == ["b.1.mlp"]
    skipped = calls("embed", "b.1.mlp.fc1", "b.1.mlp.act", "b.1:add", "b.2.mlp.fc1")
    assert diverging_modules(model, skipped) == ["b.1.mlp"]
    # two blocks' MLPs and their parent: the parent takes both in
    both = calls("embed", "b.1.mlp:gelu", "b.1:add", "b:mul")
    assert diverging_modules(model, both) == ["b"]
    assert diverging_modules(model, calls("embed", "head")) == []


def test_a_functional_call_is_rerun_with_the_targets_own_arguments(tmp_path):
    """The second block's LayerNorm takes an epsilon its code computes from the dtype (0.5
    below float32). The call is a functional layer (`1:layer_norm`): re-run on the reference's
    tensors with the target's own epsilon, it is the one defect, named with both values; the
    first block, whose code passes the same epsilon, stays precision."""
    builder = f"{ROOT}/tests/builders/dtype_scalar.py:build"
    out = tmp_path / "r.json"
    run = run_cli("torch", builder, "--target", "torch:bf16", "--json", str(out))
    assert run.returncode == 1, run.stdout + run.stderr
    report = json.loads(out.read_text())
    defects = [(d["layer"], d["cause"]) for d in report["summary"]["defects"]]
    assert defects == [("1:layer_norm", "argument_mismatch")], defects
    norm = next(x for x in report["layers"] if x["name"] == "1:layer_norm")
    assert "`eps` 1e-05 → 0.5" in norm["detail"], norm["detail"]
    first = next(x for x in report["layers"] if x["name"] == "0:layer_norm")
    assert first["finding"] in (None, "precision", "inherited"), first["detail"]


@pytest.fixture(scope="module")
def gpt2():
    from layerdiff.torch.models import load_builder

    return load_builder("gpt2")(0)


@pytest.mark.parametrize(("target", "grid"), [("torch:fp16", "float16"), ("torch", "float32")])
def test_a_bfloat16_reference_is_not_blamed_on_a_finer_target(gpt2, target, grid):
    """A bfloat16 reference rounds coarser than a float16 or float32 target: what it rounds
    away is the reference's, not a wrong or approximate kernel in the target (an Embedding read
    5800× what bfloat16 explains, the attention mask's add an infinite multiple; a float32
    target's embedding was `weight_mismatch`, its mask 1e36 off). The target's kernels are held
    to their own dtype's ideal; the drift between the sides is bfloat16's."""
    model, inputs = gpt2
    report = compare(model, inputs, target, reference="torch:bf16", seed=0)
    s = report["summary"]
    assert s["defects"] == [] and "approximations" not in s, s
    assert s["verdict"] == "precision" and s["precision"]["dtype"] == "bfloat16", s
    wte = layer(report, "model.transformer.wte")
    assert wte["cause"] in (None, "precision_loss", "rounding"), wte["detail"]
    assert wte["baseline"]["grid"] == grid, wte["baseline"]
    assert wte["baseline"]["multiple"] <= 1.0, wte["baseline"]
    # the drift is the reference's rounding: no layer of the target kept in float32 removes it
    assert not report.get("keep_float32"), report.get("keep_float32")
    mask = layer(report, "model.transformer.h.0.attn:add")
    # held as each side's own extreme (-65504 is a step of bfloat16 from -65536): no 1e36
    assert mask["accumulated"]["sentinels"] > 0 and mask["accumulated"]["max_abs_diff"] <= 32, mask


def test_a_float16_kernel_is_held_to_float16_against_a_bfloat16_reference(gpt2, monkeypatch):
    """The coarser reference does not widen what the target's kernel may err by: one Linear of
    the float16 target 1% off is still the defect at that Linear."""
    model, inputs = gpt2

    def fault(copied):
        mlp = copied.model.transformer.h[1].mlp.c_proj
        forward = mlp.forward
        mlp.forward = lambda x: forward(x) * 1.01

    inject(monkeypatch, fault, side="torch:fp16")
    report = compare(model, inputs, "torch:fp16", reference="torch:bf16", seed=0)
    defects = [(d["layer"], d["cause"]) for d in report["summary"]["defects"]]
    assert defects == [("model.transformer.h.1.mlp.c_proj", "op_implementation")], defects
    detail = report["summary"]["defects"][0]["detail"]
    assert "what float16 explains" in detail, detail
    # the reference's bfloat16 rounding keeps it as far from float64: no word of "rounding"
    assert "not a bug" not in detail and "cannot tell a float16 kernel's error" in detail, detail
