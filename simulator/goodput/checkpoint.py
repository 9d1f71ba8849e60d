"""Checkpoint size and write time from the scenario's memory model, sharded as the layout
shards the state.

A checkpoint saves, for every parameter once, its weights, master weights and optimizer
states (gradients are not saved), in the bytes per parameter of the scenario's static memory
accounting (``megatron``: 2 + 4 + 8 = 14 B).  The unique bytes of the job are each pipeline
stage's parameters after tensor- and expert-parallel sharding (the memory model's
``num_params`` per rank), times the ranks of the stage, over the data-parallel degree that
replicates them (``dp * cp`` for dense parameters, ``edp`` for routed experts): data-parallel
replicas of the same state write it once.

Who writes: state sharded over data parallelism (the distributed optimizer's master weights
and moments, ZeRO-3's weights) is written by each rank, its shard; replicated state by the
first data-parallel replica only.  With tensor parallelism innermost in the rank order, a
node holds ``min(gpus_per_node, tp)`` ranks of the first replica: the busiest node writes
their replicated state in full plus every one of its ranks' shards, for the largest stage.

The write takes the longer of the busiest node at the per-node storage bandwidth and the
unique bytes at the storage's aggregate bandwidth.  An asynchronous checkpoint blocks for the
busiest rank's bytes over the device-to-host copy bandwidth (:func:`host_copy_bytes_per_s`).
"""

from __future__ import annotations

from topologies.specs import PCIE_BANDWIDTH
from workloads.memory import bytes_per_param

__all__ = ["checkpoint_bytes", "checkpoint_write_s", "host_copy_bytes_per_s", "HOST_COPY_EFFICIENCY"]

HOST_COPY_EFFICIENCY = 0.8
"""Share of one direction of the GPU's PCIe x16 link a device-to-host copy into pinned memory
reaches: an assumption (about 50 GB/s on Gen5, 25 GB/s on Gen4)."""


def host_copy_bytes_per_s(sc) -> float:
    """Default device-to-host copy bandwidth of one GPU: its generation's PCIe x16 link
    (:data:`topologies.specs.PCIE_BANDWIDTH`) times :data:`HOST_COPY_EFFICIENCY`."""
    return PCIE_BANDWIDTH.get(sc.cluster.gpu.generation, PCIE_BANDWIDTH["hopper"]) * HOST_COPY_EFFICIENCY


def _stage_bytes(e, b: dict) -> tuple[float, float]:
    """(replicated, sharded) saved bytes one rank of a stage holds: the terms its ZeRO stage
    does not shard over data parallelism, and the rest."""
    saved = e.weights_bytes + e.master_weights_bytes + e.optimizer_states_bytes
    zero = e.zero_stage
    repl = (b["weights"] if zero < 3 else 0.0) + ((b["master_weights"] + b["optimizer_states"]) if zero < 1 else 0.0)
    replicated = e.num_params * repl
    return replicated, saved - replicated


def checkpoint_bytes(sc) -> dict:
    """Unique bytes of one checkpoint of ``sc``, the bytes its busiest node writes and those of
    its busiest rank (what an asynchronous checkpoint copies from device to host)."""
    par, n_gpus, gpn = sc.parallel, sc.cluster.num_gpus, sc.cluster.gpus_per_host
    b = bytes_per_param(0, 1, sc.memory_accounting)
    per_param = b["weights"] + b["master_weights"] + b["optimizer_states"]
    est = sc.memory_estimates()
    ranks = n_gpus / par.pp
    unique = node = rank = 0.0
    for e in est:
        dense = e.num_params - e.num_expert_params
        unique += ranks * (dense / (par.dp * par.cp) + e.num_expert_params / par.expert_dp) * per_param
        replicated, sharded = _stage_bytes(e, b)
        node = max(node, min(gpn, par.tp) * replicated + gpn * sharded)
        rank = max(rank, replicated + sharded)
    return {"checkpoint_unique_bytes": unique, "checkpoint_node_bytes": node, "checkpoint_rank_bytes": rank,
            "checkpoint_bytes_per_param": per_param}


def checkpoint_write_s(info: dict, storage_bytes_per_s: float, node_bytes_per_s: float) -> float:
    """The write time of the checkpoint :func:`checkpoint_bytes` sized: the busiest node at
    the per-node bandwidth or the unique bytes at the aggregate one, whichever is longer."""
    return max(info["checkpoint_node_bytes"] / node_bytes_per_s, info["checkpoint_unique_bytes"] / storage_bytes_per_s)
