"""Check that a schedule table is a correct training step.

Rules, checked in this order (the first broken one raises :class:`ScheduleError` naming the
stage and the action):

1. **Shape**: one list per stage; an action sits in its own stage's list; local chunk and
   micro-batch indices are in range; only ``FB`` carries a backward half.
2. **Placement**: every (micro-batch, chunk) runs on a stage its route visits
   (:func:`.actions.route`).
3. **Once per phase**: for every micro-batch and every model chunk on its route there is
   exactly one forward (``F`` or the forward half of ``FB``) and either exactly one full
   backward (``BW`` or the backward half of ``FB``) or exactly one ``B`` and one ``W``.
4. **Order on a stage**: ``F`` before ``B``/``BW``, ``B`` before ``W``.
5. **One thing at a time**: a stage runs its list in order, so the only concurrent work is
   an ``FB`` pair, whose halves must be independent: two different micro-batches.
6. **No deadlock**: cross-stage dependencies are acyclic; checked by running the table
   with unit durations (:func:`.timing.schedule_timing`), which reports every stage left
   waiting and on what.

Communication actions and ``None`` entries are skipped.
"""

from __future__ import annotations

from collections import defaultdict

from .actions import (
    Action,
    ActionKind,
    Schedule,
    ScheduleError,
    model_chunk,
    route,
    route_position,
)
from .timing import UNIT_COSTS, schedule_timing

__all__ = ["ScheduleError", "validate"]

_F, _B, _W, _BW, _FB = ActionKind.F, ActionKind.B, ActionKind.W, ActionKind.BW, ActionKind.FB


def _check_shape(schedule: Schedule) -> None:
    if len(schedule.actions) != schedule.pp:
        raise ScheduleError(None, None, f"the table has {len(schedule.actions)} stage lists, pp = {schedule.pp}")
    for s, stage_actions in enumerate(schedule.actions):
        for a in stage_actions:
            if a is None:
                continue
            if not isinstance(a, Action) or not isinstance(a.kind, ActionKind):
                raise ScheduleError(s, a, "not an Action with an ActionKind")
            if a.stage != s:
                raise ScheduleError(s, a, f"listed under stage {s} but names stage {a.stage}")
            if not a.is_compute:
                continue
            if (a.kind is _FB) != (a.b_chunk is not None and a.b_microbatch is not None):
                raise ScheduleError(s, a, "only an FB pair carries b_chunk/b_microbatch, and it needs both")
            for half in a.halves():
                if not 0 <= half.chunk < schedule.num_chunks:
                    raise ScheduleError(s, a, f"chunk {half.chunk} out of range 0..{schedule.num_chunks - 1}")
                if not 0 <= half.microbatch < schedule.num_microbatches:
                    raise ScheduleError(s, a, f"micro-batch {half.microbatch} out of range "
                                              f"0..{schedule.num_microbatches - 1}")
            if a.kind is _FB and a.microbatch == a.b_microbatch:
                raise ScheduleError(s, a, "an FB pair overlaps the forward and backward of the same micro-batch; "
                                          "the backward depends on that forward, so the stage would run two "
                                          "dependent actions at once")


def validate(schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` if ``schedule`` breaks any rule of this module.

    Parameters
    ----------
    schedule : Schedule

    Raises
    ------
    ScheduleError
        With ``.stage``, ``.action`` and ``.rule`` set.
    """
    _check_shape(schedule)
    position = route_position(schedule)
    num_model_chunks = schedule.num_model_chunks
    # (microbatch * K + model chunk) -> phase -> [(position in the stage list, action)]
    seen: dict[int, dict[ActionKind, list[tuple[int, Action]]]] = defaultdict(lambda: defaultdict(list))
    for s, stage_actions in enumerate(schedule.actions):
        for i, a in enumerate(stage_actions):
            if a is None or not a.is_compute:
                continue
            for half in a.halves():
                mb = half.microbatch
                k = position(s, half.chunk, mb)
                if k is None:
                    k = model_chunk(schedule, s, half.chunk)
                    home = [p for p in route(schedule, mb) if model_chunk(schedule, *p) == k]
                    where = f"stage {home[0][0]} chunk {home[0][1]}" if home else "no stage"
                    raise ScheduleError(s, a, f"micro-batch {mb} does not visit stage {s} chunk {half.chunk}; "
                                              f"its model chunk {k} runs on {where}")
                seen[mb * num_model_chunks + k][half.kind].append((i, a))

    for mb in range(schedule.num_microbatches):
        for k, (s, c) in enumerate(route(schedule, mb)):
            phases = seen.get(mb * num_model_chunks + k, {})
            label = f"micro-batch {mb} chunk {c}"
            forwards = phases.get(_F, [])
            if len(forwards) != 1:
                raise ScheduleError(s, forwards[1][1] if forwards else None,
                                    f"{label}: {len(forwards)} forwards, expected exactly one")
            full, split_b, split_w = phases.get(_BW, []), phases.get(_B, []), phases.get(_W, [])
            if full and (split_b or split_w):
                raise ScheduleError(s, (split_b or split_w)[0][1],
                                    f"{label}: has a full backward BW and also a split B/W")
            if not full and not split_b and not split_w:
                raise ScheduleError(s, None, f"{label}: no backward (BW, or B and W)")
            if len(full) > 1 or len(split_b) > 1 or len(split_w) > 1:
                dup = (full if len(full) > 1 else split_b if len(split_b) > 1 else split_w)[1][1]
                raise ScheduleError(s, dup, f"{label}: backward listed more than once")
            if not full and not (split_b and split_w):
                raise ScheduleError(s, (split_b or split_w)[0][1],
                                    f"{label}: a split backward needs both B and W")
            f_pos, f_action = forwards[0]
            b_pos, b_action = (full or split_b)[0]
            if b_pos < f_pos:
                raise ScheduleError(s, b_action, f"{label}: backward comes before its forward {f_action} on the stage")
            if split_w and split_w[0][0] < b_pos:
                raise ScheduleError(s, split_w[0][1], f"{label}: W comes before its B {b_action} on the stage")

    schedule_timing(schedule, UNIT_COSTS)   # deadlock check
