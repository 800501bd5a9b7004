"""A side on another ONNX Runtime or OpenVINO library (`ort:lib=PATH`, `openvino:lib=PATH`): two
releases of one runtime compared in one run, each side in a process of its own, the report naming
both. A release at least as new
as the C API layerdiff's binding asks for runs in layerdiff's own worker; an older one through
its own Python package (`release_worker.py`, started with the interpreter of the virtualenv
that holds it). The older release here is a stand-in, so that no test downloads one: a
virtualenv-shaped folder whose library is named `libonnxruntime.so.1.30.0` and whose Python
imports this environment's onnxruntime. `python -m layerdiff.releases` fetches real ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from conftest import run_cli
from layerdiff import releases
from onnx import TensorProto, helper, numpy_helper

LIBRARY = next(Path(onnxruntime.__file__).parent.glob("capi/libonnxruntime.so.*"))


def _model(path: Path) -> Path:
    """x → Conv → BatchNormalization → Relu → Conv → y: a graph ONNX Runtime rewrites at
    opt=all (the BatchNormalization folded into the first Conv)."""
    rng = np.random.default_rng(0)
    init = [
        numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "w"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "scale"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "bias"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "mean"),
        numpy_helper.from_array(rng.random(8).astype(np.float32) + 0.5, "var"),
        numpy_helper.from_array(rng.standard_normal((4, 8, 1, 1)).astype(np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node(
            "BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["b"], name="bn"
        ),  # fmt: skip
        helper.make_node("Relu", ["b"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2"),
    ]
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [vi("y", TensorProto.FLOAT, None)], init)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.save(model, str(path))
    return path


def _older_release(folder: Path) -> Path:
    """A virtualenv-shaped folder holding `libonnxruntime.so.1.30.0`, whose Python runs this
    environment's (and so imports its onnxruntime): an older release, as layerdiff sees one."""
    capi = folder / "lib" / "python3.11" / "site-packages" / "onnxruntime" / "capi"
    capi.mkdir(parents=True)
    library = capi / "libonnxruntime.so.1.30.0"
    library.symlink_to(LIBRARY)
    (folder / "bin").mkdir()
    python = folder / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return library


def _run(tmp_path: Path, *args: str) -> tuple[int, str, dict | None]:
    out = tmp_path / "r.json"
    result = run_cli("onnx", *args, "--json", str(out))
    assert "Traceback" not in result.stderr and "panicked" not in result.stderr, result.stderr
    return result.returncode, result.stderr, json.loads(out.read_text()) if out.exists() else None


def test_an_older_release_runs_in_its_own_python_and_the_report_names_both(tmp_path):
    model = _model(tmp_path / "m.onnx")
    library = _older_release(tmp_path / "venv")
    code, stderr, report = _run(tmp_path, str(model), "--reference", "ort",
                                "--target", f"ort:lib={library}")  # fmt: skip
    assert code == 0, stderr
    assert report["summary"]["verdict"] == "no_drift"
    assert report["summary"]["layers_compared"] == 4
    reference, target = report["reference"]["detail"], report["target"]["detail"]
    assert f"· onnxruntime {onnxruntime.__version__}, CPUExecutionProvider" in reference, reference
    assert "· onnxruntime 1.30.0, CPUExecutionProvider" in target, target
    assert target.endswith("in a worker process"), target
    assert report["target"]["runtime"] == "onnxruntime"


def test_an_older_release_optimizes_in_its_own_python(tmp_path):
    """`opt=all`: the release saves its optimized graph from its own process, and that graph
    is what is compared (the BatchNormalization folded into the Conv has no value of its own)."""
    model = _model(tmp_path / "m.onnx")
    library = _older_release(tmp_path / "venv")
    code, stderr, report = _run(tmp_path, str(model), "--reference", "ort",
                                "--target", f"ort:opt=all:lib={library}")  # fmt: skip
    assert code in (0, 1), stderr
    assert "graph optimizations: all" in report["target"]["detail"]
    by_name = {layer["name"]: layer for layer in report["layers"]}
    assert by_name["y"]["status"] == "compared"
    assert report["summary"]["layers_compared"] < 4, "the fused value has no counterpart"


def test_a_release_as_new_as_the_binding_runs_in_layerdiffs_own_worker(tmp_path):
    model = _model(tmp_path / "m.onnx")
    code, stderr, report = _run(tmp_path, str(model), "--target", f"ort:lib={LIBRARY}")
    assert code == 0, stderr
    target = report["target"]["detail"]
    assert f"· onnxruntime {onnxruntime.__version__}, CPUExecutionProvider" in target, target
    assert target.endswith("in a worker process"), target


def test_a_library_named_without_its_release_is_named_by_the_library(tmp_path):
    """A vendor's build is often only `libonnxruntime.so`: the report names the release the
    library itself reports, on a worker's side and on this process's alike, never "unknown"."""
    model = _model(tmp_path / "m.onnx")
    vendor = tmp_path / "vendor" / "libonnxruntime.so"
    vendor.parent.mkdir()
    vendor.symlink_to(LIBRARY)
    code, stderr, report = _run(tmp_path, str(model), "--target", f"ort:lib={vendor}")
    assert code == 0, stderr
    target = report["target"]["detail"]
    assert f"· onnxruntime {onnxruntime.__version__}, CPUExecutionProvider" in target, target
    assert target.endswith("in a worker process"), target

    out = tmp_path / "here.json"
    exe = Path(sys.executable).parent / "layerdiff"
    result = subprocess.run(
        [str(exe), "onnx", str(model), "--target", "ort", "--json", str(out)],
        capture_output=True, text=True,
        env={**os.environ, "LAYERDIFF_ORT_LIB": str(vendor)}, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    detail = json.loads(out.read_text())["target"]["detail"]
    assert f"· onnxruntime {onnxruntime.__version__}, CPUExecutionProvider" in detail, detail
    assert not detail.endswith("in a worker process"), detail


def test_a_release_that_cannot_run_is_refused_with_what_to_do(tmp_path):
    model = _model(tmp_path / "m.onnx")
    code, stderr, report = _run(tmp_path, str(model), "--target", "ort:lib=/nowhere/libort.so")
    assert code == 2 and report is None
    assert "cannot load ONNX Runtime from `/nowhere/libort.so`: no such file" in stderr, stderr
    bare = tmp_path / "libonnxruntime.so.1.20.1"
    bare.symlink_to(LIBRARY)
    code, stderr, report = _run(tmp_path, str(model), "--target", f"ort:lib={bare}")
    assert code == 2 and report is None
    assert "ONNX Runtime 1.20 answers C API 20 and older" in stderr, stderr
    assert "python -m layerdiff.releases onnxruntime==1.20.*" in stderr, stderr


def test_a_release_is_asked_for_by_package_and_version(tmp_path, monkeypatch, capsys):
    assert releases.parse("onnxruntime==1.30.0") == ("onnxruntime", "1.30.0")
    assert releases.parse("1.22.1") == ("onnxruntime", "1.22.1")
    assert releases.parse("onnxruntime-gpu==1.31.1") == ("onnxruntime-gpu", "1.31.1")
    for bad in ["onnx==1.17.0", "onnxruntime==latest", "onnxruntime=="]:
        with pytest.raises(releases.ReleaseError, match="is not a release"):
            releases.parse(bad)
    assert releases.main(["tensorflow==2.0"]) == 2
    assert "error: `tensorflow==2.0` is not a release" in capsys.readouterr().err
    # one already fetched is found in the cache, not installed again
    monkeypatch.setenv("LAYERDIFF_CACHE_DIR", str(tmp_path))
    library = _older_release(tmp_path / "runtimes" / "onnxruntime-1.30.0")
    assert releases.fetch("onnxruntime", "1.30.0") == library
    assert releases.main(["onnxruntime==1.30.0"]) == 0
    assert capsys.readouterr().out == f"ort:lib={library}\n"


def _wheel(folder: Path, version: str) -> Path:
    """A wheel shaped as an ONNX Runtime release's (its library a stand-in file), installable
    anywhere: what `pip download onnxruntime==VERSION` leaves, as layerdiff sees it."""
    import base64
    import hashlib
    import zipfile

    name = f"onnxruntime-{version}"
    files = {
        "onnxruntime/__init__.py": b"",
        f"onnxruntime/capi/libonnxruntime.so.{version}": b"a stand-in library",
        f"{name}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: onnxruntime\nVersion: {version}\n".encode()
        ),
        f"{name}.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }

    def digest(data: bytes) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    record = "".join(f"{p},sha256={digest(d)},{len(d)}\n" for p, d in files.items())
    files[f"{name}.dist-info/RECORD"] = (record + f"{name}.dist-info/RECORD,,\n").encode()
    path = folder / f"{name}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for inside, data in files.items():
            z.writestr(inside, data)
    return path


def test_offline_a_release_says_it_needs_the_index_and_its_wheel_file_installs(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("LAYERDIFF_CACHE_DIR", str(tmp_path / "cache"))
    # an index nothing answers at, as on a machine without the internet
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "1")
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "2")
    assert releases.main(["onnxruntime==1.22.1"]) == 2
    err = capsys.readouterr().err
    assert "cannot fetch onnxruntime==1.22.1: the package index cannot be reached" in err, err
    assert "pip download onnxruntime==1.22.1 --no-deps" in err, err
    assert "python -m layerdiff.releases ./onnxruntime-1.22.1-" in err, err
    assert "from versions: none" not in err, err
    assert not list((tmp_path / "cache" / "runtimes").iterdir()), "nothing left behind"
    # the release's wheel file installs without the index
    assert releases.main([str(_wheel(tmp_path, "1.29.0"))]) == 0
    venv = tmp_path / "cache" / "runtimes" / "onnxruntime-1.29.0"
    library = releases.library_in(venv)
    assert library is not None and library.name == "libonnxruntime.so.1.29.0"
    assert capsys.readouterr().out == f"ort:lib={library}\n"
    # its Python runs the release's package with this environment's numpy
    check = "import numpy, onnxruntime; print(onnxruntime.__file__)"
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", check], capture_output=True, text=True
    )
    assert done.returncode == 0 and str(venv) in done.stdout, done.stderr
    for bad, said in [
        (tmp_path / "nowhere.whl", "does not exist"),
        (_model(tmp_path / "m.onnx"), "is not a wheel file"),
    ]:
        assert releases.main([str(bad)]) == 2
        assert said in capsys.readouterr().err


def test_providers_measures_another_release_beside_this_one(tmp_path):
    model = _model(tmp_path / "m.onnx")
    library = _older_release(tmp_path / "venv")
    out = tmp_path / "cells"
    result = run_cli("providers", str(model), "--providers", "cpu", "--levels", "disable",
                     "--runtimes", f"ort:lib={library}", "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    cells = json.loads((out / "providers.json").read_text())["cells"]
    release = next(c for c in cells if c["target"] == f"ort:lib={library}")
    assert release["verdict"] == "no_drift", release


def _openvino_library() -> Path:
    openvino = pytest.importorskip("openvino", reason="OpenVINO is not installed")
    return next(Path(openvino.__file__).parent.glob("libs/libopenvino_c.so.*"))


def test_openvino_on_another_library_runs_in_a_worker_that_describes_it(tmp_path):
    """The worker loads the library and says what its plugin is: the report names that build
    and the precision it resolved, as for OpenVINO in this process."""
    model = _model(tmp_path / "m.onnx")
    library = _openvino_library()
    code, stderr, report = _run(tmp_path, str(model), "--reference", "openvino:precision=f32",
                                "--target", f"openvino:precision=f32:lib={library}")  # fmt: skip
    assert code == 0, stderr
    assert report["summary"]["verdict"] == "no_drift"
    reference, target = report["reference"]["detail"], report["target"]["detail"]
    build = reference.split("OpenVINO ")[1].split(" ")[0]
    assert f"OpenVINO {build} CPU plugin, inference precision f32" in target, target
    assert target.endswith("in a worker process"), target
    assert report["target"]["options"] == {"INFERENCE_PRECISION_HINT": "f32"}
    # a cell of the provider matrix, beside OpenVINO in this process
    out = tmp_path / "cells"
    cell = f"openvino:precision=f32:lib={library}"
    result = run_cli("providers", str(model), "--providers", "cpu", "--levels", "disable",
                     "--runtimes", f"openvino:precision=f32,{cell}", "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    cells = {c["target"]: c for c in json.loads((out / "providers.json").read_text())["cells"]}
    assert cells[cell]["verdict"] == cells["openvino:precision=f32"]["verdict"], cells


def test_a_fault_on_another_openvino_library_is_found_and_its_repro_names_the_library(tmp_path):
    """A weight scaled in the file the other library runs: the defect at its layer, and the
    repro script says which library layerdiff ran it on (it reproduces on this Python's)."""
    from faults import scale_weight

    model = _model(tmp_path / "m.onnx")
    bug = scale_weight(model, tmp_path / "bug.onnx", "y", 1.05)
    library = _openvino_library()
    repro = tmp_path / "repro"
    target = f"openvino:precision=f32:lib={library}"
    code, stderr, report = _run(tmp_path, str(model), "--vs", str(bug), "--target", target,
                                "--repro", str(repro))  # fmt: skip
    assert code == 1, stderr
    assert report["summary"]["drift_origin"] == "y"
    assert report["summary"]["defects"][0]["cause"] == "weight_mismatch"
    script = (repro / "repro.py").read_text()
    assert f"# layerdiff ran the target on\n    #   {library}\n" in script, script
    ran = subprocess.run([sys.executable, "repro.py"], cwd=repro, capture_output=True, text=True)
    assert ran.returncode == 1 and "reproduced" in ran.stdout, ran.stdout + ran.stderr


def test_an_openvino_library_that_is_not_one_is_refused_by_name(tmp_path):
    model = _model(tmp_path / "m.onnx")
    code, stderr, report = _run(tmp_path, str(model), "--target", f"openvino:lib={LIBRARY}")
    assert code == 2 and report is None
    assert f"cannot load OpenVINO from `{LIBRARY}`: it has no `ov_get_openvino_version`" in stderr
    code, stderr, report = _run(tmp_path, str(model), "--target", "openvino:lib=/nowhere/libov.so")
    assert code == 2 and report is None
    assert "cannot load OpenVINO from `/nowhere/libov.so`" in stderr, stderr


def test_an_openvino_release_is_fetched_as_a_side_of_its_own(tmp_path, monkeypatch, capsys):
    assert releases.parse("openvino==2026.4.0") == ("openvino", "2026.4.0")
    # one layerdiff cannot run is refused before it is downloaded
    with pytest.raises(releases.ReleaseError, match="layerdiff runs OpenVINO 2025.1 and later"):
        releases.parse("openvino==2024.6.0")
    monkeypatch.setenv("LAYERDIFF_CACHE_DIR", str(tmp_path))
    libs = tmp_path / "runtimes" / "openvino-2026.4.0" / "lib" / "python3.11" / "site-packages"
    (libs / "openvino" / "libs").mkdir(parents=True)
    library = libs / "openvino" / "libs" / "libopenvino_c.so.2640"
    library.symlink_to(_openvino_library())
    assert releases.fetch("openvino", "2026.4.0") == library
    assert releases.main(["openvino==2026.4.0"]) == 0
    assert capsys.readouterr().out == f"openvino:lib={library}\n"


@pytest.mark.thorough
def test_two_real_openvino_releases_compare_in_one_run(tmp_path):
    """OpenVINO 2026.4.0, fetched from PyPI into the user's cache (once), against the release
    layerdiff loads: one run, both builds named, every layer compared."""
    _openvino_library()
    older = releases.fetch("openvino", "2026.4.0", quiet=True)
    model = _model(tmp_path / "m.onnx")
    code, stderr, report = _run(tmp_path, str(model), "--reference", "openvino:precision=f32",
                                "--target", f"openvino:precision=f32:lib={older}")  # fmt: skip
    assert code in (0, 1), stderr
    assert "OpenVINO 2026.4.0-" in report["target"]["detail"], report["target"]["detail"]
    assert "OpenVINO 2026.4.0-" not in report["reference"]["detail"]
    assert report["summary"]["layers_compared"] == 4


@pytest.mark.thorough
def test_a_kernel_that_changed_between_two_real_releases_is_the_headline(tmp_path):
    """A vendor's Sigmoid (the test custom-op library) planted 1% off when ONNX Runtime 1.30.0
    loads it: 1.31 against the real 1.30.0, fetched from PyPI into the user's cache (once),
    both with the library. The layer where the two releases part is the headline, born there
    (the layers after it only inherit it), and the report names both releases. No float64
    kernel computes a vendor's op, so which release is right stays undecided, and says so."""
    from conftest import faulty_ops_library

    older = releases.fetch("onnxruntime", "1.30.0", quiet=True)
    ops = faulty_ops_library()
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32) * 0.3, "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="matmul"),
        helper.make_node(
            "Sigmoid",
            ["h"],
            ["s"],
            name="vendor_sigmoid",
            domain="layerdiff.test",
            fault="off_on=1.30.0",
        ),  # fmt: skip
        helper.make_node("MatMul", ["s", "w"], ["h2"], name="matmul2"),
        helper.make_node("Relu", ["h2"], ["y"], name="relu"),
    ]
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT, [4, 16])],
                              [vi("y", TensorProto.FLOAT, [4, 16])], [w])  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("layerdiff.test", 1)]
    model = tmp_path / "vendor.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=9), str(model))
    code, stderr, report = _run(tmp_path, str(model), "--reference", f"ort:custom_ops={ops}",
                                "--target", f"ort:lib={older}:custom_ops={ops}")  # fmt: skip
    assert code == 1, stderr
    s = report["summary"]
    assert s["drift_origin"] == "s", s
    assert "onnxruntime 1.31" in report["reference"]["detail"]
    assert "onnxruntime 1.30.0" in report["target"]["detail"]
    layer = next(layer for layer in report["layers"] if layer["name"] == "s")
    assert layer["local"]["max_abs_diff"] > 1e-3
    assert "nor which side computes it right" in layer["detail"], layer["detail"]
    after = [layer for layer in report["layers"] if layer["name"] in ("h2", "y")]
    assert all(layer["local"]["max_abs_diff"] < 1e-5 for layer in after), after
    # the same release on both sides: the library computes the same
    code, stderr, report = _run(tmp_path, str(model), "--reference", f"ort:custom_ops={ops}",
                                "--target", f"ort:custom_ops={ops}")  # fmt: skip
    assert code == 0 and report["summary"]["verdict"] == "no_drift", stderr
