"""A model whose output is an index (a classifier's argmax) compared through PyTorch: the
argmax its own `forward` calls is a layer, compared exactly and held to the indices of its
inputs as the target holds them."""

from __future__ import annotations

import json

from conftest import ROOT, run_cli

CLASSIFIER = f"{ROOT}/tests/builders/classifier.py:build"


def test_a_pytorch_classifiers_changed_predictions_are_a_row_and_their_rounding(tmp_path):
    """In bfloat16 the classifier's predictions change in about 0.3% of its rows. The argmax
    was no layer: the run's output was its logits, "off by 0.9× its tolerance", and not one
    changed prediction was said. It is a row now, its output, and held to the argmax of the
    logits as bfloat16 holds them: precision."""
    out = tmp_path / "report.json"
    result = run_cli("torch", CLASSIFIER, "--target", "torch:bf16", "--json", str(out))
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    (argmax,) = [layer for layer in report["layers"] if layer["name"].endswith(":argmax")]
    assert argmax["dtype"] == "int64" and argmax["cause"] == "precision_loss", argmax
    indices = argmax["baseline"]["indices"]
    assert indices["differ"] > 0 and indices["off_ideal"] == 0, indices
    assert argmax["baseline"]["grid"] == "bfloat16"
    precision = report["summary"]["precision"]
    assert precision["output"] == argmax["name"] and precision["dtype"] == "bfloat16"
    assert precision["output_exact"]["differ"] > 0, precision
    # past its tolerance (none) without bound, for a CI that reads the multiple (it read 0.0)
    assert precision["output_tolerance_multiple"] == "inf", precision
    assert f"the output `{argmax['name']}` (int64, compared exactly) differs in" in result.stdout
