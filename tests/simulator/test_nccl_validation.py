"""The NCCL model against measurements it was not fitted on.

A100: constants were fitted on the 1-4 host rows (2-32 GPUs) of the Azure ND A100 v4
nccl-tests logs; the 8-16 host rows (64 and 128 GPUs) are held out.  Bounds fixed by the
foundation issue: within 15 % for messages >= 64 MiB and 30 % for 1-64 MiB.  vTrain's
measured in-node tables (2-8 A100, another cluster) are held out too.
"""

import csv
from pathlib import Path

import pytest
import simpy

from simulator.collectives import CollectiveEngine
from topologies import build_cluster, parse_size

REF = Path(__file__).resolve().parents[2] / "experiments" / "reference"


def load(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def sim_all_reduce(cluster, n, size, algo=None, proto=None):
    env = simpy.Environment()
    eng = CollectiveEngine(env, cluster)
    g = eng.register_group(range(n))
    eng.issue(g, 0, "all_reduce", size, count=n, algo=algo, proto=proto)
    env.run()
    return eng.records[-1].end_s


def test_a100_all_reduce_on_8_to_16_hosts_within_fixed_bounds():
    rows = load(REF / "nccl-tests-azure-a100" / "all_reduce.csv")
    cluster = build_cluster("azure-ndv4-a100")
    checked = 0
    for r in rows:
        n, size = int(r["num_gpus"]), int(r["size_bytes"])
        if n < 64 or size < 2**20:
            continue
        err = abs(sim_all_reduce(cluster, n, size) / (float(r["time_us"]) * 1e-6) - 1)
        bound = 0.15 if size >= 64 * 2**20 else 0.30
        assert err <= bound, f"{n} GPUs, {size} B: error {err:.1%} > {bound:.0%}"
        checked += 1
    assert checked == 26


def test_a100_rings_on_part_of_a_node_and_small_calls():
    """2 and 4 GPUs of one node: slower per GPU than 8 on large messages (ring-size factor),
    and a fixed cost per call on small ones (a 1 MiB all-reduce takes 59.5 us on 2 GPUs and
    72.5 on 8: far more than NCCL's per-step latencies)."""
    rows = {(int(r["num_gpus"]), int(r["size_bytes"])): float(r["time_us"]) * 1e-6
            for r in load(REF / "nccl-tests-azure-a100" / "all_reduce.csv")}
    cluster = build_cluster("azure-ndv4-a100")
    for n in (2, 4, 8):
        for size in (64 * 2**20, 2**30):
            assert sim_all_reduce(cluster, n, size) == pytest.approx(rows[(n, size)], rel=0.07), (n, size)
        assert sim_all_reduce(cluster, n, 2**20) == pytest.approx(rows[(n, 2**20)], rel=0.10), n
    # the per-GPU fall-off itself: 2 GPUs move less than 8 per second of bus time
    bus = {n: 2 * (n - 1) / n * 2**30 / sim_all_reduce(cluster, n, 2**30) for n in (2, 4, 8)}
    assert bus[2] / bus[8] == pytest.approx(206.37 / 230.86, rel=0.02)
    assert bus[4] / bus[8] == pytest.approx(224.52 / 230.86, rel=0.02)


def test_a100_in_node_all_reduce_against_vtrains_measured_tables():
    """Held out: vTrain's all-reduce tables, measured on 2-8 A100 of one host (another
    cluster and NCCL than the Azure rows the constants came from).  From 16 MiB every size
    and GPU count is within 13 % (median 3.8 %); below, the fitted 50 us per call (Azure's
    virtual machines) makes the model up to 40 % slow on 2-4 GPUs at 1-4 MiB."""
    cluster = build_cluster("a100-4nic")
    big, small = [], []
    for r in load(REF / "vtrain" / "all_reduce_a100.csv"):
        n, size = int(r["num_gpus"]), int(r["size_bytes"])
        measured = (float(r["time_us"]) + float(r["time_us_2"])) / 2 * 1e-6
        err = sim_all_reduce(cluster, n, size) / measured - 1
        (big if size >= 16 * 2**20 else small).append(err)
    assert len(big) == 49 and len(small) == 28
    assert max(map(abs, big)) <= 0.13 and sorted(map(abs, big))[len(big) // 2] <= 0.05
    assert -0.16 <= min(small) and max(small) <= 0.41


def test_h200_nvls_to_ring_bus_bandwidth_ratio_within_10_percent():
    rows = load(REF / "nccl_microbenchmarks.csv")
    nvls = next(float(r["busbw_GBps"]) for r in rows if r["algorithm"].startswith("NVLS (NCCL_NVLS_ENABLE=1)"))
    ring = next(float(r["busbw_GBps"]) for r in rows if r["algorithm"].startswith("Ring (NCCL_NVLS_ENABLE=0)"))
    c = build_cluster("dgx-h200")
    size = 16 * 2**30
    ratio = sim_all_reduce(c, 8, size, "ring", "Simple") / sim_all_reduce(c, 8, size, "nvls", "Simple")
    assert ratio == pytest.approx(nvls / ring, rel=0.10)
    # and NCCL's own choice for a large all-reduce on one H200 node is NVLS
    env = simpy.Environment()
    eng = CollectiveEngine(env, c)
    assert eng.choose(tuple(range(8)), "all_reduce", size)[0] == "nvls"


def test_h200_partial_node_nvls_scaling():
    """NVLS bus bandwidth on 5-7 of 8 GPUs relative to 8 (rows of nccl_microbenchmarks.csv)."""
    rows = [r for r in load(REF / "nccl_microbenchmarks.csv") if r["system"] == "H200 node, partial GPU count"
            and r["algorithm"] == "NVLS"]
    meas = {int(r["gpus"]): float(r["busbw_GBps"]) for r in rows}
    c = build_cluster("dgx-h200")
    size = 8 * 2**30
    sim = {n: size / sim_all_reduce(c, n, size, "nvls", "Simple") * 2 * (n - 1) / n for n in meas}
    for n in meas:
        assert sim[n] / sim[8] == pytest.approx(meas[n] / meas[8], rel=0.05)


def test_b200_plateaus_and_partial_node_rows():
    """Blackwell constants come from the P6-B200 plateaus (8-GPU ring with NVLS off and NVLS
    at 8 GiB, 4 hosts at 16 GiB); the partial-node rows (ring on 4-5 GPUs, NVLS on 6-7)
    are held out."""
    rows = load(REF / "nccl_microbenchmarks.csv")
    full = {(int(r["gpus"]), r["payload"]): float(r["busbw_GBps"]) for r in rows
            if r["system"].startswith("AWS P6-B200 (8x B200")}
    part = {int(r["gpus"]): (r["algorithm"], float(r["busbw_GBps"])) for r in rows
            if r["system"].startswith("B200 node (AWS p6-b200.48xlarge), partial GPU count")}

    def busbw(cluster, n, size, algo=None, proto=None):
        return size * 2 * (n - 1) / n / sim_all_reduce(cluster, n, size, algo, proto) / 1e9

    one = build_cluster("dgx-b200")
    assert busbw(one, 8, 16 * 2**30) == pytest.approx(full[(8, "16GiB")], rel=0.03)      # NCCL's choice: NVLS
    assert busbw(build_cluster("dgx-b200", num_nodes=4), 32, 16 * 2**30) == pytest.approx(full[(32, "16GiB")],
                                                                                           rel=0.02)
    no_nvls = build_cluster("dgx-b200", nvls=False)
    for n, (algo, measured) in part.items():
        size = parse_size("8GiB")
        if algo == "Ring":
            assert busbw(no_nvls, n, size) == pytest.approx(measured, rel=0.05), n
        else:
            assert busbw(one, n, size, "nvls", "Simple") / busbw(one, 8, size, "nvls", "Simple") == \
                pytest.approx(measured / part[8][1], rel=0.05), n


def test_ring_size_factor_interpolates_between_measured_sizes():
    from simulator.collectives import CALIBRATIONS
    a100 = CALIBRATIONS["ampere"]
    f2, f4 = a100.ring_factor(2), a100.ring_factor(4)
    assert f2 < a100.ring_factor(3) < f4 < a100.ring_factor(6) < a100.ring_factor(8) == 1.0
    assert a100.ring_factor(3) == pytest.approx((f2 + f4) / 2)
    assert a100.ring_factor(16) == 1.0
    assert CALIBRATIONS["hopper"].ring_factor(2) == 1.0          # none measured: no factor


def test_h800_nvlink_ring_matches_deepseek_v3s_160_gb_per_s():
    """H800 (NVLink cut to 200 GB/s per direction) with Hopper's calibrated NVLink
    efficiency: an 8-GPU ring reaches the ~160 GB/s the DeepSeek-V3 report quotes for its
    NVLink (Sec 3.2.2; hardware.csv H800 row)."""
    cluster = build_cluster({"preset": "hgx-h800", "nvls": False})
    t = sim_all_reduce(cluster, 8, 2**30)
    assert 2 * 7 / 8 * 2**30 / t / 1e9 == pytest.approx(160, rel=0.05)
