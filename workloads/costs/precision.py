"""Training precision recipes as data: GEMM dtypes per role, quantisation cost, copies, wire dtypes.

A recipe (``precision:`` in a scenario) says, per GEMM role -- ``fprop`` (``Y = X W``),
``dgrad`` (``dX = dY W^T``), ``wgrad`` (``dW = X^T dY``) -- which input dtype the tensor
cores run, hence which peak and measured-matmul (MAMF) throughput apply; which GEMMs stay
in BF16; what the quantisation adds (memory-bound casts, amax passes, transposes, in
bytes per element); the low-precision weight copies a rank holds (for the memory model);
the dtypes on the wire for sequence-parallel all-gathers of GEMM inputs and for the
distributed optimizer's parameter all-gather; and the gradient-reduction dtype.

=================  ======================  =================  ========================================
recipe             fprop / dgrad / wgrad   element formats    scaling
=================  ======================  =================  ========================================
``bf16``           bf16 / bf16 / bf16      BF16               none
``fp8_delayed``    fp8 / fp8 / fp8         E4M3 fwd, E5M2 bwd per tensor, amax history (TE DelayedScaling)
``fp8_tensorwise`` fp8 / fp8 / fp8         E4M3 fwd, E5M2 bwd per tensor, current amax (TE Float8CurrentScaling)
``fp8_blockwise``  fp8 / fp8 / fp8         E4M3 everywhere    1x128 activations, 128x128 weights (DeepSeek-V3)
``mxfp8``          fp8 / fp8 / fp8         E4M3 everywhere    1x32 blocks, E8M0 scales (OCP MX)
``nvfp4``          fp4 / fp4 / fp4         E2M1               1x16 blocks, E4M3 scales + FP32 tensor
                                                              scale; 16x16 weight blocks; RHT on wgrad
=================  ======================  =================  ========================================

Sources
-------
* Transformer Engine recipes (``transformer_engine.common.recipe``): ``DelayedScaling``
  and ``Float8CurrentScaling`` default to ``Format.HYBRID`` -- "FP8 tensors in the forward
  pass are in e4m3 format, FP8 tensors in the backward pass are in e5m2 format" -- and
  quantise all three GEMMs of a linear layer; ``Float8BlockScaling``, ``MXFP8BlockScaling``
  default to E4M3 for both passes (TE docs, "FP8 Blockwise Scaling", "MXFP8");
  ``NVFP4BlockScaling`` uses E2M1.
* Hardware support: TE "Datatype and hardware support matrix": per-tensor FP8 from
  compute capability 8.9 (Hopper here), FP8 block scaling on Hopper and Blackwell, MXFP8
  and NVFP4 on data-centre Blackwell (10.x) only.
* DeepSeek-AI, DeepSeek-V3 Technical Report (arXiv:2412.19437) §3.3: fine-grained FP8
  (1x128 activation tiles, 128x128 weight blocks), all three GEMMs in FP8 E4M3.
* NVIDIA, Pretraining Large Language Models with NVFP4 (arXiv:2509.25149): NVFP4 for the
  fprop, dgrad and wgrad GEMMs of linear layers; 16x16 random Hadamard transforms on the
  wgrad inputs; 2D (16x16) block scaling of weights; stochastic rounding of gradients; a
  small share of linear layers (about 16 %) kept in BF16 -- its 12B model keeps the first
  two and the last eight blocks; we keep those counts as defaults (override with
  :func:`dataclasses.replace`).  Embeddings, the output head, norms and attention stay in
  higher precision.
* Megatron-LM: the output layer is a Megatron ``ColumnParallelLinear`` (not a TE module),
  so it stays BF16 under every recipe, as do MoE routers (``--moe-router-dtype``);
  ``--bf16`` turns on ``accumulate_allreduce_grads_in_fp32``, hence FP32 gradient
  reduction by default (docs/modelling.md, precision recipes); ``--fp8-param-gather`` all-gathers FP8
  parameters instead of BF16.

Quantisation bytes (per element quantised; BF16 source read once)
------------------------------------------------------------------
A quantised GEMM input is needed twice: row-wise for fprop/dgrad and column-wise
(transposed, or scaled along the other axis) for wgrad/dgrad, so each recipe writes two
low-precision copies: ``2 + 2 x q`` bytes for ``q`` bytes per element, plus scales, plus
an extra read of the source where the scale needs the current tensor's amax.

* delayed: ``2 + 1 + 1 = 4`` (TE's fused cast-transpose; the scale comes from history);
* tensorwise: ``2 (amax pass) + 4 = 6``;
* blockwise: ``4 + 2 x 4/128`` (FP32 scale per 128 elements, both directions);
* mxfp8: ``4 + 2 x 1/32`` (one E8M0 byte per 32 elements, both directions);
* nvfp4: ``2 (amax) + 2 + 0.5 + 0.5 + 2 x 1/16 = 5.125`` (one E4M3 scale per 16; the
  Hadamard transform is fused into the column-wise cast).

Weights are quantised once per step (TE caches the quantised weights across
micro-batches), at the same bytes per parameter (nvfp4/blockwise weight scales are per
256 / 16384 elements).  These counts are our estimates of fused-kernel traffic, to be
replaced by measurements where available (:class:`~workloads.costs.compute.MeasuredComputeModel`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass

from topologies import ConfigError, GPUSpec
from topologies.constants import value as active_value

from .flops import ComputeOp, gemm_role

__all__ = ["PrecisionRecipe", "PRECISION_RECIPES", "DTYPE_BYTES", "get_recipe", "quantize_ops",
           "with_quantize_ops", "weight_quantize_op"]

DTYPE_BYTES: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp4": 0.5}
"""Bytes per element of each dtype (scales not included)."""

_BF16_GEMMS = frozenset({"output_gemm", "mtp_output_gemm", "router",
                         # unfused core attention (ModelSpec.flash_attention false): attention stays BF16
                         "core_attn.qk", "core_attn.pv", "core_attn.dq", "core_attn.dk", "core_attn.dp",
                         "core_attn.dv"})


@dataclass(frozen=True, slots=True, kw_only=True)
class PrecisionRecipe:
    """One training precision recipe (see the module docstring for the table and sources)."""

    name: str
    fprop_dtype: str
    """Input dtype of forward GEMMs (``bf16`` | ``fp8`` | ``fp4``): selects the peak and MAMF."""
    dgrad_dtype: str
    """Input dtype of input-gradient GEMMs."""
    wgrad_dtype: str
    """Input dtype of weight-gradient GEMMs."""
    fprop_format: str
    """Element format of forward GEMM inputs (``BF16``, ``E4M3``, ``E2M1``)."""
    grad_format: str
    """Element format of gradients fed to dgrad / wgrad (``E5M2`` under TE's HYBRID format)."""
    scaling: str
    """Scaling granularity: ``none``, ``tensor_delayed``, ``tensor_current``, ``block_1x128``,
    ``mx_1x32``, ``nv_1x16``."""
    block_size: int | None = None
    """Elements per scale of activations and gradients (None: one per tensor)."""
    attention_dtype: str = "bf16"
    """Core attention stays BF16 by default (TE's ``fp8_dpa`` off); ``fp8`` runs FA3's FP8 path."""
    quantize_bytes_per_element: float = 0.0
    """HBM traffic of quantising one activation / gradient element (both copies, scales, amax pass)."""
    quantize_kernels: int = 0
    """Kernels per quantised tensor (amax pass + cast)."""
    weight_quantize_bytes_per_param: float = 0.0
    """HBM traffic per parameter of the once-per-step weight quantisation."""
    extra_weight_bytes_per_param: float = 0.0
    """Low-precision weight copies held besides the BF16 parameters (memory model), for the
    parameters of quantised GEMMs."""
    tp_gather_bytes_per_element: float = 2.0
    """Bytes per element of sequence-parallel all-gathers of GEMM inputs (TE quantises
    before gathering for the FP8 recipes)."""
    param_gather_bytes_per_param: float = 2.0
    """Bytes per parameter of the distributed optimizer's parameter all-gather."""
    grad_reduce_dtype: str = "fp32"
    """Dtype of the data-parallel gradient reduction (Megatron: FP32 with ``--bf16``)."""
    bf16_gemms: frozenset = _BF16_GEMMS
    """GEMM op names that stay BF16 whatever the recipe (output layer, MoE router)."""
    bf16_first_layers: int = 0
    """Leading decoder layers whose GEMMs stay BF16 (NVFP4 recipe)."""
    bf16_last_layers: int = 0
    """Trailing decoder layers whose GEMMs stay BF16 (NVFP4 recipe; MTP layers count as trailing)."""
    generations: tuple[str, ...] = ("ampere", "hopper", "blackwell")
    """GPU generations that run the recipe."""
    source: str = ""

    # -- lookups -----------------------------------------------------------------------------
    @property
    def peak_dtype(self) -> str:
        """The dtype whose dense peak MFU divides by (the forward GEMM dtype; docs/design.md, "Metrics")."""
        return self.fprop_dtype

    @property
    def grad_reduce_bytes(self) -> float:
        """Bytes per gradient element in the data-parallel reduction."""
        return active_value("workloads.costs.precision.DTYPE_BYTES", DTYPE_BYTES)[self.grad_reduce_dtype]

    def is_low_precision_layer(self, layer: int, num_layers: int | None) -> bool:
        """Whether layer ``layer``'s GEMMs use the recipe's low-precision dtypes.

        ``num_layers`` counts all decoder layers including MTP modules; it is needed only
        when the recipe keeps trailing layers in BF16.
        """
        if layer < 0:
            return True
        if layer < self.bf16_first_layers:
            return False
        if self.bf16_last_layers:
            if num_layers is None:
                raise ValueError(f"precision {self.name!r} keeps the last {self.bf16_last_layers} layers in BF16: "
                                 "pass num_layers")
            if layer >= num_layers - self.bf16_last_layers:
                return False
        return True

    def gemm_dtype(self, role: str, name: str = "", layer: int = -1, num_layers: int | None = None) -> str:
        """Input dtype of a GEMM of role ``fprop`` | ``dgrad`` | ``wgrad``, op ``name``, layer ``layer``."""
        if role not in ("fprop", "dgrad", "wgrad"):
            raise ValueError(f"unknown GEMM role {role!r}")
        dtype = {"fprop": self.fprop_dtype, "dgrad": self.dgrad_dtype, "wgrad": self.wgrad_dtype}[role]
        if dtype == "bf16" or name in self.bf16_gemms or not self.is_low_precision_layer(layer, num_layers):
            return "bf16"
        return dtype

    def op_gemm_dtype(self, op: ComputeOp, num_layers: int | None = None) -> str:
        """:meth:`gemm_dtype` of a GEMM op."""
        return self.gemm_dtype(gemm_role(op), op.name, op.layer, num_layers)

    def check_gpu(self, gpu: GPUSpec, field: str = "precision") -> None:
        """ConfigError unless ``gpu`` runs this recipe (generation and a peak for each dtype)."""
        if gpu.generation not in self.generations:
            raise ConfigError(field, self.name, f"needs a {' or '.join(self.generations)} GPU; "
                                                f"{gpu.name} is {gpu.generation}")
        for dtype in {self.fprop_dtype, self.dgrad_dtype, self.wgrad_dtype, self.attention_dtype}:
            if dtype not in gpu.peak_flops:
                raise ConfigError(field, self.name, f"{gpu.name} has no {dtype} peak in its GPUSpec")


_TE = "Transformer Engine transformer_engine.common.recipe and docs (support matrix, recipe pages)"

PRECISION_RECIPES: dict[str, PrecisionRecipe] = {r.name: r for r in (
    PrecisionRecipe(
        name="bf16", fprop_dtype="bf16", dgrad_dtype="bf16", wgrad_dtype="bf16",
        fprop_format="BF16", grad_format="BF16", scaling="none",
        source="Megatron-LM --bf16 (FP32 main params and grads; accumulate_allreduce_grads_in_fp32)"),
    PrecisionRecipe(
        name="fp8_delayed", fprop_dtype="fp8", dgrad_dtype="fp8", wgrad_dtype="fp8",
        fprop_format="E4M3", grad_format="E5M2", scaling="tensor_delayed",
        quantize_bytes_per_element=4.0, quantize_kernels=1, weight_quantize_bytes_per_param=4.0,
        extra_weight_bytes_per_param=2.0, tp_gather_bytes_per_element=1.0,
        generations=("hopper", "blackwell"),
        source=f"{_TE}: DelayedScaling(fp8_format=HYBRID, amax_history_len=1024); Megatron --fp8-format hybrid "
               "--fp8-recipe delayed"),
    PrecisionRecipe(
        name="fp8_tensorwise", fprop_dtype="fp8", dgrad_dtype="fp8", wgrad_dtype="fp8",
        fprop_format="E4M3", grad_format="E5M2", scaling="tensor_current",
        quantize_bytes_per_element=6.0, quantize_kernels=2, weight_quantize_bytes_per_param=6.0,
        extra_weight_bytes_per_param=2.0, tp_gather_bytes_per_element=1.0,
        generations=("hopper", "blackwell"),
        source=f"{_TE}: Float8CurrentScaling(fp8_format=HYBRID); Megatron --fp8-recipe tensorwise"),
    PrecisionRecipe(
        name="fp8_blockwise", fprop_dtype="fp8", dgrad_dtype="fp8", wgrad_dtype="fp8",
        fprop_format="E4M3", grad_format="E4M3", scaling="block_1x128", block_size=128,
        quantize_bytes_per_element=4.0 + 2 * 4 / 128, quantize_kernels=1,
        weight_quantize_bytes_per_param=4.0 + 2 * 4 / (128 * 128),
        extra_weight_bytes_per_param=2.0 + 2 * 4 / (128 * 128), tp_gather_bytes_per_element=1.0 + 4 / 128,
        generations=("hopper", "blackwell"),
        source=f"{_TE}: Float8BlockScaling (E4M3); DeepSeek-V3 report arXiv:2412.19437 §3.3; "
               "Megatron --fp8-recipe blockwise"),
    PrecisionRecipe(
        name="mxfp8", fprop_dtype="fp8", dgrad_dtype="fp8", wgrad_dtype="fp8",
        fprop_format="E4M3", grad_format="E4M3", scaling="mx_1x32", block_size=32,
        quantize_bytes_per_element=4.0 + 2 / 32, quantize_kernels=1,
        weight_quantize_bytes_per_param=4.0 + 2 / 32,
        extra_weight_bytes_per_param=2.0 + 2 / 32, tp_gather_bytes_per_element=1.0 + 1 / 32,
        generations=("blackwell",),
        source=f"{_TE}: MXFP8BlockScaling (E4M3, 32-element blocks, E8M0 scales); OCP Microscaling "
               "Formats (MX) v1.0; Megatron --fp8-recipe mxfp8"),
    PrecisionRecipe(
        name="nvfp4", fprop_dtype="fp4", dgrad_dtype="fp4", wgrad_dtype="fp4",
        fprop_format="E2M1", grad_format="E2M1", scaling="nv_1x16", block_size=16,
        quantize_bytes_per_element=2.0 + 2.0 + 0.5 + 0.5 + 2 / 16, quantize_kernels=2,
        weight_quantize_bytes_per_param=2.0 + 2.0 + 0.5 + 0.5 + 2 / 256,
        extra_weight_bytes_per_param=1.0 + 2 / 256,
        # SP all-gathers move NVFP4: Transformer Engine's _all_gather_nvfp4
        # (transformer_engine/pytorch/distributed.py, v2.10 on) quantises first and gathers the
        # packed 4-bit data and one E4M3 scale per 16 elements (the per-tensor amax is reduced
        # over the group beforehand: a few bytes); only shapes it cannot quantise go in BF16
        tp_gather_bytes_per_element=0.5 + 1 / 16,
        # no BF16 layers at the ends: Megatron-Bridge's bf16_with_nvfp4_mixed
        # (src/megatron/bridge/training/mixed_precision.py) leaves MixedPrecisionConfig's
        # first_last_layers_bf16 at False (0 + 0), as its performance recipes run it; NVIDIA's
        # NVFP4 pretraining study (arXiv:2509.25149) kept about 16 % of the blocks in BF16 for
        # accuracy -- ask for that with precision_options bf16_first_layers / _last_layers
        generations=("blackwell",),
        source=f"{_TE}: NVFP4BlockScaling (E2M1, 16-element blocks, E4M3 scales); NVIDIA, Pretraining LLMs "
               "with NVFP4, arXiv:2509.25149 (RHT on wgrad inputs, 2D weight scaling, SR); Megatron-Bridge "
               "bf16_with_nvfp4_mixed (no BF16 layers at the ends)"),
)}
"""Recipes by name: ``bf16``, ``fp8_delayed``, ``fp8_tensorwise``, ``fp8_blockwise``, ``mxfp8``, ``nvfp4``."""

_REDUCE_DTYPES = ("fp32", "bf16")

# Scale bytes per FP8 weight element: per-tensor scales are negligible; blockwise weights
# carry one FP32 scale per 128 x 128 block; MXFP8 one E8M0 byte per 32 elements.
_WEIGHT_SCALE_BYTES_PER_PARAM = {"tensor_delayed": 0.0, "tensor_current": 0.0, "block_1x128": 4 / (128 * 128),
                                 "mx_1x32": 1 / 32}


def get_recipe(name: str | PrecisionRecipe, *, grad_reduce_dtype: str | None = None,
               fp8_param_gather: bool = False, gpu: GPUSpec | None = None,
               field: str = "precision", bf16_first_layers: int | None = None,
               bf16_last_layers: int | None = None, fp4_param_gather: bool = False,
               fp8_attention: bool = False) -> PrecisionRecipe:
    """A precision recipe by name, with the scenario's overrides.

    Parameters
    ----------
    name
        A key of :data:`PRECISION_RECIPES` (or a recipe, returned with the overrides).
    grad_reduce_dtype
        ``fp32`` (default, Megatron with ``--bf16``) or ``bf16``.
    fp8_param_gather
        Megatron's ``--fp8-param-gather``: the parameter all-gather carries FP8 weights
        (1 byte/param plus scales) instead of BF16; FP8 recipes only.
    gpu
        When given, ConfigError unless the GPU's generation runs the recipe (MXFP8 and
        NVFP4 need Blackwell; per-tensor and block FP8 need Hopper or later).
    bf16_first_layers, bf16_last_layers
        Leading / trailing decoder layers whose GEMMs stay BF16 (Transformer Engine's
        ``num_layers_at_start_in_bf16`` / ``_at_end_in_bf16``); None: the recipe's
        (every recipe keeps none unless told).  Low-precision recipes only.
    fp4_param_gather
        Megatron-Core's ``fp4_param_gather`` (``DistributedDataParallelConfig``, Megatron-LM
        megatron/core/distributed/distributed_data_parallel_config.py @ d98e8a6): the
        distributed optimizer gathers the NVFP4 parameters -- 4-bit E2M1 data and one E4M3
        scale per 16 elements, 0.5 + 1/16 bytes per parameter -- instead of BF16; NVFP4 only.
    fp8_attention
        Megatron-Core's ``fp8_dot_product_attention`` (passed to Transformer Engine as
        ``fp8_dpa``: megatron/core/fp8_utils.py @ d98e8a6): core attention runs the FP8
        fused-attention kernel, costed at the FP8 row of the attention table; FP8 and NVFP4
        recipes only (Transformer Engine quantises Q, K, V under the autocast's recipe).

    Raises
    ------
    ConfigError
        Unknown name (the message lists the recipes), bad override, unsupported GPU.
    """
    if isinstance(name, PrecisionRecipe):
        recipe = name
    else:
        recipes = active_value("workloads.costs.precision.PRECISION_RECIPES", PRECISION_RECIPES)
        recipe = recipes.get(name) if isinstance(name, str) else None
        if recipe is None:
            raise ConfigError(field, name, f"unknown precision recipe; known: {', '.join(recipes)}")
    if grad_reduce_dtype is not None:
        if grad_reduce_dtype not in _REDUCE_DTYPES:
            raise ConfigError("grad_reduce_dtype", grad_reduce_dtype, f"must be one of {', '.join(_REDUCE_DTYPES)}")
        recipe = dataclasses.replace(recipe, grad_reduce_dtype=grad_reduce_dtype)
    if not isinstance(fp8_param_gather, bool):
        raise ConfigError("fp8_param_gather", fp8_param_gather, "must be true or false")
    if fp8_param_gather:
        if recipe.fprop_dtype != "fp8":
            raise ConfigError("fp8_param_gather", True, f"needs an FP8 recipe; precision is {recipe.name}")
        recipe = dataclasses.replace(
            recipe, param_gather_bytes_per_param=1.0 + _WEIGHT_SCALE_BYTES_PER_PARAM[recipe.scaling])
    recipe = _low_precision_options(recipe, fp4_param_gather, fp8_attention)
    for key, value in (("bf16_first_layers", bf16_first_layers), ("bf16_last_layers", bf16_last_layers)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"precision_options.{key}", value, "must be an integer >= 0")
        if recipe.fprop_dtype == "bf16" and value:
            raise ConfigError(f"precision_options.{key}", value, f"needs a low-precision recipe; precision is "
                                                                 f"{recipe.name}")
        recipe = dataclasses.replace(recipe, **{key: value})
    if gpu is not None:
        recipe.check_gpu(gpu, field)
    return recipe


FP4_PARAM_GATHER_BYTES_PER_PARAM = 0.5 + 1 / 16
"""An NVFP4 parameter on the wire: a 4-bit E2M1 value plus its share of the E4M3 scale of
each 16-element block (Transformer Engine NVFP4BlockScaling; the per-tensor FP32 amax is a few
bytes per tensor)."""


def _low_precision_options(recipe: PrecisionRecipe, fp4_param_gather, fp8_attention) -> PrecisionRecipe:
    """``recipe`` with FP4 parameter gathers and FP8 attention, each checked against it."""
    for key, value in (("fp4_param_gather", fp4_param_gather), ("fp8_attention", fp8_attention)):
        if not isinstance(value, bool):
            raise ConfigError(f"precision_options.{key}", value, "must be true or false")
    if fp4_param_gather:
        if recipe.fprop_dtype != "fp4":
            raise ConfigError("precision_options.fp4_param_gather", True,
                              f"needs the NVFP4 recipe; precision is {recipe.name}")
        recipe = dataclasses.replace(recipe, param_gather_bytes_per_param=FP4_PARAM_GATHER_BYTES_PER_PARAM)
    if fp8_attention:
        if recipe.fprop_dtype == "bf16":
            raise ConfigError("precision_options.fp8_attention", True,
                              f"needs an FP8 or NVFP4 recipe; precision is {recipe.name}")
        recipe = dataclasses.replace(recipe, attention_dtype="fp8")
    return recipe


# -- quantisation ops ------------------------------------------------------------------------------
def _quantized_elements(op: ComputeOp) -> float:
    """Elements of the GEMM input this op must quantise: X (m x k) for fprop, dY (m x k of
    the dgrad GEMM) for dgrad; wgrad reuses both (quantised column-wise with them)."""
    role = gemm_role(op)
    if role == "wgrad":
        return 0.0
    tokens = sum(op.groups) if op.groups else op.m
    return float(tokens) * op.k


def quantize_ops(recipe: PrecisionRecipe, ops: Iterable[ComputeOp], num_layers: int | None = None) -> list[ComputeOp]:
    """The memory-bound quantisation ops the recipe adds for ``ops``.

    One op ``<gemm>.quantize`` per low-precision fprop GEMM (its input activations) and per
    low-precision dgrad GEMM (the incoming gradient), in the same phase, layer and
    recompute flag; wgrad reuses the column-wise copies made then.  Weights are quantised
    once per step (:func:`weight_quantize_op`).  Empty for ``bf16``.
    """
    out = []
    for op in ops:
        if op.op_class != "gemm" or recipe.op_gemm_dtype(op, num_layers) == "bf16":
            continue
        elems = _quantized_elements(op)
        if elems:
            out.append(ComputeOp(f"{op.name}.quantize", op.phase, "elementwise", 0.0, 0, 0, 0,
                                 elems * recipe.quantize_bytes_per_element, recipe.quantize_kernels, op.layer,
                                 op.recompute, op.groups, quantizes=op.name))
    return out


# torchao's float8 training (pytorch/ao, v0.13.0), what torchtitan's ``float8`` converter
# swaps in: ``torchao/float8/float8_linear.py`` ``matmul_with_hp_or_float8_args`` casts, per
# linear and micro-batch, the input and the weight in the forward, and in the backward the
# output gradient twice (for dgrad, and along the other dim for wgrad), the weight again
# (transposed, for dgrad) and the saved BF16 input again (for wgrad): six dynamic casts, the
# weights' each micro-batch (no per-step cache).  One tensorwise cast
# (``float8_scaling_utils.hp_tensor_to_float8_dynamic``): ``float8_utils.tensor_to_amax``
# ``max(abs(x))`` and ``amax_to_scale`` (to float64, clamp, divide, to float32: per-tensor
# scalars), then ``float8_training_tensor._ToFloat8ConstrFunc`` ``x.to(float32) * scale`` and
# ``to_fp8_saturated`` (clamp, ``.to(float8)``).  Bytes per element and kernels of one cast:
# eager -- abs (2 + 2), max (2), to float32 (2 + 4), * scale (4 + 4), clamp (4 + 4), to float8
# (4 + 1) = 33 B in 10 kernels (4 of them on the scalar amax); under torch.compile Inductor
# fuses them into an amax reduction (read 2) and one cast (read 2, write 1) = 5 B in 2 kernels.
TORCHAO_CAST = {"torchao_eager": (33.0, 10), "torchao_compiled": (5.0, 2)}
#: How a stack's float8 casts run (``Fusion.float8_casts``): Transformer Engine's fused
#: cast-transposes (the recipe's bytes) or torchao's dynamic casts, eager or compiled.
FLOAT8_CASTS = ("te", *TORCHAO_CAST)


def _torchao_cast_elements(op: ComputeOp) -> float:
    """Elements torchao casts around one GEMM: fprop -- the input (m x k) and the weight
    (n x k); dgrad -- the output gradient twice (m x k), the weight again (n x k) and the
    forward's input for wgrad (m x n); wgrad -- none (it uses those)."""
    role = gemm_role(op)
    tokens = float(sum(op.groups) if op.groups else op.m)
    weight = float(op.n) * op.k * (len(op.groups) if op.groups else 1)
    if role == "fprop":
        return tokens * op.k + weight
    if role == "dgrad":
        return 2 * tokens * op.k + weight + tokens * op.n
    return 0.0


def uses_torchao_casts(recipe: PrecisionRecipe, casts: str) -> bool:
    """Whether torchao's casts replace the recipe's: torchao's tensorwise recipe under a stack
    that runs it (the recipe ``fp8_tensorwise``; the other recipes keep their own casts)."""
    if casts not in FLOAT8_CASTS:
        raise ConfigError("float8 casts", casts, f"must be one of {', '.join(FLOAT8_CASTS)}")
    return casts != "te" and recipe.scaling == "tensor_current"


def with_quantize_ops(recipe: PrecisionRecipe, ops: Iterable[ComputeOp], num_layers: int | None = None,
                      casts: str = "te") -> list[ComputeOp]:
    """``ops`` with each quantisation op of :func:`quantize_ops` placed just before its GEMM;
    with torchao's casts (:func:`uses_torchao_casts`), their bytes and kernels instead."""
    torchao = uses_torchao_casts(recipe, casts)
    out = []
    for op in ops:
        if torchao and op.op_class == "gemm" and recipe.op_gemm_dtype(op, num_layers) != "bf16":
            elems = _torchao_cast_elements(op)
            if elems:
                nbytes, kernels = TORCHAO_CAST[casts]
                casts_here = 2 if gemm_role(op) == "fprop" else 4
                out.append(ComputeOp(f"{op.name}.quantize", op.phase, "elementwise", 0.0, 0, 0, 0, elems * nbytes,
                                     kernels * casts_here, op.layer, op.recompute, op.groups, quantizes=op.name))
        else:
            out.extend(quantize_ops(recipe, (op,), num_layers))
        out.append(op)
    return out


def weight_quantize_op(recipe: PrecisionRecipe, num_params: float) -> ComputeOp | None:
    """The once-per-step quantisation of ``num_params`` local weights of quantised GEMMs
    (phase ``F``, before the first micro-batch's forward); None for BF16."""
    if recipe.weight_quantize_bytes_per_param == 0 or num_params == 0:
        return None
    if not (num_params >= 0 and math.isfinite(num_params)):
        raise ConfigError("num_params", num_params, "must be a non-negative number")
    return ComputeOp("weight_quantize", "F", "elementwise", 0.0, 0, 0, 0,
                     float(num_params) * recipe.weight_quantize_bytes_per_param, 1, -1)
