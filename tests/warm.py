"""`layerdiff` commands for the tests, each in a process of its own that starts warm.

Most of a test's command was the interpreter starting and importing PyTorch, torchvision and the
exporter (7 s of a ResNet-18 run's 9 on a 2-core machine, a few hundred commands in `make test`).
This server imports them once, with no Python thread running, then forks a child per command.
The child is the command's own process (its pid, signals, exit code, file descriptors, working
folder and environment) and runs the installed `layerdiff` script's entry point,
`layerdiff._cli.run`, which ends the process itself. layerdiff's own modules are not imported
here: each command imports them afresh, under its own environment.

Protocol, one JSON object a line. The request, on stdin: `exe` (the script it stands for),
`args`, `cwd`, `env`, the `stdout` and `stderr` files, `timeout`. The answer, on stdout: `rc`
(as subprocess gives it: -N for a signal) and `timed_out`.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import threading
import time


def _warm(modules: list[str]) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional framework this machine lacks: the command says so
            pass


def _child(request: dict) -> None:
    """Becomes the command's process; never returns."""
    try:
        os.setpgid(0, 0)  # a timeout ends the command and whatever it started
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        stdin = os.open(os.devnull, os.O_RDONLY)
        out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        for fd, target in ((stdin, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        sys.argv = [request["exe"], *request["args"]]
        sys.path[0] = os.path.dirname(request["exe"])  # as the installed script's process has it
        given = request["env"].get("PYTHONPATH", "").split(os.pathsep)
        sys.path[1:1] = [p for p in given if p and p not in sys.path]  # as the interpreter adds it
        from layerdiff._cli import run

        run()  # ends the process
    except BaseException:  # noqa: BLE001 - the server must never continue in the child
        import traceback

        traceback.print_exc()
    finally:
        os._exit(70)


def _wait(pid: int, timeout: float) -> tuple[int, bool]:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), False
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status), True
        time.sleep(0.01)


def serve(modules: list[str]) -> None:
    _warm(modules)
    answers = sys.stdout
    # Python threads a fork would not copy (OpenBLAS's native pool stops for a fork and starts
    # again in the child: it is made for it)
    answers.write(json.dumps({"ready": True, "threads": threading.active_count()}) + "\n")
    answers.flush()
    for line in sys.stdin:
        request = json.loads(line)
        sys.stderr.flush()  # the answers are flushed as written: the child inherits no buffer
        pid = os.fork()
        if pid == 0:
            _child(request)
        rc, timed_out = _wait(pid, request["timeout"])
        answers.write(json.dumps({"rc": rc, "timed_out": timed_out}) + "\n")
        answers.flush()


if __name__ == "__main__":
    serve(sys.argv[1:])
