"""One pipeline stage's program: the schedule's actions in order, each with its layers'
lowering and its point-to-point transfers (Megatron-Core's batched p2p, or asynchronous
with ``overlap_p2p_comm``)."""

from __future__ import annotations

from typing import NamedTuple
import numpy as np
from ...costs import embedding_ops, output_ops
from ...costs.precision import uses_torchao_casts, weight_quantize_op
from ...ops import Coll, Group, Op, OpKind, OpName, Phase, Stream, is_p2p
from ...schedules import ActionKind, model_chunk, route
from ...schedules.actions import COMM_KINDS
from ...schedules.comm import p2p_order

from .context import _Ctx, _Emitter, _Stage, _host_of
from .data_parallel import _embedding_params, _grads_sharded, _local_params, _output_params, dp_rules
from .layers import _layer_backward, _layer_forward, _layer_wgrad, _recompute_kind
from .moe import _MoEPair, _moe_pairs






def _stage_program(ctx: _Ctx, stage: int, tokens: dict) -> list[Op]:
    """The op list of the ranks of pipeline stage ``stage`` (with EP coordinate's ``tokens``):
    the weight quantisation of low-precision recipes, the schedule's actions with their
    transfers, then the step end."""
    par, sched = ctx.par, ctx.sched
    em = _Emitter(ctx.host.call_s)
    stage_layers = [ctx.chunk_layers[model_chunk(sched, stage, c)] for c in range(sched.num_chunks)]
    act_p2p = _act_bytes(ctx) / (par.tp if _p2p_split(par) else 1)
    st = _Stage(stage, tokens, stage_layers, sum(len(r) for r in stage_layers), act_p2p,
                _last_microbatches(sched, stage), dp_rules(ctx).buckets(ctx, em))
    # the weights of the layers whose GEMMs run in low precision (NVFP4 keeps some in BF16)
    lowp = [i for r in stage_layers for i in r if ctx.recipe.is_low_precision_layer(i, ctx.model.num_layers)]
    # (torchao casts the weights with each GEMM instead: costs.precision.with_quantize_ops)
    wq = None if uses_torchao_casts(ctx.recipe, ctx.fusion.float8_casts) else \
        weight_quantize_op(ctx.recipe, sum(_local_params(ctx, lowp)))
    if wq is not None:
        em.compute(OpName.WEIGHT_QUANTIZE, -1, -1, 0, Phase.F, 0.0, float(np.sum(ctx.compute.op_times_s([wq]))),
                   *_host_of(ctx, [wq]))
    order = p2p_order(sched, stage, overlap_p2p=ctx.p2p_overlap)
    acts = order if order is not None else [a for a in sched.actions[stage] if a is not None]
    for act in (_moe_pairs(acts) if ctx.moe_ep_overlap else acts):
        if isinstance(act, _MoEPair):       # an MoE overlap pair: two halves, as DualPipe's F&B
            # With transfers next to their compute (overlapped p2p), the pair waits for both
            # halves' inputs before it starts and sends both outputs after it: Megatron-Core's
            # combined step calls pre_forward and pre_backward before its first layer
            # (TransformerModelChunkSchedulePlan.run), post_forward / post_backward after.
            if order is None:
                for a in act.halves:
                    _emit_pair_p2p(ctx, em, st, a, receive=True)
            for lane, a in enumerate(act.halves, start=1):
                em.lane = lane
                _emit_action(ctx, em, st, a, p2p=False)
            em.lane = 0
            if order is None:
                for a in act.halves:
                    _emit_pair_p2p(ctx, em, st, a, receive=False)
            continue
        kind = act.kind
        if kind in COMM_KINDS:
            _emit_transfer(ctx, em, act, act_p2p)
            continue
        if kind not in (ActionKind.F, ActionKind.B, ActionKind.W, ActionKind.BW, ActionKind.FB):
            continue
        halves = act.halves() if kind == ActionKind.FB else [act]
        for lane, a in enumerate(halves, start=1 if kind == ActionKind.FB else 0):
            em.lane = lane
            _emit_action(ctx, em, st, a, p2p=order is None)
        em.lane = 0
    st.buckets.issue_deferred()
    dp_rules(ctx).step_end(ctx, em, st)
    return _one_issue_per_p2p_batch(em.ops)



def _one_issue_per_p2p_batch(ops: list[Op]) -> list[Op]:
    """Consecutive send/recv ops are one batch (one ``batch_isend_irecv`` call, as the
    engine runs them): only the first carries the host's issue time."""
    out = []
    for i, op in enumerate(ops):
        if is_p2p(op) and i > 0 and is_p2p(ops[i - 1]) and op.host_s:
            op = op._replace(host_s=0.0, host_ops=0)
        out.append(op)
    return out



def _act_bytes(ctx) -> float:
    """Bytes of one micro-batch's activation (or its gradient) between stages, whole."""
    return ctx.mbs * ctx.seq / ctx.par.cp * ctx.model.hidden_size * 2.0



def _p2p_split(par) -> bool:
    """Whether a TP rank sends only its 1/tp slice of the activations between stages:
    with sequence parallelism they are split already; with Megatron-LM's scatter/gather
    the receiver all-gathers them over the TP group (:func:`_gather_received`)."""
    return par.sequence_parallel or (par.scatter_gather_tensors_in_pipeline and par.tp > 1)



def _gather_received(ctx, em, mb, chunk, phase):
    """Megatron-LM's ``gather_split_1d_tensor``: the TP group rebuilds the received
    activation (or gradient) from its slices before computing on it."""
    if _p2p_split(ctx.par) and not ctx.par.sequence_parallel:
        em.coll(Stream.TP, Coll.ALL_GATHER, Group.TP, _act_bytes(ctx), OpName.P2P_GATHER, -1, mb, chunk, phase)



def _emit_transfer(ctx, em, t, act_p2p):
    """The p2p op of transfer action ``t`` (:mod:`workloads.schedules.comm`): the input or
    output of compute action ``(t.stage, t.chunk, t.microbatch)``."""
    sched, stage, mb = ctx.sched, t.stage, t.microbatch
    path = route(sched, mb)
    pos = path.index((stage, t.chunk))
    step = 1 if t.kind in (ActionKind.SEND_F, ActionKind.RECV_B) else -1
    _p2p(em, t.kind, stage, t.chunk, mb, model_chunk(sched, stage, t.chunk), path[pos + step][0], act_p2p)



def _p2p(em, kind, stage, chunk, mb, k, peer, act_p2p):
    """One send or receive of stage ``stage``'s model chunk ``k`` with stage ``peer``; the
    tag (source stage, destination stage, receiver's model chunk, micro-batch, F|B) is
    what both sides match on."""
    if kind == ActionKind.RECV_F:
        em.p2p(OpKind.RECV, OpName.RECV_ACT, peer, act_p2p, (peer, stage, k, mb, Phase.F), mb, chunk, Phase.F)
    elif kind == ActionKind.SEND_F:
        em.p2p(OpKind.SEND, OpName.SEND_ACT, peer, act_p2p, (stage, peer, k + 1, mb, Phase.F), mb, chunk, Phase.F)
    elif kind == ActionKind.RECV_B:
        em.p2p(OpKind.RECV, OpName.RECV_GRAD, peer, act_p2p, (peer, stage, k, mb, Phase.B), mb, chunk, Phase.B)
    else:
        em.p2p(OpKind.SEND, OpName.SEND_GRAD, peer, act_p2p, (stage, peer, k - 1, mb, Phase.B), mb, chunk, Phase.B)



class _Where(NamedTuple):
    """Where compute action ``a`` sits: its model chunk, layers and neighbours on its route."""

    k: int                        #: the model chunk
    layers: range
    prev_stage: int | None        #: the stage it receives activations from (None: the first chunk)
    next_stage: int | None        #: the stage it sends them to (None: the last chunk)
    first_idx: int                #: index of its first layer among the stage's layers
    is_last_mb: bool              #: its weight gradients complete the chunk's buckets



def _where(ctx: _Ctx, st: _Stage, a) -> _Where:
    k = model_chunk(ctx.sched, st.index, a.chunk)
    path = route(ctx.sched, a.microbatch)
    pos = path.index((st.index, a.chunk))
    prev_stage = path[pos - 1][0] if pos > 0 else None
    next_stage = path[pos + 1][0] if pos + 1 < len(path) else None
    return _Where(k, ctx.chunk_layers[k], prev_stage, next_stage, sum(len(r) for r in st.layers[:a.chunk]),
                  a.microbatch == st.last_mb.get(a.chunk))



def _emit_action(ctx: _Ctx, em: _Emitter, st: _Stage, a, p2p: bool = True) -> None:
    """The ops of compute action ``a``; with ``p2p`` also its receive before and send after
    (the plain rule of :mod:`workloads.schedules.comm`)."""
    w = _where(ctx, st, a)
    if a.kind == ActionKind.F:
        _emit_forward(ctx, em, st, a, w, p2p)
    elif a.kind in (ActionKind.B, ActionKind.BW):
        _emit_backward(ctx, em, st, a, w, p2p)
    elif a.kind == ActionKind.W:
        _emit_wgrad(ctx, em, st, a, w)



def _emit_pair_p2p(ctx: _Ctx, em: _Emitter, st: _Stage, a, receive: bool) -> None:
    """The receive (``receive``) or the send of compute action ``a``, where it has a peer:
    a forward receives activations from the stage before and sends to the stage after; a
    backward receives gradients from the stage after and sends to the stage before."""
    w = _where(ctx, st, a)
    fwd = a.kind == ActionKind.F
    peer = (w.prev_stage if fwd else w.next_stage) if receive else (w.next_stage if fwd else w.prev_stage)
    if peer is None:
        return
    kind = {(True, True): ActionKind.RECV_F, (True, False): ActionKind.SEND_F,
            (False, True): ActionKind.RECV_B, (False, False): ActionKind.SEND_B}[(fwd, receive)]
    _p2p(em, kind, st.index, a.chunk, a.microbatch, w.k, peer, st.act_p2p)



def _emit_forward(ctx: _Ctx, em: _Emitter, st: _Stage, a, w: _Where, p2p: bool) -> None:
    par, chunk, mb = ctx.par, a.chunk, a.microbatch
    if p2p and w.prev_stage is not None:
        _p2p(em, ActionKind.RECV_F, st.index, chunk, mb, w.k, w.prev_stage, st.act_p2p)
    if w.prev_stage is not None:
        _gather_received(ctx, em, mb, chunk, Phase.F)
    if w.k == 0:
        dp_rules(ctx).gather_edge(ctx, em, _embedding_params(ctx), -1, mb, chunk, Phase.F)
        _add_ops(ctx, em, "embedding", Phase.F, OpName.EMBEDDING, mb, chunk)
    for j, layer in enumerate(w.layers):
        dp_rules(ctx).gather_layer(ctx, em, layer, mb, chunk, Phase.F)
        _layer_forward(ctx, em, layer, mb, chunk, st.tokens.get((layer, mb)), Phase.F,
                       _recompute_kind(par, w.first_idx + j, st.num_layers))
    if w.next_stage is None:
        dp_rules(ctx).gather_edge(ctx, em, _output_params(ctx), -1, mb, chunk, Phase.F)
        _add_ops(ctx, em, "output", Phase.F, OpName.OUTPUT_LOSS, mb, chunk)
    elif p2p:
        _p2p(em, ActionKind.SEND_F, st.index, chunk, mb, w.k, w.next_stage, st.act_p2p)



def _emit_backward(ctx: _Ctx, em: _Emitter, st: _Stage, a, w: _Where, p2p: bool) -> None:
    """A backward action: input gradients, and with ``BW`` the weight gradients too (whose
    last micro-batch fills the gradient buckets)."""
    par, chunk, mb = ctx.par, a.chunk, a.microbatch
    with_w = a.kind == ActionKind.BW
    fill = with_w and (w.is_last_mb or _grads_sharded(par))
    if w.next_stage is not None:
        if p2p:
            _p2p(em, ActionKind.RECV_B, st.index, chunk, mb, w.k, w.next_stage, st.act_p2p)
        _gather_received(ctx, em, mb, chunk, Phase.B)
    else:
        dp_rules(ctx).gather_edge(ctx, em, _output_params(ctx), -1, mb, chunk, Phase.B)
        _add_ops(ctx, em, "output", Phase.B, OpName.OUTPUT_LOSS_BWD, mb, chunk)
        if with_w:
            _add_ops(ctx, em, "output", Phase.W, OpName.OUTPUT_WGRAD, mb, chunk)
            if fill:
                st.buckets.ready([], chunk, _output_params(ctx))
    for j, layer in reversed(list(enumerate(w.layers))):
        dp_rules(ctx).gather_layer(ctx, em, layer, mb, chunk, Phase.B)
        _layer_backward(ctx, em, layer, mb, chunk, st.tokens.get((layer, mb)),
                        _recompute_kind(par, w.first_idx + j, st.num_layers), with_w)
        if fill:
            st.buckets.ready([layer], chunk)
    if w.k == 0 and with_w:
        dp_rules(ctx).gather_edge(ctx, em, _embedding_params(ctx), -1, mb, chunk, Phase.B)
        _add_ops(ctx, em, "embedding", Phase.W, OpName.EMBEDDING_WGRAD, mb, chunk)
        if fill:
            st.buckets.ready([], chunk, _embedding_params(ctx))
    if p2p and w.prev_stage is not None:
        _p2p(em, ActionKind.SEND_B, st.index, chunk, mb, w.k, w.prev_stage, st.act_p2p)
    if fill:
        st.buckets.flush_all(chunk)



def _emit_wgrad(ctx: _Ctx, em: _Emitter, st: _Stage, a, w: _Where) -> None:
    """A zero-bubble weight-gradient action (W)."""
    par, chunk, mb = ctx.par, a.chunk, a.microbatch
    w = w._replace(is_last_mb=w.is_last_mb or _grads_sharded(par))
    if w.next_stage is None:
        _add_ops(ctx, em, "output", Phase.W, OpName.OUTPUT_WGRAD, mb, chunk)
        if w.is_last_mb:
            st.buckets.ready([], chunk, _output_params(ctx))
    for j, layer in reversed(list(enumerate(w.layers))):
        _layer_wgrad(ctx, em, layer, mb, chunk, st.tokens.get((layer, mb)),
                     _recompute_kind(par, w.first_idx + j, st.num_layers))
        if w.is_last_mb:
            st.buckets.ready([layer], chunk)
    if w.k == 0:
        _add_ops(ctx, em, "embedding", Phase.W, OpName.EMBEDDING_WGRAD, mb, chunk)
        if w.is_last_mb:
            st.buckets.ready([], chunk, _embedding_params(ctx))
    if w.is_last_mb:
        st.buckets.flush_all(chunk)



def _last_microbatches(sched, stage) -> dict[int, int]:
    """Per chunk of ``stage``: the micro-batch whose weight gradient comes last."""
    last: dict[int, int] = {}
    for a in sched.actions[stage]:
        if a is None:
            continue
        for h in (a.halves() if a.kind == ActionKind.FB else [a]):
            if h.kind in (ActionKind.W, ActionKind.BW):
                last[h.chunk] = h.microbatch
    return last



def _add_ops(ctx, em, edge: str, phase, name, mb, chunk):
    """One compute op for the ``phase`` ops of the ``embedding`` or the ``output`` layer."""
    key = ("edge", edge, phase)
    hit = ctx.seg_cache.get(key)
    if hit is None:
        ops = embedding_ops(ctx.model, ctx.par, ctx.mbs, ctx.seq) if edge == "embedding" else \
            output_ops(ctx.model, ctx.par, ctx.mbs, ctx.seq, fused_cross_entropy=ctx.fusion.cross_entropy_fused)
        sel = [o for o in ops if o.phase == phase]
        hit = ctx.seg_cache[key] = (float(sum(o.flops for o in sel)), float(np.sum(ctx.compute.op_times_s(sel))),
                                    *_host_of(ctx, sel)) if sel else ()
    if hit:
        em.compute(name, -1, mb, chunk, phase, *hit)



