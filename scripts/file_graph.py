"""File-level import graph of every crate under crates/: which source file names an item of
which other, and the circles among them (a file and its own submodules left out: a parent
declares its children, and they may read its items)."""

from __future__ import annotations

import re
from pathlib import Path

CRATES = Path(__file__).resolve().parent.parent / "crates"
USE = re.compile(r"(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);")


def module_files(src: Path) -> dict[tuple[str, ...], Path]:
    """Each module's path in its crate (`("compare", "block")`) → its file; test modules out."""
    found = {}
    for file in src.rglob("*.rs"):
        parts = file.relative_to(src).with_suffix("").parts
        if "tests" in parts or parts[-1] == "tests":
            continue
        if parts[-1] in ("lib", "main") and len(parts) == 1:
            parts = ()
        elif parts[-1] == "mod":
            parts = parts[:-1]
        found[tuple(parts)] = file
    return found


def code_of(file: Path) -> str:
    """The file without comments and without its `#[cfg(test)]` module, when inline."""
    text = "\n".join(line.split("//")[0] for line in file.read_text().splitlines())
    at = text.find("#[cfg(test)]\nmod tests {")
    return text if at < 0 else text[:at]


def flatten(tree: str) -> list[tuple[str, list[str]]]:
    """A use tree (`a::{b::C, D as E}`) → (the name it brings in, its path) each."""
    tree = re.sub(r"\s+", "", tree)
    out = []
    brace = tree.find("{")
    if brace < 0:
        path = tree.split("::")
        name = path[-1].split("as")[-1] if "as" in path[-1] else path[-1]
        return [(name, [p.split("as")[0] if "as" in p else p for p in path])]
    head = [p for p in tree[:brace].split("::") if p]
    depth, start, body = 0, 0, tree[brace + 1 : tree.rfind("}")]
    parts = []
    for i, c in enumerate(body):
        depth += c == "{"
        depth -= c == "}"
        if c == "," and depth == 0:
            parts.append(body[start:i])
            start = i + 1
    parts.append(body[start:])
    for part in filter(None, parts):
        for name, path in flatten(part):
            out.append((name, head + path))
    return out


class Crate:
    def __init__(self, src: Path):
        self.modules = module_files(src)
        self.uses: dict[tuple[str, ...], dict[str, list[str]]] = {}
        for module, file in self.modules.items():
            names = {}
            for tree in USE.findall(code_of(file)):
                for name, path in flatten(tree):
                    if name not in ("*", "self"):
                        names[name] = path
            self.uses[module] = names

    def absolute(self, module: tuple[str, ...], path: list[str]) -> list[str] | None:
        """`path` as named in `module` (`super::x`, `crate::y`, `self::z`, a child's name)
        from the crate's root; `None` for another crate's."""
        if path[0] == "crate":
            return path[1:]
        if path[0] in ("super", "self"):
            base = list(module)
            while path and path[0] in ("super", "self"):
                if path[0] == "super":
                    base = base[:-1]
                path = path[1:]
            return base + path
        if tuple(module) + (path[0],) in self.modules:
            return list(module) + path
        return None

    def file_of(self, path: list[str], depth: int = 0) -> tuple[str, ...] | None:
        """The module whose file holds what `path` (from the root) names."""
        at: tuple[str, ...] = ()
        for i, segment in enumerate(path):
            if at + (segment,) in self.modules:
                at = at + (segment,)
                continue
            # an item of `at`, or a name `at` imports from elsewhere
            source = self.uses.get(at, {}).get(segment)
            if source and depth < 8:
                resolved = self.absolute(at, source)
                if resolved:
                    return self.file_of(resolved + path[i + 1 :], depth + 1)
            return at
        return at

    def edges(self) -> dict[tuple[str, ...], set[tuple[str, ...]]]:
        graph: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
        pattern = re.compile(r"\b((?:crate|super|self)(?:::\w+)+)(?!\w|::)")
        for module, file in self.modules.items():
            code = code_of(file)
            named = [p.split("::") for p in pattern.findall(code)]
            named += [path for tree in USE.findall(code) for _, path in flatten(tree)]
            targets = set()
            for path in named:
                resolved = self.absolute(module, path)
                if resolved is None:
                    continue
                target = self.file_of(resolved)
                if target is None or target[: len(module)] == module:
                    continue  # itself, or one of its own submodules
                if module[: len(target)] == target:
                    continue  # one of its parents
                targets.add(target)
            graph[module] = targets
        return graph


def file_circles() -> list[list[str]]:
    """Every circle of files, each file named from `crates/`."""
    from import_graph import circles

    found = []
    for src in sorted(CRATES.glob("*/src")):
        crate = Crate(src)
        graph = {"::".join(m): {"::".join(t) for t in ts} for m, ts in crate.edges().items()}
        for group in circles(graph):
            found.append(
                [
                    str(crate.modules[tuple(g.split("::")) if g else ()].relative_to(CRATES))
                    for g in group
                ]
            )
    return found


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    for group in file_circles():
        print("circle:", " <-> ".join(group))
