"""A textbook configuration search, with the real simulator.

A textbook example brute-forces the 28 factorisations (d, p, t) of 64 devices for a 70B model on
8 nodes of 8 GPUs, one node per rack and a 25 GB/s cross-rack fabric, with a transparent
cost model, and finds (1, 8, 8) cheapest; its exercise raises the fabric to 200 GB/s.
Here the same 28 shapes run on the pinned case-study scenario (Llama-3-70B shape, seq
4096, global batch 128, micro-batch 1, 1F1B, ZeRO-1 with fp32 gradient reduction, full
recomputation: tests/simulator/test_case_study.py): the memory model prunes, the
closed-form estimate ranks, the event simulator (with contention) times every feasible
shape.  Then the full search (every knob: schedule, micro-batch, recompute, ZeRO stage,
...) shows what a search over more than (d, p, t) finds.

Writes results/configuration_search/{shapes.csv, search_25GBps.csv, shapes.png} and
prints the answer for each fabric next to the text's.  Resumable (SQLite per fabric);
about 5 minutes on 2 cores.

Run: python experiments/configuration_search_example.py [--workers N] [--quick]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from simulator.explore.estimate import Estimator
from simulator.scenario import load_scenario
from simulator.explore.search import SearchSpec, search
from simulator.explore.sweep import LocalExecutor, Store, config_hash, run_points
from workloads import memory_estimates

OUT = Path("results/configuration_search")
FABRICS = ("25 GB/s", "200 GB/s")


def scenario(dp: int, pp: int, tp: int, xrack: str) -> dict:
    return {"model": "llama3-70b",
            "cluster": {"preset": "dgx-h100", "num_nodes": 8, "hosts_per_rack": 1, "xrack_bandwidth_per_host": xrack},
            "parallel": {"tp": tp, "pp": pp, "dp": dp, "micro_batch_size": 1, "global_batch_size": 128,
                         "seq_len": 4096, "recompute": "full", "zero_stage": 1, "distributed_optimizer": True,
                         "sequence_parallel": tp > 1},
            "num_steps": 2}


# -- the text's cost model (Code 16.9.1), restated to compare against -------------------------
TEXT = {"P": 70e9, "bytes_state": 16, "L": 80, "act": 3.0e9, "mem": 80e9, "gpn": 8, "m": 16, "t_stage": 8.0e-3,
        "bw_fast": 600e9, "bw_pipe": 100e9}


def text_cost(dp: int, pp: int, tp: int, bw_data: float) -> tuple[float, float]:
    """(communication seconds per step, bytes per device) of the text's model."""
    t = TEXT
    mem = t["bytes_state"] * t["P"] / (dp * pp * tp) + t["act"] / (pp * tp)
    layer = t["bytes_state"] * t["P"] / t["L"]
    bw_t = t["bw_fast"] if tp <= t["gpn"] else t["bw_pipe"]
    cost = (tp - 1) * layer / (tp * bw_t) if tp > 1 else 0.0
    cost += (pp - 1) * t["act"] / (pp * t["bw_pipe"]) if pp > 1 else 0.0
    cost += (pp - 1) / t["m"] * t["t_stage"] if pp > 1 else 0.0
    cost += (dp - 1) * (t["bytes_state"] * t["P"] / (pp * tp)) / (dp * bw_data) if dp > 1 else 0.0
    return cost, mem


def shapes() -> list[tuple[int, int, int]]:
    out = []
    for tp in (1, 2, 4, 8, 16, 32, 64):
        for pp in (1, 2, 4, 8, 16, 32, 64):
            if 64 % (tp * pp) == 0 and pp <= 80:
                out.append((64 // (tp * pp), pp, tp))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="skip the full-knob search")
    ap.add_argument("--plot-only", action="store_true", help="redraw the plot from shapes.csv")
    args = ap.parse_args()
    if args.plot_only:
        plot(pd.read_csv(OUT / "shapes.csv"), OUT / "shapes.png")
        return
    OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    with LocalExecutor(args.workers) as ex:
        for fabric in FABRICS:
            bw = float(fabric.split()[0]) * 1e9
            est = None
            todo = []
            for dp, pp, tp in shapes():
                tc, tm = text_cost(dp, pp, tp, bw)
                row = {"fabric": fabric, "dp": dp, "pp": pp, "tp": tp, "text_comm_ms": tc * 1e3,
                       "text_mem_gb": tm / 1e9, "status": "ok", "reason": "", "mem_gb": math.nan,
                       "est_step_s": math.nan, "sim_step_s": math.nan, "sim_mfu": math.nan}
                cfg = scenario(dp, pp, tp, fabric)
                try:
                    sc = load_scenario(cfg)
                    mem = memory_estimates(sc.model, sc.parallel, gpu_hbm_bytes=sc.cluster.gpu.hbm_bytes)
                    worst = max(mem, key=lambda e: e.total_bytes)
                    row["mem_gb"] = worst.total_bytes / 1e9
                    if not all(e.fits() for e in mem):
                        row["status"], row["reason"] = "oom", worst.verdict()
                    else:
                        est = est or Estimator(sc.cluster)
                        row["est_step_s"] = est.estimate(sc, mem)["step_time_s"]
                        todo.append((len(rows), cfg))
                except Exception as e:          # ConfigError: e.g. tp beyond the attention heads' split
                    row["status"], row["reason"] = "invalid", str(e)
                rows.append(row)
            store = Store(OUT / f"shapes_{fabric.split()[0]}GBps.sqlite")
            run_points([c for _, c in todo], store, ex, desc=f"shapes @ {fabric}")
            got = {r["hash"]: r for r in store.rows()}
            for i, cfg in todo:
                r = got[config_hash(cfg)]
                if r["status"] == "ok":
                    rows[i]["sim_step_s"] = r["metrics"]["step_time_s"]
                    rows[i]["sim_mfu"] = r["metrics"]["mfu"]
                else:
                    rows[i]["status"], rows[i]["reason"] = r["status"], r["error"]
    df = pd.DataFrame(rows)
    df.to_csv(OUT / "shapes.csv", index=False)
    print(f"{len(shapes())} shapes (d, p, t) of 64 GPUs, as in the text\n")
    for fabric in FABRICS:
        sub = df[df["fabric"] == fabric]
        text_best = sub.loc[sub["text_comm_ms"].idxmin()]
        ok = sub[sub["sim_step_s"].notna()].sort_values("sim_step_s")
        print(f"== cross-rack fabric {fabric} ==")
        print(f"  text's model: best (d, p, t) = ({text_best.dp}, {text_best.pp}, {text_best.tp}), "
              f"{text_best.text_comm_ms:.1f} ms of communication; it calls all 28 shapes feasible")
        print(f"  memory model: {int((sub.status == 'oom').sum())} shapes out of memory, "
              f"{int((sub.status == 'invalid').sum())} invalid, {len(ok)} simulated")
        for _, r in ok.head(5).iterrows():
            print(f"    ({r.dp:>2}, {r.pp:>2}, {r.tp:>2})  simulated {r.sim_step_s:6.2f} s  (estimate {r.est_step_s:6.2f} s)"
                  f"  MFU {r.sim_mfu:5.1%}  {r.mem_gb:5.1f} GB")
        b = ok.iloc[0]
        t118 = sub[(sub.dp == 1) & (sub.pp == 8) & (sub.tp == 8)].iloc[0]
        t818 = sub[(sub.dp == 8) & (sub.pp == 1) & (sub.tp == 8)].iloc[0]
        print(f"  simulator: best ({b.dp}, {b.pp}, {b.tp}) {b.sim_step_s:.2f} s; the text's (1, 8, 8) "
              f"{t118.sim_step_s:.2f} s; the first launch (8, 1, 8) {t818.sim_step_s:.2f} s "
              f"[{t818.status}]\n")
    if not args.quick:
        spec = SearchSpec.from_dict({"model": "llama3-70b",
                                     "cluster": scenario(1, 8, 8, "25 GB/s")["cluster"],
                                     "global_batch_size": 128, "seq_len": 4096, "simulate": 8})
        store = Store(OUT / "search_25GBps.sqlite")
        with LocalExecutor(args.workers) as ex:
            res = search(spec, executor=ex, store=store)
        tab = res["table"]
        tab.to_csv(OUT / "search_25GBps.csv", index=False)
        c = res["counts"]
        print(f"== full search at 25 GB/s: {c['candidates']} candidates, {c['invalid']} invalid, {c['oom']} out of "
              f"memory, {c['ok']} feasible ({res['timing']['screened_per_s']:.0f} screened/s), "
              f"{c['simulated']} simulated ==")
        for _, r in tab[tab.sim_step_s.notna()].head(5).iterrows():
            print(f"    tp{r.tp} cp{r.cp} pp{r.pp} dp{r.dp} mbs{r.micro_batch_size} {r.schedule}"
                  f"{' vpp' + str(r.vpp) if r.vpp > 1 else ''} {r.recompute} ZeRO-{r.zero_stage}: "
                  f"{r.sim_step_s:.2f} s (estimate {r.est_step_s:.2f} s), {r.memory_gb:.0f} GB")
    plot(df, OUT / "shapes.png")
    print(f"wrote {OUT / 'shapes.csv'} and {OUT / 'shapes.png'}")


def plot(df: pd.DataFrame, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 6))
    for ax, fabric in zip(axes, FABRICS):
        sub = df[df["fabric"] == fabric].copy()
        sub["label"] = [f"({r.dp},{r.pp},{r.tp})" for r in sub.itertuples()]
        ok = sub[sub["sim_step_s"].notna()].sort_values("sim_step_s")
        bad = sub[sub["sim_step_s"].isna()]
        y = range(len(ok))
        ax.barh(list(y), ok["sim_step_s"], color="tab:blue", label="simulated step time")
        ax.scatter(ok["est_step_s"], list(y), marker="|", s=120, color="black", zorder=3, label="closed-form estimate")
        ax.set_yticks(list(y))
        ax.set_yticklabels(ok["label"], fontsize=8)
        text_best = sub.loc[sub["text_comm_ms"].idxmin()]
        for j, r in enumerate(ok.itertuples()):
            if (r.dp, r.pp, r.tp) == (text_best.dp, text_best.pp, text_best.tp):
                ax.text(r.sim_step_s * 1.35, j, "← the text's pick", va="center", fontsize=8, color="crimson")
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("step time (s, log scale)")
        for j, r in enumerate(ok.itertuples()):
            ax.text(r.sim_step_s * 1.04, j, f"{r.sim_step_s:.1f}", va="center", fontsize=7)
        ax.set_title(f"cross-rack {fabric}: {len(ok)} feasible of {len(sub)} shapes (d,p,t)\n"
                     f"{len(bad)} not simulated: " + ", ".join(f"{s}" for s in sorted(bad['status'].unique())),
                     fontsize=10)
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
    for ax in axes:
        ax.set_ylabel("shape (d, p, t), fastest first")
    fig.suptitle("Llama-3-70B, 64 H100 (8 hosts, one per rack), GBS 128: the 28 shapes of Code 16.9.1, simulated")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


if __name__ == "__main__":
    main()
