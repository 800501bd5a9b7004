"""The data-parallel side of `layerdiff grad` (`torch:ddp=N`): the model trained as
DistributedDataParallel does, in N processes of one group (`_ranks`), each rank on its shard of
the batch (its rows, in order), against the same side in one process on the whole batch.

Each rank differentiates its rows' share of the loss (the output's dot product with the matching
rows of the fixed random tensor, or its sum). The shares add up to the whole batch's loss, so the
ranks' gradients add up to its gradient: DDP's all-reduce averages them (each rank's bucket
times 1/N, then summed), and the average times N is what is compared (exact where N is a power
of two). In float16 the loss is scaled as `torch.amp.GradScaler` does, on every rank alike.

A parameter's data-parallel gradient is two computations, and the report has a layer for each:

- `fc.weight:rank1`, each rank's gradient before the all-reduce: rank 1's backward of its rows.
  Its reference is the same side in one process on the same rows, so any difference is the
  rank's own (a rank that scales its gradient, a hook that fires on one rank);
- `fc.weight`, the gradient after the all-reduce, fed by its ranks' layers. Its own value is the
  target's collective re-run on the reference's per-rank gradients (the same bucket arithmetic),
  judged against the float64 gradient of the whole batch: summing the ranks' shares in another
  order than one process does is rounding; a collective that sums wrongly, or a model that
  computes across the batch (which each rank does over its rows only), is not.

Every rank must hold the same gradients after the all-reduce: where one differs from rank 0's,
the run says so. A model input's gradient is each rank's for its rows, in batch order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings

import torch

from layerdiff import _layerdiff
from layerdiff._layerdiff import CapturedLayer
from layerdiff.tensors import dtype_name
from layerdiff.torch import _baseline, _ranks
from layerdiff.torch._backward import Pass
from layerdiff.torch._capture import _first_tensor
from layerdiff.torch._gradients import finite, loss_scaled
from layerdiff.torch._inputs import inputs_at


@dataclasses.dataclass
class Ranks:
    """A data-parallel side's gradients rank by rank, each a dict by parameter name (unscaled):
    `target`, what each rank's backward gave before the all-reduce; `reference`, the same side
    in one process on that rank's rows, with its threads; `exact`, the float64 copy on them,
    and `whole` on the whole batch; `collective`, the target's all-reduce (times N) of the
    `reference` ones; what the ranks disagree on after the all-reduce, in words."""

    target: list[dict]
    reference: list[dict]
    exact: list[dict]
    whole: dict
    collective: dict
    disagreements: list[str]


def batch_of(inputs: tuple) -> int | None:
    """The batch the inputs share along their first dimension, or None where they do not."""
    sizes = {t.shape[0] for t in inputs if isinstance(t, torch.Tensor) and t.dim() > 0}
    scalars = any(isinstance(t, torch.Tensor) and t.dim() == 0 for t in inputs)
    return sizes.pop() if len(sizes) == 1 and not scalars else None


def sharded_inputs(inputs: tuple, reference, side, seed: int) -> tuple[tuple, str | None]:
    """Inputs the ranks of `side` can share: the example's, or, where its batch is smaller than
    the ranks, inputs drawn like it at a batch of one sample per rank (and a note that says so).
    The `reference` must be the same side in one process."""
    if single(side) != reference:
        raise _layerdiff.UsageError(
            f"`{side.spelling}` is compared with the same side in one process: give "
            f"--reference {single(side).spelling} (the reference is `{reference.spelling}`)"
        )
    ranks, batch = side.ranks, batch_of(inputs)
    if batch is None:
        shapes = ", ".join("x".join(map(str, t.shape)) or "scalar" for t in inputs)
        raise _layerdiff.UsageError(
            f"the model's inputs ({shapes}) do not share a first dimension: a data-parallel "
            "side splits the batch along it, one shard per rank"
        )
    if batch >= ranks:
        return inputs, None
    drawn = inputs_at(inputs, [(ranks, *t.shape[1:]) for t in inputs], seed)
    return drawn, (
        f"the inputs are drawn at a batch of {ranks} (one sample per rank; the example's batch "
        f"is {batch}), like the example's, from the seed"
    )


def single(side):
    """The same side in one process."""
    spelling = side.spelling.replace(f":ddp={side.ranks}", "")
    return dataclasses.replace(side, ranks=1, spelling=spelling)


def gradients(model, inputs: tuple, side, cotangent: torch.Tensor) -> Pass:
    """The side's gradients after the all-reduce (see the module docs), as a `Pass` of
    parameters and model inputs with its ranks' (`Pass.ranks`); its module calls are not
    followed."""
    batch, count = batch_of(inputs), side.ranks
    if cotangent.dim() == 0 or cotangent.shape[0] != batch:
        raise _layerdiff.UsageError(
            f"the model's output ({'x'.join(map(str, cotangent.shape)) or 'scalar'}) does not "
            f"lead with the batch ({batch}): a data-parallel side gives each rank the loss of "
            "its own rows"
        )
    rows = [_rows(inputs, cotangent, count, r) for r in range(count)]
    alone = single(side)
    with _ranks.threads_of(count):
        reference, scale = _one_process(model, rows, alone)
    payload = {
        "model": model, "inputs": inputs, "cotangent": cotangent, "side": side.spelling,
        "partials": reference, "scale": scale,
    }  # fmt: skip
    try:
        found = _ranks.run(_rank, payload, count, side.device)
    except _ranks.RankFailed as e:
        raise _layerdiff.InputError(
            f"the target `{side.spelling}` could not compute the gradients: rank {e.rank}: {e.why}"
        ) from None
    first = found[0]
    grads = dict(first["parameters"])
    for i, t in enumerate(inputs):
        key = f"inputs[{i}]"
        if t.is_floating_point() and all(key in rank["partials"] for rank in found):
            grads[key] = torch.cat([rank["partials"][key] for rank in found])
    copied = side.prepare(model, (), ())[0]
    dtype = next((p.dtype for p in copied.parameters() if p.is_floating_point()), torch.float32)
    wide = _baseline.exact_copy(model, dtype)
    # each rank's rows, and the whole batch: what one process computes exactly
    every = [(_rounded(given, dtype), cot) for given, cot in [*rows, (inputs, cotangent)]]
    *exact, whole = _one_process(wide, every, None)[0]
    return Pass(
        grads=grads,
        order=[*first["order"], *(k for k in grads if k.startswith("inputs["))],
        parameters={n: p.detach() for n, p in copied.named_parameters()},
        model=copied,
        scale=first["scale"],
        skipped=first["skipped"],
        ranks=Ranks(
            target=[rank["partials"] for rank in found],
            reference=reference,
            exact=exact,
            whole=whole,
            collective=first["collective"],
            disagreements=_disagreements(found),
        ),
    )


def _rows(inputs: tuple, cotangent, count: int, rank: int) -> tuple[tuple, torch.Tensor]:
    """Rank `rank`'s rows of the inputs and of the loss's tensor."""
    return tuple(t.tensor_split(count)[rank] for t in inputs), cotangent.tensor_split(count)[rank]


def _rounded(given: tuple, dtype: torch.dtype) -> tuple:
    """Floating-point inputs rounded to `dtype`, in float64."""
    return tuple(t.to(dtype).double() if t.is_floating_point() else t for t in given)


def _one_process(model, rows: list, side) -> tuple[list[dict], float]:
    """The gradients of the loss of each rank's rows (`rows`: `(inputs, cotangent)` each) in
    one process, of the parameters and the inputs (`inputs[0]`), on `side` (None: `model` as
    it is, a float64 copy), unscaled, all at the one scale they were taken at (halved for all
    where any rank's are not finite, as DDP's ranks do together)."""
    if side is None:
        copied, running = model, contextlib.nullcontext
        rows = [(given, cot.double()) for given, cot in rows]
    else:
        copied, running = side.prepare(model, ())[0], side.running
        rows = [(tuple(side.convert(t) for t in given), cot) for given, cot in rows]
    grads, scale, _ = loss_scaled(
        side is not None and side.lower == "float16",
        lambda scale: [_backward_of(copied, given, running, cot, scale) for given, cot in rows],
        lambda grads: finite(g for each in grads for g in each.values()),
    )
    return [{n: _unscaled(g, scale) for n, g in each.items()} for each in grads], scale


def _backward_of(model, given, running, cotangent, scale, wrapped=None) -> dict:
    """One forward and backward of the loss times `scale` (through `wrapped`, a DDP of `model`,
    where given): each parameter's gradient as the backward hands it over, before any
    all-reduce, and each floating-point input's (`inputs[0]`)."""
    found: dict[str, torch.Tensor] = {}
    hooks = [
        p.register_hook(lambda g, n=n: found.__setitem__(n, g.detach().clone()))
        for n, p in model.named_parameters() if p.requires_grad
    ]  # fmt: skip
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in given]
    for p in model.parameters():
        p.grad = None
    try:
        with running():
            out = _first_tensor((wrapped or model)(*leaves))
            if out is None or out.shape != cotangent.shape:
                shape = "no tensor" if out is None else "x".join(map(str, out.shape))
                raise _layerdiff.UsageError(
                    f"the model's output on a rank's rows is {shape}, not those rows of its "
                    f"output on the whole batch ({'x'.join(map(str, cotangent.shape))}): a "
                    "data-parallel side needs an output that leads with the batch"
                )
            loss = (out.to(cotangent.dtype) * cotangent.to(out.device)).sum()
        (loss * scale).backward()
    finally:
        for h in hooks:
            h.remove()
    found.update({f"inputs[{i}]": t.grad for i, t in enumerate(leaves) if t.grad is not None})
    return found


def _unscaled(g: torch.Tensor, scale: float, times: int = 1) -> torch.Tensor:
    """A gradient of the loss times `scale`, times `times`, divided back: in its dtype where
    the loss was not scaled, float32 or wider where it was (as `_backward`)."""
    held = g.dtype if scale == 1.0 else torch.promote_types(g.dtype, torch.float32)
    return (g.detach().double() * times / scale).to(held).cpu()


def _disagreements(found: list[dict]) -> list[str]:
    """What each rank holds after the all-reduce that rank 0 does not, in words."""
    said = []
    for rank, other in enumerate(found[1:], start=1):
        differing = [
            n for n, g in other["parameters"].items()
            if not torch.equal(g, found[0]["parameters"][n])
        ]  # fmt: skip
        if differing:
            names = ", ".join(f"`{n}`" for n in differing[:3])
            more = f" and {len(differing) - 3} more" if len(differing) > 3 else ""
            said.append(
                f"after the all-reduce rank {rank} holds other gradients than rank 0 for "
                f"{names}{more}: the collective does not give every rank the same sum (rank "
                "0's are compared)"
            )
    return said


def _rank(rank: int, count: int, payload: dict) -> dict:
    """One rank: its rows' forward and backward under DDP, its gradients before and after the
    all-reduce (times `count`, unscaled) and its inputs'; then the collective re-run on the
    reference's gradients of its rows."""
    from torch.nn.parallel import DistributedDataParallel

    from layerdiff.torch._sides import TorchSide

    # DDP's reducer warns where a gradient's strides differ from its bucket's (a ViT's class
    # token): a copy's cost, not a number
    warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")
    side = TorchSide.of(_layerdiff.side_spec(payload["side"]), ranks=True)
    mine, cotangent = _rows(payload["inputs"], payload["cotangent"], count, rank)
    model, given = side.prepare(payload["model"], mine)
    on_cuda = torch.device(side.device).type == "cuda"
    wrapped = DistributedDataParallel(
        _FirstTensor(model), device_ids=[torch.cuda.current_device()] if on_cuda else None,
        find_unused_parameters=True,
    )  # fmt: skip
    names = {p: n for n, p in model.named_parameters() if p.requires_grad}
    order: list[str] = []

    def backward(scale: float) -> dict:
        order.clear()
        hooks = [p.register_post_accumulate_grad_hook(lambda p: order.append(names[p]))
                 for p in names]  # fmt: skip
        try:
            return _backward_of(model, given, side.running, cotangent, scale, wrapped)
        finally:
            for h in hooks:
                h.remove()

    def everywhere_finite(partials: dict) -> bool:
        reduced = [p.grad for p in names if p.grad is not None]
        return _everywhere_finite([*reduced, *partials.values()])

    partials, scale, skipped = loss_scaled(side.lower == "float16", backward, everywhere_finite)
    return {
        "parameters": {
            n: _unscaled(p.grad, scale, count) for p, n in names.items() if p.grad is not None
        },  # fmt: skip
        "partials": {n: _unscaled(g, scale) for n, g in partials.items()},
        "order": order,
        "scale": scale,
        "skipped": skipped,
        "collective": _collective(names, payload["partials"], payload["scale"], rank, count),
    }


class _FirstTensor(torch.nn.Module):
    """The model returning only the tensor the loss reads: DDP looks for the parameters the
    forward does not use from what it returns, and a pooler the loss never reads would leave
    its bucket waiting for gradients that never come."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *args):
        return _first_tensor(self.model(*args))


def _everywhere_finite(grads: list) -> bool:
    """Whether every rank's `grads` are finite (each rank takes the same step)."""
    import torch.distributed as dist

    bad = torch.tensor([0.0 if finite(grads) else 1.0])
    dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    return bad.item() == 0.0


def _collective(names: dict, partials: list, scale: float, rank: int, count: int) -> dict:
    """The reference's gradients of this rank's rows (`partials[rank]`) all-reduced as DDP's
    reducer does it: held as the parameters are, at the scale they were taken at, times 1/N
    into one bucket, summed across the ranks; then times N, unscaled. The parameters every
    rank's reference gives, on every rank alike."""
    import torch.distributed as dist

    everywhere = set.intersection(*(set(p) for p in partials))
    partials = partials[rank]
    held = [(p, n) for p, n in names.items() if n in everywhere]
    parts = [((partials[n].double() * scale).to(p.dtype).to(p.device) * (1.0 / count)).flatten()
             for p, n in held]  # fmt: skip
    if not parts:
        return {}
    bucket = torch.cat(parts)
    dist.all_reduce(bucket)
    out, start = {}, 0
    for p, n in held:
        out[n] = _unscaled(bucket[start : start + p.numel()].view_as(p), scale, count)
        start += p.numel()
    return out


def ranked_layers(gradients, layers: list, *, local: bool, exact: bool) -> list:
    """The report's layers with each gradient's ranks before it (`fc.weight:rank1`, see the
    module docs), each layer's values set on `gradients` (a `_grad._Gradients`), and with
    `local` its own value: a rank's is its own (its inputs are the reference's very rows); the
    all-reduced gradient's is the collective re-run on the reference's gradients of the ranks'
    rows, a model input's those put back in batch order. With `exact`, the baselines: a rank's
    is the float64 copy's gradient of its rows; an all-reduced gradient's, or a model input's,
    the float64 copy's of the whole batch: one process's semantics, so a model that computes
    across the batch (in-batch statistics) differs there by more than any rounding. An
    all-reduced gradient's terms are the ranks' (what a collective that adds them in the grid
    errs by)."""
    ranks: Ranks = gradients.tgt.ranks
    truth = gradients.truth is not None
    out = []
    for layer in layers:
        key = layer.name
        theirs = [t[key] for t in ranks.target if key in t]
        mine = [y[key] for y in ranks.reference if key in y]
        if len(theirs) != len(ranks.target) or len(mine) != len(theirs):
            gradients.local[key] = "not every rank's backward gives this gradient"
            out.append(_moved(layer, []))
            continue
        fed = []
        for r, (y, t, x) in enumerate(
            zip(mine, theirs, [w[key] for w in ranks.exact], strict=True)
        ):
            name = f"{key}:rank{r}"
            gradients.values[name] = (y, t, x if truth else None)
            if local:
                gradients.local[name] = t
            if local and exact:
                gradients.exact[name], gradients.grid[name] = x, t.dtype
            fed.append(len(out))
            out.append(
                CapturedLayer(
                    name=name, module=layer.module, module_type=f"{layer.module_type} (rank {r})",
                    call_index=0, identity=False, input_from=None, inputs_from=[],
                    shape=list(y.shape), dtype=dtype_name(name, t),
                )
            )  # fmt: skip
        reduced = key in ranks.collective
        if local:
            gradients.local[key] = ranks.collective[key] if reduced else torch.cat(mine)
        if local and exact and key in ranks.whole:
            wide = [y.double() for y in mine]
            gradients.grid[key] = gradients.tgt.grads[key].dtype
            gradients.exact[key] = ranks.whole[key]
            if reduced:
                rss = sum(w**2 for w in wide).sqrt()
                gradients.terms[key] = (len(wide), rss, torch.stack(wide))
        out.append(_moved(layer, fed))
    return out


def _moved(layer, fed: list[int]):
    """`layer` among the ranked layers, fed by `fed` (the places of its ranks' layers)."""
    layer.inputs_from = fed
    return layer


def across_the_batch(report: dict) -> list[str]:
    """Where an all-reduced gradient (or a model input's) is a defect while every rank's
    gradient of its rows is one process's: the model computes across the batch, in words."""
    layers = {x["name"]: x for x in report["layers"]}
    defects = {d["layer"] for d in report["summary"]["defects"]}
    found = [
        name for name in defects
        if ":rank" not in name
        and all(f"{name}:rank" in r and r not in defects for r in layers[name]["local_inputs"])
        and layers[name]["local_inputs"]
    ]  # fmt: skip
    if not found:
        return []
    names = ", ".join(f"`{n}`" for n in sorted(found)[:3])
    more = f" and {len(found) - 3} more" if len(found) > 3 else ""
    return [
        f"every rank computes its rows as one process does, yet {names}{more} differ from the "
        "whole batch's gradient beyond rounding: the model computes across the batch (a batch "
        "statistic, BatchNorm in training mode, in-batch negatives), which each rank does over "
        "its rows only; synchronise it across the ranks (SyncBatchNorm, an all_gather before "
        "the batch-wide step) or train it in one process"
    ]
