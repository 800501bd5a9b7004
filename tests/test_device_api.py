"""Execution providers chosen through ONNX Runtime's device API (`ort:ep=NAME`) and plugin
libraries registered at run time (`ort:ep_lib=PATH[:ep=NAME]`): the EP runs on the devices
ONNX Runtime lists for it, and one that lists none here is refused with the devices there are.
The CPU provider has a device on every machine, so the path that runs is tested with it; a
vendor's plugin (onnxruntime-ep-openvino) is tried where it is installed."""

from __future__ import annotations

import json

import pytest
from conftest import faulty_ops_library, run_cli
from test_onnx_command import report_of


def test_the_cpu_provider_through_the_device_api_computes_what_it_computes_by_name(
    resnet18_onnx, tmp_path
):
    model = str(resnet18_onnx["dynamo"])
    result, report = report_of(tmp_path, model, "--target", "ort:ep=CPUExecutionProvider")
    assert result.returncode == 0, result.stdout + result.stderr
    assert report["summary"]["verdict"] == "no_drift"
    assert report["summary"]["worst"]["max_abs_diff"]["value"] == 0.0
    detail = report["target"]["detail"]
    assert "CPUExecutionProvider (through the device API, on CPU (" in detail, detail


def test_an_execution_provider_with_no_device_here_is_refused_naming_the_devices_there_are(
    resnet18_onnx, tmp_path
):
    model = str(resnet18_onnx["dynamo"])
    result = run_cli("onnx", model, "--target", "ort:ep=NoSuchExecutionProvider", "-q")
    assert result.returncode == 2
    assert "`NoSuchExecutionProvider` offers no device on this machine" in result.stderr
    assert "CPUExecutionProvider (Microsoft) on CPU" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "panicked" not in result.stderr


def test_a_library_that_is_not_an_execution_provider_plugin_is_refused_by_name(
    resnet18_onnx, tmp_path
):
    library = faulty_ops_library()  # a custom-op library: no CreateEpFactories
    result = run_cli("onnx", str(resnet18_onnx["dynamo"]), "--target", f"ort:ep_lib={library}")
    assert result.returncode == 2
    assert f"cannot register the execution provider library `{library}`" in result.stderr
    assert "CreateEpFactories" in result.stderr, result.stderr
    result = run_cli("onnx", str(resnet18_onnx["dynamo"]), "--target", "ort:ep_lib=/nowhere.so")
    assert result.returncode == 2 and "is not a file" in result.stderr, result.stderr


def test_providers_lists_device_api_cells_beside_the_built_in_ones(resnet18_onnx, tmp_path):
    library = faulty_ops_library()
    out = tmp_path / "cells"
    result = run_cli("providers", str(resnet18_onnx["dynamo"]), "--providers", "cpu",
                     "--levels", "disable", "--runtimes",
                     f"ort:ep=CPUExecutionProvider,ort:ep_lib={library}",
                     "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    cells = {c["target"]: c for c in json.loads((out / "providers.json").read_text())["cells"]}
    assert cells["ort:ep=CPUExecutionProvider"]["verdict"] == "no_drift"
    plugin = cells[f"ort:ep_lib={library}"]  # the cell keeps its spelling
    assert plugin["verdict"] == "unavailable" and "CreateEpFactories" in plugin["reason"]


def test_a_vendors_plugin_runs_where_it_offers_a_device_and_says_why_where_not(
    resnet18_onnx, tmp_path
):
    plugin = pytest.importorskip(
        "onnxruntime_ep_openvino",
        reason="no plugin EP installed (pip install onnxruntime-ep-openvino)",
    )
    library = plugin.get_library_path()
    out = tmp_path / "r.json"
    result = run_cli("onnx", str(resnet18_onnx["dynamo"]), "--target", f"ort:ep_lib={library}",
                     "--json", str(out))  # fmt: skip
    if result.returncode == 2:
        # an Intel EP lists Intel's devices only
        assert "none of its execution providers offers a device on this machine" in result.stderr
    else:
        report = json.loads(out.read_text())
        assert "OpenVINOExecutionProvider (plugin from" in report["target"]["detail"]
        assert report["summary"]["verdict"] in ("no_drift", "precision")
