"""Class-level programs: classes, collectives per layer, matching, buckets, p2p pairing."""

import collections

import pytest

from topologies import ConfigError, get_gpu_spec
from workloads import ParallelConfig, load_model
from workloads.costs.precision import get_recipe
from workloads.program import _check_matching, build_program

H100 = get_gpu_spec("H100-SXM")


def prog(model="tiny-dense", **kw):
    base = dict(tp=2, pp=2, dp=2, micro_batch_size=1, global_batch_size=8, seq_len=256)
    base.update(kw)
    routing = base.pop("moe_routing", "balanced")
    return build_program(load_model(model), ParallelConfig(**base), H100, moe_routing=routing)


def per_layer(ops, phase, names):
    c = collections.Counter((op.layer, op.coll) for op in ops if op.phase == phase and op.name in names)
    return c


def test_dense_classes_are_pipeline_stages():
    p = prog()
    assert [c.members for c in p.classes] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert all(p.rank_ops(r) is p.classes[p.class_of_rank[r]].ops for r in range(8))


def test_sequence_parallel_collectives_per_layer():
    p = prog(recompute="none")
    ops = p.classes[0].ops
    fwd = collections.Counter(op.coll for op in ops if op.group == "tp" and op.phase == "F" and op.microbatch == 0)
    bwd = collections.Counter(op.coll for op in ops if op.group == "tp" and op.phase == "B" and op.microbatch == 0)
    layers = 2                                       # tiny-dense: 4 layers over 2 stages
    assert fwd == {"all_gather": 2 * layers, "reduce_scatter": 2 * layers}
    assert bwd == {"all_gather": 4 * layers, "reduce_scatter": 2 * layers}
    p = prog(sequence_parallel=False, recompute="none")
    ops = p.classes[0].ops
    assert collections.Counter(op.coll for op in ops if op.group == "tp" and op.microbatch == 0) == \
        {"all_reduce": 4 * layers}
    # full recompute repeats each layer's forward collectives before its backward
    p = prog(recompute="full")
    ops = p.classes[0].ops
    rec = collections.Counter(op.coll for op in ops if op.group == "tp" and op.phase == "R" and op.microbatch == 0)
    assert rec == {"all_gather": 2 * layers, "reduce_scatter": 2 * layers}


def test_gradient_buckets_and_parameter_gathers_cover_the_local_parameters():
    p = prog(tp=1, pp=1, dp=4, global_batch_size=8)
    ops = p.classes[0].ops
    m = load_model("tiny-dense")
    grads = sum(op.size_bytes for op in ops if op.name in ("grad_dense", "grad_expert"))
    gathers = sum(op.size_bytes for op in ops if op.name.startswith("param_gather"))
    assert grads == pytest.approx(4 * m.num_params(), rel=1e-6)       # fp32 gradient reduction
    assert gathers == pytest.approx(2 * m.num_params(), rel=1e-6)     # bf16 parameters
    assert all(op.coll == "reduce_scatter" for op in ops if op.name in ("grad_dense", "grad_expert"))
    # the buckets come during the last micro-batch's backward, not earlier
    last_mb = max(op.microbatch for op in ops)
    first_bucket = next(i for i, op in enumerate(ops) if op.name in ("grad_dense", "grad_expert"))
    assert all(op.microbatch in (last_mb, -1) for op in ops[first_bucket - 3:first_bucket])


@pytest.mark.parametrize("schedule, vpp, pp, gbs", [("1f1b", 1, 2, 8), ("gpipe", 1, 2, 8),
                                                    ("interleaved_1f1b", 2, 2, 8), ("zb_h1", 1, 2, 8),
                                                    ("dualpipe", 1, 2, 8), ("zb_v", 2, 2, 8)])
def test_every_send_has_its_receive(schedule, vpp, pp, gbs):
    p = prog(schedule=schedule, vpp=vpp, pp=pp, global_batch_size=gbs, dp=2)
    sends = collections.Counter(op.tag for c in p.classes for op in c.ops if op.kind == "send")
    recvs = collections.Counter(op.tag for c in p.classes for op in c.ops if op.kind == "recv")
    assert sends and sends == recvs


def test_moe_classes_split_only_when_routing_is_skewed():
    kw = dict(tp=1, pp=2, dp=4, ep=4, etp=1, global_batch_size=8, seq_len=256)
    balanced = prog("tiny-moe", **kw)
    assert len(balanced.classes) == 2
    skewed = prog("tiny-moe", moe_routing="skew(2.0)", **kw)
    assert len(skewed.classes) == 2 * 4
    ops = skewed.classes[0].ops
    assert any(op.coll == "all_to_all" and op.group == "ep" for op in ops)
    # one expert per EP rank: in every (layer, micro-batch) the hot rank does 2x the mean expert work
    work = collections.defaultdict(list)
    for c in skewed.classes:
        if c.stage == 0:
            for op in c.ops:
                if op.name == "experts":
                    work[(op.layer, op.microbatch)].append(op.flops)
    for flops in work.values():
        assert max(flops) / (sum(flops) / len(flops)) == pytest.approx(2.0, rel=0.02)


def test_expert_tensor_parallelism_gathers_and_scatters_around_the_experts():
    """Megatron-Core's all-to-all dispatcher with expert TP: all-gather of the received
    tokens over the expert-TP group after dispatch, reduce-scatter before combine, and the
    mirror in backward; nothing of the kind with etp = 1."""
    kw = dict(pp=1, ep=2, global_batch_size=8, seq_len=256, sequence_parallel=True)
    with_etp = prog("tiny-moe", tp=2, dp=4, etp=2, **kw)
    ops = with_etp.classes[0].ops
    layer0 = [op.name for op in ops if op.layer == 0 and op.microbatch == 0 and op.phase in ("F", "B")
              and (op.group in ("ep", "etp") or op.name.startswith("experts"))]
    assert layer0 == ["ep_dispatch", "etp_ag", "experts", "etp_rs", "ep_combine",
                      "ep_combine_bwd", "etp_ag_bwd", "experts_bwd", "etp_rs_bwd", "ep_dispatch_bwd"]
    a2a = next(op.size_bytes for op in ops if op.name == "ep_dispatch")
    assert all(op.size_bytes == 2 * a2a and op.group == "etp" for op in ops if op.name.startswith("etp_"))
    plain = prog("tiny-moe", tp=2, dp=4, etp=1, **kw)
    assert not any(op.group == "etp" for c in plain.classes for op in c.ops)


def test_zero3_gathers_parameters_per_layer():
    p = prog(tp=1, pp=1, dp=4, zero_stage=3, distributed_optimizer=False)
    names = collections.Counter(op.name for op in p.classes[0].ops)
    # 4 layers, the embedding and the output layer, x 2 micro-batches
    assert names["fsdp_gather"] == 6 * 2 and names["fsdp_gather_bwd"] == 6 * 2


def test_mismatched_collectives_are_caught():
    p = prog()
    ops = p.classes[1].ops
    i = next(k for k, op in enumerate(ops) if op.group == "world")
    ops[i] = ops[i]._replace(size_bytes=16.0)
    with pytest.raises(ConfigError, match="world"):
        _check_matching(p)


def test_llama_405b_layout_builds_with_executed_flops_above_model_flops():
    par = ParallelConfig(tp=8, pp=16, dp=4, micro_batch_size=1, global_batch_size=64, seq_len=8192,
                         num_layers_in_first_pipeline_stage=7, num_layers_in_last_pipeline_stage=7)
    p = build_program(load_model("llama3.1-405b"), par, H100)
    assert len(p.classes) == 16
    executed = sum(sum(op.flops for op in c.ops) * c.size for c in p.classes)
    # executed FLOPs (recompute, causal diagonal blocks, loss...) exceed model FLOPs, not by much
    assert 1.0 < executed / p.model_flops_per_step < 1.15


def test_per_rank_expansion_resolves_groups_and_peers():
    p = prog()
    groups = p.groups()
    for rank in (0, 5):
        ops = p.expand(rank)
        for op in ops:
            if op.kind == "collective":
                assert rank in groups[op.peer]
                assert groups[op.peer] == p.group_members(op.group, rank)
            elif op.kind in ("send", "recv"):
                assert p.grid.coords(op.peer)["tp"] == p.grid.coords(rank)["tp"]
                assert abs(p.grid.stage_of(op.peer) - p.grid.stage_of(rank)) == 1


def test_fp8_program_is_faster_but_not_by_the_peak_ratio():
    par = ParallelConfig(tp=8, pp=1, dp=1, micro_batch_size=1, global_batch_size=1, seq_len=8192)
    m = load_model("llama3-70b")
    t = {}
    for precision in ("bf16", "fp8_delayed"):
        p = build_program(m, par, H100, precision=precision)
        t[precision] = sum(op.duration_s for op in p.classes[0].ops if op.kind == "compute")
        if precision != "bf16":
            assert any(op.name == "weight_quantize" for op in p.classes[0].ops)
    assert 1.0 < t["bf16"] / t["fp8_delayed"] < 2.0


def test_nvfp4_keeps_its_bf16_layers_in_every_stage():
    """NVFP4 with the first 2 and last 8 layers' GEMMs in BF16 (NVIDIA's NVFP4 study; the
    recipe's default keeps none, as Megatron-Bridge's): each layer costs what its own
    precision says, whichever layer a stage starts with (the per-layer cost cache once took
    the stage's first layer for all), and only the low-precision layers' weights are
    quantised."""
    b200 = get_gpu_spec("B200")
    m = load_model("llama3-8b")
    L = m.num_layers
    par = ParallelConfig(tp=1, pp=2, dp=1, micro_batch_size=1, global_batch_size=2, seq_len=1024)

    def mlp_forward(precision):
        p = build_program(m, par, b200, precision=precision)
        return p, {o.layer: o.duration_s for c in p.classes for o in c.ops
                   if o.name == "mlp" and o.phase == "F" and o.microbatch == 0}

    p4, fp4 = mlp_forward(get_recipe("nvfp4", gpu=b200, bf16_first_layers=2, bf16_last_layers=8))
    _, bf16 = mlp_forward("bf16")
    assert sorted(fp4) == list(range(L))
    for layer in (0, 1, *range(L - 8, L)):
        assert fp4[layer] == pytest.approx(bf16[layer]), layer
    for layer in (2, L // 2 - 1, L // 2, L - 9):
        assert fp4[layer] < 0.7 * bf16[layer], layer
    wq = [sum(o.duration_s for o in c.ops if o.name == "weight_quantize") for c in p4.classes]
    assert wq[0] / wq[1] == pytest.approx((L // 2 - 2) / (L // 2 - 8), rel=0.01)   # 14 vs 8 quantised layers


def test_windowed_and_full_layers_run_their_own_attention():
    # gpt-oss-style alternation on tiny-moe: layers 0 and 2 windowed, 1 and 3 full.  The
    # program reuses one layer's ops for every layer of the same kind; the window is part of
    # the kind (a cache keyed on MoE-ness alone gave every layer layer 0's attention)
    from workloads.costs.flops import layer_ops, sum_flops
    model = load_model({"preset": "tiny-moe", "sliding_window": 32, "window_attn_skip_freq": 2})
    par = ParallelConfig(tp=1, pp=1, dp=1, micro_batch_size=1, global_batch_size=1, seq_len=512, recompute="none")
    p = build_program(model, par, H100)
    flops = collections.Counter()
    for op in p.classes[0].ops:
        if op.microbatch == 0 and op.layer >= 0:
            flops[op.layer] += op.flops
    want = [sum_flops(layer_ops(model, par, i)) for i in range(4)]
    assert [flops[i] for i in range(4)] == pytest.approx(want, rel=1e-12)
    assert want[0] == want[2] < want[1] == want[3]


def test_zb_v_keeps_a_tied_embedding_on_one_stage():
    # ZB-V puts the embedding and the output layer both on stage 0: no embedding-group
    # all-reduce between stages (1F1B has one on its first and last stage)
    tied = {"preset": "tiny-dense", "tied_embeddings": True}
    from workloads import load_model as lm
    model = lm(tied)
    kw = dict(tp=1, pp=2, dp=1, micro_batch_size=1, global_batch_size=4, seq_len=256)
    v = build_program(model, ParallelConfig(schedule="zb_v", vpp=2, **kw), H100)
    one = build_program(model, ParallelConfig(schedule="1f1b", **kw), H100)
    names = lambda p: [op.name for c in p.classes for op in c.ops]      # noqa: E731
    assert names(one).count("tied_embedding_grad") == 2
    assert names(v).count("tied_embedding_grad") == 0
    assert v.async_sends and not one.async_sends

# -- hybrid Mamba-2 stacks (Nemotron 3) ---------------------------------------------------------
def test_hybrid_program_mamba_cp_all_to_alls_and_one_block_per_layer():
    from workloads.model import ModelSpec
    from workloads.ops import OpName
    m = ModelSpec.from_dict(dict(
        num_layers=4, hidden_size=64, num_attention_heads=4, num_kv_heads=2, vocab_size=128, seq_len=256,
        mlp="relu2", ffn_hidden_size=96, hybrid_override_pattern="M*ME",
        mamba={"num_heads": 4, "head_dim": 16, "state_dim": 8, "num_groups": 2},
        moe={"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 32, "latent_size": 16}))
    par = ParallelConfig(tp=1, cp=2, ep=2, dp=2, micro_batch_size=1, seq_len=256, global_batch_size=4,
                         recompute="none")
    p = build_program(m, par, H100, num_gpus=4)
    ops = p.classes[0].ops
    names = [o.name for o in ops]
    mb = par.resolve(4).num_microbatches
    # two all-to-alls per Mamba layer forward (in_proj output to head-split, scan output back), two backward
    assert names.count(OpName.CP_MAMBA_A2A) == 2 * 2 * mb
    assert names.count(OpName.CP_MAMBA_A2A_BWD) == 2 * 2 * mb
    assert names.count(OpName.CP_HOP) == 1 * mb              # the one attention layer: a p2p ring of cp - 1 hops
    assert names.count(OpName.MAMBA) == 2 * mb and names.count(OpName.ATTN) == 1 * mb
    assert names.count(OpName.MLP) == 0 and names.count(OpName.EXPERTS) == 1 * mb
    # the dispatch carries latent-wide tokens: T/cp x top_k x latent x 2 bytes
    disp = next(o for o in ops if o.name == OpName.EP_DISPATCH)
    assert disp.size_bytes == 256 / 2 * 2 * 16 * 2
    a2a = [o for o in ops if o.name == OpName.CP_MAMBA_A2A][:2]
    assert [o.size_bytes for o in a2a] == [128 * (2 * 64 + 2 * 2 * 8 + 4) * 2, 128 * 64 * 2]


def test_hybrid_pipeline_stages_split_the_pattern_by_layer_count():
    # Megatron splits a hybrid pattern (without '|') into equal numbers of layers per stage;
    # each stage's program runs its own layers' kinds and its memory holds their parameters
    from workloads.memory import memory_estimate
    from workloads.model import ModelSpec
    from workloads.ops import OpName
    m = ModelSpec.from_dict(dict(
        num_layers=4, hidden_size=64, num_attention_heads=4, num_kv_heads=2, vocab_size=128, seq_len=256,
        mlp="relu2", ffn_hidden_size=96, hybrid_override_pattern="MM*-",
        mamba={"num_heads": 4, "head_dim": 16, "state_dim": 8, "num_groups": 2}))
    par = ParallelConfig(tp=1, pp=2, dp=1, micro_batch_size=1, seq_len=256, global_batch_size=2, recompute="none")
    p = build_program(m, par, H100, num_gpus=2)
    by_stage = {c.stage: [o.name for o in c.ops] for c in p.classes}
    assert by_stage[0].count(OpName.MAMBA) == 2 * 2 and by_stage[0].count(OpName.ATTN) == 0
    assert by_stage[1].count(OpName.MAMBA) == 0 and by_stage[1].count(OpName.ATTN) == 2
    assert by_stage[1].count(OpName.MLP) == 2
    est = [memory_estimate(m, par.resolve(2), stage=s) for s in (0, 1)]
    assert est[0].activations["mamba_in_proj_output"] > 0 and "mamba_in_proj_output" not in est[1].activations


@pytest.mark.parametrize("precision, gathered", [("bf16", 2.0), ("mxfp8", 1 + 1 / 32), ("nvfp4", 0.5 + 1 / 16)])
def test_sequence_parallel_gathers_move_the_recipes_format(precision, gathered):
    """Transformer Engine quantises before it all-gathers (``gather_along_first_dim`` with a
    quantiser): the forward input, the backward's re-gathered input and the row-parallel
    output gradient move ``gathered`` bytes per element -- NVFP4's packed 4-bit data plus one
    E4M3 scale per 16 elements, MXFP8's byte plus one E8M0 scale per 32 -- while the
    reduce-scatters move BF16.  Layers the recipe keeps in BF16 gather BF16."""
    B200 = get_gpu_spec("B200")
    opts = {"bf16_first_layers": 1} if precision != "bf16" else {}
    recipe = get_recipe(precision, **opts)
    p = build_program(load_model("tiny-dense"), ParallelConfig(tp=2, pp=1, dp=1, micro_batch_size=1,
                                                               global_batch_size=1, seq_len=256),
                      B200, precision=recipe)
    elements = 256 * load_model("tiny-dense").hidden_size
    sizes = collections.defaultdict(set)
    for op in p.classes[0].ops:
        if op.group == "tp":
            sizes[(op.name, op.layer == 0)].add(op.size_bytes)
    for name in ("sp_ag", "sp_ag_input", "sp_ag_dout"):
        assert sorted(sizes[(name, False)]) == pytest.approx([gathered * elements])
        assert sorted(sizes[(name, True)]) == pytest.approx([2.0 * elements])      # a BF16 layer
    for name in ("sp_rs", "sp_rs_dgrad"):
        assert sorted(sizes[(name, False)]) == sorted(sizes[(name, True)]) == pytest.approx([2.0 * elements])


def test_hybrid_moe_layers_honour_the_allgather_dispatcher():
    """A hybrid stack's MoE layers run the same lowering as a transformer's: with
    ``token_dispatcher: allgather`` the EP points are all-gathers and reduce-scatters.  (Before
    the block lowering, hybrid MoE layers had their own copy of the MoE path and always
    emitted all-to-alls, whatever the dispatcher.)"""
    m = load_model("nemotron3-nano")
    m = load_model({**m.to_dict(), "moe": {**m.moe.to_dict(), "token_dispatcher": "allgather"}})
    par = ParallelConfig(tp=2, pp=1, dp=2, ep=2, etp=1, micro_batch_size=1, global_batch_size=8,
                         sequence_parallel=True, seq_len=4096)
    ops = build_program(m, par, H100).classes[0].ops
    ep = collections.Counter((o.name, o.coll) for o in ops if o.group == "ep")
    n = m.hybrid_layer_counts()["moe"] * par.num_microbatches
    assert ep == {("ep_dispatch", "all_gather"): n, ("ep_combine", "reduce_scatter"): n,
                  ("ep_combine_bwd", "all_gather"): n, ("ep_dispatch_bwd", "reduce_scatter"): n}


@pytest.mark.parametrize("model", ["tiny-dense", "tiny-moe"])
def test_mtp_modules_run_on_the_last_stage(model):
    """Multi-token prediction modules are simulated, not only counted: an MTP module's layer
    (index num_layers), with its embedding, eh_proj, output GEMM and loss, runs after the last
    decoder layer on the last pipeline stage, as Megatron-Core builds them in its post-process
    stage; its gradients join the last stage's buckets. (Until this change the program emitted
    no MTP op while the model FLOPs and memory counted them: MTP models ran too fast.)"""
    base = dict(tp=1, pp=2, dp=2, micro_batch_size=1, global_batch_size=8, seq_len=256)
    plain = load_model(model)
    with_mtp = load_model({"preset": model, "mtp_layers": 1})
    p0 = build_program(plain, ParallelConfig(**base), H100)
    p1 = build_program(with_mtp, ParallelConfig(**base), H100)
    n = with_mtp.num_layers
    first, last = p1.classes[0].ops, p1.classes[-1].ops
    assert not any(op.layer == n for op in first)
    mtp_fwd = [op for op in last if op.layer == n and op.phase == "F" and op.kind == "compute" and op.microbatch == 0]
    assert mtp_fwd, "the MTP module runs no forward op"
    # the last stage's forward compute grows by exactly the MTP layer's ops; the first stage's does not
    def fwd_s(prog, stage):
        return sum(op.duration_s for op in prog.classes[stage].ops
                   if op.kind == "compute" and op.phase == "F" and op.microbatch == 0)
    assert fwd_s(p1, 0) == pytest.approx(fwd_s(p0, 0), rel=1e-12)
    assert fwd_s(p1, 1) == pytest.approx(fwd_s(p0, 1) + sum(op.duration_s for op in mtp_fwd), rel=1e-12)
    # the module's unique parameters (its layer, enorm, hnorm, final norm, eh_proj) are reduced
    grads = lambda p: sum(op.size_bytes for op in p.classes[-1].ops if op.name in ("grad_dense", "grad_expert"))  # noqa: E731
    extra = grads(p1) - grads(p0)
    assert extra == pytest.approx(4 * with_mtp.param_breakdown()["mtp"], rel=1e-6)     # fp32, dp reduce
