"""Topology: full bisection vs 2:1 and 4:1 oversubscription, rail-optimised or not, and
NVLink domain 8 vs 72 for an MoE job -- the same job on each.

Writes ``results.csv`` (study, setting, step time, ratio to the first setting, exposed
communication per axis, mean IB utilisation), ``topology.png`` (one panel per question)
and the Gantt pair of full bisection vs 4:1.

Usage: python experiments/whatif/topology/run.py [--smoke] [--out DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import gantt_pair, load_config, merge, out_dir, parse_args, save, step_time_bars, write_csv  # noqa: E402


def main(argv=None) -> list[dict]:
    from matplotlib.figure import Figure

    from simulator.engine import run
    args = parse_args("topology", argv, __doc__)
    cfg, out = load_config(args), out_dir(args)
    studies = {
        "oversubscription": [(f"{o}:1", merge(cfg["dense"], {"cluster": {"oversubscription": o}}))
                             for o in cfg["oversubscription"]],
        "rail_optimized": [("rail-optimised" if r else "not rail-optimised",
                            merge(cfg["dense"], {"cluster": {"rail_optimized": r}})) for r in cfg["rail_optimized"]],
        "nvlink_domain": [(f"NVLink domain {d}", merge(cfg["moe"], {"cluster": {"nvlink_domain_size": d}}))
                          for d in cfg["nvlink_domain_size"]],
    }
    rows, runs = [], {}
    for study, settings in studies.items():
        first = None
        for label, sc in settings:
            res = run(sc)
            runs[(study, label)] = res
            first = first or res
            m = res.metrics
            rows.append({"study": study, "setting": label, "num_gpus": m["num_gpus"], "step_time_s": m["step_time_s"],
                         "ratio": m["step_time_s"] / first.metrics["step_time_s"], "mfu": m["mfu"],
                         **{f"exposed_{k}_s": v for k, v in sorted(m["exposed_comm_s"].items())},
                         "ib_utilization": m["link_utilization"].get("ib", 0.0)})
            print(f"{study:<17} {label:<20} step {m['step_time_s'] * 1e3:9.2f} ms  ratio {rows[-1]['ratio']:.3f}  "
                  f"exposed {dict((k, round(v * 1e3, 2)) for k, v in m['exposed_comm_s'].items())} ms")
    write_csv(rows, out / "results.csv")
    fig = Figure(figsize=(13, 4.6), dpi=110)
    titles = {"oversubscription": "Fat-tree oversubscription\n(Llama-3 8B, TP 8 x DP 8, 64 H100)",
              "rail_optimized": "Rail optimisation\n(same job, full bisection)",
              "nvlink_domain": "NVLink domain size, MoE job\n(Qwen3-30B-A3B-like, EP 72 x DP 2, 144 GB200)"}
    for i, study in enumerate(studies):
        ax = fig.add_subplot(1, 3, i + 1)
        r = [x for x in rows if x["study"] == study]
        step_time_bars(ax, r, [x["setting"] for x in r], [f"C{j}" for j in range(len(r))])
        ax.set_title(titles[study], fontsize=10)
    save(fig, out / "topology.png")
    o = cfg["oversubscription"]
    a, b = runs[("oversubscription", f"{o[0]}:1")], runs[("oversubscription", f"{o[-1]}:1")]
    n = a.metrics["num_gpus"]
    gantt_pair(a, b, out, ranks=list(range(0, n, 8)), label=f"{o[-1]}:1 oversubscribed fat-tree (rank 0 of each host)")
    return rows


if __name__ == "__main__":
    main()
