"""How much of a run repeats in its steady phase: the bound on advancing it by whole periods.

Two measurements per scenario (a path, or a case of bench_targets.py):

* the *program's* period (workloads.periodicity): per rank class, the ops per period of
  ``P`` micro-batches and the stretch of the op list that repeats; the periods an engine
  could skip (every class inside its stretch, less two periods to see the state repeat) and
  the share of the step's ops they hold -- an upper bound on what skipping could save;
* with ``--run``, the *timeline's* repetition: the run is simulated, every row (op of a
  cell) is matched with the same op ``P`` micro-batches later, and the shift of its start is
  compared with the most common shift ``T`` (relative difference <= 1e-9). The whole state
  can repeat only where every cell's rows do, so the longest stretch of simulated time in
  which all rows starting there repeat is what a skip could use, in periods of ``T``.

    python benchmarks/bench_periodicity.py llama3.1-405b-256xgb200-vpp4
    python benchmarks/bench_periodicity.py experiments/configs/llama3-70b-64xh100.yaml --run
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_targets import CASES  # noqa: E402

from simulator.engine.simulate import _program, run  # noqa: E402
from simulator.scenario import load_scenario  # noqa: E402
from workloads.periodicity import periodicity  # noqa: E402


def program_bound(sc) -> tuple:
    prog, _ = _program(sc, None, None)
    t = time.perf_counter()
    per = periodicity(prog)
    wall = time.perf_counter() - t
    ls = sorted({c.ops for c in per.classes})
    print(f"program: {len(prog.classes)} classes, {per.total_ops:,} ops per step; period {per.microbatches} "
          f"micro-batches, {ls[0]}-{ls[-1]} ops per class; whole periods inside every class's stretch: "
          f"{min(c.periods for c in per.classes)}; skippable {per.skippable_periods} periods = "
          f"{per.skippable_ops:,} ops ({per.skippable_ops / max(per.total_ops, 1):.0%} of the step's) "
          f"[{wall:.1f} s]")
    return per


def timeline_repetition(sc, per) -> None:
    t = time.perf_counter()
    res = run(sc)
    print(f"run: {time.perf_counter() - t:.1f} s, {res.metrics['num_events']:,} events, "
          f"step {res.metrics['step_time_s']:.6f} s")
    repetition(res.timeline, per.microbatches)


def repetition(tl, microbatches: int) -> None:
    """Print how much of the timeline ``tl`` repeats ``microbatches`` later (module docstring)."""
    import numpy as np
    tl = tl[tl.microbatch >= 0].copy()
    key = ["cell", "step", "stream", "name", "layer", "chunk", "phase"]
    tl["occ"] = tl.groupby(key + ["microbatch"]).cumcount()
    nxt = tl.assign(microbatch=tl.microbatch - microbatches)
    m = tl.merge(nxt, on=key + ["occ", "microbatch"], suffixes=("", "_n"))
    d = (m.start_s_n - m.start_s).to_numpy()
    vals, counts = np.unique(np.round(d, 12), return_counts=True)
    T = float(vals[counts.argmax()])
    ok = np.abs(d - T) <= 1e-9 * T
    print(f"most common shift T = {T:.9f} s ({counts.max() / d.size:.1%} of {d.size:,} matched rows)")
    for step in sorted(m.step.unique()):
        sel = (m.step == step).to_numpy()
        start, flag = m.start_s.to_numpy()[sel], ok[sel]
        order = np.argsort(start, kind="stable")
        start, flag = start[order], flag[order]
        best, run_start, span = 0.0, None, (0.0, 0.0)
        for s, f in zip(start, flag):
            if f:
                run_start = s if run_start is None else run_start
                if s - run_start > best:
                    best, span = s - run_start, (run_start, s)
            else:
                run_start = None
        cells = m[sel].assign(ok=flag[np.argsort(order)]).groupby("cell").ok.mean()
        print(f"step {step}: longest stretch where every row repeats: {best / T:.2f} periods "
              f"(t = {span[0]:.4f}-{span[1]:.4f} s); rows repeating per cell: "
              + " ".join(f"{v:.0%}" for v in cells.to_numpy()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", help="a scenario YAML, or a case name of bench_targets.py")
    ap.add_argument("--run", action="store_true", help="also simulate it and measure the timeline's repetition")
    args = ap.parse_args()
    if args.scenario in CASES:
        sc = load_scenario({**CASES[args.scenario][0], "name": args.scenario})
    else:
        sc = load_scenario(args.scenario)
    per = program_bound(sc)
    if args.run:
        if per.microbatches == 0:
            print("no steady period in the program: nothing to compare")
            return 0
        timeline_repetition(sc, per)
    return 0


if __name__ == "__main__":
    sys.exit(main())
