"""Gantt chart of a simulated step: one row per rank (or pipeline stage), a lane per stream.

matplotlib is imported inside the functions (the engine never imports it) and only through
its object-oriented API (``Figure`` + ``FigureCanvasAgg``), so plotting touches no global
pyplot state and needs no display. :func:`gantt` returns the ``Figure`` and writes a PNG
when given a path.

Layout: one *row* per rank (or per pipeline stage, drawn from one representative rank),
each row a tall compute lane plus one thin lane per communication stream the rank uses
(``tp, cp, ep, pp, dp`` in that order). Compute is coloured by phase (forward, input
gradient, weight gradient, recompute, step end), communication by mesh axis; later model
chunks (virtual pipeline stages) get lighter shades of their phase colour. Adjacent ops of
the same micro-batch and phase merge into one bar, so rendering is one ``PolyCollection``
for all bars (fast for tens of thousands of ops); micro-batch numbers are written only
inside bars wide enough to hold them.

:func:`gantt` runs the pieces below in order: select the ops (:func:`_select_ops`), choose
and order the rows (:func:`_choose_rows`), lay out the lanes (:func:`_lay_out_lanes`), turn
the ops into arrays (:func:`_op_arrays`), make the figure (:func:`_gantt_figure`), merge,
colour and draw the bars (:func:`_merge_bars`, :func:`_bar_colors`, :func:`_draw_bars`), label
them (:func:`_draw_bar_labels`), style the axes (:func:`_style_axes`), then title and legend
(:func:`_draw_title_and_legend`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .style import AXIS_COLORS, PHASE_COLORS, fit_left_labels, time_unit, to_rgba
from .trace import _require_columns, stream_order

__all__ = ["gantt"]

# ---- colour categories ---------------------------------------------------------------------
_OTHER_COMPUTE = "#a0a0a0"
_OTHER_COMM = "#5fb7c9"

_CATEGORIES = [  # (key, colour, legend label) in legend order
    ("F", PHASE_COLORS["F"], "forward (F)"),
    ("B", PHASE_COLORS["B"], "backward, input grad (B)"),
    ("W", PHASE_COLORS["W"], "weight grad (W)"),
    ("R", PHASE_COLORS["R"], "recompute (R)"),
    ("S", PHASE_COLORS["S"], "optimizer / step end (S)"),
    ("compute", _OTHER_COMPUTE, "other compute"),
    ("tp", AXIS_COLORS["tp"], "TP comm"),
    ("cp", AXIS_COLORS["cp"], "CP comm"),
    ("ep", AXIS_COLORS["ep"], "EP comm"),
    ("pp", AXIS_COLORS["pp"], "PP send/recv"),
    ("dp", AXIS_COLORS["dp"], "DP comm"),
    ("comm", _OTHER_COMM, "other comm"),
]
_CAT_INDEX = {k: i for i, (k, _, _) in enumerate(_CATEGORIES)}

# ---- layout, in "lane units" (the compute lane is 1 unit tall) ------------------------------
_COMPUTE_H = 1.0
_ROW_GAP = 0.45
_FIG_W_IN = 15.0
_LEFT_IN, _RIGHT_IN, _BOTTOM_IN = 2.3, 0.3, 0.6   # the left margin fits "stage 15 · rank 1024 · host 128"
_PLOT_W_IN = _FIG_W_IN - _LEFT_IN - _RIGHT_IN
_MAX_PLOT_H_IN = 30.0    # cap on the plotting area (64 rows with 5 comm lanes each still fit)
_COMPUTE_PT = 22.0       # preferred compute-lane height; comm lanes are 0.42 of it at this size
_COLUMNS = ("rank", "stream", "kind", "name", "layer", "microbatch", "chunk", "phase", "axis", "start_s", "end_s")


def gantt(timeline: pd.DataFrame, path: str | Path | None = None, *, by: str = "rank",
          ranks: Sequence[int] | None = None, max_rows: int = 64, title: str | None = None,
          step: int | None = None, stage_of: Mapping[int, int] | Callable[[int], int] | None = None,
          dpi: int = 100, span_s: float | None = None):
    """Gantt chart of a timeline: one row per rank (or pipeline stage), a lane per stream.

    Parameters
    ----------
    timeline
        The engine's timeline DataFrame (contract columns; ``step``, ``stage`` and ``node``
        optional: ``node`` names each rank's host and draws a line between hosts).
    path
        Write a PNG here when given.
    by
        ``"rank"``: one row per rank. ``"stage"``: one row per pipeline stage, showing the
        stage's lowest rank (among ``ranks`` when given). Stages come from ``stage_of``, else
        a ``stage`` column, else are inferred (ranks running the same layers share a stage).
    ranks
        Only these ranks (ValueError if one is not in the timeline).
    max_rows
        More rows than this are thinned to ``max_rows`` evenly spaced ones (first and last
        kept), and the title says so.
    title
        Chart title; a default one names the rows and step. Notes (subsetting) are appended.
    step
        Show only this step (needs a ``step`` column); negative counts from the last, so
        ``-1`` is the last step. ``None`` shows everything.
    stage_of
        Mapping or callable rank -> pipeline stage, for ``by="stage"``.
    dpi
        Resolution of the PNG (the figure is 15 inches wide; its height grows with the
        number of lanes up to a cap of about 32 inches).
    span_s
        Seconds the time axis spans from the first op's start (at least the ops' own span):
        charts of several runs drawn with the same ``span_s`` share one time scale.

    Returns
    -------
    matplotlib.figure.Figure
    """
    df, chosen_step, present = _select_ops(timeline, by=by, ranks=ranks, max_rows=max_rows, step=step)
    rows = _choose_rows(df, present, by, stage_of, max_rows)
    n_ops_all = len(df)
    df = df[df["rank"].isin(rows.ranks)]
    lanes, op_lane = _lay_out_lanes(df, rows)
    tx = _time_axis(df, span_s)
    ops = _op_arrays(df, op_lane, tx)

    handles = _legend_handles(ops)
    legend_rows = 1 if len(handles) <= 7 else 2
    top_ticks = lanes.plot_h_in > 9             # tall charts repeat the time ticks on top
    fig, ax = _gantt_figure(lanes.plot_h_in, top_ticks, legend_rows, bool(rows.notes), dpi)
    px_per_x = _PLOT_W_IN * dpi / (tx.span * 1.01)

    bars = _merge_bars(ops, px_per_x)
    face = _bar_colors(bars, lanes, ops.n_chunks)
    _draw_bars(ax, bars, lanes, face, px_per_x)
    _draw_bar_labels(ax, bars, lanes, face, px_per_x, dpi)
    _style_axes(ax, lanes, rows, tx, top_ticks)

    if title is None:
        title = _default_title(rows, len(df), n_ops_all, chosen_step)
    _draw_title_and_legend(fig, title, rows.notes, handles, legend_rows)
    fit_left_labels(fig, ax)
    if path is not None:
        fig.savefig(path, dpi=dpi)
    return fig


# ---- which ops, which rows -----------------------------------------------------------------
def _select_ops(timeline: pd.DataFrame, *, by: str, ranks, max_rows: int,
                step: int | None) -> tuple[pd.DataFrame, int | None, set[int]]:
    """Check the arguments; the ops of the chosen step and ranks, the step, and the ranks present."""
    _require_columns(timeline, _COLUMNS)
    if by not in ("rank", "stage"):
        raise ValueError(f"by must be 'rank' or 'stage', got {by!r}")
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    df, chosen_step = _select_step(timeline, step)
    if df.empty:
        raise ValueError("timeline is empty: nothing to plot")
    present = {int(r) for r in pd.unique(df["rank"])}
    if ranks is not None:
        wanted = sorted({int(r) for r in ranks})
        missing = [r for r in wanted if r not in present]
        if missing:
            raise ValueError(f"ranks {missing} are not in the timeline (it has ranks "
                             f"{min(present)}..{max(present)}, {len(present)} in all)")
        df = df[df["rank"].isin(wanted)]
        present = set(wanted)
    return df, chosen_step, present


def _select_step(df: pd.DataFrame, step: int | None) -> tuple[pd.DataFrame, int | None]:
    """The ops of step ``step`` (negative: from the last) and that step's number; all ops for ``None``."""
    if step is None:
        return df, None
    if "step" not in df.columns:
        raise ValueError("step= given but the timeline has no 'step' column")
    steps = sorted(int(s) for s in pd.unique(df["step"]))
    chosen = steps[step] if step < 0 and -len(steps) <= step else step
    if chosen not in steps:
        raise ValueError(f"step {step} not in the timeline; steps present: {steps}")
    return df[df["step"] == chosen], chosen


@dataclass
class _Rows:
    """The chart's rows, top to bottom."""
    by: str                 # "rank" or "stage"
    items: list             # ranks, or (stage, representative rank) pairs
    ranks: list[int]        # the rank drawn in each row
    n_all: int              # rows before thinning to max_rows
    unit_name: str          # "ranks" or "stages"
    notes: list[str]        # appended to the title


def _choose_rows(df: pd.DataFrame, present: set[int], by: str, stage_of, max_rows: int) -> _Rows:
    """One row per rank, or per stage (its lowest rank), thinned evenly to at most ``max_rows``."""
    notes = []
    if by == "rank":
        items = sorted(present)
        unit_name = "ranks"
    else:
        smap, inferred = _stage_map(df, stage_of)
        reps: dict[int, int] = {}
        for r in sorted(present):
            reps.setdefault(smap[r], r)
        items = sorted(reps.items())             # (stage, representative rank)
        unit_name = "stages"
        notes.append("one rank per stage" + (", stages inferred from layers" if inferred else ""))
    n_all = len(items)
    items = _thin_evenly(items, max_rows)
    if len(items) < n_all:
        notes.append(f"showing {len(items)} of {n_all} {unit_name}, evenly spaced; pass ranks= to choose")
    ranks = [r if by == "rank" else r[1] for r in items]
    return _Rows(by, items, ranks, n_all, unit_name, notes)


def _stage_map(df: pd.DataFrame, stage_of) -> tuple[dict[int, int], bool]:
    """rank -> stage, from ``stage_of`` (mapping or callable), a 'stage' column, or inferred;
    and whether it was inferred."""
    ranks = sorted(int(r) for r in pd.unique(df["rank"]))
    if stage_of is not None:
        get = stage_of if callable(stage_of) else stage_of.__getitem__
        try:
            return {r: int(get(r)) for r in ranks}, False
        except (KeyError, IndexError) as e:
            raise ValueError(f"stage_of has no stage for rank {e.args[0]}") from None
    if "stage" in df.columns:
        s = df.groupby("rank")["stage"].first()
        return {int(r): int(v) for r, v in s.items()}, False
    # Inferred: ranks that run the same set of layers form one stage; stages ordered by their
    # first layer (the contract's layer index is global, so this follows the pipeline order).
    comp = df.loc[(df["kind"] == "compute") & (df["layer"] >= 0), ["rank", "layer"]].drop_duplicates()
    layer_sets = comp.groupby("rank")["layer"].agg(lambda x: tuple(sorted(int(v) for v in x)))
    keys = {r: layer_sets.get(r, ()) for r in ranks}
    order = sorted(set(keys.values()), key=lambda k: (k[0] if k else float("inf"), k))
    index = {k: i for i, k in enumerate(order)}
    return {r: index[keys[r]] for r in ranks}, True


def _thin_evenly(items: list, max_rows: int) -> list:
    """At most ``max_rows`` of ``items``, evenly spaced, the first and last kept."""
    if len(items) <= max_rows:
        return items
    idx = np.unique(np.round(np.linspace(0, len(items) - 1, max_rows)).astype(int))
    return [items[i] for i in idx]


# ---- lanes ---------------------------------------------------------------------------------
@dataclass
class _Lanes:
    """Vertical layout in lane units (the compute lane is 1 unit tall; y grows downwards)."""
    y0: np.ndarray                      # top of each lane
    h: np.ndarray                       # height of each lane
    is_comp: np.ndarray                 # compute lane (else a communication lane)
    label: list[str]                    # each lane's stream
    row_y: list[float]                  # centre of each row's compute lane (the row's tick)
    row_label: list[str]
    row_bounds: list[tuple[float, float]]   # (top, bottom) of each row
    total_units: float
    comm_pitch: float                   # distance between comm lanes
    comm_h: float                       # height of a comm lane
    node_of: dict                       # rank -> host, if the timeline has a 'node' column
    plot_h_in: float                    # height of the plotting area
    unit_pt: float                      # points per lane unit


def _lay_out_lanes(df: pd.DataFrame, rows: _Rows) -> tuple[_Lanes, np.ndarray]:
    """Stack each row's compute lane and the comm lanes its rank uses; the lanes, and each op's lane."""
    streams = stream_order(pd.unique(df["stream"].astype(str)))
    s_code = {s: i for i, s in enumerate(streams)}
    n_s = len(streams)
    rank_a = df["rank"].to_numpy(dtype=np.int64)
    scode_a = pd.Series(df["stream"].astype(str).to_numpy()).map(s_code).to_numpy(dtype=np.int64)
    pairs = set(zip(rank_a.tolist(), scode_a.tolist()))
    lane_of: dict[int, int] = {}           # rank * n_s + stream code -> lane index
    lane_y0, lane_h, lane_is_comp, lane_label = [], [], [], []
    row_y, row_label, row_bounds = [], [], []
    y = 0.0
    comp_code = s_code.get("compute", -1)
    node_of = (df.groupby("rank")["node"].first().to_dict() if "node" in df.columns else {})
    row_codes = [[c for c in range(n_s) if (r, c) in pairs and c != comp_code] for r in rows.ranks]
    unit_pt, pitch_pt = _lane_geometry(len(rows.items), sum(len(c) for c in row_codes))
    comm_pitch = pitch_pt / unit_pt             # in lane units (compute lane = 1)
    comm_h = 0.8 * comm_pitch
    for item, r, codes in zip(rows.items, rows.ranks, row_codes):
        row_top = y
        if comp_code >= 0:
            lane_of[r * n_s + comp_code] = len(lane_y0)
        lane_y0.append(y); lane_h.append(_COMPUTE_H); lane_is_comp.append(True); lane_label.append("compute")
        row_y.append(y + _COMPUTE_H / 2)
        row_label.append(_row_label(rows.by, item, node_of))
        y += _COMPUTE_H + (comm_pitch - comm_h)
        for c in codes:
            lane_of[r * n_s + c] = len(lane_y0)
            lane_y0.append(y); lane_h.append(comm_h); lane_is_comp.append(False); lane_label.append(streams[c])
            y += comm_pitch
        row_bounds.append((row_top, y))
        y += _ROW_GAP
    total_units = y - _ROW_GAP
    op_lane = pd.Series(rank_a * n_s + scode_a).map(lane_of).to_numpy(dtype=np.int64)
    plot_h_in = max(total_units * unit_pt / 72, 1.2)
    lanes = _Lanes(np.asarray(lane_y0), np.asarray(lane_h), np.asarray(lane_is_comp), lane_label, row_y,
                   row_label, row_bounds, total_units, comm_pitch, comm_h, node_of,
                   plot_h_in=plot_h_in, unit_pt=plot_h_in * 72 / total_units)
    return lanes, op_lane


def _lane_geometry(n_rows: int, n_comm: int) -> tuple[float, float]:
    """Compute-lane height and comm-lane pitch (points) that fit the height cap.

    When the cap binds, comm lanes shrink faster than compute lanes (pitch ~ c^2, floor 3 pt,
    about 4 px at 100 dpi) so that the compute lanes and their micro-batch numbers stay legible.
    """
    cap = _MAX_PLOT_H_IN * 72
    for c in np.linspace(_COMPUTE_PT, 3.0, 191):
        p = max(0.42 * c * min(1.0, c / _COMPUTE_PT), 3.0)
        if n_rows * c * (1 + _ROW_GAP) - _ROW_GAP * c + n_comm * p <= cap:
            break
    return float(c), float(p)


def _row_label(by: str, item, node_of: dict) -> str:
    """``rank R · host H`` (H the rank's host, when known), or ``stage S · rank R · host H``."""
    if by == "rank":
        host = f" · host {int(node_of[item])}" if item in node_of else ""
        return f"rank {item}{host}"
    host = f" · host {int(node_of[item[1]])}" if item[1] in node_of else ""
    return f"stage {item[0]} · rank {item[1]}{host}"


# ---- ops as arrays -------------------------------------------------------------------------
@dataclass(frozen=True)
class _TimeAxis:
    """Times are drawn as ``(t - t0) * scale``, in ``unit``, over ``[0, span]``."""
    t0: float
    span: float
    unit: str
    scale: float


def _time_axis(df: pd.DataFrame, span_s: float | None = None) -> _TimeAxis:
    """From the first op's start to the last op's end (or ``span_s`` after the start, if
    longer), in a unit that suits the span."""
    t0 = float(df["start_s"].min())
    span_s = max(float(df["end_s"].max()) - t0, span_s or 0.0, 1e-12)
    unit, scale = time_unit(span_s)
    return _TimeAxis(t0, span_s * scale, unit, scale)


@dataclass
class _Ops:
    """One entry per op, in timeline order; x in the time axis' unit."""
    lane: np.ndarray
    cat: np.ndarray         # index into _CATEGORIES
    chunk: np.ndarray
    mb: np.ndarray          # micro-batch, -1 for none
    phase: np.ndarray
    name: np.ndarray
    is_comp: np.ndarray
    x0: np.ndarray
    x1: np.ndarray
    n_chunks: int


def _op_arrays(df: pd.DataFrame, lane: np.ndarray, tx: _TimeAxis) -> _Ops:
    """The columns the chart needs as arrays, with each op's colour category: compute by phase,
    communication by axis (by stream when it has none), unknown ones as "other"."""
    kind = df["kind"].astype(str).to_numpy()
    phase = df["phase"].astype(str).to_numpy()
    axis = df["axis"].fillna("").astype(str).to_numpy()
    is_comp = kind == "compute"
    comm_axis = np.where(axis == "", df["stream"].astype(str).to_numpy(), axis)
    cat_key = np.where(is_comp, phase, comm_axis)
    cat = pd.Series(cat_key).map(_CAT_INDEX).to_numpy(dtype=float)
    cat = np.where(np.isnan(cat), np.where(is_comp, _CAT_INDEX["compute"], _CAT_INDEX["comm"]), cat).astype(int)
    chunk = np.nan_to_num(df["chunk"].to_numpy(dtype=float), nan=0.0).astype(int)
    return _Ops(lane=lane, cat=cat, chunk=chunk,
                mb=np.nan_to_num(df["microbatch"].to_numpy(dtype=float), nan=-1.0).astype(int),
                phase=phase, name=df["name"].astype(str).to_numpy(), is_comp=is_comp,
                x0=(df["start_s"].to_numpy(dtype=float) - tx.t0) * tx.scale,
                x1=(df["end_s"].to_numpy(dtype=float) - tx.t0) * tx.scale,
                n_chunks=int(chunk.max()) + 1 if len(chunk) else 1)


# ---- figure and bars -----------------------------------------------------------------------
def _gantt_figure(plot_h_in: float, top_ticks: bool, legend_rows: int, has_notes: bool, dpi: int):
    """The figure and its plotting axes: fixed width and margins; the height is the plotting
    area plus room for the title (two lines with notes), the legend and top ticks."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    title_lines = 1 + (1 if has_notes else 0)
    top_in = 0.25 + 0.28 * title_lines + 0.27 * legend_rows + (0.3 if top_ticks else 0.1)
    fig_h_in = plot_h_in + top_in + _BOTTOM_IN
    fig = Figure(figsize=(_FIG_W_IN, fig_h_in), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_axes([_LEFT_IN / _FIG_W_IN, _BOTTOM_IN / fig_h_in, _PLOT_W_IN / _FIG_W_IN, plot_h_in / fig_h_in])
    return fig, ax


@dataclass
class _Bars:
    """Merged bars, in lane then time order; the fields of each bar's first op, ``x1`` its last end."""
    lane: np.ndarray
    cat: np.ndarray
    chunk: np.ndarray
    mb: np.ndarray
    phase: np.ndarray
    name: np.ndarray
    is_comp: np.ndarray
    x0: np.ndarray
    x1: np.ndarray


def _merge_bars(ops: _Ops, px_per_x: float) -> _Bars:
    """Merge ops of one lane with the same category, chunk, micro-batch and phase that follow
    each other within 0.75 px into one bar."""
    order = np.lexsort((ops.x0, ops.lane))
    L, X0, X1, C, CH, MB, PH = (ops.lane[order], ops.x0[order], ops.x1[order], ops.cat[order], ops.chunk[order],
                                ops.mb[order], ops.phase[order])
    tol = 0.75 / px_per_x
    same = np.zeros(len(L), dtype=bool)
    if len(L) > 1:
        same[1:] = ((L[1:] == L[:-1]) & (C[1:] == C[:-1]) & (CH[1:] == CH[:-1]) & (MB[1:] == MB[:-1])
                    & (PH[1:] == PH[:-1]) & (X0[1:] - X1[:-1] <= tol))
    starts = np.flatnonzero(~same)
    return _Bars(lane=L[starts], cat=C[starts], chunk=CH[starts], mb=MB[starts], phase=PH[starts],
                 name=ops.name[order][starts], is_comp=ops.is_comp[order][starts], x0=X0[starts],
                 x1=np.maximum.reduceat(X1, starts))


def _bar_colors(bars: _Bars, lanes: _Lanes, n_chunks: int) -> np.ndarray:
    """RGBA face colour of each bar: its category's colour, lighter for later model chunks."""
    palette = to_rgba([c for _, c, _ in _CATEGORIES])
    face = palette[bars.cat].copy()
    if n_chunks > 1:                             # later model chunks: lighter shade of the same hue
        light = np.where(lanes.is_comp[bars.lane] & (bars.chunk > 0), 0.5 * bars.chunk / (n_chunks - 1), 0.0)[:, None]
        face[:, :3] = face[:, :3] + (1 - face[:, :3]) * light
    return face


def _draw_bars(ax, bars: _Bars, lanes: _Lanes, face: np.ndarray, px_per_x: float) -> None:
    """All bars as one ``PolyCollection``; white edges only on bars at least 5 px wide."""
    from matplotlib.collections import PolyCollection

    min_w = 0.6 / px_per_x                      # keep sub-pixel ops visible
    x1v = np.maximum(bars.x1, bars.x0 + min_w)
    ytop = lanes.y0[bars.lane]
    ybot = ytop + lanes.h[bars.lane]
    verts = np.stack([np.column_stack([bars.x0, ytop]), np.column_stack([bars.x0, ybot]),
                      np.column_stack([x1v, ybot]), np.column_stack([x1v, ytop])], axis=1)
    width_px = (bars.x1 - bars.x0) * px_per_x
    lw = np.where(width_px >= 5, 0.5, 0.0)
    pc = PolyCollection(verts, facecolors=face, edgecolors="white", linewidths=lw, antialiaseds=True,
                        zorder=2)
    ax.add_collection(pc)


# ---- labels: glyph paths in one collection per font size (thousands of Text artists are slow)
def _points_transform(fig):
    """Transform from points to display coordinates (glyphs are sized in points)."""
    from matplotlib.transforms import Affine2D
    return Affine2D().scale(1 / 72) + fig.dpi_scale_trans


def _draw_bar_labels(ax, bars: _Bars, lanes: _Lanes, face: np.ndarray, px_per_x: float, dpi: int) -> None:
    """Micro-batch numbers on compute bars and op names on comm bars, where lanes are tall
    enough for a 4.5 pt font."""
    pts = _points_transform(ax.figure)
    comp_fs = min(9.0, 0.62 * _COMPUTE_H * lanes.unit_pt)
    comm_fs = min(7.0, 0.8 * lanes.comm_h * lanes.unit_pt)
    if comp_fs >= 4.5:
        _label_compute_runs(ax, bars, lanes, face, px_per_x, comp_fs, dpi, pts)
    if comm_fs >= 4.5:
        cb = np.flatnonzero(~lanes.is_comp[bars.lane])
        texts = bars.name[cb].astype(str)
        width_px = (bars.x1[cb] - bars.x0[cb]) * px_per_x
        text_px = np.char.str_len(texts) * 0.64 * comm_fs * dpi / 72
        fits = width_px >= text_px + 2
        cb, texts, text_px = cb[fits], texts[fits], text_px[fits]
        keep = _no_overlap(bars.lane[cb], (bars.x0[cb] + bars.x1[cb]) / 2 * px_per_x, text_px)
        cb, texts = cb[keep], texts[keep]
        _add_labels(ax, texts, (bars.x0[cb] + bars.x1[cb]) / 2, lanes.y0[bars.lane[cb]] + lanes.comm_h / 2,
                    comm_fs, face[cb], ax.transData, pts, gid="labels:comm")


def _no_overlap(lane: np.ndarray, center_px: np.ndarray, width_px: np.ndarray) -> np.ndarray:
    """Which labels to keep so that none overlaps another in its lane: left to right, a label
    is kept when it starts after the last kept one ends (bars that overlap in time, such as a
    send and a receive in flight together, would otherwise print one name over the other)."""
    keep = np.zeros(len(lane), dtype=bool)
    last_end: dict[int, float] = {}
    for i in np.lexsort((center_px, lane)):
        left = center_px[i] - width_px[i] / 2
        if left >= last_end.get(int(lane[i]), -np.inf) + 2:
            keep[i] = True
            last_end[int(lane[i])] = center_px[i] + width_px[i] / 2
    return keep


def _label_compute_runs(ax, bars: _Bars, lanes: _Lanes, face: np.ndarray, px_per_x: float, fontsize: float,
                        dpi: int, pts) -> None:
    """One label per run: consecutive compute bars of a lane with the same micro-batch, chunk
    and pass (forward, or backward = B/W/R); the micro-batch number, or the op name for ops
    of no micro-batch.

    Bars of one colour in a run separated only by thin gaps (blocking TP collectives, say)
    form a group; the label goes in the centre of the run's widest bar when it fits there,
    else in the centre of its widest group when it fits there.
    """
    cbk = np.flatnonzero(bars.is_comp)           # compute blocks, in lane/time order
    if not len(cbk):
        return
    g_l, g_c, g_ch, g_x0, g_x1 = bars.lane[cbk], bars.cat[cbk], bars.chunk[cbk], bars.x0[cbk], bars.x1[cbk]
    g_mb, g_ph, g_nm = bars.mb[cbk], bars.phase[cbk], bars.name[cbk]
    pgroup = np.select([g_ph == "F", np.isin(g_ph, ("B", "W", "R"))], [0, 1], 2)
    ncode = np.where(g_mb < 0, pd.factorize(g_nm)[0], -1)
    k = np.stack([g_l, g_mb, g_ch, pgroup, ncode], axis=1)
    new_run = np.ones(len(cbk), dtype=bool)
    new_run[1:] = (k[1:] != k[:-1]).any(axis=1)
    new_grp = new_run.copy()
    new_grp[1:] |= (g_c[1:] != g_c[:-1]) | ((g_x0[1:] - g_x1[:-1]) * px_per_x > 3.0)
    run = np.cumsum(new_run) - 1
    gs = np.flatnonzero(new_grp)
    gx0, gx1 = g_x0[gs], np.maximum.reduceat(g_x1, gs)
    gw = (gx1 - gx0) * px_per_x
    bw = (g_x1 - g_x0) * px_per_x

    wb = _widest_per_run(bw, run)                   # widest single bar of each run
    wg = _widest_per_run(gw, run[gs])               # widest same-colour group of each run
    texts = np.where(g_mb[wb] >= 0, g_mb[wb].astype(str), g_nm[wb]).astype(str)
    need = np.char.str_len(texts) * 0.64 * fontsize * dpi / 72 + 2
    in_bar = bw[wb] >= need
    in_grp = ~in_bar & (gw[wg] >= need + 2)
    lx = np.where(in_bar, (g_x0[wb] + g_x1[wb]) / 2, (gx0[wg] + gx1[wg]) / 2)
    blk = cbk[np.where(in_bar, wb, gs[wg])]
    show = in_bar | in_grp
    _add_labels(ax, texts[show], lx[show], lanes.y0[bars.lane[blk[show]]] + _COMPUTE_H / 2,
                fontsize, face[blk[show]], ax.transData, pts, gid="labels:compute")


def _widest_per_run(width: np.ndarray, run_id: np.ndarray) -> np.ndarray:
    """Index of the widest item of each run (``run_id`` non-decreasing), in run order."""
    o = np.lexsort((-width, run_id))
    first = np.ones(len(o), dtype=bool)
    first[1:] = run_id[o][1:] != run_id[o][:-1]
    return o[first]


def _add_labels(ax, texts, xs, ys, fontsize, faces, offset_transform, pts_transform, *, ha="center",
                color=None, clip=True, gid="labels"):
    """Draw many short labels as one PathCollection of glyph outlines (one artist, not one per label).

    Each text is turned into a ``TextPath`` once (cached per string), centred (or right-aligned)
    on its anchor; anchors are placed with ``offset_transform``, glyphs are sized in points.
    Text is black on light bars and white on dark ones (``faces``), or ``color``.
    The collection's ``label_texts`` holds the strings drawn, for tests and callers.
    """
    from matplotlib.collections import PathCollection
    from matplotlib.font_manager import FontProperties
    from matplotlib.path import Path as MPath
    from matplotlib.textpath import TextPath

    if len(texts) == 0:
        return
    prop = FontProperties(size=fontsize)
    digit = TextPath((0, 0), "0", prop=prop).get_extents()
    dy = -(digit.y0 + digit.y1) / 2              # centre on the digit height, same for every label
    cache: dict[str, MPath] = {}
    paths = []
    for t in texts.tolist():
        p = cache.get(t)
        if p is None:
            tp = TextPath((0, 0), t, prop=prop)
            if len(tp.vertices):
                e = tp.get_extents()
                dx = -(e.x0 + e.x1) / 2 if ha == "center" else -e.x1
                p = MPath(tp.vertices + [dx, dy], tp.codes)
            else:
                p = MPath(np.zeros((1, 2)), [MPath.MOVETO])
            cache[t] = p
        paths.append(p)
    if color is None:
        lum = faces[:, :3] @ np.array([0.299, 0.587, 0.114])
        colors = np.where((lum > 0.6)[:, None], [[0, 0, 0, 1.0]], [[1, 1, 1, 1.0]])
    else:
        colors = color
    coll = PathCollection(paths, offsets=np.column_stack([xs, ys]), offset_transform=offset_transform,
                          transform=pts_transform, facecolors=colors, edgecolors="none", linewidths=0,
                          zorder=3)
    coll.set_clip_on(clip)
    coll.set_gid(gid)
    coll.label_texts = tuple(texts.tolist())
    ax.add_collection(coll, autolim=False)


# ---- axes, title, legend -------------------------------------------------------------------
def _style_axes(ax, lanes: _Lanes, rows: _Rows, tx: _TimeAxis, top_ticks: bool) -> None:
    """Limits, row shading, host separators, row and lane labels, time grid and label."""
    from matplotlib.transforms import blended_transform_factory

    ax.set_xlim(0, tx.span * 1.01)
    ax.set_ylim(lanes.total_units + 0.15, -0.15)
    for i, (a, b) in enumerate(lanes.row_bounds):
        if i % 2 == 1:
            ax.axhspan(a - _ROW_GAP / 2, b + _ROW_GAP / 2, color="#f2f2f2", zorder=0, lw=0)
    node_of = lanes.node_of
    if rows.by == "rank" and node_of:
        for i in range(1, len(rows.items)):
            if node_of.get(rows.ranks[i]) != node_of.get(rows.ranks[i - 1]):
                ax.axhline(lanes.row_bounds[i][0] - _ROW_GAP / 2, color="#888888", lw=0.8, ls="--", zorder=1)
    row_h = lanes.row_bounds[0][1] - lanes.row_bounds[0][0]
    row_fs = float(np.clip(0.55 * (row_h + _ROW_GAP) * lanes.unit_pt, 5.0, 10.0))
    ax.set_yticks(lanes.row_y)
    ax.set_yticklabels(lanes.row_label, fontsize=row_fs)
    lane_fs = min(7.0, 0.95 * lanes.comm_pitch * lanes.unit_pt)
    comm_lanes = np.flatnonzero(~lanes.is_comp)
    if lane_fs >= 5.0 and len(comm_lanes):
        _add_labels(ax, np.array([lanes.label[i] for i in comm_lanes]), np.full(len(comm_lanes), -0.004),
                    lanes.y0[comm_lanes] + lanes.comm_h / 2, lane_fs, None,
                    blended_transform_factory(ax.transAxes, ax.transData), _points_transform(ax.figure),
                    ha="right", color="#555555", clip=False, gid="labels:lanes")
        ax.tick_params(axis="y", which="major", pad=max(18, 4.2 * lane_fs))
    ax.tick_params(axis="y", which="major", length=0)
    ax.grid(axis="x", color="#d0d0d0", lw=0.6, zorder=0)
    ax.set_axisbelow(True)
    ax.tick_params(axis="x", labelsize=9, top=top_ticks, labeltop=top_ticks)
    t0 = tx.t0
    origin = "" if t0 == 0 else f" from t = {t0 * 1e3:.3f} ms" if t0 < 1 else f" from t = {t0:.3f} s"
    ax.set_xlabel(f"time ({tx.unit}){origin}", fontsize=10)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _default_title(rows: _Rows, n_ops: int, n_ops_all: int, step: int | None) -> str:
    """``Timeline: <rows>, <ops> [shown][, step S]``."""
    n_all = rows.n_all
    what = f"{n_all} {rows.unit_name}" if rows.by == "stage" else f"{n_all} rank{'s' if n_all != 1 else ''}"
    shown = f"{n_ops:,} ops shown" if n_ops < n_ops_all else f"{n_ops:,} ops"
    return f"Timeline: {what}, {shown}" + (f", step {step}" if step is not None else "")


def _legend_handles(ops: _Ops) -> list:
    """A patch per colour category that occurs, and one explaining the lighter chunk shades."""
    from matplotlib.patches import Patch

    present_cats = sorted(set(ops.cat.tolist()))
    handles = [Patch(facecolor=_CATEGORIES[i][1], edgecolor="none", label=_CATEGORIES[i][2]) for i in present_cats]
    if ops.n_chunks > 1:
        handles.append(Patch(facecolor="#cfd9ea", edgecolor="none",
                             label="lighter shade: later model chunk"))
    return handles


def _draw_title_and_legend(fig, title: str, notes: list[str], handles: list, legend_rows: int) -> None:
    """Title (notes on a second line) at the top, the legend below it."""
    fig_h_in = fig.get_figheight()
    title_lines = 1 + (1 if notes else 0)
    full_title = title + ("\n(" + "; ".join(notes) + ")" if notes else "")
    fig.text(0.5, 1 - 0.12 / fig_h_in, full_title, ha="center", va="top", fontsize=12,
             linespacing=1.4)
    ncol = int(np.ceil(len(handles) / legend_rows))
    fig.legend(handles=handles, loc="upper center", ncol=ncol, frameon=False, fontsize=9,
               bbox_to_anchor=(0.5, 1 - (0.2 + 0.28 * title_lines) / fig_h_in), handlelength=1.6,
               columnspacing=1.4)
