"""What a run says while it works, read as a CI log reads it (stderr a pipe): a line per phase and
a line at least every heartbeat (10 s; shorter here through `LAYERDIFF_HEARTBEAT`) while a phase
lasts, with no ANSI codes; nothing with --quiet; and, within a second of Ctrl-C, whatever the run
is in the middle of, `stopping…`, then last what the run left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from conftest import run_cli

EXE = Path(sys.executable).parent / "layerdiff"


def _run_timed(args, cwd, env, signal_when=None):
    """Runs the command with stderr piped; returns (exit code, [(seconds, line)] of stderr,
    the moment the signal was sent). `signal_when(line)`: send SIGINT half a second after the
    first line it accepts."""
    process = subprocess.Popen(
        [str(EXE), *args], cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    lines, sent = [], []
    start = time.monotonic()

    def read():
        for line in process.stderr:
            lines.append((time.monotonic() - start, line.rstrip("\n")))
            if signal_when is not None and not sent and signal_when(line):
                time.sleep(0.5)
                sent.append(time.monotonic() - start)
                process.send_signal(signal.SIGINT)

    reader = threading.Thread(target=read)
    reader.start()
    process.wait(timeout=300)
    reader.join()
    return process.returncode, lines, sent[0] if sent else None


def test_a_piped_run_says_each_phase_and_at_least_every_heartbeat_without_ansi(tmp_path):
    env = {**os.environ, "LAYERDIFF_HEARTBEAT": "0.5"}
    code, lines, _ = _run_timed(["torch", "resnet18", "--no-cache"], tmp_path, env)
    assert code == 0, lines
    text = "\n".join(line for _, line in lines)
    assert "\x1b" not in text and "\r" not in text, text
    # a line per phase, each with the time since the start
    for phase in ["building resnet18", "exporting to ONNX", "running PyTorch and the ONNX model"]:
        assert any(phase in line and line.startswith("[") for _, line in lines), (phase, text)
    # the export is one call of several seconds: the heartbeat names it meanwhile
    assert any("still exporting to ONNX" in line for _, line in lines), text
    # no silence longer than a heartbeat and a margin, once the command's core is loaded
    times = [t for t, line in lines if line.startswith("[")]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert max(gaps) < 2.5, (gaps, text)
    for verb in ("torch", "check"):  # every verb with --quiet
        quiet = run_cli(verb, "resnet18", "--quiet", cwd=tmp_path, env=env)
        assert quiet.returncode == 0 and quiet.stderr == "", (verb, quiet.stderr)


def test_ctrl_c_during_an_export_says_stopping_within_a_second_and_leaves_nothing(tmp_path):
    """The export runs in PyTorch's C++ code, where no Python exception lands until it returns:
    the `stopping…` line comes from the signal handler itself. The folder the run made goes."""
    code, lines, sent = _run_timed(
        ["torch", "resnet18", "--no-cache", "--out", "D"], tmp_path, os.environ,
        signal_when=lambda line: "exporting to ONNX" in line,
    )  # fmt: skip
    text = "\n".join(line for _, line in lines)
    assert sent is not None, text
    assert code == 130, text
    stopping = [t for t, line in lines if line.startswith("stopping")]
    assert stopping and stopping[0] - sent < 1.0, (sent, lines)
    assert lines[-1][1] == (
        "interrupted by SIGINT (Ctrl-C): no report written; removed D, which the run had made"
    ), text
    assert not (tmp_path / "D").exists()
    assert "Traceback" not in text
