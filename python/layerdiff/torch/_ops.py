"""`layerdiff ops`: every case of `_op_cases` on every backend and dtype, each cell judged
against a float64 computation of the op on the same rounded inputs (the rule is the core's,
`check_op`; docs/ops.md explains it).

A cell is one self-contained task, `run_cell(task)`: it makes its inputs from the seed, computes
the truth and the backend's result, and returns a JSON-able dict, so cells run the same in this
process, in a pool of processes, or as Ray tasks. ONNX backends run the single-op model that an
export task made for the case and dtype (its bytes travel with the task).
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import math
import os
import sys
import tempfile
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from layerdiff import _layerdiff, _ort
from layerdiff.tensors import flat
from layerdiff.torch._export import export_onnx
from layerdiff.torch._op_cases import CASES, Case

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
DEFAULT_BACKENDS = ["torch", "torch:compile", "ort", "ort:opt=all", "tract"]
# What a backend says when it has no kernel for an op or dtype (PyTorch, ONNX Runtime, tract,
# the exporter): such a cell is UNSUPPORTED, not an ERROR.
_UNSUPPORTED = (
    "not implemented for",
    "notimplementederror",
    "could not find an implementation",
    "not_implemented",
    "unsupported",
    "not supported",
    "no kernel",
    "unimplemented",
    "type parameter (t) of optype",
    "is not a valid type",
    "unknown datumtype",
    "type error: type 'tensor(",
)


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


def resolve(call: str):
    """The function a case's `call` names (`torch.matmul`, `F.gelu`)."""
    module, _, name = call.partition(".")
    return getattr({"torch": torch, "F": F}[module], name)


def is_onnx(backend: str) -> bool:
    """Whether an ONNX runtime computes the backend (`ort…`, `tract`, `openvino…`); a custom
    backend's name is none (a misspelled one is refused by `describe`)."""
    try:
        return _layerdiff.side_spec(backend).kind == "runtime"
    except _layerdiff.UsageError:
        return False


def torch_backend(backend: str) -> tuple[str, bool] | None:
    """`(device, compiled)` for `torch[:DEVICE][:compile]`; None for other backends."""
    spec = _layerdiff.side_spec(backend)
    if spec.kind != "torch":
        return None
    if spec.precision != "fp32":
        raise _layerdiff.UsageError(
            f"backend `{backend}`: an op backend takes no precision (`{spec.precision}`); "
            "the matrix's dtypes are --dtypes"
        )
    return spec.device, spec.compile is not None


# ---------------------------------------------------------------------------------------------
# Inputs, truth and magnitude


def make_inputs(case: Case, seed: int) -> list[torch.Tensor]:
    """The case's inputs in float32 (and int64/bool), the same for every backend and dtype."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + sum(map(ord, case.name)))
    out = []
    for spec in case.inputs:
        kind, shape = spec[0], spec[1]
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
            export_onnx(_Op(case), tuple(args), path, exporter=exporter, opset=opset)
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
    outputs = _layerdiff.run_model(task.model, task.backend, inputs, _ort.library())
    _, dtype, shape, data = outputs[0]
    dtype = getattr(torch, dtype)
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)


class _ExportFailed(Exception):
    pass


def run_cell(task: Task, custom: dict | None = None) -> dict:
    """One cell: its verdict and numbers, or why it could not be judged."""
    case = CASES[task.case]
    cell = {"case": task.case, "backend": task.backend, "dtype": task.dtype}
    if task.onnx_ops:
        cell["onnx_ops"] = list(task.onnx_ops)
    inputs = make_inputs(case, task.seed)
    args = rounded(inputs, DTYPES[task.dtype])
    wide = [x.double() if x.is_floating_point() else x for x in args]
    try:
        with torch.no_grad():
            truth = compute(case, wide)
            scale = magnitude(case, wide, truth)
            if custom is not None and task.backend in custom:
                got = custom[task.backend](case, args)
            elif is_onnx(task.backend):
                got = _run_onnx(task, args)
            else:
                device, compiled = torch_backend(task.backend)
                got = _run_torch(case, args, device, compiled)
    except Exception as e:  # a backend's failure is the cell's finding, never the run's end
        return {**cell, **_failure(e)}
    if tuple(got.shape) != tuple(truth.shape):
        return {
            **cell,
            "status": "FAIL",
            "message": f"shape {list(got.shape)} where the op gives {list(truth.shape)}",
        }
    expected_dtype = truth.dtype if not truth.is_floating_point() else DTYPES[task.dtype]
    if got.dtype != expected_dtype:
        made_by = "the exported model gives" if is_onnx(task.backend) else "gives"
        return {
            **cell,
            "status": "ERROR" if is_onnx(task.backend) else "FAIL",
            "message": f"{made_by} {str(got.dtype).removeprefix('torch.')} where the op gives "
            f"{str(expected_dtype).removeprefix('torch.')}",
        }
    truth64 = truth.double().reshape(-1).numpy()
    scale64 = (
        scale.double().expand_as(truth).reshape(-1).numpy()
        if scale is not None
        else truth64[:0].copy()
    )
    check = json.loads(
        _layerdiff.check_op(flat("got", got), truth64, scale64.copy(), case.reduction, case.stages)
    )
    return {**cell, "status": "PASS" if check["passed"] else "FAIL", "check": check}


def _failure(e: Exception) -> dict:
    message = f"{type(e).__name__}: {e}".strip()
    if isinstance(e, _ExportFailed):
        message = str(e)
    lowered = message.lower()
    unsupported = isinstance(e, NotImplementedError) or any(s in lowered for s in _UNSUPPORTED)
    first = message.splitlines()[0] if message else type(e).__name__
    return {"status": "UNSUPPORTED" if unsupported else "ERROR", "message": first[:2000]}


# ---------------------------------------------------------------------------------------------
# The matrix


def available_backends() -> list[str]:
    """The default backends: the CPU ones, and the GPU PyTorch and ONNX Runtime providers here."""
    backends = list(DEFAULT_BACKENDS)
    if torch.cuda.is_available():
        backends += ["torch:cuda", "torch:cuda:compile"]
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        backends.append("torch:mps")
    # The providers of the ONNX Runtime layerdiff loads, which need not be the onnxruntime
    # package's (LAYERDIFF_ORT_LIB).
    for provider in _layerdiff.device_providers():
        if describe(f"ort:{provider}")[1] is None:
            backends.append(f"ort:{provider}")
    return backends


def describe(backend: str) -> tuple[str, str | None]:
    """`(what runs, why it cannot run here or None)` for a backend."""
    spec = torch_backend(backend)
    if spec is not None:
        device, compiled = spec
        what = f"PyTorch {torch.__version__} eager on {device}"
        if compiled:
            what = f"PyTorch {torch.__version__} torch.compile (inductor) on {device}"
        try:
            dev = torch.device(device)
        except RuntimeError as e:
            raise _layerdiff.UsageError(f"backend `{backend}`: {e}") from e
        try:
            if dev.type == "cuda":
                if not torch.cuda.is_available():
                    return what, "CUDA is not available to this PyTorch"
                what += f" ({torch.cuda.get_device_name(dev)})"
            elif dev.type == "mps" and not torch.backends.mps.is_available():
                return what, "MPS is not available to this PyTorch"
        except RuntimeError as e:
            return what, str(e)
        return what, None
    if is_onnx(backend):
        try:
            return _layerdiff.describe_runtime(backend, _ort.library()), None
        except _layerdiff.UsageError:
            raise  # a misspelling, not a runtime this machine lacks
        except _layerdiff.LayerdiffError as e:
            return backend, str(e)
    raise _layerdiff.UsageError(
        f"backend `{backend}` computes nothing: an op backend is torch[:DEVICE][:compile] or a "
        "runtime (ort[:PROVIDER][:opt=LEVEL], tract, openvino[:precision=P])"
    )


def select_cases(patterns: list[str]) -> list[Case]:
    if not patterns:
        return list(CASES.values())
    chosen = []
    for pattern in patterns:
        matched = [c for c in CASES.values() if fnmatch.fnmatchcase(c.name, pattern)]
        if not matched:
            raise _layerdiff.UsageError(
                f"no op case matches `{pattern}` (`layerdiff ops --list` names them)"
            )
        chosen += [c for c in matched if c not in chosen]
    return [c for c in CASES.values() if c in chosen]


def _init_worker(threads: int) -> None:
    torch.set_num_threads(threads)
    warnings.simplefilter("ignore")


def _export_task(args: tuple) -> dict:
    return export_case(*args)


def _executor(kind: str, jobs: int):
    """`map(function, items)` on the chosen executor, in order."""
    if kind == "ray":
        try:
            import ray
        except ImportError as e:
            raise _layerdiff.UsageError(
                "--executor ray needs Ray\nhint: pip install 'layerdiff[ray]'"
            ) from e
        if not ray.is_initialized():
            ray.init(
                address=os.environ.get("RAY_ADDRESS") or None,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
        remote = {}

        def ray_map(function, items):
            if function not in remote:
                remote[function] = ray.remote(function)
            return ray.get([remote[function].remote(item) for item in items])

        return contextlib.nullcontext(ray_map)
    if jobs <= 1:
        return contextlib.nullcontext(lambda function, items: [function(i) for i in items])
    import multiprocessing

    pool = ProcessPoolExecutor(
        max_workers=jobs,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_init_worker,
        initargs=(max(1, (os.cpu_count() or 1) // jobs),),
    )

    @contextlib.contextmanager
    def pooled():
        with pool:
            yield lambda function, items: list(pool.map(function, items, chunksize=1))

    return pooled()


def check_ops(
    ops: list[str] | None = None,
    backends: list[str] | None = None,
    dtypes: list[str] | None = None,
    *,
    opset: int = 18,
    exporter: str = "dynamo",
    seed: int = 0,
    jobs: int | None = None,
    executor: str = "local",
    custom_backends: dict | None = None,
    progress=None,
) -> dict:
    """The op matrix as a run (the JSON the core turns into the report): every case matching
    `ops` on every backend and dtype. `custom_backends` maps a name to a function
    `(case, args) -> tensor` computing a case some other way (run in this process; `call(fn,
    case, args)` calls `fn` the way the case does)."""
    cases = select_cases(ops or [])
    dtypes = dtypes or list(DTYPES)
    for d in dtypes:
        if d not in DTYPES:
            raise _layerdiff.UsageError(f"unknown dtype `{d}` (expected {', '.join(DTYPES)})")
    custom = dict(custom_backends or {})
    names = list(backends) if backends else available_backends()
    names += [c for c in custom if c not in names]
    if len(set(names)) != len(names):
        raise _layerdiff.UsageError(f"a backend is named twice: {', '.join(names)}")
    jobs = jobs if jobs is not None else (os.cpu_count() or 1)
    say = progress or (lambda message: None)

    described, unavailable = [], {}
    for name in names:
        what, why = (f"custom backend `{name}`", None) if name in custom else describe(name)
        described.append({"name": name, "detail": what})
        if why is not None:
            unavailable[name] = why

    with _executor(executor, jobs) as run:
        cells = _run_matrix(run, cases, dtypes, names, unavailable, custom, seed, opset,
                            exporter, say)  # fmt: skip
    return {
        "opset": opset,
        "exporter": exporter,
        "seed": seed,
        "versions": [["torch", torch.__version__]],
        "backends": described,
        "dtypes": dtypes,
        "cases": [
            {
                "name": c.name,
                "op": c.describe_call(),
                "inputs": [_describe_input(s) for s in c.inputs],
                "reduction": c.reduction,
                "stages": c.stages,
                "magnitude": c.magnitude,
            }
            for c in cases
        ],
        "cells": cells,
    }


def _run_matrix(run, cases, dtypes, names, unavailable, custom, seed, opset, exporter, say):
    """Every cell, on the executor's `run` (one pool for the exports and the cells)."""
    exports = {}
    onnx_backends = [b for b in names if is_onnx(b) and b not in unavailable and b not in custom]
    if onnx_backends:
        wanted = [(c.name, d, seed, opset, exporter) for c in cases for d in dtypes]
        say(f"exporting {len(wanted)} single-op models ({exporter}, opset {opset})")
        for key, result in zip(wanted, run(_export_task, wanted), strict=True):
            exports[key[:2]] = result

    tasks, cells = [], []
    for case in cases:
        for dtype in dtypes:
            for name in names:
                if name in unavailable:
                    why = f"unavailable here: {unavailable[name]}"
                    cells.append(
                        {"case": case.name, "backend": name, "dtype": dtype,
                         "status": "UNSUPPORTED", "message": why}
                    )  # fmt: skip
                    continue
                exported = exports.get((case.name, dtype), {}) if is_onnx(name) else {}
                tasks.append(
                    Task(
                        case.name,
                        name,
                        dtype,
                        seed,
                        model=exported.get("model"),
                        input_names=exported.get("input_names", ()),
                        onnx_ops=exported.get("onnx_ops", ()),
                        export_error=exported.get("error"),
                    )
                )
    started = time.monotonic()
    say(f"running {len(tasks)} cells")
    cells += run(run_cell, [t for t in tasks if t.backend not in custom])
    cells += [run_cell(t, custom) for t in tasks if t.backend in custom]
    say(f"{len(tasks)} cells in {time.monotonic() - started:.1f}s")
    return cells


def _describe_input(spec: tuple) -> str:
    kind, shape, *rest = spec
    dims = "×".join(map(str, shape)) if isinstance(shape, tuple) else str(shape)
    detail = {
        "randn": lambda: (
            "normal"
            + (f" ×{rest[0]:g}" if rest else "")
            + (f" {rest[1]:+g}" if len(rest) > 1 else "")
        ),
        "uniform": lambda: f"uniform [{rest[0]:g}, {rest[1]:g})",
        "int": lambda: f"int64 in [{rest[0]}, {rest[1]})",
        "perm": lambda: "int64 row permutations",
        "bool": lambda: "bool",
        "masked": lambda: "normal, -inf above the diagonal",
    }[kind]()
    return f"{dims} {detail}"


def list_text() -> str:
    """The cases and this machine's backends, as `--list` prints them."""
    lines = ["cases:"]
    for c in CASES.values():
        lines.append(f"  {c.name:<30} {c.describe_call()}  K={c.reduction}")
    lines.append("backends here: " + ", ".join(available_backends()))
    lines.append("dtypes: " + ", ".join(DTYPES))
    return "\n".join(lines) + "\n"


def run_command(command, progress) -> int:
    """`layerdiff ops` as parsed."""
    if command.list:
        sys.stdout.write(list_text())
        return 0
    run = check_ops(
        command.ops,
        command.backends,
        command.dtypes,
        opset=command.opset,
        exporter=command.exporter,
        seed=command.seed,
        jobs=command.jobs,
        executor=command.executor,
        progress=progress,
    )
    return _layerdiff.deliver_ops(command, json.dumps(run))
