"""Interruption rates per component, from the one published breakdown at scale.

Llama 3 405B pre-training (Meta, "The Llama 3 Herd of Models", arXiv:2407.21783, §3.3.4,
Table 5): 419 unexpected interruptions in a 54-day snapshot on up to 16,384 H100 GPUs (2,048
eight-GPU hosts).  Each cause's count becomes a rate per unit-hour over 54 x 24 hours, per
GPU for GPU faults, per host for host, network and maintenance causes (the number of hosts,
NICs, cables and switch ports grows with the job), and per job for software bugs and
dependencies (a property of the code, not of the job's size: an assumption).  The snapshot
also ran stages on 8,192 GPUs, which the paper does not split out, so these rates are lower
bounds by up to 2x; the 47 planned interruptions are not failures and are left out.

Rates taken from this table cannot be checked against this table; they are a default to be
replaced with a cluster's own figures (``clustersim goodput --failures``).
"""

from __future__ import annotations

from .model import FailureCause

__all__ = ["LLAMA3_CAUSES", "LLAMA3_GPUS", "LLAMA3_HOURS", "job_mtbf_h", "failures_per_1000_node_days"]

LLAMA3_GPUS = 16384
LLAMA3_HOURS = 54 * 24.0
_NODES = LLAMA3_GPUS // 8

# (cause, kind, per, count in Table 5)
_TABLE5 = (
    ("faulty_gpu", "hardware", "gpu", 148),
    ("gpu_hbm3", "hardware", "gpu", 72),
    ("software_bug", "software", "job", 54),
    ("network_switch_cable", "hardware", "node", 35),
    ("host_maintenance", "maintenance", "node", 32),
    ("gpu_sram", "hardware", "gpu", 19),
    ("gpu_system_processor", "hardware", "gpu", 17),
    ("nic", "hardware", "node", 7),
    ("nccl_watchdog_timeout", "software", "node", 7),
    ("silent_data_corruption", "hardware", "gpu", 6),
    ("gpu_thermal_interface", "hardware", "gpu", 6),
    ("ssd", "hardware", "node", 3),
    ("power_supply", "hardware", "node", 3),
    ("server_chassis", "hardware", "node", 2),
    ("io_expansion_board", "hardware", "node", 2),
    ("dependency", "software", "job", 2),
    ("cpu", "hardware", "node", 2),
    ("system_memory", "hardware", "node", 2),
)
_UNITS = {"gpu": LLAMA3_GPUS, "node": _NODES, "job": 1}

LLAMA3_CAUSES: tuple[FailureCause, ...] = tuple(
    FailureCause(name, kind, per, count / (LLAMA3_HOURS * _UNITS[per])) for name, kind, per, count in _TABLE5)
"""The Table 5 causes as rates per GPU-, host- or job-hour."""


def job_mtbf_h(causes, gpus: int, gpus_per_node: int = 8, kinds: tuple[str, ...] | None = None) -> float:
    """Mean time between interruptions (hours) of a job on ``gpus`` GPUs from the causes of the
    given ``kinds`` (all when None): the rates per GPU, per node and per job summed."""
    units = {"gpu": gpus, "node": -(-gpus // gpus_per_node), "job": 1}
    lam = sum(c.rate_per_hour * units[c.per] for c in causes if kinds is None or c.kind in kinds)
    return float("inf") if lam == 0 else 1.0 / lam


def failures_per_1000_node_days(causes, gpus_per_node: int = 8, kinds: tuple[str, ...] | None = None) -> float:
    """The causes' rate per node (its GPUs' rates and its own) in failures per 1000 node-days,
    the unit of the per-node failure rates fitted on Meta's research clusters (Kokolis et al.,
    arXiv:2410.21680); per-job causes do not grow with the node count and are left out."""
    per_node = sum(c.rate_per_hour * {"gpu": gpus_per_node, "node": 1, "job": 0}[c.per]
                   for c in causes if kinds is None or c.kind in kinds)
    return per_node * 24.0 * 1000.0
