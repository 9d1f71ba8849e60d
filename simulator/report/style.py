"""Colours and time units shared by the charts (:mod:`.gantt_chart`, :mod:`.charts`).

Compute is coloured by phase (blue forward, greens backward, purple recompute, dark grey step
end), communication by mesh axis in warm / earthy hues that do not collide with the compute
ones. matplotlib is imported only inside :func:`to_rgba`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["AXIS_COLORS", "PHASE_COLORS", "fit_left_labels", "time_unit", "to_rgba"]

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


def to_rgba(colors: Sequence[str]) -> np.ndarray:
    """An (n, 4) RGBA array of matplotlib colour specs."""
    from matplotlib.colors import to_rgba_array
    return to_rgba_array(list(colors))


def time_unit(span_s: float) -> tuple[str, float]:
    """Unit to show a time span in, by its magnitude (µs below 1 ms, ms below 1 s, else s), and
    its factor from seconds: a span never reads as thousands of the smaller unit ("8.74e+03 ms")."""
    if span_s < 1e-3:
        return "µs", 1e6
    if span_s < 1.0:
        return "ms", 1e3
    return "s", 1.0


def fit_left_labels(fig, ax, pad_in: float = 0.08) -> None:
    """Widen ``fig`` on the left when ``ax``'s y tick labels (with anything else on its y axis)
    would start left of the figure's edge, so that none is clipped ("tage 7" for "stage 7").
    The axes keep their size in inches: a time axis keeps its pixels per second."""
    bbox = ax.yaxis.get_tightbbox(fig.canvas.get_renderer())
    if bbox is None:
        return
    need_in = pad_in - bbox.x0 / fig.dpi
    if need_in <= 0:
        return
    width_in, height_in = fig.get_size_inches()
    pos = ax.get_position()
    left_in, plot_w_in = pos.x0 * width_in + need_in, pos.width * width_in
    fig.set_size_inches(width_in + need_in, height_in)
    ax.set_position([left_in / (width_in + need_in), pos.y0, plot_w_in / (width_in + need_in), pos.height])
