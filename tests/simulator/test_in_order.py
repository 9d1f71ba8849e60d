"""Relays that skip simpy's heap (:func:`simulator.network.flows.succeed_in_order`) give the
same run as a plain ``succeed`` at each of them.

Each site succeeds an event as the last act of an event's processing; when the event it
schedules would be the next one popped, its callbacks run at once.  Here every site is put
back to a plain ``succeed`` in turn, on a small scenario that reaches all of them (tiny
all-reduces, pipeline transfers, CP ring hops beside compute -- finishing before it or
after --, gradient buckets on the DP stream, multi-group and pipeline waits, contended
flows): the timeline and the metrics must
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

# (CP across nodes: some ring hops land after the compute block beside them)
SCENARIO = {"model": "llama3-8b", "cluster": {"preset": "dgx-h100", "num_nodes": 8}, "num_steps": 1,
            "parallel": {"tp": 8, "cp": 2, "pp": 2, "dp": 2, "global_batch_size": 8, "seq_len": 8192}}

# the function that calls succeed_in_order, per site
SITES = {
    "_finish": "CollectiveEngine._finish: a tiny call's timer, a transfer's completion",
    "_finish_done": "FlowNetwork._finish_done: the last group finished at a solve or timer",
    "_finish_isolated": "FlowNetwork._finish_isolated: an isolated group's finish",
    "_on_done": "_Latch._on_done: the last awaited event of a latch",
    "done": "_StreamCall.done: a stream call's completion",
    "landed": "CellActor._alongside: a collective beside the next compute op",
    "_hit": "_FirstOf._hit: a hop's completion processing the AnyOf at once",
    "_a_done": "_FirstOf._a_done: the AnyOf's processing succeeding the condition",
    "_timer": "_FirstOf._timer: the compute block's end succeeding the condition",
    "_wait": "_wait: a wait after a compute op for exchanges all done already",
}
# (these two decide with next_now and go on themselves, not through succeed_in_order)
_NEXT_NOW_SITES = ("_hit", "_wait")
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
    real, real_next, taken = flows_mod.succeed_in_order, flows_mod.next_now, Counter()

    def relay(env, ev, value=None):
        site = sys._getframe(1).f_code.co_name
        assert site in SITES, site
        if site in plain:
            ev.succeed(value)
        else:
            taken[site] += flows_mod.next_now(env)
            real(env, ev, value)

    def next_now(env):
        site = sys._getframe(1).f_code.co_name
        if site not in _NEXT_NOW_SITES:
            return real_next(env)
        if site in plain:
            return False
        ok = real_next(env)
        taken[site] += ok
        return ok

    for m in _MODULES:
        monkeypatch.setattr(m, "succeed_in_order", relay)
    monkeypatch.setattr(actor_mod, "next_now", next_now)
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


class _SimpyFirstOf:
    """What :class:`simulator.engine.actor._FirstOf` stands for, with simpy's conditions."""

    def __init__(self, env, delay, events):
        self.done = env.timeout(delay)
        self.event = self.done | env.any_of(events)

    @property
    def timed_out(self) -> bool:
        return self.done.processed


def test_first_of_gives_the_run_of_simpys_conditions(monkeypatch, in_order):
    """The ring hops' wait beside a compute block, with every relay plain and simpy's
    ``timeout | any_of``, gives the same run."""
    fast, taken = in_order
    assert taken["_timer"] > 0 and taken["_hit"] > 0
    monkeypatch.setattr(actor_mod, "_FirstOf", _SimpyFirstOf)
    slow, _ = _run(monkeypatch, plain=set(SITES))
    _same(fast, slow)


def _first_of_trace(simpy_conditions: bool, hop_at: float, twin: bool, direct: bool) -> list:
    """A process waits for the first of a 1 s timer and a hop landing at ``hop_at`` (its
    completion relayed by another callback, as an actor's, or with ``direct`` the hop's
    own timer, queued ahead of the process's); with ``twin`` another process has events
    due at the same instants."""
    import simpy
    env, trace = simpy.Environment(), []
    call = env.timeout(hop_at)
    if direct:
        hop = call
        call.callbacks.append(lambda _e: trace.append(("landed", env.now)))
    else:
        hop = env.event()
        call.callbacks.append(lambda _e: (trace.append(("landed", env.now)), flows_mod.succeed_in_order(env, hop)))

    def waiter():
        w = (_SimpyFirstOf if simpy_conditions else actor_mod._FirstOf)(env, 1.0, [hop])
        yield w.event
        trace.append(("resumed", env.now, w.timed_out))
        yield env.timeout(0)
        trace.append(("again", env.now))

    def other():
        for t in (hop_at, 1.0 - hop_at if hop_at < 1.0 else 0.0):
            yield env.timeout(t)
            trace.append(("other", env.now))

    env.process(waiter())
    if twin:
        env.process(other())
    env.run()
    return trace


@pytest.mark.parametrize("hop_at", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("twin", [False, True])
@pytest.mark.parametrize("direct", [False, True])
def test_first_of_resumes_where_simpys_conditions_do(hop_at, twin, direct):
    assert _first_of_trace(False, hop_at, twin, direct) == _first_of_trace(True, hop_at, twin, direct)
