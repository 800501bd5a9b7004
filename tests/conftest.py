"""Shared fixtures: one ResNet-18 instance with random weights (fixed seed) and its exports,
built once per test session because export takes seconds."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent))

# Exports the tests make are kept in a folder of this run's, never in the user's cache (and
# the commands the tests run inherit it); it goes when the run ends. The test processes of one
# run share it (pytest-xdist's workers inherit it from the process that starts them, which
# removes it), so a model one exported the others reuse: the cache keeps each export whole or
# not at all.
if "PYTEST_XDIST_WORKER" in os.environ and "LAYERDIFF_TEST_CACHE_DIR" in os.environ:
    os.environ["LAYERDIFF_CACHE_DIR"] = os.environ["LAYERDIFF_TEST_CACHE_DIR"]
else:
    os.environ["LAYERDIFF_CACHE_DIR"] = tempfile.mkdtemp(prefix="layerdiff-cache-")
    os.environ["LAYERDIFF_TEST_CACHE_DIR"] = os.environ["LAYERDIFF_CACHE_DIR"]
    atexit.register(shutil.rmtree, os.environ["LAYERDIFF_CACHE_DIR"], ignore_errors=True)


# Each test process's share of the cores, for its runtimes' pools and PyTorch's (and the
# commands it runs): at one per core each, the processes' pools fight for the cores, and ONNX
# Runtime's spin while they wait (a quarter of the suite's time on 2 cores). A value the user
# set stays.
_PROCESSES = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _PROCESSES > 1:
    for _variable in ("LAYERDIFF_THREADS", "OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS",
                      "TF_NUM_INTEROP_THREADS"):  # fmt: skip
        os.environ.setdefault(_variable, str(max(1, (os.cpu_count() or 1) // _PROCESSES)))


# `make test-all` (CI): the random-moment tests at their many moments, and the tests marked
# `thorough`, which `make test` skips.
THOROUGH = os.environ.get("LAYERDIFF_TEST_ALL") == "1"


# The files that take longest, longest first (`--durations`, on 2 cores): a process is handed
# a file at a time in this order (pyproject's `--no-loadscope-reorder`), so none of them is
# left to run alone at the end. The rest follow as collected.
SLOW_FIRST = (
    "test_reduce.py", "test_cli.py", "test_calibration.py", "test_mapping.py",
    "test_compile_whole.py", "test_decode.py", "test_openvino.py", "test_torch_sides.py",
    "test_torch_flow.py", "test_interrupt.py", "test_causes.py", "test_streamed.py",
)  # fmt: skip


def pytest_collection_modifyitems(config, items):
    rank = {name: k for k, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))  # stable
    if THOROUGH:
        return
    skip = pytest.mark.skip(reason="thorough: `make test-all` runs it (CI)")
    for item in items:
        if "thorough" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def resnet18():
    torch = pytest.importorskip("torch")
    from layerdiff.torch import BUILTIN_MODELS

    model, inputs = BUILTIN_MODELS["resnet18"](0)
    model.eval()
    return model, inputs, torch


@pytest.fixture(scope="session")
def resnet18_onnx(resnet18, tmp_path_factory):
    """Exports of the very instance in `resnet18`, by exporter."""
    from layerdiff.torch import export_onnx

    model, inputs, _ = resnet18
    folder = tmp_path_factory.mktemp("resnet18")
    return {
        exporter: export_onnx(model, inputs, folder / f"{exporter}.onnx", exporter=exporter)
        for exporter in ("dynamo", "legacy")
    }


def rust_exe() -> Path:
    """The plain Rust binary, `target/release/layerdiff`. `make test` builds it with the
    workspace's features, as `cargo test --workspace` builds its dependencies: `cargo run -p
    layerdiff-cli` resolves them for the one package and compiled the dependency tree again (5
    of a fresh clone's 17 minutes of `make test`). Built the same way here where it is missing."""
    exe = ROOT / "target" / "release" / "layerdiff"
    if not exe.exists():
        subprocess.run(
            ["cargo", "build", "--workspace", "--release", "--quiet", "--bins"],
            cwd=ROOT, check=True,
        )  # fmt: skip
    return exe


def faulty_ops_library() -> Path:
    """The custom-op library whose kernel aborts or segfaults on a node's `fault` attribute
    (crates/layerdiff-runtime/examples/faulty_ops.rs): built by `cargo test`, else here."""
    library = ROOT / "target" / "release" / "examples" / "libfaulty_ops.so"
    if not library.exists():
        subprocess.run(
            ["cargo", "build", "--release", "--quiet", "-p", "layerdiff-runtime",
             "--example", "faulty_ops"],
            cwd=ROOT, check=True,
        )  # fmt: skip
    return library


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 600):
    """Runs the installed `layerdiff` command as a user would, in a process of its own: forked
    from a server that imported PyTorch once (tests/warm.py), unless LAYERDIFF_TEST_COLD=1 (each
    command starts the interpreter, as the user's does). `env`: variables set for the command."""
    exe = Path(sys.executable).parent / "layerdiff"
    cwd, env = cwd or ROOT, {**os.environ, **(env or {})}
    if _COLD or os.environ.get("LAYERDIFF_TEST_COLD") == "1":
        return subprocess.run(
            [str(exe), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
        )
    return _warm_server().run(exe, list(args), cwd, env, timeout)


class _WarmServer:
    """This test process's tests/warm.py, started at its first command."""

    def __init__(self, modules: list[str]):
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).parent / "warm.py"), *modules],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
        )  # fmt: skip
        ready = json.loads(self.process.stdout.readline())
        if ready["threads"] != 1:  # a fork copies one thread only: a lock another held stays held
            raise RuntimeError(f"tests/warm.py runs {ready['threads']} threads after its imports")
        self.folder = Path(tempfile.mkdtemp(prefix="layerdiff-warm-"))
        atexit.register(self.close)

    def run(self, exe: Path, args: list[str], cwd: Path, env: dict, timeout: float):
        out, err = self.folder / "stdout", self.folder / "stderr"
        request = {"exe": str(exe), "args": args, "cwd": str(cwd), "env": env,
                   "stdout": str(out), "stderr": str(err), "timeout": timeout}  # fmt: skip
        self.process.stdin.write(json.dumps(request) + "\n")
        said = self.process.stdout.readline()
        if not said:  # the server itself ended: every later command would fail the same way
            raise RuntimeError(f"tests/warm.py ended (exit {self.process.poll()})")
        answer = json.loads(said)
        stdout, stderr = (p.read_text(errors="replace") for p in (out, err))
        if answer["timed_out"]:
            raise subprocess.TimeoutExpired([str(exe), *args], timeout, stdout, stderr)
        return subprocess.CompletedProcess([str(exe), *args], answer["rc"], stdout, stderr)

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=30)
        shutil.rmtree(self.folder, ignore_errors=True)


_server: _WarmServer | None = None

#: The Keras tests' pytest runs each command cold: TensorFlow cannot share a process with
#: PyTorch, and its import is where layerdiff must keep TensorFlow's noise back.
_COLD = False

#: What the server imports: PyTorch and what its commands import (TensorFlow's tests run in a
#: pytest of their own, where PyTorch is not loaded beside it).
WARM_MODULES = ["numpy", "onnx", "torch", "torchvision", "torch._dynamo", "torch.export",
                "torch.onnx._internal.exporter._core", "onnxscript", "transformers"]  # fmt: skip


def _warm_server() -> _WarmServer:
    global _server
    if _server is None:
        _server = _WarmServer(WARM_MODULES)
    return _server


def _exported(tmp_path_factory, name: str):
    """`builders/NAME.py`'s model (seed 0), exported by dynamo into a session folder."""
    torch = pytest.importorskip("torch")
    import importlib

    from layerdiff.torch import export_onnx

    torch.manual_seed(0)
    model, inputs = importlib.import_module(f"builders.{name}").build()
    model.eval()
    path = tmp_path_factory.mktemp(name) / f"{name}.onnx"
    return export_onnx(model, inputs, path, exporter="dynamo")


@pytest.fixture(scope="session")
def encoder_onnx(tmp_path_factory):
    """The small transformer encoder of builders/encoder.py."""
    return _exported(tmp_path_factory, "encoder")


@pytest.fixture(scope="session")
def decoder_onnx(tmp_path_factory):
    """The small GPT-2-style decoder of builders/decoder.py."""
    return _exported(tmp_path_factory, "decoder")


# TensorFlow and PyTorch's compiler (triton) abort when both are loaded into one process, so
# the Keras tests (test_keras*.py) run in a pytest of their own: named explicitly (`make test`
# does both runs).
_OWN_PROCESS = "test_keras"


def pytest_configure(config):
    global _COLD  # this is the Keras tests' pytest
    _COLD = any(_OWN_PROCESS in str(arg) for arg in config.args)


def pytest_ignore_collect(collection_path, config):
    if not collection_path.name.startswith(_OWN_PROCESS):
        return None
    return not _COLD


def pytest_report_header(config):
    if not _COLD:
        return f"{_OWN_PROCESS}*.py are left out: they run on their own (`make test` names them)"
    return None


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """`name` → a folder `save_pretrained` wrote: random weights from seed 0, stored in bfloat16
    as checkpoints ship."""
    made = {}

    def folder(name):
        if name not in made:
            pytest.importorskip("torch")
            pytest.importorskip("transformers")
            from builders import checkpoints

            made[name] = checkpoints.save(name, tmp_path_factory.mktemp(name))
        return made[name]

    return folder
