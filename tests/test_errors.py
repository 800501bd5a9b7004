"""docs/errors.md, run: each example command in a folder holding the files it names (built
here: hostile and broken ones among them), printing what the page shows, with its exit code."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import faulty_ops_library, run_cli
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "errors.md"
EXE = Path(sys.executable).parent / "layerdiff"


def _vi(name, shape=(1, 4)):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _model(nodes, initializers=(), opset=17, inputs=None, outputs=None, domains=()):
    graph = helper.make_graph(
        nodes, "g", inputs or [_vi("x")], outputs or [_vi("y")], list(initializers)
    )
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, 1) for d in domains)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def _external(location: str):
    model = _model([helper.make_node("Mul", ["x", "e"], ["y"], name="mul")])
    e = TensorProto(name="e", data_type=TensorProto.FLOAT, dims=[4])
    e.data_location = TensorProto.EXTERNAL
    e.external_data.add(key="location", value=location)
    model.graph.initializer.append(e)
    return model


def _files(folder: Path) -> None:
    """Every file the page's examples name, in `folder` (and `secret.bin` beside it)."""
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    good = _model(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
            helper.make_node("Relu", ["h"], ["y"], name="relu"),
        ],
        [w],
    )
    onnx.save(good, folder / "model.onnx")
    (folder / "notes.onnx").write_text("not a model\n")
    (folder / "notes.txt").write_text("my notes\n")
    (folder / "notes.keras").write_text("not a model\n")
    (folder / "empty.onnx").write_bytes(b"")
    data = good.SerializeToString()
    (folder / "truncated.onnx").write_bytes(data[: len(data) // 2])
    lying = _model([helper.make_node("Mul", ["x", "e"], ["y"], name="mul")])
    e = TensorProto(name="e", data_type=TensorProto.FLOAT, dims=[1000000], raw_data=b"\0" * 16)
    lying.graph.initializer.append(e)
    onnx.save(lying, folder / "lying.onnx")
    (folder.parent / "secret.bin").write_bytes(b"\0" * 16)
    (folder / "link.bin").symlink_to(folder.parent / "secret.bin")
    for name, location in (("absolute", "/etc/passwd"), ("outside", "../secret.bin"),
                           ("link", "link.bin"), ("missing_data", "gone.bin")):  # fmt: skip
        onnx.save(_external(location), folder / f"{name}.onnx")
    relu = [helper.make_node("Relu", ["x"], ["y"], name="r")]
    onnx.save(_model(relu, opset=99), folder / "future_opset.onnx")
    unknown = helper.make_node("Frobnicate", ["x"], ["y"], name="f", domain="com.example")
    onnx.save(_model([unknown], domains=["com.example"]), folder / "unknown_op.onnx")
    dims = ("batch", "width")
    dynamic = _model(relu, inputs=[_vi("x", dims)], outputs=[_vi("y", dims)])
    onnx.save(dynamic, folder / "dynamic.onnx")
    gate = helper.make_node("Sigmoid", ["h"], ["y"], name="gate", domain="layerdiff.test",
                            fault="abort")  # fmt: skip
    matmul = helper.make_node("MatMul", ["x", "w"], ["h"], name="mm")
    onnx.save(_model([matmul, gate], [w], domains=["layerdiff.test"]), folder / "vendor_gated.onnx")
    shutil.copy(faulty_ops_library(), folder / "libvendor_ops.so")
    np.savez(folder / "wrong.npz", x=np.zeros((2, 3), np.float32))
    np.savez(folder / "other_name.npz", z=np.zeros((1, 4), np.float32))
    (folder / "notes.npz").write_text("not an archive\n")


def _examples() -> list[tuple[str, str, int]]:
    """(command, what it prints to stderr, exit code) of each example on the page."""
    blocks = re.findall(r"```console\n(.*?)```", PAGE.read_text(), re.S)
    examples = []
    for block in blocks:
        for part in re.split(r"^\$ ", block, flags=re.M)[1:]:
            command, _, rest = part.partition("\n")
            printed, code = re.fullmatch(r"(.*)\[exit (\d+)\]\n", rest, re.S).groups()
            examples.append((command, printed.rstrip("\n"), int(code)))
    return examples


EXAMPLES = _examples()
# a phase's line: `[   0.0s] reading model.onnx…`
PROGRESS = re.compile(r"\[ *\d+\.\ds\] ")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("errors") / "work"
    folder.mkdir()
    _files(folder)
    return folder


def test_the_page_has_examples_of_every_kind():
    assert len(EXAMPLES) >= 20
    assert {code for _, _, code in EXAMPLES} == {2}


@pytest.mark.parametrize(("command", "printed", "code"), EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_each_example_prints_what_the_page_shows(folder, command, printed, code):
    args = command.split()
    settings = {}  # `NAME=value layerdiff …`: the command's environment
    while "=" in args[0]:
        name, _, value = args.pop(0).partition("=")
        settings[name] = value
    assert args[0] == "layerdiff"
    result = run_cli(*args[1:], cwd=folder, env={"COLUMNS": "200", **settings}, timeout=300)
    assert result.returncode == code, result.stderr
    pattern = ".*?".join(re.escape(piece) for piece in printed.split("…"))
    # the progress lines before an error are left out of the page (it says so)
    said = "".join(
        line for line in result.stderr.splitlines(keepends=True) if not PROGRESS.match(line)
    )
    assert re.fullmatch(pattern, said.rstrip("\n"), re.S), (
        f"docs/errors.md shows:\n{printed}\nthe command printed:\n{result.stderr}"
    )
    assert "Traceback" not in result.stderr and "panicked" not in result.stderr
    assert not any(folder.glob("r.*")), "an error writes no report"


def test_a_report_over_a_file_the_run_reads_or_a_users_file_leaves_it_untouched(tmp_path):
    """`--json victim.onnx` replaced the model with the report, `--html notes.txt` the notes:
    both are refused before any work, the files as they were; a second run into the same
    `--out` still replaces the first's reports."""
    _files(tmp_path)
    model, notes = tmp_path / "model.onnx", tmp_path / "notes.txt"
    before = model.read_bytes(), notes.read_bytes()
    for args in (("--json", "model.onnx"), ("--markdown", str(model)), ("--html", "notes.txt"),
                 ("--inputs", "model.onnx", "--json", "model.onnx")):  # fmt: skip
        done = subprocess.run([str(EXE), "onnx", "model.onnx", *args], cwd=tmp_path,
                              capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("error: cannot write"), done.stderr
    assert (model.read_bytes(), notes.read_bytes()) == before
    # the Python API's Report.write replaced both files; it holds to the same rules
    torch = pytest.importorskip("torch")
    import layerdiff

    torch.manual_seed(0)
    model_ = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    report = layerdiff.compare_torch_onnx(model_, torch.randn(1, 4))
    twice = {"json": tmp_path / "r", "html": tmp_path / "r"}
    for kwargs in ({"json": notes}, {"markdown": model}, twice):
        with pytest.raises(layerdiff.UsageError, match="cannot write"):
            report.write(**kwargs)
    assert (model.read_bytes(), notes.read_bytes()) == before
    assert report.write(json=tmp_path / "fresh.json") == [tmp_path / "fresh.json"]
    for _ in range(2):
        done = subprocess.run([str(EXE), "onnx", "model.onnx", "--out", "run", "--quiet"],
                              cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 0, done.stderr
