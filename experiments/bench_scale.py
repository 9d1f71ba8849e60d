"""Benchmark: wall time, peak memory, events, flows and solves of one simulated step.

Llama-3-70B-like job (TP 8, PP 4, DP = rest, 1F1B, GBS = 8 per replica... see CASES) on
64, 512 and 4,096 H100 GPUs, and Llama-3.1 405B on 16,384 GPUs (TP 8, PP 16, DP 128).
Each case runs ``num_steps: 1``.  ``--max-gpus N`` skips larger cases (the engine does
not fold symmetric ranks yet: every group's collectives run as flows, so cost grows with
the GPU count -- the scale issue's folding removes that).

Run: python experiments/bench_scale.py [--max-gpus 512]
"""

from __future__ import annotations

import argparse
import time
import resource

from simulator.engine import run

LLAMA70B = {"model": "llama3-70b", "precision": "bf16", "num_steps": 1}


def cases():
    for nodes in (8, 64, 512):
        n = nodes * 8
        yield f"llama3-70b, {n} GPUs", n, {**LLAMA70B, "cluster": {"preset": "dgx-h100", "num_nodes": nodes},
                                          "parallel": {"tp": 8, "pp": 4, "dp": -1, "micro_batch_size": 1,
                                                       "global_batch_size": 8 * (n // 32), "seq_len": 8192}}
    yield "llama3.1-405b, 16,384 GPUs", 16384, {
        "model": "llama3.1-405b", "cluster": "h100-16k", "num_steps": 1,
        "parallel": {"tp": 8, "pp": 16, "dp": 128, "micro_batch_size": 1, "global_batch_size": 2048, "seq_len": 8192,
                     "num_layers_in_first_pipeline_stage": 7, "num_layers_in_last_pipeline_stage": 7}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-gpus", type=int, default=512)
    args = ap.parse_args()
    print(f"{'case':<28} {'wall':>8} {'peak RSS':>9} {'events':>9} {'flows':>9} {'solves':>8} {'step':>9} {'MFU':>6}")
    for label, n, sc in cases():
        if n > args.max_gpus:
            print(f"{label:<28} skipped (over --max-gpus {args.max_gpus})")
            continue
        t0 = time.perf_counter()
        res = run(sc)
        wall = time.perf_counter() - t0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Linux: KiB; process peak so far
        m = res.metrics
        print(f"{label:<28} {wall:7.1f}s {peak / 2**20:7.0f}MiB {m['num_events']:>9} {m['num_flows']:>9} "
              f"{m['num_solves']:>8} {m['step_time_s']:8.3f}s {m['mfu']:6.1%}")


if __name__ == "__main__":
    main()
