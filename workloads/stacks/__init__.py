"""Kernel stacks: how each training framework runs the blocks (:mod:`.base`), by name.

Megatron-Core with Transformer Engine (``megatron_core``, :mod:`.megatron_te`) is the default
and the one modelled in full; ``llm_foundry`` and ``llm_foundry_flash`` (:mod:`.llm_foundry`)
change its attention kernel only (llm-foundry's ``attn_impl: triton`` and ``flash``).  A new framework is a package beside them registered in :data:`KERNEL_STACKS`.
"""

from topologies import ConfigError

from .base import KernelStack
from .llm_foundry import STACK as LLM_FOUNDRY
from .llm_foundry import STACK_FLASH as LLM_FOUNDRY_FLASH
from .megatron_te import STACK as MEGATRON_CORE

__all__ = ["DEFAULT_STACK", "KERNEL_STACKS", "KernelStack", "get_stack"]

KERNEL_STACKS: dict[str, KernelStack] = {s.name: s for s in (MEGATRON_CORE, LLM_FOUNDRY, LLM_FOUNDRY_FLASH)}
DEFAULT_STACK = MEGATRON_CORE.name


def get_stack(name: str = DEFAULT_STACK) -> KernelStack:
    """The stack registered under ``name``; ConfigError lists the known ones."""
    if isinstance(name, KernelStack):
        return name
    try:
        return KERNEL_STACKS[name]
    except (KeyError, TypeError):
        raise ConfigError("framework", name, f"unknown; known: {', '.join(KERNEL_STACKS)}") from None
