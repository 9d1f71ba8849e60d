"""Interleaved 1F1B, Megatron-Core's virtual-pipeline schedule (Narayanan et al. 2021, §2.2).

Each stage holds ``vpp`` model chunks; stage ``s`` chunk ``c`` holds model chunk
``c*pp + s``.  Following Megatron-LM ``megatron/core/pipeline_parallel/schedules.py``:

* **Order of forwards** (``get_schedule_table``): micro-batches go in groups of
  ``N = microbatch_group_size_per_vp_stage`` (default ``pp``, depth-first); within a group
  every chunk runs the group's micro-batches in turn, chunk 0 first.  The last group holds
  what is left.  Example pp=2, N=3, m=5, vpp=2: (mb, chunk) =
  (0,0) (1,0) (2,0) (0,1) (1,1) (2,1) (3,0) (4,0) (3,1) (4,1).
* **Order of backwards**: the same table with the chunk reversed (``vpp - 1 - c``), since a
  micro-batch's gradient leaves the last chunk first.
* **Warm-up** (``get_pp_rank_microbatches``): ``(pp - s - 1) * 2 + (vpp - 1) * N``
  forwards, clipped to ``m * vpp`` (then every forward runs before any backward).
* then ``m*vpp - warmup`` steady steps of one forward and one full backward, and the
  remaining backwards as cool-down.

Stage 0 holds ``warmup + 1 = vpp*pp + pp - 1`` chunk activations at the peak (enough
micro-batches), i.e. ``pp * (1 + (pp-1)/(pp*vpp))`` non-interleaved stages' worth
(Korthikanti et al. 2022, §4.2.3).  With forward and backward of equal cost the bubble is
``(p-1)/(vpp*m + p-1)`` of the step.
"""

from __future__ import annotations

from .actions import Action, ActionKind, Schedule
from .config import validate_schedule_config

__all__ = ["interleaved_1f1b", "interleaved_order", "warmup_interleaved"]


def interleaved_order(num_microbatches: int, vpp: int, group_size: int) -> list[tuple[int, int]]:
    """The forward order ``[(microbatch, chunk), ...]`` shared by every stage."""
    order = []
    for first in range(0, num_microbatches, group_size):
        group = range(first, min(first + group_size, num_microbatches))   # the last may be shorter
        order += [(mb, c) for c in range(vpp) for mb in group]
    return order


def warmup_interleaved(pp: int, stage: int, vpp: int, num_microbatches: int,
                       group_size: int | None = None) -> int:
    """Megatron-Core's warm-up forward count: ``(pp-s-1)*2 + (vpp-1)*N``, clipped to ``m*vpp``."""
    n = pp if group_size is None else group_size
    return min((pp - stage - 1) * 2 + (vpp - 1) * n, num_microbatches * vpp)


def interleaved_1f1b(pp: int, num_microbatches: int, vpp: int = 2, *,
                     microbatch_group_size: int | None = None, extra_warmup: int = 0) -> Schedule:
    """Megatron-Core interleaved 1F1B with ``vpp`` model chunks per stage.

    Parameters
    ----------
    pp : int
        Pipeline stages (>= 2).
    num_microbatches : int
        Micro-batches per step; by default a multiple of ``pp`` (see
        :func:`.config.validate_schedule_config`).
    vpp : int
        Model chunks per stage (>= 2).
    microbatch_group_size : int, optional
        Megatron-Core's ``microbatch_group_size_per_vp_stage``; default ``pp``.
    extra_warmup : int
        Forwards added to every stage's warm-up: Megatron-Core adds one when
        ``overlap_moe_expert_parallel_comm`` pairs each steady step's forward and backward
        (``schedules.py``: "add one more warmup microbatches for 1f1b overlapping"), so the
        pair's halves belong to micro-batches already independent of each other.

    Returns
    -------
    Schedule
        Actions carry the local chunk index; ``model_chunk`` maps it to ``c*pp + s``.
    """
    validate_schedule_config("interleaved_1f1b", pp, num_microbatches, vpp,
                             microbatch_group_size=microbatch_group_size)
    m = num_microbatches
    group = pp if microbatch_group_size is None else microbatch_group_size
    order = interleaved_order(m, vpp, group)
    total = m * vpp
    # The k-th forward of every stage is order[k]; the k-th backward is order[k] with the chunk
    # reversed, because a micro-batch's gradient leaves through the last chunk first.
    forwards = order
    backwards = [(mb, vpp - 1 - c) for mb, c in order]
    actions = []
    for s in range(pp):
        warmup = min(warmup_interleaved(pp, s, vpp, m, group) + extra_warmup, total)
        steps = [forwards[k] + (ActionKind.F,) for k in range(warmup)]
        for k in range(total - warmup):                 # steady state: one forward, one backward
            steps += [forwards[warmup + k] + (ActionKind.F,), backwards[k] + (ActionKind.BW,)]
        steps += [backwards[k] + (ActionKind.BW,) for k in range(total - warmup, total)]
        actions.append([Action(s, c, kind, mb) for mb, c, kind in steps])
    return Schedule("interleaved_1f1b", pp, m, vpp, actions, num_chunks=vpp)
