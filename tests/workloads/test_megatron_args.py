"""Megatron-LM command lines -> (ModelSpec, ParallelConfig)."""

import pytest

from topologies import ConfigError
from workloads.megatron_args import from_megatron_args
from workloads.model import load_model

LLAMA70B = """--num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64
 --group-query-attention --num-query-groups 8 --seq-length 8192 --max-position-embeddings 8192
 --vocab-size 128256 --swiglu --normalization RMSNorm --position-embedding-type rope
 --untie-embeddings-and-output-weights --disable-bias-linear --tensor-model-parallel-size 8
 --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 5 --micro-batch-size 1
 --global-batch-size 128 --sequence-parallel --use-distributed-optimizer --lr 3e-4 --train-iters 100
 --data-path /data/a /data/b --recompute-granularity selective"""

MIXTRAL = """--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32
 --group-query-attention --num-query-groups 8 --seq-length 4096 --vocab-size 32000 --swiglu
 --normalization RMSNorm --position-embedding-type rope --untie-embeddings-and-output-weights
 --disable-bias-linear --num-experts 8 --moe-router-topk 2 --tensor-model-parallel-size 2
 --pipeline-model-parallel-size 4 --expert-model-parallel-size 8 --micro-batch-size 1
 --global-batch-size 256"""


def test_llama3_70b_command_line():
    model, par = from_megatron_args(LLAMA70B, num_gpus=512)
    assert model.num_params() == load_model("llama3-70b").num_params()
    assert (par.tp, par.pp, par.dp, par.vpp, par.schedule) == (8, 4, 16, 4, "interleaved_1f1b")
    assert par.sequence_parallel and par.distributed_optimizer and par.recompute == "selective"
    assert par.num_microbatches == 8


def test_mixtral_command_line_dp_includes_ep():
    model, par = from_megatron_args(MIXTRAL, num_gpus=64)
    ref = load_model("mixtral-8x7b")
    assert model.num_params() == pytest.approx(ref.num_params(), rel=1e-9)
    assert model.num_active_params() == pytest.approx(ref.num_active_params(), rel=1e-9)
    # Megatron's implicit DP (64 / (2 x 4) = 8) includes EP 8: expert DP = 2*8 / (2*8) = 1
    assert (par.dp, par.ep, par.expert_tp, par.expert_dp) == (8, 8, 2, 1)


def test_bad_command_lines():
    with pytest.raises(ConfigError, match="--hidden-size"):
        from_megatron_args("--num-layers 2 --hidden-size x", num_gpus=8)
    with pytest.raises(ConfigError, match="--vocab-size"):
        from_megatron_args("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 16", num_gpus=1)
    with pytest.raises(ConfigError, match="world_size"):
        from_megatron_args(MIXTRAL, num_gpus=60)
