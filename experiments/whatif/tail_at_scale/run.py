"""Tail at scale: step time vs GPU count with gpu_step jitter (and op jitter) at fixed severity.

Pure DP on N GPUs; every GPU's compute is slowed by lognormal(0, sigma) factors drawn
either once per GPU per step (``gpu_step``: persistent per-step slowness) or once per
compute op (``op``: independent noise).  The gradient reduction and the grad-norm
all-reduce wait for the slowest GPU, so with ``gpu_step`` the step grows like the expected
maximum of N draws (plotted beside it, E[max] from
:func:`simulator.engine.expected_max_lognormal`), while per-op noise averages out over a
step's many ops.  Writes ``results.csv``, ``tail_at_scale.png`` and the Gantt pair (no
jitter vs gpu_step jitter at ``gantt_gpus``).

Usage: python experiments/whatif/tail_at_scale/run.py [--smoke] [--out DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import gantt_pair, load_config, merge, new_axes, out_dir, parse_args, save, write_csv  # noqa: E402


def scenario(cfg: dict, n: int, scope: str | None, seed: int) -> dict:
    base = {k: v for k, v in cfg["base"].items() if k != "microbatches_per_gpu"}
    sc = merge(base, {"cluster": {"num_nodes": n // 8}, "seed": seed,
                      "parallel": {"dp": n, "global_batch_size": n * cfg["base"]["microbatches_per_gpu"]}})
    if scope:
        sc["whatif"] = {"jitter": {"scope": scope, "dist": f"lognormal(0, {cfg['sigma']})"}}
    return sc


def seeds_for(cfg: dict, n: int) -> list:
    """The seeds run at ``n`` GPUs: ``seeds``, or ``large_seeds`` from ``large_from`` GPUs on
    (nothing folds under jitter, so a 16,384-GPU run is one actor per GPU: about a minute)."""
    if "large_from" in cfg and n >= cfg["large_from"]:
        return cfg["large_seeds"]
    return cfg["seeds"]


def main(argv=None) -> list[dict]:
    from simulator.engine import run
    from simulator.engine import expected_max_lognormal
    args = parse_args("tail_at_scale", argv, __doc__)
    cfg, out = load_config(args), out_dir(args)
    sigma = cfg["sigma"]
    rows, keep = [], {}
    for n in cfg["num_gpus"]:
        base = run(scenario(cfg, n, None, 0))
        t0 = base.metrics["step_time_s"]
        # the compute part of the step: the slowest rank's busy compute time
        tl = base.timeline[(base.timeline["step"] == 1) & (base.timeline["stream"] == "compute")]
        c0 = float((tl["end_s"] - tl["start_s"]).groupby(tl["cell"]).sum().max())
        if n == cfg["gantt_gpus"]:
            keep[(n, None)] = base          # (only the Gantt's size is kept: a 16k-GPU result is ~1 GB)
        emax = expected_max_lognormal(n, 0.0, sigma)
        for scope in ("gpu_step", "op"):
            ratios = []
            for seed in seeds_for(cfg, n):
                res = run(scenario(cfg, n, scope, seed))
                if n == cfg["gantt_gpus"]:
                    keep[(n, scope)] = keep.get((n, scope), res)
                ratios.append(res.metrics["step_time_s"] / t0)
            rows.append({"num_gpus": n, "scope": scope, "sigma": sigma, "seeds": len(ratios), "base_step_s": t0,
                         "compute_share": c0 / t0, "ratio_mean": float(np.mean(ratios)),
                         "ratio_min": float(np.min(ratios)), "ratio_max": float(np.max(ratios)),
                         "expected_max_factor": emax, "expected_step_ratio": 1 + c0 / t0 * (emax - 1)})
            r = rows[-1]
            print(f"N={n:5d} {scope:<8} step/base {r['ratio_mean']:.4f} [{r['ratio_min']:.4f}, {r['ratio_max']:.4f}]"
                  f"  E[max]={r['expected_max_factor']:.4f}  expected step ratio {r['expected_step_ratio']:.4f}")
    write_csv(rows, out / "results.csv")
    nseeds = sorted({r["seeds"] for r in rows}, reverse=True)
    seeds_txt = f"{len(cfg['seeds'])} seeds" if len(nseeds) == 1 else \
        f"{nseeds[0]} seeds, {nseeds[-1]} from {cfg['large_from']:,} GPUs"
    fig, ax = new_axes(f"Tail at scale: pure DP, compute jitter lognormal(0, {sigma}), mean of {seeds_txt}",
                       "GPUs (N, log scale)", "step time / step time without jitter")
    ns = cfg["num_gpus"]
    for scope, color in (("gpu_step", "C3"), ("op", "C0")):
        r = [x for x in rows if x["scope"] == scope]
        ax.errorbar(ns, [x["ratio_mean"] for x in r],
                    yerr=[[x["ratio_mean"] - x["ratio_min"] for x in r], [x["ratio_max"] - x["ratio_mean"] for x in r]],
                    marker="o", capsize=3, color=color, label=f"simulated, scope {scope} (min-max over seeds)")
    r = [x for x in rows if x["scope"] == "gpu_step"]
    ax.plot(ns, [x["expected_max_factor"] for x in r], ls="--", color="k", label="E[max of N draws] (factor)")
    ax.plot(ns, [x["expected_step_ratio"] for x in r], ls=":", color="grey",
            label="1 + compute share x (E[max] - 1)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) if n < 1000 else f"{n // 1024}k" for n in ns])
    ax.minorticks_off()
    ax.legend(fontsize=9)
    save(fig, out / "tail_at_scale.png")
    g = cfg["gantt_gpus"]
    if (g, None) in keep:
        ranks = list(range(min(g, 16)))
        gantt_pair(keep[(g, None)], keep[(g, "gpu_step")], out, ranks=ranks,
                   label=f"gpu_step jitter lognormal(0, {sigma}), {g} GPUs (first {len(ranks)} shown)")
    return rows


if __name__ == "__main__":
    main()
