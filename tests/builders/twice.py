"""A model that calls one ReLU module twice, with a Dropout (identity at inference) between."""

import torch
from torch import nn


class Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.act = nn.ReLU()
        self.drop = nn.Dropout(0.1)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x):
        x = self.act(self.fc1(x))
        x = self.drop(x)
        return self.act(self.fc2(x))


def build():
    return Twice(), (torch.randn(4, 16),)


def build_wrong_input():
    """Inputs whose feature size does not fit the first Linear layer."""
    return Twice(), (torch.randn(4, 5),)


def build_not_a_tuple():
    return Twice()


def build_training():
    """The model as constructed: in training mode, Dropout active."""
    return Twice().train(), (torch.randn(4, 16),)
