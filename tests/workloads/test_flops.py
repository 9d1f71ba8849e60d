"""Executed FLOPs per op and model FLOPs by convention: closed forms, hand derivations, invariants."""

import dataclasses
import math

import pytest

from topologies import ConfigError
from workloads.costs.flops import (ATTN_BLOCK_SIZE, FLOP_CONVENTIONS, ComputeOp, balanced_tokens_per_expert,
                                   capacity_tokens_per_expert, causal_executed_fraction, embedding_ops,
                                   gemm_role, get_flop_convention, layer_ops, model_flops_per_step,
                                   model_flops_per_token, optimizer_ops, output_ops, padded_vocab_size, sum_flops,
                                   window_executed_fraction)
from workloads.model_loading import load_model
from workloads.parallel import ParallelConfig

NO_RECOMPUTE = ParallelConfig(recompute="none")


def rel(a, b):
    return abs(a - b) / abs(b)


# -- conventions: closed forms and hand-computed values ------------------------------------------
def test_registry_names_and_unknown():
    assert set(FLOP_CONVENTIONS) == {"megatron_2021", "narayanan_eq3", "nemo_24", "megatron_core_2025", "palm_6n"}
    with pytest.raises(ConfigError, match="megatron_core_2025"):
        get_flop_convention("mfu_magic")
    with pytest.raises(ConfigError, match="known"):
        model_flops_per_step(load_model("tiny-dense"), 8, convention="bogus")


def test_megatron_2021_equals_closed_form_exactly():
    # Narayanan et al. SC'21 count without recomputation: 72 B s L h^2 (1 + s/6h + V/(12 h L))
    m = load_model("gpt3-175b")
    B, s, L, h, V = 1536, 2048, 96, 12288, 50257
    closed = 72 * B * s * L * h ** 2 * (1 + s / (6 * h) + V / (12 * h * L))
    assert model_flops_per_step(m, B, s, "megatron_2021") == pytest.approx(closed, rel=1e-14)
    # the logits term is 6 B s h V, the transformer term 3/4 of eq. (3)'s
    assert 72 * B * s * L * h ** 2 * V / (12 * h * L) == pytest.approx(6 * B * s * h * V, rel=1e-14)


def test_narayanan_eq3_equals_closed_form_exactly():
    m = load_model("gpt3-175b")
    B, s, L, h, V = 1536, 2048, 96, 12288, 50257
    closed = 96 * B * s * L * h ** 2 * (1 + s / (6 * h) + V / (16 * L * h))
    assert model_flops_per_step(m, B, s, "narayanan_eq3") == pytest.approx(closed, rel=1e-14)
    # recomputation adds one forward pass of the layers: 4/3 of the layer term, logits unchanged
    no_rc = model_flops_per_step(m, B, s, "megatron_2021")
    logits = 6 * B * s * h * V
    assert (closed - logits) / (no_rc - logits) == pytest.approx(4 / 3, rel=1e-12)


def test_nemo_24_reproduces_published_gpt3_constant():
    # published_runs_h100.csv: "MFU = GBS*2.20e15/step/GPUs/peak" for GPT3-175B, vocab 51200, s 2048.
    # Per token: 12 L h^2 (1 + g/a + s/h) + 12 L F h (GELU: 2 matrices) + 6 V h.
    m = load_model({"preset": "gpt3-175b", "vocab_size": 51200})
    L, h, F, s, V = 96, 12288, 49152, 2048, 51200
    hand = (12 * L * h * h * (1 + 1 + s / h) + 12 * L * F * h + 6 * V * h) * s
    got = model_flops_per_step(m, 1, s, "nemo_24")
    assert got == pytest.approx(hand, rel=1e-12)
    assert got == pytest.approx(2.2046e15, rel=1e-4)
    assert rel(got, 2.20e15) < 0.005            # the CSV note rounds to three digits
    # the 405B/70B notes' constant for Llama 3 70B at 8k: 3.94e15
    l70 = load_model("llama3-70b")
    assert rel(model_flops_per_step(l70, 1, 8192, "nemo_24"), 3.94e15) < 0.005


def test_megatron_core_2025_llama3_70b_hand_derivation():
    # Per token, Megatron-Core 2025 (training.py num_floating_point_operations):
    #   attention 6 [h (q + 2g) + q s (causal half of QK^T and PV) + q h]
    #     = 6 [8192 x (8192 + 2048) + 8192 x 8192 + 8192 x 8192] = 1,308,622,848
    #   SwiGLU MLP 6 x 3 x h x F = 18 x 8192 x 28672           = 4,227,858,432
    #   80 layers                                           = 442,918,502,400
    #   logits 6 h V = 6 x 8192 x 128256                     =   6,304,038,912
    hand_per_token = 442_918_502_400 + 6_304_038_912          # 449,222,541,312
    m = load_model("llama3-70b")
    got = model_flops_per_token(m, 8192, "megatron_core_2025")
    assert rel(got, hand_per_token) < 0.01
    assert got == pytest.approx(hand_per_token, rel=1e-12)
    assert model_flops_per_step(m, 64, 8192) == pytest.approx(64 * 8192 * hand_per_token, rel=1e-12)


def test_megatron_core_2025_mixtral_moe_hand_derivation():
    # h 4096, 32 heads, 8 KV heads of 128, top-2 of 8 experts of 14336, V 32000, s 4096:
    #   attention 6 [4096 x (4096 + 2048) + 4096 x 4096 + 4096 x 4096] =   352,321,536
    #   routed experts 6 x 3 x 4096 x (2 x 14336)                    = 2,113,929,216
    #   32 layers x 2,466,250,752 = 78,920,024,064; logits 6 x 4096 x 32000 = 786,432,000
    m = load_model("mixtral-8x7b")
    assert model_flops_per_token(m, 4096) == pytest.approx(78_920_024_064 + 786_432_000, rel=1e-12)


def test_megatron_core_2025_deepseek_v3_mla_moe_mtp_hand_derivation():
    # MLA per layer (Megatron's terms, qk = nope + rope = 192):
    #   q  1536 (7168 + 128 x 192 + 1) = 48,760,320
    #   kv 512 (7168 + 128 x 256 + 1)  = 20,447,744 ; h x rope = 458,752
    #   out 128 x 128 x 7168           = 117,440,512
    #   core 4096 x 128 x 192/2 + 4096 x 128 x 128/2 = 83,886,080
    #   x 6 = 1,625,960,448, for 61 layers + 1 MTP layer
    # MLP: 3 dense layers 18 x 7168 x 18432 = 2,378,170,368 each; MoE layers (58 + the MTP
    #   layer) 18 x 7168 x (8 x 2048 + 2048) = 2,378,170,368 each
    # MTP: 6 (3 x 7168 + 2 x 7168^2) = 616,691,712; logits 6 x 7168 x 129280 x 2 = 11,118,575,616
    hand = (1_625_960_448 * 62 + 2_378_170_368 * 3 + 2_378_170_368 * 59 + 616_691_712 + 11_120_148_480)
    m = load_model("deepseek-v3")
    assert model_flops_per_token(m, 4096) == pytest.approx(hand, rel=1e-12)
    with pytest.raises(ConfigError, match="latent"):
        model_flops_per_token(m, 4096, "nemo_24")


def test_palm_6n_llama3_70b_hand_derivation():
    # N = active non-embedding parameters: 80 x (attention 150,994,944 + MLP 704,643,072
    # + norms 16,384) + final norm 8,192 + output layer 1,050,673,152 = 69,503,033,344;
    # PaLM's attention term 12 L H Q T = 12 x 80 x 64 x 128 x 8192 = 64,424,509,440 per token.
    m = load_model("llama3-70b")
    n = 80 * (150_994_944 + 704_643_072 + 16_384) + 8_192 + 1_050_673_152
    assert n == m.num_active_params(include_embedding=False)
    hand = 6 * n + 64_424_509_440
    assert model_flops_per_token(m, 8192, "palm_6n") == pytest.approx(hand, rel=1e-12)


def test_conventions_order_for_llama3_70b():
    m = load_model("llama3-70b")
    per = {c: model_flops_per_token(m, 8192, c) for c in FLOP_CONVENTIONS}
    # causal halving makes megatron_core_2025 the smallest count; recomputation the largest
    assert per["megatron_core_2025"] < per["nemo_24"] < per["narayanan_eq3"]
    assert per["megatron_core_2025"] == min(per.values())
    # nemo_24 and palm_6n differ only by norms and the GQA-vs-h^2 bookkeeping
    assert rel(per["nemo_24"], per["palm_6n"]) < 1e-3


# -- executed FLOPs of one layer ----------------------------------------------------------------
def test_causal_attention_is_half_within_one_percent():
    m = load_model("llama3-70b")
    causal = sum_flops(layer_ops(m, NO_RECOMPUTE, 0, 1, 16384), "F", "attention")
    full = sum_flops(layer_ops(m, NO_RECOMPUTE, 0, 1, 16384, causal=False), "F", "attention")
    assert rel(causal, full / 2) < 0.01
    # what we count: the blocks on and below the diagonal, 1/2 + B/(2s) of the full work
    assert causal / full == pytest.approx(0.5 + ATTN_BLOCK_SIZE / (2 * 16384), rel=1e-12)
    assert causal_executed_fraction(8192, 128) == pytest.approx(0.5 * (1 + 128 / 8192), rel=1e-12)
    assert causal_executed_fraction(100, 64) == pytest.approx((64 * 64 + 36 * 100) / 100 ** 2)


def test_window_executed_fraction_closed_forms():
    # s = 4096 in n = 32 tiles of 128: a 128-token window [q - 127, q] of a query block's
    # rows reaches back into the previous key block only, so every query block but the first
    # runs 2 key blocks: 1 + 2 x 31 = 2n - 1 of n^2 blocks
    assert window_executed_fraction(4096, 128, 128) == (2 * 32 - 1) / 32 ** 2
    # w <= B + 1 gives the same blocks; w = B + 2 reaches two blocks back from block 2 on
    assert window_executed_fraction(4096, 1, 128) == 32 / 32 ** 2                    # the diagonal only
    assert window_executed_fraction(4096, 129, 128) == (2 * 32 - 1) / 32 ** 2
    assert window_executed_fraction(4096, 130, 128) == (1 + 2 + 3 * 30) / 32 ** 2
    # w = k B + 1 reaches k blocks back: (k + 1) n - k (k + 1) / 2 blocks
    k, n = 4, 32
    assert window_executed_fraction(4096, k * 128 + 1, 128) == ((k + 1) * n - k * (k + 1) / 2) / n ** 2
    # no effective window: the causal fraction, exactly
    for s, block in ((4096, 128), (100, 64), (8192, 128)):
        for w in (s, s + 1, 10 ** 6, None):
            assert window_executed_fraction(s, w, block) == causal_executed_fraction(s, block)
    # a partial last block of r rows sees the band's key blocks up to and including itself:
    # s = 100, B = 64, w = 10: block 0 runs its 64 x 64 tile, block 1 (36 rows from key 64,
    # window start 55 in key block 0) the keys 0 .. 99
    assert window_executed_fraction(100, 10, 64) == (64 * 64 + 36 * 100) / 100 ** 2
    # monotone in the window, between the diagonal and the causal fraction
    fr = [window_executed_fraction(4096, w, 128) for w in (1, 128, 256, 1000, 2048, 4095)]
    assert fr == sorted(fr) and fr[-1] <= causal_executed_fraction(4096)
    with pytest.raises(ConfigError, match="sliding_window"):
        window_executed_fraction(4096, 0, 128)


def test_windowed_core_attention_runs_the_band_only():
    m = load_model("gpt-oss-120b")             # layer 0 windowed (128 tokens), layer 1 full
    s = 4096
    assert (m.attention_window(0), m.attention_window(1)) == (128, None)
    win = [o for o in layer_ops(m, NO_RECOMPUTE, 0, 1, s) if o.name == "core_attn"]
    full = [o for o in layer_ops(m, NO_RECOMPUTE, 1, 1, s) if o.name == "core_attn"]
    fw, ff = (next(o for o in ops if o.phase == "F") for ops in (win, full))
    assert fw.flops / ff.flops == pytest.approx(window_executed_fraction(s, 128) / causal_executed_fraction(s),
                                                rel=1e-12)
    assert fw.flops == 2 * 64 * (64 + 64) * s * s * 63 / 1024
    assert fw.mem_bytes == ff.mem_bytes                       # every key and value is still read
    # the backward keeps 2.5 x the forward; everything else in the two layers is the same
    assert sum_flops(win, "B") == pytest.approx(2.5 * fw.flops)
    rest = [sum_flops([o for o in layer_ops(m, NO_RECOMPUTE, i, 1, s) if o.name != "core_attn"]) for i in (0, 1)]
    assert rest[0] == rest[1]
    # without the causal mask the window is not applied either (the full s^2 is counted)
    assert sum_flops(layer_ops(m, NO_RECOMPUTE, 0, 1, s, causal=False), "F", "attention") \
        == sum_flops(layer_ops(m, NO_RECOMPUTE, 1, 1, s, causal=False), "F", "attention")


def test_megatron_core_2025_counts_the_keys_a_window_sees():
    m = load_model("gpt-oss-120b")
    plain = dataclasses.replace(m, sliding_window=None, window_attn_skip_freq=None)
    s, w, H, d, gbs = 4096, 128, 64, 64, 8
    # mean keys per query under the window: w (w + 1) / 2 for the first w queries, w after
    kbar = (w * (w + 1) / 2 + (s - w) * w) / s
    assert kbar == 126.015625
    # per token and windowed layer, QK^T and PV (2 H d each per key, x3 for F, dgrad, wgrad)
    # see kbar keys instead of s / 2; 18 of the 36 layers are windowed
    expected = gbs * s * 18 * 6 * 2 * H * d * (s / 2 - kbar)
    assert model_flops_per_step(plain, gbs, s) - model_flops_per_step(m, gbs, s) == pytest.approx(expected,
                                                                                                 rel=1e-12)
    # a window at least the sequence is no window; other conventions ignore windows
    assert model_flops_per_step(m, gbs, w) == model_flops_per_step(plain, gbs, w)
    for conv in ("nemo_24", "palm_6n", "megatron_2021", "narayanan_eq3"):
        assert model_flops_per_step(m, gbs, s, conv) == model_flops_per_step(plain, gbs, s, conv)
    # executed vs model FLOPs, whole model: within 1 % (the diagonal tiles, the router GEMM)
    total = sum(3 * sum_flops([o for o in layer_ops(m, NO_RECOMPUTE, i, 1, s) if o.name != "router"], "F")
                for i in (0, 1)) * 18
    vp = padded_vocab_size(m.vocab_size)
    total += 3 * sum_flops(output_ops(m, NO_RECOMPUTE, 1, s), "F") - 6 * s * m.hidden_size * (vp - m.vocab_size)
    assert rel(total, model_flops_per_step(m, 1, s)) < 0.01


def test_attention_backward_is_two_and_a_half_forward_and_has_no_w():
    ops = layer_ops(load_model("tiny-dense"), NO_RECOMPUTE, 0)
    f = sum_flops(ops, "F", "attention")
    assert sum_flops(ops, "B", "attention") == pytest.approx(2.5 * f)
    assert sum_flops(ops, "W", "attention") == 0


@pytest.mark.parametrize("preset", ["llama3-70b", "gpt3-175b", "tiny-dense"])
def test_dense_layer_forward_is_two_params_tokens_plus_attention(preset):
    m = load_model(preset)
    b, s = 2, m.seq_len
    ops = layer_ops(m, NO_RECOMPUTE, 0, b, s)
    tokens = b * s
    br = m.layer_param_breakdown(0)
    H, d = m.num_attention_heads, m.head_dim
    attn = 2 * b * H * 2 * d * s * s * causal_executed_fraction(s)
    # GEMMs: 2 x (weight matrices) x tokens exactly; biases and norms are element-wise
    weights = 2 * m.hidden_size * H * d + 2 * m.hidden_size * m.num_kv_heads * d \
        + (3 if m.mlp == "swiglu" else 2) * m.hidden_size * m.ffn_hidden_size
    assert sum_flops(ops, "F") == pytest.approx(2 * weights * tokens + attn, rel=1e-12)
    # and within 2/h of 2 x (all layer parameters) x tokens + attention (norms and biases:
    # at most 13h of the 12h^2 parameters of a GPT layer)
    assert rel(sum_flops(ops, "F"), 2 * sum(br.values()) * tokens + attn) < 2 / m.hidden_size


@pytest.mark.parametrize("preset", ["llama3-70b", "mixtral-8x7b", "deepseek-v3"])
def test_gemm_f_b_w_are_one_to_one_to_one(preset):
    m = load_model(preset)
    p = ParallelConfig(tp=1, recompute="none")
    layer = m.num_layers - 1
    ops = layer_ops(m, p, layer, 1, 4096)
    f, b, w = (sum_flops(ops, ph, "gemm") for ph in "FBW")
    assert f > 0 and b == pytest.approx(f, rel=1e-12) and w == pytest.approx(f, rel=1e-12)
    # and every GEMM op's FLOPs are 2 M N K of the shape it stores
    for o in ops:
        if o.op_class == "gemm":
            assert o.flops == pytest.approx(2.0 * sum(o.groups or [o.m]) * o.n * o.k if gemm_role(o) != "wgrad"
                                            else 2.0 * o.m * o.n * sum(o.groups or [o.k]), rel=1e-9)


def test_gemm_shapes_per_role():
    m = load_model("llama3-70b")
    ops = {(o.name, o.phase): o for o in layer_ops(m, ParallelConfig(tp=8, recompute="none"), 0, 1, 8192)}
    assert ops[("qkv_proj", "F")][4:7] == (8192, (8 + 2) * 128, 8192)   # 64/8 q heads + 2 x 8/8 kv heads
    assert ops[("qkv_proj", "B")][4:7] == (8192, 8192, 1280)
    assert ops[("qkv_proj", "W")][4:7] == (8192, 1280, 8192)
    assert ops[("fc1", "F")][4:7] == (8192, 2 * 28672 // 8, 8192)
    assert ops[("fc2", "F")][4:7] == (8192, 8192, 28672 // 8)
    assert gemm_role(ops[("fc2", "W")]) == "wgrad"


def test_tensor_and_context_parallel_shard_the_work():
    m = load_model("llama3-70b")
    one = layer_ops(m, ParallelConfig(recompute="none"), 3, 1, 8192)
    tp8 = layer_ops(m, ParallelConfig(tp=8, recompute="none"), 3, 1, 8192)
    cp4 = layer_ops(m, ParallelConfig(cp=4, recompute="none"), 3, 1, 8192)
    for phase in "FBW":
        assert 8 * sum_flops(tp8, phase) == pytest.approx(sum_flops(one, phase), rel=1e-12)
        assert 4 * sum_flops(cp4, phase) == pytest.approx(sum_flops(one, phase), rel=1e-12)
    # sequence parallelism shards the norms' bytes, not the GEMMs
    nosp = layer_ops(m, ParallelConfig(tp=8, sequence_parallel=False, recompute="none"), 3, 1, 8192)
    norm = {o.phase: o.mem_bytes for o in tp8 if o.name == "attn_norm"}
    norm_nosp = {o.phase: o.mem_bytes for o in nosp if o.name == "attn_norm"}
    assert norm_nosp["F"] == pytest.approx(8 * norm["F"])
    assert sum_flops(nosp, "F", "gemm") == sum_flops(tp8, "F", "gemm")


def test_replicated_kv_heads_when_tp_exceeds_them():
    m = load_model("llama3-70b")                   # 8 KV heads
    qkv = next(o for o in layer_ops(m, ParallelConfig(tp=16, recompute="none"), 0, 1, 8192) if o.name == "qkv_proj")
    assert qkv.n == (64 // 16 + 2 * 1) * 128


def test_recompute_adds_forward_work():
    m = load_model("llama3-70b")
    p = ParallelConfig(tp=8)
    none = layer_ops(m, p, 0, 1, 8192, recompute="none")
    sel = layer_ops(m, p, 0, 1, 8192)              # default: selective, core_attn
    full = layer_ops(m, p, 0, 1, 8192, recompute="full")
    f = sum_flops(none, "F")
    attn_f = sum_flops(none, "F", "attention")
    assert sum_flops(sel, recompute=True) == pytest.approx(attn_f)
    assert [o.name for o in sel if o.recompute] == ["core_attn"]
    assert sum_flops(full, recompute=True) == pytest.approx(f)
    assert all(o.phase == "B" for o in full if o.recompute)
    # recomputation comes before the layer's own backward
    first_b = next(i for i, o in enumerate(full) if o.phase == "B")
    assert full[first_b].recompute
    # selective with more modules (Megatron's --recompute-modules)
    p2 = dataclasses.replace(p, recompute_modules=("core_attn", "mlp", "layernorm"))
    names = {o.name for o in layer_ops(m, p2, 0, 1, 8192) if o.recompute}
    assert names == {"core_attn", "fc1", "mlp_act", "fc2", "attn_norm", "mlp_norm"}


def test_moe_balanced_tokens_and_skew():
    m = load_model("mixtral-8x7b")                 # 8 experts, top-2
    # 16 GPUs: tp 2, ep 4 carved from dp 8 -> etp = 2, 2 experts per rank
    p = ParallelConfig.from_dict({"tp": 2, "dp": 2, "ep": 4, "recompute": "none"})
    b, s = 1, 4096
    bal = balanced_tokens_per_expert(m, p, b, s)
    # etp x ep x (b s / cp / tp) x top_k / E = 2 x 4 x 2048 x 2 / 8 = 4096 per local expert
    assert bal == (4096.0, 4096.0)
    ops = layer_ops(m, p, 0, b, s)
    fc1 = next(o for o in ops if o.name == "expert_fc1" and o.phase == "F")
    assert fc1.groups == bal and fc1.n == 2 * 14336 // 2 and fc1.k == 4096
    # per rank: 2 x (tokens) x h x 3 fe / etp, all three matrices
    routed = sum_flops([o for o in ops if o.name.startswith("expert_")], "F")
    assert routed == pytest.approx(2 * 8192 * 4096 * 3 * 14336 / 2)
    skew = layer_ops(m, p, 0, b, s, tokens_per_expert=(6144, 2048))
    assert sum_flops([o for o in skew if o.name.startswith("expert_")], "F") == pytest.approx(routed)
    padded = layer_ops(m, p, 0, b, s, tokens_per_expert=(6144, 6144))
    assert sum_flops([o for o in padded if o.name.startswith("expert_")], "F") == pytest.approx(1.5 * routed)
    with pytest.raises(ConfigError, match="tokens_per_expert"):
        layer_ops(m, p, 0, b, s, tokens_per_expert=(1, 2, 3))
    with pytest.raises(ConfigError, match="capacity"):
        capacity_tokens_per_expert(m, p, b, s)
    cf = load_model({"preset": "mixtral-8x7b", "moe": {"capacity_factor": 1.25}})
    assert capacity_tokens_per_expert(cf, p, b, s) == (5120.0, 5120.0)


def test_mla_layer_shapes_and_down_projections_follow_sequence_parallelism():
    m = load_model("deepseek-v3")
    p = ParallelConfig(tp=4, recompute="none")
    ops = {(o.name, o.phase): o for o in layer_ops(m, p, 0, 1, 4096)}
    assert ops[("q_down_proj", "F")][4:7] == (1024, 1536, 7168)          # SP shard, not TP-sharded
    assert ops[("kv_down_proj", "F")][4:7] == (1024, 512 + 64, 7168)
    assert ops[("q_up_proj", "F")][4:7] == (4096, 32 * 192, 1536)
    assert ops[("kv_up_proj", "F")][4:7] == (4096, 32 * 256, 512)
    assert ops[("out_proj", "F")][4:7] == (4096, 7168, 32 * 128)
    attn = ops[("core_attn", "F")]
    assert attn.flops == pytest.approx(2 * 32 * (192 + 128) * 4096 ** 2 * causal_executed_fraction(4096))


def test_layer_ops_sum_matches_megatron_core_2025():
    # forward FLOPs of every layer (MTP included) and the output layer, times 3, against the
    # convention: equal up to the causal diagonal blocks (and, for DeepSeek, the router GEMM
    # and MLA latent-norm terms that Megatron counts differently)
    for preset, s in (("llama3-70b", 8192), ("deepseek-v3", 4096), ("mixtral-8x7b", 4096)):
        m = load_model(preset)
        total = 0.0
        for i in range(m.num_layers + m.mtp_layers):
            ops = layer_ops(m, NO_RECOMPUTE, i, 1, s)
            total += 3 * sum_flops([o for o in ops if o.name != "router"], "F")
        total += 3 * sum_flops(output_ops(m, NO_RECOMPUTE, 1, s, vocab_size=m.vocab_size), "F")
        # output_ops pads the vocabulary to a multiple of 128; the convention uses the model's
        vp = padded_vocab_size(m.vocab_size)
        total -= 6 * s * m.hidden_size * (vp - m.vocab_size) * (1 + m.mtp_layers)
        assert rel(total, model_flops_per_step(m, 1, s)) < 0.01, preset


def test_mtp_layer_carries_its_head_and_loss():
    m = load_model("deepseek-v3")
    ops = layer_ops(m, NO_RECOMPUTE, 61, 1, 4096)
    names = [o.name for o in ops if o.phase == "F"]
    assert names[:4] == ["mtp_embedding", "mtp_enorm", "mtp_hnorm", "mtp_eh_proj"]
    assert names[-3:] == ["mtp_final_norm", "mtp_output_gemm", "mtp_cross_entropy"]
    bnames = [o.name for o in ops if o.phase == "B"]
    assert bnames[:2] == ["mtp_cross_entropy", "mtp_output_gemm"]
    eh = next(o for o in ops if o.name == "mtp_eh_proj" and o.phase == "F")
    assert eh.flops == 2 * 4096 * 7168 * 2 * 7168
    with pytest.raises(ConfigError, match="layer_index"):
        layer_ops(m, NO_RECOMPUTE, 62, 1, 4096)


def test_embedding_is_a_gather_and_output_is_vocab_parallel():
    m = load_model("llama3-70b")
    p = ParallelConfig(tp=8, recompute="none")
    emb = embedding_ops(m, p, 1, 8192)
    assert sum_flops(emb) == 0 and {o.phase for o in emb} == {"F", "W"}
    assert all(o.op_class == "elementwise" and o.mem_bytes > 0 for o in emb)
    out = output_ops(m, p, 1, 8192)
    assert [(o.name, o.phase) for o in out] == [("final_norm", "F"), ("output_gemm", "F"), ("cross_entropy", "F"),
                                                ("cross_entropy", "B"), ("output_gemm", "B"), ("final_norm", "B"),
                                                ("output_gemm", "W")]
    gemm = out[1]
    # Megatron pads to a multiple of 128 x tp: 128,256 -> 129,024 at tp 8
    assert padded_vocab_size(128256, 8) == 129024 and gemm.n == 129024 // 8
    assert padded_vocab_size(128256, 1) == 128256 and padded_vocab_size(50257, 1) == 50304
    fused = output_ops(m, p, 1, 8192, fused_cross_entropy=True)
    assert fused[2].mem_bytes < out[2].mem_bytes


def test_optimizer_ops_bytes():
    g, step = optimizer_ops(1e9)
    assert (g.name, step.name) == ("grad_norm", "optimizer_step")
    assert g.mem_bytes == 4e9 and step.mem_bytes == 30e9
    with pytest.raises(ConfigError):
        optimizer_ops(-1)


def test_ops_are_compact_records():
    op = layer_ops(load_model("tiny-dense"), NO_RECOMPUTE, 0)[0]
    assert isinstance(op, ComputeOp) and isinstance(op, tuple)
    assert {o.phase for o in layer_ops(load_model("tiny-moe"), NO_RECOMPUTE, 0)} == {"F", "B", "W"}
    hash(op)


def test_input_errors_are_config_errors():
    m = load_model("llama3-70b")
    with pytest.raises(ConfigError, match="tp"):
        layer_ops(m, ParallelConfig(tp=3), 0)
    with pytest.raises(ConfigError, match="cp"):
        layer_ops(m, ParallelConfig(cp=3), 0, 1, 8192)
    with pytest.raises(ConfigError, match="recompute"):
        layer_ops(m, ParallelConfig(), 0, recompute="most")
    with pytest.raises(ConfigError, match="moe"):
        balanced_tokens_per_expert(m, ParallelConfig())


def test_unfused_attention_runs_full_scores_and_moves_them_through_hbm():
    # Megatron-LM's CoreAttention without FlashAttention (vTrain's runs): Q K^T and P V over
    # the full s x s scores, softmax and dropout as memory-bound passes over b*heads*s^2
    model = dataclasses.replace(load_model("gpt3-175b"), flash_attention=False, dropout=0.1)
    par = ParallelConfig(tp=8, recompute="none")
    b, s = 2, 2048
    ops = layer_ops(model, par, 0, b, s)
    attn = [o for o in ops if o.name.startswith("core_attn")]
    assert [(o.name, o.phase) for o in attn] == [
        ("core_attn.qk", "F"), ("core_attn.softmax", "F"), ("core_attn.dropout", "F"), ("core_attn.pv", "F"),
        ("core_attn.dp", "B"), ("core_attn.dv", "B"), ("core_attn.dropout", "B"), ("core_attn.softmax", "B"),
        ("core_attn.dq", "B"), ("core_attn.dk", "B")]
    heads, d = model.num_attention_heads // 8, model.head_dim
    full = 2.0 * b * heads * s * s * d                    # one s x s x d product, no causal skipping
    assert sum(o.flops for o in attn if o.phase == "F") == pytest.approx(2 * full)
    assert sum(o.flops for o in attn if o.phase == "B") == pytest.approx(4 * full)
    scores = b * heads * s * s
    by = {(o.name, o.phase): o for o in attn}
    assert by[("core_attn.softmax", "F")].mem_bytes == 4 * scores
    assert by[("core_attn.dropout", "F")].mem_bytes == 5 * scores
    assert by[("core_attn.softmax", "B")].mem_bytes == 6 * scores
    # no dropout, no dropout kernels; context parallelism needs the fused kernel
    names = {o.name for o in layer_ops(dataclasses.replace(model, dropout=0.0), par, 0, b, s)}
    assert "core_attn.dropout" not in names and "core_attn.qk" in names
    with pytest.raises(ConfigError, match="flash_attention"):
        layer_ops(model, ParallelConfig(tp=8, cp=2, recompute="none"), 0, b, s)
    # full recompute re-runs the unfused forward too
    rec = [o for o in layer_ops(model, ParallelConfig(tp=8, recompute="full"), 0, b, s) if o.recompute]
    assert {"core_attn.qk", "core_attn.softmax", "core_attn.pv"} <= {o.name for o in rec}


# -- hybrid Mamba-2 stacks (Nemotron 3) ---------------------------------------------------------
from workloads.costs.flops import MAMBA_SCAN_LAUNCHES, mamba_scan_bytes, mamba_scan_kernels  # noqa: E402
from workloads.model import ModelSpec  # noqa: E402


def _hybrid(pattern="M*-E", **kw):
    base = dict(num_layers=len(pattern), hidden_size=64, num_attention_heads=4, num_kv_heads=2, vocab_size=128,
                seq_len=256, mlp="relu2", ffn_hidden_size=96, hybrid_override_pattern=pattern,
                mamba={"num_heads": 4, "head_dim": 16, "state_dim": 8, "num_groups": 2},
                moe={"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 32, "num_shared_experts": 1,
                     "shared_expert_ffn_hidden_size": 48, "latent_size": 16})
    base.update(kw)
    return ModelSpec.from_dict(base)


def test_megatron_hybrid_flops_closed_form():
    # NVIDIA/Megatron-LM training.py hybrid_flops, per token x 3 (fwd + dgrad + wgrad):
    # Mamba 2h(2D + 2GN + nh) + 7DN + 2Dh with D = 2h; attention 4hp(h + hK/H) + 2shp, p = Hd/h;
    # MLP 4hf; latent MoE 4 l fe k + 4 h l + shared 4 h fs; logits 2hV(1 + mtp)
    m = _hybrid(mtp_layers=2)
    h, s, V = 64, 256, 128
    D = 2 * h
    mamba = 2 * h * (2 * D + 2 * 2 * 8 + 4) + 7 * D * 8 + 2 * D * h
    attn = 4 * h * 1 * (h + h * 2 / 4) + 2 * s * h * 1
    mlp = 4 * h * 96
    moe = 4 * 16 * 32 * 2 + 4 * h * 16 + 4 * h * 48
    logits = 2 * h * V * 3
    assert FLOP_CONVENTIONS["megatron_core_2025"](m, s) == pytest.approx(3 * s * (mamba + attn + mlp + moe + logits))


def test_nemotron3_nano_flops_agree_with_the_published_row():
    # Megatron-Bridge 26.06.01, Nemotron 3 Nano on 8 GB200, GBS 512 x 8192: 776 TFLOP/s/GPU
    # (num_floating_point_operations) and 34,816 tokens/s/GPU; the two give one step time only
    # if our count is Megatron's
    m = load_model("nemotron3-nano")
    flops = 512 * FLOP_CONVENTIONS["megatron_core_2025"](m, 8192)
    assert flops / (776e12 * 8) == pytest.approx(512 * 8192 / (34816 * 8), rel=2e-3)


def test_mamba_layer_ops_shapes_and_bytes():
    m = _hybrid()
    par = ParallelConfig(tp=2, micro_batch_size=1, seq_len=256, sequence_parallel=True)
    ops = {(o.name, o.phase): o for o in layer_ops(m, par, 0, recompute="none")}
    T, tp = 256, 2
    width = 2 * 64 + 2 * 2 * 8 + 4
    assert (ops["in_proj", "F"].m, ops["in_proj", "F"].n, ops["in_proj", "F"].k) == (T, width // tp, 64)
    assert ops["mamba_out_proj", "F"].flops == 2 * T * 64 * 32
    conv = 2 * T * (32 + 2 * 1 * 8)                           # x, B, C of this rank, BF16
    # the backward runs the conv forward again (mamba_ssm's fused function keeps only zxBCdt)
    assert ops["conv1d", "F"].mem_bytes == 2 * conv and ops["conv1d", "B"].mem_bytes == 5 * conv
    f, b = mamba_scan_bytes(T, 32, 2, 1, 8, 128)
    assert ops["ssd_scan", "F"].mem_bytes == f and ops["ssd_scan", "B"].mem_bytes == b
    assert (ops["ssd_scan", "F"].num_kernels, ops["ssd_scan", "B"].num_kernels) == MAMBA_SCAN_LAUNCHES == (5, 38)
    assert ops["ssd_scan", "F"].op_class == "elementwise" and ops["ssd_scan", "F"].flops == 0
    # the grouped RMSNorm runs without z (the gate is applied inside the scan): y in, out out
    assert ops["gated_norm", "F"].mem_bytes == 2 * 2 * T * 32 and ops["gated_norm", "B"].mem_bytes == 3 * 2 * T * 32
    assert {n for n, _ in ops} >= {"mamba_norm", "mamba_residual"}
    assert ("mamba_layout", "F") not in ops                   # micro-batch 1: the rearranges are views


def test_mamba_layout_copies_at_micro_batch_above_one():
    # Megatron-Core's rearrange("l b d -> b l d").contiguous() of in_proj's output and the
    # reverse of the scan's: copies when b > 1, and the in_proj gradient's copy backward
    m = _hybrid()
    ops = {(o.name, o.phase): o for o in layer_ops(m, ParallelConfig(tp=1, micro_batch_size=2, seq_len=256), 0)}
    T, width, d = 512, 2 * 64 + 2 * 2 * 8 + 4, 64
    assert ops["mamba_layout", "F"].mem_bytes == 2 * 2 * T * (width + d)
    assert ops["mamba_layout", "B"].mem_bytes == 2 * 2 * T * width


def test_mamba_scan_bytes_closed_form():
    # the sums of mamba_scan_kernels' per-kernel table (its docstring)
    T, d, nh, G, N, Q = 1024, 256, 4, 2, 64, 128
    Td, S, TGN, TGQ, TH = T * d, T * d * N / Q, T * G * N, T * G * Q, T * nh
    f, b = mamba_scan_bytes(T, d, nh, G, N, Q)
    assert f == 10 * Td + 12 * S + 8 * TGN + 8 * TGQ + 26 * TH
    assert b == 34 * Td + 34 * S + 30 * TGN + 24 * TGQ + 116 * TH
    fk, bk = mamba_scan_kernels(T, d, nh, G, N, Q)
    assert [n for n, _ in fk] == ["chunk_cumsum", "chunk_state", "state_passing", "bmm_chunk", "chunk_scan"]
    assert len(bk) == 15 and all(x > 0 for _, x in fk + bk)


def test_latent_moe_projects_around_the_experts():
    m = _hybrid()
    par = ParallelConfig(tp=1, ep=2, micro_batch_size=1, seq_len=256)
    ops = {(o.name, o.phase): o for o in layer_ops(m, par, 3, recompute="none")}
    assert (ops["latent_down_proj", "F"].n, ops["latent_down_proj", "F"].k) == (16, 64)
    assert (ops["latent_up_proj", "F"].n, ops["latent_up_proj", "F"].k) == (64, 16)
    assert ops["expert_fc1", "F"].k == 16 and ops["expert_fc2", "F"].n == 16
    assert ops["expert_fc1", "F"].n == 32                     # relu2: no gate, one up matrix
    assert ("qkv_proj", "F") not in ops and ("in_proj", "F") not in ops


@pytest.mark.parametrize("tp, cp, field", [(4, 1, "parallel.tp"), (2, 4, "parallel.cp")])
def test_mamba_split_rules(tp, cp, field):
    # 4 heads, 2 groups: tp must divide both, cp the per-rank heads and groups
    m = _hybrid("M*", moe=None, num_attention_heads=8, num_kv_heads=8)
    with pytest.raises(ConfigError) as e:
        layer_ops(m, ParallelConfig(tp=tp, cp=cp, micro_batch_size=1, seq_len=256), 0)
    assert e.value.field == field and "model.mamba" in e.value.rule


def test_other_conventions_on_hybrid_stacks():
    m = _hybrid()
    with pytest.raises(ConfigError) as e:
        FLOP_CONVENTIONS["nemo_24"](m, 256)
    assert e.value.field == "flop_convention"
    # PaLM: 6N plus the attention term of the one attention layer (H = 4 heads of 16)
    n = m.num_active_params(include_embedding=False)
    assert FLOP_CONVENTIONS["palm_6n"](m, 256) == 256 * (6 * n + 6 * 1 * 4 * 32 * 256)


def test_the_experts_clamps_and_fc2_bias_run_as_megatron_core_issues_them():
    """gpt-oss's clamped GLU and expert biases (megatron/core/fusions/fused_bias_geglu.py,
    moe/experts.py ``_apply_bias``): the clamps move 8a forward and 15a backward (a = routed
    tokens x expert width x 2 bytes per half of the fc1 output) and are recomputed with
    ``moe_act``; the fc2 bias 6c / 8c (c = routed tokens x h x 2 bytes), 2E + 1 and 4E + 1
    kernels for E local experts.  Without the clamp and the biases neither op exists."""
    m = load_model("gpt-oss-120b")
    assert m.activation_clamp == 7.0 and m.add_bias_linear
    par = ParallelConfig.from_dict({"tp": 1, "pp": 1, "dp": 1, "ep": 8, "micro_batch_size": 1,
                                    "global_batch_size": 8, "seq_len": 4096, "recompute": "selective",
                                    "recompute_modules": ["moe_act"]}).resolve(8)
    ops = layer_ops(m, par, 0, 1, 4096)
    routed = sum(balanced_tokens_per_expert(m, par, 1, 4096))
    assert routed == 4096 * 4                              # every token to top_k = 4 experts
    a, c = 2 * routed * 2880, 2 * routed * 2880
    by = {(o.name, o.phase, o.recompute): o for o in ops if o.name in ("expert_clamp", "expert_bias")}
    assert (by["expert_clamp", "F", False].mem_bytes, by["expert_clamp", "F", False].num_kernels) == (8 * a, 3)
    assert (by["expert_clamp", "B", False].mem_bytes, by["expert_clamp", "B", False].num_kernels) == (15 * a, 7)
    assert by["expert_clamp", "B", True].mem_bytes == 8 * a          # recomputed with the activation
    local = 128 // 8
    assert (by["expert_bias", "F", False].mem_bytes, by["expert_bias", "F", False].num_kernels) == (6 * c, 2 * local + 1)
    assert (by["expert_bias", "B", False].mem_bytes, by["expert_bias", "B", False].num_kernels) == (8 * c, 4 * local + 1)
    assert ("expert_bias", "B", True) not in by                      # outside the activation checkpoint
    plain = dataclasses.replace(m, activation_clamp=None, add_bias_linear=False)
    assert not {o.name for o in layer_ops(plain, par, 0, 1, 4096)} & {"expert_clamp", "expert_bias"}
    # HybridEP's rank budget runs with Transformer Engine's op fuser, whose fused expert ops do both
    fused = dataclasses.replace(m, moe=dataclasses.replace(m.moe, token_dispatcher="flex",
                                                           flex_dispatcher_backend="hybridep",
                                                           expert_rank_capacity_factor=1.5))
    assert not {o.name for o in layer_ops(fused, par, 0, 1, 4096)} & {"expert_clamp", "expert_bias"}
    with pytest.raises(ConfigError, match="model.activation_clamp"):
        dataclasses.replace(m, activation_clamp=-1.0)
    with pytest.raises(ConfigError, match="model.activation_clamp"):
        dataclasses.replace(m, mlp="gelu")


def test_a_yarn_factor_runs_the_unfused_rope():
    """Megatron-Core's fused RoPE does not take YaRN's table factor (rope_utils.py), so
    gpt-oss (factor 0.1 ln 32 + 1) runs the unfused one: 12a forward and 10a backward on q and
    k (a bytes) in 12 and 10 kernels, where the fused kernel reads and writes each once."""
    m = load_model("gpt-oss-120b")
    assert m.rope_mscale == pytest.approx(0.1 * math.log(32) + 1, rel=1e-15)
    a = 2 * 4096 * (64 + 8) * 64
    yarn = {o.phase: o for o in layer_ops(m, NO_RECOMPUTE, 0, 1, 4096) if o.name == "rope"}
    plain = {o.phase: o for o in layer_ops(dataclasses.replace(m, rope_mscale=1.0), NO_RECOMPUTE, 0, 1, 4096)
             if o.name == "rope"}
    assert (yarn["F"].mem_bytes, yarn["B"].mem_bytes, yarn["F"].num_kernels) == (12 * a, 10 * a, 12)
    assert (plain["F"].mem_bytes, plain["B"].mem_bytes) == (2 * a, 2 * a)
    with pytest.raises(ConfigError, match="model.rope_mscale"):
        dataclasses.replace(m, rope_mscale=0.0)
