"""Where layerdiff keeps what it can reuse between runs: exports, fetched runtime releases."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def cache_folder() -> Path:
    """Where layerdiff keeps what it can reuse: `LAYERDIFF_CACHE_DIR`, else the platform's
    cache folder (`$XDG_CACHE_HOME/layerdiff`, `~/.cache/layerdiff`)."""
    given = os.environ.get("LAYERDIFF_CACHE_DIR")
    if given:
        return Path(given)
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "layerdiff"
    if os.name == "nt":
        return Path(os.environ.get("LOCALAPPDATA", Path.home())) / "layerdiff" / "Cache"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "layerdiff"
