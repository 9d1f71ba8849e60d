"""Attention blocks: multi-head / grouped-query attention and DeepSeek's multi-head latent
attention (MLA), with sliding windows, attention sinks, q/k norms and qkv biases.

The block is the layer's pre-norm, the projections, RoPE, core attention (fused
FlashAttention, or Megatron-LM's unfused ``CoreAttention``), the output projection and the
residual.  Its parameter formulas are in :mod:`workloads.model`'s docstring, the kernel
shapes in :mod:`workloads.costs.flops`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from topologies import ConfigError

from . import kernels as kn
from .base import Block, RankParams, norm_elems, norm_params
from .fields import int_field, set_field, sub_spec

__all__ = ["AttentionBlock", "MLASpec"]


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
        set_field(self, "q_lora_rank", int_field(w, "q_lora_rank", self.q_lora_rank, optional=True))
        for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            set_field(self, key, int_field(w, key, getattr(self, key)))

    @property
    def qk_head_dim(self) -> int:
        """Query/key dimension per head: ``qk_nope_head_dim + qk_rope_head_dim``."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @classmethod
    def from_dict(cls, d: Mapping, where: str = "model.mla") -> "MLASpec":
        """From a YAML mapping of MLASpec fields; unknown keys are errors."""
        return sub_spec(cls, d, ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"), "mla", where)

    def to_dict(self) -> dict:
        """Plain mapping that :meth:`from_dict` reads back to an equal spec."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


class AttentionBlock(Block):
    """Self-attention of one layer (``model.mla`` selects MLA)."""

    kind = "attention"
    RECOMPUTE = {"attn_norm": "layernorm", "core_attn": "core_attn", "q_up_proj": "mla_up_proj",
                 "kv_up_proj": "mla_up_proj", "q_norm": "mla_up_proj", "kv_norm": "mla_up_proj"}
    SEGMENTS = dict.fromkeys(("attn_norm", "qkv_proj", "q_down_proj", "kv_down_proj", "q_norm", "kv_norm", "q_up_proj",
                              "kv_up_proj", "q_proj", "rope", "core_attn", "out_proj", "attn_residual", "qk_norm",
                              "attn_gate"), "attn")
    ACTIVATION_KEYS = ("attn_gate",)
    # (the unfused attention's ops, core_attn.qk and the like, are not listed: they run in the
    # mlp segment, as they always have; see docs/design.md, "Layer families as blocks")
    CP_SEGMENTS = {"core_attn": "core", "out_proj": "attn_post", "attn_residual": "attn_post"}

    def graph_scope(self, name: str) -> str | None:
        return "attn" if name in self.SEGMENTS else None

    # -- parameters ------------------------------------------------------------------------
    def params(self, *, active: bool = False) -> dict[str, int]:
        m = self.model
        h, heads, bias = m.hidden_size, m.num_attention_heads, m.add_bias_linear
        if m.mla is not None:
            a = m.mla
            q_out = heads * a.qk_head_dim
            if a.q_lora_rank is None:
                p = h * q_out + (q_out if bias else 0)
            else:
                p = h * a.q_lora_rank + norm_params(m, a.q_lora_rank) + a.q_lora_rank * q_out
                p += (a.q_lora_rank + q_out) if bias else 0
            kv_down, kv_up = a.kv_lora_rank + a.qk_rope_head_dim, heads * (a.qk_nope_head_dim + a.v_head_dim)
            p += h * kv_down + norm_params(m, a.kv_lora_rank) + a.kv_lora_rank * kv_up
            p += heads * a.v_head_dim * h
            p += (kv_down + kv_up + h) if bias else 0
            return {"attention": p + (heads if m.attention_sinks else 0)}
        q, kv = heads * m.head_dim, 2 * m.num_kv_heads * m.head_dim
        p = h * q + h * kv + q * h
        if m.attention_output_gate:           # the query projection's second half: the gate
            p += h * q + (q if bias or m.qkv_bias else 0)
        if bias or m.qkv_bias:
            p += q + kv
        if bias:
            p += h
        if m.qk_norm:
            p += 2 * norm_params(m, m.head_dim)
        if m.attention_sinks:
            p += heads
        return {"attention": p}

    def rank_params(self, parallel) -> RankParams:
        m, t = self.model, parallel.tp
        h, heads, bias = m.hidden_size, m.num_attention_heads, m.add_bias_linear
        norm = norm_elems(m)
        if m.mla is not None:
            a = m.mla
            q_out = heads * a.qk_head_dim
            kv_down, kv_up = a.kv_lora_rank + a.qk_rope_head_dim, heads * (a.qk_nope_head_dim + a.v_head_dim)
            if a.q_lora_rank is None:
                gemm = h * q_out / t
                p = gemm + ((q_out / t) if bias else 0)
            else:                                  # q_down and its norm are duplicated on every TP rank
                gemm = h * a.q_lora_rank + a.q_lora_rank * q_out / t
                p = gemm + norm * a.q_lora_rank + ((a.q_lora_rank + q_out / t) if bias else 0)
            kv_gemm = h * kv_down + a.kv_lora_rank * kv_up / t
            o_gemm = heads * a.v_head_dim * h / t
            gemm += kv_gemm + o_gemm
            p += kv_gemm + norm * a.kv_lora_rank + o_gemm + ((kv_down + kv_up / t + h) if bias else 0)
            return RankParams(p + (heads / t if m.attention_sinks else 0), 0.0, gemm, 0.0)
        q = heads * m.head_dim
        kv = 2 * max(1, m.num_kv_heads // t) * m.head_dim     # replicated when tp > KV heads
        gemm = h * q / t + h * kv + q * h / t
        if m.attention_output_gate:
            gemm += h * q / t
        p = gemm
        if m.attention_output_gate and (bias or m.qkv_bias):
            p += q / t
        if bias or m.qkv_bias:
            p += q / t + kv
        if bias:
            p += h                                  # row-parallel output bias, replicated
        if m.qk_norm:
            p += 2 * norm * m.head_dim
        if m.attention_sinks:
            p += heads / t                          # one sink logit per local query head
        return RankParams(p, 0.0, gemm, 0.0)

    # -- kernels ---------------------------------------------------------------------------
    def add_kernels(self, ops, sh, args) -> None:
        """Norm, QKV (or MLA's down and up projections), RoPE, core attention, output
        projection, residual."""
        model, L = self.model, self.layer
        h, tp, T, Tn = model.hidden_size, sh.tp, sh.T, sh.Tn
        heads = model.num_attention_heads // tp
        window = model.attention_window(L)       # None: full causal attention
        causal, block = args.causal, args.attn_block_size
        eager = args.fusion.eager
        ops.pair(kn.eager_norm("attn_norm", L, Tn, h) if eager else kn.norm("attn_norm", L, Tn, h))
        if model.mla is not None:
            m = model.mla
            rope_elems = T * (heads * m.qk_rope_head_dim + m.qk_rope_head_dim)
            if m.q_lora_rank is not None:
                ops.linear("q_down_proj", Tn, m.q_lora_rank, h)
                ops.pair(kn.norm("q_norm", L, Tn, m.q_lora_rank))
                ops.linear("q_up_proj", T, heads * m.qk_head_dim, m.q_lora_rank)
            else:
                ops.linear("q_proj", T, heads * m.qk_head_dim, h)
            ops.linear("kv_down_proj", Tn, m.kv_lora_rank + m.qk_rope_head_dim, h)
            ops.pair(kn.norm("kv_norm", L, Tn, m.kv_lora_rank))
            ops.linear("kv_up_proj", T, heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank)
            a = kn.act_bytes() * rope_elems
            ops.pair(kn.ew_pair("rope", L, 2 * a, 2 * a, *args.fusion.rope_kernels))
            ops.pair(kn.attention("core_attn", L, sh, heads, heads, m.qk_head_dim, m.v_head_dim, causal, block,
                                  window, args.fusion.attention_backend))
            ops.linear("out_proj", T, h, heads * m.v_head_dim)
        else:
            d = model.head_dim
            kv = model.num_kv_heads
            kv_local = kv // tp if kv % tp == 0 else 1          # replicated KV heads when tp > kv
            gate = heads if model.attention_output_gate else 0      # the gate comes out of the query projection
            ops.linear("qkv_proj", T, (heads + gate + 2 * kv_local) * d, h)
            if model.qk_norm:
                a = kn.act_bytes() * T * (heads + kv_local) * d
                ops.pair(kn.ew_pair("qk_norm", L, 2 * a, 3 * a, *args.fusion.qk_norm_kernels))
            if model.position_embedding == "rope":
                a = kn.act_bytes() * T * (heads + kv_local) * d      # rotate q and k in place: read + write
                if eager:
                    ops.pair(kn.eager_rope("rope", L, a))
                elif args.fusion.rope_fused(model):
                    ops.pair(kn.ew_pair("rope", L, 2 * a, 2 * a, *args.fusion.rope_kernels))
                else:
                    ops.pair(_unfused_rope(L, a))
            if model.flash_attention:
                ops.pair(kn.attention("core_attn", L, sh, heads, kv_local, d, d, causal, block, window,
                                      args.fusion.attention_backend))
            else:
                _unfused_attention(L, sh, heads, d, model.dropout, ops)
            if gate:
                ops.pair(_output_gate(L, kn.act_bytes() * T * heads * d))
            ops.linear("out_proj", T, h, heads * d)
        residual = kn.eager_residual if eager else kn.residual
        ops.pair(residual("attn_residual", L, Tn, h, model.dropout))

    # -- activations -----------------------------------------------------------------------
    def activation_terms(self, d, modules, out) -> None:
        m = self.model
        a_loc = m.num_attention_heads / d.t
        e, lb, tok, tsp = d.e, d.lb, d.tok, d.tok_sp
        if "layernorm" not in modules:
            out["attn_input"] = tsp * m.hidden_size * lb
        if m.mla is not None:
            mla = m.mla
            qk = mla.qk_head_dim
            lat = 0.0
            if mla.q_lora_rank is not None:     # q_down output (norm input) and the normed latent (q_up input)
                lat += tsp * mla.q_lora_rank * e + tok * mla.q_lora_rank * lb + tsp * 4 * norm_elems(m)
            lat += tsp * (mla.kv_lora_rank + mla.qk_rope_head_dim) * e + tok * mla.kv_lora_rank * lb
            out["mla_latents"] = lat
            if "mla_up_proj" not in modules:
                out["q"] = tok * a_loc * qk * e
                out["kv"] = tok * a_loc * (qk + mla.v_head_dim) * e
            dv = mla.v_head_dim
        else:
            hd = m.head_dim
            out["q"] = tok * a_loc * hd * e
            out["kv"] = 2 * tok * d.kv_heads * hd * e
            if m.qk_norm:
                out["qk_norm_inputs"] = tok * (a_loc + d.kv_heads) * hd * e
            dv = hd
        if "core_attn" not in modules:
            if d.opt.flash_attention and m.flash_attention:
                out["softmax_stats"] = 4 * a_loc * tok
            else:
                scores = a_loc * d.s_loc * d.seq * d.b          # this rank's queries against every key
                dropout = d.attn_dropout > 0
                out["attn_scores"] = (2 if dropout else 1) * e * scores
                out["attn_dropout_mask"] = scores if dropout else 0.0
        out["attn_output"] = tok * a_loc * dv * lb
        if m.attention_output_gate:          # the gate and the ungated output, for the product's backward
            out["attn_gate"] = 2 * tok * a_loc * dv * e

    # -- model FLOPs -----------------------------------------------------------------------
    def mc_flops_per_token(self, seq_len: int) -> float:
        """Megatron-Core's attention term (``transformer_flops``), causal half of ``QK^T`` and ``PV``::

            GQA  6 [ h (q + 2g)  +  q s / 2 * 2  +  q h ]
            MLA  6 [ q_lora (h + H (nope + rope) + 1)  (or h H (nope + rope))
                     + kv_lora (h + H (nope + v) + 1) + h rope + H v h + s H (nope + rope) / 2 + s H v / 2 ]

        with ``q = H d``, ``g = K d``; a sliding window's correction is :meth:`mc_window_correction`."""
        model, s = self.model, seq_len
        h, H = model.hidden_size, model.num_attention_heads
        if model.mla is not None:
            m = model.mla
            qk = m.qk_head_dim          # Megatron's qk_head_dim + qk_pos_emb_head_dim
            q_term = (m.q_lora_rank * (h + H * qk + 1)) if m.q_lora_rank is not None else h * H * qk
            return 6 * (q_term + m.kv_lora_rank * (h + H * (m.qk_nope_head_dim + m.v_head_dim) + 1)
                        + h * m.qk_rope_head_dim + H * m.v_head_dim * h
                        + s * H * qk / 2 + s * H * m.v_head_dim / 2)
        q, g = model.head_dim * H, model.head_dim * model.num_kv_heads
        if model.attention_output_gate:        # the gate's half of the query projection
            return 6 * (h * (2 * q + 2 * g) + q * s / 2 * 2 + q * h)
        return 6 * (h * (q + 2 * g) + q * s / 2 * 2 + q * h)

    def mc_window_correction(self, seq_len: int) -> float:
        """What a sliding window of ``w < s`` changes in :meth:`mc_flops_per_token` for one
        windowed layer: the two core-attention terms see ``kbar`` keys per query instead of
        ``s / 2``, ``kbar = (w (w + 1) / 2 + (s - w) w) / s`` (0 without a window)."""
        model, s = self.model, seq_len
        if model.sliding_window is None or model.sliding_window >= s:
            return 0.0
        w = model.sliding_window
        kbar = (w * (w + 1) / 2 + (s - w) * w) / s
        H = model.num_attention_heads
        qkv_width = H * (model.mla.qk_head_dim + model.mla.v_head_dim) if model.mla is not None \
            else 2 * model.head_dim * H
        return 6 * qkv_width * (kbar - s / 2)

    def mc_hybrid_forward_per_token(self, seq_len: int) -> float:
        """Megatron-Core's ``hybrid_flops`` forward count of one attention layer per token:
        ``4 h p (h + h K / H) + 2 s h p`` with ``p = H d / h``."""
        model = self.model
        h, H, K = model.hidden_size, model.num_attention_heads, model.num_kv_heads
        p = model.head_dim * H / h
        return 4 * h * p * (h + h * K / H) + 2 * seq_len * h * p

    def unsupported_convention(self, convention: str) -> str | None:
        if convention == "nemo_24" and self.model.mla is not None:
            return "defines no count for multi-head latent attention; use megatron_core_2025"
        return None

    def cp_exchange_elements(self, tp: int) -> tuple[int, int]:
        """K and V, and Q, per token of this TP rank's heads (MLA: the per-head K and V, not
        the latent)."""
        model = self.model
        heads = model.num_attention_heads // tp
        if model.mla is not None:
            return heads * (model.mla.qk_head_dim + model.mla.v_head_dim), heads * model.mla.qk_head_dim
        return 2 * max(1, model.num_kv_heads // tp) * model.head_dim, heads * model.head_dim

    def attention_dims(self) -> tuple[int, int]:
        """(query/key, value) head dimensions."""
        if self.model.mla is not None:
            return self.model.mla.qk_head_dim, self.model.mla.v_head_dim
        return self.model.head_dim, self.model.head_dim

    def windowed(self) -> bool:
        """Whether this layer attends through a sliding window."""
        return self.model.attention_window(self.layer) is not None


def _output_gate(L: int, a: float):
    """Gated attention's ``o * sigmoid(gate)`` on ``a`` bytes of output, as Hugging Face's
    ``Qwen3NextAttention`` runs it (eager PyTorch): the sigmoid (read and write ``a``) and the
    product (read ``2a``, write ``a``), ``5a`` in 2 kernels; backward, the product's two
    gradients and the sigmoid's (read ``2a``, write ``a`` each), ``9a`` in 3."""
    return kn.ew_pair("attn_gate", L, 5 * a, 9 * a, 2, 3)


def _unfused_rope(L: int, a: float):
    """Megatron-Core's unfused RoPE (rope_utils.py ``_apply_rotary_pos_emb_bshd``), which runs
    when the tables carry a YaRN factor (``rope_mscale``), on q and k (``a`` bytes together):
    ``t * cos`` (read and write ``a``), ``_rotate_half`` (``-x2``: ``a``; ``cat``: ``2a``),
    ``* sin`` (``2a``), the sum (``3a``) and the final ``cat`` with the empty pass-through part
    (``2a``): ``12a`` in 6 kernels per tensor (the cos / sin tables are small).  Backward by
    autograd: the two products' gradients (``2a`` each), the negation's (``a``), the chunk's
    halves concatenated (``2a``) and the two paths summed (``3a``): ``10a`` in 5 per tensor."""
    return kn.ew_pair("rope", L, 12 * a, 10 * a, 12, 10)


def _unfused_attention(L: int, sh, heads: int, d: int, dropout: float, ops) -> None:
    """Megatron-LM's unfused ``CoreAttention`` (``ModelSpec.flash_attention = False``).

    Per micro-batch, ``B = b x heads`` (this rank's heads) score matrices of ``s x s``:
    F: ``baddbmm`` Q K^T (full ``s^2``: the causal mask is applied after the product),
    the fused scale-mask-softmax (read scores, write probabilities: 4 bytes / score), the
    attention dropout (read 2, write 2 and a one-byte mask), ``bmm`` P V.  B: dP = dO V^T
    and dV = P^T dO, dropout backward (read 2 + mask 1, write 2), softmax backward (read
    probabilities and their gradient, write 6 bytes / score), dQ = dS K and dK = dS^T Q.
    Kernel sequence as in NVIDIA/Megatron-LM ``megatron/model/transformer.py``
    ``CoreAttention.forward`` (2022) and vTrain's model (``src/model/gpt_modeling.py``).
    """
    if sh.cp > 1:
        raise ConfigError("model.flash_attention", False, "context parallelism needs fused (flash) attention")
    B, s = sh.b * heads, sh.s
    scores = float(B) * s * s
    drop = dropout > 0
    f_ops = [kn.bmm("core_attn.qk", "F", L, B, s, s, d),
             kn.ew("core_attn.softmax", "F", L, 4 * scores),
             *([kn.ew("core_attn.dropout", "F", L, 5 * scores)] if drop else []),
             kn.bmm("core_attn.pv", "F", L, B, s, d, s)]
    # backward ops in forward order (layer_ops reverses them): executed as dP, dV,
    # dropout, softmax, dQ, dK
    b_ops = [kn.bmm("core_attn.dk", "B", L, B, s, d, s),
             kn.bmm("core_attn.dq", "B", L, B, s, d, s),
             kn.ew("core_attn.softmax", "B", L, 6 * scores),
             *([kn.ew("core_attn.dropout", "B", L, 5 * scores)] if drop else []),
             kn.bmm("core_attn.dv", "B", L, B, s, d, s),
             kn.bmm("core_attn.dp", "B", L, B, s, s, d)]
    ops.fwd.extend(f_ops)
    ops.bwd.extend(b_ops)
