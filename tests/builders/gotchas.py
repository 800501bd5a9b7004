"""Models that mislead a comparison unless it catches them: one that is random in eval mode,
one whose input the legacy exporter turns into a constant, one the dynamo export keeps an input
of that no node reads, and one given float64 inputs."""

import torch
import torch.nn.functional as F
from torch import nn


class Random(nn.Module):
    """Dropout called with training=True: every run differs, in eval mode too."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(F.dropout(self.fc1(x), 0.5, training=True))


class Scaled(nn.Module):
    """`scale.item()` is a Python number to the tracer: the export bakes the example's."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x, scale):
        return self.fc(x) * float(scale.item())


class Ignores(nn.Module):
    """Takes a mask and never reads it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x, mask):
        return self.fc(x)


class Casts(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc(x.float())


def build_random():
    torch.manual_seed(0)
    return Random(), (torch.randn(2, 16),)


def build_scaled():
    torch.manual_seed(0)
    return Scaled(), (torch.randn(2, 16), torch.tensor(3.0))


def build_ignores():
    torch.manual_seed(0)
    return Ignores(), (torch.randn(2, 16), torch.ones(2, 16))


def build_float64():
    torch.manual_seed(0)
    return Casts(), (torch.randn(2, 16, dtype=torch.float64),)
