"""Each opt-in approximation against the exact path, on the same scenarios.

For ``coupled_all_to_all`` (an all-to-all as one coupled flow per source rank): mixture-of-
experts jobs with balanced, skewed and Zipf routing, expert parallelism 8 to 64, on 64 to 2,048
H100s, each run exactly and approximately in this process.  Prints, per scenario, both step
times, the approximation's error, both wall times and the speed-up; then the error's median
and worst case.  The scenarios are the largest of their kind whose exact run takes well under
ten minutes on a 2-core machine.

    python benchmarks/bench_approximations.py               # every scenario (about 30 minutes)
    python benchmarks/bench_approximations.py --list
    python benchmarks/bench_approximations.py --case NAME   # one, or several: --case A --case B
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

from simulator import load_scenario, run


def _moe(model, gpus, routing, *, tp=1, pp=2, ep=8, gbs=64, seq=4096, **extra) -> dict:
    par = {"tp": tp, "pp": pp, "ep": ep, "dp": -1, "global_batch_size": gbs, "seq_len": seq, **extra}
    return {"model": model, "cluster": {"preset": "dgx-h100", "num_nodes": gpus // 8}, "moe_routing": routing,
            "seed": 1, "parallel": par}


def _label(routing: str) -> str:
    return routing.replace("(", "").replace(")", "")       # zipf(1.2) -> zipf1.2: a name a shell takes


ROUTINGS = ("balanced", "skew(1.5)", "zipf(1.0)", "zipf(1.2)", "zipf(1.5)")
SCENARIOS = {}
for r in ROUTINGS:
    SCENARIOS[f"mixtral-8x7b-64-ep8-{_label(r)}"] = _moe("mixtral-8x7b", 64, r, tp=2, pp=4, ep=8, gbs=32)
for r in ("balanced", "zipf(1.2)", "zipf(1.5)"):
    SCENARIOS[f"qwen3-30b-64-ep8-{_label(r)}"] = _moe("qwen3-30b-a3b", 64, r, pp=2, ep=8)
    SCENARIOS[f"qwen3-30b-64-ep32-{_label(r)}"] = _moe("qwen3-30b-a3b", 64, r, pp=2, ep=32)
for r in ("balanced", "zipf(1.2)", "zipf(1.5)"):
    SCENARIOS[f"qwen3-235b-256-ep32-{_label(r)}"] = _moe("qwen3-235b-a22b", 256, r, pp=2, ep=32, gbs=256)
for r in ("skew(1.5)", "zipf(1.2)"):
    SCENARIOS[f"mixtral-8x22b-128-ep8-{_label(r)}"] = _moe("mixtral-8x22b", 128, r, tp=4, pp=4, ep=8, gbs=32)
for r in ("balanced", "zipf(1.0)", "zipf(1.2)"):
    SCENARIOS[f"deepseek-v3-512-ep64-{_label(r)}"] = _moe("deepseek-v3", 512, r, pp=8, ep=64, gbs=128,
                                                   num_layers_in_first_pipeline_stage=6,
                                                   num_layers_in_last_pipeline_stage=7)
# the largest the exact path runs in well under ten minutes: DeepSeek-V3 on 2,048 GPUs, 2 micro-batches
SCENARIOS["deepseek-v3-2048-ep64-zipf1.2"] = _moe("deepseek-v3", 2048, "zipf(1.2)", pp=16, ep=64, gbs=256,
                                                 num_layers_in_first_pipeline_stage=4,
                                                 num_layers_in_last_pipeline_stage=1)


def compare(name: str, approximation: str = "coupled_all_to_all") -> dict:
    sc = SCENARIOS[name]
    t0 = time.perf_counter()
    exact = run(copy.deepcopy(sc))
    t1 = time.perf_counter()
    approx = run({**copy.deepcopy(sc), "approximations": [approximation]})
    t2 = time.perf_counter()
    e, a = exact.metrics["step_time_s"], approx.metrics["step_time_s"]
    return {"name": name, "exact_s": e, "approx_s": a, "error": a / e - 1, "exact_wall_s": t1 - t0,
            "approx_wall_s": t2 - t1, "exact_solves": exact.metrics["num_solves"],
            "approx_solves": approx.metrics["num_solves"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", help="run only this scenario (repeatable)")
    ap.add_argument("--list", action="store_true", help="list the scenarios and exit")
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(SCENARIOS))
        return 0
    names = args.case or list(SCENARIOS)
    for n in names:
        if n not in SCENARIOS:
            ap.error(f"--case {n!r}: unknown; --list shows the scenarios")
        load_scenario(copy.deepcopy(SCENARIOS[n]))        # every scenario valid before minutes of runs
    print(f"{'scenario':<36} {'exact s':>9} {'approx s':>9} {'error':>8} {'exact wall':>11} {'approx wall':>12} "
          f"{'speed-up':>9} {'solves':>15}")
    rows = []
    for n in names:
        r = compare(n)
        rows.append(r)
        print(f"{n:<36} {r['exact_s']:9.4f} {r['approx_s']:9.4f} {r['error']:+8.3%} {r['exact_wall_s']:10.1f}s "
              f"{r['approx_wall_s']:11.1f}s {r['exact_wall_s'] / r['approx_wall_s']:8.1f}x "
              f"{r['exact_solves']:>7}->{r['approx_solves']:<7}", flush=True)
    errs = [abs(r["error"]) for r in rows]
    print(f"\n{len(rows)} scenarios: |error| median {statistics.median(errs):.3%}, max {max(errs):.3%}; "
          f"wall time exact {sum(r['exact_wall_s'] for r in rows):.0f} s, "
          f"approximate {sum(r['approx_wall_s'] for r in rows):.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
