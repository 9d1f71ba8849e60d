"""Per-SKU GPU figures: the datasheet rates agree with each SKU's SMs, clock and power limit."""

from __future__ import annotations

import pytest

from topologies.specs import GPU_SPECS
from workloads.costs.compute import num_sms

#: dense BF16 tensor FLOPs per SM per clock: A100 1,024 FMA, Hopper twice that, Blackwell
#: twice Hopper's (NVIDIA architecture whitepapers).
_PER_SM_CLOCK = {"ampere": 2048, "hopper": 4096, "blackwell": 8192}


@pytest.mark.parametrize("name, clock_mhz", [("A100-SXM4-80GB", 1410), ("H100-SXM", 1830), ("H200-SXM", 1830),
                                             ("B200", 1856), ("GB200", 2062), ("B300", 1717), ("GB300", 1907)])
def test_dense_bf16_peak_is_sms_x_clock_x_rate(name, clock_mhz):
    """The datasheet's dense BF16 rate divided by SMs x per-SM rate gives the boost clock the
    datasheet assumes: 1410 MHz (A100), 1830 (H100/H200), and for Blackwell ~1.86 GHz on B200,
    ~2.06 on GB200 (the same die at 1,200 W instead of 1,000 W), ~1.72 on B300 and ~1.91 on
    GB300 (160 SMs at the same rate as B200's 148)."""
    g = GPU_SPECS[name]
    implied = g.peak_flops["bf16"] / (num_sms(g) * _PER_SM_CLOCK[g.generation]) / 1e6
    assert implied == pytest.approx(clock_mhz, rel=2e-3)


def test_blackwell_skus_differ_where_their_datasheets_do():
    b200, gb200, b300, gb300 = (GPU_SPECS[n] for n in ("B200", "GB200", "B300", "GB300"))
    assert (b200.power_w, gb200.power_w, b300.power_w, gb300.power_w) == (1000, 1200, 1100, 1400)
    assert num_sms(b200) == num_sms(gb200) == 148 and num_sms(b300) == num_sms(gb300) == 160
    # Blackwell Ultra: dense FP4 about 1.5x Blackwell's, BF16 and FP8 unchanged
    assert gb300.peak_flops["fp4"] / gb200.peak_flops["fp4"] == pytest.approx(1.5)
    assert b300.peak_flops["fp4"] / b200.peak_flops["fp4"] == pytest.approx(105 / 72)
    for a, b in ((b200, b300), (gb200, gb300)):
        assert a.peak_flops["bf16"] == b.peak_flops["bf16"] and a.peak_flops["fp8"] == b.peak_flops["fp8"]
    assert all(g.hbm_bandwidth_bytes_per_s == 8.0e12 for g in (b200, gb200, b300, gb300))
    assert all(g.power_w > 0 for g in GPU_SPECS.values())
