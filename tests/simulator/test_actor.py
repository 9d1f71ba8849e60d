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


# -- a node failing mid-step -----------------------------------------------------------------

_PIPE = {"model": {"preset": "tiny-dense", "num_layers": 4},
         "cluster": {"preset": "dgx-h100", "num_nodes": 4, "hosts_per_leaf": 2},
         "parallel": {"tp": 8, "pp": 2, "dp": 2, "global_batch_size": 8, "seq_len": 1024}, "num_steps": 2}


def _run_pieces(scenario, fold=True):
    """simulate._run's set-up and loop, keeping the run's state to look at."""
    from simulator.collectives import CollectiveEngine
    from simulator.engine.simulate import _folding, _loop, _state
    import simpy
    sc = load_scenario(copy.deepcopy(scenario))
    prog, pert = _program(sc, None, None)
    coll = CollectiveEngine(simpy.Environment(), pert.cluster, None)
    state = _state(sc, prog, pert, coll, _folding(sc, prog, pert, coll, fold, False), False)
    return state, lambda: _loop(state, 1e7, 0.0)


@pytest.mark.parametrize("fold", [True, False], ids=["folded", "unfolded"])
def test_a_node_failing_mid_step_interrupts_every_cell_and_stops_the_job(fold):
    """Every NIC of host 1 fails in the middle of the second step: the job stops at the first
    transfer that needs one of them after that instant.  Every cell's process is interrupted
    there (simpy Process.interrupt, cause the JobStopped) and ends cleanly; the run raises the
    JobStopped from its loop, not out of the network's callback."""
    from simulator.engine import JobStopped, run
    base = run(copy.deepcopy(_PIPE))
    (s0, e0), (s1, e1) = base.step_bounds
    mid = 0.5 * (s1 + e1)
    failing = {**_PIPE, "whatif": {"failed_nics": [{"nic": f"nic1.{k}", "at_s": mid} for k in range(8)]}}
    state, loop = _run_pieces(failing, fold)
    with pytest.raises(JobStopped) as e:
        loop()
    assert e.traceback[-1].name == "_loop"
    assert e.value is state.stopped and e.value.nic.startswith("nic1.")
    assert mid <= e.value.time_s < e1
    assert state.env.now == e.value.time_s            # stopped at that instant
    assert state.left == 0 and not any(state.done_flags)
    assert all(p.triggered and p.ok and not p.is_alive for p in state.procs)
    assert set(state.stopped_at) == set(range(len(state.procs)))
    assert all(step == 1 for step, _op in state.stopped_at.values())      # all of them in the second step
    assert (e.value.steps_completed, e.value.num_steps) == (1, 2)
    assert e.value.progress() == "1 of 2 steps had completed"
    with pytest.raises(JobStopped) as e2:
        run(copy.deepcopy(failing), fold=fold)
    assert str(e2.value) == str(e.value)
