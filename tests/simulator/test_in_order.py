"""Relays that skip simpy's heap (:func:`simulator.network.flows.succeed_in_order`) give the
same run as a plain ``succeed`` at each of them.

Each site succeeds an event as the last act of an event's processing; when the event it
schedules would be the next one popped, its callbacks run at once.  Here every site is put
back to a plain ``succeed`` in turn, on a small scenario that reaches all of them (tiny
all-reduces, pipeline transfers, CP ring hops beside compute, gradient buckets on the DP
stream, multi-group and pipeline waits, contended flows): the timeline and the metrics must
not move, and the site must have taken its in-order branch in the run that uses it.
"""

import sys
from collections import Counter

import pytest

import simulator.collectives.engine as engine_mod
import simulator.engine.actor as actor_mod
import simulator.network.flows as flows_mod
from simulator.engine.simulate import run
from simulator.scenario import load_scenario

SCENARIO = {"model": "llama3-8b", "cluster": {"preset": "dgx-h100", "num_nodes": 2}, "num_steps": 1,
            "parallel": {"tp": 2, "cp": 2, "pp": 2, "dp": 2, "global_batch_size": 16, "seq_len": 8192}}

# the function that calls succeed_in_order, per site
SITES = {
    "_finish": "CollectiveEngine._finish: a tiny call's timer, a transfer's completion",
    "_finish_done": "FlowNetwork._finish_done: the last group finished at a solve or timer",
    "_finish_isolated": "FlowNetwork._finish_isolated: an isolated group's finish",
    "_on_done": "_Latch._on_done: the last awaited event of a latch",
    "done": "_StreamCall.done: a stream call's completion",
    "landed": "CellActor._alongside: a collective beside the next compute op",
}
_MODULES = (flows_mod, actor_mod, engine_mod)


def _same(a, b) -> None:
    """The same metrics (apart from wall times) and timeline."""
    def clean(m):
        m = dict(m, wall_time_s=None)
        m["fold"] = dict(m["fold"], wall_s=None)
        return m
    assert clean(a.metrics) == clean(b.metrics)
    assert a.timeline.equals(b.timeline)


def _run(monkeypatch, plain=()):
    """The scenario with the sites ``plain`` back to a plain succeed; also, per site, how
    many of its calls would take the in-order branch."""
    real, taken = flows_mod.succeed_in_order, Counter()

    def relay(env, ev, value=None):
        site = sys._getframe(1).f_code.co_name
        assert site in SITES, site
        if site in plain:
            ev.succeed(value)
        else:
            taken[site] += flows_mod.next_now(env)
            real(env, ev, value)

    for m in _MODULES:
        monkeypatch.setattr(m, "succeed_in_order", relay)
    r = run(load_scenario(SCENARIO))
    return r, taken


@pytest.fixture(scope="module")
def in_order():
    with pytest.MonkeyPatch.context() as mp:
        return _run(mp)


@pytest.mark.parametrize("site", sorted(SITES))
def test_each_in_order_site_gives_the_run_of_a_plain_succeed(monkeypatch, in_order, site):
    fast, taken = in_order
    assert taken[site] > 0, f"{SITES[site]}: never took the in-order branch here"
    slow, _ = _run(monkeypatch, plain={site})
    _same(fast, slow)


def test_all_sites_plain_give_the_same_run(monkeypatch, in_order):
    fast, taken = in_order
    slow, _ = _run(monkeypatch, plain=set(SITES))
    assert sum(taken.values()) > 1000
    _same(fast, slow)
