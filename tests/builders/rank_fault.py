"""A small convolutional network one of whose layers scales its weight's gradient on rank 1
of a data-parallel run, before the all-reduce (a rank-dependent hook or scale, as a bug would
put it): one process computes it right, so only `layerdiff grad --target torch:ddp=2` sees it,
at that weight, on that rank."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class _Scaled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weight):
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad):
        return grad * 1.01  # the fault: 1% more on this rank


class RankScaledConv(nn.Conv2d):
    """A Conv2d whose weight gradient rank 1 scales."""

    def forward(self, x):
        weight = self.weight
        if dist.is_initialized() and dist.get_rank() == 1:
            weight = _Scaled.apply(weight)
        return self._conv_forward(x, weight, self.bias)


def build():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
        RankScaledConv(8, 8, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5),
    ).eval()  # fmt: skip
    return model, (torch.randn(4, 3, 16, 16),)
