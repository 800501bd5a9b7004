"""A checkpoint larger than the memory it may use (issue 48, part 4): held one module at a time,
its weights read from the safetensors files as the forward pass reaches each module and dropped
after, the float64 truth and the baseline the same way. The report is the one the whole model
gives, decoding step by step too; nothing stays held; a weight edited in the export is still
found at its layer; an export (which needs every weight at once) is refused with what to do
instead."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
onnx = pytest.importorskip("onnx")

from faults import scale_weight  # noqa: E402
from layerdiff import UsageError  # noqa: E402

# Room for the values of the test checkpoints' largest segment (a head's logits on every side).
BUDGET = "1M"
WIDE_BUDGET = "4M"


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A Llama-style checkpoint whose weights (6.5 MB in float32) take more than `WIDE_BUDGET`,
    room for its largest segment's values: the rule streams it."""
    from builders import checkpoints

    return checkpoints.save("wide", tmp_path_factory.mktemp("wide"))


def _export(folder, path):
    from layerdiff.torch import export_onnx, load_checkpoint

    return export_onnx(*load_checkpoint(folder), path)


def _without_timing(report) -> dict:
    data = json.loads(json.dumps(report.data))
    data.pop("timings", None)
    return data


@pytest.mark.parametrize("name", ["llama", "gpt2"])  # gpt2: its head tied to the embedding
def test_a_checkpoint_held_one_module_at_a_time_reports_as_the_whole_model(
    checkpoint, name, tmp_path
):
    from layerdiff.torch import compare_torch_onnx, load_checkpoint

    folder = checkpoint(name)
    exported = _export(folder, tmp_path / "model.onnx")
    whole = compare_torch_onnx(folder, onnx=exported, max_memory=BUDGET, seed=0)
    model, inputs = load_checkpoint(folder, streams=lambda size: True)
    assert all(p.device.type == "meta" for p in model.parameters()), "nothing read yet"
    # the dtype the model's code reads off its parameters is float32's, not the files'
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    streamed = compare_torch_onnx(model, inputs, onnx=exported, max_memory=BUDGET, seed=0)
    assert streamed.summary["verdict"] == "no_drift", streamed.summary
    assert streamed.summary["layers_compared"] == streamed.summary["layers_total"] > 30
    assert _without_timing(streamed) == _without_timing(whole)
    # nothing is held once the run is over
    assert all(p.device.type == "meta" for p in model.parameters())
    # the default rule holds it whole: its weights are far below the machine's budget
    assert any(p.device.type == "cpu" for p in load_checkpoint(folder)[0].parameters())


def test_a_head_read_in_bands_reports_as_the_whole_model_and_as_one_read_whole(
    checkpoint, tmp_path, monkeypatch
):
    """The float64 truth computes a head past the banding size a band of rows at a time, each
    band read alone from the files (gpt2: the head tied to the embedding, read under the
    embedding's name): the report of the model held whole, and the float64 distances of a
    head read whole to float64's last bits."""
    from layerdiff.torch import _widened, compare_torch_onnx, load_checkpoint

    folder = checkpoint("gpt2")
    exported = _export(folder, tmp_path / "model.onnx")
    whole = compare_torch_onnx(folder, onnx=exported, max_memory=BUDGET, seed=0)
    monkeypatch.setattr(_widened, "CHUNKED_ABOVE", 512 * 64 * 8 - 1)  # the head alone
    monkeypatch.setattr(_widened, "BAND", 100 * 64 * 8)  # bands of 100 rows: 512 no multiple
    bands, read = [], _widened.weight_rows

    def counted(module, name, start, stop, dtype):
        bands.append((start, stop))
        return read(module, name, start, stop, dtype)

    monkeypatch.setattr(_widened, "weight_rows", counted)
    banded = compare_torch_onnx(folder, onnx=exported, max_memory=BUDGET, seed=0)
    # (the truth and the baseline's replay each read them, in threads of their own)
    assert sorted(set(bands)) == [(0, 100), (100, 200), (200, 300), (300, 400), (400, 500),
                                  (500, 512)], bands  # fmt: skip
    model, inputs = load_checkpoint(folder, streams=lambda size: True)
    streamed = compare_torch_onnx(model, inputs, onnx=exported, max_memory=BUDGET, seed=0)
    assert _without_timing(streamed) == _without_timing(banded)
    head = [(a, b) for a, b in zip(whole.layers, banded.layers, strict=True) if a["float64"]]
    assert any(a["name"] == "lm_head" for a, _ in head)
    for a, b in head:
        for side in ("reference", "target"):
            assert b["float64"][side] == pytest.approx(a["float64"][side], rel=1e-9, abs=1e-15)


def test_rows_are_read_alone_as_the_whole_tensor_gives_them(tmp_path):
    """`Weights.rows`: the rows of the tensor read whole, in every stored dtype, as stored
    where that is the model's values (None), and never a view of the buffer reads share."""
    from layerdiff.torch._streamed import Weights
    from safetensors.torch import save_file

    torch.manual_seed(0)
    base = torch.randn(11, 5, dtype=torch.float64)
    tensors = {"bf16": base.bfloat16(), "f32": base.float(), "f64": base,
               "ids": torch.arange(55).reshape(11, 5)}  # fmt: skip
    save_file(tensors, tmp_path / "model.safetensors")
    weights = Weights(tmp_path)
    for name, stored in tensors.items():
        for dtype in (None, torch.float32, torch.float64):
            whole, rows = weights.get(name, dtype), weights.rows(name, 3, 8, dtype)
            assert torch.equal(rows, whole[3:8]), (name, dtype)
            if not stored.is_floating_point():
                assert rows.dtype == stored.dtype
            elif dtype is None:
                assert rows.dtype == (torch.float32 if name == "f64" else stored.dtype)
    first = weights.rows("bf16", 0, 2, torch.float64)
    weights.rows("bf16", 2, 4, torch.float64)
    assert torch.equal(first, base.bfloat16()[:2].double()), "a later read leaves it as it was"


def test_a_tensor_converted_as_it_is_read_is_read_in_bands_with_nothing_beside_it(
    tmp_path, monkeypatch
):
    """Converted in bands (a band here of 3 rows, 11 rows in all, and a scalar), the values of
    the tensor converted whole; a file cut short is said, not read past."""
    from layerdiff.torch import _streamed
    from safetensors.torch import save_file

    monkeypatch.setattr(_streamed, "_BAND", 3 * 5 * 2)  # 3 rows of bfloat16
    torch.manual_seed(0)
    table = torch.randn(11, 5).bfloat16()
    save_file({"table": table, "scalar": torch.tensor(1.5, dtype=torch.float64),
               "empty": torch.zeros(0, 5)}, tmp_path / "model.safetensors")  # fmt: skip
    weights = _streamed.Weights(tmp_path)
    assert torch.equal(weights.get("table", torch.float64), table.double())
    assert weights._buffers.raw.numel() == 3 * 5 * 2, "the buffer holds one band"
    assert weights.get("scalar").shape == () and weights.get("scalar").item() == 1.5
    assert weights.get("empty", torch.float64).shape == (0, 5)
    path = tmp_path / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(UsageError, match="ends inside"):
        _streamed.Weights(tmp_path).get("table")


def test_the_command_line_streams_below_the_budget_and_finds_an_edited_weight(wide, tmp_path):
    folder = wide
    clean = _export(folder, tmp_path / "model.onnx")
    out = tmp_path / "clean.json"
    done = run_cli(
        "torch", str(folder), "--onnx", str(clean), "--max-memory", WIDE_BUDGET, "--json", str(out)
    )
    assert done.returncode == 0, done.stderr
    assert "loaded in float32 one module at a time as the forward pass reaches it" in done.stderr
    down = next(
        layer for layer in json.loads(out.read_text())["layers"]
        if layer["name"] == "model.layers.1.mlp.down_proj"
    )  # fmt: skip
    edited = scale_weight(clean, tmp_path / "edited.onnx", down["location"]["value"], 1.05)
    out = tmp_path / "edited.json"
    done = run_cli(
        "torch", str(folder), "--onnx", str(edited), "--max-memory", WIDE_BUDGET, "--json", str(out)
    )
    assert done.returncode == 1, done.stderr
    s = json.loads(out.read_text())["summary"]
    # the weight check reads the module's weight from the files: the cause is named
    assert [(d["layer"], d["cause"]) for d in s["defects"]] == [
        ("model.layers.1.mlp.down_proj", "weight_mismatch")
    ], s


def test_an_export_of_a_streamed_checkpoint_is_refused_with_what_to_do(wide, tmp_path):
    from layerdiff.torch import compare_torch_onnx, load_checkpoint

    folder = wide
    done = run_cli("torch", str(folder), "--max-memory", WIDE_BUDGET, "--out", str(tmp_path / "o"))
    assert done.returncode == 2, done.stderr
    assert "an export needs all of them: give its ONNX file with --onnx" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "o").exists()
    model, inputs = load_checkpoint(folder, streams=lambda size: True)
    with pytest.raises(UsageError, match="held one module at a time"):
        compare_torch_onnx(model, inputs)


def test_a_checkpoint_whose_names_differ_from_the_model_s_is_refused_with_both(wide, tmp_path):
    """Held one module at a time, the files are read by the model's own names: a file that
    names its tensors otherwise is told apart from a missing file."""
    import shutil

    from safetensors.torch import load_file, save_file

    renamed = tmp_path / "renamed"
    shutil.copytree(wide, renamed)
    tensors = load_file(renamed / "model.safetensors")
    save_file({f"transformer.{k}": v for k, v in tensors.items()}, renamed / "model.safetensors")
    never_read = tmp_path / "model.onnx"  # the names are refused before the file is read
    never_read.write_bytes(b"")
    done = run_cli("torch", str(renamed), "--onnx", str(never_read), "--max-memory", WIDE_BUDGET)
    assert done.returncode == 2, done.stderr
    assert "stores no tensor under" in done.stderr and "it holds `transformer." in done.stderr
    assert "Traceback" not in done.stderr


def test_decoding_a_streamed_checkpoint_against_its_decoder_file_reports_as_the_whole(
    wide, tmp_path
):
    """`--decode-steps` with the decoder's file given: the prefill and every step run on the
    model held one module at a time, with the axis report of the model held whole."""
    whole = tmp_path / "whole.json"
    done = run_cli("torch", str(wide), "--decode-steps", "2", "--out", str(tmp_path / "w"),
                   "--json", str(whole))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "one module at a time" not in done.stderr
    streamed = tmp_path / "streamed.json"
    decoder = tmp_path / "w" / "model.onnx"
    done = run_cli("torch", str(wide), "--decode-steps", "2", "--onnx", str(decoder),
                   "--max-memory", WIDE_BUDGET, "--json", str(streamed))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "loaded in float32 one module at a time" in done.stderr
    a, b = (json.loads(p.read_text()) for p in (whole, streamed))
    assert [p["point"] for p in b["points"]] == ["prefill", "1", "2"], b["points"]
    a.pop("timings", None)
    b.pop("timings", None)
    assert a == b
