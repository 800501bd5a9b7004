"""A model whose export bakes the batch size in: `int(h.shape[0])` is a Python number to the
tracer, so the legacy exporter writes the export's batch as a constant. PyTorch is right at
every batch size; the ONNX file only at the one it was traced with."""

import torch
from torch import nn


class RowOffset(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        h = self.fc1(x)
        rows = int(h.shape[0])
        h = h + torch.arange(rows, dtype=h.dtype)[:, None] * 0.01
        return self.fc2(h)


def build():
    torch.manual_seed(0)
    return RowOffset(), (torch.randn(1, 16),)
