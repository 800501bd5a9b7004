"""An MLP with a block whose backward is wrong in half precision (a hand-written autograd
Function whose half-precision gradient is scaled by 1.25 too much): its forward is right on
every side, so only `layerdiff grad` against a bfloat16 target sees it, in that block's
backward; the repro is that block's backward alone."""

from __future__ import annotations

import torch
from torch import nn


class _Doubled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.half = x.dtype in (torch.float16, torch.bfloat16)
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * (2.5 if ctx.half else 2.0)  # the fault: the half-precision path


class Doubled(nn.Module):
    def forward(self, x):
        return _Doubled.apply(x)


def build():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(16, 32), nn.Tanh(), Doubled(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4)
    ).eval()
    return model, (torch.randn(8, 16),)
