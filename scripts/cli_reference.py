"""Writes docs/cli.md from the command's own --help texts (run by `make docs`; a test checks
that the committed file is current)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

VERBS = [[], ["torch"], ["keras"], ["onnx"], ["reduce"], ["sweep"]]


def render() -> str:
    exe = Path(sys.executable).parent / "layerdiff"
    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1"}
    parts = ["# CLI reference\n", "Generated from `--help` by `make docs`; do not edit by hand.\n"]
    for verb in VERBS:
        text = subprocess.run(
            [str(exe), *verb, "--help"], capture_output=True, text=True, env=env
        ).stdout
        title = " ".join(["layerdiff", *verb])
        parts.append(f"## `{title}`\n\n```text\n{text.rstrip()}\n```\n")
    return "\n".join(parts)


if __name__ == "__main__":
    target = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
    target.write_text(render())
    print(f"wrote {target}")
