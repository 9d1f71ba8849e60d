"""Hardware constants, each with its source.

These tables are the documented defaults; lookups (:func:`get_gpu_spec`, :func:`get_nic_spec`)
apply the active :class:`~topologies.constants.Constants` overrides.

Peak numbers are dense (no 2:4 sparsity).  Every GPU row cites the NVIDIA datasheets,
collected by stas00/ml-engineering (compute/accelerator/README.md, network/README.md)
and glennklockwood.com; the MAMF figures (maximum achievable matmul FLOP/s, measured
with stas00's mamf-finder) feed the compute model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum

from .constants import active, table_field, value as active_value
from .errors import ConfigError

__all__ = ["Tier", "GPUSpec", "NICSpec", "GPU_SPECS", "NIC_SPECS", "get_gpu_spec", "get_nic_spec",
           "PCIE_BANDWIDTH", "LINK_LATENCY_S"]


class Tier(StrEnum):
    """Network tier of a link."""

    NVLINK = "nvlink"   #: GPU <-> NVSwitch (scale-up domain)
    PCIE = "pcie"       #: GPU <-> NIC inside a host
    IB = "ib"           #: NIC <-> leaf <-> spine (scale-out fabric)
    XRACK = "xrack"     #: spine <-> cross-rack core (slower tier between racks)


TIER_INDEX = {Tier.NVLINK: 0, Tier.PCIE: 1, Tier.IB: 2, Tier.XRACK: 3}
TIERS = tuple(TIER_INDEX)


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """One GPU model.  Bandwidths are per direction, in bytes/s."""

    name: str
    generation: str
    """'ampere', 'hopper' or 'blackwell': selects the calibrated constants."""
    hbm_bytes: float
    """HBM capacity in bytes (the datasheet's GB read as GiB, see GiB above)."""
    hbm_bandwidth_bytes_per_s: float
    peak_flops: dict[str, float]
    """Dense peak FLOP/s per dtype ('tf32', 'bf16', 'fp16', 'fp8', 'fp4')."""
    mamf_flops: dict[str, float]
    """Measured maximum achievable matmul FLOP/s per dtype (empty when unmeasured)."""
    nvlink_bandwidth_bytes_per_s: float
    """Scale-up bandwidth per GPU, one direction."""
    nvlink_domain_size: int
    """GPUs in one NVLink domain in the reference system (8 for HGX, 72 for NVL72)."""
    nvls: bool
    """NVLink SHARP (in-switch reduction) available: Hopper and later NVSwitch systems."""
    source: str
    notes: str = ""
    power_w: float = 0.0
    """Board power limit (TDP) in watts, the cap GPU Boost holds the clock under: it sets the
    sustained clock (``workloads.costs.compute.SUSTAINED_FRACTION``), so parts of one die at
    different limits differ (B200 1,000 W against GB200 1,200 W).  0: not given."""


_HWCSV = "NVIDIA datasheets"
# Datasheet "80 GB" HBM is 80 GiB: nvidia-smi shows 81,559 MiB on an H100 SXM 80GB and
# 40,960 MiB on an A100 40GB, so capacities are taken as binary gigabytes.
GiB = 2**30
_STAS = "stas00/ml-engineering compute/accelerator/README.md and network/README.md"

GPU_SPECS: dict[str, GPUSpec] = {s.name: s for s in (
    GPUSpec("A100-SXM4-40GB", "ampere", 40 * GiB, 1.555e12,
            {"tf32": 156e12, "bf16": 312e12, "fp16": 312e12}, {},
            300e9, 8, False, f"{_HWCSV} (NVIDIA A100 datasheet via glennklockwood.com; {_STAS})",
            "no MAMF measured for the 40GB part; FLOP/s identical to 80GB", power_w=400),
    GPUSpec("A100-SXM4-80GB", "ampere", 80 * GiB, 2.039e12,
            {"tf32": 156e12, "bf16": 312e12, "fp16": 312e12}, {"bf16": 271.2e12},
            300e9, 8, False, f"{_HWCSV} ({_STAS}; MAMF best shape 1024x10240x5120)", power_w=400),
    GPUSpec("H100-SXM", "hopper", 80 * GiB, 3.35e12,
            {"tf32": 494.5e12, "bf16": 989e12, "fp16": 989e12, "fp8": 1979e12},
            {"bf16": 794.5e12, "fp8": 1402.6e12},
            450e9, 8, True, f"{_HWCSV} ({_STAS}; NVIDIA H100 spec page: SXM up to 700 W)", power_w=700),
    GPUSpec("H800-SXM", "hopper", 80 * GiB, 3.35e12,
            {"tf32": 494.5e12, "bf16": 989e12, "fp16": 989e12, "fp8": 1979e12}, {},
            200e9, 8, True, f"{_HWCSV} (secondary spec pages: H100 silicon, NVLink cut to 400 GB/s "
            "bidirectional; DeepSeek-V3 report Sec 3.2.2: 'NVLink offers a bandwidth of 160 GB/s')",
            "no MAMF measured: the Hopper fallback fraction of the peak (H100's); NVLS assumed as on H100 "
            "(same NVSwitch generation)", power_w=700),
    GPUSpec("H200-SXM", "hopper", 141 * GiB, 4.8e12,
            {"tf32": 494.5e12, "bf16": 989e12, "fp16": 989e12, "fp8": 1979e12},
            {"bf16": 794.5e12, "fp8": 1453.4e12},
            450e9, 8, True, f"{_HWCSV} ({_STAS}; MAMF bf16 'same as H100'; H200 SXM up to 700 W)", power_w=700),
    GPUSpec("B200", "blackwell", 180 * GiB, 8.0e12,
            {"tf32": 1125e12, "bf16": 2250e12, "fp16": 2250e12, "fp8": 4500e12, "fp4": 9000e12},
            {"bf16": 1745.0e12, "fp8": 3432.5e12},
            900e9, 8, True, f"{_HWCSV} ({_STAS}; DGX B200 datasheet)", "HBM 180 GB platform figure", power_w=1000),
    # Blackwell Ultra keeps Blackwell's dense BF16 / FP8 rates and raises dense FP4: HGX B300
    # 105 PFLOPS dense FP4 for 8 GPUs (13.1 per GPU, 1.46x B200's 9.0), GB300 NVL72 1,080 PFLOPS
    # for 72 (15.0 per GPU, 1.5x GB200's 10.0) (NVIDIA HGX B300 and GB300 NVL72 datasheets via
    # glennklockwood.com/garden/processors/B300).  Power limits: HGX B300 1,100 W, GB300 1,400 W
    # (same page: "Upgrade to 1400 W (from 1200 W)" for the NVL72 part; the HGX figure from
    # NVIDIA's HGX B300 specification, secondary sources).
    GPUSpec("B300", "blackwell", 288 * GiB, 8.0e12,
            {"tf32": 1125e12, "bf16": 2250e12, "fp8": 4500e12, "fp4": 105e15 / 8},
            {"bf16": 1769.0e12, "fp8": 3353.3e12},
            900e9, 8, True, f"{_HWCSV} ({_STAS}; HGX B300 dense FP4 105 PFLOPS / 8, glennklockwood.com)",
            power_w=1100),
    GPUSpec("GB200", "blackwell", 186 * GiB, 8.0e12,
            {"tf32": 1250e12, "bf16": 2500e12, "fp16": 2500e12, "fp8": 5000e12, "fp4": 10000e12},
            {"bf16": 1822.0e12, "fp8": 3615.6e12},
            900e9, 72, True, f"{_HWCSV} ({_STAS}; per Blackwell GPU in NVL72; GB200 NVL72 datasheet: "
            "1,200 W per GPU)", power_w=1200),
    GPUSpec("GB300", "blackwell", 288 * GiB, 8.0e12,
            {"tf32": 1250e12, "bf16": 2500e12, "fp8": 5000e12, "fp4": 15000e12}, {},
            900e9, 72, True, f"{_HWCSV} ({_STAS}; GB300 NVL72: 1,080 PFLOPS dense FP4 / 72, 20 TB HBM at "
            "576 TB/s / 72 = 8 TB/s, glennklockwood.com)", "no MAMF measured: the Blackwell fallback fraction",
            power_w=1400),
)}

_GPU_ALIASES = {
    "a100": "A100-SXM4-80GB", "a100-40gb": "A100-SXM4-40GB", "a100-80gb": "A100-SXM4-80GB",
    "a100-sxm4-40gb": "A100-SXM4-40GB", "a100-sxm4-80gb": "A100-SXM4-80GB",
    "h100": "H100-SXM", "h100-sxm": "H100-SXM", "h100-sxm5-80gb": "H100-SXM", "h100-sxm-80gb": "H100-SXM",
    "h200": "H200-SXM", "h200-sxm": "H200-SXM", "h200-sxm-141gb": "H200-SXM",
    "h800": "H800-SXM", "h800-sxm": "H800-SXM", "h800-sxm5-80gb": "H800-SXM",
    "b200": "B200", "b300": "B300", "gb200": "GB200", "gb300": "GB300",
}


def get_gpu_spec(name: str | GPUSpec, field: str = "cluster.gpu") -> GPUSpec:
    """Look a GPU up by name or alias (case-insensitive)."""
    if isinstance(name, GPUSpec):
        return name
    key = str(name).strip()
    if key not in GPU_SPECS:
        key = _GPU_ALIASES.get(key.lower())
        if key is None:
            raise ConfigError(field, name, f"unknown GPU; known: {', '.join(GPU_SPECS)}")
    return _with_active_fields(key, GPU_SPECS[key])


_SPEC_FIELDS = ("peak_flops", "mamf_flops", "hbm_bandwidth_bytes_per_s", "nvlink_bandwidth_bytes_per_s")
"""Fields of :data:`GPU_SPECS` whose ``GPU_SPECS[*].field`` a Constants object may override."""


def _with_active_fields(key: str, spec: GPUSpec) -> GPUSpec:
    """``spec`` with the active constants' ``GPU_SPECS[*].field`` overrides (topologies.constants)."""
    if active().is_default:
        return spec
    changes = {f: table_field("topologies.specs.GPU_SPECS", key, f, getattr(spec, f)) for f in _SPEC_FIELDS}
    changes = {f: v for f, v in changes.items() if v is not getattr(spec, f)}
    return dataclasses.replace(spec, **changes) if changes else spec


@dataclass(frozen=True, slots=True)
class NICSpec:
    """A scale-out NIC port; bandwidth per direction in bytes/s."""

    name: str
    bandwidth_bytes_per_s: float
    source: str


NIC_SPECS: dict[str, NICSpec] = {n.name: n for n in (
    NICSpec("hdr", 200e9 / 8, "InfiniBand HDR 200 Gb/s (ConnectX-6), DGX A100: 8 per node; hardware.csv"),
    NICSpec("ndr", 400e9 / 8, "InfiniBand NDR 400 Gb/s (ConnectX-7), DGX H100: 8 per node; hardware.csv"),
    NICSpec("xdr", 800e9 / 8, "InfiniBand XDR 800 Gb/s (ConnectX-8), DGX B300; hardware.csv"),
)}


def get_nic_spec(name: str, field: str = "cluster.nic") -> NICSpec:
    try:
        return active_value("topologies.specs.NIC_SPECS", NIC_SPECS)[str(name).lower()]
    except KeyError:
        raise ConfigError(field, name, f"unknown NIC; known: {', '.join(NIC_SPECS)}") from None


PCIE_BANDWIDTH = {
    # One direction of an x16 link: Gen4 16 GT/s * 16 lanes * 128/130 = 31.5 GB/s,
    # Gen5 twice that (PCI-SIG base specifications).  A100 hosts are Gen4; H100/B200 Gen5.
    "ampere": 31.5e9,
    "hopper": 63.0e9,
    "blackwell": 63.0e9,
}

LINK_LATENCY_S = {
    # Physical per-link latency added to a collective step's software latency.  NCCL's
    # per-step hwLat (tuning.cc) already includes NVLink and PCIe traversal, so those are
    # zero; an InfiniBand switch hop is about 0.1-0.2 us (NVIDIA Quantum-2 QM9700
    # product brief: port-to-port latency on the order of 100+ ns); the cross-rack tier
    # default of 2 us is an assumption for long links and an extra switch layer.
    Tier.NVLINK: 0.0,
    Tier.PCIE: 0.0,
    Tier.IB: 0.15e-6,
    Tier.XRACK: 2.0e-6,
}
