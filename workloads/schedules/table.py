"""The text table of a schedule (the ``clustersim schedule`` view).

The timed view places every compute action at its unit-cost start slot from
:func:`.timing.schedule_timing`, so this module sits above both :mod:`.actions` (the
table as data) and :mod:`.timing` (its longest path).
"""

from __future__ import annotations

from .actions import ActionKind, Schedule, format_action
from .timing import UNIT_COSTS, schedule_timing

__all__ = ["format_legend", "format_table"]

_KIND_MEANING = {
    ActionKind.F: "forward",
    ActionKind.BW: "full backward (input and weight gradients together, as 1F1B and GPipe run it)",
    ActionKind.B: "backward for the input gradient only (zero-bubble split: it unblocks the previous stage)",
    ActionKind.W: "backward for the weight gradient of a micro-batch whose B ran (fills bubbles)",
}


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


def format_legend(schedule: Schedule, timed: bool = True) -> str:
    """A few lines explaining the notation of :func:`format_table` (and of the per-stage lists):
    the action form with an example from this schedule, the kinds it uses, chunks, the ``&`` of
    an overlapped pair and, in the timed view, the ``.`` of an idle slot."""
    show_chunk = schedule.num_chunks > 1
    kinds: set[ActionKind] = set()
    first = None
    for stage_actions in schedule.actions:
        for a in stage_actions:
            if a is None or not a.is_compute:
                continue
            first = first or a
            kinds.update(h.kind for h in a.halves())
            if a.kind is ActionKind.FB:
                kinds.add(ActionKind.FB)
    form = "{stage}{kind}{micro-batch}" + ("@c{chunk}" if show_chunk else "")
    lines = [f"notation: {form}"]
    if first is not None:
        f = first.halves()[0]
        example = f"stage {f.stage}, {_KIND_MEANING[f.kind].split(' (')[0]} of micro-batch {f.microbatch}"
        if show_chunk:
            example += f" on the stage's model chunk {f.chunk}"
        lines[0] += f", e.g. {format_action(f, show_chunk)} = {example}"
    for kind in (ActionKind.F, ActionKind.BW, ActionKind.B, ActionKind.W):
        if kind in kinds:
            lines.append(f"  {kind.value:<3}{_KIND_MEANING[kind]}")
    if show_chunk:
        lines.append(f"  @cN the stage's model chunk N (each stage holds {schedule.num_chunks} chunks of layers)")
    if ActionKind.FB in kinds:
        lines.append("  X&Y two actions overlapped as one unit (DualPipe's F&B pair, stage written once)")
    if timed:
        lines.append("  .  idle slot: the pipeline bubble (one slot per action, communication free)")
    return "\n".join(lines) + "\n"
