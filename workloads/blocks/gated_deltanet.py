"""The gated DeltaNet mixer (Yang, Kautz & Hatamizadeh, "Gated Delta Networks", 2024) as
Qwen3-Next runs it in the place of attention in three of every four layers.

Shapes and parameters follow Hugging Face's ``Qwen3NextGatedDeltaNet``
(transformers ``models/qwen3_next/modeling_qwen3_next.py``): with ``nk`` key heads of
``dk``, ``nv`` value heads of ``dv``, ``K = nk dk``, ``V = nv dv``,

* ``in_proj_qkvz``: ``h -> 2K + 2V`` (q, k, v and the output gate z) and ``in_proj_ba``:
  ``h -> 2 nv`` (the per-head beta and decay inputs), no biases;
* a depthwise causal ``conv1d`` of ``conv_kernel`` taps, no bias, over the ``2K + V``
  channels of q, k and v, with SiLU;
* per value head ``dt_bias`` and ``A_log``; the decay ``g = -exp(A_log) softplus(a + dt_bias)``
  and ``beta = sigmoid(b)``;
* q and k repeated from ``nk`` to ``nv`` heads, then the chunked gated delta rule
  (flash-linear-attention's ``chunk_gated_delta_rule`` with q/k L2-normalised in the kernel);
* a gated RMSNorm over each head's ``dv`` channels (one weight of ``dv``, shared by the
  heads), gated by ``silu(z)``; ``out_proj``: ``V -> h``, no bias.

Parameters: ``h (2K + 2V + 2 nv) + (2K + V) conv_kernel + 2 nv + dv + V h``.  Tensor
parallelism splits the heads (column-parallel projections, row-parallel ``out_proj``, the
conv channels and per-head vectors with their heads); the norm weight is replicated.

The chunked scan's cost is an **assumption**, bytes per kernel as flash-linear-attention's
Triton kernels move them (``fla/ops/gated_delta_rule/chunk.py``: ``chunk_local_cumsum``,
``chunk_scaled_dot_kkt_fwd``, ``solve_tril``, ``recompute_w_u_fwd``,
``chunk_gated_delta_rule_fwd_h``, ``chunk_fwd_o``; the backward recomputes ``w, u`` and the
chunk states, then ``chunk_bwd_dv_local``, ``chunk_gated_delta_rule_bwd_dhu``,
``chunk_bwd_dqkwg``, ``prepare_wy_repr_bwd``; ``l2norm_fwd`` / ``l2norm_bwd`` on q and k), timed
as memory-bound at the generic element-wise efficiency: the kernels were not measured here.
Their FLOPs (``6 dk dv + 2 C (3 dk + 2 dv)`` per token and value head forward, chunk ``C``) sit
well under the bytes' time at H100 rates, so the bytes bound them.  Context parallelism for
these layers is not modelled (refused).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from topologies import ConfigError

from . import kernels as kn
from .base import Block, RankParams
from .fields import int_field, set_field, sub_spec

__all__ = ["GatedDeltaNetBlock", "GatedDeltaNetSpec", "GDN_SCAN_LAUNCHES", "gdn_scan_kernels"]


@dataclass(frozen=True, slots=True, kw_only=True)
class GatedDeltaNetSpec:
    """Gated DeltaNet mixer dimensions and which layers use it (the others: full attention)."""

    num_key_heads: int
    """Key (and query) heads ``nk`` (HF ``linear_num_key_heads``; Qwen3-Next 16)."""
    num_value_heads: int
    """Value heads ``nv`` (``linear_num_value_heads``; 32); a multiple of ``nk``."""
    key_head_dim: int = 128
    """``dk`` (``linear_key_head_dim``)."""
    value_head_dim: int = 128
    """``dv`` (``linear_value_head_dim``)."""
    conv_kernel: int = 4
    """Causal conv1d taps (``linear_conv_kernel_dim``)."""
    chunk_size: int = 64
    """Chunk length ``C`` of the chunked scan (flash-linear-attention's ``BT = 64``)."""
    full_attention_interval: int | None = 4
    """Every ``N``-th layer, counted from 1, is full attention, the others gated DeltaNet (HF
    ``full_attention_interval``, Megatron-Core's integer ``linear_attention_freq``)."""
    layer_pattern: tuple[int, ...] | None = None
    """Explicit per-layer flags, 1 = gated DeltaNet, 0 = full attention (HF ``layer_types``,
    Megatron-Core's list form of ``linear_attention_freq``); overrides the interval, which
    must then be null."""

    def __post_init__(self):
        w = "gated_deltanet"
        for key in ("num_key_heads", "num_value_heads", "key_head_dim", "value_head_dim", "conv_kernel",
                    "chunk_size"):
            set_field(self, key, int_field(w, key, getattr(self, key)))
        if self.num_value_heads % self.num_key_heads:
            raise ConfigError(f"{w}.num_value_heads", self.num_value_heads,
                              f"must be a multiple of num_key_heads = {self.num_key_heads}")
        pat = self.layer_pattern
        if pat is not None:
            if isinstance(pat, (str, bytes)) or not hasattr(pat, "__iter__") \
                    or any(isinstance(x, bool) or x not in (0, 1) for x in pat) or not tuple(pat):
                raise ConfigError(f"{w}.layer_pattern", pat, "must be a list of 0/1 flags (1 = gated DeltaNet)")
            if self.full_attention_interval is not None:
                raise ConfigError(f"{w}.layer_pattern", list(pat),
                                  "give either layer_pattern or full_attention_interval (set it to null), not both")
            set_field(self, "layer_pattern", tuple(int(x) for x in pat))
        else:
            set_field(self, "full_attention_interval",
                      int_field(w, "full_attention_interval", self.full_attention_interval))

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_channels(self) -> int:
        """Channels of the conv1d: q, k and v, ``2K + V``."""
        return 2 * self.key_dim + self.value_dim

    @property
    def in_proj_width(self) -> int:
        """Outputs of the two input projections: ``2K + 2V + 2 nv``."""
        return 2 * self.key_dim + 2 * self.value_dim + 2 * self.num_value_heads

    def is_linear(self, i: int) -> bool:
        """Whether layer ``i`` (0-based) runs the gated DeltaNet (else full attention)."""
        if self.layer_pattern is not None:
            return bool(self.layer_pattern[i])
        return (i + 1) % self.full_attention_interval != 0

    def mixer_params(self, h: int) -> int:
        """Parameters of one mixer without its pre-norm (see the module docstring)."""
        return (h * self.in_proj_width + self.conv_channels * self.conv_kernel + 2 * self.num_value_heads
                + self.value_head_dim + self.value_dim * h)

    @classmethod
    def from_dict(cls, d: Mapping, where: str = "model.gated_deltanet") -> "GatedDeltaNetSpec":
        """From a YAML mapping of GatedDeltaNetSpec fields; unknown keys are errors."""
        return sub_spec(cls, d, ("num_key_heads", "num_value_heads"), "gated_deltanet", where)

    def to_dict(self) -> dict:
        """Plain mapping that :meth:`from_dict` reads back to an equal spec."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if out["layer_pattern"] is not None:
            out["layer_pattern"] = list(out["layer_pattern"])
        return out


GDN_SCAN_LAUNCHES = (8, 14)
"""Kernels of the chunked scan forward (two L2 norms and six scan kernels) and backward (the
recomputed ``w, u`` and states, four backward kernels, the reverse cumsum, two L2-norm
backwards and the gradient sums of the repeated q / k heads): read off
flash-linear-attention's ``chunk_gated_delta_rule_fwd`` / ``_bwd``."""


def gdn_scan_kernels(T: float, H: int, dk: int, dv: int, C: int):
    """The chunked gated delta rule's kernels, forward and backward, each with the HBM bytes
    it reads and writes once, for ``T`` tokens and ``H`` value heads of one rank (q and k
    already repeated to ``H`` heads), chunk ``C``.  BF16 activations (2 bytes); the decay
    and its cumulative sum, the L2-norm statistics and the in-chunk matrix ``A`` FP32 (4), its
    inverse and the chunk states (``S = T H dk dv / C`` elements) BF16.  An assumption read
    off flash-linear-attention's kernels (module docstring), not a measurement."""
    a, f = kn.act_bytes(), kn.FP32
    TH, S = T * H, T * H * dk * dv / C
    qk, v = a * TH * dk, a * TH * dv
    l2 = ("l2norm", 2 * (2 * qk + f * TH))
    cumsum = ("chunk_local_cumsum", 2 * f * TH)
    kkt = ("chunk_scaled_dot_kkt", qk + a * TH + f * TH + f * TH * C)
    tril = ("solve_tril", f * TH * C + a * TH * C)
    wu = ("recompute_w_u", 2 * qk + 2 * v + a * TH + a * TH * C + f * TH)
    states = ("chunk_fwd_h", 2 * qk + 2 * v + f * TH + a * S)
    fwd = (l2, cumsum, kkt, tril, wu, states, ("chunk_fwd_o", 2 * qk + 2 * v + a * S + f * TH))
    bwd = (wu, states,
           ("chunk_bwd_dv_local", 2 * qk + 2 * v + f * TH),
           ("chunk_bwd_dhu", 3 * qk + 3 * v + 2 * a * S + f * TH),
           ("chunk_bwd_dqkwg", 6 * qk + 3 * v + 2 * a * S + 2 * f * TH),
           ("prepare_wy_repr_bwd", 4 * qk + 4 * v + 3 * a * TH + 2 * a * TH * C + 2 * f * TH),
           ("chunk_local_cumsum_reverse", 2 * f * TH),
           ("l2norm_bwd", 2 * (3 * qk + f * TH)))
    return tuple((n, float(x)) for n, x in fwd), tuple((n, float(x)) for n, x in bwd)


class GatedDeltaNetBlock(Block):
    """A gated DeltaNet mixer (``model.gated_deltanet``) in the place of attention."""

    kind = "gated_deltanet"
    RECOMPUTE = {"gdn_norm": "layernorm"}
    SEGMENTS = dict.fromkeys(("gdn_norm", "gdn_in_proj", "gdn_layout", "gdn_conv1d", "gdn_gate", "gdn_repeat",
                              "gdn_scan", "gdn_gated_norm", "gdn_out_proj", "gdn_residual"), "attn")
    ACTIVATION_KEYS = ("gdn_in_proj_output", "gdn_conv_output", "gdn_scan_state", "gdn_scan_output")

    def graph_scope(self, name: str) -> str | None:
        return "attn" if name in self.SEGMENTS else None

    def params(self, *, active: bool = False) -> dict[str, int]:
        return {"linear_attention": self.model.gated_deltanet.mixer_params(self.model.hidden_size)}

    def rank_params(self, parallel) -> RankParams:
        g, h, t = self.model.gated_deltanet, self.model.hidden_size, parallel.tp
        gemm = (h * g.in_proj_width + g.value_dim * h) / t
        split = (g.conv_channels * g.conv_kernel + 2 * g.num_value_heads) / t
        return RankParams(gemm + split + g.value_head_dim, 0.0, gemm, 0.0)

    def check_split(self, tp: int, cp: int) -> None:
        """Heads split over TP; context parallelism for these layers is not modelled."""
        g = self.model.gated_deltanet
        for key, n in (("num_key_heads", g.num_key_heads), ("num_value_heads", g.num_value_heads)):
            if n % tp:
                raise ConfigError("parallel.tp", tp, f"must divide model.gated_deltanet.{key} = {n}")
        if cp > 1:
            raise ConfigError("parallel.cp", cp, "context parallelism for gated DeltaNet layers is not modelled")

    def add_kernels(self, ops, sh, args) -> None:
        """Pre-norm, the input projections (one GEMM), the q/k/v gather for the conv, the conv1d
        with SiLU, the decay and beta gates (eager FP32 element-wise ops), q and k repeated to
        the value heads, the chunked scan, the gated RMSNorm, ``out_proj``, residual."""
        model, L = self.model, self.layer
        g, h, tp = model.gated_deltanet, model.hidden_size, sh.tp
        self.check_split(tp, sh.cp)
        T, Tn, A = sh.T, sh.Tn, kn.act_bytes()
        nk, nv = g.num_key_heads // tp, g.num_value_heads // tp
        vd, conv = g.value_dim // tp, g.conv_channels // tp
        ops.pair(kn.norm("gdn_norm", L, Tn, h))
        ops.linear("gdn_in_proj", T, g.in_proj_width // tp, h)
        # q, k, v concatenated for the conv (torch.cat: read + write), and their gradient split back
        ops.pair(kn.ew_pair("gdn_layout", L, 2 * A * T * conv, 2 * A * T * conv, 1, 1))
        c = A * T * conv
        ops.pair(kn.ew_pair("gdn_conv1d", L, 2 * c, 5 * c, 1, 2))
        # g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b): a, b read in BF16, g and beta FP32
        ops.pair(kn.ew_pair("gdn_gate", L, (2 * A + 2 * kn.FP32) * T * nv, 2 * (2 * A + 2 * kn.FP32) * T * nv, 6, 10))
        if nv > nk:        # repeat_interleave of q and k to the value heads (read nk, write nv heads)
            r = A * T * g.key_head_dim * 2 * (nk + nv)
            ops.pair(kn.ew_pair("gdn_repeat", L, r, r, 2, 2))
        f, b = gdn_scan_kernels(T, nv, g.key_head_dim, g.value_head_dim, g.chunk_size)
        ops.pair(kn.ew_pair("gdn_scan", L, sum(x for _, x in f), sum(x for _, x in b), *GDN_SCAN_LAUNCHES))
        o = A * T * vd
        ops.pair(kn.ew_pair("gdn_gated_norm", L, 3 * o, 5 * o, 1, 2))     # y, z in, out (B: y, z, dy in, dy, dz out)
        ops.linear("gdn_out_proj", T, h, vd)
        ops.pair(kn.residual("gdn_residual", L, Tn, h, model.dropout))

    def activation_terms(self, d, modules, out) -> None:
        """The normed ``in_proj`` input, the projections' output (conv input and the gate z),
        the conv output (the scan's q, k, v), what the scan saves besides them (its in-chunk
        matrix ``A``, the decay, beta and the q / k L2-norm statistics) and the scan output
        with the gated norm's output (``out_proj``'s input)."""
        g, h = self.model.gated_deltanet, self.model.hidden_size
        nv = g.num_value_heads / d.t
        if "layernorm" not in modules:
            out["attn_input"] = d.tok_sp * h * d.lb
        out["gdn_in_proj_output"] = d.tok * g.in_proj_width / d.t * d.e
        out["gdn_conv_output"] = d.tok * g.conv_channels / d.t * d.e
        out["gdn_scan_state"] = d.tok * nv * (g.chunk_size * d.e + d.e + 3 * 4)
        out["gdn_scan_output"] = d.tok * g.value_dim / d.t * (d.e + d.lb)

    def mc_flops_per_token(self, seq_len: int) -> float:
        """Our count, in Megatron-Core's manner (every GEMM three times, ``2 M N K``): the two
        projections ``6 h (2K + 2V + 2 nv) + 6 V h`` and the scan, three times its forward
        ``nv (6 dk dv + 2 C (3 dk + 2 dv))``; conv and gates not counted."""
        g, h = self.model.gated_deltanet, self.model.hidden_size
        dk, dv, C = g.key_head_dim, g.value_head_dim, g.chunk_size
        return 6 * h * g.in_proj_width + 6 * g.value_dim * h + 3 * g.num_value_heads * (
            6 * dk * dv + 2 * C * (3 * dk + 2 * dv))

    def unsupported_convention(self, convention: str) -> str | None:
        if convention == "nemo_24":
            return "defines no count for gated DeltaNet layers; use megatron_core_2025"
        return None
