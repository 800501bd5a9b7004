"""The gradient anchor of the validation seed: Linear → GELU → Linear → LayerNorm."""

import torch
from torch import nn


def build():
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64), nn.LayerNorm(64))
    return model, (torch.randn(8, 64),)
