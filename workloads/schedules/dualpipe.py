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


class _Issuer:
    """One rank's actions as DualPipe issues them: transfers queued as ``SEND_*`` /
    ``RECV_*`` actions before the compute chunk that posts them, micro-batches numbered per
    chunk and per kind in arrival order, and the split backwards whose ``W`` waits in
    ``queued_w`` (first in, first out)."""

    def __init__(self, s: int, half: int):
        self.s = s
        self.half = half
        self.count = {kind: [0, 0] for kind in ("F", "B", "rF", "sF", "rB", "sB")}  # per chunk, in arrival order
        self.queued_w: deque[tuple[int, int]] = deque()
        self.out: list[Action] = []

    def _take(self, kind: str, c: int) -> int:
        """The next micro-batch of ``kind`` on chunk ``c`` (chunk 1 numbers from ``half``)."""
        self.count[kind][c] += 1
        j = self.count[kind][c] - 1
        return j if c == 0 else self.half + j

    def recv_f(self, c: int) -> None:
        self.out.append(Action(self.s, c, ActionKind.RECV_F, self._take("rF", c)))

    def send_f(self, c: int) -> None:
        self.out.append(Action(self.s, c, ActionKind.SEND_F, self._take("sF", c)))

    def recv_b(self, c: int) -> None:
        self.out.append(Action(self.s, c, ActionKind.RECV_B, self._take("rB", c)))

    def send_b(self, c: int) -> None:
        self.out.append(Action(self.s, c, ActionKind.SEND_B, self._take("sB", c)))

    def _f(self, c: int) -> Action:
        return Action(self.s, c, ActionKind.F, self._take("F", c))

    def _b(self, c: int, split: bool) -> Action:
        a = Action(self.s, c, ActionKind.B if split else ActionKind.BW, self._take("B", c))
        if split:
            self.queued_w.append((c, a.microbatch))
        return a

    def forward(self, c: int, recv: bool = True, send: bool = True) -> None:
        if recv:
            self.recv_f(c)
        self.out.append(self._f(c))
        if send:
            self.send_f(c)

    def backward(self, c: int, split: bool = False, recv: bool = True, send: bool = True) -> None:
        """A full backward ``BW``, or with ``split`` its ``B`` (the ``W`` queued)."""
        if recv:
            self.recv_b(c)
        self.out.append(self._b(c, split))
        if send:
            self.send_b(c)

    def forward_backward(self, c_f: int, c_b: int, recv_f_input: bool = True) -> None:
        """An overlapped ``FB`` pair: forward on ``c_f``, full backward on ``c_b``."""
        if recv_f_input:
            self.recv_f(c_f)
        self.recv_b(c_b)
        self.out.append(Action.pair(self._f(c_f), self._b(c_b, False)))
        self.send_f(c_f)
        self.send_b(c_b)

    def weight(self) -> None:
        """The oldest queued ``W``."""
        c, i = self.queued_w.popleft()
        self.out.append(Action(self.s, c, ActionKind.W, i))


def rank_order(s: int, pp: int, half: int) -> list[Action]:
    """Rank ``s``'s compute actions and p2p transfers in the order the reference
    implementation issues them (deepseek-ai/DualPipe ``DualPipe.step``): transfers are
    queued (``SEND_*`` / ``RECV_*`` actions) and every compute chunk -- weight passes
    included -- first posts and waits for the queue, so the transfers between two compute
    actions are one batch (see :mod:`.comm`).  Transfers without a peer are kept here;
    :func:`.comm.p2p_order` drops them.  The numbered phases are the module docstring's."""
    h = pp // 2
    r = min(s, pp - 1 - s)
    middle = r == h - 1
    near = 0 if s < h else 1        # chunk 0 is fed from stage 0, chunk 1 from stage pp-1
    far = 1 - near
    q = _Issuer(s, half)
    for _ in range(2 * (h - r - 1)):                                              # 1
        q.forward(near)
    q.recv_f(near)                                                                # 2
    for i in range(r + 1):
        q.forward(near, recv=False, send=middle)
        q.recv_f(near)                     # the next near forward's input, one chunk early
        q.forward(far, send=not middle or i < r)
        if not middle:
            q.send_f(near)
    for _ in range(h - r - 1):                                                    # 3
        q.backward(far, split=True)
        q.recv_f(far)
        q.weight()
        q.forward(far, recv=False)
    for i in range(half - pp + r + 1):                                            # 4
        if i == 0 and middle:
            # DualPipe does not overlap the middle ranks' first pair ("to further reduce
            # bubble size"); the far forward held back in phase 2 goes out here
            q.forward(near, recv=False, send=False)
            q.send_f(far)
            q.backward(far, send=False)
            q.send_f(near)
            q.send_b(far)
        else:
            q.forward_backward(near, far, recv_f_input=i > 0)
        q.forward_backward(far, near)
    for _ in range(h - r - 1):                                                    # 5
        q.backward(far)
        q.forward_backward(far, near)
    for i in range(r + 1):                                                        # 6
        q.backward(far, split=2 * i >= r + 1)
        q.backward(near, split=2 * i + 1 >= r + 1)
    for _ in range(h - r - 1):                                                    # 7
        q.weight()
        q.backward(near, split=True)
    while q.queued_w:                                                             # 8
        q.weight()
    # the last sends are posted by the final commit
    # (the order of the compute actions alone is DualPipe's table, checked against Fig. 5)
    return q.out


def _rank_actions(s: int, pp: int, half: int) -> list[Action]:
    """Rank ``s``'s compute actions (the schedule table's row)."""
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
