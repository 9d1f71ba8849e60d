"""One layer's lowering: each of its blocks (:func:`workloads.blocks.layer_blocks`) with the
tensor-, context- and expert-parallel collectives around it, forward, recomputed forward,
backward and weight gradients."""

from __future__ import annotations

from ...blocks import layer_blocks
from ...ops import Coll, Group, OpName, Phase, Stream
from ...parallel import ParallelConfig

from .context import _NOSEG, _segments
from .context_parallel import _cp_attention, _cp_work_share, _mamba_cp_bytes
from .moe import _emit_dispatch_sync, _ep_comm, _expert_tp, _preprocess_calls


_RECOMPUTE_PARTS = (("attn", OpName.RECOMPUTE_ATTN), ("mlp", OpName.RECOMPUTE_MLP), ("pre", OpName.RECOMPUTE_PRE),
                    ("post", OpName.RECOMPUTE_POST))
"""Selective recompute: the segment of each part recomputed ahead of the backward, and its op."""



def _tp_sizes(ctx, layer: int) -> tuple[float, float, bool]:
    """``(gathered bytes, activation bytes, sequence parallel?)`` of one block's TP
    collectives in ``layer``.  Transformer Engine quantises before it gathers under a
    low-precision recipe (``gather_along_first_dim`` with the quantiser: the forward input of
    a column-parallel linear in ``linear.py``, the output gradient of a row-parallel one in
    ``base.py`` ``grad_output_preprocess``), so both all-gathers move the recipe's format in
    the layers it quantises; reduce-scatters and all-reduces move BF16."""
    par, model = ctx.par, ctx.model
    tokens = ctx.mbs * ctx.seq / par.cp
    act = tokens * model.hidden_size * 2.0
    low = ctx.recipe.is_low_precision_layer(layer, ctx.model.num_layers)
    gathered = tokens * model.hidden_size * ctx.recipe.tp_gather_bytes_per_element if low else act
    return gathered, act, par.sequence_parallel and par.tp > 1



def _tp_forward_collectives(ctx, em, layer, mb, chunk, phase):
    """``(tp_in, tp_out)``: the forward's tensor-parallel collectives around one block, as
    Megatron places them: with sequence parallelism an all-gather of the (quantised) input
    before and a reduce-scatter of the output after; without it an all-reduce after."""
    par = ctx.par
    tp_bytes, act_bytes, sp = _tp_sizes(ctx, layer)

    def tp_in():
        if sp:
            em.coll(Stream.TP, Coll.ALL_GATHER, Group.TP, tp_bytes, OpName.SP_AG, layer, mb, chunk, phase)

    def tp_out():
        if sp:
            em.coll(Stream.TP, Coll.REDUCE_SCATTER, Group.TP, act_bytes, OpName.SP_RS, layer, mb, chunk, phase)
        elif par.tp > 1:
            em.coll(Stream.TP, Coll.ALL_REDUCE, Group.TP, act_bytes, OpName.TP_AR, layer, mb, chunk, phase)

    return tp_in, tp_out



def _layer_forward(ctx, em, layer, mb, chunk, tpe, phase, recompute):
    """Forward (or recomputed forward, phase 'R') of one layer: each of its blocks
    (:func:`workloads.blocks.layer_blocks`) with the collectives around it.  A recomputed
    layer's checkpoint function costs the host once, with the layer's first block."""
    seg = _segments(ctx, layer, tpe, recompute)
    tp = _tp_forward_collectives(ctx, em, layer, mb, chunk, phase)
    host_extra = ctx.host.checkpoint_s if phase == Phase.R else 0.0
    for block in layer_blocks(ctx.model, layer):
        _LOWERING[block.kind][0](ctx, em, seg, layer, mb, chunk, phase, tp, host_extra)
        host_extra = 0.0



def _layer_backward(ctx, em, layer, mb, chunk, tpe, recompute, with_w: bool):
    """Backward of one layer: the recomputation it needs, then its blocks in reverse order
    with the forward's collectives mirrored, then (``with_w``) its weight gradients."""
    seg = _segments(ctx, layer, tpe, recompute)
    if recompute == "full":
        _layer_forward(ctx, em, layer, mb, chunk, tpe, Phase.R, recompute)
    else:
        _selective_recompute(ctx, em, seg, layer, mb, chunk)
    tp = _tp_sizes(ctx, layer)
    for block in reversed(layer_blocks(ctx.model, layer)):
        _LOWERING[block.kind][1](ctx, em, seg, layer, mb, chunk, tp)
    if with_w:
        _layer_wgrad(ctx, em, layer, mb, chunk, tpe, recompute)


# -- each block kind with its collectives ----------------------------------------------------------
def _attention_forward(ctx, em, seg, layer, mb, chunk, phase, tp, host_extra):
    """Attention between the TP collectives, with its CP exchanges (:func:`_cp_attention`)."""
    tp_in, tp_out = tp
    tp_in()
    f, t, hs, k = seg.get("F:attn", _NOSEG)
    em.compute(OpName.ATTN, layer, mb, chunk, phase, f, t, hs + host_extra, k)
    if ctx.par.cp > 1:
        _cp_attention(ctx, em, seg, "F", layer, mb, chunk, phase)
    tp_out()



def _mamba_forward(ctx, em, seg, layer, mb, chunk, phase, tp, host_extra):
    """A Mamba mixer between the TP collectives; with context parallelism in_proj's output
    (z, x, B, C, dt) is transposed from sequence- to head-split before the conv1d and the
    scan's output back after it (Megatron-Core ``MambaContextParallel``, whatever
    ``cp_comm_type`` says)."""
    tp_in, tp_out = tp
    cp = ctx.par.cp > 1
    tp_in()
    if cp:
        em.coll(Stream.CP, Coll.ALL_TO_ALL, Group.CP, _mamba_cp_bytes(ctx, ctx.model.mamba.in_proj_width),
                OpName.CP_MAMBA_A2A, layer, mb, chunk, phase)
    f, t, hs, k = seg.get("F:attn", _NOSEG)
    em.compute(OpName.MAMBA, layer, mb, chunk, phase, f, t, hs + host_extra, k)
    if cp:
        em.coll(Stream.CP, Coll.ALL_TO_ALL, Group.CP, _mamba_cp_bytes(ctx, ctx.model.mamba.d_inner),
                OpName.CP_MAMBA_A2A, layer, mb, chunk, phase)
    tp_out()



def _mlp_forward(ctx, em, seg, layer, mb, chunk, phase, tp, host_extra):
    """A dense MLP between the TP collectives."""
    tp_in, tp_out = tp
    tp_in()
    f, t, hs, k = seg.get("F:mlp", _NOSEG)
    em.compute(OpName.MLP, layer, mb, chunk, phase, f, t, hs + host_extra, k)
    tp_out()



def _moe_forward(ctx, em, seg, layer, mb, chunk, phase, tp, host_extra):
    """The MoE path: router and permutation (``moe_pre``), the dispatcher's host sync, the
    EP dispatch, the experts between the expert-TP collectives, the combine, the
    unpermutation (``moe_post``)."""
    par = ctx.par
    f, t, hs, k = seg.get("F:pre", _NOSEG)
    n = _preprocess_calls(ctx)
    em.compute(OpName.MOE_PRE, layer, mb, chunk, phase, f, t, hs + host_extra + n * ctx.host.call_s, k + n)
    _emit_dispatch_sync(ctx, em, seg, "pre", layer, mb, chunk, phase)
    if par.ep > 1:
        _ep_comm(ctx, em, OpName.EP_DISPATCH, layer, mb, chunk, phase)
        _emit_dispatch_sync(ctx, em, seg, "dispatch", layer, mb, chunk, phase)
    _expert_tp(ctx, em, Coll.ALL_GATHER, OpName.ETP_AG, layer, mb, chunk, phase)
    em.compute(OpName.EXPERTS, layer, mb, chunk, phase, *seg.get("F:mlp", _NOSEG))
    _expert_tp(ctx, em, Coll.REDUCE_SCATTER, OpName.ETP_RS, layer, mb, chunk, phase)
    if par.ep > 1:
        _ep_comm(ctx, em, OpName.EP_COMBINE, layer, mb, chunk, phase)
    em.compute(OpName.MOE_POST, layer, mb, chunk, phase, *seg.get("F:post", _NOSEG))



def _tp_block_backward(ctx, em, layer, mb, chunk, tp, name, part, seg, inner=None) -> None:
    """The backward of a block between TP collectives: the row-parallel output gradient
    gathered and the column-parallel input re-gathered (SP), the block's ``B`` segment
    ``part`` (``inner`` emits what runs around it), the dgrad reduce-scattered (SP) or
    all-reduced."""
    tp_bytes, act_bytes, sp = tp
    if sp:
        em.coll(Stream.TP, Coll.ALL_GATHER, Group.TP, tp_bytes, OpName.SP_AG_DOUT, layer, mb, chunk, Phase.B)
        em.coll(Stream.TP, Coll.ALL_GATHER, Group.TP, tp_bytes, OpName.SP_AG_INPUT, layer, mb, chunk, Phase.B)
    if inner is not None:
        inner(True)
    em.compute(name, layer, mb, chunk, Phase.B, *seg.get(f"B:{part}", _NOSEG))
    if inner is not None:
        inner(False)
    if sp:
        em.coll(Stream.TP, Coll.REDUCE_SCATTER, Group.TP, act_bytes, OpName.SP_RS_DGRAD, layer, mb, chunk, Phase.B)
    elif ctx.par.tp > 1:
        em.coll(Stream.TP, Coll.ALL_REDUCE, Group.TP, act_bytes, OpName.TP_AR_DGRAD, layer, mb, chunk, Phase.B)



def _attention_backward(ctx, em, seg, layer, mb, chunk, tp):
    def cp(before):
        if before and ctx.par.cp > 1:
            _cp_attention(ctx, em, seg, "B", layer, mb, chunk, Phase.B)
    _tp_block_backward(ctx, em, layer, mb, chunk, tp, OpName.ATTN_BWD, "attn", seg, cp)



def _mamba_backward(ctx, em, seg, layer, mb, chunk, tp):
    def cp(before):
        if ctx.par.cp > 1:
            width = ctx.model.mamba.d_inner if before else ctx.model.mamba.in_proj_width
            em.coll(Stream.CP, Coll.ALL_TO_ALL, Group.CP, _mamba_cp_bytes(ctx, width), OpName.CP_MAMBA_A2A_BWD,
                    layer, mb, chunk, Phase.B)
    _tp_block_backward(ctx, em, layer, mb, chunk, tp, OpName.MAMBA_BWD, "attn", seg, cp)



def _mlp_backward(ctx, em, seg, layer, mb, chunk, tp):
    _tp_block_backward(ctx, em, layer, mb, chunk, tp, OpName.MLP_BWD, "mlp", seg)



def _moe_backward(ctx, em, seg, layer, mb, chunk, tp):
    par = ctx.par
    em.compute(OpName.MOE_POST_BWD, layer, mb, chunk, Phase.B, *seg.get("B:post", _NOSEG))
    if par.ep > 1:
        _ep_comm(ctx, em, OpName.EP_COMBINE_BWD, layer, mb, chunk, Phase.B)
    _expert_tp(ctx, em, Coll.ALL_GATHER, OpName.ETP_AG_BWD, layer, mb, chunk, Phase.B)
    em.compute(OpName.EXPERTS_BWD, layer, mb, chunk, Phase.B, *seg.get("B:mlp", _NOSEG))
    _expert_tp(ctx, em, Coll.REDUCE_SCATTER, OpName.ETP_RS_BWD, layer, mb, chunk, Phase.B)
    if par.ep > 1:
        _ep_comm(ctx, em, OpName.EP_DISPATCH_BWD, layer, mb, chunk, Phase.B)
    em.compute(OpName.MOE_PRE_BWD, layer, mb, chunk, Phase.B, *seg.get("B:pre", _NOSEG))



def _gdn_forward(ctx, em, seg, layer, mb, chunk, phase, tp, host_extra):
    """A gated DeltaNet mixer between the TP collectives, as an attention block without CP
    (the block refuses context parallelism)."""
    tp_in, tp_out = tp
    tp_in()
    f, t, hs, k = seg.get("F:attn", _NOSEG)
    em.compute(OpName.GDN, layer, mb, chunk, phase, f, t, hs + host_extra, k)
    tp_out()


def _gdn_backward(ctx, em, seg, layer, mb, chunk, tp):
    _tp_block_backward(ctx, em, layer, mb, chunk, tp, OpName.GDN_BWD, "attn", seg)


_LOWERING = {"attention": (_attention_forward, _attention_backward), "mamba": (_mamba_forward, _mamba_backward),
             "mlp": (_mlp_forward, _mlp_backward), "moe": (_moe_forward, _moe_backward),
             "gated_deltanet": (_gdn_forward, _gdn_backward)}
"""Each block kind's forward and backward with the collectives between its kernels, as
Megatron-Core with Transformer Engine places them."""



def _selective_recompute(ctx, em, seg, layer, mb, chunk) -> None:
    """The selectively recomputed parts of a layer ahead of its backward.  With CP the
    recomputed core attention is this rank's share of the causal work (its exchanges are
    not re-run)."""
    for part, name in _RECOMPUTE_PARTS:
        v = seg.get(f"R:{part}", _NOSEG)
        if part == "attn" and ctx.par.cp > 1:
            c, share = seg.get("R:core", _NOSEG), _cp_work_share(ctx)
            v = (v[0] + c[0] * share, v[1] + c[1] * share, v[2] + c[2], v[3] + c[3])
        em.compute(name, layer, mb, chunk, Phase.R, *v)
        if part == "pre" and "R:permute_s" in seg and "moe" in ctx.par.recompute_modules:
            # the recomputed MoE layer (Megatron-Core's moe_layer_recompute checkpoints the
            # whole forward) runs its dispatcher again, sync included
            _emit_dispatch_sync(ctx, em, seg, "pre", layer, mb, chunk, Phase.R)



def _layer_wgrad(ctx, em, layer, mb, chunk, tpe, recompute):
    seg = _segments(ctx, layer, tpe, recompute)
    parts = [v for k, v in seg.items() if k.startswith("W:")]
    em.compute(OpName.WGRAD, layer, mb, chunk, Phase.W, *(sum(v[i] for v in parts) for i in range(4)))



def _recompute_kind(par: ParallelConfig, index_in_stage: int, layers_in_stage: int) -> str:
    if par.recompute != "full":
        return par.recompute
    n = par.recompute_num_layers
    if n is None or n >= layers_in_stage:
        return "full"
    if par.recompute_method == "block":
        return "full" if index_in_stage < n else "none"
    return "full"          # uniform: every layer recomputes, in groups of n (same work)
