"""Schedule actions, the `Schedule` table and its text forms.

A pipeline schedule is data: for every pipeline stage (pp rank) the ordered list of compute
actions that rank runs in one training step.  The simulator executes the table; nothing
about the order lives in control flow.

Action kinds (the ``clustersim schedule`` table's letters).  PyTorch pipelining spells the full backward ``B``
and the input-gradient backward ``I``; clustersim follows the zero-bubble paper and
DualPipe, where ``B`` is the input-gradient part:

``F``
    forward of one micro-batch through one model chunk.
``B``
    backward for the input gradient only (zero-bubble split); a later ``W`` completes it.
``W``
    backward for the weight gradient of a micro-batch whose ``B`` already ran.
``BW``
    full backward (``B`` and ``W`` fused), as 1F1B and GPipe run it.
``FB``
    DualPipe's overlapped pair: the forward of one (micro-batch, chunk) and the full
    backward (``BW``) of another micro-batch, run together as one unit.
``SEND_F``, ``RECV_F``, ``SEND_B``, ``RECV_B``
    explicit point-to-point actions.  The generators here do not emit them (the program
    builder derives p2p from the dependencies); they exist so that tables with
    communication can be written and parsed.  Validation and timing skip them
    (communication is free there).

Text form, as in PyTorch pipelining: ``"{stage}{kind}{microbatch}"``, with ``"@c{chunk}"``
appended for schedules with more than one chunk per stage, e.g. ``1F0@c1``.  An ``FB`` pair
is written as its two halves joined by ``&`` (DeepSeek-V3's "F&B" notation), the stage
written once: ``3F1@c0&BW6@c1`` is stage 3 running the forward of micro-batch 1 on
chunk 0 overlapped with the full backward of micro-batch 6 on chunk 1.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

__all__ = [
    "COMM_KINDS",
    "COMPUTE_KINDS",
    "Action",
    "ActionKind",
    "Schedule",
    "ScheduleError",
    "LAYOUTS",
    "format_action",
    "model_chunk",
    "parse_action",
    "route",
    "route_position",
]


class ScheduleError(ValueError):
    """A schedule table breaks a rule: names the stage, the action and the rule."""

    def __init__(self, stage: int | None, action: Action | str | None, rule: str):
        self.stage = stage
        self.action = action
        self.rule = rule
        where = [] if stage is None else [f"stage {stage}"]
        if action is not None:
            where.append(f"action {action}")
        super().__init__(f"{', '.join(where)}: {rule}" if where else rule)


class ActionKind(StrEnum):
    """What one schedule action computes or communicates."""

    F = "F"             #: forward
    B = "B"             #: input-gradient backward (zero-bubble "B")
    W = "W"             #: weight-gradient backward (zero-bubble "W")
    BW = "BW"           #: full backward, B and W fused
    FB = "FB"           #: DualPipe overlapped pair: F of one (mb, chunk) + BW of another
    SEND_F = "SEND_F"   #: send activations to the next stage
    RECV_F = "RECV_F"   #: receive activations from the previous stage
    SEND_B = "SEND_B"   #: send input gradients to the previous stage
    RECV_B = "RECV_B"   #: receive gradients from the next stage


COMPUTE_KINDS = frozenset({ActionKind.F, ActionKind.B, ActionKind.W, ActionKind.BW, ActionKind.FB})
COMM_KINDS = frozenset({ActionKind.SEND_F, ActionKind.RECV_F, ActionKind.SEND_B, ActionKind.RECV_B})


LAYOUTS = ("interleaved", "bidirectional", "v")
"""Chunk placements a :class:`Schedule` can have (see :func:`model_chunk`)."""


class Action(NamedTuple):
    """One entry of a schedule table.

    ``chunk`` is the *local* chunk index on the stage (0 .. chunks per stage - 1); which
    model chunk (layer range) it holds is given by :func:`model_chunk`.  For ``FB`` the
    first four fields describe the forward half and ``b_chunk`` / ``b_microbatch`` the
    backward (``BW``) half; they are ``None`` for every other kind.
    """

    stage: int
    chunk: int
    kind: ActionKind
    microbatch: int
    b_chunk: int | None = None
    b_microbatch: int | None = None

    def __str__(self) -> str:
        # Lossless without context: "@c" appears only for chunks other than 0.
        return format_action(self)

    @property
    def is_compute(self) -> bool:
        """True for F, B, W, BW and FB."""
        return self.kind in COMPUTE_KINDS

    def halves(self) -> tuple[Action, ...]:
        """``(F, BW)`` for an ``FB`` pair, ``(self,)`` for every other action."""
        if self.kind is ActionKind.FB:
            return (Action(self.stage, self.chunk, ActionKind.F, self.microbatch),
                    Action(self.stage, self.b_chunk, ActionKind.BW, self.b_microbatch))
        return (self,)

    @classmethod
    def pair(cls, forward: Action, backward: Action) -> Action:
        """Build an ``FB`` action from a forward and a full backward on the same stage."""
        if forward.kind is not ActionKind.F or backward.kind is not ActionKind.BW:
            raise ValueError(f"an FB pair is an F and a BW, got {forward} and {backward}")
        if forward.stage != backward.stage:
            raise ValueError(f"an FB pair runs on one stage, got {forward} and {backward}")
        return cls(forward.stage, forward.chunk, ActionKind.FB, forward.microbatch,
                   backward.chunk, backward.microbatch)


def format_action(action: Action, show_chunk: bool | None = None) -> str:
    """Text form of an action, e.g. ``"2F0"``, ``"1F0@c1"``, ``"3F1@c0&BW6@c1"``.

    Parameters
    ----------
    action : Action
    show_chunk : bool or None
        Append ``@c{chunk}`` always (True), never (False), or only when the chunk is not
        0 (None, the default: lossless for a lone action).
    """
    def half(kind: str, mb: int, chunk: int) -> str:
        if show_chunk or (show_chunk is None and chunk != 0):
            return f"{kind}{mb}@c{chunk}"
        return f"{kind}{mb}"

    if action.kind is ActionKind.FB:
        return (f"{action.stage}{half('F', action.microbatch, action.chunk)}"
                f"&{half('BW', action.b_microbatch, action.b_chunk)}")
    return f"{action.stage}{half(action.kind.value, action.microbatch, action.chunk)}"


# Longest kinds first so that "BW" is not read as "B" followed by garbage.
_KIND_RE = "|".join(sorted((k.value for k in ActionKind if k is not ActionKind.FB), key=len, reverse=True))
_ACTION_RE = re.compile(rf"(\d+)({_KIND_RE})(\d+)(?:@c(\d+))?")
_HALF_RE = re.compile(rf"({_KIND_RE})(\d+)(?:@c(\d+))?")


def parse_action(text: str) -> Action:
    """Inverse of :func:`format_action`: ``"1F0@c1"`` -> ``Action(1, 1, F, 0)``.

    A missing ``@c`` suffix means chunk 0.  Raises ``ValueError`` on anything else.
    """
    text = text.strip()
    if "&" in text:
        left, _, right = text.partition("&")
        forward = parse_action(left)
        match = _HALF_RE.fullmatch(right)
        if forward.kind is not ActionKind.F or match is None or match.group(1) != "BW":
            raise ValueError(f"invalid FB action {text!r}: expected e.g. '3F1@c0&BW6@c1'")
        backward = Action(forward.stage, int(match.group(3) or 0), ActionKind.BW, int(match.group(2)))
        return Action.pair(forward, backward)
    match = _ACTION_RE.fullmatch(text)
    if match is None:
        raise ValueError(f"invalid action {text!r}: expected '{{stage}}{{kind}}{{microbatch}}[@c{{chunk}}]', "
                         "e.g. '2F0' or '1F0@c1'")
    stage, kind, mb, chunk = match.groups()
    return Action(int(stage), int(chunk or 0), ActionKind(kind), int(mb))


@dataclass(frozen=True, slots=True)
class Schedule:
    """A pipeline schedule: per-stage ordered action lists plus what produced them.

    ``actions[s]`` is what pipeline stage (pp rank) ``s`` runs, in order.  Entries may be
    ``None`` (an explicit idle slot, as in PyTorch's tables); every consumer skips them.
    The table says only *order*; times come from :func:`~.timing.schedule_timing` or the
    simulator.
    """

    name: str
    """Registry key of the generator (``"1f1b"``, ...), or a free name for hand-made tables."""
    pp: int
    """Pipeline-parallel degree: number of stages (ranks)."""
    num_microbatches: int
    """Micro-batches per step."""
    vpp: int
    """Virtual pipeline degree as configured (model chunks per stage for interleaved 1F1B)."""
    actions: list[list[Action | None]]
    """``actions[stage]``: that stage's ordered actions."""
    num_chunks: int = 1
    """Chunks held per stage: ``vpp`` for interleaved, 2 for DualPipe, else 1."""
    layout: str = "interleaved"
    """Where model chunks live, see :func:`model_chunk`: ``"interleaved"`` (stage s, chunk c
    holds model chunk ``c*pp + s``; with one chunk per stage this is plain 1F1B placement)
    , ``"bidirectional"`` (DualPipe: stage s holds chunks s and ``pp-1-s``) or ``"v"``
    (ZB-V: stage s holds model chunks s and ``2*pp-1-s``)."""

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"Schedule.layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if self.layout in ("bidirectional", "v") and self.num_chunks != 2:
            raise ValueError(f"a {self.layout} schedule holds 2 chunks per stage, got num_chunks={self.num_chunks}")

    def __len__(self) -> int:
        return len(self.actions)

    def __getitem__(self, stage: int) -> list[Action | None]:
        return self.actions[stage]

    def __iter__(self) -> Iterator[list[Action | None]]:
        return iter(self.actions)

    @property
    def num_model_chunks(self) -> int:
        """Number of distinct model chunks (layer ranges) a micro-batch passes through."""
        return self.pp if self.layout == "bidirectional" else self.pp * self.num_chunks


def model_chunk(schedule: Schedule, stage: int, chunk: int) -> int:
    """Model chunk (layer range, 0 = nearest the embedding) held by ``(stage, chunk)``.

    * ``interleaved`` layout (GPipe, 1F1B, ZB-H1, interleaved 1F1B): ``chunk * pp + stage``,
      Megatron-Core's virtual-pipeline placement (chunk c of rank s holds layers of
      virtual stage ``c*pp + s``).
    * ``bidirectional`` layout (DualPipe): chunk 0 holds model chunk ``stage`` and chunk 1
      holds ``pp - 1 - stage``, so each rank keeps two parameter copies' worth of layers
      and every model chunk is stored on two ranks (DeepSeek-V3 report §3.2.1;
      deepseek-ai/DualPipe ``examples/example_dualpipe.py``).
    * ``v`` layout (ZB-V): the model is cut into ``2*pp`` chunks; chunk 0 of stage s holds
      model chunk ``s`` and chunk 1 holds ``2*pp - 1 - s``, so a micro-batch runs down the
      stages and back up, and stage 0 holds both the embedding and the loss (Qi et al.,
      "Zero Bubble Pipeline Parallelism", §6; PyTorch pipelining's
      ``generate_stage_to_rank_mapping(style="v")``).
    """
    if schedule.layout == "bidirectional":
        return stage if chunk == 0 else schedule.pp - 1 - stage
    if schedule.layout == "v":
        return stage if chunk == 0 else 2 * schedule.pp - 1 - stage
    return chunk * schedule.pp + stage


def route(schedule: Schedule, microbatch: int) -> tuple[tuple[int, int], ...]:
    """The ``(stage, chunk)`` places micro-batch ``microbatch`` visits, in forward order.

    Position ``k`` of the route holds model chunk ``k``.  In the bidirectional layout the
    first half of the micro-batches enters at stage 0 on chunk 0 and the second half at
    stage ``pp-1`` on chunk 1 (DualPipe feeds micro-batches from both ends).
    """
    pp = schedule.pp
    if schedule.layout == "bidirectional":
        if microbatch < schedule.num_microbatches // 2:
            return tuple((k, 0) for k in range(pp))
        return tuple((pp - 1 - k, 1) for k in range(pp))
    if schedule.layout == "v":
        return tuple((k, 0) for k in range(pp)) + tuple((pp - 1 - k, 1) for k in range(pp))
    return tuple((k % pp, k // pp) for k in range(pp * schedule.num_chunks))


def route_position(schedule: Schedule) -> Callable[[int, int, int], int | None]:
    """A fast ``(stage, chunk, microbatch) -> k`` for this schedule's layout.

    ``k`` is the position of ``(stage, chunk)`` on the micro-batch's :func:`route` (its model
    chunk), or None when the micro-batch does not pass there: the same answer as
    ``route(schedule, microbatch).index((stage, chunk))`` without building the route.
    """
    pp, m, num_chunks = schedule.pp, schedule.num_microbatches, schedule.num_chunks
    if schedule.layout == "bidirectional":
        half = m // 2

        def position(stage: int, chunk: int, microbatch: int) -> int | None:
            if not (0 <= stage < pp and 0 <= microbatch < m):
                return None
            direction = 0 if microbatch < half else 1
            if chunk != direction:
                return None
            return stage if direction == 0 else pp - 1 - stage
    elif schedule.layout == "v":
        def position(stage: int, chunk: int, microbatch: int) -> int | None:
            if not (0 <= stage < pp and 0 <= chunk < 2 and 0 <= microbatch < m):
                return None
            return stage if chunk == 0 else 2 * pp - 1 - stage
    else:
        def position(stage: int, chunk: int, microbatch: int) -> int | None:
            if not (0 <= stage < pp and 0 <= chunk < num_chunks and 0 <= microbatch < m):
                return None
            return chunk * pp + stage
    return position
