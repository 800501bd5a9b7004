"""The machine's memory, touched once before the bench's first row. On a virtual machine whose
host backs guest memory only when it is first touched, taking a page never used since boot costs
far more than taking one used before (on the 2-core VM of an earlier run: about 3 s per GiB
against 0.15 s), and whichever row comes first would pay for it. A child process takes most of
the memory available, 1 GiB at a time (each page written), and exits; how long each GiB took is
reported beside the rows."""

from __future__ import annotations

import json
import subprocess
import sys

# What the child takes: this share of the memory available when it starts.
SHARE = 0.85

_CHILD = """
import json, time
import numpy as np
gib = int(open('/proc/meminfo').read().split('MemAvailable:')[1].split()[0]) * {share} / (1 << 20)
held, seconds = [], []
for _ in range(int(gib)):
    start = time.perf_counter()
    held.append(np.ones(1 << 27))  # 1 GiB of float64, every page written
    seconds.append(time.perf_counter() - start)
print(json.dumps(seconds))
"""


def touch() -> dict:
    """Touches the memory; returns the GiB taken and the seconds each took (none where the
    machine has no /proc/meminfo)."""
    child = subprocess.run(
        [sys.executable, "-c", _CHILD.format(share=SHARE)], capture_output=True, text=True
    )
    if child.returncode != 0:
        return {"gib": 0, "seconds": []}
    seconds = json.loads(child.stdout)
    return {"gib": len(seconds), "seconds": seconds}


def words(warmed: dict) -> str:
    """A sentence for docs/performance.md."""
    seconds = sorted(warmed["seconds"])
    if not seconds:
        return "The bench could not touch the machine's memory before its first row."
    median = seconds[len(seconds) // 2]
    return (
        f"Before its first row the bench touched {warmed['gib']} GiB of the machine's memory "
        f"once (`benches/warm.py`): {median:.2f} s per GiB at the median, {seconds[0]:.2f} to "
        f"{seconds[-1]:.2f}. Where a GiB takes seconds, the host backs the machine's memory "
        "only as it is first used, and without this the first row would pay for it."
    )
