"""The house's shape, measured: import circles, imports that point up the layers, local imports,
the longest modules and the folds of the event stream.

    python benchmarks/layers.py            # this checkout
    python benchmarks/layers.py --root DIR # another checkout (say, a worktree of an older commit)

The layers are read from pyproject.toml's import-linter contract (the one the test suite
checks), top to bottom; a module belongs to the deepest layer that names it or a package
above it. An import "points up" when it goes from a lower layer to a higher one, or between
two layers marked independent (`a | b`). Circles and upward imports are counted twice: at run
time (imports made only for type checking left out: they cost nothing when the code runs) and
at type level (those included: the words a module names for mypy must not come from above
either). The contract's own `ignore_imports` are counted and listed too, as the exceptions
they are. A fold of the event stream is a function that branches on four or more event types
(an event's "type" compared with their names) or a table of handlers keyed by them; those of the
run's read model (engine.record.state and the accounting it folds with) are the one fold, the
rest are counted and listed. A flag branch is a test of how an attempt's process started --
a launch's is_command, distributed or group, an attempt end's command -- outside the launchers
(engine/run/launchers/), which are where those differences live. Prints figures; asserts nothing.
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


# The run's read model: engine.record.state, and the accounting and curves it is folded with.
READ_MODEL = ("engine/record/state.py", "engine/record/stats.py", "engine/record/goodput.py",
              "engine/record/curves.py")


def event_types(root: Path) -> set[str]:
    """The event types EVENT_FIELDS names (engine/event_types.py, or where it was before)."""
    for rel in ("engine/event_types.py", "engine/record/event_types.py"):
        path = root / rel
        for node in ast.walk(ast.parse(path.read_text())) if path.exists() else ():
            target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
            if isinstance(target, ast.Name) and target.id == "EVENT_FIELDS" and isinstance(node.value, ast.Dict):
                return {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
    return set()


def _reads_type(node: ast.AST, names: set[str]) -> bool:
    """e["type"], e.get("type"), or a name bound to one of them."""
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "type"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "type"
    return isinstance(node, ast.Name) and node.id in names


def _strings(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def _type_names(func: ast.AST) -> set[str]:
    """The names a function binds to an event's type: kind = e["type"]; t, kind = ..., e.get("type")."""
    names = set()
    for n in ast.walk(func):
        if not isinstance(n, ast.Assign):
            continue
        for target in n.targets:
            pairs = zip(target.elts, n.value.elts) if isinstance(target, ast.Tuple) and isinstance(
                n.value, ast.Tuple) else [(target, n.value)]
            names |= {t.id for t, v in pairs if isinstance(t, ast.Name) and _reads_type(v, set())}
    return names


def _keeps(func: ast.AST) -> bool:
    """Whether a function keeps what it reads from one event for the next: it loops over
    events, or it is a method that sets its object's attributes (not a formatter of one event)."""
    return any(isinstance(n, (ast.For, ast.While)) and any(isinstance(c, ast.Compare) for c in ast.walk(n))
               for n in ast.walk(func)) or any(
        isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
        for n in ast.walk(func) if isinstance(n, (ast.Assign, ast.AugAssign))
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))


def folds(root: Path, least: int = 4) -> tuple[list[str], list[str]]:
    """Where the event stream is folded, each 'path:line name (n event types)': in the read
    model, and elsewhere."""
    types = event_types(root)
    inside, outside = [], []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = str(path.relative_to(root))
            if path.name in ("event_types.py", "emit.py"):   # the vocabulary itself
                continue
            tree = ast.parse(path.read_text())
            found = []
            for node in ast.walk(tree):
                if isinstance(node, ast.Dict) and node.keys:   # a table of handlers, one per event type
                    keys = set().union(*(_strings(k) for k in node.keys if k is not None))
                    if len(keys & types) >= least and keys <= types and all(
                            isinstance(v, (ast.Name, ast.Lambda, ast.Call, ast.Attribute)) for v in node.values):
                        found.append((node.lineno, "handlers", len(keys)))
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not _keeps(node):
                    continue
                names, seen = _type_names(node), set()
                for n in ast.walk(node):
                    if isinstance(n, ast.Compare) and _reads_type(n.left, names):
                        for c in n.comparators:
                            seen |= _strings(c) & types
                if len(seen) >= least:
                    found.append((node.lineno, node.name, len(seen)))
            for line, name, n in found:
                (inside if rel in READ_MODEL else outside).append(f"{rel}:{line} {name} ({n} event types)")
    return inside, outside


# What a launcher decides, as the flags that once said it (engine.run.launch.Launch's and
# engine.run.crashes.AttemptEnd's), on whatever holds a launch or an attempt's end.
FLAGS = {"is_command", "distributed", "group", "command"}


def flag_branches(root: Path) -> list[str]:
    """Tests (if, elif, a conditional expression, and/or) of a launch's or an attempt end's
    flags outside engine/run/launchers/: 'file:line expression'."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith("engine/run/launchers/"):
                continue
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                tests = [node.test] if isinstance(node, (ast.If, ast.IfExp, ast.While)) else \
                    node.values if isinstance(node, ast.BoolOp) else []
                for test in tests:
                    for sub in ast.walk(test):
                        if isinstance(sub, ast.Attribute) and sub.attr in FLAGS:
                            holder = ast.unparse(sub.value)
                            if holder.split(".")[-1] in ("launch", "end", "_launch", "self._launch"):
                                found.append(f"{rel}:{sub.lineno} {ast.unparse(sub)}")
    return sorted(set(found))


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

    inside, outside = folds(root)
    print(f"folds of the event stream: {len(inside)} in the read model, {len(outside)} elsewhere")
    for where in outside:
        print("   ", where)

    branches = flag_branches(root)
    print(f"flag branches outside the launchers: {len(branches)}")
    for where in branches:
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
