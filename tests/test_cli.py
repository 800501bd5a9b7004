"""The `layerdiff` command as a user runs it: reports written, exit codes, and clear messages
(exit 2, no traceback) for bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import ROOT, run_cli
from safetensors.numpy import load_file

TWICE = str(ROOT / "tests/builders/twice.py")


def assert_usage_error(result, *fragments):
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "panicked" not in result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


def test_builder_file_writes_reports_and_inputs(tmp_path):
    result = run_cli("torch", f"{TWICE}:build", "--out", str(tmp_path), "--seed", "3")
    assert result.returncode == 0, result.stderr
    assert "no drift" in result.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["schema"] == "layerdiff.report/4"
    assert report["seed"] == 3 and report["summary"]["layers_total"] == 5
    assert (tmp_path / "report.md").read_text().startswith("# layerdiff")
    inputs = load_file(tmp_path / "report.inputs.safetensors")
    assert list(inputs) == [report["inputs"][0]["name"]]
    assert (tmp_path / "model.onnx").is_file()


def test_a_builder_file_imports_the_files_beside_it(tmp_path):
    """As `python file.py` would: its folder comes first on the path, wherever layerdiff runs."""
    (tmp_path / "blocks.py").write_text(
        "import torch\n"
        "def mlp():\n"
        "    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()\n"
    )
    (tmp_path / "build.py").write_text(
        "import torch\nfrom blocks import mlp\n"
        "def build():\n"
        "    torch.manual_seed(0)\n"
        "    return mlp(), (torch.randn(2, 4),)\n"
    )
    result = run_cli("torch", f"{tmp_path}/build.py:build", "--target", "torch", "-q")
    assert result.returncode == 0, result.stderr


def test_same_seed_gives_the_same_report_bytes(tmp_path):
    for run in ("a", "b"):
        result = run_cli("torch", f"{TWICE}:build", "--json", str(tmp_path / f"{run}.json"), "-q")
        assert result.returncode == 0 and result.stdout == ""
    # The report's bytes do not depend on where it is written.
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    # The saved inputs: their tensors and seed the same; their metadata records the command
    # line (for `layerdiff reduce`), so the same command gives the same bytes (metadata order
    # included), in separate processes.
    a, b = tmp_path / "a.inputs.safetensors", tmp_path / "b.inputs.safetensors"
    assert load_file(a).keys() == load_file(b).keys()
    assert all((load_file(a)[k] == load_file(b)[k]).all() for k in load_file(a))
    same = []
    for _ in range(2):
        run_cli("torch", f"{TWICE}:build", "--json", "same.json", "-q", cwd=tmp_path)
        same.append((tmp_path / "same.inputs.safetensors").read_bytes())
    assert same[0] == same[1]


def test_exit_codes_follow_the_verdict_and_fail_on(tmp_path):
    # A tolerance of zero makes any rounding difference exceed: rounding alone exits 0, and 1
    # with --fail-on drift.
    for fail_on in ("defect", "drift"):
        out = tmp_path / fail_on
        result = run_cli(
            "torch", f"{TWICE}:build", "--tolerance", "0", "--out", str(out), "--fail-on", fail_on
        )
        assert result.returncode in (0, 1), result.stderr
        s = json.loads((out / "report.json").read_text())["summary"]
        assert s["verdict"] in ("no_drift", "precision"), s
        drifted = s["verdict"] == "precision"
        assert result.returncode == (1 if fail_on == "drift" and drifted else 0)


def test_not_an_onnx_file(tmp_path):
    bogus = tmp_path / "model.onnx"
    bogus.write_text("this is not a protobuf\n" * 10)
    result = run_cli("torch", f"{TWICE}:build", "--onnx", str(bogus))
    assert_usage_error(result, "is not a valid ONNX model")
    assert not any(tmp_path.glob("*.json"))


def test_truncated_onnx_file(tmp_path, resnet18_onnx):
    full = resnet18_onnx["dynamo"].read_bytes()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(full[: len(full) // 3])
    result = run_cli("torch", "resnet18", "--onnx", str(cut), "--json", str(tmp_path / "r.json"))
    assert_usage_error(result, "cut.onnx", "not a valid ONNX model")
    assert not (tmp_path / "r.json").exists()


def test_inputs_of_the_wrong_shape_for_the_onnx_file(tmp_path):
    exported = tmp_path / "exported"
    assert run_cli("torch", f"{TWICE}:build", "--out", str(exported), "-q").returncode == 0
    # A model taking 16 features, given 5: torch itself refuses, and says what it got.
    result = run_cli("torch", f"{TWICE}:build_wrong_input", "--onnx", str(exported / "model.onnx"))
    assert_usage_error(result, "the model failed on its inputs", "(4, 5)")


def test_onnx_file_expecting_another_shape(tmp_path, resnet18_onnx):
    builder = tmp_path / "small.py"
    builder.write_text(
        "import torch, torchvision\n"
        "def build():\n"
        "    return torchvision.models.resnet18(weights=None), (torch.randn(1, 3, 64, 64),)\n"
    )
    result = run_cli("torch", f"{builder}:build", "--onnx", str(resnet18_onnx["dynamo"]))
    assert_usage_error(result, "input `x`", "expects shape [1, 3, 224, 224]", "[1, 3, 64, 64]")


def test_onnx_file_expecting_another_dtype(tmp_path, resnet18_onnx):
    builder = tmp_path / "half.py"
    builder.write_text(
        "import torch, torchvision\n"
        "def build():\n"
        "    m = torchvision.models.resnet18(weights=None).double()\n"
        "    return m, (torch.randn(1, 3, 224, 224, dtype=torch.float64),)\n"
    )
    result = run_cli("torch", f"{builder}:build", "--onnx", str(resnet18_onnx["dynamo"]))
    assert_usage_error(result, "input `x`", "expects float32", "float64")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (f"{TWICE}:missing", "has no function `missing`"),
        ("tests/builders/nope.py:build", "does not exist"),
        ("no_such_package.models:build", "cannot import module `no_such_package.models`"),
        ("resnet1000", "unknown model `resnet1000`"),
        (f"{TWICE}:build_not_a_tuple", "must return (model, example_inputs)"),
    ],
)
def test_bad_model_specs(spec, message):
    assert_usage_error(run_cli("torch", spec), message)


def test_bad_usage_is_exit_2():
    assert_usage_error(
        run_cli("torch", "resnet18", "--tolerance=-1"),
        "tolerance must be a number ≥ 0, `auto` or `dtype`",
    )
    assert_usage_error(
        run_cli("torch", "resnet18", "--tolerance", "abc"),
        "tolerance must be a number ≥ 0, `auto` or `dtype`",
    )
    assert_usage_error(run_cli("frobnicate"), "unrecognized subcommand")


def test_missing_onnx_file():
    assert_usage_error(
        run_cli("torch", "resnet18", "--onnx", "/nonexistent.onnx"), "does not exist"
    )


def test_help_exits_0():
    result = run_cli("--help")
    assert result.returncode == 0 and "torch" in result.stdout


@pytest.mark.skipif(shutil.which("cargo") is None, reason="needs cargo")
def test_rust_binary_refers_torch_to_the_python_package():
    import subprocess

    from conftest import rust_exe

    result = subprocess.run(
        [str(rust_exe()), "torch", "resnet18"], capture_output=True, text=True, timeout=600
    )
    assert_usage_error(result, "needs PyTorch")


def test_torch_against_tract(tmp_path):
    result = run_cli(
        "torch", f"{TWICE}:build", "--target", "tract", "--json", str(tmp_path / "r.json")
    )
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["target"]["runtime"] == "tract"
    assert report["summary"]["layers_compared"] == 5


def test_unknown_target_runtime_is_a_usage_error():
    assert_usage_error(run_cli("torch", "resnet18", "--target", "tvm"), "unknown runtime `tvm`")


def test_options_that_do_not_fit_together_are_refused_before_the_model_is_built():
    """Parsed once, checked once, in Rust: the command and the Python API say the same."""
    assert_usage_error(
        run_cli("torch", "resnet18", "--target", "expected:values.npz"),
        "`expected:values.npz` is a file of values: `layerdiff torch` needs a runtime",
    )
    result = run_cli("torch", "resnet18", "--tolerance", "auto", "--no-float64")
    assert_usage_error(result, "tolerance `auto` needs the float64 run")
    assert "building" not in result.stderr, "refused before any work"


@pytest.mark.parametrize("verb", ["onnx", "providers"])
def test_tolerance_auto_without_float64_is_refused_by_every_verb(verb, tmp_path):
    """`auto` measures each value against the float64 run, which `--no-float64` skips: the
    ONNX verbs refuse the pair as `torch` does, where they ran the float64 run regardless."""
    from builders.graphs import growing_convs

    model = growing_convs(tmp_path / "convs.onnx", layers=2, channels=8)
    result = run_cli(verb, str(model), "--tolerance", "auto", "--no-float64")
    assert_usage_error(result, "tolerance `auto` needs the float64 run; drop --no-float64")


def _bare_env(tmp_path) -> dict:
    """What a shell that never activated the virtualenv gives the command."""
    return {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


def test_the_command_by_its_full_path_finds_onnx_runtime_without_a_virtualenv(tmp_path):
    """Run as `/path/to/venv/bin/layerdiff` from a shell that never activated the venv, it
    looked beside the base interpreter and at the `python3` on PATH, never at the interpreter
    running it, and could not find ONNX Runtime."""
    import subprocess
    import sys
    from pathlib import Path

    from test_onnx_command import _relu_model

    model = tmp_path / "relu.onnx"
    _relu_model(model)
    exe = Path(sys.executable).parent / "layerdiff"
    result = subprocess.run(
        [str(exe), "onnx", str(model), "--vs", str(model), "--batch", "2", "-q"],
        capture_output=True, text=True, cwd=tmp_path, env=_bare_env(tmp_path), timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_python_dash_m_layerdiff_is_the_command(tmp_path):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "layerdiff", "onnx", "--help"],
        capture_output=True, text=True, cwd=tmp_path, env=_bare_env(tmp_path), timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Usage: layerdiff onnx" in result.stdout


def test_torch_timings_add_up_to_the_wall_clock(tmp_path):
    """`--timings` left out the interpreter's start-up and the PyTorch import (2-4 s), so its
    total did not match the wall clock. Started cold, as a user's command is: a command forked
    from the tests' warm server has PyTorch imported before it begins."""
    import subprocess
    import sys
    import time

    out = tmp_path / "r.json"
    args = ["torch", "tests/builders/deep_mlp.py:build", "--timings", "--json", str(out), "-q"]
    exe = Path(sys.executable).parent / "layerdiff"
    started = time.monotonic()
    result = subprocess.run([str(exe), *args], capture_output=True, text=True, cwd=ROOT)
    wall = time.monotonic() - started
    assert result.returncode in (0, 1), result.stderr
    phases = json.loads(out.read_text())["timings"]
    start_up = next(p for p in phases if p["phase"].startswith("start-up"))
    assert start_up["seconds"] > 0.1  # importing PyTorch alone takes longer
    # What is left is the process's exit and the report written after the JSON.
    assert sum(p["seconds"] for p in phases) > 0.8 * wall


def test_the_extension_is_one_abi3_build_for_every_python():
    """One wheel serves Python 3.10 and later (a GPU machine's 3.12 included), instead of one
    build per interpreter."""
    import sys
    from pathlib import Path

    from layerdiff import _layerdiff

    if sys.platform.startswith("linux"):
        assert Path(_layerdiff.__file__).name == "_layerdiff.abi3.so"


def test_a_model_in_training_mode_is_compared_in_eval_mode_and_said_so(tmp_path):
    result = run_cli("torch", f"{TWICE}:build_training", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "the model was in training mode (drop)" in result.stderr
    assert "compared in eval mode" in result.stderr


def test_the_python_api_prints_no_progress():
    """The lines themselves are the engine's (crates/layerdiff-flow/src/progress.rs) and what a
    command prints is tested in test_progress.py; a process that is not the command (the Python
    API's) never started them, so the flows get no ticker, whatever they are given."""
    from layerdiff._cli import _Progress
    from layerdiff.torch._running import progress_line

    assert progress_line(_Progress(quiet=False), 10) is None
    assert progress_line(_Progress(quiet=True), 10) is None
    assert progress_line(None, 10) is None


def test_an_exporter_failure_is_one_clean_paragraph_with_the_hint_that_fits():
    """A module that returns a Llama decoder's whole output, its key/value cache in it, does not
    export: the message names the exporter's own cause, without terminal colour codes or a
    pointer to a stack trace nobody is shown, and says how to fix it."""
    builder = f"{ROOT}/tests/builders/llama_cache.py:wrapped"
    result = run_cli("torch", builder, "--no-cache")
    assert result.returncode == 2, result.stderr
    error = next(line for line in result.stderr.splitlines() if line.startswith("error:"))
    assert error.startswith("error: torch.onnx.export (dynamo) failed: RuntimeError: Found"), error
    assert "DynamicCache" in error
    assert "\x1b[" not in result.stderr and "full stack trace" not in result.stderr
    assert "hint: the model returns its key/value cache" in result.stderr
    assert "`use_cache=False`" in result.stderr


def test_inputs_given_by_name_are_the_models_keyword_arguments(tmp_path):
    """A builder returning its inputs as a dict (a tokenizer's output) is run with them by name,
    exported and compared layer by layer, its layers named as the model's own."""
    builder = f"{ROOT}/tests/builders/llama_cache.py:by_name"
    result = run_cli("torch", builder, "--json", str(tmp_path / "r.json"))
    assert result.returncode == 0, result.stderr
    assert "the LlamaModel's key/value cache is turned off" in result.stderr, result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert len(report["inputs"]) == 2, report["inputs"]
    names = [layer["name"] for layer in report["layers"]]
    assert "layers.0.self_attn.q_proj" in names and "norm" in names, names
    assert report["summary"]["layers_compared"] > 10 and report["summary"]["verdict"] == "no_drift"


def test_a_stock_decoder_from_a_builder_is_compared_with_its_cache_off_and_says_so(tmp_path):
    """A builder returning a transformers decoder with its default `use_cache=True` has the
    cache turned off, as a checkpoint folder has, and the run says so: against its export and
    against a PyTorch side (both failed: the exporter on the cache, the side on its output)."""
    builder = f"{ROOT}/tests/builders/llama_cache.py:build"
    for target in ([], ["--target", "torch:bf16"]):
        result = run_cli("torch", builder, *target, "--json", str(tmp_path / "r.json"))
        assert result.returncode in (0, 1), result.stderr
        assert "LlamaModel's key/value cache is turned off (use_cache=False)" in result.stderr
        report = json.loads((tmp_path / "r.json").read_text())
        assert report["summary"]["layers_compared"] > 10, report["summary"]
