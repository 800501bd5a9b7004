"""Exporting a model to ONNX with either `torch.onnx.export` path, once per model: exports are
kept in the user's cache folder under a key of everything that decides the file (the weights,
the model's code, the inputs, the exporter, its options and versions), so a second run of the
same model reuses the file instead of exporting again."""

from __future__ import annotations

import contextlib
import inspect
import io
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path

import torch
from torch import nn

from layerdiff import _layerdiff
from layerdiff._cache import cache_folder

#: Bumped when what an export key covers changes: older entries are then never found.
_KEY_VERSION = "layerdiff-export/2"
#: Total size of the kept exports above which the least recently used go (bytes); the
#: environment's `LAYERDIFF_CACHE_SIZE` (bytes) replaces it.
_CACHE_SIZE = 20 << 30


def export_onnx(
    model: nn.Module,
    inputs: tuple,
    path: Path,
    *,
    exporter: str = "dynamo",
    opset: int | None = None,
    dynamic: list[list[int]] | None = None,
    cache: bool = True,
    step=None,
    copy: bool = True,
    external_data: bool | None = None,
) -> Path:
    """Exports with ``torch.onnx.export`` to ``path``; the exporter's chatter (the legacy one
    prints whole graphs when it fails) is kept back, and its last lines go in the error when it
    fails. ``dynamic``: for each input, the dimensions exported dynamic (a batch or shape
    axis). With ``cache`` an export of the very same model, inputs and options made before is
    reused (see `cache_folder`); the path returned is then ``path`` (a copy: a file the user
    edits in place must not change the kept one), or the kept file itself where it has external
    data or where ``copy`` is False (the caller only reads it). ``step`` hears which of the two
    happened. ``external_data``: the weights go to a file beside the model (``model.onnx.data``)
    when True, inline when False; by default only past ONNX's 2 GB limit."""
    say = step or (lambda message: None)
    exporter = _layerdiff.choice("exporter", exporter)
    from layerdiff.torch._streamed import refuse_export

    refuse_export(model)
    entry = None
    if cache:
        try:
            key = export_key(model, inputs, exporter, opset, dynamic, external_data)
        except Exception:  # a tensor whose bytes cannot be read (quantized, sparse): no key
            key = None
        entry = cache_folder() / "exports" / key if key else None
        kept = entry / "model.onnx" if entry else None
        if kept is not None and kept.is_file():
            say(f"ONNX export ({exporter}): the same model's, kept from an earlier run")
            with contextlib.suppress(OSError):
                os.utime(entry)  # recently used
            return _placed(kept, Path(path)) if copy else kept
    say(f"exporting to ONNX ({exporter})")
    if entry is None:
        return _export(model, inputs, Path(path), exporter, opset, dynamic, external_data)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".partial-", dir=entry.parent))
    except OSError:  # no cache folder to write to: the export goes where it was asked
        return _export(model, inputs, Path(path), exporter, opset, dynamic, external_data)
    try:
        _export(model, inputs, staging / "model.onnx", exporter, opset, dynamic, external_data)
        try:
            staging.rename(entry)  # whole or not at all
        except OSError:  # another run kept the same export meanwhile
            pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _evict(entry.parent, keep=entry)
    return _placed(entry / "model.onnx", Path(path)) if copy else entry / "model.onnx"


def export_key(
    model: nn.Module, inputs: tuple, exporter: str, opset, dynamic, external_data=None
) -> str:
    """A digest of everything that decides the exported file: the versions of PyTorch and the
    exporter's packages, the exporter and its options, the source files of every class in the
    model (and of a forward replaced on an instance), every parameter, buffer and tensor
    attribute (name, dtype, shape, bytes), and the inputs (the same, so a traced branch that
    depends on their values is keyed too). The core's BLAKE3 digest: the weights' bytes are hashed
    in place on every core (a 2.3 GB model in a fraction of a second)."""
    digest = _layerdiff.Digest()

    def add(*parts) -> None:
        for part in parts:
            digest.update(str(part).encode())
            digest.update(b"\0")

    def add_tensor(name: str, t: torch.Tensor) -> None:
        t = t.detach()
        add(name, t.dtype, tuple(t.shape), t.device.type)
        if t.numel():
            data = t.cpu().contiguous().reshape(-1).view(torch.uint8)
            digest.update(data.numpy())

    add(_KEY_VERSION, torch.__version__, _version("onnx"), _version("onnxscript"))
    add(exporter, opset, dynamic)
    if external_data is not None:  # keys made before the option stay the same
        add("external_data", external_data)
    sources: set[str] = set()
    for module in model.modules():
        for code in (type(module), vars(module).get("forward")):
            with contextlib.suppress(TypeError, OSError):
                if code is not None and (source := inspect.getsourcefile(code)):
                    sources.add(source)
    for source in sorted(sources):
        add(source)
        with contextlib.suppress(OSError):
            digest.update(Path(source).read_bytes())
    for name, module in model.named_modules(remove_duplicate=False):
        for attribute, value in vars(module).items():
            if attribute in ("_parameters", "_buffers"):
                for own, t in value.items():
                    if t is not None:
                        add_tensor(f"{name}.{own}", t)
            elif isinstance(value, torch.Tensor):
                add_tensor(f"{name}.{attribute}", value)
        add(name, type(module).__qualname__, module.training)
    for i, t in enumerate(inputs):
        if isinstance(t, torch.Tensor):
            add_tensor(f"input {i}", t)
        else:
            add(f"input {i}", repr(t))
    return digest.hexdigest()[:32]


def _version(package: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "-"


def _placed(kept: Path, path: Path) -> Path:
    """A copy of the kept export at `path`; the kept file itself where it has external data,
    whose file names it records."""
    if any(p.name != "model.onnx" for p in kept.parent.iterdir()):
        return kept
    if path.resolve() == kept.resolve():
        return kept
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    shutil.copyfile(kept, partial)
    partial.replace(path)  # whole or not at all: an interrupted copy leaves the old file
    return path


def _evict(folder: Path, keep: Path) -> None:
    """Drops the least recently used exports while all of them take more than the cache's
    size (`LAYERDIFF_CACHE_SIZE`, bytes); `keep` stays."""
    limit = _size(os.environ.get("LAYERDIFF_CACHE_SIZE", str(_CACHE_SIZE)))
    entries = []
    for entry in folder.iterdir():
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        with contextlib.suppress(OSError):
            size = sum(f.stat().st_size for f in entry.iterdir())
            entries.append((entry.stat().st_mtime, size, entry))
    total = sum(size for _, size, _ in entries)
    for _, size, entry in sorted(entries, key=lambda e: e[0]):
        if total <= limit:
            break
        if entry != keep:
            shutil.rmtree(entry, ignore_errors=True)
            total -= size


def _size(text: str) -> int:
    """`LAYERDIFF_CACHE_SIZE` in bytes: a number, or one with K, M, G or T (powers of 1024)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    spelled = text.strip().upper().removesuffix("B").removesuffix("I")
    try:
        if spelled[-1:] in units:
            return int(float(spelled[:-1]) * units[spelled[-1]])
        return int(spelled)
    except ValueError:
        raise _layerdiff.UsageError(
            f"LAYERDIFF_CACHE_SIZE is `{text}`: give a size in bytes, or with K, M, G or T"
        ) from None


def _export(model, inputs, path: Path, exporter: str, opset, dynamic, external_data=None) -> Path:
    """`torch.onnx.export` to `path`, as `export_onnx` describes."""
    dynamic_shapes = dynamic_axes = input_names = None
    if dynamic is not None and any(dynamic):
        dynamic_shapes = tuple({d: torch.export.Dim.DYNAMIC for d in dims} for dims in dynamic)
        input_names = [f"input_{i}" for i in range(len(dynamic))]
        dynamic_axes = {
            name: {d: f"{name}_dim{d}" for d in dims}
            for name, dims in zip(input_names, dynamic, strict=True)
            if dims
        }
    chatter = io.StringIO()
    try:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(chatter),
            contextlib.redirect_stderr(chatter),
        ):
            warnings.simplefilter("ignore")
            if exporter == "dynamo":
                program = torch.onnx.export(
                    model, inputs, dynamo=True, verbose=False, opset_version=opset,
                    dynamic_shapes=dynamic_shapes,
                )  # fmt: skip
                program.save(str(path), external_data=external_data)
            else:
                torch.onnx.export(
                    model, inputs, str(path), dynamo=False, opset_version=opset,
                    input_names=input_names, dynamic_axes=dynamic_axes,
                )  # fmt: skip
    except Exception as e:  # the exporter's own failure: report it, with what it printed
        raise _layerdiff.ModelError(export_failure(exporter, e, chatter.getvalue())) from e
    if external_data and exporter == "legacy":  # it writes them inline below 2 GB
        import onnx

        onnx.save_model(
            onnx.load(str(path)), str(path), save_as_external_data=True,
            all_tensors_to_one_file=True, location=f"{path.name}.data", size_threshold=1024,
        )  # fmt: skip
    return path


#: Terminal colour codes an exporter prints into its messages.
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def export_failure(exporter: str, error: Exception, printed: str) -> str:
    """An exporter's failure in one clean paragraph: the cause it names (its exception summary,
    else its message), without colour codes or pointers to a stack trace nobody is shown, then
    what the exporter printed last, then the hint that fits."""
    text = _ANSI.sub("", str(error)).strip()
    # torch.export's failure names the real cause under "Exception summary"
    summary = re.search(
        r"## Exception summary\s*(.*?)(?:\n\s*\(Refer to the full stack|$)", text, re.S
    )
    cause = (summary.group(1) if summary else text).strip()
    cause = re.sub(r"^<class '([\w.]+)'>:\s*", r"\1: ", cause)
    if not summary:
        cause = f"{type(error).__name__}: {cause}"
    lines = [line.strip() for line in cause.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("(Refer to the full stack trace")]
    message = f"torch.onnx.export ({exporter}) failed: {' '.join(lines)}"
    tail = [_ANSI.sub("", line).strip() for line in printed.strip().splitlines()[-3:]]
    if any(tail):
        message += f" (the exporter printed last: {' / '.join(t for t in tail if t)})"
    if re.search(r"DynamicCache|past_key_values|cache_utils", text):
        message += (
            "\nhint: the model returns its key/value cache (a transformers decoder with "
            "`use_cache=True`, the default), which the exporter cannot trace: build it with "
            "`use_cache=False` (in its config, or `model.config.use_cache = False`)"
        )
    return message
