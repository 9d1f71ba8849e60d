"""NCCL's own collective cost model: latency tables, protocol factors, enable rules.

Every number here is read from NVIDIA/nccl ``src/graph/tuning.cc`` at tag v2.27.7-1
(commit 593de54e), except where marked [2.28+] (v2.30.7-1, commit 73cf1122).  Units as
in NCCL: latencies in microseconds; we convert to seconds at the edge.

NCCL predicts ``time = latency + nBytes / algBw`` per (algorithm, protocol) and picks the
smallest.  clustersim keeps NCCL's latency model verbatim and its protocol and
algorithm bandwidth factors; the bandwidth itself comes from the flow network (the
uncontended rate of the collective's channels over the real links), so prediction and
simulation agree when nothing else runs.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from topologies.constants import Constants, active

__all__ = ["ALGORITHMS", "PROTOCOLS", "BASE_LAT_US", "HW_LAT_US", "TREE_CORRECTION", "LL_MAX_BW_GBPS",
           "NcclTables", "tables", "latency_us", "bandwidth_factor", "enabled_algorithms"]

#: NCCL's algorithms and protocols, in NCCL's order (the axes of its tables below; ties between
#: equal predictions go to the earlier).  The objects behind the names: :mod:`.algorithms`.
ALGORITHMS = ("ring", "tree", "nvls", "nvls_tree", "collnet_direct")
PROTOCOLS = ("LL", "LL128", "Simple")

# tuning.cc L132-137: baseLat[algo][proto] (us)
BASE_LAT_US = {
    "tree": (6.8, 14.0, 8.4),
    "ring": (6.6, 14.0, 8.4),
    "nvls": (0.0, 0.0, 0.0),
    "nvls_tree": (0.0, 0.0, 0.0),
    "collnet_direct": (0.0, 0.0, 0.0),
}

# tuning.cc L143-156: hwLat[NVLINK | PCI | NET][algo][proto] (us)
HW_LAT_US = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "nvls": (0, 0, 25.0), "nvls_tree": (0, 0, 25.0),
               "collnet_direct": (0, 0, 3.7)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7), "nvls": (0, 0, 0.0), "nvls_tree": (0, 0, 0.0),
            "collnet_direct": (0, 0, 3.7)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "nvls": (0, 0, 18.0), "nvls_tree": (0, 0, 14.0),
            "collnet_direct": (0, 0, 31.0)},
}

# tuning.cc L555-559: treeCorrectionFactor[proto][log2(nBytes >> 6)], applied to tree all-reduce
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
}

# tuning.cc L165-170: llMaxBws[row][N1 | N2 | N4] (GB/s, caps the total LL bus bandwidth).
# Row: single node -> GPU generation; multi node -> CPU vendor (Intel row 0).
LL_MAX_BW_GBPS = {
    "ampere": (87.7, 39.0, 20.4),
    "hopper": (141.0, 39.0, 20.4),
    "blackwell": (2 * 141.0, 39.0, 20.4),
}

# CollNet Direct Simple bus bandwidth on sm90+ (tuning.cc L279-298: "busBw *= 0.85").
COLLNET_FACTOR = {"ampere": 1.0, "hopper": 0.85, "blackwell": 0.85}
# CollNet Direct "arity serialization" latency per extra local rank (us, tuning.cc L362-364).
COLLNET_ARITY_US = 0.4

# Network post overhead (tuning.cc getNetOverhead, L201-209): 1 us on Intel/other CPUs.
NET_OVERHEAD_US = 1.0
# Ring Simple all-reduce across nodes, "plateau effect of ring" (tuning.cc L561-578).
RING_PLATEAU_FACTOR = {"ampere": 1.4, "hopper": 1.4, "blackwell": 1.4}


class NcclTables(NamedTuple):
    """NCCL's tables as one run reads them: the module's tables (the documented defaults)
    with a :class:`~topologies.constants.Constants` object's overrides (:func:`tables`).
    The collective engine builds one and hands it to the algorithms."""

    base_lat_us: dict
    hw_lat_us: dict
    tree_correction: dict
    ll_max_bw_gbps: dict
    ring_plateau_factor: dict
    net_overhead_us: float
    collnet_arity_us: float
    max_ring_channels: int
    """``simulator.collectives.plans.MAX_RING_CHANNELS``."""


_FIELDS = {"base_lat_us": "BASE_LAT_US", "hw_lat_us": "HW_LAT_US", "tree_correction": "TREE_CORRECTION",
           "ll_max_bw_gbps": "LL_MAX_BW_GBPS", "ring_plateau_factor": "RING_PLATEAU_FACTOR",
           "net_overhead_us": "NET_OVERHEAD_US", "collnet_arity_us": "COLLNET_ARITY_US"}


def tables(constants: Constants | None = None) -> NcclTables:
    """The NCCL tables under ``constants`` (default: the active ones)."""
    c = active() if constants is None else constants
    return NcclTables(**{f: c.get(f"simulator.collectives.nccl.{attr}") for f, attr in _FIELDS.items()},
                      max_ring_channels=c.get("simulator.collectives.plans.MAX_RING_CHANNELS"))


def _log2i(x: int) -> int:
    return int(math.floor(math.log2(x))) if x >= 1 else 0


def num_steps(kind: str, n: int) -> int:
    """Pipeline steps of a ring collective over n ranks (tuning.cc L250-252)."""
    if kind == "all_reduce":
        return 2 * (n - 1)
    if kind in ("all_gather", "reduce_scatter"):
        return n - 1
    return n


def latency_us(kind: str, algo: str, proto: str, n_ranks: int, n_nodes: int, intra_hw: str = "nvlink",
               latency_inter_us: float = 0.0, intra_scale: float = 1.0, inter_scale: float = 1.0,
               nccl_tables: NcclTables | None = None) -> float:
    """NCCL's latency for one call in microseconds: :meth:`.algorithms.CollectiveAlgorithm.latency_us`
    of ``ALGORITHMS[algo]`` with ``PROTOCOLS[proto]`` (the model lives with each algorithm);
    ``nccl_tables`` default :func:`tables` of the active constants."""
    from .algorithms import ALGORITHMS as _A, PROTOCOLS as _PR
    a = _A.get(algo)
    if a is None or algo not in ALGORITHMS:
        raise ValueError(algo)
    return a.latency_us(kind, _PR[proto], n_ranks, n_nodes, intra_hw, latency_inter_us, intra_scale, inter_scale,
                        nccl_tables or tables())


def bandwidth_factor(kind: str, algo: str, proto: str, n_nodes: int, size_bytes: float,
                     nccl_tables: NcclTables | None = None) -> float:
    """Fraction of the link bandwidth NCCL expects an (algorithm, protocol) to reach.

    Ring LL 0.5 and LL128 0.92; tree all-reduce 0.92 (any protocol), then LL 1/3.8 and
    LL128 7/9 (one node) or 120/128, times the size-dependent tree correction
    (tuning.cc L279-298 and L555-578).  NVLS factors live in the calibration.  The model
    lives with each algorithm (:meth:`.algorithms.CollectiveAlgorithm.nccl_bandwidth_factor`).
    """
    from .algorithms import ALGORITHMS as _A, PROTOCOLS as _PR
    return _A[algo].nccl_bandwidth_factor(kind, _PR[proto], n_nodes, size_bytes, nccl_tables or tables())


def enabled_algorithms(kind: str, n_nodes: int, nvls_capable: bool, ppn: int,
                       sharp: bool = False) -> list[tuple[str, str]]:
    """(algorithm, protocol) pairs NCCL would consider for a call (tuning.cc L255-264, L436-471;
    enqueue.cc updateCollCostTable).

    Broadcast: ring.  All-gather / reduce-scatter: ring.  All-reduce: ring and tree (tree
    only across nodes here: inside one node NCCL's tree is a chain that never wins),
    NVLS on one NVSwitch node (Hopper+, more than 2 GPUs), NVLS-tree across nodes.  Where
    the cluster declares SHARP (NCCL's CollNet enabled) an all-reduce across nodes may
    also use CollNet Direct (at most 8 local ranks) and NVLS across nodes.
    """
    out = [("ring", p) for p in PROTOCOLS]
    if kind == "all_reduce":
        if n_nodes > 1:
            out += [("tree", p) for p in PROTOCOLS]
        if nvls_capable and ppn > 2:
            out.append(("nvls", "Simple") if n_nodes == 1 else ("nvls_tree", "Simple"))
            if n_nodes > 1 and sharp:
                out.append(("nvls", "Simple"))
        if n_nodes > 1 and sharp and ppn <= 8:
            out.append(("collnet_direct", "Simple"))
    return out
