"""The `layerdiff` console command. Parsing is the Rust parser's (same help, errors and exit
codes as the Rust binary); this module runs the verbs that need PyTorch."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

from layerdiff import _layerdiff, _ort

_IMPORTED = time.perf_counter()


class _Progress:
    """Step lines with elapsed time on stderr; silent with --quiet. Each step is also where a
    Ctrl-C or SIGTERM that Python code swallowed (a library's C code can clear the
    KeyboardInterrupt it raised) still stops the run: the command's handler keeps it."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.start = time.monotonic()

    def __call__(self, message: str) -> None:
        if _layerdiff.interrupt_signal()[0] is not None:
            raise KeyboardInterrupt
        if not self.quiet:
            print(
                f"[{time.monotonic() - self.start:6.1f}s] {message}…", file=sys.stderr, flush=True
            )


def main(argv: list[str] | None = None) -> int:
    args = ["layerdiff", *(sys.argv[1:] if argv is None else argv)]
    try:
        kind, value = _layerdiff.parse_cli(args, _ort.library())
        if kind == "exit":
            return int(value)
        return _run(kind, value)
    except _layerdiff.LayerdiffError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # a bug in layerdiff, not a user mistake: short message, no traceback
        if os.environ.get("LAYERDIFF_DEBUG"):
            raise
        print(f"error: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        print(
            "hint: rerun with LAYERDIFF_DEBUG=1 for the traceback, and please report it",
            file=sys.stderr,
        )
        return 2


def _process_age() -> float:
    """Seconds since this process started (from /proc on Linux; elsewhere, since this module
    was imported, which leaves out the interpreter's own start)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the name may hold spaces
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _IMPORTED


def _run(verb: str, command) -> int:
    """Runs `layerdiff torch`, `grad`, `keras` or `ops` as parsed (a `Command`, an
    `OpsCommand`); the outputs are written and printed by the same Rust functions as the ONNX
    verbs'."""
    if verb == "keras":
        return _keras(command)
    try:
        with _signals_deferred():  # PyTorch's import runs Python from C++: see there
            from layerdiff import torch as lt
    except ImportError as e:
        if (e.name or "").split(".")[0] == "layerdiff":  # our own package is broken, not missing
            raise _layerdiff.UsageError(
                f"`layerdiff {verb}` cannot load layerdiff's PyTorch adapter: {e}\n"
                "hint: the package and its core do not match; reinstall layerdiff"
            ) from e
        raise _layerdiff.UsageError(
            f"`layerdiff {verb}` needs PyTorch ({e.name or e} is missing)\n"
            "hint: pip install 'layerdiff[torch]'"
        ) from e

    if verb == "reduce":
        return _reduce(command)
    if verb == "zoo":
        from layerdiff.torch.models import zoo_text

        sys.stdout.write(zoo_text())
        return 0
    progress = _Progress(command.quiet)
    if verb == "check":
        from layerdiff.torch import _check

        return _check.run_command(command, progress)
    if verb == "ops":
        from layerdiff.torch import _ops

        return _ops.run_command(command, progress)
    # The options' rules (--dtype, --keep-fp32, --onnx against the target) were kept in Rust
    # when the command line was parsed.
    pytorch_target = command.options.torch_target is not None

    started = time.perf_counter()
    # Before this point: the interpreter's start-up and the imports (PyTorch's above all).
    start_up = [("start-up: interpreter and imports", "pytorch", _process_age())]
    builder = lt.load_builder(command.model)
    progress(f"building {command.model} (seed {command.seed})")
    model, inputs = builder(command.seed)
    built = [*start_up, ("building the model", "pytorch", time.perf_counter() - started)]
    common = {
        "name": command.model,
        "seed": command.seed,
        "timings": built if command.timings else False,
        "options": command.options,
    }
    if verb == "torch" and (command.batch_sizes or command.shapes):
        return _along_axis(lt, command, model, inputs, progress)
    if verb == "grad":
        from layerdiff.torch._grad import compare_gradients

        report = compare_gradients(model, inputs, loss=command.loss, progress=progress, **common)
        if command.repro is not None:
            report.notes.append(_grad_repro(model, inputs, report, command)[0])
    elif pytorch_target:
        report = lt.compare_torch(
            model, inputs, progress=progress, keep_fp32=command.keep_fp32,
            bisect=command.bisect, **common,
        )  # fmt: skip
        if command.repro is not None:
            report.notes.append(_torch_repro(model, inputs, report, command)[0])
    else:
        with tempfile.TemporaryDirectory() as kept:
            # A repro is cut from the file compared: keep the export until it is written.
            workdir = command.out or (kept if command.repro is not None else None)
            report = lt.compare_torch_onnx(
                model,
                inputs,
                onnx=command.onnx,
                exporter=command.exporter,
                workdir=workdir,
                progress=progress,
                cache=command.cache,
                dtype=command.dtype,
                keep_fp32=command.keep_fp32,
                **common,
            )
            if command.repro is not None:
                report.notes.append(_onnx_repro(model, inputs, report, command)[0])
    return report._native.deliver(command, report.inputs, command.seed, report.notes)


def _onnx_repro(model, inputs, report, command, folder=None) -> tuple[str, bool]:
    """`--repro DIR` of a PyTorch model against its ONNX file: the layer's ONNX nodes fed
    PyTorch's values, run on the target's runtime, checked."""
    from layerdiff.torch._repro import write_onnx_repro

    target = command.options.target_spelling
    return write_onnx_repro(
        model, inputs, report, target, folder or command.repro, command.invocation
    )


def _grad_repro(model, inputs, report, command, folder=None) -> tuple[str, bool]:
    """`--repro DIR` of `layerdiff grad`: the headline gradient's module backward alone."""
    from layerdiff.torch._repro import write_grad_repro
    from layerdiff.torch._sides import TorchSide

    options = command.options
    sides = (TorchSide.of(options.reference), TorchSide.of(options.torch_target))
    return write_grad_repro(
        model, inputs, report, sides, command.loss, command.seed, folder or command.repro,
        command.invocation, builder=command.model,
    )  # fmt: skip


def _torch_repro(model, inputs, report, command, folder=None) -> tuple[str, bool]:
    """`--repro DIR` of a PyTorch target: its headline's module alone, checked."""
    from layerdiff.torch._repro import write_repro
    from layerdiff.torch._sides import TorchSide

    options = command.options
    ref_side, tgt_side = TorchSide.of(options.reference), TorchSide.of(options.torch_target)
    return write_repro(
        model, inputs, report, ref_side, tgt_side, folder or command.repro, command.invocation,
        builder=command.model,
    )  # fmt: skip


def _reduce(plan: dict) -> int:
    """`layerdiff reduce REPORT.json` of a report of `layerdiff torch`: its command run again
    where it ran, and its headline written as a repro (the module alone against a PyTorch
    target; the layer's ONNX nodes fed PyTorch's values against an ONNX one)."""
    if plan["command"] not in ("torch", "grad"):
        raise _layerdiff.UsageError(
            f"`layerdiff reduce` cuts down reports of `layerdiff onnx`, `torch` and `grad`; "
            f"this one is of `layerdiff {plan['command']}`"
        )
    os.chdir(plan["cwd"])
    kind, command = _layerdiff.parse_cli(["layerdiff", *plan["argv"]], _ort.library())
    if kind != plan["command"]:
        raise _layerdiff.UsageError(
            f"the command line the report records does not parse as `layerdiff {plan['command']}` "
            f"any more: "
            f"`{plan['text']}`"
        )
    from layerdiff import torch as lt

    quiet = plan["quiet"]
    progress = _Progress(quiet)
    progress(f"running the report's command again: {plan['text']}")
    model, inputs = lt.load_builder(command.model)(command.seed)
    common = {"name": command.model, "seed": command.seed, "options": command.options}
    if kind == "grad":
        from layerdiff.torch._grad import compare_gradients

        report = compare_gradients(model, inputs, loss=command.loss, progress=progress, **common)
        sentence, reproduced = _grad_repro(model, inputs, report, command, plan["folder"])
    elif command.options.torch_target is not None:
        report = lt.compare_torch(
            model, inputs, progress=progress, keep_fp32=command.keep_fp32, **common
        )
        sentence, reproduced = _torch_repro(model, inputs, report, command, plan["folder"])
    else:
        with tempfile.TemporaryDirectory() as workdir:
            report = lt.compare_torch_onnx(
                model, inputs, onnx=command.onnx, exporter=command.exporter, workdir=workdir,
                progress=progress, dtype=command.dtype, keep_fp32=command.keep_fp32,
                cache=command.cache, **common,
            )  # fmt: skip
            sentence, reproduced = _onnx_repro(model, inputs, report, command, plan["folder"])
    if not quiet:
        print(sentence)
    return 0 if reproduced else 1


def _keras(command) -> int:
    """`layerdiff keras`: TensorFlow's adapter, which only this verb imports."""
    try:
        with _signals_deferred():  # TensorFlow's import runs Python from C++ too
            from layerdiff import keras as lk
    except ImportError as e:
        if (e.name or "").split(".")[0] == "layerdiff":
            raise _layerdiff.UsageError(
                f"`layerdiff keras` cannot load layerdiff's Keras adapter: {e}\n"
                "hint: the package and its core do not match; reinstall layerdiff"
            ) from e
        raise _layerdiff.UsageError(
            f"`layerdiff keras` needs TensorFlow, Keras and tf2onnx ({e.name or e} is missing)\n"
            "hint: pip install 'layerdiff[tf]'"
        ) from e
    return lk.run_command(command, _Progress(command.quiet))


def _along_axis(lt, command, model, inputs, progress) -> int:
    """`layerdiff torch --batch-sizes`/`--shapes`: the axis report, and under `--out` each
    point's reports in its own folder."""
    from layerdiff.torch import _axis
    from layerdiff.torch._running import as_input_tuple

    axis, reports, notes = _axis.compare_along(
        model,
        as_input_tuple(inputs),
        batch_sizes=command.batch_sizes,
        shapes=command.shapes,
        onnx=command.onnx,
        exporter=command.exporter,
        workdir=command.out,
        cache=command.cache,
        seed=command.seed,
        name=command.model,
        options=command.options,
        dtype=command.dtype,
        keep_fp32=command.keep_fp32,
        progress=progress,
    )
    if command.out is not None:
        for label, report in reports:
            folder = Path(command.out) / _axis.slug(axis.axis, label)
            report.write(
                json=folder / "report.json",
                markdown=folder / "report.md",
                html=folder / "report.html",
                svg=folder / "report.svg",
                node_data=folder / "report.node-data.json",
            )
    for label, report in reports:
        notes += [f"{label}: {note}" for note in report.notes]
    return axis.deliver(command, notes)


def run() -> None:
    """The `layerdiff` command itself: `main`, then out of the process at once. Tearing down
    the interpreter with PyTorch, ONNX Runtime and TensorFlow loaded takes 1-2 s after the work
    is done (the native libraries' destructors, their thread pools); the reports are written
    and closed by then, so exit handlers run, the streams are flushed and the process ends."""
    import atexit

    _layerdiff.settle_heap()  # the command's own process only: the API leaves the user's
    _catch_interrupts()
    try:
        code = main()
    except KeyboardInterrupt as e:
        code = _interrupted(e)
    # the work is done and said: a signal now only ends the process with what it was to say
    # (its exit code), not with a traceback from an exit handler
    import signal

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _catch_interrupts() -> None:
    """Ctrl-C and SIGTERM: Python code stops where it is (SIGTERM raises as Ctrl-C does), and a
    run in the core stops at its next layer and writes the layers compared so far, marked
    incomplete; either way the exit code is 128 + the signal's number. A second signal ends the
    process at once."""
    import signal

    def stop(signum, frame):
        if _deferred is not None:  # inside an import that C++ drives: raised after it
            _deferred.append(signum)
            return
        raise KeyboardInterrupt(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    _layerdiff.catch_interrupts()  # after Python's handlers, which it calls in turn


#: While set, the signals that arrived (see `_signals_deferred`).
_deferred: list[int] | None = None


@contextlib.contextmanager
def _signals_deferred():
    """Ctrl-C and SIGTERM held until the block ends, then raised as usual. PyTorch's and
    TensorFlow's imports run Python code from C++ (pybind11 module initialisation): an exception
    raised there cannot cross back, and the process aborts (`terminate called after throwing
    pybind11::error_already_set`, exit -6) instead of exiting 128 + the signal."""
    global _deferred
    _deferred = []
    try:
        yield
    finally:
        arrived, _deferred = _deferred, None
        if arrived:
            raise KeyboardInterrupt(arrived[0])


def _interrupted(e: KeyboardInterrupt) -> int:
    """What an interrupted command prints and exits with."""
    import signal

    signum, said = _layerdiff.interrupt_signal()
    signum = signum or signal.SIGINT
    if e.args and isinstance(e.args[0], str):  # the core's own words on what it stopped
        print(f"error: {e.args[0]}", file=sys.stderr)
    elif not said:
        name = "SIGINT (Ctrl-C)" if signum == signal.SIGINT else signal.Signals(signum).name
        print(f"interrupted by {name}", file=sys.stderr)
    return 128 + signum


if __name__ == "__main__":
    run()
