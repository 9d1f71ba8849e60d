"""ZB-H1, the memory-efficient handcrafted zero-bubble schedule (Qi et al. 2023,
"Zero Bubble Pipeline Parallelism", arXiv 2401.10241, §2.1 and Fig. 3 top).

The backward is split into ``B`` (input gradient, on the critical path between stages) and
``W`` (weight gradient, free to move).  ZB-H1 keeps 1F1B's shape and memory bound:

* stage ``s`` runs the 1F1B warm-up of ``min(pp - s - 1, m)`` forwards, then alternates
  ``F`` and ``B``;
* the ``W`` passes of stage ``s`` lag ``s`` micro-batches behind (after the ``j``-th ``B``,
  the oldest pending ``W`` runs only if ``j >= s``); the ``s`` postponed ``W`` passes run
  at the end, filling the cool-down bubble.  Every stage then keeps ``pp`` micro-batches in
  flight at its peak, the amount 1F1B keeps on stage 0, so peak memory does not grow (the
  paper: "the first worker ... does not exceed the peak memory of 1F1B").

The same per-rank order is what PyTorch pipelining's ``ScheduleInterleavedZeroBubble``
builds with one stage per rank (``_get_1f1b_rank_ops`` with ``enable_zero_bubble``, where
the first ``rank`` steady steps run without ``W``).

Bubble, in the paper's notation (``T_B`` = input-gradient backward only):
``(p-1)(T_F + T_B - T_W)``, a third of 1F1B's ``(p-1)(T_F + T_B + T_W)`` when the three
are equal.  In DeepSeek-V3's Table 2 notation, where ``B`` is the full backward, the same
number reads ``(PP-1)(F + B - 2W)`` ("ZB1P").  Under :mod:`.timing`'s model the worst
stage's idle time equals it exactly for ``m >= pp`` and ``T_W <= min(T_F, T_B)`` (a ``W``
can only fill a gap as long as the pass it replaces); with ``m < pp`` the bubble is larger,
which is why :func:`.config.min_microbatches` asks for ``m >= pp``.
"""

from __future__ import annotations

from collections import deque

from .actions import Action, ActionKind, Schedule
from .config import validate_schedule_config

__all__ = ["zb_h1"]


def zb_h1(pp: int, num_microbatches: int, vpp: int = 1) -> Schedule:
    """ZB-H1 schedule with split backwards (``B`` then ``W``).

    Parameters
    ----------
    pp : int
        Pipeline stages.
    num_microbatches : int
        Micro-batches per step (>= pp).
    vpp : int
        Must be 1.

    Returns
    -------
    Schedule
    """
    validate_schedule_config("zb_h1", pp, num_microbatches, vpp)
    m = num_microbatches
    actions = []
    for s in range(pp):
        warmup = min(pp - s - 1, m)
        order = [Action(s, 0, ActionKind.F, i) for i in range(warmup)]
        pending_w: deque[int] = deque()
        for j in range(m):                         # j-th backward, micro-batch j
            if warmup + j < m:
                order.append(Action(s, 0, ActionKind.F, warmup + j))
            order.append(Action(s, 0, ActionKind.B, j))
            pending_w.append(j)
            if j >= s:                             # W lags s micro-batches behind on stage s
                order.append(Action(s, 0, ActionKind.W, pending_w.popleft()))
        order += [Action(s, 0, ActionKind.W, i) for i in pending_w]
        actions.append(order)
    return Schedule("zb_h1", pp, m, vpp, actions)
