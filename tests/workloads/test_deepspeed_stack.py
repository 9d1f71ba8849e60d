"""The deepspeed kernel stack (workloads/stacks/deepspeed/): DeepSpeed v0.16.4's gradient
buckets and reductions per ZeRO stage, ZeRO-1/2's exposed parameter all-gather, ZeRO-3's
per-layer gathers (persistence threshold, prefetch calls, reuse distance), the scenario's
``deepspeed`` section and the layouts the stack refuses."""

from __future__ import annotations

import math

import pytest

from simulator import run
from simulator.scenario import load_scenario
from simulator.validation.mapping import row_to_scenario
from topologies import ConfigError
from workloads import build_program
from workloads.ops import Coll, Issue, OpName, is_fsdp_gather, is_grad_bucket
from workloads.stacks import get_stack
from workloads.stacks.deepspeed import DeepSpeedOptions, deepspeed_options

_LLAMA = "llama3-8b"


def _scenario(zero_stage, model=_LLAMA, dp=8, mbs_per_step=1, deepspeed=None, framework="deepspeed", **par):
    data = {"model": model, "cluster": {"preset": "dgx-h100", "num_nodes": max(1, dp // 8)},
            "parallel": {"dp": dp, "micro_batch_size": 1, "global_batch_size": dp * mbs_per_step, "seq_len": 2048,
                         "zero_stage": zero_stage, "distributed_optimizer": zero_stage > 0, "recompute": "full",
                         **par},
            "framework": framework, "num_steps": 2}
    if deepspeed is not None:
        data["deepspeed"] = deepspeed
    return load_scenario(data)


def _ops(sc):
    prog = build_program(sc.model, sc.parallel, sc.cluster.gpu, framework=sc.framework, overlap=sc.overlap,
                         stack_options=sc.stack_options)
    return prog.classes[0].ops


def _greedy_buckets(sizes, bucket):
    """DeepSpeed's rule: a bucket is reduced before a gradient that would overflow it joins."""
    out, pending = [], 0
    for n in sizes:
        if pending and pending + n > bucket:
            out.append(pending)
            pending = 0
        pending += n
    return out + ([pending] if pending else [])


def _backward_sizes(model):
    """Parameters in backward order: output layer + final norm, the layers last to first, the embedding."""
    h = model.hidden_size
    layers = [model.layer_num_params(i) for i in reversed(range(model.num_layers))]
    return [model.vocab_size * h + h] + layers + [model.vocab_size * h]


# -- options -----------------------------------------------------------------------------------

def test_defaults_are_deepspeeds_and_overlap_comm_is_on_only_at_stage3():
    o = DeepSpeedOptions()
    assert (o.reduce_bucket_size, o.stage3_prefetch_bucket_size, o.stage3_param_persistence_threshold,
            o.stage3_max_live_parameters) == (5e8, 5e7, 1e5, 1e9)
    assert [o.overlap(z) for z in range(4)] == [False, False, False, True]
    assert deepspeed_options({"overlap_comm": True}).overlap(1) is True
    assert deepspeed_options({"overlap_comm": False}).overlap(3) is False


@pytest.mark.parametrize("raw,field,rule", [
    ({"reduce_bucket_size": 0}, "deepspeed.reduce_bucket_size", ">= 1"),
    ({"stage3_prefetch_bucket_size": -5}, "deepspeed.stage3_prefetch_bucket_size", ">= 0"),
    ({"stage3_param_persistence_threshold": 1.5}, "deepspeed.stage3_param_persistence_threshold", "whole number"),
    ({"overlap_comm": "yes"}, "deepspeed.overlap_comm", "true or false"),
    ({"communication_data_type": "fp8"}, "deepspeed.communication_data_type", "bf16, fp16, fp32"),
    ({"allgather_bucket_size": 5e8}, "deepspeed.allgather_bucket_size", "unknown option"),
])
def test_a_bad_option_is_refused_with_field_value_and_rule(raw, field, rule):
    with pytest.raises(ConfigError) as e:
        _scenario(1, model="tiny-dense", deepspeed=raw)
    assert e.value.field == field and e.value.value == next(iter(raw.values())) and rule in e.value.rule


def test_the_deepspeed_section_needs_the_deepspeed_framework():
    with pytest.raises(ConfigError, match="scenario.deepspeed.*only with framework: deepspeed"):
        _scenario(1, model="tiny-dense", deepspeed={"overlap_comm": True}, framework="megatron_core")
    with pytest.raises(ConfigError, match="takes no options"):
        get_stack("megatron_core").parse_options({"overlap_comm": True})


@pytest.mark.parametrize("axis", ["tp", "pp"])
def test_model_parallel_layouts_are_refused(axis):
    with pytest.raises(ConfigError) as e:
        _ops(_scenario(1, model="tiny-dense", dp=4, **{axis: 2}))
    assert e.value.field == f"parallel.{axis}" and e.value.value == 2 and "data parallelism only" in e.value.rule


# -- ZeRO-0/1/2: buckets, all-reduce, the step's all-gather --------------------------------------

def test_zero1_buckets_follow_reduce_bucket_size_and_are_all_reduced_after_the_backward():
    sc = _scenario(1)
    ops = _ops(sc)
    grads = [o for o in ops if is_grad_bucket(o)]
    expect = _greedy_buckets(_backward_sizes(sc.model), 500_000_000)
    assert len(expect) == 2 + math.ceil(sc.model.num_layers / 2)        # output, 2 layers a bucket, embedding
    assert [o.size_bytes for o in grads] == pytest.approx([2.0 * n for n in expect])     # BF16
    assert {o.coll for o in grads} == {Coll.ALL_REDUCE} and {o.issue for o in grads} == {Issue.BLOCKING}
    last_backward = max(i for i, o in enumerate(ops) if o.kind == "compute" and o.phase in ("B", "W"))
    assert min(i for i, o in enumerate(ops) if is_grad_bucket(o)) > last_backward
    bigger = _ops(_scenario(1, deepspeed={"reduce_bucket_size": 1_000_000_000}))
    assert len([o for o in bigger if is_grad_bucket(o)]) == len(_greedy_buckets(_backward_sizes(sc.model), 1e9))


def test_zero1_2_gather_the_updated_parameters_in_one_exposed_call():
    for stage in (1, 2):
        sc = _scenario(stage)
        gathers = [o for o in _ops(sc) if o.name == OpName.PARAM_GATHER_DENSE]
        assert len(gathers) == 1 and gathers[0].issue is Issue.BLOCKING
        assert gathers[0].size_bytes == pytest.approx(2.0 * sc.model.num_params())
    assert not [o for o in _ops(_scenario(3)) if o.name == OpName.PARAM_GATHER_DENSE]


def test_zero2_reduces_every_microbatch_inline_and_overlap_comm_moves_it_to_a_side_stream():
    plain = _ops(_scenario(2, mbs_per_step=2))
    grads = [o for o in plain if is_grad_bucket(o)]
    assert len(grads) == 2 * len(_greedy_buckets(_backward_sizes(_scenario(2).model), 5e8))
    assert {o.issue for o in grads} == {Issue.BLOCKING} and {o.coll for o in grads} == {Coll.ALL_REDUCE}
    first_grad = min(i for i, o in enumerate(plain) if is_grad_bucket(o))
    assert any(o.kind == "compute" and o.phase == "B" for o in plain[first_grad:])   # during the backward
    overlapped = _ops(_scenario(2, mbs_per_step=2, deepspeed={"overlap_comm": True}))
    assert {o.issue for o in overlapped if is_grad_bucket(o)} == {Issue.DP_STREAM}


def test_zero1_exposed_reduction_is_bytes_over_bandwidth_and_overlap_comm_hides_it():
    """Without overlap_comm nothing overlaps the DP collectives: exposed DP time is the sum of
    the buckets' all-reduces, the grad norm and the parameter all-gather, and every bucket
    takes latency + bytes / bandwidth with one bandwidth."""
    res = run(_scenario(1))
    tl = res.timeline
    tl = tl[(tl["rank"] == 0) & (tl["step"] == 1)]
    dp = tl[tl["stream"] == "dp"]
    assert res.metrics["breakdown_s"]["exposed_dp"] == pytest.approx(float((dp.end_s - dp.start_s).sum()), rel=1e-6)
    g = dp[dp["name"] == "grad_dense"]
    d = (g.end_s - g.start_s).to_numpy()
    s = g.size_bytes.to_numpy()
    big, small = s.argmax(), s.argmin()
    per_byte = (d[big] - d[small]) / (s[big] - s[small])         # 1 / bandwidth
    latency = d[small] - s[small] * per_byte
    assert 0 <= latency < 0.1 * d[small]
    assert d == pytest.approx(latency + s * per_byte, rel=1e-3)
    hidden = run(_scenario(1, deepspeed={"overlap_comm": True})).metrics["breakdown_s"]["exposed_dp"]
    assert hidden < res.metrics["breakdown_s"]["exposed_dp"] - 0.5 * d.sum()


# -- ZeRO-3 ----------------------------------------------------------------------------------------

def test_zero3_reduce_scatters_in_the_communication_dtype_overlapped_by_default():
    sc = _scenario(3)
    grads = [o for o in _ops(sc) if is_grad_bucket(o)]
    assert {o.coll for o in grads} == {Coll.REDUCE_SCATTER} and {o.issue for o in grads} == {Issue.DP_STREAM}
    assert sum(o.size_bytes for o in grads) == pytest.approx(2.0 * sc.model.num_params())
    fp32 = [o for o in _ops(_scenario(3, deepspeed={"communication_data_type": "fp32", "overlap_comm": False}))
            if is_grad_bucket(o)]
    assert sum(o.size_bytes for o in fp32) == pytest.approx(4.0 * sc.model.num_params())
    assert {o.issue for o in fp32} == {Issue.BLOCKING}


def _layer_gathers(ops, layer, name=OpName.FSDP_GATHER):
    return [o for o in ops if o.name == name and o.layer == layer and o.microbatch == 0]


def test_zero3_persistence_threshold_keeps_small_parameters_whole():
    sc = _scenario(3)
    br = sc.model.layer_param_breakdown(0)
    gathered = sum(o.size_bytes for o in _layer_gathers(_ops(sc), 0))
    assert gathered == pytest.approx(2.0 * (br["attention"] + br["mlp"]))           # the norms stay whole
    everything = _ops(_scenario(3, deepspeed={"stage3_param_persistence_threshold": 0}))
    assert sum(o.size_bytes for o in _layer_gathers(everything, 0)) == pytest.approx(2.0 * sum(br.values()))
    # a threshold above every tensor: no layer is gathered at all
    none = _ops(_scenario(3, deepspeed={"stage3_param_persistence_threshold": 10**9}))
    assert not [o for o in none if is_fsdp_gather(o) and o.layer >= 0]


def test_zero3_prefetches_in_calls_of_the_prefetch_bucket_or_gathers_per_tensor_without():
    sc = _scenario(3)
    br = sc.model.layer_param_breakdown(0)
    calls = _layer_gathers(_ops(sc), 0)
    assert len(calls) == math.ceil((br["attention"] + br["mlp"]) / 5e7)
    assert {o.issue for o in calls} == {Issue.PREFETCH}
    blocking = _layer_gathers(_ops(_scenario(3, deepspeed={"stage3_prefetch_bucket_size": 0})), 0)
    assert len(blocking) == 2 and {o.issue for o in blocking} == {Issue.BLOCKING}   # attention, mlp (norms persist)
    assert len(_layer_gathers(_ops(_scenario(3, deepspeed={"stage3_param_persistence_threshold": 0,
                                                           "stage3_prefetch_bucket_size": 0})), 0)) == 2 + 2
    small_live = _layer_gathers(_ops(_scenario(3, deepspeed={"stage3_max_live_parameters": 10**6})), 0)
    assert {o.issue for o in small_live} == {Issue.BLOCKING}


def test_zero3_keeps_what_recurs_within_the_reuse_distance():
    sc = _scenario(3)
    ops = _ops(sc)
    out_bwd = [o for o in ops if o.name == OpName.FSDP_GATHER_BWD and o.layer == -1]
    emb = sc.model.vocab_size * sc.model.hidden_size
    # the output layer comes back at once; the embedding (first forward, last backward) does not
    assert sum(o.size_bytes for o in out_bwd) == pytest.approx(2.0 * emb)
    last = sc.model.num_layers - 1
    assert _layer_gathers(ops, last, OpName.FSDP_GATHER_BWD)      # 2 x output layer > 1e9: regathered
    keep_all = _ops(_scenario(3, deepspeed={"stage3_max_reuse_distance": 10**12}))
    assert not [o for o in keep_all if o.name == OpName.FSDP_GATHER_BWD and o.layer >= 0]
    keep_none = _ops(_scenario(3, deepspeed={"stage3_max_reuse_distance": 0}))
    assert len([o for o in keep_none if o.name == OpName.FSDP_GATHER_BWD and o.layer == -1]) > len(out_bwd)


# -- the stack's kernels and the validation mapping -------------------------------------------------

def test_the_stack_runs_pytorch_fsdps_eager_kernels_without_fsdp2_and_with_a_fused_adam():
    ds, fsdp = get_stack("deepspeed").fusion, get_stack("pytorch_fsdp").fusion
    assert (ds.attention_backend, ds.elementwise) == (fsdp.attention_backend, fsdp.elementwise) == \
        ("flash_attention_2", "eager")
    assert ds.fsdp2_copies is False and ds.optimizer == "megatron"
    ops = _ops(_scenario(3))
    assert not [o for o in ops if o.name in (OpName.FSDP_COPY, OpName.FSDP_GRAD_COPY)]


def test_a_model_parallel_deepspeed_row_stays_on_the_default_stack():
    row = {"gpu_type": "H100 80GB", "num_gpus": "8", "tp": "2", "pp": "1", "model": "test-dense", "num_layers": "4",
           "hidden_size": "1024", "ffn_hidden_size": "4096", "num_heads": "8", "vocab_size": "32000",
           "seq_len": "2048", "micro_batch_size": "1", "global_batch_size": "16", "precision": "BF16",
           "framework": "DeepSpeed ZeRO-1"}
    scenario, notes = row_to_scenario(row, "published")
    assert "framework" not in scenario and any("deepspeed kernel stack with tp=2" in n for n in notes)


def test_the_estimate_exposes_what_the_stack_issues_blocking():
    """The closed-form estimate reads the issue modes: DeepSpeed ZeRO-1's buckets after the
    backward and its step all-gather are exposed whole, as the simulation runs them."""
    from simulator import estimate
    sc = _scenario(1)
    exposed = run(sc).metrics["breakdown_s"]["exposed_dp"]
    assert estimate(sc)["exposed_dp_s"] == pytest.approx(exposed, rel=0.01)
    hidden = _scenario(1, deepspeed={"overlap_comm": True})
    assert estimate(hidden)["exposed_dp_s"] < estimate(sc)["exposed_dp_s"]
