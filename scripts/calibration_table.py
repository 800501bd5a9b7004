"""The calibration table in docs/metrics.md (between its calibration markers): the rows a run
wrote, and writing a run's table in their place (`scripts/calibrate_baseline.py`)."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs/metrics.md"
BEGIN, END = "<!-- calibration: begin -->", "<!-- calibration: end -->"
_BLOCK = f"{re.escape(BEGIN)}(.*?){re.escape(END)}"


def write(table: str, doc: Path = DOC) -> None:
    """`table` in place of the one between the markers of `doc`."""
    block = f"{BEGIN}\n{table}\n{END}"
    doc.write_text(re.sub(_BLOCK, lambda _: block, doc.read_text(), flags=re.S))


def again(jobs: list[tuple], header: list[str], doc: Path = DOC) -> list[tuple]:
    """`jobs` (each `(kind, model, target, …)`) with each whose row in `doc`'s table read as
    expected kept as it is there (`("kept", row)`): only the rows that broke, were missed or
    are not there run again. `header`: the table's lines before its rows."""
    found = re.search(_BLOCK, doc.read_text(), flags=re.S)
    rows = found.group(1).strip().splitlines()[len(header) :] if found else []
    written = {"|".join(r.split("|")[1:3]).strip(): r for r in rows}
    kept = []
    for job in jobs:
        row = written.get(f" {job[1]} | {job[2]} ".strip())
        fine = row is not None and "broke" not in row and "**missed**" not in row
        kept.append(("kept", row) if fine else job)
    return kept


def row(what: str, target: str, report, seconds: float, expected: str = "no defect",
        said: str = "—") -> str:  # fmt: skip
    """A run's row of the table: its verdict, defects, what it names, the doors a fault went
    through, the largest multiple of what precision explains, and how long it took."""
    s = report.summary
    # an infinite multiple (own error where the ideal has none) is written as a string
    multiples = [float(x["baseline"]["multiple"]) for x in report.layers if x.get("baseline")]
    worst = max(multiples, default=0.0)
    defects = ", ".join(f"`{d['layer']}` {d['cause']}" for d in s["defects"]) or "none"

    def named(kind: str, show) -> str:
        found = [show(k) for k in s.get(kind, [])]
        more = f" and {len(found) - 3} more" if len(found) > 3 else ""
        return ", ".join(found[:3]) + more or "none"

    narrow = named("narrow_accumulation", lambda k: f"`{k['layer']}`")
    approximations = named(
        "approximations", lambda a: f"`{a['layer']}` {a['ops']} {float(a['multiple']):.1f}×"
    )
    took = "`make reports`" if getattr(report, "committed", False) else f"{seconds:.0f} s"
    return (
        f"| {what} | {target} | {expected} | {s['verdict']} | {defects} | {narrow} | "
        f"{approximations} | {said} | {worst:.2f} | {len(multiples)} | {took} |"
    )


def unclean(report, target: str) -> str:
    """What a clean run says that it should not, besides a defect, in words for its row: an
    approximation by PyTorch's own kernels (the honest ones the rule is drawn from), or exit 1
    without a defect (an overflow, an undecided run)."""
    if target.startswith("torch") and report.summary.get("approximations"):
        return " **an approximation in a PyTorch target**"
    return " **exit 1**" if getattr(report, "exit", None) == 1 else ""


def headline(report: dict) -> str | None:
    """The layer a report's headline names: its first defect, else its first approximation."""
    s = report["summary"]
    first = (s["defects"] or s.get("approximations") or [{}])[0]
    return first.get("layer")


def found(report, layer: str, cause: str) -> bool:
    """Whether a planted fault is the headline: the one defect at its layer with its cause, or
    (a kernel that accumulates in the narrow dtype) named as such there, with no defect."""
    s = report.summary
    if cause in ("narrow_accumulation", "approximation"):
        kind = {"approximation": "approximations"}.get(cause, cause)
        named = [k["layer"] for k in s.get(kind, [])]
        return named == [layer] and not s["defects"]
    return [(d["layer"], d["cause"]) for d in s["defects"]] == [(layer, cause)]
