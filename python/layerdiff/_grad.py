"""`layerdiff grad`: a model's gradients on another device, precision or compiler, against the
model as given: the gradient of every parameter and of every floating-point input, in the order
backward produces them, compared, judged and explained by the same engine as the layers of
`layerdiff torch`.

Both sides differentiate the same loss of the same model instance on the same input bytes, in
eval mode (no dropout, batch norms on their running statistics: one function on both sides).
In float16 the loss is scaled as `torch.amp.GradScaler` does (from 2**16, halved while a
gradient is not finite, as its skipped steps would) and the gradients are unscaled in float32
before they are compared: what the optimizer would see.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from layerdiff import _layerdiff
from layerdiff._capture import _first_tensor
from layerdiff._sides import _WORDS, TorchSide, cuda_math
from layerdiff.report import Report
from layerdiff.tensors import dtype_name, flat

# GradScaler's first scale and its back-off on a step with non-finite gradients.
_INIT_SCALE, _BACKOFF = 2.0**16, 0.5


@dataclass
class _Gradients:
    """One side's gradients, in the order backward produced them, and how the loss was scaled."""

    grads: dict[str, torch.Tensor]
    order: list[str]
    parameters: dict[str, torch.Tensor]
    scale: float = 1.0
    skipped: int = 0


def compare_gradients(
    model,
    inputs,
    *,
    target: str = "torch:bf16",
    reference: str = "torch",
    loss: str = "dot",
    tolerance: float | str = "dtype",
    float64: bool = True,
    name: str | None = None,
    seed: int | None = None,
    timings: bool | list = False,
    options: _layerdiff.Options | None = None,
    progress=None,
) -> Report:
    """Compare a model's gradients on the PyTorch side ``target`` (``"torch:bf16"``,
    ``"torch:cuda:amp-fp16"``, ``"torch:compile"``…) with those on ``reference`` (default: the
    model as given), for every parameter and floating-point input, in backward order.

    ``loss`` is ``"dot"`` (the output's dot product with a fixed random tensor from ``seed``,
    so every output element has its own gradient) or ``"sum"``. ``tolerance`` and ``float64``
    (the float64 gradients as the truth) as for :func:`layerdiff.torch.compare_torch`.
    ``report.drift_origin`` is the first gradient, in backward order, that exceeds its tolerance.
    """
    from layerdiff.torch import _as_input_tuple

    step = progress or (lambda message: None)
    inputs = _as_input_tuple(inputs)
    if loss not in ("dot", "sum"):
        raise _layerdiff.UsageError(f"unknown loss `{loss}` (expected `dot` or `sum`)")
    if options is None:
        options = _layerdiff.Options(
            tolerance=str(tolerance),
            local=False,
            target=target,
            reference=reference,
            float64=float64,
        )
    if options.torch_target is None:
        raise _layerdiff.UsageError("compare_gradients compares PyTorch sides (`torch:bf16`…)")
    ref_side, tgt_side = TorchSide.of(options.reference), TorchSide.of(options.torch_target)
    from layerdiff.torch import to_eval

    eval_note = to_eval(model)
    with torch.no_grad():
        out = _first_tensor(model(*inputs))
    if out is None or not out.is_floating_point():
        raise _layerdiff.InputError("the model's output is not a floating-point tensor")
    generator = torch.Generator().manual_seed(seed or 0)
    cotangent = (
        torch.randn(out.shape, generator=generator) if loss == "dot" else torch.ones(out.shape)
    )

    with cuda_math(ref_side, tgt_side):
        step(f"forward and backward on the reference ({ref_side.spelling})")
        ref = _side_gradients(model, inputs, ref_side, cotangent, "the reference")
        step(f"forward and backward on the target ({tgt_side.spelling})")
        tgt = _side_gradients(model, inputs, tgt_side, cotangent, "the target")
    if not ref.order:
        raise _layerdiff.InputError("the model has no parameter or input that takes a gradient")
    truth, lost = None, None
    if options.float64:
        step("forward and backward in float64 (the truth)")
        try:
            truth = _float64_gradients(model, inputs, cotangent)
        except Exception as e:  # compared without it, and said so
            lost = f"no float64 truth: the float64 copy failed ({type(e).__name__}: {e})"
    missing = [n for n in ref.order if n not in tgt.grads]
    if missing:
        raise _layerdiff.InputError(
            f"the target `{tgt_side.spelling}` computed no gradient for "
            f"{', '.join(f'`{n}`' for n in missing[:5])}"
        )

    owners = {
        f"{path}.{attribute}" if path else attribute: (path, type(module).__name__, attribute)
        for path, module in model.named_modules()
        for attribute, _ in module.named_parameters(recurse=False)
    }
    listed = []
    for key in ref.order:
        module, module_type, attribute = owners.get(key, ("", "input", key))
        grad = ref.grads[key]
        listed.append(
            {
                "name": key,
                "module": module,
                "module_type": f"{module_type}.{attribute}" if module_type != "input" else "input",
                "call_index": 0,
                "identity": False,
                "input_from": None,
                "inputs_from": [],
                "shape": list(grad.shape),
                "dtype": dtype_name(key, grad),
                "fingerprint": None,
                "op": None,
            }
        )
    given = [flat(f"input_{i}", t) for i, t in enumerate(inputs)]
    run = _layerdiff.CapturedRun(
        command="grad",
        model=name or type(model).__name__,
        inputs=given,
        layers=listed,
        options=options,
        seed=seed,
        reference_runtime="pytorch",
        reference_detail=f"{ref_side.describe()}; {_how(ref, loss)}",
        target_detail=f"{tgt_side.describe()}; {_how(tgt, loss)}",
        reduced_math=tgt_side.reduced_math(),
        lower_precision=_lower_precision(tgt_side),
        timings=list(timings) if isinstance(timings, list) else ([] if timings else None),
    )
    step(f"comparing {len(ref.order)} gradients")
    for index, key in enumerate(ref.order):
        wide = truth.grads.get(key) if truth is not None else None
        run.add(
            index,
            flat(key, ref.grads[key]),
            float64=None if wide is None else flat(key, wide),
            target=flat(key, tgt.grads[key]),
        )
    needed = run.conclude()
    native = run.finish(
        {i: [flat(k, ref.parameters[k])] for i in needed if (k := ref.order[i]) in ref.parameters},
        {i: [flat(k, tgt.parameters[k])] for i in needed if (k := ref.order[i]) in tgt.parameters},
    )
    report = Report(native, inputs=given)
    report.notes += [n for n in (eval_note, lost) if n]
    between = _born_between(model, report, owners)
    if between:
        report.notes.append(between)
    if tgt.skipped:
        report.notes.append(
            f"the target's gradients were not finite at {tgt.skipped} larger loss scale(s): a "
            f"GradScaler would skip {tgt.skipped} step(s) before reaching {tgt.scale:g}"
        )
    return report


def _born_between(model, report: Report, owners: dict) -> str | None:
    """Where backward first went wrong, in words: the first gradient to exceed its tolerance
    comes after one that agrees, so what lies between their modules (in the model's order)
    computed the difference; None when that says nothing."""
    layers = report.data["layers"]
    origin = report.drift_origin
    names = [x["name"] for x in layers]
    if origin is None or names.index(origin) == 0:
        return None
    before = layers[names.index(origin) - 1]
    if before["exceeds_tol"]:
        return None
    order = [path for path, _ in model.named_modules()]
    first = owners.get(before["name"], (None,))[0]
    last = owners.get(origin, (None,))[0]
    if first is None or last is None or first not in order or last not in order:
        return None
    lo, hi = sorted((order.index(first), order.index(last)))
    modules = dict(model.named_modules())
    leaves = [
        f"`{path}` ({type(modules[path]).__name__})"
        for path in order[lo + 1 : hi]
        if path and not any(True for _ in modules[path].children())
    ]
    if not leaves:
        return None
    return (
        f"the first gradient to exceed, `{origin}`, comes right after `{before['name']}` in "
        f"backward order, which agrees: the difference is born in the backward of "
        f"{', '.join(leaves[:5])}"
    )


def _side_gradients(model, inputs, side: TorchSide, cotangent, which: str) -> _Gradients:
    """`_gradients`, with the side's own failure said as bad input, naming the side."""
    try:
        return _gradients(model, inputs, side, cotangent)
    except _layerdiff.LayerdiffError:
        raise
    except Exception as e:
        raise _layerdiff.InputError(
            f"{which} `{side.spelling}` could not compute the gradients: {type(e).__name__}: {e}"
        ) from e


def _gradients(model, inputs, side: TorchSide, cotangent) -> _Gradients:
    """The side's gradients of the loss, from its own copy of the model; in float16, the loss
    scaled as GradScaler does and the gradients unscaled in float32."""
    copied, given = side.prepare(model, inputs)
    scale = _INIT_SCALE if side.precision in ("fp16", "amp-fp16") else 1.0
    skipped = 0
    while True:
        found = _backward(copied, given, side.running, cotangent, scale)
        if scale == 1.0 or all(bool(torch.isfinite(g).all()) for g in found.grads.values()):
            break
        scale *= _BACKOFF
        skipped += 1
    found.scale, found.skipped = scale, skipped
    return found


def _float64_gradients(model, inputs, cotangent) -> _Gradients:
    """The gradients of a float64 copy of the model: the numerical truth."""
    wide = tuple(t.double() if t.is_floating_point() else t for t in inputs)
    return _backward(copy.deepcopy(model).double(), wide, torch.enable_grad, cotangent.double())


def _backward(model, given, running, cotangent, scale: float = 1.0) -> _Gradients:
    """One forward and backward pass of the loss (times `scale`), recording each gradient as
    backward finishes it."""
    names = {p: n for n, p in model.named_parameters() if p.requires_grad}
    leaves = [
        t.detach().clone().requires_grad_(True) if t.is_floating_point() else t for t in given
    ]
    for i, t in enumerate(leaves):
        if t.is_floating_point():
            names[t] = f"inputs[{i}]"
    order: list[str] = []
    hooks = [t.register_post_accumulate_grad_hook(lambda t: order.append(names[t])) for t in names]
    for p in model.parameters():
        p.grad = None
    try:
        with torch.enable_grad(), running():
            out = _first_tensor(model(*leaves))
            loss = (out.to(cotangent.dtype) * cotangent.to(out.device)).sum()
        (loss * scale).backward()
    finally:
        for h in hooks:
            h.remove()
    grads = {}
    for t, key in names.items():
        if t.grad is not None:
            g = t.grad.detach()
            grads[key] = (g.float() / scale).to(g.dtype if scale == 1.0 else torch.float32)
    parameters = {n: p.detach() for n, p in model.named_parameters()}
    return _Gradients(grads=grads, order=[k for k in order if k in grads], parameters=parameters)


def _how(found: _Gradients, loss: str) -> str:
    """The gradients' loss and scaling in words."""
    what = "the output's dot product with a fixed random tensor" if loss == "dot" else "sum"
    scaled = f", scaled by {found.scale:g} and unscaled in float32" if found.scale != 1 else ""
    return f"gradients of {what}{scaled}"


def _lower_precision(side: TorchSide) -> str | None:
    """How the side's gradients carry a lower precision than float32, in words."""
    if side.precision == "fp32":
        return None
    return f"the target runs its forward and backward passes in {_WORDS[side.precision]}"
