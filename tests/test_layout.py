"""The import rule: a lower room never imports a higher one.

Top level: ``topologies`` <- ``workloads`` <- ``simulator``.  Inside ``simulator`` the rooms
are ranked (docs/design.md, "Rooms"); a module may import from its own room or from a room
of lower rank, never from a higher or an equal-rank sibling room.  Imports inside functions
count too: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PACKAGES = {"topologies": 0, "workloads": 1, "simulator": 2}
"""Top-level packages by rank."""

ROOMS = {"scenario": 0, "network": 0, "collectives": 1, "engine": 2, "report": 3, "explore": 4, "validation": 4, "goodput": 4,
         "cli": 5, "__init__": 6}
"""simulator's rooms by rank (the sub-package, or the module for ``cli`` and the package's
``__init__``, which re-exports the public API)."""


def _imports(path: Path, module: str) -> list[tuple[str, int]]:
    """(absolute module imported, line) for every import statement in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    pkg = module.split(".")
    if path.name != "__init__.py":
        pkg = pkg[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[:len(pkg) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
                if node.module is None:       # from . import x: x may be a module
                    out += [(f"{target}.{a.name}", node.lineno) for a in node.names]
                    continue
            else:
                target = node.module
            out.append((target, node.lineno))
    return out


def _modules():
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            yield path, ".".join(rel.parts)


def room_of(module: str) -> str | None:
    """The simulator room of ``module`` (None outside simulator)."""
    parts = module.split(".")
    if parts[0] != "simulator":
        return None
    if len(parts) == 1:
        return "__init__"
    return parts[1] if parts[1] in ROOMS else "?" + parts[1]


def violations(edges) -> list[str]:
    """The imports among ``edges`` ((importer, imported, where)) that break the rule."""
    bad = []
    for src, dst, where in edges:
        top_s, top_d = src.split(".")[0], dst.split(".")[0]
        if top_d not in PACKAGES:
            continue                                    # the standard library or a dependency
        if PACKAGES[top_d] > PACKAGES[top_s]:
            bad.append(f"{where}: {src} imports {dst} (a higher package)")
            continue
        rs, rd = room_of(src), room_of(dst)
        if rs is None or rd is None or rs == rd:
            continue
        if rs.startswith("?") or rd.startswith("?"):
            bad.append(f"{where}: {src} -> {dst}: a module outside the rooms (add it to a room)")
        elif ROOMS[rd] >= ROOMS[rs]:
            bad.append(f"{where}: {src} (room {rs}) imports {dst} (room {rd}, not below it)")
    return bad


def test_no_import_runs_back_up():
    edges = [(mod, dst, f"{path.relative_to(ROOT)}:{line}")
             for path, mod in _modules() for dst, line in _imports(path, mod)]
    assert len(edges) > 100
    assert violations(edges) == []


def test_every_simulator_module_is_in_a_room():
    rooms = {room_of(mod) for _, mod in _modules() if mod.startswith("simulator")}
    assert rooms <= set(ROOMS), sorted(rooms - set(ROOMS))


@pytest.mark.parametrize("src, dst", [
    ("simulator.engine.simulate", "simulator.explore.estimate"),     # engine below explore
    ("simulator.network.flows", "simulator.collectives.engine"),     # network below collectives
    ("simulator.explore.search", "simulator.validation.evaluate"),   # siblings of one rank
    ("simulator.scenario.load", "simulator.cli"),
    ("workloads.program", "simulator.engine"),                        # a package above
    ("topologies.cluster", "workloads.model"),
])
def test_the_rule_catches_an_import_that_runs_back_up(src, dst):
    assert len(violations([(src, dst, "x.py:1")])) == 1


def test_relative_imports_resolve(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("from ..network import FlowNetwork\nfrom . import fold\nimport numpy\n"
                 "def f():\n    from ..explore.sweep import run_points\n")
    got = [d for d, _ in _imports(p, "simulator.engine.simulate")]
    assert got == ["simulator.network", "simulator.engine.fold", "numpy", "simulator.explore.sweep"]
