"""The ops `layerdiff ops` runs, as data: the PyTorch call, its inputs (shapes from transformer
and CNN layers, and edge values), how many terms it reduces into one output element (K), how
many intermediate results its usual decomposition rounds to the dtype (stages), and what its
error scales with (magnitude). docs/ops.md explains the rule these feed.

Inputs are spelled as tuples (a collective's shape starts with "ranks": one row per rank):
  ("randn", shape[, scale[, shift]])   normal values, scaled and shifted
  ("uniform", shape, lo, hi)           uniform values (positive inputs of log, sqrt, pow)
  ("int", shape, lo, hi)               int64 indices in [lo, hi)
  ("perm", shape)                      int64, each row a permutation of range(shape[-1]) (unique
                                       scatter targets, so the result does not depend on order)
  ("bool", shape)                      a random condition
  ("masked", shape)                    normal values, -inf above the last two dims' diagonal (a
                                       causal attention mask)
  ("ones", shape) / ("zeros", shape)   batch-norm statistics and the like

Magnitudes:
  terms       the op applied to the inputs' absolute values (ops linear in them: Σ|terms|)
  value       |y| (a relative error)
  input       max(|y|, |x|) for ops whose formula cancels (GELU's 1 + erf(x/√2))
  normalized  (|x| + |mean|)/σ·|weight| + |bias|: normalizations
  softmax     |y|·(1 + |x − max|): exp's condition number, row by row
  attention   (P ⊙ (1 + |Q||K|ᵀ·scale)) @ |V|: a score's error moves its probability
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Transformer sizes (BERT/GPT-2 base: hidden 768, 12 heads of 64, MLP 3072, 128 tokens) and CNN
# sizes (ResNet stages: 64 channels at 56×56, the 7×7 stem on 224×224).
T, H, D, HEADS, MLP = 128, 768, 64, 12, 3072


@dataclass(frozen=True)
class Case:
    """One op with its inputs and its error model."""

    name: str
    call: str
    inputs: tuple
    kwargs: dict = field(default_factory=dict)
    reduction: int = 1
    stages: int = 0
    magnitude: str = "value"
    # Names of the last inputs, passed by keyword (`weight`, `bias` of F.layer_norm).
    keywords: tuple = ()
    # A collective that sums one term per rank (all_reduce, reduce_scatter): K is the ranks.
    sums_ranks: bool = False

    @property
    def collective(self) -> bool:
        """Whether it runs across the ranks of a `torch:ddp=N` backend (`_collectives`)."""
        return self.call.startswith("dist.")

    def terms(self, ranks: int = 1) -> int:
        """K, the terms each output element sums, on a backend of `ranks` processes."""
        return ranks if self.sums_ranks else self.reduction

    def describe_call(self) -> str:
        if self.collective:
            terms = " (K: the backend's ranks)" if self.sums_ranks else ""
            return f"{self.call} across the ranks, each on its own row{terms}"
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        return f"{self.call}({args})" if args else self.call


def _cases() -> list[Case]:
    r = "randn"
    return [
        # Matrix products: K terms per output, error in proportion to Σ|a·b|.
        Case("matmul", "torch.matmul", ((r, (256, 256)), (r, (256, 256))), reduction=256,
             magnitude="terms"),
        Case("bmm", "torch.bmm", ((r, (HEADS, T, D)), (r, (HEADS, D, T))), reduction=D,
             magnitude="terms"),
        Case("addmm", "torch.addmm", ((r, (H,)), (r, (T, H)), (r, (H, H), 0.036)), reduction=H,
             magnitude="terms"),
        Case("linear", "F.linear", ((r, (2, T, H)), (r, (MLP, H), 0.036), (r, (MLP,))),
             reduction=H, magnitude="terms"),
        Case("linear_empty_batch", "F.linear", ((r, (0, H)), (r, (H, H), 0.036)), reduction=H,
             magnitude="terms"),
        # Activations.
        Case("relu", "F.relu", ((r, (2, T, MLP)),)),
        Case("relu_empty", "F.relu", ((r, (0, H)),)),
        Case("gelu", "F.gelu", ((r, (2, T, MLP), 3.0),), stages=4, magnitude="input"),
        Case("gelu_tanh", "F.gelu", ((r, (2, T, MLP), 3.0),), {"approximate": "tanh"},
             stages=6, magnitude="input"),
        Case("silu", "F.silu", ((r, (2, T, MLP), 3.0),), stages=1),
        Case("sigmoid", "torch.sigmoid", ((r, (2, T, H), 4.0),)),
        Case("tanh", "torch.tanh", ((r, (2, T, H), 2.0),)),
        # Normalizations: K values in each mean and variance.
        Case("layer_norm", "F.layer_norm", ((r, (2, T, H)), (r, (H,)), (r, (H,))),
             {"normalized_shape": (H,)}, reduction=H, magnitude="normalized",
             keywords=("weight", "bias")),
        Case("layer_norm_offset", "F.layer_norm", ((r, (2, T, H), 1.0, 1000.0),),
             {"normalized_shape": (H,)}, reduction=H, magnitude="normalized"),
        Case("rms_norm", "F.rms_norm", ((r, (2, T, H)), (r, (H,))),
             {"normalized_shape": (H,), "eps": 1e-6}, reduction=H, stages=4,
             keywords=("weight",)),
        Case("group_norm", "F.group_norm", ((r, (2, 64, 28, 28)), (r, (64,)), (r, (64,))),
             {"num_groups": 32}, reduction=2 * 28 * 28, stages=2, magnitude="normalized",
             keywords=("weight", "bias")),
        Case("batch_norm", "F.batch_norm",
             ((r, (2, 64, 56, 56)), (r, (64,), 0.1), ("uniform", (64,), 0.5, 2.0), (r, (64,)),
              (r, (64,))), magnitude="normalized"),
        # Softmax and its log: K terms in each row's sum.
        Case("softmax", "F.softmax", ((r, (2, HEADS, T, T)),), {"dim": -1}, reduction=T,
             magnitude="softmax"),
        Case("softmax_large_logits", "F.softmax", ((r, (2, HEADS, T, T), 50.0),), {"dim": -1},
             reduction=T, magnitude="softmax"),
        Case("softmax_masked", "F.softmax", (("masked", (2, HEADS, T, T)),), {"dim": -1},
             reduction=T, magnitude="softmax"),
        Case("log_softmax", "F.log_softmax", ((r, (8, 32000)),), {"dim": -1}, reduction=32000,
             magnitude="input"),
        # Reductions.
        Case("sum_1m", "torch.sum", ((r, (1 << 20,)),), reduction=1 << 20, magnitude="terms"),
        Case("sum_rows", "torch.sum", ((r, (2, T, H)),), {"dim": -1}, reduction=H,
             magnitude="terms"),
        Case("mean", "torch.mean", ((r, (2, T, H)),), {"dim": -1}, reduction=H,
             magnitude="terms"),
        Case("mean_near_zero", "torch.mean", ((r, (2, T, H), 1e-5),), {"dim": -1}, reduction=H,
             magnitude="terms"),
        Case("amax", "torch.amax", ((r, (2, T, H)),), {"dim": -1}),
        Case("argmax", "torch.argmax", ((r, (8, 32000)),), {"dim": -1}),
        Case("cumsum", "torch.cumsum", ((r, (8, 4096)),), {"dim": -1}, reduction=4096,
             magnitude="terms"),
        # Elementwise arithmetic.
        Case("add", "torch.add", ((r, (2, T, H)), (r, (2, T, H))), magnitude="terms"),
        Case("mul", "torch.mul", ((r, (2, T, H)), (r, (2, T, H)))),
        Case("div", "torch.div", ((r, (2, T, H)), (r, (2, T, H)))),
        Case("pow", "torch.pow",
             (("uniform", (2, T, H), 0.1, 4.0), ("uniform", (2, T, H), -2.0, 2.0))),
        Case("exp", "torch.exp", ((r, (2, T, H), 3.0),)),
        Case("exp_overflow", "torch.exp", ((r, (2, T, H), 3.0, 8.0),)),
        Case("exp_negative", "torch.exp", ((r, (2, T, H), 3.0, -12.0),)),
        Case("log", "torch.log", (("uniform", (2, T, H), 1e-3, 100.0),)),
        Case("sqrt", "torch.sqrt", (("uniform", (2, T, H), 1e-3, 100.0),)),
        Case("rsqrt", "torch.rsqrt", (("uniform", (2, T, H), 1e-3, 100.0),)),
        # Indexing: exact copies.
        Case("embedding", "F.embedding", (("int", (2, T), 0, 8192), (r, (8192, H)))),
        Case("index_select", "torch.index_select", ((r, (1024, H)), ("int", (256,), 0, 1024)),
             {"dim": 0}, keywords=("index",)),
        Case("gather", "torch.gather", ((r, (8, 1000)), ("int", (8, 50), 0, 1000)), {"dim": 1},
             keywords=("index",)),
        Case("scatter", "torch.scatter", ((r, (8, 1000)), ("perm", (8, 1000)), (r, (8, 1000))),
             {"dim": 1}, keywords=("index", "src")),
        Case("where", "torch.where", (("bool", (2, T, H)), (r, (2, T, H)), (r, (2, T, H)))),
        # Convolutions and pooling: K = input channels × kernel size.
        Case("conv1d", "F.conv1d", ((r, (2, 256, 1024)), (r, (256, 256, 3), 0.036)),
             {"padding": 1}, reduction=256 * 3, magnitude="terms"),
        Case("conv2d", "F.conv2d", ((r, (1, 64, 56, 56)), (r, (64, 64, 3, 3), 0.04)),
             {"padding": 1}, reduction=64 * 9, magnitude="terms"),
        Case("conv2d_7x7_stem", "F.conv2d", ((r, (1, 3, 224, 224)), (r, (64, 3, 7, 7), 0.08)),
             {"stride": 2, "padding": 3}, reduction=3 * 49, magnitude="terms"),
        Case("conv_transpose2d", "F.conv_transpose2d",
             ((r, (1, 64, 28, 28)), (r, (64, 32, 4, 4), 0.03)), {"stride": 2, "padding": 1},
             reduction=64 * 16, magnitude="terms"),
        Case("max_pool2d", "F.max_pool2d", ((r, (1, 64, 112, 112)),),
             {"kernel_size": 3, "stride": 2, "padding": 1}),
        Case("avg_pool2d", "F.avg_pool2d", ((r, (1, 64, 56, 56)),), {"kernel_size": 2},
             reduction=4, magnitude="terms"),
        Case("interpolate_bilinear", "F.interpolate", ((r, (1, 64, 28, 28)),),
             {"scale_factor": 2.0, "mode": "bilinear", "align_corners": False}, reduction=4,
             magnitude="terms"),
        # Attention: scores over D, weighted sums over T; exported as MatMul → Softmax → MatMul.
        Case("scaled_dot_product_attention", "F.scaled_dot_product_attention",
             ((r, (1, HEADS, T, D)), (r, (1, HEADS, T, D)), (r, (1, HEADS, T, D))),
             reduction=T, stages=2, magnitude="attention"),
        Case("sdpa_causal", "F.scaled_dot_product_attention",
             ((r, (1, HEADS, T, D)), (r, (1, HEADS, T, D)), (r, (1, HEADS, T, D))),
             {"is_causal": True}, reduction=T, stages=2, magnitude="attention"),
        # Collectives across the ranks of a `torch:ddp=N` backend, one row per rank (a 1M
        # gradient bucket's worth of values): sums of one term per rank, and exact copies.
        Case("all_reduce", "dist.all_reduce", ((r, ("ranks", 1 << 18)),), sums_ranks=True,
             magnitude="terms"),
        Case("reduce_scatter", "dist.reduce_scatter", ((r, ("ranks", 1 << 18)),),
             sums_ranks=True, magnitude="terms"),
        Case("all_gather", "dist.all_gather", ((r, ("ranks", 1 << 18)),)),
        Case("broadcast", "dist.broadcast", ((r, ("ranks", 1 << 18)),)),
    ]  # fmt: skip


CASES: dict[str, Case] = {c.name: c for c in _cases()}
