"""The package's import graph, read from the source (ast): no cycles, lazy imports included, and no module
importing another module's private name."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "quantlab"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}
PACKAGES = {module_name(p) for p in PACKAGE.rglob("__init__.py")}


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """Nodes under ``if TYPE_CHECKING:``, which never run."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(sub) for sub in ast.walk(node))
    return skip


def imports_of(name: str) -> list[tuple[str, str | None]]:
    """(imported module, imported name or None) for every import statement of module ``name``, at module level or
    inside a function."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = name if path.name == "__init__.py" else name.rpartition(".")[0]
    skip = _type_checking_nodes(tree)
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.split(".")[0] == "quantlab"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: len(here.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "quantlab":
                found += [(target, a.name) for a in node.names]
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules importing it runs: the target, a submodule named in ``from pkg import mod``, and
    every package ``__init__`` on the way (importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__``)."""
    graph: dict[str, set[str]] = {}
    for name in MODULES:
        edges: set[str] = set()
        for target, imported in imports_of(name):
            if imported is not None and f"{target}.{imported}" in MODULES:
                edges.add(f"{target}.{imported}")
            if target in MODULES:
                edges.add(target)
            parts = target.split(".")
            edges.update(".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in PACKAGES)
        # a module's own ancestors are already running when it is imported
        graph[name] = {e for e in edges if e != name and not name.startswith(e + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def describe(component: list[str], graph: dict[str, set[str]]) -> str:
    members = set(component)
    return "; ".join(f"{a} -> {b}" for a in component for b in sorted(graph[a] & members))


def test_the_import_graph_sees_lazy_imports_and_package_inits() -> None:
    graph = import_graph()
    assert "quantlab.quant.formats.rtn" in graph["quantlab.quant.formats"]  # from . import rtn
    assert "quantlab.quant" in graph["quantlab.engine.memory"]  # importing quantlab.quant.linear runs quant/__init__
    assert "quantlab.report" in graph["quantlab.api"]  # a lazy import inside run_recipe
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles: " + " | ".join(describe(c, graph) for c in found)


def test_no_module_imports_another_modules_private_name() -> None:
    private = [f"{name} imports {imported} from {target}" for name in MODULES for target, imported in imports_of(name)
               if imported and imported.startswith("_") and not imported.startswith("__") and target != name]
    assert not private, private


def test_the_library_never_imports_the_command_line() -> None:
    users = sorted(name for name in MODULES for target, _ in imports_of(name) if target == "quantlab.cli")
    assert users == [], users


def test_the_layout_has_its_packages() -> None:
    for package in ("engine", "eval", "eval.perplexity", "measurements", "quant", "quant.formats", "quant.tensors",
                    "quant.kernels", "quant.calibrate", "quant.mixed", "quant.io", "run", "kv", "estimate", "report", "native"):
        assert f"quantlab.{package}" in PACKAGES, package


# The declared layer map: each part of the package and its tier. An import (at module level, inside a function, or
# under TYPE_CHECKING) may only go to a part of a lower tier: parts of one tier never import each other, so no loop
# between packages can form. Shared modules (errors, files, data, ...) are tier 0.
LAYERS: dict[str, int] = {
    **dict.fromkeys(["quantlab", "errors", "registry", "dtypes", "paths", "lazy", "validation", "environment",
                     "entrypoints", "files", "progress", "corpus", "data"], 0),
    **dict.fromkeys(["native", "fidelity", "models"], 1),
    "quant": 2,
    "kv": 3,
    **dict.fromkeys(["eval", "engine", "estimate"], 4),
    "measurements": 5,
    "records": 6,
    **dict.fromkeys(["run", "report"], 7),
    **dict.fromkeys(["api", "starter", "extend", "plan"], 8),  # plan: joint weights + KV choice, measured through run
    "cli": 9,
    "reference": 10,  # the documentation's generated pages: reads every registry and the CLI's parser
}


def part(module: str) -> str:
    """The layer-map part a module belongs to: its top-level package or module under quantlab."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def every_import() -> list[tuple[str, str]]:
    """(importing module, imported module) for every quantlab import, TYPE_CHECKING ones included."""
    found = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [(name, a.name) for a in node.names if a.name.split(".")[0] == "quantlab"]
            elif isinstance(node, ast.ImportFrom):
                base = here.split(".")[: len(here.split(".")) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module or ""
                if target.split(".")[0] != "quantlab":
                    continue
                for a in node.names:  # ``from quantlab import run`` names a part: count the part
                    found.append((name, f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target))
    return found


def test_every_part_of_the_package_is_on_the_layer_map() -> None:
    missing = sorted({part(m) for m in MODULES} - set(LAYERS))
    assert not missing, f"add to LAYERS: {missing}"


def test_every_import_points_down_the_layer_map_lazy_and_type_checking_ones_included() -> None:
    upward = sorted({f"{a} -> {b} ({part(a)} tier {LAYERS[part(a)]} -> {part(b)} tier {LAYERS[part(b)]})"
                     for a, b in every_import() if part(a) != part(b) and LAYERS[part(b)] >= LAYERS[part(a)]
                     and LAYERS[part(a)] > 0})  # the shared modules of tier 0 may use each other (no circle: below)
    assert not upward, "imports against the layer map:\n" + "\n".join(upward)


def test_no_module_circle_counting_type_checking_imports() -> None:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for a, b in every_import():
        if b in MODULES and b != a and not a.startswith(b + "."):
            graph[a].add(b)
    found = cycles(graph)
    assert not found, "module circles: " + " | ".join(describe(c, graph) for c in found)
