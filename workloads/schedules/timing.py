"""Longest-path timing of a schedule table, the bubble, and activations in flight.

This module is independent of the generators: it knows only the dependency rules of
pipeline training and reads the table as given.

Model
-----
Every compute action is a node.  Writing ``k`` for the position of a (micro-batch, chunk)
on the micro-batch's route (= its model chunk, see :func:`.actions.route`), the edges are

* program order: an action starts after the previous action of its stage ends;
* ``F(mb, k)`` after ``F(mb, k-1)`` (previous stage, or previous chunk);
* ``B(mb, k)`` (or ``BW``) after ``F(mb, k)`` and after the input gradient of
  ``(mb, k+1)``, i.e. its ``B``/``BW``; the last model chunk's backward needs only its
  forward (the loss);
* ``W(mb, k)`` after ``B(mb, k)``;
* an ``FB`` pair starts when both halves' dependencies are met and completes both halves
  when it ends.

Communication is free (p2p time is the simulator's business) and explicit ``SEND_*`` /
``RECV_*`` actions and ``None`` entries are skipped.  Start times are the earliest the
dependencies allow (as-soon-as-possible on a fixed per-stage order), so the makespan is the
longest path through the graph, weighted by per-action costs.

Costs
-----
``F``, ``B``, ``W`` as given; ``BW = B + W``; ``FB`` costs ``ActionCosts.fb`` when given
(DeepSeek-V3 Table 2's ``F&B``, the time of a mutually overlapped forward and full
backward), otherwise ``F + B + W`` (the sum: no gain from overlap, the conservative choice).

Bubble
------
Defined once, here: the bubble of a stage is its idle time within the step,
``step_time - busy[s]`` (start-up wait included); the schedule's bubble time is the largest
stage bubble, and ``bubble_fraction = bubble_time / step_time``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from .actions import Action, ActionKind, Schedule, ScheduleError, route_position

__all__ = [
    "UNIT_COSTS",
    "ActionCosts",
    "ScheduleTiming",
    "peak_in_flight",
    "schedule_timing",
    "unit_cost",
]

_F, _B, _W, _BW, _FB = ActionKind.F, ActionKind.B, ActionKind.W, ActionKind.BW, ActionKind.FB


class ActionCosts(NamedTuple):
    """Duration of each kind of compute action for one chunk (any time unit, seconds in
    the simulator).  ``BW`` is ``b + w``; ``FB`` is ``fb``, or ``f + b + w`` if ``fb`` is
    None."""

    f: float = 1.0
    b: float = 1.0
    w: float = 1.0
    fb: float | None = None

    def duration(self, action: Action) -> float:
        """Duration of ``action`` under these costs."""
        kind = action.kind
        if kind is _F:
            return self.f
        if kind is _B:
            return self.b
        if kind is _W:
            return self.w
        if kind is _BW:
            return self.b + self.w
        if kind is _FB:
            return self.f + self.b + self.w if self.fb is None else self.fb
        return 0.0


DEFAULT_COSTS = ActionCosts()
"""F = B = W = 1, FB = 3 (no overlap gain)."""


def unit_cost(action: Action) -> float:
    """Every compute action takes one slot (BW and FB included); communication none."""
    return 1.0 if action.is_compute else 0.0


UNIT_COSTS = unit_cost
"""Cost function used for the slot view of :func:`.table.format_table` and deadlock checks."""


@dataclass(frozen=True, slots=True)
class ScheduleTiming:
    """Result of :func:`schedule_timing`; times start at 0 for the step."""

    start: list[list[float]]
    """``start[s][i]``: start of the ``i``-th entry of stage ``s`` (skipped entries: the
    time they were passed)."""
    end: list[list[float]]
    """``end[s][i]``: its end."""
    busy: list[float]
    """Sum of the durations of each stage's actions."""
    step_time: float
    """Makespan: the latest end over all stages."""

    @property
    def idle(self) -> list[float]:
        """Per-stage idle time within the step: ``step_time - busy[s]``."""
        return [self.step_time - b for b in self.busy]

    @property
    def bubble_time(self) -> float:
        """Idle time of the worst stage."""
        return max(self.idle)

    @property
    def bubble_fraction(self) -> float:
        """``bubble_time / step_time`` (0 for an empty schedule)."""
        return self.bubble_time / self.step_time if self.step_time > 0 else 0.0


# Events are ints: (microbatch * K + k) * 3 + phase, K model chunks, phase 0 = forward done,
# 1 = input gradient done, 2 = weight gradient done.
_PHASE_NAMES = ("forward", "input-gradient backward", "weight-gradient backward")


def _describe(event: int, num_model_chunks: int) -> str:
    """An event in words, for error messages."""
    place, phase = divmod(event, 3)
    mb, k = divmod(place, num_model_chunks)
    return f"the {_PHASE_NAMES[phase]} of micro-batch {mb} at model chunk {k}"


def _events_function(schedule: Schedule):
    """``action -> (needs, gives)``: event ids the action waits for and produces."""
    position = route_position(schedule)
    num_model_chunks = schedule.num_model_chunks
    last = num_model_chunks - 1

    def events(a: Action) -> tuple[list[int], list[int]]:
        if a.kind is _FB:
            halves = ((_F, a.chunk, a.microbatch), (_BW, a.b_chunk, a.b_microbatch))
        else:
            halves = ((a.kind, a.chunk, a.microbatch),)
        needs: list[int] = []
        gives: list[int] = []
        for kind, chunk, mb in halves:
            k = position(a.stage, chunk, mb)
            if k is None:
                raise ScheduleError(a.stage, a, f"micro-batch {mb} does not visit stage {a.stage} chunk {chunk}")
            base = (mb * num_model_chunks + k) * 3
            if kind is _F:
                if k > 0:
                    needs.append(base - 3)          # forward of (mb, k-1)
                gives.append(base)
            elif kind is _W:
                needs.append(base + 1)              # B of (mb, k)
                gives.append(base + 2)
            else:                                   # B or BW
                needs.append(base)                  # forward of (mb, k)
                if k < last:
                    needs.append(base + 4)          # input gradient of (mb, k+1)
                gives.append(base + 1)
                if kind is _BW:
                    gives.append(base + 2)
        return needs, gives

    return events


def schedule_timing(schedule: Schedule,
                    costs: ActionCosts | Callable[[Action], float] = DEFAULT_COSTS) -> ScheduleTiming:
    """As-soon-as-possible start and end times of every action (longest path).

    Parameters
    ----------
    schedule : Schedule
    costs : ActionCosts or callable
        Per-kind costs (default :data:`DEFAULT_COSTS`), or a function ``action -> duration``
        (e.g. heavier first and last stages).  Durations in any unit; the result is in the
        same unit.

    Returns
    -------
    ScheduleTiming

    Raises
    ------
    ScheduleError
        If an action runs where its micro-batch does not pass, a result is produced twice,
        or the table deadlocks (a cycle of waits across stages, or a dependency nobody
        produces); the message names each stuck stage, its next action and what it waits for.
    """
    run = _AsapRun(schedule, _duration_function(costs))
    ready = deque(range(len(schedule.actions)))
    while ready:
        ready.extend(run.advance(ready.popleft()))
    run.check_finished()
    step_time = max((max(e) for e in run.end if e), default=0.0)
    return ScheduleTiming(run.start, run.end, run.busy, step_time)


def _duration_function(costs: ActionCosts | Callable[[Action], float]) -> Callable[[Action], float]:
    """``action -> duration`` for per-kind costs (looked up by kind), or ``costs`` itself."""
    if isinstance(costs, ActionCosts):
        by_kind = {kind: costs.duration(Action(0, 0, kind, 0)) for kind in ActionKind}

        def duration(a: Action) -> float:
            return by_kind[a.kind]
        return duration
    return costs


class _AsapRun:
    """The as-soon-as-possible pass over a table in progress: per stage, the start and end
    of its entries so far, its busy time, when it is free and its next entry
    (``pointer``); per event, when it was produced (-1: not yet) and the stages waiting for
    it (``waiting``, and ``blocked_on`` the other way round)."""

    def __init__(self, schedule: Schedule, duration: Callable[[Action], float]):
        self.actions = schedule.actions
        self.events = _events_function(schedule)
        self.duration = duration
        self.num_model_chunks = schedule.num_model_chunks
        actions = self.actions
        pp = len(actions)
        self.start = [[0.0] * len(a) for a in actions]
        self.end = [[0.0] * len(a) for a in actions]
        self.busy = [0.0] * pp
        self.free = [0.0] * pp
        self.pointer = [0] * pp
        self.done = [-1.0] * (3 * schedule.num_microbatches * self.num_model_chunks)   # -1: not yet
        self.waiting: dict[int, list[int]] = {}
        self.blocked_on: dict[int, int] = {}

    def advance(self, s: int) -> list[int]:
        """Run stage ``s`` until its table ends or its next action waits for an event not
        yet produced; returns the stages the events it produced woke up, in order."""
        start, end, free, pointer, done = self.start, self.end, self.free, self.pointer, self.done
        woken: list[int] = []
        stage_actions = self.actions[s]
        while pointer[s] < len(stage_actions):
            i = pointer[s]
            a = stage_actions[i]
            if a is None or not a.is_compute:
                start[s][i] = end[s][i] = free[s]
                pointer[s] += 1
                continue
            needs, gives = self.events(a)
            t0 = free[s]
            missing = None
            for e in needs:
                t = done[e]
                if t < 0:
                    missing = e
                    break
                t0 = max(t0, t)
            if missing is not None:
                self.waiting.setdefault(missing, []).append(s)
                self.blocked_on[s] = missing
                break
            t1 = t0 + self.duration(a)
            start[s][i] = t0
            end[s][i] = t1
            self.busy[s] += t1 - t0
            free[s] = t1
            pointer[s] += 1
            for e in gives:
                if done[e] >= 0:
                    raise ScheduleError(s, a, f"{_describe(e, self.num_model_chunks)} is computed twice")
                done[e] = t1
                if e in self.waiting:
                    woken.extend(self.waiting.pop(e))
        return woken

    def check_finished(self) -> None:
        """Raise the deadlock error if some stage did not reach the end of its table."""
        actions, pointer = self.actions, self.pointer
        stuck = [s for s in range(len(actions)) if pointer[s] < len(actions[s])]
        if stuck:
            detail = "; ".join(f"stage {s} at {actions[s][pointer[s]]} waits for "
                               f"{_describe(self.blocked_on[s], self.num_model_chunks)}" for s in stuck)
            first = stuck[0]
            raise ScheduleError(first, actions[first][pointer[first]], f"deadlock: {detail}")


def peak_in_flight(schedule: Schedule) -> list[int]:
    """Per stage, the most (micro-batch, chunk) activation sets held at once.

    A set is held from its forward (``F``, or the forward half of ``FB``) until the action
    that completes its weight gradient (``BW``, the backward half of ``FB``, or ``W``): the
    weight-gradient pass still reads the saved layer inputs, so a ``B`` alone does not
    free the stage's activations (the zero-bubble paper counts ``W``'s memory as smaller
    than ``B``'s; counting a whole set is the upper bound).  Counted in program order,
    so it does not depend on timing.  The unit is one chunk's activations for one
    micro-batch: for interleaved 1F1B with ``vpp`` chunks that is ``1/vpp`` of a
    non-interleaved stage's.
    """
    peaks = []
    for stage_actions in schedule.actions:
        held = peak = 0
        for a in stage_actions:
            if a is None:
                continue
            for half in a.halves():
                if half.kind is _F:
                    held += 1
                    peak = max(peak, held)
                elif half.kind in (_BW, _W):
                    held -= 1
        peaks.append(peak)
    return peaks
