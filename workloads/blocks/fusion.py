"""What a framework fuses: the kernel-level choices a kernel stack makes for the blocks.

The blocks say what a layer computes; how many kernels it takes and which ones are fused is
the framework's (:mod:`workloads.stacks`).  A :class:`Fusion` record carries those choices;
the blocks read it through :class:`workloads.blocks.base.KernelArgs`.  Its defaults are
Megatron-Core with Transformer Engine, the default stack; another framework gives its own.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Fusion", "MEGATRON_TE"]


@dataclass(frozen=True, slots=True)
class Fusion:
    """Kernel-level choices of one framework (defaults: Megatron-Core with Transformer Engine)."""

    rope_kernels: tuple[int, int] = (2, 2)
    """(forward, backward) kernels of the fused RoPE on q and k (Transformer Engine's
    ``fused_apply_rotary_pos_emb``, one per tensor)."""
    unfused_rope_with_yarn: bool = True
    """Megatron-Core's fused RoPE does not take YaRN's table factor: with ``rope_mscale`` other
    than 1 its unfused RoPE runs (models/common/embeddings/rope_utils.py)."""
    qk_norm_kernels: tuple[int, int] = (2, 2)
    """(forward, backward) kernels of the per-head q and k norms (one per tensor)."""
    router_kernels: tuple[int, int] = (5, 3)
    """(forward, backward) kernels of the router's softmax / sigmoid, top-k, score
    normalisation and load-balancing statistics."""
    permute_kernels: tuple[int, int] = (3, 3)
    """(forward, backward) kernels of the MoE token permutation (and of the unpermutation)."""
    expert_op_fuser: str = "with_rank_budget"
    """When the experts' clamped activation and fc2 bias run fused inside the grouped expert
    ops: ``with_rank_budget`` (Megatron-Core runs HybridEP's rank budget only with Transformer
    Engine's op fuser, and Megatron-Bridge's recipes that set the budget set the fuser),
    ``always`` or ``never``; otherwise they run as eager kernels."""
    cross_entropy_fused: bool = False
    """Megatron's ``--cross-entropy-loss-fusion`` (off by default, as in Megatron-LM)."""
    attention_backend: str = "te_fused"
    """The fused attention kernel (:data:`workloads.costs.compute.ATTENTION_BACKENDS`):
    ``flash`` is the best kernel of each generation (FlashAttention-2 on Ampere, FlashAttention-3
    on Hopper, FlashAttention-4 on Blackwell); ``te_fused`` is Transformer Engine's
    DotProductAttention, which runs cuDNN's fused attention on Hopper and Blackwell -- timed from
    the measured tables where they cover the op
    (:data:`workloads.costs.compute.MEASURED_ATTENTION_KERNELS`), else as ``flash``."""

    elementwise: str = "fused"
    """How the dense blocks' element-wise work runs: ``fused`` (Transformer Engine's fused
    norm, RoPE, activation and bias-dropout-add kernels; also what ``torch.compile``'s Inductor
    produces at the granularity modelled) or ``eager`` (PyTorch eager: each ATen op its own
    memory-bound kernel, :func:`workloads.blocks.kernels.eager_norm` and its neighbours)."""

    moe_kernels: str = "megatron"
    """How a MoE block's router, permutation and element-wise kernels run: ``megatron``
    (Megatron-Core's fused router and permute kernels, Transformer Engine's norm and activation)
    or ``torchtitan_eager`` (torchtitan's MoE module run eagerly: index ops, casts and products
    each a kernel, :func:`workloads.blocks.kernels.titan_router` and its neighbours)."""

    float8_casts: str = "te"
    """Who casts to FP8 under the ``fp8_tensorwise`` recipe (:data:`workloads.costs.precision.FLOAT8_CASTS`):
    ``te`` (Transformer Engine's fused cast-transposes, the recipe's bytes, weights once a step),
    ``torchao_eager`` or ``torchao_compiled`` (torchao's six dynamic casts per linear and
    micro-batch, :data:`workloads.costs.precision.TORCHAO_CAST`)."""

    optimizer: str = "megatron"
    """The optimizer step's kernels (:data:`workloads.costs.flops.OPTIMIZER_IMPLEMENTATIONS`):
    ``megatron`` (Megatron's fused multi-tensor Adam over FP32 master weights, writing the BF16
    copy), ``torch_fused`` (``torch.optim.AdamW(fused=True)``) or ``torch_foreach`` (its
    ``_foreach_*`` default)."""

    fsdp2_copies: bool = False
    """PyTorch FSDP2's foreach copies around each ZeRO-3 collective run as memory-bound kernels
    (the shard into the all-gather buffer, the gathered buffer out into the parameters, the
    gradients into the reduce-scatter input: :mod:`workloads.stacks.megatron_te.data_parallel`)."""

    @property
    def eager(self) -> bool:
        """Whether the element-wise ops run as eager PyTorch kernels."""
        return self.elementwise == "eager"

    def rope_fused(self, model) -> bool:
        """Whether ``model``'s RoPE runs as the fused kernel."""
        return not (self.unfused_rope_with_yarn and model.rope_mscale != 1.0)

    def expert_ops_fused(self, moe) -> bool:
        """Whether the experts' clamp and bias run inside the fused expert ops."""
        if self.expert_op_fuser == "always":
            return True
        if self.expert_op_fuser == "never":
            return False
        return moe.expert_rank_capacity_factor is not None


MEGATRON_TE = Fusion()
"""Megatron-Core with Transformer Engine's choices (the dataclass defaults)."""
