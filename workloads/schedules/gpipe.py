"""GPipe: every forward, then every backward (Huang et al. 2019, arXiv 1811.06965).

Each stage runs ``F`` for micro-batches ``0 .. m-1`` and then the full backward ``BW`` in
reverse order, ``m-1 .. 0`` (last in, first out, the order PyTorch pipelining's
breadth-first schedule ``ScheduleLoopedBFS`` uses; the order does not change the timing).  All ``m``
micro-batches' activations are held at the turn; bubble ``(p-1)/(m+p-1)`` of the step.
"""

from __future__ import annotations

from .actions import Action, ActionKind, Schedule
from .config import validate_schedule_config

__all__ = ["gpipe"]


def gpipe(pp: int, num_microbatches: int, vpp: int = 1) -> Schedule:
    """GPipe schedule: all forwards, then all full backwards in reverse micro-batch order.

    Parameters
    ----------
    pp : int
        Pipeline stages.
    num_microbatches : int
        Micro-batches per step (>= 1).
    vpp : int
        Must be 1.

    Returns
    -------
    Schedule
    """
    validate_schedule_config("gpipe", pp, num_microbatches, vpp)
    m = num_microbatches
    actions = [[Action(s, 0, ActionKind.F, i) for i in range(m)]
               + [Action(s, 0, ActionKind.BW, i) for i in reversed(range(m))] for s in range(pp)]
    return Schedule("gpipe", pp, m, vpp, actions)
