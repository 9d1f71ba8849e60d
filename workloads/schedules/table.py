"""The text table of a schedule (the ``clustersim schedule`` view).

The timed view places every compute action at its unit-cost start slot from
:func:`.timing.schedule_timing`, so this module sits above both :mod:`.actions` (the
table as data) and :mod:`.timing` (its longest path).
"""

from __future__ import annotations

from .actions import Schedule, format_action
from .timing import UNIT_COSTS, schedule_timing

__all__ = ["format_table"]


def format_table(schedule: Schedule, timed: bool = True) -> str:
    """A compact text table: one column per stage, one row per time slot.

    With ``timed=True`` (default) every action takes one slot and starts as soon as its
    stage is free and its dependencies have finished (unit-duration longest path, see
    :mod:`.timing`), so idle slots, shown as ``.``, draw the bubble.  With ``timed=False``
    row ``i`` is simply the ``i``-th entry of every stage's list.  Chunks are written
    (``@c``) when the schedule has more than one chunk per stage.  The timed view shows
    compute actions only (communication takes no slot).
    """
    show_chunk = schedule.num_chunks > 1
    columns: list[dict[int, str]] = [{} for _ in range(schedule.pp)]
    if timed:
        timing = schedule_timing(schedule, UNIT_COSTS)
        for s, stage_actions in enumerate(schedule.actions):
            for a, start in zip(stage_actions, timing.start[s], strict=True):
                if a is not None and a.is_compute:
                    columns[s][int(start)] = format_action(a, show_chunk)
    else:
        for s, stage_actions in enumerate(schedule.actions):
            for i, a in enumerate(stage_actions):
                if a is not None:
                    columns[s][i] = format_action(a, show_chunk)
    num_rows = 1 + max((max(col) for col in columns if col), default=-1)
    header = ["slot"] + [f"stage{s}" for s in range(schedule.pp)]
    rows = [[str(t)] + [col.get(t, ".") for col in columns] for t in range(num_rows)]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]]
    return "\n".join(lines) + "\n"
