"""A deep MLP whose activations grow layer by layer (weights scaled up), so float32 rounding
alone crosses 1e-4 in the later layers: drift that is rounding, not a bug."""

import torch
from torch import nn


def build():
    layers = []
    for _ in range(8):
        linear = nn.Linear(512, 512)
        with torch.no_grad():
            linear.weight.mul_(8.0)
        layers += [linear, nn.ReLU()]
    return nn.Sequential(*layers), (torch.randn(4, 512),)
