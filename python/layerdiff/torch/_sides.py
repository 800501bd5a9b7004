"""A PyTorch side: the model on a device, in a precision, eager or compiled, as parsed from its
spelling (`torch:cuda:bf16`, `torch:compile`; parsing is Rust's, `layerdiff._layerdiff.Options`).

The side makes its copy of the model and converts inputs the way it computes (`prepare`,
`convert`), holds what must hold while it runs (`running`: autocast), and says what it is in
words for the report (`describe`, `reduced_math`).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass

import torch
from torch import nn

from layerdiff import _layerdiff
from layerdiff.torch._capture import leaf_modules

_CAST = {"fp16": torch.float16, "bf16": torch.bfloat16}
_AUTOCAST = {"amp-fp16": torch.float16, "amp-bf16": torch.bfloat16}
_WORDS = {
    "fp32": "float32",
    "tf32": "float32 with TF32 products",
    "fp16": "float16",
    "bf16": "bfloat16",
    "amp-fp16": "autocast to float16",
    "amp-bf16": "autocast to bfloat16",
}
# Compiled graphs a compiled side may make: one per leaf module and input shape.
_ROOM = 1 << 16
# Module types (and functional rows) whose float32 products TF32 computes with a 10-bit mantissa.
_TF32_TYPES = [
    "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
    "Linear", "Bilinear", "MultiheadAttention", "matmul()", "bmm()",
    "scaled_dot_product_attention()",
]  # fmt: skip


@dataclass(frozen=True)
class TorchSide:
    """How one side runs the model (see the module docs)."""

    spelling: str
    device: str
    precision: str
    compile: str | None
    #: The lower float dtype it computes its layers in (`float16`), whose keep-in-float32
    #: advice is checked: the core's rule (`Precision::lower`); None in float32 and TF32.
    lower: str | None = None
    #: The processes DistributedDataParallel trains it in (`torch:ddp=2`); 1: one process.
    ranks: int = 1

    @classmethod
    def of(cls, spec: _layerdiff.SideSpec, *, ranks: bool = False) -> TorchSide:
        """The side of a parsed PyTorch spelling; checks that this machine can run it. A
        data-parallel one (`torch:ddp=2`) only where ``ranks`` says its gradients are wanted."""
        side = cls(spec.spelling, spec.device, spec.precision, spec.compile, spec.lower, spec.ranks)
        if side.ranks > 1 and not ranks:
            raise _layerdiff.UsageError(
                f"`{side.spelling}` trains the model in {side.ranks} processes: only gradients "
                f"differ there, so it is the target of `layerdiff grad` (`layerdiff grad MODEL "
                f"--target {side.spelling}`), never the reference: it is compared with the "
                "model in one process"
            )
        side._check()
        return side

    @property
    def plain(self) -> bool:
        """The model as given: CPU, float32, eager."""
        return self.spelling == "torch"

    @property
    def on_cuda(self) -> bool:
        return torch.device(self.device).type == "cuda"

    @property
    def may_disagree(self) -> bool:
        """Whether the same call may give other bits twice (atomics and algorithm choice on
        accelerators; PyTorch's CPU kernels give the same bits for the same inputs)."""
        return torch.device(self.device).type != "cpu"

    def _check(self) -> None:
        usage = _layerdiff.UsageError
        try:
            device = torch.device(self.device)
        except (RuntimeError, ValueError) as e:
            raise usage(
                f"`{self.spelling}`: `{self.device}` is neither a precision (fp32, tf32, fp16, "
                f"bf16, amp-fp16, amp-bf16) nor a device PyTorch knows ({e})"
            ) from e
        if device.type == "cuda" and not torch.cuda.is_available():
            raise usage(
                f"`{self.spelling}`: PyTorch sees no CUDA device here (torch "
                f"{torch.__version__}, CUDA {torch.version.cuda or 'not built in'})"
            )
        if device.type == "mps" and not torch.backends.mps.is_available():
            raise usage(f"`{self.spelling}`: PyTorch sees no MPS device here")
        try:
            torch.empty(1, device=device)
        except Exception as e:
            raise usage(f"`{self.spelling}`: PyTorch cannot use `{self.device}` here: {e}") from e
        if self.precision == "tf32" and device.type != "cuda":
            raise usage(
                f"`{self.spelling}`: TF32 is a CUDA math mode; on {device.type} it computes what "
                "fp32 does (give a CUDA device: `torch:cuda:tf32`)"
            )
        if self.ranks > 1:
            from layerdiff.torch import _ranks

            _ranks.check(self.device, self.ranks, self.spelling)
            if self.compile is not None:
                raise usage(
                    f"`{self.spelling}`: a data-parallel side runs eager; compare "
                    "`torch:compile` on its own"
                )
        if self.compile is not None:
            from torch import _dynamo

            backends = set(_dynamo.list_backends(exclude_tags=())) | {"inductor"}
            if self.compile not in backends:
                raise usage(
                    f"`{self.spelling}`: `{self.compile}` is not a torch.compile backend here "
                    f"(known: {', '.join(sorted(backends))})"
                )

    def convert(self, tensor):
        """A tensor as this side holds its inputs: on its device, floating point in its dtype;
        always a copy (a re-run may compute in place). A mask's sentinel another side holds
        (float32's extreme) is held as this dtype's own extreme, as the model computes its mask
        in this dtype (`torch.finfo(dtype).min`), not as the ±Inf a cast makes of it: a row of
        keys all masked so read gave a NaN softmax that the side's own run never makes."""
        if not isinstance(tensor, torch.Tensor):
            return tensor
        dtype = _CAST.get(self.precision) if tensor.is_floating_point() else None
        out = tensor.to(device=self.device, dtype=dtype or tensor.dtype, copy=True)
        narrower = dtype is not None and torch.finfo(dtype).max < torch.finfo(tensor.dtype).max
        # a sentinel is an infinity the cast made: looked for on the cast's values, the rest kept
        if narrower and torch.isinf(out).any():
            floor = min(_layerdiff.SENTINEL, torch.finfo(tensor.dtype).max / 2)
            masks = (torch.isfinite(tensor) & (tensor.abs() >= floor)).to(out.device)
            # in this dtype: its largest is no value of the other's (65504 is bfloat16's 65536)
            out[masks] = (torch.finfo(dtype).max * out.sign())[masks]
        return out

    def converter_from(self, reference: TorchSide):
        """`convert` for the values `reference` holds: where this side casts nothing and the
        reference casts to a narrower dtype (a float32 target of a bfloat16 reference), its
        values come back to the float32 the model holds them in first."""
        narrow = _CAST.get(reference.precision) if self.precision not in _CAST else None
        if narrow is None:
            return self.convert

        def convert(tensor):
            if isinstance(tensor, torch.Tensor) and tensor.dtype == narrow:
                tensor = tensor.float()
            return self.convert(tensor)

        return convert

    def prepare(
        self, model: nn.Module, inputs: tuple, whole=frozenset(), reads_outside=()
    ) -> tuple[nn.Module, tuple]:
        """This side's copy of the model and its inputs. Compiled, each leaf module (``whole``:
        as `leaf_modules` takes it) is compiled on its own: hooks fire between leaves, so every
        layer is compared (fusion across modules is not exercised at this granularity).

        Of a model held one module at a time (`layerdiff.torch._streamed`), the copy holds each
        module's weights on this side's device and in its dtype only while the module runs,
        read from the files then (`layerdiff.torch._widened`; ``reads_outside``: the modules
        whose code reads their submodules' weights, which hold those too): the bits the model
        converted whole computes, with one module's weights in memory at a time."""
        from layerdiff.torch._streamed import is_streamed

        if is_streamed(model):
            return self._streamed_copy(model, whole, reads_outside), tuple(
                self.convert(t) for t in inputs
            )
        copied = copy.deepcopy(model).to(self.device)
        if self.precision in _CAST:
            copied = copied.to(_CAST[self.precision])
        if self.compile is not None:
            for _, leaf in leaf_modules(copied, whole):
                leaf.forward = torch.compile(leaf.forward, backend=self.compile, dynamic=False)
        return copied, tuple(self.convert(t) for t in inputs)

    def refuse_streamed(self) -> None:
        """A `UsageError` where this side cannot run a model held one module at a time."""
        if self.compile is not None:
            raise _layerdiff.UsageError(
                f"`{self.spelling}`: the checkpoint is held one module at a time (its weights "
                "take more than the memory budget allows at once), and a compiled module must "
                "hold its weights from one call to the next: give a --max-memory its weights "
                "fit in, or compare it eager"
            )

    def _streamed_copy(self, model: nn.Module, whole, reads_outside) -> nn.Module:
        from layerdiff.torch._widened import widened_copy

        self.refuse_streamed()
        device, dtype = self.device, _CAST.get(self.precision)
        return widened_copy(
            model, lambda t: t.to(device=device, dtype=dtype or t.dtype), whole, reads_outside,
            narrow=False,
        )  # fmt: skip

    @property
    def autocast_device(self) -> str | None:
        """The device type autocast runs on for this side (`cpu`, `cuda`), or None without."""
        return torch.device(self.device).type if self.precision in _AUTOCAST else None

    @contextlib.contextmanager
    def running(self):
        """What holds while the side runs, in the thread it runs in (each setting here holds
        per thread): autocast; compiled, room for a compiled graph per leaf module (they share
        their class's code, so each instance is a recompilation) and an error rather than a
        silent fall back to eager should that room run out."""
        with contextlib.ExitStack() as stack:
            if self.autocast_device is not None:
                stack.enter_context(
                    torch.autocast(self.autocast_device, dtype=_AUTOCAST[self.precision])
                )
            if self.compile is not None:
                from torch import _dynamo

                stack.enter_context(
                    _dynamo.config.patch(
                        recompile_limit=_ROOM,
                        accumulated_recompile_limit=_ROOM,
                        fail_on_recompile_limit_hit=True,
                    )
                )
            yield

    def describe(self) -> str:
        """The side in words, with what changes its numbers."""
        device = torch.device(self.device)
        where = device.type
        if device.type == "cuda":
            where = f"cuda ({torch.cuda.get_device_name(device)})"
        how = f"compiled ({self.compile}, each leaf module)" if self.compile else "eager"
        if self.ranks > 1:
            from layerdiff.torch._ranks import backend

            how += (
                f", DistributedDataParallel over {self.ranks} processes ({backend(self.device)}"
                "), each on its shard of the batch; the all-reduced gradients times "
                f"{self.ranks}"
            )
        return f"torch {torch.__version__}, {where}, {_WORDS[self.precision]}, {how}"

    def reduced_math(self) -> tuple[list[str], str] | None:
        """The module types whose float32 products this side computes in lower precision, and
        how, in words (TF32 on CUDA)."""
        if self.precision != "tf32":
            return None
        return (
            _TF32_TYPES,
            "PyTorch computes its float32 products in TF32 on CUDA (10-bit mantissa; "
            "torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32); "
            "a plain `torch:cuda` side turns it off",
        )


@contextlib.contextmanager
def cuda_math(*sides: TorchSide):
    """Sets PyTorch's global TF32 switches as the CUDA sides ask (fp32 turns them off; cuDNN
    allows TF32 by default) for the run, and puts them back after. Sides on CUDA that ask
    differently cannot run side by side: the switches are global."""
    wanted = {side.precision == "tf32" for side in sides if side.on_cuda}
    if len(wanted) > 1:
        raise _layerdiff.UsageError(
            "both sides run on CUDA, one with TF32 and one without: PyTorch's TF32 switches are "
            "global, so the two cannot run side by side; compare each with the CPU instead"
        )
    if not wanted:
        yield
        return
    (tf32,) = wanted
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
