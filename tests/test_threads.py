"""`LAYERDIFF_THREADS`: the threads each pool of a run uses, for runs side by side (README,
Cost): PyTorch's in the command, ONNX Runtime's and OpenVINO's, and the report says so."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

pytest.importorskip("torch")

BUILDER = """
import torch


def build():
    with open(__file__ + ".threads", "w") as f:
        f.write(str(torch.get_num_threads()))
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()), (torch.randn(2, 8),)
"""


@pytest.mark.parametrize("threads", ["1", "3"])
def test_the_cap_sizes_pytorch_and_the_runtime_and_the_report_says_it(tmp_path, threads):
    builder = tmp_path / "tiny.py"
    builder.write_text(BUILDER)
    report = tmp_path / "report.json"
    r = run_cli(
        "torch", f"{builder}:build", "--json", str(report), "--quiet",
        env={"LAYERDIFF_THREADS": threads},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "tiny.py.threads").read_text() == threads  # what build() saw
    words = "1 thread" if threads == "1" else f"{threads} threads"
    assert json.loads(report.read_text())["target"]["detail"].endswith(f", {words}")


def test_an_unset_or_empty_cap_leaves_each_runtime_its_default(tmp_path):
    model = tmp_path / "tiny.py"
    model.write_text(BUILDER)
    report = tmp_path / "report.json"
    r = run_cli(
        "torch", f"{model}:build", "--json", str(report), "--quiet",
        env={"LAYERDIFF_THREADS": ""},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "thread" not in json.loads(report.read_text())["target"]["detail"]


@pytest.mark.parametrize("value", ["0", "all", "-2"])
def test_a_cap_that_is_not_a_number_of_threads_is_refused_before_any_work(tmp_path, value):
    report = tmp_path / "report.json"
    r = run_cli("torch", "resnet18", "--json", str(report), env={"LAYERDIFF_THREADS": value})
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        f"error: LAYERDIFF_THREADS is `{value}`: give the number of threads each run's kernels "
        "may use, 1 or more"
    )
    assert "Traceback" not in r.stderr
    assert not report.exists()
