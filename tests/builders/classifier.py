"""A classifier whose output is its prediction, the argmax of its logits, as a deployed file
often ends: the output is int64 and compared exactly, and where rounding the logits to
float16 breaks a near tie, a prediction changes. Its head is scaled so that the logits are
about ±10 and float16's steps in them 1/128 or 1/64: 16384 rows meet a few such ties."""

from __future__ import annotations

import torch
from torch import nn


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 256)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x):
        return torch.argmax(self.fc2(self.act(self.fc1(x))), dim=-1)


def build():
    torch.manual_seed(0)
    model = Classifier().eval()
    with torch.no_grad():
        model.fc2.weight.mul_(40.0)
    return model, (torch.randn(16384, 64),)
