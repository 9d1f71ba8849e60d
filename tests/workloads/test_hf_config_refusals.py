"""The Hugging Face importer refuses what it does not model: a model type outside
HF_MODEL_TYPES, or a key neither read for its type, nor known to have no effect, nor inert."""

import dataclasses
import json

import pytest

from topologies import ConfigError
from workloads.hf_config import HF_MODEL_TYPES, model_from_hf_config
from workloads.model_loading import load_model

from .test_model import (DEEPSEEK_V3_HF, FIXTURES, GPT_OSS_20B_HF, GPT_OSS_120B_HF, LLAMA3_8B_HF, MIXTRAL_8X7B_HF,
                         QWEN3_30B_A3B_HF, same_model)

# The keys of Qwen/Qwen3-Next-80B-A3B's config.json (hybrid gated DeltaNet + gated attention):
# read as a plain MoE transformer it used to load silently, every layer full attention.
QWEN3_NEXT_HF = {
    "architectures": ["Qwen3NextForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "full_attention_interval": 4,
    "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 5120, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_value_head_dim": 128,
    "max_position_embeddings": 262144, "mlp_only_layers": [], "model_type": "qwen3_next",
    "moe_intermediate_size": 512, "norm_topk_prob": True, "num_attention_heads": 16, "num_experts": 512,
    "num_experts_per_tok": 10, "num_hidden_layers": 48, "num_key_value_heads": 2, "output_router_logits": False,
    "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 10000000,
    "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 512, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}


def test_qwen3_next_imports_with_its_gated_deltanet_layers():
    """Qwen3-Next is modelled now (workloads/blocks/gated_deltanet.py): its config gives the
    preset's model, 36 gated DeltaNet layers and 12 gated-attention layers."""
    m = model_from_hf_config(QWEN3_NEXT_HF, seq_len=4096)
    preset = load_model("qwen3-next-80b-a3b")
    assert m.num_params() == preset.num_params() and m.param_breakdown() == preset.param_breakdown()
    assert sum(m.gated_deltanet.is_linear(i) for i in range(48)) == 36
    explicit = {**QWEN3_NEXT_HF, "layer_types": ["linear_attention"] * 3 + ["full_attention"]}
    explicit["layer_types"] *= 12
    assert model_from_hf_config(explicit, seq_len=4096).num_params() == m.num_params()
    with pytest.raises(ConfigError) as e:
        model_from_hf_config({**QWEN3_NEXT_HF, "layer_types": ["sliding_attention"] * 48})
    assert e.value.field == "hf_config.layer_types"
    # under a type the importer knows, its architecture keys are refused one by one
    with pytest.raises(ConfigError) as e:
        model_from_hf_config({**QWEN3_NEXT_HF, "model_type": "qwen3_moe"})
    assert e.value.field in {"hf_config.full_attention_interval", "hf_config.linear_conv_kernel_dim"}


@pytest.mark.parametrize("model_type", [None, "", "llama4_text", "qwen3_5_moe", "mamba2"])
def test_unknown_or_missing_model_type_is_refused(model_type):
    with pytest.raises(ConfigError) as e:
        model_from_hf_config({**LLAMA3_8B_HF, "model_type": model_type})
    assert e.value.field == "hf_config.model_type"


NEMOTRON_NANO = json.loads((FIXTURES / "nemotron3_nano_hf_config.json").read_text())


@pytest.mark.parametrize("base, key, value", [
    (LLAMA3_8B_HF, "layer_types", ["linear_attention", "full_attention", "full_attention", "full_attention"] * 8),
    (QWEN3_30B_A3B_HF, "full_attention_interval", 4),
    (QWEN3_30B_A3B_HF, "linear_num_key_heads", 16),
    (LLAMA3_8B_HF, "partial_rotary_factor", 0.5),
    (QWEN3_30B_A3B_HF, "attn_output_gate", True),
    (LLAMA3_8B_HF, "qk_layernorm", True),
    (LLAMA3_8B_HF, "use_qk_norm", True),
    (QWEN3_30B_A3B_HF, "shared_expert_gate", True),
    (LLAMA3_8B_HF, "use_sliding_window", True),               # read for Qwen only
    (LLAMA3_8B_HF, "attention_dropout", 0.1),
    (LLAMA3_8B_HF, "attention_bias", True),                   # without mlp_bias: the o bias is not modelled
    (DEEPSEEK_V3_HF, "attention_bias", True),                 # with MLA
    (LLAMA3_8B_HF, "moe_intermediate_size", 1024),            # an MoE key without experts
    (LLAMA3_8B_HF, "a_key_from_the_future", {"anything": [1, 2]}),
    (GPT_OSS_120B_HF, "experts_per_token", 8),
    (NEMOTRON_NANO, "use_conv_bias", False),
    (NEMOTRON_NANO, "sliding_window", 4096),                  # not read for nemotron_h
])
def test_an_unmodelled_key_is_refused_naming_it(base, key, value):
    with pytest.raises(ConfigError) as e:
        model_from_hf_config({**base, key: value})
    assert e.value.field == f"hf_config.{key}"
    assert key in str(e.value)


def test_keys_without_effect_and_inert_values_still_load():
    cfg = {**LLAMA3_8B_HF, "partial_rotary_factor": 1.0, "attn_output_gate": False, "qk_layernorm": False,
           "attention_dropout": 0.0, "mlp_only_layers": [], "_comment": "annotation", "pad_token_id": 0,
           "quantization_config": {"quant_method": "fp8"}, "rope_scaling": {"rope_type": "llama3", "factor": 8.0},
           "n_group": 8, "topk_group": 4, "dtype": "bfloat16"}
    assert same_model(model_from_hf_config(cfg), model_from_hf_config(LLAMA3_8B_HF))


SHIPPED = [(LLAMA3_8B_HF, "llama3-8b", None), (MIXTRAL_8X7B_HF, "mixtral-8x7b", 4096),
           (QWEN3_30B_A3B_HF, "qwen3-30b-a3b", 4096), (DEEPSEEK_V3_HF, "deepseek-v3", 4096),
           (GPT_OSS_120B_HF, "gpt-oss-120b", 4096), (GPT_OSS_20B_HF, "gpt-oss-20b", 4096),
           (FIXTURES / "nemotron3_nano_hf_config.json", "nemotron3-nano", 8192),
           (FIXTURES / "nemotron3_super_hf_config.json", "nemotron3-super", 8192)]


@pytest.mark.parametrize("cfg, preset, seq_len", SHIPPED)
def test_every_shipped_config_still_loads_to_its_preset(cfg, preset, seq_len):
    m, p = model_from_hf_config(cfg, seq_len=seq_len), load_model(preset)
    if preset == "nemotron3-super":       # the HF config does not say the MTP module is repeated
        p = dataclasses.replace(p, mtp_repeated_layer=False)
    assert same_model(m, p)


def test_every_model_type_has_its_read_keys():
    from workloads.hf_config import _NO_EFFECT, _READ_KEYS
    assert set(_READ_KEYS) == set(HF_MODEL_TYPES)
    assert not set(_NO_EFFECT) & set().union(*_READ_KEYS.values()) - {"rope_scaling"}


def test_a_key_given_twice_in_the_json_is_refused_naming_it(tmp_path):
    """json.load keeps the last of two equal keys without a word; the importer refuses the
    file instead, naming the key and where it comes again (nested objects too)."""
    text = json.dumps(LLAMA3_8B_HF, indent=1)
    twice = text.replace('"num_hidden_layers"', '"num_hidden_layers": 8,\n "num_hidden_layers"', 1)
    path = tmp_path / "config.json"
    path.write_text(twice)
    with pytest.raises(ConfigError, match=r"model\.hf_config = '.*config\.json': key 'num_hidden_layers' is given "
                                          r"twice in one JSON object \(again on line \d+\); keep one"):
        load_model({"hf_config": str(path)})
    nested = {**LLAMA3_8B_HF, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    path.write_text(json.dumps(nested).replace('"factor": 8.0', '"factor": 8.0, "factor": 4.0'))
    with pytest.raises(ConfigError, match="key 'factor' is given twice"):
        load_model({"hf_config": str(tmp_path)})                      # the folder form reads the same file
    path.write_text(json.dumps(LLAMA3_8B_HF))
    assert load_model({"hf_config": str(path)}).num_layers == LLAMA3_8B_HF["num_hidden_layers"]
