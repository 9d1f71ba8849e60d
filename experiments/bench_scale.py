"""Benchmark: wall time, peak memory, events, flows, solves and fold cells per simulated job.

Each case runs in its own Python process (so "peak RSS" is that case's).  "load" is
loading the scenario (building the cluster graph); "run" is ``run()``: building the
program, folding it (unless the case says otherwise, "fold" is that part) and
simulating ``num_steps`` steps; "cells" are the rank cells simulated.

Cases (the scale issue's targets in brackets; CPU seconds on a 2-core machine):

* Llama-3 70B, TP 8 PP 4, DP fills 64 / 512 / 1,024 / 4,096 H100 (1 step) [1,024: <= 0.5 s]
* Llama-3.1 405B, 16,384 H100 (h100-16k), TP 8 PP 16 DP 128, 7-layer first and last
  stages, 16 micro-batches, 1F1B, 2 steps: folded [<= 1 s]; one straggler rank (1.2x
  compute: DP unfolded around it) [<= 10 s]; nothing folded (``--unfolded``) [<= 300 s]
* DeepSeek-V3, 2,048 H100, EP 64 PP 16, 2 steps: balanced routing [<= 1 s] (``--moe``);
  Zipf(1.2) expert popularity [<= 60 s] (``--skew``: over 20 minutes today, see docs/performance.md)

Run: python experiments/bench_scale.py [--max-gpus N] [--moe] [--skew] [--unfolded] [--case NAME]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

LLAMA70B = {"model": "llama3-70b", "precision": "bf16", "num_steps": 1}
L405B = {"model": "llama3.1-405b", "cluster": "h100-16k", "num_steps": 2,
         "parallel": {"tp": 8, "pp": 16, "dp": 128, "micro_batch_size": 1, "global_batch_size": 2048,
                      "seq_len": 8192, "num_layers_in_first_pipeline_stage": 7,
                      "num_layers_in_last_pipeline_stage": 7}}
DSV3 = {"model": "deepseek-v3", "cluster": {"preset": "dgx-h100", "num_nodes": 256}, "num_steps": 2,
        "parallel": {"tp": 1, "pp": 16, "dp": 2, "ep": 64, "micro_batch_size": 1, "global_batch_size": 2048,
                     "seq_len": 4096, "num_layers_in_first_pipeline_stage": 4,
                     "num_layers_in_last_pipeline_stage": 1}}


def cases() -> dict:
    """name -> (GPUs, scenario, run() keyword arguments, group)."""
    out = {}
    for nodes in (8, 64, 128, 512):
        n = nodes * 8
        out[f"llama3-70b-{n}"] = (n, {**LLAMA70B, "cluster": {"preset": "dgx-h100", "num_nodes": nodes},
                                      "parallel": {"tp": 8, "pp": 4, "dp": -1, "micro_batch_size": 1,
                                                   "global_batch_size": 8 * (n // 32), "seq_len": 8192}}, {}, "")
    out["llama3.1-405b-16k"] = (16384, L405B, {}, "")
    out["llama3.1-405b-16k-straggler"] = (16384, L405B, {"compute_scale": {5000: 1.2}}, "")
    out["llama3.1-405b-16k-unfolded"] = (16384, L405B, {"fold": False}, "unfolded")
    out["deepseek-v3-2048"] = (2048, {**DSV3, "moe_routing": "balanced"}, {}, "moe")
    out["deepseek-v3-2048-zipf"] = (2048, {**DSV3, "moe_routing": "zipf(1.2)"}, {}, "skew")
    return out


def run_case(name: str) -> dict:
    from simulator.engine import run
    from simulator.scenario import load_scenario
    n, sc, kw, _ = cases()[name]
    t0 = time.perf_counter()
    scenario = load_scenario(sc)                 # builds the cluster (networkx): ~1 s at 16k GPUs
    t1 = time.perf_counter()
    res = run(scenario, **kw)
    wall = time.perf_counter() - t1
    m = res.metrics
    return {"case": name, "gpus": n, "load_s": t1 - t0, "wall_s": wall,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "events": m["num_events"], "flows": m["num_flows"], "solves": m["num_solves"],
            "cells": m["fold"]["rank_cells"], "fold_s": m["fold"].get("wall_s", 0.0),
            "step_s": m["step_time_s"], "mfu": m["mfu"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-gpus", type=int, default=1 << 20)
    ap.add_argument("--moe", action="store_true", help="also run the DeepSeek-V3 balanced-routing case")
    ap.add_argument("--skew", action="store_true", help="also run DeepSeek-V3 with Zipf routing (over 20 min today)")
    ap.add_argument("--unfolded", action="store_true", help="also run the 16,384-GPU case with nothing folded")
    ap.add_argument("--case", help="run one case in this process and print its JSON")
    args = ap.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case)))
        return
    print(f"{'case':<30} {'GPUs':>6} {'load':>6} {'run':>8} {'fold':>6} {'peak RSS':>9} {'events':>9} {'flows':>8} "
          f"{'solves':>7} {'cells':>6} {'step':>9} {'MFU':>6}")
    for name, (n, _, _, group) in cases().items():
        wanted = {"": True, "moe": args.moe, "skew": args.skew, "unfolded": args.unfolded}[group]
        if n > args.max_gpus or not wanted:
            print(f"{name:<30} {n:>6} skipped")
            continue
        out = subprocess.run([sys.executable, __file__, "--case", name], capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{name:<30} {n:>6} failed: {out.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{name:<30} {n:>6} {r['load_s']:5.2f}s {r['wall_s']:7.2f}s {r['fold_s']:5.2f}s {r['peak_rss_mib']:7.0f}MiB "
              f"{r['events']:>9} {r['flows']:>8} {r['solves']:>7} {r['cells']:>6} {r['step_s']:8.3f}s "
              f"{r['mfu']:6.1%}", flush=True)


if __name__ == "__main__":
    main()
