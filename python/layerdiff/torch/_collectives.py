"""The collectives of `layerdiff ops` (all_reduce, all_gather, reduce_scatter, broadcast) across
the ranks of a `torch:ddp=N` backend: N processes of one `torch.distributed` group (`_ranks`:
gloo on the CPU, NCCL on CUDA). A case's input is one row per rank (`("randn", ("ranks", n))`):
rank r holds row r, rounded to the cell's dtype. The truth is what one process computes from
all the rows in float64 (`truth`); what a cell compares is rank 0's result, and every rank must
hold what rank 0 does (for broadcast and reduce_scatter, each rank's own part, in rank order).

One group per backend computes every collective cell of the matrix (`answers`), as TensorFlow's
process does its cells: a group takes seconds to start.
"""

from __future__ import annotations

import torch

from layerdiff.torch import _ranks

# What each collective gives, from all the ranks' rows (`stacked`, one row per rank).
NAMES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


class Truth:
    """The collectives computed in one process from every rank's row: `Case.call`'s
    `dist.NAME` (see `_op_cell.resolve`)."""

    @staticmethod
    def all_reduce(stacked: torch.Tensor) -> torch.Tensor:
        return stacked.sum(0)

    @staticmethod
    def reduce_scatter(stacked: torch.Tensor) -> torch.Tensor:
        return stacked.sum(0)  # the ranks' parts, put back in rank order

    @staticmethod
    def all_gather(stacked: torch.Tensor) -> torch.Tensor:
        return stacked.clone()

    @staticmethod
    def broadcast(stacked: torch.Tensor) -> torch.Tensor:
        return stacked[0].expand_as(stacked).clone()  # rank 0's row, on every rank


def answers(tasks: list, rows_of) -> dict:
    """Every collective cell of `tasks` (`_op_cell.Task`s on `torch:ddp=N` backends), computed
    by one group per backend: `(case, backend, dtype)` → `(result, 0)`, or the exception the
    cell reports. `rows_of(task)` gives a cell's rows, rounded to its dtype."""
    from layerdiff import _layerdiff
    from layerdiff.torch._op_cell import Said

    out = {}
    for backend in dict.fromkeys(t.backend for t in tasks):
        mine = [t for t in tasks if t.backend == backend]
        spec = _layerdiff.side_spec(backend)
        requests = [(_name(t.case), rows_of(t)) for t in mine]
        try:
            found = _ranks.run(_rank, requests, spec.ranks, spec.device)
        except _ranks.RankFailed as e:
            failed = Said(f"rank {e.rank} of the group failed: {e.why}")
            out.update({(t.case, t.backend, t.dtype): failed for t in mine})
            continue
        for i, t in enumerate(mine):
            out[(t.case, t.backend, t.dtype)] = _cell(_name(t.case), [rank[i] for rank in found])
    return out


def _name(case: str) -> str:
    """The collective a case runs (`all_reduce`)."""
    from layerdiff.torch._op_cases import CASES

    return CASES[case].call.removeprefix("dist.")


def _cell(name: str, results: list):
    """What the cell compares, from each rank's result (a tensor, or what it raised): rank 0's
    (each rank's own part put in rank order, where the collective gives each its own), or the
    exception where a rank raised or holds other values than rank 0."""
    from layerdiff.torch._op_cell import Said

    for rank, got in enumerate(results):
        if isinstance(got, tuple):  # (exception type, message)
            kind, message = got
            if kind == "NotImplementedError" or "not supported" in message.lower():
                return NotImplementedError(f"rank {rank}: {message}")
            return Said(f"rank {rank}: {kind}: {message}")
    if name in ("reduce_scatter", "broadcast"):
        return torch.cat(results) if name == "reduce_scatter" else torch.stack(results), 0
    for rank, got in enumerate(results[1:], start=1):
        if not torch.equal(got, results[0]):
            return Said(
                f"rank {rank} holds other values than rank 0 after {name} (max |diff| "
                f"{(got.double() - results[0].double()).abs().max().item():.3e}): the "
                "collective does not give every rank the same result"
            )
    return results[0], 0


def _rank(rank: int, count: int, requests: list) -> list:
    """This rank's result of each request `(collective, rows)`, on its own row: a tensor on the
    CPU, or `(exception type, message)`."""
    import torch.distributed as dist

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    out = []
    for name, rows in requests:
        mine = rows[rank].to(device).clone()
        try:
            if name == "all_reduce":
                dist.all_reduce(mine)
                got = mine
            elif name == "all_gather":
                parts = [torch.empty_like(mine) for _ in range(count)]
                dist.all_gather(parts, mine)
                got = torch.stack(parts)
            elif name == "reduce_scatter":
                parts = [p.contiguous() for p in mine.tensor_split(count)]
                got = torch.empty_like(parts[rank])
                dist.reduce_scatter(got, parts)
            else:
                dist.broadcast(mine, src=0)
                got = mine
            out.append(got.cpu())
        except Exception as e:  # the cell's finding; every rank raises alike on a dtype or op
            out.append((type(e).__name__, str(e).strip().splitlines()[0] if str(e) else ""))
    return out
