"""The repro.py a PyTorch repro folder holds (`string.Template`: `$name` is filled in)."""

SCRIPT = r'''"""layerdiff repro: `$layer` ($cls) on $target against $reference.

Runs the model's module `$path` alone: its class from your code, its structure from module.pt
and its weights from state.safetensors, on the reference's inputs to it (inputs.safetensors),
on the reference side and on the target side, and prints how far the target is from the
reference by the tolerance layerdiff judged the layer by. Needs torch, numpy and your code.
Exit code 1: the difference shows.
"""

import contextlib
import copy
import json
import struct
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
CODE = $code_dir  # the folder of your code, when it is not an installed package
if CODE is not None:
    sys.path.insert(0, CODE)
$imports

REFERENCE = $reference_side
TARGET = $target_side
ATOL, RTOL = $atol, $rtol  # within tolerance: |target - reference| <= ATOL + RTOL * |reference|
CAST = {"fp16": torch.float16, "bf16": torch.bfloat16}
AUTOCAST = {"amp-fp16": torch.float16, "amp-bf16": torch.bfloat16}
$reader

def load(path):
    """The tensors of a safetensors file, handed to torch in their own dtype."""
    tensors = {}
    for name, (array, dtype) in read(path).items():
        tensor = torch.from_numpy(array)
        tensors[name] = tensor.to(torch.bfloat16) if dtype == "BF16" else tensor
    return tensors


INPUTS = load(HERE / "inputs.safetensors")


def T(name):
    return INPUTS[name]


ARGS = $args
KWARGS = $kwargs
# None: the module's output is compared. Else its backward alone, for the output gradient the
# whole model's backward gave it (inputs.safetensors' grad_output): the gradient of its first
# floating-point input ("input") or of a parameter, with the target's loss scale.
GRADIENT = $gradient


def build():
    """The module: its structure unpickled with its class, then its weights."""
    module = torch.load(HERE / "module.pt", weights_only=False).to_empty(device="cpu")
    assert isinstance(module, $class_name), type(module)
    with torch.no_grad():
        for name, tensor in load(HERE / "state.safetensors").items():
            owner, _, leaf = name.rpartition(".")
            getattr(module.get_submodule(owner), leaf).copy_(tensor)
    return module.eval()


def first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    values = out.values() if isinstance(out, dict) else out
    if not isinstance(values, (list, tuple, type({}.values()))):
        return None
    return next((t for t in map(first_tensor, values) if t is not None), None)


def run(side, module):
    """The module's output as `side` computes it (its device, precision, compiler); with
    GRADIENT, the gradient its backward alone gives for the saved output gradient."""
    module = copy.deepcopy(module).to(side["device"])
    dtype = CAST.get(side["precision"])
    if dtype is not None:
        module = module.to(dtype)
    if side["compile"]:
        module.forward = torch.compile(module.forward, backend=side["compile"], dynamic=False)
    wrt = []

    def convert(t):
        if not isinstance(t, torch.Tensor):
            return t
        wanted = dtype if dtype is not None and t.is_floating_point() else t.dtype
        t = t.to(device=side["device"], dtype=wanted).detach().clone()
        if GRADIENT is not None and t.is_floating_point():
            wrt.append(t.requires_grad_(True))
            return t.clone()  # a module may work in place on its input
        return t

    args = torch.utils._pytree.tree_map(convert, ARGS)
    kwargs = torch.utils._pytree.tree_map(convert, KWARGS)
    tf32 = side["precision"] == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    amp = AUTOCAST.get(side["precision"])
    device = torch.device(side["device"]).type
    autocast = torch.autocast(device, dtype=amp) if amp else contextlib.nullcontext()
    with torch.set_grad_enabled(GRADIENT is not None), autocast:
        out = first_tensor(module(*args, **kwargs))
    if GRADIENT is None:
        return out.detach().cpu()
    scale = GRADIENT["scale"] if side is TARGET else 1.0
    out.backward((T("grad_output").to(out.device) * scale).to(out.dtype))
    of = GRADIENT["of"]
    grad = wrt[0].grad if of == "input" else module.get_parameter(of).grad
    return (grad.detach().float() / scale).cpu()


def differs(what, reference, got):
    """Prints how far `got` is from `reference`; True when an element is beyond the tolerance."""
    reference, got = reference.double(), got.double()
    diff = (got - reference).abs()
    beyond = ~(diff <= ATOL + RTOL * reference.abs())  # NaN is beyond
    print(f"`$layer` {what}: max |diff| {diff.nan_to_num(float('inf')).max().item():.3e} against "
          f"the tolerance {ATOL:g} + {RTOL:g}*|reference|: {int(beyond.sum())} of "
          f"{diff.numel()} elements beyond it")
    return bool(beyond.any())


def main():
    module = build()
    reference = run(REFERENCE, module)
    same = (reference.double() - load(HERE / "expected.safetensors")["output"].double()).abs()
    print(f"the reference side here against layerdiff's run of the whole model: max |diff| "
          f"{same.max().item():.3e}")
    shown = differs("on $target against $reference", reference, run(TARGET, module))
    print("reproduced" if shown else "not reproduced: within the tolerance")
    return 1 if shown else 0


if __name__ == "__main__":
    sys.exit(main())
'''
