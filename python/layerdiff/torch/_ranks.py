"""Processes of one `torch.distributed` group on this machine: what a data-parallel side
(`torch:ddp=N`) and the collectives of `layerdiff ops` run in.

`run(task, payload, ranks, device)` starts `ranks` processes (spawned: a fresh interpreter
each, as `torchrun` gives), joins them in one group (gloo on the CPU, NCCL on CUDA, one GPU per
rank), and calls the module-level `task(rank, ranks, payload)` in each; it returns what each
rank's call returned, in rank order. The payload travels once, as a file; a model's classes
that live in a file rather than an importable module (a builder `path/to/file.py:build`) are
imported from that file in each process first.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.machinery
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from layerdiff import _layerdiff
from layerdiff._builders import import_file

# How often the wait for the ranks looks whether the command was asked to stop, in seconds.
_POLL = 0.2
# How long a collective may wait for the other ranks before the group gives up.
_TIMEOUT = datetime.timedelta(minutes=10)


class RankFailed(Exception):
    """A rank raised, or its process died: `rank`, and the error's last line (`why`)."""

    def __init__(self, rank: int, why: str):
        super().__init__(f"rank {rank}: {why}")
        self.rank, self.why = rank, why


def backend(device: str) -> str:
    """The group's backend for ranks on `device`'s type."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def check(device: str, ranks: int, spelling: str) -> None:
    """Refuses ranks this machine cannot hold: on CUDA, one GPU per rank (NCCL will not put two
    ranks on one device)."""
    if torch.device(device).type == "cuda" and torch.cuda.device_count() < ranks:
        raise _layerdiff.UsageError(
            f"`{spelling}`: {ranks} ranks on CUDA need {ranks} GPUs (one each, as NCCL "
            f"requires); PyTorch sees {torch.cuda.device_count()} here; run the ranks on the CPU "
            "(gloo) by leaving the device out"
        )
    if torch.device(device).type not in ("cpu", "cuda"):
        raise _layerdiff.UsageError(
            f"`{spelling}`: data-parallel ranks run on the CPU (gloo) or CUDA (NCCL), not "
            f"`{device}`"
        )


def threads(ranks: int) -> int:
    """The threads each rank computes with: this process's, shared out."""
    return max(1, torch.get_num_threads() // ranks)


@contextlib.contextmanager
def threads_of(ranks: int):
    """This process computing with a rank's threads (a CPU kernel's sums may be split by
    thread: one process on a rank's rows computes as the rank does only with as many)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads(ranks))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run(task, payload, ranks: int, device: str) -> list:
    """`task(rank, ranks, payload)` in each of `ranks` processes of one group (see the module
    docs); their results in rank order. A rank that fails raises `RankFailed`; a Ctrl-C or
    SIGTERM the command holds stops them all."""
    if os.environ.get(_IN_RANK):
        raise _layerdiff.UsageError(
            "layerdiff ran again as a rank started: the script that runs it defines the model's "
            'class and has no `if __name__ == "__main__":` guard, so each rank, importing the '
            "script for that class, runs it too; put what the script runs under that guard"
        )
    with tempfile.TemporaryDirectory(prefix="layerdiff-ranks-") as folder:
        files, scripted = _file_modules(payload)
        if scripted:
            _check_main()
        (Path(folder) / "modules.json").write_text(json.dumps(files))
        torch.save(payload, Path(folder) / "payload.pt")
        with _started(scripted):
            context = torch.multiprocessing.start_processes(
                _rank_main,
                args=(task, folder, ranks, backend(device), device, threads(ranks)),
                nprocs=ranks,
                join=False,
                start_method="spawn",
            )
        # PyTorch logs each rank it stops after another's failure: the failure says enough
        logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
        try:
            while not context.join(timeout=_POLL):
                signum = _layerdiff.interrupt_signal()
                if signum is not None:
                    raise KeyboardInterrupt(signum)
        except torch.multiprocessing.ProcessRaisedException as e:
            raise RankFailed(e.error_index, _last_line(str(e))) from None
        except torch.multiprocessing.ProcessExitedException as e:
            raise RankFailed(e.error_index, _death(e, folder, scripted)) from None
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.terminate()
        return [torch.load(Path(folder) / f"rank{r}.pt", weights_only=False) for r in range(ranks)]


def _rank_main(rank, task, folder, ranks, backend_name, device, count) -> None:
    """One rank: in the group, its task on the payload, its result saved for the caller."""
    import torch.distributed as dist

    # what the rank prints goes to a file of its own, read back where it dies
    err = os.open(Path(folder) / f"rank{rank}.err", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(err, 2)
    torch.set_num_threads(count)
    if torch.device(device).type == "cuda":
        torch.cuda.set_device(rank)
    store = Path(folder) / "store"
    dist.init_process_group(
        backend_name, init_method=f"file://{store}", rank=rank, world_size=ranks, timeout=_TIMEOUT
    )
    try:
        for name, file in json.loads((Path(folder) / "modules.json").read_text()):
            if name not in sys.modules:
                import_file(name, file)
        payload = torch.load(Path(folder) / "payload.pt", weights_only=False)
        result = task(rank, ranks, payload)
        torch.save(result, Path(folder) / f"rank{rank}.pt")
        # every rank done with the group before any leaves it: a rank whose peer's connections
        # close while its own last collective still reads from them aborts
        dist.barrier()
        _left_together(Path(folder), rank, ranks)
    except BaseException:
        dist.destroy_process_group()
        raise
    dist.destroy_process_group()
    # the result is saved: the rank ends here, without the interpreter's teardown, in which a
    # thread of the group's was now and then destroyed unjoined (std::terminate: "terminate
    # called without an active exception", SIGABRT; one run in 150 on two one-thread CPU ranks)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _left_together(folder: Path, rank: int, ranks: int) -> None:
    """Waits, through files rather than the group's connections, until every rank has passed
    the last barrier: only then does any rank close its connections (a peer still finishing
    the barrier reads from them)."""
    (folder / f"rank{rank}.left").touch()
    waited = 0.0
    while not all((folder / f"rank{r}.left").exists() for r in range(ranks)):
        if waited > _TIMEOUT.total_seconds():
            raise RuntimeError("the other ranks did not finish the last barrier")
        time.sleep(0.005)
        waited += 0.005


# Set in a rank's environment: layerdiff started again there is a script without a guard.
_IN_RANK = "LAYERDIFF_IN_RANK"


@contextlib.contextmanager
def _started(scripted: bool):
    """The ranks start with `_IN_RANK` set, and, unless the model's classes are the main
    script's (`scripted`), without importing that script, as spawned processes otherwise do: a
    script without an `if __name__ == "__main__":` guard would run again in each rank."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in vars(main)}
    # the ranks' C++ logging off: their stderr is what a rank that dies said last, and DDP's
    # reducer warns on every run that `find_unused_parameters` found nothing unused
    before = {k: os.environ.get(k) for k in (_IN_RANK, "TORCH_CPP_LOG_LEVEL")}
    os.environ.update({_IN_RANK: "1", "TORCH_CPP_LOG_LEVEL": "ERROR"})
    if not scripted:
        main.__dict__.pop("__file__", None)
        main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _file_modules(payload) -> tuple[list[tuple[str, str]], bool]:
    """The modules, by name and file, that the payload's modules' classes come from where a
    fresh process could not import them by name (a builder file loaded by its path), and
    whether a class is the main script's."""
    found, scripted = set(), False
    for item in payload.values() if isinstance(payload, dict) else [payload]:
        if isinstance(item, torch.nn.Module):
            for m in item.modules():
                name = type(m).__module__
                scripted |= name == "__main__"
                module = sys.modules.get(name)
                file = getattr(module, "__file__", None)
                top = name.split(".")[0]
                if file and name != "__main__" and not _findable(top):
                    found.add((name, os.path.abspath(file)))
    return sorted(found), scripted


def _check_main() -> None:
    """Refuses a model class the ranks cannot import: one defined interactively (a notebook,
    a script read from stdin), which has no file a fresh process could import it from."""
    file = getattr(sys.modules.get("__main__"), "__file__", None)
    if file is None or not Path(file).is_file():
        raise _layerdiff.UsageError(
            "the model's class is defined interactively (a notebook, or a script read from "
            f"{file or 'an interpreter'}): each rank is a fresh process, which imports the "
            "model's classes from their files; move the class into a module or a file of its own"
        )


def _findable(name: str) -> bool:
    """Whether a fresh process finds the top-level module `name` by name (on sys.path, or
    built in)."""
    if name in sys.builtin_module_names:
        return True
    return importlib.machinery.PathFinder.find_spec(name, sys.path) is not None


def _death(e, folder: str, scripted: bool) -> str:
    """How a rank's process died, in words: what it printed last, or what its exit says."""
    err = Path(folder) / f"rank{e.error_index}.err"
    how = f"its process died (exit code {e.exit_code})"
    if e.exit_code == -9:  # nothing it printed says why
        return (
            f"{how}: killed (SIGKILL), most often by the system for want of memory: each rank "
            "is a process of its own with its copy of the model; try fewer ranks"
        )
    said = _said(err)
    if said:
        return f"{how}: {said}"
    if not err.exists() and scripted:
        return (
            f"{how} before it started: importing the script that defines the model's class "
            "failed there (the error is above); run what the script does under "
            '`if __name__ == "__main__":`'
        )
    return how


def _said(path: Path) -> str:
    """The last lines a dead rank printed (its error, where it said one), joined."""
    try:
        lines = [x.strip() for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return " / ".join(lines[-3:])


def _last_line(text: str) -> str:
    """A child's traceback's last line: the error itself."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else text
