"""The peers `make bench` measures layerdiff beside, each in a virtualenv of its own holding
what its users install and nothing of layerdiff's (PyTorch above all, which Polygraphy imports
when it finds it; layerdiff itself, which the predecessor has no use for): under
target/bench/peers/NAME, made once and made again when its requirements change or its making
did not finish.

Polygraphy is installed by pip. The predecessor needs PyTorch, whose PyPI wheels are gigabytes:
its environment holds the very distributions its README installs (torch, torchvision, onnx,
onnxruntime, numpy) and what they require, as layerdiff's environment holds them, each linked
into its own site-packages (the files pip would write, the same releases PyTorch runs in
layerdiff's runs), and nothing else.

    python benches/peers.py [NAME...]    # makes them now and prints each one's python
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "target" / "bench" / "peers"

# Each peer's requirements, as its users install it. Polygraphy: its own package and the
# runtime its `--onnxrt` runs (ONNX Runtime, the release layerdiff loads), numpy, and onnx,
# which `--onnx-outputs mark all` needs to mark every value an output.
PEERS = {
    "polygraphy": ["polygraphy==0.53.6", "onnxruntime==1.31.1", "onnx==1.23.2", "numpy==2.4.6"],
}
# Peers linked from layerdiff's environment (see the module's words): their top requirements.
# The predecessor's README installs PyTorch, torchvision, ONNX, ONNX Runtime and numpy.
LINKED = {
    "predecessor": ["torch", "torchvision", "onnx", "onnxruntime", "numpy"],
}


def requirements_of(name: str) -> list[str]:
    """What the peer's environment is made of: pip's requirements, or the linked
    distributions, each `name==version` as layerdiff's environment holds it."""
    if name in PEERS:
        return PEERS[name]
    return [f"{d.metadata['Name']}=={d.version}" for d in closure(LINKED[name])]


def closure(names: list[str]) -> list[importlib.metadata.Distribution]:
    """The installed distributions `names` need, theirs included (markers read for this
    machine, a requirement's extras followed), each once, sorted by name."""
    found: dict[str, importlib.metadata.Distribution] = {}
    wanted = [(Requirement(n), "") for n in names]
    while wanted:
        requirement, extra = wanted.pop()
        if requirement.marker and not requirement.marker.evaluate({"extra": extra}):
            continue
        key = canonicalize_name(requirement.name)
        dist = found.get(key)
        if dist is None:
            try:
                dist = importlib.metadata.distribution(requirement.name)
            except importlib.metadata.PackageNotFoundError:
                continue  # an optional requirement this environment does not hold either
            found[key] = dist
            extras = [""]
        else:
            extras = []
        extras += sorted(requirement.extras)
        for needed in dist.requires or []:
            for wanted_extra in extras:
                wanted.append((Requirement(needed), wanted_extra))
    return sorted(found.values(), key=lambda d: canonicalize_name(d.metadata["Name"]))


def link(folder: Path, names: list[str]) -> None:
    """Links each file and folder at the top of the distributions `names` need into the
    virtualenv `folder`'s site-packages."""
    (site,) = (folder / "lib").glob("python*/site-packages")
    for dist in closure(names):
        for file in dist.files or []:
            top = Path(file).parts[0]
            if top in ("..", "__pycache__") or (site / top).exists():
                continue
            (site / top).symlink_to(Path(dist.locate_file(top)).resolve())


def python_of(name: str) -> Path:
    """The peer's interpreter, its virtualenv made first where it is missing or was made for
    other requirements. It is made where it stays (a virtualenv cannot move: its scripts name
    its interpreter), and its requirements file is written last, so a folder without it is
    one whose making did not finish, made again."""
    folder = FOLDER / name
    wanted = "\n".join(requirements_of(name)) + "\n"
    stamp = folder / "requirements.txt"
    python = folder / "bin" / "python"
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    shutil.rmtree(folder, ignore_errors=True)
    FOLDER.mkdir(parents=True, exist_ok=True)
    print(f"making {name}'s environment: {wanted.split()}", file=sys.stderr)
    # a linked peer's environment holds no pip of its own: every distribution in it is linked
    bare = [] if name in PEERS else ["--without-pip"]
    subprocess.run([sys.executable, "-m", "venv", *bare, str(folder)], check=True)
    if name in PEERS:
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *PEERS[name]], check=True)
    else:
        link(folder, LINKED[name])
    stamp.write_text(wanted)
    return python


def packages_of(name: str) -> list[str]:
    """What the peer's environment holds, `package==version` each: what the bench says it ran."""
    listed = subprocess.run(
        [str(python_of(name)), "-c", LIST],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return sorted(listed.stdout.split(), key=str.lower)


# What a peer's interpreter prints of its environment, `name==version` each.
LIST = (
    "import importlib.metadata as m\n"
    "for d in m.distributions(): print(f\"{d.metadata['Name']}=={d.version}\")"
)


if __name__ == "__main__":
    for peer in sys.argv[1:] or [*PEERS, *LINKED]:
        print(f"{peer}: {python_of(peer)}")
