"""The bench's PyTorch models built as `layerdiff torch` builds them (the same weights and
inputs from the same seed), without importing layerdiff: the predecessor runs in an
environment of its own, which does not have it, and the limit's start-up must not count
layerdiff's import.

    model, inputs = build("resnet18")            # or "vit_b_16", "path/to/file.py:build"
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from torch import nn


def _torchvision(name: str) -> nn.Module:
    import torchvision

    model = getattr(torchvision.models, name)(weights=None)
    if name == "vit_b_16":
        # as layerdiff's zoo: torchvision starts the head at zero, every output zero
        nn.init.normal_(model.heads.head.weight, std=0.02)
    return model


def build(spec: str, seed: int = 0) -> tuple[nn.Module, tuple]:
    """A torchvision model of layerdiff's zoo by name (an image of 1 × 3 × 224 × 224), or a
    builder `path/to/file.py:function` returning (model, inputs), seeded as layerdiff seeds it."""
    if ":" not in spec:
        torch.manual_seed(seed)
        model = _torchvision(spec).eval()
        image = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(seed))
        return model, (image,)
    path, function = spec.rsplit(":", 1)
    loaded = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    torch.manual_seed(seed)
    model, inputs = getattr(module, function)()
    return model.eval(), tuple(inputs)
