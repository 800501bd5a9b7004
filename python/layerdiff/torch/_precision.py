"""Lower-precision targets (`layerdiff torch --dtype`): the ONNX file converted to float16 or
quantized to int8 with ONNX Runtime's own tools, as a deployment would; and the keep-in-float32
advice the report gives, checked by running the same comparison again with those layers kept
(`node_block_list` of the float16 converter, `nodes_to_exclude` of the quantizer; for a PyTorch
target, the modules left in float32).
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path

import torch

from layerdiff import _layerdiff

# Calibration runs of the int8 quantizer: the example inputs and this many variations of them.
VARIATIONS = 7


def _quiet():
    """ONNX Runtime's tools log and warn freely; a run prints only its own lines."""
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    stack.callback(logging.disable, previous)
    return stack


def convert(
    onnx_path: Path, dtype: str, out: Path, inputs: tuple, *, keep_nodes=(), seed: int = 0
) -> tuple[Path, str]:
    """The ONNX file in `dtype` (`fp16`, `int8`), written to `out`, with `keep_nodes` left in
    float32; and what was done, in words, for the target's description."""
    import onnx

    kept = f", {len(keep_nodes)} node(s) kept in float32" if keep_nodes else ""
    try:
        with _quiet():
            if dtype == "fp16":
                from onnxruntime.transformers.float16 import convert_float_to_float16

                model = convert_float_to_float16(
                    onnx.load(str(onnx_path)),
                    keep_io_types=True,
                    node_block_list=list(keep_nodes) or None,
                )
                _drop_repeated(model.graph)
                _join_kept(model.graph)
                onnx.save(model, str(out))
                return out, (
                    "converted to float16 by onnxruntime.transformers.float16 "
                    f"(inputs and outputs kept float32{kept})"
                )
            if dtype == "int8":
                from onnxruntime.quantization import QuantFormat, quantize_static

                names = [
                    i.name for i in onnx.load(str(onnx_path), load_external_data=False).graph.input
                ]
                quantize_static(
                    str(onnx_path),
                    str(out),
                    _Calibration(names, inputs, seed),
                    quant_format=QuantFormat.QDQ,
                    nodes_to_exclude=list(keep_nodes),
                )
                return out, (
                    "quantized to int8 by onnxruntime.quantization.quantize_static (QDQ, MinMax "
                    f"calibration on the inputs and {VARIATIONS} variations{kept})"
                )
    except _layerdiff.LayerdiffError:
        raise
    except Exception as e:
        tool = "float16 converter" if dtype == "fp16" else "static quantizer"
        raise _layerdiff.ModelError(
            f"ONNX Runtime's {tool} could not convert `{onnx_path}`: {type(e).__name__}: {e}"
        ) from e
    raise _layerdiff.UsageError(f"no ONNX conversion to `{dtype}` (fp16 or int8)")


def _drop_repeated(graph) -> None:
    """The converter inserts the same Cast twice where a value feeds two kept nodes (same name,
    same output: a model ONNX Runtime refuses); the copies go."""
    seen: set[bytes] = set()
    unique = []
    for node in graph.node:
        key = node.SerializeToString(deterministic=True)
        if key not in seen:
            seen.add(key)
            unique.append(node)
    if len(unique) != len(graph.node):
        del graph.node[:]
        graph.node.extend(unique)


def _join_kept(graph) -> None:
    """Where one node kept in float32 feeds only others kept, the converter still rounds the
    value between them to float16 (a Cast down and a Cast back up around each kept node): a
    value past float16's range overflows all the same. Each such pair goes, and the value keeps
    its name, now float32, so the kept layers compute in float32 from end to end."""
    from onnx import TensorProto

    def cast_to(node) -> int | None:
        if node.op_type != "Cast":
            return None
        return next((a.i for a in node.attribute if a.name == "to"), None)

    outputs = {o.name for o in graph.output}
    consumers: dict[str, list] = {}
    producers = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
        for name in node.output:
            producers[name] = node
    gone = set()
    for down in list(graph.node):
        if cast_to(down) != TensorProto.FLOAT16:
            continue
        wide, low = down.input[0], down.output[0]
        ups = consumers.get(low, [])
        producer = producers.get(wide)
        if (
            producer is None
            or low in outputs
            or wide in outputs
            or len(consumers.get(wide, [])) != 1
            or not ups
            or any(cast_to(u) != TensorProto.FLOAT or u.output[0] in outputs for u in ups)
        ):
            continue
        producer.output[list(producer.output).index(wide)] = low
        for up in ups:
            for node in graph.node:
                for i, name in enumerate(node.input):
                    if name == up.output[0]:
                        node.input[i] = low
            gone.add(id(up))
        gone.add(id(down))
        for info in graph.value_info:
            if info.name == low:
                info.type.tensor_type.elem_type = TensorProto.FLOAT
    kept = [n for n in graph.node if id(n) not in gone]
    del graph.node[:]
    graph.node.extend(kept)


class _Calibration:
    """The quantizer's calibration data: the example inputs, then variations of them."""

    def __init__(self, names: list[str], inputs: tuple, seed: int):
        from layerdiff.torch._inputs import variations

        runs = [inputs, *variations(inputs, VARIATIONS, seed)]
        self._feeds = iter(
            [{n: t.detach().cpu().numpy() for n, t in zip(names, r, strict=False)} for r in runs]
        )

    def get_next(self) -> dict | None:
        return next(self._feeds, None)


def kept_nodes(report, layers: list[str]) -> list[str]:
    """The ONNX nodes of `layers` as `report` mapped them: each layer's whole group where its
    local error was measured, else the node producing its value. A layer the report does not
    name, or names without an ONNX node, is a usage error."""
    nodes: list[str] = []
    for name in layers:
        try:
            layer = report.layer(name)
        except KeyError:
            raise _layerdiff.UsageError(
                f"--keep-fp32: `{name}` is not a layer of this model (the report names each layer)"
            ) from None
        location = layer.get("location")
        if not location or location["kind"] != "onnx":
            raise _layerdiff.UsageError(
                f"--keep-fp32: `{name}` has no ONNX node to keep "
                f"({layer.get('reason') or 'unmapped'})"
            )
        for node in location["nodes"] or [location["node"]]:
            if node not in nodes:
                nodes.append(node)
    return nodes


def computing_modules(listed) -> set[str]:
    """The modules that make a layer of `listed` (a leaf, or the owner of a functional call):
    those that compute, as opposed to those that only route values between submodules."""
    return {layer.module for layer in listed}


def kept_modules(listed, layers: list[str]) -> list[str]:
    """The modules a PyTorch target keeps in float32 for `layers` (a functional call's module
    is the one that makes it)."""
    by_name = {layer.name: layer.module for layer in listed}
    modules = []
    for name in layers:
        if name not in by_name:
            raise _layerdiff.UsageError(
                f"--keep-fp32: `{name}` is not a layer of this model (the report names each layer)"
            )
        if by_name[name] not in modules:
            modules.append(by_name[name])
    return modules


def keep_in_float32(
    model: torch.nn.Module,
    modules: list[str],
    autocast: str | None = None,
    computing: set[str] | None = None,
    original: torch.nn.Module | None = None,
) -> None:
    """Leaves `modules` of a model cast to a lower precision in float32: their parameters
    float32 and their floating inputs cast up on the way in. Their outputs stay float32, so kept
    modules feed each other in float32 (a value past float16's range between them survives);
    every other module that computes (in `computing`: those that make a layer, a leaf or a
    functional call; all of them when not given) casts its floating inputs back down on the way
    in (a float32 value a kept module hands on, T5's position bias, would otherwise meet the
    lower precision in a matmul). A kept module takes its weights from `original` (the model
    before the cast) where given: kept in float32, a layer has its float32 weights, not its
    float16 ones widened. A module that only routes values between its submodules
    (T5's blocks and stack) hands them on as they are: casting a kept layer's float32 output
    down there would overflow again where keeping it was meant to help.

    Under autocast on device type `autocast` (the model stays float32, PyTorch lowers op by op),
    each kept module runs with autocast off instead, its floating inputs cast up, as AMP code
    keeps a sensitive block in float32; autocast lowers what the others read by itself."""
    if not modules:
        return
    named = dict(model.named_modules())
    if autocast is not None:
        for name in modules:
            _outside_autocast(named[name], autocast)
        return
    low = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    inside: set[int] = set()
    for name in _with_whole_parents(named, modules):
        module = named[name]
        module.float()
        if original is not None:
            _restore_weights(module, original.get_submodule(name))
        inside.update(id(m) for m in module.modules())
        module.register_forward_pre_hook(
            lambda _m, args, kwargs: (_cast(args, torch.float32), _cast(kwargs, torch.float32)),
            with_kwargs=True,
        )
    routes = {m for n, m in named.items() if computing is not None and n not in computing}
    for module in model.modules():
        if id(module) in inside or module in routes:
            continue
        module.register_forward_pre_hook(
            lambda _m, args, kwargs: (_cast(args, low), _cast(kwargs, low)), with_kwargs=True
        )
    forward = model.forward

    def promoting(*args, **kwargs):
        with _Promoting():
            return forward(*args, **kwargs)

    model.forward = promoting


# Ops that refuse floating inputs of two dtypes where elementwise ops promote them.
_UNPROMOTED = frozenset(
    {"linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "einsum", "conv1d",
     "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
     "scaled_dot_product_attention", "layer_norm", "group_norm", "batch_norm", "rms_norm"}
)  # fmt: skip


class _Promoting(torch.overrides.TorchFunctionMode):
    """Where a kept layer's float32 value meets a lower-precision one in an op that does not
    promote (a matmul between a kept query and a key that is not), the op computes in float32,
    as PyTorch's elementwise ops promote: the values kept in float32 stay so."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "").strip("_")
        if name in _UNPROMOTED:
            floats = {
                t.dtype
                for t in [*args, *kwargs.values()]
                if isinstance(t, torch.Tensor) and t.is_floating_point()
            }
            if torch.float32 in floats and len(floats) > 1:
                args, kwargs = _cast(args, torch.float32), _cast(kwargs, torch.float32)
        return func(*args, **kwargs)


def _restore_weights(module: torch.nn.Module, original: torch.nn.Module) -> None:
    """`module`'s floating parameters and buffers set to `original`'s (same names), in float32."""
    with torch.no_grad():
        theirs = dict(original.named_parameters()) | dict(original.named_buffers())
        for name, t in [*module.named_parameters(), *module.named_buffers()]:
            source = theirs.get(name)
            if source is not None and t.is_floating_point() and source.shape == t.shape:
                t.copy_(source.detach().to(t.device, t.dtype))


def _with_whole_parents(named: dict, modules: list[str]) -> list[str]:
    """`modules`, and every module all of whose leaf submodules they keep: those compute in
    float32 too (their own ops then meet their submodules' float32 values, T5's attention mask
    its queries), outermost first."""
    kept = set(modules)

    def covered(name: str) -> bool:
        return any(name == k or name.startswith(f"{k}.") for k in kept)

    parents = []
    for name, module in named.items():
        if not name or covered(name) or not any(True for _ in module.children()):
            continue
        leaves = [n for n, m in named.items() if n.startswith(f"{name}.") and not any(
            True for _ in m.children()
        )]  # fmt: skip
        if leaves and all(covered(n) for n in leaves):
            parents.append(name)
    outermost = [p for p in parents if not any(p.startswith(f"{q}.") for q in parents)]
    return [*outermost, *[m for m in modules if not any(m.startswith(f"{q}.") for q in outermost)]]


def _outside_autocast(module: torch.nn.Module, device: str) -> None:
    forward = module.forward

    def kept(*args, **kwargs):
        with torch.autocast(device, enabled=False):
            return forward(*_cast(args, torch.float32), **_cast(kwargs, torch.float32))

    module.forward = kept


def computes_in(module: torch.nn.Module, default: torch.dtype) -> torch.dtype:
    """The dtype a module computes in: its own floating parameters', else `default`."""
    own = [p for p in module.parameters(recurse=False) if p.is_floating_point()]
    return own[0].dtype if own else default


def _cast(value, dtype):
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, tuple):
        return tuple(_cast(v, dtype) for v in value)
    if isinstance(value, list):
        return [_cast(v, dtype) for v in value]
    if isinstance(value, dict):
        return {k: _cast(v, dtype) for k, v in value.items()}
    return value


def checked_advice(plain, keep_fp32, precision: str, again, step, what: str):
    """The report of a lower-precision run with its keep-in-float32 advice checked (the rules
    are the core's: `Report.layers_to_check`, `Report.advice_checked`): the layers run again
    in float32 by ``again(kept)`` and compared with the plain run. ``what`` names the target
    in the progress line (``float16``, ``torch:bf16``)."""
    kept = plain.layers_to_check(keep_fp32)
    if not kept:
        return plain
    step(f"checking: {what} again with {len(kept)} layer(s) in float32")
    return plain.advice_checked(again(kept), kept, bool(keep_fp32), precision)
