"""Small models whose ONNX files a test edits after export, so that the file, not the runtime,
computes differently from the model: a GELU whose `approximate` attribute is changed, and a
normalization whose divisor the exporter folds into a constant (from two buffers) that is
changed. ONNX Runtime computes what each edited file says."""

from __future__ import annotations

import torch
from torch import nn


class Normalize(nn.Module):
    """(x − mean) / (2·std): the exporter folds `2·std` into one constant."""

    def __init__(self, features: int):
        super().__init__()
        self.register_buffer("mean", torch.linspace(-0.5, 0.5, features))
        self.register_buffer("std", torch.linspace(0.5, 1.5, features))

    def forward(self, x):
        return (x - self.mean) / (self.std * 2.0)


class GeluBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.act = nn.GELU()
        self.norm = Normalize(32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(self.norm(self.act(self.fc1(x))))


def build():
    torch.manual_seed(0)
    return GeluBlock().eval(), (torch.randn(4, 16),)
