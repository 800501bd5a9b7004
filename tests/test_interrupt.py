"""Ctrl-C and SIGTERM at random moments of real runs: never a truncated report, never a
traceback; either nothing written, or a whole report, marked incomplete when the run stopped
before its last layer, whose layers are the full run's own; the exit code is 128 + the signal's
number (or, before the command's handlers are in place, the process ended by the signal)."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import THOROUGH

EXE = Path(sys.executable).parent / "layerdiff"
# Random moments per run: `make test` tries a few of each kind, `make test-all` (CI) many.
MOMENTS = 20 if THOROUGH else 6
TORCH_MOMENTS = 6 if THOROUGH else 3


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [str(EXE), *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _layers(report: dict) -> list[tuple]:
    return [
        (layer["name"], layer["status"], layer["accumulated"], layer["local"])
        for layer in report["layers"]
    ]


def _full(args: list[str], folder: Path) -> tuple[list[str], dict, float]:
    """The uninterrupted run: its arguments, its report, and how long it took warm (the faster
    of two runs: the first pays for cold caches, and moments spread over it miss the run)."""
    took = []
    for _ in range(2):
        started = time.monotonic()
        done = subprocess.run([str(EXE), *args], cwd=folder, capture_output=True, text=True)
        took.append(time.monotonic() - started)
        assert done.returncode in (0, 1), done.stderr
    return args, json.loads((folder / "r.json").read_text()), min(took)


REPORTS = ["--json", "r.json", "--markdown", "r.md", "--html", "r.html", "--out", "D"]


@pytest.fixture(scope="module")
def full_run(resnet18_onnx, tmp_path_factory):
    """`layerdiff onnx` of ResNet-18 against ONNX Runtime's optimized graph."""
    model = resnet18_onnx["dynamo"]
    args = ["onnx", str(model), "--target", "ort:cpu:opt=all", *REPORTS]
    return _full(args, tmp_path_factory.mktemp("full"))


def test_a_run_killed_at_random_moments_leaves_no_truncated_report(full_run, tmp_path):
    seen = _kill_at_random(*full_run, MOMENTS, random.Random(31), tmp_path)
    # the moments reached the run itself, not only its start-up
    assert seen["incomplete"] + seen["whole"] >= 1, seen


def test_a_pytorch_run_killed_at_random_moments_too(tmp_path_factory, tmp_path):
    # the first run exports (into the test session's cache): the killed ones use the export
    full = _full(["torch", "resnet18", *REPORTS], tmp_path_factory.mktemp("full_torch"))
    _kill_at_random(*full, TORCH_MOMENTS, random.Random(7), tmp_path)


def _kill_at_random(args, full, took, moments, rng, tmp_path) -> dict:
    """Runs `args` `moments` times, each sent SIGINT or SIGTERM at a random moment of the
    time the full run `took`; checks what each leaves; returns how many ended which way."""
    seen = {"nothing": 0, "incomplete": 0, "whole": 0, "finished first": 0}
    for moment in range(moments):
        signum = (signal.SIGINT, signal.SIGTERM)[moment % 2]
        # Python's own start-up comes before any handler of the command's: Ctrl-C there is a
        # KeyboardInterrupt of the interpreter's (SIGTERM simply ends it, as tested here)
        earliest = 0.3 if signum == signal.SIGINT else 0.0
        # one moment in each of `moments` equal stretches of the run, at random within it: the
        # late stretches, where layers are compared, are always tried (a faster run's are short)
        stretch = (took * 1.1 - earliest) / moments
        delay = earliest + stretch * (moment + rng.random())
        folder = tmp_path / f"run{moment}"
        folder.mkdir()
        process = _start(args, folder)
        time.sleep(delay)
        finished_first = process.poll() is not None
        if not finished_first:
            process.send_signal(signum)
        out, err = process.communicate(timeout=120)
        what = f"{signum.name} at {delay:.2f}s: exit {process.returncode}\n{err}"
        assert "Traceback" not in err and "panicked" not in err, what
        left = sorted(p.name for p in folder.iterdir())
        assert not [n for n in left if n.endswith(".partial")], (what, left)
        # a signal that lands as the process ends, its work done, changes nothing: the run
        # finished, and its reports are the full run's
        finished_first = finished_first or process.returncode in (0, 1)
        if finished_first:
            seen["finished first"] += 1
            assert process.returncode in (0, 1), what
            assert _layers(json.loads((folder / "r.json").read_text())) == _layers(full), what
            continue
        assert process.returncode in (128 + signum, -signum), what
        out_folder = folder / "D"
        if process.returncode == 128 + signum:  # the command's handlers had it
            said = err.strip().splitlines()
            assert any(line.startswith("stopping") for line in said), what
            assert said[-1].startswith(f"interrupted by {signum.name}"), what
        if not (folder / "r.json").exists():
            seen["nothing"] += 1
            assert not [n for n in left if n.startswith("r.")], (what, left)
            # nothing the run made stays: no export in D, no empty D
            assert not out_folder.exists(), (what, sorted(p.name for p in out_folder.iterdir()))
            if process.returncode == 128 + signum:
                assert "no report written" in said[-1], what
            continue
        report = json.loads((folder / "r.json").read_text())
        summary = report["summary"]
        assert summary["layers_total"] == len(report["layers"]), what
        for name in ("r.md", "r.html"):
            text = (folder / name).read_text()
            assert text.endswith("\n") and len(text) > 200, (what, name)
        assert (folder / "r.html").read_text().rstrip().endswith("</html>"), what
        # whatever was compared is what the full run compared, value for value
        assert _layers(report) == _layers(full)[: len(report["layers"])], what
        if "incomplete" in summary:
            seen["incomplete"] += 1
            assert len(report["layers"]) < len(full["layers"]), what
            assert "interrupted by" in summary["incomplete"], what
            assert summary["verdict"] != "no_drift", what
            # every report a person reads says so first
            assert out.startswith("INCOMPLETE: "), (what, out[:200])
            assert (folder / "r.md").read_text().startswith("# INCOMPLETE: "), what
            assert "<title>INCOMPLETE: " in (folder / "r.html").read_text()[:300], what
            assert "marked INCOMPLETE" in err.strip().splitlines()[-1], what
            # D holds its reports (those --json and the like did not send elsewhere) and nothing
            # else the run made
            left_in_d = {p.name for p in out_folder.iterdir()}
            assert left_in_d == {"report.svg", "report.node-data.json"}, (what, left_in_d)
        else:
            seen["whole"] += 1
            assert _layers(report) == _layers(full), what
    print(seen)
    return seen


def test_a_second_signal_ends_the_run_at_once(full_run, tmp_path):
    args, _, took = full_run
    process = _start(args, tmp_path)
    time.sleep(min(0.8, took / 2))
    if process.poll() is not None:
        pytest.skip("the run finished before the signal")
    process.send_signal(signal.SIGINT)
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=60)
    assert process.returncode in (130, -signal.SIGINT)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_any_import_lands_after_it(signum, tmp_path):
    """Imports run Python from C++ (PyTorch's pybind11, Triton's nanobind): a KeyboardInterrupt
    raised in there cannot cross back, and the process aborted (`terminate called after
    throwing an instance of 'nanobind::python_error'`, exit -6; CI's random-moment test met it
    in the `import torchvision` that building resnet18 makes, long after PyTorch's own import).
    A signal that arrives during any import the command makes is raised once the outermost
    import is done: the command then exits as interrupted, 128 + the signal."""
    (tmp_path / "model_zoo.py").write_text(
        f"import os\nos.kill(os.getpid(), {int(signum)})\nimport torchvision  # the abort's\n"
    )
    script = (
        "import sys\n"
        "from layerdiff import _cli\n"
        "_cli._catch_interrupts()\n"
        "def build():\n"
        "    import model_zoo  # as a builder imports its library, inside a function\n"
        "try:\n"
        "    build()\n"
        "    print('not interrupted', flush=True)\n"
        "except KeyboardInterrupt as e:\n"
        "    print(sorted(m for m in ('model_zoo', 'torchvision') if m in sys.modules))\n"
        "    sys.exit(_cli._interrupted(e))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.stdout == "['model_zoo', 'torchvision']\n", done.stdout + done.stderr
    assert done.returncode == 128 + signum, done.stderr
    assert "terminate called" not in done.stderr and "Traceback" not in done.stderr


def test_the_command_catches_ctrl_c_before_any_heavy_import():
    """The command's handlers go in as it starts, once the package is imported: a Ctrl-C in
    that window is Python's own (a KeyboardInterrupt traceback; the random-moment test met one
    while the package imported NumPy at 0.3 s on a loaded machine). Importing the command
    imports no NumPy, PyTorch, ONNX or TensorFlow, so the window is the interpreter's start."""
    script = (
        "import sys\n"
        "from layerdiff._cli import run\n"
        "heavy = ('numpy', 'torch', 'onnx', 'tensorflow', 'openvino')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.stdout == "[]\n", done.stdout + done.stderr
