"""A T5-style RMS norm that starts with a no-op `x.to(torch.float32)`, in a residual block that
reads `x` again after the norm: the legacy exporter records the no-op cast inside the norm's
scope and feeds the residual Add from it, so the norm's scope has two values read outside it."""

import torch
from torch import nn


class RmsNorm(nn.Module):
    def __init__(self, size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size) + 0.1 * torch.randn(size))

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h


class Block(nn.Module):
    def __init__(self, size: int = 32):
        super().__init__()
        self.norm = RmsNorm(size)
        self.proj = nn.Linear(size, size)

    def forward(self, x):
        return x + self.proj(self.norm(x))


def build():
    return Block().eval(), (torch.randn(2, 8, 32) * 3,)
