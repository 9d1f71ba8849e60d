"""How Megatron-Core with Transformer Engine issues each op relative to the compute stream,
under the scenario's ``overlap`` switches (:class:`workloads.ops.Issue`).

==========================================  ==========================  ======================
op                                          switch (default)            issue mode
==========================================  ==========================  ======================
CP ring hop (K/V, dK/dV)                    ``cp_comm`` (on)            ``beside_next``
TP collective                               ``tp_comm`` (off)           ``overlap_next``
TE's backward input re-gather (SP)          always; ``tp_comm`` on:     ``beside_next``
                                            userbuffer overlap          (``overlap_next``)
gradient bucket                             ``grad_reduce`` (on)        ``dp_stream``
distributed-optimizer parameter gather      ``param_gather`` (on)       ``dp_stream``
ZeRO-3 / FSDP per-layer parameter gather    ``fsdp_prefetch`` (on)      ``prefetch``
anything else                                                           ``blocking``
==========================================  ==========================  ======================

Sources: Transformer Engine ``context_parallel.py`` (the ring's next hop posted before each
block), ``module/linear.py`` ``_Linear.backward`` (the input all-gather with
``async_op=True`` while the dgrad GEMM runs) and its userbuffer ``ub_overlap_*`` options;
Megatron-Core ``distributed_data_parallel.py`` (``overlap_grad_reduce``,
``overlap_param_gather``) and PyTorch FSDP's backward / forward prefetch.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...ops import KIND_COLLECTIVE, GROUP_TP, Issue, Op, is_cp_hop, is_fsdp_gather, is_grad_bucket, \
    is_param_gather, is_te_async

__all__ = ["assign_issue_modes", "issue_mode"]


def issue_mode(op: Op, overlap: Mapping) -> Issue:
    """The issue mode of ``op`` under the ``overlap`` switches (missing ones take their defaults)."""
    if op.kind != KIND_COLLECTIVE:
        return Issue.BLOCKING
    tp_comm = bool(overlap.get("tp_comm", False))
    hop = is_cp_hop(op)
    te_async = is_te_async(op)
    if (hop and overlap.get("cp_comm", True)) or (tp_comm and op.group == GROUP_TP) or te_async:
        return Issue.BESIDE_NEXT if hop or (te_async and not tp_comm) else Issue.OVERLAP_NEXT
    if (is_grad_bucket(op) and overlap.get("grad_reduce", True)) or \
            (is_param_gather(op) and overlap.get("param_gather", True)):
        return Issue.DP_STREAM
    if is_fsdp_gather(op) and overlap.get("fsdp_prefetch", True):
        return Issue.PREFETCH
    return Issue.BLOCKING


def assign_issue_modes(ops: list[Op], overlap: Mapping) -> list[Op]:
    """``ops`` with their issue modes set (the blocking ones unchanged)."""
    out = []
    for op in ops:
        mode = issue_mode(op, overlap)
        out.append(op if mode is Issue.BLOCKING else op._replace(issue=mode))
    return out
