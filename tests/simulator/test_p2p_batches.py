"""Pipeline p2p batches (Megatron's interleaved loop, DualPipe's queue) and DualPipe's F&B overlap."""

import collections
import re

import pytest

import workloads.program as program_module_root
import workloads.stacks.megatron_te.pipeline as program_module
from simulator.engine import DeadlockError, run
from workloads.schedules import ActionKind, get_schedule
from workloads.schedules.actions import COMM_KINDS, route_position
from workloads.schedules.comm import batches, p2p_order

CASES = ([("interleaved_1f1b", pp, vpp, m) for pp in (2, 4) for vpp in (2, 3) for m in (pp, 2 * pp, 3 * pp)]
         + [("dualpipe", pp, 1, m) for pp in (2, 4, 6) for m in (2 * pp, 2 * pp + 2, 4 * pp)])


def _scenario(schedule, pp, vpp, m, **kw):
    layers = 2 * pp if schedule == "dualpipe" else pp * vpp
    return {"model": {"preset": "tiny-dense", "num_layers": layers},
            "cluster": {"gpu": "H100-SXM", "num_nodes": 1, "gpus_per_host": pp, "nvlink_domain_size": pp,
                        "nics_per_host": 1},
            "parallel": {"tp": 1, "pp": pp, "dp": 1, "vpp": vpp, "global_batch_size": m, "micro_batch_size": 1,
                         "seq_len": 256, "schedule": schedule},
            "num_steps": 1, **kw}


def _key(sched, a):
    """The transfer a SEND/RECV action takes part in: (micro-batch, receiving route position, F|B)."""
    k = route_position(sched)(a.stage, a.chunk, a.microbatch)
    return {ActionKind.SEND_F: (a.microbatch, k + 1, "F"), ActionKind.RECV_F: (a.microbatch, k, "F"),
            ActionKind.SEND_B: (a.microbatch, k - 1, "B"), ActionKind.RECV_B: (a.microbatch, k, "B")}[a.kind]


@pytest.mark.parametrize("schedule, pp, vpp, m", CASES)
def test_every_transfer_is_posted_once_on_each_side(schedule, pp, vpp, m):
    sched = get_schedule(schedule)(pp, m, vpp)
    sends, recvs = collections.Counter(), collections.Counter()
    for s in range(pp):
        order = p2p_order(sched, s)
        assert [a for a in order if a.kind not in COMM_KINDS] == [a for a in sched.actions[s] if a is not None]
        for a in order:
            if a.kind in (ActionKind.SEND_F, ActionKind.SEND_B):
                sends[_key(sched, a)] += 1
            elif a.kind in COMM_KINDS:
                recvs[_key(sched, a)] += 1
    assert sends == recvs and set(sends.values()) == {1}
    # a micro-batch crosses every boundary of its route once forward and once backward
    assert len(sends) == 2 * m * (sched.num_model_chunks - 1)


def test_interleaved_batches_are_megatrons_steps():
    """Steady state: one batch after each (F, BW) step sends its activation and gradient and
    receives the next step's (send_forward_backward_recv_forward_backward)."""
    sched = get_schedule("interleaved_1f1b")(4, 8, 2)
    order = p2p_order(sched, 1)                      # a middle stage: every transfer has a peer
    kinds = [tuple(sorted(a.kind.value for a in b)) for b in batches(order)]
    steady = [k for k in kinds if len(k) == 4]
    assert steady and all(k == ("RECV_B", "RECV_F", "SEND_B", "SEND_F") for k in steady[:-1])
    # with Megatron's overlap_p2p_comm the plain per-action rule applies
    assert p2p_order(sched, 1, overlap_p2p=True) is None
    assert p2p_order(get_schedule("1f1b")(4, 8), 1) is None


def test_dualpipe_order_follows_the_reference_queue():
    """Rank 0 of pp=4, 8 micro-batches, written out from deepseek-ai/DualPipe's step():
    sends leave with the next chunk's receives, the far forward's input is received before
    the phase-3 weight pass, and F&B pairs receive both inputs up front."""
    sched = get_schedule("dualpipe")(4, 8)
    text = " ".join(str(a) if a.kind not in COMM_KINDS else f"[{a}]" for a in p2p_order(sched, 0))
    assert text == ("0F0 [0SEND_F0] 0F1 [0SEND_F1] 0F2 [0RECV_F4@c1] 0F4@c1 [0SEND_F2] 0B4@c1 [0SEND_B4@c1] "
                    "[0RECV_F5@c1] 0W4@c1 0F5@c1 0F3&BW5@c1 [0SEND_F3] [0SEND_B5@c1] [0RECV_F6@c1] [0RECV_B0] "
                    "0F6@c1&BW0 0BW6@c1 [0SEND_B6@c1] [0RECV_F7@c1] [0RECV_B1] 0F7@c1&BW1 0BW7@c1 [0SEND_B7@c1] "
                    "[0RECV_B2] 0B2 0W2 [0RECV_B3] 0B3 0W3")


@pytest.mark.parametrize("schedule, pp, vpp, m", CASES)
def test_blocking_sends_finish_with_the_implementations_batches(schedule, pp, vpp, m):
    res = run(_scenario(schedule, pp, vpp, m))
    assert res.metrics["step_time_s"] > 0


def test_per_action_batches_would_deadlock(monkeypatch):
    """Negative control: posting each transfer next to its own action (no pairing) with
    blocking sends deadlocks both schedules, so the batches above are what makes them finish."""
    monkeypatch.setattr(program_module, "p2p_order", lambda *a, **kw: None)
    for case in (("interleaved_1f1b", 4, 2, 8), ("dualpipe", 4, 1, 8)):
        with pytest.raises(DeadlockError, match="cannot finish"):
            run(_scenario(*case))


def test_interleaved_send_blocks_until_the_receive_is_posted():
    res = run(_scenario("interleaved_1f1b", 4, 2, 8))
    tl = res.timeline
    send = tl[tl["name"] == "send_act"].set_index(["cell", "microbatch", "chunk"])
    recv = tl[tl["name"] == "recv_act"]
    checked = 0
    for _, r in recv.iterrows():
        src_stage = (r["cell"] - 1) % 4               # one class per stage here
        src_chunk = r["chunk"] if r["cell"] > 0 else r["chunk"] - 1
        s = send.loc[(src_stage, r["microbatch"], src_chunk)]
        assert s["end_s"] >= r["start_s"] - 1e-15           # rendezvous: done only once posted
        checked += 1
    assert checked == 8 * (2 * 4 - 1)
    # with overlap.p2p sends do not wait for the receiver
    res = run(_scenario("interleaved_1f1b", 4, 2, 8, overlap={"p2p": True}))
    sends = res.timeline[res.timeline["name"] == "send_act"]
    assert (sends["end_s"] == sends["start_s"]).any()


def _moe_dualpipe(**kw):
    return {"model": {"preset": "tiny-moe", "num_layers": 8},
            "cluster": {"preset": "dgx-h100", "num_nodes": 2},
            "parallel": {"tp": 1, "pp": 2, "ep": 4, "dp": -1, "global_batch_size": 32, "micro_batch_size": 1,
                         "seq_len": 2048, "schedule": "dualpipe", "mesh_order": "tp-cp-dp-ep-pp"},
            "num_steps": 1, "host": "none", **kw}      # GPU-side overlap: an infinitely fast host


def test_dualpipe_overlaps_one_halfs_all_to_all_with_the_other_halfs_compute():
    on = run(_moe_dualpipe())
    off = run(_moe_dualpipe(overlap={"fb_overlap": False}))
    assert on.metrics["step_time_s"] < off.metrics["step_time_s"]
    assert on.metrics["exposed_comm_s"]["ep"] < off.metrics["exposed_comm_s"]["ep"]
    # in some F&B pair an all-to-all of one half runs while the other half computes
    tl = on.timeline
    a2a = tl[(tl["stream"] == "ep") & (tl["end_s"] > tl["start_s"])]
    comp = tl[(tl["stream"] == "compute") & (tl["end_s"] > tl["start_s"])]
    hidden = 0
    for _, a in a2a.iterrows():
        same = comp[(comp["cell"] == a["cell"]) & (comp["start_s"] < a["end_s"])
                    & (comp["end_s"] > a["start_s"]) & (comp["phase"] != a["phase"])]
        hidden += len(same) > 0
    assert hidden > 0
    # the overlap hides communication only: with free communication both give the same step
    free_on = run(_moe_dualpipe(), free_comm=True).metrics["step_time_s"]
    free_off = run(_moe_dualpipe(overlap={"fb_overlap": False}), free_comm=True).metrics["step_time_s"]
    assert free_on == pytest.approx(free_off, rel=1e-12)


def test_megatron_lm_scatter_gather_sends_a_slice_and_gathers_it():
    """Megatron-LM's scatter_gather_tensors_in_pipeline (without SP): each TP rank sends
    1/tp of the activation, the receiving TP group all-gathers it before computing."""
    base = {"model": "tiny-dense", "cluster": {"preset": "dgx-h100", "num_nodes": 2},
            "parallel": {"tp": 4, "pp": 2, "dp": 2, "global_batch_size": 8, "seq_len": 2048,
                         "sequence_parallel": False, "mesh_order": "tp-cp-ep-pp-dp"}, "num_steps": 1}
    plain = run(base)
    sg = run({**base, "parallel": {**base["parallel"], "scatter_gather_tensors_in_pipeline": True}})
    send = lambda r: r.program.classes[0].ops  # noqa: E731
    size = {op.size_bytes for op in send(plain) if op.kind == "send"}
    size_sg = {op.size_bytes for op in send(sg) if op.kind == "send"}
    assert len(size) == len(size_sg) == 1 and size_sg.pop() * 4 == size.pop()
    recvs = sum(1 for c in sg.program.classes for op in c.ops if op.kind == "recv")
    gathers = sum(1 for c in sg.program.classes for op in c.ops if op.name == "p2p_gather")
    assert gathers == recvs > 0
    assert all(op.group == "tp" and op.coll == "all_gather" for c in sg.program.classes for op in c.ops
               if op.name == "p2p_gather")
    assert plain.metrics["exposed_comm_s"].get("pp", 0) > sg.metrics["exposed_comm_s"].get("pp", 0)


# -- zero-bubble schedules: asynchronous sends ------------------------------------------------------
def _compute_only(schedule, pp=4, m=16):
    """A pipeline whose only communication is its p2p transfers, short beside the compute:
    TP, CP, DP and EP 1, every stage on one NVLink host, 8 wide layers per stage, a small
    vocabulary (the edge stages' embedding and loss cost little), no recomputation and an
    infinitely fast host.  Unlike ``free_comm``, the transfers keep their send semantics."""
    return {"model": {"preset": "tiny-dense", "num_layers": 8 * pp, "hidden_size": 4096, "ffn_hidden_size": 14336,
                      "num_attention_heads": 32, "num_kv_heads": 8, "vocab_size": 1024},
            "cluster": {"gpu": "H100-SXM", "num_nodes": 1, "gpus_per_host": pp, "nvlink_domain_size": pp,
                        "nics_per_host": 1},
            "parallel": {"tp": 1, "pp": pp, "dp": 1, "global_batch_size": m, "micro_batch_size": 1, "seq_len": 4096,
                         "schedule": schedule, "recompute": "none"},
            "host": "none", "num_steps": 1}


def _analytic_bubble(res, capsys) -> float:
    """``clustersim schedule``'s bubble fraction for the run's schedule, under the run's own
    per-chunk F, B and W times (a middle stage's, micro-batch 1)."""
    from simulator.cli import main
    cls = next(c for c in res.program.classes if c.stage == 1)
    t = collections.defaultdict(float)
    for op in cls.ops:
        if op.kind == "compute" and op.microbatch == 1 and op.chunk == 0:
            t[op.phase] += op.duration_s * 1e3
    par, sched = res.program.parallel, res.program.schedule
    capsys.readouterr()
    assert main(["schedule", "--schedule", sched.name, "--pp", str(par.pp), "--microbatches",
                 str(par.num_microbatches), "--vpp", str(sched.vpp), "--costs", f"{t['F']!r},{t['B']!r},{t['W']!r}"]) == 0
    return float(re.search(r"bubble ([0-9.]+)% of the step", capsys.readouterr().out).group(1)) / 100


@pytest.mark.parametrize("schedule", ["zb_h1", "zb_v", "dualpipe"])
def test_compute_only_bubble_matches_the_schedule_tool(schedule, capsys):
    """With the p2p transfers issued as the implementations issue them, the engine's bubble
    on a compute-only pipeline is the schedule's own, within a point."""
    res = run(_compute_only(schedule))
    assert res.metrics["bubble_fraction"] == pytest.approx(_analytic_bubble(res, capsys), abs=0.01)


def test_zb_h1_with_rendezvous_sends_leaves_a_gap_at_every_microbatch(monkeypatch, capsys):
    """Negative control: with ZB-H1's sends blocking until the peer posts its receive, a stage
    sends a gradient alone after its ``B`` (a ``W`` follows), and its upstream neighbour posts
    the matching receive with its next activation send, which completes only once the stage
    has run its ``W``: the bubble grows by about one ``W`` per micro-batch."""
    monkeypatch.setattr(program_module_root, "sends_async", lambda schedule: False)
    res = run(_compute_only("zb_h1"))
    assert res.metrics["bubble_fraction"] > _analytic_bubble(res, capsys) + 0.1


def test_zero_bubble_sends_never_block_whatever_overlap_p2p_says():
    """The zero-bubble runtimes post sends asynchronously (``overlap.p2p`` changes nothing for
    them); 1F1B keeps Megatron's paired, waited-for batches."""
    sc = _compute_only("zb_h1", m=8)
    on, off = run({**sc, "overlap": {"p2p": True}}), run({**sc, "overlap": {"p2p": False}})
    assert on.program.async_sends and off.program.async_sends
    assert on.metrics["step_time_s"] == off.metrics["step_time_s"]
    sends = off.timeline[off.timeline["name"] == "send_grad"]
    assert (sends["end_s"] == sends["start_s"]).any()       # a send alone in its batch: posted, not awaited
    assert not run(_compute_only("1f1b", m=8)).program.async_sends


def test_only_megatrons_batches_make_the_host_wait(monkeypatch):
    """Megatron-Core synchronises the device after a batch (``batch_p2p_sync``); DualPipe's
    ``req.wait()`` only makes the stream wait, so on a host-bound pipeline its host issues the
    next chunk while the transfers run, and the step is shorter than with the sync."""
    sc = _scenario("dualpipe", 4, 1, 8)              # tiny layers: the eager host paces the step
    res = run(sc)
    assert not res.program.host_waits_for_p2p and not run(_compute_only("zb_h1", m=8)).program.host_waits_for_p2p
    assert run(_scenario("1f1b", 4, 1, 8)).program.host_waits_for_p2p
    monkeypatch.setattr(program_module_root, "host_waits_for_batches", lambda schedule: True)
    synced = run(sc)
    assert res.metrics["step_time_s"] < synced.metrics["step_time_s"]
