"""Layer families as blocks: one module per block kind, each answering for its shapes and a
parallel layout its parameters, kernels, activation memory and model FLOPs.

* :mod:`.kernels` -- the kernel records (:class:`ComputeOp`: GEMM, attention, memory-bound)
  and their constructors;
* :mod:`.base` -- the :class:`Block` interface;
* :mod:`.attention` (MHA / GQA / MLA, windows, sinks), :mod:`.mlp` (dense MLP),
  :mod:`.moe` (router, routed and shared experts, latent projections), :mod:`.mamba`
  (Mamba-2), :mod:`.mtp` (multi-token prediction), :mod:`.edges` (embedding, output, loss);
* :mod:`.layers` -- which blocks each layer holds, and one rank's shard of a micro-batch.
"""

from .base import Block, KernelArgs, RankParams
from .kernels import ComputeOp, LayerOps, Shard
from .layers import BLOCK_CLASSES, layer_blocks, selected_for_recompute, shard

__all__ = ["BLOCK_CLASSES", "Block", "ComputeOp", "KernelArgs", "LayerOps", "RankParams", "Shard", "layer_blocks",
           "selected_for_recompute", "shard"]
