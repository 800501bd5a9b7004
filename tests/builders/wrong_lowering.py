"""An MLP whose model is fine, compiled by an Inductor with one wrong lowering: importing this
file patches Inductor's lowering of `aten.sigmoid` to scale its result by 1.05 (as a faulty
compiler release might), so eager is right and only `torch.compile(backend="inductor")` is
off, at the Sigmoid alone. `--bisect` must name Inductor's lowerings, at sigmoid."""

from __future__ import annotations

import torch
from torch import nn
from torch._inductor import lowering

_aten = torch.ops.aten
_right = lowering.lowerings[_aten.sigmoid.default]


def _wrong(x):
    return lowering.lowerings[_aten.mul.Tensor](_right(x), 1.05)


for _op in (_aten.sigmoid.default, _aten.sigmoid):
    lowering.lowerings[_op] = _wrong


def build():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Sigmoid(), nn.Linear(32, 4)
    ).eval()
    return model, (torch.randn(4, 16),)
