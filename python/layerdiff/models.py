"""Models to compare: the built-in ones (torchvision constructors, random weights from the seed)
and a user's builder (`path/to/file.py:build` or `package.module:build`)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import torch
from torch import nn

from layerdiff import _layerdiff


def _torchvision(name: str):
    def build(seed: int):
        import torchvision

        torch.manual_seed(seed)
        model = getattr(torchvision.models, name)(weights=None)
        generator = torch.Generator().manual_seed(seed)
        return model, (torch.randn(1, 3, 224, 224, generator=generator),)

    return build


BUILTIN_MODELS = {
    name: _torchvision(name) for name in ("resnet18", "resnet50", "mobilenet_v3_small", "vit_b_16")
}


def load_builder(spec: str):
    """`resnet18`, `path/to/file.py:build` or `package.module:build` → a function of the seed."""
    if spec in BUILTIN_MODELS:
        return BUILTIN_MODELS[spec]
    if ":" not in spec:
        known = ", ".join(sorted(BUILTIN_MODELS))
        raise _layerdiff.UsageError(
            f"unknown model `{spec}`: expected a built-in name ({known}), "
            "`path/to/file.py:function` or `package.module:function`"
        )
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

    def build(seed: int):
        torch.manual_seed(seed)
        try:
            built = func()
        except Exception as e:
            raise _layerdiff.UsageError(f"`{spec}` raised {type(e).__name__}: {e}") from e
        if not (isinstance(built, tuple) and len(built) == 2 and isinstance(built[0], nn.Module)):
            raise _layerdiff.UsageError(
                f"`{spec}` must return (model, example_inputs), got {type(built).__name__}"
            )
        return built

    return build
