"""The project's import graph, function-local imports included: which of its modules
(``posenc.*`` under ``src/``, ``analysis.*``, ``pipelines.*``) imports which.

    python -m tests.imports          # the edge count and every circle

``graph()`` reads the sources with ``ast`` (nothing is imported), so an import inside a
function counts as much as one at the top: hiding a circle in a function does not break it.
``circles()`` is the strongly connected components of more than one module (Tarjan's
algorithm), each a set of modules that reach one another.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = {"posenc": REPO / "src" / "posenc", "analysis": REPO / "analysis", "pipelines": REPO / "pipelines"}


def modules(roots: dict[str, Path] = ROOTS) -> dict[str, Path]:
    """{dotted name: file} of every module under ``roots`` ({top-level name: its folder}; a
    package by its __init__)."""
    out = {}
    for top, root in roots.items():
        for path in sorted(root.rglob("*.py")):
            parts = [top, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The project module ``name`` is, or is in (``a.b.c`` -> ``a.b`` when c is a name in it)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def graph(roots: dict[str, Path] = ROOTS) -> dict[str, set[str]]:
    """{module: the project modules it imports anywhere in its text}, itself left out."""
    known = modules(roots)
    edges: dict[str, set[str]] = {m: set() for m in known}
    for mod, path in known.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names] or [base]
            for t in targets:
                r = _resolve(t, known)
                if r and r != mod and not mod.startswith(r + "."):  # a package's own __init__ is not an edge
                    edges[mod].add(r)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted, in name order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(1000, 10 * len(edges)))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def main() -> int:
    edges = graph()
    found = circles(edges)
    print(f"{len(edges)} modules, {sum(map(len, edges.values()))} import edges, {len(found)} circle(s)")
    for c in found:
        inner = sorted(f"{a} -> {b}" for a in c for b in edges[a] if b in c)
        print("  circle: " + ", ".join(c) + "\n    " + "\n    ".join(inner))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
