"""Multi-token prediction (DeepSeek-V3): each MTP module embeds the shifted tokens (the
shared embedding), normalises them and the previous hidden state (``enorm``, ``hnorm``),
projects the concatenation (``eh_proj``, ``2h -> h``), runs one decoder layer shaped like
the main model's last layer, a final norm and the shared output layer with its loss."""

from __future__ import annotations

from . import kernels as kn
from .base import norm_params
from .edges import output_and_loss

__all__ = ["mtp_epilogue", "mtp_extra_params", "mtp_prologue"]


def mtp_extra_params(model) -> int:
    """Unique parameters of one MTP module besides its decoder layer: ``enorm``, ``hnorm``,
    the final norm and ``eh_proj`` (the embedding and output layer are shared)."""
    h = model.hidden_size
    return 3 * norm_params(model, h) + 2 * h * h


def mtp_prologue(model, sh, L: int, ops) -> None:
    """An MTP module's input: embedding of the shifted tokens, its two norms, ``eh_proj``."""
    h = model.hidden_size
    # embedding of the shifted tokens (shared table; its gradient is a W-phase scatter-add)
    ops.fwd.append(kn.ew("mtp_embedding", "F", L, kn.act_bytes() * h * (sh.T / sh.tp + sh.T), 2))
    ops.wgt.append(kn.ew("mtp_embedding", "W", L, kn.act_bytes() * sh.T * h + 2 * kn.FP32 * sh.T * h / sh.tp, 4))
    for name in ("mtp_enorm", "mtp_hnorm"):
        ops.pair(kn.norm(name, L, sh.Tn, h))
    ops.fbw(*kn.linear("mtp_eh_proj", L, sh.T, h // sh.tp, 2 * h))


def mtp_epilogue(model, sh, L: int, ops) -> None:
    """An MTP module's output: final norm, the shared output GEMM and its loss."""
    ops.pair(kn.norm("mtp_final_norm", L, sh.Tn, model.hidden_size))
    f_ops, b_ops, w_ops = output_and_loss(model, sh, L, "mtp_output_gemm", "mtp_cross_entropy", None, False)
    ops.fwd.extend(f_ops)
    ops.bwd.extend(b_ops)
    ops.wgt.extend(w_ops)
