"""The host model: what it costs the CPU to issue a rank's work (Python, autograd and the CUDA
launch), by host mode (``eager``, ``cuda_graphs``, ``none``) or measured per-call costs, and the
per-module CUDA-graph scopes that take parts of a layer off the host.  The engine's host cursor
spends these; :mod:`workloads.costs.compute` re-exports them."""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

from topologies import ConfigError
from topologies.constants import value as active_value

__all__ = ["CUDA_GRAPH_SCOPES", "HOST_COSTS", "HOST_MODES", "HostCosts", "host_costs"]


HOST_MODES = ("eager", "cuda_graphs", "none")
"""How the host issues a rank's work (the scenario's ``host``): ``eager`` PyTorch,
``cuda_graphs`` (layers replayed from captured graphs), or ``none`` (an infinitely fast
host: the GPU never waits for it).  A mapping ``{kernel_us, call_us, checkpoint_us,
expert_launch_us}`` is eager with a measured host's own costs (:func:`host_costs`)."""


class HostCosts(NamedTuple):
    """Host (CPU) seconds to issue work: Python, autograd and the CUDA launch included."""

    kernel_s: float
    """Per modelled kernel (:attr:`~workloads.costs.flops.ComputeOp.num_kernels`)."""
    call_s: float
    """Per collective call and per batch of pipeline transfers."""
    checkpoint_s: float
    """Per layer and micro-batch under full recompute (the checkpoint function itself:
    saving and restoring RNG states, the no-grad forward, re-entering autograd)."""
    graphed: frozenset = frozenset()
    """Per-module CUDA-graph scopes (:data:`CUDA_GRAPH_SCOPES`): the ops of these modules are
    replayed from captured graphs (no per-kernel host cost, the graph launch gap on the GPU);
    everything else is issued eagerly at ``kernel_s``.  Empty: no per-module graphs."""
    expert_launch_s: float = 0.0
    """Per launch that Transformer Engine's grouped linear issues for each further local
    expert from its C++ loop: the first expert's launches are in the op's ``kernel_s``, every
    other expert that receives tokens adds one cuBLASLt GEMM per grouped GEMM (and one
    quantisation per quantised grouped GEMM input) at this cost.  0: one launch covers all
    experts (graphs, an ideal host)."""


CUDA_GRAPH_SCOPES: dict[str, str] = {
    # Megatron-Core's per-layer capture regions (megatron/core/transformer/enums.py
    # ``CudaGraphModule``; what each covers: transformer_layer.py
    # ``_get_submodules_under_cudagraphs`` and the MoE layer's partial-graph forward).
    # The experts, the token permutation, the dispatch and combine stay eager under every
    # scope but ``moe`` (which Megatron allows only for drop-and-pad MoE layers).
    "attn": "input norm and self-attention (incl. the output projection and residual)",
    "mlp": "pre-MLP norm and the dense MLP (dense layers only)",
    "moe": "the whole MoE block (drop-and-pad MoE layers only)",
    "moe_router": "pre-MLP norm and the router (top-k) of MoE layers",
    "moe_preprocess": "the dispatcher's token-count preprocessing (no modelled kernels of its own)",
    "mamba": "a Mamba layer's norm and mixer",
}


HOST_COSTS: dict[str, HostCosts] = {
    # The GPU cannot start a kernel the host has not issued, so when kernels are short
    # (small layers, small micro-batches, high TP) the step is paced by the host.
    # eager: measured by experiments/microbench/gpu_bench.py (parts "host" and
    # "checkpointed", data/h100_host2.json; compare_gpu_bench.py derives these) on one H100
    # SXM host (a 16-vCPU VM, PyTorch 2.11, Python 3.12): Megatron-LM's 2022 GPT layer
    # (LayerNorm, QKV, unfused baddbmm / softmax / dropout / bmm, projection,
    # bias-dropout-add, GELU MLP; FP16) issued back to back while the GPU lags, five shapes
    # (h 1024-3072, TP shards 1-8), the median of five rounds of 50 calls each:
    # * kernel: the forward without autograd plus the forward and backward with it (3.20-
    #   3.68 ms a layer) over the 13 + 13 + 19 kernels the model counts for the forward,
    #   the recomputed forward and the backward: median 73.6 us (the profiler saw 18-21 +
    #   66-72 real kernels, ~35 us each);
    # * checkpoint: the same layer under torch.utils.checkpoint (reentrant, as Megatron's
    #   full recompute) took 4.16-4.73 ms, 0.75-1.53 ms more: median 0.891 ms;
    # * call: with Megatron's four TP autograd functions per layer (all-reduce in the
    #   forward of the two row-parallel outputs and the backward of the two column-parallel
    #   inputs) on a one-rank NCCL group, 6 calls more per layer and micro-batch under full
    #   recompute took a median 227 us each (32-288 us across the shapes; a bare all_reduce
    #   call: 31-53 us).  SP, DP, EP and CP calls and pipeline batches reuse it (an
    #   assumption: only the TP all-reduce path was measured).
    # One host, inherently: a faster CPU or another PyTorch issues faster.  vTrain's
    # single-node A100 runs (not used here) level off at ~3.1 ms per layer and micro-batch
    # at TP 1 and ~5 ms at TP 8 under full recompute; these costs give 4.2 and 5.6 ms.
    # cuda_graphs: the host launches one graph per captured region and its kernels issue
    # from the device (LAUNCH_OVERHEAD_S[True]): no per-kernel host cost (an assumption).
    # expert_launch: Transformer Engine's GroupedLinear (transformer_engine/pytorch/module/
    # grouped_linear.py, v2.12-v2.18) quantises each expert's slice in ``tex.split_quantize``
    # (one kernel and its output buffers per expert) and runs ``general_grouped_gemm``, a C++
    # loop that issues one cuBLASLt GEMM per expert; common/gemm/cublaslt_gemm.cu creates the
    # matmul and layout descriptors and queries ``cublasLtMatmulAlgoGetHeuristic`` on every
    # call (no algorithm cache).  A cuBLASLt GEMM issued that way costs about 10 us of host
    # time (NVIDIA/raft PR #1736, NVTX from entering the wrapper to the launch: ~10 us with a
    # heuristic query per call, ~5 us memoised; x86); one small kernel launched from PyTorch
    # cost 7-9 us on our H200 host (experiments/microbench/data/h200_moe_host.json).  10 us
    # per launch for both; x86 hosts (Grace not measured here).
    "eager": HostCosts(kernel_s=73.6e-6, call_s=227e-6, checkpoint_s=0.891e-3, expert_launch_s=10e-6),
    "cuda_graphs": HostCosts(0.0, 0.0, 0.0),
    "none": HostCosts(0.0, 0.0, 0.0),
}


def host_costs(spec, where: str = "host") -> HostCosts:
    """The :class:`HostCosts` of a scenario's ``host``: a mode of :data:`HOST_MODES`, or a
    mapping of ``kernel_us``, ``call_us``, ``checkpoint_us``, ``expert_launch_us`` (microseconds, each >= 0;
    missing ones take the eager defaults) for a host measured with ``gpu_bench.py``, and
    ``cuda_graph_scope`` (a list of :data:`CUDA_GRAPH_SCOPES`): eager issue except for the
    modules captured in per-layer graphs."""
    if isinstance(spec, HostCosts):
        return spec
    if isinstance(spec, str):
        table = active_value("workloads.costs.host.HOST_COSTS", HOST_COSTS)
        if spec not in table:
            raise ConfigError(where, spec, f"must be one of {', '.join(HOST_MODES)} or a mapping of kernel_us, "
                                           "call_us, checkpoint_us, expert_launch_us")
        return table[spec]
    if isinstance(spec, dict):
        keys = {"kernel_us": "kernel_s", "call_us": "call_s", "checkpoint_us": "checkpoint_s",
                "expert_launch_us": "expert_launch_s"}
        bad = sorted(set(spec) - set(keys) - {"cuda_graph_scope"})
        if bad:
            raise ConfigError(f"{where}.{bad[0]}", spec[bad[0]],
                              f"unknown key; known: {', '.join(keys)}, cuda_graph_scope")
        vals = active_value("workloads.costs.host.HOST_COSTS", HOST_COSTS)["eager"]._asdict()
        if "cuda_graph_scope" in spec:
            vals["graphed"] = _graph_scope(spec["cuda_graph_scope"], f"{where}.cuda_graph_scope")
        for k, v in spec.items():
            if k == "cuda_graph_scope":
                continue
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 <= v < math.inf:
                raise ConfigError(f"{where}.{k}", v, "must be a number of microseconds >= 0")
            vals[keys[k]] = float(v) * 1e-6
        return HostCosts(**vals)
    raise ConfigError(where, spec, f"must be one of {', '.join(HOST_MODES)} or a mapping")


def _graph_scope(scope, where: str) -> frozenset:
    """The validated set of a ``cuda_graph_scope`` list (names of :data:`CUDA_GRAPH_SCOPES`)."""
    if isinstance(scope, str):
        scope = [scope]
    if not isinstance(scope, (list, tuple)) or not scope:
        raise ConfigError(where, scope, f"must be a non-empty list of {', '.join(CUDA_GRAPH_SCOPES)}")
    for name in scope:
        if name not in CUDA_GRAPH_SCOPES:
            raise ConfigError(where, name, f"unknown scope; known: {', '.join(CUDA_GRAPH_SCOPES)}")
    return frozenset(scope)
