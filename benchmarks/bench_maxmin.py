"""Benchmark: one max-min solve with 10^3, 10^4 and 10^5 live flows on the 16,384-GPU preset.

Two families of instances on ``h100-16k`` (2,048 DGX H100 hosts, 8 rails, 8 racks):

step-like -- the flows a 16k-GPU training step has in flight, layout TP 8 x DP 128 x PP 16
             (mesh order tp-dp-pp):
    10^3  128 DP ring channels (one per pipeline stage and rail, 128 hosts each, coupled)
          + 872 TP rings inside hosts;
    10^4  10,000 pipeline send/recv flows between neighbouring stages;
    10^5  expert-parallel all-to-all: 25 groups of 64 GPUs (8 hosts), every pair a flow.
random    -- routes between uniformly random GPU pairs, plus (second set) 10 % coupled
             rings of 8-64 random GPUs: a stress test with many distinct bottleneck levels.

Prints the median wall time of repeated solves of the numpy solver, with the allocator
tuning of :mod:`simulator.network.allocator` (as the simulator runs), and, when numba is
installed, of the compiled kernel (simulator/network/maxmin_jit.py; checked bit-identical
on each instance; its load time is printed once).
Run: python benchmarks/bench_maxmin.py [--keep-malloc]
"""

from __future__ import annotations

import os
import time

import numpy as np

from simulator.network.allocator import tune_allocator
from simulator.network import maxmin, maxmin_jit
from simulator.network.maxmin import max_min_rates
from topologies import build_cluster


def _csr(routes):
    ptr = np.zeros(len(routes) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(l) for l, _ in routes])
    return ptr, np.concatenate([l for l, _ in routes]), np.concatenate([c for _, c in routes])


def _ring(cluster, members):
    parts = [cluster.route(a, b) for a, b in zip(members, members[1:] + members[:1])]
    return np.concatenate([p.links for p in parts]), np.concatenate([p.coefs for p in parts])


def step_like(cluster, n_flows: int):
    tp, dp = 8, 128
    routes = []
    if n_flows == 1_000:
        for stage in range(16):
            for rail in range(8):
                routes.append(_ring(cluster, [rail + tp * (d + dp * stage) for d in range(dp)]))
        for host in range(n_flows - len(routes)):
            routes.append(_ring(cluster, list(range(8 * host, 8 * host + 8))))
    elif n_flows == 10_000:
        for g in range(n_flows):
            r = cluster.route(g, g + tp * dp)
            routes.append((r.links, r.coefs))
    else:
        for grp in range(n_flows // (64 * 63) + 1):
            members = range(64 * grp, 64 * grp + 64)
            for a in members:
                for b in members:
                    if a != b and len(routes) < n_flows:
                        r = cluster.route(a, b)
                        routes.append((r.links, r.coefs))
    return _csr(routes)


def random_pairs(cluster, n_flows: int, rng: np.random.Generator, ring_every: int = 0):
    routes = []
    n = cluster.num_gpus
    for i in range(n_flows):
        if ring_every and i % ring_every == 0:
            size = int(rng.choice([8, 16, 32, 64]))
            stride = int(rng.choice([1, 8, 64]))
            start = int(rng.integers(0, n - size * stride))
            routes.append(_ring(cluster, [start + k * stride for k in range(size)]))
        else:
            a, b = (int(x) for x in rng.integers(0, n, 2))
            r = cluster.route(a, b, flow_key=i)
            routes.append((r.links, r.coefs))
    return _csr(routes)


def _time(fn, args, reps):
    fn(*args)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def main() -> None:
    import sys
    if "--keep-malloc" not in sys.argv:
        tune_allocator()
    print(f"allocator tuned: {'--keep-malloc' not in sys.argv}")
    t0 = time.perf_counter()
    cluster = build_cluster("h100-16k")
    print(f"built {cluster.num_gpus} GPUs, {cluster.num_links} links in {time.perf_counter() - t0:.2f} s")
    maxmin._load_after_s = 0.0          # the compiled kernel from the first large solve
    rng = np.random.default_rng(0)
    cases = [("step-like", lambda n: step_like(cluster, n)),
             ("random p2p", lambda n: random_pairs(cluster, n, rng)),
             ("random p2p + 10% rings", lambda n: random_pairs(cluster, n, rng, 10))]
    t0 = time.perf_counter()
    jit = maxmin_jit.load()
    print(f"compiled kernel: {'loaded in %.2f s' % (time.perf_counter() - t0) if jit else 'no numba'}")
    print(f"{'instance':<24} {'flows':>7} {'entries':>9} {'rounds':>6} {'numpy':>10} {'compiled':>10}")
    for label, make in cases:
        for n_flows in (1_000, 10_000, 100_000):
            ptr, links, coefs = make(n_flows)
            reps = 15 if n_flows <= 10_000 else 3
            os.environ["CLUSTERSIM_NO_JIT"] = "1"
            ref, rounds = max_min_rates(ptr, links, coefs, cluster.link_capacity, return_rounds=True)
            t_np = _time(max_min_rates, (ptr, links, coefs, cluster.link_capacity), reps)
            os.environ["CLUSTERSIM_NO_JIT"] = "0"
            t_jit = float("nan")
            if jit:
                got = max_min_rates(ptr, links, coefs, cluster.link_capacity, return_rounds=True)
                assert np.array_equal(got[0], ref) and got[1] == rounds, "compiled kernel differs"
                t_jit = _time(max_min_rates, (ptr, links, coefs, cluster.link_capacity), reps)
            print(f"{label:<24} {n_flows:>7} {links.size:>9} {rounds:>6} {t_np * 1e3:>7.2f} ms {t_jit * 1e3:>7.2f} ms")


if __name__ == "__main__":
    main()
