"""1F1B, Megatron-Core's non-interleaved schedule (PipeDream-Flush; Narayanan et al. 2021).

Stage ``s`` of ``pp`` runs ``warmup = min(pp - s - 1, m)`` forwards, then ``m - warmup``
steady steps of one forward and one full backward, then ``warmup`` cool-down backwards
(Megatron-LM ``megatron/core/pipeline_parallel/schedules.py``,
``forward_backward_pipelining_without_interleaving``: ``num_warmup_microbatches =
total_stages - current_stage - 1`` clipped to ``num_microbatches``).  Stage ``s`` holds at
most ``warmup + 1 = pp - s`` micro-batches' activations; bubble ``(p-1)/(m+p-1)``.
"""

from __future__ import annotations

from .actions import Action, ActionKind, Schedule
from .config import validate_schedule_config

__all__ = ["one_f_one_b", "warmup_1f1b"]


def warmup_1f1b(pp: int, stage: int, num_microbatches: int) -> int:
    """Megatron-Core's warm-up forward count for ``stage``: ``min(pp - stage - 1, m)``."""
    return min(pp - stage - 1, num_microbatches)


def one_f_one_b(pp: int, num_microbatches: int, vpp: int = 1) -> Schedule:
    """Non-interleaved 1F1B with full backwards (``BW``).

    Parameters
    ----------
    pp : int
        Pipeline stages.
    num_microbatches : int
        Micro-batches per step (>= 1).
    vpp : int
        Must be 1 (use ``interleaved_1f1b`` for virtual stages).

    Returns
    -------
    Schedule
    """
    validate_schedule_config("1f1b", pp, num_microbatches, vpp)
    m = num_microbatches
    actions = []
    for s in range(pp):
        warmup = warmup_1f1b(pp, s, m)
        order = [Action(s, 0, ActionKind.F, i) for i in range(warmup)]
        for i in range(m - warmup):          # steady state: F of the newest, BW of the oldest
            order += [Action(s, 0, ActionKind.F, warmup + i), Action(s, 0, ActionKind.BW, i)]
        order += [Action(s, 0, ActionKind.BW, i) for i in range(m - warmup, m)]
        actions.append(order)
    return Schedule("1f1b", pp, m, vpp, actions)
