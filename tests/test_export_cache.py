"""Exporting once: an export is kept under a key of everything that decides the file, reused
by a second run of the same model, made anew when a weight, the inputs or the exporter change,
and never reused with `--no-cache`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

torch = pytest.importorskip("torch")

from layerdiff.torch import export_onnx  # noqa: E402
from layerdiff.torch._export import cache_folder, export_key  # noqa: E402

MLP = f"{ROOT / 'tests/builders/seed_mlp.py'}:build"


def _mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    return model.eval(), (torch.randn(2, 8),)


def test_the_key_changes_with_a_weight_the_inputs_and_the_exporter():
    model, inputs = _mlp()
    key = export_key(model, inputs, "dynamo", None, None)
    assert key == export_key(model, inputs, "dynamo", None, None)
    assert key != export_key(model, inputs, "legacy", None, None)
    assert key != export_key(model, inputs, "dynamo", 18, None)
    assert key != export_key(model, (inputs[0] + 1,), "dynamo", None, None)
    with torch.no_grad():
        model[2].bias[0] += 1e-6  # one weight, one element
    assert key != export_key(model, inputs, "dynamo", None, None)


def test_a_second_export_of_the_same_model_is_the_kept_file(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERDIFF_CACHE_DIR", str(tmp_path / "cache"))
    model, inputs = _mlp()
    heard = []
    first = export_onnx(model, inputs, tmp_path / "a.onnx", step=heard.append)
    assert heard == ["exporting to ONNX (dynamo)"]
    kept = list((tmp_path / "cache" / "exports").iterdir())
    assert [p.name for p in kept[0].iterdir()] == ["model.onnx"] and len(kept) == 1

    calls = []
    monkeypatch.setattr(torch.onnx, "export", lambda *a, **k: calls.append(a))
    second = export_onnx(model, inputs, tmp_path / "b.onnx", step=heard.append)
    assert calls == [] and "kept from an earlier run" in heard[-1]
    assert second.read_bytes() == first.read_bytes()
    with torch.no_grad():
        model[0].weight[0, 0] += 0.5
    from layerdiff import _layerdiff

    # a changed weight exports again (here: the stand-in, which makes no file)
    with pytest.raises(_layerdiff.ModelError):
        export_onnx(model, inputs, tmp_path / "c.onnx")
    assert len(calls) == 1


def test_the_command_reuses_the_export_and_no_cache_makes_it_anew(tmp_path):
    env_cache = Path(os.environ["LAYERDIFF_CACHE_DIR"])
    assert cache_folder() == env_cache
    first = run_cli("torch", MLP, "--timings", "--json", str(tmp_path / "1.json"))
    second = run_cli("torch", MLP, "--timings", "--json", str(tmp_path / "2.json"))
    assert first.returncode == second.returncode == 0, second.stderr
    assert "kept from an earlier run" in second.stderr
    fresh = run_cli("torch", MLP, "--no-cache", "--json", str(tmp_path / "3.json"))
    assert "kept from an earlier run" not in fresh.stderr
    assert "exporting to ONNX (dynamo)" in fresh.stderr

    def without_timings(path):
        report = json.loads(path.read_text())
        report.pop("timings", None)
        return report

    # the report is the same whichever way the file came
    assert without_timings(tmp_path / "1.json") == without_timings(tmp_path / "2.json")
    assert (tmp_path / "2.json").read_bytes() != b""
    assert without_timings(tmp_path / "3.json") == without_timings(tmp_path / "1.json")


def test_a_placed_export_edited_in_place_leaves_the_kept_one_alone(tmp_path, monkeypatch):
    """`--out` gets a copy: a user who edits run/model.onnx in place (onnx.save over it) must not
    change what the next run of the same model reuses."""
    monkeypatch.setenv("LAYERDIFF_CACHE_DIR", str(tmp_path / "cache"))
    model, inputs = _mlp()
    placed = export_onnx(model, inputs, tmp_path / "out" / "model.onnx")
    kept = next((tmp_path / "cache" / "exports").iterdir()) / "model.onnx"
    before = kept.read_bytes()
    with open(placed, "r+b") as f:  # in place, same inode
        f.write(b"edited")
    assert kept.read_bytes() == before
    assert export_onnx(model, inputs, tmp_path / "x.onnx", copy=False) == kept


def test_a_model_whose_tensors_cannot_be_keyed_is_exported_every_time(tmp_path, monkeypatch):
    """A tensor whose bytes cannot be read as one block (a sparse one) leaves the model without
    a key: it is exported, never reused and never an error."""
    monkeypatch.setenv("LAYERDIFF_CACHE_DIR", str(tmp_path / "cache"))
    model, inputs = _mlp()
    model.odd = torch.ones(3).to_sparse()  # a tensor attribute, never read by forward
    with pytest.raises(Exception):  # noqa: B017 (what reading its bytes raises is torch's)
        export_key(model, inputs, "dynamo", None, None)
    heard = []
    path = export_onnx(model, inputs, tmp_path / "m.onnx", step=heard.append)
    assert path.is_file() and heard == ["exporting to ONNX (dynamo)"]
    assert not (tmp_path / "cache" / "exports").exists()
