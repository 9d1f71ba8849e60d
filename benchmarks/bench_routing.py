"""Benchmark: build the 16,384-GPU preset and route between random GPU pairs.

Run: python benchmarks/bench_routing.py
"""

from __future__ import annotations

import time

import numpy as np

from topologies import build_cluster


def main() -> None:
    t0 = time.perf_counter()
    c = build_cluster("h100-16k")
    t_build = time.perf_counter() - t0
    print(f"build h100-16k: {c.num_gpus} GPUs, {c.table.num_nodes} nodes, {c.num_links} links "
          f"in {t_build:.2f} s")
    rng = np.random.default_rng(0)
    pairs = rng.integers(0, c.num_gpus, size=(100_000, 2))
    t0 = time.perf_counter()
    for a, b in pairs:
        c.route(int(a), int(b))
    t_cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    for a, b in pairs:
        c.route(int(a), int(b))
    t_warm = time.perf_counter() - t0
    print(f"route 100,000 random pairs: {t_cold / 1e5 * 1e6:.1f} us each uncached, {t_warm / 1e5 * 1e6:.2f} us cached")


if __name__ == "__main__":
    main()
