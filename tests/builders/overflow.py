"""A block whose hidden activations reach ~1e5, past float16's largest finite value (65504),
before a LayerNorm brings them back: float32 is fine, float16 overflows to Inf in the first
Linear and the norm turns that into NaN. Keeping that Linear (and the norm) in float32 is the
fix, as for T5's feed-forward layers in float16."""

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(32, 64)
        self.up = nn.Linear(64, 256)
        self.norm = nn.LayerNorm(256)
        self.act = nn.GELU()
        self.down = nn.Linear(256, 64)
        self.head = nn.Linear(64, 10)
        with torch.no_grad():
            self.up.weight.mul_(1e5)

    def forward(self, x):
        h = self.embed(x)
        h = self.act(self.norm(self.up(h)))
        return self.head(self.down(h))


def build():
    torch.manual_seed(0)
    return Block(), (torch.randn(4, 32),)
