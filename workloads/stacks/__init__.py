"""Kernel stacks: how each training framework runs the blocks (:mod:`.base`), by name.

Megatron-Core with Transformer Engine (``megatron_core``, :mod:`.megatron_te`) is the default
and the one modelled in full; ``llm_foundry`` and ``llm_foundry_flash`` (:mod:`.llm_foundry`)
change its attention kernel only (llm-foundry's ``attn_impl: triton`` and ``flash``);
``torchtitan``, ``torchtitan_compile`` and ``pytorch_fsdp`` (:mod:`.torchtitan`) run PyTorch
SDPA's kernel and (eager) unfused element-wise kernels; ``deepspeed`` (:mod:`.deepspeed`) runs
those kernels under DeepSpeed ZeRO's own data-parallel rules.  A new framework is a package beside them registered in :data:`KERNEL_STACKS`.
"""

from topologies import ConfigError

from .base import KernelStack
from .deepspeed import STACK as DEEPSPEED
from .llm_foundry import STACK as LLM_FOUNDRY
from .llm_foundry import STACK_FLASH as LLM_FOUNDRY_FLASH
from .megatron_te import STACK as MEGATRON_CORE
from .torchtitan import STACK as TORCHTITAN
from .torchtitan import STACK_COMPILE as TORCHTITAN_COMPILE
from .torchtitan import STACK_PYTORCH_FSDP as PYTORCH_FSDP

__all__ = ["DEFAULT_STACK", "KERNEL_STACKS", "KernelStack", "get_stack"]

KERNEL_STACKS: dict[str, KernelStack] = {s.name: s for s in (MEGATRON_CORE, LLM_FOUNDRY, LLM_FOUNDRY_FLASH,
                                                             TORCHTITAN, TORCHTITAN_COMPILE, PYTORCH_FSDP,
                                                             DEEPSPEED)}
DEFAULT_STACK = MEGATRON_CORE.name


def get_stack(name: str = DEFAULT_STACK) -> KernelStack:
    """The stack registered under ``name``; ConfigError lists the known ones."""
    if isinstance(name, KernelStack):
        return name
    try:
        return KERNEL_STACKS[name]
    except (KeyError, TypeError):
        raise ConfigError("framework", name, f"unknown; known: {', '.join(KERNEL_STACKS)}") from None
