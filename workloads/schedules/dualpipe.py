"""DualPipe, DeepSeek-V3's bidirectional schedule (DeepSeek-AI 2024, arXiv 2412.19437, §3.2.1,
Fig. 5 and Table 2; reference implementation deepseek-ai/DualPipe ``dualpipe/dualpipe.py``).

Placement: ``pp`` (even) ranks, the model cut into ``pp`` chunks; rank ``s`` holds chunk
``s`` as its local chunk 0 and chunk ``pp-1-s`` as local chunk 1, so each rank stores two
model chunks and every chunk lives on two ranks ("2x parameters").  Half of the ``m``
micro-batches (``0 .. m/2-1``) enter at rank 0 and flow on local chunk 0 towards rank
``pp-1`` ("forward direction"); the other half (``m/2 .. m-1``) enter at rank ``pp-1`` and flow
on local chunk 1 towards rank 0 ("reverse direction").  Both halves pass through model chunks
``0 .. pp-1`` in order, so they compute the same function.

Per rank, with ``h = pp/2``, ``r = min(s, pp-1-s)`` (distance from the nearer end), the
*near* chunk being the one whose micro-batches enter at the nearer end and ``M = m/2``, the
order is eight phases:

1. ``2(h-r-1)`` forwards on the near chunk;
2. ``r+1`` times: forward near, forward far;
3. ``h-r-1`` times: split backward ``B`` far, its ``W``, forward far;
4. ``M-pp+r+1`` times: ``FB`` (forward near & full backward far), ``FB`` (forward far &
   full backward near); on the two middle ranks the very first pair runs as a plain ``F``
   then ``BW``, not overlapped (DualPipe: "we don't overlap these two chunks to further
   reduce bubble size");
5. ``h-r-1`` times: full backward far, ``FB`` (forward far & full backward near);
6. ``r+1`` times: backward far, backward near; the later half of these ``2(r+1)`` backwards
   are split (``B`` now, ``W`` queued), the earlier half are full ``BW``;
7. ``h-r-1`` times: a queued ``W``, split backward near;
8. the ``r+1`` remaining queued ``W`` passes (first in, first out).

``FB`` pairs hold the full backward (DualPipe runs them without weight-gradient deferral),
and their cost is DeepSeek's ``F&B``.

Table 2 gives the bubble as ``(PP/2-1)(F&B + B - 3W)`` (``B`` the full backward) and the
activations as ``PP+1`` chunk-micro-batches per rank.  Under :mod:`.timing`'s model (free
communication, as-soon-as-possible on this order) the worst rank's idle time equals that
expression exactly when the input-gradient backward costs the same as the forward
(``B_input = F``, so ``B = F + W``), ``W <= F`` and ``B <= F&B <= F + B`` (checked for pp
2-10 and several m; the README figure, F = B_input = W = 1 cell and F&B = 3 cells, is
such a case).  Outside that region the expression is an idealisation and the longest path
differs (e.g. pp=4, F=1, B_input=2, W=1, F&B=3.5: 2.5 instead of 3.5).  The peak of
activations held is ``PP+1`` on every rank (:func:`.timing.peak_in_flight`).
"""

from __future__ import annotations

from collections import deque

from .actions import COMM_KINDS, Action, ActionKind, Schedule
from .config import validate_schedule_config

__all__ = ["dualpipe", "rank_order"]


def rank_order(s: int, pp: int, half: int) -> list[Action]:
    """Rank ``s``'s compute actions and p2p transfers in the order the reference
    implementation issues them (deepseek-ai/DualPipe ``DualPipe.step``): transfers are
    queued (``SEND_*`` / ``RECV_*`` actions) and every compute chunk -- weight passes
    included -- first posts and waits for the queue, so the transfers between two compute
    actions are one batch (see :mod:`.comm`).  Transfers without a peer are kept here;
    :func:`.comm.p2p_order` drops them."""
    h = pp // 2
    r = min(s, pp - 1 - s)
    middle = r == h - 1
    near = 0 if s < h else 1        # chunk 0 is fed from stage 0, chunk 1 from stage pp-1
    far = 1 - near
    count = {kind: [0, 0] for kind in ("F", "B", "rF", "sF", "rB", "sB")}  # per chunk, in arrival order
    queued_w: deque[tuple[int, int]] = deque()
    out: list[Action] = []

    def mb(chunk: int, j: int) -> int:
        return j if chunk == 0 else half + j

    def take(kind: str, c: int) -> int:
        count[kind][c] += 1
        return mb(c, count[kind][c] - 1)

    def recv_f(c: int) -> None:
        out.append(Action(s, c, ActionKind.RECV_F, take("rF", c)))

    def send_f(c: int) -> None:
        out.append(Action(s, c, ActionKind.SEND_F, take("sF", c)))

    def recv_b(c: int) -> None:
        out.append(Action(s, c, ActionKind.RECV_B, take("rB", c)))

    def send_b(c: int) -> None:
        out.append(Action(s, c, ActionKind.SEND_B, take("sB", c)))

    def f(c: int) -> Action:
        return Action(s, c, ActionKind.F, take("F", c))

    def b(c: int, split: bool) -> Action:
        a = Action(s, c, ActionKind.B if split else ActionKind.BW, take("B", c))
        if split:
            queued_w.append((c, a.microbatch))
        return a

    def forward(c: int, recv: bool = True, send: bool = True) -> None:
        if recv:
            recv_f(c)
        out.append(f(c))
        if send:
            send_f(c)

    def backward(c: int, split: bool = False, recv: bool = True, send: bool = True) -> None:
        if recv:
            recv_b(c)
        out.append(b(c, split))
        if send:
            send_b(c)

    def forward_backward(c_f: int, c_b: int, recv_f_input: bool = True) -> None:
        if recv_f_input:
            recv_f(c_f)
        recv_b(c_b)
        out.append(Action.pair(f(c_f), b(c_b, False)))
        send_f(c_f)
        send_b(c_b)

    def weight() -> None:
        c, i = queued_w.popleft()
        out.append(Action(s, c, ActionKind.W, i))

    for _ in range(2 * (h - r - 1)):                                              # 1
        forward(near)
    recv_f(near)                                                                  # 2
    for i in range(r + 1):
        forward(near, recv=False, send=middle)
        recv_f(near)                       # the next near forward's input, one chunk early
        forward(far, send=not middle or i < r)
        if not middle:
            send_f(near)
    for _ in range(h - r - 1):                                                    # 3
        backward(far, split=True)
        recv_f(far)
        weight()
        forward(far, recv=False)
    for i in range(half - pp + r + 1):                                            # 4
        if i == 0 and middle:
            # DualPipe does not overlap the middle ranks' first pair ("to further reduce
            # bubble size"); the far forward held back in phase 2 goes out here
            forward(near, recv=False, send=False)
            send_f(far)
            backward(far, send=False)
            send_f(near)
            send_b(far)
        else:
            forward_backward(near, far, recv_f_input=i > 0)
        forward_backward(far, near)
    for _ in range(h - r - 1):                                                    # 5
        backward(far)
        forward_backward(far, near)
    for i in range(r + 1):                                                        # 6
        backward(far, split=2 * i >= r + 1)
        backward(near, split=2 * i + 1 >= r + 1)
    for _ in range(h - r - 1):                                                    # 7
        weight()
        backward(near, split=True)
    while queued_w:                                                               # 8
        weight()
    # the last sends are posted by the final commit
    # (the order of the compute actions alone is DualPipe's table, checked against Fig. 5)
    return out


def _rank_actions(s: int, pp: int, half: int) -> list[Action]:
    return [a for a in rank_order(s, pp, half) if a.kind not in COMM_KINDS]


def dualpipe(pp: int, num_microbatches: int, vpp: int = 1) -> Schedule:
    """DualPipe schedule: bidirectional, two chunks per rank, overlapped ``FB`` pairs.

    Parameters
    ----------
    pp : int
        Pipeline ranks; even.
    num_microbatches : int
        Micro-batches per step; even and >= ``2*pp``.  Micro-batches ``0 .. m/2-1`` enter at
        stage 0 (local chunk 0), ``m/2 .. m-1`` at stage ``pp-1`` (local chunk 1).
    vpp : int
        Must be 1: the two chunks per rank are DualPipe's own placement, not virtual stages.

    Returns
    -------
    Schedule
        ``num_chunks = 2``, ``layout = "bidirectional"``.
    """
    validate_schedule_config("dualpipe", pp, num_microbatches, vpp)
    half = num_microbatches // 2
    actions = [_rank_actions(s, pp, half) for s in range(pp)]
    return Schedule("dualpipe", pp, num_microbatches, vpp, actions, num_chunks=2, layout="bidirectional")
