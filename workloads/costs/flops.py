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

import numbers
from collections.abc import Callable, Iterable, Sequence

from topologies import ConfigError
from topologies.constants import value as active_value

from ..blocks import KernelArgs, LayerOps, layer_blocks, selected_for_recompute
from ..blocks.edges import embedding_kernels, output_and_loss, padded_vocab_size
from ..blocks.fusion import MEGATRON_TE, Fusion
from ..blocks.kernels import (ACT_BYTES, ATTN_BLOCK_SIZE, EXPERT_GROUPED_LINEARS, ComputeOp, causal_executed_fraction,
                              ew, gemm_role, norm, window_executed_fraction)
from ..blocks.shard import positive_int as _positive_int
from ..blocks.shard import shard as _shard
from ..blocks.mamba import MAMBA_SCAN_LAUNCHES, check_mamba_split, mamba_scan_bytes, mamba_scan_kernels
from ..blocks.moe import balanced_tokens_per_expert, capacity_tokens_per_expert, routed_expert_part
from ..blocks.mtp import mtp_epilogue, mtp_prologue
from ..model import ModelSpec
from ..parallel import ParallelConfig

__all__ = ["ComputeOp", "EXPERT_GROUPED_LINEARS", "OP_CLASSES", "PHASES", "GEMM_ROLES", "ACT_BYTES", "ATTN_BLOCK_SIZE",
           "layer_ops", "layer_load_ops", "embedding_ops", "mamba_scan_bytes", "mamba_scan_kernels", "MAMBA_SCAN_LAUNCHES", "check_mamba_split", "output_ops", "optimizer_ops", "OPTIMIZER_IMPLEMENTATIONS", "gemm_role", "sum_flops",
           "balanced_tokens_per_expert", "capacity_tokens_per_expert", "padded_vocab_size",
           "causal_executed_fraction", "window_executed_fraction", "FLOP_CONVENTIONS", "DEFAULT_FLOP_CONVENTION",
           "get_flop_convention", "model_flops_per_step", "model_flops_per_token", "routed_expert_flops_per_step"]

OP_CLASSES = ("gemm", "attention", "elementwise")
PHASES = ("F", "B", "W")
GEMM_ROLES = ("fprop", "dgrad", "wgrad")

# Adam step with FP32 master weights and moments (Megatron's distributed optimizer, a
# multi-tensor fused kernel): read grad, master, exp_avg, exp_avg_sq (4 x 4 B), write
# master and both moments (3 x 4 B) and the BF16 model copy (2 B).
_ADAM_BYTES_PER_PARAM = 4 * 4 + 3 * 4 + 2
_F = "workloads.costs.flops."   # the prefix of this module's constants (topologies.constants)
# Gradient-norm pass (multi_tensor_l2norm) reads the FP32 grads once.
_GRAD_NORM_BYTES_PER_PARAM = 4
# torch.optim.AdamW(fused=True) (torch/optim/adam.py _fused_adam -> torch._fused_adam_, one
# multi-tensor kernel) over FP32 parameters: read param, grad, exp_avg, exp_avg_sq (4 x 4 B),
# write param, exp_avg, exp_avg_sq (3 x 4 B).  torchtitan's default (optimizer.implementation
# = "fused", torchtitan/config/job_config.py@v0.2.2); FSDP2's sharded parameters are the FP32
# master copy, so no BF16 copy is written here (FSDP2's all-gather copy-in casts).
_FUSED_ADAMW_BYTES_PER_PARAM = 4 * 4 + 3 * 4
# torch.optim.AdamW's default on CUDA is foreach (torch/optim/optimizer.py
# _default_to_fused_or_foreach: fused stays off unless asked for): torch/optim/adam.py
# _multi_tensor_adam, non-capturable branch, decoupled weight decay -- each _foreach_* op one
# pass (one multi_tensor_apply launch per tensor chunk) over FP32 tensors, bytes per parameter:
_FOREACH_ADAMW_PASSES = {
    "_foreach_mul_(params, 1 - lr * wd)": 8,              # read and write the parameter
    "_foreach_lerp_(exp_avgs, grads, 1 - beta1)": 12,     # read exp_avg, grad; write exp_avg
    "_foreach_mul_(exp_avg_sqs, beta2)": 8,
    "_foreach_addcmul_(exp_avg_sqs, grads, grads)": 12,   # read exp_avg_sq, grad; write exp_avg_sq
    "_foreach_sqrt(exp_avg_sqs)": 8,                      # a new tensor
    "_foreach_div_(sqrt, bias_correction2_sqrt)": 8,
    "_foreach_add_(sqrt, eps)": 8,
    "_foreach_addcdiv_(params, exp_avgs, sqrt, step)": 16,  # read param, exp_avg, denominator; write param
}
#: The optimizer steps :func:`optimizer_ops` costs (a kernel stack's ``Fusion.optimizer``).
OPTIMIZER_IMPLEMENTATIONS = ("megatron", "torch_fused", "torch_foreach")


def sum_flops(ops: Iterable[ComputeOp], phase: str | None = None, op_class: str | None = None,
              recompute: bool | None = None) -> float:
    """Total FLOPs of ``ops``, optionally only one phase / class / recompute flag."""
    return float(sum(o.flops for o in ops if (phase is None or o.phase == phase)
                     and (op_class is None or o.op_class == op_class)
                     and (recompute is None or o.recompute == recompute)))



def layer_ops(model: ModelSpec, parallel: ParallelConfig, layer_index: int, micro_batch_size: int | None = None,
              seq_len: int | None = None, *, tokens_per_expert: Sequence[float] | None = None,
              recompute: str | None = None, causal: bool = True,
              attn_block_size: int | None = None, fusion: Fusion = MEGATRON_TE) -> list[ComputeOp]:
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
        FlashAttention tile used to count the executed causal diagonal blocks (None: the
        active ``ATTN_BLOCK_SIZE``, :mod:`topologies.constants`).
    fusion
        The framework's kernel-level choices (:class:`workloads.blocks.fusion.Fusion`; default
        Megatron-Core with Transformer Engine).

    Returns
    -------
    list[ComputeOp]
        Forward ops in execution order, then the backward: recomputed forward ops (if
        any, ``recompute=True``), the ``B`` ops in reverse order, then the ``W`` ops.
    """
    layer_index, mode, sh, blocks, args = _layer_setup(model, parallel, layer_index, micro_batch_size, seq_len,
                                                       tokens_per_expert, recompute, causal, attn_block_size, fusion)
    is_mtp = layer_index >= model.num_layers
    ops = LayerOps(layer_index)
    if is_mtp:
        mtp_prologue(model, sh, layer_index, ops)
    for block in blocks:
        block.add_kernels(ops, sh, args)
    if is_mtp:
        mtp_epilogue(model, sh, layer_index, ops)
    recomputed = _recomputed(ops.fwd, mode, parallel.recompute_modules, blocks)
    return ops.fwd + recomputed + ops.bwd[::-1] + ops.wgt


def layer_load_ops(model: ModelSpec, parallel: ParallelConfig, layer_index: int, micro_batch_size: int | None = None,
                   seq_len: int | None = None, *, tokens_per_expert: Sequence[float] | None = None,
                   recompute: str | None = None, causal: bool = True,
                   attn_block_size: int | None = None, fusion: Fusion = MEGATRON_TE) -> list[ComputeOp]:
    """The ops of :func:`layer_ops` (same arguments) whose shape depends on ``tokens_per_expert``
    (the blocks' :meth:`~workloads.blocks.Block.add_load_kernels`: an MoE block's permutation,
    grouped GEMMs and what runs between them), in the order :func:`layer_ops` lists them; the
    other ops of the layer are the same whatever the load.

    >>> from workloads import load_model
    >>> from workloads.parallel import ParallelConfig
    >>> m, par = load_model("tiny-moe"), ParallelConfig(ep=2)
    >>> full = layer_ops(m, par, 0, tokens_per_expert=(5, 0))
    >>> load = layer_load_ops(m, par, 0, tokens_per_expert=(5, 0))
    >>> [o for o in full if o.name in {o.name for o in load}] == load
    True
    """
    layer_index, mode, sh, blocks, args = _layer_setup(model, parallel, layer_index, micro_batch_size, seq_len,
                                                       tokens_per_expert, recompute, causal, attn_block_size, fusion)
    ops = LayerOps(layer_index)
    for block in blocks:
        block.add_load_kernels(ops, sh, args)
    recomputed = _recomputed(ops.fwd, mode, parallel.recompute_modules, blocks)
    return ops.fwd + recomputed + ops.bwd[::-1] + ops.wgt


def _layer_setup(model, parallel, layer_index, micro_batch_size, seq_len, tokens_per_expert, recompute, causal,
                 attn_block_size, fusion) -> tuple:
    """(layer index, recompute mode, shard, blocks, kernel arguments) of :func:`layer_ops`."""
    layer_index = _checked_layer_index(model, layer_index)
    mode = parallel.recompute if recompute is None else recompute
    if mode not in ("none", "selective", "full"):
        raise ConfigError("parallel.recompute", mode, "must be one of none, selective, full")
    sh = _shard(model, parallel, micro_batch_size, seq_len)
    blocks = layer_blocks(model, layer_index)
    if attn_block_size is None:
        attn_block_size = active_value("workloads.blocks.kernels.ATTN_BLOCK_SIZE", ATTN_BLOCK_SIZE)
    return layer_index, mode, sh, blocks, KernelArgs(parallel, tokens_per_expert, causal, attn_block_size, fusion)


def _checked_layer_index(model: ModelSpec, layer_index) -> int:
    """``layer_index`` as an int, if it names a decoder layer or an MTP module."""
    total = model.num_layers + model.mtp_layers
    if isinstance(layer_index, bool) or not isinstance(layer_index, numbers.Integral) \
            or not 0 <= layer_index < total:
        raise ConfigError("layer_index", layer_index, f"must be in [0, {total}) "
                                                      f"({model.num_layers} layers + {model.mtp_layers} MTP)")
    return int(layer_index)


def _recomputed(fwd: list[ComputeOp], mode: str, modules: tuple[str, ...], blocks) -> list[ComputeOp]:
    """The forward ops re-run in the backward (phase ``B``, ``recompute=True``): all of them
    (``full``), those of the ``--recompute-modules`` (``selective``), or none."""
    if mode == "full":
        return [o._replace(phase="B", recompute=True) for o in fwd]
    if mode == "selective":
        return [o._replace(phase="B", recompute=True) for o in fwd
                if selected_for_recompute(o.name, modules, blocks)]
    return []


# -- embedding, output layer, optimizer ----------------------------------------------------------
def embedding_ops(model: ModelSpec, parallel: ParallelConfig, micro_batch_size: int | None = None,
                  seq_len: int | None = None) -> list[ComputeOp]:
    """The input embedding of the first stage (:func:`workloads.blocks.edges.embedding_kernels`)."""
    return embedding_kernels(model, _shard(model, parallel, micro_batch_size, seq_len))


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
    f, b = norm("final_norm", -1, sh.Tn, model.hidden_size)
    f_ops, b_ops, w_ops = output_and_loss(model, sh, -1, "output_gemm", "cross_entropy", vocab_size,
                                           fused_cross_entropy)
    # F: norm, GEMM, loss; B in reverse: loss, GEMM, norm; then W
    # F: norm, GEMM, loss; B in reverse: loss, GEMM, norm; then W
    return [f, *f_ops, *b_ops[::-1], b, *w_ops]


def optimizer_ops(num_params: float, implementation: str = "megatron") -> list[ComputeOp]:
    """Gradient-norm pass and the Adam step over ``num_params`` local (sharded) parameters.

    Both memory-bound, phase ``W`` (after the last backward): 4 bytes/param for the norm, and
    for the step (``implementation``, :data:`OPTIMIZER_IMPLEMENTATIONS`):

    * ``megatron``: 30 bytes/param, Megatron's fused multi-tensor Adam with FP32 master
      weights and moments and a BF16 model copy (``_ADAM_BYTES_PER_PARAM``);
    * ``torch_fused``: ``torch.optim.AdamW(fused=True)`` over FSDP2's FP32 sharded parameters
      (torchtitan's default): one multi-tensor kernel, 28 bytes/param (no BF16 copy: FSDP2
      casts in its all-gather copy-in);
    * ``torch_foreach``: ``torch.optim.AdamW``'s default on CUDA, eight ``_foreach_*`` ops,
      80 bytes/param (``_FOREACH_ADAMW_PASSES``).
    """
    if isinstance(num_params, bool) or not isinstance(num_params, numbers.Real) or num_params < 0:
        raise ConfigError("num_params", num_params, "must be a non-negative number")
    if implementation not in OPTIMIZER_IMPLEMENTATIONS:
        raise ConfigError("optimizer implementation", implementation,
                          f"must be one of {', '.join(OPTIMIZER_IMPLEMENTATIONS)}")
    norm_op = ew("grad_norm", "W", -1, _GRAD_NORM_BYTES_PER_PARAM * num_params, 2)
    if implementation == "torch_fused":
        return [norm_op, ew("optimizer_step", "W", -1, _FUSED_ADAMW_BYTES_PER_PARAM * num_params, 1)]
    if implementation == "torch_foreach":
        return [norm_op, ew("optimizer_step", "W", -1, sum(_FOREACH_ADAMW_PASSES.values()) * num_params,
                            len(_FOREACH_ADAMW_PASSES))]
    return [norm_op,
            ew("optimizer_step", "W", -1,
               active_value(_F + "_ADAM_BYTES_PER_PARAM", _ADAM_BYTES_PER_PARAM) * num_params, 2)]



# -- model FLOPs by convention -------------------------------------------------------------------
def _mixer(model: ModelSpec, i: int = 0):
    """The token-mixing block of layer ``i`` (the first of a plain layer's blocks)."""
    return layer_blocks(model, i)[0]


def _block_counts(model: ModelSpec, layers: int, ffn: bool) -> list[tuple[object, int]]:
    """The feed-forward blocks (``ffn``) or the token mixers of the first ``layers`` layers
    (MTP modules included past ``num_layers``), one representative per block kind, each with
    its count, in the order the kinds first appear."""
    out: dict[str, list] = {}
    for i in range(layers):
        for block in layer_blocks(model, i):
            if (block.ffn_width() is not None) == ffn:
                entry = out.setdefault(block.kind, [block, 0])
                entry[1] += 1
    return [(b, n) for b, n in out.values()]


def _ffn_counts(model: ModelSpec, layers: int) -> list[tuple[object, int]]:
    return _block_counts(model, layers, True)


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
    mixers = 0
    for block, n in _block_counts(model, L + mtp, False):
        mixers += block.mc_flops_per_token(s) * n
    # sliding-window layers: the two core-attention terms see kbar keys per query instead of s / 2
    window_terms = 0.0
    correction = _mixer(model).mc_window_correction(s)
    if correction:
        n_windowed = sum(model.attention_window(i) is not None for i in range(L + mtp))
        window_terms = correction * n_windowed
    mlp = 0
    for block, n in _ffn_counts(model, L + mtp):
        mlp += block.mc_flops_per_token(s) * n
    per_token = mlp + mixers + 6 * mtp * (3 * h + 2 * h * h) + 6 * h * V * (1 + mtp)
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
    per_token = 0.0
    for kind, count in model.hybrid_layer_counts().items():
        if count:
            first = next(i for i in range(model.num_layers) if model.layer_kind(i) == kind)
            per_token += count * _mixer(model, first).mc_hybrid_forward_per_token(s)
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
    for block, _ in _block_counts(model, model.num_layers, False):
        why = block.unsupported_convention("nemo_24")
        if why:
            raise ConfigError("flop_convention", "nemo_24", why)
    if model.is_hybrid:
        raise ConfigError("flop_convention", "nemo_24", "defines no count for hybrid (Mamba) stacks; "
                                                         "use megatron_core_2025")
    h, s, L = model.hidden_size, seq_len, model.num_layers
    V = model.vocab_size if vocab_size is None else vocab_size
    H, K = model.num_attention_heads, model.num_kv_heads
    mm = 3 if model.mlp == "swiglu" else 2
    width = 0
    for block, n in _ffn_counts(model, L):
        width += block.ffn_width() * n
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
    s = seq_len
    attention_layers = [i for i in range(model.num_layers)
                        if any(b.attention_dims() for b in layer_blocks(model, i))]
    L = len(attention_layers)           # only the attention layers of a hybrid stack attend
    n = model.num_active_params(include_embedding=False)
    if vocab_size is not None:
        n += (vocab_size - model.vocab_size) * model.hidden_size
    dims = next((b.attention_dims() for i in attention_layers[:1] for b in layer_blocks(model, i)
                 if b.attention_dims()), (model.head_dim, model.head_dim))
    dsum = dims[0] + dims[1]
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


def routed_expert_flops_per_step(model: ModelSpec, global_batch_size: int, seq_len: int | None = None,
                                 convention: str = DEFAULT_FLOP_CONVENTION, *, vocab_size: int | None = None) -> float:
    """The part of :func:`model_flops_per_step` that the routed experts of the decoder's MoE
    layers contribute under ``convention`` (every routed token-expert assignment counted):
    ``6 m h fe`` per assignment in ``megatron_core_2025`` and ``nemo_24``, one expert's
    parameters in ``palm_6n``, none in the architecture-blind ``megatron_2021`` /
    ``narayanan_eq3`` (:func:`workloads.blocks.moe.routed_expert_part` finds it as
    ``k (F(k + 1) - F(k))``).  Metrics scale it by the dropped fraction
    (:mod:`simulator.engine.metrics`, docs/modelling.md "MFU with token dropping")."""
    return routed_expert_part(model, lambda m: model_flops_per_step(m, global_batch_size, seq_len, convention,
                                                                    vocab_size=vocab_size))
