"""Golden digests: the exact results of 60 small scenarios, kept bit for bit across refactors.

Each case is a scenario (and the ``run()`` keywords it needs) chosen to cover the engine's
contract: every pipeline schedule, ZeRO stages 0-3, context and expert parallelism with
balanced, skewed, Zipf and trace routing, every host mode, each overlap switch, every
what-if, precisions and recompute modes, folded and unfolded runs, free communication.

A case's digest has two parts:

* ``ops``: SHA-256 over every rank's executed ops -- for each rank in order, the sorted
  rows (step, stream, kind, name, layer, micro-batch, chunk, phase, axis, and the float64
  bit patterns of start, end, FLOPs and bytes) of the cell that stands for it.  The digest
  does not depend on the order in which the engine records rows or numbers its cells, so
  an engine that reorders its work but not its results keeps it.
* ``metrics``: SHA-256 over the metrics JSON (sorted keys, floats by ``repr``) without the
  fields that measure the simulator rather than the job: wall time, event/flow/solve
  counts and folding statistics; the last cell is named by its lowest rank.

``step_time_s`` is stored in clear to make a failure readable.  Regenerate only for a
change that is meant to move results, and say so in its commit:

    python -m tests.golden.cases --write        # rewrites tests/golden/digests.json
    python -m tests.golden.cases --check        # what the test does, with a table
"""

from __future__ import annotations

import copy
import hashlib
import json
import struct
import sys
from pathlib import Path

DIGESTS = Path(__file__).with_name("digests.json")
TRACE_CSV = Path(__file__).with_name("moe_trace.csv")

#: metrics that measure the simulator's effort, not the simulated job
EFFORT_KEYS = ("wall_time_s", "num_events", "num_flows", "num_solves", "fold")


def _small(tp=1, pp=2, dp=2, *, cp=1, ep=1, nmb=4, schedule="1f1b", vpp=1, moe=False, layers=None,
           preset="dgx-h100", gpus_per_host=8, host="none", **extra) -> dict:
    """A tiny dense (or MoE) scenario of ``tp * cp * dp * pp`` GPUs; ``extra`` merges into the
    scenario's sections (``parallel``, ``overlap``, ``cluster``) or sets top-level keys."""
    world = tp * cp * dp * pp
    layers = layers or 2 * pp * vpp
    model = {"preset": "tiny-moe" if moe else "tiny-dense", "num_layers": layers, "num_kv_heads": 8}
    if moe:
        model["moe"] = {"num_experts": 8}
    nodes = max(1, world // gpus_per_host)
    sc = {"model": model,
          "cluster": {"preset": preset, "num_nodes": nodes, "hosts_per_leaf": 2},
          "parallel": {"tp": tp, "pp": pp, "dp": -1, "cp": cp, "ep": ep, "micro_batch_size": 1,
                       "global_batch_size": nmb * dp, "seq_len": 1024, "schedule": schedule, "vpp": vpp},
          "num_steps": 2, "host": host}
    if world < gpus_per_host:
        sc["cluster"].update(gpus_per_host=world, nics_per_host=world)
    for key, value in extra.items():
        if key in ("parallel", "overlap", "cluster", "model"):
            sc.setdefault(key, {}).update(value)
        else:
            sc[key] = value
    return sc


def cases() -> dict[str, tuple[dict, dict]]:
    """name -> (scenario mapping, run() keywords)."""
    c: dict[str, tuple[dict, dict]] = {}

    def add(name, sc, **kw):
        assert name not in c, name
        c[name] = (sc, kw)

    # -- schedules -----------------------------------------------------------------------------
    add("gpipe", _small(schedule="gpipe"))
    add("1f1b", _small())
    add("1f1b-tp2-sp", _small(tp=2, parallel={"sequence_parallel": True}))
    add("1f1b-tp2-nosp", _small(tp=2, parallel={"sequence_parallel": False}))
    add("interleaved", _small(pp=2, vpp=2, schedule="interleaved_1f1b"))
    add("interleaved-p2p", _small(pp=2, vpp=2, schedule="interleaved_1f1b", overlap={"p2p": True}))
    add("interleaved-pp4", _small(pp=4, vpp=2, dp=2, nmb=8, schedule="interleaved_1f1b"))
    add("zb-h1", _small(schedule="zb_h1"))
    add("zb-h1-pp4", _small(pp=4, nmb=8, schedule="zb_h1"))
    add("dualpipe", _small(pp=4, nmb=8, schedule="dualpipe"))
    add("dualpipe-moe", _small(pp=4, dp=2, ep=2, nmb=8, schedule="dualpipe", moe=True))
    add("dualpipe-moe-no-fb-overlap", _small(pp=4, dp=2, ep=2, nmb=8, schedule="dualpipe", moe=True,
                                             overlap={"fb_overlap": False}))
    add("pp1", _small(pp=1, dp=4, tp=2))
    add("edge-stage-split", _small(pp=2, layers=5, parallel={"num_layers_in_first_pipeline_stage": 2}))
    # -- data parallel and ZeRO ----------------------------------------------------------------
    add("zero0", _small(dp=4, parallel={"zero_stage": 0, "distributed_optimizer": False}))
    add("zero1", _small(dp=4, parallel={"zero_stage": 1}))
    add("zero2", _small(dp=4, parallel={"zero_stage": 2}))
    add("zero3", _small(dp=4, parallel={"zero_stage": 3}))
    add("zero3-no-prefetch", _small(dp=4, parallel={"zero_stage": 3}, overlap={"fsdp_prefetch": False}))
    add("no-grad-overlap", _small(dp=4, overlap={"grad_reduce": False}))
    add("no-param-gather-overlap", _small(dp=4, overlap={"param_gather": False}))
    add("no-comm-slowdown", _small(dp=4, overlap={"comm_slowdown": False}))
    add("tp-comm-overlap", _small(tp=4, dp=2, parallel={"sequence_parallel": True}, overlap={"tp_comm": True}))
    add("grad-bf16", _small(dp=4, grad_reduce_dtype="bf16"))
    # -- context parallel ----------------------------------------------------------------------
    add("cp2", _small(tp=2, cp=2, dp=2))
    add("cp2-no-overlap", _small(tp=2, cp=2, dp=2, overlap={"cp_comm": False}))
    add("cp4-zero3", _small(cp=4, dp=2, parallel={"zero_stage": 3}))
    # -- expert parallel and routing -----------------------------------------------------------
    add("ep2", _small(dp=4, ep=2, moe=True))
    add("ep4-balanced", _small(dp=4, ep=4, moe=True))
    add("ep4-forced-balanced", _small(dp=4, ep=4, moe=True, moe_routing="forced_balanced"))
    add("ep4-skew", _small(dp=4, ep=4, moe=True, moe_routing="skew(2.0)"))
    add("ep4-zipf", _small(dp=4, ep=4, moe=True, moe_routing="zipf(1.2)", seed=3))
    add("ep4-trace", _small(dp=4, ep=4, moe=True, moe_routing={"trace": str(TRACE_CSV)}))
    add("ep2-etp2", _small(tp=2, dp=4, ep=2, moe=True, parallel={"etp": 2, "sequence_parallel": True}))
    add("ep-tp2-cp2", _small(tp=2, cp=2, dp=2, ep=2, moe=True, parallel={"sequence_parallel": True}))
    # -- host ----------------------------------------------------------------------------------
    add("host-eager", _small(tp=2, host="eager"))
    add("host-cuda-graphs", _small(tp=2, host="cuda_graphs"))
    add("host-measured", _small(tp=2, host={"kernel_us": 40.0, "call_us": 120.0, "checkpoint_us": 500.0},
                                parallel={"recompute": "full"}))
    add("host-eager-interleaved", _small(vpp=2, schedule="interleaved_1f1b", host="eager"))
    # -- precision and recompute ---------------------------------------------------------------
    add("fp8-delayed", _small(tp=2, precision="fp8_delayed"))
    add("fp8-blockwise", _small(tp=2, precision="fp8_blockwise"))
    add("mxfp8-b200", _small(tp=2, preset="dgx-b200", precision="mxfp8"))
    add("nvfp4-b200", _small(tp=2, preset="dgx-b200", layers=12, precision="nvfp4"))
    add("recompute-none", _small(parallel={"recompute": "none"}))
    add("recompute-full", _small(parallel={"recompute": "full"}))
    add("recompute-full-block", _small(layers=8, parallel={"recompute": "full", "recompute_method": "block",
                                                           "recompute_num_layers": 2}))
    # -- clusters ------------------------------------------------------------------------------
    add("a100", _small(tp=2, dp=4, preset="dgx-a100"))
    add("gb200-nvl72", _small(tp=4, pp=2, dp=4, preset="gb200-nvl72", gpus_per_host=4,
                              cluster={"nvls": False}))
    add("ecmp-oversubscribed", _small(dp=16, pp=1, tp=1, cluster={"routing": "ecmp_hash", "oversubscription": 4.0}))
    add("mesh-order-dp-inner", _small(tp=2, dp=4, parallel={"mesh_order": "dp-tp-cp-ep-pp"}))
    # -- what-ifs ------------------------------------------------------------------------------
    add("slow-gpu", _small(dp=4, whatif={"slow_gpus": {1: 1.3}}))
    add("slow-rank-kwarg", _small(dp=4), compute_scale={5: 1.2})
    add("slow-nic", _small(dp=16, whatif={"slow_gpus": {3: {"nic": 2.0}}}))
    add("jitter-op", _small(dp=4, whatif={"jitter": {"scope": "op", "dist": "lognormal(0, 0.1)"}}))
    add("jitter-step", _small(dp=4, whatif={"jitter": [{"scope": "gpu_step", "dist": "bernoulli_stall(0.3, 1 ms)"},
                                                       {"scope": "host_step", "dist": "lognormal(0, 0.05)"}]}))
    add("thermal", _small(dp=4, whatif={"thermal": {"factor": 1.25, "gpus": [2], "start_step": 1}}))
    add("degraded-link", _small(dp=16, whatif={"degraded_links": [{"link": ["leaf0.0", "spine0.0"],
                                                                  "bandwidth_factor": 0.25,
                                                                  "extra_latency": "5 us"}]}))
    add("failed-link", _small(dp=16, whatif={"failed_links": [["leaf0.0", "spine0.0"]]}))
    add("degraded-nic", _small(dp=16, whatif={"degraded_nics": [{"nic": "nic0.0", "bandwidth_factor": 0.5}]}))
    add("failed-nic-pxn", _small(dp=16, whatif={"failed_nics": ["nic0.1"], "nic_failover": "pxn"}))
    add("failed-nic-stops", _small(dp=8, whatif={"failed_nics": ["nic0.1"]}))
    add("placement", _small(tp=2, dp=4, whatif={"placement": [1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12,
                                                              15, 14]}))
    # -- folding and free communication --------------------------------------------------------
    add("unfolded-1f1b", _small(tp=2, dp=2), fold=False)
    add("unfolded-ep4-zipf", _small(dp=4, ep=4, moe=True, moe_routing="zipf(1.2)"), fold=False)
    add("unfolded-jitter", _small(dp=4, whatif={"jitter": {"scope": "op", "dist": "lognormal(0, 0.1)"}}),
        fold=False)
    add("unfolded-interleaved-zero3", _small(vpp=2, schedule="interleaved_1f1b", parallel={"zero_stage": 3}),
        fold=False)
    add("free-comm", _small(tp=2, dp=4), free_comm=True)
    add("free-comm-dualpipe", _small(pp=4, nmb=8, schedule="dualpipe"), free_comm=True)
    add("one-step", _small(tp=2, num_steps=1))
    # -- jobs at real sizes (the shipped example scenarios, frozen here) -------------------------
    h100 = {"preset": "dgx-h100", "num_nodes": 8}
    add("llama3-70b-64xh100", {"model": "llama3-70b", "cluster": h100,
                               "parallel": {"tp": 8, "pp": 4, "dp": 2, "global_batch_size": 64, "seq_len": 8192}})
    add("mixtral-8x7b-64xh100-skew", {"model": "mixtral-8x7b", "cluster": h100, "moe_routing": "skew(1.5)",
                                      "parallel": {"tp": 2, "pp": 4, "dp": 1, "ep": 8, "global_batch_size": 32,
                                                   "seq_len": 4096}})
    add("llama3-8b-128k-cp8", {"model": "llama3-8b", "cluster": h100, "num_steps": 1,
                               "parallel": {"tp": 8, "cp": 8, "pp": 1, "dp": 1, "global_batch_size": 1,
                                            "seq_len": 131072, "recompute": "full"}})
    add("gpt3-175b-interleaved-16k", {"model": "gpt3-175b", "cluster": {"preset": "dgx-h100", "num_nodes": 16},
                                      "precision": "fp8_delayed", "overlap": {"tp_comm": True, "p2p": True},
                                      "parallel": {"tp": 4, "pp": 8, "dp": 4, "vpp": 3,
                                                   "schedule": "interleaved_1f1b", "global_batch_size": 32,
                                                   "seq_len": 2048}})
    return c


def _f(x) -> bytes:
    return struct.pack("<d", float(x))


def ops_digest(res) -> str:
    """SHA-256 of every rank's executed ops (see the module docstring)."""
    tl = res.timeline
    cell_col = "cell" if "cell" in tl.columns else "class_id"
    per_cell: dict[int, str] = {}
    cols = [tl[k].tolist() for k in ("step", "stream", "kind", "name", "layer", "microbatch", "chunk", "phase",
                                     "axis", "start_s", "end_s", "flops", "size_bytes", cell_col)]
    rows: dict[int, list] = {}
    for (step, stream, kind, name, layer, mb, chunk, phase, axis, s, e, fl, sz, cell) in zip(*cols):
        rows.setdefault(int(cell), []).append(
            f"{int(step)}|{stream}|{kind}|{name}|{int(layer)}|{int(mb)}|{int(chunk)}|{phase}|{axis}|"
            f"{_f(s).hex()}|{_f(e).hex()}|{_f(fl).hex()}|{_f(sz).hex()}")
    for cell, lines in rows.items():
        per_cell[cell] = hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()
    h = hashlib.sha256()
    cells = res.folding.cells
    rank_hash: dict[int, str] = {}
    for cid, members in enumerate(cells):
        for r in members:
            rank_hash[int(r)] = per_cell.get(cid, "-")
    for r in sorted(rank_hash):
        h.update(f"{r}:{rank_hash[r]}\n".encode())
    return h.hexdigest()


def canonical_metrics(res) -> dict:
    """The metrics without the simulator's effort, the last cell by its lowest rank."""
    m = {k: v for k, v in res.metrics.items() if k not in EFFORT_KEYS}
    for key in ("last_class", "last_cell"):
        if key in m:
            m["last_cell_first_rank"] = int(min(res.folding.cells[int(m.pop(key))]))
    return m


def metrics_digest(res) -> str:
    text = json.dumps(canonical_metrics(res), sort_keys=True, default=float)
    return hashlib.sha256(text.encode()).hexdigest()


def compute(name: str) -> dict:
    """The digest record of case ``name``."""
    from simulator.engine import JobStopped, run       # noqa: PLC0415 (import cost only when run)
    sc, kw = cases()[name]
    try:
        res = run(copy.deepcopy(sc), **kw)
    except JobStopped as e:
        return {"stopped": str(e)}
    return {"step_time_s": repr(float(res.metrics["step_time_s"])), "ops": ops_digest(res),
            "metrics": metrics_digest(res)}


def _main(argv: list[str]) -> int:
    import time
    write = "--write" in argv
    stored = json.loads(DIGESTS.read_text()) if DIGESTS.exists() else {}
    out, bad = {}, 0
    for name in cases():
        t0 = time.perf_counter()
        rec = compute(name)
        dt = time.perf_counter() - t0
        out[name] = rec
        same = stored.get(name) == rec
        bad += not same
        print(f"{name:32s} {dt:6.2f} s  {rec.get('step_time_s', 'stopped'):>24s}  {'ok' if same else 'DIFFERS'}")
    if write:
        DIGESTS.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(out)} digests to {DIGESTS}")
        return 0
    print(f"{len(out) - bad} of {len(out)} identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
