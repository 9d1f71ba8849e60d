"""Measured kernel tables: published single-kernel benchmarks the compute model reads instead of
its roofline where a table covers the op.

A table is ``(kernel kind, kernel, GPU, dtype, fixed shape axes, phase) -> achieved TFLOP/s``
over one swept axis (attention: the sequence length), each point with its source.  The raw
values live under ``experiments/reference/kernels/`` (CSV and a README saying where each came
from and how it was read).  Inside a table's range the achieved rate is interpolated linearly
in ``log2`` of the swept axis (a table point is reproduced exactly); outside it, or for a shape
no table holds, the caller falls back to its model (:class:`~workloads.costs.compute.RooflineComputeModel`
records which one timed each op: ``measured`` or ``model``).

Attention (:class:`AttentionTables`, ``cudnn_sdpa.csv``): keyed by the mask (``causal`` or
``full``), the sliding window (none or its width), ``d_qk`` and ``d_v`` -- exact matches only --
and swept over the sequence length of self-attention (``q_len == kv_len``; a context-parallel
share, whose queries see more keys than they are, is left to the model).  The benchmarks ran
batch x heads of 128-256 head-sequences; the rate is taken to hold for the op's own batch and
heads (each head-sequence of 2k+ tokens already spans 16+ query tiles): an assumption.  Several
measurements of one key (different cuDNN releases) keep the newest release's.

FLOPs are counted as the benchmark counts them (NVIDIA/cudnn-frontend
``benchmark/sdpa_benchmark_training/benchmark_single_sdpa.py`` ``flops``): ``2 x batch x heads
x unmasked x (d_qk + d_v)`` forward and ``(3 d_qk + 2 d_v)`` backward, unmasked = ``S (S + 1) /
2`` under the causal mask, ``W (W + 1) / 2 + (S - W) W`` with a window ``W``, ``S^2`` without a
mask -- so the op's time is the table's FLOPs over the table's rate, whatever FLOP count the
rest of the simulator uses.
"""

from __future__ import annotations

import csv
import functools
import math
from dataclasses import dataclass
from pathlib import Path

from topologies import ConfigError

__all__ = ["KERNEL_TABLE_DIR", "ATTENTION_TABLE_FILE", "ATTENTION_TABLE_GPUS", "KernelTable", "AttentionTables",
           "attention_table_flops", "default_attention_tables"]

KERNEL_TABLE_DIR = Path(__file__).resolve().parents[2] / "experiments" / "reference" / "kernels"
"""Where the measured tables are committed (``experiments/reference/kernels/``)."""

ATTENTION_TABLE_FILE = "cudnn_sdpa.csv"
"""NVIDIA/cudnn-frontend's SDPA training benchmarks (see that folder's README)."""

ATTENTION_TABLE_GPUS: dict[str, tuple[tuple[str, str], ...]] = {
    # simulated GPU (GPUSpec.name) -> the tables' GPUs to use, in order of preference, each with
    # its rule: "same" (measured on this GPU) or a substitution rule.
    # B200: its own measurements (cuDNN 9.13.1, head dim 128) first; other shapes from GB200's
    # (cuDNN 9.22) scaled by the dense-peak ratio of the dtype (B200 2,250 / GB200 2,500 TFLOP/s
    # BF16, topologies/specs.py: the same Blackwell die at a lower power limit and clock).
    "B200": (("B200", "same"), ("GB200", "peak_ratio")),
    "GB200": (("GB200", "same"),),
    "GB300": (("GB300", "same"),),
    # B300 (HGX Blackwell Ultra) from GB300's measurements by the dense-peak ratio (equal peaks
    # for BF16 and FP8 in topologies/specs.py): a substitution, labelled as such.
    "B300": (("GB300", "peak_ratio"),),
    "H200-SXM": (("H200", "same"),),
    # H100 SXM from the H200 measurements: the same GH100 die, SM count, clocks and 700 W limit;
    # attention at 2k+ tokens is compute-bound, so H200's larger HBM does not enter (hardware.csv
    # takes H200's MAMF as H100's likewise).  A substitution, labelled as such.
    "H100-SXM": (("H200", "same_die"),),
}
"""Which measured GPU stands for each simulated GPU (none listed: no measured attention)."""


@dataclass(frozen=True)
class KernelTable:
    """One measured curve: ``ys`` (TFLOP/s) at ``xs`` (the swept axis, ascending)."""

    kind: str
    kernel: str
    gpu: str
    dtype: str
    key: tuple
    phase: str
    xs: tuple
    ys: tuple
    sources: tuple
    """One source per point (file@commit)."""

    def __post_init__(self):
        if len(self.xs) != len(self.ys) or not self.xs:
            raise ConfigError("kernel table", self.describe(), "needs as many rates as points, at least one")
        if any(b <= a for a, b in zip(self.xs, self.xs[1:])):
            raise ConfigError("kernel table", self.describe(), "points must be strictly ascending")
        if any(not (y > 0 and math.isfinite(y)) for y in self.ys):
            raise ConfigError("kernel table", self.describe(), "rates must be positive and finite")

    def describe(self) -> str:
        return f"{self.kind}/{self.kernel} {self.gpu} {self.dtype} {self.key} {self.phase}"

    def covers(self, x: float) -> bool:
        """Whether ``x`` lies inside the measured range (ends included)."""
        return self.xs[0] <= x <= self.xs[-1]

    def rate_at(self, x: float) -> float | None:
        """TFLOP/s at ``x``: a table point exactly, linear in ``log2 x`` between points, None
        outside the range."""
        if not self.covers(x):
            return None
        for (x0, y0), (x1, y1) in zip(zip(self.xs, self.ys), zip(self.xs[1:], self.ys[1:])):
            if x == x0:
                return y0
            if x0 < x < x1:
                t = (math.log2(x) - math.log2(x0)) / (math.log2(x1) - math.log2(x0))
                return y0 + (y1 - y0) * t
        return self.ys[-1]


def _unmasked(s: int, mask: str, window: int | None) -> float:
    if mask == "full":
        return float(s) * s
    if window and s > window:
        return window * (window + 1) / 2 + (s - window) * float(window)
    return s * (s + 1) / 2


def attention_table_flops(shape, phase: str) -> float:
    """FLOPs of attention ``shape`` (:class:`~workloads.blocks.kernels.AttentionShape`) in the
    tables' count, forward (``F``) or backward (``B``); see the module docstring."""
    per = (shape.d_qk + shape.d_v) if phase == "F" else (3 * shape.d_qk + 2 * shape.d_v)
    return 2.0 * shape.batch * shape.heads * _unmasked(shape.q_len, shape.mask, shape.window) * per


def _cudnn_rank(v: str) -> int:
    """A cuDNN version as one integer (``9.13.1`` -> 91301, ``92200`` -> 92200)."""
    if "." in v:
        major, minor, patch = (int(p) for p in (v.split(".") + ["0", "0"])[:3])
        return major * 10000 + minor * 100 + patch
    return int(float(v))


class AttentionTables:
    """Measured fused-attention curves (``cudnn_sdpa.csv``), by kernel, GPU, dtype, mask, window,
    head dims and phase, over the sequence length."""

    def __init__(self, tables: dict):
        self.tables = tables

    @classmethod
    def from_csv(cls, path: str | Path) -> AttentionTables:
        path = Path(path)
        if not path.is_file():
            raise ConfigError("kernel table", str(path), "file not found")
        points: dict[tuple, dict[int, tuple]] = {}
        with path.open(newline="") as f:
            for line, r in enumerate(csv.DictReader(f), start=2):
                try:
                    window = int(r["window"]) if r["window"] else None
                    key = (r["kernel"], r["gpu"], r["dtype"], (r["mask"], window, int(r["d_qk"]), int(r["d_v"])),
                           r["phase"])
                    seq, rate, rank = int(r["seq_len"]), float(r["tflops"]), _cudnn_rank(r["cudnn"])
                except (KeyError, ValueError) as e:
                    raise ConfigError(f"kernel table {path.name} line {line}", str(r), f"bad row: {e}") from None
                old = points.setdefault(key, {}).get(seq)
                if old is None or rank > old[0]:
                    points[key][seq] = (rank, rate, r["source"])
        tables = {}
        for key, pts in points.items():
            newest = max(p[0] for p in pts.values())     # one release per curve
            xs = sorted(s for s, p in pts.items() if p[0] == newest)
            kernel, gpu, dtype, shape_key, phase = key
            tables[key] = KernelTable("attention", kernel, gpu, dtype, shape_key, phase, tuple(xs),
                                      tuple(pts[s][1] for s in xs), tuple(pts[s][2] for s in xs))
        return cls(tables)

    def table(self, kernel: str, gpu: str, dtype: str, shape, phase: str) -> KernelTable | None:
        """The curve for ``shape`` (an AttentionShape) measured on table GPU ``gpu``, or None."""
        window = shape.window if shape.mask == "window" else None
        mask = "full" if shape.mask == "full" else "causal"
        return self.tables.get((kernel, gpu, dtype, (mask, window, int(shape.d_qk), int(shape.d_v)), phase))

    def lookup(self, kernel: str, gpu, dtype: str, shape, phase: str, gpu_specs=None) -> tuple[float, str] | None:
        """``(seconds at the benchmark's clock, provenance)`` of attention ``shape`` on ``gpu``
        (a GPUSpec), or None where no table covers it (another GPU's curves by
        :data:`ATTENTION_TABLE_GPUS`; ``gpu_specs``: table GPU name -> GPUSpec, for the
        ``peak_ratio`` rule)."""
        if shape is None or shape.q_len != shape.kv_len or shape.q_len <= 0:
            return None
        for table_gpu, rule in ATTENTION_TABLE_GPUS.get(gpu.name, ()):
            t = self.table(kernel, table_gpu, dtype, shape, phase)
            rate = t.rate_at(shape.q_len) if t is not None else None
            if rate is None:
                continue
            scale, how = 1.0, f"{kernel} on {table_gpu}"
            if rule == "peak_ratio":
                other = (gpu_specs or {}).get(table_gpu)
                if other is None or dtype not in other.peak_flops or dtype not in gpu.peak_flops:
                    continue
                scale = gpu.peak_flops[dtype] / other.peak_flops[dtype]
                how += f" x dense-peak ratio {scale:.3f}"
            elif rule == "same_die":
                how += f" (same die as {gpu.name})"
            return attention_table_flops(shape, phase) / (rate * scale * 1e12), how
        return None


@functools.lru_cache(maxsize=4)
def default_attention_tables(path: str | None = None) -> AttentionTables | None:
    """The committed attention tables (None when the file is absent, e.g. an installed
    package without ``experiments/``: every op then falls back to the model)."""
    p = Path(path) if path else KERNEL_TABLE_DIR / ATTENTION_TABLE_FILE
    if not p.is_file():
        return None
    return AttentionTables.from_csv(p)
