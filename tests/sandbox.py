"""A folder that holds one distribution and what it depends on, linked from this environment:
run `python -S` with it as PYTHONPATH and nothing else is importable, as in a fresh virtualenv
where only those were installed."""

from __future__ import annotations

import importlib.metadata as metadata
import os
import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement


def closure(*names: str) -> set[str]:
    """The distributions `names` need to run (their requirements without extras, whose markers
    hold here), themselves included."""
    needed: set[str] = set()
    todo = list(names)
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in needed:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # a marker-gated requirement not installed here
        needed.add(name)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return needed


def folder_of(tmp_path: Path, *names: str) -> Path:
    """A folder of links to the top-level packages and modules of `names`' closure."""
    folder = tmp_path / "only"
    folder.mkdir(exist_ok=True)
    for name in closure(*names):
        dist = metadata.distribution(name)
        for file in dist.files or []:
            top = file.parts[0]
            if top.endswith((".dist-info", ".data")) or top in ("..", "__pycache__"):
                continue
            source = Path(dist.locate_file(top))
            link = folder / top
            if source.exists() and not link.exists():
                link.symlink_to(source)
    return folder


def run_in(folder: Path, packages: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -S ARGS` in `folder` with only `packages` importable beyond the standard
    library."""
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(packages)}
    return subprocess.run([sys.executable, "-S", *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
