"""An MLP whose activations are written as the formulas a runtime computes by approximation:
GELU with `erf` (what the legacy exporter writes for `nn.GELU` below opset 20), GELU with
`tanh`, SiLU (`x·sigmoid(x)`, an `exp`) and a softmax (`exp`), at the small magnitudes deep
layers have. tract's Erf, Tanh and Exp are approximations accurate to a few units in the last
place of float32 near 1 and far more below it: beyond what float32 explains at a layer, within
every tolerance. For the calibration corpus's `file tract` rows and the severity that names an
approximation without failing the run (tests/test_severity.py)."""

from __future__ import annotations

import math

import torch
from torch import nn


class ErfGelu(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


class TanhGelu(nn.Module):
    def forward(self, x):
        k = math.sqrt(2.0 / math.pi)
        return 0.5 * x * (1.0 + torch.tanh(k * (x + 0.044715 * x**3)))


class Silu(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(x)


class Softmax(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


def build():
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for activation in (ErfGelu, TanhGelu, Silu, ErfGelu, TanhGelu, Silu):
        layers += [nn.Linear(256, 256), activation()]
    layers += [nn.Linear(256, 10), Softmax()]
    return nn.Sequential(*layers).eval(), (torch.randn(8, 256),)
