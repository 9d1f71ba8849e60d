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
    set_field as _set
from .blocks.attention import MLASpec
from .blocks.gated_deltanet import GatedDeltaNetSpec
from .blocks.mamba import MambaSpec
from .blocks.moe import MoESpec

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
        self._check_shape(w)
        self._check_attention(w)
        self._check_options(w)
        self._check_window(w)
        self._check_activation(w)
        self._check_hybrid(w)
        self._check_linear_attention(w)
        self._check_moe(w)

    def _check_shape(self, w: str) -> None:
        """Names, the required sizes, the kinds and the MLP width (``__post_init__``)."""
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
        h = self.hidden_size
        ffn = _int(w, "ffn_hidden_size", self.ffn_hidden_size, optional=True)
        if ffn is None:
            ffn = 4 * h if self.mlp == "gelu" else max(64, int(4 * h * 2 / 3 / 64) * 64)
        _set(self, "ffn_hidden_size", ffn)

    def _check_attention(self, w: str) -> None:
        """KV heads, MLA and the head dimension (``__post_init__``)."""
        h, heads = self.hidden_size, self.num_attention_heads
        kv = _int(w, "num_kv_heads", self.num_kv_heads, optional=True)
        kv = heads if kv is None else kv
        if heads % kv:
            raise ConfigError(f"{w}.num_kv_heads", kv, f"must divide num_attention_heads = {heads}")
        _set(self, "num_kv_heads", kv)
        hd = _int(w, "head_dim", self.head_dim, optional=True)
        if self.mla is not None:
            if not isinstance(self.mla, MLASpec):
                raise ConfigError(f"{w}.mla", self.mla, "must be an MLASpec (or a mapping, via from_dict)")
            if kv != heads:
                raise ConfigError(f"{w}.num_kv_heads", kv,
                                  f"must equal num_attention_heads = {heads} with mla (no grouped-query attention)")
            if self.qkv_bias or self.qk_norm:
                key = "qkv_bias" if self.qkv_bias else "qk_norm"
                raise ConfigError(f"{w}.{key}", True, "does not apply to mla (use add_bias_linear)")
            if hd is not None and hd != self.mla.qk_head_dim:
                raise ConfigError(f"{w}.head_dim", hd, "with mla the head dimension is qk_nope_head_dim + "
                                                       f"qk_rope_head_dim = {self.mla.qk_head_dim}")
            _set(self, "head_dim", self.mla.qk_head_dim)
            return
        if hd is None:
            if h % heads:
                raise ConfigError(f"{w}.num_attention_heads", heads, f"must divide hidden_size = {h}, or give head_dim")
            hd = h // heads
        _set(self, "head_dim", hd)

    def _check_options(self, w: str) -> None:
        """Dropout, unfused attention and MTP (``__post_init__``)."""
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

    def _check_activation(self, w: str) -> None:
        """YaRN's RoPE factor and the experts' activation clamp (``__post_init__``)."""
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

    def _check_moe(self, w: str) -> None:
        """The MoE spec against the layers: expert widths default to the MLP's, at least one
        MoE layer, the hybrid pattern's E layers (``__post_init__``)."""
        moe = self.moe
        if moe is None:
            return
        if not isinstance(moe, MoESpec):
            raise ConfigError(f"{w}.moe", moe, "must be a MoESpec (or a mapping, via from_dict)")
        ffn = self.ffn_hidden_size
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
