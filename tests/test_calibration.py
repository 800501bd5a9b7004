"""The calibration corpus's quick subset (`scripts/calibrate_baseline.py --quick`): a clean row
of each kind of side (an ONNX float16 file, a dynamic int8 file, OpenVINO, PyTorch bfloat16,
TFLite int8, bfloat16 gradients, a dynamic int8 decoder under `--decode-steps`) must read no
defect, and the planted faults that take seconds (a dtype-dependent epsilon, a weight whose
layer stays under the absolute tolerance, a dynamic int8 file's weight scale) must each be found
at their layer with their cause, and agree at every door (exit code, `check`, `reduce`). `make
calibrate` runs the whole corpus."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli

ROOT = Path(__file__).resolve().parent.parent


def _calibrate():
    spec = importlib.util.spec_from_file_location(
        "calibrate_baseline", ROOT / "scripts" / "calibrate_baseline.py"
    )
    calibrate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(calibrate)
    return calibrate


def test_the_quick_calibration_subset_reads_every_row_as_expected(capsys, monkeypatch):
    calibrate = _calibrate()
    cold = calibrate._layerdiff  # each command in a process of its own, started warm but Keras's
    monkeypatch.setattr(
        calibrate, "_layerdiff",
        lambda *args, env=None: (cold if args[0] == "keras" else run_cli)(*args, env=env),
    )  # fmt: skip
    code = calibrate.main(["--quick"])
    table = capsys.readouterr().out
    assert code == 0, table
    assert "broke" not in table and "**missed**" not in table, table
    # every kind of row ran: clean forward, Keras, gradients, the faults
    assert table.count("| no defect |") == 7, table
    # the three quick faults, each found (named by builder and target, not by place)
    for fault in ("`1:layer_norm` argument_mismatch", "`features.2.0.block.2.fc1` weight_mismatch",
                  "`model.encoder.layer.0.attention.self.value` weight_mismatch"):  # fmt: skip
        assert table.count(f"| {fault} | defect | {fault} |") == 1, (fault, table)


def test_again_runs_only_the_rows_that_broke_or_were_missed(tmp_path):
    """`--again` keeps every row of the written table that read as expected, and runs the rows
    that broke, were missed, or are not there; the table it writes replaces the old one."""
    _calibrate()  # puts scripts/ on the path
    import calibration_table

    header = ["| model | target |", "|---|---|"]
    rows = [
        "| a gradients | torch:bf16 | no defect | precision |",
        "| a gradients | torch:bf16 · 1 thread | no defect | broke: IndexError |",
        "| b (file) | ort | `x` weight_mismatch | **missed** |",
    ]
    doc = tmp_path / "metrics.md"
    begin, end = calibration_table.BEGIN, calibration_table.END
    doc.write_text("\n".join(["text", begin, *header, *rows, end, "after", ""]))
    jobs = [
        ("grad", "a gradients", "torch:bf16"),
        ("grad", "a gradients", "torch:bf16 · 1 thread"),
        ("fault", "b (file)", "ort"),
        ("grad", "c gradients", "torch:bf16"),
    ]
    again = calibration_table.again(jobs, header, doc)
    assert again == [("kept", rows[0]), *jobs[1:]]
    calibration_table.write("\n".join([*header, rows[0]]), doc)
    assert doc.read_text() == "\n".join(["text", begin, *header, rows[0], end, "after", ""])


@pytest.mark.thorough  # the quick subset twice; Ray starts in seconds
def test_the_quick_subset_on_ray_reads_the_rows_it_reads_in_process():
    """`--executor ray` sends each row to a Ray task (layerdiff._executor): the same rows, in
    the same order, as one after another here (each row's time left out)."""
    script = [sys.executable, str(ROOT / "scripts" / "calibrate_baseline.py"), "--quick"]
    here = subprocess.run([*script, "--no-write"], capture_output=True, text=True, cwd=ROOT)
    ray = subprocess.run(
        [*script, "--no-write", "--executor", "ray"], capture_output=True, text=True, cwd=ROOT
    )
    assert here.returncode == 0 and ray.returncode == 0, here.stdout + ray.stdout + ray.stderr

    def rows(out: str) -> list[str]:
        return [line.rsplit("|", 2)[0] for line in out.splitlines() if line.startswith("| ")]

    assert rows(ray.stdout) == rows(here.stdout) and rows(here.stdout), ray.stdout
