"""A user's builder, `path/to/file.py:function` or `package.module:function`, found and
imported the same way for every framework's verbs (no framework imported here)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from layerdiff import _layerdiff


def builder_function(spec: str):
    """The function `spec` names (`spec` holds a `:`); a `UsageError` says what is wrong."""
    target, func_name = spec.rsplit(":", 1)
    if target.endswith(".py") or "/" in target:
        path = Path(target)
        if not path.is_file():
            raise _layerdiff.UsageError(f"builder file `{target}` does not exist")
        module_spec = importlib.util.spec_from_file_location(
            f"_layerdiff_builder_{path.stem}", path
        )
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_spec.name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as e:
            raise _layerdiff.UsageError(
                f"importing `{target}` failed: {type(e).__name__}: {e}"
            ) from e
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise _layerdiff.UsageError(f"cannot import module `{target}`: {e}") from e
    func = getattr(module, func_name, None)
    if not callable(func):
        raise _layerdiff.UsageError(f"`{target}` has no function `{func_name}`")
    return func
