"""Small charts: a step-time breakdown bar and the predicted-vs-measured validation scatter.

matplotlib is imported inside the functions (the engine never imports it) and only through
its object-oriented API (``Figure`` + ``FigureCanvasAgg``), so plotting touches no global
pyplot state and needs no display. Both functions return the ``Figure`` and write a PNG
when given a path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from .style import AXIS_COLORS, PHASE_COLORS, time_unit, to_rgba

__all__ = ["breakdown_bar", "validation_scatter"]

# ---- step-time breakdown ---------------------------------------------------------------------
_BREAKDOWN_FALLBACK = ["#17becf", "#bcbd22", "#7f7f7f", "#aec7e8", "#ffbb78", "#98df8a"]
_TOTAL_KEYS = ("total", "total_s", "step_time", "step_time_s")


def breakdown_bar(breakdown: Mapping[str, float], path: str | Path | None = None, *,
                  title: str | None = None, dpi: int = 100):
    """Step-time breakdown: one stacked bar of the step plus one labelled bar per category.

    Parameters
    ----------
    breakdown
        Category -> seconds, in display order (e.g. ``compute, recompute, bubble,
        exposed_tp, ...``). A ``total``/``step_time_s`` entry, if present, is not drawn as a
        category; it is checked against the sum and shown in the title.
    path
        Write a PNG here when given.
    title
        Chart title (a default one states the total).
    dpi
        Resolution of the PNG (the figure is 10 inches wide).

    Returns
    -------
    matplotlib.figure.Figure
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    items, total_ref = _breakdown_items(breakdown)
    total = sum(v for _, v in items)
    unit, scale = time_unit(max(total, 1e-12))
    colors = [_breakdown_color(k, i) for i, (k, _) in enumerate(items)]

    fig_h = 1.9 + 0.34 * len(items)
    fig = Figure(figsize=(10, fig_h), dpi=dpi)
    FigureCanvasAgg(fig)
    top_in, stack_h_in, gap_in, bottom_in = 0.55, 0.45, 0.45, 0.45
    list_h_in = fig_h - top_in - stack_h_in - gap_in - bottom_in
    ax_s = fig.add_axes([0.22, (bottom_in + list_h_in + gap_in) / fig_h, 0.74, stack_h_in / fig_h])
    ax_l = fig.add_axes([0.22, bottom_in / fig_h, 0.74, list_h_in / fig_h])
    _draw_step_stack(ax_s, items, colors, total, scale)
    _draw_category_bars(ax_l, items, colors, total, scale, unit)

    if title is None:
        title = f"Step-time breakdown: {_fmt(total * scale)} {unit}"
        if total_ref is not None and abs(total_ref - total) > 1e-9 * max(abs(total_ref), 1e-12):
            title += f" (categories sum; step time {_fmt(total_ref * scale)} {unit})"
    fig.text(0.5, 1 - 0.15 / fig_h, title, ha="center", va="top", fontsize=12)
    if path is not None:
        fig.savefig(path, dpi=dpi)
    return fig


def _breakdown_items(breakdown: Mapping[str, float]) -> tuple[list[tuple[str, float]], float | None]:
    """The categories as (name, seconds) in order, and the total entry if there is one.

    Raises ValueError for a non-finite or negative value (rounding noise below 1e-9 of the
    sum is taken as 0) and for no category at all.
    """
    items, total_ref = [], None
    for k, v in breakdown.items():
        v = float(v)
        if not np.isfinite(v):
            raise ValueError(f"breakdown[{k!r}] = {v} is not finite")
        if str(k).lower() in _TOTAL_KEYS:
            total_ref = v
            continue
        if v < 0:
            if v < -1e-9 * max(1.0, abs(sum(float(x) for x in breakdown.values()))):
                raise ValueError(f"breakdown[{k!r}] = {v} is negative")
            v = 0.0
        items.append((str(k), v))
    if not items:
        raise ValueError("breakdown is empty")
    return items, total_ref


def _breakdown_color(key: str, i: int) -> str:
    """Colour of category ``key`` (the ``i``-th): the Gantt chart's colour of the phase or axis
    its name mentions, greys for bubble / idle / other, a fallback cycle for the rest."""
    k = key.lower()
    tokens = set(k.replace("-", "_").replace(" ", "_").replace("/", "_").split("_"))
    if "recompute" in k:
        return PHASE_COLORS["R"]
    if "bubble" in k:
        return "#c9c9c9"
    if k == "host_issue":               # the GPU waiting for the host to issue work
        return "#5b6770"
    if "idle" in k or "other" in k:
        return "#e4e4e4"
    if "optimizer" in k or "step" in tokens:
        return PHASE_COLORS["S"]
    for ax_name, color in AXIS_COLORS.items():
        if ax_name in tokens:
            return color
    if "compute" in k:
        return PHASE_COLORS["F"]
    return _BREAKDOWN_FALLBACK[i % len(_BREAKDOWN_FALLBACK)]


def _draw_step_stack(ax, items, colors, total: float, scale: float) -> None:
    """The whole step as one stacked bar, each category's share written on it when >= 6 %."""
    left = 0.0
    for (k, v), c in zip(items, colors):
        if v <= 0:
            continue
        ax.barh(0, v * scale, left=left, color=c, edgecolor="white", linewidth=0.8, height=0.8)
        frac = v / total if total > 0 else 0.0
        if frac >= 0.06:
            lum = np.dot(to_rgba([c])[0][:3], [0.299, 0.587, 0.114])
            ax.text(left + v * scale / 2, 0, f"{frac:.0%}", ha="center", va="center", fontsize=9,
                    color="black" if lum > 0.6 else "white")
        left += v * scale
    ax.set_xlim(0, max(total * scale, 1e-12))
    ax.set_yticks([0])
    ax.set_yticklabels(["step"], fontsize=10)
    ax.tick_params(axis="x", labelsize=8)
    ax.tick_params(axis="y", length=0)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)


def _draw_category_bars(ax, items, colors, total: float, scale: float, unit: str) -> None:
    """One bar per category, top to bottom, labelled with its time and share of the step."""
    ypos = np.arange(len(items))
    vals = np.array([v for _, v in items]) * scale
    ax.barh(ypos, vals, color=colors, height=0.7, edgecolor="none")
    ax.set_yticks(ypos)
    ax.set_yticklabels([k.replace("_", " ") for k, _ in items], fontsize=10)
    ax.invert_yaxis()
    vmax = float(vals.max())
    ax.set_xlim(0, max(vmax, 1e-12) * 1.28)
    for yy, (k, v) in zip(ypos, items):
        frac = v / total if total > 0 else 0.0
        ax.text(v * scale + vmax * 0.01, yy, f"{fmt_duration(v)}  ({frac:.1%})", va="center", fontsize=9)
    ax.set_xlabel(f"time ({unit})", fontsize=10)
    ax.tick_params(axis="x", labelsize=8)
    ax.tick_params(axis="y", length=0)
    ax.grid(axis="x", color="#dddddd", lw=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def fmt_duration(seconds: float) -> str:
    """A duration in the unit its magnitude calls for, three significant digits kept:
    ``6.00 s``, ``151 ms``, ``7.72 ms``, ``41.5 µs``, ``0 s``."""
    if seconds == 0:
        return "0 s"
    unit, scale = time_unit(abs(seconds))
    v = seconds * scale
    return f"{v:,.0f} {unit}" if abs(v) >= 100 else f"{v:#.3g} {unit}"


def _fmt(v: float) -> str:
    """``1,234``, ``123``, ``12.3``, ``1.23``, ``0.123``, ``0.00123``: whole numbers from 100 up,
    else three significant digits; ``0``; e-notation below 0.001."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}" if abs(v) >= 1e-3 else "0" if v == 0 else f"{v:.1e}"


# ---- validation scatter -------------------------------------------------------------------------
_SOURCE_COLORS = ("#3a6fb0", "#d1495b", "#3f9a4a", "#edae49", "#8e6bbf", "#00798c", "#6b4226", "#3b3b3b")


def validation_scatter(results: Sequence[Mapping], path: str | Path | None = None, *, title: str | None = None,
                       band: float = 0.10, dpi: int = 110):
    """Predicted against measured step time of :func:`simulator.validation.validate` rows.

    Log-log axes, the ``y = x`` line with a ``+-band`` (default 10 %) band, one colour per
    ``source`` (rows without one are ``runs``); the legend gives each source's simulated rows
    and median absolute error. Rows whose ``status`` is not ``ok`` are not drawn (the legend
    counts them). Writes a PNG when ``path`` is given, creating its folder; returns the
    ``Figure``.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    groups: dict[str, list[tuple[float, float]]] = {}
    totals: dict[str, int] = {}
    for r in results:
        src = str(r.get("source", "")) or "runs"
        totals[src] = totals.get(src, 0) + 1
        groups.setdefault(src, [])
        if r.get("status") == "ok" and r.get("predicted_step_s") not in ("", None):
            groups[src].append((float(r["measured_step_s"]), float(r["predicted_step_s"])))
    pts = [p for g in groups.values() for p in g]
    if not pts:
        raise ValueError("no simulated rows (status ok) to plot")
    lo = min(min(p) for p in pts) / 1.3
    hi = max(max(p) for p in pts) * 1.3

    fig = Figure(figsize=(7.5, 7), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    xs = np.geomspace(lo, hi, 64)
    ax.fill_between(xs, xs * (1 - band), xs * (1 + band), color="#d9d9d9", alpha=0.6, linewidth=0,
                    label=f"±{band:.0%}")
    ax.plot(xs, xs, color="#555555", linewidth=1.0, label="predicted = measured")
    for i, (src, g) in enumerate(groups.items()):
        if not g:
            continue
        m, p = np.array(g).T
        err = np.abs(p / m - 1) * 100
        ax.scatter(m, p, s=26, color=_SOURCE_COLORS[i % len(_SOURCE_COLORS)], edgecolor="white", linewidth=0.5,
                   zorder=3, label=f"{src}: {len(g)}/{totals[src]} rows, median |err| {np.median(err):.1f}%")
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(FuncFormatter(_log_major_label))
        axis.set_minor_formatter(FuncFormatter(_log_minor_label))
    ax.tick_params(which="minor", labelsize=8)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal")
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title(title or "clustersim: predicted vs measured step time")
    ax.grid(True, which="both", color="#eeeeee", linewidth=0.6)
    ax.legend(loc="upper left", fontsize=8, frameon=True)
    fig.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(str(path))
    return fig


def _log_major_label(v, _pos) -> str:
    """Tick label of a decade: ``0.1``, ``1``, ``10``."""
    return f"{v:g}"


def _log_minor_label(v, _pos) -> str:
    """Tick label of a minor tick: 2x and 5x of each decade only."""
    mant = v / 10 ** np.floor(np.log10(v))
    return f"{v:g}" if round(mant) in (2, 5) and abs(mant - round(mant)) < 1e-6 else ""
