"""The peers `make bench` measures layerdiff beside, each in a virtualenv of its own, installed as
its users install it, so that nothing of layerdiff's environment (PyTorch above all, which
Polygraphy imports when it finds it) is in its time: under target/bench/peers/NAME, made once
and made again when its requirements change or its making did not finish.

    python benches/peers.py [NAME...]    # makes them now and prints each one's python
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "target" / "bench" / "peers"

# Each peer's requirements, as its users install it. Polygraphy: its own package and the
# runtime its `--onnxrt` runs (ONNX Runtime, the release layerdiff loads), numpy, and onnx,
# which `--onnx-outputs mark all` needs to mark every value an output.
PEERS = {
    "polygraphy": ["polygraphy==0.53.6", "onnxruntime==1.31.1", "onnx==1.23.2", "numpy==2.4.6"],
}


def python_of(name: str) -> Path:
    """The peer's interpreter, its virtualenv made first where it is missing or was made for
    other requirements. It is made where it stays (a virtualenv cannot move: its scripts name
    its interpreter), and its requirements file is written last, so a folder without it is
    one whose making did not finish, made again."""
    folder = FOLDER / name
    wanted = "\n".join(PEERS[name]) + "\n"
    stamp = folder / "requirements.txt"
    python = folder / "bin" / "python"
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    shutil.rmtree(folder, ignore_errors=True)
    FOLDER.mkdir(parents=True, exist_ok=True)
    print(f"installing {name}'s environment: {', '.join(PEERS[name])}", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *PEERS[name]], check=True)
    stamp.write_text(wanted)
    return python


def packages_of(name: str) -> list[str]:
    """What the peer's environment holds, `package==version` each: what the bench says it ran."""
    frozen = subprocess.run(
        [str(python_of(name)), "-m", "pip", "freeze"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return [line for line in frozen.stdout.split() if "==" in line]


if __name__ == "__main__":
    for peer in sys.argv[1:] or list(PEERS):
        print(f"{peer}: {python_of(peer)}")
