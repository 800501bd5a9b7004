"""A norm whose epsilon depends on the dtype it computes in: 1e-5 in float32, 1.0 in any other
(a copy-paste slip in a module's own code). In bfloat16 it normalizes wrongly, and so does the
model's float64 copy, whose code takes the same branch: a truth and a same-precision baseline
that agree with the target, not with the float32 reference."""

import torch
from torch import nn


class EpsNorm(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        eps = 1e-5 if x.dtype == torch.float32 else 1.0
        return nn.functional.layer_norm(x, x.shape[-1:], self.weight, None, eps)


class Net(nn.Module):
    def __init__(self, width: int = 64):
        super().__init__()
        self.a = nn.Linear(32, width)
        self.n = EpsNorm(width)
        self.b = nn.Linear(width, 8)

    def forward(self, x):
        return self.b(self.n(torch.relu(self.a(x))))


def build():
    torch.manual_seed(0)
    return Net().eval(), (torch.randn(4, 32),)
