"""The package's import graph: no circles, read from the source (imports inside functions count too: a lazy import
hides a circle from the interpreter, not from the reader), and benchmarks that share a harness instead of
importing each other."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vit_flowers"


def _unit(module: str) -> str | None:
    """The node of ``module`` ("vit_flowers.x.y"): every module is its own, a sub-package's too (a circle between
    two modules of one sub-package is a circle all the same); None for the package itself."""
    parts = module.split(".")
    if parts[0] != "vit_flowers" or len(parts) == 1:
        return None
    return module


def _imported(path: Path) -> set[str]:
    """Every vit_flowers module (or name in one) that ``path`` imports, anywhere in the file."""
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    if path.name == "__init__.py":
        module = package
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)  # `from . import report`
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith("vit_flowers")}


def _graph() -> dict[str, set[str]]:
    """Unit -> the units it imports (see :func:`_unit`), over every module of the package."""
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
               for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        unit = _unit(name)
        if unit is None:
            continue
        targets = {_unit(t) for t in _imported(path) if t in modules}
        graph.setdefault(unit, set()).update(t for t in targets if t is not None and t != unit)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (its units in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(unit: str) -> list[str] | None:
        state[unit] = 1
        path.append(unit)
        for target in sorted(graph.get(unit, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        state[unit] = 2
        path.pop()
        return None

    for unit in sorted(graph):
        if unit not in state and (found := visit(unit)):
            return found
    return None


def test_the_cycle_finder_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_package_has_no_import_circle():
    graph = _graph()
    assert {"vit_flowers.evaluate", "vit_flowers.models.vit", "vit_flowers.training.trainer"} <= set(graph)  # read
    cycle = _cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_sub_packages_never_import_a_root_module():
    # a sub-package is library: it imports none of the commands at the package root, nor cli.py (their shared
    # parts), nor the app's command; only that command and the __main__ files (which run a command) may
    graph = _graph()
    root = {f"vit_flowers.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem != "__init__"} | {"vit_flowers.app.command"}
    assert {"vit_flowers.cli", "vit_flowers.predict", "vit_flowers.explain", "vit_flowers.train"} <= root  # read
    library = {unit for unit in graph if unit not in root and not unit.endswith(".__main__")}  # packages too
    assert {"vit_flowers.app.engine", "vit_flowers.inference.predictions", "vit_flowers.training.trainer"} <= library
    for unit in sorted(library):
        assert not graph[unit] & root, f"{unit} imports the root module(s) {sorted(graph[unit] & root)}"


def test_the_benchmarks_share_a_harness_instead_of_importing_each_other():
    scripts = {p.stem for p in (ROOT / "benchmarks").glob("*.py")} - {"harness"}
    assert {"speed", "accuracy", "onnx_speed"} <= scripts
    for stem in sorted(scripts):
        tree = ast.parse((ROOT / "benchmarks" / f"{stem}.py").read_text(encoding="utf-8"))
        names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | {
            a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not names & scripts, f"benchmarks/{stem}.py imports the benchmark(s) {sorted(names & scripts)}"
        assert "sys.path.insert" not in ast.unparse(tree), f"benchmarks/{stem}.py edits sys.path itself"
