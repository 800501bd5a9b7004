"""`layerdiff sweep`: models × targets (× precisions × batch sizes), each a `layerdiff torch`
run of its own, here or as Ray tasks, and one index of their verdicts that does not depend on
where they ran. A run whose process dies is tried once more; nothing else is lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

TWICE = "tests/builders/twice.py:build"
SMALL = [TWICE, "tests/builders/edited_files.py:build"]


def _index(folder: Path) -> dict:
    return json.loads((folder / "index.json").read_text())


def test_a_sweep_writes_one_index_whose_rows_are_their_runs_reports(tmp_path):
    out = tmp_path / "sweep"
    run = run_cli("sweep", ",".join(SMALL), "--targets", "ort,torch:bf16", "--out", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    rows = _index(out)["rows"]
    assert [(r["model"], r["target"]) for r in rows] == [
        (m, t) for m in SMALL for t in ("ort", "torch:bf16")
    ]
    for row in rows:
        assert row["status"] == "compared" and row["exit"] == 0, row
        report = json.loads((out / row["json"]).read_text())
        assert row["verdict"] == report["summary"]["verdict"], row
        assert row["defects"] == len(report["summary"]["defects"]), row
        assert row["headline"].startswith(f"{row['model']}: "), row
        assert (out / row["report"]).is_file(), row
        assert row["command"].startswith("layerdiff torch "), row
    page = (out / "index.html").read_text()
    assert all(f'<a href="{r["report"]}">page</a>' in page for r in rows)
    assert run.stdout.startswith("sweep: 4 run(s): 4 compared (0 failing"), run.stdout
    # each run's export stays in the export cache, not in the sweep's folder
    assert not list(out.rglob("*.onnx"))


def test_a_run_that_cannot_run_is_a_row_saying_why_and_fails_the_sweep(tmp_path):
    """int8 quantizes an ONNX file: with a PyTorch target the run refuses it (exit 2), and the
    row says why; the ONNX target's run compares."""
    out = tmp_path / "sweep"
    run = run_cli("sweep", TWICE, "--targets", "ort,torch", "--dtypes", "int8", "--out", str(out))
    assert run.returncode == 1, run.stdout + run.stderr
    ort, torch_row = _index(out)["rows"]
    assert ort["status"] == "compared" and ort["dtype"] == "int8", ort
    assert torch_row["status"] == "could_not_run" and torch_row["exit"] == 2, torch_row
    assert "int8" in torch_row["error"], torch_row
    assert "could not run: " in run.stdout


@pytest.mark.parametrize(
    "option, said",
    [
        (("--dtypes", "fp8"), "unknown precision `fp8` (expected fp32, fp16, bf16 or int8)"),
        (("--batch-sizes", "0"), "`0` is not a size above zero"),
        (("--jobs", "0"), "`0` is not a size above zero"),
    ],
)
def test_a_sweep_refuses_what_it_cannot_run_before_it_starts(tmp_path, option, said):
    run = run_cli("sweep", TWICE, *option, "--out", str(tmp_path / "s"))
    assert run.returncode == 2
    assert said in run.stderr, run.stderr
    assert not (tmp_path / "s").exists()


def test_a_batch_size_s_row_says_what_was_found_there(tmp_path):
    out = tmp_path / "sweep"
    run = run_cli("sweep", TWICE, "--batch-sizes", "2", "--out", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    (row,) = _index(out)["rows"]
    assert row["batch"] == 2 and row["json"].endswith("/batch-2/report.json"), row
    assert row["headline"].startswith(f"{TWICE} along the batch size: batch size 2: no drift"), row
    assert "(batch 2)" in run.stderr


def _sweep(out: Path, *args: str) -> subprocess.Popen:
    """`layerdiff sweep` started, as a user's shell starts it."""
    command = [sys.executable, "-m", "layerdiff", "sweep", *args, "--out", str(out), "--quiet"]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _run_of(sweep: subprocess.Popen, model: str, timeout: float = 120) -> int:
    """The pid of the `layerdiff torch MODEL` process `sweep` started, once it runs (not
    another test's run of the same model)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                if b"torch" in argv and model.encode() in argv and _descends(entry, sweep.pid):
                    return int(entry.name)
            except (OSError, ValueError, StopIteration):
                continue
        time.sleep(0.02)
    raise AssertionError(f"no run of {model} started")


def _parent(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("PPid:")).split()[1])


def _descends(entry: Path, ancestor: int) -> bool:
    """Whether the process `entry` (/proc/PID) descends from `ancestor` (a Ray worker's run
    descends from the local Ray instance the sweep started)."""
    pid = int(entry.name)
    while pid > 1:
        pid = _parent(pid)
        if pid == ancestor:
            return True
    return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the run's process in /proc")
def test_a_run_killed_mid_sweep_is_tried_once_more_and_the_rest_go_on(tmp_path):
    out = tmp_path / "sweep"
    sweep = _sweep(out, f"{TWICE},resnet18", "--targets", "ort", "--jobs", "2")
    os.kill(_run_of(sweep, "resnet18"), signal.SIGKILL)
    _, err = sweep.communicate(timeout=600)
    assert sweep.returncode == 0, err.decode()
    twice, resnet = _index(out)["rows"]
    assert twice["status"] == "compared" and "retried" not in twice, twice
    assert resnet["status"] == "compared" and resnet["retried"] == "killed by SIGKILL", resnet
    assert (out / resnet["json"]).is_file()
    assert "(tried again: killed by SIGKILL)" in (out / "index.md").read_text()


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the run's process in /proc")
def test_a_sweep_stopped_keeps_the_runs_that_ended_and_says_which_did_not(tmp_path):
    """Ctrl-C while the second run is under way: that run stops, the first one's reports stay
    (they are reports, not what a stopped run leaves behind), and the index says which ran."""
    out = tmp_path / "sweep"
    sweep = _sweep(out, f"{TWICE},resnet18", "--targets", "ort", "--jobs", "1")
    run = _run_of(sweep, "resnet18")
    sweep.send_signal(signal.SIGINT)
    _, err = sweep.communicate(timeout=300)
    assert sweep.returncode == 130, err.decode()
    index = _index(out)
    assert index["incomplete"] == "interrupted by SIGINT", index
    twice, resnet = index["rows"]
    assert twice["status"] == "compared" and (out / twice["json"]).is_file(), twice
    assert (out / twice["report"]).is_file(), twice
    assert resnet["status"] == "not_run" and "json" not in resnet, resnet
    assert not Path(f"/proc/{run}").exists() or _state(run) == "Z", "the run under way stopped"
    assert "INCOMPLETE: interrupted by SIGINT, 1 not run" in (out / "index.md").read_text()
    said = err.decode().strip().splitlines()[-1]
    assert "marked INCOMPLETE: " in said and "index.json" in said, said
    assert "report.json" not in said.split("; kept")[0], "only the index is incomplete"
    assert "; kept 6 report file(s) written whole before it" in said, said


def _state(pid: int) -> str:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(line for line in status.splitlines() if line.startswith("State:")).split()[1]


@pytest.mark.thorough  # Ray starts in seconds; the local executor's tests cover the index
def test_a_sweep_on_ray_writes_the_index_a_local_one_does(tmp_path):
    args = (",".join(SMALL), "--targets", "ort,torch:bf16")
    local, ray = tmp_path / "local", tmp_path / "ray"
    assert run_cli("sweep", *args, "--out", str(local)).returncode == 0
    run = run_cli("sweep", *args, "--executor", "ray", "--out", str(ray))
    assert run.returncode == 0, run.stdout + run.stderr
    assert _index(ray)["rows"] == _index(local)["rows"]
    for row in _index(ray)["rows"]:
        assert (ray / row["json"]).read_bytes() == (local / row["json"]).read_bytes(), row


@pytest.mark.thorough
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the run's process in /proc")
def test_a_ray_worker_killed_mid_sweep_is_tried_once_more(tmp_path):
    out = tmp_path / "sweep"
    sweep = _sweep(out, f"{TWICE},resnet18", "--targets", "ort", "--executor", "ray")
    run = _run_of(sweep, "resnet18", timeout=300)
    os.kill(_parent(run), signal.SIGKILL)  # the Ray worker that started the run
    _, err = sweep.communicate(timeout=600)
    assert sweep.returncode == 0, err.decode()
    twice, resnet = _index(out)["rows"]
    assert twice["status"] == "compared", twice
    assert resnet["status"] == "compared", resnet
    assert resnet["retried"].startswith("its worker died: "), resnet
