"""Benchmark: one max-min solve with 10^3, 10^4 and 10^5 live flows on a 16,384-GPU fat-tree.

Flows are routes between random GPU pairs of the ``h100-16k`` preset (NVLink, PCIe,
leaf, spine and cross-rack links), plus coupled ring channels of 8 to 64 GPUs, as a
training step's mix looks.  Prints the median wall time of repeated solves.

Run: python benchmarks/bench_maxmin.py
"""

from __future__ import annotations

import time

import numpy as np

from simulator.maxmin import max_min_rates
from topologies import build_cluster


def instance(cluster, n_flows: int, rng: np.random.Generator, ring_every: int = 10):
    routes = []
    n = cluster.num_gpus
    for i in range(n_flows):
        if ring_every and i % ring_every == 0:     # a coupled ring channel over a random group
            size = int(rng.choice([8, 16, 32, 64]))
            stride = int(rng.choice([1, 8, 64]))
            start = int(rng.integers(0, n - size * stride))
            members = [start + k * stride for k in range(size)]
            parts = [cluster.route(a, b) for a, b in zip(members, members[1:] + members[:1])]
            links = np.concatenate([p.links for p in parts])
            coefs = np.concatenate([p.coefs for p in parts])
        else:
            a, b = (int(x) for x in rng.integers(0, n, 2))
            r = cluster.route(a, b, flow_key=i)
            links, coefs = r.links, r.coefs
        routes.append((links, coefs))
    ptr = np.zeros(n_flows + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(l) for l, _ in routes])
    links = np.concatenate([l for l, _ in routes])
    coefs = np.concatenate([c for _, c in routes])
    return ptr, links, coefs


def main() -> None:
    t0 = time.perf_counter()
    cluster = build_cluster("h100-16k")
    print(f"built {cluster.num_gpus} GPUs, {cluster.num_links} links in {time.perf_counter() - t0:.2f} s")
    rng = np.random.default_rng(0)
    print(f"{'instance':<34} {'flows':>8} {'nnz':>9} {'rounds':>6} {'median solve':>14}")
    for label, ring_every in (("p2p routes between random GPUs", 0), ("same + 10 % coupled rings (8-64)", 10)):
        for n_flows in (1_000, 10_000, 100_000):
            ptr, links, coefs = instance(cluster, n_flows, rng, ring_every)
            reps = 20 if n_flows <= 10_000 else 5
            times = []
            for _ in range(reps):
                t = time.perf_counter()
                _, rounds = max_min_rates(ptr, links, coefs, cluster.link_capacity, return_rounds=True)
                times.append(time.perf_counter() - t)
            print(f"{label:<34} {n_flows:>8} {links.size:>9} {rounds:>6} {np.median(times) * 1e3:>11.2f} ms")


if __name__ == "__main__":
    main()
