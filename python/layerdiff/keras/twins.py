"""The PyTorch twins of the built-in Keras models: the same architectures in PyTorch, their
modules named as the Keras layers are, so that `layerdiff keras MODEL --torch twin` pairs them
by name. Random weights from the seed (batch norm statistics too, so their conversion is
exercised); the Keras model takes them, converted layer by layer."""

from __future__ import annotations

import torch
from torch import nn

from layerdiff import _layerdiff


class Cnn(nn.Module):
    """`keras_cnn` in PyTorch: the residual add, the global pooling and the input are computed
    outside modules (the Keras layers `residual` and `gap` have no module to pair with)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16, eps=1e-3)  # Keras's default epsilon
        self.relu1 = nn.ReLU()
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.pw = nn.Conv2d(16, 16, 1)
        self.relu2 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU())
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = self.relu1(self.bn1(self.conv1(x)))
        y = self.relu2(x + self.pw(self.dw(x)))
        y = self.conv2(self.pool(y))
        return self.fc(y.mean((2, 3)))


class Encoder(nn.Module):
    """`keras_encoder` in PyTorch: a post-norm BERT-style block."""

    def __init__(self, width: int = 32, heads: int = 4, hidden: int = 64):
        super().__init__()
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm1 = nn.LayerNorm(width, eps=1e-5)
        self.ff1 = nn.Sequential(nn.Linear(width, hidden), nn.GELU())
        self.ff2 = nn.Linear(hidden, width)
        self.norm2 = nn.LayerNorm(width, eps=1e-5)

    def forward(self, x):
        x = self.norm1(x + self.attention(x, x, x, need_weights=False)[0])
        return self.norm2(x + self.ff2(self.ff1(x)))


TWINS = {"keras_cnn": Cnn, "keras_encoder": Encoder}


def twin(name: str, seed: int) -> nn.Module:
    """The built-in twin of the Keras model `name`, seeded."""
    if name not in TWINS:
        raise _layerdiff.UsageError(
            f"`{name}` has no built-in PyTorch twin (those of {', '.join(TWINS)}); give "
            "--torch path/to/file.py:build returning yours"
        )
    torch.manual_seed(seed)
    model = TWINS[name]().eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.normal_(0, 0.3)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.2)
    return model
