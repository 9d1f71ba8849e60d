"""The goodput picture: the distribution of time to train and where the wall time went."""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["goodput_figure"]

_KINDS = (("productive", "steps kept"), ("checkpoint", "checkpoint writes"), ("lost_work", "steps lost (redone)"),
          ("lost_checkpoint", "checkpoint writes lost"), ("restart", "restarts"))


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
    hours = np.array([s["time_s"][k] / 3600.0 for k, _ in _KINDS[1:]])
    b.barh([lab for _, lab in _KINDS[1:]], hours, color="#dd8452")
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
