"""A causal self-attention that masks its scores the way transformers does: it adds
`torch.finfo(torch.float32).min` above the diagonal. In float16 that sentinel is no value the
dtype holds (ONNX Runtime's converter clamps it to -65504); in bfloat16 it rounds to the
dtype's largest. Either way the softmax gives the masked positions 0."""

import torch
from torch import nn


class MaskedAttention(nn.Module):
    def __init__(self, width: int = 32, tokens: int = 16):
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        causal = torch.ones(tokens, tokens).triu(1).bool()
        self.register_buffer(
            "mask", torch.zeros(tokens, tokens).masked_fill(causal, torch.finfo(torch.float32).min)
        )

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        scores = scores + self.mask
        return self.out(scores.softmax(dim=-1) @ v)


def build():
    torch.manual_seed(0)
    return MaskedAttention(), (torch.randn(2, 16, 32),)
