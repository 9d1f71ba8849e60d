"""The goodput picture: the distribution of time to train and where the wall time went."""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["goodput_figure", "sweep_figure"]

_KINDS = (("productive", "steps kept"), ("checkpoint", "checkpoint writes"), ("lost_work", "steps lost (redone)"),
          ("lost_checkpoint", "checkpoint writes lost"), ("restart", "restarts"),
          ("spare_wait", "waiting for a spare node"), ("degraded", "slower steps (replicas down, slow GPUs)"))


def goodput_figure(result, path: Path) -> Path:
    """Two panels: a histogram of time to train over the Monte Carlo runs (days, with the
    mean, p50 and p90 marked) and the mean time per kind (hours)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result.summary()
    days = result.wall_s / 86400.0
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1.2, 1]})
    a.hist(days, bins=min(40, max(10, len(days) // 5)), color="#4c72b0", alpha=0.85)
    for v, label, ls in ((s["wall_p50_s"], "p50", "-"), (s["wall_p90_s"], "p90", "--")):
        a.axvline(v / 86400.0, color="#c44e52", ls=ls, lw=1.5, label=f"{label} {v / 86400.0:.2f} d")
    a.set_xlabel("time to train (days)")
    a.set_ylabel("runs")
    a.set_title(f"time to train over {s['runs']} runs\n(without failures {result.model.work_s / 86400.0:.2f} d; "
                f"goodput {s['goodput']:.1%})", fontsize=10)
    a.legend(fontsize=8)
    kinds = [(k, lab) for k, lab in _KINDS[1:] if k in s["time_s"]]
    hours = np.array([s["time_s"][k] / 3600.0 for k, _ in kinds])
    b.barh([lab for _, lab in kinds], hours, color="#dd8452")
    for y, h in enumerate(hours):
        b.text(h, y, f" {h:,.0f} h", va="center", fontsize=8)
    b.set_xlabel("mean hours per run")
    b.set_title("wall time not spent on kept steps", fontsize=10)
    b.set_xlim(0, max(hours.max() * 1.25, 1e-9))
    b.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


#: Units of the ``--sweep`` keys, for the x-axis label.
SWEEP_UNITS = {"checkpoint_interval": "s", "checkpoint_s": "s", "storage_gbps": "GB/s",
               "storage_node_gbps": "GB/s", "restart_s": "s", "failure_scale": "x the failure rates",
               "spares": "nodes", "repair_h": "h", "replicas": "data-parallel replicas",
               "slow_rate": "per GPU-hour", "slow_factor": "x the step", "detect_h": "h"}


def axis_label(key: str) -> str:
    """A swept key with its unit: ``checkpoint_interval (s)``."""
    unit = SWEEP_UNITS.get(key)
    return f"{key} ({unit})" if unit else key


def _label(v) -> str:
    return f"{v:g}" if isinstance(v, (int, float)) else str(v)


def sweep_figure(rows: list[dict], keys: list[str], path: Path) -> Path:
    """Time to train (mean, with p50 to p90 as a bar) and goodput against the first swept key,
    one line per combination of the others."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first, rest = keys[0], keys[1:]
    xs = list(dict.fromkeys(_label(r[first]) for r in rows))
    groups: dict = {}
    for r in rows:
        groups.setdefault(", ".join(f"{k}={_label(r[k])}" for k in rest), []).append(r)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, (name, rs) in enumerate(groups.items()):
        x = np.array([xs.index(_label(r[first])) for r in rs]) + (i - (len(groups) - 1) / 2) * 0.04
        mean = np.array([r["time_to_train_days"] for r in rs])
        lo = mean - np.array([r["p50_days"] for r in rs])
        hi = np.array([r["p90_days"] for r in rs]) - mean
        a.errorbar(x, mean, yerr=[np.maximum(lo, 0), np.maximum(hi, 0)], marker="o", capsize=3, label=name or None)
        b.plot(x, [100 * r["goodput"] for r in rs], marker="o", label=name or None)
    for ax in (a, b):
        ax.set_xticks(range(len(xs)), xs)
        ax.set_xlabel(axis_label(first))
        ax.grid(alpha=0.3)
        if len(groups) > 1:
            ax.legend(fontsize=7)
    a.set_ylabel("time to train (days): mean, bar p50 to p90")
    if max(r["time_to_train_days"] for r in rows) > 8 * min(r["time_to_train_days"] for r in rows):
        a.set_yscale("log")
    b.set_ylabel("goodput (%)")
    a.set_title("time to train", fontsize=10)
    b.set_title("goodput (time on kept steps / wall time)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

