"""One cell of `layerdiff ops`, a self-contained task (`run_cell(task)`): its inputs made from the
seed, the truth computed in float64 on the same rounded inputs, the backend's result (PyTorch on
a device, compiled or not, or the single-op ONNX model its export task made, on a runtime), and a
JSON-able dict back, so cells run the same in this process, in a pool or as Ray tasks."""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from layerdiff import _layerdiff
from layerdiff.tensors import flat
from layerdiff.torch._export import export_onnx
from layerdiff.torch._op_cases import CASES, Case

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Task:
    """One cell: everything it needs, picklable."""

    case: str
    backend: str
    dtype: str
    seed: int
    model: bytes | None = None  # the single-op ONNX model, for ONNX backends
    input_names: tuple = ()
    onnx_ops: tuple = ()
    export_error: str | None = None
    #: The narrower dtype the backend computes this cell in (OpenVINO's inference precision),
    #: as the core says (`Narrowing.of`): inputs rounded to it, the cell judged by its rule.
    computed_in: str | None = None


def resolve(call: str):
    """The function a case's `call` names (`torch.matmul`, `F.gelu`; a collective's
    `dist.all_reduce`, computed in one process from every rank's row)."""
    from layerdiff.torch._collectives import Truth

    module, _, name = call.partition(".")
    return getattr({"torch": torch, "F": F, "dist": Truth}[module], name)


def is_onnx(backend: str) -> bool:
    """Whether an ONNX runtime computes the backend (`ort…`, `tract`, `openvino…`); a custom
    backend's name is none (a misspelled one is refused by `describe`)."""
    try:
        return _layerdiff.side_spec(backend).kind == "runtime"
    except _layerdiff.UsageError:
        return False


def torch_backend(backend: str) -> tuple[str, bool] | None:
    """`(device, compiled)` for `torch[:DEVICE][:compile]`; None for other backends (a
    `torch:ddp=N` backend's are `ranks_of`)."""
    spec = _layerdiff.side_spec(backend)
    if spec.kind != "torch" or spec.ranks > 1:
        return None
    if spec.precision != "fp32":
        raise _layerdiff.UsageError(
            f"backend `{backend}`: an op backend takes no precision (`{spec.precision}`); "
            "the matrix's dtypes are --dtypes"
        )
    return spec.device, spec.compile is not None


def ranks_of(backend: str) -> int:
    """The processes a backend's collectives run across (`torch:ddp=2`: 2); 1 for every other
    backend, which runs no collective."""
    try:
        spec = _layerdiff.side_spec(backend)
    except _layerdiff.UsageError:
        return 1  # a custom backend's name
    return spec.ranks if spec.kind == "torch" else 1


def runs(case: Case, backend: str) -> bool:
    """Whether the matrix has a cell for `case` on `backend`: a collective on a backend of
    ranks, every other op on the others."""
    return case.collective == (ranks_of(backend) > 1)


# ---------------------------------------------------------------------------------------------
# Inputs, truth and magnitude


def make_inputs(case: Case, seed: int, ranks: int = 1) -> list[torch.Tensor]:
    """The case's inputs in float32 (and int64/bool), the same for every backend and dtype (a
    collective's, one row for each of `ranks`)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + sum(map(ord, case.name)))
    out = []
    for spec in case.inputs:
        kind = spec[0]
        shape = tuple(ranks if d == "ranks" else d for d in spec[1])
        if kind == "randn":
            rest = spec[2:]
            scale, shift = (rest[0] if rest else 1.0), (rest[1] if len(rest) > 1 else 0.0)
            out.append(torch.randn(shape, generator=g) * scale + shift)
        elif kind == "uniform":
            lo, hi = spec[2], spec[3]
            out.append(torch.rand(shape, generator=g) * (hi - lo) + lo)
        elif kind == "int":
            out.append(torch.randint(spec[2], spec[3], shape, generator=g))
        elif kind == "perm":
            rows = [torch.randperm(shape[-1], generator=g) for _ in range(math.prod(shape[:-1]))]
            out.append(torch.stack(rows).reshape(shape))
        elif kind == "bool":
            out.append(torch.rand(shape, generator=g) < 0.5)
        elif kind == "masked":
            x = torch.randn(shape, generator=g)
            above = torch.ones(shape[-2:], dtype=torch.bool).triu(1)
            out.append(x.masked_fill(above, float("-inf")))
        else:
            raise ValueError(f"case {case.name}: unknown input kind {kind!r}")
    return out


def rounded(inputs: list[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
    """Float inputs rounded to `dtype`; indices and conditions as they are."""
    return [x.to(dtype) if x.is_floating_point() else x for x in inputs]


def call(fn, case: Case, args: list) -> torch.Tensor:
    """`fn` on the inputs as the case passes them: the first positionally, the last
    `case.keywords` by name, then the case's own keyword arguments."""
    split = len(args) - len(case.keywords)
    out = fn(*args[:split], **dict(zip(case.keywords, args[split:], strict=True)), **case.kwargs)
    return out[0] if isinstance(out, tuple) else out


def compute(case: Case, args: list[torch.Tensor]) -> torch.Tensor:
    return call(resolve(case.call), case, args)


def magnitude(case: Case, args: list[torch.Tensor], truth: torch.Tensor) -> torch.Tensor | None:
    """What the case's error scales with, per output element, in float64 (None: |truth|)."""
    kind = case.magnitude
    if kind == "value":
        return None
    if kind == "terms":
        absolute = [x.abs() if x.is_floating_point() else x for x in args]
        return compute(case, absolute).abs()
    if kind == "input":
        return torch.maximum(truth.abs(), args[0].abs().expand_as(truth))
    if kind == "softmax":
        x = args[0]
        below = (x - x.amax(case.kwargs["dim"], keepdim=True)).abs().nan_to_num(posinf=0.0)
        return truth.abs() * (1.0 + below)
    if kind == "normalized":
        return _normalized(case, args)
    if kind == "attention":
        q, k, v = args[:3]
        scale = 1.0 / math.sqrt(q.shape[-1])
        scores = q @ k.transpose(-2, -1) * scale
        if case.kwargs.get("is_causal"):
            n = scores.shape[-1]
            above = torch.ones(n, n, dtype=torch.bool).triu(1)
            scores = scores.masked_fill(above, float("-inf"))
        p = scores.softmax(-1)
        spread = 1.0 + (q.abs() @ k.abs().transpose(-2, -1)) * scale
        return (p * spread) @ v.abs()
    raise ValueError(f"case {case.name}: unknown magnitude {kind!r}")


def _normalized(case: Case, args: list[torch.Tensor]) -> torch.Tensor:
    """(|x| + |mean|)/σ·|weight| + |bias| over the dims the op normalizes."""
    x = args[0]
    weight = bias = None
    if case.call == "F.batch_norm":
        mean, var, weight, bias = args[1:5]
        shape = (1, -1) + (1,) * (x.dim() - 2)
        mean, sigma = mean.reshape(shape), (var + 1e-5).sqrt().reshape(shape)
        weight, bias = weight.reshape(shape), bias.reshape(shape)
        return (x.abs() + mean.abs()) / sigma * weight.abs() + bias.abs()
    if case.call == "F.group_norm":
        groups = case.kwargs["num_groups"]
        grouped = x.reshape(x.shape[0], groups, -1)
        mean = grouped.mean(-1, keepdim=True)
        sigma = (grouped.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()
        m = ((grouped.abs() + mean.abs()) / sigma).reshape(x.shape)
        shape = (1, -1) + (1,) * (x.dim() - 2)
        if len(args) > 1:
            weight, bias = args[1].reshape(shape), args[2].reshape(shape)
        return m * (weight.abs() if weight is not None else 1) + (
            bias.abs() if bias is not None else 0
        )
    dims = tuple(range(-len(case.kwargs["normalized_shape"]), 0))
    mean = x.mean(dims, keepdim=True)
    sigma = (x.var(dims, unbiased=False, keepdim=True) + 1e-5).sqrt()
    m = (x.abs() + mean.abs()) / sigma
    if len(args) > 1:
        m = m * args[1].abs()
    if len(args) > 2:
        m = m + args[2].abs()
    return m


# ---------------------------------------------------------------------------------------------
# Backends


class _Op(torch.nn.Module):
    """One case as a module: what is exported and compiled."""

    def __init__(self, case: Case):
        super().__init__()
        self.case = case

    def forward(self, *args):
        return call(resolve(self.case.call), self.case, list(args))


def export_case(case_name: str, dtype: str, seed: int, opset: int, exporter: str) -> dict:
    """The case exported alone at `opset`: its bytes, input names and ONNX ops, or the error."""
    import onnx

    case = CASES[case_name]
    args = rounded(make_inputs(case, seed), DTYPES[dtype])
    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / "op.onnx"
        try:
            export_onnx(_Op(case), tuple(args), path, exporter=exporter, opset=opset, cache=False)
        except _layerdiff.ModelError as e:  # the exporter's own failure is the cell's finding
            return {"error": str(e).splitlines()[0]}
        model = onnx.load(str(path))
    model.ir_version = min(model.ir_version, 10)  # what ONNX Runtime 1.31 accepts
    initializers = {i.name for i in model.graph.initializer}
    return {
        "model": model.SerializeToString(),
        "input_names": tuple(i.name for i in model.graph.input if i.name not in initializers),
        "onnx_ops": tuple(sorted({n.op_type for n in model.graph.node})),
    }


def _run_torch(case: Case, args: list[torch.Tensor], device: str, compiled: bool):
    args = [x.to(device) for x in args]
    module = _Op(case)
    if compiled:
        torch._dynamo.reset()
        module = torch.compile(module, dynamic=False)
    with torch.no_grad():
        out = module(*args)
    return out.cpu()


def _run_onnx(task: Task, args: list[torch.Tensor]) -> torch.Tensor:
    if task.export_error is not None:
        raise _ExportFailed(task.export_error)
    if len(task.input_names) != len(args):
        raise RuntimeError(
            f"the exported model reads {len(task.input_names)} inputs where the op takes "
            f"{len(args)}"
        )
    inputs = [flat(name, x) for name, x in zip(task.input_names, args, strict=True)]
    outputs = _layerdiff.run_model(task.model, task.backend, inputs)
    _, dtype, shape, data = outputs[0]
    dtype = getattr(torch, dtype)
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)


class _ExportFailed(Exception):
    pass


class Said(Exception):
    """A backend's own message for a cell it could not compute, as it said it."""


def run_cell(task: Task, custom: dict | None = None) -> _layerdiff.OpCell:
    """One cell: what its backend computed, or how it broke; the core gives the verdict."""
    case = CASES[task.case]
    cell = (task.case, task.backend, task.dtype, list(task.onnx_ops), task.computed_in)
    ranks = ranks_of(task.backend)
    inputs = make_inputs(case, task.seed, ranks)
    args = rounded(inputs, DTYPES[task.dtype])
    if task.computed_in is not None:  # on the grid the backend computes in, then held as asked
        args = rounded(rounded(args, DTYPES[task.computed_in]), DTYPES[task.dtype])
    wide = [x.double() if x.is_floating_point() else x for x in args]
    try:
        with torch.no_grad():
            truth = compute(case, wide)
            scale = magnitude(case, wide, truth)
            extra = 0  # roundings a backend's spelling of the op adds to the case's own
            if custom is not None and task.backend in custom:
                got = custom[task.backend](case, args)
                if isinstance(got, tuple):
                    got, extra = got
            elif is_onnx(task.backend):
                got = _run_onnx(task, args)
            else:
                device, compiled = torch_backend(task.backend)
                got = _run_torch(case, args, device, compiled)
    except Exception as e:  # a backend's failure is the cell's finding, never the run's end
        message = f"{type(e).__name__}: {e}".strip()
        if isinstance(e, (_ExportFailed, Said)):
            message = str(e) or type(e).__name__
        return _layerdiff.OpCell.broke(cell, message, isinstance(e, NotImplementedError))
    magnitude_64 = (
        scale.double().expand_as(truth).contiguous().reshape(-1).numpy()
        if scale is not None
        else np.zeros(0)
    )
    exported, truth = is_onnx(task.backend), flat("truth", truth)
    try:
        flat_got = flat("got", got)
    except _layerdiff.InputError:  # a dtype layerdiff cannot read (complex): not the op's
        named = str(got.dtype).removeprefix("torch.")
        return _layerdiff.OpCell.unreadable(cell, named, truth, exported)
    return _layerdiff.OpCell.judged(
        cell, flat_got, truth, magnitude_64, case.terms(ranks), case.stages + extra, exported
    )


# ---------------------------------------------------------------------------------------------
# The matrix
