"""The headline defect of a PyTorch target, cut down to its module alone (`--repro DIR`,
`layerdiff reduce`): the module's structure (module.pt, no weights), its weights and the
reference's inputs to it (safetensors), the reference's output, and a repro.py that imports
the module's class from the user's code and runs it on the reference side and on the target
side. The folder is claimed only once its repro.py, run in a fresh interpreter, shows the
difference."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from layerdiff import _layerdiff
from layerdiff.tensors import flat
from layerdiff.torch._capture import _first_tensor
from layerdiff.torch._running import as_input_tuple
from layerdiff.torch._sides import TorchSide
from layerdiff.torch._streamed import state_of, unstreamed


def _unwritten(why: str) -> tuple[str, bool]:
    """Why no repro was written, as a repro's (sentence, reproduced)."""
    return f"--repro: no repro written: {why}", False


def write_repro(model, inputs, report, ref_side: TorchSide, tgt_side: TorchSide, folder,
                command: str, builder: str | None = None) -> tuple[str, bool]:  # fmt: skip
    """Writes the repro of `report`'s headline into `folder` and says what it holds, or says
    why there is none (a clean run writes nothing), with whether it shows the difference.
    `builder` (`path/to/file.py:build`, `package.module:build`) is imported by the repro too,
    for what the user's code sets up (custom ops, compiler settings)."""
    name, why = report._native.headline
    if name is None:
        return _unwritten(f"{why}")
    inputs = as_input_tuple(inputs)  # a builder may return one bare tensor
    path, call = _module_of(model, name)
    try:
        module = model.get_submodule(path)
    except AttributeError:
        return _unwritten(f"`{name}` is not a module of the model")
    where = (
        ""
        if path in ("", name.partition("#")[0])
        else f" (the headline `{name}` is a call inside it: the module holds it)"
    )
    args, kwargs, expected = _call_inputs(model, inputs, path, call, ref_side)
    piece = _Piece(module, args, kwargs, expected, name, path, where)
    return _staged(piece, report, (ref_side, tgt_side), folder, command, builder)


def _staged(piece, report, sides, folder, command, builder) -> tuple[str, bool]:
    """Writes `piece` into a folder of its own beside `folder` and moves it into place once
    checked: a failure leaves no half folder behind."""
    final = Path(folder)
    final.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=".repro-", dir=final.parent))
    try:
        return _write(piece, report, sides, folder, final, command, builder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@dataclass
class _Piece:
    """The headline's module call: the module, its arguments and output on the reference,
    the layer's name, the module's path, and how the two relate in words."""

    module: torch.nn.Module
    args: tuple
    kwargs: dict
    expected: torch.Tensor
    name: str
    path: str
    where: str
    #: For a gradient: its backward alone, for `grad_output`, of `{"of": "input" or a
    #: parameter's name in the module, "scale": the target's loss scale}`.
    gradient: dict | None = None
    grad_output: torch.Tensor | None = None


def _write(
    piece: _Piece, report, sides, folder: Path, final: Path, command, builder
) -> tuple[str, bool]:
    """Writes the repro into `folder`, runs its repro.py there, and moves it to `final`."""
    module, args, kwargs, expected = piece.module, piece.args, piece.kwargs, piece.expected
    name, path, where = piece.name, piece.path, piece.where
    ref_side, tgt_side = sides
    tensors: list = []
    literal_args = _literal(args, "arg", tensors)
    literal_kwargs = _literal(kwargs, "kwarg", tensors)
    state = state_of(module)  # a checkpoint held one module at a time: read from its files
    _layerdiff.write_safetensors(
        folder / "state.safetensors", [flat(n, t.cpu()) for n, t in state.items()]
    )
    if piece.grad_output is not None:
        tensors.append(flat("grad_output", piece.grad_output))
    _layerdiff.write_safetensors(folder / "inputs.safetensors", tensors)
    _layerdiff.write_safetensors(folder / "expected.safetensors", [flat("output", expected)])
    torch.save(unstreamed(module), folder / "module.pt")
    cls = type(module)
    imports, code_dir = _class_import(cls)
    gradient = piece.gradient
    written = _layerdiff.ModuleRepro(
        layer=name, path=path, where_=where, class_module=cls.__module__,
        class_name=cls.__qualname__, imports=_builder_import(builder, cls) + imports,
        code_dir=code_dir, args=literal_args, kwargs=literal_kwargs,
        gradient=None if gradient is None else (gradient["of"], gradient["scale"]),
        reference=_side(ref_side), target=_side(tgt_side), command=command,
    )  # fmt: skip
    written.write_script(report._native, folder)
    shown = subprocess.run(
        [sys.executable, "repro.py"], cwd=folder, capture_output=True, text=True, timeout=600
    )
    written.write_readme(report._native, shown.stdout, shown.stderr, folder)
    if final.exists():
        shutil.rmtree(final)
    folder.rename(final)
    return written.verdict(shown.stdout, shown.stderr, final)


def _module_call(name: str) -> tuple[str, int]:
    """The module a layer's value is computed in, and which call of it (1 first): `a.b#2` is
    `a.b`'s second call; `a.b:add#3` is a call inside `a.b`, whose first call holds it."""
    path, _, index = name.partition("#")
    if ":" in path:
        return path.split(":", 1)[0], 1
    return path, int(index) if index.isdigit() else 1


def _module_of(model, name: str) -> tuple[str, int]:
    """`_module_call`, where the whole model, named by its class (a compiled model that differs
    as a whole), is the path ``""``."""
    path, call = _module_call(name)
    if path == type(model).__name__ and not hasattr(model, path):
        path = ""
    return path, call


def _call_inputs(model, inputs, path: str, call: int, side: TorchSide):
    """The arguments of the `call`-th call of `model`'s `path` and its first output, on the
    reference side, on the CPU."""
    ref_model, ref_inputs = (model, inputs) if side.plain else side.prepare(model, inputs)
    seen: list = []

    def keep(t):
        return t.detach().cpu().clone() if isinstance(t, torch.Tensor) else t

    def before(_module, args, kwargs):
        seen.append([torch.utils._pytree.tree_map(keep, (args, kwargs)), None])

    def after(_module, _args, output):
        if seen and seen[-1][1] is None:
            seen[-1][1] = _first_tensor(output).detach().cpu().clone()

    target = ref_model.get_submodule(path)
    handles = [
        target.register_forward_pre_hook(before, with_kwargs=True),
        target.register_forward_hook(after),
    ]
    try:
        with torch.no_grad(), side.running():
            ref_model(*ref_inputs)
    finally:
        for h in handles:
            h.remove()
    if len(seen) < call:
        raise _layerdiff.InputError(f"`{path}` ran {len(seen)} times, not {call}")
    (args, kwargs), output = seen[call - 1]
    return args, kwargs, output


def _literal(value, name: str, tensors: list) -> str:
    """`value` as Python source, each tensor a `T("name")` saved into `tensors`."""
    if isinstance(value, torch.Tensor):
        tensors.append(flat(name, value))
        return f"T({name!r})"
    if isinstance(value, (list, tuple)):
        parts = [_literal(v, f"{name}_{i}", tensors) for i, v in enumerate(value)]
        if isinstance(value, tuple):
            return f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"
        return f"[{', '.join(parts)}]"
    if isinstance(value, dict):
        items = [f"{k!r}: {_literal(v, f'{name}_{k}', tensors)}" for k, v in value.items()]
        return "{" + ", ".join(items) + "}"
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    raise _layerdiff.UsageError(
        f"the module takes a {type(value).__name__}, which a repro cannot write down"
    )


def _class_import(cls) -> tuple[str, str | None]:
    """The source that imports `cls` so that module.pt unpickles, and the folder of the user's
    code to put on sys.path (None: an installed package)."""
    module = sys.modules[cls.__module__]
    top = cls.__qualname__.split(".")[0]
    if cls.__module__ == "__main__":
        raise _layerdiff.UsageError(
            f"`{cls.__qualname__}` is defined in the script that ran, which a repro cannot "
            "import: move it into a module"
        )
    if cls.__module__.startswith("_layerdiff_builder_"):  # a builder given as path/to/file.py
        source = Path(module.__file__).resolve()
        return (
            "import importlib.util\n\n"
            f"_spec = importlib.util.spec_from_file_location({cls.__module__!r}, {str(source)!r})\n"
            "_code = importlib.util.module_from_spec(_spec)\n"
            f"sys.modules[{cls.__module__!r}] = _code\n"
            "_spec.loader.exec_module(_code)\n"
            f"{top} = _code.{top}",
            None,
        )
    root = sys.modules[cls.__module__.split(".")[0]]
    origin = Path(getattr(root, "__file__", "") or "")
    code_dir = None
    if origin.name and "-packages" not in str(origin):
        code_dir = str(origin.parent.parent if origin.name == "__init__.py" else origin.parent)
    return f"from {cls.__module__} import {top}", code_dir


def _builder_import(builder: str | None, cls) -> str:
    """The source that imports the model's builder (`None`, a built-in name: nothing), unless
    it is the module the class comes from."""
    if not builder or ":" not in builder:
        return ""
    target = builder.rsplit(":", 1)[0]
    if target.endswith(".py") or "/" in target:
        source = Path(target).resolve()
        name = f"_layerdiff_builder_{source.stem}"
        if name == cls.__module__:
            return ""
        return (
            "import importlib.util\n\n"
            "# Your model's file, for what it sets up (custom ops, compiler settings).\n"
            f"_spec = importlib.util.spec_from_file_location({name!r}, {str(source)!r})\n"
            f"sys.modules[{name!r}] = importlib.util.module_from_spec(_spec)\n"
            f"_spec.loader.exec_module(sys.modules[{name!r}])\n"
        )
    if target == cls.__module__:
        return ""
    return f"import {target}  # your model's module, for what it sets up\n"


def _side(side: TorchSide) -> tuple:
    """The side as the repro's words take it: spelling, words, device, precision, compiler."""
    return side.spelling, side.describe(), side.device, side.precision, side.compile or None


def write_onnx_repro(model, inputs, report, target: str, folder, command: str) -> tuple[str, bool]:
    """Writes the repro of `report`'s headline (a PyTorch model against its ONNX file on
    `target`): the layer's ONNX nodes fed PyTorch's values at their inputs, held to PyTorch's
    value of the layer, run on the target's runtime; or says why there is none."""
    inputs = as_input_tuple(inputs)  # a builder may return one bare tensor
    from layerdiff.torch._capture import capture

    name, why = report._native.headline
    if name is None:
        return _unwritten(f"{why}")
    layers = {layer["name"]: layer for layer in report.layers}
    layer = layers[name]
    location = layer.get("location") or {}
    if not location.get("nodes") or not layer.get("local_inputs"):
        reason = layer.get("local_reason") or "it has no ONNX nodes of its own"
        return _unwritten(f"`{name}` was not re-run alone: {reason}")
    if report.onnx_path is None:
        return "--repro: no repro written: the ONNX file compared is not known"
    wanted = {name, *layer["local_inputs"]}
    values: dict = {}

    def keep(index, call, out, local):
        if call.name in wanted:
            first = _first_tensor(out)
            if first is not None:
                values[call.name] = first.detach().cpu().clone()

    listing = capture(model, inputs)
    whole = frozenset(listing.self_computing)
    capture(model, inputs, keep, whole=whole, dataflow=False)
    declared = [d[0] for d in _layerdiff.model_inputs(str(report.onnx_path))]
    given = dict(zip(declared, inputs, strict=False))
    feeds = []
    for source in layer["local_inputs"]:
        if source in values:
            onnx_value = (layers.get(source, {}).get("location") or {}).get("value", source)
            feeds.append(flat(onnx_value, values[source]))
        elif source in given:
            feeds.append(flat(source, given[source]))
        else:
            return _unwritten(f"PyTorch's value of `{source}` was not seen")
    if name not in values:
        return _unwritten(f"PyTorch's value of `{name}` was not seen")
    return _layerdiff.write_framework_repro(
        report._native, name, str(report.onnx_path), location["nodes"], feeds,
        flat(location["value"], values[name]), target, command, str(folder),
    )  # fmt: skip


def write_grad_repro(model, inputs, report, sides, loss: str, seed: int, folder, command: str,
                     builder: str | None = None) -> tuple[str, bool]:  # fmt: skip
    """Writes the repro of a `layerdiff grad` report's headline gradient: the backward alone of
    the module call that computes it (a parameter's module, or the call whose input gradient it
    is), for the output gradient the whole reference backward gave that call, on both sides."""
    from layerdiff.torch import _backward, _gradients
    from layerdiff.torch._capture import capture

    ref_side, tgt_side = sides
    name, why = report._native.headline
    if name is None:
        return _unwritten(f"{why}")
    inputs = as_input_tuple(inputs)  # a builder may return one bare tensor
    if name.startswith("inputs["):
        return _unwritten(
            f"`{name}` is the model input's gradient, which the whole backward computes"
        )
    with torch.no_grad():
        out = _first_tensor(model(*inputs))
    generator = torch.Generator().manual_seed(seed)
    cotangent = (
        torch.randn(out.shape, generator=generator) if loss == "dot" else torch.ones(out.shape)
    )
    whole = frozenset(capture(model, inputs).self_computing)
    ref = _gradients.side_gradients(model, inputs, ref_side, cotangent, whole, "the reference")
    tgt = _gradients.side_gradients(model, inputs, tgt_side, cotangent, whole, "the target")
    if name.endswith(":input"):
        call = ref.calls.get(name.removesuffix(":input"))
        of = "input"
    else:
        path, _, of = name.rpartition(".")
        call = next((c for c in ref.calls.values() if c.module == path), None)
    if call is None or call.grad_output is None:
        return _unwritten(f"no module call computes `{name}` alone")
    module = model.get_submodule(call.module)
    alone = _backward.vjp(
        ref.model.get_submodule(call.module), call, call.grad_output, ref_side.convert,
        ref_side.running, 1.0,
    )  # fmt: skip
    expected = alone.input if of == "input" else alone.parameters.get(of)
    if expected is None:
        return _unwritten(f"the backward of `{call.module}` gives no `{of}`")
    piece = _Piece(
        module, call.args, call.kwargs, expected.detach().cpu(), name, call.module,
        f" (its backward, for the gradient `{name}`)",
        gradient={"of": of, "scale": float(tgt.scale)},
        grad_output=call.grad_output.detach().cpu(),
    )  # fmt: skip
    return _staged(piece, report, (ref_side, tgt_side), folder, command, builder)
