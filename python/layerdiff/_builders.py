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
        # its folder first on the path, as `python file.py` puts it: a builder imports the
        # files beside it (its model's code), then or when it is called
        folder = str(path.resolve().parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        try:
            module = import_file(f"_layerdiff_builder_{path.stem}", path)
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


def import_file(name: str, path) -> object:
    """The Python file at `path` imported as module `name` (registered in `sys.modules`, so
    that what it defines pickles by that name)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
