"""`ModelSpec`: decoder-only transformers, dense and mixture-of-experts, with exact parameter counts.

What is modelled
----------------
A stack of ``num_layers`` pre-norm decoder layers between a word embedding (plus an
optional learned position table) and an output layer, followed by optional DeepSeek-V3
style multi-token-prediction (MTP) modules.  Each layer is

* a norm, then attention: multi-head / grouped-query attention (``num_kv_heads``), or
  DeepSeek's multi-head latent attention (``mla``); optional per-head q/k norms (Qwen3,
  Megatron's ``qk_layernorm``);
* a norm, then a feed-forward block: a dense MLP of ``ffn_hidden_size``, or in MoE layers
  a router, ``num_experts`` routed experts of ``expert_ffn_hidden_size`` of which ``top_k``
  run per token, and ``num_shared_experts`` that every token runs.

``mlp`` is ``"gelu"`` (two matrices, ``h -> f -> h``) or ``"swiglu"`` (three: gate and up
``h -> f``, down ``f -> h``); ``norm`` is ``"layernorm"`` (weight and bias, ``2h``) or
``"rmsnorm"`` (weight, ``h``).

Sliding-window attention (Mistral 7B, gpt-oss) is a per-layer property: with
``sliding_window = w`` a query attends to the ``w`` most recent tokens, itself included
(Hugging Face's ``sliding_window``; Megatron-Core's ``window_size = (w - 1, 0)``), in the
layers :meth:`ModelSpec.attention_window` names; the others attend causally to the whole
sequence.  Which layers are windowed follows Megatron-Core: every layer, or all but every
``window_attn_skip_freq``-th (1-based: ``2`` makes layers 1, 3, 5, ... full, gpt-oss's
alternation), or an explicit per-layer ``window_layer_pattern``.  A window changes the
work of core attention (:mod:`workloads.costs.flops`), not the parameters.
``attention_sinks`` adds gpt-oss's learned per-head sink logit (Megatron's learnable
``softmax_offset``): ``H`` parameters per layer.

Hybrid stacks (Nemotron-H, Nemotron 3) are a per-layer pattern, Megatron-Core's
``hybrid_override_pattern``: each character is one layer holding one pre-norm and one
sublayer, ``M`` a Mamba-2 mixer (:class:`MambaSpec`), ``*`` attention, ``-`` a dense MLP,
``E`` an MoE block (:meth:`ModelSpec.layer_kind`).  Latent MoE (``MoESpec.latent_size``)
runs the routed experts in a reduced width between a down and an up projection;
``mlp="relu2"`` is the non-gated squared ReLU of Nemotron's MLPs and experts.

Nothing else is modelled: no encoder, no cross-attention, no other linear-attention layers
(gated delta nets), no Qwen2-MoE shared-expert gate (``h`` parameters per layer).

Parameter counts
----------------
With ``h`` the hidden size, ``H`` / ``K`` the query / key-value heads, ``d`` the head
dimension, ``f`` an MLP width, ``V`` the vocabulary, ``s`` the sequence length,
``n(x)`` the parameters of a norm of width ``x`` and ``m`` = 2 (gelu, relu2) or 3 (swiglu)::

    attention (GQA)  h*H*d + 2*h*K*d + H*d*h   [+ H*d + 2*K*d  qkv biases]  [+ h  output bias]
                     [+ 2*n(d)  q/k norms]  [+ H  attention sinks]
    attention (MLA)  q:  h*q_lora + n(q_lora) + q_lora*H*(nope+rope)   (or h*H*(nope+rope) without q_lora)
                     kv: h*(kv_lora+rope) + n(kv_lora) + kv_lora*H*(nope+v)
                     out: H*v*h
    MLP              m*h*f                      [+ (m-1)*f + h  biases]
    MoE block        router h*E [+ E] + E * MLP(expert f) + S * MLP(shared f)
                     latent l: experts read / write l, m*l*fe each, plus 2*h*l projections
    Mamba-2 mixer    h*(2D + 2GN + nh) + (D + 2GN)*(k + 1) + 3*nh + D + D*h     D = nh*hd
    layer            2*n(h) + attention + (MLP | MoE block)
    hybrid layer     n(h) + one of Mamba mixer | attention | MLP | MoE block
    model            V*h (embedding) [+ s*h learned positions] + layers + n(h) (final norm)
                     [+ V*h output layer unless tied]

``[...]`` terms depend on ``add_bias_linear``, ``qkv_bias``, ``qk_norm``, ``attention_sinks``,
``router_bias``, ``position_embedding`` and ``tied_embeddings``.  Megatron-LM's GPT (gelu, LayerNorm,
biases, learned positions, tied embeddings) thus has ``12 l h^2 + 13 l h + (V + s) h + 2h``
parameters: Narayanan et al. (SC'21) eq. for P plus the final LayerNorm, which their
formula leaves out.

MTP modules are counted DeepSeek's way: each has two input norms (``enorm``, ``hnorm``),
the projection ``eh_proj`` (``2h x h``), one decoder layer shaped like the last layer of
the main model and a final norm; it *shares* the embedding and the output layer with the
main model, so they are not counted again.  Published totals exclude MTP: DeepSeek-V3's
671B is the main model, and the checkpoint's 685B adds the 14B MTP module weights
(11.5B unique plus stored copies of the shared 0.9B embedding and 0.9B output head;
deepseek-ai/DeepSeek-V3 ``README_WEIGHTS.md``).  Hence ``num_params()`` excludes MTP and
``num_params(include_mtp=True)`` adds the unique MTP parameters, which are what training
holds in memory.

Active parameters per token count every dense part, the router, the shared experts and
``top_k`` routed experts of each MoE layer.  Publishers disagree on the input embedding:
Mistral (Mixtral 12.9B) and Qwen (Qwen3 3.3B / 22B) count it; DeepSeek's 36.6B ("37B")
and OpenAI's gpt-oss 5.13B / 3.61B do not (they count the output head); hence
``num_active_params(include_embedding=...)``.

Defaults
--------
Where a field is left out, ``ModelSpec`` assumes today's Llama-style decoder: SwiGLU,
RMSNorm, rotary positions, no linear biases, untied embeddings.  This differs from
Megatron-LM's GPT defaults (gelu, LayerNorm, learned absolute positions, biases, tied
embeddings); every one of them is a field, and the Megatron GPT presets set them.
``ffn_hidden_size`` defaults as in Megatron-LM: ``4h`` for gelu and
``int(8h / 3 / 64) * 64`` for swiglu.

All errors on user input are :class:`~topologies.ConfigError` naming the field, the value
and the rule.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass

from topologies import ConfigError
from topologies.errors import check_keys

from .blocks import layer_blocks
from .blocks.fields import bool_field as _bool, build as _build, choice_field as _choice, int_field as _int, \
    set_field as _set, sub_spec as _sub_spec
from .blocks.gated_deltanet import GatedDeltaNetSpec

__all__ = ["BREAKDOWN_KEYS", "HYBRID_SYMBOLS", "MLP_KINDS", "NORM_KINDS", "POSITION_EMBEDDINGS",
           "GatedDeltaNetSpec", "MLASpec", "MambaSpec", "ModelSpec", "MoESpec"]

MLP_KINDS = ("gelu", "swiglu", "relu2")
NORM_KINDS = ("layernorm", "rmsnorm")
POSITION_EMBEDDINGS = ("rope", "learned", "none")
_MLP_MATRICES = {"gelu": 2, "swiglu": 3, "relu2": 2}
_NORM_PARAMS_PER_ELEMENT = {"layernorm": 2, "rmsnorm": 1}   # weight (+ bias)

#: Keys of :meth:`ModelSpec.param_breakdown`, in order.
BREAKDOWN_KEYS = ("embedding", "position_embedding", "attention", "mamba", "mlp", "router", "latent_proj",
                  "routed_experts", "shared_experts", "norms", "output_layer", "mtp", "linear_attention")

#: Layer symbols of a hybrid pattern (Megatron-Core ``hybrid_layer_allocation.Symbols``): one
#: character is one layer with one pre-normed sublayer.
HYBRID_SYMBOLS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


# -- MoE and MLA -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class MoESpec:
    """Mixture-of-experts feed-forward blocks: which layers have them and how they route."""

    num_experts: int
    """Routed experts per MoE layer (Mixtral 8, DeepSeek-V3 256, Qwen3-MoE 128)."""
    top_k: int
    """Routed experts each token runs (Megatron's ``moe_router_topk``)."""
    expert_ffn_hidden_size: int | None = None
    """Hidden width of one routed expert's MLP; None: the model's ``ffn_hidden_size``."""
    num_shared_experts: int = 0
    """Experts every token runs besides the routed ones (DeepSeek's ``n_shared_experts``)."""
    shared_expert_ffn_hidden_size: int | None = None
    """Hidden width of *one* shared expert; None: ``expert_ffn_hidden_size``.  Megatron's
    ``moe_shared_expert_intermediate_size`` is the total, ``num_shared_experts`` times this."""
    moe_layer_freq: int = 1
    """Layer ``i`` (0-based) is MoE when ``i % moe_layer_freq == 0`` (and ``i >= first_k_dense``),
    as in Megatron-LM's integer ``--moe-layer-freq`` and DeepSeek's ``moe_layer_freq``."""
    first_k_dense: int = 0
    """The first k layers are dense (DeepSeek's ``first_k_dense_replace``)."""
    moe_layer_pattern: tuple[int, ...] | None = None
    """Explicit per-layer flags, 1 = MoE, 0 = dense (Megatron's list form of ``--moe-layer-freq``);
    overrides the two rules above, which must then keep their defaults."""
    capacity_factor: float | None = None
    """Tokens an expert accepts, as a multiple of the balanced share; excess tokens are dropped.
    None: dropless (Megatron-Core's default, and Mixtral / DeepSeek / Qwen training)."""
    router_bias: bool = False
    """A per-expert bias on the router scores (DeepSeek-V3's auxiliary-loss-free balancing bias,
    ``e_score_correction_bias``): ``num_experts`` extra parameters per MoE layer."""
    token_drop_policy: str = "probs"
    """Which tokens an over-full expert drops (Megatron-Core's ``--moe-token-drop-policy``):
    ``probs`` (lowest routing probability) or ``position`` (latest in the sequence).  The number
    dropped, and so the step, is the same for both."""
    pad_expert_input_to_capacity: bool = False
    """Every (source rank, expert) pair sends exactly its capacity, padding what routing left
    short (``--moe-pad-expert-input-to-capacity``); needs ``capacity_factor``."""
    expert_rank_capacity_factor: float | None = None
    """HybridEP's per-EP-rank token budget, as a multiple of one rank's ``local tokens x
    top_k`` (``moe_expert_rank_capacity_factor``); tokens above it are dropped.  Needs the
    ``flex`` dispatcher with the ``hybridep`` backend.  None: no budget."""
    token_dispatcher: str = "alltoall"
    """``alltoall`` | ``allgather`` | ``flex`` (``--moe-token-dispatcher-type``; clustersim's
    default is ``alltoall``, Megatron-Core's own default is ``allgather``)."""
    flex_dispatcher_backend: str = "deepep"
    """With ``token_dispatcher: flex``: ``deepep`` or ``hybridep``
    (``--moe-flex-dispatcher-backend``)."""
    flex_dispatcher_num_sms: int | None = None
    """SMs the flex dispatcher's kernels hold (``moe_flex_dispatcher_num_sms``); None: the
    backend's default (DeepEP 20, HybridEP 16: ``workloads.moe_routing`` cites both)."""
    shared_expert_gate: bool = False
    """A sigmoid gate scales the shared experts' output per token (Qwen2-MoE / Qwen3-Next
    ``shared_expert_gate``, Megatron-Core's ``moe_shared_expert_gate``): ``h`` parameters per
    MoE layer, one ``h -> 1`` projection and an element-wise product."""
    latent_size: int | None = None
    """Latent MoE (Nemotron 3 Super / Ultra; Megatron-Core's ``moe_latent_size``): the routed
    experts run in this reduced width.  A down projection ``h -> latent`` (``fc1_latent_proj``)
    runs before the dispatch, so the all-to-all carries ``latent``-wide tokens, and an up
    projection ``latent -> h`` (``fc2_latent_proj``) after the combine; both are replicated
    over TP (Megatron-Core ``moe_layer.py``, ``parallel_mode="duplicated"``).  The router and
    the shared experts keep the full width.  None: experts run at ``h``."""

    def __post_init__(self):
        w = "moe"
        _set(self, "num_experts", _int(w, "num_experts", self.num_experts))
        _set(self, "top_k", _int(w, "top_k", self.top_k))
        if self.top_k > self.num_experts:
            raise ConfigError(f"{w}.top_k", self.top_k, f"must be <= num_experts = {self.num_experts}")
        _set(self, "expert_ffn_hidden_size", _int(w, "expert_ffn_hidden_size", self.expert_ffn_hidden_size,
                                                  optional=True))
        _set(self, "num_shared_experts", _int(w, "num_shared_experts", self.num_shared_experts, minimum=0))
        shared = _int(w, "shared_expert_ffn_hidden_size", self.shared_expert_ffn_hidden_size, optional=True)
        _set(self, "shared_expert_ffn_hidden_size", shared if shared is not None else self.expert_ffn_hidden_size)
        _set(self, "moe_layer_freq", _int(w, "moe_layer_freq", self.moe_layer_freq))
        _set(self, "first_k_dense", _int(w, "first_k_dense", self.first_k_dense, minimum=0))
        if self.moe_layer_pattern is not None:
            pat = self.moe_layer_pattern
            if isinstance(pat, (str, bytes)) or not hasattr(pat, "__iter__"):
                raise ConfigError(f"{w}.moe_layer_pattern", pat, "must be a list of 0/1 flags, one per layer")
            pat = tuple(pat)
            if not pat or any(not isinstance(x, numbers.Integral) or x not in (0, 1) for x in pat):
                raise ConfigError(f"{w}.moe_layer_pattern", list(pat), "must be a list of 0/1 flags, one per layer")
            if self.moe_layer_freq != 1 or self.first_k_dense != 0:
                raise ConfigError(f"{w}.moe_layer_pattern", list(pat),
                                  "give either moe_layer_pattern or moe_layer_freq / first_k_dense, not both")
            _set(self, "moe_layer_pattern", tuple(int(x) for x in pat))
        cf = self.capacity_factor
        if cf is not None:
            if isinstance(cf, bool) or not isinstance(cf, numbers.Real) or not cf > 0:
                raise ConfigError(f"{w}.capacity_factor", cf, "must be a positive number, or null for dropless")
            _set(self, "capacity_factor", float(cf))
        _bool(w, "router_bias", self.router_bias)
        _bool(w, "shared_expert_gate", self.shared_expert_gate)
        if self.shared_expert_gate and not self.num_shared_experts:
            raise ConfigError(f"{w}.shared_expert_gate", True, "gates the shared experts: needs num_shared_experts")
        _set(self, "latent_size", _int(w, "latent_size", self.latent_size, optional=True))
        self._check_dropping_and_dispatch(w)

    def _check_dropping_and_dispatch(self, w: str) -> None:
        """Megatron-Core's rules (transformer_config.py ``__post_init__``) for token dropping
        and the dispatcher, as ConfigErrors."""
        from .moe_routing import DISPATCHERS, DROP_POLICIES, FLEX_BACKENDS    # noqa: PLC0415 (cycle)
        if self.token_drop_policy not in DROP_POLICIES:
            raise ConfigError(f"{w}.token_drop_policy", self.token_drop_policy, f"must be one of {', '.join(DROP_POLICIES)}")
        _bool(w, "pad_expert_input_to_capacity", self.pad_expert_input_to_capacity)
        if self.pad_expert_input_to_capacity and self.capacity_factor is None:
            raise ConfigError(f"{w}.pad_expert_input_to_capacity", True, "padding to capacity needs capacity_factor")
        if self.token_dispatcher not in DISPATCHERS:
            raise ConfigError(f"{w}.token_dispatcher", self.token_dispatcher, f"must be one of {', '.join(DISPATCHERS)}")
        if self.flex_dispatcher_backend not in FLEX_BACKENDS:
            raise ConfigError(f"{w}.flex_dispatcher_backend", self.flex_dispatcher_backend,
                              f"must be one of {', '.join(FLEX_BACKENDS)}")
        flex = self.token_dispatcher == "flex"
        if flex and self.flex_dispatcher_backend == "deepep" and self.pad_expert_input_to_capacity:
            raise ConfigError(f"{w}.pad_expert_input_to_capacity", True,
                              "the flex dispatcher's deepep backend does not pad to capacity (Megatron-Core refuses it)")
        _set(self, "flex_dispatcher_num_sms", _int(w, "flex_dispatcher_num_sms", self.flex_dispatcher_num_sms,
                                                   optional=True))
        if self.flex_dispatcher_num_sms is not None and not flex:
            raise ConfigError(f"{w}.flex_dispatcher_num_sms", self.flex_dispatcher_num_sms,
                              "only the flex dispatcher reserves SMs (set token_dispatcher: flex)")
        rcf = self.expert_rank_capacity_factor
        if rcf is not None:
            if isinstance(rcf, bool) or not isinstance(rcf, numbers.Real) or not rcf > 0:
                raise ConfigError(f"{w}.expert_rank_capacity_factor", rcf, "must be a positive number, or null")
            if not (flex and self.flex_dispatcher_backend == "hybridep"):
                raise ConfigError(f"{w}.expert_rank_capacity_factor", rcf,
                                  "the per-rank budget needs token_dispatcher: flex with flex_dispatcher_backend: hybridep")
            _set(self, "expert_rank_capacity_factor", float(rcf))

    @property
    def expert_width(self) -> int | None:
        """Width the routed experts read and write: ``latent_size`` or None (the model's ``h``)."""
        return self.latent_size

    def is_moe_layer(self, i: int) -> bool:
        """Whether decoder layer ``i`` (0-based) has a MoE block (no range check)."""
        if self.moe_layer_pattern is not None:
            return bool(self.moe_layer_pattern[i])
        return i >= self.first_k_dense and i % self.moe_layer_freq == 0

    @classmethod
    def from_dict(cls, d: Mapping, where: str = "model.moe") -> "MoESpec":
        """From a YAML mapping of MoESpec fields; unknown keys are errors."""
        return _sub_spec(cls, d, ("num_experts", "top_k"), "moe", where)

    def to_dict(self) -> dict:
        """Plain mapping (lists, no tuples) that :meth:`from_dict` reads back to an equal spec."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if out["moe_layer_pattern"] is not None:
            out["moe_layer_pattern"] = list(out["moe_layer_pattern"])
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank compressed queries and keys/values."""

    q_lora_rank: int | None = None
    """Rank of the query compression (1536 in DeepSeek-V3); None: queries projected directly
    from the hidden state (DeepSeek-V2-Lite)."""
    kv_lora_rank: int
    """Rank of the joint key/value compression (512): the latent the KV cache stores."""
    qk_nope_head_dim: int
    """Per-head query/key dimension without rotary embedding (128)."""
    qk_rope_head_dim: int
    """Per-head query/key dimension with rotary embedding; the key part is shared by all heads (64)."""
    v_head_dim: int
    """Per-head value dimension (128)."""

    def __post_init__(self):
        w = "mla"
        _set(self, "q_lora_rank", _int(w, "q_lora_rank", self.q_lora_rank, optional=True))
        for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            _set(self, key, _int(w, key, getattr(self, key)))

    @property
    def qk_head_dim(self) -> int:
        """Query/key dimension per head: ``qk_nope_head_dim + qk_rope_head_dim``."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @classmethod
    def from_dict(cls, d: Mapping, where: str = "model.mla") -> "MLASpec":
        """From a YAML mapping of MLASpec fields; unknown keys are errors."""
        return _sub_spec(cls, d, ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"), "mla", where)

    def to_dict(self) -> dict:
        """Plain mapping that :meth:`from_dict` reads back to an equal spec."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True, slots=True, kw_only=True)
class MambaSpec:
    """Mamba-2 (SSD) mixer dimensions, as Megatron-Core's ``MambaMixer`` builds them
    (NVIDIA/Megatron-LM ``megatron/core/ssm/mamba_mixer.py``).

    ``d_inner = num_heads x head_dim``.  Per layer: ``in_proj`` ``h -> 2 d_inner + 2 G N + nh``
    (z, x, B, C, dt packed; the layer's pre-norm fused into it), a depthwise causal conv1d of
    ``conv_kernel`` taps (with bias) over the ``d_inner + 2 G N`` channels of x, B and C,
    per-head ``dt_bias``, ``A_log`` and ``D``, the chunked SSD scan, a gated RMSNorm over
    ``d_inner`` (grouped by ``G``) and ``out_proj`` ``d_inner -> h``; no linear biases.
    """

    num_heads: int
    """SSM heads ``nh`` (Megatron ``mamba_num_heads``; Nemotron 3 Nano 64)."""
    head_dim: int
    """Channels per head (``mamba_head_dim``; 64)."""
    state_dim: int
    """SSM state size ``N`` (``mamba_state_dim`` / HF ``ssm_state_size``; 128)."""
    num_groups: int
    """B / C groups ``G`` (``mamba_num_groups`` / HF ``n_groups``; 8)."""
    conv_kernel: int = 4
    """Depthwise conv1d taps (Megatron ``d_conv``, HF ``conv_kernel``; 4)."""
    chunk_size: int = 128
    """SSD scan chunk length (Megatron ``chunk_size``; 128)."""

    def __post_init__(self):
        w = "mamba"
        for key in ("num_heads", "head_dim", "state_dim", "num_groups", "conv_kernel", "chunk_size"):
            _set(self, key, _int(w, key, getattr(self, key)))
        if self.num_heads % self.num_groups:
            raise ConfigError(f"{w}.num_groups", self.num_groups,
                              f"must divide num_heads = {self.num_heads} (Megatron-Core MambaMixer)")

    @property
    def d_inner(self) -> int:
        """``num_heads x head_dim``."""
        return self.num_heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        """Channels of the conv1d: x, B and C, ``d_inner + 2 G N``."""
        return self.d_inner + 2 * self.num_groups * self.state_dim

    @property
    def in_proj_width(self) -> int:
        """Output width of ``in_proj``: z, x, B, C, dt = ``2 d_inner + 2 G N + nh``."""
        return 2 * self.d_inner + 2 * self.num_groups * self.state_dim + self.num_heads

    def mixer_params(self, h: int) -> int:
        """Parameters of one mixer without its pre-norm: in_proj, conv1d weight and bias,
        dt_bias, A_log, D, the gated norm's weight, out_proj."""
        return (h * self.in_proj_width + self.conv_channels * (self.conv_kernel + 1) + 3 * self.num_heads
                + self.d_inner + self.d_inner * h)

    @classmethod
    def from_dict(cls, d: Mapping, where: str = "model.mamba") -> "MambaSpec":
        """From a YAML mapping of MambaSpec fields; unknown keys are errors."""
        return _sub_spec(cls, d, ("num_heads", "head_dim", "state_dim", "num_groups"), "mamba", where)

    def to_dict(self) -> dict:
        """Plain mapping that :meth:`from_dict` reads back to an equal spec."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


# -- the model ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer, dense or mixture-of-experts (see the module docstring).

    Examples
    --------
    >>> m = ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=100, seq_len=16)
    >>> (m.ffn_hidden_size, m.num_kv_heads, m.head_dim)
    (128, 4, 16)
    """

    name: str = "custom"
    """Preset or user name; carried into reports."""
    num_layers: int
    """Decoder layers of the main model (MTP modules not included)."""
    hidden_size: int
    """Model width ``h``."""
    ffn_hidden_size: int | None = None
    """Hidden width of a dense MLP; None: ``4h`` (gelu) or ``int(8h/3/64)*64`` (swiglu), Megatron's rule."""
    num_attention_heads: int
    """Query heads."""
    num_kv_heads: int | None = None
    """Key/value heads (grouped-query attention); None: ``num_attention_heads`` (multi-head)."""
    head_dim: int | None = None
    """Dimension per head; None: ``hidden_size / num_attention_heads``.  With ``mla`` it is
    ``qk_nope_head_dim + qk_rope_head_dim``."""
    vocab_size: int
    """Vocabulary entries as stored (Megatron pads to a multiple of 128 x tp; presets give the model's own)."""
    seq_len: int
    """Default training sequence length in tokens (also the learned position table's length)."""
    tied_embeddings: bool = False
    """The output layer reuses the input embedding matrix."""
    mlp: str = "swiglu"
    """``gelu`` (2 matrices) or ``swiglu`` (3 matrices), for dense MLPs and experts alike."""
    norm: str = "rmsnorm"
    """``layernorm`` (weight + bias) or ``rmsnorm`` (weight only)."""
    position_embedding: str = "rope"
    """``rope`` (no parameters), ``learned`` (a ``seq_len x h`` table, GPT) or ``none``."""
    add_bias_linear: bool = False
    """Biases on every linear layer of attention and MLP (Megatron's ``--add-bias-linear``; GPT-3)."""
    qkv_bias: bool = False
    """Biases on the q, k, v projections only (Qwen2; Megatron's ``--add-qkv-bias``)."""
    qk_norm: bool = False
    """A norm over each head's query and key (Qwen3; Megatron's ``--qk-layernorm``): ``2 n(d)``."""
    sliding_window: int | None = None
    """Tokens a query attends to in a windowed layer, itself included (Hugging Face's
    ``sliding_window``; Megatron-Core's ``window_size = (sliding_window - 1, 0)``); None: every
    layer attends causally to the whole sequence.  Which layers are windowed:
    ``window_attn_skip_freq`` / ``window_layer_pattern``; :meth:`attention_window`."""
    window_attn_skip_freq: int | None = None
    """With ``sliding_window``: every ``N``-th layer, counted from 1, is full (causal)
    attention and the others are windowed (Megatron-Core's integer ``window_attn_skip_freq``;
    gpt-oss: 2, layers 1, 3, 5, ... of 0-based indices full).  None: every layer windowed."""
    window_layer_pattern: tuple[int, ...] | None = None
    """Explicit per-layer flags, 1 = windowed, 0 = full attention (Megatron-Core's list form
    of ``window_attn_skip_freq``; Hugging Face's ``layer_types``); overrides the frequency,
    which must then be None."""
    attention_sinks: bool = False
    """A learned sink logit per query head in every layer's softmax (gpt-oss ``sinks``;
    Megatron-Core's ``softmax_type="learnable"`` ``softmax_offset``): ``H`` parameters per layer."""
    rope_mscale: float = 1.0
    """The factor the rotary cos / sin tables are scaled by: YaRN's attention factor
    (Megatron-Core's ``_yarn_get_concentration_factor``, ``0.1 ln(scaling factor) + 1``;
    gpt-oss: 32x YaRN, 1.3466).  Megatron-Core's fused RoPE does not take it
    (models/common/embeddings/rope_utils.py ``apply_rotary_pos_emb``): with ``rope`` and a
    factor other than 1 the unfused RoPE runs (``workloads.costs.flops``).  1: plain RoPE."""
    activation_clamp: float | None = None
    """The routed experts' gated activation clamps its two inputs first (Megatron-Core's
    ``activation_func_clamp_value``; gpt-oss: 7.0, Hugging Face's ``swiglu_limit``): the gate
    half from above, the linear half to ``[-limit, limit]``.  Megatron-Core runs the clamps
    eagerly ahead of the fused activation kernel (``workloads.costs.flops``, ``expert_clamp``).
    None: no clamp.  Needs ``mlp: swiglu`` (a gated activation)."""
    dropout: float = 0.0
    """Hidden (residual) dropout probability, after attention and MLP; 0 disables it."""
    flash_attention: bool = True
    """Core attention runs as one fused FlashAttention kernel (Transformer Engine / cuDNN /
    flash-attn; Megatron-Core's default).  False: Megatron-LM's unfused ``CoreAttention``
    (before ``--use-flash-attn``, 2023): a batched ``Q K^T`` GEMM over the full ``s x s``
    scores (no causal skipping), a fused scale-mask-softmax and the attention dropout
    over ``b x heads x s^2`` elements in HBM, and a batched ``P V`` GEMM."""
    moe: MoESpec | None = None
    """Mixture-of-experts layers; None for a dense model."""
    mla: MLASpec | None = None
    """Multi-head latent attention instead of (grouped-query) multi-head attention."""
    mtp_layers: int = 0
    """Multi-token-prediction modules after the main model (DeepSeek-V3: 1)."""
    mtp_repeated_layer: bool = False
    """All MTP depths run one shared module (Megatron-Core's ``mtp_use_repeated_layer``;
    Nemotron 3's recipes): its parameters are held once, its work runs ``mtp_layers`` times."""
    hybrid_override_pattern: str | None = None
    """A hybrid stack (Megatron-Core's ``hybrid_override_pattern`` / ``hybrid_layer_pattern``):
    one character per layer, ``M`` Mamba-2 mixer, ``*`` self-attention, ``-`` dense MLP,
    ``E`` MoE; each layer is one pre-norm and that one sublayer, and ``num_layers`` is the
    pattern's length.  None: every layer is attention + MLP/MoE."""
    mamba: MambaSpec | None = None
    """Mamba-2 mixer dimensions; required when the hybrid pattern has ``M`` layers."""
    gated_deltanet: GatedDeltaNetSpec | None = None
    """Gated DeltaNet mixers (Qwen3-Next) in the place of attention in the layers its
    ``full_attention_interval`` / ``layer_pattern`` names (:mod:`workloads.blocks.gated_deltanet`);
    None: every layer attends."""
    attention_output_gate: bool = False
    """Gated attention (Qwen3-Next; Megatron-Core's ``attention_output_gate``): the query
    projection also produces a per-channel gate, and the attention output is multiplied by its
    sigmoid before the output projection: ``h x H d`` more parameters per attention layer."""
    source: str = ""
    """Where the numbers come from (paper table, config file)."""

    def __post_init__(self):
        w = "model"
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"{w}.name", self.name, "must be a non-empty string")
        if not isinstance(self.source, str):
            raise ConfigError(f"{w}.source", self.source, "must be a string")
        for key in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size", "seq_len"):
            _set(self, key, _int(w, key, getattr(self, key)))
        for key in ("tied_embeddings", "add_bias_linear", "qkv_bias", "qk_norm", "attention_sinks"):
            _bool(w, key, getattr(self, key))
        _choice(w, "mlp", self.mlp, MLP_KINDS)
        _choice(w, "norm", self.norm, NORM_KINDS)
        _choice(w, "position_embedding", self.position_embedding, POSITION_EMBEDDINGS)
        h, heads = self.hidden_size, self.num_attention_heads

        ffn = _int(w, "ffn_hidden_size", self.ffn_hidden_size, optional=True)
        if ffn is None:
            ffn = 4 * h if self.mlp == "gelu" else max(64, int(4 * h * 2 / 3 / 64) * 64)
        _set(self, "ffn_hidden_size", ffn)

        kv = _int(w, "num_kv_heads", self.num_kv_heads, optional=True)
        kv = heads if kv is None else kv
        if heads % kv:
            raise ConfigError(f"{w}.num_kv_heads", kv, f"must divide num_attention_heads = {heads}")
        _set(self, "num_kv_heads", kv)

        if self.mla is not None:
            if not isinstance(self.mla, MLASpec):
                raise ConfigError(f"{w}.mla", self.mla, "must be an MLASpec (or a mapping, via from_dict)")
            if kv != heads:
                raise ConfigError(f"{w}.num_kv_heads", kv,
                                  f"must equal num_attention_heads = {heads} with mla (no grouped-query attention)")
            if self.qkv_bias or self.qk_norm:
                key = "qkv_bias" if self.qkv_bias else "qk_norm"
                raise ConfigError(f"{w}.{key}", True, "does not apply to mla (use add_bias_linear)")
            hd = _int(w, "head_dim", self.head_dim, optional=True)
            if hd is not None and hd != self.mla.qk_head_dim:
                raise ConfigError(f"{w}.head_dim", hd, "with mla the head dimension is qk_nope_head_dim + "
                                                       f"qk_rope_head_dim = {self.mla.qk_head_dim}")
            _set(self, "head_dim", self.mla.qk_head_dim)
        else:
            hd = _int(w, "head_dim", self.head_dim, optional=True)
            if hd is None:
                if h % heads:
                    raise ConfigError(f"{w}.num_attention_heads", heads,
                                      f"must divide hidden_size = {h}, or give head_dim")
                hd = h // heads
            _set(self, "head_dim", hd)

        d = self.dropout
        if isinstance(d, bool) or not isinstance(d, numbers.Real) or not 0 <= d < 1:
            raise ConfigError(f"{w}.dropout", d, "must be a probability in [0, 1)")
        _set(self, "dropout", float(d))
        if not isinstance(self.flash_attention, bool):
            raise ConfigError(f"{w}.flash_attention", self.flash_attention, "must be true or false")
        if not self.flash_attention and self.mla is not None:
            raise ConfigError(f"{w}.flash_attention", False, "unfused attention is modelled for multi-head / "
                                                             "grouped-query attention only, not mla")
        _set(self, "mtp_layers", _int(w, "mtp_layers", self.mtp_layers, minimum=0))
        _bool(w, "mtp_repeated_layer", self.mtp_repeated_layer)
        self._check_window(w)
        ms = self.rope_mscale
        if isinstance(ms, bool) or not isinstance(ms, numbers.Real) or not 0 < ms < math.inf:
            raise ConfigError(f"{w}.rope_mscale", ms, "must be a positive number (1: no YaRN scaling)")
        _set(self, "rope_mscale", float(ms))
        clamp = self.activation_clamp
        if clamp is not None:
            if isinstance(clamp, bool) or not isinstance(clamp, numbers.Real) or not 0 < clamp < math.inf:
                raise ConfigError(f"{w}.activation_clamp", clamp, "must be a positive number, or null for no clamp")
            if self.mlp != "swiglu":
                raise ConfigError(f"{w}.activation_clamp", clamp, f"clamps a gated activation: needs mlp swiglu, "
                                                                  f"not {self.mlp}")
            _set(self, "activation_clamp", float(clamp))
        self._check_hybrid(w)
        self._check_linear_attention(w)

        if self.moe is not None:
            moe = self.moe
            if not isinstance(moe, MoESpec):
                raise ConfigError(f"{w}.moe", moe, "must be a MoESpec (or a mapping, via from_dict)")
            if moe.expert_ffn_hidden_size is None:
                moe = dataclasses.replace(moe, expert_ffn_hidden_size=ffn,
                                          shared_expert_ffn_hidden_size=moe.shared_expert_ffn_hidden_size or ffn)
                _set(self, "moe", moe)
            n = self.num_layers
            if self.hybrid_override_pattern is not None:
                if moe.moe_layer_pattern is not None or moe.moe_layer_freq != 1 or moe.first_k_dense:
                    raise ConfigError(f"{w}.moe.moe_layer_pattern", moe.moe_layer_pattern,
                                      "with hybrid_override_pattern the E layers are the MoE layers: leave "
                                      "moe_layer_pattern, moe_layer_freq and first_k_dense at their defaults")
                if "E" not in self.hybrid_override_pattern:
                    raise ConfigError(f"{w}.hybrid_override_pattern", self.hybrid_override_pattern,
                                      "has no E (MoE) layer but moe is given")
            if moe.moe_layer_pattern is not None and len(moe.moe_layer_pattern) != n:
                raise ConfigError(f"{w}.moe.moe_layer_pattern", list(moe.moe_layer_pattern),
                                  f"has {len(moe.moe_layer_pattern)} flags; the model has num_layers = {n}")
            if not any(moe.is_moe_layer(i) for i in range(n)):
                key = "moe_layer_pattern" if moe.moe_layer_pattern is not None else "first_k_dense"
                raise ConfigError(f"{w}.moe.{key}", getattr(moe, key) if key != "moe_layer_pattern"
                                  else list(moe.moe_layer_pattern), f"leaves no MoE layer among {n} layers")

    def _check_hybrid(self, w: str) -> None:
        """Validate the hybrid pattern and the Mamba spec (``__post_init__``)."""
        pat, mamba = self.hybrid_override_pattern, self.mamba
        if mamba is not None and not isinstance(mamba, MambaSpec):
            raise ConfigError(f"{w}.mamba", mamba, "must be a MambaSpec (or a mapping, via from_dict)")
        if pat is None:
            if mamba is not None:
                raise ConfigError(f"{w}.mamba", mamba.to_dict(), "needs hybrid_override_pattern with M layers")
            return
        rule = (f"must be a string of layer symbols {''.join(HYBRID_SYMBOLS)} (M Mamba, * attention, - MLP, "
                "E MoE), one per layer; MTP ('/') and pipeline ('|') separators are not read here")
        if not isinstance(pat, str) or not pat or any(c not in HYBRID_SYMBOLS for c in pat):
            raise ConfigError(f"{w}.hybrid_override_pattern", pat, rule)
        if len(pat) != self.num_layers:
            raise ConfigError(f"{w}.num_layers", self.num_layers,
                              f"must equal the length of hybrid_override_pattern ({len(pat)})")
        if "M" in pat and mamba is None:
            raise ConfigError(f"{w}.mamba", None, "required: hybrid_override_pattern has Mamba (M) layers")
        if "M" not in pat and mamba is not None:
            raise ConfigError(f"{w}.mamba", mamba.to_dict(), "given but hybrid_override_pattern has no M layer")
        if "E" in pat and self.moe is None:
            raise ConfigError(f"{w}.moe", None, "required: hybrid_override_pattern has MoE (E) layers")
        if self.mla is not None or self.sliding_window is not None:
            key = "mla" if self.mla is not None else "sliding_window"
            raise ConfigError(f"{w}.{key}", getattr(self, key) if key == "sliding_window" else "mla",
                              "is not modelled for hybrid (hybrid_override_pattern) models")

    def _check_linear_attention(self, w: str) -> None:
        """Validate the gated DeltaNet layers and the attention output gate (``__post_init__``)."""
        _bool(w, "attention_output_gate", self.attention_output_gate)
        if self.attention_output_gate and self.mla is not None:
            raise ConfigError(f"{w}.attention_output_gate", True, "is not modelled with mla")
        g = self.gated_deltanet
        if g is None:
            return
        if not isinstance(g, GatedDeltaNetSpec):
            raise ConfigError(f"{w}.gated_deltanet", g, "must be a GatedDeltaNetSpec (or a mapping, via from_dict)")
        if self.hybrid_override_pattern is not None or self.mla is not None:
            key = "mla" if self.mla is not None else "hybrid_override_pattern"
            raise ConfigError(f"{w}.gated_deltanet", g.to_dict(), f"is not modelled together with {key}")
        if g.layer_pattern is not None and len(g.layer_pattern) != self.num_layers:
            raise ConfigError(f"{w}.gated_deltanet.layer_pattern", list(g.layer_pattern),
                              f"has {len(g.layer_pattern)} flags; the model has num_layers = {self.num_layers}")

    def _check_window(self, w: str) -> None:
        """Validate and normalise the sliding-window fields (``__post_init__``)."""
        window = _int(w, "sliding_window", self.sliding_window, optional=True)
        _set(self, "sliding_window", window)
        freq, pat = self.window_attn_skip_freq, self.window_layer_pattern
        if window is None:
            for key, v in (("window_attn_skip_freq", freq), ("window_layer_pattern", pat)):
                if v is not None:
                    raise ConfigError(f"{w}.{key}", list(v) if key == "window_layer_pattern" else v,
                                      "needs sliding_window (the window's size in tokens)")
            return
        if pat is not None:
            rule = f"must be a list of 0/1 flags (1 = windowed), one per layer ({self.num_layers})"
            if isinstance(pat, (str, bytes)) or not hasattr(pat, "__iter__"):
                raise ConfigError(f"{w}.window_layer_pattern", pat, rule)
            pat = tuple(pat)
            if len(pat) != self.num_layers or any(isinstance(x, bool) or not isinstance(x, numbers.Integral)
                                                  or x not in (0, 1) for x in pat):
                raise ConfigError(f"{w}.window_layer_pattern", list(pat), rule)
            if freq is not None:
                raise ConfigError(f"{w}.window_layer_pattern", list(pat),
                                  "give either window_layer_pattern or window_attn_skip_freq, not both")
            if not any(pat):
                raise ConfigError(f"{w}.window_layer_pattern", list(pat),
                                  "has no windowed layer; leave sliding_window out instead")
            _set(self, "window_layer_pattern", tuple(int(x) for x in pat))
        elif freq is not None:
            # 1 would make every layer full attention: a window no layer uses
            _set(self, "window_attn_skip_freq", _int(w, "window_attn_skip_freq", freq, minimum=2))

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping, where: str = "model") -> "ModelSpec":
        """From a mapping of ModelSpec fields (``moe`` and ``mla`` as nested mappings).

        Unknown keys, missing required fields and bad values raise ConfigError naming
        ``where.<field>``.
        """
        if not isinstance(d, Mapping):
            raise ConfigError(where, d, "expected a preset name or a mapping of ModelSpec fields")
        fields = dataclasses.fields(cls)
        check_keys(d, [f.name for f in fields], where)
        for f in fields:
            if f.default is dataclasses.MISSING and f.name not in d:
                raise ConfigError(f"{where}.{f.name}", None, "required")
        kw = dict(d)
        if isinstance(kw.get("moe"), Mapping):
            kw["moe"] = MoESpec.from_dict(kw["moe"], f"{where}.moe")
        if isinstance(kw.get("mla"), Mapping):
            kw["mla"] = MLASpec.from_dict(kw["mla"], f"{where}.mla")
        if isinstance(kw.get("mamba"), Mapping):
            kw["mamba"] = MambaSpec.from_dict(kw["mamba"], f"{where}.mamba")
        if isinstance(kw.get("gated_deltanet"), Mapping):
            kw["gated_deltanet"] = GatedDeltaNetSpec.from_dict(kw["gated_deltanet"], f"{where}.gated_deltanet")
        return _build(cls, kw, "model", where)

    def to_dict(self) -> dict:
        """Plain mapping (YAML-safe) that :meth:`from_dict` reads back to an equal spec."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["moe"] = None if self.moe is None else self.moe.to_dict()
        out["mla"] = None if self.mla is None else self.mla.to_dict()
        out["mamba"] = None if self.mamba is None else self.mamba.to_dict()
        out["gated_deltanet"] = None if self.gated_deltanet is None else self.gated_deltanet.to_dict()
        if self.window_layer_pattern is not None:
            out["window_layer_pattern"] = list(self.window_layer_pattern)
        return out

    # -- structure ---------------------------------------------------------------------------
    def is_moe_layer(self, i: int) -> bool:
        """Whether decoder layer ``i`` (0-based, ``0 <= i < num_layers``) has a MoE block."""
        if not 0 <= i < self.num_layers:
            raise IndexError(f"layer {i} out of range for {self.num_layers} layers")
        if self.hybrid_override_pattern is not None:
            return self.hybrid_override_pattern[i] == "E"
        return self.moe is not None and self.moe.is_moe_layer(i)

    @property
    def is_hybrid(self) -> bool:
        """A hybrid stack (``hybrid_override_pattern`` set): one sublayer per layer."""
        return self.hybrid_override_pattern is not None

    def layer_kind(self, i: int) -> str:
        """``transformer`` (attention + MLP / MoE: every layer of a non-hybrid model and every
        MTP module) or, in a hybrid stack, ``mamba`` / ``attention`` / ``mlp`` / ``moe``."""
        if not 0 <= i < self.num_layers + self.mtp_layers:
            raise IndexError(f"layer {i} out of range for {self.num_layers} layers + {self.mtp_layers} MTP")
        if self.hybrid_override_pattern is None or i >= self.num_layers:
            return "transformer"
        return HYBRID_SYMBOLS[self.hybrid_override_pattern[i]]

    def hybrid_layer_counts(self) -> dict[str, int]:
        """Main-stack layers per kind (``mamba``, ``attention``, ``mlp``, ``moe``) of a hybrid model."""
        pat = self.hybrid_override_pattern or ""
        return {kind: pat.count(sym) for sym, kind in HYBRID_SYMBOLS.items()}

    def num_moe_layers(self) -> int:
        """Decoder layers with a MoE block (MTP modules not included)."""
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    def attention_window(self, i: int) -> int | None:
        """Tokens a query of layer ``i`` attends to, itself included, or None for full causal
        attention.  ``i`` is 0-based; ``num_layers + k`` names MTP module ``k``'s layer,
        shaped like the last main layer.

        >>> m = ModelSpec(num_layers=4, hidden_size=64, num_attention_heads=4, vocab_size=100,
        ...               seq_len=512, sliding_window=128, window_attn_skip_freq=2)
        >>> [m.attention_window(i) for i in range(4)]
        [128, None, 128, None]
        """
        if not 0 <= i < self.num_layers + self.mtp_layers:
            raise IndexError(f"layer {i} out of range for {self.num_layers} layers + {self.mtp_layers} MTP")
        if self.sliding_window is None:
            return None
        i = min(i, self.num_layers - 1)
        if self.window_layer_pattern is not None:
            windowed = bool(self.window_layer_pattern[i])
        elif self.window_attn_skip_freq is not None:
            windowed = (i + 1) % self.window_attn_skip_freq != 0     # Megatron counts layers from 1
        else:
            windowed = True
        return self.sliding_window if windowed else None

    # -- parameter counts --------------------------------------------------------------------
    def _norm(self, width: int) -> int:
        return _NORM_PARAMS_PER_ELEMENT[self.norm] * width

    def layer_param_breakdown(self, i: int, *, active: bool = False) -> dict[str, int]:
        """Parameters of decoder layer ``i`` by component.

        Keys: ``attention``, ``mamba`` (a hybrid stack's Mamba-2 mixer), ``mlp`` (dense
        layers), ``router``, ``latent_proj`` (latent MoE's down and up projections),
        ``routed_experts``, ``shared_experts``, ``norms`` (the pre-norms: two, or one in a
        hybrid layer).  With ``active=True`` the routed
        experts count ``top_k`` experts, the ones a token runs.  ``i == num_layers + k``
        names MTP module ``k``'s decoder layer, shaped like the last main layer.
        """
        blocks = layer_blocks(self, i)
        out = {"attention": 0, "mamba": 0, "mlp": 0, "router": 0, "latent_proj": 0, "routed_experts": 0,
               "shared_experts": 0, "norms": self._norm(self.hidden_size) * len(blocks)}
        for block in blocks:
            out.update(block.params(active=active))
        return out

    def layer_num_params(self, i: int, *, active: bool = False) -> int:
        """Total of :meth:`layer_param_breakdown`."""
        return sum(self.layer_param_breakdown(i, active=active).values())

    def mtp_module_params(self) -> int:
        """Unique parameters of one MTP module: enorm, hnorm, eh_proj (2h x h), a decoder layer
        shaped like the last main layer, and a final norm (embedding and output layer shared)."""
        h = self.hidden_size
        return 3 * self._norm(h) + 2 * h * h + self.layer_num_params(self.num_layers if self.mtp_layers else self.num_layers - 1)

    def param_breakdown(self, *, active: bool = False) -> dict[str, int]:
        """Parameters by component (keys :data:`BREAKDOWN_KEYS`), summed over layers.

        ``norms`` holds the layers' pre-norms and the final norm; norms inside attention
        (MLA's latent norms, q/k norms) count under ``attention``.  ``output_layer`` is 0
        with tied embeddings.  ``mtp`` holds the unique parameters of all MTP modules and
        is *not* part of :meth:`num_params` unless asked for.  With ``active=True`` routed
        experts count ``top_k`` per MoE layer and ``mtp`` the module's active parameters.
        """
        h = self.hidden_size
        out = dict.fromkeys(BREAKDOWN_KEYS, 0)
        out["embedding"] = self.vocab_size * h
        out["position_embedding"] = self.seq_len * h if self.position_embedding == "learned" else 0
        per_kind: dict[tuple, dict[str, int]] = {}
        for i in range(self.num_layers):
            kind = tuple(b.kind for b in layer_blocks(self, i))
            if kind not in per_kind:
                per_kind[kind] = self.layer_param_breakdown(i, active=active)
            for key, v in per_kind[kind].items():
                out[key] += v
        out["norms"] += self._norm(h)
        out["output_layer"] = 0 if self.tied_embeddings else self.vocab_size * h
        if self.mtp_layers:
            last = self.layer_num_params(self.num_layers, active=active)
            copies = 1 if self.mtp_repeated_layer else self.mtp_layers
            out["mtp"] = copies * (3 * self._norm(h) + 2 * h * h + last)
        return out

    def num_params(self, *, include_mtp: bool = False) -> int:
        """Total parameters: embedding, layers, final norm and output layer unless tied.

        MTP modules are left out, as in published totals (DeepSeek-V3 671B); pass
        ``include_mtp=True`` for what training holds (unique MTP parameters added).
        """
        b = self.param_breakdown()
        return sum(b.values()) - (0 if include_mtp else b["mtp"])

    def num_active_params(self, *, include_embedding: bool = True, include_mtp: bool = False) -> int:
        """Parameters one token runs through: dense parts, routers, shared and ``top_k`` experts.

        ``include_embedding=False`` drops the input embedding tables (word and learned
        positions), which are looked up rather than multiplied; the output layer stays (with
        tied embeddings the shared matrix is counted once, as the output layer).  Mistral
        and Qwen count the embedding in their active figures; DeepSeek does not.
        """
        b = self.param_breakdown(active=True)
        total = sum(b.values()) - (0 if include_mtp else b["mtp"])
        if not include_embedding:
            total -= b["position_embedding"]
            if not self.tied_embeddings:
                total -= b["embedding"]
        return total
