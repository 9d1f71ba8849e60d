"""Colours and time units shared by the charts (:mod:`.gantt_chart`, :mod:`.charts`).

Compute is coloured by phase (blue forward, greens backward, purple recompute, dark grey step
end), communication by mesh axis in warm / earthy hues that do not collide with the compute
ones. matplotlib is imported only inside :func:`to_rgba`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["AXIS_COLORS", "PHASE_COLORS", "time_unit", "to_rgba"]

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
    """Unit to show a time span in (µs below 2 ms, ms below 20 s, else s) and its factor from seconds."""
    if span_s < 2e-3:
        return "µs", 1e6
    if span_s < 20.0:
        return "ms", 1e3
    return "s", 1.0
