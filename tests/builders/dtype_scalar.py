"""A small MLP whose second block computes a functional op's scalar argument from the dtype:
its LayerNorm's epsilon is 1e-5 in float32 and 0.5 below it (a fault as a hand-tuned
low-precision path might make). The op is called by the block's own `forward`, between its
submodules, so it is a functional layer (`1:layer_norm`): its local re-run must take the
target's own epsilon, not the reference's, to see it."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self, features: int, fault: bool):
        super().__init__()
        self.fc = nn.Linear(features, features)
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(features))
        self.fault = fault

    def forward(self, x):
        h = self.fc(x)
        low = h.dtype in (torch.float16, torch.bfloat16)
        eps = 0.5 if low and self.fault else 1e-5  # the fault: the low-precision path's epsilon
        return torch.relu(F.layer_norm(h, h.shape[-1:], self.weight, None, eps))


def build():
    torch.manual_seed(0)
    model = nn.Sequential(Block(64, False), Block(64, True), nn.Linear(64, 16)).eval()
    return model, (torch.randn(8, 64) * 0.1,)
