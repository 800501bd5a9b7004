"""A small CNN whose gated block has a wrong low-precision path: below float32 it forgets its
bias (as a hand-written fused kernel for half types might). Every other module is honest, so a
bfloat16 target's only defect is that block: `layerdiff reduce` must cut it down to it alone."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class GatedConv(nn.Module):
    """Conv → sigmoid gate; the half-precision path drops the bias."""

    def __init__(self, channels: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(channels, channels, 3, 3) * 0.2)
        self.bias = nn.Parameter(torch.randn(channels) * 0.5)

    def forward(self, x):
        half = x.dtype in (torch.float16, torch.bfloat16)
        bias = None if half else self.bias  # the fault: the half-precision path
        y = F.conv2d(x, self.weight, bias, padding=1)
        return y * torch.sigmoid(y)


def build():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        GatedConv(16),
        nn.Conv2d(16, 16, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    ).eval()
    return model, (torch.randn(2, 3, 16, 16),)
