"""Straggler sensitivity: step time vs the slowdown (1.0-2.0x) of one GPU by placement.

One GPU computes ``s`` x slower (``whatif: {slow_gpus: {g: s}}``) in five placements:
a TP group, the first and the last pipeline stage, a DP replica, an EP group.  Writes
``results.csv`` (case, slowdown, step time, ratio to the unperturbed step), ``straggler.png``
(step-time ratio vs slowdown, one line per placement, with the ratio the slow GPU's own
compute would give) and the Gantt pair of the ``gantt_case``.

Usage: python experiments/whatif/straggler/run.py [--smoke] [--out DIR] [--config config_16k.yaml]

``config_16k.yaml`` asks the same question of Llama 3.1 405B on 16,384 H100 (TP 8, PP 16,
DP 128): one slow GPU among 16,384 folds into 128 rank cells, so each run takes seconds.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import gantt_pair, load_config, merge, new_axes, out_dir, parse_args, save, write_csv  # noqa: E402


def scenario(cfg: dict, case: dict, slowdown: float) -> dict:
    sc = merge(cfg["base"], {k: v for k, v in case.items() if k != "gpu"})
    if slowdown != 1.0:
        sc["whatif"] = {"slow_gpus": {case["gpu"]: slowdown}}
    return sc


def compute_share(res, gpu: int) -> float:
    """Busy compute seconds of ``gpu``'s rank in the reported step, over the step time."""
    tl = res.rank_timeline([gpu])
    tl = tl[(tl["step"] == tl["step"].max()) & (tl["stream"] == "compute")]
    return float((tl["end_s"] - tl["start_s"]).sum()) / res.metrics["step_time_s"]


def main(argv=None) -> list[dict]:
    from simulator.engine import run
    args = parse_args("straggler", argv, __doc__)
    cfg, out = load_config(args), out_dir(args)
    rows, runs = [], {}
    for name, case in cfg["cases"].items():
        base = share = None
        for s in cfg["slowdowns"]:
            res = run(scenario(cfg, case, s))
            if name == cfg["gantt_case"]:     # (only the Gantt's runs are kept: 16k-GPU results are large)
                runs[(name, s)] = res
            if base is None:            # the first slowdown's run is the reference
                base, share = res, compute_share(res, case["gpu"])
            rows.append({"case": name, "gpu": case["gpu"], "slowdown": s, "step_time_s": res.metrics["step_time_s"],
                         "ratio": res.metrics["step_time_s"] / base.metrics["step_time_s"],
                         "wall_s": res.wall_time_s,
                         "gpu_compute_share": share,
                         "rank_cells": res.metrics["fold"]["rank_cells"]})
            print(f"{name:<15} x{s:<5g} step {res.metrics['step_time_s'] * 1e3:9.2f} ms  ratio {rows[-1]['ratio']:.3f}")
    write_csv(rows, out / "results.csv")
    fig, ax = new_axes(f"One slow GPU: step-time ratio vs its compute slowdown ({cfg.get('title', '32 H100')})",
                       "slowdown of one GPU's compute (x)", "step time / unperturbed step time")
    for name in cfg["cases"]:
        r = [x for x in rows if x["case"] == name]
        ax.plot([x["slowdown"] for x in r], [x["ratio"] for x in r], marker="o", label=name.replace("_", " "))
    xs = cfg["slowdowns"]
    ax.plot(xs, xs, ls=":", color="grey", label="step x slowdown (upper bound)")
    ax.legend(fontsize=9)
    save(fig, out / "straggler.png")
    g, s = cfg["gantt_case"], cfg["gantt_slowdown"]
    if (g, s) in runs:
        gpu = cfg["cases"][g]["gpu"]
        gantt_pair(runs[(g, 1.0)], runs[(g, s)], out, label=f"{g.replace('_', ' ')}: gpu{gpu} x{s}", by="stage")
    return rows


if __name__ == "__main__":
    main()
