"""Context-parallel variants (``parallel.cp_comm_type``), MLA under CP and the sequential
split what-if: the ops each variant emits against Transformer Engine's
``context_parallel.py``, and the per-rank causal work against its closed form."""

import numpy as np
import pytest

from topologies import ConfigError, get_gpu_spec
from workloads import ParallelConfig, from_megatron_args, load_model
from workloads.ops import OpName
from workloads.program import build_program
from workloads.stacks.megatron_te.context_parallel import _kv_bytes, cp_block_shares

H100 = get_gpu_spec("H100-SXM")
SEQ = 8192


def _prog(cp_comm_type="p2p", cp=4, tp=1, model="llama3-8b", **kw):
    m = load_model(model)
    par = ParallelConfig(tp=tp, cp=cp, dp=1, pp=1, seq_len=SEQ, cp_comm_type=cp_comm_type,
                         sequence_parallel=tp > 1, **kw)
    return build_program(m, par, H100)


def _layer_ops(prog, cls=0, layer=0, phase=None):
    return [o for o in prog.classes[cls].ops if o.layer == layer and o.microbatch == 0
            and (phase is None or o.phase == phase)]


def _kv_chunk(prog):
    class _C:  # the context _kv_bytes reads
        model, par = prog.model, prog.parallel
    return _kv_bytes(_C) * SEQ / prog.parallel.cp


def test_p2p_is_the_default_and_runs_a_ring_of_hops_each_before_one_block():
    assert ParallelConfig().cp_comm_type == "p2p"
    p = _prog("p2p", cp=4)
    f = _layer_ops(p, phase="F")
    names = [o.name for o in f]
    # cp - 1 forward hops, each posted just before a core-attention block (hop i+1 in
    # flight while block i computes), the last block without one
    i = names.index(OpName.CORE_ATTN) - 1
    assert names[i:i + 7] == [OpName.CP_HOP, OpName.CORE_ATTN] * 3 + [OpName.CORE_ATTN]
    hops = [o for o in f if o.name == OpName.CP_HOP]
    assert len(hops) == 3 and all(o.size_bytes == pytest.approx(_kv_chunk(p)) for o in hops)
    # every hop goes to the next CP rank only
    m = p.a2a_sizes[hops[0].tag]
    assert np.count_nonzero(m) == 4 and all(m[i, (i + 1) % 4] > 0 for i in range(4))
    # the backward circulates K/V and dK/dV: cp hops of kv, 2kv, 2kv, kv -- twice the forward
    b = [o for o in _layer_ops(p, phase="B") if o.name == OpName.CP_HOP_BWD]
    assert [o.size_bytes / _kv_chunk(p) for o in b] == pytest.approx([1, 2, 2, 1])
    assert sum(o.size_bytes for o in b) == pytest.approx(2 * sum(o.size_bytes for o in hops))
    assert not [o for o in p.classes[0].ops if o.name in (OpName.CP_KV, OpName.CP_DKV)]


def test_zigzag_blocks_are_equal_and_sum_to_the_balanced_work():
    p = _prog("p2p", cp=4)
    ag = _prog("all_gather", cp=4)
    blocks = [o for o in _layer_ops(p, phase="F") if o.name == OpName.CORE_ATTN]
    whole = [o for o in _layer_ops(ag, phase="F") if o.name == OpName.CORE_ATTN]
    assert len(blocks) == 4 and len(whole) == 1
    assert all(o.flops == pytest.approx(blocks[0].flops) for o in blocks)
    assert sum(o.flops for o in blocks) == pytest.approx(whole[0].flops)


def test_all_gather_gathers_kv_before_and_reduce_scatters_dkv_after():
    p = _prog("all_gather", cp=4)
    f = [o.name for o in _layer_ops(p, phase="F")]
    assert f.index(OpName.CP_KV) + 1 == f.index(OpName.CORE_ATTN)
    b = [o for o in _layer_ops(p, phase="B")]
    names = [o.name for o in b]
    assert names.index(OpName.CP_KV_BWD) < names.index(OpName.CORE_ATTN_BWD) < names.index(OpName.CP_DKV)
    kv = next(o for o in b if o.name == OpName.CP_KV_BWD)
    assert kv.coll == "all_gather" and kv.size_bytes == pytest.approx(4 * _kv_chunk(p))


def test_a2a_moves_qkv_before_and_the_output_after():
    p = _prog("a2a", cp=4)
    m = p.model
    f = _layer_ops(p, phase="F")
    names = [o.name for o in f]
    assert names.index(OpName.CP_A2A_QKV) < names.index(OpName.CORE_ATTN) < names.index(OpName.CP_A2A_OUT)
    tokens = SEQ / 4
    qkv = next(o for o in f if o.name == OpName.CP_A2A_QKV)
    out = next(o for o in f if o.name == OpName.CP_A2A_OUT)
    d = m.head_dim
    assert qkv.size_bytes == pytest.approx(tokens * (m.num_attention_heads + 2 * m.num_kv_heads) * d * 2)
    assert out.size_bytes == pytest.approx(tokens * m.num_attention_heads * d * 2)
    b = [o.name for o in _layer_ops(p, phase="B")]
    assert b.index(OpName.CP_A2A_DOUT) < b.index(OpName.CORE_ATTN_BWD) < b.index(OpName.CP_A2A_DQKV)


def test_a2a_refuses_heads_per_tp_rank_not_divisible_by_cp():
    # Transformer Engine: "cp_comm_type='a2a' requires num_heads % cp_size == 0 for Q, K, V"
    # (the heads one TP rank holds): llama3-8b has 8 KV heads, 2 per rank at TP 4
    with pytest.raises(ConfigError, match="cp_comm_type.*KV heads per TP rank \\(2\\).*all-to-all CP size 4"):
        _prog("a2a", cp=4, tp=4)
    _prog("a2a", cp=2, tp=4)          # 2 KV heads per rank over 2: fine
    _prog("p2p", cp=4, tp=4)          # the ring has no such rule


def test_a2a_p2p_needs_its_sizes_and_rings_over_blocks():
    with pytest.raises(ConfigError, match="hierarchical_context_parallel_sizes"):
        ParallelConfig(cp=4, cp_comm_type="a2a+p2p").check()
    with pytest.raises(ConfigError, match="product cp = 4"):
        ParallelConfig(cp=4, cp_comm_type="a2a+p2p", hierarchical_context_parallel_sizes=(2, 4)).check()
    with pytest.raises(ConfigError, match="cp_comm_type"):
        ParallelConfig(cp=4, cp_comm_type="ring").check()
    p = _prog("a2a+p2p", cp=4, hierarchical_context_parallel_sizes=(2, 2))
    f = _layer_ops(p, phase="F")
    hops = [o for o in f if o.name == OpName.CP_HOP]
    assert len(hops) == 1 and hops[0].size_bytes == pytest.approx(_kv_chunk(p))
    ring = p.a2a_sizes[hops[0].tag]            # to the same a2a rank of the next block
    assert all(ring[i, (i + 2) % 4] > 0 for i in range(4)) and np.count_nonzero(ring) == 4
    a2a = p.a2a_sizes[next(o for o in f if o.name == OpName.CP_A2A_QKV).tag]
    assert np.count_nonzero(a2a) == 8 and a2a[0, 1] > 0 and a2a[0, 2] == 0     # inside blocks of 2


def test_megatron_cp_comm_type_flag():
    base = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 4096 --vocab-size 32000 "
            "--context-parallel-size 4 ")
    _, par = from_megatron_args(base, num_gpus=4)
    assert par.cp_comm_type == "p2p"
    _, par = from_megatron_args(base + "--cp-comm-type allgather", num_gpus=4)
    assert par.cp_comm_type == "all_gather"
    _, par = from_megatron_args(base + "--cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 2",
                                num_gpus=4)
    assert par.cp_comm_type == "a2a+p2p" and par.hierarchical_context_parallel_sizes == (2, 2)
    with pytest.raises(ConfigError, match="--cp-comm-type"):
        from_megatron_args(base + "--cp-comm-type p2p a2a p2p a2a", num_gpus=4)


def test_mla_exchanges_per_head_k_and_v_not_the_latent():
    """DeepSeek-V3 at TP 1: 128 heads x (192 + 128) per token against the 512 + 64 latent."""
    m = load_model("deepseek-v3")

    class _C:
        model, par = m, ParallelConfig(tp=1, cp=2)

    per_head = m.num_attention_heads * (m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim + m.mla.v_head_dim) * 2
    latent = (m.mla.kv_lora_rank + m.mla.qk_rope_head_dim) * 2
    assert _kv_bytes(_C) == per_head
    assert _kv_bytes(_C) / latent == pytest.approx(40960 / 576)        # about 71x


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_sequential_split_follows_the_causal_triangle(cp):
    """Rank r of a sequential split does (2r + 1) / cp^2 of the whole causal attention
    (its queries see the r earlier chunks in full and its own chunk's triangle); zigzag
    gives every rank 1 / cp."""
    shares = [sum(cp_block_shares("sequential", cp, r)) for r in range(cp)]
    assert [s / cp for s in shares] == pytest.approx([(2 * r + 1) / cp ** 2 for r in range(cp)])
    assert sum(cp_block_shares("zigzag", cp, 0)) == pytest.approx(1.0)
    # in the program: one class per CP rank, core-attention FLOPs in those ratios
    p = _prog("p2p", cp=cp, cp_split="sequential")
    z = _prog("p2p", cp=cp)
    assert len(p.classes) == cp and len(z.classes) == 1
    total = cp * sum(o.flops for o in _layer_ops(z, phase="F") if o.name == OpName.CORE_ATTN)
    for c in p.classes:
        r = p.grid.coords(c.members[0])["cp"]
        mine = sum(o.flops for o in _layer_ops(p, cls=c.class_id, phase="F") if o.name == OpName.CORE_ATTN)
        assert mine / total == pytest.approx((2 * r + 1) / cp ** 2)


def test_sequential_split_is_balanced_under_a2a():
    p = _prog("a2a", cp=4, cp_split="sequential")
    assert len(p.classes) == 1


def test_memory_follows_the_cp_variant():
    from workloads import memory_estimate
    from workloads.memory import cp_buffer_bytes
    m = load_model("llama3-8b")
    par = lambda kind, **kw: ParallelConfig(tp=1, cp=4, dp=1, seq_len=SEQ, cp_comm_type=kind, **kw)
    c = SEQ / 4 * 2 * m.num_kv_heads * m.head_dim * 2          # this rank's K and V
    q = SEQ / 4 * m.num_attention_heads * m.head_dim * 2
    assert cp_buffer_bytes(m, par("p2p")) == pytest.approx(4 * c)              # 2 x [kv, dkv] in flight
    assert cp_buffer_bytes(m, par("all_gather")) == pytest.approx(2 * 4 * c)   # whole-sequence K/V and dK/dV
    assert cp_buffer_bytes(m, par("a2a")) == pytest.approx(2 * (q + c))
    assert cp_buffer_bytes(m, ParallelConfig(tp=1, cp=1, dp=1, seq_len=SEQ)) == 0.0
    est = {k: memory_estimate(m, par(k)) for k in ("p2p", "all_gather", "a2a")}
    assert est["all_gather"].total_bytes - est["p2p"].total_bytes == pytest.approx(4 * c)
    assert est["a2a"].terms()["cp_buffers"] == est["a2a"].cp_buffers_bytes > 0
    # MLA: the per-head K and V, 71x the latent per token
    ds = load_model("deepseek-v3")
    assert cp_buffer_bytes(ds, ParallelConfig(tp=1, cp=2, dp=1, ep=1, seq_len=SEQ)) == pytest.approx(
        4 * SEQ / 2 * 128 * (192 + 128) * 2)


def test_sequential_split_recompute_follows_the_triangle_too():
    """Selective recompute of core attention (Megatron-Core's default) re-runs this rank's
    share of the causal work."""
    seq = _prog("p2p", cp=4, cp_split="sequential")
    zig = _prog("p2p", cp=4)
    rec = lambda p, c: sum(o.flops for o in _layer_ops(p, cls=c, phase="R") if o.name == OpName.RECOMPUTE_ATTN)
    core = sum(o.flops for o in _layer_ops(zig, phase="F") if o.name == OpName.CORE_ATTN)
    assert core > 0 and rec(zig, 0) >= core
    for c in seq.classes:
        r = seq.grid.coords(c.members[0])["cp"]
        assert rec(seq, c.class_id) - rec(zig, 0) == pytest.approx(core * ((2 * r + 1) / 4 - 1))


@pytest.mark.parametrize("kind", ["p2p", "all_gather", "a2a"])
def test_hybrid_attention_layers_exchange_by_the_variant_and_keep_their_work(kind):
    """A hybrid stack's attention layer runs the same CP exchange as a transformer layer, and
    its compute (pre, core blocks, post) adds up to the layer's ops whatever the variant."""
    from workloads.costs import layer_ops
    m = load_model("nemotron3-nano")
    attn = next(i for i in range(m.num_layers) if m.layer_kind(i) == "attention")
    par = ParallelConfig(tp=1, cp=2, dp=1, seq_len=SEQ, cp_comm_type=kind, recompute="none")
    p = build_program(m, par, H100)
    ops = _layer_ops(p, layer=attn)
    names = {o.name for o in ops}
    expect = {"p2p": OpName.CP_HOP, "all_gather": OpName.CP_KV, "a2a": OpName.CP_A2A_QKV}[kind]
    assert expect in names and OpName.CORE_ATTN in names
    want = sum(o.flops for o in layer_ops(m, par, attn, 1, SEQ) if o.phase == "F")
    assert sum(o.flops for o in ops if o.phase == "F" and o.kind == "compute") == pytest.approx(want)
