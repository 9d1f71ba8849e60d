"""The cell actor runs each op by its issue mode, read from ``op.issue`` (set by the kernel
stack), and the estimator reads the same: over every op of every golden case, the engine's
handler is the :data:`~simulator.engine.actor.ISSUE_HANDLERS` entry of the op's mode, and
the engine runs a collective beside the next compute op exactly where the estimator charges
it only for what outlasts that op.  Neither re-derives a mode from the op's name."""

from __future__ import annotations

import copy
from functools import lru_cache

import pytest

from simulator.engine.actor import ISSUE_HANDLERS, CellActor, ClassPlan, issue_modes
from simulator.engine.simulate import _program
from simulator.explore.estimate import _PENDING_ISSUES
from simulator.scenario import load_scenario
from tests.golden.cases import cases
from workloads.ops import KIND_COLLECTIVE, Issue

#: the engine's handlers that run a collective while the next compute op computes
_BESIDE_NEXT_COMPUTE = {CellActor._beside_next, CellActor._overlap_next, CellActor._prefetched}
_NOT_BY_ISSUE = {CellActor._compute_op, CellActor._host_sync, CellActor._p2p_batch, CellActor._fb_pair}


@lru_cache(maxsize=None)
def _golden_program(name):
    sc, kw = cases()[name]
    scenario = load_scenario(copy.deepcopy(sc))
    prog, _ = _program(scenario, kw.get("compute_scale"), kw.get("whatif"))
    return scenario, prog


def test_every_issue_mode_has_a_handler():
    assert set(ISSUE_HANDLERS) == set(Issue)


@pytest.mark.parametrize("name", sorted(cases()))
def test_engine_and_estimator_agree_on_every_ops_issue_mode(name):
    sc, prog = _golden_program(name)
    fb_overlap = sc.overlap.get("fb_overlap", True)
    seen = 0
    for cls in prog.classes:
        plan = ClassPlan(cls.ops, fb_overlap, False, {})
        inside = set()                  # ops run by a batch's or a pair's first op
        for i, h in enumerate(plan.handler_at):
            if h is None:
                inside.add(i)
        for i, op in enumerate(cls.ops):
            h = plan.handler_at[i]
            if i in inside:
                continue
            if h in _NOT_BY_ISSUE:
                assert op.kind != KIND_COLLECTIVE or h is CellActor._fb_pair, (name, i, op.name)
                continue
            seen += 1
            assert op.kind == KIND_COLLECTIVE, (name, i, op.name)
            assert h is ISSUE_HANDLERS[op.issue], (name, i, op.name, op.issue, h.__name__)
            # the estimator's reading of the same field: pending beside the next compute op
            assert (h in _BESIDE_NEXT_COMPUTE) == (op.issue in _PENDING_ISSUES), (name, i, op.name, op.issue)
    assert seen or all(o.kind != KIND_COLLECTIVE or o.lane for c in prog.classes for o in c.ops)


def test_the_engine_reads_the_mode_not_the_name():
    """Relabel every collective of a case with each mode in turn: the engine's handler follows
    the label, whatever the op's name."""
    _, prog = _golden_program("1f1b-tp2-sp")
    ops = prog.classes[0].ops
    coll = [i for i, o in enumerate(ops) if o.kind == KIND_COLLECTIVE and not o.lane]
    assert coll
    for mode in Issue:
        relabelled = [o._replace(issue=mode) if i in coll else o for i, o in enumerate(ops)]
        names = issue_modes(relabelled)
        assert {names[i] for i in coll} == {ISSUE_HANDLERS[mode].__name__}


def test_the_golden_cases_use_every_issue_mode():
    used = {o.issue for name in cases() for c in _golden_program(name)[1].classes for o in c.ops
            if o.kind == KIND_COLLECTIVE}
    assert used == set(Issue)
