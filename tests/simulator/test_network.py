"""The fluid network: fairness over time, conservation, one solve per instant."""

import numpy as np
import pytest
import simpy

from simulator.network import FlowNetwork
from simulator.network import flows as flows_mod


def run_flows(capacity, flows):
    """flows: (name, links, bytes, start_s[, coefs]); returns finish times and the network."""
    env = simpy.Environment()
    net = FlowNetwork(env, np.asarray(capacity, float))
    done = {}

    def proc(name, links, size, start, coefs=None):
        yield env.timeout(start)
        yield net.transfer(np.asarray(links), size, coefs=None if coefs is None else np.asarray(coefs, float))
        done[name] = env.now

    for f in flows:
        env.process(proc(*f))
    env.run()
    return done, net


def test_finishing_flow_frees_bandwidth():
    done, net = run_flows([10.0, 10.0], [("a", [0], 10.0, 0.0), ("b", [0, 1], 20.0, 0.0)])
    # both at 5 B/s until a finishes at t=2; then b alone at 10 B/s for its last 10 bytes
    assert done == {"a": 2.0, "b": 3.0}
    np.testing.assert_allclose(net.link_bytes, [30.0, 20.0])
    np.testing.assert_allclose(net.link_busy_s, [3.0, 3.0])


def test_coupled_ring_runs_at_its_slowest_edge_and_charges_each_link():
    # a 3-edge ring channel over links of 10, 4 and 10 B/s, plus an independent flow on link 0
    done, net = run_flows([10.0, 4.0, 10.0], [("ring", [0, 1, 2], 8.0, 0.0), ("x", [0], 12.0, 0.0)])
    # the ring is held to 4 B/s by link 1, so x gets 6 B/s on link 0: both finish at t=2
    assert done["ring"] == 2.0 and done["x"] == 2.0
    np.testing.assert_allclose(net.link_bytes, [20.0, 8.0, 8.0])


def test_every_byte_is_delivered_and_no_link_exceeds_capacity():
    rng = np.random.default_rng(1)
    cap = rng.uniform(1, 10, 20)
    flows = []
    expect = np.zeros(20)
    for i in range(60):
        links = rng.choice(20, size=rng.integers(1, 5), replace=False)
        coefs = rng.choice([0.5, 1.0, 2.0], size=links.size)
        size = float(rng.uniform(1, 50))
        flows.append((i, links, size, float(rng.uniform(0, 5)), coefs))
        np.add.at(expect, links, size * coefs)
    done, net = run_flows(cap, flows)
    assert len(done) == 60
    np.testing.assert_allclose(net.link_bytes, expect, rtol=1e-9)
    # average rate over the busy time never exceeds capacity
    busy = net.link_busy_s > 0
    assert np.all(net.link_bytes[busy] / net.link_busy_s[busy] <= cap[busy] * (1 + 1e-9))


def test_byte_balance_mid_flight_and_at_the_end():
    """byte_balance(): carried + still to carry = asked, per link, at any instant.  Link 0
    (10 B/s) is shared by a (10 B) and b (20 B, also on link 1); link 2 has an isolated flow
    c (30 B at 10 B/s) to itself.  At t = 1: a and b ran at 5 B/s, c at 10 B/s."""
    env = simpy.Environment()
    net = FlowNetwork(env, np.array([10.0, 10.0, 10.0]))
    net.transfer(np.array([0]), 10.0)
    net.transfer(np.array([0, 1]), 20.0)
    net.transfer_group([(np.array([2]), None, 30.0, 1.0, np.inf)], key="c")
    env.run(until=1.0)
    carried, left, asked = net.byte_balance()
    np.testing.assert_allclose(carried, [10.0, 5.0, 10.0])
    np.testing.assert_allclose(left, [20.0, 15.0, 20.0])
    np.testing.assert_allclose(asked, [30.0, 20.0, 30.0])
    env.run()
    carried, left, asked = net.byte_balance()
    np.testing.assert_allclose(left, 0.0, atol=1e-9)
    np.testing.assert_allclose(carried, asked, rtol=1e-12)
    # a group started again counts again: same key, one more run of c
    net.transfer_group([(np.array([2]), None, 30.0, 1.0, np.inf)], key="c")
    env.run()
    np.testing.assert_allclose(net.byte_balance()[2], [30.0, 20.0, 60.0])


def test_rates_are_solved_once_per_instant():
    env = simpy.Environment()
    net = FlowNetwork(env, np.array([100.0]))

    def burst():
        # 50 flows start at t=0 from 50 separate processes, 50 more at t=1
        for k in range(50):
            env.process(one(k))
        yield env.timeout(1.0)
        for k in range(50):
            env.process(one(k))

    def one(k):
        yield net.transfer(np.array([0]), 1.0)

    env.process(burst())
    env.run()
    # starts at t=0 (1 solve), all finish together at t=0.5 (1 solve), starts at t=1,
    # finish at t=1.5: four instants with flows changing, and no more solves than that
    assert net.num_solves <= 4


def test_per_tier_accounting_over_a_window():
    env = simpy.Environment()
    net = FlowNetwork(env, np.array([10.0, 10.0, 20.0]))
    tier = np.array([0, 0, 1])
    start = net.snapshot()
    net.transfer(np.array([0, 2]), 10.0)      # 1 s at 10 B/s over tiers 0 and 1
    env.run()
    s = FlowNetwork.tier_summary(start, net.snapshot(), net.capacity, tier, ["nvlink", "ib"])
    assert s["nvlink"] == {"bytes": 10.0, "busy_link_s": 1.0, "utilization": 0.5}
    assert s["ib"] == {"bytes": 10.0, "busy_link_s": 1.0, "utilization": 0.5}


def _random_traffic(isolate: bool, seed: int):
    """Groups of flows on a small random network, started at random instants with random
    start delays; returns every group's completion time and the per-link bytes."""
    rng = np.random.default_rng(seed)
    n_links = 12
    env = simpy.Environment()
    net = FlowNetwork(env, rng.uniform(1.0, 4.0, n_links), isolate=isolate)
    done = {}

    def starter(i):
        yield env.timeout(float(rng.uniform(0.0, 3.0)))
        flows = []
        for _ in range(int(rng.integers(1, 3))):
            links = rng.choice(n_links, size=int(rng.integers(1, 4)), replace=False)
            flows.append((links, rng.uniform(0.5, 2.0, links.size), float(rng.uniform(0.5, 3.0)), 1.0, np.inf))
        ev = net.transfer_group(flows, delay=float(rng.choice([0.0, 0.0, 0.3, 1.0])))
        yield ev
        done[i] = env.now

    for i in range(40):
        env.process(starter(i))
    env.run()
    return done, net.link_bytes.copy()


@pytest.mark.parametrize("seed", range(6))
def test_isolated_groups_match_the_solver(seed):
    """The isolated fast path (a group alone on its links skips the solver, is turned back
    into ordinary flows when another group claims a link, before or after it starts) gives
    the same completion times and link bytes as solving every group."""
    fast, bytes_fast = _random_traffic(True, seed)
    slow, bytes_slow = _random_traffic(False, seed)
    assert fast.keys() == slow.keys()
    for i in fast:
        assert fast[i] == pytest.approx(slow[i], rel=1e-9, abs=1e-12)
    np.testing.assert_allclose(bytes_fast, bytes_slow, rtol=1e-9, atol=1e-9)


class _Forgetful(dict):
    """A solve cache that never keeps anything: every solve runs the solver."""

    def __setitem__(self, key, value):
        pass


def _repeating_traffic(cache: bool):
    """The same few flow sets again and again (a steady pipeline's pattern), with weights and
    caps that change between rounds, so a cache keyed on routes alone would answer wrongly."""
    env = simpy.Environment()
    net = FlowNetwork(env, np.array([4.0, 2.0, 3.0]), isolate=False)
    if not cache:
        net._solved = _Forgetful()
    done = []

    def flow(links, size, start, weight, cap):
        yield env.timeout(start)
        yield net.transfer(np.asarray(links), size, weight=weight, cap=cap)
        done.append(env.now)

    for r in range(12):
        t0 = 3.0 * r
        env.process(flow([0, 1], 2.0, t0, 1.0 + r % 3, np.inf))
        env.process(flow([0], 3.0, t0 + 0.25, 1.0, np.inf if r % 2 else 1.5))
        env.process(flow([1, 2], 1.0, t0 + 0.5, 1.0, np.inf))
    env.run()
    return done, net


def test_solve_cache_answers_exactly_what_the_solver_would():
    cached, net = _repeating_traffic(cache=True)
    fresh, net0 = _repeating_traffic(cache=False)
    assert net.num_solve_hits > net.num_solves // 2 and net0.num_solve_hits == 0
    assert cached == fresh                      # bit for bit, not approximately
    assert net.link_bytes.tolist() == net0.link_bytes.tolist()


def test_solve_cache_byte_bound_changes_nothing(monkeypatch):
    """A cache that clears itself whenever it would hold more than a few bytes answers the
    same as one that keeps everything (a cleared entry is solved again, to the same bits)."""
    kept, net = _repeating_traffic(cache=True)
    monkeypatch.setattr(flows_mod, "_SOLVE_CACHE_BYTES", 200)
    bounded, net_b = _repeating_traffic(cache=True)
    assert bounded == kept
    assert net_b.link_bytes.tolist() == net.link_bytes.tolist()
    assert net_b.num_solve_hits < net.num_solve_hits and net_b._solved_bytes <= 200 + 100


def _wide_groups():
    """Groups of 40-120 flows (some identical, so they merge into weighted flows) over
    shared links, started at staggered instants: completion times and link bytes."""
    rng = np.random.default_rng(7)
    env = simpy.Environment()
    net = FlowNetwork(env, rng.uniform(1.0, 4.0, 16), isolate=False)
    done = {}

    def group(i):
        yield env.timeout(0.1 * i)
        flows = []
        for _ in range(int(rng.integers(40, 120))):
            links = rng.choice(16, size=int(rng.integers(1, 4)), replace=False)
            size = float(rng.choice([0.5, 1.0, 2.0]))
            flows.append((np.sort(links) if rng.random() < 0.5 else links[:1], None, size,
                          float(rng.choice([1.0, 2.0])), np.inf if rng.random() < 0.8 else 1.5))
        yield net.transfer_group(flows)
        done[i] = env.now

    for i in range(6):
        env.process(group(i))
    env.run()
    return done, net.link_bytes.tolist(), net.num_flows


def test_wide_groups_start_as_their_flows_one_by_one(monkeypatch):
    """A group of more than _FEW flows starts in array operations (merging identical flows
    and summing their weights in order); with the threshold out of reach every group takes
    the one-flow-at-a-time path.  Both give the same results to the bit."""
    batched = _wide_groups()
    monkeypatch.setattr(flows_mod, "_FEW", 10**9)
    assert _wide_groups() == batched


def _in_order_trace(inline: bool, twin: bool) -> list:
    """Two processes; a timer's callback ends by succeeding the event the first one waits on
    (with :func:`succeed_in_order` or a plain ``succeed``); with ``twin`` the second process
    has an event due at the same instant."""
    import simpy
    from simulator.network.flows import succeed_in_order
    env, trace = simpy.Environment(), []
    done = env.event()

    def waiter():
        yield done
        trace.append(("waiter", env.now))
        yield env.timeout(0)
        trace.append(("waiter again", env.now))

    def other():
        yield env.timeout(1.0 if twin else 0.5)
        trace.append(("other", env.now))
        yield env.timeout(0)
        trace.append(("other again", env.now))

    def fire(_e):
        trace.append(("timer", env.now))
        (succeed_in_order(env, done, 7) if inline else done.succeed(7))

    env.process(waiter())
    env.process(other())
    t = env.timeout(1.0)
    t.callbacks.append(fire)
    env.run()
    return trace + [("value", done.value), ("processed", done.processed)]


def test_succeed_in_order_runs_the_callbacks_when_simpy_would_and_no_event_is_lost():
    for twin in (False, True):
        assert _in_order_trace(True, twin) == _in_order_trace(False, twin)
    assert _in_order_trace(True, True) != _in_order_trace(True, False)      # (the two cases differ)


def test_isolated_groups_finished_in_order_give_the_same_run_as_a_plain_succeed(monkeypatch):
    """The isolated-group finish skips the heap only where that changes nothing: the demo's
    model on a few nodes gives the same timeline with a plain ``succeed`` there."""
    import simulator.network.flows as flows
    from simulator.engine.simulate import run
    from simulator.scenario import load_scenario
    sc = {"model": "llama3-8b", "cluster": {"preset": "dgx-h100", "num_nodes": 2}, "num_steps": 1,
          "parallel": {"tp": 4, "pp": 2, "dp": 2, "global_batch_size": 16, "seq_len": 2048}}
    inline, real = [], flows.succeed_in_order

    def counted(env, ev, value=None):
        inline.append(flows.next_now(env))
        real(env, ev, value)

    monkeypatch.setattr(flows, "succeed_in_order", counted)
    fast = run(load_scenario(sc))
    assert sum(inline) > 1000                   # (most finishes skip the heap here)
    monkeypatch.setattr(flows, "succeed_in_order", lambda env, ev, value=None: ev.succeed(value))
    slow = run(load_scenario(sc))
    assert fast.metrics["step_time_s"] == slow.metrics["step_time_s"]
    assert fast.timeline.equals(slow.timeline)


def test_succeed_in_order_goes_ahead_of_an_event_queued_behind_the_instant():
    """An event queued at this instant with a lower priority than NORMAL (the network's
    solve) comes after one a plain ``succeed`` would schedule now: the relay still skips
    the heap, and the order is the same."""
    import heapq
    import simpy
    from simulator.network import flows

    def trace(inline: bool) -> tuple:
        env, out = simpy.Environment(), []
        done = env.event()
        done.callbacks.append(lambda e: out.append(("done", env.now, e.value)))

        def fire(_e):
            late = simpy.Event(env)
            late._ok, late._value = True, None
            late.callbacks.append(lambda _x: out.append(("after the instant", env.now)))
            heapq.heappush(env._queue, (env._now, flows._AFTER_INSTANT, next(env._eid), late))
            out.append(("next now", flows.next_now(env)))
            (flows.succeed_in_order(env, done, 3) if inline else done.succeed(3))

        env.timeout(1.0).callbacks.append(fire)
        env.run()
        return out

    assert trace(True) == trace(False) == [("next now", True), ("done", 1.0, 3), ("after the instant", 1.0)]
