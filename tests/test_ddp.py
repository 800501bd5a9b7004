"""Data-parallel training as a side (`layerdiff grad MODEL --target torch:ddp=N`): each parameter's
gradient after DistributedDataParallel's all-reduce, against the single-process gradient of the
whole batch, with each rank's gradient before it as a layer of its own; and the collectives of
`layerdiff ops` across the ranks of a gloo group."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, run_cli

torch = pytest.importorskip("torch")

import layerdiff  # noqa: E402

RANK_FAULT = f"{ROOT / 'tests/builders/rank_fault.py'}:build"
MLP = ROOT / "tests/builders/seed_mlp.py"


def _report(out) -> dict:
    return json.loads((out / "report.json").read_text())


def test_resnet18_trained_data_parallel_is_clean_rank_by_rank(tmp_path):
    """The issue's command: no defect; every parameter has its ranks' gradients before the
    all-reduce (each bit for bit one process's on the same rows), and its all-reduced gradient
    is fed by them, its own error what summing the ranks' shares in another order explains."""
    run = run_cli("grad", "resnet18", "--target", "torch:ddp=2", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr
    assert "the inputs are drawn at a batch of 2 (one sample per rank" in run.stdout + run.stderr
    report = _report(tmp_path)
    summary, layers = report["summary"], {x["name"]: x for x in report["layers"]}
    assert summary["defects"] == [] and summary["verdict"] == "no_drift", summary
    assert "DistributedDataParallel over 2 processes (gloo)" in report["target"]["detail"]
    parameters = [n for n in layers if ":" not in n and not n.startswith("inputs[")]
    assert len(parameters) == 62  # ResNet-18's
    for name in parameters:
        assert layers[name]["local_inputs"] == [f"{name}:rank0", f"{name}:rank1"], name
        assert layers[f"{name}:rank1"]["module_type"].endswith("(rank 1)")
        for rank in (f"{name}:rank0", f"{name}:rank1"):
            assert layers[rank]["local"]["max_abs_diff"] == 0.0, rank
    judged = [layers[n]["baseline"]["multiple"] for n in parameters if layers[n]["baseline"]]
    assert judged and max(judged) < 1.0, max(judged)
    # the all-reduced gradient has an own error of its own (the collective on the ranks'
    # partials): the sums' order may differ or not, with the threads
    assert layers["conv1.weight"]["local"] is not None


def test_a_rank_that_scales_its_gradient_is_found_at_that_parameter_on_that_rank(tmp_path):
    run = run_cli("grad", RANK_FAULT, "--target", "torch:ddp=2", "--out", str(tmp_path))
    assert run.returncode == 1, run.stderr
    summary = _report(tmp_path)["summary"]
    assert [(d["layer"], d["cause"]) for d in summary["defects"]] == [
        ("2.weight:rank1", "op_implementation")
    ], summary["defects"]
    assert summary["defects"][0]["multiple"] > 1000
    layers = {x["name"]: x for x in _report(tmp_path)["layers"]}
    # the all-reduced gradient carries it in from rank 1; its own (the collective) is clean
    assert layers["2.weight"]["exceeds_tol"] and not layers["2.weight"]["local_exceeds"]
    assert layers["2.weight:rank0"]["local"]["max_abs_diff"] == 0.0
    assert "defect at `2.weight:rank1`" in run.stdout
    fix = summary["defects"][0]["fix"]
    assert fix.startswith("rank 1's gradient of `2.weight` before the all-reduce"), fix
    reduced = run_cli("reduce", str(tmp_path / "report.json"))
    assert reduced.returncode == 2, reduced.stderr
    assert "cannot show what one rank of `torch:ddp=2` does" in reduced.stderr


def test_the_api_takes_a_data_parallel_target_in_any_precision():
    """float16 with the loss scaled on every rank alike, against float16 in one process: the
    all-reduce rounds, nothing computes wrongly."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("seed_mlp", MLP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model, inputs = module.build()
    report = layerdiff.compare_gradients(
        model, inputs, target="torch:fp16:ddp=2", reference="torch:fp16", seed=0
    )
    summary = report.data["summary"]
    assert summary["defects"] == [], summary["defects"]
    names = [x["name"] for x in report.data["layers"]]
    assert names[:3] == ["3.weight:rank0", "3.weight:rank1", "3.weight"], names[:3]
    assert "inputs[0]:rank1" in names


def test_a_model_that_computes_across_the_batch_is_no_rounding_under_data_parallelism(tmp_path):
    """Each rank computes its rows as one process does, but the batch's mean is each rank's own:
    the all-reduced gradients are another function of the batch, a defect, and the run says
    why."""
    builder = RANK_FAULT.replace(":build", ":across_the_batch")
    run = run_cli("grad", builder, "--target", "torch:ddp=2", "--out", str(tmp_path))
    assert run.returncode == 1, run.stderr
    summary = _report(tmp_path)["summary"]
    defects = {d["layer"] for d in summary["defects"]}
    assert defects == {"0.weight", "0.bias", "3.weight", "inputs[0]"}, defects
    assert summary["verdict"] == "defect"
    said = " ".join(summary["warnings"])
    assert "every rank computes its rows as one process does" in said, said
    assert "the model computes across the batch" in said


def test_a_head_the_loss_never_reads_takes_no_gradient_on_any_rank(tmp_path):
    """A pooled head returned beside the hidden states (BertModel's pooler): no gradient in one
    process, none on the ranks, no row; a clean run."""
    run = run_cli(
        "grad", RANK_FAULT.replace(":build", ":pooled"), "--target", "torch:ddp=2",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    names = [x["name"] for x in _report(tmp_path)["layers"]]
    assert "body.weight" in names and not any(n.startswith("pooler") for n in names), names


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["torch", "resnet18", "--target", "torch:ddp=2"], "the target of `layerdiff grad`"),
        (
            ["grad", "resnet18", "--target", "torch:ddp=2", "--reference", "torch:bf16"],
            "give --reference torch (the reference is `torch:bf16`)",
        ),
        (["grad", "resnet18", "--target", "torch:ddp=2", "--repro", "r"], "leave --repro out"),
        (["grad", "resnet18", "--target", "torch:ddp=1"], "takes 2 to 1024 processes"),
        (["grad", "resnet18", "--target", "torch:ddp=2:compile"], "runs eager"),
        (["grad", "resnet18", "--target", "torch:ddp"], "`ddp` needs its processes: `ddp=N`"),
        (
            ["grad", RANK_FAULT.replace(":build", ":transposed"), "--target", "torch:ddp=2"],
            "does not lead with the batch (4): a data-parallel side gives each rank",
        ),
    ],
)
def test_a_data_parallel_target_where_it_does_not_fit_is_refused(tmp_path, args, said):
    run = run_cli(*args, "--out", str(tmp_path / "out"))
    assert run.returncode == 2, run.stdout + run.stderr
    assert said in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "out").exists()


def test_collectives_across_two_ranks_pass_and_three_half_precision_ranks_sum_narrow(tmp_path):
    """gloo adds two ranks' rows in one rounding; across three, each hop of its ring rounds the
    running sum to float16: a sum in the narrow dtype, which the op rule fails as it fails a
    float16-accumulating torch.sum. Copies are exact everywhere."""
    run = run_cli(
        "ops", "--ops", "all_reduce,reduce_scatter,all_gather,broadcast,matmul",
        "--backends", "torch,torch:ddp=2,torch:ddp=3", "--dtypes", "float32,float16",
        "--out", str(tmp_path),
    )  # fmt: skip
    cells = {
        (c["case"], c["backend"], c["dtype"]): c
        for c in json.loads((tmp_path / "ops.json").read_text())["cells"]
    }
    assert run.returncode == 1, run.stderr
    # each op on the backends that run it: collectives across ranks, matmul in one process
    assert ("matmul", "torch:ddp=2", "float32") not in cells
    assert ("all_reduce", "torch", "float32") not in cells
    failed = sorted(k for k, c in cells.items() if c["status"] != "PASS")
    assert failed == [
        ("all_reduce", "torch:ddp=3", "float16"),
        ("reduce_scatter", "torch:ddp=3", "float16"),
    ], failed
    for copy in ("all_gather", "broadcast"):
        assert cells[(copy, "torch:ddp=3", "float16")]["check"]["max_abs_diff"] == 0.0
    assert "torch.distributed (gloo) across 3 processes" in (tmp_path / "ops.md").read_text()


def test_ranks_that_hold_other_values_after_a_collective_are_said():
    """Every rank must hold what rank 0 does after an all-reduce: a collective that does not
    give the ranks the same sum is an error of the cell, and a warning of a data-parallel run."""
    from layerdiff.torch import _collectives, _ddp
    from layerdiff.torch._op_cell import Said

    same, other = torch.ones(4), torch.tensor([1.0, 1.0, 1.5, 1.0])
    got, extra = _collectives._cell("all_reduce", [same, same.clone()])
    assert torch.equal(got, same) and extra == 0
    said = _collectives._cell("all_reduce", [same, other])
    assert isinstance(said, Said) and "rank 1 holds other values than rank 0" in str(said)
    assert "max |diff| 5.000e-01" in str(said)
    parts, _ = _collectives._cell("reduce_scatter", [same[:2], other[2:]])
    assert torch.equal(parts, torch.tensor([1.0, 1.0, 1.5, 1.0]))  # each rank's own, in order
    unsupported = _collectives._cell("all_gather", [("RuntimeError", "bf16 not supported")] * 2)
    assert isinstance(unsupported, NotImplementedError)
    ranks = [{"parameters": {"w": same}}, {"parameters": {"w": other}}]
    assert _ddp._disagreements(ranks) == [
        "after the all-reduce rank 1 holds other gradients than rank 0 for `w`: the collective "
        "does not give every rank the same sum (rank 0's are compared)"
    ]
