"""A model as a composition of blocks: which blocks each decoder layer holds, and one rank's
share of a micro-batch (:func:`shard`).

* A layer of a plain stack (and every MTP module's layer) is a token mixer and a
  feed-forward block: attention (or, in the layers ``model.gated_deltanet`` names, a gated
  DeltaNet), then a dense MLP or an MoE block (:meth:`ModelSpec.is_moe_layer`).
* A layer of a hybrid stack (``hybrid_override_pattern``) is the one block its symbol names
  (:data:`workloads.model.HYBRID_SYMBOLS`).

Each block carries its own pre-norm and residual.  A new family registers its block class in
:data:`BLOCK_CLASSES` and, if it has its own symbol or layer rule, in :func:`layer_blocks`.
"""

from __future__ import annotations

from functools import lru_cache

from .attention import AttentionBlock
from .base import Block
from .gated_deltanet import GatedDeltaNetBlock
from .mamba import MambaBlock
from .mlp import DenseMLPBlock
from .moe import MoEBlock
from .shard import shard

__all__ = ["BLOCK_CLASSES", "EXTRA_ACTIVATION_TERMS", "layer_blocks", "selected_for_recompute", "shard"]

BLOCK_CLASSES: dict[str, type[Block]] = {cls.kind: cls for cls in (AttentionBlock, MambaBlock, DenseMLPBlock, MoEBlock,
                                                                   GatedDeltaNetBlock)}
"""Block classes by kind (:data:`workloads.model.HYBRID_SYMBOLS`' values among them)."""

EXTRA_ACTIVATION_TERMS: tuple[str, ...] = tuple(key for cls in BLOCK_CLASSES.values() for key in cls.ACTIVATION_KEYS)
"""Activation-memory terms the blocks add to :data:`workloads.memory.ACTIVATION_TERMS`."""


def layer_blocks(model, i: int) -> tuple[Block, ...]:
    """The blocks of decoder layer ``i`` (0-based; ``num_layers + k`` is MTP module ``k``'s
    layer, shaped like the last main layer), in execution order."""
    # the last model asked about, by identity: a program build asks ~10^4 times about one
    # model, and the cache below hashes every field of it each time
    entry = _LAST_MODEL[0]
    if entry[0] is not model:
        entry = _LAST_MODEL[0] = (model, {})
    i = int(i)
    hit = entry[1].get(i)
    if hit is None:
        hit = entry[1][i] = _layer_blocks(model, i)
    return hit


#: (model, {layer: its blocks}) of the last model :func:`layer_blocks` was asked about (one
#: tuple, replaced whole: threads asking about different models only miss it)
_LAST_MODEL: list = [(None, {})]


@lru_cache(maxsize=4096)
def _layer_blocks(model, i: int) -> tuple[Block, ...]:
    kind = model.layer_kind(i)
    if kind != "transformer":
        return (BLOCK_CLASSES[kind](model, i),)
    j = min(i, model.num_layers - 1)            # an MTP module's layer is shaped like the last one
    ffn = MoEBlock if model.is_moe_layer(j) else DenseMLPBlock
    linear = model.gated_deltanet is not None and model.gated_deltanet.is_linear(j)
    return (GatedDeltaNetBlock if linear else AttentionBlock)(model, i), ffn(model, i)


def selected_for_recompute(name: str, modules, blocks) -> bool:
    """Whether selective recomputation of ``modules`` re-runs op ``name`` of a layer of ``blocks``."""
    return any(b.recompute_module_of(name, modules) for b in blocks)
