"""A GPT-2-style decoder built from a config, with random weights: token and position
embeddings, pre-LayerNorm blocks of causal self-attention (scores written out, so every
head's T×T matrix is a value of the graph) and a GELU MLP, a final LayerNorm and an LM head.

Intermediate values grow with batch × tokens² × heads × layers, which is what the
bounded-memory tests and `make bench` need: a model whose activations do not fit.
"""

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Config:
    layers: int = 12
    heads: int = 12
    width: int = 768
    tokens: int = 1024
    vocab: int = 8192
    batch: int = 1

    def value_bytes(self) -> int:
        """About how many bytes of float32 values one forward pass produces (the attention
        scores dominate): a sizing aid, not a measurement."""
        b, t, w, h = self.batch, self.tokens, self.width, self.heads
        per_block = 4 * b * h * t * t + 30 * b * t * w
        return 4 * (self.layers * per_block + b * t * self.vocab)


class Block(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.heads = c.heads
        self.ln_1 = nn.LayerNorm(c.width)
        self.qkv = nn.Linear(c.width, 3 * c.width)
        self.proj = nn.Linear(c.width, c.width)
        self.ln_2 = nn.LayerNorm(c.width)
        self.fc = nn.Linear(c.width, 4 * c.width)
        self.act = nn.GELU()
        self.out = nn.Linear(4 * c.width, c.width)
        mask = torch.tril(torch.ones(c.tokens, c.tokens, dtype=torch.bool))
        self.register_buffer("mask", mask, persistent=False)

    def attention(self, x):
        b, t, w = x.shape
        q, k, v = self.qkv(x).split(w, dim=2)
        heads = lambda y: y.view(b, t, self.heads, w // self.heads).transpose(1, 2)  # noqa: E731
        q, k, v = heads(q), heads(k), heads(v)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(w // self.heads)
        scores = scores.masked_fill(~self.mask[:t, :t], float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, w))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.out(self.act(self.fc(self.ln_2(x))))


class Decoder(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.wte = nn.Embedding(c.vocab, c.width)
        self.wpe = nn.Embedding(c.tokens, c.width)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.ln_f = nn.LayerNorm(c.width)
        self.head = nn.Linear(c.width, c.vocab, bias=False)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.wte(ids) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def build(config: Config = Config(layers=2, heads=4, width=64, tokens=32, vocab=256)):
    """The decoder and its example input (token ids of shape batch × tokens)."""
    model = Decoder(config)
    ids = torch.randint(0, config.vocab, (config.batch, config.tokens))
    return model, (ids,)
