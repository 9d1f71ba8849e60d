"""Import a model and its parallel layout from Megatron-LM command-line arguments.

``from_megatron_args("--num-layers 80 --hidden-size 8192 ... --tensor-model-parallel-size 8",
num_gpus=512)`` returns ``(ModelSpec, ParallelConfig)``.  The GPU count is not an
argument of Megatron-LM (the launcher sets it), so it is passed separately; Megatron's
data-parallel degree is implicit and includes expert parallelism
(:meth:`ParallelConfig.from_megatron`).

Defaults follow Megatron-LM's argument parser where the flag is absent: GELU MLP,
LayerNorm, learned absolute positions, biases on linear layers, tied embeddings
(``--untie-embeddings-and-output-weights`` unties them).  One exception: without
``--moe-token-dispatcher-type`` the dispatcher is clustersim's default ``alltoall`` (what
MoE training recipes set), not Megatron-Core's ``allgather``.

Flags not read follow one explicit rule.  A flag of an architecture family (``--moe-*``,
``--mamba-*``, ``--rotary-*``, ``--attention-*``, ``--qk-*``, ``--linear-*``, ``--hybrid-*``...:
``_ARCH_PREFIXES``) is refused, naming it, unless it is listed as having no effect on the
model (``_NO_EFFECT_FLAGS``, each with why: RoPE bases, loss weights, router arithmetic,
fusions) or carries a modelled value (``--rotary-percent 1.0``, ``--softmax-type vanilla``,
``--attention-backend flash``); ``_UNSUPPORTED`` names a few more (``--no-position-embedding``,
``--quick-geglu``, ``--activation-func-clamp-value``).  Other flags (data, tokenizer,
logging, checkpointing, optimizer and learning rate, precision, overlaps) do not change the
model and are skipped, so nothing that shapes the model is silently dropped.
"""

from __future__ import annotations

import re
import shlex
from typing import Sequence

from topologies import ConfigError

from .model import ModelSpec
from .parallel import ParallelConfig

__all__ = ["from_megatron_args", "model_from_megatron_args", "overlap_from_megatron_args"]

# Flags taking a value, mapped to (section, key, type).  section "model" | "moe" | "mla" | "parallel" | "other".
_VALUE_FLAGS: dict[str, tuple[str, str, type]] = {
    "--num-layers": ("model", "num_layers", int),
    "--hidden-size": ("model", "hidden_size", int),
    "--ffn-hidden-size": ("model", "ffn_hidden_size", int),
    "--num-attention-heads": ("model", "num_attention_heads", int),
    "--num-query-groups": ("model", "num_kv_heads", int),
    "--kv-channels": ("model", "head_dim", int),
    "--seq-length": ("model", "seq_len", int),
    "--max-position-embeddings": ("other", "max_position_embeddings", int),
    "--vocab-size": ("model", "vocab_size", int),
    "--padded-vocab-size": ("model", "vocab_size", int),
    "--make-vocab-size-divisible-by": ("other", "vocab_divisor", int),
    "--normalization": ("other", "normalization", str),
    "--position-embedding-type": ("other", "position_embedding_type", str),
    "--hidden-dropout": ("model", "dropout", float),
    "--attention-dropout": ("other", "attention_dropout", float),
    "--num-experts": ("moe", "num_experts", int),
    "--moe-router-topk": ("moe", "top_k", int),
    "--moe-ffn-hidden-size": ("moe", "expert_ffn_hidden_size", int),
    "--moe-shared-expert-intermediate-size": ("other", "shared_total", int),
    "--moe-layer-freq": ("other", "moe_layer_freq", str),
    "--moe-expert-capacity-factor": ("moe", "capacity_factor", float),
    "--moe-token-drop-policy": ("moe", "token_drop_policy", str),
    "--moe-expert-rank-capacity-factor": ("moe", "expert_rank_capacity_factor", float),
    "--moe-token-dispatcher-type": ("moe", "token_dispatcher", str),
    "--moe-flex-dispatcher-backend": ("moe", "flex_dispatcher_backend", str),
    "--moe-flex-dispatcher-num-sms": ("moe", "flex_dispatcher_num_sms", int),
    "--q-lora-rank": ("mla", "q_lora_rank", int),
    "--kv-lora-rank": ("mla", "kv_lora_rank", int),
    "--qk-head-dim": ("mla", "qk_nope_head_dim", int),
    "--qk-pos-emb-head-dim": ("mla", "qk_rope_head_dim", int),
    "--v-head-dim": ("mla", "v_head_dim", int),
    "--mtp-num-layers": ("model", "mtp_layers", int),
    "--tensor-model-parallel-size": ("parallel", "tp", int),
    "--pipeline-model-parallel-size": ("parallel", "pp", int),
    "--context-parallel-size": ("parallel", "cp", int),
    "--expert-model-parallel-size": ("parallel", "ep", int),
    "--expert-tensor-parallel-size": ("parallel", "etp", int),
    "--num-layers-per-virtual-pipeline-stage": ("other", "layers_per_vstage", int),
    "--virtual-pipeline-model-parallel-size": ("parallel", "vpp", int),
    "--micro-batch-size": ("parallel", "micro_batch_size", int),
    "--global-batch-size": ("parallel", "global_batch_size", int),
    "--recompute-granularity": ("parallel", "recompute", str),
    "--recompute-method": ("parallel", "recompute_method", str),
    "--recompute-num-layers": ("parallel", "recompute_num_layers", int),
    "--decoder-first-pipeline-num-layers": ("parallel", "num_layers_in_first_pipeline_stage", int),
    "--decoder-last-pipeline-num-layers": ("parallel", "num_layers_in_last_pipeline_stage", int),
    "--pipeline-model-parallel-layout": ("parallel", "pipeline_layout", str),
    # hybrid Mamba stacks (Megatron-Core TransformerConfig mamba_* fields; --hybrid-layer-pattern,
    # its deprecated alias --hybrid-override-pattern) and latent MoE
    "--hybrid-layer-pattern": ("other", "hybrid_pattern", str),
    "--hybrid-override-pattern": ("other", "hybrid_pattern", str),
    "--mamba-state-dim": ("mamba", "state_dim", int),
    "--mamba-head-dim": ("mamba", "head_dim", int),
    "--mamba-num-groups": ("mamba", "num_groups", int),
    "--mamba-num-heads": ("mamba", "num_heads", int),
    "--moe-latent-size": ("moe", "latent_size", int),
    # sliding-window attention (gpt-oss): Megatron-Core's window_size "(left, right)" and
    # window_attn_skip_freq (an integer or a list expression such as "[1,1,1,0]*3")
    "--window-size": ("other", "window_size", str),
    "--window-attn-skip-freq": ("other", "window_skip", str),
}
_LIST_FLAGS = {"--recompute-modules": ("parallel", "recompute_modules"),
               "--cp-comm-type": ("other", "cp_comm_type"),
               "--hierarchical-context-parallel-sizes": ("other", "hierarchical_cp_sizes")}
_CP_COMM_TYPES = {"p2p": "p2p", "allgather": "all_gather", "all_gather": "all_gather", "a2a": "a2a",
                  "a2a+p2p": "a2a+p2p"}
"""Megatron-LM's ``--cp-comm-type`` names (``allgather``) to clustersim's (Transformer Engine's)."""
_SWITCHES: dict[str, tuple[str, str, object]] = {
    "--swiglu": ("model", "mlp", "swiglu"),
    "--untie-embeddings-and-output-weights": ("model", "tied_embeddings", False),
    "--disable-bias-linear": ("model", "add_bias_linear", False),
    "--add-qkv-bias": ("model", "qkv_bias", True),
    "--qk-layernorm": ("model", "qk_norm", True),
    "--group-query-attention": ("other", "gqa", True),
    "--multi-latent-attention": ("other", "mla", True),
    "--sequence-parallel": ("parallel", "sequence_parallel", True),
    "--use-distributed-optimizer": ("parallel", "distributed_optimizer", True),
    "--account-for-embedding-in-pipeline-split": ("parallel", "account_for_embedding_in_pipeline_split", True),
    "--account-for-loss-in-pipeline-split": ("parallel", "account_for_loss_in_pipeline_split", True),
    "--moe-router-enable-expert-bias": ("moe", "router_bias", True),
    "--moe-pad-expert-input-to-capacity": ("moe", "pad_expert_input_to_capacity", True),
    "--overlap-moe-expert-parallel-comm": ("overlap", "moe_ep_comm", True),
    "--delay-wgrad-compute": ("other", "delay_wgrad_compute", True),
    "--squared-relu": ("model", "mlp", "relu2"),
    "--mtp-use-repeated-layer": ("model", "mtp_repeated_layer", True),
}
# Flags that change the step but have no meaning in clustersim yet (with a hint where one helps).
_UNSUPPORTED = {"--num-experts-per-layer": "", "--encoder-num-layers": "", "--decoder-num-layers": "",
                "--no-position-embedding": "; give --position-embedding-type none",
                "--quick-geglu": "", "--activation-func-clamp-value": "",
                "--moe-enable-deepep": "; give --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep",
                "--moe-layer-recompute": "; give --recompute-granularity selective --recompute-modules moe"}
# Flag families that shape the model (architecture): an unread flag of these is refused unless
# listed in _NO_EFFECT_FLAGS or given a modelled value (_MODELLED_VALUES).  Unread flags outside
# them (data, tokenizer, logging, checkpointing, optimizer and learning rate, precision, kernel
# fusions, communication overlaps) are skipped: they do not change the model.
_ARCH_PREFIXES = ("--num-layers", "--num-experts", "--num-query-groups", "--num-attention-heads", "--hidden-",
                  "--ffn-", "--kv-", "--q-", "--qk-", "--v-", "--moe-", "--mamba-", "--mtp-", "--hybrid-",
                  "--rotary-", "--rope-", "--position-", "--attention-", "--softmax-", "--window-",
                  "--multi-latent", "--group-query", "--linear-", "--heterogeneous-", "--experimental-",
                  "--normalization", "--apply-", "--glu-", "--activation-", "--add-", "--encoder-", "--decoder-")
_NO_EFFECT_FLAGS = {
    "--attention-softmax-in-fp32": "numerics", "--apply-layernorm-1p": "zero-centred norm weights: same parameters",
    "--apply-query-key-layer-scaling": "numerics", "--apply-residual-connection-post-layernorm": "same ops",
    "--apply-rope-fusion": "a fusion (the default)", "--rotary-base": "RoPE table values",
    "--rotary-interleaved": "RoPE layout", "--rotary-seq-len-interpolation-factor": "RoPE table values",
    "--rotary-scaling-factor": "RoPE table values", "--rope-scaling-factor": "RoPE table values",
    "--glu-linear-offset": "an elementwise offset in the GLU",
    "--moe-grouped-gemm": "the grouped expert GEMMs clustersim models",
    "--moe-use-legacy-grouped-gemm": "a grouped-GEMM implementation", "--moe-permute-fusion": "a fusion",
    "--moe-router-fusion": "a fusion", "--moe-shared-expert-overlap": "an overlap, not the model",
    "--moe-router-load-balancing-type": "a loss", "--moe-aux-loss-coeff": "a loss weight",
    "--moe-z-loss-coeff": "a loss weight", "--moe-input-jitter-eps": "router input noise (elementwise)",
    "--moe-router-score-function": "softmax or sigmoid scores (elementwise)",
    "--moe-router-pre-softmax": "router arithmetic (elementwise)",
    "--moe-router-topk-scaling-factor": "scaling the routed output (elementwise)",
    "--moe-router-dtype": "router numerics", "--moe-router-bias-update-rate": "the expert-bias update",
    "--moe-router-num-groups": "group-limited routing: as many experts per token (node spread not modelled)",
    "--moe-router-group-topk": "group-limited routing: as many experts per token (node spread not modelled)",
    "--moe-per-layer-logging": "logging", "--moe-use-upcycling": "checkpoint conversion",
    "--moe-upcycling-granularity": "checkpoint conversion", "--mtp-loss-scaling-factor": "a loss weight",
}
# Unread flags that are modelled with these values only (Megatron-LM's defaults or equivalents).
_MODELLED_VALUES = {"--rotary-percent": ("1.0",), "--softmax-type": ("vanilla",),
                    "--attention-backend": ("auto", "flash", "fused")}


def _tokens(argv: str | Sequence[str]) -> list[str]:
    """The command line as tokens, ``--flag=value`` split in two."""
    toks = shlex.split(argv) if isinstance(argv, str) else list(argv)
    out = []
    for t in toks:
        if t.startswith("--") and "=" in t:
            k, v = t.split("=", 1)
            out += [k, v]
        else:
            out.append(t)
    return out


def from_megatron_args(argv: str | Sequence[str], num_gpus: int,
                       name: str = "megatron-args") -> tuple[ModelSpec, ParallelConfig]:
    """Parse Megatron-LM arguments into ``(ModelSpec, ParallelConfig)`` for ``num_gpus`` GPUs."""
    sec = _sections(_tokens(argv))
    model = ModelSpec.from_dict(_model_dict(sec, name), where="megatron_args")
    par = _parallel_kwargs(sec["parallel"], sec["other"], model)
    cfg = ParallelConfig.from_megatron(world_size=num_gpus, **par)
    cfg.check_model(model)
    return model, cfg


def model_from_megatron_args(argv: str | Sequence[str], name: str = "megatron-args") -> ModelSpec:
    """Only the model of Megatron-LM arguments (no GPU count needed): what a scenario's
    ``model: {megatron_args: "..."}`` reads."""
    return ModelSpec.from_dict(_model_dict(_sections(_tokens(argv)), name), where="model.megatron_args")


def overlap_from_megatron_args(argv: str | Sequence[str]) -> dict[str, bool]:
    """The scenario's ``overlap`` switches the arguments set: ``--overlap-moe-expert-parallel-comm``
    is ``moe_ep_comm`` (``--delay-wgrad-compute`` goes with it: the delayed weight gradients
    are part of the modelled F&B pair, so alone it changes nothing)."""
    return dict(_sections(_tokens(argv))["overlap"])


def _sections(toks: list[str]) -> dict[str, dict]:
    """The flags' values by section (see ``_VALUE_FLAGS``); an unknown flag is skipped with
    its values, an unsupported one or a stray value is an error."""
    sec: dict[str, dict] = {"model": {}, "moe": {}, "mla": {}, "mamba": {}, "parallel": {}, "other": {},
                            "overlap": {}}
    i = 0
    while i < len(toks):
        flag = toks[i]
        if flag in _VALUE_FLAGS:
            if i + 1 >= len(toks):
                raise ConfigError(flag, None, "expects a value")
            s, key, typ = _VALUE_FLAGS[flag]
            try:
                sec[s][key] = typ(toks[i + 1])
            except ValueError:
                raise ConfigError(flag, toks[i + 1], f"expects a {typ.__name__}") from None
            i += 2
        elif flag in _LIST_FLAGS:
            s, key = _LIST_FLAGS[flag]
            vals = []
            i += 1
            while i < len(toks) and not toks[i].startswith("--"):
                vals.append(toks[i])
                i += 1
            sec[s][key] = tuple(vals)
        elif flag in _SWITCHES:
            s, key, val = _SWITCHES[flag]
            sec[s][key] = val
            i += 1
        elif flag in _UNSUPPORTED:
            raise ConfigError(flag, None, "changes the training step but is not modelled by clustersim"
                                          + _UNSUPPORTED[flag])
        elif flag.startswith("--"):
            # a flag not read: refused if it shapes the model, else skipped with its value(s)
            j = i + 1
            while j < len(toks) and not toks[j].startswith("--"):
                j += 1
            _check_unread(flag, toks[i + 1:j])
            i = j
        else:
            raise ConfigError("megatron_args", flag, "expected a --flag")
    return sec


def _same(value: str, modelled: str) -> bool:
    try:
        return float(value) == float(modelled)
    except ValueError:
        return value == modelled


def _check_unread(flag: str, values: list[str]) -> None:
    """ConfigError for a flag that is not read but shapes the model (an architecture-family
    flag neither listed as without effect nor given a modelled value)."""
    if flag in _MODELLED_VALUES:
        if len(values) == 1 and any(_same(values[0], v) for v in _MODELLED_VALUES[flag]):
            return
        raise ConfigError(flag, " ".join(values), f"not modelled by clustersim; only "
                                                  f"{' or '.join(_MODELLED_VALUES[flag])}")
    if flag in _NO_EFFECT_FLAGS or not flag.startswith(_ARCH_PREFIXES):
        return
    raise ConfigError(flag, " ".join(values) or None,
                      "an architecture flag not modelled by clustersim (refused rather than ignored)")


def _model_dict(sec: dict[str, dict], name: str) -> dict:
    """The :meth:`ModelSpec.from_dict` mapping: the model section with Megatron-LM's
    defaults, its norm and position-embedding names, and the MoE and MLA sections."""
    m, other = sec["model"], sec["other"]
    # Megatron-LM defaults that differ from ModelSpec's (Llama-style) defaults
    m.setdefault("mlp", "gelu")
    m.setdefault("add_bias_linear", True)
    m.setdefault("tied_embeddings", True)
    norm = other.get("normalization", "LayerNorm")
    m["norm"] = {"LayerNorm": "layernorm", "RMSNorm": "rmsnorm"}.get(norm, norm)
    pos = other.get("position_embedding_type", "learned_absolute")
    m["position_embedding"] = {"learned_absolute": "learned", "rope": "rope", "none": "none"}.get(pos, pos)
    if not other.get("gqa"):
        m.pop("num_kv_heads", None)
    if "vocab_size" not in m:
        raise ConfigError("--vocab-size", None, "required (Megatron reads it from the tokenizer; pass it)")
    if sec["moe"]:
        moe = dict(sec["moe"])
        if "shared_total" in other:
            moe["num_shared_experts"] = 1
            moe["shared_expert_ffn_hidden_size"] = other["shared_total"]
        freq = other.get("moe_layer_freq")
        if freq is not None:
            if freq.startswith("["):
                moe["moe_layer_pattern"] = [int(x) for x in freq.strip("[]").split(",") if x.strip()]
            else:
                moe["moe_layer_freq"] = int(freq)
        m["moe"] = moe
    if other.get("mla"):
        m["mla"] = dict(sec["mla"])
    if "window_size" in other:
        _window(m, other["window_size"], other.get("window_skip"))
    elif "window_skip" in other:
        raise ConfigError("--window-attn-skip-freq", other["window_skip"], "needs --window-size")
    if "hybrid_pattern" in other:
        _hybrid(m, sec["mamba"], other["hybrid_pattern"])
    elif sec["mamba"]:
        flag = "--mamba-" + next(iter(sec["mamba"])).replace("_", "-")
        raise ConfigError(flag, next(iter(sec["mamba"].values())), "needs --hybrid-layer-pattern")
    m["name"] = name
    return m


def _window(m: dict, size: str, skip: str | None) -> None:
    """Sliding-window fields from ``--window-size "(left, right)"`` (Megatron-Core's
    ``window_size``: a query sees ``left`` earlier tokens and itself, so ``sliding_window =
    left + 1``; ``right`` must be 0, causal) and ``--window-attn-skip-freq`` (an integer N:
    every N-th layer full; or a list expression of 1 = windowed / 0 = full flags, terms
    ``[...]`` or ``[...]*k`` joined by ``+``)."""
    try:
        left, right = (int(x) for x in size.strip().strip("()").split(","))
    except ValueError:
        raise ConfigError("--window-size", size, "expects two integers, e.g. (127,0)") from None
    if right != 0 or left < 0:
        raise ConfigError("--window-size", size, "only causal windows (left >= 0, right 0) are modelled")
    m["sliding_window"] = left + 1
    if skip is None:
        return
    text = skip.replace(" ", "")
    if text.isdigit():
        m["window_attn_skip_freq"] = int(text)
        return
    flags: list[int] = []
    for term in text.split("+"):
        match = re.fullmatch(r"\[([01,]*)\](?:\*(\d+))?", term)
        if match is None:
            raise ConfigError("--window-attn-skip-freq", skip,
                              "expects an integer or a list expression of 0/1 flags, e.g. [1,1,1,0]*3")
        flags += [int(x) for x in match.group(1).split(",") if x] * int(match.group(2) or 1)
    m["window_layer_pattern"] = flags


def _hybrid(m: dict, mamba: dict, pattern: str) -> None:
    """A hybrid stack from Megatron's pattern (``M`` Mamba, ``*`` attention, ``-`` MLP, ``E``
    MoE; ``/`` separates the MTP depths' patterns, each modelled as one attention + MLP/MoE
    layer) and the ``--mamba-*`` flags with Megatron-Core's defaults: state 128, head dim 64,
    8 groups, heads ``2 h / head_dim`` (expand 2)."""
    main, *mtp = pattern.split("/")
    if "|" in main:
        raise ConfigError("--hybrid-layer-pattern", pattern, "pipeline-stage separators '|' are not read; give "
                                                             "--pipeline-model-parallel-layout instead")
    if mtp:
        if any(p not in ("*E", "*-") for p in mtp):
            raise ConfigError("--hybrid-layer-pattern", pattern,
                              "MTP patterns after '/' are modelled as one attention + MLP/MoE layer: *E or *-")
        if m.get("mtp_layers") not in (None, len(mtp)):
            raise ConfigError("--mtp-num-layers", m["mtp_layers"],
                              f"must equal the MTP depths of --hybrid-layer-pattern ({len(mtp)})")
        m["mtp_layers"] = len(mtp)
    m["hybrid_override_pattern"] = main
    m.setdefault("num_layers", len(main))
    if "M" in main:
        mb = dict(mamba)
        mb.setdefault("state_dim", 128)
        mb.setdefault("head_dim", 64)
        mb.setdefault("num_groups", 8)
        if "num_heads" not in mb and isinstance(m.get("hidden_size"), int):
            mb["num_heads"] = 2 * m["hidden_size"] // mb["head_dim"]
        m["mamba"] = mb


def _parallel_kwargs(par: dict, other: dict, model: ModelSpec) -> dict:
    """The :meth:`ParallelConfig.from_megatron` keywords: the parallel section with the
    virtual pipeline size, the schedule, recomputation and Megatron-LM's defaults."""
    if "layers_per_vstage" in other:
        pp = par.get("pp", 1)
        per_stage = model.num_layers // pp
        if per_stage % other["layers_per_vstage"]:
            raise ConfigError("--num-layers-per-virtual-pipeline-stage", other["layers_per_vstage"],
                              f"must divide the layers per pipeline stage ({per_stage})")
        par["vpp"] = per_stage // other["layers_per_vstage"]
    if par.get("vpp", 1) > 1:
        par["schedule"] = "interleaved_1f1b"
    gran = par.pop("recompute", None)
    par["recompute"] = gran if gran in ("full", "selective") else "none"
    if gran is None:
        par.setdefault("recompute_modules", ())
    par.setdefault("sequence_parallel", False)
    par.setdefault("distributed_optimizer", False)
    par.setdefault("zero_stage", 1 if par["distributed_optimizer"] else 0)
    par["seq_len"] = model.seq_len
    # --cp-comm-type takes one type for every layer or one per layer (Megatron-LM's
    # arguments.py, nargs='+'); clustersim runs one type for all of them
    kinds = other.get("cp_comm_type")
    if kinds:
        if len(set(kinds)) > 1:
            raise ConfigError("--cp-comm-type", " ".join(kinds), "one type for every layer (per-layer types are "
                                                               "not modelled)")
        if kinds[0] not in _CP_COMM_TYPES:
            raise ConfigError("--cp-comm-type", kinds[0], "must be p2p, a2a, allgather or a2a+p2p")
        par["cp_comm_type"] = _CP_COMM_TYPES[kinds[0]]
    hcp = other.get("hierarchical_cp_sizes")
    if hcp:
        try:
            par["hierarchical_context_parallel_sizes"] = tuple(int(x) for x in hcp)
        except ValueError:
            raise ConfigError("--hierarchical-context-parallel-sizes", " ".join(hcp), "expects integers") from None
    return par
