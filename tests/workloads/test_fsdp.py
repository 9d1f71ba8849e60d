"""Sharded data parallelism (ZeRO-2/3, Megatron-FSDP) in the program: what is gathered,
in which dtype and over which group, and how often gradients are reduce-scattered."""

import pytest

from topologies import get_gpu_spec
from workloads import ParallelConfig, load_model
from workloads.costs import get_recipe
from workloads.ops import Group, OpName
from workloads.program import build_program
from workloads.stacks.megatron_te.context import _Ctx
from workloads.stacks.megatron_te.data_parallel import _count_local_params, _embedding_params, _output_params

H100 = get_gpu_spec("H100-SXM")


def _prog(zero_stage=3, model="tiny-dense", precision="bf16", **kw):
    base = dict(tp=1, pp=1, dp=4, micro_batch_size=1, global_batch_size=16, seq_len=512, zero_stage=zero_stage)
    return build_program(load_model(model), ParallelConfig(**{**base, **kw}), H100, precision=precision)


def _ops(p, name, mb=0):
    return [o for o in p.classes[0].ops if o.name == name and o.microbatch == mb]


def test_zero3_gathers_the_embedding_and_the_output_layer_too():
    p = _prog()
    fwd = _ops(p, OpName.FSDP_GATHER)
    edge = sorted(o.size_bytes for o in fwd if o.layer == -1)
    ctx = _Ctx(p.model, p.parallel, None, None, 1, 512, [range(p.model.num_layers)], None, None, 0)
    assert edge == sorted([2.0 * _embedding_params(ctx), 2.0 * _output_params(ctx)])
    # the gathers of one forward carry every parameter the memory model shards (BF16)
    dense = sum(_count_local_params(ctx, [i])[0] for i in range(p.model.num_layers))
    assert sum(o.size_bytes for o in fwd) == pytest.approx(2.0 * (dense + _embedding_params(ctx) + _output_params(ctx)))
    # and again before the backward of each
    assert sorted(o.size_bytes for o in _ops(p, OpName.FSDP_GATHER_BWD) if o.layer == -1) == edge
    assert not [o for o in _prog(zero_stage=1).classes[0].ops if o.name == OpName.FSDP_GATHER]


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_sharded_gradients_are_reduce_scattered_every_microbatch(zero_stage):
    """With gradient sharding a rank cannot accumulate whole gradients over micro-batches:
    each micro-batch's are reduce-scattered (ZeRO-1 reduces once, in the last)."""
    once = [o for o in _prog(zero_stage=1).classes[0].ops if o.name == OpName.GRAD_DENSE]
    every = [o for o in _prog(zero_stage=zero_stage).classes[0].ops if o.name == OpName.GRAD_DENSE]
    m = 4
    assert len(every) == m * len(once)
    assert sum(o.size_bytes for o in every) == pytest.approx(m * sum(o.size_bytes for o in once))
    assert {o.coll for o in every} == {"reduce_scatter"}


def test_fp8_parameters_are_gathered_in_fp8():
    bf16 = _ops(_prog(precision="fp8_blockwise"), OpName.FSDP_GATHER)
    fp8 = _ops(_prog(precision=get_recipe("fp8_blockwise", fp8_param_gather=True)), OpName.FSDP_GATHER)
    layer = lambda ops: [o.size_bytes for o in ops if o.layer >= 0]
    # 1 byte per parameter plus the 128 x 128 blocks' FP32 scales, against BF16's 2
    assert [f / b for f, b in zip(layer(fp8), layer(bf16))] == pytest.approx([(1 + 4 / 128 ** 2) / 2] * len(layer(bf16)))
    # the embedding and output layer stay BF16
    edge = lambda ops: sorted(o.size_bytes for o in ops if o.layer < 0)
    assert edge(fp8) == edge(bf16)


def test_zero3_gathers_expert_parameters_over_the_expert_data_parallel_group():
    p = _prog(model="tiny-moe", ep=2, dp=4)
    assert p.parallel.expert_dp == 2
    ctx = _Ctx(p.model, p.parallel, None, None, 1, 512, [range(p.model.num_layers)], None, None, 0)
    experts = [o for o in _ops(p, OpName.FSDP_GATHER) if o.group == Group.EDP]
    assert experts
    for o in experts:
        assert o.size_bytes == pytest.approx(2.0 * _count_local_params(ctx, [o.layer])[1])
