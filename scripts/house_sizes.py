"""Files and functions longer than the house allows (docs/design.md, "Keeping it readable"):
source files over 500 lines, functions over 120, in Rust and Python. Generated code is left out.

    python scripts/house_sizes.py [--functions N] [--files N]
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("crates", "python", "scripts", "tests", "benches", "fuzz")
_RUST_FN = re.compile(
    r"\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?fn\s+(\w+)"
)


def sources() -> list[Path]:
    found = []
    for folder in FOLDERS:
        for pattern in ("*.rs", "*.py"):
            found += (ROOT / folder).rglob(pattern)
    skipped = ("generated", "/target/", "/.venv/")
    return sorted(p for p in found if not any(s in str(p) for s in skipped))


def long_files(limit: int = 500) -> list[tuple[str, int]]:
    """(path, lines) of each source file over `limit` lines."""
    counted = [(str(p.relative_to(ROOT)), len(p.read_text().splitlines())) for p in sources()]
    return [(p, n) for p, n in counted if n > limit]


def _rust_functions(text: str):
    """(name, first line, lines) of each Rust function with a body, by brace depth (strings and
    line comments left out; enough for this house, which has no braces in char literals)."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        match = _RUST_FN.match(line)
        if not match or line.rstrip().endswith(";"):
            continue
        depth, started = 0, False
        for j in range(i, len(lines)):
            code = re.sub(r'"(\\.|[^"\\])*"', '""', lines[j])
            code = re.sub(r"//.*", "", code)
            for ch in code:
                if ch == "{":
                    depth, started = depth + 1, True
                elif ch == "}":
                    depth -= 1
            if started and depth == 0:
                yield match.group(1), i + 1, j - i + 1
                break
            if not started and code.strip().endswith(";"):
                break


def long_functions(limit: int = 120) -> list[tuple[str, str, int]]:
    """(path, function, lines) of each function over `limit` lines."""
    found = []
    for path in sources():
        text, name = path.read_text(), str(path.relative_to(ROOT))
        if path.suffix == ".rs":
            found += [(name, f, n) for f, _, n in _rust_functions(text) if n > limit]
        else:
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    if n > limit:
                        found.append((name, node.name, n))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", type=int, default=120)
    parser.add_argument("--files", type=int, default=500)
    args = parser.parse_args()
    for path, n in long_files(args.files):
        print(f"{n:5} lines  {path}")
    for path, name, n in long_functions(args.functions):
        print(f"{n:5} lines  {path}: {name}")


if __name__ == "__main__":
    main()
