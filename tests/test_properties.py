"""Properties of the Python front door (hypothesis): the command line's parser takes any
arguments without a traceback (a parsed command, or exit 2 with a message); `compare_tensors`
takes any pair of float arrays and agrees with numpy on what numpy computes the same way. (The
report writers' properties are Rust's: crates/layerdiff-core/src/render/properties.rs.)"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from layerdiff import _layerdiff, compare_tensors

VERBS = ["onnx", "torch", "grad", "providers", "audit", "ops", "check", "keras", "reduce", "zoo"]
OPTIONS = [
    "--target", "--reference", "--vs", "--max-memory", "--tolerance", "--fail-on", "--shape",
    "--batch", "--int-range", "--seed", "--json", "--markdown", "--html", "--dtype", "--quiet",
    "--inputs", "--exporter", "--loss", "--batch-sizes", "--no-local", "--bisect", "--repro",
    "--timings", "--float64", "-q", "--help", "--version",
]  # fmt: skip
VALUES = [
    "tract", "ort", "ort:cpu:opt=all", "ort:cuda", "openvino", "4G", "0", "-1", "1e309", "nan",
    "x=1,2", "x=", "=", ",", "5,1", "drift", "defect", "float16", "bf16", "", " ", "é", "../x",
    "/dev/null", "missing.onnx", "resnet18", "auto", "1e-3", "a:b:c", "--", "-",
]  # fmt: skip


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    verb=st.sampled_from(VERBS),
    tokens=st.lists(st.sampled_from(OPTIONS + VALUES) | st.text(max_size=8), max_size=6),
)
def test_the_parser_takes_any_arguments_without_a_traceback(verb, tokens, capfd):
    # the model is always a file that is not there: whatever parses then stops at loading it
    argv = ["layerdiff", verb, "missing.onnx", *tokens]
    try:
        kind, value = _layerdiff.parse_cli(argv)
    except _layerdiff.LayerdiffError:
        return  # a user's mistake, named: the command prints it and exits 2
    if kind == "exit":
        assert value in (0, 1, 2), (argv, value)
        if value == 2:
            assert "error:" in capfd.readouterr().err, argv
    else:  # handed back with the function that runs it
        assert kind == "run" and value[0] in VERBS, (argv, kind, value)


FLOATS = st.sampled_from([np.float16, np.float32, np.float64])


@st.composite
def pairs(draw):
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, max_side=40))
    reference = draw(hnp.arrays(draw(FLOATS), shape))
    target = draw(hnp.arrays(draw(FLOATS), shape))
    return reference, target


@settings(max_examples=200, deadline=None)
@given(pairs())
def test_compare_tensors_agrees_with_numpy(pair):
    reference, target = pair
    stats = compare_tensors(reference, target)
    r, t = reference.astype(np.float64).ravel(), target.astype(np.float64).ravel()
    either_nan = np.isnan(r) | np.isnan(t)
    assert stats["compared"] == int((~either_nan).sum())
    assert stats["nan_mismatch"] == int((np.isnan(r) != np.isnan(t)).sum())
    with np.errstate(invalid="ignore"):
        d = np.where(r == t, 0.0, np.abs(t - r))[~either_nan]
    expected = float(d.max()) if d.size else 0.0
    assert stats["max_abs_diff"] == pytest.approx(expected, rel=0, abs=0) or (
        math.isinf(expected) and stats["max_abs_diff"] == "inf"
    )
    assert json.loads(json.dumps(stats)) == stats


def test_mismatched_sizes_are_an_error_naming_them():
    with pytest.raises(_layerdiff.LayerdiffError, match=r"\[2\].*\[3\]|\[3\].*\[2\]"):
        compare_tensors(np.zeros(2, np.float32), np.zeros(3, np.float32))
