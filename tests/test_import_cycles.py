"""No import circle among the modules of ``workloads`` and ``topologies``.

Built from the source (AST), not from what happens to import at run time: an import inside
a function counts (it hides a circle, it does not remove it); an import under
``if TYPE_CHECKING:`` does not (it never runs).  ``from .pkg import x`` runs ``pkg``'s
``__init__``, so it is an edge to the package, and the package's own imports of its
submodules are edges too.  An edge to a package that contains the importing module is left
out: Python always initialises the parent before the child, so it cannot form a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("workloads", "topologies")


def module_files(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, a package standing for its ``__init__.py``."""
    out = {}
    for top in packages:
        for path in sorted((root / top).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST):
    """Every import statement, at any depth, outside ``if TYPE_CHECKING:`` bodies."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _targets(node: ast.Import | ast.ImportFrom, package: list[str], modules) -> list[str]:
    """The absolute names an import statement names (the base, and ``x`` of ``from base import x``
    where ``base.x`` is a module)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
    else:
        base = node.module
    return [base] + [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]


def import_graph(root: Path, packages=PACKAGES) -> dict[str, dict[str, str]]:
    """importer -> {imported module: "file:line"}, among the modules of ``packages``."""
    modules = module_files(root, packages)
    graph: dict[str, dict[str, str]] = {m: {} for m in modules}
    for mod, path in modules.items():
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in _import_nodes(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, package, modules):
                parts = target.split(".")
                for i in range(1, len(parts) + 1):      # importing a.b.c runs a.b's __init__ too
                    dst = ".".join(parts[:i])
                    if dst in modules and dst != mod and not mod.startswith(dst + "."):
                        graph[mod].setdefault(dst, f"{path.relative_to(root)}:{node.lineno}")
    return graph


def find_cycle(graph: dict[str, dict[str, str]]) -> list[str] | None:
    """One import circle as ``[m0, m1, ..., m0]``, or None."""
    state: dict[str, int] = {}                          # 1 on the current path, 2 done

    def visit(mod: str, path: list[str]) -> list[str] | None:
        state[mod] = 1
        path.append(mod)
        for dst in sorted(graph.get(mod, ())):
            if state.get(dst) == 1:
                return path[path.index(dst):] + [dst]
            if dst not in state and (found := visit(dst, path)):
                return found
        path.pop()
        state[mod] = 2
        return None

    for mod in sorted(graph):
        if mod not in state and (found := visit(mod, [])):
            return found
    return None


def describe(graph, cycle: list[str]) -> str:
    return "import circle: " + " -> ".join(
        f"{a} ({graph[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"


def test_no_import_cycle_in_workloads_and_topologies():
    graph = import_graph(ROOT)
    assert len(graph) > 30 and sum(map(len, graph.values())) > 60
    cycle = find_cycle(graph)
    assert cycle is None, describe(graph, cycle)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_a_circle_hidden_in_a_function_is_found(tmp_path):
    root = _tree(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from .b import g\n",
                            "pkg/b.py": "def g():\n    from .a import f\n"})
    graph = import_graph(root, ("pkg",))
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]
    assert "pkg/b.py:2" in describe(graph, find_cycle(graph))


def test_type_checking_imports_do_not_count(tmp_path):
    root = _tree(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from .b import g\n",
                            "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                        "    from .a import f\nelse:\n    import json\n"})
    assert find_cycle(import_graph(root, ("pkg",))) is None


def test_a_circle_through_a_package_init_is_found(tmp_path):
    root = _tree(tmp_path, {"pkg/__init__.py": "from .x import f\n", "pkg/x.py": "from .sub import h\n",
                            "pkg/sub/__init__.py": "from .y import h\n",
                            "pkg/sub/y.py": "def h():\n    from .. import x\n"})
    assert find_cycle(import_graph(root, ("pkg",))) == ["pkg.x", "pkg.sub", "pkg.sub.y", "pkg.x"]


def test_a_module_importing_its_own_package_is_no_circle(tmp_path):
    root = _tree(tmp_path, {"pkg/__init__.py": "from .a import f\n",
                            "pkg/a.py": "from . import b\n", "pkg/b.py": "import pkg\nfrom pkg import c\n",
                            "pkg/c.py": ""})
    graph = import_graph(root, ("pkg",))
    assert graph["pkg.a"] == {"pkg.b": "pkg/a.py:1"} and graph["pkg.b"] == {"pkg.c": "pkg/b.py:2"}
    assert find_cycle(graph) is None
