"""A routed layer's kernel rows rebuilt only where the load changes them
(``workloads.stacks.megatron_te.context.kernel_rows``) give the very programs that building
every layer whole gives: under skewed routing each EP rank and micro-batch has its own load,
and every op of every rank class must come out equal, floats bit for bit."""

import struct

import pytest

from simulator.scenario import load_scenario
from workloads import build_program
from workloads.costs.flops import layer_load_ops, layer_ops
from workloads.stacks.megatron_te import context


def _scenario(model, *, ep=4, pp=2, dp=4, routing="zipf(1.2)", parallel=None, **top) -> dict:
    world = pp * dp
    sc = {"model": model, "cluster": {"preset": "dgx-h100", "num_nodes": 1, "gpus_per_host": world,
                                      "nics_per_host": world},
          "parallel": {"tp": 1, "pp": pp, "dp": -1, "ep": ep, "micro_batch_size": 1, "global_batch_size": 4 * dp,
                       "seq_len": 1024, **(parallel or {})},
          "moe_routing": routing, "seed": 3, "host": "eager", **top}
    return sc


TINY16 = {"preset": "tiny-moe", "num_layers": 4, "moe": {"num_experts": 16}}
DSV3 = {"preset": "deepseek-v3", "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8, "num_kv_heads": 8,
        "vocab_size": 4096, "moe": {"num_experts": 16, "first_k_dense": 1, "expert_ffn_hidden_size": 512,
                                    "shared_expert_ffn_hidden_size": 512}}
GPT_OSS = {"preset": "gpt-oss-20b", "num_layers": 4, "moe": {"num_experts": 16}}

CASES = {
    # FP8 quantisation ops around the grouped GEMMs, the MoE activation recomputed
    "fp8-selective": _scenario(TINY16, precision="fp8_delayed",
                               parallel={"recompute": "selective", "recompute_modules": ["core_attn", "moe_act"]}),
    # MLA, shared experts, dense first layer, MTP; full recompute; CUDA graphs
    "dsv3-full-graphs": _scenario(DSV3, precision="fp8_blockwise", host="cuda_graphs",
                                  parallel={"recompute": "full", "schedule": "interleaved_1f1b", "vpp": 2}),
    # clamped activation and expert biases; the whole MoE layer recomputed; a capacity factor
    # that drops tokens (routed per source)
    "gpt-oss-moe-recompute-capacity": _scenario({**GPT_OSS, "moe": {**GPT_OSS["moe"], "capacity_factor": 1.0}},
                                                routing="skew(2.0)",
                                                parallel={"recompute": "selective", "recompute_modules": ["moe"]}),
    # torchtitan's eager MoE kernels
    "torchtitan": _scenario(TINY16, ep=2, pp=1, dp=8, framework="torchtitan"),
}


def _bits(value):
    """``value`` with every float as its bit pattern (so 0.0 and -0.0 differ, NaN equals NaN)."""
    if isinstance(value, float):
        return ("f", struct.pack("<d", value))
    if isinstance(value, tuple):
        return tuple(_bits(v) for v in value)
    return value


def _program(sc: dict):
    s = load_scenario(sc)
    return build_program(s.model, s.parallel, s.cluster.gpu, precision=s.recipe_or_name, moe_routing=s.moe_routing,
                         seed=s.seed, host=s.host, overlap=s.overlap, framework=s.framework,
                         stack_options=s.stack_options)


@pytest.mark.parametrize("name", sorted(CASES))
def test_spliced_rows_give_the_same_program(name, monkeypatch):
    sc = CASES[name]
    fast = _program(sc)
    ctx = fast._lowering[1]
    templates = [v for k, v in ctx.seg_cache.items() if k[0] == "load_template"]
    assert any(templates), "the skewed scenario must reuse layer rows"
    monkeypatch.setattr(context, "SPLICE_LOAD_ROWS", False)
    whole = _program(sc)
    assert len(fast.classes) == len(whole.classes) > 1
    assert fast.class_of_rank.tolist() == whole.class_of_rank.tolist()
    for a, b in zip(fast.classes, whole.classes):
        assert (a.stage, a.members, len(a.ops)) == (b.stage, b.members, len(b.ops))
        for x, y in zip(a.ops, b.ops):
            assert _bits(tuple(x)) == _bits(tuple(y)), (a.class_id, x, y)
    assert fast.a2a_sizes.keys() == whole.a2a_sizes.keys()
    for k, m in fast.a2a_sizes.items():
        assert m.tobytes() == whole.a2a_sizes[k].tobytes()


def test_a_load_of_another_kind_builds_the_whole_layer(monkeypatch):
    """An expert without tokens has no quantisation op for its share: the load's ops differ in
    kind from the template's, and the rows come from the whole layer."""
    prog = _program(CASES["fp8-selective"])
    ctx = prog._lowering[1]
    loads = [(40.0, 30.0, 20.0, 10.0), (0.0, 0.0, 0.0, 0.0), (7.0, 0.0, 3.0, 1.0), (41.0, 29.0, 21.0, 9.0)]
    def segments(t):
        return {k: _bits(tuple(v) if isinstance(v, list) else v)
                for k, v in context._kernel_segments(ctx, 1, t, "selective").items()}

    for sweep in (loads, loads[::-1]):
        ctx.seg_cache.clear()
        got = [context.kernel_rows(ctx, 1, t, "selective") for t in sweep]
        got_seg = [list(segments(t).items()) for t in sweep]
        monkeypatch.setattr(context, "SPLICE_LOAD_ROWS", False)
        ctx.seg_cache.clear()
        want = [context.kernel_rows(ctx, 1, t, "selective") for t in sweep]
        want_seg = [list(segments(t).items()) for t in sweep]
        monkeypatch.setattr(context, "SPLICE_LOAD_ROWS", True)
        for g, w in zip(got, want):
            assert [_bits(tuple(r)) for r in g] == [_bits(tuple(r)) for r in w]
        assert got_seg == want_seg          # (segments in the same order too)


def test_layer_load_ops_are_the_layer_ops_that_depend_on_the_load():
    s = load_scenario(CASES["dsv3-full-graphs"])
    for layer in range(s.model.num_layers + s.model.mtp_layers):
        for tokens in ((5.0, 0.0, 7.0, 1.0), (1.0, 2.0, 3.0, 4.0)):
            full = layer_ops(s.model, s.parallel, layer, tokens_per_expert=tokens, recompute="full")
            load = layer_load_ops(s.model, s.parallel, layer, tokens_per_expert=tokens, recompute="full")
            names = {o.name for o in load}
            assert [o for o in full if o.name in names] == load
            assert bool(load) == s.model.is_moe_layer(min(layer, s.model.num_layers - 1))
