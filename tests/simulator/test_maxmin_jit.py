"""The compiled max-min kernel (simulator/network/maxmin_jit.py) returns the numpy solver's
floats bit for bit, with the same round count.

Checked on 3,200 seeded random instances (coefficients, weights, caps, empty routes,
sparse and dense link use, up to dozens of rounds), on 40 solves captured from a skewed
all-to-all run (DeepSeek-V3 on 2,048 H100, Zipf(1.2) routing: about 3,300 live pair flows
and 18,000 route entries each; data/maxmin_zipf_solves.npz), and through whole simulated
runs (the MoE golden cases with the kernel forced from the first solve).  Skipped without
numba: the simulator then never leaves the numpy solver.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from simulator.network import maxmin, maxmin_jit, maxmin_small
from simulator.network.maxmin import max_min_rates
from tests.simulator.test_maxmin import random_instances

pytest.importorskip("numba")

DATA = Path(__file__).parent / "data" / "maxmin_zipf_solves.npz"


@pytest.fixture
def reference(monkeypatch):
    """The numpy solver alone (CLUSTERSIM_NO_JIT=1) for the duration of a test."""
    monkeypatch.setenv("CLUSTERSIM_NO_JIT", "1")
    return max_min_rates


def _kernel(ptr, links, coefs, capacity, weight=None, cap=None):
    """The compiled kernel, called directly: (rate, rounds), rounds -1 where it declines."""
    kernel = maxmin_jit.load()
    rate = np.full(ptr.size - 1, np.inf) if cap is None else np.array(cap, dtype=float)
    empty = np.empty(0)
    rounds = kernel(np.asarray(ptr, dtype=np.int64), np.asarray(links, dtype=np.int64),
                    empty if coefs is None else np.asarray(coefs, dtype=float),
                    empty if weight is None else np.asarray(weight, dtype=float),
                    np.asarray(capacity, dtype=float), rate.copy(), rate)
    return rate, rounds


def _assert_same(ref, got):
    (a, ra), (b, rb) = ref, got
    assert rb == ra, f"{rb} rounds, the reference {ra}"
    assert a.tobytes() == b.tobytes(), f"rates differ at flows {np.flatnonzero(a != b)[:10]}"


def _many_levels(seed: int, n: int):
    """Larger instances with continuous capacities and caps: many distinct bottleneck
    levels, so many rounds, and releases both sparse and dense."""
    rng = np.random.default_rng(seed)
    for trial in range(n):
        F, L = int(rng.integers(50, 3000)), int(rng.integers(20, 2000))
        lens = rng.integers(1, 9, F)
        ptr = np.zeros(F + 1, dtype=np.int64)
        np.cumsum(lens, out=ptr[1:])
        links = rng.integers(0, L, ptr[-1])
        coefs = rng.choice([1.0, 2.0, 1 / 3, 0.125], ptr[-1]) if trial % 2 else None
        w = rng.choice([1.0, 2.0, 7.0], F) if trial % 3 else None
        cap = np.where(rng.random(F) < 0.2, rng.uniform(0.01, 5, F), np.inf) if trial % 4 else None
        yield ptr, links, coefs, rng.uniform(1, 1000, L) ** rng.uniform(0.5, 1.5), w, cap


def test_bit_identical_on_random_instances(reference):
    rounds = []
    for seed in (1, 2, 3, 4, 5, 6, 7):
        for ptr, links, coefs, capacity, w, cap in random_instances(seed, 400):
            ref = reference(ptr, links, coefs, capacity, w, cap, return_rounds=True)
            if links.size == 0:
                continue                 # answered before any solver runs
            _assert_same(ref, _kernel(ptr, links, coefs, capacity, w, cap))
            rounds.append(ref[1])
    for ptr, links, coefs, capacity, w, cap in _many_levels(8, 400):
        ref = reference(ptr, links, coefs, capacity, w, cap, return_rounds=True)
        _assert_same(ref, _kernel(ptr, links, coefs, capacity, w, cap))
        rounds.append(ref[1])
    assert len(rounds) > 3000 and max(rounds) >= 10


def test_bit_identical_on_solves_captured_from_a_skewed_all_to_all(reference):
    d = np.load(DATA)
    capacity = d["capacity"]
    ptr_all = np.zeros(d["lens"].size + 1, dtype=np.int64)
    np.cumsum(d["lens"], out=ptr_all[1:])
    f0 = 0
    for n in d["n_flows"]:
        e0, e1 = ptr_all[f0], ptr_all[f0 + n]
        ptr = ptr_all[f0:f0 + n + 1] - e0
        links = d["links"][e0:e1].astype(np.int64)
        coefs, w, cap = d["coefs"][e0:e1], d["weight"][f0:f0 + n], d["cap"][f0:f0 + n]
        _assert_same(reference(ptr, links, coefs, capacity, w, cap, return_rounds=True),
                     _kernel(ptr, links, coefs, capacity, w, cap))
        f0 += n
    assert d["n_flows"].size == 40 and int(np.median(d["n_flows"])) > 3000


@pytest.mark.parametrize("change", ["inf capacity", "zero coefficient", "nan weight", "zero cap"])
def test_declines_what_it_cannot_promise_and_the_reference_answers(change, reference, monkeypatch):
    ptr = np.array([0, 2, 3, 5])
    links = np.array([0, 1, 1, 0, 2])
    coefs, capacity = np.ones(5), np.array([4.0, 6.0, 5.0])
    w, cap = np.ones(3), np.full(3, np.inf)
    if change == "inf capacity":
        capacity[1] = np.inf
    elif change == "zero coefficient":
        coefs[2] = 0.0
    elif change == "nan weight":
        w[1] = np.nan
    else:
        cap[0] = 0.0
    assert _kernel(ptr, links, coefs, capacity, w, cap)[1] == -1
    want = reference(ptr, links, coefs, capacity, w, cap, return_rounds=True)
    monkeypatch.setenv("CLUSTERSIM_NO_JIT", "0")
    monkeypatch.setenv("CLUSTERSIM_JIT", "always")
    got = max_min_rates(ptr, links, coefs, capacity, w, cap, return_rounds=True)
    assert got[1] == want[1] and np.array_equal(got[0], want[0], equal_nan=True)


def test_numba_is_loaded_only_after_the_numpy_solver_has_spent_its_cost(monkeypatch):
    """The switch: small runs never import numba; CLUSTERSIM_NO_JIT=1 keeps numpy always."""
    monkeypatch.delenv("CLUSTERSIM_JIT", raising=False)
    monkeypatch.delenv("CLUSTERSIM_NO_JIT", raising=False)
    monkeypatch.setattr(maxmin_jit, "_kernel", None)
    monkeypatch.setattr(maxmin_jit, "_tried", False)
    monkeypatch.setattr(maxmin, "_numpy_spent_s", 0.0)
    monkeypatch.setattr(maxmin, "_load_after_s", None)
    monkeypatch.setattr(maxmin_jit, "cached", lambda: True)
    # (solves this small run in plain Python, maxmin_small, and spend no numpy time: make them numpy's)
    monkeypatch.setattr(maxmin_small, "MAX_ENTRIES", 0)
    ptr, links = np.array([0, 1, 2]), np.array([0, 0])
    per_solve = maxmin._NUMPY_SOLVE_S + links.size * maxmin._NUMPY_ENTRY_S
    for _ in range(int(maxmin._LOAD_CACHED_S / per_solve) - 5):
        max_min_rates(ptr, links, None, np.array([2.0]))
    assert maxmin_jit.loaded() is None
    monkeypatch.setenv("CLUSTERSIM_NO_JIT", "1")
    for _ in range(20):
        max_min_rates(ptr, links, None, np.array([2.0]))
    assert maxmin_jit.loaded() is None
    monkeypatch.setenv("CLUSTERSIM_NO_JIT", "")
    for _ in range(20):
        assert max_min_rates(ptr, links, None, np.array([2.0])).tolist() == [1.0, 1.0]
    assert maxmin_jit.loaded() is not None


@pytest.mark.parametrize("name", ["ep4-zipf", "ep4-skew", "unfolded-ep4-zipf", "dualpipe-moe"])
def test_moe_golden_cases_identical_with_the_kernel_from_the_first_solve(name, monkeypatch):
    from tests.golden.cases import DIGESTS, compute
    monkeypatch.setenv("CLUSTERSIM_JIT", "always")
    monkeypatch.delenv("CLUSTERSIM_NO_JIT", raising=False)
    assert compute(name) == json.loads(DIGESTS.read_text())[name]
    assert maxmin_jit.loaded() is not None


def test_a_small_run_never_imports_numba():
    """Loading numba costs about 0.3 s: a run whose solves cost less must not pay it."""
    import subprocess
    import sys
    code = ("import os, sys\nos.environ.pop('CLUSTERSIM_JIT', None); os.environ.pop('CLUSTERSIM_NO_JIT', None)\n"
            "from tests.golden.cases import compute\ncompute('ep4-zipf')\n"
            "assert 'numba' not in sys.modules, 'numba imported'\n")
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True)
