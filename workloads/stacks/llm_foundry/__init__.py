"""llm-foundry (MosaicML Composer, PyTorch FSDP1) as its MPT benchmark runs ran, so far as
modelled: the attention kernel is the run's own, everything else is the default stack's.

Attention (``model.attn_config.attn_impl``, which ``scripts/train/benchmarking/submit_benchmarks.py``
writes into every run's yaml; its default ``'triton'`` at b2a43a14 and 5e85bd62):

* ``llm_foundry`` -- ``attn_impl: triton``: llm-foundry's Triton FlashAttention
  (``llmfoundry/models/layers/flash_attn_triton.py@v0.3.0``, a copy of Dao-AILab/flash-attention's
  ``flash_attn_triton.py`` compiled with triton-pre-mlir).  No benchmark of that kernel is
  published.  Its own docstring (``flash_attn/flash_attn_triton.py``) says its forward is
  generally faster and its backward slower than the CUDA FlashAttention of the time, "overall
  ... slightly slower": it is costed as FlashAttention v1, whose kernel benchmark is published
  for A100 and H100 (:data:`workloads.costs.compute.ATTENTION_BACKENDS`,
  ``flash_attention_1``).  A proxy, named as such.
* ``llm_foundry_flash`` -- ``attn_impl: flash`` with the ``gpu-flash2`` extra (flash-attn 2.4.2;
  ``submit_benchmarks.py@5e85bd62``): the CUDA FlashAttention-2 kernel
  (``flash_attention_2``: on A100 the default stack's ``flash`` table, on H100 the FA2 kernel
  benchmark, below the FA3-class ``flash`` table).

The FSDP1 rules, read from the source and found equal to what the default stack already does
at the granularity clustersim models (so they are not separate code):

* Mixed precision (Composer ``composer/trainer/mosaic_fsdp_utils.py`` ``get_mixed_precision``,
  v0.16.4 / v0.17.2): ``DEFAULT`` gathers parameters in the autocast dtype (BF16) and reduces
  gradients in FP32; ``PURE`` does both in BF16; ``FULL`` keeps everything in FP32.  Parameters
  are gathered at 2 bytes in both modes clustersim runs (as the default stack's ZeRO-3 gather);
  the gradient reduction's dtype is the scenario's ``grad_reduce_dtype`` (the validation
  mapping sets ``bf16`` for ``PURE``, leaves FP32 for ``DEFAULT``).
* Prefetch and ``limit_all_gathers`` (PyTorch ``torch/distributed/fsdp/api.py``
  ``BackwardPrefetch`` docstring and ``_limiter_utils.py`` ``_FreeEventQueue``, pytorch/pytorch
  @14911054): FSDP1 issues
  a unit's all-gather on its own stream from the CPU, which runs ahead of the GPU; with
  ``BACKWARD_PRE`` the next unit's gather is issued before the current unit's gradient kernels,
  with ``BACKWARD_POST`` (Composer's default, ``dist_strategy.py`` ``set_fsdp_default``) right
  after them -- either way it runs while the current unit's backward computes.  The rate limiter
  blocks the CPU while two all-gathers are in flight, which still lets the next unit's gather
  overlap the current one's compute.  Both are the default stack's one-layer-ahead
  ``prefetch`` issue mode (:mod:`..megatron_te.issue`).
* ``SHARD_GRAD_OP`` keeps the gathered parameters from the forward through the backward and
  reduce-scatters the gradients: ZeRO-2 as the mapping reads it (one gather per step where the
  run has one micro-batch per step, as every such row of the benchmark tables does).
* Activation checkpointing (Composer wraps each ``MPTBlock`` in ``checkpoint_wrapper``,
  ``dist_strategy.py``): the whole block is recomputed, the default stack's ``full`` recompute.

Not its own yet (the default stack's fused kernels stand in): eager PyTorch's unfused
element-wise kernels (``low_precision_layernorm``, GELU, residual adds) and the optimizer step
(decoupled AdamW / LionW: memory-bound over the local shard, under 0.1 % of these runs' steps).
"""

from dataclasses import replace

from ...blocks.fusion import MEGATRON_TE
from ..megatron_te import STACK as _MEGATRON_CORE

__all__ = ["STACK", "STACK_FLASH"]

_FSDP1 = ("composer/trainer/mosaic_fsdp_utils.py@v0.16.4 (mixed-precision modes), composer/trainer/"
          "dist_strategy.py@v0.16.4 (FSDP defaults), pytorch/pytorch torch/distributed/fsdp/api.py and _limiter_utils.py@14911054 (prefetch, limiter)")

STACK = replace(
    _MEGATRON_CORE,
    name="llm_foundry",
    summary="llm-foundry / Composer (PyTorch FSDP1), attn_impl: triton: its Triton FlashAttention (costed as "
            "FlashAttention v1); other kernels and overlaps as megatron_core",
    sources="mosaicml/llm-foundry scripts/train/benchmarking/submit_benchmarks.py@b2a43a14 (attn_impl default "
            "'triton'), llmfoundry/models/layers/flash_attn_triton.py@v0.3.0, Dao-AILab/flash-attention "
            "flash_attn/flash_attn_triton.py@f1a73d07 (docstring: speed against the CUDA kernel); " + _FSDP1,
    fusion=replace(MEGATRON_TE, attention_backend="flash_attention_1"),
)

STACK_FLASH = replace(
    STACK,
    name="llm_foundry_flash",
    summary="llm-foundry / Composer (PyTorch FSDP1), attn_impl: flash: the CUDA FlashAttention-2 kernel; other "
            "kernels and overlaps as megatron_core",
    sources="mosaicml/llm-foundry scripts/train/benchmarking/submit_benchmarks.py@5e85bd62 (pip '.[gpu-flash2]', "
            "attn_impl written into the run's yaml) and sweep.py@5e85bd62 (--attn_impl flash per model); " + _FSDP1,
    fusion=replace(MEGATRON_TE, attention_backend="flash_attention_2"),
)
