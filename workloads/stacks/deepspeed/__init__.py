"""DeepSpeed (ZeRO stages 0-3) training a Hugging Face-style eager PyTorch model, as modelled.

Kernels.  DeepSpeed wraps the user's ``nn.Module``; it fuses nothing unless the model is built
from its own kernels (``deepspeed.ops`` transformer kernels, DeepSpeed-Inference injection),
which a ZeRO training run of a Hugging Face model does not use.  The model's modules run
eagerly: Hugging Face ``transformers``' Llama (``LlamaRMSNorm`` in Python: a cast, ``pow``,
``mean``, ``rsqrt``, two ``mul``; rotary embedding with ``rotate_half``; ``act_fn(gate) * up``)
is costed with the torchtitan stack's eager element-wise kernels (one memory-bound kernel per
ATen op; HF's RMSNorm launches a few more, which this under-counts), and its attention with
``attn_implementation="sdpa"`` (the transformers default since 4.36 when PyTorch has SDPA):
SDPA's default backend order, FlashAttention-2 on torch 2.4-2.8 -- the ``pytorch_fsdp``
stack's attention and element-wise kernels, without FSDP2's copies (``fsdp2_copies`` off:
ZeRO-3 gathers into its own buffers, :mod:`.data_parallel`).  The optimizer step is the
default stack's fused multi-tensor Adam over the FP32 partition, writing the BF16 copy
(``Fusion.optimizer = "megatron"``): DeepSpeed's ``FusedAdam`` (``deepspeed/ops/adam/
fused_adam.py@v0.16.4``, ``multi_tensor_apply``), which a DeepSpeed config's ``"optimizer":
{"type": "AdamW"}`` builds, then ``bit16_partitions[...].data.copy_(fp32_partition)`` in
``step()`` (stage_1_and_2.py).  Compute lowering, recompute and host launch are the
default stack's.

Data parallelism (:mod:`.data_parallel`; defaults :mod:`.options`, the scenario's ``deepspeed``
section), read from microsoft/DeepSpeed at v0.16.4:

* gradients reduced in buckets of ``reduce_bucket_size`` (5e8) elements, in the training
  dtype (``communication_data_type`` unset): ZeRO-0 after the backward (all-reduce, 5e8
  buckets), ZeRO-1 at the accumulation boundary, ZeRO-2/3 every micro-batch; ZeRO-0/1/2
  all-reduce each bucket (``allreduce_and_scatter``), ZeRO-3 reduce-scatters it;
  ``overlap_comm`` (default on only at stage 3) puts them on a side stream, off they
  block the compute stream (ZeRO-0/1: after the backward);
* ZeRO-1/2: the optimizer steps over 1/dp of the parameters, then ``step()`` all-gathers the
  updated BF16 parameters in one call per parameter group, exposed at the step's end;
* ZeRO-3: each layer's partitioned parameters (tensors above
  ``stage3_param_persistence_threshold``: the norms stay whole) gathered before its forward
  and backward, prefetched on the all-gather stream in calls of
  ``stage3_prefetch_bucket_size``; the output layer (and any layer within
  ``stage3_max_reuse_distance`` of its backward) kept gathered into the backward.

What clustersim does not model for it: tensor, pipeline, context and expert parallelism
(DeepSpeed's pipeline engine refuses ZeRO-2/3; Megatron-DeepSpeed runs run as
``megatron_core``), MoE models, the ``contiguous_gradients`` copies into the bucket buffer,
prefetch further than one compute segment ahead (DeepSpeed may run up to
``stage3_max_live_parameters`` ahead: the engine's one-segment prefetch is the bound here),
per-submodule (rather than per-layer) fetch order, ZeRO++ (quantised gathers, hpZ), and
loss scaling under FP16.
"""

from __future__ import annotations

from dataclasses import replace

from topologies import ConfigError

from ...blocks.fusion import MEGATRON_TE
from ...ops import Issue, is_fsdp_gather, is_grad_bucket, is_param_gather
from ..megatron_te import STACK as _MEGATRON_CORE
from ..megatron_te.issue import issue_mode
from ..megatron_te.pipeline import _stage_program as _shared_stage_program
from ..torchtitan import STACK_PYTORCH_FSDP as _PYTORCH_FSDP
from .data_parallel import DEEPSPEED_DP
from .options import DeepSpeedOptions, deepspeed_options

__all__ = ["STACK", "DeepSpeedOptions", "deepspeed_options"]


def _stage_program(ctx, stage: int, tokens: dict):
    """The shared stage program with DeepSpeed's data-parallel rules."""
    ctx.dp_rules = DEEPSPEED_DP
    return _shared_stage_program(ctx, stage, tokens)


def assign_issue_modes(ops, overlap):
    """The default stack's issue modes, except for the data-parallel collectives: their mode
    comes from the DeepSpeed options (``overlap_comm``, prefetch), set as they were emitted;
    the ``overlap`` switches ``grad_reduce``, ``param_gather`` and ``fsdp_prefetch`` do not
    apply."""
    out = []
    for op in ops:
        if is_grad_bucket(op) or is_param_gather(op) or is_fsdp_gather(op):
            out.append(op)
            continue
        mode = issue_mode(op, overlap)
        out.append(op if mode is Issue.BLOCKING else op._replace(issue=mode))
    return out


def check_layout(model, parallel, schedule, *, moe_ep_overlap) -> None:
    """Refuse what this stack does not model: any parallelism but data parallelism, MoE."""
    for axis in ("tp", "pp", "cp", "ep"):
        if getattr(parallel, axis) != 1:
            raise ConfigError(f"parallel.{axis}", getattr(parallel, axis),
                              "the deepspeed stack models ZeRO data parallelism only (DeepSpeed's pipeline engine "
                              "refuses ZeRO-2/3; Megatron-DeepSpeed layouts run as megatron_core): must be 1")
    if model.moe is not None:
        raise ConfigError("framework", "deepspeed", "MoE models are not modelled on the deepspeed stack "
                                                    "(DeepSpeed-MoE's expert parallelism)")


STACK = replace(
    _MEGATRON_CORE,
    name="deepspeed",
    summary="DeepSpeed ZeRO 0-3 (v0.16.4 defaults) on an eager Hugging Face-style model: SDPA FlashAttention-2, "
            "unfused element-wise kernels, DeepSpeed's gradient buckets and ZeRO-3 gathers",
    sources="microsoft/DeepSpeed@v0.16.4 deepspeed/runtime/zero/config.py (defaults), zero/stage_1_and_2.py "
            "(buckets, all-reduce, step all-gather), zero/stage3.py (reduce-scatter, streams), "
            "zero/partitioned_param_coordinator.py (fetch, prefetch, release), zero/partition_parameters.py "
            "(persistence), runtime/engine.py (communication_data_type, ZeRO-0 reduction), runtime/utils.py "
            "(all_gather_dp_groups); huggingface/transformers models/llama/modeling_llama.py (eager modules, sdpa)",
    fusion=replace(MEGATRON_TE, attention_backend=_PYTORCH_FSDP.fusion.attention_backend,
                   elementwise=_PYTORCH_FSDP.fusion.elementwise),
    stage_program=_stage_program,
    assign_issue_modes=assign_issue_modes,
    check_layout=check_layout,
    options=deepspeed_options,
)
