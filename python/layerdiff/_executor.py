"""Where independent tasks run, for every verb and script that has many (`ops`'s cells,
`sweep`'s runs, the calibration corpus's rows): here, in processes on this machine, or as Ray
tasks on the cluster `RAY_ADDRESS` names (a Ray instance started on this machine otherwise).

A task is a module-level function and a picklable item: Ray ships both to its workers, which
need `layerdiff` installed as the driver has it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, ThreadPoolExecutor, wait

from layerdiff import _layerdiff

# How often a wait for tasks looks whether the command was asked to stop, in seconds.
_POLL = 0.2


def _stop_if_asked() -> None:
    """Raises KeyboardInterrupt (with the signal's number) where the command's handler holds a
    Ctrl-C or SIGTERM (`layerdiff_flow::interrupt`): a wait for tasks does not wake for the
    signal itself, so it looks between waits, and a sweep stops when asked, not when a run
    under way happens to end."""
    signum = _layerdiff.interrupt_signal()
    if signum is not None:
        raise KeyboardInterrupt(signum)


def ray():
    """Ray, connected: to `RAY_ADDRESS`'s cluster, else to an instance started here."""
    try:
        import ray
    except ImportError as e:
        raise _layerdiff.UsageError(
            "--executor ray needs Ray\nhint: pip install 'layerdiff[ray]'"
        ) from e
    if not ray.is_initialized():
        ray.init(
            address=os.environ.get("RAY_ADDRESS") or None,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    return ray


def mapped(kind: str, jobs: int, initializer=None, initargs: tuple = ()):
    """A context giving `map(function, items)` on the chosen executor, results in order:
    `ray` tasks, else `jobs` processes (each set up by `initializer(*initargs)`), else this
    process (`jobs` ≤ 1). A task that raises raises here."""
    if kind == "ray":
        remote = {}
        session = ray()

        def ray_map(function, items):
            if function not in remote:
                remote[function] = session.remote(function)
            return session.get([remote[function].remote(item) for item in items])

        return contextlib.nullcontext(ray_map)
    if jobs <= 1:
        return contextlib.nullcontext(lambda function, items: [function(i) for i in items])
    import multiprocessing

    pool = ProcessPoolExecutor(
        max_workers=jobs,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=initializer,
        initargs=initargs,
    )

    @contextlib.contextmanager
    def pooled():
        with pool:
            yield lambda function, items: list(pool.map(function, items, chunksize=1))

    return pooled()


def each(
    kind: str, jobs: int, function: Callable, items: list, cpus: int = 1, gpus=lambda item: 0
) -> Iterator[tuple[int, object, BaseException | None]]:
    """`function(item)` for every item, as each ends: `(position, result, None)`, or
    `(position, None, error)` where the task raised or its worker died (a Ray worker killed, a
    node lost), so that one task's end never stops the others. Locally `jobs` threads run the
    tasks (each task starts the process that does its work); on Ray each task holds `cpus`
    CPUs of the cluster and `gpus(item)` GPUs."""
    if kind == "ray":
        session = ray()
        task = session.remote(num_cpus=cpus, max_retries=0)(function)
        pending = {
            task.options(num_gpus=gpus(item)).remote(item): i for i, item in enumerate(items)
        }
        while pending:
            done, _ = session.wait(list(pending), num_returns=1, timeout=_POLL)
            if not done:
                _stop_if_asked()
                continue
            i = pending.pop(done[0])
            try:
                yield i, session.get(done[0]), None
            except Exception as e:  # a task's failure, or its worker's death
                yield i, None, e
        return
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        futures = {pool.submit(function, item): i for i, item in enumerate(items)}
        while futures:
            done, _ = wait(list(futures), timeout=_POLL, return_when=FIRST_COMPLETED)
            for future in done:
                i = futures.pop(future)
                error = future.exception()
                yield i, (None if error else future.result()), error
            _stop_if_asked()  # after the tasks that ended are handed on: they are kept
    except BaseException:
        # stopped (Ctrl-C): the tasks not started never start, and the caller stops the ones
        # under way rather than wait for them here
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
