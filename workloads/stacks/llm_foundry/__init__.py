"""llm-foundry (MosaicML Composer, PyTorch FSDP1) as its MPT benchmark runs ran, so far as
modelled: the attention kernel is its own, everything else is the default stack's.

What is llm-foundry's here: core attention runs the Triton FlashAttention kernel
(``attn_impl: triton``, the default of ``scripts/train/benchmarking/submit_benchmarks.py``
when its benchmark tables were made, 2023-2024; ``llmfoundry/models/layers/flash_attn_triton.py``,
a copy of Dao-AILab/flash-attention's ``flash_attn_triton.py`` compiled with triton-pre-mlir).
No benchmark of that kernel is published.  Its own docstring
(``flash_attn/flash_attn_triton.py``) says its forward is generally faster and its backward
slower than the CUDA FlashAttention of the time, "overall ... slightly slower": it is costed as
FlashAttention v1, whose kernel benchmark is published for A100 and H100
(:data:`workloads.costs.compute.ATTENTION_BACKENDS`, ``flash_attention_1``).  A proxy, named as
such; a microbenchmark of the kernel itself would replace it.

Not yet its own (Megatron-Core's rules stand in): the FSDP1 sharding, prefetch and
``limit_all_gathers`` behaviour, Composer's mixed-precision modes, eager PyTorch's unfused
element-wise kernels and its optimizer.  The scenario's ``parallel`` and ``overlap`` sections
say what a run shards and overlaps, as for the default stack.
"""

from dataclasses import replace

from ...blocks.fusion import MEGATRON_TE
from ..megatron_te import STACK as _MEGATRON_CORE

__all__ = ["STACK"]

STACK = replace(
    _MEGATRON_CORE,
    name="llm_foundry",
    summary="llm-foundry / Composer (PyTorch FSDP1): its Triton FlashAttention (costed as FlashAttention v1); "
            "other kernels and overlaps as megatron_core",
    sources="mosaicml/llm-foundry scripts/train/benchmarking/submit_benchmarks.py@b2a43a14 (attn_impl default "
            "'triton'), llmfoundry/models/layers/flash_attn_triton.py@v0.3.0, Dao-AILab/flash-attention "
            "flash_attn/flash_attn_triton.py@f1a73d07 (docstring: speed against the CUDA kernel)",
    fusion=replace(MEGATRON_TE, attention_backend="flash_attention_1"),
)
