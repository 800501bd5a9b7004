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
