"""`layerdiff sweep`: every model against every target (in every precision, at every batch
size asked), each a `layerdiff torch` run in a process of its own, here or as a Ray task
(`layerdiff._executor`), and one index of their verdicts (`layerdiff_flow::verbs::sweep`).

A run's reports travel back with its result, whatever machine it ran on, and are written under
the sweep's folder by this process: the index depends on the runs' reports alone. A run whose
process dies (killed, out of memory, its Ray worker or node lost) is tried once more, then
listed as failed with how it died; the other runs go on.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from layerdiff import _layerdiff
from layerdiff._executor import each

# A run's process (Linux): killed when the worker that started it dies (PR_SET_PDEATHSIG, kept
# across exec), so a worker killed mid-run leaves no run behind; then `layerdiff ARGS`.
_LAUNCH = (
    "import ctypes, os, sys\n"
    "try:\n"
    "    ctypes.CDLL(None).prctl(1, 9)\n"
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(137)\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'layerdiff', *sys.argv[2:]])\n"
)
# the runs under way in this process (the local executor's), stopped with the sweep
_RUNNING: set[subprocess.Popen] = set()
# files of a run that do not travel back: the export (the cache keeps it; the run's command
# makes it again) and its external weights
_LEFT = (".onnx", ".data", ".onnx_data")


def run_command(command: _layerdiff.SweepCommand, progress) -> int:
    """Runs the sweep the command line asked for; returns its exit code."""
    tasks = plan(command)
    jobs = command.jobs or max(1, (os.cpu_count() or 1) // 2)
    # each run's share of the cores, unless LAYERDIFF_THREADS says how many
    given = os.environ.get("LAYERDIFF_THREADS", "")
    threads = int(given) if given.isdigit() and int(given) > 0 else None
    threads = threads or max(1, (os.cpu_count() or 1) // min(jobs, len(tasks)))
    for task in tasks:
        task["threads"] = threads
    rows: list[dict | None] = [None] * len(tasks)
    try:
        _sweep(command, tasks, jobs, threads, rows, progress)
    except KeyboardInterrupt as stopped:
        # the runs under way stop too (each writes its report marked incomplete), and the
        # index says which ended; then the command ends as a stopped one does
        for running in list(_RUNNING):
            running.terminate()
        signum = stopped.args[0] if stopped.args and isinstance(stopped.args[0], int) else 2
        incomplete = f"interrupted by {signal.Signals(signum).name}"
        rows = [row or _not_run(task) for row, task in zip(rows, tasks, strict=True)]
        index = {"schema": "layerdiff.sweep/1", "rows": rows, "incomplete": incomplete}
        _layerdiff.deliver_sweep(command, json.dumps(index))
        raise
    index = {"schema": "layerdiff.sweep/1", "rows": rows}
    return _layerdiff.deliver_sweep(command, json.dumps(index))


def _sweep(command, tasks: list[dict], jobs: int, threads: int, rows: list, progress) -> None:
    """Runs `tasks`, each tried once more where its process died, into `rows` as they end."""
    tried = [0] * len(tasks)
    died: dict[int, str] = {}
    todo = list(range(len(tasks)))
    while todo:
        again = []
        items = [tasks[i] for i in todo]
        ran = each(command.executor, jobs, run_task, items, cpus=threads, gpus=_gpus)
        for k, result, error in ran:
            i = todo[k]
            tried[i] += 1
            how = _death(result, error)
            if how is not None and tried[i] < 2:
                died[i] = how
                again.append(i)
                progress(f"run {i + 1} of {len(tasks)} died ({how}): trying it once more")
                continue
            rows[i] = _row(tasks[i], result, how, command.out, died.get(i))
            done = sum(r is not None for r in rows)
            progress(f"{done} of {len(tasks)} runs: {_said(rows[i])}")
        todo = again


def plan(command) -> list[dict]:
    """The runs, in order: each model against each target, in each precision, at each batch
    size; with the command line that makes it and the folder its reports go to."""
    dtypes = list(command.dtypes) or [None]
    batches = list(command.batch_sizes) or [None]
    tasks, names = [], set()
    for model in command.models:
        given = _absolute(model)
        for target in command.targets:
            for dtype in dtypes:
                for batch in batches:
                    argv = ["torch", given, "--target", target, "--seed", str(command.seed)]
                    argv += ["--dtype", dtype] if dtype else []
                    argv += ["--batch-sizes", str(batch)] if batch else []
                    argv += ["--fail-on", command.fail_on]
                    name = _folder(model, target, dtype, batch, names)
                    tasks.append({
                        "model": model, "given": given, "target": target, "dtype": dtype,
                        "batch": batch, "argv": argv, "folder": f"runs/{name}",
                    })  # fmt: skip
    return tasks


def run_task(task: dict) -> dict:
    """One run, in a process of its own (`layerdiff torch …`, its threads the task's share):
    its exit code (negative: the signal that killed it), its headline, its last error line and
    its reports' bytes by path."""
    with tempfile.TemporaryDirectory(prefix="layerdiff-sweep-") as folder:
        env = {**os.environ, "LAYERDIFF_THREADS": str(task["threads"])}
        # in a folder of its own, its reports in `run/`: what they record of where they were
        # written is the same for every run (the model's paths are absolute)
        done = subprocess.Popen(
            [sys.executable, "-c", _LAUNCH, str(os.getpid()), *task["argv"], "--out", "run"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=folder,
        )  # fmt: skip
        _RUNNING.add(done)
        try:
            stdout, stderr = done.communicate()
        finally:
            _RUNNING.discard(done)
        run = Path(folder) / "run"
        files = {
            str(p.relative_to(run)): p.read_bytes()
            for p in sorted(run.rglob("*"))
            if p.is_file() and not p.name.endswith(_LEFT)
        }
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    return {
        "exit": done.returncode,
        "headline": _headline(stdout),
        "error": errors[-1].removeprefix("error: ") if errors else None,
        "files": files,
    }


def _headline(printed: str) -> str | None:
    """A run's headline: the first line it printed; along an axis (a batch size), that line
    names the axis and the next one says what was found there."""
    lines = printed.splitlines()
    if len(lines) > 1 and lines[0].endswith(":"):
        return f"{lines[0]} {lines[1].strip()}"
    return next(iter(lines), None)


def _gpus(task: dict) -> int:
    """The GPUs a run holds on a cluster: one where its target names CUDA."""
    return int("cuda" in task["target"])


def _death(result: dict | None, error: BaseException | None) -> str | None:
    """How a run's process died, in words; `None` where it ended by itself (0, 1 or 2)."""
    if error is not None:
        return f"its worker died: {type(error).__name__}: {str(error).splitlines()[0]}"
    code = result["exit"]
    if code in (0, 1, 2):
        return None
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit {code}"


def _row(task: dict, result: dict | None, died: str | None, out: Path, retried) -> dict:
    """The index's row of a run, its reports written under `out`."""
    command = "layerdiff " + shlex.join(task["argv"])
    row = {
        "model": task["model"], "target": task["target"], "dtype": task["dtype"],
        "batch": task["batch"], "command": command, "retried": retried, "defects": 0,
    }  # fmt: skip
    if died is not None:
        return {**row, "status": "failed", "exit": None, "error": died}
    row["folder"] = task["folder"]
    folder = Path(out) / task["folder"]
    for name, data in result["files"].items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    found = sorted(n for n in result["files"] if Path(n).name == "report.json")
    if result["exit"] == 2 or not found:
        why = result["error"] or f"exit {result['exit']} without a report"
        return {**row, "status": "could_not_run", "exit": result["exit"], "error": why}
    report = found[0]  # a batch size's report sits in batch-N/
    summary = json.loads(result["files"][report])["summary"]
    headline = result["headline"] or ""
    if headline.startswith(task["given"]):  # the model as the sweep was given it
        headline = task["model"] + headline[len(task["given"]) :]
    page = str(Path(report).with_suffix(".html"))
    return {
        **row, "status": "compared", "exit": result["exit"], "verdict": summary["verdict"],
        "defects": len(summary["defects"]), "headline": headline or None,
        "report": f"{task['folder']}/{page}" if page in result["files"] else None,
        "json": f"{task['folder']}/{report}",
    }  # fmt: skip


def _not_run(task: dict) -> dict:
    """The row of a run the sweep was stopped before it ended."""
    command = "layerdiff " + shlex.join(task["argv"])
    return {
        "model": task["model"], "target": task["target"], "dtype": task["dtype"],
        "batch": task["batch"], "command": command, "status": "not_run", "exit": None,
        "defects": 0,
    }  # fmt: skip


def _said(row: dict) -> str:
    """A finished run in a progress line."""
    point = ", ".join(p for p in (row["dtype"], row["batch"] and f"batch {row['batch']}") if p)
    what = f"{row['model']} · {row['target']}" + (f" ({point})" if point else "")
    if row["status"] == "compared":
        return f"{what}: {row['verdict']}"
    return f"{what}: {row['status'].replace('_', ' ')} ({row['error']})"


def _absolute(model: str) -> str:
    """A builder's file or a checkpoint folder as an absolute path (a run's process may start
    elsewhere); a built-in name or a package's builder as given."""
    file, colon, function = model.rpartition(":")
    if colon and Path(file).is_file():
        return f"{Path(file).resolve()}:{function}"
    if Path(model).exists():
        return str(Path(model).resolve())
    return model


def _folder(model: str, target: str, dtype, batch, taken: set) -> str:
    """A folder name for a run, unique in the sweep (`resnet18--ort-opt=all--fp16--batch-8`,
    `zoo-resnet18_160--ort` for the builder `tests/builders/zoo.py:resnet18_160`)."""
    file, colon, function = model.rpartition(":")
    if colon and file.endswith(".py"):
        stem = f"{Path(file).stem}-{function}"
    else:
        stem = Path(model).name or model
    parts = [stem, target, dtype, batch and f"batch-{batch}"]
    name = re.sub(r"[^A-Za-z0-9._=-]+", "-", "--".join(str(p) for p in parts if p))
    unique, n = name, 1
    while unique in taken:
        n += 1
        unique = f"{name}-{n}"
    taken.add(unique)
    return unique
