"""Megatron-LM command lines -> (ModelSpec, ParallelConfig)."""

import dataclasses

import pytest

from topologies import ConfigError
from workloads.megatron_args import from_megatron_args, model_from_megatron_args
from workloads.model_loading import load_model

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


# -- hybrid Mamba stacks (Nemotron 3) -----------------------------------------------------------
_FIXTURES = __import__("pathlib").Path(__file__).parent / "fixtures"


def test_nemotron3_nano_args_match_the_preset():
    argv = (_FIXTURES / "nemotron3_nano_megatron_args.txt").read_text()
    model, par = from_megatron_args(argv, num_gpus=8)
    p = load_model("nemotron3-nano")
    assert model.hybrid_override_pattern == p.hybrid_override_pattern and model.mamba == p.mamba
    assert model.moe == p.moe and model.mlp == "relu2"
    assert model.num_params() == p.num_params()
    assert par.ep == 8


def test_hybrid_pattern_mtp_depths_latent_and_mamba_defaults():
    argv = ("--hybrid-override-pattern M*E/*E/*E --hidden-size 256 --num-attention-heads 4 --seq-length 128 "
            "--vocab-size 512 --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 64 --moe-latent-size 32 "
            "--mtp-use-repeated-layer --micro-batch-size 1 --global-batch-size 8")
    model, _ = from_megatron_args(argv, num_gpus=1)
    assert model.num_layers == 3 and model.mtp_layers == 2 and model.mtp_repeated_layer
    assert model.moe.latent_size == 32
    # Megatron-Core defaults: state 128, head dim 64, 8 groups, heads 2 h / head dim
    assert (model.mamba.state_dim, model.mamba.head_dim, model.mamba.num_groups, model.mamba.num_heads) == \
        (128, 64, 8, 8)


@pytest.mark.parametrize("argv, flag", [
    ("--hybrid-layer-pattern M*|M* --hidden-size 256 --num-attention-heads 4 --seq-length 128 --vocab-size 512",
     "--hybrid-layer-pattern"),
    ("--hybrid-layer-pattern M*/MM --hidden-size 256 --num-attention-heads 4 --seq-length 128 --vocab-size 512",
     "--hybrid-layer-pattern"),
    ("--mamba-state-dim 64 --num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 128 "
     "--vocab-size 512", "--mamba-state-dim"),
])
def test_hybrid_bad_flags_name_the_flag(argv, flag):
    with pytest.raises(ConfigError) as e:
        from_megatron_args(argv, num_gpus=1)
    assert e.value.field == flag


# -- sliding-window attention flags (gpt-oss) ---------------------------------------------------
_GPT_OSS_LIKE = ("--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 512 --vocab-size 512 "
                 "--swiglu --micro-batch-size 1 --global-batch-size 8 ")


def test_window_size_and_skip_frequency():
    # Megatron-Core window_size (left, right) = (w - 1, 0); skip frequency 2: layers 1, 3 full
    model, _ = from_megatron_args(_GPT_OSS_LIKE + "--window-size (127,0) --window-attn-skip-freq 2", num_gpus=1)
    assert model.sliding_window == 128 and model.window_attn_skip_freq == 2
    assert [model.attention_window(i) for i in range(4)] == [128, None, 128, None]
    model, _ = from_megatron_args(_GPT_OSS_LIKE + "--window-size 63,0 --window-attn-skip-freq [1,0]*2", num_gpus=1)
    assert model.sliding_window == 64 and model.window_layer_pattern == (1, 0, 1, 0)


@pytest.mark.parametrize("flags, field", [("--window-size (127,5)", "--window-size"),
                                          ("--window-attn-skip-freq 2", "--window-attn-skip-freq"),
                                          ("--window-size (127,0) --window-attn-skip-freq [1,x]",
                                           "--window-attn-skip-freq")])
def test_window_bad_flags_name_the_flag(flags, field):
    with pytest.raises(ConfigError) as e:
        from_megatron_args(_GPT_OSS_LIKE + flags, num_gpus=1)
    assert e.value.field == field


# -- flags not read: refused when they shape the model, skipped otherwise ----------------------
@pytest.mark.parametrize("flags, flag", [
    # Qwen3-Next as Megatron-Core writes it: gated DeltaNet layers and gated attention
    ("--experimental-attention-variant gated_delta_net --linear-attention-freq 4 --linear-num-key-heads 16",
     "--experimental-attention-variant"),
    ("--linear-num-key-heads 16", "--linear-num-key-heads"),
    ("--attention-output-gate", "--attention-output-gate"),
    ("--rotary-percent 0.5", "--rotary-percent"),
    ("--softmax-type learnable", "--softmax-type"),
    ("--attention-backend unfused", "--attention-backend"),
    ("--qk-l2-norm", "--qk-l2-norm"),
    ("--no-position-embedding", "--no-position-embedding"),
    ("--moe-layer-recompute", "--moe-layer-recompute"),
    ("--moe-shared-expert-gate", "--moe-shared-expert-gate"),
    ("--hybrid-attention-ratio 0.25", "--hybrid-attention-ratio"),
    ("--activation-func-clamp-value 7.0", "--activation-func-clamp-value"),
    ("--num-experts-per-layer 8", "--num-experts-per-layer"),
])
def test_an_unread_architecture_flag_is_refused_naming_it(flags, flag):
    with pytest.raises(ConfigError) as e:
        from_megatron_args(MIXTRAL + " " + flags, num_gpus=64)
    assert e.value.field == flag
    with pytest.raises(ConfigError):
        model_from_megatron_args(MIXTRAL + " " + flags)


def test_flags_without_effect_on_the_model_are_skipped():
    extra = (" --rotary-percent 1.0 --softmax-type vanilla --attention-backend flash --rotary-base 1000000"
             " --moe-grouped-gemm --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-2"
             " --moe-permute-fusion --apply-layernorm-1p --attention-softmax-in-fp32 --num-workers 8 --bf16"
             " --overlap-grad-reduce --lr 1e-4 --data-path /a /b --tokenizer-type HuggingFaceTokenizer")
    assert from_megatron_args(MIXTRAL + extra, num_gpus=64) == from_megatron_args(MIXTRAL, num_gpus=64)


@pytest.mark.parametrize("argv, preset", [(LLAMA70B, "llama3-70b"), (MIXTRAL, "mixtral-8x7b"),
                                          ((_FIXTURES / "nemotron3_nano_megatron_args.txt").read_text(),
                                           "nemotron3-nano")])
def test_every_shipped_command_line_still_maps_to_its_preset(argv, preset):
    model = model_from_megatron_args(argv)
    assert dataclasses.replace(model, name="x", source="") == dataclasses.replace(load_model(preset), name="x",
                                                                                   source="")
