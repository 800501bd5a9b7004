"""A model whose one block computes differently only when torch.compile compiles it as a whole:
in that block's own `forward`, between its leaves, `if torch.compiler.is_compiling(): y = y *
1.01` (a stand-in for a faulty fusion across modules). Each leaf compiled alone never sees it
(that code runs in the block, not in a leaf), so `--target torch:compile`, which compiles each
leaf on its own to compare every layer, finds every layer within its tolerance, while the whole
model compiled at once is 1% off. The search over the module tree must name that block, which
sits two levels down (`stages.1.blocks.1`): the model, its `stages`, the second stage, its
`blocks`, the second block. `build_clean` is the twin without the fault: the same model, clean
whichever way it is compiled. `build_first` has the fault in the first block instead: there the
reference's own code ran while the compiled side compiled its first leaves in another thread,
and PyTorch's `is_compiling()`, one flag for the whole process, made the reference take the
faulty path too ("leaf call 3 was `stages.0.blocks.0:mul` this time …: the model does not run
the same way twice", exit 2)."""

from __future__ import annotations

import torch
from torch import nn

FAULTY = "stages.1.blocks.1"


class Block(nn.Module):
    """A pre-norm residual MLP block; `faulty`: its own code scales the hidden values by 1.01
    when compiled."""

    def __init__(self, dim: int, faulty: bool):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * dim, dim)
        self.faulty = faulty

    def forward(self, x):
        y = self.fc1(self.norm(x))
        if self.faulty and torch.compiler.is_compiling():
            y = y * 1.01  # the fault: only a compiler tracing this block as a whole runs it
        return x + self.fc2(self.act(y))


class Stage(nn.Module):
    """Two blocks, the second of them `faulty` where asked."""

    def __init__(self, dim: int, faulty: bool):
        super().__init__()
        self.blocks = nn.Sequential(Block(dim, False), Block(dim, faulty))

    def forward(self, x):
        return self.blocks(x)


class Model(nn.Module):
    def __init__(self, faulty: bool, dim: int = 32):
        super().__init__()
        self.stem = nn.Linear(16, dim)
        self.stages = nn.Sequential(Stage(dim, False), Stage(dim, faulty))
        self.head = nn.Linear(dim, 8)

    def forward(self, x):
        return self.head(self.stages(self.stem(x)))


def _built(faulty: bool, first: bool = False):
    torch.manual_seed(0)
    model = Model(faulty and not first).eval()
    model.stages[0].blocks[0].faulty = first
    return model, (torch.randn(4, 16),)


def build():
    """The block `stages.1.blocks.1` computes differently when compiled as a whole."""
    return _built(True)


def build_clean():
    """The same model without the fault."""
    return _built(False)


def build_first():
    """The first block, `stages.0.blocks.0`, computes differently when compiled as a whole."""
    return _built(True, first=True)
