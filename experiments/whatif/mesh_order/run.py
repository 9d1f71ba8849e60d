"""Mesh order: TP innermost vs EP innermost for MoE jobs on 8-GPU hosts.

For each model and ``parallel.mesh_order``: the step time, how many hosts a TP group, an
expert-TP group and an EP group span (1 = NVLink only), and the exposed TP (dense and
expert TP together) and EP communication.  With Megatron-Core's MoE parallel folding the
dense layers have their own mesh without an EP axis, so EP innermost moves only the
*expert* TP groups off the host; dense TP stays on NVLink either way.  Writes
``results.csv``, ``mesh_order.png`` (step time and exposed TP / EP time per order and
model) and the Gantt pair (TP innermost vs EP innermost) for ``gantt_model``.

Usage: python experiments/whatif/mesh_order/run.py [--smoke] [--out DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import gantt_pair, load_config, merge, out_dir, parse_args, save, write_csv  # noqa: E402


def hosts_spanned(res, kind: str) -> int:
    """Hosts the first group of ``kind`` (``tp`` or ``ep``) spans."""
    grid, c = res.program.grid, res.scenario.cluster
    return len({c.host_of(grid.gpu_of(r)) for r in grid.group(kind, 0)})


def main(argv=None) -> list[dict]:
    from matplotlib.figure import Figure

    from simulator.engine import run
    args = parse_args("mesh_order", argv, __doc__)
    cfg, out = load_config(args), out_dir(args)
    rows, runs = [], {}
    for mname, model in cfg["models"].items():
        for order in cfg["orders"]:
            res = run(merge(cfg["base"], {"model": model, "parallel": {"mesh_order": order}}))
            runs[(mname, order)] = res
            m = res.metrics
            rows.append({"model": mname, "mesh_order": order, "innermost": order.split("-")[0],
                         "step_time_s": m["step_time_s"], "mfu": m["mfu"],
                         "tp_hosts": hosts_spanned(res, "tp"), "etp_hosts": hosts_spanned(res, "etp"),
                         "ep_hosts": hosts_spanned(res, "ep"),
                         "exposed_tp_s": m["exposed_comm_s"].get("tp", 0.0),
                         "exposed_ep_s": m["exposed_comm_s"].get("ep", 0.0)})
            r = rows[-1]
            print(f"{mname:<15} {order:<16} step {r['step_time_s'] * 1e3:8.2f} ms  TP spans {r['tp_hosts']} host(s), "
                  f"expert TP {r['etp_hosts']}, EP {r['ep_hosts']}; exposed TP {r['exposed_tp_s'] * 1e3:.1f} ms, EP {r['exposed_ep_s'] * 1e3:.1f} ms")
    write_csv(rows, out / "results.csv")
    fig = Figure(figsize=(12, 4.6), dpi=110)
    for i, mname in enumerate(cfg["models"]):
        ax = fig.add_subplot(1, len(cfg["models"]), i + 1)
        r = [x for x in rows if x["model"] == mname]
        xs = range(len(r))
        w = 0.27
        ax.bar([x - w for x in xs], [x["step_time_s"] * 1e3 for x in r], w, label="step time", color="C0")
        ax.bar(list(xs), [x["exposed_tp_s"] * 1e3 for x in r], w, label="exposed TP comm", color="C1")
        ax.bar([x + w for x in xs], [x["exposed_ep_s"] * 1e3 for x in r], w, label="exposed EP comm", color="C2")
        for j, x in enumerate(r):
            ax.text(j - w, x["step_time_s"] * 1e3, f"{x['step_time_s'] * 1e3:.0f}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(xs), [f"{x['innermost'].upper()} innermost\n({x['mesh_order']})\nhosts: TP {x['tp_hosts']}, "
                                 f"expert TP {x['etp_hosts']}, EP {x['ep_hosts']}" for x in r], fontsize=8)
        ax.set_ylabel("time per step (ms)")
        ax.set_title(f"{mname}: TP 4 x EP 8 on 8-GPU hosts", fontsize=10)
        ax.legend(fontsize=8)
        ax.margins(y=0.15)
    save(fig, out / "mesh_order.png")
    g = cfg["gantt_model"]
    a, b = runs[(g, cfg["orders"][0])], runs[(g, cfg["orders"][1])]
    gantt_pair(a, b, out, ranks=list(range(0, 32, 4)), label=f"{g}, EP innermost ({cfg['orders'][1]}); ranks 0, 4, ...")
    return rows


if __name__ == "__main__":
    main()
