"""The import graph of `crates/layerdiff-flow/src/`, and its circles.

    python scripts/import_graph.py [--dot]

Each file is read as text: the `crate::…` paths it names outside comments (and the items
`lib.rs` re-exports, resolved to where they live) make the edges between parts. A part is
`engine`, `onnx`, a root module (`output`, `inputs`…), or one module under `sides/`, `spec/` or
`verbs/`. Prints the edges, then every circle (exit code 1 when there is one)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "crates" / "layerdiff-flow" / "src"
FOLDERS = ("sides", "spec", "verbs")


def part_of(path: list[str]) -> str | None:
    """The part a module path (`["verbs", "reduce", "script"]`) belongs to."""
    if not path:
        return None
    if path[0] in FOLDERS:
        return "::".join(path[:2]) if len(path) > 1 else None
    return path[0]


def module_of(file: Path) -> list[str]:
    parts = list(file.relative_to(SRC).with_suffix("").parts)
    return [] if parts == ["lib"] else parts


def reexports() -> dict[str, list[str]]:
    """Names `lib.rs` re-exports, and the module path each comes from."""
    found: dict[str, list[str]] = {}
    text = (SRC / "lib.rs").read_text()
    for source, names in re.findall(r"pub use ([\w:]+)::\{?([^;}]*)\}?;", text):
        for name in re.split(r"\s*,\s*", names.strip()):
            name = name.strip()
            if name and name != "self":
                found[name] = source.split("::")
    return found


def edges() -> dict[str, set[str]]:
    exported = reexports()
    graph: dict[str, set[str]] = {}
    for file in sorted(SRC.rglob("*.rs")):
        here = part_of(module_of(file))
        if here is None:
            continue
        code = "\n".join(
            line.split("//")[0] for line in file.read_text().splitlines()
        )  # comments and doc comments say nothing about imports
        targets: set[str] = set()
        for path in re.findall(r"crate::((?:\w+::)*\w+)", code):
            segments = path.split("::")
            if segments[0] in exported:
                segments = exported[segments[0]]
            target = part_of(segments)
            if target and target not in ("Error", "Result"):
                targets.add(target)
        for group in re.findall(r"crate::\{([^}]*)\}", code):
            for name in re.split(r"[\s,]+", group):
                if name in exported:
                    target = part_of(exported[name])
                    if target:
                        targets.add(target)
        graph.setdefault(here, set()).update(t for t in targets if t != here and t != "error")
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one part."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def main() -> int:
    graph = edges()
    if "--dot" in sys.argv:
        print("digraph flow {")
        for a in sorted(graph):
            for b in sorted(graph[a]):
                print(f'  "{a}" -> "{b}";')
        print("}")
        return 0
    for a in sorted(graph):
        print(f"{a} -> {', '.join(sorted(graph[a])) or '(nothing)'}")
    found = circles(graph)
    for group in found:
        print("circle:", " <-> ".join(group))
    if not found:
        print("no circle")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
