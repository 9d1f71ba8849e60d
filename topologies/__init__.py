"""Cluster hardware and graphs: GPUs, NVLink domains, NICs, leaf/spine fabrics, racks.

The lowest layer of clustersim: it imports nothing from ``workloads`` or ``simulator``.
"""

from .cluster import CLUSTER_PRESETS, Cluster, ClusterSpec, build_cluster, load_preset
from .errors import ConfigError
from .routing import Route, Router
from .specs import GPU_SPECS, NIC_SPECS, GPUSpec, NICSpec, Tier, get_gpu_spec
from .units import parse_bandwidth, parse_size, parse_time

__all__ = ["Cluster", "ClusterSpec", "build_cluster", "load_preset", "CLUSTER_PRESETS", "ConfigError",
           "Route", "Router", "GPUSpec", "NICSpec", "GPU_SPECS", "NIC_SPECS", "Tier", "get_gpu_spec",
           "parse_bandwidth", "parse_size", "parse_time"]
