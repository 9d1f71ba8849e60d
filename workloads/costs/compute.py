"""Compute-time models: how long one :class:`~workloads.costs.flops.ComputeOp` runs on one GPU.

The interface is :class:`ComputeModel` -- ``op_time_s(op)`` and the vectorised
``op_times_s(ops)``.  Two implementations:

* :class:`RooflineComputeModel` (default), built from four named sub-models::

      time = max(flops / (peak x efficiency), bytes / (HBM bandwidth x memory efficiency))
             + kernels x launch cost

  (a) :class:`GemmModel` -- GEMM efficiency = the measured maximum achievable matmul
      FLOP/s (MAMF, ``GPUSpec.mamf_flops``) scaled by tile and wave quantisation of the
      actual sharded ``M, N, K`` and a per-tile fixed cost that penalises small ``K``;
  (b) :class:`AttentionModel` -- FlashAttention forward / backward efficiency per GPU
      generation, from the FlashAttention-2/-3/-4 papers, with a sequence-length ramp;
  (c) :class:`MemoryModel` -- element-wise ops (norms, RoPE, SwiGLU, bias-dropout-add,
      permutation, cross-entropy, optimizer, FP8 casts) as bytes over HBM at an
      achievable fraction of the datasheet bandwidth;
  (d) :class:`LaunchModel` -- a fixed cost per kernel launch, much smaller under CUDA graphs;
      the host's own issue time per kernel (:data:`HOST_COSTS`) is not part of an op's
      time: the engine runs a host cursor per rank that the GPU may have to wait for;

  and GEMM and attention efficiencies are scaled by :data:`SUSTAINED_FRACTION`, the
  tensor-core rate a GPU holds at its power limit under a full node's training load
  relative to the short-run benchmarks (MAMF, FlashAttention figures) the sub-models
  reproduce.

  The GEMM dtype of each op comes from the precision recipe
  (:mod:`workloads.costs.precision`): fprop, dgrad and wgrad may run in different dtypes,
  the output layer and router stay BF16, attention runs in the recipe's attention dtype.
  MoE experts are grouped GEMMs timed on the rank's actual tokens per expert: a group of
  few tokens fills few rows of its tiles (and, in wgrad, runs a short ``K``), so expert
  efficiency falls as tokens per expert shrink; the permutation around them is
  memory-bound.

* :class:`MeasuredComputeModel` -- per-op times from a CSV of measurements, falling back
  to another model (named by :meth:`MeasuredComputeModel.source_of`) for ops not in it.

A job on N GPUs runs at its slowest chip: :data:`CHIP_SPREAD` and :func:`slowest_chip_factor`
scale the sustained fractions by the expected minimum of N chips (``num_gpus``).

Not modelled here: the slowdown of compute kernels that share the GPU with communication
kernels (a simulator concern), L2 reuse between consecutive kernels.
"""

from __future__ import annotations

import csv
import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from topologies import ConfigError, GPUSpec, get_gpu_spec
from topologies.constants import Constants, active, using

from .flops import PHASES, ComputeOp, gemm_role
from .host import CUDA_GRAPH_SCOPES, HOST_COSTS, HOST_MODES, HostCosts, host_costs  # noqa: F401 (re-exported)
from .kernel_tables import AttentionTables, default_attention_tables
from .precision import PrecisionRecipe, get_recipe

__all__ = ["ComputeModel", "RooflineComputeModel", "MeasuredComputeModel", "GemmModel", "AttentionModel",
           "MemoryModel", "LaunchModel", "OpCost", "SM_COUNTS", "GEMM_TILES", "MAMF_BEST_SHAPES",
           "MAMF_FALLBACK_FRACTION", "FLASH_ATTENTION_EFFICIENCY", "ATTENTION_BACKENDS",
           "BACKEND_HEAD_DIM_FACTOR", "FA_HEAD_DIM_FACTOR", "head_dim_factor", "SUSTAINED_FRACTION", "CHIP_SPREAD",
           "slowest_chip_factor", "expected_max_normal", "HBM_EFFICIENCY", "KERNEL_HBM_FRACTION", "LAUNCH_OVERHEAD_S",
           "MEASURED_ATTENTION_KERNELS", "MODEL_ATTENTION_BACKEND", "HOST_MODES", "HOST_COSTS", "HostCosts", "host_costs", "CUDA_GRAPH_SCOPES", "COMPUTE_MODELS", "get_compute_model", "num_sms"]


# -- constants, each with its source -----------------------------------------------------------
# The module attributes below are the documented defaults; a model reads them through the
# Constants object of its run (topologies.constants), named with this prefix.
_C = "workloads.costs.compute."

SM_COUNTS: dict[str, int] = {
    # Streaming multiprocessors per GPU.  A100: NVIDIA A100 Tensor Core GPU Architecture
    # whitepaper (108 SMs enabled of 128).  H100 SXM5 / H200 / H800: NVIDIA H100 Tensor Core
    # GPU Architecture whitepaper (132 SMs for SXM5; H200 and H800 are the same GH100
    # configuration).  B200 / GB200: 148 SMs as reported by cudaGetDeviceProperties on B200
    # systems (2 dies x 74 enabled; not in an NVIDIA datasheet).  B300 / GB300 (Blackwell
    # Ultra): 160 SMs (NVIDIA Technical Blog, "Inside NVIDIA Blackwell Ultra", 2025).
    "GB300": 160, "B300": 160, "GB200": 148, "B200": 148, "H800": 132, "H200": 132, "H100": 132, "A100": 108,
}
_SMS_BY_GENERATION = {"ampere": 108, "hopper": 132, "blackwell": 148}


def num_sms(gpu: GPUSpec, counts: dict[str, int] | None = None) -> int:
    """SMs of ``gpu``: its own count (``GPUSpec.sm_count``: AMD compute units, a custom GPU's
    ``sm_count``), else from ``counts`` (default :data:`SM_COUNTS`) by name prefix, else by
    generation."""
    if gpu.sm_count:
        return gpu.sm_count
    name = gpu.name.upper()
    for prefix, n in (SM_COUNTS if counts is None else counts).items():   # longest prefixes first (GB300 before B300)
        if name.startswith(prefix):
            return n
    return _SMS_BY_GENERATION.get(gpu.generation, 132)


GEMM_TILES: tuple[tuple[int, int], ...] = ((128, 256), (256, 128), (128, 128))
"""Output tiles (rows x columns) one SM computes per work unit; the model takes the one
with the best utilisation for each shape, as cuBLAS's heuristics pick among kernels.
128x256 / 256x128 with two consumer warp groups and 128x128 are the BF16/FP8 tiles of
CUTLASS's Hopper warp-specialised GEMMs (NVIDIA/cutlass ``examples/48_hopper_warp_specialized_gemm``,
``include/cutlass/gemm/collective/builders/sm90_gmma_builder.inl``) and common cuBLAS
kernel names (``..._128x256x64_...``); Ampere's CUTLASS SM80 kernels use the same
threadblock tiles, and Blackwell's 2-SM 256x256 UMMA tile is 128x256 per SM.  All tiles
are given the same per-SM throughput (the larger tiles' better data reuse is inside the
measured MAMF), so for quantisation the finest tile, 128 x 128, never loses: the set
models cuBLAS's freedom to pick a smaller tile for an awkward shape.  Split-K and
stream-K kernels, which cuBLAS uses to soften wave quantisation, are not modelled."""

GEMM_K_BLOCK = 64
"""K step of one main-loop iteration (64 for BF16 tiles in CUTLASS SM80/SM90 kernels):
``K`` is rounded up to it."""

GEMM_K_OVERHEAD = 128
"""Per-tile fixed cost in units of ``K``: prologue (filling the shared-memory pipeline)
and epilogue (writing the output tile) take about two 64-deep main-loop iterations.  An
assumption that makes small-``K`` GEMMs (MoE wgrad with few tokens per expert, MLA
down-projections) slower, consistent in shape with the fall-off of mamf-finder sweeps at
small ``K``; calibrate with :class:`MeasuredComputeModel` where it matters."""

MAMF_BEST_SHAPES: dict[tuple[str, str], tuple[int, int, int]] = {
    # (GPU, dtype) -> the M x N x K at which the MAMF in GPUSpec.mamf_flops was measured
    # (stas00/ml-engineering mamf-finder results and their notes).
    ("A100-SXM4-80GB", "bf16"): (1024, 10240, 5120),
    ("H100-SXM", "bf16"): (2048, 2048, 13312),
    ("H100-SXM", "fp8"): (1024, 9216, 14336),
    ("H200-SXM", "bf16"): (2048, 2048, 13312),     # "H200 is the same" as H100
    ("H200-SXM", "fp8"): (1280, 4096, 12032),
    ("B200", "bf16"): (1792, 16128, 3072),
    ("MI300X", "bf16"): (10240, 15360, 8192),    # torch 2.5.1 + ROCm 6.3, PYTORCH_TUNABLEOP_ENABLED=1
}
_DEFAULT_BEST_SHAPE = (8192, 8192, 8192)

MAMF_FALLBACK_FRACTION: dict[tuple[str, str], float] = {
    # MAMF / dense peak where GPUSpec.mamf_flops has no entry for a dtype: the measured
    # MAMF fractions of the same generation's measured GPU (stas00/ml-engineering mamf-finder).
    ("ampere", "bf16"): 0.869,      # A100 SXM 271.2 / 312
    ("ampere", "fp16"): 0.869,
    ("hopper", "bf16"): 0.803,      # H100 SXM 794.5 / 989
    ("hopper", "fp16"): 0.803,
    ("hopper", "fp8"): 0.709,       # H100 SXM 1402.6 / 1979
    ("blackwell", "bf16"): 0.729,   # the lowest Blackwell row: GB200 1822 / 2500 (B200 77.6 %, B300 78.6 %)
    ("blackwell", "fp16"): 0.729,
    ("blackwell", "fp8"): 0.723,    # GB200 3615.6 / 5000 (B200 76.3 %, B300 74.5 %)
}
_MAMF_DEFAULT_FRACTION = 0.70
"""Fallback for dtypes never measured (FP4, TF32): an assumption, below every measured row."""

FLASH_ATTENTION_EFFICIENCY: dict[tuple[str, str], dict[str, float]] = {
    # (generation, dtype) -> {"F": forward, "B": backward} fraction of the dense peak of
    # that dtype, at long sequences (16k), head dim 128, relative to the FLOPs counted as in
    # flash-attention's benchmark (causal: half; backward: 2.5 x forward).
    #
    # Ampere, FA2 (Dao, arXiv:2307.08691, §4.1 and Fig. 4-6 on A100 80GB): forward
    # 50-73 % of peak ("up to 230 TFLOPs/s"), backward lower (about 160-190 TFLOP/s for
    # head dim 128 at long sequences).
    ("ampere", "bf16"): {"F": 0.70, "B": 0.55},
    ("ampere", "fp16"): {"F": 0.70, "B": 0.55},
    # Hopper, FA3 (Shah et al., arXiv:2407.08608): BF16/FP16 forward up to 740 TFLOP/s
    # (75 % of 989) for long sequences, causal head dim 128 a few points lower; backward
    # about 1.5-1.75x FA2's, 450-550 TFLOP/s (Fig. 6).  FP8 forward "close to 1.2
    # PFLOPs/s" (61 % of 1979); the FP8 backward is not in the paper: assumed 0.45.
    ("hopper", "bf16"): {"F": 0.72, "B": 0.52},
    ("hopper", "fp16"): {"F": 0.72, "B": 0.52},
    ("hopper", "fp8"): {"F": 0.60, "B": 0.45},
    # Blackwell, FA4 (Zadouri, Dao et al., arXiv:2603.05451; Together AI blog
    # "FlashAttention-4"): BF16 forward up to 1605-1613 TFLOP/s on B200 (71 %); the backward
    # is assumed at Hopper's backward/forward ratio (0.72 -> 0.52), and FP8 as on Hopper.
    ("blackwell", "bf16"): {"F": 0.71, "B": 0.51},
    ("blackwell", "fp16"): {"F": 0.71, "B": 0.51},
    ("blackwell", "fp8"): {"F": 0.60, "B": 0.45},
}

ATTENTION_BACKENDS: dict[str, dict[tuple[str, str], dict[str, float]]] = {
    # backend -> (generation, dtype) -> {"F", "B"} fraction of the dense peak, as in
    # FLASH_ATTENTION_EFFICIENCY (16k tokens, head dim 128, causal), for fused attention
    # kernels other than each generation's best.  "flash" is FLASH_ATTENTION_EFFICIENCY itself.
    #
    # flash_attention_1: the CUDA FlashAttention v1 (written for Ampere's mma instructions).
    # Measured on A100 80GB and H100 80GB in the same charts
    # (experiments/reference/kernels/flash_attention_readme_charts.csv): forward + backward
    # 83 and 137 TFLOP/s at 16k tokens, causal, head dim 128 (FlashAttention-2: 189 and 328).
    # The charts give forward + backward only; the split is taken from FlashAttention-2's
    # Ampere entry (B / F = 0.55 / 0.70): an assumption.  With backward FLOPs 2.5x the
    # forward, the combined fraction is 3.5 F / (1 + 2.5 / 0.786) = 0.837 F: A100
    # F = 83 / 312 / 0.837 = 0.318, H100 F = 137 / 989 / 0.837 = 0.1655.  Blackwell: none.
    "flash_attention_1": {
        ("ampere", "bf16"): {"F": 0.318, "B": 0.250},
        ("ampere", "fp16"): {"F": 0.318, "B": 0.250},
        ("hopper", "bf16"): {"F": 0.1655, "B": 0.130},
        ("hopper", "fp16"): {"F": 0.1655, "B": 0.130},
    },
    # flash_attention_2: the CUDA FlashAttention-2 (flash-attn 2.x) on any GPU -- on Hopper
    # slower than that generation's best ("flash": FA3-class), since FA2 does not use
    # Hopper's wgmma/TMA.  Same charts: 189 (A100) and 328 (H100) TFLOP/s forward + backward
    # at 16k, causal, head dim 128.  Ampere is the "flash" entry (FA2 itself, 183 TFLOP/s by
    # the formula above).  Hopper, same split and formula: F = 328 / 989 / 0.837 = 0.396,
    # B = 0.786 F = 0.311.
    "flash_attention_2": {
        ("ampere", "bf16"): {"F": 0.70, "B": 0.55},
        ("ampere", "fp16"): {"F": 0.70, "B": 0.55},
        ("hopper", "bf16"): {"F": 0.396, "B": 0.311},
        ("hopper", "fp16"): {"F": 0.396, "B": 0.311},
    },
    # cudnn_sdpa: PyTorch SDPA's cuDNN backend (SDPBackend.CUDNN_ATTENTION).  Hopper: the
    # FlashAttention-3 paper's BF16 forward benchmark on H100 SXM5, causal, head dim 128,
    # 16k tokens (Shah et al., arXiv:2407.08608): cuDNN 595 against FA3 648 TFLOP/s (0.918)
    # -> F = 0.72 x 0.918 = 0.661; the backward is assumed at the same ratio (0.52 x 0.918).
    # Blackwell: cuDNN is the kernel Transformer Engine runs there, the "flash" entry.  Ampere:
    # the torch FlashAttention-2 the SDPA falls back to (an assumption: cuDNN's Ampere kernel
    # is not benchmarked in the sources), the "flash" (FA2) entry.
    "cudnn_sdpa": {
        ("ampere", "bf16"): {"F": 0.70, "B": 0.55},
        ("ampere", "fp16"): {"F": 0.70, "B": 0.55},
        ("hopper", "bf16"): {"F": 0.661, "B": 0.477},
        ("hopper", "fp16"): {"F": 0.661, "B": 0.477},
        ("blackwell", "bf16"): {"F": 0.71, "B": 0.51},
        ("blackwell", "fp16"): {"F": 0.71, "B": 0.51},
    },
}
"""Fused attention kernels by name (:attr:`workloads.blocks.fusion.Fusion.attention_backend`)."""

MEASURED_ATTENTION_KERNELS: dict[str, dict[str, str]] = {
    # attention backend -> GPU generation -> the measured kernel of workloads.costs.kernel_tables
    # that runs it there; the model's figures ("flash") where none is listed or no table covers
    # the op.  te_fused: Transformer Engine's DotProductAttention, which prefers FusedAttention
    # (cuDNN) over FlashAttention on compute capability >= 9.0 ("Disabling FlashAttention to give
    # FusedAttention preference on Hopper+ for performance reasons",
    # NVIDIA/TransformerEngine transformer_engine/pytorch/attention/dot_product_attention/utils.py
    # get_attention_backend); on Ampere it runs FlashAttention-2.
    "te_fused": {"hopper": "cudnn", "blackwell": "cudnn"},
    # cudnn_sdpa: PyTorch SDPA's cuDNN backend calls the same cuDNN fused-attention graph
    # (aten/src/ATen/native/transformers/cuda/attention.cu -> cudnn-frontend SDPA), so the
    # same curves time it; outside them its own modelled figures (ATTENTION_BACKENDS).
    "cudnn_sdpa": {"hopper": "cudnn", "blackwell": "cudnn"},
}
"""Backends timed from measured tables where a table covers the op."""

MODEL_ATTENTION_BACKEND: dict[str, str] = {"te_fused": "flash"}
"""The modelled figures a measured backend falls back to outside its tables."""

BACKEND_HEAD_DIM_FACTOR: dict[str, tuple[tuple[int, float], ...]] = {
    # backend -> its own FA_HEAD_DIM_FACTOR.  FlashAttention v1 is faster per FLOP at head
    # dim 64 than at 128 (causal, 16k tokens: A100 97 / 83 = 1.17, H100 156 / 137 = 1.14 in
    # flash_attention_readme_charts.csv); 1.15 taken for both.
    "flash_attention_1": ((64, 1.15), (128, 1.0)),
    # FlashAttention-2 in the same charts, causal, 16k: A100 171 / 189 = 0.905, H100
    # 284 / 328 = 0.866 at head dim 64; 0.885 taken for both.
    "flash_attention_2": ((64, 0.885), (128, 1.0)),
}
"""Head-dim factors of the backends whose head-dim behaviour differs from FlashAttention's."""

FA_HEAD_DIM_FACTOR: tuple[tuple[int, float], ...] = (
    # (head dim, attention efficiency relative to head dim 128): FLASH_ATTENTION_EFFICIENCY
    # holds for head dim 128.  FlashAttention-3 paper (Shah et al., arXiv:2407.08608), its
    # BF16 forward benchmark on H100 SXM5 at 16k tokens: 497 TFLOP/s at head dim 64 against
    # 648 at head dim 128 (cuDNN's kernel in the same figures: 413 against 595, 0.69): fewer
    # FLOPs per byte of K/V loaded and per softmax element.  Taken for the backward and for
    # Blackwell as well (no published head-dim-64 figure of either): an assumption.  Linear
    # in between; head dims below 64 take the 64 factor, above 128 the 128 one.
    (64, 497.0 / 648.0),
    (128, 1.0),
)

FA_SEQ_HALF = 384
"""Sequence-length ramp of attention efficiency: ``eff(s) = eff_16k x r(s) / r(16384)``
with ``r(s) = s / (s + 384)`` (capped at ``eff_16k``): 98 % of the long-sequence value at
8k queries, 86 % at 2k, 58 % at 512 -- the shape of the causal curves in the FA2/FA3
papers' figures (fewer query blocks per head fill fewer SMs; fixed per-block work).  A fit
by eye; ``s`` is the query length per sequence on the rank (``s / cp`` under CP)."""
_FA_REFERENCE_SEQ = 16384

SUSTAINED_FRACTION: dict[str, dict[str, float]] = {
    # generation -> {"gemm": ..., "attention": ...}: the tensor-core rate a GPU holds under a
    # full node's sustained training load, as a fraction of the short-run measurements the
    # GEMM and attention sub-models are anchored on.  Dense GEMMs drive an SXM part to its
    # power limit within milliseconds, and GPU Boost then lowers the SM clock.  Source:
    # stas00/ml-engineering compute/accelerator/benchmarks/README.md ("What was measured:
    # alone vs all-8 concurrent", mamf-finder-all-gpus.py, torch 2.14+cu130): MSMF, the
    # mean rate over a 4 s window that holds steady, with every GPU of the node computing,
    # against MAMF, the median of the 5 fastest boost-clock iterations:
    #   H200 BF16: node MSMF 755 TFLOP/s, slowest GPU 745; MAMF 852.1 (all 8 GPUs, n=40).
    #   B200 BF16: node MSMF 1439, slowest GPU 1421; MAMF 1746.7.
    # A synchronous job runs at its slowest GPU, so the slowest-GPU MSMF is used.
    # "gemm": over the MAMF of GPUSpec.mamf_flops (hardware.csv: H100/H200 794.5, B200
    #   1745.0, measured with the older mamf-finder's mean of 100 iterations per shape):
    #   Hopper 745 / 794.5 = 0.938, Blackwell 1421 / 1745.0 = 0.814.
    # "attention": over boost-clock kernel benchmarks (the FlashAttention papers' figures,
    #   FLASH_ATTENTION_EFFICIENCY): the MSMF / burst-MAMF clock ratio, Hopper 745 / 852.1 =
    #   0.874, Blackwell 1421 / 1746.7 = 0.814.
    # H100 (700 W, GH100) is taken equal to the measured H200 (same die and power limit), B300
    # and GB200/GB300 equal to the measured B200, and FP8 equal to BF16 (the clock is what
    # drops): assumptions.
    # Ampere: no MSMF of an A100 SXM is published in these sources; the sustained clock is:
    # NVIDIA computes the A100's HPL Rpeak at 1305 MHz, "the clock that can be sustained at
    # a GPU's power limit while running HPL", against the 1410 MHz boost clock
    # (glennklockwood.com/garden/peak-FLOPS).  The A100 MAMF (271.2, one GPU, short runs) is
    # taken as measured at the boost clock, so both fractions are 1305 / 1410 = 0.926: the
    # clock ratio, as Hopper's attention fraction is.  Consistent with H. He, "Strangely,
    # Matrix Multiplications on GPUs Run Faster When Given 'Predictable' Data" (thonking.ai,
    # 2024): an A100 8192^3 cuBLAS GEMM runs 257 TFLOP/s on randn inputs and 295 on zeros,
    # i.e. the part is power-limited at its 400 W on real data.
    "hopper": {"gemm": 745.0 / 794.5, "attention": 745.0 / 852.1},
    "blackwell": {"gemm": 1421.0 / 1745.0, "attention": 1421.0 / 1746.7},
    "ampere": {"gemm": 1305.0 / 1410.0, "attention": 1305.0 / 1410.0},
}

_E_MAX_8 = 1.4236
"""Expected maximum of 8 standard normals (:func:`expected_max_normal` ``(8)``; a test checks)."""

CHIP_SPREAD: dict[str, tuple[float, int]] = {
    # generation -> (sigma, n_ref).  Chips of one model differ in the clock they hold at the
    # power limit, and each keeps its place: stas00/ml-engineering, "alone vs all-8
    # concurrent" (source of SUSTAINED_FRACTION above): across 5 rounds on all 8 GPUs of a
    # node, "each GPU stays in its own part of that range" -- on B200 GPU0 averaged 1417,
    # GPU5 1472.  A synchronous job waits on its slowest chip, so on N GPUs it runs at the
    # expected minimum of N chips, mean x (1 - sigma x e(N)), e(N) the expected maximum of N
    # standard normals (e(8) = 1.42, e(512) = 3.04, e(2048) = 3.44).
    # sigma, the chip-to-chip spread of the sustained rate over its mean: from the node's
    # median GPU against its slowest (both in SUSTAINED_FRACTION's source), (median -
    # slowest) / median = sigma x e(8): Hopper (H200) (755 - 745) / 755 / 1.42 = 0.93 %,
    # Blackwell (B200) (1439 - 1421) / 1439 / 1.42 = 0.88 %.
    # n_ref: the chip SUSTAINED_FRACTION already stands for: Hopper and Blackwell the slowest
    # of a measured 8-GPU node (n_ref 8); Ampere a typical chip (NVIDIA's HPL clock; n_ref 1).
    # Ampere's sigma is taken equal to Hopper's (no A100 per-chip measurement in these
    # sources): an assumption.  The order of magnitude agrees with Sinha et al., "Not All
    # GPUs Are Created Equal" (SC22, arXiv 2208.11035): across >90 % of the GPUs of V100 and
    # MI60 clusters, "8% (max 22%) average performance variation" for one SKU -- about 6
    # sigma of ~1.3 % between the fastest and slowest of thousands.
    "hopper": ((755.0 - 745.0) / 755.0 / _E_MAX_8, 8),
    "blackwell": ((1439.0 - 1421.0) / 1439.0 / _E_MAX_8, 8),
}
CHIP_SPREAD["ampere"] = (CHIP_SPREAD["hopper"][0], 1)


def expected_max_normal(n: int) -> float:
    """E[max of ``n`` independent standard normals] (0 for ``n`` <= 1), by quadrature."""
    if n <= 1:
        return 0.0
    return _expected_max_normal(int(n))


@functools.lru_cache(maxsize=256)
def _expected_max_normal(n: int) -> float:
    x, dx = np.linspace(-8.0, 8.0, 16001, retstep=True)
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    cdf = 0.5 * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in x]))
    y = x * n * pdf * cdf ** (n - 1)
    return float((y.sum() - 0.5 * (y[0] + y[-1])) * dx)     # trapezoid rule


def slowest_chip_factor(generation: str, num_gpus: int | None, spread: dict | None = None) -> float:
    """Sustained tensor rate of the slowest of ``num_gpus`` chips relative to the chip
    :data:`SUSTAINED_FRACTION` stands for (``spread``, default :data:`CHIP_SPREAD`); 1.0 when
    ``num_gpus`` is None or the generation has no measured spread."""
    spread = CHIP_SPREAD if spread is None else spread
    if num_gpus is None or generation not in spread:
        return 1.0
    sigma, n_ref = spread[generation]
    return (1.0 - sigma * expected_max_normal(num_gpus)) / (1.0 - sigma * expected_max_normal(n_ref))


HBM_EFFICIENCY = 0.85
"""Achievable fraction of the datasheet HBM bandwidth for fused element-wise kernels.  A
device-to-device copy or STREAM triad on H100 SXM measures about 3.0-3.1 TB/s of 3.35
(90-92 %, public STREAM/nvbandwidth reports); kernels with reductions (norms, softmax)
or strided access (permutation) run somewhat below a copy, hence 0.85 for all
generations."""

KERNEL_HBM_FRACTION: dict[str, dict[str, float]] = {
    # op name -> {"F": forward, "B": backward}: the fraction of the datasheet HBM bandwidth
    # that these element-wise ops' real kernels reach, used instead of HBM_EFFICIENCY.
    # Measured on one H200 SXM (4.8 TB/s; experiments/microbench/mamba_bench.py, data in
    # experiments/microbench/data/h200_mamba*.json): bytes counted by workloads.costs.flops
    # over the measured time, the median of the three per-rank Mamba layers of the Nemotron 3
    # rows (Nano TP 1 micro-batch 2; Super TP 2 and TP 1, micro-batch 1; sequence 8192).
    # ssd_scan: mamba_ssm 2.3.2's Triton SSD kernels (mamba_scan_kernels' bytes) replayed from
    #   a CUDA graph, less 0.5 us per launch: forward 0.522 / 0.475 / 0.492, backward 0.485 /
    #   0.451 / 0.489.  Neither bound holds: their FLOPs (3.4 MFLOP per token and layer forward
    #   for Nano) take under a tenth of the time at the tensor peak, and the bytes about half.
    # gated_norm: mamba_ssm's Triton grouped RMSNorm (RMSNormGated without z), the kernels'
    #   own times (torch.profiler): forward 0.685 / 0.816 / 0.820, backward 0.219 / 0.197 /
    #   0.206 (its backward kernel loops over rows inside each of SMs x groups programs).
    # A plain copy of the same T x d tensor reached 0.66-0.79 on that GPU.
    # Blackwell (and every other GPU): the same fractions of its own datasheet bandwidth (B200,
    # GB200: 8 TB/s, topologies/specs.py), the rule HBM_EFFICIENCY applies to all element-wise
    # kernels.  An assumption, not measured: kernels this far below their bandwidth are partly
    # bound by latency and SM issue; if they scaled with SMs x clock instead (148 x 1.965 GHz
    # against 132 x 1.98 GHz, 1.11x rather than the bandwidth's 1.67x), they would take 1.5x
    # the time modelled here on Blackwell.
    "ssd_scan": {"F": 0.492, "B": 0.485},
    "gated_norm": {"F": 0.816, "B": 0.206},
}

LAUNCH_OVERHEAD_S: dict[bool, float] = {
    # Per kernel.  Eager: a CUDA kernel launch costs a few microseconds of host time
    # (NVIDIA Technical Blog, A. Gray, "Getting Started with CUDA Graphs", 2019: launch
    # overheads of the same order as microsecond-scale kernels), and PyTorch's dispatcher
    # adds more; when kernels are short the GPU waits for the host.  3 us is our estimate
    # of the exposed cost per kernel.  CUDA graphs replay the launches from the device:
    # ~0.5 us per kernel node (same blog: graph launch removes most of the per-kernel cost).
    False: 3.0e-6,
    True: 0.5e-6,
}

# -- sub-models ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class GemmModel:
    """(a) GEMM throughput: MAMF scaled by tile / wave quantisation and the small-``K`` cost.

    For sub-GEMMs ``(M_i, N_i, K_i)`` (one, or one per group of a grouped GEMM) and a
    tile ``TM x TN``::

        tiles     = sum_i ceil(M_i / TM) ceil(N_i / TN)
        tile cost = TM TN (ceil(K_i / 64) 64 + K0)            per tile of sub-GEMM i
        waves     = ceil(tiles / SMs)
        U         = sum_i M_i N_i K_i / (SMs x waves x mean tile cost)

    ``U`` is the useful share of the SM-time the kernel occupies (idle SMs in the last
    wave, padded tile rows and columns, padded ``K`` and the per-tile fixed cost ``K0``
    all count as waste); the best of :data:`GEMM_TILES` is taken.  The achieved
    throughput is ``MAMF x min(1, U / U_ref)``, ``U_ref`` being ``U`` at the shape where
    the MAMF was measured (:data:`MAMF_BEST_SHAPES`), so the model reproduces the
    measurement there and never exceeds it.  Efficiency = achieved / dense peak.
    """

    peak_flops: dict
    """Dense peak FLOP/s per dtype (from the GPUSpec)."""
    mamf_flops: dict
    """MAMF per dtype: measured, or the :data:`MAMF_FALLBACK_FRACTION` of the peak."""
    num_sms: int
    reference_shapes: dict
    """dtype -> (M, N, K) where the MAMF holds."""
    tiles: tuple = GEMM_TILES
    k_block: int = GEMM_K_BLOCK
    k_overhead: int = GEMM_K_OVERHEAD
    _u_ref: dict = field(default_factory=dict, init=False, compare=False, repr=False)   # cache of U_ref per dtype
    _per_tile: dict = field(default_factory=dict, init=False, compare=False, repr=False)   # cache of _tile_terms

    @classmethod
    def for_gpu(cls, gpu: GPUSpec, constants: Constants | None = None) -> GemmModel:
        """The model of ``gpu``, with fallbacks for dtypes it has no MAMF for, under
        ``constants`` (default: the active ones, :mod:`topologies.constants`)."""
        c = active() if constants is None else constants
        fallback, default = c.get(_C + "MAMF_FALLBACK_FRACTION"), c.get(_C + "_MAMF_DEFAULT_FRACTION")
        mamf = {}
        for dtype, peak in gpu.peak_flops.items():
            if dtype in gpu.mamf_flops:
                mamf[dtype] = gpu.mamf_flops[dtype]
            else:
                mamf[dtype] = peak * fallback.get((gpu.generation, dtype), default)
        best = c.get(_C + "MAMF_BEST_SHAPES")
        shapes = {dtype: best.get((gpu.name, dtype), _DEFAULT_BEST_SHAPE) for dtype in gpu.peak_flops}
        return cls(dict(gpu.peak_flops), mamf, num_sms(gpu, c.get(_C + "SM_COUNTS")), shapes,
                   c.get(_C + "GEMM_TILES"), c.get(_C + "GEMM_K_BLOCK"), c.get(_C + "GEMM_K_OVERHEAD"))

    def utilization(self, shapes: Sequence[tuple[float, float, float]]) -> float:
        """Best-tile useful share ``U`` of SM time for the sub-GEMMs ``shapes`` (0..1)."""
        shapes = [(m, n, k) for m, n, k in shapes if m > 0 and n > 0 and k > 0]
        if not shapes:
            return 1.0
        useful = sum(m * n * k for m, n, k in shapes)
        sms = self.num_sms
        terms = [self._tile_terms(shape) for shape in shapes]
        best = 0.0
        for j in range(len(self.tiles)):
            tiles = 0
            cost = 0.0
            for per_tile in terms:
                t, c = per_tile[j]
                tiles += t
                cost += c
            waves = math.ceil(tiles / sms)
            best = max(best, useful / (sms * waves * (cost / tiles)))
        return best

    def _tile_terms(self, shape: tuple[float, float, float]) -> tuple:
        """Per tile of :attr:`tiles`, ``(tiles, tile cost)`` of one sub-GEMM (:meth:`utilization`):
        ``ceil(M / TM) ceil(N / TN)`` and that times ``TM TN (ceil(K / 64) 64 + K0)``; kept
        per shape (a skewed MoE's grouped GEMMs repeat the same per-expert shapes)."""
        hit = self._per_tile.get(shape)
        if hit is None:
            m, n, k = shape
            kb, k0 = self.k_block, self.k_overhead
            hit = []
            for tm, tn in self.tiles:
                t = math.ceil(m / tm) * math.ceil(n / tn)
                hit.append((t, t * tm * tn * (math.ceil(k / kb) * kb + k0)))
            if len(self._per_tile) >= 1 << 16:
                self._per_tile.clear()
            hit = self._per_tile[shape] = tuple(hit)
        return hit

    def _reference_utilization(self, dtype: str) -> float:
        u = self._u_ref.get(dtype)
        if u is None:
            u = self.utilization([self.reference_shapes.get(dtype, _DEFAULT_BEST_SHAPE)])
            self._u_ref[dtype] = u
        return u

    def efficiency(self, dtype: str, shapes: Sequence[tuple[float, float, float]]) -> float:
        """Achieved FLOP/s over the dense ``dtype`` peak for the sub-GEMMs ``shapes``."""
        if dtype not in self.peak_flops:
            raise ConfigError("precision", dtype, f"no {dtype} peak for this GPU; known: {', '.join(self.peak_flops)}")
        u = min(1.0, self.utilization(shapes) / self._reference_utilization(dtype))
        return self.mamf_flops[dtype] / self.peak_flops[dtype] * u

    def efficiency_mnk(self, dtype: str, m: float, n: float, k: float) -> float:
        """:meth:`efficiency` of one ``M x N x K`` GEMM."""
        return self.efficiency(dtype, [(m, n, k)])

    def flops_per_s(self, dtype: str, shapes: Sequence[tuple[float, float, float]]) -> float:
        """Achieved FLOP/s for the sub-GEMMs ``shapes``."""
        return self.peak_flops[dtype] * self.efficiency(dtype, shapes)


@dataclass(frozen=True, slots=True)
class AttentionModel:
    """(b) FlashAttention efficiency: :data:`FLASH_ATTENTION_EFFICIENCY` x a sequence ramp."""

    generation: str
    peak_flops: dict
    table: dict = field(default_factory=lambda: dict(FLASH_ATTENTION_EFFICIENCY))
    seq_half: int = FA_SEQ_HALF
    head_dim_factors: tuple = FA_HEAD_DIM_FACTOR
    backends: dict = field(default_factory=lambda: dict(ATTENTION_BACKENDS))
    """Other kernels' tables (:data:`ATTENTION_BACKENDS`)."""
    backend_head_dim_factors: dict = field(default_factory=lambda: dict(BACKEND_HEAD_DIM_FACTOR))

    @classmethod
    def for_gpu(cls, gpu: GPUSpec, constants: Constants | None = None) -> AttentionModel:
        """The model of ``gpu`` under ``constants`` (default: the active ones)."""
        c = active() if constants is None else constants
        return cls(gpu.generation, dict(gpu.peak_flops), dict(c.get(_C + "FLASH_ATTENTION_EFFICIENCY")),
                   c.get(_C + "FA_SEQ_HALF"), c.get(_C + "FA_HEAD_DIM_FACTOR"), dict(c.get(_C + "ATTENTION_BACKENDS")),
                   dict(c.get(_C + "BACKEND_HEAD_DIM_FACTOR")))

    def efficiency(self, phase: str, dtype: str, seq_len: float, head_dim: float | None = None,
                   backend: str = "flash") -> float:
        """Fraction of the ``dtype`` peak for a forward (``F``) or backward (``B``) pass with
        ``seq_len`` queries per sequence on the rank and query/key heads of ``head_dim``
        (None: 128, the head dim the table holds for; :data:`FA_HEAD_DIM_FACTOR`), run by the
        kernel ``backend`` (:data:`ATTENTION_BACKENDS`; ``flash``: :attr:`table`; a measured
        backend, :data:`MODEL_ATTENTION_BACKEND`, its modelled stand-in)."""
        backend = MODEL_ATTENTION_BACKEND.get(backend, backend)
        table = self.table if backend == "flash" else self.backends.get(backend)
        if table is None:
            raise ConfigError("attention backend", backend, f"unknown; known: flash, {', '.join(self.backends)}")
        try:
            eff = table[(self.generation, dtype)][phase]
        except KeyError:
            raise ConfigError("precision", dtype, f"no {backend} attention efficiency for {dtype} {phase} on "
                                                  f"{self.generation} GPUs") from None
        s = max(float(seq_len), 1.0)
        ramp = (s / (s + self.seq_half)) / (_FA_REFERENCE_SEQ / (_FA_REFERENCE_SEQ + self.seq_half))
        return eff * min(1.0, ramp) * head_dim_factor(head_dim, self.backend_head_dim_factors.get(backend)
                                                      if backend != "flash" else self.head_dim_factors)


def head_dim_factor(head_dim: float | None, points: tuple | None = None) -> float:
    """Attention efficiency at ``head_dim`` relative to head dim 128 (``points``, default
    :data:`FA_HEAD_DIM_FACTOR`).

    >>> head_dim_factor(64), head_dim_factor(128), head_dim_factor(192), round(head_dim_factor(96), 3)
    (0.7669753086419753, 1.0, 1.0, 0.883)
    """
    if not head_dim:
        return 1.0
    pts = FA_HEAD_DIM_FACTOR if points is None else points
    d = float(head_dim)
    if d <= pts[0][0]:
        return pts[0][1]
    for (d0, f0), (d1, f1) in zip(pts, pts[1:]):
        if d <= d1:
            return f0 + (f1 - f0) * (d - d0) / (d1 - d0)
    return pts[-1][1]


@dataclass(frozen=True, slots=True)
class MemoryModel:
    """(c) Memory-bound time: bytes over ``HBM bandwidth x efficiency``."""

    hbm_bandwidth_bytes_per_s: float
    efficiency: float = HBM_EFFICIENCY

    def time_s(self, nbytes: float) -> float:
        return float(nbytes) / (self.hbm_bandwidth_bytes_per_s * self.efficiency)


@dataclass(frozen=True, slots=True)
class LaunchModel:
    """(d) Launch overhead: ``kernels x per-kernel cost`` (:data:`LAUNCH_OVERHEAD_S`)."""

    per_kernel_s: float

    @classmethod
    def for_graphs(cls, cuda_graphs: bool, constants: Constants | None = None) -> LaunchModel:
        c = active() if constants is None else constants
        return cls(c.get(_C + "LAUNCH_OVERHEAD_S")[bool(cuda_graphs)])

    def time_s(self, num_kernels: int) -> float:
        return num_kernels * self.per_kernel_s


class OpCost(NamedTuple):
    """How :class:`RooflineComputeModel` timed one op."""

    compute_s: float
    """FLOPs over achieved FLOP/s."""
    memory_s: float
    """Bytes over achievable HBM bandwidth."""
    launch_s: float
    """Kernel launches."""
    dtype: str
    """Dtype whose peak applied ('' for element-wise ops)."""
    efficiency: float
    """Fraction of that peak (GEMM / attention); 0 for element-wise ops."""
    source: str = "model"
    """Where the time came from: ``model`` (the sub-models) or ``measured`` (a kernel table,
    :mod:`workloads.costs.kernel_tables`)."""
    table: str = ""
    """The measured table and its substitution rule, when ``source`` is ``measured``."""

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.memory_s) + self.launch_s


# -- the interface ---------------------------------------------------------------------------------
class ComputeModel:
    """Times compute ops.  Subclasses implement :meth:`op_time_s`."""

    def op_time_s(self, op: ComputeOp) -> float:
        """Seconds ``op`` takes on one GPU."""
        raise NotImplementedError

    def op_times_s(self, ops: Iterable[ComputeOp]) -> np.ndarray:
        """Seconds per op, as a float64 array in the order of ``ops``."""
        ops = list(ops)
        return np.fromiter((self.op_time_s(o) for o in ops), dtype=np.float64, count=len(ops))


def _sub_gemms(op: ComputeOp) -> list[tuple[float, float, float]]:
    if not op.groups:
        return [(op.m, op.n, op.k)]
    if gemm_role(op) == "wgrad":                 # token dimension is K
        return [(op.m, op.n, g) for g in op.groups]
    return [(g, op.n, op.k) for g in op.groups]  # token dimension is M


class RooflineComputeModel(ComputeModel):
    """Default compute model: roofline over four sourced sub-models (see the module docstring).

    Parameters
    ----------
    gpu
        A :class:`~topologies.GPUSpec` or a GPU name (``"H100"``).
    precision
        A recipe name or :class:`~workloads.costs.precision.PrecisionRecipe`; ConfigError
        if the GPU cannot run it.
    cuda_graphs
        Launch cost per kernel from :data:`LAUNCH_OVERHEAD_S` with or without CUDA graphs.
    num_layers
        Decoder layers including MTP modules; needed by recipes that keep the last
        layers in BF16 (``nvfp4``).
    gemm, attention, memory, launch
        Replace a sub-model (e.g. a :class:`GemmModel` with other tiles).
    sustained
        ``{"gemm": f, "attention": f}``: the sustained-clock fractions that scale the GEMM
        and attention efficiencies; default :data:`SUSTAINED_FRACTION` of the generation
        (``{"gemm": 1, "attention": 1}`` reproduces the short-run measurements).
    num_gpus
        GPUs of the job: the default sustained fractions then hold for the slowest of that
        many chips (:func:`slowest_chip_factor`); None keeps the generation's reference chip.
    constants
        The :class:`~topologies.constants.Constants` every sub-model, the GPU lookup and the
        recipe read (default: the active ones when the model is built); kept as
        :attr:`constants`.
    kernel_tables
        Measured attention curves (:class:`~workloads.costs.kernel_tables.AttentionTables`) for
        the backends of :data:`MEASURED_ATTENTION_KERNELS`; default the committed ones; False:
        none (every op from the sub-models).  A measured time is the benchmark's, short-run at
        boost clock, so it is divided by the same sustained fraction as the attention figures.

    Examples
    --------
    >>> from workloads.costs.flops import ComputeOp
    >>> m = RooflineComputeModel("H100")
    >>> op = ComputeOp("fc1", "F", "gemm", 2.0 * 8192 ** 3, 8192, 8192, 8192)
    >>> round(op.flops / m.op_time_s(op) / 1e12)
    739
    """

    def __init__(self, gpu: GPUSpec | str, precision: str | PrecisionRecipe = "bf16", cuda_graphs: bool = False,
                 *, num_layers: int | None = None, gemm: GemmModel | None = None,
                 attention: AttentionModel | None = None, memory: MemoryModel | None = None,
                 launch: LaunchModel | None = None, sustained: dict | None = None, num_gpus: int | None = None,
                 constants: Constants | None = None, kernel_tables: AttentionTables | None | bool = None):
        c = self.constants = active() if constants is None else constants
        with using(c):
            self.gpu = get_gpu_spec(gpu)
            self.recipe = get_recipe(precision, gpu=self.gpu)
        if not isinstance(cuda_graphs, bool):
            raise ConfigError("cuda_graphs", cuda_graphs, "must be true or false")
        self.cuda_graphs = cuda_graphs
        self.num_layers = num_layers
        self.gemm = gemm or GemmModel.for_gpu(self.gpu, c)
        self.attention = attention or AttentionModel.for_gpu(self.gpu, c)
        self.memory = memory or MemoryModel(self.gpu.hbm_bandwidth_bytes_per_s, c.get(_C + "HBM_EFFICIENCY"))
        self.launch = launch or LaunchModel.for_graphs(cuda_graphs, c)
        if sustained is None:
            chip = slowest_chip_factor(self.gpu.generation, num_gpus, c.get(_C + "CHIP_SPREAD"))
            base = c.get(_C + "SUSTAINED_FRACTION").get(self.gpu.generation, {"gemm": 1.0, "attention": 1.0})
            sustained = {k: f * chip for k, f in base.items()}
        self.sustained = dict(sustained)
        self.num_gpus = num_gpus
        self._dtype_bytes = c.get("workloads.costs.precision.DTYPE_BYTES")
        self._kernel_hbm = c.get(_C + "KERNEL_HBM_FRACTION")
        self._cache: dict[ComputeOp, float] = {}
        self.kernel_tables = (default_attention_tables() if kernel_tables is None
                              else (kernel_tables or None))
        self._measured_kernels = c.get(_C + "MEASURED_ATTENTION_KERNELS")
        with using(c):      # the tables' GPUs, for the dense-peak substitution rule
            self._table_gpus = {g: get_gpu_spec(g) for g in ("GB200", "GB300")}

    def _measured_attention(self, op: ComputeOp, phase: str, dtype: str, launch_s: float) -> OpCost | None:
        """The op's cost from a measured table, or None where none covers it."""
        if self.kernel_tables is None or op.attention is None:
            return None
        kernel = self._measured_kernels.get(op.attention.backend, {}).get(self.gpu.generation)
        if kernel is None:
            return None
        hit = self.kernel_tables.lookup(kernel, self.gpu, dtype, op.attention, phase, self._table_gpus)
        if hit is None:
            return None
        t = hit[0] / self.sustained["attention"]
        eff = op.flops / (self.attention.peak_flops[dtype] * t) if op.flops and t > 0 else 0.0
        return OpCost(t, 0.0, launch_s, dtype, eff, "measured", hit[1])

    def op_source(self, op: ComputeOp) -> str:
        """``measured`` when a kernel table timed ``op``, else ``model``."""
        if op.op_class != "attention":
            return "model"
        return self.op_cost(op).source

    def op_cost(self, op: ComputeOp) -> OpCost:
        """The parts of ``op``'s time (compute, memory, launch), its dtype and efficiency."""
        launch_s = self.launch.time_s(op.launches)
        if op.op_class == "gemm":
            dtype = self.recipe.op_gemm_dtype(op, self.num_layers)
            shapes = _sub_gemms(op)
            eff = self.gemm.efficiency(dtype, shapes) * self.sustained["gemm"]
            compute_s = op.flops / (self.gemm.peak_flops[dtype] * eff) if op.flops else 0.0
            in_b = self._dtype_bytes[dtype]
            out_b = 2 * 4.0 if gemm_role(op) == "wgrad" else 2.0   # wgrad: FP32 main-grad read + write
            nbytes = sum(in_b * (m * k + k * n) + out_b * m * n for m, n, k in shapes)
            return OpCost(compute_s, self.memory.time_s(nbytes), launch_s, dtype, eff)
        if op.op_class == "attention":
            dtype = self.recipe.attention_dtype
            phase = "F" if (op.phase == "F" or op.recompute) else "B"
            measured = self._measured_attention(op, phase, dtype, launch_s)
            if measured is not None:
                return measured
            backend = op.attention.backend if op.attention is not None else "flash"
            eff = self.attention.efficiency(phase, dtype, op.m, op.k, backend) * self.sustained["attention"]
            compute_s = op.flops / (self.attention.peak_flops[dtype] * eff) if op.flops else 0.0
            return OpCost(compute_s, self.memory.time_s(op.mem_bytes), launch_s, dtype, eff)
        if op.op_class == "elementwise":
            measured = self._kernel_hbm.get(op.name)
            if measured is None:
                return OpCost(0.0, self.memory.time_s(op.mem_bytes), launch_s, "", 0.0)
            frac = measured["F" if (op.phase == "F" or op.recompute) else "B"]
            return OpCost(0.0, op.mem_bytes / (self.memory.hbm_bandwidth_bytes_per_s * frac), launch_s, "", 0.0)
        raise ValueError(f"unknown op class {op.op_class!r} of op {op.name!r}")

    def op_time_s(self, op: ComputeOp) -> float:
        t = self._cache.get(op)
        if t is None:
            t = self.op_cost(op).time_s
            self._cache[op] = t
        return t


# -- measured ------------------------------------------------------------------------------------
_CSV_REQUIRED = ("name", "phase", "time_s")
_CSV_OPTIONAL = ("m", "n", "k")


class MeasuredComputeModel(ComputeModel):
    """Per-op times from measurements, with a fallback model for ops not measured.

    CSV columns (header required): ``name``, ``phase`` (F / B / W), ``time_s`` (seconds),
    and optionally ``m``, ``n``, ``k`` (the op's GEMM shape as in
    :class:`~workloads.costs.flops.ComputeOp`; attention: query tokens, key tokens, head
    dim; omitted or 0 for element-wise ops).  Rows match ops by ``(name, phase, m, n, k)``;
    recomputed ops (``recompute=True``) match their forward row (phase ``F``).  Unknown
    columns, bad values and duplicate keys are ConfigErrors.  The measurements stand for
    one precision and GPU: they replace the whole time (launch overhead included).

    Parameters
    ----------
    csv_path
        The CSV file.
    fallback
        Model for ops without a row (e.g. a :class:`RooflineComputeModel`); None makes a
        missing row a ConfigError.
    """

    def __init__(self, csv_path: str | Path, fallback: ComputeModel | None = None):
        self.csv_path = Path(csv_path)
        self.fallback = fallback
        self.times_s = self._read(self.csv_path)

    @staticmethod
    def _read(path: Path) -> dict[tuple, float]:
        where = f"compute.measured_csv ({path.name})"
        if not path.is_file():
            raise ConfigError("compute.measured_csv", str(path), "file not found")
        out: dict[tuple, float] = {}
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            cols = reader.fieldnames or []
            for c in cols:
                if c not in _CSV_REQUIRED + _CSV_OPTIONAL:
                    raise ConfigError(where, c, f"unknown column; valid: {', '.join(_CSV_REQUIRED + _CSV_OPTIONAL)}")
            for c in _CSV_REQUIRED:
                if c not in cols:
                    raise ConfigError(where, c, "required column missing")
            for line, row in enumerate(reader, start=2):
                name, phase = (row["name"] or "").strip(), (row["phase"] or "").strip()
                if not name:
                    raise ConfigError(f"{where} line {line}", row["name"], "name must not be empty")
                if phase not in PHASES:
                    raise ConfigError(f"{where} line {line}", phase, f"phase must be one of {', '.join(PHASES)}")
                dims = []
                for c in _CSV_OPTIONAL:
                    raw = (row.get(c) or "0").strip() or "0"
                    try:
                        v = int(raw)
                    except ValueError:
                        raise ConfigError(f"{where} line {line}", raw, f"{c} must be a non-negative integer") from None
                    if v < 0:
                        raise ConfigError(f"{where} line {line}", raw, f"{c} must be a non-negative integer")
                    dims.append(v)
                try:
                    t = float(row["time_s"])
                except (TypeError, ValueError):
                    raise ConfigError(f"{where} line {line}", row["time_s"], "time_s must be a number") from None
                if not (math.isfinite(t) and t >= 0):
                    raise ConfigError(f"{where} line {line}", row["time_s"], "time_s must be finite and >= 0")
                key = (name, phase, *dims)
                if key in out:
                    raise ConfigError(f"{where} line {line}", key, "duplicate row for this op")
                out[key] = t
        return out

    @staticmethod
    def key(op: ComputeOp) -> tuple:
        """The CSV key of ``op``: ``(name, phase, m, n, k)``; recomputation uses phase F."""
        return (op.name, "F" if op.recompute else op.phase, int(op.m), int(op.n), int(op.k))

    def covers(self, op: ComputeOp) -> bool:
        """Whether ``op`` has a measured row."""
        return self.key(op) in self.times_s

    def source_of(self, op: ComputeOp) -> str:
        """``measured``, or ``fallback:<ClassName>`` for ops timed by the fallback model."""
        if self.covers(op):
            return "measured"
        if self.fallback is None:
            return "missing"
        return f"fallback:{type(self.fallback).__name__}"

    def uncovered(self, ops: Iterable[ComputeOp]) -> list[tuple]:
        """Distinct keys of ``ops`` without a measured row (timed by the fallback), in order."""
        seen: dict[tuple, None] = {}
        for op in ops:
            k = self.key(op)
            if k not in self.times_s:
                seen.setdefault(k, None)
        return list(seen)

    def op_time_s(self, op: ComputeOp) -> float:
        t = self.times_s.get(self.key(op))
        if t is not None:
            return t
        if self.fallback is None:
            raise ConfigError("compute.measured_csv", self.key(op),
                              f"no measured time in {self.csv_path.name} and no fallback model")
        return self.fallback.op_time_s(op)


COMPUTE_MODELS = {"roofline": RooflineComputeModel, "measured": MeasuredComputeModel}
"""Compute models by name (constructors; see each class for its arguments)."""


def get_compute_model(name: str):
    """The compute-model class registered under ``name``; ConfigError lists the names."""
    try:
        return COMPUTE_MODELS[name]
    except (KeyError, TypeError):
        raise ConfigError("compute.model", name, f"unknown; known: {', '.join(COMPUTE_MODELS)}") from None
