"""The house's shape, measured: import circles, imports that point up the layers, local imports
and the longest modules.

    python benchmarks/layers.py            # this checkout
    python benchmarks/layers.py --root DIR # another checkout (say, a worktree of an older commit)

The layers are read from pyproject.toml's import-linter contract (the one the test suite
checks), top to bottom; a module belongs to the deepest layer that names it or a package
above it. An import "points up" when it goes from a lower layer to a higher one, or between
two layers marked independent (`a | b`). Circles and upward imports are counted twice: at run
time (imports made only for type checking left out: they cost nothing when the code runs) and
at type level (those included: the words a module names for mypy must not come from above
either). The contract's own `ignore_imports` are counted and listed too, as the exceptions
they are. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import ast
import sys
import tomllib
from pathlib import Path

PACKAGES = ("engine", "cockpit")


def layers(pyproject: Path) -> tuple[list[list[str]], list[bool], list[str]]:
    """The layers, top first: each a list of module names and whether they are independent."""
    config = tomllib.loads(pyproject.read_text()).get("tool", {}).get("importlinter", {})
    contract = next(c for c in config.get("contracts", []) if c.get("type") == "layers")
    names, independent = [], []
    for layer in contract["layers"]:
        sep = "|" if "|" in layer else ":"
        names.append([m.strip() for m in layer.split(sep)])
        independent.append(sep == "|")
    return names, independent, list(contract.get("ignore_imports", []))


def placement(module: str, names: list[list[str]]) -> tuple[int, str] | None:
    """(layer index, the name it falls under) by the longest matching prefix."""
    best = None
    for i, layer in enumerate(names):
        for name in layer:
            if module == name or module.startswith(name + "."):
                if best is None or len(name) > len(best[1]):
                    best = (i, name)
    return best


def circles(graph) -> list[list[str]]:
    """Strongly connected components of two or more modules (Tarjan, iterative)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def upward(graph, names: list[list[str]], independent: list[bool]) -> list[str]:
    """Each import that goes up the layers or across independent ones, with its lines."""
    out = []
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            a, b = placement(importer, names), placement(imported, names)
            if a is None or b is None:
                continue
            if b[0] < a[0] or (a[0] == b[0] and independent[a[0]] and a[1] != b[1]):
                lines = sorted({d["line_number"] for d in graph.get_import_details(
                    importer=importer, imported=imported)})
                out.append(f"{importer} -> {imported} (line {', '.join(map(str, lines))})")
    return out


def local_imports(root: Path) -> tuple[list[str], list[str]]:
    """Imports of engine/cockpit modules inside a function: all, and those with no comment on
    their line or the line above saying why they are deferred."""
    found, unexplained = [], []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            lines = path.read_text().splitlines()
            tree = ast.parse("\n".join(lines))
            for func in ast.walk(tree):
                if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(func):
                    if isinstance(node, ast.ImportFrom):
                        targets = [node.module or ""] if node.level == 0 else [package]
                    elif isinstance(node, ast.Import):
                        targets = [a.name for a in node.names]
                    else:
                        continue
                    if not any(t.split(".")[0] in PACKAGES for t in targets):
                        continue
                    where = f"{path.relative_to(root)}:{node.lineno}"
                    if where in found:
                        continue
                    found.append(where)
                    said = lines[node.lineno - 1] + (lines[node.lineno - 2] if node.lineno > 1 else "")
                    if "#" not in said:
                        unexplained.append(where)
    return found, unexplained


def longest(root: Path, count: int = 10) -> list[tuple[int, str]]:
    sizes = [(len(p.read_text().splitlines()), str(p.relative_to(root)))
             for package in PACKAGES for p in (root / package).rglob("*.py")]
    return sorted(sizes, reverse=True)[:count]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the checkout to measure (default: this one)")
    parser.add_argument("--layers-from", type=Path, default=None,
                        help="the pyproject.toml whose layers to use (default: this checkout's)")
    args = parser.parse_args(argv)
    try:
        import grimp
    except ImportError:
        print("benchmarks/layers.py needs grimp: pip install grimp (in the test extra)", file=sys.stderr)
        return 2
    root = args.root.resolve()
    sys.path.insert(0, str(root))
    names, independent, ignored = layers(args.layers_from or Path(__file__).resolve().parent.parent
                                         / "pyproject.toml")
    for level, typed in (("at run time", False), ("at type level", True)):
        graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=not typed,
                                  cache_dir=None)
        found = circles(graph)
        print(f"import circles {level}: {len(found)}")
        for component in found:
            print("   ", " <-> ".join(component))

        up = upward(graph, names, independent)
        print(f"imports pointing up the layers {level}: {len(up)}")
        for line in up:
            print("   ", line)
        if ignored:
            print(f"  of which the contract lets through, each with its reason: {len(ignored)}")

    everywhere, unexplained = local_imports(root)
    print(f"function-local imports of engine/cockpit: {len(everywhere)}, "
          f"{len(unexplained)} with no comment saying why")
    for where in unexplained:
        print("   ", where)

    print("longest modules:")
    for size, path in longest(root):
        print(f"    {size:5d}  {path}")
    over = [(s, p) for s, p in longest(root, 10_000) if p.startswith("engine/run/") and s > 400]
    print(f"engine/run files over 400 lines: {len(over)}"
          + "".join(f"\n    {s:5d}  {p}" for s, p in over))
    return 0


if __name__ == "__main__":
    sys.exit(main())
