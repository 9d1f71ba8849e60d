"""Where each pipeline stage posts its point-to-point transfers: the send/receive batches.

A stage posts its p2p transfers in *batches* (``torch.distributed.batch_isend_irecv``):
every transfer of a batch is posted at once, then the stage waits for all of them --
sends included, since a send completes only once the peer has posted the matching receive
and the data has moved -- and only then computes.  Where the batches fall is part of a
schedule's implementation, not of its compute order: it decides what a transfer overlaps
and whether rendezvous semantics can deadlock.

:func:`p2p_order` gives a stage's compute actions with its transfers
(``SEND_F``/``RECV_F``/``SEND_B``/``RECV_B`` actions, the chunk and micro-batch of the
compute action whose input or output moves) in posting order; the transfers between two
compute actions form one batch.  It returns ``None`` for schedules that use the plain rule
-- a compute action receives its input just before it runs and sends its output just after,
so a send and the next action's receive share a batch (Megatron's
``send_forward_recv_backward`` in 1F1B) -- which the program builder applies itself.

* ``interleaved_1f1b`` follows Megatron-Core's loop
  (``forward_backward_pipelining_with_interleaving`` without ``overlap_p2p_comm``): warm-up
  forwards, steady steps of one forward and one backward, cool-down backwards; one batch
  before the first step receives its inputs, and one batch after every step sends that
  step's outputs and receives the next step's inputs
  (``send_forward_backward_recv_forward_backward``).  Posting both directions together is
  what lets every stage block on its sends without deadlock.
* ``dualpipe`` follows the reference implementation (deepseek-ai/DualPipe,
  ``dualpipe/dualpipe.py``): transfers are queued and the queue is committed (posted and
  waited for) before every compute chunk, weight passes included; sends are queued after a
  chunk computes, so they go out with the next chunk's receives; in phase 2 the next
  near-chunk forward's input is received one chunk early, and outside the middle ranks the
  near forward's output waits for the far forward; in phase 3 the far forward's input is
  received before the weight pass; ``F&B`` pairs receive both inputs before and send both
  outputs after.
* the zero-bubble schedules (``zb_h1``, ``zb_v``) use the plain rule with sends that do not
  block (:func:`sends_async`): their runtimes post each send and never wait for it, and
  wait for a receive only when its consumer runs.
"""

from __future__ import annotations

from .actions import COMM_KINDS, Action, ActionKind, Schedule, route_position
from .dualpipe import rank_order

__all__ = ["p2p_order", "batches", "host_waits_for_batches", "sends_async"]


def p2p_order(schedule: Schedule, stage: int, overlap_p2p: bool = False) -> list[Action] | None:
    """The stage's compute actions and transfers in posting order, or ``None`` for the
    plain receive-before / send-after rule (see the module docstring).

    ``overlap_p2p`` is Megatron's ``overlap_p2p_comm`` (on by default in Megatron-LM, where
    ``--no-overlap-p2p-communication`` turns it off; it affects only the interleaved
    schedule): transfers are posted asynchronously next to their compute action, the plain
    rule with sends that do not block.

    Transfers with no peer (the first model chunk receives no activations, the last no
    gradients) are left out.  A hand-edited table whose compute order no longer matches
    its generator gets the plain rule.
    """
    if schedule.name == "interleaved_1f1b":
        if overlap_p2p:
            return None
        order = _megatron_interleaved(schedule, stage)
        if order is None:
            return None
    elif schedule.name == "dualpipe":
        order = rank_order(stage, schedule.pp, schedule.num_microbatches // 2)
    else:
        return None
    compute = [a for a in schedule.actions[stage] if a is not None]
    if [a for a in order if a.kind not in COMM_KINDS] != compute:
        return None
    position = route_position(schedule)
    last = schedule.num_model_chunks - 1

    def has_peer(a: Action) -> bool:
        k = position(a.stage, a.chunk, a.microbatch)
        if a.kind in (ActionKind.RECV_F, ActionKind.SEND_B):
            return k > 0
        return k < last

    return [a for a in order if a.kind not in COMM_KINDS or has_peer(a)]


#: Schedules whose runtime posts pipeline sends without waiting for them.
_ASYNC_SEND_SCHEDULES = frozenset({"zb_h1", "zb_v"})


def sends_async(schedule: Schedule) -> bool:
    """Whether ``schedule``'s runtime posts its pipeline sends asynchronously: the rank goes
    on computing after posting a send and never waits for it; it waits for a receive just
    before the action that consumes it.

    Both zero-bubble runtimes do so:

    * sail-sg/zero-bubble-pipeline-parallelism (the paper's implementation, ZB-H1 and ZB-V;
      ``megatron/core/pipeline_parallel/zerobubble/runtime.py``@39f2c186): ``flush`` posts the
      queued transfers with ``isend`` / ``irecv`` (``p2p_pipeline_ops``: its runtime keeps
      ``overlap_p2p_comm`` on, so ``batch_p2p_comm`` is off) and drops the send handles ("send
      handles (send_reqs) can simply be dropped"); ``schedule_f_impl`` / ``schedule_b_impl``
      wait on the receive handles of the micro-batch they compute, and nothing waits on a send;
    * PyTorch pipelining (``ScheduleInterleavedZeroBubble``, ``ScheduleZBVZeroBubble``):
      ``_PipelineScheduleRuntime._step_microbatches`` posts each send as a batched ``isend``
      and waits on the send handles only at the end of the step.

    With rendezvous sends instead, ZB-H1's order leaves a gap at every micro-batch: after its
    ``B`` a stage sends the gradient alone (a ``W`` follows, with no receive to pair it with),
    so its upstream neighbour, which posts that receive with its next activation send, waits
    for the stage's whole ``W`` before the activation send completes and its ``B`` can start.
    ZB-V's order deadlocks (stage ``s`` sends a chunk-0 activation down while stage ``s+1``
    sends a chunk-1 activation up).  Megatron-Core's own schedules (1F1B, interleaved) and
    DualPipe wait for their batches, sends included (:mod:`.comm`'s module docstring).
    """
    return schedule.name in _ASYNC_SEND_SCHEDULES


def host_waits_for_batches(schedule: Schedule) -> bool:
    """Whether the host waits for the device after each batch of transfers it waited for.

    Megatron-Core does (``batch_p2p_sync``, on by default, synchronises the device after a
    batched ``batch_isend_irecv`` in ``p2p_communication._communicate``), so the host issues
    the next work only once the batch has completed.  DualPipe does not: its
    ``_commit_and_wait_comm`` (deepseek-ai/DualPipe ``dualpipe/dualpipe.py``@3da1bbea) calls
    ``req.wait()`` on each request, which makes the compute stream wait for the transfers
    while the host goes on issuing.  Nor do the zero-bubble runtimes, whose receives are
    waited the same way and whose sends not at all (:func:`sends_async`)."""
    return schedule.name != "dualpipe" and not sends_async(schedule)


def batches(order: list[Action]) -> list[list[Action]]:
    """The transfer batches of a :func:`p2p_order` list: maximal runs of transfers."""
    out: list[list[Action]] = []
    run: list[Action] = []
    for a in order:
        if a.kind in COMM_KINDS:
            run.append(a)
        elif run:
            out.append(run)
            run = []
    if run:
        out.append(run)
    return out


def _transfers(a: Action, recv: bool) -> list[Action]:
    """The receives that feed compute action ``a`` (``recv``), or the sends of what it
    produces: activations for a forward, gradients for a backward (both halves of an
    ``FB`` pair)."""
    f_kind, b_kind = (ActionKind.RECV_F, ActionKind.RECV_B) if recv else (ActionKind.SEND_F, ActionKind.SEND_B)
    out = []
    for h in a.halves():
        if h.kind is ActionKind.F:
            out.append(Action(h.stage, h.chunk, f_kind, h.microbatch))
        elif h.kind in (ActionKind.B, ActionKind.BW):
            out.append(Action(h.stage, h.chunk, b_kind, h.microbatch))
    return out


def _megatron_interleaved(schedule: Schedule, stage: int) -> list[Action] | None:
    acts = [a for a in schedule.actions[stage] if a is not None]
    num_f = sum(1 for a in acts if a.kind is ActionKind.F)
    leading = next((i for i, a in enumerate(acts) if a.kind is not ActionKind.F), len(acts))
    # Megatron's warm-up count: every forward before the first backward, except the one that
    # opens the first steady (F, BW) step -- unless all forwards are warm-up
    warmup = leading if leading == num_f else leading - 1
    steady = num_f - warmup
    steps = [[a] for a in acts[:warmup]]
    steps += [acts[warmup + 2 * k: warmup + 2 * k + 2] for k in range(steady)]
    steps += [[a] for a in acts[warmup + 2 * steady:]]
    if any(len(st) == 2 and [a.kind for a in st] != [ActionKind.F, ActionKind.BW] for st in steps) or \
            any(len(st) == 1 and st[0].kind not in (ActionKind.F, ActionKind.BW) for st in steps):
        return None                      # not Megatron's warm-up / steady / cool-down shape
    order: list[Action] = []
    for i, step in enumerate(steps):
        if i == 0:
            order += [r for a in step for r in _transfers(a, recv=True)]
        order += step
        order += [x for a in step for x in _transfers(a, recv=False)]
        if i + 1 < len(steps):
            order += [r for a in steps[i + 1] for r in _transfers(a, recv=True)]
    return order
