"""Benchmark: configuration-search throughput.

* screening (validation + memory model + closed-form estimate) in candidates per second
  over the whole 64-GPU and 1,024-GPU Llama-3 70B search spaces, in order (as a search
  screens them, so the caches work as they do there);
* simulated candidates per minute for a 1,024-GPU search (the best 8 by estimate), with
  local worker processes and on a 2-worker Dask LocalCluster.

Run: python benchmarks/bench_search.py [--simulate K] [--no-dask]
"""

from __future__ import annotations

import argparse
import tempfile
import time

from simulator.explore.search import SearchSpec, candidates, screen, search
from simulator.explore.sweep import DaskExecutor, LocalExecutor, Store


def spec(nodes: int, simulate: int = 8) -> SearchSpec:
    return SearchSpec.from_dict({"model": "llama3-70b", "cluster": {"preset": "dgx-h100", "num_nodes": nodes},
                                 "global_batch_size": 8 * nodes * 2, "seq_len": 4096, "simulate": simulate,
                                 "num_steps": 1})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--simulate", type=int, default=8)
    ap.add_argument("--no-dask", action="store_true")
    args = ap.parse_args()
    for nodes in (8, 128):
        s = spec(nodes)
        cands = candidates(s)
        t0 = time.perf_counter()
        table = screen(s, cands)
        dt = time.perf_counter() - t0
        ok = int((table["status"] == "ok").sum())
        print(f"{nodes * 8:>5} GPUs: {len(cands)} candidates; screened {len(cands)} in {dt:.1f} s = "
              f"{len(cands) / dt:.0f}/s ({ok} feasible, estimated; the rest invalid or out of memory)", flush=True)
    s = spec(128, args.simulate)
    for label, make in [("local, 2 processes", lambda: LocalExecutor(2))] + \
            ([] if args.no_dask else [("Dask LocalCluster, 2 workers", lambda: DaskExecutor("local", 2))]):
        with make() as ex:
            t0 = time.perf_counter()
            out = search(s, executor=ex, store=Store(tempfile.mkdtemp() + "/b.sqlite"), progress=False)
            sim_s = out["timing"]["simulate_s"]
            print(f"1,024-GPU search, {label}: {out['counts']['simulated']} simulated in {sim_s:.1f} s = "
                  f"{out['counts']['simulated'] / sim_s * 60:.1f} per minute (whole search "
                  f"{time.perf_counter() - t0:.0f} s, best {out['table'].iloc[0]['sim_step_s']:.3f} s)", flush=True)


if __name__ == "__main__":
    main()
