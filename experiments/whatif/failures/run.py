"""Failures: a spine link down (re-routing, link utilisation before/after) and a NIC down
with and without ``nic_failover: pxn``.

Writes ``results.csv`` (case, outcome, step time or stop instant), ``links.csv`` (bytes and
utilisation of every leaf-spine link before and after the cut), ``failures.png`` (step
times; utilisation of the cut leaf's uplinks before/after; bytes through the failed NIC
and its failover peer) and the Gantt pair (healthy vs spine link down).

Usage: python experiments/whatif/failures/run.py [--smoke] [--out DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import gantt_pair, load_config, merge, out_dir, parse_args, save, step_time_bars, write_csv  # noqa: E402


def utilisation(res) -> np.ndarray:
    """Per physical link: bytes carried over the whole run / (capacity x run time)."""
    end = res.step_bounds[-1][1]
    return np.asarray(res.network.link_bytes) / (np.asarray(res.network.capacity) * end)


def cable_bytes(res, u: str, v: str) -> float:
    c = res.scenario.cluster
    lb = res.network.link_bytes
    return float(lb[c.link_id[(u, v)]] + lb[c.link_id[(v, u)]])


def main(argv=None) -> list[dict]:
    from matplotlib.figure import Figure

    from simulator.engine import run
    from simulator.engine import JobStopped
    args = parse_args("failures", argv, __doc__)
    cfg, out = load_config(args), out_dir(args)
    base = cfg["base"]
    u, v = cfg["failed_link"]
    nic = cfg["failed_nic"]
    healthy = run(base)
    cut = run(merge(base, {"whatif": {"failed_links": [[u, v]]}}))
    rows = [{"case": "healthy", "outcome": "completed", "step_time_s": healthy.metrics["step_time_s"]},
            {"case": f"link {u}--{v} down", "outcome": "completed", "step_time_s": cut.metrics["step_time_s"]}]
    stop = None
    try:
        run(merge(base, {"whatif": {"failed_nics": [nic]}}))
        rows.append({"case": f"{nic} down, no failover", "outcome": "completed"})
    except JobStopped as e:
        stop = e
        rows.append({"case": f"{nic} down, no failover", "outcome": f"stopped: {e}", "stop_time_s": e.time_s,
                     "stop_gpus": " ".join(f"gpu{g}" for g in e.gpus)})
    pxn = run(merge(base, {"whatif": {"failed_nics": [nic], "nic_failover": "pxn"}}))
    rows.append({"case": f"{nic} down, nic_failover: pxn", "outcome": "completed",
                 "step_time_s": pxn.metrics["step_time_s"]})
    for r in rows:
        r["ratio"] = r.get("step_time_s", float("nan")) / healthy.metrics["step_time_s"]
        print(f"{r['case']:<32} {r['outcome'][:90]:<90} "
              + (f"step {r['step_time_s'] * 1e3:.2f} ms ({r['ratio']:.3f}x)" if "step_time_s" in r else ""))
    write_csv(rows, out / "results.csv")
    # link utilisation of every leaf-spine link, before and after
    c = healthy.scenario.cluster
    kinds = [(c.graph.nodes[a]["kind"], c.graph.nodes[b]["kind"]) for a, b in c.link_nodes]
    sel = [i for i, k in enumerate(kinds) if set(k) == {"leaf", "spine"}]
    ub, ua = utilisation(healthy), utilisation(cut)
    write_csv([{"link": f"{c.link_nodes[i][0]}->{c.link_nodes[i][1]}", "bytes_before": float(healthy.network.link_bytes[i]),
                "bytes_after": float(cut.network.link_bytes[i]), "utilisation_before": float(ub[i]),
                "utilisation_after": float(ua[i])} for i in sel], out / "links.csv")
    fig = Figure(figsize=(14, 4.8), dpi=110)
    ax = fig.add_subplot(1, 3, 1)
    done = [r for r in rows if "step_time_s" in r]
    step_time_bars(ax, done, [r["case"].replace(", ", ",\n").replace(" down", "\ndown") for r in done],
                   ["C0", "C3", "C2"][:len(done)], fontsize=8)
    stopped = ("job completed" if stop is None else
               f"job stopped at t = {stop.time_s * 1e3:.1f} ms, {' '.join(f'gpu{g}' for g in stop.gpus)}")
    ax.set_title(f"Step time ({nic} down without failover:\n{stopped})", fontsize=9)
    ax = fig.add_subplot(1, 3, 2)
    leaf = u if c.graph.nodes[u]["kind"] == "leaf" else v
    up = [i for i in sel if leaf in c.link_nodes[i]]
    xs = np.arange(len(up))
    ax.bar(xs - 0.2, [ub[i] * 100 for i in up], 0.4, label="healthy", color="C0")
    ax.bar(xs + 0.2, [ua[i] * 100 for i in up], 0.4, label=f"{u}--{v} down", color="C3")
    ax.set_xticks(xs, [f"{c.link_nodes[i][0]}\n->{c.link_nodes[i][1]}" for i in up], fontsize=8)
    ax.set_ylabel("utilisation over the run (%)")
    ax.set_title(f"Where the re-routed traffic lands:\n{leaf}'s spine links", fontsize=9)
    ax.legend(fontsize=8)
    ax = fig.add_subplot(1, 3, 3)
    g = c.graph
    peer = "nic" + nic[3:].split(".")[0] + "." + str(int(nic.split(".")[1]) + 1)
    names = [nic, peer]
    leaf_of = {n: next(x for x in g.successors(n) if g.nodes[x]["kind"] == "leaf") for n in names}
    xs = np.arange(2)
    ax.bar(xs - 0.2, [cable_bytes(healthy, n, leaf_of[n]) / 1e9 for n in names], 0.4, label="healthy", color="C0")
    ax.bar(xs + 0.2, [cable_bytes(pxn, n, leaf_of[n]) / 1e9 for n in names], 0.4,
           label=f"{nic} down, nic_failover: pxn", color="C2")
    ax.set_xticks(xs, [f"{n} (failed)" if n == nic else f"{n} (failover peer)" for n in names], fontsize=8)
    ax.set_ylabel("bytes through the NIC port, both directions (GB)")
    ax.set_title("NIC failover: the peer's NIC carries the traffic", fontsize=9)
    ax.legend(fontsize=8)
    save(fig, out / "failures.png")
    n = healthy.metrics["num_gpus"]
    gantt_pair(healthy, cut, out, ranks=list(range(0, n, 8)), label=f"link {u}--{v} down (rank 0 of each host)")
    return rows


if __name__ == "__main__":
    main()
