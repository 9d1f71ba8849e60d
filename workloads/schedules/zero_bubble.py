"""Zero-bubble schedules (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", arXiv
2401.10241): ZB-H1 (§2.1, Fig. 3 top) and ZB-V (§6).

ZB-H1, the memory-efficient handcrafted schedule.

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

ZB-V cuts the model into ``2*pp`` chunks placed in a V (stage ``s`` holds model chunks ``s``
and ``2*pp-1-s``, see :func:`.actions.model_chunk`): a micro-batch goes down the stages on
chunk 0 and comes back up on chunk 1, so stage 0 computes the loss and the first backward
starts as soon as the last forward ends, without a hop back.  Per stage ``s`` the order is
five phases (``n = max(m, 2*pp - 1)`` micro-batches, then every action of a micro-batch
``>= m`` is dropped; PyTorch pipelining's ``ScheduleZBVZeroBubble``, whose tables
``tests/workloads/golden/pytorch_zero_bubble_orders.json`` holds as the oracle):

1. ``2(pp-s) - 1`` forwards on chunk 0;
2. ``s`` times: forward chunk 1, forward chunk 0;
3. ``pp-s`` times: forward chunk 1, then its ``B`` and ``W`` at once;
4. steady pairs until every forward ran: (forward chunk 0 while any remain), ``B``, ``W``
   on chunk 0; forward, ``B``, ``W`` on chunk 1;
5. cool-down: ``s`` times ``B`` chunk 0, ``B`` chunk 1 (their ``W`` deferred); ``pp-s``
   times ``B`` chunk 0 and the oldest deferred chunk-0 ``W``; then the deferred ``W``
   passes, chunk 1's before chunk 0's.

With the per-chunk costs equal (``T_F = T_B = T_W``) and ``m >= 2*pp - 1`` the stages never
idle between their first and last action (the paper's "zero bubble"), and each keeps at
most ``2*pp`` chunk activations, each half a 1F1B stage's, so the peak equals 1F1B's
``pp`` stage activations.  Unequal costs leave a bubble; :mod:`.timing` computes it.
"""

from __future__ import annotations

from collections import deque

from .actions import Action, ActionKind, Schedule
from .config import validate_schedule_config

__all__ = ["zb_h1", "zb_v"]


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


def zb_v(pp: int, num_microbatches: int, vpp: int = 2) -> Schedule:
    """ZB-V schedule: two chunks per stage in a V, split backwards (``B`` then ``W``).

    Parameters
    ----------
    pp : int
        Pipeline stages.
    num_microbatches : int
        Micro-batches per step (>= pp).
    vpp : int
        Model chunks per stage; must be 2 (the V).

    Returns
    -------
    Schedule
        ``num_chunks = 2``, ``layout = "v"``.
    """
    validate_schedule_config("zb_v", pp, num_microbatches, vpp)
    actions = [[a for a in _zb_v_stage(s, pp, max(num_microbatches, 2 * pp - 1))
                if a.microbatch < num_microbatches] for s in range(pp)]
    return Schedule("zb_v", pp, num_microbatches, vpp, actions, num_chunks=2, layout="v")


def _zb_v_stage(s: int, pp: int, n: int) -> list[Action]:
    """Stage ``s``'s ZB-V order for ``n`` micro-batches (see the module docstring)."""
    order: list[Action] = []
    issued = {(c, k): 0 for c in (0, 1) for k in (ActionKind.F, ActionKind.B, ActionKind.W)}

    def run(chunk: int, kind: ActionKind, microbatch: int | None = None) -> None:
        mb = issued[chunk, kind] if microbatch is None else microbatch
        order.append(Action(s, chunk, kind, mb))
        issued[chunk, kind] += 1

    def f_b_w(chunk: int, forward: bool = True) -> None:
        if forward:
            run(chunk, ActionKind.F)
        run(chunk, ActionKind.B)
        run(chunk, ActionKind.W)

    for _ in range(2 * (pp - s) - 1):
        run(0, ActionKind.F)
    for _ in range(s):
        run(1, ActionKind.F)
        run(0, ActionKind.F)
    for _ in range(pp - s):
        f_b_w(1)
    while issued[1, ActionKind.F] < issued[0, ActionKind.F] or issued[0, ActionKind.F] < n:
        f_b_w(0, forward=issued[0, ActionKind.F] < n)
        f_b_w(1)
    for _ in range(s):
        run(0, ActionKind.B)
        run(1, ActionKind.B)
    for _ in range(pp - s):
        run(0, ActionKind.B)
        run(0, ActionKind.W)
    for chunk in (1, 0):
        while issued[chunk, ActionKind.W] < issued[chunk, ActionKind.B]:
            run(chunk, ActionKind.W)
    return order
