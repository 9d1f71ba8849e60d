"""Mixture-of-experts lowering as Megatron-Core runs it: routed loads per EP rank and the
dispatch matrices, the token dispatcher's host sync and collective calls, expert-TP
collectives, and the F&B pairs of the EP-overlap schedule."""

from __future__ import annotations

from typing import NamedTuple
import numpy as np
from topologies import ConfigError
from ...moe_routing import _trace_has_sources, apply_rank_budget, apply_source_capacity, dispatch_matrix, expert_load, source_dispatch_matrix, source_loads
from ...ops import Coll, Group, OpName, Stream
from ...schedules import ActionKind

from .context import _Ctx



def _dispatch_sync(ctx) -> str | None:
    """Where Megatron-Core's token dispatcher makes the host wait for the GPU in every MoE
    layer's forward (and a recomputed one), to read the per-expert token counts it sizes
    buffers, all-to-all splits and Transformer Engine's grouped-GEMM ``m_splits`` with:
    ``"pre"`` (ahead of the dispatch: the point the GPU must reach lies before the token
    permutation), ``"dispatch"`` (after the dispatch collective), or None (no sync).

    From megatron/core/transformer/moe/token_dispatcher.py (NVIDIA/Megatron-LM):

    * ``alltoall`` (``MoEAlltoAllTokenDispatcher``): unless ``moe_pad_expert_input_to_capacity``
      (``drop_and_pad``: the counts are known on the host), ``_maybe_dtoh_and_synchronize``
      copies the counts and splits to the host on a side stream at ``cuda_dtoh_point``
      (``before_permutation_1``; ``before_ep_alltoall`` when the ``moe_preprocess`` module
      is CUDA-graphed) and waits for the copy (``d2h_event.synchronize()``) at
      ``cuda_sync_point``: ``before_ep_alltoall`` with EP or TP > 1, ``before_finish``
      otherwise, ``before_permutation_1`` with a capacity factor.  The host then issues the
      all-to-all, the sort by local expert and the experts.
    * ``allgather`` (``MoEAllGatherTokenDispatcher.dispatch_postprocess``):
      ``local_map.sum(dim=0).long().cpu()`` after the all-gather, always.
    * ``flex`` with DeepEP (``_DeepepManager`` -> ``fused_a2a.FusedDispatch``): DeepEP's
      normal-mode ``Buffer.dispatch`` waits on the host for the received-token counts
      ("the CPU will wait for GPU's signal to arrive"), always; with HybridEP
      (``_HybridEPManager`` -> ``HybridEPDispatch``): ``non_blocking`` only when
      ``num_permuted_tokens`` is known, i.e. with ``moe_expert_rank_capacity_factor`` or
      padding to capacity.

    The backward needs no sync (the splits are kept from the forward), and Transformer
    Engine's ``GroupedLinear`` then gets host ``m_splits`` (``TEGroupedMLP.forward``'s
    ``tokens_per_expert.tolist()`` of a host tensor).  A full-iteration CUDA graph cannot hold
    a sync (Megatron-Core needs the rank budget for it): host modes without host costs
    (``cuda_graphs``, ``none``) emit none, as the host never gates the GPU there."""
    moe = ctx.model.moe
    if moe is None or not any(ctx.host[:3]):
        return None
    if moe.token_dispatcher == "alltoall":
        return None if moe.pad_expert_input_to_capacity else "pre"
    if moe.token_dispatcher == "allgather":
        return "dispatch" if ctx.par.ep > 1 else "pre"
    if moe.flex_dispatcher_backend == "hybridep" and (moe.expert_rank_capacity_factor is not None
                                                      or moe.pad_expert_input_to_capacity):
        return None
    return "pre"



def _emit_dispatch_sync(ctx, em, seg, where: str, layer, mb, chunk, phase) -> None:
    """The dispatcher's host sync (:func:`_dispatch_sync`) if it falls ``where`` (``pre`` or
    ``dispatch``).  Its lag (the GPU seconds of the preceding op after the point the host
    waits for): ``pre``, the permutation the program places in ``moe_pre`` -- all of it when
    the counts are copied before permutation 1, only the sort by local expert after the
    all-to-all (its ``2 k / (1 + 3 k)`` of the permutation's bytes, ``workloads.costs.flops``
    ``_moe_block``, dropless) when the ``moe_preprocess`` graph holds permutation 1 and the
    copy follows it (alltoall); ``dispatch``, none."""
    if _dispatch_sync(ctx) != where:
        return
    lag = 0.0
    if where == "pre":
        lag = seg.get("F:permute_s", 0.0)          # a recomputed permutation is the forward's
        if ctx.model.moe.token_dispatcher == "alltoall" and "moe_preprocess" in ctx.host.graphed:
            k = ctx.model.moe.top_k
            lag *= 2 * k / (1 + 3 * k)
    em.host_sync(OpName.MOE_HOST_SYNC, layer, mb, chunk, phase, lag)



def _moe_signature(ctx: _Ctx, e: int, a2a_sizes: dict, loads: dict):
    """(hashable signature, {(layer, mb): tokens per local expert}) of EP coordinate ``e``."""
    m, par = ctx.model, ctx.par
    if m.moe is None:
        return (), {}
    E, k = m.moe.num_experts, m.moe.top_k
    tn = ctx.mbs * ctx.seq // (par.cp * par.tp) if par.sequence_parallel or par.tp == 1 else ctx.mbs * ctx.seq // par.cp
    pool = par.expert_tp * par.ep * tn
    local = E // par.ep
    bytes_per_token = (m.moe.latent_size or m.hidden_size) * 2.0     # latent MoE dispatches latent-wide tokens
    table = {}
    per_source = _drops_tokens(ctx) or _trace_has_sources(ctx.routing)
    for layer in range(m.num_layers + m.mtp_layers):
        # an MTP module's layer is shaped like the last decoder layer (blocks.layers) and routes too
        if not m.is_moe_layer(min(layer, m.num_layers - 1)):
            continue
        for mb in range(par.num_microbatches):
            load = loads.get((layer, mb))
            if load is None:
                if per_source:
                    load = loads[(layer, mb)] = _routed_per_source(ctx, tn, layer, mb, a2a_sizes, bytes_per_token)
                else:
                    load = loads[(layer, mb)] = expert_load(ctx.routing, pool, E, k, layer=layer, microbatch=mb,
                                                            seed=ctx.seed)
            table[(layer, mb)] = tuple(map(int, load[e * local:(e + 1) * local].tolist()))
            if (layer, mb) not in a2a_sizes and par.ep > 1:
                a2a_sizes[(layer, mb)] = dispatch_matrix(load, par.ep, bytes_per_token)
    return tuple(sorted(table.items())), table



def _drops_tokens(ctx) -> bool:
    moe = ctx.model.moe
    return moe is not None and (moe.capacity_factor is not None or moe.expert_rank_capacity_factor is not None)



def _routed_per_source(ctx, tn: int, layer: int, mb: int, a2a_sizes: dict, bytes_per_token: float) -> np.ndarray:
    """Tokens each expert computes on in (layer, mb), routed per source rank: each of the
    ``ep x etp`` source ranks routes its ``tn`` local tokens, keeps at most the capacity per
    expert (Megatron-Core's per-router-call capacity), HybridEP's rank budget trims what an EP
    rank receives; the all-to-all carries what is kept (or the padded capacity).  Records the
    dispatch matrix, the bytes' scale for the expert-TP collectives and the drop counts."""
    m, par = ctx.model, ctx.par
    E, k, moe = m.moe.num_experts, m.moe.top_k, m.moe
    sources = par.ep * par.expert_tp
    routed = source_loads(ctx.routing, tn, sources, E, k, layer=layer, microbatch=mb, seed=ctx.seed)
    kept, dropped = apply_source_capacity(routed, tn, k, moe.capacity_factor, moe.pad_expert_input_to_capacity)
    kept, over = apply_rank_budget(kept, par.ep, tn, k, moe.expert_rank_capacity_factor)
    ctx.drops[0] += int(routed.sum())
    ctx.drops[1] += dropped + over
    ctx.a2a_scale[(layer, mb)] = float(kept.sum()) / float(sources * tn * k)
    if par.ep > 1:
        a2a_sizes[(layer, mb)] = source_dispatch_matrix(kept, par.ep, bytes_per_token)
    return kept.sum(axis=0)



#: The allgather dispatcher's collective for each EP communication point: tokens are
#: gathered before the experts and the outputs reduce-scattered after them; the backward of
#: an all-gather is a reduce-scatter and the other way round.
_ALLGATHER_COLL = {OpName.EP_DISPATCH: Coll.ALL_GATHER, OpName.EP_COMBINE: Coll.REDUCE_SCATTER,
                   OpName.EP_COMBINE_BWD: Coll.ALL_GATHER, OpName.EP_DISPATCH_BWD: Coll.REDUCE_SCATTER}



def _ep_comm(ctx, em, name, layer, mb, chunk, phase):
    """One expert-parallel communication point, as the dispatcher moves tokens.

    ``alltoall`` and ``flex`` (DeepEP, HybridEP): an all-to-all with per-peer sizes from the
    routing (``Program.a2a_sizes``; the flex kernels' bandwidth and SM use are the engine's,
    :mod:`simulator.collectives.ep_dispatch`).  ``allgather`` (Megatron-Core's
    ``MoEAllGatherTokenDispatcher``): every rank all-gathers the EP group's tokens (not
    multiplied by top-k: each rank picks the tokens of its own experts from the gathered
    buffer), and the expert outputs are reduce-scattered back, ``ep x local tokens x hidden``
    BF16 each way."""
    par, m = ctx.par, ctx.model
    if m.moe.token_dispatcher == "allgather":
        tn = ctx.mbs * ctx.seq // (par.cp * par.tp) if par.sequence_parallel or par.tp == 1 else ctx.mbs * ctx.seq // par.cp
        em.coll(Stream.EP, _ALLGATHER_COLL[name], Group.EP, float(par.ep * tn * m.hidden_size * 2.0), name, layer, mb,
                chunk, phase)
    else:
        em.coll(Stream.EP, Coll.ALL_TO_ALL, Group.EP, _a2a_total(ctx, layer, mb), name, layer, mb, chunk, phase,
                tag=(layer, mb))
    _ep_host_calls(ctx, em, name, phase)



def _ep_calls(ctx, name, phase) -> int:
    """The collective calls the host issues at one EP communication point (the program
    models their bytes as one collective).  From Megatron-Core's token_dispatcher.py:
    ``alltoall`` dispatches the tokens and, in a second ``all_to_all``, their routing
    probabilities (``token_dispatch``; their gradients likewise in the backward; the counts'
    all-gather before is :func:`_preprocess_calls`); ``allgather`` gathers the routing map,
    the probabilities and the tokens (the backward reduce-scatters the last two); the flex
    dispatchers make one fused call; a combine is one call everywhere."""
    disp = ctx.model.moe.token_dispatcher
    if name not in (OpName.EP_DISPATCH, OpName.EP_DISPATCH_BWD) or disp == "flex":
        return 1
    if disp == "allgather":
        return 3 if name == OpName.EP_DISPATCH else 2
    return 2



def _preprocess_calls(ctx) -> int:
    """Collective calls inside an MoE layer's eager preprocessing (issued with ``moe_pre``):
    the ``alltoall`` dispatcher all-gathers the per-expert counts over the TP x EP group
    (token_dispatcher.py ``preprocess``) with EP or TP > 1, unless it pads to capacity or the
    ``moe_preprocess`` graph holds it."""
    m, par = ctx.model, ctx.par
    if (m.moe is None or m.moe.token_dispatcher != "alltoall" or m.moe.pad_expert_input_to_capacity
            or (par.ep == 1 and par.tp == 1) or "moe_preprocess" in ctx.host.graphed or not ctx.host.call_s):
        return 0
    return 1



def _ep_host_calls(ctx, em, name, phase) -> None:
    """Charge the host for every call of the EP communication point just emitted."""
    n = _ep_calls(ctx, name, phase)
    op = em.ops[-1]
    if n > 1 and op.host_s > 0.0:
        em.ops[-1] = op._replace(host_s=op.host_s * n, host_ops=n)



def _expert_tp(ctx, em, coll, name, layer, mb, chunk, phase):
    """Expert tensor parallelism around the experts (Megatron-Core's
    ``MoEAlltoAllTokenDispatcher``): after the dispatch all-to-all the expert-TP group
    all-gathers the tokens its ranks received (each rank then runs its 1/etp slice of every
    local expert on all of them), and before the combine all-to-all it reduce-scatters the
    partial outputs; backward mirrors both.  Sized for the mean load (the gathered buffer:
    etp ranks' tokens x top-k x hidden, BF16)."""
    par = ctx.par
    if par.expert_tp > 1:
        em.coll(Stream.TP, coll, Group.ETP, par.expert_tp * _a2a_total(ctx, layer, mb), name, layer, mb, chunk, phase)



def _a2a_total(ctx, layer, mb) -> float:
    """Bytes one rank dispatches in (layer, mb) at the mean load: its tokens x top-k x hidden
    (BF16), scaled by what token dropping keeps (or padding adds)."""
    par, m = ctx.par, ctx.model
    tn = ctx.mbs * ctx.seq // (par.cp * par.tp) if par.sequence_parallel or par.tp == 1 else ctx.mbs * ctx.seq // par.cp
    # latent MoE dispatches latent-wide tokens
    total = float(tn * m.moe.top_k * (m.moe.latent_size or m.hidden_size) * 2.0)
    scale = ctx.a2a_scale.get((layer, mb))
    return total if scale is None else total * scale



def check_layout(model, par, sched, *, moe_ep_overlap: bool = False) -> None:
    """What Megatron-Core refuses, or clustersim does not model, in an MoE layout: the
    ``allgather`` dispatcher with expert tensor parallelism, and the EP-overlap schedule's
    conditions (:func:`_check_moe_overlap`)."""
    if model.moe is not None and model.moe.token_dispatcher == "allgather" and par.expert_tp > 1:
        raise ConfigError("model.moe.token_dispatcher", "allgather", f"with expert tensor parallelism (etp = "
                          f"{par.expert_tp}) is not modelled: use alltoall or flex, or etp 1")
    if moe_ep_overlap:
        _check_moe_overlap(model, par, sched)


def _check_moe_overlap(model, par, sched) -> None:
    """Megatron-Core's conditions for ``overlap_moe_expert_parallel_comm``
    (transformer_config.py ``__post_init__``), as ConfigErrors."""
    key = "overlap.moe_ep_comm"
    if model.moe is None or par.ep == 1:
        raise ConfigError(key, True, "needs expert parallelism (a MoE model with ep > 1)")
    if model.moe.token_dispatcher not in ("alltoall", "flex"):
        raise ConfigError(key, True, f"needs the alltoall or flex dispatcher, not {model.moe.token_dispatcher}")
    if par.recompute == "full":
        raise ConfigError(key, True, "needs recompute other than full (Megatron-Core refuses full recomputation)")
    if sched.layout == "bidirectional":
        raise ConfigError(key, True, "DualPipe already pairs forward and backward (overlap.fb_overlap)")
    if par.pp > 1 and sched.name != "interleaved_1f1b":
        raise ConfigError(key, True, "with pipeline parallelism needs the interleaved 1F1B schedule (Megatron-Core "
                          "requires a virtual pipeline size)")



class _MoEPair(NamedTuple):
    halves: tuple



def _moe_pairs(acts: list) -> list:
    """Megatron-Core's combined 1F1B (``overlap_moe_expert_parallel_comm``): a forward and a
    full backward that follow each other with no transfer between them, of different
    (chunk, micro-batch), become one pair (:class:`_MoEPair`) whose halves run as two
    threads (the engine's F&B pair, as DualPipe's): in the interleaved steady state the step's
    forward and backward; without a pipeline the backward of micro-batch i with the forward
    of i+1.  ``delay_wgrad_compute`` is inside the pair: the backward half's weight gradients
    are compute the forward half's all-to-alls can overlap."""
    out, i = [], 0
    compute = (ActionKind.F, ActionKind.BW)
    while i < len(acts):
        a = acts[i]
        b = acts[i + 1] if i + 1 < len(acts) else None
        if (b is not None and a.kind in compute and b.kind in compute and a.kind != b.kind
                and (a.chunk, a.microbatch) != (b.chunk, b.microbatch)):
            out.append(_MoEPair((a, b)))
            i += 2
            continue
        out.append(a)
        i += 1
    return out
