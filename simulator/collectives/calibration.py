"""Collective-model constants, one set per hardware generation, each with its source.

A :class:`Calibration` says how far real NCCL falls short of the wires:

* ``tier_efficiency`` derates link capacities per tier (protocol headers, PCIe and NIC
  efficiency, kernel pipelining): the network runs on ``capacity x efficiency``;
* ``nvls_efficiency`` is the extra factor of NVLink-SHARP reductions over plain NVLink
  traffic (NCCL >= 2.28 itself uses 0.85 on Hopper and 0.74 on Blackwell,
  ``nvlsEfficiency`` in tuning.cc);
* ``ring_size_factor`` scales the bus bandwidth of rings on part of a node (measured
  2- and 4-GPU plateaus relative to 8);
* NCCL's latency tables and protocol factors (:mod:`.nccl`) apply unless ``ideal``, scaled
  per tier, plus ``call_latency_us`` per call where the platform's measurements show a
  fixed cost NCCL's tables lack.

``IDEAL`` turns every factor off and charges a fixed latency per pipeline step: with it
the flow model must reproduce the textbook alpha-beta formulas exactly (tests).

How the numbers were fitted: ``experiments/calibrate_nccl.py`` prints the fits and the
error tables; the A100 constants use only the 1-4 host rows (2-32 GPUs) of
``experiments/reference/nccl-tests-azure-a100/all_reduce.csv``; the 8-16 host rows are the
held-out check (tests/simulator/test_nccl_validation.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from topologies import ConfigError

__all__ = ["Calibration", "CALIBRATIONS", "IDEAL", "get_calibration"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    name: str
    tier_efficiency: dict[str, float] = field(default_factory=lambda: {"nvlink": 1.0, "pcie": 1.0, "ib": 1.0,
                                                                       "xrack": 1.0})
    """Achieved fraction of each tier's link capacity (bus bandwidth / wire rate)."""
    nvls_efficiency: float = 1.0
    """NVLS reduction rate relative to derated NVLink (see module docstring)."""
    ideal: bool = False
    """No NCCL factors: fixed ``step_latency_s`` per step, all factors 1, no plateau."""
    step_latency_s: float = 0.0
    """Latency per pipeline step when ``ideal``."""
    intra_latency_scale: float = 1.0
    """Multiplies NCCL's base and intra-node latencies (platform and NCCL version differ)."""
    inter_latency_scale: float = 1.0
    """Multiplies NCCL's network latencies."""
    ring_plateau: bool = True
    """Apply NCCL's 1.4x latency factor to large multi-node ring all-reduces ("plateau
    effect of ring", tuning.cc); off where large-message measurements show no such term."""
    link_latency: bool = True
    """Add the physical latency of inter-node routes (NCCL's graph.latencyInter)."""
    call_latency_us: float = 0.0
    """A fixed cost per call on top of NCCL's latency model (microseconds): kernel launch and
    per-call setup of the measured platform, which NCCL's tables do not hold."""
    ring_size_factor: dict[int, float] = field(default_factory=dict)
    """Bus bandwidth of a ring inside one node of ``n`` GPUs relative to the full node's
    (``{n: factor}``, measured plateaus, the full node listed with 1.0); linear between the
    listed sizes, the end factors beyond them, 1.0 where empty."""

    def ring_factor(self, n_ranks: int) -> float:
        """:attr:`ring_size_factor` at ``n_ranks``."""
        if not self.ring_size_factor:
            return 1.0
        sizes, factors = zip(*sorted(self.ring_size_factor.items()))
        return float(np.interp(n_ranks, sizes, factors))
    source: str = ""


_AZ = "experiments/reference/nccl-tests-azure-a100/all_reduce.csv"
_MB = "experiments/reference/nccl_microbenchmarks.csv"
_XGMI = "experiments/reference/rccl_mi300x.csv"

CALIBRATIONS: dict[str, Calibration] = {
    # A100, fitted on the 1-4 host rows (2-32 GPUs) of _AZ only; 64 and 128 GPUs are held out
    # (experiments/calibrate_nccl.py).  Tier efficiencies from the >= 1 GiB plateaus: 8 GPUs
    # reach 230.9 GB/s bus bandwidth of 300 GB/s NVLink (0.770); 2 hosts (ring over 8 HDR
    # rails of 25 GB/s) 127.4 of 200 (0.637).  Rings on part of a node are slower per GPU:
    # 2 GPUs 206.4 GB/s and 4 GPUs 224.5 at 1 GiB, 0.894 and 0.973 of the 8-GPU plateau (the
    # ring-size factors; vTrain's measured A100 all-reduce tables show the same fall-off).
    # Latency: least squares of log error over the 1 MiB - 4 GiB rows on a grid: NCCL's base
    # and intra-node latencies x 0.5, network x 1.0, plus 50 us per call -- these rows come
    # from an older NCCL on virtual machines, where a call costs ~55-70 us however small and
    # however few GPUs (1 MiB: 59.5 us on 2 GPUs, 72.5 on 8), which NCCL's per-step tables
    # alone cannot give.  NCCL's ring "plateau" factor is off: the 16-GPU rows above 256 MiB
    # show no extra latency.
    "ampere": Calibration(name="ampere", tier_efficiency={"nvlink": 0.770, "pcie": 1.0, "ib": 0.637, "xrack": 0.637},
                          intra_latency_scale=0.5, inter_latency_scale=1.0, call_latency_us=50.0,
                          ring_size_factor={2: 206.37 / 230.86, 4: 224.52 / 230.86, 8: 1.0}, ring_plateau=False,
                          source=f"{_AZ} (2-32 GPU rows)"),
    # Hopper: H200 8-GPU ring all-reduce 367.2 GB/s bus bandwidth of 450 (0.816) and
    # NVLS 480.0 GB/s at 16 GiB (_MB, stas00/ml-engineering, NCCL 2.27.7).  NVLS moves
    # S(1 + 1/n) per GPU each way against ring's 2(n-1)/n S, so its rate over the derated
    # NVLink is 480/367.2 x 1.125/1.75 = 0.840 (NCCL 2.28 uses 0.85 for Hopper).
    # Scale-out: 4 x P5en (H200, EFA) ring all-reduce 364.9 GB/s bus bandwidth of 8 x 50 GB/s
    # = 0.912 (_MB).  NCCL's latency tables as they are.
    "hopper": Calibration(name="hopper", tier_efficiency={"nvlink": 0.816, "pcie": 1.0, "ib": 0.912, "xrack": 0.912},
                          nvls_efficiency=0.840, source=f"{_MB} (H200 NVLS/ring 16 GiB rows, P5en 4-node row)"),
    # Blackwell, from the AWS P6-B200 rows of _MB (8 x B200 per node, NVLink 5 at 900 GB/s,
    # 8 x 400G EFA v4; NCCL 2.27.7, stas00/ml-engineering): ring on 8 GPUs with
    # NCCL_NVLS_ENABLE=0, 682.2 GB/s bus bandwidth of 900 at 8 GiB (0.758); NVLS 838.0 GB/s
    # at 8 GiB, so 838.0/682.2 x 1.125/1.75 = 0.790 over the derated NVLink (NCCL 2.28's
    # nvlsEfficiency is 0.74); 4 hosts (32 GPUs) 381.8 GB/s of 8 x 50 GB/s at 16 GiB (0.955).
    # Those rows were timed through torch.distributed: below ~256 MiB their times carry the
    # per-call host cost, so only the >= 8 GiB plateaus are used.  NCCL's latency tables as
    # they are.
    "blackwell": Calibration(name="blackwell",
                             tier_efficiency={"nvlink": 0.758, "pcie": 1.0, "ib": 0.955, "xrack": 0.955},
                             nvls_efficiency=0.790,
                             source=f"{_MB} (P6-B200 ring/NVLS 8 GiB rows, 4-node 16 GiB row)"),
    # AMD Instinct, RCCL over the xGMI full mesh (GPUSpec.calibration).  Link efficiency from
    # AMD's own measurement, not fitted: "rated up to 64 GB/s for each point-to-point link ...
    # reduce the usable bandwidth to approximately 48 GB/s per link" (0.75; AMD ROCm blog
    # "Understanding RCCL Bandwidth and xGMI Performance on AMD Instinct MI300X", 2025-03-02,
    # https://rocm.blogs.amd.com/software-tools-optimization/mi300x-rccl-xgmi/README.html);
    # RCCL's topology model takes the same 48 GB/s per gfx94x xGMI link
    # (GFX94X_XGMI_WIDTH, ROCm/rccl@0cbce2a7 src/graph/topo.h).
    # The published 8-GPU all-reduce in _XGMI is the held-out check (tests/simulator/
    # test_mesh_collectives.py).  Scale-out and NCCL's latency tables: Hopper's, as RCCL keeps
    # NCCL's tuning model (an assumption; no multi-node MI300X plateau is used).
    "cdna3": Calibration(name="cdna3", tier_efficiency={"nvlink": 0.75, "pcie": 1.0, "ib": 0.912, "xrack": 0.912},
                         source="AMD ROCm blog mi300x-rccl-xgmi (48 of 64 GB/s per xGMI link); scale-out as hopper"),
    # MI355X: no published xGMI efficiency; the MI300X's 0.75 is assumed.
    "cdna4": Calibration(name="cdna4", tier_efficiency={"nvlink": 0.75, "pcie": 1.0, "ib": 0.955, "xrack": 0.955},
                         source="xGMI efficiency as cdna3 (assumed); scale-out as blackwell"),
}

IDEAL = Calibration(name="ideal", ideal=True, step_latency_s=0.0, link_latency=False,
                    source="textbook alpha-beta: no efficiencies, fixed latency per step")


def get_calibration(name_or_cal: "str | Calibration", calibrations: dict | None = None) -> Calibration:
    """A calibration, or one by name from ``calibrations`` (default :data:`CALIBRATIONS`; the
    collective engine passes its run's, :mod:`topologies.constants`) or ``ideal``."""
    if isinstance(name_or_cal, Calibration):
        return name_or_cal
    if name_or_cal == "ideal":
        return IDEAL
    table = CALIBRATIONS if calibrations is None else calibrations
    try:
        return table[name_or_cal]
    except KeyError:
        raise ConfigError("calibration", name_or_cal,
                          f"unknown calibration; known: ideal, {', '.join(table)}") from None
