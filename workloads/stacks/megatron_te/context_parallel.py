"""Context-parallel lowering as Transformer Engine's ``context_parallel.py`` runs it: the
K/V ring, all-gather, all-to-all (Ulysses) and hierarchical variants around core attention,
and a Mamba layer's head-transposing all-to-all."""

from __future__ import annotations

import numpy as np
from topologies import ConfigError

from ...ops import Coll, Group, OpName, Phase, Stream

from .context import _NOSEG



def _mamba_cp_bytes(ctx, width: int) -> float:
    """Bytes one rank sends and receives in a Mamba layer's CP all-to-all: its ``T / cp``
    tokens x ``width / tp`` channels, BF16."""
    return ctx.mbs * ctx.seq / ctx.par.cp * width / ctx.par.tp * 2.0



def _kv_bytes(ctx) -> float:
    """Bytes of K and V per token of one TP rank's heads (bf16).

    MLA exchanges the keys and values attention consumes, materialised per head by the
    up-projection -- ``heads/tp x (qk_head_dim + v_head_dim)`` per token -- not the
    compressed latent: Megatron-Core's ``MLASelfAttention`` up-projects K and V before it
    calls Transformer Engine's ``DotProductAttention``, whose CP exchange moves its ``k`` and
    ``v`` inputs (``context_parallel.py``, ``AttnFuncWithCPAndKVP2P``)."""
    m, par = ctx.model, ctx.par
    if m.mla is not None:
        heads = m.num_attention_heads // par.tp
        return heads * (m.mla.qk_head_dim + m.mla.v_head_dim) * 2.0
    kv_heads = max(m.num_kv_heads // par.tp, 1)
    return 2 * kv_heads * m.head_dim * 2.0



def mla_cp_bytes_per_token(model, tp: int) -> tuple[float, float]:
    """(per-head K and V, latent) bytes per token and layer one TP rank's CP exchange moves
    for an MLA model (bf16): ``heads/tp x (qk_head_dim + v_head_dim) x 2`` as Megatron-Core
    and Transformer Engine exchange them (:func:`_kv_bytes`), against the ``cp_mla_latent``
    what-if's ``(kv_lora_rank + qk_rope_head_dim) x 2``: the compressed latent and the
    decoupled RoPE key, shared by every head (so not divided over TP).

    >>> from workloads import load_model
    >>> mla_cp_bytes_per_token(load_model("deepseek-v3"), 1)       # 128 x (192 + 128) x 2, (512 + 64) x 2
    (81920.0, 1152.0)
    """
    m = model.mla
    heads = model.num_attention_heads // tp
    return heads * (m.qk_head_dim + m.v_head_dim) * 2.0, (m.kv_lora_rank + m.qk_rope_head_dim) * 2.0


def check_cp_mla_latent(model, par, where: str = "whatif.cp_mla_latent") -> bool:
    """The ``cp_mla_latent`` what-if needs an MLA model, context parallelism and an exchange
    that moves K/V (``p2p`` ring or ``all_gather``); ConfigError naming the rule otherwise,
    else True."""
    if model.mla is None:
        raise ConfigError(where, True, f"needs a model with multi-head latent attention (an 'mla' section, "
                          f"as DeepSeek-V3's); {model.name} has per-head K/V only")
    if par.cp <= 1:
        raise ConfigError(where, True, f"needs context parallelism (parallel.cp > 1); cp = {par.cp}")
    if par.cp_comm_type not in ("p2p", "all_gather"):
        raise ConfigError(where, True, f"applies to the exchanges that move K/V, cp_comm_type p2p or all_gather; "
                          f"'{par.cp_comm_type}' splits heads")
    return True


def _qkv_out_bytes(ctx) -> tuple[float, float]:
    """(Q, K and V ; output) bytes per token of one TP rank's heads (bf16): what the a2a
    (Ulysses) exchange moves before and after core attention."""
    m, par = ctx.model, ctx.par
    heads = m.num_attention_heads // par.tp
    if m.mla is not None:
        return heads * m.mla.qk_head_dim * 2.0 + _kv_bytes(ctx), heads * m.mla.v_head_dim * 2.0
    return heads * m.head_dim * 2.0 + _kv_bytes(ctx), heads * m.head_dim * 2.0



def cp_block_shares(cp_split: str, ring: int, pos: int) -> list[float]:
    """The share of a rank's (zigzag-balanced) core-attention work in each ring step.

    Causal attention over a ring of ``ring`` ranks, rank ``pos`` of it.  ``zigzag``
    (Megatron-Core / Transformer Engine: 2 x ring chunks, rank r holding chunks r and
    2 ring - 1 - r): every step does the same work, ``1/ring`` each (TE's
    ``AttnFuncWithCPAndKVP2P``: the diagonal step runs causal on both local chunks, the
    others half of the block).  ``sequential`` (a what-if): rank r holds the r-th
    contiguous chunk; step 0 is the causal diagonal block (half a block), steps 1..r full
    blocks of earlier keys, later steps nothing -- ``(2r + 1) / ring`` of the balanced work
    in all, i.e. ``(2r + 1) / ring^2`` of the whole causal attention.  Shares are relative
    to the balanced per-rank work (they sum to 1 under zigzag)."""
    if cp_split == "zigzag" or ring == 1:
        return [1.0 / ring] * ring
    return [1.0 / ring if i == 0 else (2.0 / ring if i <= pos else 0.0) for i in range(ring)]



def _ring_matrix(n: int, step: int, nbytes: float) -> np.ndarray:
    """Bytes member i sends to member (i + step) mod n: one hop of a ring (an all-to-all
    whose only pairs are ring neighbours, so the network carries exactly the hop)."""
    m = np.zeros((n, n))
    for i in range(n):
        m[i, (i + step) % n] = nbytes
    return m



def _block_matrix(n: int, a: int, nbytes: float) -> np.ndarray:
    """An all-to-all within consecutive blocks of ``a`` members, ``nbytes`` per member split
    evenly over its block (the a2a part of a2a+p2p, over the CP group)."""
    m = np.zeros((n, n))
    for i in range(n):
        b = (i // a) * a
        m[i, b:b + a] = nbytes / a
    return m



def _cp_attention(ctx, em, seg, src, layer, mb, chunk, phase) -> None:
    """Core attention under context parallelism with its exchanges, as the variant
    (``parallel.cp_comm_type``) runs it in Transformer Engine's ``context_parallel.py``:

    * ``p2p`` (ring attention, ``AttnFuncWithCPAndKVP2P``): the forward runs ``cp`` blocks
      of core attention and posts the next K/V hop before each block but the last, so hop
      ``i + 1`` is in flight while block ``i`` computes (double buffered); the backward
      runs ``cp`` blocks and before each posts a hop carrying K/V (step 0), K/V and the
      dK/dV accumulated so far (steps 1..cp-2) or dK/dV alone (step cp-1): about twice
      the forward's bytes.
    * ``all_gather`` (``AttnFuncWithCPAndKVAllGather``): K/V all-gathered before core
      attention, not overlapped; the backward gathers them again and reduce-scatters dK/dV.
    * ``a2a`` (Ulysses, ``AttnFuncWithCPAndQKVOA2A``): Q, K, V all-to-all from sequence-
      to head-split before, the output back after; the backward does dO before and dQ,
      dK, dV after.  Each rank then runs the whole sequence for ``heads / cp`` heads.
    * ``a2a+p2p``: the all-to-all inside blocks of ``a2a size`` adjacent CP ranks, then
      the ring across blocks (``p2p size`` steps; TE's ``send_dst`` is the same a2a rank
      of the next block).

    Every exchange is a collective on the CP group; a hop is an all-to-all whose only
    pairs are ring neighbours (:func:`_ring_matrix`, sizes in ``Program.a2a_sizes``).
    """
    par = ctx.par
    kind = par.cp_comm_type
    a2a, ring = par.cp_sizes()
    bwd = phase == Phase.B
    core = seg.get(f"{src}:core", _NOSEG)
    post = seg.get(f"{src}:attn_post", _NOSEG)
    tokens = ctx.mbs * ctx.seq / par.cp          # this rank's tokens
    kv_chunk = _kv_bytes(ctx) * tokens           # its K and V (after an a2a: the same bytes)
    if ctx.cp_mla_latent:                        # what-if: MLA's latent and RoPE key instead
        kv_chunk = mla_cp_bytes_per_token(ctx.model, par.tp)[1] * tokens
    up = _latent_up(ctx, seg, bwd)
    qkv_b, out_b = (x * tokens for x in _qkv_out_bytes(ctx))
    core_name = OpName.CORE_ATTN_BWD if bwd else OpName.CORE_ATTN
    if bwd:
        em.compute(OpName.ATTN_OUT_BWD, layer, mb, chunk, phase, *post)
    # the work of this rank: balanced by zigzag; a sequential split (what-if) follows the
    # causal triangle over the ring (the all-to-all part splits heads, not the sequence)
    shares = cp_block_shares(par.cp_split, ring, ctx.cp_pos)
    if a2a > 1:
        tag = _a2a_tag(ctx, a2a, ring, out_b if bwd else qkv_b)
        em.coll(Stream.CP, Coll.ALL_TO_ALL, Group.CP, out_b if bwd else qkv_b,
                OpName.CP_A2A_DOUT if bwd else OpName.CP_A2A_QKV, layer, mb, chunk, phase, tag=tag)
    if kind == "all_gather":
        em.coll(Stream.CP, Coll.ALL_GATHER, Group.CP, kv_chunk * par.cp, OpName.CP_KV_BWD if bwd else OpName.CP_KV,
                layer, mb, chunk, phase)
        _latent_block(em, up, layer, mb, chunk, phase, par.cp - 1)
        _core_block(em, core_name, layer, mb, chunk, phase, core, sum(shares), 1.0)
        if bwd:
            em.coll(Stream.CP, Coll.REDUCE_SCATTER, Group.CP, kv_chunk * par.cp, OpName.CP_DKV, layer, mb, chunk,
                    phase)
    elif ring > 1:
        for i, share in enumerate(shares):
            if bwd:
                size = kv_chunk if i in (0, ring - 1) else 2 * kv_chunk
            else:
                size = kv_chunk if i < ring - 1 else 0.0
            if i > 0:
                _latent_block(em, up, layer, mb, chunk, phase, 1)
            if size > 0:
                tag = ("cp_ring", a2a, size)
                if tag not in ctx.a2a_sizes:
                    ctx.a2a_sizes[tag] = _ring_matrix(par.cp, a2a, size)
                em.coll(Stream.CP, Coll.ALL_TO_ALL, Group.CP, size, OpName.CP_HOP_BWD if bwd else OpName.CP_HOP,
                        layer, mb, chunk, phase, tag=tag)
            _core_block(em, core_name, layer, mb, chunk, phase, core, share, 1.0 / ring)
    else:
        _core_block(em, core_name, layer, mb, chunk, phase, core, 1.0, 1.0)
    if a2a > 1:
        tag = _a2a_tag(ctx, a2a, ring, qkv_b if bwd else out_b)
        em.coll(Stream.CP, Coll.ALL_TO_ALL, Group.CP, qkv_b if bwd else out_b,
                OpName.CP_A2A_DQKV if bwd else OpName.CP_A2A_OUT, layer, mb, chunk, phase, tag=tag)
    if not bwd:
        em.compute(OpName.ATTN_OUT, layer, mb, chunk, phase, *post)



def _latent_up(ctx, seg, bwd: bool):
    """The ``cp_mla_latent`` what-if's extra work per received chunk, ``(FLOPs, seconds, host
    seconds, kernels)``, or None without the what-if: the up-projection of its latent to
    per-head K/V (a chunk holds as many tokens as the rank's own); in the backward the
    up-projection again (nothing up-projected is kept across the ring), its data gradient
    back to the latent (what the ring then carries to the chunk's owner) and its weight
    gradient.  The rank's own chunk is up-projected once, as without the what-if."""
    if not ctx.cp_mla_latent:
        return None
    parts = [seg.get(f"latent_up:{p}", _NOSEG) for p in (("F", "B", "W") if bwd else ("F",))]
    return tuple(sum(p[i] for p in parts) for i in range(4))


def _latent_block(em, up, layer, mb, chunk, phase, n: int) -> None:
    """``n`` received chunks' share of :func:`_latent_up`, one compute op (before the hop is
    posted, so the hop overlaps the core-attention block only)."""
    if up is None or n <= 0:
        return
    f, t, hs, k = up
    em.compute(OpName.CP_LATENT_UP_BWD if phase == Phase.B else OpName.CP_LATENT_UP, layer, mb, chunk, phase,
               f * n, t * n, hs * n, k * n)


def _cp_work_share(ctx) -> float:
    """This rank's core-attention work relative to the balanced share (1 under zigzag and
    for a2a; ``(2r + 1) / ring`` at ring position r of a sequential split)."""
    return sum(cp_block_shares(ctx.par.cp_split, ctx.par.cp_sizes()[1], ctx.cp_pos))



def _a2a_tag(ctx, a2a: int, ring: int, nbytes: float):
    """The sizes tag of an a2a over the CP group: None (an even split) for plain a2a; for
    a2a+p2p the block matrix of its inner groups."""
    if ring == 1:
        return None
    tag = ("cp_a2a", a2a, nbytes)
    if tag not in ctx.a2a_sizes:
        ctx.a2a_sizes[tag] = _block_matrix(ctx.par.cp, a2a, nbytes)
    return tag



def _core_block(em, name, layer, mb, chunk, phase, core, share, kernel_share) -> None:
    """One block of core attention: ``share`` of the rank's balanced work (FLOPs and time
    scale with it) and ``kernel_share`` of its kernels."""
    f, t, hs, k = core
    if share <= 0:
        return
    em.compute(name, layer, mb, chunk, phase, f * share, t * share, hs * kernel_share,
               max(int(round(k * kernel_share)), 1 if k else 0))
