"""Host offload: activations and optimizer state moved to CPU memory over the GPU's host link.

Three mechanisms, each costed from the hardware it runs on:

Activation offload (``offload.activations: N``)
    Megatron-Core's ``cpu_offloading`` with ``cpu_offloading_num_layers = N`` hands each
    decoder layer to Transformer Engine's ``get_cpu_offload_context`` (Megatron-LM
    megatron/core/transformer/transformer_block.py @ d98e8a6; Transformer Engine
    transformer_engine/pytorch/cpu_offload.py and docs/features/other_optimizations/
    cpu_offloading/cpu_offloading.rst @ v2.18).  The first N of the model's L layers copy the
    tensors they save for backward to pinned host memory on a side stream as soon as they are
    saved, and copy them back during the backward; at most ``L - N`` layers' activations are
    on the GPU at once, so the compute stream stalls when a copy has not finished in time
    (:func:`activation_offload_stalls` walks that schedule).  Megatron-Core refuses it with
    pipeline parallelism and with recomputation (transformer_config.py @ d98e8a6), and so
    does clustersim.  Memory: the offloaded layers' activations leave the GPU.
Fine-grained activation offload (``offload.modules: [...]``)
    Megatron-Core's ``fine_grained_activation_offloading`` with ``offload_modules``
    (megatron/core/pipeline_parallel/fine_grained_activation_offload.py @ d98e8a6): every
    layer copies the inputs of the named modules (:data:`OFFLOAD_MODULES`) to the host and
    reloads them one layer ahead of the backward: the same schedule with one layer's set
    double-buffered (``keep = 1``).
Optimizer offload (``offload.optimizer: f``)
    Megatron-Core's ``optimizer_cpu_offload`` with ``optimizer_offload_fraction = f``
    (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py @ d98e8a6), as DeepSpeed's
    ZeRO-Offload (Ren et al., arXiv:2101.06840): the fraction ``f`` of the rank's optimizer
    shard lives in host memory (FP32 master weights and Adam moments); its gradients go to
    the host, the CPU runs Adam, the updated parameters come back.  The CPU step is bound by
    host DRAM bandwidth (:data:`CPU_ADAM_BYTES_PER_PARAM` over :func:`host_dram_bytes_per_s`);
    ``offload.overlap_optimizer_copies`` (``overlap_cpu_optimizer_d2h_h2d``) pipelines the
    copies with the CPU step (the slowest of the three), otherwise they follow one another.
MoE paged stash (``moe.paged_stash``, :func:`paged_stash_copy_s`)
    Megatron-Core's ``moe_paged_stash`` (megatron/core/transformer/moe/paged_stash.py and
    docs/user-guide/features/paged_stash.md @ d98e8a6) packs the routed experts' saved
    activations into a paged buffer of ``moe_paged_stash_buffer_size_factor_cuda`` (1.10) x
    the balanced size: a device-to-device copy of those bytes on a pack stream after each
    layer's forward and back on an unpack stream before its backward, at HBM bandwidth,
    waited for one layer later (the same schedule with ``keep = 1``).  The HBM bandwidth the
    copies take from overlapping kernels is not modelled.

The host link (:func:`host_link_bytes_per_s`), one direction per GPU:

* PCIe Gen5 x16 (x86 hosts: B200, H100): 63 GB/s nominal (:data:`topologies.specs.PCIE_BANDWIDTH`)
  x 0.8 reached by pinned copies (:data:`HOST_COPY_EFFICIENCY`: about 50 GB/s);
* NVLink-C2C on Grace superchips (GH200, GB200, GB300): 900 GB/s bidirectional, 450 GB/s a
  direction (Transformer Engine cpu_offloading.rst @ v2.18; NVIDIA GB200 NVL72 datasheet),
  x the same 0.8, capped by the Grace LPDDR5X bandwidth each GPU gets (512 GB/s per Grace,
  NVIDIA Grace CPU datasheet; GB200 and GB300 put two GPUs on one Grace: 256 GB/s each).
"""

from __future__ import annotations

from topologies import ConfigError
from topologies.specs import PCIE_BANDWIDTH

__all__ = ["CPU_ADAM_BYTES_PER_PARAM", "HOST_COPY_EFFICIENCY", "OFFLOAD_MODULES", "PAGED_STASH_BUFFER_FACTOR",
           "activation_offload_stalls", "check_offload", "offloaded_terms", "host_dram_bytes_per_s", "host_link_bytes_per_s", "optimizer_offload_s",
           "paged_stash_copy_s"]

HOST_COPY_EFFICIENCY = 0.8
"""Share of one direction of the host link a pinned device-to-host or host-to-device copy
reaches: an assumption (about 50 GB/s on PCIe Gen5 x16), the one checkpoint copies use."""

C2C_BYTES_PER_S = 450e9
"""NVLink-C2C, one direction (900 GB/s bidirectional: Transformer Engine
docs/features/other_optimizations/cpu_offloading/cpu_offloading.rst @ v2.18)."""

GRACE_DRAM_BYTES_PER_S = 512e9
"""LPDDR5X bandwidth of one Grace CPU (NVIDIA Grace CPU Superchip datasheet: up to 512 GB/s)."""

GPUS_PER_GRACE = {"GH200": 1, "GB200": 2, "GB300": 2}
"""GPUs sharing one Grace CPU's memory (GB200 / GB300 superchips: one Grace, two GPUs)."""

X86_DRAM_BYTES_PER_S_PER_GPU = 2 * 8 * 38.4e9 / 8
"""An x86 HGX host's DRAM bandwidth per GPU: two sockets of eight DDR5-4800 channels (38.4
GB/s each; DGX H100 user guide: two Xeon 8480C) over eight GPUs, 76.8 GB/s."""

CPU_ADAM_BYTES_PER_PARAM = 28.0
"""Host DRAM traffic of one Adam update of one FP32 parameter: read the parameter, its FP32
gradient and both moments (16 bytes), write the parameter and both moments (12) -- the
streams of DeepSpeed's CPU Adam (csrc/adam/cpu_adam_impl.cpp, Step_AVX @ v0.16.0) and of
torch.optim.AdamW on the CPU that Megatron-Core's HybridDeviceOptimizer runs."""

OPTIMIZER_D2H_BYTES_PER_PARAM = 4.0
"""FP32 main gradient copied to the host per offloaded parameter."""
OPTIMIZER_H2D_BYTES_PER_PARAM = 4.0
"""FP32 updated parameter copied back per offloaded parameter (HybridDeviceOptimizer copies
the CPU parameter into the GPU's FP32 main parameter, then casts on the GPU)."""

PAGED_STASH_BUFFER_FACTOR = 1.10
"""``moe_paged_stash_buffer_size_factor_cuda``'s default: the stash holds 1.10 x the balanced
routed-expert activations (Megatron-LM docs/user-guide/features/paged_stash.md @ d98e8a6)."""


def _grace(gpu) -> int:
    return GPUS_PER_GRACE.get(str(getattr(gpu, "name", gpu)).upper(), 0)


def host_link_bytes_per_s(gpu) -> float:
    """Bytes/s one GPU's pinned copies to or from host memory reach, one direction.

    >>> from topologies.specs import get_gpu_spec
    >>> host_link_bytes_per_s(get_gpu_spec("B200")) / 1e9, host_link_bytes_per_s(get_gpu_spec("GB200")) / 1e9
    (50.4, 256.0)
    """
    if _grace(gpu):
        return min(C2C_BYTES_PER_S * HOST_COPY_EFFICIENCY, GRACE_DRAM_BYTES_PER_S / _grace(gpu))
    return PCIE_BANDWIDTH.get(gpu.generation, PCIE_BANDWIDTH["hopper"]) * HOST_COPY_EFFICIENCY


def host_dram_bytes_per_s(gpu) -> float:
    """Host DRAM bandwidth one GPU's CPU-side optimizer step gets."""
    return GRACE_DRAM_BYTES_PER_S / _grace(gpu) if _grace(gpu) else X86_DRAM_BYTES_PER_S_PER_GPU


def activation_offload_stalls(fwd_s, bwd_s, copy_s, n: int, keep: int | None = None) -> tuple[list[float], list[float]]:
    """Seconds the compute stream waits before each layer's forward and backward when the
    first ``n`` of the layers offload their activations (Transformer Engine's default
    scheduling, one copy stream, one micro-batch's forward then its backward).  ``keep``:
    layers' offloaded sets the GPU may hold at once (default ``L - n``; fine-grained offload
    double-buffers one layer, ``keep = 1``, with every layer offloading).

    ``fwd_s[i]``, ``bwd_s[i]``: layer ``i``'s forward and backward (with weight gradients)
    seconds; ``copy_s[i]``: its saved bytes over the host link.  An offload starts when its
    layer's forward starts (tensors go as they are saved) and after the previous offload,
    and ends no earlier than the forward; layer ``k``'s forward waits until at most ``L - n``
    layers' activations remain on the GPU (layer ``k - (L - n)``'s offload done).  In the
    backward a reload of layer ``j`` starts once layer ``j + (L - n)``'s backward has freed
    its set, after the previous reload; the backward of ``j`` waits for it.

    >>> activation_offload_stalls([1.0] * 4, [2.0] * 4, [0.5] * 4, 2)   # copies hide
    ([0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0])
    >>> activation_offload_stalls([1.0] * 3, [1.0] * 3, [3.0] * 3, 1)   # one slow copy
    ([0.0, 0.0, 1.0], [2.0, 0.0, 0.0])
    """
    L = len(fwd_s)
    if keep is None:
        if not 0 <= n < L:
            raise ConfigError("offload.activations", n, f"must be an integer in 0..{L - 1} (layers on the stage - 1)")
        keep = L - n
    fstall, bstall = [0.0] * L, [0.0] * L
    t, link, off_end = 0.0, 0.0, [0.0] * L
    for k in range(L):
        j = k - keep
        if 0 <= j < n and off_end[j] > t:
            fstall[k], t = off_end[j] - t, off_end[j]
        start = t
        t += fwd_s[k]
        if k < n:
            link = max(link, start) + copy_s[k]
            off_end[k] = link = max(link, t)
    # backward, last layer first; the reloads run in order n-1 .. 0 on the copy stream
    link, end = t, {}
    for k in reversed(range(L)):
        if k < n:
            freed = end.get(k + keep, t)
            link = max(link, freed) + copy_s[k]
            if link > t:
                bstall[k], t = link - t, link
        t += bwd_s[k]
        end[k] = t
    return fstall, bstall


def optimizer_offload_s(params: float, fraction: float, gpu, overlap: bool) -> float:
    """Step-end seconds of the offloaded share of a rank's optimizer shard of ``params``
    parameters: the gradients to the host, the CPU Adam step, the parameters back; their sum,
    or with ``overlap`` the slowest of the three (pipelined over parameter groups).

    >>> from topologies.specs import get_gpu_spec
    >>> round(optimizer_offload_s(1e9, 1.0, get_gpu_spec("GB200"), False), 4)   # 4/256 + 28/256 + 4/256 GB/s
    0.1406
    """
    n = params * fraction
    link, dram = host_link_bytes_per_s(gpu), host_dram_bytes_per_s(gpu)
    parts = (n * OPTIMIZER_D2H_BYTES_PER_PARAM / link, n * CPU_ADAM_BYTES_PER_PARAM / dram,
             n * OPTIMIZER_H2D_BYTES_PER_PARAM / link)
    return max(parts) if overlap else sum(parts)


def paged_stash_copy_s(stash_bytes: float, hbm_bytes_per_s: float) -> float:
    """Seconds of one direction of the paged stash's packing copy: ``stash_bytes`` read and
    written once at ``hbm_bytes_per_s``."""
    return 2.0 * stash_bytes / hbm_bytes_per_s


OFFLOAD_MODULES = {
    # Megatron-Core's fine-grained offload_modules (transformer_config.py @ d98e8a6): each
    # offloads its module's *input*; here the memory terms (workloads.memory) that input is,
    # with the share of the term it is (the two pre-norms' inputs are one term)
    "attn_norm": {"norm_inputs": 0.5}, "mlp_norm": {"norm_inputs": 0.5}, "qkv_linear": {"attn_input": 1.0},
    "core_attn": {"q": 1.0, "kv": 1.0, "mla_latents": 0.0}, "attn_proj": {"attn_output": 1.0},
    "expert_fc1": {"expert_input": 1.0}, "moe_act": {"expert_fc1_output": 1.0},
    "fused_group_mlp": {"expert_input": 1.0, "expert_fc1_output": 1.0, "expert_fc2_input": 1.0},
}
"""Fine-grained offload modules clustersim models, by the activation terms their inputs are
(``gdp_qkv``, the gated DeltaNet's convolution input, has no term of its own: refused)."""


def offloaded_terms(terms: dict, modules) -> dict:
    """The part of one layer's activation ``terms`` that the fine-grained ``modules`` move to
    the host (the rest stays on the GPU).

    >>> offloaded_terms({"norm_inputs": 4.0, "expert_input": 2.0, "q": 1.0}, ("attn_norm", "expert_fc1"))
    {'norm_inputs': 2.0, 'expert_input': 2.0}
    """
    out: dict = {}
    for mod in modules:
        for term, share in OFFLOAD_MODULES[mod].items():
            if terms.get(term) and share:
                out[term] = min(terms[term], out.get(term, 0.0) + share * terms[term])
    return out


def check_offload(par, model) -> None:
    """ConfigError unless the offload knobs of ``par`` go with it and ``model``, as Megatron-Core
    checks them (transformer_config.py, optimizer_config.py @ d98e8a6)."""
    n = par.offload_activation_layers
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ConfigError("offload.activations", n, "must be an integer >= 0 (layers whose activations go to the host)")
    if n:
        if n >= model.num_layers:
            raise ConfigError("offload.activations", n, f"must be below the model's {model.num_layers} layers "
                                                        "(Megatron-Core keeps at least one on the GPU)")
        if par.pp > 1:
            raise ConfigError("offload.activations", n, f"needs pp 1 (Megatron-Core has no CPU offloading with "
                                                        f"pipeline parallelism); pp is {par.pp}")
        if par.recompute != "none":
            raise ConfigError("offload.activations", n, f"needs recompute none (Megatron-Core refuses CPU offloading "
                                                        f"with recomputation); recompute is {par.recompute}")
    mods = par.offload_modules
    if not isinstance(mods, tuple) or any(m not in OFFLOAD_MODULES for m in mods):
        raise ConfigError("offload.modules", list(mods) if isinstance(mods, tuple) else mods,
                          f"must be a list of {', '.join(OFFLOAD_MODULES)} (Megatron-Core's offload_modules)")
    if mods and n:
        raise ConfigError("offload.modules", list(mods), "cannot go with offload.activations (Megatron-Core: "
                                                         "fine-grained offloading excludes cpu_offloading)")
    if "attn_proj" in mods and "core_attn" not in mods:
        raise ConfigError("offload.modules", list(mods), "attn_proj needs core_attn (its input is core_attn's output, "
                                                         "which core_attn's backward needs)")
    if "fused_group_mlp" in mods and ({"expert_fc1", "moe_act"} & set(mods)):
        raise ConfigError("offload.modules", list(mods), "fused_group_mlp cannot go with expert_fc1 or moe_act")
    f = par.optimizer_offload_fraction
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 <= f <= 1.0:
        raise ConfigError("offload.optimizer", f, "must be a fraction in [0, 1] of the optimizer state on the host")
