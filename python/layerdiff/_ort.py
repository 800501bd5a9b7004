"""Where the running interpreter's ONNX Runtime is, found without importing it."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path


def library() -> str | None:
    """The libonnxruntime inside the onnxruntime wheel of the running interpreter; ``None`` when
    ``LAYERDIFF_ORT_LIB`` or ``ORT_DYLIB_PATH`` names one (the core honours them) or there is no
    wheel (the core then searches and says where it looked)."""
    if os.environ.get("LAYERDIFF_ORT_LIB") or os.environ.get("ORT_DYLIB_PATH"):
        return None
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or spec.origin is None:
        return None
    capi = Path(spec.origin).parent / "capi"
    candidates = sorted(capi.glob("libonnxruntime.so*")) + sorted(
        capi.glob("libonnxruntime*.dylib")
    )
    return str(candidates[-1]) if candidates else None


def point_at_openvino() -> None:
    """Names the running interpreter's OpenVINO C library in ``LAYERDIFF_OPENVINO_LIB`` (unless
    set), so the core loads the OpenVINO this Python has, as it does ONNX Runtime. Nothing is
    imported; without the wheel the core searches and says where it looked."""
    if os.environ.get("LAYERDIFF_OPENVINO_LIB"):
        return
    spec = importlib.util.find_spec("openvino")
    if spec is None or spec.origin is None:
        return
    libs = Path(spec.origin).parent / "libs"
    candidates = sorted(libs.glob("libopenvino_c.so*")) + sorted(libs.glob("libopenvino_c*.dylib"))
    if candidates:
        os.environ["LAYERDIFF_OPENVINO_LIB"] = str(candidates[-1])
