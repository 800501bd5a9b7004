"""Each side's gradients of the loss, from its own copy of the model: in float16 with the loss
scaled as `torch.amp.GradScaler` does, and the float64 truth; and a tensor's gradient added up
from several calls' parts as backward accumulates them."""

from __future__ import annotations

import copy

import torch

from layerdiff import _layerdiff
from layerdiff.torch import _backward
from layerdiff.torch._backward import Pass
from layerdiff.torch._capture import capture
from layerdiff.torch._lockstep import diverging_modules
from layerdiff.torch._sides import TorchSide

# GradScaler's first scale and its back-off on a step with non-finite gradients.
_INIT_SCALE, _BACKOFF = 2.0**16, 0.5


def side_gradients(model, inputs, side: TorchSide, cotangent, whole, which: str) -> Pass:
    """`_gradients`, with the side's own failure said as bad input, naming the side."""
    try:
        return _gradients(model, inputs, side, cotangent, whole)
    except _layerdiff.LayerdiffError:
        raise
    except Exception as e:
        raise _layerdiff.InputError(
            f"{which} `{side.spelling}` could not compute the gradients: {type(e).__name__}: {e}"
        ) from e


def _gradients(model, inputs, side: TorchSide, cotangent, whole) -> Pass:
    """The side's gradients of the loss, from its own copy of the model; in float16, the loss
    scaled as GradScaler does and the gradients unscaled in float32. A data-parallel side's
    come from its ranks (`_ddp`)."""
    if side.ranks > 1:
        from layerdiff.torch import _ddp

        return _ddp.gradients(model, inputs, side, cotangent)
    copied, given = side.prepare(model, inputs, whole)
    found, _, skipped = loss_scaled(
        side.lower == "float16",
        lambda scale: _backward.backward(copied, given, side.running, cotangent, scale, whole),
        lambda found: finite(found.grads.values()),
    )
    found.skipped = skipped
    return found


def loss_scaled(float16: bool, backward, finite_at) -> tuple:
    """`backward(scale)` at the scale GradScaler would step at: in float16 from its first scale,
    halved while `finite_at(what backward returned)` is False, as its skipped steps would; else
    at 1. Returns what the last backward returned, its scale and the steps skipped."""
    scale, skipped = (_INIT_SCALE if float16 else 1.0), 0
    while True:
        found = backward(scale)
        if scale == 1.0 or finite_at(found):
            return found, scale, skipped
        scale *= _BACKOFF
        skipped += 1


def finite(grads) -> bool:
    """Whether every gradient of `grads` is finite."""
    return all(bool(torch.isfinite(g).all()) for g in grads)


def float64_gradients(model, inputs, cotangent, whole) -> Pass:
    """The gradients of a float64 copy of the model: the numerical truth."""
    wide = tuple(t.double() if t.is_floating_point() else t for t in inputs)
    copied = copy.deepcopy(model).double()
    return _backward.backward(copied, wide, torch.enable_grad, cotangent.double(), whole=whole)


def summed(parts: list[torch.Tensor]) -> torch.Tensor:
    """The gradients of one tensor from several calls, added up as backward accumulates them
    (in float32 or wider, then in the first part's dtype)."""
    if len(parts) == 1:
        return parts[0]
    wide = torch.promote_types(parts[0].dtype, torch.float32)
    total = sum(p.to(wide) for p in parts)
    return total.to(parts[0].dtype)


def completed(parts: list[torch.Tensor], rest, held: torch.dtype) -> torch.Tensor:
    """A gradient's own value: its calls' parts added up as backward does, plus `rest` (the
    reference's share from computation outside module calls), in the dtype it is held in."""
    total = summed(parts)
    if not isinstance(rest, torch.Tensor):
        return total
    return (total.double() + rest.to(total.device)).to(held)


def both_sides(model, inputs, sides, cotangent, listing, whole, step):
    """Both sides' gradients. A target that calls other layers inside a module than the
    reference (a path of its own for its precision) is differentiated with those modules whole,
    on both sides: the gradients, the listing and the modules run whole then, and what is said
    of it."""
    ref_side, tgt_side = sides
    diverging: list[str] = []
    for _ in range(3):
        step(f"forward and backward on the reference ({ref_side.spelling})")
        ref = side_gradients(model, inputs, ref_side, cotangent, whole, "the reference")
        step(f"forward and backward on the target ({tgt_side.spelling})")
        tgt = side_gradients(model, inputs, tgt_side, cotangent, whole, "the target")
        if tgt_side.ranks > 1:
            break  # its module calls are not followed (`_ddp`)
        found = diverging_modules(list(ref.calls.values()), list(tgt.calls.values()))
        if not found or set(found) <= set(diverging):
            break
        diverging = sorted({*diverging, *found})
        whole = frozenset([*listing.self_computing, *diverging])
        listing = capture(model, inputs, whole=whole)
    warnings = []
    warnings += tgt.ranks.disagreements if tgt.ranks is not None else []
    if diverging:
        warnings.append(
            f"{', '.join(f'`{m}`' for m in diverging)} compared whole: the target calls other "
            "submodules or ops inside them than the reference does (a path of their own for its "
            "precision or device), so it cannot be followed call by call there"
        )
    return ref, tgt, listing, whole, warnings


def missing_as_zero(ref, tgt) -> list[str]:
    """A parameter the target's forward does not use has no gradient there: zero, and said."""
    missing = [n for n in ref.order if n in ref.grads and n not in tgt.grads]
    for n in missing:
        tgt.grads[n] = torch.zeros_like(ref.grads[n])
    if not missing:
        return []
    names = ", ".join(f"`{n}`" for n in missing[:5])
    more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
    return [
        f"the target's backward gives no gradient for {names}{more}: its forward does not use "
        "them; compared as zero"
    ]


def skipped_note(tgt) -> str | None:
    """What the target's loss scaling skipped, where it did."""
    if not tgt.skipped:
        return None
    return (
        f"the target's gradients were not finite at {tgt.skipped} larger loss scale(s): a "
        f"GradScaler would skip {tgt.skipped} step(s) before reaching {tgt.scale:g}"
    )
