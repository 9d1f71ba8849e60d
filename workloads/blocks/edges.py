"""The ends of the stack: the input embedding, the output layer and its cross-entropy loss
(shared by the main model and every MTP module)."""

from __future__ import annotations

from topologies.constants import value as active_value

from . import kernels as kn

__all__ = ["embedding_kernels", "output_and_loss", "padded_vocab_size"]

_E = "workloads.blocks.edges."   # the prefix of this module's constants (topologies.constants)
_VOCAB_MULTIPLE = 128  # Megatron-LM --make-vocab-size-divisible-by default (times tp)

# Cross-entropy over the vocabulary-parallel logits, bytes per logit (T x Vp/tp of them).
# Unfused Megatron (``vocab_parallel_cross_entropy`` on logits cast to FP32): cast
# (read 2, write 4), max (read 4), subtract (read 4, write 4), exp (read 4, write 4),
# sum (read 4), divide (read 4, write 4) = 38; backward softmax - one-hot, scale by the
# loss gradient, cast to BF16: (8 + 8 + 6) = 22.  Fused (``--cross-entropy-loss-fusion``):
# one pass reading BF16 logits and writing FP32 softmax (6), one pass back (read 4,
# write 2) = 6.
_CE_BYTES_PER_LOGIT = {False: (38, 22), True: (6, 6)}
_CE_KERNELS = {False: (8, 4), True: (2, 1)}


def padded_vocab_size(vocab_size: int, tp: int = 1, multiple: int | None = None) -> int:
    """Megatron-LM's padded vocabulary: a multiple of ``multiple x tp``
    (``--make-vocab-size-divisible-by``, default 128)."""
    step = (active_value(_E + "_VOCAB_MULTIPLE", _VOCAB_MULTIPLE) if multiple is None else multiple) * tp
    return -(-int(vocab_size) // step) * step


def output_and_loss(model, sh, L: int, gemm_name: str, ce_name: str, vocab_size, fused_ce: bool):
    """(F ops, B ops in forward order, W ops) of the output GEMM and its loss."""
    vp = padded_vocab_size(model.vocab_size if vocab_size is None else vocab_size, sh.tp)
    f, b, w = kn.linear(gemm_name, L, sh.T, vp // sh.tp, model.hidden_size)
    logits = sh.T * vp / sh.tp
    fb, bb = active_value(_E + "_CE_BYTES_PER_LOGIT", _CE_BYTES_PER_LOGIT)[fused_ce]
    kf, kb = _CE_KERNELS[fused_ce]
    return ([f, kn.ew(ce_name, "F", L, fb * logits, kf)], [b, kn.ew(ce_name, "B", L, bb * logits, kb)], [w])


def embedding_kernels(model, sh) -> list:
    """The input embedding of the first stage: a vocabulary-parallel gather, no GEMM FLOPs.

    ``F``: each TP rank reads the rows of its vocabulary shard and writes the full
    ``T x h`` output (zeros elsewhere; the TP reduction is communication).  ``W``: the
    weight gradient is a scatter-add of ``dY`` into the FP32 main grad of the shard.
    Learned positions add a table read and an add.
    """
    h, T, tp = model.hidden_size, sh.T, sh.tp
    a, f32 = kn.act_bytes(), kn.FP32
    f_bytes = a * h * (T / tp + T) + 8 * T          # rows, output, int64 token ids
    w_bytes = a * T * h + 2 * f32 * T * h / tp
    if model.position_embedding == "learned":
        f_bytes += 2 * a * T * h
        w_bytes += a * T * h + 2 * f32 * T * h
    return [kn.ew("embedding", "F", -1, f_bytes, 2), kn.ew("embedding", "W", -1, w_bytes, 4)]
