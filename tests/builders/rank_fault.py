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


class _Centred(nn.Module):
    """Subtracts the batch's mean: computes across the batch, which each rank does over its own
    rows only."""

    def forward(self, x):
        return x - x.mean(0)


def across_the_batch():
    """A clean model that computes across the batch (the mean over it): under data
    parallelism its gradient is another function, whatever the ranks do."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), _Centred(), nn.Linear(16, 4)).eval()
    return model, (torch.randn(6, 8),)


class _Pooled(nn.Module):
    """Returns its hidden states and a pooled head the loss never reads (as transformers'
    BertModel does), and then only the hidden states transposed where `transposed`."""

    def __init__(self, transposed: bool = False):
        super().__init__()
        self.body, self.pooler = nn.Linear(8, 8), nn.Linear(8, 8)
        self.transposed = transposed

    def forward(self, x):
        hidden = self.body(x)
        return (hidden.t(),) if self.transposed else (hidden, self.pooler(hidden[0]))


def pooled():
    torch.manual_seed(0)
    return _Pooled().eval(), (torch.randn(4, 8),)


def transposed():
    torch.manual_seed(0)
    return _Pooled(transposed=True).eval(), (torch.randn(4, 8),)
