"""Symmetry folding is exact: a folded run gives the unfolded run's answer, op for op.

:func:`simulator.engine.run` simulates each rank cell of the equitable partition computed by
:mod:`simulator.engine.fold` once, on a quotient network; ``fold=False`` runs one actor per rank on
the physical links (the reference).  These tests compare the two on many small layouts:

* the step time (relative 1e-9);
* every op of every rank -- the folded timeline expanded with ``Result.rank_timeline()``
  against the unfolded timeline, matched by (rank, step, op) -- with its start and end time
  (absolute tolerance 1e-9 x the step time), bytes and FLOPs;
* the bytes every physical link carried (``np.allclose``, rtol 1e-9) and their total.

They also check how the partition reacts to perturbations (a slowed cell, one straggler),
that a partition which is *not* equitable for the network it is used on gives a different
answer (the comparison above has teeth), and that large data-parallel jobs fold to a handful
of cells.

Every configuration is fixed (a seeded generator for the random ones), so a failure
reproduces with the test id alone.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from simulator.engine import run
from simulator.scenario import load_scenario
from topologies import ConfigError

REL = 1e-9
"""Relative tolerance of every folded-versus-unfolded comparison."""

OP_KEY = ["rank", "step", "stream", "kind", "name", "layer", "microbatch", "chunk", "phase"]
"""Columns naming an op of a rank's program; ``occurrence`` (its count in program order among
equal keys, e.g. a layer's two forward TP all-reduces) makes the name unique."""


# -- scenarios ---------------------------------------------------------------------------------
def scenario(tp, pp, dp, *, cp=1, ep=1, nmb=2, schedule="1f1b", preset="dgx-h100", routing="dmodk",
             hosts_per_leaf=None, num_steps=1, moe_routing="balanced", tp_comm=False, sp=False, p2p=None,
             zero_stage=1, dist_opt=True, recompute="selective", grad_reduce=True, param_gather=True, pxn=True,
             seq_len=1024, cp_comm_type="p2p", cp_split="zigzag", hcp=None) -> dict:
    """A small scenario mapping: ``tp * cp * dp * pp`` GPUs on 8-GPU hosts, ``nmb`` micro-batches
    per data-parallel replica.

    ``dp`` is the dense data-parallel degree (EP is carved out of it: ``edp = cp * dp / ep``);
    the model is the tiny dense or MoE preset (8 experts) with two layers per pipeline chunk
    and 8 KV heads (so TP up to 8 divides them).  The interleaved schedule runs with ``vpp=2``
    and, unless ``p2p`` says otherwise, ``overlap.p2p`` on.
    """
    vpp = 2 if schedule in ("interleaved_1f1b", "zb_v") else 1
    world = tp * cp * dp * pp
    assert world % 8 == 0, f"{world} GPUs do not fill 8-GPU hosts"
    model = {"preset": "tiny-moe" if ep > 1 else "tiny-dense", "num_layers": 2 * pp * vpp, "num_kv_heads": 8}
    if ep > 1:
        model["moe"] = {"num_experts": 8}
    cluster = {"preset": preset, "num_nodes": world // 8, "routing": routing, "pxn": pxn}
    if hosts_per_leaf:
        cluster["hosts_per_leaf"] = hosts_per_leaf
    par = {"tp": tp, "pp": pp, "dp": -1, "cp": cp, "ep": ep, "micro_batch_size": 1,
           "global_batch_size": nmb * dp, "seq_len": seq_len, "schedule": schedule, "vpp": vpp,
           "sequence_parallel": sp, "zero_stage": zero_stage, "distributed_optimizer": dist_opt,
           "recompute": recompute, "cp_comm_type": cp_comm_type, "cp_split": cp_split}
    if hcp is not None:
        par["hierarchical_context_parallel_sizes"] = list(hcp)
    sc = {"model": model, "cluster": cluster, "parallel": par, "num_steps": num_steps, "host": "none",
          "overlap": {"p2p": vpp > 1 if p2p is None else p2p, "tp_comm": tp_comm, "grad_reduce": grad_reduce,
                      "param_gather": param_gather}}
    if ep > 1:
        sc["moe_routing"] = moe_routing
    return sc


_DEFAULTS = {"cp": 1, "ep": 1, "nmb": 2, "schedule": "1f1b", "preset": "dgx-h100", "routing": "dmodk",
             "hosts_per_leaf": None, "num_steps": 1, "moe_routing": "balanced", "tp_comm": False, "sp": False,
             "p2p": None, "zero_stage": 1, "dist_opt": True, "recompute": "selective", "grad_reduce": True,
             "param_gather": True, "pxn": True, "cp_comm_type": "p2p", "cp_split": "zigzag", "hcp": None}


_SHORT = {"nmb": "mb", "schedule": "", "preset": "", "routing": "", "hosts_per_leaf": "hpl", "num_steps": "steps",
          "moe_routing": "", "zero_stage": "zero", "recompute": "rc_"}


def _describe(kw: dict) -> str:
    """A test id: the degrees, then every option that differs from its default."""
    s = f"tp{kw['tp']}-pp{kw['pp']}-dp{kw['dp']}"
    for k, v in kw.items():
        if k in ("tp", "pp", "dp") or v == _DEFAULTS.get(k):
            continue
        s += f"-{k}" if v is True else f"-no_{k}" if v is False else f"-{_SHORT.get(k, k)}{v}"
    return s


def random_layouts(seed: int, n: int, max_world: int = 64) -> list[dict]:
    """``n`` valid layouts drawn from a seeded generator: PP 2-4, DP 2-16, TP 2-8, 2-8
    micro-batches, CP 1-2, EP 1-4 (EP x TP and CP x TP within a host whenever they fit), four
    schedules, two host types (8 NICs per host, or 4 shared by two GPUs each), three routing
    policies, one or several leaves, balanced or skewed expert routing, one or two steps, and
    the overlap / ZeRO / recompute switches.  Layouts the scenario loader rejects (a
    schedule's micro-batch minimum, a leaf size that does not divide the hosts) are redrawn,
    so the list is the same on every machine."""
    rng = random.Random(seed)
    out: list[dict] = []
    while len(out) < n:
        kw = {"tp": rng.choice([2, 4, 8]), "pp": rng.choice([2, 3, 4]), "dp": rng.choice([2, 4, 8, 16]),
              "cp": rng.choice([1, 1, 2]), "ep": rng.choice([1, 1, 2, 4]),
              "schedule": rng.choice(["1f1b", "1f1b", "gpipe", "zb_h1", "interleaved_1f1b"]),
              "nmb": rng.randint(2, 8), "preset": rng.choice(["dgx-h100", "dgx-h100", "a100-4nic"]),
              "routing": rng.choice(["dmodk", "dmodk", "adaptive", "ecmp_hash"]),
              "hosts_per_leaf": rng.choice([None, 2]), "num_steps": rng.choice([1, 1, 2]),
              "moe_routing": rng.choice(["balanced", "balanced", "skew(2.0)", "forced_balanced"]),
              "tp_comm": rng.random() < 0.25, "sp": rng.random() < 0.5,
              "zero_stage": rng.choice([0, 1, 1, 1, 2, 3]), "dist_opt": rng.random() < 0.8,
              "recompute": rng.choice(["none", "selective", "selective", "full"]),
              "grad_reduce": rng.random() < 0.8, "param_gather": rng.random() < 0.8, "pxn": rng.random() < 0.8}
        world = kw["tp"] * kw["pp"] * kw["dp"] * kw["cp"]
        if world % 8 or world > max_world:
            continue
        kw = {k: v for k, v in kw.items() if k in ("tp", "pp", "dp") or v != _DEFAULTS[k]}
        if kw.get("ep", 1) == 1:
            kw.pop("moe_routing", None)
        try:
            load_scenario(scenario(**kw))
        except ConfigError:
            continue
        out.append(kw)
    return out


#: Hand-picked layouts covering what the random draw might miss.
NAMED_LAYOUTS = [
    dict(tp=2, pp=2, dp=2),
    # TP x EP share a host: 2 x 4 = the 8 GPUs of a DGX (expert all-to-alls stay on NVLink)
    dict(tp=2, pp=2, dp=4, ep=4, nmb=4),
    # TP x EP sharing a host with skewed expert routing (per-rank token counts differ)
    dict(tp=2, pp=2, dp=4, ep=4, nmb=2, moe_routing="skew(2.0)"),
    # TP x CP share a host: 4 x 2
    dict(tp=4, pp=2, dp=2, cp=2, nmb=4),
    # TP x CP x EP on one host (2 x 2 x 2), EP spanning CP and DP
    dict(tp=2, pp=2, dp=4, cp=2, ep=2, nmb=2),
    # CP variants: ring attention over 4 ranks with a sequential split (per-CP-rank classes,
    # the ring crossing hosts), all-gather, Ulysses all-to-all and the hierarchical a2a+p2p
    dict(tp=1, pp=2, dp=2, cp=4, nmb=2, cp_split="sequential"),
    dict(tp=2, pp=2, dp=2, cp=2, nmb=2, cp_comm_type="all_gather"),
    dict(tp=2, pp=2, dp=2, cp=2, nmb=2, cp_comm_type="a2a"),
    dict(tp=1, pp=2, dp=2, cp=4, nmb=2, cp_comm_type="a2a+p2p", hcp=(2, 2), cp_split="sequential"),
    # DP 16 across 8 hosts
    dict(tp=2, pp=2, dp=16, nmb=2),
    # PP 3 with 8 micro-batches under GPipe, TP over the whole host
    dict(tp=8, pp=3, dp=2, nmb=8, schedule="gpipe"),
    # PP 4 interleaved (vpp 2) with 8 micro-batches, two steps (parameter gathers carry over)
    dict(tp=2, pp=4, dp=2, nmb=8, schedule="interleaved_1f1b", num_steps=2),
    # zero-bubble schedule, TP comm overlap and sequence parallelism
    dict(tp=4, pp=2, dp=2, nmb=4, schedule="zb_h1", tp_comm=True, sp=True),
    # ZeRO-3 / FSDP: prefetched per-layer parameter gathers over DP, two steps
    dict(tp=2, pp=2, dp=4, nmb=4, zero_stage=3, num_steps=2),
    # ZeRO-3 with experts (gathered over the expert data-parallel group) and ZeRO-2
    # (gradients reduce-scattered every micro-batch)
    dict(tp=2, pp=2, dp=4, ep=2, nmb=2, zero_stage=3),
    dict(tp=2, pp=2, dp=4, nmb=4, zero_stage=2),
    # two GPUs per NIC, 2 hosts per leaf: traffic crosses the spines
    dict(tp=2, pp=2, dp=8, nmb=2, preset="a100-4nic", hosts_per_leaf=2),
    # adaptive routing spreads each flow over the spine planes
    dict(tp=4, pp=2, dp=4, nmb=2, routing="adaptive", hosts_per_leaf=2),
    # ECMP hashing: refinement must split every cell a collision touches
    dict(tp=4, pp=2, dp=4, nmb=2, routing="ecmp_hash", hosts_per_leaf=2),
]

RANDOM_SEED = 20240607
RANDOM_LAYOUTS = random_layouts(RANDOM_SEED, 24)

LAYOUTS = [pytest.param(kw, id=_describe(kw)) for kw in NAMED_LAYOUTS] + \
          [pytest.param(kw, id=f"rand{i}-{_describe(kw)}") for i, kw in enumerate(RANDOM_LAYOUTS)]


# -- comparison ----------------------------------------------------------------------------------
def _ops(tl):
    """One row per (rank, step, op), named by ``OP_KEY`` + ``occurrence``, in that order."""
    tl = tl.reset_index(drop=True).copy()
    tl["occurrence"] = tl.groupby(OP_KEY, sort=False).cumcount()
    return tl.sort_values(OP_KEY + ["occurrence"], kind="stable").reset_index(drop=True)


def assert_same_run(folded, unfolded, what: str = "") -> None:
    """``folded`` (any folding) reproduces ``unfolded`` (one actor per rank): step time, every
    rank's every op (start, end, bytes, FLOPs), step bounds and every physical link's bytes."""
    st_f, st_u = folded.metrics["step_time_s"], unfolded.metrics["step_time_s"]
    assert st_u > 0
    assert st_f == pytest.approx(st_u, rel=REL, abs=0), f"{what}: step time {st_f!r} folded vs {st_u!r} unfolded"
    tol = REL * st_u
    np.testing.assert_allclose(np.asarray(folded.step_bounds), np.asarray(unfolded.step_bounds), rtol=0, atol=tol,
                               err_msg=f"{what}: step bounds")

    a, b = _ops(folded.rank_timeline()), _ops(unfolded.timeline)
    assert len(a) == len(b), f"{what}: {len(a)} op rows folded vs {len(b)} unfolded"
    keys = OP_KEY + ["occurrence", "node", "axis"]
    mismatch = (a[keys].astype(str).to_numpy() != b[keys].astype(str).to_numpy()).any(axis=1)
    assert not mismatch.any(), (f"{what}: op lists differ, first at\n{a.loc[mismatch, keys].head(3)}\nvs\n"
                                f"{b.loc[mismatch, keys].head(3)}")
    for col in ("start_s", "end_s"):
        err = np.abs(a[col].to_numpy() - b[col].to_numpy())
        i = int(np.argmax(err))
        assert err[i] <= tol, (f"{what}: {col} differs by {err[i]:.3g} s (step {st_u:.6g} s) at "
                               f"{dict(a.loc[i, OP_KEY + ['occurrence']])}: {a.loc[i, col]!r} vs {b.loc[i, col]!r}")
    for col in ("size_bytes", "flops"):
        np.testing.assert_array_equal(a[col].to_numpy(), b[col].to_numpy(), err_msg=f"{what}: {col}")

    lb_f, lb_u = np.asarray(folded.network.link_bytes), np.asarray(unfolded.network.link_bytes)
    assert lb_f.shape == lb_u.shape
    assert np.allclose(lb_f, lb_u, rtol=REL, atol=1e-6), (
        f"{what}: link bytes differ on {int((~np.isclose(lb_f, lb_u, rtol=REL, atol=1e-6)).sum())} links, "
        f"max |diff| {np.abs(lb_f - lb_u).max():.6g} B")
    assert lb_f.sum() == pytest.approx(lb_u.sum(), rel=1e-12), f"{what}: total link bytes"


# -- properties ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", LAYOUTS)
def test_folded_run_equals_unfolded_run(kw):
    """On every layout the folded run is the unfolded run: same step time, same per-rank
    per-op timings, same per-link bytes -- and it never needs more actors than ranks."""
    sc = scenario(**kw)
    folded, unfolded = run(sc), run(sc, fold=False)
    assert folded.folding.folded and not unfolded.folding.folded
    world = unfolded.program.grid.world_size
    assert unfolded.metrics["fold"]["rank_cells"] == world
    assert kw["pp"] <= folded.metrics["fold"]["rank_cells"] <= world
    assert_same_run(folded, unfolded, _describe(kw))


@pytest.mark.parametrize("kw", [
    pytest.param(dict(tp=2, pp=2, dp=2, nmb=4, schedule="interleaved_1f1b", p2p=False), id="interleaved-blocking"),
    pytest.param(dict(tp=2, pp=2, dp=2, nmb=4, schedule="dualpipe"), id="dualpipe"),
    pytest.param(dict(tp=2, pp=4, dp=2, nmb=8, schedule="dualpipe"), id="dualpipe-pp4"),
    pytest.param(dict(tp=2, pp=4, dp=2, nmb=8, schedule="zb_v", p2p=False), id="zb_v-pp4"),
])
def test_schedules_that_used_to_deadlock_fold_exactly(kw):
    """The interleaved 1F1B schedule with ``overlap.p2p`` off and DualPipe: with blocking
    sends their programs deadlocked (stage 0 blocked in ``send_grad`` to stage 1 while stage 1
    blocked in ``send_grad`` to stage 0, each matching receive posted in a later batch), so
    the engine never blocks sends for these schedules.  Both now finish, folded == unfolded.
    ZB-V with rendezvous sends deadlocks as well (stage s sends a chunk-0 activation down
    while stage s+1 sends a chunk-1 activation up); its runtime posts sends asynchronously
    (``Program.async_sends``), so it finishes with ``overlap.p2p`` off."""
    sc = scenario(**kw)
    unfolded = run(sc, fold=False)
    assert_same_run(run(sc), unfolded, _describe(kw))


@pytest.mark.parametrize("kw", [pytest.param(dict(tp=2, pp=2, dp=4, ep=4, nmb=4), id="tp2xep4-pp2"),
                                pytest.param(dict(tp=4, pp=3, dp=2, cp=2, nmb=3, hosts_per_leaf=2),
                                             id="tp4xcp2-pp3-hpl2")])
def test_free_communication_folds_exactly(kw):
    """With free communication (ranks and groups partitioned only, no network) folding still
    reproduces the unfolded schedule op for op."""
    sc = scenario(**kw)
    folded, unfolded = run(sc, free_comm=True), run(sc, free_comm=True, fold=False)
    assert folded.metrics["fold"]["rank_cells"] < unfolded.program.grid.world_size
    assert_same_run(folded, unfolded, "free_comm " + _describe(kw))


@pytest.mark.parametrize("kw", [pytest.param(dict(tp=2, pp=4, dp=4, nmb=4), id="tp2-pp4-dp4"),
                                pytest.param(dict(tp=2, pp=2, dp=8, ep=4, nmb=2, hosts_per_leaf=2),
                                             id="tp2xep4-pp2-dp8-hpl2")])
def test_slowing_a_whole_cell_keeps_the_partition(kw):
    """``compute_scale`` on *every* member of a cell keeps the partition equitable: the folded
    run still has exactly the unperturbed number of rank cells (the same cells), and still
    equals the unfolded run with the same perturbation -- for each cell in turn."""
    sc = scenario(**kw)
    base = run(sc)
    for k, members in enumerate(base.folding.cells):
        scale = {r: 1.25 for r in members}
        folded = run(sc, compute_scale=scale)
        assert folded.metrics["fold"]["rank_cells"] == base.metrics["fold"]["rank_cells"]
        assert sorted(folded.folding.cells) == sorted(base.folding.cells)
        unfolded = run(sc, fold=False, compute_scale=scale)
        assert_same_run(folded, unfolded, f"{_describe(kw)} cell {k} x1.25")
        assert folded.metrics["step_time_s"] > base.metrics["step_time_s"]


@pytest.mark.parametrize("kw, straggler", [
    # 128 GPUs (balanced: 2 cells, one per stage); a straggler leaves 12
    pytest.param(dict(tp=2, pp=2, dp=32, nmb=2), 0, id="tp2-pp2-dp32-rank0"),
    pytest.param(dict(tp=2, pp=2, dp=32, nmb=2), 77, id="tp2-pp2-dp32-rank77"),
    # 64 GPUs, each TP group a host (balanced: 1 cell); a straggler leaves 4
    pytest.param(dict(tp=8, pp=1, dp=8, nmb=2), 13, id="tp8-pp1-dp8-rank13"),
])
def test_one_straggler_unfolds_only_what_it_touches(kw, straggler):
    """One slow rank (compute x1.2) in a DP >= 8 job: the folded run equals the unfolded run
    with the same straggler, the step gets slower, and the partition gains cells -- the
    straggler alone, the ranks that see it differently -- but stays far below the world size
    (at most 1/8 of it).  The comparison itself sees the straggler: the balanced run does
    not pass for the perturbed one."""
    sc = scenario(**kw)
    scale = {straggler: 1.2}
    base = run(sc)
    folded = run(sc, compute_scale=scale)
    unfolded = run(sc, fold=False, compute_scale=scale)
    world = unfolded.program.grid.world_size
    assert_same_run(folded, unfolded, f"{_describe(kw)} straggler {straggler}")
    assert folded.metrics["step_time_s"] > base.metrics["step_time_s"]
    cells = folded.metrics["fold"]["rank_cells"]
    assert base.metrics["fold"]["rank_cells"] < cells <= world // 8
    assert (straggler,) in folded.folding.cells
    with pytest.raises(AssertionError):
        assert_same_run(base, unfolded)


def test_straggler_cells_do_not_grow_with_data_parallelism():
    """The straggler's extra cells come from the ranks whose view of it differs (its TP and DP
    peers, its pipeline neighbours), not from the DP degree: doubling DP from 32 to 64 (256
    GPUs, folded runs only) adds no cell."""
    cells = [run(scenario(tp=2, pp=2, dp=dp, nmb=2), compute_scale={0: 1.2}).metrics["fold"]["rank_cells"]
             for dp in (32, 64)]
    assert cells[1] <= cells[0] <= 128 // 8


def test_a_folding_that_mixes_compute_scales_is_refused():
    """A given Folding whose cell mixes slowed and unslowed ranks cannot be simulated as one
    actor: the engine refuses it instead of silently applying the representative's factor."""
    sc = scenario(tp=2, pp=2, dp=4)
    balanced = run(sc).folding
    with pytest.raises(ConfigError, match="compute_scale"):
        run(sc, fold=balanced, compute_scale={1: 1.2})


def test_dmodk_folding_is_wrong_under_ecmp_hashing_but_refinement_is_exact():
    """Negative control.  8 DGX hosts, 2 per leaf (4 leaves: DP and PP traffic crosses the
    spines).  Under D-mod-K routing the layout folds to a few cells; that partition is
    equitable for D-mod-K routes only.  Forcing it onto the same scenario routed by ECMP
    hashing (collisions load some spine links more than others) must give a different answer
    from the unfolded ECMP run -- the per-link bytes differ (192 of 512 links, and at the
    time of writing the step time by 1.3 %), and ``assert_same_run`` rejects it, so the comparisons of the other
    tests would catch a wrong partition.  ``fold=True`` under ECMP
    refines the partition to the hashed routes and reproduces the unfolded run exactly."""
    kw = dict(tp=8, pp=2, dp=4, nmb=2, hosts_per_leaf=2)
    dmodk = run(scenario(**kw))
    assert dmodk.metrics["fold"]["rank_cells"] < dmodk.program.grid.world_size // 4
    ecmp = scenario(**kw, routing="ecmp_hash")
    unfolded = run(ecmp, fold=False)
    wrong = run(ecmp, fold=dmodk.folding)
    with pytest.raises(AssertionError):
        assert_same_run(wrong, unfolded)

    st_w, st_u = wrong.metrics["step_time_s"], unfolded.metrics["step_time_s"]
    lb_w, lb_u = wrong.network.link_bytes, unfolded.network.link_bytes
    step_differs = abs(st_w - st_u) > 1e-6 * st_u
    links_differ = not np.allclose(lb_w, lb_u, rtol=1e-6, atol=1.0)
    assert step_differs or links_differ, f"step time {st_w!r} vs {st_u!r}, link bytes equal"
    # in particular ECMP collisions put uneven bytes on spine links the D-mod-K cells treat as one
    assert links_differ, f"max link byte difference {np.abs(lb_w - lb_u).max():.6g}"

    refined = run(ecmp)
    assert refined.metrics["fold"]["rank_cells"] > dmodk.metrics["fold"]["rank_cells"]
    assert_same_run(refined, unfolded, "ecmp_hash fold=True")


@pytest.mark.parametrize("kw", [
    pytest.param(dict(tp=4, pp=2, dp=16, nmb=2), id="tp4-pp2-dp16-128gpu"),
    pytest.param(dict(tp=2, pp=4, dp=16, nmb=4), id="tp2-pp4-dp16-128gpu"),
])
def test_large_data_parallel_job_folds_to_one_cell_per_stage(kw):
    """128 GPUs with DP 16: every DP replica and TP rank of a pipeline stage is
    interchangeable, so the folded run simulates PP actors instead of 128, and gives the
    unfolded answer op for op."""
    sc = scenario(**kw)
    folded, unfolded = run(sc), run(sc, fold=False)
    assert unfolded.program.grid.world_size == 128
    assert folded.metrics["fold"]["rank_cells"] == kw["pp"]
    assert len(folded.timeline) * (128 // kw["pp"]) == len(unfolded.timeline)
    assert_same_run(folded, unfolded, _describe(kw))


def test_refinement_helpers_equal_their_plain_forms():
    """Colour refinement hashes incidences through a (colour, coefficient) table and
    relabels through a hash table of keys; both give exactly what hashing every incidence
    and sorting every key give."""
    import importlib

    F = importlib.import_module("simulator.engine.fold")
    rng = np.random.default_rng(5)
    for n, k in ((50_000, 300), (20_000, 15_000), (7, 3), (1, 1)):
        old = rng.integers(0, k, n)
        h = rng.integers(0, 4, n).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        _, first, inv = np.unique(F._pair(old, h), return_index=True, return_inverse=True)
        rank = np.empty(first.size, dtype=np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(first.size)
        assert np.array_equal(F._relabel(old, h), rank[inv.ravel()])
        coef = rng.integers(0, 3, n)
        for offset in (0, 1):
            assert np.array_equal(F._pair_table(k, offset, 3)[old, coef], F._pair(old + offset, coef))
    # colours 0 and 1 under keys that collide: a merge, refused
    inner = [F._mix(np.uint64(c) + F._K1) * F._K1 for c in (0, 1)]      # arrays: they wrap silently
    with pytest.raises(F.FoldError):
        F._relabel(np.array([0, 1]), np.concatenate([np.zeros(1, np.uint64), inner[0] - inner[1]]))


@pytest.mark.parametrize("kw", [{"schedule": "interleaved_1f1b", "nmb": 4}, {"ep": 2}])
def test_transfer_cells_of_each_rank_cell_equal_a_plain_count(kw):
    """Folding counts, per (rank cell, other stage, side), the transfer cells its members'
    transfers fall in with numpy; a transfer-by-transfer count gives the same lists, keys
    in the same order."""
    import importlib

    import simpy

    from simulator.collectives import CollectiveEngine
    from workloads.program import build_program

    F = importlib.import_module("simulator.engine.fold")
    sc = load_scenario(scenario(2, 4, 2, **kw))
    prog = build_program(sc.model, sc.parallel, sc.cluster.gpu, moe_routing=sc.moe_routing, host=sc.host)
    coll = CollectiveEngine(simpy.Environment(), sc.cluster)
    gr, group_label, flow_label = F._structure(prog, coll, True)
    rank_c, _, flow_c, _, _ = F._refine(gr, *F._initial_colours(prog, coll, True, group_label, flow_label, None, None))
    pc = F._relabel(np.zeros(len(gr.pairs), dtype=np.int64), flow_c[gr.pflow].astype(np.uint64))
    plain: dict = {}
    stage_of = {r: k for p in gr.pipes for k, r in enumerate(p)}
    for i, (s, d) in enumerate(gr.pairs):
        for r, other, side in ((s, d, "send"), (d, s, "recv")):
            dd = plain.setdefault((int(rank_c[r]), stage_of[other], side), {})
            dd[int(pc[i])] = dd.get(int(pc[i]), 0) + 1
    assert list(F._p2p_of(gr, rank_c, pc).items()) == [(k, sorted(v.items())) for k, v in plain.items()]
