"""Plots of a simulated step: a per-rank Gantt chart and a step-time breakdown bar.

matplotlib is imported inside the functions (the engine never imports it) and only through
its object-oriented API (``Figure`` + ``FigureCanvasAgg``), so plotting touches no global
pyplot state and needs no display. Both functions return the ``Figure`` and write a PNG
when given a path.

Gantt layout: one *row* per rank (or per pipeline stage, drawn from one representative
rank), each row a tall compute lane plus one thin lane per communication stream the rank
uses (``tp, cp, ep, pp, dp`` in that order). Compute is coloured by phase (forward, input
gradient, weight gradient, recompute, step end), communication by mesh axis; later model
chunks (virtual pipeline stages) get lighter shades of their phase colour. Adjacent ops of
the same micro-batch and phase merge into one bar, so rendering is one ``PolyCollection``
for all bars (fast for tens of thousands of ops); micro-batch numbers are written only
inside bars wide enough to hold them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from .trace import _require_columns, stream_order

__all__ = ["AXIS_COLORS", "PHASE_COLORS", "breakdown_bar", "gantt", "validation_scatter"]

# ---- colours -------------------------------------------------------------------------------
# Compute by phase (blue forward, greens backward, purple recompute, dark grey step end),
# communication by axis in warm / earthy hues that do not collide with the compute ones.
PHASE_COLORS = {
    "F": "#3a6fb0",   # forward
    "B": "#3f9a4a",   # backward, input gradient
    "W": "#9ccf6b",   # weight gradient
    "R": "#8e6bbf",   # recompute
    "S": "#3b3b3b",   # optimizer / grad norm / step end
}
AXIS_COLORS = {
    "tp": "#f28e2b",  # orange
    "cp": "#d4b000",  # gold
    "ep": "#d6404e",  # red
    "pp": "#8c564b",  # brown
    "dp": "#e377c2",  # pink
}
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
_LEFT_IN, _RIGHT_IN, _BOTTOM_IN = 1.45, 0.3, 0.6
_MAX_PLOT_H_IN = 30.0    # cap on the plotting area (64 rows with 5 comm lanes each still fit)
_COMPUTE_PT = 22.0       # preferred compute-lane height; comm lanes are 0.42 of it at this size


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


def _to_rgba(colors: Sequence[str]) -> np.ndarray:
    from matplotlib.colors import to_rgba_array
    return to_rgba_array(list(colors))


def _time_unit(span_s: float) -> tuple[str, float]:
    if span_s < 2e-3:
        return "µs", 1e6
    if span_s < 20.0:
        return "ms", 1e3
    return "s", 1.0


def _select_step(df: pd.DataFrame, step: int | None) -> tuple[pd.DataFrame, int | None]:
    if step is None:
        return df, None
    if "step" not in df.columns:
        raise ValueError("step= given but the timeline has no 'step' column")
    steps = sorted(int(s) for s in pd.unique(df["step"]))
    chosen = steps[step] if step < 0 and -len(steps) <= step else step
    if chosen not in steps:
        raise ValueError(f"step {step} not in the timeline; steps present: {steps}")
    return df[df["step"] == chosen], chosen


def _stage_map(df: pd.DataFrame, stage_of) -> tuple[dict[int, int], bool]:
    """rank -> stage, from ``stage_of`` (mapping or callable), a 'stage' column, or inferred."""
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


def _subset(items: list, max_rows: int) -> list:
    if len(items) <= max_rows:
        return items
    idx = np.unique(np.round(np.linspace(0, len(items) - 1, max_rows)).astype(int))
    return [items[i] for i in idx]


def gantt(timeline: pd.DataFrame, path: str | Path | None = None, *, by: str = "rank",
          ranks: Sequence[int] | None = None, max_rows: int = 64, title: str | None = None,
          step: int | None = None, stage_of: Mapping[int, int] | Callable[[int], int] | None = None,
          dpi: int = 100):
    """Gantt chart of a timeline: one row per rank (or pipeline stage), a lane per stream.

    Parameters
    ----------
    timeline
        The engine's timeline DataFrame (contract columns; ``step`` and ``stage`` optional).
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

    Returns
    -------
    matplotlib.figure.Figure
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import PolyCollection
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.transforms import Affine2D, blended_transform_factory

    cols = ("rank", "stream", "kind", "name", "layer", "microbatch", "chunk", "phase", "axis", "start_s", "end_s")
    _require_columns(timeline, cols)
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

    notes = []
    if by == "rank":
        row_items = sorted(present)
        unit_name = "ranks"
    else:
        smap, inferred = _stage_map(df, stage_of)
        reps: dict[int, int] = {}
        for r in sorted(present):
            reps.setdefault(smap[r], r)
        row_items = sorted(reps.items())         # (stage, representative rank)
        unit_name = "stages"
        notes.append("one rank per stage" + (", stages inferred from layers" if inferred else ""))
    n_all = len(row_items)
    row_items = _subset(row_items, max_rows)
    if len(row_items) < n_all:
        notes.append(f"showing {len(row_items)} of {n_all} {unit_name}, evenly spaced; pass ranks= to choose")
    row_ranks = [r if by == "rank" else r[1] for r in row_items]
    n_ops_all = len(df)
    df = df[df["rank"].isin(row_ranks)]

    # ---- lanes -------------------------------------------------------------------------------
    streams = stream_order(pd.unique(df["stream"].astype(str)))
    s_code = {s: i for i, s in enumerate(streams)}
    n_s = len(streams)
    rank_a = df["rank"].to_numpy(dtype=np.int64)
    stream_a = df["stream"].astype(str).to_numpy()
    scode_a = pd.Series(stream_a).map(s_code).to_numpy(dtype=np.int64)
    pairs = set(zip(rank_a.tolist(), scode_a.tolist()))
    lane_of: dict[int, int] = {}           # rank * n_s + stream code -> lane index
    lane_y0, lane_h, lane_is_comp, lane_label = [], [], [], []
    row_y, row_label, row_bounds = [], [], []
    y = 0.0
    comp_code = s_code.get("compute", -1)
    node_of = (df.groupby("rank")["node"].first().to_dict() if "node" in df.columns else {})
    row_codes = [[c for c in range(n_s) if (r, c) in pairs and c != comp_code] for r in row_ranks]
    unit_pt, pitch_pt = _lane_geometry(len(row_items), sum(len(c) for c in row_codes))
    comm_pitch = pitch_pt / unit_pt             # in lane units (compute lane = 1)
    comm_h = 0.8 * comm_pitch
    for item, codes in zip(row_items, row_codes):
        r = item if by == "rank" else item[1]
        row_top = y
        if comp_code >= 0:
            lane_of[r * n_s + comp_code] = len(lane_y0)
        lane_y0.append(y); lane_h.append(_COMPUTE_H); lane_is_comp.append(True); lane_label.append("compute")
        row_y.append(y + _COMPUTE_H / 2)
        if by == "rank":
            host = f"  h{int(node_of[r])}" if r in node_of else ""
            row_label.append(f"rank {r}{host}")
        else:
            row_label.append(f"stage {item[0]} · r{r}")
        y += _COMPUTE_H + (comm_pitch - comm_h)
        for c in codes:
            lane_of[r * n_s + c] = len(lane_y0)
            lane_y0.append(y); lane_h.append(comm_h); lane_is_comp.append(False); lane_label.append(streams[c])
            y += comm_pitch
        row_bounds.append((row_top, y))
        y += _ROW_GAP
    total_units = y - _ROW_GAP
    lane_y0 = np.asarray(lane_y0); lane_h = np.asarray(lane_h); lane_is_comp = np.asarray(lane_is_comp)

    key = rank_a * n_s + scode_a
    lane = pd.Series(key).map(lane_of).to_numpy(dtype=np.int64)

    # ---- figure geometry -------------------------------------------------------------------
    plot_h_in = max(total_units * unit_pt / 72, 1.2)
    unit_pt = plot_h_in * 72 / total_units
    top_ticks = plot_h_in > 9
    t0 = float(df["start_s"].min())
    t1 = float(df["end_s"].max())
    span_s = max(t1 - t0, 1e-12)
    unit, scale = _time_unit(span_s)

    kind = df["kind"].astype(str).to_numpy()
    phase = df["phase"].astype(str).to_numpy()
    axis = df["axis"].fillna("").astype(str).to_numpy()
    is_comp_op = kind == "compute"
    comm_axis = np.where(axis == "", stream_a, axis)
    cat_key = np.where(is_comp_op, phase, comm_axis)
    cat = pd.Series(cat_key).map(_CAT_INDEX).to_numpy(dtype=float)
    cat = np.where(np.isnan(cat), np.where(is_comp_op, _CAT_INDEX["compute"], _CAT_INDEX["comm"]), cat).astype(int)
    chunk = np.nan_to_num(df["chunk"].to_numpy(dtype=float), nan=0.0).astype(int)
    n_chunks = int(chunk.max()) + 1 if len(chunk) else 1
    mb = np.nan_to_num(df["microbatch"].to_numpy(dtype=float), nan=-1.0).astype(int)
    names = df["name"].astype(str).to_numpy()
    x0 = (df["start_s"].to_numpy(dtype=float) - t0) * scale
    x1 = (df["end_s"].to_numpy(dtype=float) - t0) * scale
    xspan = span_s * scale

    present_cats = sorted(set(cat.tolist()))
    legend_rows = 1 if len(present_cats) + (n_chunks > 1) <= 7 else 2
    title_lines = 1 + (1 if notes else 0)
    top_in = 0.25 + 0.28 * title_lines + 0.27 * legend_rows + (0.3 if top_ticks else 0.1)
    fig_h_in = plot_h_in + top_in + _BOTTOM_IN
    fig = Figure(figsize=(_FIG_W_IN, fig_h_in), dpi=dpi)
    FigureCanvasAgg(fig)
    plot_w_in = _FIG_W_IN - _LEFT_IN - _RIGHT_IN
    ax = fig.add_axes([_LEFT_IN / _FIG_W_IN, _BOTTOM_IN / fig_h_in, plot_w_in / _FIG_W_IN, plot_h_in / fig_h_in])
    px_per_x = plot_w_in * dpi / (xspan * 1.01)

    # ---- bars: merge adjacent same-key ops in a lane, then one PolyCollection -----------------
    order = np.lexsort((x0, lane))
    L, X0, X1, C, CH, MB, PH = (lane[order], x0[order], x1[order], cat[order], chunk[order], mb[order],
                                phase[order])
    NM, COMP = names[order], is_comp_op[order]
    tol = 0.75 / px_per_x
    same = np.zeros(len(L), dtype=bool)
    if len(L) > 1:
        same[1:] = ((L[1:] == L[:-1]) & (C[1:] == C[:-1]) & (CH[1:] == CH[:-1]) & (MB[1:] == MB[:-1])
                    & (PH[1:] == PH[:-1]) & (X0[1:] - X1[:-1] <= tol))
    starts = np.flatnonzero(~same)
    bx0 = X0[starts]
    bx1 = np.maximum.reduceat(X1, starts)
    bl, bc, bch, bname = L[starts], C[starts], CH[starts], NM[starts]
    min_w = 0.6 / px_per_x                      # keep sub-pixel ops visible
    bx1v = np.maximum(bx1, bx0 + min_w)
    ytop = lane_y0[bl]
    ybot = ytop + lane_h[bl]
    verts = np.stack([np.column_stack([bx0, ytop]), np.column_stack([bx0, ybot]),
                      np.column_stack([bx1v, ybot]), np.column_stack([bx1v, ytop])], axis=1)
    palette = _to_rgba([c for _, c, _ in _CATEGORIES])
    face = palette[bc].copy()
    if n_chunks > 1:                             # later model chunks: lighter shade of the same hue
        light = np.where(lane_is_comp[bl] & (bch > 0), 0.5 * bch / (n_chunks - 1), 0.0)[:, None]
        face[:, :3] = face[:, :3] + (1 - face[:, :3]) * light
    width_px = (bx1 - bx0) * px_per_x
    lw = np.where(width_px >= 5, 0.5, 0.0)
    pc = PolyCollection(verts, facecolors=face, edgecolors="white", linewidths=lw, antialiaseds=True,
                        zorder=2)
    ax.add_collection(pc)

    # ---- labels: glyph paths in one collection per font size (thousands of Text artists are slow)
    pts = Affine2D().scale(1 / 72) + fig.dpi_scale_trans
    comp_fs = min(9.0, 0.62 * _COMPUTE_H * unit_pt)
    comm_fs = min(7.0, 0.8 * comm_h * unit_pt)
    if comp_fs >= 4.5:
        # One label per run: consecutive compute bars of a lane with the same micro-batch, chunk
        # and pass (forward, or backward = B/W/R). Bars of one colour in a run separated only by
        # thin gaps (blocking TP collectives, say) form a group; the label goes in the centre of
        # the run's widest group when it fits there.
        cbk = np.flatnonzero(COMP[starts])           # compute blocks, in lane/time order
        if len(cbk):
            g_l, g_c, g_ch, g_x0, g_x1 = bl[cbk], bc[cbk], bch[cbk], bx0[cbk], bx1[cbk]
            g_mb, g_ph, g_nm = MB[starts][cbk], PH[starts][cbk], bname[cbk]
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

            def widest(width, run_id):            # index of the widest item of each run
                o = np.lexsort((-width, run_id))
                first = np.ones(len(o), dtype=bool)
                first[1:] = run_id[o][1:] != run_id[o][:-1]
                return o[first]

            wb = widest(bw, run)                            # widest single bar of each run
            wg = widest(gw, run[gs])                        # widest same-colour group of each run
            texts = np.where(g_mb[wb] >= 0, g_mb[wb].astype(str), g_nm[wb]).astype(str)
            need = np.char.str_len(texts) * 0.64 * comp_fs * dpi / 72 + 2
            in_bar = bw[wb] >= need
            in_grp = ~in_bar & (gw[wg] >= need + 2)
            lx = np.where(in_bar, (g_x0[wb] + g_x1[wb]) / 2, (gx0[wg] + gx1[wg]) / 2)
            blk = cbk[np.where(in_bar, wb, gs[wg])]
            show = in_bar | in_grp
            _add_labels(ax, texts[show], lx[show], lane_y0[bl[blk[show]]] + _COMPUTE_H / 2,
                        comp_fs, face[blk[show]], ax.transData, pts, gid="labels:compute")
    if comm_fs >= 4.5:
        cb = np.flatnonzero(~lane_is_comp[bl])
        texts = bname[cb].astype(str)
        fits = width_px[cb] >= np.char.str_len(texts) * 0.64 * comm_fs * dpi / 72 + 2
        cb, texts = cb[fits], texts[fits]
        _add_labels(ax, texts, (bx0[cb] + bx1[cb]) / 2, lane_y0[bl[cb]] + comm_h / 2, comm_fs, face[cb],
                    ax.transData, pts, gid="labels:comm")

    # ---- axes, row shading, host separators --------------------------------------------------
    ax.set_xlim(0, xspan * 1.01)
    ax.set_ylim(total_units + 0.15, -0.15)
    for i, (a, b) in enumerate(row_bounds):
        if i % 2 == 1:
            ax.axhspan(a - _ROW_GAP / 2, b + _ROW_GAP / 2, color="#f2f2f2", zorder=0, lw=0)
    if by == "rank" and node_of:
        for i in range(1, len(row_items)):
            if node_of.get(row_ranks[i]) != node_of.get(row_ranks[i - 1]):
                ax.axhline(row_bounds[i][0] - _ROW_GAP / 2, color="#888888", lw=0.8, ls="--", zorder=1)
    row_fs = float(np.clip(0.55 * (row_bounds[0][1] - row_bounds[0][0] + _ROW_GAP) * unit_pt, 5.0, 10.0))
    ax.set_yticks(row_y)
    ax.set_yticklabels(row_label, fontsize=row_fs)
    lane_fs = min(7.0, 0.95 * comm_pitch * unit_pt)
    comm_lanes = np.flatnonzero(~lane_is_comp)
    if lane_fs >= 5.0 and len(comm_lanes):
        _add_labels(ax, np.array([lane_label[i] for i in comm_lanes]), np.full(len(comm_lanes), -0.004),
                    lane_y0[comm_lanes] + comm_h / 2, lane_fs, None, blended_transform_factory(ax.transAxes,
                    ax.transData), pts, ha="right", color="#555555", clip=False,
                    gid="labels:lanes")
        ax.tick_params(axis="y", which="major", pad=max(18, 4.2 * lane_fs))
    ax.tick_params(axis="y", which="major", length=0)
    ax.grid(axis="x", color="#d0d0d0", lw=0.6, zorder=0)
    ax.set_axisbelow(True)
    ax.tick_params(axis="x", labelsize=9, top=top_ticks, labeltop=top_ticks)
    origin = "" if t0 == 0 else f" from t = {t0 * 1e3:.3f} ms" if t0 < 20 else f" from t = {t0:.3f} s"
    ax.set_xlabel(f"time ({unit}){origin}", fontsize=10)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)

    # ---- title and legend ------------------------------------------------------------------
    if title is None:
        what = f"{n_all} {unit_name}" if by == "stage" else f"{n_all} rank{'s' if n_all != 1 else ''}"
        shown = f"{len(df):,} ops shown" if len(df) < n_ops_all else f"{len(df):,} ops"
        title = f"Timeline: {what}, {shown}" + (f", step {chosen_step}" if chosen_step is not None else "")
    full_title = title + ("\n(" + "; ".join(notes) + ")" if notes else "")
    fig.text(0.5, 1 - 0.12 / fig_h_in, full_title, ha="center", va="top", fontsize=12,
             linespacing=1.4)
    handles = [Patch(facecolor=_CATEGORIES[i][1], edgecolor="none", label=_CATEGORIES[i][2]) for i in present_cats]
    if n_chunks > 1:
        handles.append(Patch(facecolor="#cfd9ea", edgecolor="none",
                             label="lighter shade: later model chunk"))
    ncol = int(np.ceil(len(handles) / legend_rows))
    fig.legend(handles=handles, loc="upper center", ncol=ncol, frameon=False, fontsize=9,
               bbox_to_anchor=(0.5, 1 - (0.2 + 0.28 * title_lines) / fig_h_in), handlelength=1.6,
               columnspacing=1.4)
    if path is not None:
        fig.savefig(path, dpi=dpi)
    return fig


def _add_labels(ax, texts, xs, ys, fontsize, faces, offset_transform, pts_transform, *, ha="center",
                color=None, clip=True, gid="labels"):
    """Draw many short labels as one PathCollection of glyph outlines (one artist, not one per label).

    Each text is turned into a ``TextPath`` once (cached per string), centred (or right-aligned)
    on its anchor; anchors are placed with ``offset_transform``, glyphs are sized in points.
    Text is black on light bars and white on dark ones (``faces``), or ``color``.
    """
    from matplotlib.collections import PathCollection
    from matplotlib.font_manager import FontProperties
    from matplotlib.path import Path as MPath
    from matplotlib.textpath import TextPath

    if len(texts) == 0:
        return None
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
    coll.label_texts = tuple(texts.tolist())    # the strings drawn, for tests and callers
    ax.add_collection(coll, autolim=False)
    return coll


# ---- step-time breakdown ---------------------------------------------------------------------
_BREAKDOWN_FALLBACK = ["#17becf", "#bcbd22", "#7f7f7f", "#aec7e8", "#ffbb78", "#98df8a"]
_TOTAL_KEYS = ("total", "total_s", "step_time", "step_time_s")


def _fmt(v: float) -> str:
    """1,234 / 123.4 -> 123 / 12.3 / 1.23 / 0.123: three significant digits, never exponents."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}" if abs(v) >= 1e-3 else "0" if v == 0 else f"{v:.1e}"


def _breakdown_color(key: str, i: int) -> str:
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

    Returns
    -------
    matplotlib.figure.Figure
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

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
    total = sum(v for _, v in items)
    unit, scale = _time_unit(max(total, 1e-12))
    colors = [_breakdown_color(k, i) for i, (k, _) in enumerate(items)]
    n = len(items)

    fig_h = 1.9 + 0.34 * n
    fig = Figure(figsize=(10, fig_h), dpi=dpi)
    FigureCanvasAgg(fig)
    top_in, stack_h_in, gap_in, bottom_in = 0.55, 0.45, 0.45, 0.45
    list_h_in = fig_h - top_in - stack_h_in - gap_in - bottom_in
    ax_s = fig.add_axes([0.22, (bottom_in + list_h_in + gap_in) / fig_h, 0.74, stack_h_in / fig_h])
    ax_l = fig.add_axes([0.22, bottom_in / fig_h, 0.74, list_h_in / fig_h])

    left = 0.0
    for (k, v), c in zip(items, colors):
        if v <= 0:
            continue
        ax_s.barh(0, v * scale, left=left, color=c, edgecolor="white", linewidth=0.8, height=0.8)
        frac = v / total if total > 0 else 0.0
        if frac >= 0.06:
            lum = np.dot(_to_rgba([c])[0][:3], [0.299, 0.587, 0.114])
            ax_s.text(left + v * scale / 2, 0, f"{frac:.0%}", ha="center", va="center", fontsize=9,
                      color="black" if lum > 0.6 else "white")
        left += v * scale
    ax_s.set_xlim(0, max(total * scale, 1e-12))
    ax_s.set_yticks([0])
    ax_s.set_yticklabels(["step"], fontsize=10)
    ax_s.tick_params(axis="x", labelsize=8)
    ax_s.tick_params(axis="y", length=0)
    for side in ("top", "right", "left"):
        ax_s.spines[side].set_visible(False)

    ypos = np.arange(n)
    vals = np.array([v for _, v in items]) * scale
    ax_l.barh(ypos, vals, color=colors, height=0.7, edgecolor="none")
    ax_l.set_yticks(ypos)
    ax_l.set_yticklabels([k.replace("_", " ") for k, _ in items], fontsize=10)
    ax_l.invert_yaxis()
    vmax = float(vals.max()) if n else 1.0
    ax_l.set_xlim(0, max(vmax, 1e-12) * 1.28)
    for yy, (k, v) in zip(ypos, items):
        frac = v / total if total > 0 else 0.0
        ax_l.text(v * scale + vmax * 0.01, yy, f"{_fmt(v * scale)} {unit}  ({frac:.1%})", va="center", fontsize=9)
    ax_l.set_xlabel(f"time ({unit})", fontsize=10)
    ax_l.tick_params(axis="x", labelsize=8)
    ax_l.tick_params(axis="y", length=0)
    ax_l.grid(axis="x", color="#dddddd", lw=0.6)
    ax_l.set_axisbelow(True)
    for side in ("top", "right"):
        ax_l.spines[side].set_visible(False)

    if title is None:
        title = f"Step-time breakdown: {_fmt(total * scale)} {unit}"
        if total_ref is not None and abs(total_ref - total) > 1e-9 * max(abs(total_ref), 1e-12):
            title += f" (categories sum; step time {_fmt(total_ref * scale)} {unit})"
    fig.text(0.5, 1 - 0.15 / fig_h, title, ha="center", va="top", fontsize=12)
    if path is not None:
        fig.savefig(path, dpi=dpi)
    return fig


# ---- validation scatter -------------------------------------------------------------------------
_SOURCE_COLORS = ("#3a6fb0", "#d1495b", "#3f9a4a", "#edae49", "#8e6bbf", "#00798c", "#6b4226", "#3b3b3b")


def validation_scatter(results: Sequence[Mapping], path: str | Path | None = None, *, title: str | None = None,
                       band: float = 0.10, dpi: int = 110):
    """Predicted against measured step time of :func:`simulator.validation.validate` rows.

    Log-log axes, the ``y = x`` line with a ``+-band`` (default 10 %) band, one colour per
    ``source``; the legend gives each source's simulated rows and median absolute error.
    Rows whose ``status`` is not ``ok`` are not drawn (the legend counts them).  Writes a PNG
    when ``path`` is given; returns the ``Figure``.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

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
    from matplotlib.ticker import FuncFormatter

    def _major(v, _pos):
        return f"{v:g}"

    def _minor(v, _pos):                      # label 2x and 5x of each decade only
        mant = v / 10 ** np.floor(np.log10(v))
        return f"{v:g}" if round(mant) in (2, 5) and abs(mant - round(mant)) < 1e-6 else ""

    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(FuncFormatter(_major))
        axis.set_minor_formatter(FuncFormatter(_minor))
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
