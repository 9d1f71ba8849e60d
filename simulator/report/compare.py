"""Several runs side by side: the table, the breakdown bars, Gantt charts on one time axis
and the ops that changed on the critical path.

``clustersim compare A.yaml B.yaml [...] [--set key=value ...] [--out DIR]`` calls these on
the runs it made; from Python they take :class:`simulator.engine.Result` objects.

*Critical path* here is what the step-time breakdown already follows: the compute stream of
the rank cell that finishes the reported step last.  Its busy time is summed per op name
(``attn``, ``mlp_bwd``, ``experts``...), its idle time per reason (``exposed_<axis>``,
``bubble``, ``host_issue``), so a comparison says which kinds of work or waiting moved,
not only that the exposed communication in total did.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from ..engine.metrics import layout_label as _layout_of
from .charts import _breakdown_color, _fmt
from .style import fit_left_labels, time_unit

__all__ = ["comparison_table", "critical_path_table", "breakdown_comparison", "aligned_gantts", "layout_label",
           "shown_table", "plain_number"]


def layout_label(res) -> str:
    """``TP8 PP4 DP2 1f1b, bf16``: the run's layout in one line (its ``layout`` metric)."""
    return res.metrics.get("layout") or _layout_of(res.scenario)


def comparison_table(results: Sequence, names: Sequence[str], intervals: Sequence | None = None) -> pd.DataFrame:
    """One row per run: step time and its ratio to the first, MFU, tokens/s, peak memory and
    fit, bubble, host issue, the exposed communication per axis (seconds) and, given each run's
    interval (:class:`simulator.validation.intervals.Interval`), the interval of the measured step."""
    base = results[0].metrics["step_time_s"]
    axes = sorted({ax for r in results for ax in r.metrics["exposed_comm_s"]})
    rows = []
    for i, (name, r) in enumerate(zip(names, results, strict=True)):
        m = r.metrics
        row = {"scenario": name, "layout": layout_label(r), "gpus": m["num_gpus"], "step_s": m["step_time_s"],
               "vs_first": m["step_time_s"] / base if base > 0 else np.nan, "mfu": m["mfu"],
               "tokens_per_s": m["tokens_per_s"], "peak_memory_gb": m["peak_memory_bytes"] / 1e9,
               "fits": m.get("memory_fits"), "bubble_s": m["breakdown_s"].get("bubble", 0.0),
               "host_issue_s": m["breakdown_s"].get("host_issue", 0.0),
               **(_interval_cells(r, intervals[i]) if intervals is not None else {})}
        for ax in axes:
            row[f"exposed_{ax}_s"] = m["exposed_comm_s"].get(ax, 0.0)
        rows.append(row)
    return pd.DataFrame(rows)


def _interval_cells(res, iv) -> dict:
    """``likely_low_s``, ``likely_high_s`` (the 80 % interval of the measured step; NaN without
    comparable measurements) and ``comparable_runs``: :mod:`simulator.validation.intervals`."""
    b = iv.bounds(res.metrics["step_time_s"])
    return {"likely_low_s": b[0] if b else np.nan, "likely_high_s": b[1] if b else np.nan,
            "comparable_runs": iv.rows}


def plain_number(v, digits: int = 4) -> str:
    """``v`` in plain decimals, never an exponent, ``digits`` significant digits.

    >>> plain_number(1.5e-05), plain_number(0.053094), plain_number(77152.3), plain_number(1.0), plain_number(0.0)
    ('0.000015', '0.05309', '77150', '1', '0')
    """
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return ""
    if v == 0:
        return "0"
    return np.format_float_positional(float(v), precision=digits, unique=False, fractional=False, trim="-")


#: How the printed comparison shows a row (the CSV and JSON keep the raw numbers); any other
#: row is seconds, in plain decimals.
_SHOWN = {"gpus": lambda v: f"{int(v)}", "comparable_runs": lambda v: f"{int(v)}" if v else "none", "vs_first": lambda v: f"{v:.3f}", "mfu": lambda v: f"{v:.1%}",
          "tokens_per_s": lambda v: f"{v:,.0f}", "peak_memory_gb": lambda v: f"{v:.1f}",
          "fits": lambda v: {True: "yes", False: "NO"}.get(v, "")}


def shown_table(table: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """A table of numbers with one row per quantity (:func:`comparison_table` transposed, or
    :func:`critical_path_table`) as text for the terminal: MFU in %, tokens/s with
    thousands separators, seconds in plain decimals; ``columns`` names the runs."""
    out = table.copy().astype(object)
    for row in out.index:
        fmt = _SHOWN.get(row, plain_number)
        out.loc[row] = [fmt(v) for v in table.loc[row]]
    out.columns = list(columns)
    return out


def _critical_stream(res) -> pd.DataFrame:
    tl = res.timeline
    last = tl[(tl["step"] == tl["step"].max()) & (tl["cell"] == res.metrics["last_cell"])]
    return last[last["stream"] == "compute"]


def critical_path_table(results: Sequence, names: Sequence[str], top: int = 12) -> pd.DataFrame:
    """Seconds per op name (busy) and per idle reason on each run's critical path, the rows
    sorted by how much they changed against the first run (largest first), at most ``top``
    rows plus ``other``; a ``delta_<name>`` column per later run."""
    cols = {}
    for name, r in zip(names, results, strict=True):
        comp = _critical_stream(r)
        busy = (comp["end_s"] - comp["start_s"]).groupby(comp["name"].astype(str)).sum()
        idle = {k: v for k, v in r.metrics["breakdown_s"].items() if k not in ("compute", "recompute")}
        cols[name] = pd.concat([busy, pd.Series(idle, dtype=float)])
    table = pd.DataFrame(cols).fillna(0.0)
    first = names[0]
    for name in names[1:]:
        table[f"delta_{name}"] = table[name] - table[first]
    deltas = table[[f"delta_{n}" for n in names[1:]]].abs().max(axis=1) if len(names) > 1 else table[first]
    table = table.loc[deltas.sort_values(ascending=False).index]
    if len(table) > top:
        rest = table.iloc[top:].sum().rename("other")
        table = pd.concat([table.iloc[:top], rest.to_frame().T])
    table.index.name = "on the critical path"
    return table


def breakdown_comparison(results: Sequence, names: Sequence[str], path: str | Path | None = None, *,
                         title: str = "Step-time breakdown", dpi: int = 100):
    """One stacked horizontal bar per run (its step time split into compute, recompute,
    exposed communication per axis, bubble, host issue), one colour per category across runs,
    on one time axis; each bar ends with its step time and ratio to the first."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cats: list[str] = []
    for r in results:
        for k in r.metrics["breakdown_s"]:
            if k not in cats:
                cats.append(k)
    order = [c for c in ("compute", "recompute") if c in cats] + sorted(c for c in cats if c.startswith("exposed_")) \
        + [c for c in ("host_issue", "bubble") if c in cats] + [c for c in cats if c not in
                                                               ("compute", "recompute", "host_issue", "bubble")
                                                               and not c.startswith("exposed_")]
    longest = max(r.metrics["step_time_s"] for r in results)
    unit, scale = time_unit(max(longest, 1e-12))
    n = len(results)
    fig = Figure(figsize=(11, 1.6 + 0.55 * n + 0.3 * ((len(order) + 4) // 5)), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_axes([0.26, 0.28, 0.6, 0.6])
    base = results[0].metrics["step_time_s"]
    for i, r in enumerate(results):
        y = n - 1 - i
        left = 0.0
        for j, k in enumerate(order):
            v = r.metrics["breakdown_s"].get(k, 0.0) * scale
            if v > 0:
                ax.barh(y, v, left=left, color=_breakdown_color(k, j), edgecolor="white", linewidth=0.5,
                        label=k if i == 0 or not any(k in rr.metrics["breakdown_s"] for rr in results[:i]) else None)
                left += v
        step = r.metrics["step_time_s"]
        ax.text(left + longest * scale * 0.01, y, f"{_fmt(step * scale)} {unit}"
                + ("" if i == 0 else f"  ({step / base:.2f}x)"), va="center", fontsize=9)
    ax.set_yticks(range(n))
    ax.set_yticklabels([f"{nm}\n{layout_label(r)}" for nm, r in zip(reversed(names), reversed(results))], fontsize=8)
    ax.set_xlim(0, longest * scale * 1.18)
    ax.set_xlabel(f"time in the step ({unit})")
    ax.set_title(title, fontsize=11)
    ax.grid(axis="x", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels)), fontsize=8, frameon=False)
    fit_left_labels(fig, ax)
    if path is not None:
        fig.savefig(path, dpi=dpi)
    return fig


def aligned_gantts(results: Sequence, names: Sequence[str], path: str | Path, *, by: str = "stage",
                   dpi: int = 80) -> Path:
    """The reported step of every run as a Gantt chart, all on one time axis (the longest
    step's), stacked top to bottom in one PNG."""
    from matplotlib.image import imsave

    from .gantt_chart import gantt

    span = max(r.metrics["step_time_s"] for r in results)
    images, lefts = [], []
    for name, r in zip(names, results, strict=True):
        tl = r.timeline
        last = tl[tl["step"] == tl["step"].max()]
        stage_of = r.program.grid.stage_of
        fig = gantt(last, None, by=by, stage_of=stage_of, max_rows=16, span_s=span, dpi=dpi,
                    title=f"{name}: {layout_label(r)}, step {r.metrics['step_time_s']:.4g} s, "
                          f"MFU {r.metrics['mfu']:.1%}")
        fig.canvas.draw()
        images.append(np.asarray(fig.canvas.buffer_rgba()))
        lefts.append(round(fig.axes[0].get_position().x0 * images[-1].shape[1]))
    # a chart whose row labels needed a wider left margin is wider: pad the others on the left
    # so that every time axis starts at the same pixel, then on the right to one width
    shift = [max(lefts) - x for x in lefts]
    width = max(im.shape[1] + d for im, d in zip(images, shift))
    padded = [np.pad(im, ((0, 0), (d, width - im.shape[1] - d), (0, 0)), constant_values=255)
              for im, d in zip(images, shift)]
    out = Path(path)
    imsave(out, np.vstack(padded))
    return out
