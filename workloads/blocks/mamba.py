"""The Mamba-2 (SSD) mixer block of hybrid stacks (Nemotron-H, Nemotron 3), as Megatron-Core
builds it (``megatron/core/ssm/mamba_mixer.py``): pre-norm, ``in_proj``, the depthwise
causal conv1d, the chunked SSD scan, the gated RMSNorm, ``out_proj``, residual."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from topologies import ConfigError

from . import kernels as kn
from .base import Block, RankParams
from .fields import int_field, set_field, sub_spec

__all__ = ["MAMBA_SCAN_LAUNCHES", "MambaBlock", "MambaSpec", "check_mamba_split", "mamba_scan_bytes", "mamba_scan_kernels"]


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
            set_field(self, key, int_field(w, key, getattr(self, key)))
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
        return sub_spec(cls, d, ("num_heads", "head_dim", "state_dim", "num_groups"), "mamba", where)

    def to_dict(self) -> dict:
        """Plain mapping that :meth:`from_dict` reads back to an equal spec."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


MAMBA_SCAN_LAUNCHES = (5, 38)
"""Kernels the chunked SSD scan launches forward and backward (the backward with its
recomputed forward, the small PyTorch reductions, flips, cumulative sums and fills around
the Triton kernels): 43 per forward + backward in the torch.profiler table of
``experiments/microbench/data/h200_mamba.json`` (mamba_ssm 2.3.2, one H200), 5 of them
the forward."""


def mamba_scan_kernels(T: float, d: int, heads: int, groups: int, state: int,
                       chunk: int) -> tuple[tuple[tuple[str, float], ...], tuple[tuple[str, float], ...]]:
    """The chunked SSD scan's kernels, forward and backward, each with the HBM bytes it
    reads and writes once, for ``T`` tokens of one rank with ``d`` inner channels, ``heads``
    heads, ``groups`` B/C groups (this rank's share), state size ``N = state`` and chunk
    length ``Q = chunk``.

    The sequence is mamba_ssm's (state-spaces/mamba ``mamba_ssm/ops/triton/ssd_combined.py``,
    ``_mamba_chunk_scan_combined_fwd`` / ``_bwd``; Dao & Gu, Mamba-2, 2024) as Megatron-Core's
    ``_ssm_training`` runs it (z gated inside the chunk scan, states in the activation dtype).
    Activations, x, z, B, C, dt and their gradients are BF16 (2 bytes); ``dA_cumsum``, the
    processed dt, ``C B^T`` (``T G Q`` per pass) and the chunk states (``S = T d N / Q``
    elements) as the kernels write them: FP32, the passed states BF16 in the forward.  ``TH``
    = ``T x heads``.

    ====================================  ==========================================================
    forward kernel                        bytes
    ====================================  ==========================================================
    chunk_cumsum                          dt in, dA_cumsum and dt out: ``10 TH``
    chunk_state                           x, B, dt, dA in, FP32 states out: ``2Td + 2TGN + 8TH + 4S``
    state_passing                         FP32 states in, BF16 states out: ``6S``
    bmm_chunk                             B, C in, FP32 ``C B^T`` out: ``4TGN + 4TGQ``
    chunk_scan                            ``C B^T``, x, z, C, states, dt, dA in, out and out_x out:
                                          ``8Td + 2TGN + 4TGQ + 2S + 8TH``
    ====================================  ==========================================================

    Backward: dt copied (``4 TH``); the forward's cumsum, ``C B^T``, chunk states and state
    passing recomputed (the passing now writes FP32: ``8S``); ``chunk_scan_bwd_dz`` (x, z, out,
    dy in; dz, dy' out: ``12Td``); ``bwd_dstates`` (``2Td + 2TGN + 4TH + 4S``);
    ``state_passing_bwd`` (FP32 states and their gradients in, both BF16 out: ``12S``); the
    fused ``bwd_dx`` (``6Td + 4TGQ + 2TGN + 2S + 12TH``), ``bwd_db``
    (``2Td + 2S + 4TGN + 12TH``), ``bwd_dC`` (``2Td + 2S + 4TGN + 8TH``), ``bwd_dcb`` (``4Td + 4TGQ + 8TH``), two
    ``bmm_chunk_bwd`` (``6TGN + 4TGQ`` each), ``bwd_ddAcs`` (``4Td + 4TGQ + 12TH``) and the
    FP32 passes over ``ddA``/``ddt`` (reverse cumsum, adds, ``chunk_cumsum_bwd``: ``38TH``).
    In all: forward ``10Td + 12S + 8TGN + 8TGQ + 26TH``, backward ``34Td + 34S + 30TGN + 24TGQ
    + 116TH``.  Reads that several programs share through L2 (B and C per head) are counted
    once; the time model applies the measured fraction of HBM bandwidth these kernels reach
    (:data:`~workloads.costs.compute.KERNEL_HBM_FRACTION`), which absorbs what the counts miss.
    """
    a, f = kn.act_bytes(), kn.FP32
    Td, TGN, TGQ, TH = T * d, T * groups * state, T * groups * chunk, T * heads
    S = T * d * state / chunk
    cumsum = ("chunk_cumsum", TH * (a + 2 * f))
    cstate = ("chunk_state", a * Td + a * TGN + 2 * f * TH + f * S)
    bmm = ("bmm_chunk", 2 * a * TGN + f * TGQ)
    fwd = (cumsum, cstate, ("state_passing", f * S + a * S), bmm,
           ("chunk_scan", 4 * a * Td + a * TGN + f * TGQ + a * S + 2 * f * TH))
    bwd = (("dt_copy", 2 * a * TH), cumsum, bmm, cstate, ("state_passing", 2 * f * S),
           ("chunk_scan_bwd_dz", 6 * a * Td),
           ("chunk_scan_bwd_dstates", a * Td + a * TGN + f * TH + f * S),
           ("state_passing_bwd", 2 * f * S + 2 * a * S),
           ("chunk_scan_chunk_state_bwd_dx", 3 * a * Td + f * TGQ + a * TGN + a * S + 3 * f * TH),
           ("chunk_state_bwd_db", a * Td + a * S + 2 * a * TGN + 3 * f * TH),
           ("chunk_scan_bwd_dC", a * Td + a * S + 2 * a * TGN + 2 * f * TH),
           ("chunk_scan_bwd_dcb", 2 * a * Td + f * TGQ + 2 * f * TH),
           ("bmm_chunk_bwd", 2 * (3 * a * TGN + f * TGQ)),
           ("chunk_scan_bwd_ddAcs", 2 * a * Td + f * TGQ + 3 * f * TH),
           ("ddA_passes", 38 * TH))
    return tuple((n, float(x)) for n, x in fwd), tuple((n, float(x)) for n, x in bwd)


def mamba_scan_bytes(T: float, d: int, heads: int, groups: int, state: int, chunk: int) -> tuple[float, float]:
    """(forward, backward) HBM bytes of the chunked SSD scan: the sums of
    :func:`mamba_scan_kernels` (same arguments)."""
    f, b = mamba_scan_kernels(T, d, heads, groups, state, chunk)
    return float(sum(x for _, x in f)), float(sum(x for _, x in b))



class MambaBlock(Block):
    """A Mamba-2 mixer (``model.mamba``) in the place of attention."""

    kind = "mamba"
    RECOMPUTE = {"mamba_norm": "layernorm"}
    # the mixer stands where attention does: one segment between the TP collectives
    SEGMENTS = dict.fromkeys(("mamba_norm", "in_proj", "mamba_layout", "conv1d", "ssd_scan", "gated_norm",
                              "mamba_out_proj", "mamba_residual"), "attn")

    def graph_scope(self, name: str) -> str | None:
        return "mamba" if name in self.SEGMENTS else None

    def params(self, *, active: bool = False) -> dict[str, int]:
        return {"mamba": self.model.mamba.mixer_params(self.model.hidden_size)}

    def rank_params(self, parallel) -> RankParams:
        # in_proj / out_proj column / row parallel; conv1d, dt_bias, A_log, D and the gated
        # norm split with the heads (Megatron-Core MambaMixer)
        mb, h, t = self.model.mamba, self.model.hidden_size, parallel.tp
        gemm = (h * mb.in_proj_width + mb.d_inner * h) / t
        return RankParams(gemm + (mb.mixer_params(h) - h * mb.in_proj_width - mb.d_inner * h) / t, 0.0, gemm, 0.0)

    def add_kernels(self, ops, sh, args) -> None:
        """A Mamba-2 layer (Megatron-Core ``MambaLayer`` / ``MambaMixer._ssm_training``):
        pre-norm, ``in_proj`` (column-parallel, z x B C dt), the layout copy to batch-major, the
        depthwise causal conv1d with SiLU over x, B, C, the chunked SSD scan gated by
        ``silu(z)``, the copy back to sequence-major, the grouped RMSNorm, ``out_proj``
        (row-parallel), residual.

        TP splits heads and groups (``d = d_inner / tp``); context parallelism transposes the
        sequence-split activations to head-split ones before the conv1d and back after the scan
        (a rank then runs the whole sequence for ``1 / cp`` of its heads), which leaves the
        per-rank bytes unchanged: ``T`` tokens x ``d`` channels either way.

        * ``mamba_layout``: ``rearrange(zxBCdt, "l b d -> b l d").contiguous()`` before the
          scan and the reverse on its output (a copy each when the micro-batch is above 1; a view
          at 1), and the copy of the ``in_proj`` output gradient in the backward.
        * conv1d (causal_conv1d's CUDA kernels): F reads and writes the ``d + 2 G N / tp``
          channels; B runs the forward again (mamba_ssm's fused function saves only the
          ``in_proj`` output) and then reads x and dy, writes dx (the weight gradient reduced in
          the same kernel).
        * scan: :func:`mamba_scan_kernels` (z gated inside the chunk scan).
        * gated_norm (mamba_ssm's Triton ``RMSNormGated``, per group, called without z): F reads
          y, writes the output; B reads y and dy, writes dy.

        All are element-wise ops (bytes over HBM); the scan and the norm at the fractions of HBM
        bandwidth their kernels reached on an H200
        (:data:`~workloads.costs.compute.KERNEL_HBM_FRACTION`).
        """
        model, L = self.model, self.layer
        mb, h, tp = model.mamba, model.hidden_size, sh.tp
        d = mb.d_inner // tp
        heads, groups = mb.num_heads // tp, mb.num_groups // tp
        T, Tn = sh.T, sh.Tn
        ops.pair(kn.norm("mamba_norm", L, Tn, h))
        width = mb.in_proj_width // tp
        ops.linear("in_proj", T, width, h)
        if sh.b > 1:
            ops.pair(kn.ew_pair("mamba_layout", L, 2 * kn.act_bytes() * T * (width + d), 2 * kn.act_bytes() * T * width,
                                2, 1))
        conv = kn.act_bytes() * T * (d + 2 * groups * mb.state_dim)
        ops.pair(kn.ew_pair("conv1d", L, 2 * conv, 5 * conv, 1, 2))
        f, b = mamba_scan_bytes(T, d, heads, groups, mb.state_dim, mb.chunk_size)
        ops.pair(kn.ew_pair("ssd_scan", L, f, b, *MAMBA_SCAN_LAUNCHES))
        a = kn.act_bytes() * T * d
        ops.pair(kn.ew_pair("gated_norm", L, 2 * a, 3 * a, 1, 2))
        ops.linear("mamba_out_proj", T, h, d)
        ops.pair(kn.residual("mamba_residual", L, Tn, h, model.dropout))

    def activation_terms(self, d, modules, out) -> None:
        """Megatron-Core's memory-efficient training path (``mamba_split_conv1d_scan_combined``,
        which recomputes the conv1d output in its backward) keeps the normed ``in_proj``
        input, the ``in_proj`` output (z, x, B, C, dt: the scan's saved input), the scan
        output (the gated norm's input) and the ``out_proj`` input."""
        mb, h = self.model.mamba, self.model.hidden_size
        if "layernorm" not in modules:
            out["attn_input"] = d.tok_sp * h * d.lb
        out["mamba_in_proj_output"] = d.tok * mb.in_proj_width / d.t * d.e
        out["mamba_scan_output"] = d.tok * mb.d_inner / d.t * (d.e + d.lb)

    def unsupported_convention(self, convention: str) -> str | None:
        if convention == "nemo_24":
            return "defines no count for hybrid (Mamba) stacks; use megatron_core_2025"
        return None

    def mc_hybrid_forward_per_token(self, seq_len: int) -> float:
        """Megatron-Core's ``hybrid_flops`` forward count of one Mamba layer per token:
        ``2 h (2 D + 2 G N + nh) + 7 D N + 2 D h`` with its assumed ``D = 2 h``."""
        mb, h = self.model.mamba, self.model.hidden_size
        d_in = 2 * h
        return (2 * h * (2 * d_in + 2 * mb.num_groups * mb.state_dim + mb.num_heads)
                + 7 * d_in * mb.state_dim + 2 * d_in * h)


def check_mamba_split(model, tp: int, cp: int) -> None:
    """Megatron-Core's MambaMixer splits heads and groups over TP (``nheads % tp == 0``,
    ``ngroups % tp == 0``) and, with context parallelism, a rank's heads and groups again
    over CP (the head-transposing all-to-all; ``mamba_context_parallel.py``)."""
    mb = model.mamba
    for key, n in (("num_heads", mb.num_heads), ("num_groups", mb.num_groups)):
        if n % tp:
            raise ConfigError("parallel.tp", tp, f"must divide model.mamba.{key} = {n} (Mamba heads and groups "
                                                 "are split over tensor parallelism)")
    heads, groups = mb.num_heads // tp, mb.num_groups // tp
    if heads % cp:
        raise ConfigError("parallel.cp", cp, f"must divide model.mamba.num_heads / tp = {heads} (context "
                                             "parallelism splits a Mamba layer's heads)")
    if groups % cp and cp % groups:
        # fewer groups than CP ranks: each group's state is replicated on cp / groups ranks
        raise ConfigError("parallel.cp", cp, f"must divide model.mamba.num_groups / tp = {groups} or be a "
                                             "multiple of it (context parallelism splits or replicates the groups)")

