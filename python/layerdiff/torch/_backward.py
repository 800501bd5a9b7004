"""Backward passes for `layerdiff grad`: one side's forward and backward with every module call
recorded (its inputs, and the gradient that reaches its output), and each module call's
backward made again on its own (a vector-Jacobian product of that call alone) on given inputs
and output gradient: what a gradient's own error, and its same-precision baseline, are made of.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from layerdiff.torch import _baseline
from layerdiff.torch._capture import _first_tensor, capture


@dataclass
class Call:
    """One module call of a pass: its inputs as it got them (detached copies), the gradient of
    the loss with respect to its output (unscaled, float32 or wider), and which model inputs it
    read directly (by position among its floating-point arguments)."""

    name: str
    module: str
    args: tuple
    kwargs: dict
    grad_output: torch.Tensor | None = None
    reads: dict[int, int] = field(default_factory=dict)


@dataclass
class ChildCall:
    """A call of a direct submodule with parameters inside an `OwnerCall`: what it returned,
    and the gradient that reached each of its floating-point inputs through it (unscaled)."""

    name: str
    output: object = None
    input_grads: list = field(default_factory=list)


@dataclass
class OwnerCall:
    """One call of a module that uses parameters of its own besides calling its submodules
    (ConvNeXt's block scales its branch by `layer_scale`; a ViT adds its `pos_embedding`): its
    inputs, its direct submodules' calls during it (`ChildCall`, in call order), and the
    gradient that reaches its output. Its own parameters' gradients are made again by its own
    code alone: its submodules with parameters replaced by what they returned, and by the
    gradients that passed back through them (see `owner_vjp`)."""

    module: str
    args: tuple
    kwargs: dict
    children: list = field(default_factory=list)
    grad_output: torch.Tensor | None = None


@dataclass
class Pass:
    """One side's gradients, in the order backward produced them, its module calls, and how the
    loss was scaled. `order` names parameters (`fc.weight`), model inputs (`inputs[0]`) and the
    input gradient of each module call (`fc:input`)."""

    grads: dict[str, torch.Tensor]
    order: list[str]
    parameters: dict[str, torch.Tensor]
    model: torch.nn.Module
    calls: dict[str, Call] = field(default_factory=dict)
    scale: float = 1.0
    skipped: int = 0
    owner_calls: list[OwnerCall] = field(default_factory=list)
    #: A data-parallel side's gradients rank by rank (`_ddp.Ranks`); None in one process.
    ranks: object = None


def _unscaled(grad: torch.Tensor, scale: float) -> torch.Tensor:
    """A gradient of the loss times `scale`, divided back, in float32 or wider."""
    return (grad.detach().float() / scale).to(torch.promote_types(grad.dtype, torch.float32))


def input_layer(call: str) -> str:
    """The name of the layer that is a call's input gradient (what its backward hands on)."""
    return f"{call}:input"


def backward(model, given, running, cotangent, scale: float = 1.0, whole=frozenset()) -> Pass:
    """One forward and backward pass of the loss (times `scale`), recording each gradient as
    backward finishes it, and every module call (see `Call`) with the gradient that reaches its
    output."""
    names = {p: n for n, p in model.named_parameters() if p.requires_grad}
    leaves = [
        t.detach().clone().requires_grad_(True) if t.is_floating_point() else t for t in given
    ]
    for i, t in enumerate(leaves):
        if t.is_floating_point():
            names[t] = f"inputs[{i}]"
    order: list[str] = []
    calls: dict[str, Call] = {}
    pending: dict[str, list] = {}

    def saved(value):
        return value.detach().clone() if isinstance(value, torch.Tensor) else value

    def before(leaf, func, args, kwargs):
        if func is not None:
            return None  # a functional call between modules: its backward is not re-run
        flat = torch.utils._pytree.tree_leaves((args, kwargs))
        floats = [t for t in flat if isinstance(t, torch.Tensor) and t.is_floating_point()]
        # a model input, or the view of it an owner's hook hands its submodule (`_record_owners`)
        reads = {
            k: i
            for k, t in enumerate(floats)
            for i, x in enumerate(leaves)
            if t is x or t._base is x
        }
        copied = torch.utils._pytree.tree_map(saved, (args, kwargs))
        pending.setdefault(leaf, []).append((copied, reads))
        return None

    def on_layer(index, layer, out, _local):
        if layer.op is not None or not pending.get(layer.module):
            return
        (args, kwargs), reads = pending[layer.module].pop(0)
        call = Call(layer.name, layer.module, args, kwargs, reads=reads)
        calls[layer.name] = call
        if out.requires_grad:

            def reached(grad, call=call):
                call.grad_output = _unscaled(grad, scale)
                order.append(input_layer(call.name))

            out.register_hook(reached)

    hooks = [t.register_post_accumulate_grad_hook(lambda t: order.append(names[t])) for t in names]
    owner_calls = _record_owners(model, whole, saved, scale, hooks)
    for p in model.parameters():
        p.grad = None
    try:
        with running():
            out = capture(
                model, tuple(leaves), on_layer, rerun=before, whole=whole, dataflow=False,
                grad=True,
            ).output  # fmt: skip
            out = _first_tensor(out)
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
    return Pass(
        grads=grads,
        order=[k for k in order if k in grads or k.endswith(":input")],
        parameters=parameters,
        model=model,
        calls=calls,
        scale=scale,
        owner_calls=owner_calls,
    )


def owners(model: nn.Module, whole=frozenset()) -> dict[str, nn.Module]:
    """The modules, by path, that have submodules and parameters of their own that take a
    gradient: their own code uses those (no module call's backward covers them). Modules taken
    whole, and those inside them, are module calls already."""
    return {
        path: m
        for path, m in model.named_modules()
        if path not in whole
        and not any(path.startswith(f"{w}.") for w in whole)
        and any(True for _ in m.children())
        and any(p.requires_grad for p in m.parameters(recurse=False))
    }


def _record_owners(model, whole, saved, scale: float, hooks: list) -> list[OwnerCall]:
    """Hooks (appended to `hooks`) that record every call of an owner module (`owners`):
    its inputs, its output's gradient, and for each call of a direct submodule with parameters
    during it what it returned and the gradient that reached its inputs through it."""
    recorded: list[OwnerCall] = []
    active: dict[str, OwnerCall] = {}
    tree_map = torch.utils._pytree.tree_map

    for path, module in owners(model, whole).items():

        def pre(_, args, kwargs, path=path):
            if path not in active:  # a module calling itself again is inside its own call
                active[path] = OwnerCall(path, *tree_map(saved, (args, kwargs)))

        def post(_, args, kwargs, output, path=path):
            call = active.pop(path, None)
            if call is None:
                return
            recorded.append(call)
            out = _first_tensor(output)
            if out is not None and out.requires_grad:

                def reached(grad, call=call):
                    call.grad_output = _unscaled(grad, scale)

                out.register_hook(reached)

        hooks.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        hooks.append(module.register_forward_hook(post, with_kwargs=True))
        for name, child in module.named_children():
            if not any(True for _ in child.parameters()):
                continue  # it runs again as it is (see `owner_vjp`)

            def entered(_, args, kwargs, path=path, name=name):
                if path not in active:
                    return None
                child_call = ChildCall(name)
                active[path].children.append(child_call)

                def alias(t):
                    # a view of each input, so that the gradient through this call alone
                    # can be read (the input itself may feed a residual path too)
                    if not (isinstance(t, torch.Tensor) and t.is_floating_point()):
                        return t
                    if not t.requires_grad:
                        return t
                    slot = len(child_call.input_grads)
                    child_call.input_grads.append(None)
                    seen = t.view_as(t)

                    def reached(grad, slot=slot):
                        child_call.input_grads[slot] = _unscaled(grad, scale)

                    seen.register_hook(reached)
                    return seen

                return tree_map(alias, (args, kwargs))

            def returned(_, args, output, path=path):
                if path in active and active[path].children:
                    active[path].children[-1].output = tree_map(saved, output)

            hooks.append(child.register_forward_pre_hook(entered, with_kwargs=True))
            hooks.append(child.register_forward_hook(returned))
    return recorded


class _Replayed(torch.autograd.Function):
    """A submodule's call replayed: its output as recorded, and in backward the gradients
    that reached its inputs as recorded (`grads`, prepared as the side holds them)."""

    @staticmethod
    def forward(ctx, output, grads, *inputs):
        ctx.grads = grads
        ctx.held = [(t.dtype, t.shape) for t in inputs]
        return output.detach().clone()

    @staticmethod
    def backward(ctx, _grad):
        return (
            None, None,
            *[None if g is None else g.to(dtype).reshape(shape)
              for g, (dtype, shape) in zip(ctx.grads, ctx.held, strict=True)],
        )  # fmt: skip


def owner_vjp(
    module, call: OwnerCall, grad_output, prepare, running, scale: float, grad_dtype=None,
    spread: bool = False, held_scale: float | None = None,
) -> Vjp:  # fmt: skip
    """The backward of `module`'s own code alone, for `call`: `module` run on the call's
    inputs (each tensor through `prepare`) with each direct submodule that has parameters
    replayed (`_Replayed`: what it returned in the call, and in backward the gradients that
    reached its inputs through it, scaled by `held_scale` as the side holds them, through
    `prepare`, and brought to `scale`), then `vjp`'s backward; only the module's own parameters
    take a gradient. A submodule without parameters runs again as it is: it may compute on the
    module's own parameters."""
    tree_map, leaves = torch.utils._pytree.tree_map, torch.utils._pytree.tree_leaves
    held_scale = scale if held_scale is None else held_scale
    replays: dict[str, list] = {}
    for child in call.children:
        replays.setdefault(child.name, []).append(child)
    children = dict(module.named_children())
    kept = {name: children[name].__dict__.get("forward") for name in replays if name in children}

    def given(t):
        return prepare(t) if isinstance(t, torch.Tensor) else t

    def replay(name):
        recorded = iter(replays[name])

        def forward(*args, **kwargs):
            child = next(recorded)
            out = tree_map(given, child.output)
            first = _first_tensor(out)
            inputs = [
                t for t in leaves((args, kwargs))
                if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad
            ]  # fmt: skip
            if first is None or len(inputs) != len(child.input_grads):
                return out  # what it returned, as a constant
            grads = [
                None if g is None else prepare(g * held_scale).double() * (scale / held_scale)
                for g in child.input_grads
            ]  # fmt: skip
            replayed = _Replayed.apply(first, grads, *inputs)
            return tree_map(lambda t: replayed if t is first else t, out)

        return forward

    for name in kept:
        children[name].forward = replay(name)
    try:
        as_call = Call(call.module, call.module, call.args, call.kwargs, call.grad_output)
        found = vjp(module, as_call, grad_output, prepare, running, scale, grad_dtype, spread)
    finally:
        for name, forward in kept.items():
            if forward is None:
                del children[name].forward
            else:
                children[name].forward = forward
    own = {n for n, p in module.named_parameters(recurse=False)}
    return Vjp(
        found.input, found.inputs,
        {n: g for n, g in found.parameters.items() if n in own},
        found.dtype,
        {n: t for n, t in found.terms.items() if n in own},
    )  # fmt: skip


# Random sign patterns whose backwards measure a parameter gradient's terms (see `_spread`).
_FLIPS = 8


@dataclass
class Vjp:
    """One module call's backward alone: the gradient of its first floating-point input (None
    without one), of each of its floating-point inputs by position, and of its parameters by
    name within the module; and the dtype its output was computed in. `terms`: for each
    parameter, where measured, how many terms each element of its gradient sums, their root
    sum of squares (see `_spread`), and the terms themselves where handed over (`_each`), else
    None."""

    input: torch.Tensor | None
    inputs: dict[int, torch.Tensor]
    parameters: dict[str, torch.Tensor]
    dtype: torch.dtype
    terms: dict[str, tuple[int, torch.Tensor, torch.Tensor | None]] = field(default_factory=dict)


def vjp(
    module, call: Call, grad_output, prepare, running, scale: float, grad_dtype=None,
    spread: bool = False,
) -> Vjp:  # fmt: skip
    """`module` run on `call`'s inputs (each tensor through `prepare`), then its backward alone
    for `grad_output` (times `scale`, in the output's dtype or `grad_dtype`); the gradients
    unscaled (float32 when scaled), as a side's whole backward gives them. With `spread`, the
    parameters' gradients' terms are measured too (`Vjp.terms`)."""
    flat, spec = torch.utils._pytree.tree_flatten((call.args, call.kwargs))
    given, wrt = [], []
    for t in flat:
        if isinstance(t, torch.Tensor):
            t = prepare(t)
            if t.is_floating_point():
                leaf = t.detach().requires_grad_(True)
                wrt.append(leaf)
                t = leaf.clone()  # a module may work in place on its input (ReLU(inplace=True))
        given.append(t)
    args, kwargs = torch.utils._pytree.tree_unflatten(given, spec)
    params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    with torch.enable_grad(), running():
        out = _first_tensor(module(*args, **kwargs))
    if out is None or not out.requires_grad:
        return Vjp(None, {}, {}, out.dtype if out is not None else torch.float32)
    g = (grad_output.to(out.device) * scale).to(grad_dtype or out.dtype)
    found = torch.autograd.grad(
        out, [*wrt, *(p for _, p in params)], g, allow_unused=True, retain_graph=spread
    )

    def unscaled(grad):
        if grad is None:
            return None
        if scale == 1.0:
            return grad.detach()
        return _unscaled(grad, scale)

    inputs = {k: unscaled(found[k]) for k in range(len(wrt)) if found[k] is not None}
    parameters = {
        n: unscaled(g) for (n, _), g in zip(params, found[len(wrt) :], strict=True) if g is not None
    }
    terms = _spread(out, g, [(n, p) for n, p in params if n in parameters]) if spread else {}
    each = _each(module, wrt[0].detach(), g, dict(params)) if terms and wrt else {}
    terms = {n: (k, r, each.get(n)) for n, (k, r) in terms.items()}
    return Vjp(inputs.get(0), inputs, parameters, out.dtype, terms)


def _each(module, x, g, params) -> dict[str, torch.Tensor]:
    """A LayerNorm's weight and bias gradients' terms themselves: one row per position, in the
    order the positions are held (`positions × features`), as a kernel adds them up: the output
    gradient `g` for the bias, times the normalized input for the weight. Where the features
    lie in the output is found by running the module with a bias that counts them (a
    `LayerNorm2d` normalizes axis 1). Empty for any other module, and for features over more
    than one axis."""
    if not isinstance(module, nn.LayerNorm) or len(module.normalized_shape) != 1:
        return {}
    features = module.normalized_shape[0]
    weight = params.get("weight")
    like = weight if weight is not None else params.get("bias")
    if like is None:
        return {}
    call = torch.func.functional_call
    with torch.no_grad():
        count = torch.arange(features, dtype=x.dtype)
        counted = call(module, {"weight": torch.zeros_like(like), "bias": count}, (x,))
        normalized = call(module, {"weight": torch.ones_like(like), "bias": count * 0}, (x,))
    axes = [
        a for a in range(g.dim()) if g.shape[a] == features
        and torch.equal(counted.movedim(a, -1), count.expand_as(counted.movedim(a, -1)))
    ]  # fmt: skip
    if len(axes) != 1 or counted.shape != g.shape:
        return {}

    def rows(t: torch.Tensor) -> torch.Tensor:
        return t.detach().movedim(axes[0], -1).reshape(-1, features).contiguous()

    each = {"weight": rows(g * normalized)}
    if "bias" in params:
        each["bias"] = rows(g)
    return {n: t for n, t in each.items() if n in params}


def _spread(out, g, params) -> dict[str, tuple[int, torch.Tensor]]:
    """For each parameter, how many terms each element of its gradient sums, and their root sum
    of squares: a parameter's gradient is linear in the output gradient `g`, a sum over the
    output's elements of `J·g`, so flipping the sign of each element of `g` at random leaves
    every term's square and cancels their products on average: the mean square of the gradients
    of `_FLIPS` such patterns is `Σ term²` (fixed seed, so the same every run). The number of
    terms is the output's elements per slice the parameter's first (else last) axis indexes
    (a weight's output channel, a norm's feature)."""
    if not params:
        return {}
    generator = torch.Generator().manual_seed(0)
    squares = [torch.zeros_like(p, dtype=torch.float64) for _, p in params]
    for k in range(_FLIPS):
        signs = torch.randint(0, 2, g.shape, generator=generator).to(g) * 2 - 1
        grads = torch.autograd.grad(
            out, [p for _, p in params], g * signs, allow_unused=True,
            retain_graph=k < _FLIPS - 1,
        )  # fmt: skip
        for total, found in zip(squares, grads, strict=True):
            if found is not None:
                total += found.detach().double() ** 2
    return {
        n: (_terms(p, g), (total / _FLIPS).sqrt())
        for (n, p), total in zip(params, squares, strict=True)
    }


def _terms(parameter: torch.Tensor, g: torch.Tensor) -> int:
    """How many of the output's elements each element of `parameter`'s gradient sums (see
    `_spread`)."""
    for size in (parameter.shape[:1] + parameter.shape[-1:]) if parameter.dim() else ():
        if size in g.shape:
            return max(1, g.numel() // size)
    return max(1, g.numel() // max(1, parameter.numel()))


def exact_vjp(
    module, call: Call | OwnerCall, grad_output, held, dtype: torch.dtype, scale: float
) -> Vjp:
    """The call's backward made exactly: a float64 copy of the reference's `module` with its
    weights rounded to `dtype`, on the call's inputs each as the target holds it (`held(t)`
    converts it so) and rounded to `dtype` where narrower, for the output gradient as the
    target gets it (scaled by `scale`, rounded to `dtype`, scaled back: exact for a power of
    two); autocast off, on the CPU. Gradients in float64, with their parameters' terms
    (`Vjp.terms`)."""
    exact = _baseline.exact_copy(module, dtype)
    g = (grad_output.detach().cpu().double() * scale).to(dtype).double() / scale

    def prepare(t):
        if not t.is_floating_point():
            return t.detach().cpu()
        return _baseline.as_held(t, held, dtype)

    with _baseline.no_autocast():
        if isinstance(call, OwnerCall):
            return owner_vjp(
                exact, call, g, prepare, _nothing, 1.0, torch.float64, True, held_scale=scale
            )
        return vjp(exact, call, g, prepare, _nothing, 1.0, grad_dtype=torch.float64, spread=True)


class _nothing:
    """No context."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
