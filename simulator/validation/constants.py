"""The constants registry: every number that shapes a step-time prediction, where it comes from,
and a way to perturb the ones nobody measured.

Each :class:`Constant` names a module attribute (``workloads.costs.compute.HBM_EFFICIENCY``),
or one field of every value of a table (``topologies.specs.GPU_SPECS[*].peak_flops``), and
says which of four provenance classes it belongs to (:data:`PROVENANCES`):

``datasheet``
    a vendor or standards specification (peak FLOP/s, link rates, SM counts);
``microbenchmark``
    a measurement: ours (``experiments/microbench``), nccl-tests, mamf-finder, or a
    benchmark figure in a paper;
``framework source``
    read from the code of Megatron-LM, NCCL, CUTLASS, FlashAttention or Transformer Engine;
``assumption``
    chosen by us, with no direct measurement behind the value.

The class follows the constant's own comment in the code; where a comment gives no
measurement, the constant is an assumption.  A table that mixes classes is filed under the
class of most of its entries, and :attr:`Constant.source` names the exceptions.

The module attributes are the documented defaults and never change.  A run reads every
registered constant through an immutable :class:`~topologies.constants.Constants` object
(the registry's names are its keys): ``simulator.engine.run(..., constants=c)`` carries it
explicitly to the engine and the collective engine and makes it the active constants while
the scenario, program and cost models are built (:mod:`topologies.constants` says which
code reads it how).  :func:`scaled` multiplies a registered constant by a factor inside a
``with`` block by installing ``active().scaled(name, factor)`` as the active constants --
no module attribute, dataclass default or table is touched -- and the previous constants
are back afterwards.  The object is picklable: ``validate(..., workers=n)`` hands the
active constants to its worker processes, so a perturbation holds there too.  An object
built before the block (a cost model, a cluster) keeps the values it was built with.

>>> from workloads.costs import compute
>>> with scaled("workloads.costs.compute.HBM_EFFICIENCY", 1.1):
...     round(compute.RooflineComputeModel("H100").memory.efficiency, 3)
0.935
>>> compute.RooflineComputeModel("H100").memory.efficiency, compute.HBM_EFFICIENCY
(0.85, 0.85)
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from topologies.constants import Constants, active, scale_value, using

__all__ = ["PROVENANCES", "Constant", "REGISTRY", "get", "assumptions", "resolve", "scaled", "scale_value",
           "registry_markdown"]

PROVENANCES = ("datasheet", "microbenchmark", "framework source", "assumption")
"""The provenance classes, from most to least grounded."""


@dataclass(frozen=True, slots=True)
class Constant:
    """One registered constant.

    ``name`` is ``package.module.ATTR`` or ``package.module.TABLE[*].field`` (that field of
    every value of the dict ``TABLE``): the attribute holds the documented default, and the
    name is the key a :class:`~topologies.constants.Constants` object overrides it under.
    """

    name: str
    value: str
    """The value, shortened for a table."""
    provenance: str
    """One of :data:`PROVENANCES`."""
    source: str
    """Where the value comes from, as the code's own comment gives it."""
    shapes: str
    """What in a prediction it affects."""

    def perturb(self, factor: float):
        """Context manager: this constant times ``factor`` (:func:`scaled`)."""
        return scaled(self.name, factor)


def resolve(name: str) -> Any:
    """The value of ``name`` under the active constants (the default unless :func:`scaled`
    or :func:`topologies.constants.using` installed others); for ``TABLE[*].field``,
    ``{key: value.field}``.

    Raises AttributeError / ModuleNotFoundError when the name does not exist.
    """
    return active().get(name)


@contextmanager
def scaled(name: str, factor: float) -> Iterator[Constants]:
    """Within the block, the registered constant ``name`` is ``factor`` times its value:
    the block runs under ``active().scaled(name, factor)`` (yielded), and the previous
    constants are active again afterwards, also after an exception.

    Only registered names are read through the constants object, so another name is a
    KeyError.
    """
    if name not in _BY_NAME:
        raise KeyError(f"{name!r} is not a registered constant (simulator.validation.constants.REGISTRY); "
                       "only registered constants are read through the run's Constants")
    with using(active().scaled(name, factor)) as c:
        yield c


# -- the registry ------------------------------------------------------------------------------------
_C = "workloads.costs.compute."
_F = "workloads.costs.flops."
_K = "workloads.blocks.kernels."
_E = "workloads.blocks.edges."
_N = "simulator.collectives.nccl."
_S = "topologies.specs."
_TUNING = "NVIDIA/nccl src/graph/tuning.cc (v2.27.7-1)"
_MLE = "stas00/ml-engineering"

REGISTRY: tuple[Constant, ...] = (
    # compute: GEMMs
    Constant(f"{_S}GPU_SPECS[*].peak_flops", "H100 989 / 1979 TFLOP/s BF16 / FP8; A100 312 BF16; B200 2250 BF16",
             "datasheet", "NVIDIA datasheets (via stas00/ml-engineering, glennklockwood.com)",
             "dense tensor-core peak: the scale of every GEMM and attention time"),
    Constant(f"{_S}GPU_SPECS[*].mamf_flops", "H100 794.5 BF16, 1402.6 FP8; A100 271.2 BF16; B200 1745 BF16",
             "microbenchmark", f"mamf-finder results ({_MLE})",
             "best achievable GEMM rate: the ceiling of the GEMM model"),
    Constant(f"{_C}MAMF_BEST_SHAPES", "e.g. H100 BF16 2048x2048x13312", "microbenchmark",
             f"shapes where mamf-finder found the MAMF ({_MLE})",
             "reference utilisation the tile/wave model is normalised to"),
    Constant(f"{_C}MAMF_FALLBACK_FRACTION", "Hopper BF16 0.803, FP8 0.709; Blackwell 0.729", "microbenchmark",
             "measured MAMF / peak of the same generation's measured GPU, reused for unmeasured GPUs",
             "GEMM ceiling of GPUs / dtypes without a MAMF (H800, GB300, FP16)"),
    Constant(f"{_C}_MAMF_DEFAULT_FRACTION", "0.70", "assumption",
             "chosen below every measured MAMF fraction", "GEMM ceiling of dtypes never measured (FP4, TF32)"),
    Constant(f"{_C}SM_COUNTS", "A100 108, H100 132, B200 148, B300 160", "datasheet",
             "NVIDIA architecture whitepapers; B200 from cudaGetDeviceProperties reports",
             "wave quantisation of GEMMs"),
    Constant(f"{_C}GEMM_TILES", "128x256, 256x128, 128x128", "framework source",
             "CUTLASS SM90 warp-specialised GEMM tiles and cuBLAS kernel names", "tile quantisation of GEMMs"),
    Constant(f"{_C}GEMM_K_BLOCK", "64", "framework source", "K step of CUTLASS SM80/SM90 BF16 main loops",
             "K padding of GEMMs"),
    Constant(f"{_C}GEMM_K_OVERHEAD", "128 (units of K)", "assumption",
             "per-tile prologue/epilogue cost, shaped like mamf-finder's small-K fall-off but not fitted",
             "efficiency of small-K GEMMs (MoE wgrad, MLA down-projections)"),
    Constant(f"{_C}SUSTAINED_FRACTION", "Hopper GEMM 0.938, attention 0.874; Blackwell 0.814; Ampere 0.926",
             "microbenchmark",
             f"all-8-GPU sustained vs burst matmul rates ({_MLE} accelerator benchmarks); Ampere from NVIDIA's "
             "HPL sustained clock; H100 = H200 and FP8 = BF16 assumed",
             "GEMM and attention rate under a full node's power limit"),
    Constant(f"{_C}CHIP_SPREAD", "sigma 0.93 % Hopper, 0.88 % Blackwell", "microbenchmark",
             f"median vs slowest GPU of a measured node ({_MLE}); Ampere's sigma assumed equal to Hopper's",
             "slowest-chip derating growing with the number of GPUs"),
    # compute: attention
    Constant(f"{_C}FLASH_ATTENTION_EFFICIENCY", "Hopper BF16 F 0.72 / B 0.52; Ampere 0.70 / 0.55",
             "microbenchmark",
             "kernel benchmarks in the FlashAttention-2/3/4 papers; FP8 backward and Blackwell backward assumed",
             "attention kernel time (FlashAttention runs)"),
    Constant(f"{_C}ATTENTION_BACKENDS", "FlashAttention v1: Ampere F 0.318 / B 0.250; Hopper 0.1655 / 0.130. "
             "FlashAttention-2: Ampere 0.70 / 0.55; Hopper 0.396 / 0.311. cuDNN SDPA: Hopper 0.661 / 0.477",
             "microbenchmark",
             "FlashAttention repository's kernel charts (fwd+bwd at 16k, causal, head dim 128: FA1 A100 83, H100 137; "
             "FA2 A100 189, H100 328 TFLOP/s); the F/B split assumed as FA2's on Ampere; cuDNN: FA3 paper's H100 "
             "forward chart (595 vs FA3 648 TFLOP/s), backward assumed at the same ratio",
             "attention kernel time of stacks that run another kernel (llm_foundry, llm_foundry_flash, torchtitan, "
             "pytorch_fsdp)"),
    Constant(f"{_C}BACKEND_HEAD_DIM_FACTOR", "head dim 64: FlashAttention v1 1.15, FlashAttention-2 0.885 of head "
             "dim 128", "microbenchmark",
             "FlashAttention repository's kernel charts, 16k tokens, causal (FA1 A100 1.17, H100 1.14; FA2 A100 0.905, "
             "H100 0.866)",
             "attention kernel time of 64-wide heads on those kernels (MPT-125m, 350m)"),
    Constant(f"{_C}FA_HEAD_DIM_FACTOR", "head dim 64: 0.767 of head dim 128", "microbenchmark",
             "FlashAttention-3 paper's BF16 forward benchmark on H100 (497 / 648 TFLOP/s at 16k); backward and "
             "Blackwell assumed alike",
             "attention kernel time of models with 64-wide heads (gpt-oss)"),
    Constant(f"{_C}FA_SEQ_HALF", "384 tokens", "assumption",
             "sequence-length ramp fitted by eye to the FA2/FA3 papers' curves",
             "attention efficiency at short per-rank sequences (CP shards)"),
    Constant(f"{_K}ATTN_BLOCK_SIZE", "128", "framework source", "FA3 causal tile size for head dim 128",
             "executed fraction of the causal attention FLOPs"),
    # compute: memory-bound ops and launches
    Constant(f"{_S}GPU_SPECS[*].hbm_bandwidth_bytes_per_s", "A100 2.04, H100 3.35, H200 4.8, B200 8 TB/s",
             "datasheet", "NVIDIA datasheets", "time of memory-bound (element-wise) ops"),
    Constant(f"{_C}HBM_EFFICIENCY", "0.85", "assumption",
             "chosen a little below the 90-92 % a STREAM copy reaches on H100",
             "time of every memory-bound op (norms, activations, casts, optimizer)"),
    Constant(f"{_C}KERNEL_HBM_FRACTION", "SSD scan F 0.492 / B 0.485, Mamba grouped RMSNorm 0.816 / 0.206",
             "microbenchmark",
             "experiments/microbench/mamba_bench.py on one H200 (mamba_ssm's Triton kernels at the Nemotron 3 "
             "shapes); the same fractions on other GPUs assumed",
             "time of a Mamba-2 layer's scan and gated norm"),
    Constant(f"{_K}ACT_BYTES", "2", "framework source", "Megatron --bf16: BF16 activations between kernels",
             "bytes of element-wise ops"),
    Constant(f"{_F}_ADAM_BYTES_PER_PARAM", "30", "framework source",
             "Megatron distributed-optimizer fused Adam: reads and writes of FP32 state and the BF16 copy",
             "optimizer step time"),
    Constant(f"{_E}_CE_BYTES_PER_LOGIT", "unfused 38 / 22, fused 6 / 6", "framework source",
             "Megatron vocab-parallel cross entropy, pass by pass", "loss time over the vocabulary"),
    Constant(f"{_E}_VOCAB_MULTIPLE", "128 (x tp)", "framework source",
             "Megatron --make-vocab-size-divisible-by default", "padded vocabulary: output-layer GEMM size"),
    Constant("workloads.costs.precision.DTYPE_BYTES", "fp32 4, bf16 2, fp8 1, fp4 0.5", "datasheet",
             "number-format definitions (IEEE 754, OCP FP8 / MX)", "bytes moved by GEMMs, casts and collectives"),
    Constant("workloads.costs.precision.PRECISION_RECIPES", "bf16, fp8_delayed, fp8_blockwise, mxfp8, nvfp4 ...",
             "framework source",
             "Transformer Engine recipes; cast bytes counted from their kernels (NVFP4's BF16 SP gather assumed)",
             "GEMM dtypes, quantisation (cast) cost, FP8 weight copies"),
    Constant(f"{_C}LAUNCH_OVERHEAD_S", "eager 3 us, CUDA graphs 0.5 us per kernel", "assumption",
             "our estimate of the exposed launch cost (order of magnitude from NVIDIA's CUDA Graphs blog)",
             "per-kernel cost added to every op"),
    Constant("workloads.costs.host.HOST_COSTS", "eager: 73.6 us/kernel, 227 us/call, 0.891 ms/checkpoint", "microbenchmark",
             "experiments/microbench/gpu_bench.py on one H100 host; call cost reused for non-TP groups "
             "(assumed), CUDA graphs zero (assumed)",
             "host issue time the GPU may wait for (small layers, high TP, full recompute)"),
    # communication
    Constant("simulator.engine.simulate.COMM_SLOWDOWN", "1.189 (all generations)", "microbenchmark",
             "Lee et al., arXiv 2507.03114: compute kernels 18.9 % slower on average under overlapping NCCL",
             "compute slowed while a collective shares the GPU"),
    Constant(f"{_S}GPU_SPECS[*].nvlink_bandwidth_bytes_per_s", "A100 300, H100 450, H800 200, B200 900 GB/s",
             "datasheet", "NVIDIA datasheets; H800 from secondary spec pages and the DeepSeek-V3 report",
             "intra-node collective bandwidth (TP, EP, CP, part of DP)"),
    Constant(f"{_S}NIC_SPECS", "HDR 200, NDR 400, XDR 800 Gb/s", "datasheet", "InfiniBand generation rates",
             "inter-node bandwidth (DP, PP, EP across nodes)"),
    Constant(f"{_S}PCIE_BANDWIDTH", "Gen4 31.5, Gen5 63 GB/s", "datasheet", "PCI-SIG base specifications",
             "GPU-NIC hop"),
    Constant(f"{_S}LINK_LATENCY_S", "IB hop 0.15 us, cross-rack 2 us", "assumption",
             "IB hop picked from the Quantum-2 brief's order of magnitude; cross-rack value assumed",
             "latency of inter-node collectives and transfers"),
    Constant("simulator.collectives.calibration.CALIBRATIONS", "e.g. Hopper NVLink 0.816, IB 0.912, NVLS 0.840",
             "microbenchmark",
             "fits to nccl-tests: Azure A100 all_reduce (2-32 GPUs), H200 / P5en / P6-B200 bus bandwidths",
             "achieved fraction of link rates, NVLS rate, A100 per-call latency"),
    Constant(f"{_N}BASE_LAT_US", "ring Simple 8.4 us, tree LL 6.8 us ...", "framework source", _TUNING,
             "per-call latency of collectives"),
    Constant(f"{_N}HW_LAT_US", "per-step NVLink / PCIe / network latencies", "framework source", _TUNING,
             "per-step latency of collectives; algorithm choice"),
    Constant(f"{_N}TREE_CORRECTION", "0.4-1.0 by message size", "framework source", _TUNING,
             "tree all-reduce bandwidth and the ring/tree choice"),
    Constant(f"{_N}LL_MAX_BW_GBPS", "Hopper 141 / 39 / 20.4 GB/s", "framework source", _TUNING,
             "LL protocol bandwidth cap (small messages)"),
    Constant(f"{_N}RING_PLATEAU_FACTOR", "1.4", "framework source", _TUNING,
             "latency of large multi-node ring all-reduces"),
    Constant(f"{_N}NET_OVERHEAD_US", "1 us", "framework source", _TUNING, "per-step network post overhead"),
    Constant(f"{_N}COLLNET_ARITY_US", "0.4 us", "framework source", _TUNING,
             "CollNet (SHARP) all-reduce latency per local rank"),
    Constant("simulator.collectives.plans.MAX_RING_CHANNELS", "32", "framework source", "NCCL MAXCHANNELS",
             "channels a ring or tree can use across rails"),
    Constant("simulator.collectives.engine.TINY_CALL_BYTES", "4096 bytes", "assumption",
             "threshold chosen where the bandwidth term is under 1 % of the latency",
             "calls timed analytically instead of on the flow network"),
    # memory
    Constant("workloads.memory_accounting.DEFAULT_RESERVE_BYTES", "3 GiB", "assumption",
             "CUDA context measured (0.75 GiB); NCCL buffers and fragmentation assumed",
             "memory-fit verdict only (not step time)"),
)
"""Every registered constant."""

_BY_NAME = {c.name: c for c in REGISTRY}


def get(name: str) -> Constant:
    """The registered constant ``name`` (KeyError if not registered)."""
    return _BY_NAME[name]


def assumptions() -> tuple[Constant, ...]:
    """The constants whose provenance is ``assumption``."""
    return tuple(c for c in REGISTRY if c.provenance == "assumption")


@functools.cache
def _order() -> dict[str, int]:
    return {p: i for i, p in enumerate(PROVENANCES)}


def registry_markdown() -> str:
    """The registry as a Markdown table, by provenance class then in registry order."""
    rows = sorted(REGISTRY, key=lambda c: _order()[c.provenance])
    lines = ["| constant | value | provenance | source | shapes |", "| --- | --- | --- | --- | --- |"]
    for c in rows:
        cells = (f"`{c.name}`", c.value, c.provenance, c.source, c.shapes)
        lines.append("| " + " | ".join(s.replace("|", "/") for s in cells) + " |")
    return "\n".join(lines) + "\n"
