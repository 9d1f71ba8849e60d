"""Textbook alpha-beta collective times, independent of the flow network.

The flow path never imports this module; tests compare the two.  ``B`` is the
bandwidth available to each rank's channel set (bytes/s), ``alpha`` the latency of one
pipeline step (s), ``S`` the payload in nccl-tests' convention (the all-reduce buffer;
the full gathered buffer for all-gather and reduce-scatter).

References: Thakur, Rabenseifner and Gropp, "Optimization of Collective Communication
Operations in MPICH" (2005) for ring and chain costs; Sanders, Speck and Traeff (2009)
for the two-tree all-reduce, whose pipelined cost is S/B per tree direction per byte.
"""

from __future__ import annotations

import math

__all__ = ["ring_all_reduce", "ring_all_gather", "ring_reduce_scatter", "chain_broadcast", "tree_all_reduce",
           "nvls_all_reduce", "p2p", "uniform_all_to_all", "sharp_all_reduce"]


def ring_all_reduce(n: int, S: float, B: float, alpha: float) -> float:
    """2(n-1)/n * S/B + 2(n-1) alpha."""
    return 2 * (n - 1) / n * S / B + 2 * (n - 1) * alpha


def ring_all_gather(n: int, S: float, B: float, alpha: float) -> float:
    """(n-1)/n * S/B + (n-1) alpha."""
    return (n - 1) / n * S / B + (n - 1) * alpha


def ring_reduce_scatter(n: int, S: float, B: float, alpha: float) -> float:
    """(n-1)/n * S/B + (n-1) alpha."""
    return (n - 1) / n * S / B + (n - 1) * alpha


def chain_broadcast(n: int, S: float, B: float, alpha: float) -> float:
    """Pipelined chain from the root: S/B + (n-1) alpha."""
    return S / B + (n - 1) * alpha


def tree_all_reduce(n_nodes: int, ppn: int, S: float, B: float, alpha: float) -> float:
    """Double binary tree across nodes, chains inside them.

    Each tree carries S/2, reduced up and broadcast down; a node interior in one tree
    (two children and a parent) is a leaf in the other, so its busiest port carries four
    tree streams: 2 S/B.  With two nodes each tree is a single edge: S/B.
    Latency: 2 ((ppn - 1) + floor(log2 n_nodes)) alpha.
    """
    bw = S / B if n_nodes == 2 else 2 * S / B
    return bw + 2 * ((ppn - 1) + int(math.floor(math.log2(n_nodes)))) * alpha


def nvls_all_reduce(n: int, S: float, B: float, alpha: float) -> float:
    """In-switch reduction: each GPU sends and receives S (1 + 1/n); latency 2 alpha."""
    return S * (1 + 1 / n) / B + 2 * alpha


def p2p(S: float, B: float, alpha: float) -> float:
    return S / B + alpha


def uniform_all_to_all(num_nodes: int, ppn: int, s: float, B_nvlink: float, B_nic: float, alpha: float) -> float:
    """Every rank sends ``s`` bytes to every other rank; ``ppn`` ranks per node on ``ppn`` rails.

    With rail-aligned forwarding (PXN) the NIC of rail r carries what all ``ppn`` ranks of
    its node send to the rail-r ranks of the other nodes, ppn (N-1) s; a rank's NVLink
    port carries its (ppn-1) local sends plus its (ppn-1)(N-1) forwarded sends.  The
    busiest port sets the time.
    """
    nvl = (ppn - 1) * s * num_nodes / B_nvlink if ppn > 1 else 0.0
    nic = ppn * (num_nodes - 1) * s / B_nic if num_nodes > 1 else 0.0
    return max(nvl, nic) + alpha


def sharp_all_reduce(ppn: int, S: float, B_nvlink: float, B_nic: float, alpha: float, nvls: bool = False) -> float:
    """In-network (SHARP) all-reduce across nodes of ``ppn`` ranks, every rank a NIC head.

    Inside a node: direct reduce-scatter plus all-gather, 2 (ppn-1)/ppn S per NVLink port
    (NVLS: S (1 + 1/ppn)); across nodes each head moves its S/ppn slice to the switches
    and back once.  The two stages pipeline, so the slower one sets the time; latency
    2 alpha (up the aggregation tree and down).
    """
    intra = (1 + 1 / ppn) * S / B_nvlink if nvls else 2 * (ppn - 1) / ppn * S / B_nvlink
    return max(intra, S / ppn / B_nic) + 2 * alpha
