"""A fixed sample of the ONNX backend node tests through `layerdiff onnx` with `expected:` as
reference (the full run writes docs/conformance.md: `make conformance`)."""

from __future__ import annotations

import sys

import numpy as np
import onnx
import pytest
from conftest import ROOT
from onnx import numpy_helper

sys.path.insert(0, str(ROOT / "scripts"))
conformance = pytest.importorskip("conformance")

PASSING = [
    "test_abs",
    "test_relu",
    "test_add_bcast",
    "test_matmul_2d",
    "test_conv_with_strides_padding",
    "test_softmax_axis_1",
    "test_maxpool_2d_pads",
    "test_layer_normalization_2d_axis0",
]


@pytest.fixture(scope="module")
def cases():
    wanted = {*PASSING, "test_identity_sequence", "test_reversesequence_batch"}
    return {c.name: c for c in conformance.collect_cases() if c.name in wanted}


@pytest.mark.parametrize("runtime", ["ort", "tract"])
def test_sample_passes_on_both_runtimes(cases, tmp_path, runtime):
    for name in PASSING:
        assert conformance.write_case(cases[name], tmp_path / name) is None
        category, diff, message = conformance.run_case(tmp_path / name, runtime)
        assert category == "pass", (name, runtime, message)
        assert diff is not None and diff <= 1e-4


def test_a_wrong_expected_value_is_a_numeric_mismatch(cases, tmp_path):
    folder = tmp_path / "relu"
    conformance.write_case(cases["test_relu"], folder)
    out = folder / "test_data_set_0" / "output_0.pb"
    values = numpy_helper.to_array(onnx.load_tensor_from_string(out.read_bytes())).copy()
    values.reshape(-1)[5] += np.float32(0.5)
    out.write_bytes(numpy_helper.from_array(values).SerializeToString())
    category, diff, _ = conformance.run_case(folder, "ort")
    assert (category, diff) == ("numeric mismatch", 0.5)


def test_sequences_are_not_runnable_and_unknown_ops_are_refused(cases, tmp_path):
    assert "non-tensor" in conformance.write_case(cases["test_identity_sequence"], tmp_path / "seq")
    conformance.write_case(cases["test_reversesequence_batch"], tmp_path / "rev")
    category, _, message = conformance.run_case(tmp_path / "rev", "tract")
    assert category == "unsupported" and "ReverseSequence" in message
