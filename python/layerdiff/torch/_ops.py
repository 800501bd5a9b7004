"""`layerdiff ops`: every case of `_op_cases` on every backend and dtype, each cell judged
against a float64 computation of the op on the same rounded inputs (shape, dtype and values are
judged by the core, `OpCell::judged`; docs/ops.md explains the rule).

A cell is one self-contained task (`_op_cell.run_cell`); this module picks the backends and
cases, exports each case once per dtype for the ONNX backends (the model's bytes travel with the
task), and runs the cells in this process, in a pool of processes, or as Ray tasks.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import sys
import time
import warnings

import torch

from layerdiff import _layerdiff
from layerdiff._executor import mapped
from layerdiff.torch import _collectives
from layerdiff.torch._op_cases import CASES, Case
from layerdiff.torch._op_cell import (
    DTYPES,
    Said,
    Task,
    export_case,
    is_onnx,
    make_inputs,
    ranks_of,
    rounded,
    run_cell,
    runs,
    torch_backend,
)

# PyTorch's own backends on the CPU (its collectives across 2 processes, gloo); the ONNX
# runtimes' are theirs to list (`op_backends`).
TORCH_BACKENDS = ["torch", "torch:compile", "torch:ddp=2"]


# TensorFlow's op backends: the same spelling as the Keras sides (`xla` is TensorFlow's XLA
# everywhere), computed in a process of their own (`layerdiff.keras._op_calls`).
TF_BACKENDS = {"tf": "eager", "xla": "XLA (tf.function(jit_compile=True))"}


def _tf_version() -> str | None:
    """The installed TensorFlow's version, without importing it (it cannot share a process
    with PyTorch's triton)."""
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec("tensorflow") is None:
        return None
    for dist in ("tensorflow", "tensorflow-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "?"


def _is_keras(backend: str) -> bool:
    try:
        return _layerdiff.side_spec(backend).kind == "keras"
    except _layerdiff.UsageError:
        return False


def available_backends() -> list[str]:
    """The default backends: the CPU ones, OpenVINO where installed, and the GPU PyTorch and
    ONNX Runtime providers here."""
    backends = list(TORCH_BACKENDS)
    if torch.cuda.is_available():
        backends += ["torch:cuda", "torch:cuda:compile"]
        if torch.cuda.device_count() > 1:  # NCCL: one GPU per rank
            backends.append(f"torch:cuda:ddp={torch.cuda.device_count()}")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        backends.append("torch:mps")
    # Each ONNX runtime's own (ONNX Runtime's as the file is written and optimized, and its
    # device providers; tract; OpenVINO), those that start here: the ONNX Runtime layerdiff
    # loads need not be the onnxruntime package's (LAYERDIFF_ORT_LIB).
    backends += _layerdiff.op_backends()
    # TensorFlow eager and XLA, where TensorFlow is installed
    if _tf_version() is not None:
        backends += list(TF_BACKENDS)
    return backends


def describe(backend: str) -> tuple[str, str | None]:
    """`(what runs, why it cannot run here or None)` for a backend."""
    if ranks_of(backend) > 1:
        return _describe_ranks(backend)
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
            return _layerdiff.describe_runtime(backend), None
        except _layerdiff.UsageError:
            raise  # a misspelling, not a runtime this machine lacks
        except _layerdiff.LayerdiffError as e:
            return backend, str(e)
    if _is_keras(backend):
        if backend not in TF_BACKENDS:
            raise _layerdiff.UsageError(
                f"backend `{backend}` runs a converted model, not one op: TensorFlow's op "
                "backends are `tf` (eager) and `xla`"
            )
        version = _tf_version()
        what = f"TensorFlow {version or ''} {TF_BACKENDS[backend]} on cpu".replace("  ", " ")
        if version is None:
            return what, "TensorFlow is not installed (pip install 'layerdiff[tf]')"
        return what, None
    raise _layerdiff.UsageError(
        f"backend `{backend}` computes nothing: an op backend is torch[:DEVICE][:compile], "
        "a runtime (ort[:PROVIDER][:opt=LEVEL], tract, openvino[:precision=P]) or TensorFlow "
        "(tf, xla)"
    )


def _describe_ranks(backend: str) -> tuple[str, str | None]:
    """`describe` for a `torch:ddp=N` backend: its collectives' group."""
    from layerdiff.torch import _ranks

    spec = _layerdiff.side_spec(backend)
    if spec.precision != "fp32" or spec.compile is not None:
        raise _layerdiff.UsageError(
            f"backend `{backend}`: a collectives backend is `torch[:DEVICE]:ddp=N` (the "
            "matrix's dtypes are --dtypes)"
        )
    what = (
        f"PyTorch {torch.__version__} torch.distributed ({_ranks.backend(spec.device)}) across "
        f"{spec.ranks} processes on {spec.device}"
    )
    try:
        _ranks.check(spec.device, spec.ranks, backend)
    except _layerdiff.UsageError as e:
        return what, str(e)
    return what, None


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
) -> _layerdiff.OpsRun:
    """The op matrix as a run (what the core turns into the report): every case matching
    `ops` on every backend and dtype. `custom_backends` maps a name to a function
    `(case, args) -> tensor` computing a case some other way (run in this process; `call(fn,
    case, args)` calls `fn` the way the case does)."""
    cases = select_cases(ops or [])
    dtypes = [_layerdiff.choice("op dtype", d) for d in dtypes] if dtypes else list(DTYPES)
    exporter = _layerdiff.choice("exporter", exporter)
    executor = _layerdiff.choice("executor", executor)
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
        described.append((name, what))
        if why is not None:
            unavailable[name] = why

    with mapped(executor, jobs, _init_worker, (max(1, (os.cpu_count() or 1) // jobs),)) as run:
        cells = _run_matrix(run, cases, dtypes, names, unavailable, custom, seed, opset,
                            exporter, say)  # fmt: skip
    return _layerdiff.OpsRun(
        opset=opset,
        exporter=exporter,
        seed=seed,
        versions=[("torch", torch.__version__)],
        backends=described,
        dtypes=dtypes,
        cases=[
            _layerdiff.OpCase(
                name=c.name,
                op=c.describe_call(),
                inputs=[_describe_input(s) for s in c.inputs],
                reduction=c.terms(max((ranks_of(n) for n in names), default=1)),
                stages=c.stages,
                magnitude=c.magnitude,
            )
            for c in cases
        ],
        cells=cells,
    )


def _run_matrix(run, cases, dtypes, names, unavailable, custom, seed, opset, exporter, say):
    """Every cell, on the executor's `run` (one pool for the exports and the cells)."""
    exports = {}
    onnx_backends = [b for b in names if is_onnx(b) and b not in unavailable and b not in custom]
    if onnx_backends:
        wanted = [
            (c.name, d, seed, opset, exporter) for c in cases if not c.collective for d in dtypes
        ]
        say(f"exporting {len(wanted)} single-op models ({exporter}, opset {opset})")
        for key, result in zip(wanted, run(_export_task, wanted), strict=True):
            exports[key[:2]] = result

    # how each ONNX backend narrows float math here, as the model flow knows the side
    narrowings = {b: _layerdiff.runtime_narrowing(b) for b in onnx_backends}
    tasks, cells = [], []
    for case in cases:
        for dtype in dtypes:
            for name in names:
                if not runs(case, name):
                    continue  # a collective on one process, or one op across ranks
                if name in unavailable:
                    cell = (case.name, name, dtype, [], None)
                    cells.append(_layerdiff.OpCell.unavailable(cell, unavailable[name]))
                    continue
                exported = exports.get((case.name, dtype), {}) if is_onnx(name) else {}
                onnx_ops = exported.get("onnx_ops", ())
                narrowing = narrowings.get(name)
                tasks.append(
                    Task(
                        case.name,
                        name,
                        dtype,
                        seed,
                        model=exported.get("model"),
                        input_names=exported.get("input_names", ()),
                        onnx_ops=onnx_ops,
                        export_error=exported.get("error"),
                        computed_in=narrowing.of(list(onnx_ops), dtype) if narrowing else None,
                    )
                )
    started = time.monotonic()
    say(f"running {len(tasks)} cells")
    here = dict(custom)
    tensorflow = [t for t in tasks if t.backend in TF_BACKENDS and t.backend not in custom]
    if tensorflow:
        say(f"computing {len(tensorflow)} cells in TensorFlow, in a process of its own")
        answers = _in_tensorflow(tensorflow, seed)
        for name in TF_BACKENDS:
            here.setdefault(name, functools.partial(_answered, answers, name))
    collective = [t for t in tasks if ranks_of(t.backend) > 1 and t.backend not in custom]
    if collective:
        say(f"computing {len(collective)} collective cells, one group of processes per backend")
        answers = _collectives.answers(collective, _rows)
        for name in dict.fromkeys(t.backend for t in collective):
            here.setdefault(name, functools.partial(_answered, answers, name))
    cells += run(run_cell, [t for t in tasks if t.backend not in here])
    cells += [run_cell(t, here) for t in tasks if t.backend in here]
    say(f"{len(tasks)} cells in {time.monotonic() - started:.1f}s")
    return cells


def _in_tensorflow(tasks: list, seed: int) -> dict:
    """Each TensorFlow cell's result, `(case, backend, dtype)` → a tensor or the exception its
    cell reports, computed by `layerdiff.keras._op_calls` in a process of its own on the very
    inputs the other backends get."""
    import json
    import subprocess
    import tempfile
    from pathlib import Path

    import numpy as np

    arrays, requests = {}, []
    for t in tasks:
        case = CASES[t.case]
        key = f"{t.case}.{t.dtype}"
        count = len(case.inputs)
        if f"{key}.0" not in arrays:  # one set of inputs for both TensorFlow backends
            args = rounded(make_inputs(case, seed), DTYPES[t.dtype])
            for k, a in enumerate(args):
                arrays[f"{key}.{k}"] = a.float().numpy() if a.is_floating_point() else a.numpy()
        requests.append({
            "call": case.call, "kwargs": case.kwargs, "keywords": list(case.keywords),
            "dtype": t.dtype, "backend": t.backend, "inputs": key, "count": count,
        })  # fmt: skip
    answers = {}
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work)
        np.savez(folder / "inputs.npz", **arrays)
        (folder / "requests.json").write_text(json.dumps(requests))
        done = subprocess.run(
            [sys.executable, "-m", "layerdiff.keras._op_calls", str(folder)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
            failed = Said(f"TensorFlow's process failed: {lines[-1]}")
            return {(t.case, t.backend, t.dtype): failed for t in tasks}
        said = json.loads((folder / "results.json").read_text())
        with np.load(folder / "results.npz") as results:
            for i, (t, answer) in enumerate(zip(tasks, said, strict=True)):
                if "error" in answer:
                    value = Said(answer["error"])
                else:
                    got = torch.from_numpy(results[str(i)]).to(getattr(torch, answer["dtype"]))
                    value = (got, answer["stages"])
                answers[(t.case, t.backend, t.dtype)] = value
    return answers


def _rows(task) -> torch.Tensor:
    """A collective cell's rows (one per rank), rounded to its dtype."""
    case = CASES[task.case]
    return rounded(make_inputs(case, task.seed, ranks_of(task.backend)), DTYPES[task.dtype])[0]


def _answered(answers: dict, backend: str, case, args) -> tuple:
    """A cell computed elsewhere (TensorFlow's process, a group of ranks): its result and the
    roundings its spelling adds, as a custom backend gives them."""
    dtype = next(str(a.dtype).removeprefix("torch.") for a in args if a.is_floating_point())
    answer = answers[(case.name, backend, dtype)]
    if isinstance(answer, Exception):
        raise answer
    return answer


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
        terms = "ranks" if c.sums_ranks else c.reduction
        lines.append(f"  {c.name:<30} {c.describe_call()}  K={terms}")
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
    return _layerdiff.deliver_ops(command, run)
