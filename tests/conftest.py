"""Shared fixtures: one ResNet-18 instance with random weights (fixed seed) and its exports,
built once per test session because export takes seconds."""

from __future__ import annotations

import atexit
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


# `make test-all` (CI): the random-moment tests at their many moments, and the tests marked
# `thorough`, which `make test` skips.
THOROUGH = os.environ.get("LAYERDIFF_TEST_ALL") == "1"


def pytest_collection_modifyitems(config, items):
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


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Runs the installed `layerdiff` command as a user would."""
    exe = Path(sys.executable).parent / "layerdiff"
    return subprocess.run(
        [str(exe), *args], capture_output=True, text=True, cwd=cwd or ROOT, timeout=600
    )


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


def pytest_ignore_collect(collection_path, config):
    if not collection_path.name.startswith(_OWN_PROCESS):
        return None
    return not any(_OWN_PROCESS in str(arg) for arg in config.args)


def pytest_report_header(config):
    if not any(_OWN_PROCESS in str(arg) for arg in config.args):
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
