"""The network's fast paths for few live flows give the same bits as the general ones.

* Per-link counters in Python lists (networks of up to ``flows._LIST_LINKS`` links) against
  numpy arrays; a few live flows kept as a list (``flows._FEW``), and their cache misses
  solved from per-route lists, against the vectorised updates and solves: whole golden runs with overlaps on (TP communication, p2p, gradient reduction and
  parameter gathers) and one with thousands of all-to-all flows (the paths switch back and
  forth) reproduce their stored digests with the fast paths off.
* The plain-Python rounds for small solves (:mod:`simulator.network.maxmin_small`) against
  the numpy solver: rates bit for bit and the round count, on seeded random instances.
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.network import flows, maxmin_small
from simulator.network.maxmin import max_min_rates
from tests.golden.cases import compute
from tests.simulator.test_maxmin import random_instances

GOLDEN_WITH_OVERLAPS = ["tp-comm-overlap", "interleaved-p2p", "no-param-gather-overlap", "mixtral-8x7b-64xh100-skew"]


@pytest.mark.parametrize("name", GOLDEN_WITH_OVERLAPS)
def test_fast_paths_off_give_the_stored_digest(name, monkeypatch):
    import json
    from tests.golden.cases import DIGESTS
    want = json.loads(DIGESTS.read_text())[name]
    monkeypatch.setattr(flows, "_LIST_LINKS", -1)      # numpy per-link counters
    monkeypatch.setattr(flows, "_FEW", 0)              # vectorised per-event updates
    monkeypatch.setenv("CLUSTERSIM_NO_JIT", "1")       # numpy solver for every solve
    assert compute(name) == want


def _small_instances(seed: int, n: int):
    """Solver instances of a few flows over a few links, as a pipeline's network meets them
    (equal capacities on some: ties between links and flows)."""
    return random_instances(seed, n, flows=(2, 9), links=(1, 12), empty_every=7, max_route=6,
                            weights=(1.0, 2.0, 4.0, 3.0), tie_every=5)


def test_small_solver_matches_the_numpy_solver(monkeypatch):
    monkeypatch.setenv("CLUSTERSIM_NO_JIT", "1")       # the reference: numpy alone
    checked = 0
    instances = [*_small_instances(11, 3000), *random_instances(12, 400)]
    for ptr, links, coefs, capacity, w, cap in instances:
        if links.size == 0 or ptr.size == 2 or links.size > maxmin_small.MAX_ENTRIES:
            continue                     # answered before any solver runs, or not small
        ref, rounds = max_min_rates(ptr, links, coefs, capacity, w, cap, return_rounds=True)
        rate = np.full(ptr.size - 1, np.inf) if cap is None else np.array(cap, dtype=float)
        got = maxmin_small.solve(ptr, links, coefs, w, capacity, rate)
        assert got == rounds
        assert rate.tobytes() == ref.tobytes()
        checked += 1
    assert checked > 2500


def test_small_solver_declines_what_the_kernel_declines():
    ptr, links = np.array([0, 1, 2]), np.array([0, 0])
    rate = np.array([np.inf, 0.0])      # a zero cap: the numpy solver decides
    assert maxmin_small.solve(ptr, links, None, None, np.array([10.0]), rate) == -1
    rate = np.full(2, np.inf)
    assert maxmin_small.solve(ptr, links, np.array([1.0, 0.0]), None, np.array([10.0]), rate) == -1
    assert rate.tolist() == [np.inf, np.inf]
