"""A checkpoint larger than the memory it may use: its model built with every parameter on the
`meta` device (no memory), and each module's weights read from the checkpoint's safetensors
files as the forward pass reaches the module, then dropped when it returns. At any moment the
model holds the weights of the modules running (a projection, a norm), not all of them; the
float64 truth and the baseline's replay (`layerdiff.torch._widened`) read theirs from the same
files, one module at a time.

Buffers are made as the model's code makes them (a rotary table, a causal mask: computed, not
stored), then replaced by the file's where it stores them. A module whose weights another one
reads while it is not running would hand over a placeholder, and fails loudly (PyTorch refuses
to compute with `meta` tensors) rather than compute wrong."""

from __future__ import annotations

import contextlib
import copy
import json
import threading
import weakref
from pathlib import Path

import torch
from torch import nn

from layerdiff import _layerdiff


class Weights:
    """The tensors of a checkpoint folder's safetensors files (`model.safetensors`, or the
    shards its `model.safetensors.index.json` lists), each read from its file when asked for
    (read, not mapped: a mapped file's pages would count in the process's memory as it is
    read through); floating ones in float32, the dtype the model is compared in."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        index = self.folder / "model.safetensors.index.json"
        if index.is_file():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        elif (self.folder / "model.safetensors").is_file():
            files = ["model.safetensors"]
        else:
            raise _layerdiff.UsageError(
                f"`{self.folder}` holds no model.safetensors (nor its index): reading the "
                "weights one module at a time needs them in safetensors"
            )
        # name → (file, dtype, shape, first byte, bytes)
        self._where: dict[str, tuple] = {}
        for file in files:
            path = self.folder / file
            try:
                with open(path, "rb") as f:
                    length = int.from_bytes(f.read(8), "little")
                    header = json.loads(f.read(length))
            except (OSError, ValueError) as e:
                raise _layerdiff.UsageError(f"`{path}` is not a safetensors file: {e}") from e
            for name, entry in header.items():
                if name == "__metadata__":
                    continue
                begin, end = entry["data_offsets"]
                dtype = _DTYPES.get(entry["dtype"])
                if dtype is None:
                    raise _layerdiff.UsageError(
                        f"`{path}` stores `{name}` as {entry['dtype']}, a dtype PyTorch has not"
                    )
                self._where[name] = (path, dtype, entry["shape"], 8 + length + begin, end - begin)
        self._lock = threading.Lock()  # the float64 copy reads from its own thread
        self._buffers = threading.local()

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def names(self):
        """The tensors' names, in the files' order."""
        return iter(self._where)

    def float32_bytes(self) -> int:
        """What the weights take in float32 (the dtype the model is held in)."""
        total = 0
        for _, dtype, _, _, size in self._where.values():
            numel = size // dtype.itemsize
            total += numel * 4 if dtype.is_floating_point else size
        return total

    def get(self, name: str, dtype: torch.dtype | None = torch.float32) -> torch.Tensor:
        """The tensor `name`, floating ones with float32's values (the model's) in `dtype`: a
        float64 copy's weights are widened straight from what the file stores, with no float32
        copy on the way. `dtype` None: as the file stores it where that is the model's values
        exactly (float16, bfloat16, float32), else in float32."""
        return self.rows(name, 0, None, dtype)

    def rows(
        self, name: str, start: int, stop: int | None, dtype: torch.dtype | None = torch.float32
    ) -> torch.Tensor:
        """Rows `start:stop` of the tensor `name` (along its first axis), read alone from its
        file, as `get` gives them. Read straight into the tensor made, where it keeps the
        file's dtype; else a band of rows at a time through a buffer each thread keeps, each
        band converted into it: never a copy of the raw bytes beside the tensor."""
        path, stored, shape, offset, size = self._where[name]
        row = size // shape[0] if shape and shape[0] else size
        stop = (shape[0] if shape else 1) if stop is None else stop
        rows = [stop - start, *shape[1:]] if shape else shape
        if (stop - start) * row >= _LARGE:
            # What the modules before freed goes back to the system first (glibc keeps it in
            # pieces, and a wide tensor is placed beside them): a few times a run, before the
            # widest reads; after every module, its pages would be faulted in again and again.
            _layerdiff.give_back_freed()
        if not stored.is_floating_point:
            want = stored
        else:
            model = torch.float32 if stored.itemsize > 4 else stored  # the model's values
            want = model if dtype is None else dtype
        out = torch.empty(rows, dtype=want)
        if out.numel() == 0:
            return out
        by_row = out.reshape(stop - start, -1)  # a scalar as one row
        band = stop - start if want == stored else max(1, _BAND // row)
        with open(path, "rb") as f:
            for first in range(start, stop, band):
                last = min(first + band, stop)
                length = (last - first) * row
                if want == stored:
                    into = out.reshape(-1).view(torch.uint8)
                else:
                    into = self._buffer(length)
                with self._lock:
                    f.seek(offset + first * row)
                    if f.readinto(memoryview(into.numpy())) != length:
                        raise _layerdiff.UsageError(
                            f"`{path}` ends inside `{name}`: the file is cut short"
                        )
                if want != stored:
                    read = into.view(stored).reshape(last - first, -1)
                    # float64 in the file: the model's float32 values, then the dtype asked for
                    by_row[first - start : last - start] = (
                        read.float() if stored.itemsize > 4 else read
                    )
        return out

    def _buffer(self, length: int) -> torch.Tensor:
        """This thread's read buffer, `length` bytes of it."""
        held = getattr(self._buffers, "raw", None)
        if held is None or held.numel() < length:
            self._buffers.raw = None  # the smaller one goes first
            held = self._buffers.raw = torch.empty(length, dtype=torch.uint8)
        return held[:length]


#: Bytes of a read before which the memory the process has freed goes back to the system.
_LARGE = 64 << 20
#: Bytes of the file read at once where a tensor is converted as it is read.
_BAND = 16 << 20


_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64,
    "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip


@contextlib.contextmanager
def parameters_on_meta():
    """Modules built inside make their parameters on the meta device, each freed as soon as it
    is made (one tensor at a time at most), their buffers as their code makes them."""
    register = nn.Module.register_parameter

    def on_meta(module, name, param):
        register(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = nn.Parameter(
                param.to("meta"), requires_grad=param.requires_grad
            )

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


#: A streamed module → the weights and, for each parameter, its name in the files.
_SOURCES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def stream(model: nn.Module, weights: Weights) -> None:
    """Makes `model` (built by `parameters_on_meta`) read each module's parameters from
    `weights` while the module runs, and load the buffers the files store now. A parameter
    tied to another (an output head sharing the embedding's matrix) is read under whichever of
    its names the files hold."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    missing = []
    for prefix, module in model.named_modules():
        for name, b in list(module._buffers.items()):
            key = f"{prefix}.{name}" if prefix else name
            if b is not None and key in weights:
                module._buffers[name] = weights.get(key).to(b.dtype)
        own = {}
        for name, p in module._parameters.items():
            if p is None:
                continue
            stored = [n for n in names[id(p)] if n in weights]
            if not stored:
                missing.append(f"{prefix}.{name}" if prefix else name)
                continue
            own[name] = stored[0]
        if own:
            _SOURCES[module] = (weights, own, [0])
            module.register_forward_pre_hook(_load)
            module.register_forward_hook(_drop, always_call=True)
    if missing:
        held = next(iter(weights.names()), "nothing")
        raise _layerdiff.UsageError(
            f"`{weights.folder}` stores no tensor under {len(missing)} of the model's parameter "
            f"names ({', '.join(missing[:3])}{'…' if len(missing) > 3 else ''}; it holds "
            f"`{held}`…): held one module at a time, a checkpoint is read by the model's own "
            "names, which an older checkpoint may not use (transformers renames them when it "
            "loads the model whole: give a --max-memory its weights fit in)"
        )


def is_streamed(model: nn.Module) -> bool:
    """Whether `model` reads its weights from the files as it runs (`stream`)."""
    return any(m in _SOURCES for m in model.modules())


def refuse_export(model: nn.Module) -> None:
    """A `UsageError` where `model` is streamed: an export needs all of its weights at once."""
    if is_streamed(model):
        raise _layerdiff.UsageError(
            "the checkpoint is held one module at a time (its weights take more than the "
            "memory budget allows at once), and an export needs all of them: give its ONNX "
            "file with --onnx (onnx= in Python), exported where it fits or by optimum"
        )


#: A module of a copy that holds its weights only while it runs (`layerdiff.torch._widened`)
#: → how it reads one of them as it would hold it: (name, its placeholder) → the tensor.
_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def register_copy(module: nn.Module, read) -> None:
    """Lets `weight` read the weights of `module`, of a copy, with `read` (see `_COPIES`)."""
    _COPIES[module] = read


def weight(
    module: nn.Module, name: str, t: torch.Tensor, dtype: torch.dtype | None = torch.float32
) -> torch.Tensor:
    """The parameter `name` of `module` (`t`, as the module holds it now), read from the files
    (in `dtype`: see `Weights.get`) where the module is streamed and not running; of a copy's
    module that is not running, made as the copy makes it (in the copy's dtype)."""
    if t.device.type != "meta":
        return t
    if module in _COPIES:
        return _COPIES[module](name, t)
    if module not in _SOURCES:
        return t
    weights, own, _ = _SOURCES[module]
    return weights.get(own[name], dtype) if name in own else t


def state_of(module: nn.Module) -> dict[str, torch.Tensor]:
    """`module`'s parameters and buffers by name (ties under each name), a streamed model's read
    from the files (`weight`)."""
    out = {}
    for prefix, m in module.named_modules(remove_duplicate=False):
        for name, t in [*m._parameters.items(), *m._buffers.items()]:
            if t is not None:
                out[f"{prefix}.{name}" if prefix else name] = weight(m, name, t).detach()
    return out


def unstreamed(module: nn.Module) -> nn.Module:
    """A copy of `module` on the `meta` device without the hooks that read a streamed model's
    weights: what a repro saves, loadable where layerdiff is not installed."""
    copied = copy.deepcopy(module).to("meta")
    for m in copied.modules():
        for hooks, ours in ((m._forward_pre_hooks, _load), (m._forward_hooks, _drop)):
            for key in [k for k, hook in hooks.items() if hook is ours]:
                del hooks[key]
                m._forward_hooks_always_called.pop(key, None)
    return copied


def weight_rows(
    module: nn.Module, name: str, start: int, stop: int, dtype: torch.dtype | None
) -> torch.Tensor:
    """Rows `start:stop` of the parameter `name` of `module`: a view of the module's own where it
    holds it, else read alone from the files (see `Weights.rows`)."""
    t = module._parameters[name]
    if t.device.type != "meta" or module not in _SOURCES:
        return t.detach()[start:stop]
    weights, own, _ = _SOURCES[module]
    return weights.rows(own[name], start, stop, dtype)


def _load(module, _args):
    if module not in _SOURCES:  # a copy of a streamed model (the float64 truth's) reads its own
        return
    weights, own, running = _SOURCES[module]
    running[0] += 1
    if running[0] == 1:
        # the placeholders stay: put back after, they keep a tied weight one parameter
        _PLACEHOLDERS[module] = {name: module._parameters[name] for name in own}
        for name, key in own.items():
            module._parameters[name] = nn.Parameter(weights.get(key), requires_grad=False)


def _drop(module, _args, _output):
    if module not in _SOURCES:
        return
    _, own, running = _SOURCES[module]
    running[0] -= 1
    if running[0] == 0:
        module._parameters.update(_PLACEHOLDERS.pop(module))


#: A streamed module while it runs → the placeholders its weights replaced, by name.
_PLACEHOLDERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
