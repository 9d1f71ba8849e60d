"""torchtitan and plain PyTorch FSDP2 training loops, as modelled: PyTorch SDPA's attention
kernel, eager (or ``torch.compile``-fused) element-wise kernels; the data-parallel, pipeline
and overlap rules are the default stack's.

Attention.  PyTorch's ``scaled_dot_product_attention`` tries its backends in a priority order
and runs the first whose checks pass (bf16, causal, head dim 128: all of them pass on sm80+):

* the default order (pytorch/pytorch ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``
  ``priority_order``, later ``aten/src/ATen/Context.h`` ``sdp_priority_order``): flash
  (PyTorch's own copy of FlashAttention-2, not FA3), memory-efficient, math, cuDNN last --
  every release from 2.2 to 2.8 except 2.5.0, whose ``priority_order`` put cuDNN first (a
  change 2.5.1 took back);
* from 2.9, ``priority_order`` moves cuDNN to the front on sm90 and newer
  (``check_prefer_cudnn_attention``);
* torchtitan overrides the order: ``torchtitan/models/attention.py@v0.2.2``
  ``ScaledDotProductAttention`` runs SDPA under ``sdpa_kernel([CUDNN_ATTENTION,
  FLASH_ATTENTION, MATH], set_priority=True)`` (its comment: until PyTorch 2.9 is released).

:func:`sdpa_backend` is that rule; the kernels map to :data:`workloads.costs.compute.ATTENTION_BACKENDS`
(``flash_attention_2``, ``cudnn_sdpa``).

Element-wise kernels.  torchtitan's ``Compile.enable`` defaults to False
(``torchtitan/config/job_config.py@v0.2.2``): the Llama blocks run eagerly
(``torchtitan/models/llama3/model/model.py@v0.2.2``: ``nn.RMSNorm``, RoPE as complex products
with ``.float()`` and ``type_as``, ``silu(w1 x) * w3 x``, residual adds), each ATen op one
memory-bound kernel (:data:`workloads.blocks.kernels.EAGER_NORM` and its neighbours).  With
``compile.enable`` Inductor fuses each group back into about one kernel: the default stack's
fused costs stand in.  The MoE block runs torchtitan's module eagerly under ``torchtitan``
(``Fusion.moe_kernels = "torchtitan_eager"``: :func:`workloads.blocks.kernels.titan_router`,
``titan_permute``, ``titan_unpermute``, from ``torchtitan/models/moe/moe.py@v0.2.2`` and
``utils.py``; ``torch._grouped_mm`` costed as the default stack's grouped GEMMs); compiled
torchtitan and the plain loop keep the fused MoE kernels; other blocks (SSMs) too.

FSDP2 (``torchtitan/models/llama3/infra/parallelize.py@v0.2.2``, ``config/job_config.py``
``mixed_precision_reduce = "float32"``, ``fsdp_reshard_after_forward = "default"``): parameters
gathered in BF16 per layer before its forward and again before its backward (re-gathered per
micro-batch; kept under pipeline parallelism), gradients reduce-scattered in FP32 -- the
default stack's ZeRO-3 with ``grad_reduce_dtype: fp32`` (4 bytes per gradient element, twice
the BF16 bytes).  FSDP2's own copies around those collectives (``Fusion.fsdp2_copies``,
:mod:`workloads.stacks.megatron_te.data_parallel`) run on every one of the three stacks; the
plain loop is modelled as FSDP2 (FSDP1's flat parameter has no copy-out; not modelled apart).

Optimizer (``Fusion.optimizer``): torchtitan's ``optimizer.implementation = "fused"``
(job_config.py@v0.2.2), ``torch.optim.AdamW(fused=True)``; a plain loop's AdamW defaults to
``foreach`` on CUDA (:func:`workloads.costs.flops.optimizer_ops`).

float8 (``Fusion.float8_casts``): torchtitan's ``float8`` converter swaps in torchao's
``Float8Linear``; under the ``fp8_tensorwise`` recipe its six dynamic casts per linear and
micro-batch replace Transformer Engine's, eager or compiled
(:data:`workloads.costs.precision.TORCHAO_CAST`).  Not modelled: async TP (only with compile and
TP in torchtitan: ``overlap.tp_comm`` runs the TP collectives beside the next GEMM as the default
stack's userbuffer overlap does, on the compiled stack only; the eager stacks refuse it),
torchao's rowwise recipes and FP8 all-gather.
"""

from __future__ import annotations

from dataclasses import replace

from topologies import ConfigError

from ...blocks.fusion import MEGATRON_TE
from ..megatron_te import STACK as _MEGATRON_CORE
from ..megatron_te.issue import assign_issue_modes

__all__ = ["STACK", "STACK_COMPILE", "STACK_PYTORCH_FSDP", "sdpa_backend"]

#: SDPA's kernels -> the compute model's attention tables.
_KERNEL_TABLE = {"flash": "flash_attention_2", "cudnn": "cudnn_sdpa"}


def _version(text: str) -> tuple[int, int, int]:
    parts = str(text).split("+")[0].split(".")
    try:
        nums = [int("".join(ch for ch in p if ch.isdigit()) or "x") for p in parts[:3]]
    except ValueError:
        raise ConfigError("torch_version", text, "expected MAJOR.MINOR[.PATCH], e.g. 2.5.1") from None
    return tuple(nums + [0] * (3 - len(nums)))


def sdpa_backend(torch_version: str, generation: str, priority: tuple[str, ...] | None = None) -> str:
    """The kernel SDPA runs for BF16 causal attention (head dim <= 128, no mask, no dropout) on
    a ``generation`` GPU under PyTorch ``torch_version``, as an attention-table name; ``priority``
    is an ``sdpa_kernel(..., set_priority=True)`` order (``("cudnn", "flash", "math")`` for
    torchtitan), None for the release's default (see the module docstring)."""
    v = _version(torch_version)
    if v < (2, 0, 0):
        raise ConfigError("torch_version", torch_version, "SDPA needs PyTorch 2.0 or newer")
    if generation not in ("ampere", "hopper", "blackwell"):
        raise ConfigError("gpu generation", generation, "SDPA's kernels are modelled for ampere, hopper, blackwell")
    if priority is None:
        cudnn_first = v[:2] >= (2, 9) or v == (2, 5, 0)
        priority = ("cudnn", "flash") if cudnn_first and generation != "ampere" else ("flash", "cudnn")
    for kernel in priority:
        if kernel == "cudnn" and (v[:2] < (2, 5) or generation == "ampere"):
            continue                        # no cuDNN SDPA before 2.5 or (as modelled) before sm90
        if kernel in _KERNEL_TABLE:
            return _KERNEL_TABLE[kernel]
    raise ConfigError("sdpa priority", priority, "no flash or cudnn kernel in the order")


_TITAN = ("pytorch/torchtitan torchtitan/models/attention.py@v0.2.2 (SDPA order cuDNN, flash, math), "
          "torchtitan/models/llama3/model/model.py@v0.2.2 (eager modules), torchtitan/config/job_config.py@v0.2.2 "
          "(compile off, FP32 gradient reduction, reshard_after_forward), "
          "torchtitan/models/llama3/infra/parallelize.py@v0.2.2 (FSDP2)")

def _eager_issue_modes(ops, overlap):
    """The default stack's issue modes, but no TP overlap: torchtitan overlaps TP communication
    only as async TP, which needs compile (``torchtitan/distributed/tensor_parallel.py@v0.2.2``
    ``maybe_enable_async_tp`` raises without ``compile.enable``); a plain eager loop likewise."""
    if overlap.get("tp_comm", False):
        raise ConfigError("overlap.tp_comm", overlap["tp_comm"], "async TP needs torch.compile in torchtitan "
                          "(maybe_enable_async_tp): use framework torchtitan_compile, or tp_comm false")
    return assign_issue_modes(ops, overlap)


#: torchtitan's optimizer (``optimizer.implementation = "fused"``, job_config.py@v0.2.2) over
#: FSDP2 (``fully_shard``, parallelize.py@v0.2.2), whose copies run eagerly with or without
#: ``compile.enable`` (torchtitan compiles each TransformerBlock; FSDP2's hooks stay outside).
_FSDP2_FUSED_ADAMW = {"optimizer": "torch_fused", "fsdp2_copies": True}

STACK = replace(
    _MEGATRON_CORE,
    name="torchtitan",
    summary="torchtitan v0.2.2 (FSDP2, eager): SDPA's cuDNN attention (Hopper, Blackwell; FlashAttention-2 on "
            "Ampere), unfused element-wise kernels; collectives and overlaps as megatron_core",
    sources=_TITAN,
    assign_issue_modes=_eager_issue_modes,
    fusion=replace(MEGATRON_TE, attention_backend="cudnn_sdpa", elementwise="eager", moe_kernels="torchtitan_eager",
                   float8_casts="torchao_eager", **_FSDP2_FUSED_ADAMW),
)

STACK_COMPILE = replace(
    STACK,
    name="torchtitan_compile",
    summary="torchtitan v0.2.2 with compile.enable: SDPA's cuDNN attention, Inductor-fused element-wise kernels",
    assign_issue_modes=_MEGATRON_CORE.assign_issue_modes,     # overlap.tp_comm: async TP (see the docstring)
    fusion=replace(MEGATRON_TE, attention_backend="cudnn_sdpa", float8_casts="torchao_compiled", **_FSDP2_FUSED_ADAMW),
)

STACK_PYTORCH_FSDP = replace(
    STACK,
    name="pytorch_fsdp",
    summary="PyTorch FSDP / FSDP2 training loop, eager, torch 2.4-2.8 SDPA default (FlashAttention-2); "
            "collectives and overlaps as megatron_core",
    sources="pytorch/pytorch aten/src/ATen/native/transformers/cuda/sdp_utils.cpp priority_order and "
            "aten/src/ATen/Context.h sdp_priority_order (flash first); " + _TITAN,
    fusion=replace(MEGATRON_TE, attention_backend=sdpa_backend("2.7", "hopper"), elementwise="eager",
                   optimizer="torch_foreach", fsdp2_copies=True),
)
