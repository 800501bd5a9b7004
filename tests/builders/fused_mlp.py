"""A residual MLP block whose MLP has a hand-written half-precision path, as a fused kernel
would: below float32 it reads its Linears' weights itself instead of calling them, and forgets
the second bias. A target in bfloat16 then calls other submodules than the model in float32
(none of `fc1`, `act`, `fc2`, and a `gelu` of its own): the lockstep cannot follow it call by
call, so that MLP must be compared whole, and it is the one defect."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class FusedMlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        if x.dtype in (torch.float16, torch.bfloat16):  # the "fused kernel"
            return F.linear(F.gelu(F.linear(x, self.fc1.weight, self.fc1.bias)), self.fc2.weight)
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mlp = FusedMlp(dim, 4 * dim)

    def forward(self, x):
        return x + self.mlp(self.norm(x))


def build():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), Block(32), Block(32), nn.Linear(32, 10))
    with torch.no_grad():
        model[2].mlp.fc2.bias.zero_()  # its path is right: it has no bias to forget
        model[3].mlp.fc2.bias.normal_(0, 0.5)
    return model.eval(), (torch.randn(4, 16),)
