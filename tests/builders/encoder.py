"""A small transformer encoder (2 layers, d_model 64) with random weights: LayerNorm, attention
and feed-forward layers for the cause tests."""

import torch
from torch import nn


def build():
    layer = nn.TransformerEncoderLayer(
        d_model=64, nhead=4, dim_feedforward=128, dropout=0.0, batch_first=True
    )
    model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    return model, (torch.randn(1, 16, 64),)
