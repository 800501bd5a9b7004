"""The PyTorch side: capture every leaf-module call with forward hooks, export to ONNX, and hand
both to the Rust core, which maps layers to ONNX values, runs ONNX Runtime and compares.

This is the only module of layerdiff that imports torch.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import io
import queue
import sys
import tempfile
import threading
import time
import warnings
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from layerdiff import _layerdiff, _ort
from layerdiff.report import Report
from layerdiff.tensors import dtype_name, flat

IDENTITY_AT_INFERENCE = (
    nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
    nn.FeatureAlphaDropout,
)  # fmt: skip


# --------------------------------------------------------------------------------------------
# Capture


# Ops a module's own `forward` computes between its submodules that get rows of their own
# (a residual `out += identity`, an attention's `matmul` and `softmax`, the batch norm of a
# module that is a BatchNorm and holds its activation, like timm's BatchNormAct2d), by the name
# captured calls give them: `__iadd__`, `add_` and `torch.add` are all `add`.
FUNCTIONAL_OPS = frozenset(
    {"add", "sub", "mul", "div", "matmul", "bmm", "softmax", "relu", "gelu", "silu", "sigmoid",
     "tanh", "cat", "layer_norm", "batch_norm", "group_norm", "scaled_dot_product_attention"}
)  # fmt: skip


def functional_op(func) -> str | None:
    """The op a torch function call computes, when it is one that gets a row."""
    name = getattr(func, "__name__", "")
    if name.startswith("__") and name.endswith("__"):
        name = name[2:-2]
        if name[:1] in ("i", "r") and name[1:] in FUNCTIONAL_OPS:  # __iadd__, __radd__
            name = name[1:]
    name = name.strip("_")
    return name if name in FUNCTIONAL_OPS else None


@dataclass
class CapturedLayer:
    """One call of a leaf module, or one functional call between modules (``op`` set): what it
    produced, and where its input came from."""

    name: str  # module path, `#2`, `#3`… for repeated calls; `owner:op` for a functional call
    module: str  # for a functional call, the module whose forward made it ("" for the model)
    module_type: str
    call_index: int
    identity: bool
    input_from: int | None
    shape: list[int]
    dtype: str  # layerdiff's dtype name (`float32`)
    # (element count, samples): pairs the layer by value where the ONNX file names no scope
    fingerprint: tuple[int, list[float]] | None = None
    op: str | None = None


@dataclass
class Capture:
    """Every leaf-module call of one forward pass, in execution order."""

    layers: list[CapturedLayer] = field(default_factory=list)
    output: object = None


def leaf_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Modules without children, with their qualified names (the model itself if it has none)."""
    leaves = [(n, m) for n, m in model.named_modules() if n and not any(True for _ in m.children())]
    return leaves or [(type(model).__name__, model)]


def _first_tensor(value):
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        for v in value:
            t = _first_tensor(v)
            if t is not None:
                return t
    if isinstance(value, dict):
        for v in value.values():
            t = _first_tensor(v)
            if t is not None:
                return t
    return None


class _FunctionalCalls(TorchFunctionMode):
    """Sees every torch function call of a forward pass and hands those of `FUNCTIONAL_OPS`
    made by a module's own `forward` (not inside a leaf module) to `record(op, owner, output)`."""

    def __init__(self, stack: list, leaves: set, record):
        super().__init__()
        self.stack, self.leaves, self.record = stack, leaves, record

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        owner = self.stack[-1] if self.stack else None
        op = functional_op(func)
        if (
            op is not None
            and owner is not None
            and owner[1] not in self.leaves
            and isinstance(out, torch.Tensor)
            and out.is_floating_point()
            and out.dim() > 0
        ):
            self.record(op, owner[0], args, out)
        return out


def capture(model: nn.Module, inputs: tuple, on_layer=None, *, fingerprints=False) -> Capture:
    """Runs `model(*inputs)` once under `torch.no_grad()`, listing each leaf call and each
    functional call a module's own `forward` makes between its submodules (with a fingerprint
    of each output when ``fingerprints``).

    ``on_layer(index, layer, output)`` sees each call's output the moment the module returns
    it, before any later op can rewrite it in place; nothing is kept here, so PyTorch frees each
    activation as usual.
    """
    result = Capture()
    names = {m: n for n, m in leaf_modules(model)}
    calls: dict[str, int] = {}
    # data_ptr of an output → (index of the layer that produced it, the output, weakly): an
    # address is only that layer's while its output lives, since freed memory is reused.
    producer: dict[int, tuple[int, weakref.ref]] = {}

    def source(tensor) -> int | None:
        index, output = producer.get(tensor.data_ptr(), (None, lambda: None))
        return index if output() is not None else None

    def next_call(key: str) -> int:
        """The index of this call among the calls of `key` (every call counts, as the legacy
        exporter's `_N` scopes do, tensor output or not)."""
        k = calls.get(key, 0)
        calls[key] = k + 1
        return k

    def add_layer(k: int, key: str, module: str, module_type: str, out, args, **kind) -> None:
        first_in = _first_tensor(args)
        called = key if k == 0 else f"{key}#{k + 1}"
        layer = CapturedLayer(
            name=called,
            module=module,
            module_type=module_type,
            call_index=k,
            input_from=source(first_in) if first_in is not None else None,
            shape=list(out.shape),
            dtype=dtype_name(called, out),
            fingerprint=_layerdiff.fingerprint(flat(called, out)) if fingerprints else None,
            **kind,
        )
        index = len(result.layers)
        result.layers.append(layer)
        producer[out.data_ptr()] = (index, weakref.ref(out))
        if on_layer is not None:
            on_layer(index, layer, out.detach())

    def hook(module, args, output):
        name = names[module]
        k = next_call(name)
        out = _first_tensor(output)
        if out is not None:
            identity = isinstance(module, IDENTITY_AT_INFERENCE) and not module.training
            add_layer(k, name, name, type(module).__name__, out, args, identity=identity)

    def function(op, owner, args, out):
        key = f"{owner}:{op}"
        add_layer(next_call(key), key, owner, f"{op}()", out, args, identity=False, op=op)

    # Which module's forward is running, for the functional calls it makes.
    paths = {m: n for n, m in model.named_modules()}
    running: list = []
    leaves = set(names)

    def enter(module, args):
        running.append((paths[module], module))

    def leave(module, args, output):
        running.pop()

    handles = [m.register_forward_pre_hook(enter) for m in paths]
    handles += [m.register_forward_hook(hook) for m in names]
    handles += [m.register_forward_hook(leave) for m in paths]
    try:
        with torch.no_grad(), _FunctionalCalls(running, leaves, function):
            result.output = model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return result


class _Float64Run:
    """A float64 copy of the model run in lockstep beside the main forward pass: a thread runs
    it, and its hooks hand each layer's value over one at a time, so only a layer or two of
    float64 values exist at once. Gives up (``None`` from then on) where the copy cannot run
    in float64 or calls its layers differently."""

    _END = object()

    def __init__(self, model: nn.Module, inputs: tuple):
        self.queue: queue.Queue = queue.Queue(maxsize=1)
        self.stop = threading.Event()
        self.done = False
        try:  # the copy is made before any hook is registered on the model
            double = copy.deepcopy(model).double()
        except Exception:
            self.done, self.thread = True, None
            return
        wide = tuple(t.double() if t.is_floating_point() else t for t in inputs)
        self.thread = threading.Thread(target=self._run, args=(double, wide), daemon=True)
        self.thread.start()

    def _put(self, item) -> None:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.05)
                return
            except queue.Full:
                continue
        raise _Stopped

    def _run(self, double: nn.Module, wide: tuple) -> None:
        try:
            capture(double, wide, lambda i, layer, out: self._put((layer.name, out.clone())))
        except Exception:  # a model that cannot run in float64 still gets its comparison
            pass
        with contextlib.suppress(_Stopped):
            self._put(self._END)

    def next(self, name: str):
        """The float64 value of the layer `name`, or None."""
        if self.done:
            return None
        item = self.queue.get()
        if item is self._END or item[0] != name:
            self.close()
            return None
        return item[1]

    def close(self) -> None:
        self.done = True
        self.stop.set()
        if self.thread is not None:
            self.thread.join()


class _Stopped(Exception):
    pass


# --------------------------------------------------------------------------------------------
# Export


def export_onnx(model: nn.Module, inputs: tuple, path: Path, *, exporter: str = "dynamo") -> Path:
    """Exports with ``torch.onnx.export``; the exporter's chatter goes to stderr, never stdout."""
    if exporter not in ("dynamo", "legacy"):
        raise _layerdiff.UsageError(f"unknown exporter `{exporter}` (expected dynamo or legacy)")
    chatter = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(chatter):
            warnings.simplefilter("ignore")
            if exporter == "dynamo":
                program = torch.onnx.export(model, inputs, dynamo=True, verbose=False)
                program.save(str(path))
            else:
                torch.onnx.export(model, inputs, str(path), dynamo=False)
    except Exception as e:  # the exporter's own failure: report it, with what it printed
        detail = chatter.getvalue().strip().splitlines()[-5:]
        raise _layerdiff.ModelError(
            f"torch.onnx.export ({exporter}) failed: {type(e).__name__}: {e}"
            + ("\n" + "\n".join(detail) if detail else "")
        ) from e
    return path


# --------------------------------------------------------------------------------------------
# Models


def _torchvision(name: str):
    def build(seed: int):
        import torchvision

        torch.manual_seed(seed)
        model = getattr(torchvision.models, name)(weights=None)
        generator = torch.Generator().manual_seed(seed)
        return model, (torch.randn(1, 3, 224, 224, generator=generator),)

    return build


BUILTIN_MODELS = {
    name: _torchvision(name) for name in ("resnet18", "resnet50", "mobilenet_v3_small", "vit_b_16")
}


def load_builder(spec: str):
    """`resnet18`, `path/to/file.py:build` or `package.module:build` → a function of the seed."""
    if spec in BUILTIN_MODELS:
        return BUILTIN_MODELS[spec]
    if ":" not in spec:
        known = ", ".join(sorted(BUILTIN_MODELS))
        raise _layerdiff.UsageError(
            f"unknown model `{spec}`: expected a built-in name ({known}), "
            "`path/to/file.py:function` or `package.module:function`"
        )
    target, func_name = spec.rsplit(":", 1)
    if target.endswith(".py") or "/" in target:
        path = Path(target)
        if not path.is_file():
            raise _layerdiff.UsageError(f"builder file `{target}` does not exist")
        module_spec = importlib.util.spec_from_file_location(
            f"_layerdiff_builder_{path.stem}", path
        )
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_spec.name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as e:
            raise _layerdiff.UsageError(
                f"importing `{target}` failed: {type(e).__name__}: {e}"
            ) from e
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise _layerdiff.UsageError(f"cannot import module `{target}`: {e}") from e
    func = getattr(module, func_name, None)
    if not callable(func):
        raise _layerdiff.UsageError(f"`{target}` has no function `{func_name}`")

    def build(seed: int):
        torch.manual_seed(seed)
        try:
            built = func()
        except Exception as e:
            raise _layerdiff.UsageError(f"`{spec}` raised {type(e).__name__}: {e}") from e
        if not (isinstance(built, tuple) and len(built) == 2 and isinstance(built[0], nn.Module)):
            raise _layerdiff.UsageError(
                f"`{spec}` must return (model, example_inputs), got {type(built).__name__}"
            )
        return built

    return build


def _as_input_tuple(inputs) -> tuple:
    if isinstance(inputs, torch.Tensor):
        return (inputs,)
    if isinstance(inputs, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in inputs):
        return tuple(inputs)
    raise _layerdiff.InputError(
        f"example inputs must be a tensor or a tuple of tensors, got {type(inputs).__name__}"
    )


# --------------------------------------------------------------------------------------------
# Comparison


def compare_torch_onnx(
    model: nn.Module,
    inputs,
    *,
    onnx: str | Path | None = None,
    tolerance: float | str = "dtype",
    exporter: str = "dynamo",
    target: str = "ort",
    name: str | None = None,
    seed: int | None = None,
    workdir: str | Path | None = None,
    clone: bool = True,
    local: bool = True,
    float64: bool = True,
    max_memory: int | str | None = None,
    timings: bool | list = False,
    progress=None,
    options: _layerdiff.Options | None = None,
) -> Report:
    """Compare a PyTorch model with its ONNX export under ONNX Runtime, layer by layer.

    The one model instance given is both captured and exported (or, with ``onnx=``, compared
    against that file), and both sides receive the same input bytes. ``target`` names the runtime
    that runs the ONNX file: ``"ort"`` (CPU, optimizations off), ``"ort:opt=all"``,
    ``"ort:cuda"``…, or ``"tract"``.

    ``tolerance`` is a number for every layer, ``"dtype"`` (float32 1e-4, float16 1e-2, bfloat16
    5e-2) or ``"auto"`` (4× PyTorch's own distance from the float64 run, per layer). With
    ``local`` each layer's ONNX nodes are also re-run on PyTorch's values of their inputs, so the
    report tells a layer's own error from inherited error; with ``float64`` a float64 copy of the
    model is run as the numerical truth. ``report.drift_origin`` names the layer where the drift
    is born; each exceeding layer carries a ``cause``. With ``timings`` (True, or a list of
    ``(phase, by, seconds)`` measured before the call) the report holds the time of each phase.

    Layers stream from the forward hooks: the ONNX run goes in segments, each run as soon as
    PyTorch has produced its layers, so that the values held at once stay within
    ``max_memory`` (bytes, or a size such as ``"4G"``; default: half the memory available).
    The numbers do not depend on it.

    ``options`` (an ``Options`` already parsed, as the command line makes) replaces
    ``tolerance``, ``local``, ``float64``, ``max_memory`` and ``target``.
    """
    phases = list(timings) if isinstance(timings, list) else []
    clock = [time.perf_counter()]

    def lap(phase: str, by: str = "pytorch") -> None:
        now = time.perf_counter()
        phases.append((phase, by, now - clock[0]))
        clock[0] = now

    step = progress or (lambda message: None)
    inputs = _as_input_tuple(inputs)
    if options is None:
        options = _layerdiff.Options(
            tolerance=str(tolerance),
            local=local,
            max_memory=None if max_memory is None else str(max_memory),
            target=target,
            float64=float64,
        )
    model.eval()

    step("listing PyTorch layers")
    listed = _run_model(inputs, lambda: capture(model, inputs, fingerprints=True)).layers
    lap("listing PyTorch layers")

    with contextlib.ExitStack() as stack:
        if onnx is not None:
            onnx_path = Path(onnx)
            if not onnx_path.is_file():
                raise _layerdiff.UsageError(f"ONNX file `{onnx}` does not exist")
        else:
            folder = (
                Path(workdir)
                if workdir
                else Path(stack.enter_context(tempfile.TemporaryDirectory()))
            )
            folder.mkdir(parents=True, exist_ok=True)
            step(f"exporting to ONNX ({exporter})")
            onnx_path = export_onnx(model, inputs, folder / "model.onnx", exporter=exporter)
            lap("ONNX export")

        declared = _layerdiff.model_inputs(str(onnx_path))
        if len(declared) != len(inputs):
            names = ", ".join(d[0] for d in declared)
            raise _layerdiff.InputError(
                f"the ONNX model takes {len(declared)} input(s) ({names}), "
                f"but {len(inputs)} example input(s) were given"
            )
        onnx_inputs = [flat(decl[0], t) for decl, t in zip(declared, inputs, strict=True)]
        run = _layerdiff.CapturedRun(
            command="torch",
            model=name or type(model).__name__,
            onnx_path=str(onnx_path),
            inputs=onnx_inputs,
            layers=[vars(layer) for layer in listed],
            options=options,
            seed=seed,
            reference_runtime="pytorch",
            reference_detail=f"torch {torch.__version__}, eager, cpu",
            ort_library=_ort.library(),
            timings=phases if timings is not False else None,
        )
        split = run.segments_text
        pieces = f" in {run.segments} segments" if split else ""
        step(f"running PyTorch and the ONNX model side by side{pieces}, comparing each layer")
        _stream(model, inputs, run, listed, float64=options.float64, clone=clone)
        needed = run.conclude()
        native = run.finish(_layer_parameters(model, listed, needed))
    report = Report(native, inputs=onnx_inputs)
    if split:
        report.notes.append(split)
    return report


def _run_model(inputs: tuple, call):
    """`call()`, with a failure of the model itself reported as bad input (our own errors, e.g.
    from the ONNX side while layers stream in, pass through)."""
    try:
        return call()
    except _layerdiff.LayerdiffError:
        raise
    except Exception as e:
        shapes = ", ".join(f"{tuple(t.shape)} {t.dtype}" for t in inputs)
        raise _layerdiff.InputError(
            f"the model failed on its inputs ({shapes}): {type(e).__name__}: {e}"
        ) from e


def _stream(model, inputs, run, listed, *, float64: bool, clone: bool) -> None:
    """The second forward pass: each layer's value goes to the run as its hook fires, with the
    float64 run's value of the same layer. ``clone=False`` instead hands the outputs over after
    the pass, by reference: it exists only so a test can show what in-place ops
    (``ReLU(inplace=True)``) then do to them."""
    truth = _Float64Run(model, inputs) if float64 else None
    late: list = []

    def on_layer(index, layer, out):
        expected = listed[index].name if index < len(listed) else None
        if layer.name != expected:
            raise _layerdiff.InputError(
                f"leaf call {index} was `{layer.name}` this time and "
                f"{f'`{expected}`' if expected else 'nothing'} when the layers were listed: "
                "the model does not run the same way twice"
            )
        wide = truth.next(layer.name) if truth is not None else None
        if clone:
            run.add(index, flat(layer.name, out), _flat_or_none(layer.name, wide))
        else:
            late.append((index, layer.name, out, wide))

    try:
        _run_model(inputs, lambda: capture(model, inputs, on_layer))
    finally:
        if truth is not None:
            truth.close()
    for index, layer_name, out, wide in late:
        run.add(index, flat(layer_name, out), _flat_or_none(layer_name, wide))


def _flat_or_none(name: str, tensor):
    return None if tensor is None else flat(name, tensor)


_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d)
_BATCH_NORM = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def _layer_parameters(model: nn.Module, listed: list[CapturedLayer], needed: list[int]) -> dict:
    """The parameters and buffers of the layers in `needed` (by index), as flat tensors by
    qualified name, for the weight check. A BatchNorm fed by a Conv also lists the Conv's
    weight and bias folded with it, under the Conv's names: that is the form exporters write
    when they fuse the two."""
    modules = dict(model.named_modules())
    out: dict[int, list] = {}
    for index in needed:
        layer = listed[index]
        module = modules.get(layer.module)
        if module is None:
            continue
        own = [
            (f"{layer.module}.{n}", t.detach())
            for n, t in [
                *module.named_parameters(recurse=False),
                *module.named_buffers(recurse=False),
            ]
            if t is not None and t.is_floating_point()
        ]
        feeder = listed[layer.input_from] if layer.input_from is not None else None
        conv = modules.get(feeder.module) if feeder is not None else None
        if (
            isinstance(module, _BATCH_NORM)
            and isinstance(conv, _CONV)
            and module.track_running_stats
        ):
            scale = module.running_var.add(module.eps).rsqrt()
            if module.weight is not None:
                scale = scale * module.weight.detach()
            shift = -module.running_mean * scale
            if module.bias is not None:
                shift = shift + module.bias.detach()
            shape = (-1,) + (1,) * (conv.weight.dim() - 1)
            own.append((f"{feeder.module}.weight", conv.weight.detach() * scale.reshape(shape)))
            bias = shift if conv.bias is None else conv.bias.detach() * scale + shift
            own.append((f"{feeder.module}.bias", bias))
            own += [
                (f"{feeder.module}.{n}", t.detach())
                for n, t in conv.named_parameters(recurse=False)
            ]
        out[index] = [flat(n, t) for n, t in own]
    return out
