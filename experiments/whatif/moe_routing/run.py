"""MoE routing: step time and exposed expert-parallel time, balanced vs skewed routing.

For each expert-parallel degree, one mixture-of-experts job runs with balanced routing,
with Zipf(s) expert popularity and with a per-expert load file (a ``trace`` CSV that this
study writes: every layer and micro-batch's loads from a seeded Dirichlet draw).  An
uneven routing costs twice: the EP rank holding the hottest experts computes longest, and
its all-to-all moves the most bytes, so every other rank of its EP group waits for it at
the combine.  The table reports, per run, the step time, its ratio to balanced routing at
the same EP degree, the exposed EP (all-to-all) time of the rank that finished last, and
how uneven the routing was (hottest expert's load over the mean, and the busiest EP rank's
over the mean).  Writes ``results.csv``, ``moe_routing.png`` and the Gantt pair (balanced
vs Zipf(1.2) at ``gantt_ep``).

Usage: python experiments/whatif/moe_routing/run.py [--smoke] [--out DIR]
"""

from __future__ import annotations

import csv
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import gantt_pair, load_config, merge, new_axes, out_dir, parse_args, save, write_csv  # noqa: E402


def write_trace(path: Path, sc, alpha: float, seed: int) -> Path:
    """A per-expert load file for scenario ``sc``: for every MoE layer and micro-batch,
    expert shares from Dirichlet(alpha), scaled to the tokens x top_k its EP group routes,
    no expert above every token once."""
    from workloads.moe_routing import _capped
    m, par = sc.model, sc.parallel
    tokens = par.micro_batch_size * par.seq_len // par.cp // (par.tp if par.sequence_parallel else 1)
    pool = par.expert_tp * par.ep * tokens
    total = pool * m.moe.top_k
    rng = np.random.default_rng(seed)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["layer", "microbatch", "expert", "tokens"])
        for layer in range(m.num_layers):
            if not m.is_moe_layer(layer):
                continue
            for mb in range(par.num_microbatches):
                load = _capped(rng.dirichlet(np.full(m.moe.num_experts, alpha)), total, pool)
                w.writerows([layer, mb, e, int(t)] for e, t in enumerate(load.tolist()))
    return path


def unevenness(sc) -> tuple[float, float]:
    """(hottest expert / mean, busiest EP rank / mean) of layer 0's (or the first MoE
    layer's) first micro-batch, as the program routes it."""
    from workloads.moe_routing import expert_load, parse_routing, rank_load
    m, par = sc.model, sc.parallel
    layer = next(i for i in range(m.num_layers) if m.is_moe_layer(i))
    tokens = par.micro_batch_size * par.seq_len // par.cp // (par.tp if par.sequence_parallel else 1)
    load = expert_load(parse_routing(sc.moe_routing), par.expert_tp * par.ep * tokens, m.moe.num_experts,
                       m.moe.top_k, layer=layer, microbatch=0, seed=sc.seed).astype(float)
    ranks = rank_load(load, par.ep).astype(float)
    return float(load.max() / load.mean()), float(ranks.max() / ranks.mean())


def main(argv=None) -> list[dict]:
    from simulator.engine import run
    from simulator.scenario import load_scenario
    args = parse_args("moe_routing", argv, __doc__)
    cfg, out = load_config(args), out_dir(args)
    rows, keep = [], {}
    for ep in cfg["ep"]:                # every layout valid before minutes of runs
        load_scenario(merge(cfg["base"], {"parallel": {"ep": ep}}))
    for ep in cfg["ep"]:
        base = merge(cfg["base"], {"parallel": {"ep": ep}})
        for routing in cfg["routings"]:
            if routing == "trace":
                path = write_trace(out / f"trace_ep{ep}.csv", load_scenario(base), cfg["trace_concentration"],
                                   base.get("seed", 0))
                spec = {"trace": str(path)}
            else:
                spec = routing
            sc = load_scenario(merge(base, {"moe_routing": spec}))
            t0 = time.perf_counter()
            res = run(sc)
            wall = time.perf_counter() - t0
            keep[(ep, routing)] = res
            hot, busiest = unevenness(sc)
            m = res.metrics
            rows.append({"ep": ep, "routing": routing, "step_time_s": m["step_time_s"],
                         "exposed_ep_s": m["breakdown_s"].get("exposed_ep", 0.0), "hot_expert_over_mean": hot,
                         "busiest_ep_rank_over_mean": busiest, "mfu": m["mfu"], "wall_s": wall})
    for r in rows:
        r["ratio"] = r["step_time_s"] / next(x["step_time_s"] for x in rows
                                             if x["ep"] == r["ep"] and x["routing"] == "balanced")
        print(f"EP {r['ep']:3d} {r['routing']:<10} step {r['step_time_s']:8.4f} s ({r['ratio']:.2f}x)  exposed EP "
              f"{r['exposed_ep_s']:7.4f} s  hottest expert {r['hot_expert_over_mean']:5.1f}x mean, busiest EP rank "
              f"{r['busiest_ep_rank_over_mean']:4.2f}x  ({r['wall_s']:.1f} s wall)")
    write_csv(rows, out / "results.csv")
    _plot(rows, cfg, out)
    g = cfg["gantt_ep"]
    if (g, "balanced") in keep and (g, "zipf(1.2)") in keep:
        ranks = list(range(min(g, 16)))
        gantt_pair(keep[(g, "balanced")], keep[(g, "zipf(1.2)")], out, ranks=ranks,
                   label=f"Zipf(1.2) routing, EP {g} (first {len(ranks)} ranks shown)")
    return rows


def _seconds(s: float) -> str:
    return f"{s * 1e3:.0f} ms" if s < 1.0 else f"{s:.2f} s"


def _plot(rows: list[dict], cfg: dict, out: Path) -> None:
    model = cfg["base"]["model"]
    fig, ax = new_axes(f"MoE routing: {model}, step time by routing and expert parallelism",
                       "routing", "step time / balanced routing at the same EP", figsize=(13, 5.5))
    routings = cfg["routings"]
    eps = cfg["ep"]
    width = 0.8 / len(eps)
    for i, ep in enumerate(eps):
        r = [next(x for x in rows if x["ep"] == ep and x["routing"] == name) for name in routings]
        xs = np.arange(len(routings)) + (i - (len(eps) - 1) / 2) * width
        bars = ax.bar(xs, [x["ratio"] for x in r], width, color=f"C{i}", label=f"EP {ep}")
        for b, x in zip(bars, r):
            ax.text(b.get_x() + b.get_width() / 2, b.get_height(),
                    f"{x['ratio']:.2f}x\nEP {_seconds(x['exposed_ep_s'])}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(routings)), ["per-expert file" if n == "trace" else n for n in routings])
    ax.axhline(1.0, color="k", lw=0.8)
    ax.margins(y=0.2)
    ax.legend(title="expert parallel", fontsize=9)
    ax.text(0.01, 0.98, "label: step ratio, then exposed all-to-all time of the rank that finished last",
            transform=ax.transAxes, va="top", fontsize=8, color="0.3")
    save(fig, out / "moe_routing.png")


if __name__ == "__main__":
    main()
