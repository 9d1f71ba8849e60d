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

from .actions import Action, ActionKind, Schedule
from .config import validate_schedule_config

__all__ = ["dualpipe"]


def _rank_actions(s: int, pp: int, half: int) -> list[Action]:
    h = pp // 2
    r = min(s, pp - 1 - s)
    near = 0 if s < h else 1        # chunk 0 is fed from stage 0, chunk 1 from stage pp-1
    far = 1 - near
    next_f = [0, 0]                 # next micro-batch index per chunk (direction), forward
    next_b = [0, 0]                 # ... and backward; both run in arrival order
    queued_w: deque[tuple[int, int]] = deque()
    out: list[Action] = []

    def mb(chunk: int, j: int) -> int:
        return j if chunk == 0 else half + j

    def forward(c: int) -> Action:
        next_f[c] += 1
        return Action(s, c, ActionKind.F, mb(c, next_f[c] - 1))

    def backward(c: int, split: bool = False) -> Action:
        next_b[c] += 1
        a = Action(s, c, ActionKind.B if split else ActionKind.BW, mb(c, next_b[c] - 1))
        if split:
            queued_w.append((c, a.microbatch))
        return a

    def weight() -> Action:
        c, i = queued_w.popleft()
        return Action(s, c, ActionKind.W, i)

    def pair(c_f: int, c_b: int) -> Action:
        return Action.pair(forward(c_f), backward(c_b))

    out += [forward(near) for _ in range(2 * (h - r - 1))]                       # 1
    for _ in range(r + 1):                                                        # 2
        out += [forward(near), forward(far)]
    for _ in range(h - r - 1):                                                    # 3
        out += [backward(far, split=True), weight(), forward(far)]
    for i in range(half - pp + r + 1):                                            # 4
        if i == 0 and r == h - 1:
            out += [forward(near), backward(far)]
        else:
            out.append(pair(near, far))
        out.append(pair(far, near))
    for _ in range(h - r - 1):                                                    # 5
        out += [backward(far), pair(far, near)]
    for i in range(r + 1):                                                        # 6
        out.append(backward(far, split=2 * i >= r + 1))
        out.append(backward(near, split=2 * i + 1 >= r + 1))
    for _ in range(h - r - 1):                                                    # 7
        out += [weight(), backward(near, split=True)]
    out += [weight() for _ in range(len(queued_w))]                               # 8
    return out


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
