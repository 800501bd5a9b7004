"""Inputs like the example's, of another shape or drawn again: floating inputs with the same
mean and spread, integers (token ids, indices) from the same range, booleans at random; seeded.
What the int8 quantizer calibrates on, and what a model is checked with along a batch or shape
axis."""

from __future__ import annotations

import torch


def like(example: torch.Tensor, shape, generator: torch.Generator) -> torch.Tensor:
    """A tensor of `shape` drawn like `example`."""
    shape = tuple(shape)
    if example.is_floating_point():
        wide = example.detach().float()
        std = wide.std() if wide.numel() > 1 else torch.tensor(1.0)
        drawn = torch.randn(shape, generator=generator) * std + wide.mean()
        return drawn.to(example.dtype)
    if example.dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    low, high = int(example.min()), int(example.max())
    return torch.randint(low, high + 1, shape, generator=generator).to(example.dtype)


def inputs_at(example: tuple, shapes, seed: int) -> tuple:
    """Inputs of `shapes` (one per input) drawn like `example`, seeded; where a shape is the
    example's own, the example itself."""
    generator = torch.Generator().manual_seed(seed)
    return tuple(
        t if tuple(t.shape) == tuple(shape) else like(t, shape, generator)
        for t, shape in zip(example, shapes, strict=True)
    )


def variations(example: tuple, count: int, seed: int) -> list[tuple]:
    """`count` redraws of the example inputs, same shapes."""
    generator = torch.Generator().manual_seed(seed)
    return [tuple(like(t, t.shape, generator) for t in example) for _ in range(count)]
