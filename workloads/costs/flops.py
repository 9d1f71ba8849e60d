"""Executed FLOPs and bytes per op of one rank, and model FLOPs by named convention.

Two counts live here and are never mixed (docs/design.md, "Metrics"):

* **Executed** FLOPs and bytes per op -- :func:`layer_ops`, :func:`embedding_ops`,
  :func:`output_ops`, :func:`optimizer_ops` -- for one micro-batch on one rank, after
  TP / CP / EP sharding, split into forward (``F``), input-gradient (``B``) and
  weight-gradient (``W``) phases.  They drive op times and HFU.
* **Model** FLOPs per step -- :func:`model_flops_per_step` -- by a named, sourced
  convention in :data:`FLOP_CONVENTIONS`.  They drive TFLOP/s and MFU.

What one layer executes
-----------------------
Notation: ``b`` micro-batch, ``s`` sequence, ``h`` hidden, ``H`` / ``K`` query / KV heads,
``d`` head dim, ``f`` MLP width, ``m1`` = 2 (swiglu: gate and up fused) or 1 (gelu),
``tp`` / ``cp`` / ``ep`` / ``etp`` degrees, ``T = b s / cp`` tokens a rank's TP-sharded
GEMMs see (sequence parallelism all-gathers them first), ``Tn = T / tp`` with sequence
parallelism (else ``T``): the tokens a rank's norms, residual adds and router see.

A linear layer ``Y[M, N] = X[M, K] W[K, N]`` is three GEMMs of ``2 M N K`` FLOPs each:
``F`` (M, N, K), ``B`` = dgrad ``dX = dY W^T`` (M, K, N) and ``W`` = wgrad
``dW = X^T dY`` (K, N, M); so per layer the GEMM FLOPs are exactly F : B : W = 1 : 1 : 1.
The ``(m, n, k)`` stored on an op is the shape of the GEMM it runs.

======================  =====================================================  ==============
op                      forward GEMM shape per rank (M, N, K)                  notes
======================  =====================================================  ==============
``qkv_proj``            (T, (H/tp + 2 Kl) d, h)                                GQA: ``Kl = K/tp``, or 1 when
                                                                               tp > K (replicated KV heads)
``q_down_proj``         (Tn, q_lora, h)                                        MLA; not TP-sharded: each rank
``kv_down_proj``        (Tn, kv_lora + rope, h)                                projects its own SP shard
``q_up_proj``           (T, H/tp (nope + rope), q_lora)                        MLA (``q_proj`` w/o q_lora)
``kv_up_proj``          (T, H/tp (nope + v), kv_lora)                          MLA
``core_attn``           see below                                              FlashAttention
``out_proj``            (T, h, H/tp v)
``fc1`` / ``fc2``       (T, m1 f/tp, h) / (T, h, f/tp)                         dense MLP
``router``              (Tn, E, h)                                             replicated over TP
``expert_fc1/fc2``      grouped: (t_e, m1 fe/etp, h) / (t_e, h, fe/etp)        one group per local expert
``shared_fc1/fc2``      (T, m1 S fs/tp, h) / (T, h, S fs/tp)                   shared experts, one fused MLP
``output_gemm``         (T, Vp/tp, h)                                          ``Vp`` padded vocabulary
``mtp_eh_proj``         (T, h/tp, 2h)                                          MTP module projection
======================  =====================================================  ==============

**Core attention** (FlashAttention).  Per head the forward runs ``Q K^T`` and ``P V``:
``2 s_q s_k (d_qk + d_v)`` FLOPs unmasked.  Causal attention is counted at its *executed*
cost: FlashAttention skips key blocks entirely above the diagonal and computes the blocks
on the diagonal in full (masking after the matmul), so with square ``B x B`` tiles it runs
``n (n + 1) / 2`` of ``n^2`` blocks (``n = s / B``): ``s^2 / 2 + s B / 2`` score entries,
i.e. the half of the full ``s^2`` work plus ``B / s`` of it for the diagonal blocks (1.6 %
at s = 8192, B = 128; FA3's causal forward tile on H100 is 128 x 128).  Context
parallelism with the load-balanced causal split (each rank holds chunks ``i`` and
``2 cp - 1 - i``) gives every CP rank exactly ``1 / cp`` of that work.  The backward
runs five matmuls (it recomputes ``Q K^T``): 2.5 x the forward, the count
FlashAttention's own benchmark uses (Dao-AILab/flash-attention
``benchmarks/benchmark_flash_attention.py``: ``bwd = 2.5 * fwd``), which is also what its
papers' efficiencies are relative to.  Core attention has no ``W`` phase.

**Sliding-window layers** (:meth:`ModelSpec.attention_window` set, e.g. gpt-oss's even
layers with a 128-token window) execute only the key blocks the band ``[q - w + 1, q]``
touches, each in full: :func:`window_executed_fraction` replaces the causal fraction
(``2 n - 1`` of ``n^2`` blocks for ``w <= B + 1``: 6.2 % of the full work at s = 4096
instead of 51.6 %).  The bytes are those of a causal layer (every key and value is still
read), the CP split keeps ``1 / cp`` of the work per rank, and the efficiency model is the
causal one: a band of mostly diagonal tiles probably runs below it.  Unfused attention
computes the full ``s x s`` scores whatever the mask, window or not.

With ``ModelSpec.flash_attention = False`` (Megatron-LM's unfused ``CoreAttention``) core
attention is ``core_attn.qk`` / ``core_attn.pv`` batched GEMMs over the *full* ``s x s``
scores (``2 s^2 d`` FLOPs each per head; the backward runs four: ``dp, dv, dq, dk``) and
``core_attn.softmax`` / ``core_attn.dropout`` memory-bound passes over the ``b x heads x
s^2`` scores in BF16 (softmax 4 / 6 bytes per score forward / backward, dropout 5 with its
one-byte mask); see :func:`_unfused_attention`.

**MoE.**  Megatron-Core requires sequence parallelism for MoE with tp > 1, so tokens
enter the MoE block as ``Tn``; the router and the permutation run on them.  A rank's
``E / ep`` local experts run grouped GEMMs on ``tokens_per_expert`` tokens each -- an
input, so skewed routing or capacity padding can be passed; the default is balanced
routing: every expert-tensor-parallel shard of an expert sees
``etp * ep * (T / tp) * top_k / E`` tokens (the tokens of the ``etp * ep`` ranks that
share the expert, ``top_k`` copies spread over ``E`` experts).

**Element-wise ops** (norms, RoPE, activations, bias-dropout-add, router top-k,
permutation, embedding lookup, cross-entropy, optimizer) carry the bytes they move over
HBM and no FLOPs: their arithmetic is well under 1 % of a layer's and no convention
counts it.  Byte counts assume BF16 activations (2 bytes) and fused kernels that read
each input and write each output once; the per-op formulas are in the code, with the
kernel counts used for launch overhead.

**Recomputation** adds forward work to the backward phase as ops with ``recompute=True``
and ``phase="B"`` (they run just before the layer's backward): ``selective`` recomputes
the modules in ``parallel.recompute_modules`` (Megatron-Core's default ``core_attn``:
the attention forward), ``full`` the whole layer's forward.  Which layers of a stage
recompute under ``recompute_num_layers`` is the program builder's call: it passes
``recompute=`` to :func:`layer_ops`.

Not modelled: dropout's RNG cost, bias-add FLOPs (fused into GEMM epilogues), TP / CP /
EP communication (a separate module), FP8 quantisation ops (added per recipe by
:func:`workloads.costs.precision.quantize_ops`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from topologies import ConfigError

from ..model import ModelSpec
from ..parallel import ParallelConfig, check_mamba_split

__all__ = ["ComputeOp", "EXPERT_GROUPED_LINEARS", "OP_CLASSES", "PHASES", "GEMM_ROLES", "ACT_BYTES", "ATTN_BLOCK_SIZE",
           "layer_ops", "embedding_ops", "mamba_scan_bytes", "mamba_scan_kernels", "MAMBA_SCAN_LAUNCHES", "check_mamba_split", "output_ops", "optimizer_ops", "gemm_role", "sum_flops",
           "balanced_tokens_per_expert", "capacity_tokens_per_expert", "padded_vocab_size",
           "causal_executed_fraction", "window_executed_fraction", "FLOP_CONVENTIONS", "DEFAULT_FLOP_CONVENTION",
           "get_flop_convention", "model_flops_per_step", "model_flops_per_token"]

OP_CLASSES = ("gemm", "attention", "elementwise")
PHASES = ("F", "B", "W")
GEMM_ROLES = ("fprop", "dgrad", "wgrad")

ACT_BYTES = 2
"""Bytes per activation element: BF16 activations (Megatron ``--bf16``; FP8 recipes keep
activations between GEMMs in BF16 too)."""

ATTN_BLOCK_SIZE = 128
"""FlashAttention key/query tile for the causal diagonal: 128 x 128 in FA3's causal
forward for head dim 128 on H100 (Dao-AILab/flash-attention ``hopper/`` tile_size_fwd_sm90:
kBlockM = kBlockN = 128 for causal hdim 128); FA2 on A100 uses 128 x 64 or 128 x 128."""

_FP32 = 4
_MASK_BYTES = 1        # torch dropout mask: one byte per element
_VOCAB_MULTIPLE = 128  # Megatron-LM --make-vocab-size-divisible-by default (times tp)

# Adam step with FP32 master weights and moments (Megatron's distributed optimizer, a
# multi-tensor fused kernel): read grad, master, exp_avg, exp_avg_sq (4 x 4 B), write
# master and both moments (3 x 4 B) and the BF16 model copy (2 B).
_ADAM_BYTES_PER_PARAM = 4 * 4 + 3 * 4 + 2
# Gradient-norm pass (multi_tensor_l2norm) reads the FP32 grads once.
_GRAD_NORM_BYTES_PER_PARAM = 4

# Cross-entropy over the vocabulary-parallel logits, bytes per logit (T x Vp/tp of them).
# Unfused Megatron (``vocab_parallel_cross_entropy`` on logits cast to FP32): cast
# (read 2, write 4), max (read 4), subtract (read 4, write 4), exp (read 4, write 4),
# sum (read 4), divide (read 4, write 4) = 38; backward softmax - one-hot, scale by the
# loss gradient, cast to BF16: (8 + 8 + 6) = 22.  Fused (``--cross-entropy-loss-fusion``):
# one pass reading BF16 logits and writing FP32 softmax (6), one pass back (read 4,
# write 2) = 6.
_CE_BYTES_PER_LOGIT = {False: (38, 22), True: (6, 6)}
_CE_KERNELS = {False: (8, 4), True: (2, 1)}


class ComputeOp(NamedTuple):
    """One compute kernel (or fused group) of one rank for one micro-batch.

    ``op_class`` selects the sub-model that times it: ``gemm`` (tile-quantised matmul
    efficiency in the recipe's dtype), ``attention`` (FlashAttention efficiency) or
    ``elementwise`` (bytes over HBM).
    """

    name: str
    """Stable op name, e.g. ``qkv_proj``, ``core_attn``, ``mlp_norm`` (keys of measured CSVs)."""
    phase: str
    """``F`` forward, ``B`` input gradient (and recomputation), ``W`` weight gradient."""
    op_class: str
    """``gemm`` | ``attention`` | ``elementwise``."""
    flops: float
    """Executed FLOPs (0 for element-wise ops)."""
    m: int = 0
    """GEMM rows M (attention: query tokens per sequence on this rank)."""
    n: int = 0
    """GEMM columns N (attention: key tokens per sequence)."""
    k: int = 0
    """GEMM reduction K (attention: query/key head dimension)."""
    mem_bytes: float = 0.0
    """Bytes moved over HBM (GEMMs: at BF16 inputs; the compute model recomputes them per dtype)."""
    num_kernels: int = 1
    """Kernel launches the op stands for (launch-overhead model)."""
    layer: int = -1
    """Decoder layer index (``num_layers + j`` for MTP module ``j``); -1 outside layers."""
    recompute: bool = False
    """Forward work re-run during the backward (activation recomputation)."""
    groups: tuple = ()
    """Grouped GEMMs (MoE experts): per-group sizes of the token dimension -- ``m`` for
    fprop and dgrad, ``k`` for wgrad (see :func:`gemm_role`).  Empty for one GEMM."""
    quantizes: str = ""
    """A quantisation op: the name of the GEMM whose input it quantises (it belongs to that
    GEMM's block); empty otherwise."""

    @property
    def kernel_rounds(self) -> int:
        """How many times the op's ``num_kernels`` launch: once per local expert with tokens
        for an expert grouped linear (:data:`EXPERT_GROUPED_LINEARS`) and the quantisation of
        its input -- Transformer Engine's grouped linear runs each expert's GEMM and slice as
        kernels of their own -- and once otherwise (a batched GEMM is one kernel)."""
        if not self.groups or (self.quantizes or self.name) not in EXPERT_GROUPED_LINEARS:
            return 1
        return max(sum(1 for g in self.groups if g > 0), 1)

    @property
    def launches(self) -> int:
        """Kernels the op launches on the GPU: ``num_kernels x kernel_rounds``."""
        return self.num_kernels * self.kernel_rounds


EXPERT_GROUPED_LINEARS = frozenset({"expert_fc1", "expert_fc2"})
"""The routed experts' grouped GEMMs (their ``groups`` are local experts; a batched GEMM's
groups, e.g. unfused attention's, are one kernel)."""


def gemm_role(op: ComputeOp) -> str:
    """``fprop`` for forward and recomputed GEMMs, ``dgrad`` for ``B``, ``wgrad`` for ``W``."""
    if op.phase == "F" or op.recompute:
        return "fprop"
    return "dgrad" if op.phase == "B" else "wgrad"


def sum_flops(ops: Iterable[ComputeOp], phase: str | None = None, op_class: str | None = None,
              recompute: bool | None = None) -> float:
    """Total FLOPs of ``ops``, optionally only one phase / class / recompute flag."""
    return float(sum(o.flops for o in ops if (phase is None or o.phase == phase)
                     and (op_class is None or o.op_class == op_class)
                     and (recompute is None or o.recompute == recompute)))


def window_executed_fraction(seq_len: int, window: int | None, block: int = ATTN_BLOCK_SIZE) -> float:
    """Executed fraction of the full ``s x s`` attention work under a causal sliding window.

    Query ``q`` attends to keys ``[q - window + 1, q]`` (``window`` tokens, itself included;
    Hugging Face's ``sliding_window``).  FlashAttention skips every key block outside the band
    and computes the blocks the band touches in full: query block ``i`` (rows ``[i B, i B +
    r_i)``) runs the key blocks that intersect ``[i B - window + 1, i B + r_i - 1]``, i.e.
    the columns from ``B * floor(max(0, i B - window + 1) / B)`` to the end of its own block.
    With ``n = s / B`` blocks and ``window <= B + 1`` that is ``2 n - 1`` of ``n^2`` blocks (the
    diagonal and the one left of it, none left of block 0).  ``window >= s`` (or None) is
    :func:`causal_executed_fraction`.

    >>> window_executed_fraction(4096, 128, 128) == (2 * 32 - 1) / 32 ** 2
    True
    """
    s, bs = int(seq_len), int(block)
    if window is None or window >= s:
        return causal_executed_fraction(s, bs)
    w = int(window)
    if w < 1:
        raise ConfigError("model.sliding_window", window, "must be an integer >= 1")
    entries = 0
    for i in range(-(-s // bs)):
        start = i * bs
        rows = min(bs, s - start)
        first_key_block = max(0, start - w + 1) // bs
        entries += rows * (start + rows - first_key_block * bs)
    return entries / (s * s)


def causal_executed_fraction(seq_len: int, block: int = ATTN_BLOCK_SIZE) -> float:
    """Executed fraction of the full ``s x s`` attention work under a causal mask.

    FlashAttention runs the ``n (n + 1) / 2`` blocks on or below the diagonal of ``n x n``
    (``n = s / block``, the last block partial): ``1/2 + block / (2 s)`` when ``block``
    divides ``s``.
    """
    s, bs = int(seq_len), int(block)
    full, rem = divmod(s, bs)
    # rows of complete query blocks: block i runs (i + 1) key blocks of bs x bs
    entries = bs * bs * full * (full + 1) / 2
    if rem:
        # a partial last query block of rem rows sees every key column up to and including its own
        entries += rem * (full * bs + rem)
    return entries / (s * s)


# -- sharding ----------------------------------------------------------------------------------
class _Shard(NamedTuple):
    b: int
    s: int
    tp: int
    cp: int
    sp: bool
    T: int      # tokens of TP-sharded GEMMs on this rank
    Tn: int     # tokens of norms / residuals / router on this rank


def _positive_int(field: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
        raise ConfigError(field, v, "must be an integer >= 1")
    return int(v)


def _shard(model: ModelSpec, parallel: ParallelConfig, micro_batch_size, seq_len) -> _Shard:
    b = _positive_int("parallel.micro_batch_size",
                      parallel.micro_batch_size if micro_batch_size is None else micro_batch_size)
    s = _positive_int("parallel.seq_len", (parallel.seq_len or model.seq_len) if seq_len is None else seq_len)
    tp, cp = parallel.tp, parallel.cp
    if s % cp:
        raise ConfigError("parallel.seq_len", s, f"must be divisible by cp = {cp}")
    T = b * s // cp
    sp = parallel.sequence_parallel and tp > 1
    if sp and T % tp:
        raise ConfigError("parallel.seq_len", s, f"tokens per CP rank ({T}) must divide by tp = {tp} "
                                                 "(sequence parallelism)")
    if model.num_attention_heads % tp:
        raise ConfigError("parallel.tp", tp, f"must divide the attention heads ({model.num_attention_heads})")
    kv = model.num_kv_heads
    if kv % tp and tp % kv:
        raise ConfigError("parallel.tp", tp, f"must divide the KV heads ({kv}) or be a multiple of them")
    if model.mamba is not None:
        check_mamba_split(model, tp, cp)
    return _Shard(b, s, tp, cp, sp, T, T // tp if sp else T)


def _gemm_bytes(m, n, k) -> float:
    return float(ACT_BYTES * (m * k + k * n + m * n))


def _linear(name: str, layer: int, m: int, n: int, k: int) -> tuple[ComputeOp, ComputeOp, ComputeOp]:
    """F, B, W ops of ``Y[m, n] = X[m, k] W[k, n]``."""
    f = 2.0 * m * n * k
    return (ComputeOp(name, "F", "gemm", f, m, n, k, _gemm_bytes(m, n, k), 1, layer),
            ComputeOp(name, "B", "gemm", f, m, k, n, _gemm_bytes(m, k, n), 1, layer),
            # wgrad accumulates into the FP32 main grad (gradient-accumulation fusion): read + write 4 B
            ComputeOp(name, "W", "gemm", f, k, n, m, ACT_BYTES * (m * k + m * n) + 2.0 * _FP32 * k * n, 1, layer))


def _grouped_linear(name: str, layer: int, tokens: Sequence[float], n: int, k: int):
    """F, B, W ops of one grouped GEMM: group ``e`` is ``Y[t_e, n] = X[t_e, k] W_e[k, n]``."""
    groups = tuple(float(t) for t in tokens)
    t = sum(groups)
    m = round(t)
    f = 2.0 * t * n * k
    ng = sum(1 for g in groups if g > 0)
    return (ComputeOp(name, "F", "gemm", f, m, n, k, ACT_BYTES * (t * k + ng * k * n + t * n), 1, layer, False, groups),
            ComputeOp(name, "B", "gemm", f, m, k, n, ACT_BYTES * (t * n + ng * k * n + t * k), 1, layer, False, groups),
            ComputeOp(name, "W", "gemm", f, k, n, m, ACT_BYTES * (t * k + t * n) + 2.0 * _FP32 * ng * k * n, 1, layer,
                      False, groups))


def _ew(name: str, phase: str, layer: int, nbytes: float, kernels: int = 1) -> ComputeOp:
    return ComputeOp(name, phase, "elementwise", 0.0, 0, 0, 0, float(nbytes), kernels, layer)


def _ew_pair(name: str, layer: int, f_bytes: float, b_bytes: float, kf: int = 1, kb: int = 1):
    return _ew(name, "F", layer, f_bytes, kf), _ew(name, "B", layer, b_bytes, kb)


def _norm(name: str, layer: int, tokens: float, width: int):
    # F: read x, write y.  B: read x and dy, write dx (dgamma reduced in the same kernel).
    a = ACT_BYTES * tokens * width
    return _ew_pair(name, layer, 2 * a, 3 * a)


def _residual(name: str, layer: int, tokens: float, width: int, dropout: float):
    # bias-dropout-add: F reads the branch output and the residual, writes the sum (+ mask);
    # B reads dy (+ mask) and writes the branch gradient (the residual gradient passes through).
    a = ACT_BYTES * tokens * width
    mask = _MASK_BYTES * tokens * width if dropout > 0 else 0
    return _ew_pair(name, layer, 3 * a + mask, 2 * a + mask)


def _activation(name: str, layer: int, tokens: float, width: int, mlp: str):
    # swiglu: F reads gate and up (2 w), writes w; B reads gate, up, dy, writes dgate, dup (5 w).
    # gelu: F reads w, writes w; B reads x and dy, writes dx (3 w).
    a = ACT_BYTES * tokens * width
    return _ew_pair(name, layer, 3 * a, 5 * a) if mlp == "swiglu" else _ew_pair(name, layer, 2 * a, 3 * a)


def _attention(name: str, layer: int, sh: _Shard, heads: int, kv_heads: int, d_qk: int, d_v: int,
               causal: bool, block: int, window: int | None = None) -> tuple[ComputeOp, ComputeOp]:
    s, cp = sh.s, sh.cp
    if not causal:
        frac = 1.0
    elif window is not None:
        frac = window_executed_fraction(s, window, block)
    else:
        frac = causal_executed_fraction(s, block)
    fwd = 2.0 * sh.b * heads * (d_qk + d_v) * s * s * frac / cp
    sq = s // cp
    # F: read Q, K, V (this rank's queries against all keys, K/V exchanged over CP), write O
    # and the log-sum-exp; B additionally reads O and dO and writes dQ, dK, dV.
    q = sh.b * sq * heads * d_qk
    kv = sh.b * s * kv_heads * (d_qk + d_v)
    o = sh.b * sq * heads * d_v
    f_bytes = ACT_BYTES * (q + kv + o) + _FP32 * sh.b * sq * heads
    b_bytes = ACT_BYTES * (2 * q + 2 * kv + 2 * o) + _FP32 * sh.b * sq * heads
    # one kernel per ring step with CP; backward: preprocess (dO . O), main, dQ conversion
    return (ComputeOp(name, "F", "attention", fwd, sq, s, d_qk, f_bytes, cp, layer),
            ComputeOp(name, "B", "attention", 2.5 * fwd, sq, s, d_qk, b_bytes, 2 * cp + 1, layer))


def _bmm(name: str, phase: str, layer: int, batches: int, m: int, n: int, k: int) -> ComputeOp:
    """``batches`` independent ``m x n x k`` GEMMs in one batched kernel (cuBLAS strided
    batched): timed by the GEMM model as a grouped GEMM of ``batches`` groups of ``m`` rows."""
    return ComputeOp(name, phase, "gemm", 2.0 * batches * m * n * k, m, n, k,
                     ACT_BYTES * batches * (m * k + k * n + m * n), 1, layer, False, (float(m),) * batches)


def _unfused_attention(L: int, sh: _Shard, heads: int, d: int, dropout: float, ops: _LayerOps) -> None:
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
    f_ops = [_bmm("core_attn.qk", "F", L, B, s, s, d),
             _ew("core_attn.softmax", "F", L, 4 * scores),
             *([_ew("core_attn.dropout", "F", L, 5 * scores)] if drop else []),
             _bmm("core_attn.pv", "F", L, B, s, d, s)]
    # backward ops in forward order (layer_ops reverses them): executed as dP, dV,
    # dropout, softmax, dQ, dK
    b_ops = [_bmm("core_attn.dk", "B", L, B, s, d, s),
             _bmm("core_attn.dq", "B", L, B, s, d, s),
             _ew("core_attn.softmax", "B", L, 6 * scores),
             *([_ew("core_attn.dropout", "B", L, 5 * scores)] if drop else []),
             _bmm("core_attn.dv", "B", L, B, s, d, s),
             _bmm("core_attn.dp", "B", L, B, s, s, d)]
    ops.fwd.extend(f_ops)
    ops.bwd.extend(b_ops)


# -- MoE token counts --------------------------------------------------------------------------
def balanced_tokens_per_expert(model: ModelSpec, parallel: ParallelConfig, micro_batch_size: int | None = None,
                               seq_len: int | None = None) -> tuple[float, ...]:
    """Tokens each of this rank's ``E / ep`` local experts runs under perfectly balanced routing.

    ``etp * ep * (b s / cp / tp) * top_k / E`` per expert (see the module docstring); may be
    fractional (an average).
    """
    if model.moe is None:
        raise ConfigError("model.moe", None, "balanced_tokens_per_expert needs a mixture-of-experts model")
    sh = _shard(model, parallel, micro_batch_size, seq_len)
    moe, ep, etp = model.moe, parallel.ep, parallel.expert_tp
    if moe.num_experts % ep:
        raise ConfigError("parallel.ep", ep, f"must divide the number of experts ({moe.num_experts})")
    per_expert = etp * ep * (sh.T / sh.tp) * moe.top_k / moe.num_experts
    return (per_expert,) * (moe.num_experts // ep)


def capacity_tokens_per_expert(model: ModelSpec, parallel: ParallelConfig, micro_batch_size: int | None = None,
                               seq_len: int | None = None) -> tuple[float, ...]:
    """Tokens per local expert when inputs are padded to capacity (Megatron's
    ``--moe-pad-expert-input-to-capacity``): ``ceil(capacity_factor x balanced)``."""
    cf = model.moe.capacity_factor if model.moe is not None else None
    if cf is None:
        raise ConfigError("model.moe.capacity_factor", cf, "padding to capacity needs a capacity factor")
    bal = balanced_tokens_per_expert(model, parallel, micro_batch_size, seq_len)
    return tuple(float(math.ceil(cf * t)) for t in bal)


def padded_vocab_size(vocab_size: int, tp: int = 1, multiple: int = _VOCAB_MULTIPLE) -> int:
    """Megatron-LM's padded vocabulary: a multiple of ``multiple x tp``
    (``--make-vocab-size-divisible-by``, default 128)."""
    step = multiple * tp
    return -(-int(vocab_size) // step) * step


# -- one decoder layer -------------------------------------------------------------------------
_MODULE_OF = {
    # op name -> Megatron-Core --recompute-modules entry that recomputes it (selective)
    "attn_norm": "layernorm", "mlp_norm": "layernorm", "mamba_norm": "layernorm",
    "core_attn": "core_attn",
    "q_up_proj": "mla_up_proj", "kv_up_proj": "mla_up_proj", "q_norm": "mla_up_proj", "kv_norm": "mla_up_proj",
    "fc1": "mlp", "mlp_act": "mlp", "fc2": "mlp",
    "expert_act": "moe_act", "expert_clamp": "moe_act",
    "shared_fc1": "shared_experts", "shared_act": "shared_experts", "shared_fc2": "shared_experts",
}
_MOE_OPS = {"router", "router_topk", "moe_permute", "expert_fc1", "expert_clamp", "expert_act", "expert_fc2",
            "expert_bias", "moe_unpermute",
            "shared_fc1", "shared_act", "shared_fc2", "latent_down_proj", "latent_up_proj"}


def _selected_for_recompute(name: str, modules: tuple[str, ...]) -> bool:
    if _MODULE_OF.get(name.split(".")[0]) in modules:      # "core_attn.qk" belongs to core_attn
        return True
    return "moe" in modules and name in _MOE_OPS


def layer_ops(model: ModelSpec, parallel: ParallelConfig, layer_index: int, micro_batch_size: int | None = None,
              seq_len: int | None = None, *, tokens_per_expert: Sequence[float] | None = None,
              recompute: str | None = None, causal: bool = True,
              attn_block_size: int = ATTN_BLOCK_SIZE) -> list[ComputeOp]:
    """Compute ops of one decoder layer for one micro-batch on one rank.

    Parameters
    ----------
    model, parallel
        The model and the parallel layout (tp, cp, ep, etp, sequence parallelism,
        recomputation are read from it).
    layer_index
        0-based decoder layer; ``num_layers + j`` is MTP module ``j`` (its embedding
        lookup, norms, ``eh_proj``, a decoder layer shaped like the last main layer, its
        final norm, the shared output GEMM and its loss).
    micro_batch_size, seq_len
        Default: ``parallel.micro_batch_size`` and ``parallel.seq_len`` (else the model's).
    tokens_per_expert
        MoE layers: tokens each of this rank's ``E / ep`` local experts runs (padding
        included).  Default :func:`balanced_tokens_per_expert`.
    recompute
        ``none`` | ``selective`` | ``full`` for this layer; default ``parallel.recompute``.
    causal
        Causal self-attention (decoder training); False counts the full ``s^2`` work.
    attn_block_size
        FlashAttention tile used to count the executed causal diagonal blocks.

    Returns
    -------
    list[ComputeOp]
        Forward ops in execution order, then the backward: recomputed forward ops (if
        any, ``recompute=True``), the ``B`` ops in reverse order, then the ``W`` ops.
    """
    layer_index = _checked_layer_index(model, layer_index)
    mode = parallel.recompute if recompute is None else recompute
    if mode not in ("none", "selective", "full"):
        raise ConfigError("parallel.recompute", mode, "must be one of none, selective, full")
    sh = _shard(model, parallel, micro_batch_size, seq_len)
    is_mtp = layer_index >= model.num_layers
    moe_layer = model.is_moe_layer(model.num_layers - 1 if is_mtp else layer_index)

    L = layer_index
    ops = _LayerOps(L)
    kind = model.layer_kind(L)
    if is_mtp:
        _mtp_prologue(model, sh, L, ops)
    if kind in ("transformer", "attention"):
        _attention_block(model, sh, L, causal, attn_block_size, ops)
    elif kind == "mamba":
        _mamba_block(model, sh, L, ops)
    if kind == "moe" or (kind == "transformer" and moe_layer):
        _moe_block(model, parallel, sh, L, tokens_per_expert, ops)
    elif kind in ("transformer", "mlp"):
        _dense_mlp_block(model, sh, L, ops)
    if is_mtp:
        _mtp_epilogue(model, sh, L, ops)
    return ops.fwd + _recomputed(ops.fwd, mode, parallel.recompute_modules) + ops.bwd[::-1] + ops.wgt


class _LayerOps:
    """A layer's ops as its blocks add them: the forward ops in order (``fwd``), their
    ``B`` ops in forward order (``bwd``; :func:`layer_ops` reverses them) and the ``W``
    ops (``wgt``)."""

    def __init__(self, layer: int):
        self.layer = layer
        self.fwd: list[ComputeOp] = []
        self.bwd: list[ComputeOp] = []
        self.wgt: list[ComputeOp] = []

    def linear(self, name: str, m: int, n: int, k: int) -> None:
        """The F, B and W GEMMs of ``Y[m, n] = X[m, k] W[k, n]``."""
        self.fbw(*_linear(name, self.layer, m, n, k))

    def fbw(self, f: ComputeOp, b: ComputeOp, w: ComputeOp) -> None:
        self.fwd.append(f)
        self.bwd.append(b)
        self.wgt.append(w)

    def pair(self, pair: tuple[ComputeOp | None, ComputeOp | None]) -> None:
        """A forward op and its ``B`` op (either may be None)."""
        if pair[0] is not None:
            self.fwd.append(pair[0])
        if pair[1] is not None:
            self.bwd.append(pair[1])


def _checked_layer_index(model: ModelSpec, layer_index) -> int:
    """``layer_index`` as an int, if it names a decoder layer or an MTP module."""
    total = model.num_layers + model.mtp_layers
    if isinstance(layer_index, bool) or not isinstance(layer_index, numbers.Integral) \
            or not 0 <= layer_index < total:
        raise ConfigError("layer_index", layer_index, f"must be in [0, {total}) "
                                                      f"({model.num_layers} layers + {model.mtp_layers} MTP)")
    return int(layer_index)


def _recomputed(fwd: list[ComputeOp], mode: str, modules: tuple[str, ...]) -> list[ComputeOp]:
    """The forward ops re-run in the backward (phase ``B``, ``recompute=True``): all of them
    (``full``), those of the ``--recompute-modules`` (``selective``), or none."""
    if mode == "full":
        return [o._replace(phase="B", recompute=True) for o in fwd]
    if mode == "selective":
        return [o._replace(phase="B", recompute=True) for o in fwd if _selected_for_recompute(o.name, modules)]
    return []


def _dense_mlp_block(model: ModelSpec, sh: _Shard, L: int, ops: _LayerOps) -> None:
    """The dense MLP: norm, fc1 (gate and up fused for SwiGLU), activation, fc2, residual."""
    h = model.hidden_size
    ops.pair(_norm("mlp_norm", L, sh.Tn, h))
    m1 = 2 if model.mlp == "swiglu" else 1
    f_local = model.ffn_hidden_size / sh.tp
    ops.linear("fc1", sh.T, int(m1 * f_local), h)
    ops.pair(_activation("mlp_act", L, sh.T, int(f_local), model.mlp))
    ops.linear("fc2", sh.T, h, int(f_local))
    ops.pair(_residual("mlp_residual", L, sh.Tn, h, model.dropout))


def _attention_block(model: ModelSpec, sh: _Shard, L: int, causal: bool, block: int, ops: _LayerOps) -> None:
    """Attention: norm, QKV (or MLA's down and up projections), RoPE, core attention,
    output projection, residual."""
    h, tp, T, Tn = model.hidden_size, sh.tp, sh.T, sh.Tn
    heads = model.num_attention_heads // tp
    window = model.attention_window(L)       # None: full causal attention
    ops.pair(_norm("attn_norm", L, Tn, h))
    if model.mla is not None:
        m = model.mla
        rope_elems = T * (heads * m.qk_rope_head_dim + m.qk_rope_head_dim)
        if m.q_lora_rank is not None:
            ops.linear("q_down_proj", Tn, m.q_lora_rank, h)
            ops.pair(_norm("q_norm", L, Tn, m.q_lora_rank))
            ops.linear("q_up_proj", T, heads * m.qk_head_dim, m.q_lora_rank)
        else:
            ops.linear("q_proj", T, heads * m.qk_head_dim, h)
        ops.linear("kv_down_proj", Tn, m.kv_lora_rank + m.qk_rope_head_dim, h)
        ops.pair(_norm("kv_norm", L, Tn, m.kv_lora_rank))
        ops.linear("kv_up_proj", T, heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank)
        a = ACT_BYTES * rope_elems
        ops.pair(_ew_pair("rope", L, 2 * a, 2 * a, 2, 2))
        ops.pair(_attention("core_attn", L, sh, heads, heads, m.qk_head_dim, m.v_head_dim, causal, block, window))
        ops.linear("out_proj", T, h, heads * m.v_head_dim)
    else:
        d = model.head_dim
        kv = model.num_kv_heads
        kv_local = kv // tp if kv % tp == 0 else 1          # replicated KV heads when tp > kv
        ops.linear("qkv_proj", T, (heads + 2 * kv_local) * d, h)
        if model.qk_norm:
            a = ACT_BYTES * T * (heads + kv_local) * d
            ops.pair(_ew_pair("qk_norm", L, 2 * a, 3 * a, 2, 2))
        if model.position_embedding == "rope":
            a = ACT_BYTES * T * (heads + kv_local) * d      # rotate q and k in place: read + write
            if model.rope_mscale == 1.0:
                ops.pair(_ew_pair("rope", L, 2 * a, 2 * a, 2, 2))
            else:
                ops.pair(_unfused_rope(L, a))
        if model.flash_attention:
            ops.pair(_attention("core_attn", L, sh, heads, kv_local, d, d, causal, block, window))
        else:
            _unfused_attention(L, sh, heads, d, model.dropout, ops)
        ops.linear("out_proj", T, h, heads * d)
    ops.pair(_residual("attn_residual", L, Tn, h, model.dropout))


# Chunked SSD scan (mamba_ssm ``mamba_split_conv1d_scan_combined``, the training path of
# Megatron-Core's MambaMixer) costed kernel by kernel as the bytes its Triton kernels move; see
# mamba_scan_kernels and _mamba_block.
_SCAN_FP32 = _FP32

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
    a, f = ACT_BYTES, _SCAN_FP32
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


def _mamba_block(model: ModelSpec, sh: _Shard, L: int, ops: _LayerOps) -> None:
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
    mb, h, tp = model.mamba, model.hidden_size, sh.tp
    d = mb.d_inner // tp
    heads, groups = mb.num_heads // tp, mb.num_groups // tp
    T, Tn = sh.T, sh.Tn
    ops.pair(_norm("mamba_norm", L, Tn, h))
    width = mb.in_proj_width // tp
    ops.linear("in_proj", T, width, h)
    if sh.b > 1:
        ops.pair(_ew_pair("mamba_layout", L, 2 * ACT_BYTES * T * (width + d), 2 * ACT_BYTES * T * width, 2, 1))
    conv = ACT_BYTES * T * (d + 2 * groups * mb.state_dim)
    ops.pair(_ew_pair("conv1d", L, 2 * conv, 5 * conv, 1, 2))
    f, b = mamba_scan_bytes(T, d, heads, groups, mb.state_dim, mb.chunk_size)
    ops.pair(_ew_pair("ssd_scan", L, f, b, *MAMBA_SCAN_LAUNCHES))
    a = ACT_BYTES * T * d
    ops.pair(_ew_pair("gated_norm", L, 2 * a, 3 * a, 1, 2))
    ops.linear("mamba_out_proj", T, h, d)
    ops.pair(_residual("mamba_residual", L, Tn, h, model.dropout))


def _moe_block(model: ModelSpec, parallel: ParallelConfig, sh: _Shard, L: int, tokens_per_expert,
               ops: _LayerOps) -> None:
    """The MoE MLP: norm, router, permute, the local experts' grouped GEMMs, unpermute,
    shared experts, residual."""
    moe, h = model.moe, model.hidden_size
    ep, etp = parallel.ep, parallel.expert_tp
    if moe.num_experts % ep:
        raise ConfigError("parallel.ep", ep, f"must divide the number of experts ({moe.num_experts})")
    local = moe.num_experts // ep
    if tokens_per_expert is None:
        tokens = balanced_tokens_per_expert(model, parallel, sh.b, sh.s)
    else:
        tokens = tuple(tokens_per_expert)
        if len(tokens) != local or any(isinstance(t, bool) or not isinstance(t, numbers.Real) or t < 0
                                       for t in tokens):
            raise ConfigError("tokens_per_expert", list(tokens),
                              f"must be {local} non-negative numbers (experts per rank: {moe.num_experts} / ep {ep})")
    routed = float(sum(tokens))
    Tn, E, k = sh.Tn, moe.num_experts, moe.top_k
    m1 = 2 if model.mlp == "swiglu" else 1
    ops.pair(_norm("mlp_norm", L, Tn, h))
    ops.linear("router", Tn, E, h)
    # softmax / sigmoid, top-k, score normalisation and the load-balancing statistics, in FP32
    ops.pair(_ew_pair("router_topk", L, 3 * _FP32 * Tn * E, 2 * _FP32 * Tn * E, 5, 3))
    # permute: read the local tokens, write top_k copies sorted by expert; after the
    # all-to-all, sort the received chunks by local expert (read + write the routed tokens)
    # latent MoE: the routed tokens are projected down to the latent width before the
    # dispatch (replicated over TP, on this rank's Tn tokens) and back up after the combine
    w = moe.latent_size or h
    if moe.latent_size:
        ops.linear("latent_down_proj", Tn, w, h)
    perm = ACT_BYTES * w * (Tn * (1 + k) + 2 * routed)
    ops.pair(_ew_pair("moe_permute", L, perm, perm, 3, 3))
    fe = moe.expert_ffn_hidden_size / etp
    ops.fbw(*_grouped_linear("expert_fc1", L, tokens, int(m1 * fe), w))
    # Transformer Engine's op fuser (``use_transformer_engine_op_fuser``, TE >= 2.14) runs the
    # clamped GLU and the probability-scaled fc2 bias inside its fused expert ops
    # (moe/experts.py ``_is_fused_impl_supported``); Megatron-Core runs HybridEP's rank budget
    # only with it or grouped tensors (transformer_config.py), and Megatron-Bridge's recipes
    # that set the budget set the op fuser (perf_recipes/gpt_oss/common.py): taken as fused
    eager = moe.expert_rank_capacity_factor is None
    if model.activation_clamp is not None and eager:
        ops.pair(_expert_clamp(L, routed, int(fe)))
    ops.pair(_activation("expert_act", L, routed, int(fe), model.mlp))
    ops.fbw(*_grouped_linear("expert_fc2", L, tokens, w, int(fe)))
    if model.add_bias_linear and eager:
        ops.pair(_expert_bias(L, routed, w, len(tokens)))
    # unpermute: the reverse of permute, plus the probability-weighted sum of the top_k copies
    ops.pair(_ew_pair("moe_unpermute", L, perm, perm, 3, 3))
    if moe.latent_size:
        ops.linear("latent_up_proj", Tn, h, w)
    if moe.num_shared_experts:
        fs = moe.num_shared_experts * moe.shared_expert_ffn_hidden_size / sh.tp
        ops.linear("shared_fc1", sh.T, int(m1 * fs), h)
        ops.pair(_activation("shared_act", L, sh.T, int(fs), model.mlp))
        ops.linear("shared_fc2", sh.T, h, int(fs))
    ops.pair(_residual("mlp_residual", L, Tn, h, model.dropout))


def _unfused_rope(L: int, a: float) -> tuple[ComputeOp, ComputeOp]:
    """Megatron-Core's unfused RoPE (rope_utils.py ``_apply_rotary_pos_emb_bshd``), which runs
    when the tables carry a YaRN factor (``rope_mscale``), on q and k (``a`` bytes together):
    ``t * cos`` (read and write ``a``), ``_rotate_half`` (``-x2``: ``a``; ``cat``: ``2a``),
    ``* sin`` (``2a``), the sum (``3a``) and the final ``cat`` with the empty pass-through part
    (``2a``): ``12a`` in 6 kernels per tensor (the cos / sin tables are small).  Backward by
    autograd: the two products' gradients (``2a`` each), the negation's (``a``), the chunk's
    halves concatenated (``2a``) and the two paths summed (``3a``): ``10a`` in 5 per tensor."""
    return _ew_pair("rope", L, 12 * a, 10 * a, 12, 10)


def _expert_clamp(L: int, routed: float, width: int) -> tuple[ComputeOp, ComputeOp]:
    """The clamps ahead of the experts' gated activation (``activation_clamp``), as
    Megatron-Core runs them (megatron/core/fusions/fused_bias_geglu.py,
    ``weighted_bias_quick_geglu_impl``; the unfused ``glu`` of moe/experts.py the same): the
    fc1 output is chunked into its gate and linear halves (``a`` = routed tokens x width
    elements each), each half is clamped (read and write ``a``) and the two are concatenated
    (read and write ``2a``) before the fused activation kernel: ``8a`` in 3 kernels.  The
    backward, by PyTorch's ``clamp_backward`` (``where`` over comparison masks of one byte per
    element): the gate half ``le`` + ``where`` (``4a``, 2 kernels), the linear half ``ge``,
    ``le``, ``logical_and_``, ``where`` (``7a``, 4 kernels), then the two gradients
    concatenated for the chunk's input (``4a``, 1 kernel): ``15a`` in 7.  Under
    ``recompute_modules: [moe_act]`` the clamps are recomputed with the activation."""
    a = ACT_BYTES * routed * width
    return _ew_pair("expert_clamp", L, 8 * a, 15 * a, 3, 7)


def _expert_bias(L: int, routed: float, width: int, local_experts: int) -> tuple[ComputeOp, ComputeOp]:
    """The routed experts' fc2 bias, weighted by the routing probability, as Megatron-Core's
    ``TEGroupedMLP._apply_bias`` adds it (megatron/core/transformer/moe/experts.py; fc1's bias
    is added inside Transformer Engine's grouped GEMM): per local expert ``t + b * p`` over its
    tokens (``b * p`` writes ``c / E`` bytes, the add reads ``2 c / E`` and writes ``c / E``,
    ``c`` = routed tokens x width x 2 bytes), then ``torch.cat`` (read and write ``c``): ``6c``
    in ``2 E + 1`` kernels.  Backward: the bias gradient ``sum(grad * p)`` and the probability
    gradient ``sum(grad * b)`` (a product and a reduction each, ``3c`` each) per expert, and
    the split's gradient concatenated (``2c``): ``8c`` in ``4 E + 1``."""
    c = ACT_BYTES * routed * width
    return _ew_pair("expert_bias", L, 6 * c, 8 * c, 2 * local_experts + 1, 4 * local_experts + 1)


def _mtp_prologue(model: ModelSpec, sh: _Shard, L: int, ops: _LayerOps) -> None:
    """An MTP module's input: embedding of the shifted tokens, its two norms, ``eh_proj``."""
    h = model.hidden_size
    # embedding of the shifted tokens (shared table; its gradient is a W-phase scatter-add)
    ops.fwd.append(_ew("mtp_embedding", "F", L, ACT_BYTES * h * (sh.T / sh.tp + sh.T), 2))
    ops.wgt.append(_ew("mtp_embedding", "W", L, ACT_BYTES * sh.T * h + 2 * _FP32 * sh.T * h / sh.tp, 4))
    for name in ("mtp_enorm", "mtp_hnorm"):
        ops.pair(_norm(name, L, sh.Tn, h))
    ops.fbw(*_linear("mtp_eh_proj", L, sh.T, h // sh.tp, 2 * h))


def _mtp_epilogue(model: ModelSpec, sh: _Shard, L: int, ops: _LayerOps) -> None:
    """An MTP module's output: final norm, the shared output GEMM and its loss."""
    ops.pair(_norm("mtp_final_norm", L, sh.Tn, model.hidden_size))
    f_ops, b_ops, w_ops = _output_and_loss(model, sh, L, "mtp_output_gemm", "mtp_cross_entropy", None, False)
    ops.fwd.extend(f_ops)
    ops.bwd.extend(b_ops)
    ops.wgt.extend(w_ops)


def _output_and_loss(model: ModelSpec, sh: _Shard, L: int, gemm_name: str, ce_name: str, vocab_size,
                     fused_ce: bool) -> tuple[list[ComputeOp], list[ComputeOp], list[ComputeOp]]:
    """(F ops, B ops in forward order, W ops) of the output GEMM and its loss."""
    vp = padded_vocab_size(model.vocab_size if vocab_size is None else vocab_size, sh.tp)
    f, b, w = _linear(gemm_name, L, sh.T, vp // sh.tp, model.hidden_size)
    logits = sh.T * vp / sh.tp
    fb, bb = _CE_BYTES_PER_LOGIT[fused_ce]
    kf, kb = _CE_KERNELS[fused_ce]
    return ([f, _ew(ce_name, "F", L, fb * logits, kf)], [b, _ew(ce_name, "B", L, bb * logits, kb)], [w])


# -- embedding, output layer, optimizer ----------------------------------------------------------
def embedding_ops(model: ModelSpec, parallel: ParallelConfig, micro_batch_size: int | None = None,
                  seq_len: int | None = None) -> list[ComputeOp]:
    """The input embedding of the first stage: a vocabulary-parallel gather, no GEMM FLOPs.

    ``F``: each TP rank reads the rows of its vocabulary shard and writes the full
    ``T x h`` output (zeros elsewhere; the TP reduction is communication).  ``W``: the
    weight gradient is a scatter-add of ``dY`` into the FP32 main grad of the shard.
    Learned positions add a table read and an add.
    """
    sh = _shard(model, parallel, micro_batch_size, seq_len)
    h, T, tp = model.hidden_size, sh.T, sh.tp
    f_bytes = ACT_BYTES * h * (T / tp + T) + 8 * T          # rows, output, int64 token ids
    w_bytes = ACT_BYTES * T * h + 2 * _FP32 * T * h / tp
    if model.position_embedding == "learned":
        f_bytes += 2 * ACT_BYTES * T * h
        w_bytes += ACT_BYTES * T * h + 2 * _FP32 * T * h
    return [_ew("embedding", "F", -1, f_bytes, 2), _ew("embedding", "W", -1, w_bytes, 4)]


def output_ops(model: ModelSpec, parallel: ParallelConfig, micro_batch_size: int | None = None,
               seq_len: int | None = None, *, vocab_size: int | None = None,
               fused_cross_entropy: bool = False) -> list[ComputeOp]:
    """The last stage's final norm, output GEMM (logits) and cross-entropy loss.

    The output GEMM is vocabulary-parallel over ``Vp / tp`` columns, ``Vp`` the vocabulary
    padded to a multiple of ``128 x tp`` as Megatron-LM does (``vocab_size`` overrides
    the model's before padding).  ``fused_cross_entropy`` selects Megatron's
    ``--cross-entropy-loss-fusion`` (off by default, as in Megatron-LM).
    """
    sh = _shard(model, parallel, micro_batch_size, seq_len)
    f, b = _norm("final_norm", -1, sh.Tn, model.hidden_size)
    f_ops, b_ops, w_ops = _output_and_loss(model, sh, -1, "output_gemm", "cross_entropy", vocab_size,
                                           fused_cross_entropy)
    # F: norm, GEMM, loss; B in reverse: loss, GEMM, norm; then W
    return [f, *f_ops, *b_ops[::-1], b, *w_ops]


def optimizer_ops(num_params: float) -> list[ComputeOp]:
    """Gradient-norm pass and the Adam step over ``num_params`` local (sharded) parameters.

    Both memory-bound, phase ``W`` (after the last backward): 4 bytes/param for the norm,
    30 bytes/param for Adam with FP32 master weights and moments and a BF16 model copy
    (see ``_ADAM_BYTES_PER_PARAM``).
    """
    if isinstance(num_params, bool) or not isinstance(num_params, numbers.Real) or num_params < 0:
        raise ConfigError("num_params", num_params, "must be a non-negative number")
    return [_ew("grad_norm", "W", -1, _GRAD_NORM_BYTES_PER_PARAM * num_params, 2),
            _ew("optimizer_step", "W", -1, _ADAM_BYTES_PER_PARAM * num_params, 2)]


# -- model FLOPs by convention -------------------------------------------------------------------
def _mlp_matrices(model: ModelSpec) -> int:
    return 3 if model.mlp == "swiglu" else 2


def _moe_widths(model: ModelSpec) -> tuple[float, float]:
    """(routed width top_k x fe, shared width S x fs) of a MoE layer's MLPs per token."""
    moe = model.moe
    return moe.top_k * moe.expert_ffn_hidden_size, moe.num_shared_experts * moe.shared_expert_ffn_hidden_size


def megatron_core_2025(model: ModelSpec, seq_len: int, vocab_size: int | None = None) -> float:
    """Model FLOPs per sequence, Megatron-Core's count (default convention).

    Source: NVIDIA/Megatron-LM ``megatron/training/training.py``,
    ``num_floating_point_operations`` (``transformer_flops``), 2025: every GEMM counted
    three times (forward, dgrad, wgrad) at ``2 M N K``.  Per token, with ``q = H d``,
    ``g = K d``, ``m`` = 3 (swiglu) or 2 (gelu)::

        attention (GQA)  6 [ h (q + 2g)  +  q s / 2 * 2  +  q h ]        causal half of QK^T and PV
        attention (MLA)  6 [ q_lora (h + H (nope + rope) + 1)             (or h H (nope + rope))
                             + kv_lora (h + H (nope + v) + 1) + h rope
                             + H v h  +  s H (nope + rope) / 2  +  s H v / 2 ]
        dense MLP        6 m h f
        MoE MLP          6 m h (top_k fe + S fs)                          routed top-k + shared experts
        MTP module j     one more layer shaped like the last one, plus 6 (3h + 2h^2)
        logits           6 h V (1 + mtp_layers)

    The ``+ 1`` terms are Megatron's count of the MLA latent norms.  Not counted (as in
    Megatron): the router GEMM, norms, element-wise ops, FlashAttention's backward
    recomputation of ``Q K^T``.

    Sliding-window layers (:meth:`ModelSpec.attention_window` ``= w < s``) replace the
    ``s / 2`` keys per query of the two core-attention terms by the mean number of keys a
    query attends to under the window, ``(w (w + 1) / 2 + (s - w) w) / s``: the useful
    work of the layer (gpt-oss-120b at s = 4096, w = 128: 126.0 keys instead of 2048).
    This is our extension; Megatron-LM's own count may ignore windows and count every
    layer causally, so MFU quoted from a windowed model's Megatron run may be higher than
    this convention's.  A window ``w >= s`` is no window (``s / 2``).  Earlier Megatron-LM versions (2024) counted the full
    ``s^2`` attention (the :func:`nemo_24` form); the causal halving is what names this
    convention.  ``V`` is ``vocab_size`` if given, else the model's (Megatron uses its
    padded vocabulary).
    """
    if model.is_hybrid:
        return _megatron_hybrid(model, seq_len, vocab_size)
    h, s, L = model.hidden_size, seq_len, model.num_layers
    V = model.vocab_size if vocab_size is None else vocab_size
    mtp = model.mtp_layers
    H = model.num_attention_heads
    if model.mla is not None:
        m = model.mla
        qk = m.qk_head_dim          # Megatron's qk_head_dim + qk_pos_emb_head_dim
        q_term = (m.q_lora_rank * (h + H * qk + 1)) if m.q_lora_rank is not None else h * H * qk
        attn = 6 * (q_term + m.kv_lora_rank * (h + H * (m.qk_nope_head_dim + m.v_head_dim) + 1)
                    + h * m.qk_rope_head_dim + H * m.v_head_dim * h
                    + s * H * qk / 2 + s * H * m.v_head_dim / 2)
    else:
        q, g = model.head_dim * H, model.head_dim * model.num_kv_heads
        attn = 6 * (h * (q + 2 * g) + q * s / 2 * 2 + q * h)
    # sliding-window layers: the two core-attention terms (QK^T with q_k = H d_qk, PV with
    # q_v = H d_v; 6 x 2 ... per key) see kbar keys per query instead of s / 2
    window_terms = 0.0
    if model.sliding_window is not None and model.sliding_window < s:
        w = model.sliding_window
        kbar = (w * (w + 1) / 2 + (s - w) * w) / s
        qkv_width = H * (m.qk_head_dim + m.v_head_dim) if model.mla is not None else 2 * model.head_dim * H
        n_windowed = sum(model.attention_window(i) is not None for i in range(L + mtp))
        window_terms = 6 * qkv_width * (kbar - s / 2) * n_windowed
    mm = _mlp_matrices(model)
    n_moe = model.num_moe_layers()
    n_dense = L - n_moe
    if mtp:
        if model.is_moe_layer(L - 1):
            n_moe += mtp
        else:
            n_dense += mtp
    mlp = 6 * mm * h * model.ffn_hidden_size * n_dense
    if n_moe:
        routed, shared = _moe_widths(model)
        mlp += 6 * mm * h * (routed + shared) * n_moe
    per_token = mlp + attn * (L + mtp) + 6 * mtp * (3 * h + 2 * h * h) + 6 * h * V * (1 + mtp)
    if window_terms:
        per_token += window_terms
    return float(per_token * s)


def _megatron_hybrid(model: ModelSpec, seq_len: int, vocab_size: int | None) -> float:
    """Megatron-Core's count for a hybrid model, per sequence (``megatron_core_2025`` of a
    model with ``hybrid_override_pattern``).

    Source: NVIDIA/Megatron-LM ``megatron/training/training.py``,
    ``num_floating_point_operations`` -> ``hybrid_flops`` (2026), which counts each layer by
    its symbol and multiplies the forward by 3.  Per token, forward::

        Mamba      2 h (2 D + 2 G N + nh)  +  7 D N  +  2 D h        D = 2 h (Megatron's
                   in_proj, scan, out_proj                           estimate, not nh x hd)
        attention  4 h p (h + h K / H)  +  2 s h p                   p = H d / h
        MLP        4 h f (x 3/2 for swiglu)
        MoE        4 h fe k (latent: 4 latent fe k + 4 h latent)  +  4 h S fs   (x 3/2 swiglu)
        logits     2 h V (1 + mtp_layers)

    Megatron documents the scan's ``7 D N`` as an estimate; ``D = 2 h`` is its assumption of
    the usual expand factor 2 (Nemotron 3 Nano's Mamba width is 4096, not 2 h = 5376).  MTP
    modules add only their logits; routers, norms and latent norms are not counted.
    """
    h, s = model.hidden_size, seq_len
    V = model.vocab_size if vocab_size is None else vocab_size
    counts = model.hybrid_layer_counts()
    per_token = 0.0
    if counts["mamba"]:
        mb = model.mamba
        d_in = 2 * h
        per_token += counts["mamba"] * (2 * h * (2 * d_in + 2 * mb.num_groups * mb.state_dim + mb.num_heads)
                                        + 7 * d_in * mb.state_dim + 2 * d_in * h)
    if counts["attention"]:
        H, K = model.num_attention_heads, model.num_kv_heads
        p = model.head_dim * H / h
        per_token += counts["attention"] * (4 * h * p * (h + h * K / H) + 2 * s * h * p)
    scale = 1.5 if model.mlp == "swiglu" else 1.0
    if counts["mlp"]:
        per_token += counts["mlp"] * 4 * h * model.ffn_hidden_size * scale
    if counts["moe"]:
        moe = model.moe
        lat = moe.latent_size
        routed = (4 * (lat or h) * moe.expert_ffn_hidden_size * moe.top_k * scale
                  + (4 * h * lat if lat else 0))
        shared = 4 * h * moe.num_shared_experts * moe.shared_expert_ffn_hidden_size * scale
        per_token += counts["moe"] * (routed + shared)
    per_token += 2 * h * V * (1 + model.mtp_layers)
    return float(3 * per_token * s)


def nemo_24(model: ModelSpec, seq_len: int, vocab_size: int | None = None) -> float:
    """Model FLOPs per sequence, the NeMo / DGX Cloud benchmark formula (no causal halving).

    Source: NVIDIA NeMo ``flops_formulas.py`` for gpt3 / llama / mixtral (the formula
    behind the MFU column of ``experiments/reference/published_runs_h100.csv``).  Per token::

        12 L h^2 (1 + K/H + s/h)  +  6 m L h f  +  6 V h

    with ``m f`` = 18 f for SwiGLU (3 matrices), 12 f for GELU (2), and in MoE layers
    ``f`` = ``top_k fe + S fs`` (NeMo's mixtral form).  The attention term assumes
    ``H d = h`` and counts the full ``s^2`` score work.  Check: GPT-3 175B (vocab 51,200,
    s = 2048) gives 2.2047e15 per sequence, the ``GBS x 2.20e15`` of the published MFU
    notes.  MLA is not covered by this formula (ConfigError); MTP modules are ignored, and so
    are sliding windows (every layer counts the full ``s^2``).
    """
    if model.mla is not None:
        raise ConfigError("flop_convention", "nemo_24", "defines no count for multi-head latent attention; "
                                                         "use megatron_core_2025")
    if model.is_hybrid:
        raise ConfigError("flop_convention", "nemo_24", "defines no count for hybrid (Mamba) stacks; "
                                                         "use megatron_core_2025")
    h, s, L = model.hidden_size, seq_len, model.num_layers
    V = model.vocab_size if vocab_size is None else vocab_size
    H, K = model.num_attention_heads, model.num_kv_heads
    mm = _mlp_matrices(model)
    n_moe = model.num_moe_layers()
    width = model.ffn_hidden_size * (L - n_moe)
    if n_moe:
        width += sum(_moe_widths(model)) * n_moe
    per_token = 12 * L * h * h * (1 + K / H + s / h) + 6 * mm * h * width + 6 * V * h
    return float(per_token * s)


def megatron_2021(model: ModelSpec, seq_len: int, vocab_size: int | None = None) -> float:
    """Model FLOPs per sequence, Narayanan et al. (SC'21) for GPT without recomputation.

    ``72 s L h^2 (1 + s / (6h) + V / (12 h L))`` per sequence: the transformer term of the
    paper's count (forward, dgrad, wgrad; MHA; a 4h GELU MLP; full ``s^2`` attention)
    plus the logits, ``6 s h V``.  It is the paper's eq. (3) (:func:`narayanan_eq3`)
    without the recomputed forward pass (96 -> 72 on the transformer part; the logits,
    never recomputed, stay ``6 s h V``).  Architecture-blind: it sees only ``h, L, s, V``
    (GQA, SwiGLU, MoE, MLA and sliding windows are not reflected).
    """
    h, s, L = model.hidden_size, seq_len, model.num_layers
    V = model.vocab_size if vocab_size is None else vocab_size
    return float(72 * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L)))


def narayanan_eq3(model: ModelSpec, seq_len: int, vocab_size: int | None = None) -> float:
    """Model FLOPs per sequence, Narayanan et al. (SC'21, arXiv:2104.04473) eq. (3).

    ``96 s L h^2 (1 + s / (6h) + V / (16 L h))``: the GPT count *with* full activation
    recomputation (an extra forward pass of every layer), which the paper uses for its
    reported TFLOP/s.  Architecture-blind like :func:`megatron_2021` (sliding windows
    ignored).
    """
    h, s, L = model.hidden_size, seq_len, model.num_layers
    V = model.vocab_size if vocab_size is None else vocab_size
    return float(96 * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h)))


def palm_6n(model: ModelSpec, seq_len: int, vocab_size: int | None = None) -> float:
    """Model FLOPs per sequence, PaLM's ``6 N + 12 L H Q T`` per token.

    Source: Chowdhery et al., PaLM (arXiv:2204.02311), Appendix B (MFU definition):
    ``6N`` for the parameter matmuls plus ``12 L H Q T`` for attention (``H`` heads of
    dimension ``Q``, ``T`` the sequence length; QK^T and PV, forward and backward,
    without causal halving).  We keep PaLM's full attention term (the brief's
    ``6 L h s`` would be its causal half; we follow the paper so numbers compare with
    PaLM-style reports).  ``N`` = active parameters without the input embedding
    (:meth:`ModelSpec.num_active_params` with ``include_embedding=False``: dense parts,
    router, shared and ``top_k`` routed experts, the output layer; MTP excluded).  With
    ``d_qk != d_v`` (MLA) the attention term is ``6 L H (d_qk + d_v) s``.  Sliding windows
    are ignored: every layer keeps PaLM's full ``s`` keys per query.  In a hybrid stack only
    the attention layers count the attention term.
    """
    s, L = seq_len, model.num_layers
    if model.is_hybrid:                 # only the attention layers of a hybrid stack attend
        L = model.hybrid_layer_counts()["attention"]
    n = model.num_active_params(include_embedding=False)
    if vocab_size is not None:
        n += (vocab_size - model.vocab_size) * model.hidden_size
    if model.mla is not None:
        dsum = model.mla.qk_head_dim + model.mla.v_head_dim
    else:
        dsum = 2 * model.head_dim
    per_token = 6 * n + 6 * L * model.num_attention_heads * dsum * s
    return float(per_token * s)


FLOP_CONVENTIONS: dict[str, Callable[[ModelSpec, int, int | None], float]] = {
    "megatron_core_2025": megatron_core_2025,
    "megatron_2021": megatron_2021,
    "narayanan_eq3": narayanan_eq3,
    "nemo_24": nemo_24,
    "palm_6n": palm_6n,
}
"""Model-FLOP conventions: ``name -> f(model, seq_len, vocab_size=None) -> FLOPs per
sequence`` (forward + backward).  Each function's docstring gives its formula and source."""

DEFAULT_FLOP_CONVENTION = "megatron_core_2025"


def get_flop_convention(name: str) -> Callable[[ModelSpec, int, int | None], float]:
    """The convention function registered under ``name``; ConfigError lists the names."""
    try:
        return FLOP_CONVENTIONS[name]
    except (KeyError, TypeError):
        raise ConfigError("flop_convention", name, f"unknown; known: {', '.join(FLOP_CONVENTIONS)}") from None


def model_flops_per_step(model: ModelSpec, global_batch_size: int, seq_len: int | None = None,
                         convention: str = DEFAULT_FLOP_CONVENTION, *, vocab_size: int | None = None) -> float:
    """Model FLOPs of one optimizer step: ``global_batch_size`` sequences of ``seq_len``.

    Parameters
    ----------
    model
        The model.
    global_batch_size
        Sequences per step over all replicas.
    seq_len
        Tokens per sequence; default the model's.
    convention
        A key of :data:`FLOP_CONVENTIONS` (default ``megatron_core_2025``).
    vocab_size
        Vocabulary used for the logits term instead of the model's (e.g. Megatron's
        padded size; GPT-3's 51,200 in NVIDIA's published MFU notes).

    Returns
    -------
    float
        FLOPs (forward + backward) per step.
    """
    gbs = _positive_int("parallel.global_batch_size", global_batch_size)
    s = _positive_int("parallel.seq_len", model.seq_len if seq_len is None else seq_len)
    if vocab_size is not None:
        vocab_size = _positive_int("model.vocab_size", vocab_size)
    return gbs * get_flop_convention(convention)(model, s, vocab_size)


def model_flops_per_token(model: ModelSpec, seq_len: int | None = None,
                          convention: str = DEFAULT_FLOP_CONVENTION, *, vocab_size: int | None = None) -> float:
    """Model FLOPs per trained token (forward + backward) under ``convention``."""
    s = _positive_int("parallel.seq_len", model.seq_len if seq_len is None else seq_len)
    return model_flops_per_step(model, 1, s, convention, vocab_size=vocab_size) / s
