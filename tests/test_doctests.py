"""The examples in docstrings run: every module of the three packages with a ``>>>`` example
is doctested, so an example that stops being true fails here."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                 for top in ("topologies", "workloads", "simulator") for p in (ROOT / top).rglob("*.py")
                 if ">>>" in p.read_text())


def test_there_are_examples():
    assert len(MODULES) >= 10


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{name} has '>>>' but no example ran"
    assert result.failed == 0
