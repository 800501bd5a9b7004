"""The `layerdiff` console command. Parsing and the one dispatch are Rust's (same help, errors
and exit codes as the Rust binary); a verb that needs PyTorch or TensorFlow comes back with the
Python function that runs it, which this module imports and calls. Here: the process's concerns
only (signals, errors as messages, the exit)."""

from __future__ import annotations

import contextlib
import os
import sys
import time

from layerdiff import _layerdiff

_IMPORTED = time.perf_counter()


class _Progress:
    """A line per phase on stderr, and the core's line at least every 10 s while it lasts
    (`layerdiff_flow::progress`); silent with --quiet. Each phase is also where a Ctrl-C or
    SIGTERM that Python code swallowed (a library's C code can clear the KeyboardInterrupt it
    raised) still stops the run: the command's handler keeps it."""

    def __init__(self, quiet: bool):
        self.quiet = quiet

    def __call__(self, message: str) -> None:
        if _layerdiff.interrupt_signal() is not None:
            raise KeyboardInterrupt
        _layerdiff.progress_phase(message)


def main(argv: list[str] | None = None) -> int:
    args = ["layerdiff", *(sys.argv[1:] if argv is None else argv)]
    try:
        kind, value = _layerdiff.parse_cli(args)
        if kind == "exit":
            return int(value)
        return _run(*value)
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


def _run(verb: str, module: str, function: str, framework: str, extra: str, command) -> int:
    """Runs a verb the dispatch handed back (it needs PyTorch or TensorFlow): the function it
    names, imported here, on the parsed command; the outputs are written and printed by the
    same Rust functions as the ONNX verbs'."""
    import importlib

    if verb not in ("zoo", "sweep"):  # the import takes seconds: the log says what it waits for
        _layerdiff.progress_phase(f"loading {framework}")
    try:
        with _signals_deferred():  # PyTorch's and TensorFlow's imports run Python from C++
            runner = getattr(importlib.import_module(module), function)
    except ImportError as e:
        if (e.name or "").split(".")[0] == "layerdiff":  # our own package is broken, not missing
            raise _layerdiff.UsageError(
                f"`layerdiff {verb}` cannot load layerdiff's adapter for {framework}: {e}\n"
                "hint: the package and its core do not match; reinstall layerdiff"
            ) from e
        raise _layerdiff.UsageError(
            f"`layerdiff {verb}` needs {framework} ({e.name or e} is missing)\n"
            f"hint: pip install '{extra}'"
        ) from e
    _cap_framework_threads()
    return runner(command, _Progress(command is None or command.quiet))


def _cap_framework_threads() -> None:
    """`LAYERDIFF_THREADS` for the framework the verb imported (the runtimes and layerdiff's
    own pool read it in the core): PyTorch's intra-op threads; TensorFlow's, before it starts."""
    threads = _layerdiff.thread_cap()
    if threads is None:
        return
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    if "tensorflow" in sys.modules:
        config = sys.modules["tensorflow"].config.threading
        with contextlib.suppress(RuntimeError):  # already started: its threads are set
            config.set_intra_op_parallelism_threads(threads)
            config.set_inter_op_parallelism_threads(threads)


def run() -> None:
    """The `layerdiff` command itself: `main`, then out of the process at once. Tearing down
    the interpreter with PyTorch, ONNX Runtime and TensorFlow loaded takes 1-2 s after the work
    is done (the native libraries' destructors, their thread pools); the reports are written
    and closed by then, so exit handlers run, the streams are flushed and the process ends."""
    import atexit

    _layerdiff.settle_heap()  # the command's own process only: the API leaves the user's
    _catch_interrupts()
    try:
        code = _layerdiff.conclude(main())  # a run the core stopped says what it left
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
    _defer_signals_in_imports()


def _defer_signals_in_imports() -> None:
    """Every import the command's main thread makes holds the signals until it ends (see
    `_signals_deferred`), not only the framework's first: a model's own import comes later
    (`import torchvision` imports torch._dynamo, then Triton, whose enums a nanobind extension
    builds; SIGTERM there aborted the process, exit -6, in CI's random-moment test). An import
    statement of a module already imported costs about a microsecond more."""
    import builtins
    import threading

    plain = builtins.__import__
    main = threading.main_thread().ident

    def deferring(name, globals=None, locals=None, fromlist=(), level=0):
        if _deferred is not None or threading.get_ident() != main:
            return plain(name, globals, locals, fromlist, level)
        with _signals_deferred():
            return plain(name, globals, locals, fromlist, level)

    builtins.__import__ = deferring


#: While set, the signals that arrived (see `_signals_deferred`).
_deferred: list[int] | None = None


@contextlib.contextmanager
def _signals_deferred():
    """Ctrl-C and SIGTERM held until the block ends, then raised as usual. Imports run Python
    code from C++ (pybind11's and nanobind's module initialisation: PyTorch, TensorFlow,
    Triton): an exception raised there cannot cross back, and the process aborts (`terminate
    called after throwing pybind11::error_already_set`, exit -6) instead of exiting 128 + the
    signal."""
    global _deferred
    _deferred = []
    try:
        yield
    finally:
        arrived, _deferred = _deferred, None
        if arrived:
            raise KeyboardInterrupt(arrived[0])


def _interrupted(e: KeyboardInterrupt) -> int:
    """What an interrupted command leaves, says and exits with: what the run made besides its
    reports goes, the last line says what is left, and the exit code is 128 + the signal."""
    import signal

    signum = e.args[0] if e.args and isinstance(e.args[0], int) else signal.SIGINT
    return _layerdiff.conclude(128 + signum, signum)


if __name__ == "__main__":
    run()
