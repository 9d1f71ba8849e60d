"""Import a Hugging Face ``config.json`` as a :class:`~workloads.model.ModelSpec`.

Covers the decoder-only families whose configs share Llama's keys: ``llama``,
``mistral``, ``mixtral``, ``qwen2``, ``qwen2_moe``, ``qwen3``, ``qwen3_moe``,
``deepseek_v2``, ``deepseek_v3`` and ``gpt_oss``.  All of them use SwiGLU MLPs, RMSNorm
and rotary positions; what differs is read from the keys:

=============================  ===========================================================
ModelSpec                      config.json
=============================  ===========================================================
num_layers                     ``num_hidden_layers``
hidden_size                    ``hidden_size``
ffn_hidden_size                ``intermediate_size`` (dense MLP)
num_attention_heads            ``num_attention_heads``
num_kv_heads                   ``num_key_value_heads`` (default: the attention heads)
head_dim                       ``head_dim`` (absent or null: hidden / heads)
vocab_size                     ``vocab_size``
seq_len                        the ``seq_len`` argument, else ``max_position_embeddings``
tied_embeddings                ``tie_word_embeddings`` (default false, as in these families)
qkv_bias                       always for qwen2 / qwen2_moe; else ``attention_bias``
add_bias_linear                ``attention_bias`` and ``mlp_bias`` both true; gpt_oss:
                               ``attention_bias`` (its experts always carry biases)
qk_norm                        always for qwen3 / qwen3_moe
sliding_window                 ``sliding_window`` unless ``use_sliding_window`` is false
                               (Qwen2/3) or no layer is windowed
window_attn_skip_freq /        ``layer_types`` (``sliding_attention`` = windowed); else
window_layer_pattern           Qwen2's ``max_window_layers`` with ``use_sliding_window``;
                               else every layer windowed (Mistral 7B)
attention_sinks                always for gpt_oss (per-head ``sinks``)
activation_clamp               gpt_oss: ``swiglu_limit`` (the experts' clamped GLU)
rope_mscale                    gpt_oss (Megatron-Bridge runs it with YaRN): ``rope_scaling``'s
                               ``attention_factor``, else Megatron-Core's concentration factor
                               (``0.1 ln(factor) + 1``, or the ``mscale`` / ``mscale_all_dim`` ratio)
moe.num_experts                ``num_local_experts`` | ``n_routed_experts`` | ``num_experts``
moe.top_k                      ``num_experts_per_tok``
moe.expert_ffn_hidden_size     ``moe_intermediate_size``, else ``intermediate_size`` (Mixtral)
moe.num_shared_experts         ``n_shared_experts`` (DeepSeek, each ``moe_intermediate_size``) or
                               1 of ``shared_expert_intermediate_size`` (Qwen2-MoE)
moe layer pattern              ``first_k_dense_replace`` + ``moe_layer_freq`` (DeepSeek);
                               ``decoder_sparse_step`` + ``mlp_only_layers`` (Qwen MoE)
moe.router_bias                deepseek_v3 (``e_score_correction_bias``); gpt_oss (router bias)
mla                            ``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim``,
                               ``qk_rope_head_dim``, ``v_head_dim``
mtp_layers                     ``num_nextn_predict_layers``
=============================  ===========================================================

``nemotron_h`` (Nemotron-H, Nemotron 3: hybrid Mamba-2 / attention / MLP / MoE stacks) is
read by its own keys: ``hybrid_override_pattern`` (or the newer per-layer
``layers_block_type`` list: ``mamba`` / ``attention`` / ``mlp`` / ``moe``), ``mamba_num_heads``,
``mamba_head_dim``, ``ssm_state_size``, ``n_groups``, ``conv_kernel``, ``chunk_size``; the MLP
activation ``mlp_hidden_act`` (``relu2``: squared ReLU, non-gated); MoE ``n_routed_experts``,
``num_experts_per_tok``, ``moe_intermediate_size``, ``n_shared_experts`` with
``moe_shared_expert_intermediate_size`` (the shared experts' total width), ``moe_latent_size``
(latent MoE) and the router's ``e_score_correction_bias`` (always present); no position
embedding; ``num_nextn_predict_layers`` MTP modules (their ``mtp_hybrid_override_pattern``
``*E`` is the attention + MoE layer an MTP module holds here).  Linear biases
(``mamba_proj_bias``, ``mlp_bias``, ``attention_bias``) must be false.

What is not modelled is refused, never approximated silently: a ``model_type`` outside
:data:`HF_MODEL_TYPES` (``qwen3_next``, say, whose linear-attention layers a Llama-style
reading would count as full attention), and any key that is neither read for its model
type nor in the documented set of keys with no effect on the structure or cost of a step
(``_NO_EFFECT``: token ids, dtypes, RoPE tables, norm epsilons, loss weights, router
arithmetic...) unless its value is inert (null, false, 0, empty, or a default such as
``partial_rotary_factor: 1``).  So ``layer_types`` with ``linear_attention``,
``full_attention_interval``, ``linear_*`` sizes, ``attn_output_gate``, ``qk_layernorm``,
``partial_rotary_factor: 0.25``, a non-zero dropout, ``use_sliding_window: true`` outside
Qwen, MoE keys without experts, and ``attention_bias`` without ``mlp_bias`` (the output
projection's bias) or with MLA are errors naming the key.  Still not represented exactly:
Qwen2-MoE's shared-expert gate (``h`` parameters per layer, always present in its modelling
code, no config key).  The importer only reads the file it is given.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping

from topologies import ConfigError

from .model import GatedDeltaNetSpec, MambaSpec, MLASpec, ModelSpec, MoESpec

__all__ = ["HF_MODEL_TYPES", "model_from_hf_config"]

#: Families whose configs this importer models; others are refused.
HF_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_next",
                  "deepseek_v2", "deepseek_v3", "gpt_oss", "nemotron_h")
_ROUTER_BIAS_TYPES = ("deepseek_v3", "gpt_oss")
_SINK_TYPES = ("gpt_oss",)
_LAYER_TYPES = {"sliding_attention": 1, "full_attention": 0}
_QKV_BIAS_TYPES = ("qwen2", "qwen2_moe")
_QK_NORM_TYPES = ("qwen3", "qwen3_moe", "qwen3_next")
# Qwen3-Next (transformers models/qwen3_next): gated DeltaNet mixers in the layers layer_types /
# full_attention_interval name, gated attention (a doubled q_proj) and a sigmoid-gated shared
# expert, all three always present in its modelling code.  Its partial_rotary_factor (0.25)
# is read and has no cost of its own: the fused RoPE kernel passes the unrotated channels
# through in the same read and write.
_QWEN3_NEXT_KEYS = frozenset({"linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
                              "linear_num_key_heads", "linear_num_value_heads", "full_attention_interval",
                              "partial_rotary_factor"})
_QWEN3_NEXT_LAYER_TYPES = {"linear_attention": 1, "full_attention": 0}
_GATED_ACTIVATIONS = ("silu", "swish")

# -- what the importer refuses ------------------------------------------------------------------
# Every key of a config is read (below, per model type), known to have no effect on the
# structure or the cost of a training step (_NO_EFFECT, each with why), or inert (null, false,
# 0, empty, or the default in _INERT_DEFAULTS); any other key is refused, naming it, so a field
# that changes the model is never dropped silently.
_COMMON_KEYS = frozenset({
    "model_type", "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
    "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings", "tie_word_embeddings",
    "num_nextn_predict_layers"})
_LLAMA_STYLE_KEYS = _COMMON_KEYS | {"hidden_act", "attention_bias", "mlp_bias", "sliding_window", "layer_types"}
_EXPERT_COUNT_KEYS = ("num_local_experts", "n_routed_experts", "num_experts")
_MOE_KEYS = frozenset({"num_experts_per_tok", "moe_intermediate_size", "n_shared_experts",
                       "shared_expert_intermediate_size", "first_k_dense_replace", "moe_layer_freq",
                       "decoder_sparse_step", "mlp_only_layers", "topk_method"})
_MLA_KEYS = frozenset({"kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"})
_QWEN_WINDOW_KEYS = frozenset({"use_sliding_window", "max_window_layers"})
_NEMOTRON_H_KEYS = _COMMON_KEYS | {
    "hybrid_override_pattern", "layers_block_type", "mamba_proj_bias", "mlp_bias", "attention_bias",
    "mlp_hidden_act", "mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups", "conv_kernel",
    "chunk_size", "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "moe_latent_size",
    "n_shared_experts", "moe_shared_expert_intermediate_size", "mtp_hybrid_override_pattern"}
_GPT_OSS_KEYS = frozenset({"swiglu_limit", "rope_scaling", "experts_per_token"})
#: Keys read, by model type (MoE keys only with experts: see _refuse_unmodelled).
_READ_KEYS = {t: _LLAMA_STYLE_KEYS | set(_EXPERT_COUNT_KEYS) | _MOE_KEYS | _MLA_KEYS
              | (_QWEN_WINDOW_KEYS if t.startswith("qwen") else set()) | (_GPT_OSS_KEYS if t == "gpt_oss" else set())
              for t in HF_MODEL_TYPES if t != "nemotron_h"}
_READ_KEYS["nemotron_h"] = _NEMOTRON_H_KEYS
_READ_KEYS["qwen3_next"] = _READ_KEYS["qwen3_next"] | _QWEN3_NEXT_KEYS
#: The one value (besides null) a key may hold without changing anything; for other keys null,
#: false, 0 and empty are inert.  (Nemotron-H's conv1d bias is counted: use_conv_bias must be true.)
_INERT_DEFAULTS = {"decoder_sparse_step": 1, "moe_layer_freq": 1, "partial_rotary_factor": 1,
                   "use_conv_bias": True, "mamba_hidden_act": "silu", "topk_method": "greedy"}
#: Keys with no effect on the structure or the cost of a training step, and why.
_NO_EFFECT = {
    "architectures": "the modelling class; model_type decides",
    "transformers_version": "the library version that wrote the file",
    "torch_dtype": "the checkpoint's storage dtype; the scenario's precision recipe decides",
    "dtype": "the checkpoint's storage dtype; the scenario's precision recipe decides",
    "quantization_config": "the checkpoint's storage format; the scenario's precision recipe decides",
    "bos_token_id": "a token id", "eos_token_id": "a token id", "pad_token_id": "a token id",
    "tokenizer_class": "the tokenizer (vocab_size is read)",
    "initializer_range": "initialisation", "auto_map": "remote-code class names",
    "rms_norm_eps": "a norm's epsilon", "layer_norm_epsilon": "a norm's epsilon",
    "rope_theta": "RoPE table values", "rope_scaling": "RoPE table values (read for gpt_oss: rope_mscale)",
    "initial_context_length": "YaRN's original context (gpt-oss): RoPE table values",
    "use_cache": "inference KV cache", "output_router_logits": "an inference output",
    "num_logits_to_keep": "inference logits", "use_mamba_kernels": "a kernel choice at inference",
    "pretraining_tp": "Llama's sliced matmuls at pre-training: the same products",
    "router_aux_loss_coef": "a loss weight", "aux_loss_alpha": "a loss weight", "seq_aux": "a loss's form",
    "router_jitter_noise": "router input noise (elementwise)",
    "norm_topk_prob": "renormalising the top-k scores (elementwise)",
    "routed_scaling_factor": "scaling the routed output (elementwise)",
    "scoring_func": "softmax or sigmoid router scores (elementwise)",
    "n_group": "group-limited routing picks among fewer experts, as many per token (node spread not modelled)",
    "topk_group": "group-limited routing picks among fewer experts, as many per token (node spread not modelled)",
    "ep_size": "DeepSeek's inference expert parallelism; the scenario's layout decides",
    "expand": "Nemotron-H's mixer width is mamba_num_heads x mamba_head_dim (read); expand is not used",
    "mamba_hidden_act": "the Mamba gate's activation (silu)",
    "time_step_min": "Mamba dt initialisation", "time_step_max": "Mamba dt initialisation",
    "time_step_floor": "Mamba dt initialisation", "time_step_limit": "Mamba dt clamp (elementwise)",
    "residual_in_fp32": "residual dtype (numerics)", "rescale_prenorm_residual": "initialisation",
}


def _inert(key: str, value) -> bool:
    if key in _INERT_DEFAULTS:
        return value is None or value == _INERT_DEFAULTS[key]
    return value is None or value is False or value == 0 or value in ("", [], {})


def _refuse_unmodelled(cfg: dict, where: str) -> str:
    """The config's model type; ConfigError for a model type or a key this importer does not
    model (see above)."""
    model_type = str(cfg.get("model_type") or "")
    if model_type not in HF_MODEL_TYPES:
        raise ConfigError(f"{where}.model_type", cfg.get("model_type"),
                          f"model type not modelled by the Hugging Face importer (refused rather than read as "
                          f"a Llama-style stack); modelled: {', '.join(HF_MODEL_TYPES)}")
    read = _READ_KEYS[model_type]
    experts = any(cfg.get(k) for k in _EXPERT_COUNT_KEYS) or model_type == "nemotron_h"
    for key, value in cfg.items():
        if key.startswith("_") or key in _NO_EFFECT or _inert(key, value):
            continue            # transformers' bookkeeping (_name_or_path) or annotations (_comment)
        if key in read and (experts or key not in _MOE_KEYS):
            continue
        rule = (f"an MoE key without experts ({' / '.join(_EXPERT_COUNT_KEYS)})" if key in read else
                f"not modelled by the Hugging Face importer for model_type {model_type} (it changes the "
                f"model's structure or cost, or is unknown); clustersim refuses rather than ignore it")
        raise ConfigError(f"{where}.{key}", value, rule)
    types = cfg.get("layer_types")
    if isinstance(types, list) and model_type != "nemotron_h":
        known = _QWEN3_NEXT_LAYER_TYPES if model_type == "qwen3_next" else _LAYER_TYPES
        bad = next((t for t in types if t not in known), None)
        if bad is not None:
            raise ConfigError(f"{where}.layer_types", bad, f"layer type not modelled for model_type {model_type}; "
                                                           f"modelled: {', '.join(known)}")
    if model_type == "gpt_oss" and cfg.get("experts_per_token") not in (None, cfg.get("num_experts_per_tok")):
        raise ConfigError(f"{where}.experts_per_token", cfg["experts_per_token"],
                          "must equal num_experts_per_tok (gpt-oss repeats it)")
    if cfg.get("attention_bias") and not cfg.get("mlp_bias") and model_type not in ("gpt_oss", "nemotron_h"):
        what = "with MLA" if cfg.get("kv_lora_rank") else "without mlp_bias (the output projection's bias)"
        raise ConfigError(f"{where}.attention_bias", cfg["attention_bias"],
                          f"attention biases {what} are not modelled")
    return model_type


class _DuplicateKey(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _refuse_duplicates(pairs: list[tuple[str, object]]) -> dict:
    """``object_pairs_hook`` for json: a dict, or _DuplicateKey for a key met twice in one object."""
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def _second_line(text: str, key: str) -> str:
    """`` (again on line N)`` for the second place ``"key":`` is written, or ``""``."""
    hits = [m.start() for m in re.finditer(re.escape(json.dumps(key)) + r"\s*:", text)]
    return f" (again on line {text.count(chr(10), 0, hits[1]) + 1})" if len(hits) > 1 else ""


def _read(path_or_dict, where: str) -> tuple[dict, str]:
    if isinstance(path_or_dict, Mapping):
        return dict(path_or_dict), "Hugging Face config (mapping)"
    if not isinstance(path_or_dict, (str, os.PathLike)):
        raise ConfigError(where, path_or_dict, "expected a path to a config.json or a mapping")
    path = os.fspath(path_or_dict)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        data = json.loads(text, object_pairs_hook=_refuse_duplicates)
    except _DuplicateKey as e:
        raise ConfigError(where, path, f"key {e.key!r} is given twice in one JSON object{_second_line(text, e.key)}; "
                                       "keep one (JSON readers silently keep the last)") from None
    except FileNotFoundError:
        raise ConfigError(where, path, "file not found") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(where, path, f"not a readable JSON file ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(where, path, "the JSON file does not hold an object")
    return data, f"Hugging Face config.json: {path}"


def _req(cfg: dict, key: str, where: str):
    if cfg.get(key) is None:
        raise ConfigError(f"{where}.{key}", None, "required key missing from the Hugging Face config")
    return cfg[key]


def _moe(cfg: dict, num_layers: int, model_type: str, where: str) -> MoESpec | None:
    experts_key = next((k for k in ("num_local_experts", "n_routed_experts", "num_experts") if cfg.get(k)), None)
    if experts_key is None:
        return None
    num_experts = cfg[experts_key]
    top_k = _req(cfg, "num_experts_per_tok", where)
    ffn_key = "moe_intermediate_size" if cfg.get("moe_intermediate_size") else "intermediate_size"
    expert_ffn = _req(cfg, ffn_key, where)
    kw: dict = dict(num_experts=num_experts, top_k=top_k, expert_ffn_hidden_size=expert_ffn)
    if cfg.get("n_shared_experts"):
        kw.update(num_shared_experts=cfg["n_shared_experts"], shared_expert_ffn_hidden_size=expert_ffn)
    elif cfg.get("shared_expert_intermediate_size"):
        kw.update(num_shared_experts=1, shared_expert_ffn_hidden_size=cfg["shared_expert_intermediate_size"])
    # layer pattern: DeepSeek's (first k dense, then every freq-th) or Qwen's (sparse step, dense list)
    first_k = cfg.get("first_k_dense_replace") or 0
    freq = cfg.get("moe_layer_freq") or 1
    step = cfg.get("decoder_sparse_step") or 1
    dense_list = cfg.get("mlp_only_layers") or []
    if not isinstance(dense_list, list):
        raise ConfigError(f"{where}.mlp_only_layers", dense_list, "must be a list of layer indices")
    if step != 1 or dense_list:
        # Qwen: layer i is MoE when i is not listed and (i + 1) % decoder_sparse_step == 0
        pattern = [int(i not in dense_list and (i + 1) % step == 0) for i in range(num_layers)]
        if first_k:
            pattern = [0 if i < first_k else p for i, p in enumerate(pattern)]
        k = next((i for i, p in enumerate(pattern) if p), num_layers)
        if freq == 1 and all(pattern[k:]):
            kw["first_k_dense"] = k            # a dense prefix: keep the compact form
        else:
            kw["moe_layer_pattern"] = tuple(pattern)
    else:
        kw.update(first_k_dense=first_k, moe_layer_freq=freq)
    if model_type in _ROUTER_BIAS_TYPES or cfg.get("topk_method") == "noaux_tc":
        kw["router_bias"] = True
    if model_type == "qwen3_next" and kw.get("num_shared_experts"):
        kw["shared_expert_gate"] = True        # Qwen3NextSparseMoeBlock.shared_expert_gate, h -> 1
    try:
        return MoESpec(**kw)
    except ConfigError as e:
        keys = {"num_experts": experts_key, "top_k": "num_experts_per_tok", "expert_ffn_hidden_size": ffn_key,
                "num_shared_experts": "n_shared_experts", "first_k_dense": "first_k_dense_replace",
                "moe_layer_pattern": "mlp_only_layers"}
        key = e.field.split(".", 1)[-1]
        raise ConfigError(f"{where}.{keys.get(key, key)}", e.value, e.rule) from None


def _yarn_mscale(scaling) -> float:
    """The factor YaRN scales the RoPE tables by (Megatron-Core yarn_rotary_pos_embedding.py
    ``_yarn_get_mscale``: ``0.1 ln(factor) + 1``, or the config's ``attention_factor``); 1.0
    for no or other scaling."""
    if not isinstance(scaling, dict) or (scaling.get("rope_type") or scaling.get("type")) != "yarn":
        return 1.0
    if scaling.get("attention_factor"):
        return float(scaling["attention_factor"])
    factor = float(scaling.get("factor") or 1.0)

    def get(m):
        return 0.1 * m * math.log(factor) + 1.0 if factor > 1.0 else 1.0
    ms, ms_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
    return get(1.0) if ms is None or ms_all is None else get(float(ms)) / get(float(ms_all))


def _window(cfg: dict, num_layers, where: str) -> dict:
    """ModelSpec's sliding-window fields from ``sliding_window``, ``layer_types`` and Qwen2's
    ``use_sliding_window`` / ``max_window_layers`` (empty: no windowed layer)."""
    window = cfg.get("sliding_window")
    if not window or cfg.get("use_sliding_window") is False:
        return {}
    if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers < 1:
        return {}                          # ModelSpec reports num_hidden_layers
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != num_layers or any(t not in _LAYER_TYPES for t in types):
            raise ConfigError(f"{where}.layer_types", types,
                              f"must list {num_layers} entries (num_hidden_layers), each one of "
                              f"{', '.join(_LAYER_TYPES)}")
        flags = [_LAYER_TYPES[t] for t in types]
    elif cfg.get("use_sliding_window") and cfg.get("max_window_layers") is not None:
        # transformers' Qwen2: layer i is windowed when i >= max_window_layers
        flags = [int(i >= cfg["max_window_layers"]) for i in range(num_layers)]
    else:
        flags = [1] * num_layers          # Mistral 7B: every layer
    if not any(flags):
        return {}
    if all(flags):
        return {"sliding_window": window}
    for freq in range(2, num_layers + 1):  # Megatron's compact form: every freq-th layer (1-based) full
        if flags == [int((i + 1) % freq != 0) for i in range(num_layers)]:
            return {"sliding_window": window, "window_attn_skip_freq": freq}
    return {"sliding_window": window, "window_layer_pattern": tuple(flags)}


def model_from_hf_config(path_or_dict, *, name: str | None = None, seq_len: int | None = None,
                         where: str = "hf_config") -> ModelSpec:
    """A ModelSpec from a Hugging Face ``config.json`` (a local file, its folder, or the parsed mapping).

    Parameters
    ----------
    path_or_dict
        Path of a ``config.json`` (or of the folder holding it), or its contents as a mapping.
    name
        Name for the spec; default: the config's ``_name_or_path``, else its ``model_type``.
    seq_len
        Training sequence length; default ``max_position_embeddings`` (often the long-context
        limit, e.g. 131072 for Llama 3.1, rather than the pre-training length).
    where
        Field prefix for error messages.

    Returns
    -------
    ModelSpec

    Raises
    ------
    ConfigError
        A required key is missing (the error names it), a value is invalid, the file
        cannot be read, or the model type or a key is not modelled (see the module docstring).
    """
    cfg, source = _read(path_or_dict, where)
    model_type = _refuse_unmodelled(cfg, where)
    if model_type == "nemotron_h":
        return _nemotron_h(cfg, source, name, seq_len, where)
    num_layers = _req(cfg, "num_hidden_layers", where)
    hidden = _req(cfg, "hidden_size", where)
    heads = _req(cfg, "num_attention_heads", where)
    act = cfg.get("hidden_act", "silu")
    if act not in _GATED_ACTIVATIONS:
        raise ConfigError(f"{where}.hidden_act", act,
                          "only SiLU-gated MLPs (SwiGLU) are supported for Llama-style configs")
    if seq_len is None:
        seq_len = _req(cfg, "max_position_embeddings", where)
    attention_bias = bool(cfg.get("attention_bias", False))
    mlp_bias = bool(cfg.get("mlp_bias", False))
    kw: dict = dict(
        name=name or str(cfg.get("_name_or_path") or model_type or "hf-model"),
        num_layers=num_layers,
        hidden_size=hidden,
        ffn_hidden_size=_req(cfg, "intermediate_size", where),
        num_attention_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim"),
        vocab_size=_req(cfg, "vocab_size", where),
        seq_len=seq_len,
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        mlp="swiglu",
        norm="rmsnorm",
        position_embedding="rope",
        add_bias_linear=attention_bias and (mlp_bias or model_type == "gpt_oss"),
        qkv_bias=model_type in _QKV_BIAS_TYPES or (attention_bias and not mlp_bias and model_type != "gpt_oss"),
        qk_norm=model_type in _QK_NORM_TYPES,
        attention_sinks=model_type in _SINK_TYPES,
        activation_clamp=cfg.get("swiglu_limit") if model_type == "gpt_oss" else None,
        rope_mscale=_yarn_mscale(cfg.get("rope_scaling")) if model_type == "gpt_oss" else 1.0,
        **_window(cfg, num_layers, where),
        mtp_layers=cfg.get("num_nextn_predict_layers") or 0,
        source=source,
    )
    if isinstance(num_layers, int) and not isinstance(num_layers, bool) and num_layers > 0:
        kw["moe"] = _moe(cfg, num_layers, model_type, where)
    if model_type == "qwen3_next":
        _qwen3_next(cfg, kw, num_layers, where)
    if cfg.get("kv_lora_rank"):
        _mla(cfg, kw, heads, where)
    try:
        return ModelSpec(**kw)
    except ConfigError as e:
        raise ConfigError(_hf_field(e.field, where), e.value, e.rule) from None


def _mla(cfg: dict, kw: dict, heads, where: str) -> None:
    """DeepSeek's multi-head latent attention into ``kw`` (ModelSpec fields)."""
    mla_kw = {k: _req(cfg, k, where) for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}
    try:
        kw["mla"] = MLASpec(q_lora_rank=cfg.get("q_lora_rank"), **mla_kw)
    except ConfigError as e:
        raise ConfigError(f"{where}.{e.field.split('.', 1)[-1]}", e.value, e.rule) from None
    kw["head_dim"] = None                  # transformers sets head_dim = qk_rope_head_dim; not ours
    kw["num_kv_heads"] = heads
    kw["qkv_bias"] = False                 # MLA's attention_bias (q_a, kv_a, o) is not represented alone


def _qwen3_next(cfg: dict, kw: dict, num_layers, where: str) -> None:
    """Qwen3-Next's gated DeltaNet layers and gated attention into ``kw`` (ModelSpec fields)."""
    types = cfg.get("layer_types")
    g: dict = {"num_key_heads": _req(cfg, "linear_num_key_heads", where),
               "num_value_heads": _req(cfg, "linear_num_value_heads", where),
               "key_head_dim": _req(cfg, "linear_key_head_dim", where),
               "value_head_dim": _req(cfg, "linear_value_head_dim", where),
               "conv_kernel": cfg.get("linear_conv_kernel_dim") or 4}
    if types is not None:
        if not isinstance(types, list) or len(types) != num_layers:
            raise ConfigError(f"{where}.layer_types", types, f"must list {num_layers} entries (num_hidden_layers)")
        g.update(layer_pattern=tuple(_QWEN3_NEXT_LAYER_TYPES[t] for t in types), full_attention_interval=None)
    else:              # transformers' default: every 4th layer full attention
        g["full_attention_interval"] = cfg.get("full_attention_interval") or 4
    try:
        kw["gated_deltanet"] = GatedDeltaNetSpec(**g)
    except ConfigError as e:
        keys = {"num_key_heads": "linear_num_key_heads", "num_value_heads": "linear_num_value_heads",
                "key_head_dim": "linear_key_head_dim", "value_head_dim": "linear_value_head_dim",
                "conv_kernel": "linear_conv_kernel_dim", "layer_pattern": "layer_types"}
        key = e.field.split(".", 1)[-1]
        raise ConfigError(f"{where}.{keys.get(key, key)}", e.value, e.rule) from None
    kw["attention_output_gate"] = True          # Qwen3NextAttention's q_proj: H d x 2 (query and gate)


# ModelSpec field -> config.json key, to name the user's key in errors
_HF_KEYS = {"num_layers": "num_hidden_layers", "ffn_hidden_size": "intermediate_size",
            "num_kv_heads": "num_key_value_heads", "seq_len": "max_position_embeddings",
            "tied_embeddings": "tie_word_embeddings", "mtp_layers": "num_nextn_predict_layers"}


def _hf_field(field: str, where: str) -> str:
    key = field.split(".", 1)[-1]
    return f"{where}.{_HF_KEYS.get(key, key)}"


_NEMOTRON_H_BLOCKS = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}
_NEMOTRON_H_ACTS = {"relu2": "relu2", "silu": "swiglu", "gelu": "gelu"}


def _nemotron_h(cfg: dict, source: str, name, seq_len, where: str) -> ModelSpec:
    """A hybrid ModelSpec from a ``nemotron_h`` config (see the module docstring)."""
    pattern = cfg.get("hybrid_override_pattern")
    if pattern is None and cfg.get("layers_block_type") is not None:
        blocks = cfg["layers_block_type"]
        if not isinstance(blocks, list) or any(b not in _NEMOTRON_H_BLOCKS for b in blocks):
            raise ConfigError(f"{where}.layers_block_type", blocks,
                              f"must be a list of {', '.join(_NEMOTRON_H_BLOCKS)}")
        pattern = "".join(_NEMOTRON_H_BLOCKS[b] for b in blocks)
    if pattern is None:
        raise ConfigError(f"{where}.hybrid_override_pattern", None,
                          "required key missing from the Hugging Face config (or layers_block_type)")
    for key in ("mamba_proj_bias", "mlp_bias", "attention_bias"):
        if cfg.get(key):
            raise ConfigError(f"{where}.{key}", cfg[key], "linear biases are not modelled for nemotron_h")
    act = cfg.get("mlp_hidden_act", "relu2")
    if act not in _NEMOTRON_H_ACTS:
        raise ConfigError(f"{where}.mlp_hidden_act", act, f"must be one of {', '.join(_NEMOTRON_H_ACTS)}")
    heads = _req(cfg, "num_attention_heads", where)
    n_layers = cfg.get("num_hidden_layers")
    kw: dict = dict(
        name=name or str(cfg.get("_name_or_path") or "nemotron_h"),
        num_layers=n_layers if n_layers is not None else (len(pattern) if isinstance(pattern, str) else 0),
        hybrid_override_pattern=pattern,
        hidden_size=_req(cfg, "hidden_size", where),
        ffn_hidden_size=cfg.get("intermediate_size"),
        num_attention_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim"),
        vocab_size=_req(cfg, "vocab_size", where),
        seq_len=seq_len if seq_len is not None else _req(cfg, "max_position_embeddings", where),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        mlp=_NEMOTRON_H_ACTS[act], norm="rmsnorm", position_embedding="none",
        mtp_layers=cfg.get("num_nextn_predict_layers") or 0,
        source=source,
    )
    if isinstance(pattern, str) and "M" in pattern:
        mamba_kw = {"num_heads": _req(cfg, "mamba_num_heads", where), "head_dim": _req(cfg, "mamba_head_dim", where),
                    "state_dim": _req(cfg, "ssm_state_size", where), "num_groups": _req(cfg, "n_groups", where),
                    "conv_kernel": cfg.get("conv_kernel") or 4, "chunk_size": cfg.get("chunk_size") or 128}
        try:
            kw["mamba"] = MambaSpec(**mamba_kw)
        except ConfigError as e:
            keys = {"num_heads": "mamba_num_heads", "head_dim": "mamba_head_dim", "state_dim": "ssm_state_size",
                    "num_groups": "n_groups"}
            key = e.field.split(".", 1)[-1]
            raise ConfigError(f"{where}.{keys.get(key, key)}", e.value, e.rule) from None
    if isinstance(pattern, str) and "E" in pattern:
        moe_kw: dict = dict(num_experts=_req(cfg, "n_routed_experts", where), top_k=_req(cfg, "num_experts_per_tok", where),
                            expert_ffn_hidden_size=_req(cfg, "moe_intermediate_size", where), router_bias=True,
                            latent_size=cfg.get("moe_latent_size") or None)
        shared = cfg.get("n_shared_experts") or 0
        if shared:
            total = _req(cfg, "moe_shared_expert_intermediate_size", where)
            if not isinstance(total, int) or isinstance(total, bool) or total % shared:
                raise ConfigError(f"{where}.moe_shared_expert_intermediate_size", total,
                                  f"must be an integer divisible by n_shared_experts = {shared}")
            moe_kw.update(num_shared_experts=shared, shared_expert_ffn_hidden_size=total // shared)
        try:
            kw["moe"] = MoESpec(**moe_kw)
        except ConfigError as e:
            keys = {"num_experts": "n_routed_experts", "top_k": "num_experts_per_tok",
                    "expert_ffn_hidden_size": "moe_intermediate_size", "latent_size": "moe_latent_size"}
            key = e.field.split(".", 1)[-1]
            raise ConfigError(f"{where}.{keys.get(key, key)}", e.value, e.rule) from None
    if kw["mtp_layers"]:
        mtp_pat = cfg.get("mtp_hybrid_override_pattern", "*E")
        if mtp_pat not in ("*E", "*-"):
            raise ConfigError(f"{where}.mtp_hybrid_override_pattern", mtp_pat,
                              "MTP modules are modelled as one attention + MLP/MoE layer: *E or *-")
    try:
        return ModelSpec(**kw)
    except ConfigError as e:
        key = e.field.split(".", 1)[-1]
        key = {"num_layers": "num_hidden_layers", "num_kv_heads": "num_key_value_heads",
               "mtp_layers": "num_nextn_predict_layers", "seq_len": "max_position_embeddings"}.get(key, key)
        raise ConfigError(f"{where}.{key}", e.value, e.rule) from None
