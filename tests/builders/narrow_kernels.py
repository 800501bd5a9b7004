"""Modules whose kernel is wrong in a narrow dtype only, planted in real models for the defect
tests: in float32 (and float64) each computes what its PyTorch module does; in bfloat16 or
float16 it adds its products one by one to a running sum held in that dtype, as a kernel that
does not accumulate in float32 does. The wrong-backward modules compute their forward right
and, in the narrow dtype, scale their weight's gradient by 1.02 (a backward kernel that is off
where the forward is right)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

NARROW = (torch.float16, torch.bfloat16)


def _sibling(name: str):
    """A builder beside this file, whether it is imported as `builders.narrow_kernels` (the
    tests) or loaded by path (`layerdiff grad tests/builders/narrow_kernels.py:…`)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_narrow_kernels_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _narrow_sum(products: torch.Tensor) -> torch.Tensor:
    """Sums the last dimension into a running sum held in the products' dtype."""
    total = torch.zeros(products.shape[:-1], dtype=products.dtype, device=products.device)
    for k in range(products.shape[-1]):
        total = total + products[..., k]
    return total


class NarrowLinear(nn.Linear):
    """A Linear that accumulates in the narrow dtype (see the module docs)."""

    def forward(self, x):
        if x.dtype not in NARROW:
            return super().forward(x)
        y = _narrow_sum(x.unsqueeze(-2) * self.weight)
        return y if self.bias is None else y + self.bias


class NarrowConv2d(nn.Conv2d):
    """A Conv2d (groups 1) that accumulates in the narrow dtype (see the module docs)."""

    def forward(self, x):
        if x.dtype not in NARROW:
            return super().forward(x)
        n, _, h, w = x.shape
        cols = F.unfold(x, self.kernel_size, self.dilation, self.padding, self.stride)
        out_h = h + 2 * self.padding[0] - self.dilation[0] * (self.kernel_size[0] - 1) - 1
        out_h = out_h // self.stride[0] + 1
        out_w = w + 2 * self.padding[1] - self.dilation[1] * (self.kernel_size[1] - 1) - 1
        out_w = out_w // self.stride[1] + 1
        weight = self.weight.reshape(self.out_channels, -1)
        # (n, L, 1, K) * (O, K) → (n, L, O, K), summed over K in the narrow dtype
        y = _narrow_sum(cols.transpose(1, 2).unsqueeze(-2) * weight)
        y = y.transpose(1, 2).reshape(n, self.out_channels, out_h, out_w)
        return y if self.bias is None else y + self.bias.reshape(1, -1, 1, 1)


class _WrongWeightGrad(torch.autograd.Function):
    """Identity forward; backward passes the gradient on, and (in a narrow dtype) scales the
    gradient that reaches the weight by `factor`."""

    @staticmethod
    def forward(ctx, weight, factor):
        ctx.factor = factor if weight.dtype in NARROW else 1.0
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


class _NoisyWeightGrad(torch.autograd.Function):
    """Identity forward; backward passes the gradient on, and (in a narrow dtype) adds to the
    gradient that reaches the weight random noise of `relative` times its mean magnitude (a
    fixed seed): an error of a rounding's size whose shape no rounding has."""

    @staticmethod
    def forward(ctx, weight, relative):
        ctx.relative = relative if weight.dtype in NARROW else 0.0
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad):
        if not ctx.relative:
            return grad, None
        draw = torch.Generator(device=grad.device).manual_seed(0)
        noise = torch.randn(grad.shape, generator=draw, dtype=torch.float32, device=grad.device)
        scale = ctx.relative * grad.float().abs().mean()
        return (grad.float() + noise * scale).to(grad.dtype), None


class WrongBackwardLinear(nn.Linear):
    """A Linear whose forward is right in every dtype and whose backward, in a narrow dtype,
    makes its weight's gradient 2% too large."""

    FACTOR = 1.02

    def forward(self, x):
        return F.linear(x, _WrongWeightGrad.apply(self.weight, self.FACTOR), self.bias)


class ShortBackwardLinear(WrongBackwardLinear):
    """The same, its weight's gradient 2% short: leaning as a stalled narrow sum leans (toward
    zero), on a weight whose sums do not stall."""

    FACTOR = 0.98


class NoisyBackwardLinear(nn.Linear):
    """A Linear whose forward is right in every dtype and whose backward, in a narrow dtype,
    adds random noise of 5% of its weight gradient's mean magnitude to it."""

    RELATIVE = 0.05

    def forward(self, x):
        return F.linear(x, _NoisyWeightGrad.apply(self.weight, self.RELATIVE), self.bias)


class WrongBackwardConv2d(nn.Conv2d):
    """A Conv2d whose forward is right in every dtype and whose backward, in a narrow dtype,
    makes its weight's gradient 2% too large."""

    def forward(self, x):
        return self._conv_forward(x, _WrongWeightGrad.apply(self.weight, 1.02), self.bias)


def _swap(parent: nn.Module, name: str, kind) -> None:
    old = getattr(parent, name)
    if isinstance(old, nn.Linear):
        new = kind(old.in_features, old.out_features, bias=old.bias is not None)
    else:
        new = kind(
            old.in_channels, old.out_channels, old.kernel_size, old.stride, old.padding,
            old.dilation, old.groups, bias=old.bias is not None,
        )  # fmt: skip
    new.load_state_dict(old.state_dict())
    setattr(parent, name, new)


def cnn():
    """torchvision's ResNet-18 (random weights, seed 0) at 96×96 whose `layer3.0.conv2`
    accumulates in the narrow dtype."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    _swap(model.layer3[0], "conv2", NarrowConv2d)
    return model, (torch.randn(1, 3, 96, 96),)


def transformer():
    """A two-layer transformer encoder (d_model 64) whose second layer's `linear1` accumulates
    in the narrow dtype."""

    torch.manual_seed(0)
    model, inputs = _sibling("encoder").build()
    _swap(model.layers[1], "linear1", NarrowLinear)
    return model.eval(), inputs


def mlp_wrong_backward():
    """The seed's MLP (Linear → GELU → Linear → LayerNorm) whose first Linear's backward is off
    in the narrow dtype."""

    torch.manual_seed(0)
    model, inputs = _sibling("seed_mlp").build()
    _swap(model, "0", WrongBackwardLinear)
    return model, inputs


def cnn_wrong_backward():
    """ResNet-18 (random weights, seed 0) at 64×64 whose `layer3.0.conv2` backward is off in the
    narrow dtype."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    _swap(model.layer3[0], "conv2", WrongBackwardConv2d)
    return model, (torch.randn(1, 3, 64, 64),)


def transformer_wrong_backward():
    """The two-layer transformer encoder whose second layer's `linear1` backward is off in the
    narrow dtype."""

    torch.manual_seed(0)
    model, inputs = _sibling("encoder").build()
    _swap(model.layers[1], "linear1", WrongBackwardLinear)
    return model.eval(), inputs


def convnext_wrong_backward():
    """The tiny ConvNeXt (tests/builders/zoo.py) whose classifier Linear (`classifier.2`) has a
    backward off in the narrow dtype, beside PyTorch's own LayerNorm gradients that accumulate
    in it."""
    model, inputs = _sibling("zoo").tiny_convnext()
    _swap(model.classifier, "2", WrongBackwardLinear)
    return model, inputs


def convnext_short_backward():
    """The tiny ConvNeXt whose classifier Linear's backward is 2% short in the narrow dtype:
    its error leans toward zero, as the LayerNorms' stalled sums beside it do."""
    model, inputs = _sibling("zoo").tiny_convnext()
    _swap(model.classifier, "2", ShortBackwardLinear)
    return model, inputs


def vit_noisy_backward():
    """The tiny ViT (tests/builders/zoo.py) whose second block's first MLP Linear adds random
    noise to its weight's gradient in the narrow dtype: a Linear's gradient PyTorch sums in
    float32, off by about what a bfloat16 running sum would be, beside the LayerNorms whose
    sums are bfloat16."""
    model, inputs = _sibling("zoo").tiny_vit()
    _swap(model.encoder.layers.encoder_layer_1.mlp, "0", NoisyBackwardLinear)
    return model, inputs
