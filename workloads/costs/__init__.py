"""Compute costs: executed FLOPs and bytes per op, model FLOPs by convention, op times, precision.

* :mod:`.flops` -- :class:`ComputeOp` records of one rank's layer / embedding / output /
  optimizer work per micro-batch (F, B, W), and model FLOPs per step by a named convention.
* :mod:`.compute` -- the :class:`ComputeModel` interface, the default
  :class:`RooflineComputeModel` and :class:`MeasuredComputeModel`.
* :mod:`.precision` -- precision recipes (``bf16``, ``fp8_delayed``, ``fp8_tensorwise``,
  ``fp8_blockwise``, ``mxfp8``, ``nvfp4``) and the quantisation ops they add.
"""

from .compute import COMPUTE_MODELS, ComputeModel, MeasuredComputeModel, RooflineComputeModel, get_compute_model
from .flops import (DEFAULT_FLOP_CONVENTION, FLOP_CONVENTIONS, ComputeOp, balanced_tokens_per_expert,
                    capacity_tokens_per_expert, embedding_ops, gemm_role, get_flop_convention, layer_ops,
                    model_flops_per_step, model_flops_per_token, optimizer_ops, output_ops, padded_vocab_size,
                    routed_expert_flops_per_step, sum_flops)
from .precision import PRECISION_RECIPES, PrecisionRecipe, get_recipe, quantize_ops, weight_quantize_op, \
    with_quantize_ops

__all__ = ["ComputeOp", "layer_ops", "embedding_ops", "output_ops", "optimizer_ops", "gemm_role", "sum_flops",
           "balanced_tokens_per_expert", "capacity_tokens_per_expert", "padded_vocab_size",
           "FLOP_CONVENTIONS", "DEFAULT_FLOP_CONVENTION", "get_flop_convention", "model_flops_per_step",
           "model_flops_per_token", "routed_expert_flops_per_step",
           "ComputeModel", "RooflineComputeModel", "MeasuredComputeModel", "COMPUTE_MODELS", "get_compute_model",
           "PrecisionRecipe", "PRECISION_RECIPES", "get_recipe", "quantize_ops", "with_quantize_ops",
           "weight_quantize_op"]
