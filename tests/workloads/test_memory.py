"""Memory model: Korthikanti et al.'s activation formulas, Megatron's static accounting and
theoretical-memory report, ZeRO sharding, in-flight micro-batches per schedule, the OOM verdict.

Sources of the expected figures (written out here, not imported from the package):

* Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
  (arXiv 2205.05198), Table 2: activation bytes per transformer layer in 16-bit with dropout
  and no FlashAttention: ``sbh(34 + 5as/h)``; with TP ``sbh(10 + 24/t + 5as/(ht))``; with TP
  and SP ``sbh(34/t + 5as/(ht))``; with TP, SP and selective recomputation ``34 sbh/t``;
  full recomputation ``2 sbh`` (``2 sbh/t`` with SP).  Their Table 3 models: 22B (a=64,
  h=6144), 175B (96, 12288), 530B (128, 20480), 1T (160, 25600), all at s=2048, t=8.
  The abstract: sequence parallelism with selective recomputation "reduces activation
  memory by 5x".  The paper's absolute per-GPU figures are bar charts only (no numbers in
  the text), so the 5x is the published figure tested.
* Megatron-LM ``megatron/training/theoretical_memory_usage.py`` (NVIDIA/Megatron-LM):
  ``compute_weight_and_optimizer_memory`` (most loaded shard = (block / pp + embedding) / tp
  parameters, times 18 or 6 + 12/dp bytes) and ``compute_activation_memory`` (SP and
  selective: ``sbh(18 + 4 f/h)`` per layer times all layers for the first stage, plus
  ``8 s b p`` and ``s b h p``, divided by tp).
* Megatron-LM distributed-optimizer docs: 18 bytes/param, 6 + 12/d with the optimizer sharded.
* Rajbhandari et al. 2020, ZeRO (arXiv 1910.02054) §3.1 / Figure 1: 2 + 2 + 12 = 16 bytes per
  parameter; stages 1, 2, 3: 4 + 12/Nd, 2 + 14/Nd, 16/Nd.
* Schedules: 1F1B stage s holds pp - s micro-batches (Megatron-Core warm-up pp - s - 1, plus
  one); GPipe holds m; interleaved stage 0 holds (pp-1)*2 + (vpp-1)*pp + 1 chunk sets, i.e.
  pp (1 + (pp-1)/(pp vpp)) stages' worth (Korthikanti §4.2.3); DualPipe pp + 1 chunk sets and
  two parameter copies (DeepSeek-V3 report Table 2).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from topologies import ConfigError, get_gpu_spec
from workloads.memory import (
    ACTIVATION_TERMS,
    DEFAULT_RESERVE_BYTES,
    MEMORY_TERMS,
    RESERVE_PARTS,
    MemoryEstimate,
    MemoryOptions,
    bytes_per_param,
    check_fits,
    effective_zero_stage,
    layer_activation_bytes,
    memory_estimate,
    memory_estimates,
)
from workloads.model import ModelSpec
from workloads.model_loading import load_model
from workloads.parallel import ParallelConfig
from workloads.schedules import get_schedule, peak_in_flight

GB = 1e9


def rel(a: float, b: float) -> float:
    return abs(a / b - 1)


# -- (1) Korthikanti et al. 2022, Table 2 -------------------------------------------------------
def gpt(name: str, heads: int, hidden: int, layers: int = 4) -> ModelSpec:
    """Korthikanti's GPT: GELU MLP of 4h, LayerNorm, biases, dropout 0.1, s = 2048."""
    return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads, vocab_size=51200,
                     seq_len=2048, mlp="gelu", norm="layernorm", position_embedding="learned",
                     add_bias_linear=True, tied_embeddings=True, dropout=0.1)


# Table 3 of the paper: (heads, hidden) of the 22B, 175B, 530B and 1T models; tp = 8.
KORTHIKANTI_MODELS = {"22B": (64, 6144), "175B": (96, 12288), "530B": (128, 20480), "1T": (160, 25600)}


def table2(s: int, b: int, h: int, a: int, t: int, case: str) -> float:
    """Korthikanti et al. Table 2, bytes per layer."""
    return {"none": s * b * h * (34 + 5 * a * s / h),
            "tp": s * b * h * (10 + 24 / t + 5 * a * s / (h * t)),
            "tp_sp": s * b * h * (34 / t + 5 * a * s / (h * t)),
            "tp_sp_selective": s * b * h * 34 / t,
            "full": 2 * s * b * h,
            "tp_sp_full": 2 * s * b * h / t}[case]


CASES = {"none": {"tp": 1, "sequence_parallel": False, "recompute": "none"},
         "tp": {"tp": 8, "sequence_parallel": False, "recompute": "none"},
         "tp_sp": {"tp": 8, "sequence_parallel": True, "recompute": "none"},
         "tp_sp_selective": {"tp": 8, "sequence_parallel": True, "recompute": "selective"},
         "full": {"tp": 1, "sequence_parallel": False, "recompute": "full"},
         "tp_sp_full": {"tp": 8, "sequence_parallel": True, "recompute": "full"}}


@pytest.mark.parametrize("size", list(KORTHIKANTI_MODELS))
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("b", [1, 4])
def test_korthikanti_table2_per_layer(size, case, b):
    a, h = KORTHIKANTI_MODELS[size]
    model = gpt(size, a, h)
    par = ParallelConfig(micro_batch_size=b, seq_len=2048, **CASES[case])
    got = sum(layer_activation_bytes(model, par, flash_attention=False).values())
    want = table2(2048, b, h, a, CASES[case]["tp"], case)
    # the only terms the paper leaves out are the norms' fp32 statistics (16 sb bytes)
    assert rel(got, want) < 0.05
    assert rel(got, want) < 1e-4


def test_korthikanti_five_times_less_activation_memory():
    # Abstract: SP + selective recomputation "reduces activation memory by 5x" against tensor
    # parallelism alone.  For the 530B and 1T models (t = 8, s = 2048) Table 2 gives
    # (10 + 24/8 + 5as/(8h)) / (34/8) = 21 / 4.25 = 4.94.
    for size in ("530B", "1T"):
        a, h = KORTHIKANTI_MODELS[size]
        model = gpt(size, a, h)
        base = ParallelConfig(tp=8, sequence_parallel=False, recompute="none", seq_len=2048)
        ours = ParallelConfig(tp=8, sequence_parallel=True, recompute="selective", seq_len=2048)
        ratio = (sum(layer_activation_bytes(model, base, flash_attention=False).values())
                 / sum(layer_activation_bytes(model, ours, flash_attention=False).values()))
        assert rel(ratio, 5) < 0.05


def test_flash_attention_has_no_quadratic_term():
    model = load_model("llama3-8b")
    for flash, expect_linear in ((True, True), (False, False)):
        acts = [sum(layer_activation_bytes(model, ParallelConfig(recompute="none", seq_len=s),
                                           flash_attention=flash).values()) for s in (4096, 8192)]
        assert (acts[1] == pytest.approx(2 * acts[0])) is expect_linear
    terms = layer_activation_bytes(model, ParallelConfig(recompute="none", seq_len=8192))
    assert terms["attn_scores"] == 0 and terms["softmax_stats"] > 0
    # selective recomputation of core attention then removes only the log-sum-exp
    sel = layer_activation_bytes(model, ParallelConfig(recompute="selective", seq_len=8192))
    assert sum(terms.values()) - sum(sel.values()) == pytest.approx(terms["softmax_stats"])


def test_architecture_terms():
    par = ParallelConfig(recompute="none", seq_len=2048, sequence_parallel=False)
    s, h = 2048, 4096
    base = ModelSpec(num_layers=2, hidden_size=h, num_attention_heads=32, vocab_size=1000, seq_len=s,
                     ffn_hidden_size=4 * h, mlp="gelu", norm="layernorm")
    t_base = layer_activation_bytes(base, par)
    # GQA: K and V shrink with the KV heads
    t_gqa = layer_activation_bytes(dataclasses.replace(base, num_kv_heads=8), par)
    assert t_gqa["kv"] == pytest.approx(t_base["kv"] / 4) and t_gqa["q"] == t_base["q"]
    # SwiGLU keeps both fc1 outputs (gate and up)
    t_swi = layer_activation_bytes(dataclasses.replace(base, mlp="swiglu"), par)
    assert t_swi["mlp_fc1_output"] == pytest.approx(2 * t_base["mlp_fc1_output"])
    assert t_swi["mlp_fc2_input"] == t_base["mlp_fc2_input"]
    # RMSNorm keeps one statistic (rstd), LayerNorm two (mean, rstd)
    t_rms = layer_activation_bytes(dataclasses.replace(base, norm="rmsnorm"), par)
    assert t_rms["norm_stats"] == pytest.approx(t_base["norm_stats"] / 2)
    # dropout masks, one byte per element, only with dropout
    assert t_base["dropout_masks"] == 0
    t_drop = layer_activation_bytes(dataclasses.replace(base, dropout=0.1), par)
    assert t_drop["dropout_masks"] == 2 * s * h
    # CP shards the sequence: exactly half per micro-batch
    half = layer_activation_bytes(base, dataclasses.replace(par, cp=2))
    assert sum(half.values()) == pytest.approx(sum(t_base.values()) / 2)
    assert set(t_base) == set(ACTIVATION_TERMS)


def test_selective_modules_and_full_recompute():
    model = load_model("llama3-8b")
    sel = ParallelConfig(recompute="selective", recompute_modules=("core_attn",), seq_len=8192)
    base = layer_activation_bytes(model, sel)
    mlp = layer_activation_bytes(model, dataclasses.replace(sel, recompute_modules=("core_attn", "mlp")))
    assert mlp["mlp_fc1_output"] == mlp["mlp_fc2_input"] == 0 and mlp["ffn_input"] == base["ffn_input"]
    norm = layer_activation_bytes(model, dataclasses.replace(sel, recompute_modules=("layernorm",)))
    assert norm["attn_input"] == norm["ffn_input"] == 0 and norm["norm_inputs"] == base["norm_inputs"]
    full = layer_activation_bytes(model, dataclasses.replace(sel, recompute="full"))
    assert sum(full.values()) == full["layer_input"] == 8192 * 4096 * 2


def test_full_recompute_uniform_and_block():
    model = load_model("llama3-8b")                      # 32 layers
    par = {"tp": 1, "pp": 1, "seq_len": 4096}
    layer_in = 4096 * 4096 * 2                         # s b h e: a checkpoint's input
    one = sum(layer_activation_bytes(model, ParallelConfig(recompute="none", **par)).values())
    uni = memory_estimate(model, ParallelConfig(recompute="full", recompute_method="uniform", recompute_num_layers=4,
                                                **par))
    assert uni.activations["layer_input"] == 8 * layer_in                 # 32 / 4 checkpoints
    assert uni.activations["recompute_working"] == pytest.approx(4 * one)   # one group rebuilt at a time
    blk = memory_estimate(model, ParallelConfig(recompute="full", recompute_method="block", recompute_num_layers=12,
                                                **par))
    assert blk.activations["layer_input"] == 12 * layer_in
    assert blk.activations["recompute_working"] == pytest.approx(one)
    assert blk.activations_bytes - blk.activations["layer_input"] - blk.activations["recompute_working"] \
        - blk.activations.get("embedding", 0) - blk.activations.get("output_head", 0) == pytest.approx(20 * one)


def test_moe_activations_scale_with_top_k():
    m2 = load_model("tiny-moe")
    m1 = load_model({"preset": "tiny-moe", "moe": {"top_k": 1}})
    par = ParallelConfig(recompute="none", seq_len=512)
    t1, t2 = layer_activation_bytes(m1, par), layer_activation_bytes(m2, par)
    for key in ("expert_input", "expert_fc1_output", "expert_fc2_input", "moe_combine"):
        assert t2[key] == pytest.approx(2 * t1[key]) and t1[key] > 0
    assert t2["router"] == t1["router"] > 0
    assert t2["mlp_fc1_output"] == 0                    # no dense MLP in a MoE layer
    act = layer_activation_bytes(m2, dataclasses.replace(par, recompute="selective", recompute_modules=("moe_act",)))
    assert act["expert_fc2_input"] == 0 and act["expert_fc1_output"] == t2["expert_fc1_output"]
    skew = layer_activation_bytes(m2, par, moe_token_imbalance=1.5)
    assert skew["expert_input"] == pytest.approx(1.5 * t2["expert_input"])


# -- (2) Megatron's theoretical memory report for Llama 3 70B --------------------------------------
def test_megatron_theoretical_memory_llama3_70b():
    """Megatron-LM theoretical_memory_usage.py by hand for Llama 3 70B, stage 0.

    Inputs: h = 8192, f = 28672 (swiglu), a = 64, g = 8 KV groups, L = 80, vocab 128256
    padded to 129024 (make-vocab-size-divisible-by 128 x tp 8), s = 8192, b = 1, tp = 8,
    pp = 4, dp = 4, distributed optimizer, SP, selective recomputation, 32 micro-batches.

    Expected: weight_and_optimizer = 2,271,256,832 params x (6 + 12/4) = 20.44 GB
    (19,494 MB in Megatron's MiB); activation = 21.51 GB (20,512 MB); total 41.95 GB.
    """
    h, f, a, g, L, V, s, b, t, p, d = 8192, 28672, 64, 8, 80, 128256, 8192, 1, 8, 4, 4
    vocab = -(-V // (128 * t)) * 128 * t
    attn = 2 * h * h * (1 + g / a)
    layer = 2 * h * (f * 3 / 2 + 1) + attn
    block = layer * L + h                         # + final norm
    shard = (block / p + h * vocab) / t           # most loaded shard: first stage
    weight_and_optimizer = shard * (6 + 12 / d)
    activation = (s * b * h * (18 + 4 * f / h) * L + 8 * s * b * p + s * b * h * p) / t
    assert weight_and_optimizer == pytest.approx(20.44e9, rel=1e-3)
    assert activation == pytest.approx(21.51e9, rel=1e-3)

    model = load_model("llama3-70b")
    par = ParallelConfig(tp=8, pp=4, dp=4, micro_batch_size=1, global_batch_size=128, seq_len=8192)
    est = memory_estimate(model, par, stage=0, memory_reserve_bytes=0)
    assert est.num_params == pytest.approx(shard, rel=1e-3)
    assert rel(est.static_bytes, weight_and_optimizer) < 0.10
    # SwiGLU keeps gate and up (6 f/h where Megatron's formula has 4 f/h): about +5 %
    assert rel(est.activations_bytes, activation) < 0.10
    assert rel(est.total_bytes, weight_and_optimizer + activation) < 0.10


# -- (3) static accounting ---------------------------------------------------------------------------
@pytest.mark.parametrize("dp", [1, 2, 8, 64])
def test_static_bytes_per_param_exact(dp):
    model = load_model("llama3-8b")             # vocabulary 128256 = 1002 x 128: no padding at tp = 1
    base = {"tp": 1, "pp": 1, "dp": dp, "global_batch_size": dp, "seq_len": 1024}
    plain = memory_estimate(model, ParallelConfig(zero_stage=0, distributed_optimizer=False, **base))
    assert plain.num_params == model.num_params()
    assert plain.static_bytes == pytest.approx(18 * model.num_params(), rel=1e-12)
    dist = memory_estimate(model, ParallelConfig(zero_stage=1, distributed_optimizer=True, **base))
    assert dist.static_bytes == pytest.approx((6 + 12 / dp) * model.num_params(), rel=1e-12)
    # with context parallelism the optimizer is sharded over dp * cp
    cp = memory_estimate(model, ParallelConfig(cp=2, **dict(base, seq_len=2048)))
    assert cp.static_bytes == pytest.approx((6 + 12 / (2 * dp)) * model.num_params(), rel=1e-12)


def test_zero_paper_accounting():
    # Rajbhandari et al. 2020: 16 bytes/param; 4 + 12/Nd, 2 + 14/Nd, 16/Nd
    for stage, want in ((0, 16), (1, 4 + 12 / 64), (2, 2 + 14 / 64), (3, 16 / 64)):
        assert sum(bytes_per_param(stage, 64, "zero_paper").values()) == pytest.approx(want)
    assert sum(bytes_per_param(0, 8).values()) == 18 and sum(bytes_per_param(1, 8).values()) == 7.5
    model = load_model("llama3-8b")
    est = memory_estimate(model, ParallelConfig(zero_stage=0, distributed_optimizer=False, seq_len=1024),
                          accounting="zero_paper")
    assert est.static_bytes == pytest.approx(16 * model.num_params(), rel=1e-12)
    with pytest.raises(ConfigError, match="memory.accounting"):
        memory_estimate(model, ParallelConfig(seq_len=1024), accounting="nope")


def test_effective_zero_stage():
    assert effective_zero_stage(ParallelConfig(zero_stage=1, distributed_optimizer=True)) == 1
    assert effective_zero_stage(ParallelConfig(zero_stage=1, distributed_optimizer=False)) == 0
    assert effective_zero_stage(ParallelConfig(zero_stage=0, distributed_optimizer=True)) == 1
    assert effective_zero_stage(ParallelConfig(zero_stage=3, distributed_optimizer=False)) == 3


def test_per_rank_params_match_model_counts():
    for name in ("llama3-8b", "tiny-moe", "deepseek-v3", "qwen3-30b-a3b", "gpt3-175b", "gpt-oss-120b"):
        model = load_model(name)
        par = ParallelConfig(tp=1, pp=1, seq_len=model.seq_len)
        est = memory_estimate(model, par, make_vocab_size_divisible_by=1)
        assert est.num_params == model.num_params(include_mtp=True), name
    # TP: everything but the replicated norms is split 8 ways
    model = load_model("llama3-70b")
    est = memory_estimate(model, ParallelConfig(tp=8, seq_len=8192), make_vocab_size_divisible_by=1)
    replicated = model.param_breakdown()["norms"]
    assert est.num_params == pytest.approx((model.num_params() - replicated) / 8 + replicated)


def test_experts_sharded_over_ep_and_edp():
    model = load_model("tiny-moe")                        # 4 experts, every layer MoE
    par = ParallelConfig(tp=1, dp=4, ep=4, etp=1, seq_len=512, global_batch_size=4)   # edp = 1
    est = memory_estimate(model, par, make_vocab_size_divisible_by=1)
    routed = model.param_breakdown()["routed_experts"]
    assert est.num_expert_params == routed / 4
    dense = est.num_params - est.num_expert_params
    assert est.master_weights_bytes + est.optimizer_states_bytes == pytest.approx(12 * (dense / 4 + routed / 4 / 1))
    assert est.moe_dispatch_bytes > 0


# -- (4) sharding over data parallelism --------------------------------------------------------------
def test_distributed_optimizer_shrinks_with_dp_and_zero3_shards_params():
    model = load_model("llama3-70b")
    base = {"tp": 8, "pp": 4, "micro_batch_size": 1, "seq_len": 8192}
    static = [memory_estimate(model, ParallelConfig(dp=dp, global_batch_size=4 * dp, **base), stage=0).static_bytes
              for dp in (1, 2, 4, 8, 16)]
    assert all(x > y for x, y in itertools.pairwise(static))
    params = memory_estimate(model, ParallelConfig(dp=1, global_batch_size=4, **base), stage=0).num_params
    assert static[-1] == pytest.approx((6 + 12 / 16) * params)

    z = {stage: memory_estimate(model, ParallelConfig(dp=8, global_batch_size=32, zero_stage=stage, **base), stage=0)
         for stage in (1, 2, 3)}
    assert z[3].weights_bytes == pytest.approx(z[1].weights_bytes / 8)
    assert z[2].gradients_bytes == pytest.approx(z[1].gradients_bytes / 8)
    assert z[3].static_bytes == pytest.approx(18 * params / 8)
    assert z[3].param_gather_bytes > 0 and z[1].param_gather_bytes == 0 and z[2].param_gather_bytes == 0
    # Megatron's buckets are views of its gradient buffer; sharded gradients need two buckets
    # of max(40M, 1M * dp * cp) parameters in flight (fp32)
    assert z[1].dp_buckets_bytes == 0
    assert z[2].dp_buckets_bytes == 2 * 40e6 * 4


# -- (5) micro-batches in flight ---------------------------------------------------------------------
def dense_model(layers: int = 8) -> ModelSpec:
    return ModelSpec(num_layers=layers, hidden_size=1024, num_attention_heads=16, num_kv_heads=4, vocab_size=4096,
                     seq_len=1024)


def test_1f1b_holds_pp_minus_s_and_gpipe_holds_m():
    model, pp, m = dense_model(8), 4, 12
    par = ParallelConfig(pp=pp, global_batch_size=m, seq_len=1024, schedule="1f1b")
    for est in memory_estimates(model, par):
        assert est.in_flight_microbatches == pp - est.stage
        body = est.activations_bytes - est.activations.get("embedding", 0) - est.activations.get("output_head", 0)
        per = est.activation_bytes_per_microbatch - (est.activations.get("embedding", 0)
                                                     + est.activations.get("output_head", 0)) / (pp - est.stage)
        assert body == pytest.approx((pp - est.stage) * per)
    first = memory_estimate(model, par, stage=0)
    assert first.activations_bytes == pytest.approx(pp * first.activation_bytes_per_microbatch)
    gp = memory_estimates(model, dataclasses.replace(par, schedule="gpipe"))
    for est in gp:
        assert est.in_flight_microbatches == m
        assert est.activations_bytes == pytest.approx(m * est.activation_bytes_per_microbatch)
    # the last stage holds the logits of every micro-batch in flight: 1 with 1F1B, m with GPipe
    one = 1024 * 4096 / 1 * 4
    assert memory_estimate(model, par, stage=pp - 1).logits_bytes == one
    assert gp[-1].logits_bytes == m * one
    assert all(e.logits_bytes == 0 for e in gp[:-1])


def test_interleaved_zero_bubble_and_dualpipe_in_flight():
    model, pp, vpp, m = dense_model(16), 4, 2, 16
    inter = ParallelConfig(pp=pp, vpp=vpp, global_batch_size=m, seq_len=1024, schedule="interleaved_1f1b")
    est = memory_estimates(model, inter)
    assert [e.in_flight_microbatches for e in est] == peak_in_flight(get_schedule("interleaved_1f1b")(pp, m, vpp))
    assert est[1].in_flight_microbatches == (pp - 1 - 1) * 2 + (vpp - 1) * pp + 1
    # Korthikanti §4.2.3: stage 0 holds pp (1 + (pp-1)/(pp vpp)) non-interleaved stages' worth
    assert est[0].in_flight_microbatches / vpp == pytest.approx(pp * (1 + (pp - 1) / (pp * vpp)))
    zb = memory_estimates(model, dataclasses.replace(inter, schedule="zb_h1", vpp=1))
    assert [e.in_flight_microbatches for e in zb] == [pp] * pp
    dual = memory_estimates(model, dataclasses.replace(inter, schedule="dualpipe", vpp=1))
    one = memory_estimates(model, dataclasses.replace(inter, schedule="1f1b", vpp=1))
    assert [e.in_flight_microbatches for e in dual] == [pp + 1] * pp
    for d, o in zip(dual, one):
        assert d.num_layers == 2 * o.num_layers
    # middle ranks hold exactly two copies of one stage's layers; the end ranks both carry
    # the embedding and the output layer
    assert dual[1].weights_bytes == pytest.approx(2 * one[1].weights_bytes)
    assert dual[0].num_params == pytest.approx(dual[-1].num_params)


def test_published_llama31_70b_recipe_fits_h100():
    # NVIDIA DGX Cloud expected-performance run (shared/reference/published_runs_h100.csv):
    # Llama 3.1 70B on H100-SXM 80GB, tp 4 pp 4 vpp 5 cp 2, mbs 1, seq 8192, BF16 -- it ran.
    model = load_model("llama3.1-70b")
    par = ParallelConfig(tp=4, pp=4, vpp=5, cp=2, dp=2, micro_batch_size=1, global_batch_size=128, seq_len=8192,
                         schedule="interleaved_1f1b")
    worst = memory_estimate(model, par, gpu_hbm_bytes=get_gpu_spec("H100-SXM"))
    assert worst.stage == 0 and worst.fits()
    assert 50 * GB < worst.total_bytes < 80 * GB


# -- (6) the OOM verdict ---------------------------------------------------------------------------------
def test_oom_verdict_405b_on_one_node():
    model = load_model("llama3.1-405b")
    h100 = get_gpu_spec("H100-SXM")
    par = ParallelConfig(tp=8, pp=1, dp=1, micro_batch_size=1, seq_len=8192)
    est = memory_estimate(model, par, gpu_hbm_bytes=h100)
    assert not est.fits()
    # ~50.7B parameters per GPU x 18 bytes: ~912 GB of static state alone
    assert est.static_bytes == pytest.approx(18 * model.num_params() / 8, rel=0.01)
    assert est.biggest_terms(1)[0][0] == "optimizer_states"
    msg = est.verdict()
    assert "pipeline stage 0" in msg and "ranks 0-7" in msg and "optimizer_states" in msg and "does not fit" in msg
    with pytest.raises(ConfigError, match="pipeline stage 0.*optimizer_states"):
        est.check_fits()
    with pytest.raises(ConfigError, match="optimizer_states"):
        check_fits(memory_estimates(model, par), h100.hbm_bytes)
    check_fits(memory_estimates(load_model("llama3-8b"), ParallelConfig(tp=8, seq_len=8192)), h100)   # no raise


def test_estimate_shape_and_options():
    model = load_model("llama3-8b")
    par = ParallelConfig(tp=2, pp=2, seq_len=4096, global_batch_size=4)
    est = memory_estimate(model, par)
    assert isinstance(est, MemoryEstimate) and est.stage in (0, 1)
    assert est.total_bytes == max(e.total_bytes for e in memory_estimates(model, par))
    assert tuple(est.terms()) == MEMORY_TERMS
    assert est.total_bytes == pytest.approx(sum(est.terms().values()))
    assert est.to_dict()["total_bytes"] == est.total_bytes
    assert "total" in est.format_table()
    assert est.reserve_bytes == DEFAULT_RESERVE_BYTES == sum(v for v, _ in RESERVE_PARTS.values()) == 3 * 2**30
    # FP8 copies cover the GEMM weights: everything but the embedding, output layer and norms
    fp8 = memory_estimate(model, ParallelConfig(seq_len=4096), fp8_weight_copy_bytes_per_param=2)
    parts = model.param_breakdown()
    gemm = model.num_params() - parts["embedding"] - parts["output_layer"] - parts["norms"]
    assert fp8.fp8_weight_copies_bytes == pytest.approx(2 * gemm)
    opts = MemoryOptions(memory_reserve_bytes=0)
    assert memory_estimate(model, par, stage=0, options=opts).reserve_bytes == 0
    with pytest.raises(ConfigError, match="memory.activation_dtype_bytes"):
        memory_estimate(model, par, activation_dtype_bytes=-1)
    with pytest.raises(TypeError, match="unknown memory option"):
        memory_estimate(model, par, bogus=1)
    with pytest.raises(ConfigError, match="stage"):
        memory_estimate(model, par, stage=2)
    with pytest.raises(ValueError, match="HBM"):
        est.fits()
    with pytest.raises(ConfigError, match="parallel.dp"):
        memory_estimate(model, ParallelConfig(dp=-1))


def test_rank_description_follows_mesh_order():
    model = dense_model(8)
    par = ParallelConfig(tp=2, dp=2, pp=2, seq_len=1024, global_batch_size=2)
    assert memory_estimate(model, par, stage=1).where == "pipeline stage 1 (ranks 4-7)"
    inner = dataclasses.replace(par, mesh_order="pp-tp-cp-ep-dp")
    assert "first rank 1" in memory_estimate(model, inner, stage=1).where


def test_mla_and_mtp():
    model = load_model("deepseek-v3")
    par = ParallelConfig(tp=1, pp=16, dp=64, ep=64, etp=1, seq_len=4096, global_batch_size=1024,
                         micro_batch_size=1, num_layers_in_first_pipeline_stage=1,
                         num_layers_in_last_pipeline_stage=0, recompute="none")
    # 61 layers: 1 on the first stage, 60 over the 14 middle ones -- does not divide
    with pytest.raises(ConfigError):
        memory_estimate(model, par)
    par = dataclasses.replace(par, num_layers_in_first_pipeline_stage=5, num_layers_in_last_pipeline_stage=0)
    last = memory_estimate(model, par, stage=15)
    assert last.num_layers == 1                        # only the MTP module's layer
    assert last.activations["mtp_extra"] > 0 and last.logits_bytes == 2 * 4096 * 129280 * 4   # main + MTP head
    mid = memory_estimate(model, par, stage=3)
    assert mid.activations["mla_latents"] > 0 and mid.moe_dispatch_bytes > 0
    up = memory_estimate(model, dataclasses.replace(par, recompute="selective", recompute_modules=("mla_up_proj",)),
                         stage=3)
    assert "q" not in up.activations and "kv" not in up.activations
    assert math.isfinite(mid.total_bytes)


def test_zb_v_stage_0_holds_the_embedding_and_the_loss():
    # the V: stage s holds model chunks s and 2pp-1-s, so stage 0 has the first and the last
    model, pp, m = dense_model(16), 4, 12
    par = ParallelConfig(pp=pp, vpp=2, global_batch_size=m, seq_len=1024, schedule="zb_v")
    est = memory_estimates(model, par)
    assert [e.in_flight_microbatches for e in est] == [2 * pp] * pp      # 2pp half-stage chunk sets
    assert est[0].logits_bytes > 0 and all(e.logits_bytes == 0 for e in est[1:])
    one = memory_estimates(model, dataclasses.replace(par, schedule="1f1b", vpp=1))
    assert one[-1].logits_bytes == est[0].logits_bytes and one[0].logits_bytes == 0
    assert all(e.num_layers == 16 // pp for e in est)
    # the embedding and the output layer both sit on stage 0: its parameters exceed a middle stage's
    # by both, where 1F1B splits them over the first and the last stage
    edge = est[0].num_params - est[1].num_params
    assert edge == pytest.approx((one[0].num_params - one[1].num_params) + (one[-1].num_params - one[1].num_params))

# -- hybrid Mamba-2 stacks (Nemotron 3) ---------------------------------------------------------
def _hybrid(pattern="M*-E"):
    return ModelSpec.from_dict(dict(
        num_layers=len(pattern), hidden_size=64, num_attention_heads=4, num_kv_heads=2, vocab_size=128, seq_len=256,
        mlp="relu2", ffn_hidden_size=96, hybrid_override_pattern=pattern,
        mamba={"num_heads": 4, "head_dim": 16, "state_dim": 8, "num_groups": 2},
        moe={"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 32, "latent_size": 16}))


def test_mamba_layer_activations_closed_form():
    m = _hybrid()
    par = ParallelConfig(tp=2, micro_batch_size=1, seq_len=256, sequence_parallel=True, recompute="none")
    a = layer_activation_bytes(m, par, 0)
    T, Tsp = 256, 128
    assert a["norm_inputs"] == Tsp * 64 * 2                   # one pre-norm's input, BF16
    assert a["attn_input"] == Tsp * 64 * 2                    # the normed in_proj input
    assert a["mamba_in_proj_output"] == T * (2 * 64 + 2 * 2 * 8 + 4) / 2 * 2
    assert a["mamba_scan_output"] == T * 64 / 2 * (2 + 2)     # gated-norm input and out_proj input
    assert a["q"] == a["kv"] == a["mlp_fc1_output"] == 0


def test_hybrid_layers_keep_one_sublayers_activations():
    m = _hybrid()
    par = ParallelConfig(tp=1, micro_batch_size=1, seq_len=256, recompute="none")
    attn, mlp, moe = (layer_activation_bytes(m, par, i) for i in (1, 2, 3))
    assert attn["q"] > 0 and attn["mlp_fc1_output"] == 0 and attn["mamba_in_proj_output"] == 0
    assert mlp["q"] == 0 and mlp["mlp_fc1_output"] == 256 * 96 * 2
    assert moe["expert_input"] == 256 * 2 * 16 * 2           # top-2 copies of latent-wide tokens


def test_hybrid_stage_parameters_match_the_model():
    m = _hybrid()
    par = ParallelConfig(tp=1, ep=1, dp=1, micro_batch_size=1, seq_len=256, global_batch_size=1,
                         distributed_optimizer=False)
    est = memory_estimate(m, par, stage=0)
    assert est.num_params == pytest.approx(m.num_params(), abs=1)       # experts included
    assert est.num_expert_params == 4 * 2 * 16 * 32
