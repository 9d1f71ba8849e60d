"""No function in simulator/ or workloads/ runs over 80 lines (the max-min kernel excepted):
a reader should be able to hold any one of them in view. The kernel is one hot loop over the
flows' rounds, kept whole on purpose: a call per round would cost more than its body."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 80
EXEMPT = {("simulator/network/maxmin.py", "max_min_rates")}


def _long_functions(package: str) -> list[tuple[str, str, int]]:
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > LIMIT and (rel, node.name) not in EXEMPT:
                    out.append((rel, node.name, n))
    return out


def test_no_function_over_80_lines():
    long = _long_functions("simulator") + _long_functions("workloads")
    assert not long, f"functions over {LIMIT} lines: {long}"


def test_the_check_sees_a_long_function(tmp_path, monkeypatch):
    pkg = tmp_path / "simulator"
    pkg.mkdir()
    (pkg / "m.py").write_text("def f():\n" + "    x = 1\n" * 90)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _long_functions("simulator") == [("simulator/m.py", "f", 91)]
