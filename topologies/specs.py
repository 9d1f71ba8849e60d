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
           "PCIE_BANDWIDTH", "LINK_LATENCY_S", "SCALEUP_TOPOLOGIES", "GENERATIONS", "gpu_from_mapping"]

SCALEUP_TOPOLOGIES = ("switch", "mesh")
GENERATIONS = ("ampere", "hopper", "blackwell")
"""Generations with calibrated constants (compute efficiencies, NCCL tables); any other GPU
borrows one of them (``GPUSpec.generation``)."""


class Tier(StrEnum):
    """Network tier of a link."""

    NVLINK = "nvlink"   #: GPU <-> NVSwitch, or GPU <-> GPU on a full mesh (scale-up domain)
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
    """'ampere', 'hopper' or 'blackwell': selects the calibrated constants (compute efficiencies,
    NCCL tables, PCIe).  AMD parts and GPUs given by their specs borrow one of them."""
    hbm_bytes: float
    """HBM capacity in bytes (the datasheet's GB read as GiB, see GiB above)."""
    hbm_bandwidth_bytes_per_s: float
    peak_flops: dict[str, float]
    """Dense peak FLOP/s per dtype ('tf32', 'bf16', 'fp16', 'fp8', 'fp4')."""
    mamf_flops: dict[str, float]
    """Measured maximum achievable matmul FLOP/s per dtype (empty when unmeasured)."""
    nvlink_bandwidth_bytes_per_s: float
    """Scale-up bandwidth, one direction: per GPU into the switch, or per link to each peer on a
    full mesh (``scaleup_topology``)."""
    nvlink_domain_size: int
    """GPUs in one scale-up domain in the reference system (8 for HGX and AMD platforms, 72 for NVL72)."""
    nvls: bool
    """NVLink SHARP (in-switch reduction) available: Hopper and later NVSwitch systems."""
    source: str
    notes: str = ""
    power_w: float = 0.0
    """Board power limit (TDP) in watts, the cap GPU Boost holds the clock under: it sets the
    sustained clock (``workloads.costs.compute.SUSTAINED_FRACTION``), so parts of one die at
    different limits differ (B200 1,000 W against GB200 1,200 W).  0: not given."""
    scaleup_topology: str = "switch"
    """How the scale-up domain is wired: ``switch`` (NVLink through NVSwitch: each GPU has one
    port of ``nvlink_bandwidth_bytes_per_s`` into a non-blocking switch) or ``mesh`` (AMD
    Infinity Fabric / xGMI: every pair of GPUs has its own link of ``nvlink_bandwidth_bytes_per_s``
    per direction, and no switch)."""
    sm_count: int = 0
    """Streaming multiprocessors (NVIDIA) or compute units (AMD) for GEMM wave quantisation;
    0: ``workloads.costs.compute.SM_COUNTS`` by name, else by generation."""
    calibration: str = ""
    """Key of the collective calibration (``simulator.collectives.calibration.CALIBRATIONS``)
    when it is not the generation's (AMD parts borrow a generation's compute constants but
    have their own xGMI efficiency)."""
    nic_bandwidth_bytes_per_s: float = 0.0
    """Default scale-out NIC per GPU, one direction (used when the cluster names none); 0: none."""
    vendor: str = "nvidia"


_HWCSV = "NVIDIA datasheets"
# Datasheet "80 GB" HBM is 80 GiB: nvidia-smi shows 81,559 MiB on an H100 SXM 80GB and
# 40,960 MiB on an A100 40GB, so capacities are taken as binary gigabytes.
GiB = 2**30
_STAS = "stas00/ml-engineering compute/accelerator/README.md and network/README.md"

_MI300X_MAMF_FRACTION = 668.4 / 1307.4
"""MI300X BF16 MAMF over its dense peak (51.1 %): what the AMD parts without a measured MAMF
(their FP8, MI325X, MI355X) are assumed to reach, in place of the NVIDIA generation's fallback."""

GPU_SPECS: dict[str, GPUSpec] = {s.name: s for s in (
    GPUSpec("A100-SXM4-40GB", "ampere", 40 * GiB, 1.555e12,
            {"tf32": 156e12, "bf16": 312e12, "fp16": 312e12}, {},
            300e9, 8, False, f"{_HWCSV} (NVIDIA A100 datasheet via glennklockwood.com; {_STAS})",
            "no MAMF measured for the 40GB part; FLOP/s identical to 80GB", power_w=400),
    GPUSpec("A100-SXM4-80GB", "ampere", 80 * GiB, 2.039e12,
            {"tf32": 156e12, "bf16": 312e12, "fp16": 312e12}, {"bf16": 271.2e12},
            300e9, 8, False, f"{_HWCSV} ({_STAS}; MAMF best shape 1024x10240x5120)", power_w=400),
    # A800 SXM4 80GB: the export SKU of the A100 80GB (same GA100 silicon, compute and HBM2e);
    # only NVLink is cut, 600 -> 400 GB/s both directions together = 200 GB/s per direction
    # (NVIDIA's statement of 2022-11-07, summarised at https://aiwiki.ai/wiki/nvidia_a800; peaks
    # and memory as the A100 80GB, https://hmc-tech.com/gpu/nvidia-a800-vs-nvidia-t40).
    GPUSpec("A800-SXM4-80GB", "ampere", 80 * GiB, 2.039e12,
            {"tf32": 156e12, "bf16": 312e12, "fp16": 312e12}, {"bf16": 271.2e12},
            200e9, 8, False, f"{_HWCSV} (A100 80GB figures; NVLink 400 GB/s bidirectional per NVIDIA's A800 "
            "statement, aiwiki.ai/wiki/nvidia_a800)",
            "MAMF: the A100 80GB's (same silicon and clocks)", power_w=400),
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
    # AMD Instinct, 8 per node on an Infinity Fabric (xGMI) full mesh: each GPU has 7 links,
    # one to each peer, no switch.  Peaks are dense (no sparsity).  Compute constants are
    # borrowed from the NVIDIA generation of the same period (see docs/modelling.md); the
    # collective calibration is their own (calibration "cdna3" / "cdna4").
    # MI300X: AMD Instinct MI300X data sheet
    # (https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/amd-instinct-mi300x-data-sheet.pdf):
    # 304 CUs, BF16/FP16 1,307.4 TFLOPS, FP8 2,614.9, TF32 653.7; 192 GB HBM3 at 5.3 TB/s;
    # 7 Infinity Fabric links of 128 GB/s (64 GB/s per direction; AMD ROCm blog "Understanding
    # RCCL Bandwidth and xGMI Performance on AMD Instinct MI300X", 2025-03-02: "rated up to
    # 64 GB/s for each point-to-point link", about 48 GB/s usable); 750 W.  MAMF BF16 668.4
    # TFLOPS (stas00 mamf-finder, torch 2.5.1 + ROCm 6.3, best shape 10240x15360x8192).
    GPUSpec("MI300X", "hopper", 192 * GiB, 5.3e12,
            {"tf32": 653.7e12, "bf16": 1307.4e12, "fp16": 1307.4e12, "fp8": 2614.9e12},
            {"tf32": 653.7e12 * _MI300X_MAMF_FRACTION, "bf16": 668.4e12, "fp16": 668.4e12,
             "fp8": 2614.9e12 * _MI300X_MAMF_FRACTION},
            64e9, 8, False, "AMD Instinct MI300X data sheet; xGMI per link: AMD ROCm blog mi300x-rccl-xgmi; "
            f"MAMF: {_STAS}", "no FP8 MAMF measured: the BF16 fraction (51.1 %) of the FP8 peak is assumed",
            power_w=750, scaleup_topology="mesh", sm_count=304, calibration="cdna3", nic_bandwidth_bytes_per_s=400e9 / 8,
            vendor="amd"),
    # MI325X: AMD Instinct MI325X data sheet
    # (https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/product-briefs/instinct-mi325x-datasheet.pdf):
    # the MI300X's CDNA 3 compute (304 CUs, same peaks) with 256 GB HBM3E at 6.0 TB/s, the same
    # 7 x 128 GB/s Infinity Fabric (896 GB/s), 1,000 W.  No MAMF published with mamf-finder: the
    # MI300X's measured fraction (51.1 % of the BF16 peak) is assumed.
    GPUSpec("MI325X", "hopper", 256 * GiB, 6.0e12,
            {"tf32": 653.7e12, "bf16": 1307.4e12, "fp16": 1307.4e12, "fp8": 2614.9e12},
            {"tf32": 653.7e12 * _MI300X_MAMF_FRACTION, "bf16": 668.4e12, "fp16": 668.4e12,
             "fp8": 2614.9e12 * _MI300X_MAMF_FRACTION},
            64e9, 8, False, "AMD Instinct MI325X data sheet", "MAMF: the MI300X's fraction of the peak (assumed)",
            power_w=1000, scaleup_topology="mesh", sm_count=304, calibration="cdna3", nic_bandwidth_bytes_per_s=400e9 / 8,
            vendor="amd"),
    # MI355X: AMD Instinct MI355X product page and data sheet
    # (https://www.amd.com/en/products/accelerators/instinct/mi350/mi355x.html): CDNA 4, 256 CUs
    # (8 XCDs x 32), BF16/FP16 2.5 PFLOPS dense (2,516.6 TFLOPS), FP8 5.0 PFLOPS (5,033.2),
    # MXFP4 10 PFLOPS (10,066.3); 288 GB HBM3E at 8 TB/s; 7 Infinity Fabric links, 1,075.2 GB/s
    # in all (153.6 GB/s per link, 76.8 per direction); 1,400 W (liquid-cooled; the MI350X is
    # the 1,000 W part).  No published MAMF: the MI300X's 51.1 % of the peak is assumed.
    GPUSpec("MI355X", "blackwell", 288 * GiB, 8.0e12,
            {"bf16": 2516.6e12, "fp16": 2516.6e12, "fp8": 5033.2e12, "fp4": 10066.3e12},
            {d: v * _MI300X_MAMF_FRACTION for d, v in (("bf16", 2516.6e12), ("fp16", 2516.6e12), ("fp8", 5033.2e12),
                                                      ("fp4", 10066.3e12))},
            76.8e9, 8, False, "AMD Instinct MI355X product page / data sheet",
            "MAMF: the MI300X's fraction of the peak (assumed); xGMI efficiency as MI300X's (assumed)",
            power_w=1400, scaleup_topology="mesh", sm_count=256, calibration="cdna4", nic_bandwidth_bytes_per_s=400e9 / 8,
            vendor="amd"),
)}

_GPU_ALIASES = {
    "a100": "A100-SXM4-80GB", "a100-40gb": "A100-SXM4-40GB", "a100-80gb": "A100-SXM4-80GB",
    "a100-sxm4-40gb": "A100-SXM4-40GB", "a100-sxm4-80gb": "A100-SXM4-80GB",
    "a800": "A800-SXM4-80GB", "a800-sxm4-80gb": "A800-SXM4-80GB", "a800-80gb": "A800-SXM4-80GB",
    "h100": "H100-SXM", "h100-sxm": "H100-SXM", "h100-sxm5-80gb": "H100-SXM", "h100-sxm-80gb": "H100-SXM",
    "h200": "H200-SXM", "h200-sxm": "H200-SXM", "h200-sxm-141gb": "H200-SXM",
    "h800": "H800-SXM", "h800-sxm": "H800-SXM", "h800-sxm5-80gb": "H800-SXM",
    "b200": "B200", "b300": "B300", "gb200": "GB200", "gb300": "GB300",
    "mi300x": "MI300X", "mi325x": "MI325X", "mi355x": "MI355X",
}


def get_gpu_spec(name: "str | dict | GPUSpec", field: str = "cluster.gpu") -> GPUSpec:
    """Look a GPU up by name or alias (case-insensitive), or build one from a mapping of its
    specs (:func:`gpu_from_mapping`)."""
    if isinstance(name, GPUSpec):
        return name
    if isinstance(name, dict):
        return gpu_from_mapping(name, field)
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


_GPU_KEYS = {
    "name": "a label for reports (default 'custom-gpu')",
    "peak_tflops": "dense peak TFLOP/s per dtype, e.g. {bf16: 989, fp8: 1979} (required, needs bf16)",
    "mamf_tflops": "measured maximum achievable matmul TFLOP/s per dtype (optional)",
    "hbm_gb": "HBM capacity in the datasheet's GB, read as GiB like the presets (required)",
    "hbm_bandwidth": "HBM bandwidth, e.g. '4.8 TB/s' (required)",
    "scaleup_bandwidth": "scale-up bandwidth per direction: per GPU into the switch, or per link for a mesh "
                         "(required)",
    "scaleup_topology": "'switch' (NVLink/NVSwitch, default) or 'mesh' (a link per GPU pair, e.g. xGMI)",
    "scaleup_domain": "GPUs per scale-up domain (default 8)",
    "nvls": "in-switch reduction (NVLink SHARP) available (default false; switch only)",
    "nic": "default NIC per GPU: a NIC name (hdr, ndr, xdr) or a bandwidth like '400 Gb/s'",
    "power_w": "board power limit in watts (optional)",
    "generation": "whose calibrated compute and NCCL constants it borrows: ampere, hopper or blackwell "
                  "(default hopper)",
    "sm_count": "SMs / compute units for GEMM wave quantisation (default: the generation's)",
}
_DTYPES = ("tf32", "bf16", "fp16", "fp8", "fp4")


def _positive(d: dict, key: str, where: str, integer: bool = False):
    v = d[key]
    ok = not isinstance(v, bool) and isinstance(v, int if integer else (int, float)) and v > 0
    if not ok:
        raise ConfigError(f"{where}.{key}", v, f"must be a positive {'integer' if integer else 'number'}")
    return v


def _tflops_table(d: dict, key: str, where: str) -> dict[str, float]:
    table = d[key]
    if not isinstance(table, dict) or not table:
        raise ConfigError(f"{where}.{key}", table, f"must be a mapping of dtype to TFLOP/s; dtypes: {', '.join(_DTYPES)}")
    out = {}
    for dtype in table:
        if dtype not in _DTYPES:
            raise ConfigError(f"{where}.{key}.{dtype}", table[dtype], f"unknown dtype; known: {', '.join(_DTYPES)}")
        out[dtype] = float(_positive(table, dtype, f"{where}.{key}")) * 1e12
    return out


def gpu_from_mapping(d: dict, where: str = "cluster.gpu") -> GPUSpec:
    """A :class:`GPUSpec` from a scenario's mapping of specs (keys in ``_GPU_KEYS``): how a user
    describes a GPU clustersim has no preset for.  Every value is checked; an unknown key, a
    missing required key or a bad value is a :class:`ConfigError` naming it.

    >>> g = gpu_from_mapping({"peak_tflops": {"bf16": 1000}, "hbm_gb": 96, "hbm_bandwidth": "4 TB/s",
    ...                       "scaleup_bandwidth": "64 GB/s", "scaleup_topology": "mesh"})
    >>> g.scaleup_topology, g.nvlink_bandwidth_bytes_per_s, g.generation
    ('mesh', 64000000000.0, 'hopper')
    """
    from .errors import check_keys
    from .units import parse_bandwidth

    check_keys(d, _GPU_KEYS, where)
    for key in ("peak_tflops", "hbm_gb", "hbm_bandwidth", "scaleup_bandwidth"):
        if key not in d:
            raise ConfigError(f"{where}.{key}", None, f"required: {_GPU_KEYS[key]}")
    peak = _tflops_table(d, "peak_tflops", where)
    if "bf16" not in peak:
        raise ConfigError(f"{where}.peak_tflops", d["peak_tflops"], "needs a bf16 entry (training runs in bf16)")
    mamf = _tflops_table(d, "mamf_tflops", where) if "mamf_tflops" in d else {}
    for dtype, v in mamf.items():
        if dtype not in peak or v > peak[dtype]:
            raise ConfigError(f"{where}.mamf_tflops.{dtype}", v / 1e12,
                              f"must not exceed its peak_tflops ({peak.get(dtype, 0) / 1e12:g})")
    gen = d.get("generation", "hopper")
    if gen not in GENERATIONS:
        raise ConfigError(f"{where}.generation", gen, f"must be one of {', '.join(GENERATIONS)}")
    topo = d.get("scaleup_topology", "switch")
    if topo not in SCALEUP_TOPOLOGIES:
        raise ConfigError(f"{where}.scaleup_topology", topo, f"must be one of {', '.join(SCALEUP_TOPOLOGIES)}")
    domain = _positive(d, "scaleup_domain", where, integer=True) if "scaleup_domain" in d else 8
    nvls = d.get("nvls", False)
    if not isinstance(nvls, bool):
        raise ConfigError(f"{where}.nvls", nvls, "must be true or false")
    if nvls and topo == "mesh":
        raise ConfigError(f"{where}.nvls", nvls, "in-switch reduction needs scaleup_topology: switch")
    nic = 0.0
    if "nic" in d:
        v = d["nic"]
        nic = (NIC_SPECS[v.lower()].bandwidth_bytes_per_s if isinstance(v, str) and v.lower() in NIC_SPECS
               else parse_bandwidth(v, f"{where}.nic"))
    name = d.get("name", "custom-gpu")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where}.name", name, "must be a non-empty string")
    return GPUSpec(
        name.strip(), gen, float(_positive(d, "hbm_gb", where)) * GiB,
        parse_bandwidth(d["hbm_bandwidth"], f"{where}.hbm_bandwidth"), peak, mamf,
        parse_bandwidth(d["scaleup_bandwidth"], f"{where}.scaleup_bandwidth"), domain, nvls,
        "user-given specs (scenario)", "custom GPU: unmeasured efficiencies borrowed from " + gen,
        power_w=float(_positive(d, "power_w", where)) if "power_w" in d else 0.0, scaleup_topology=topo,
        sm_count=_positive(d, "sm_count", where, integer=True) if "sm_count" in d else 0,
        nic_bandwidth_bytes_per_s=nic, vendor="custom")


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
