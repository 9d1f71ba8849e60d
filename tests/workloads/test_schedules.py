"""Pipeline schedules: text form, validation, closed-form bubbles, warm-up and in-flight counts,
golden tables.

The closed forms are written out here from their sources (not imported from the package):

* GPipe / 1F1B: bubble fraction ``(p-1)/(m+p-1)``.
* Interleaved 1F1B (Narayanan et al. 2021 §2.2): ``(p-1)/(v*m+p-1)`` when a chunk's F and
  full backward each cost ``1/v`` of a stage's.
* ZB-H1 (Qi et al. 2023, arXiv 2401.10241, §2.1): bubble time ``(p-1)(T_F + T_B - T_W)``
  with ``T_B`` the input-gradient backward; DeepSeek-V3 Table 2 writes the same as
  ``(PP-1)(F + B - 2W)`` with ``B`` the full backward.  1F1B: ``(PP-1)(F + B)``.
* DualPipe (DeepSeek-V3 Table 2 / deepseek-ai/DualPipe README): ``(PP/2-1)(F&B + B - 3W)``,
  ``B`` the full backward, ``F&B`` an overlapped forward + backward pair.
* ZB-V (Qi et al. §6): with per-chunk ``T_F = T_B = T_W`` and ``m >= 2p-1`` no stage idles
  between its first and last action; the worst stage's idle time is the ``(p-1) T_F`` it
  waits for the first forward to reach it (the last stage), a lower bound for any order on
  this placement.  The paper's "zero bubble" leaves that fill out.

The action orders of ZB-V and of ZB-H1 are also checked against PyTorch pipelining's own
generators (``golden/pytorch_zero_bubble_orders.json``, written by
``experiments/reference/pytorch_pipelining/make_orders.py``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from topologies import ConfigError
from workloads.schedules import (
    SCHEDULE_NAMES,
    SCHEDULES,
    Action,
    ActionCosts,
    ActionKind,
    Schedule,
    ScheduleError,
    format_action,
    format_table,
    get_schedule,
    min_microbatches,
    model_chunk,
    parse_action,
    peak_in_flight,
    route,
    schedule_timing,
    validate,
    validate_schedule_config,
)
from workloads.schedules.actions import route_position
from workloads.schedules.interleaved import interleaved_order, warmup_interleaved
from workloads.schedules.one_f_one_b import warmup_1f1b

F, B, W, BW, FB = ActionKind.F, ActionKind.B, ActionKind.W, ActionKind.BW, ActionKind.FB
GOLDEN = Path(__file__).parent / "golden"


def build(name: str, pp: int, m: int, vpp: int | None = None) -> Schedule:
    if vpp is None:
        vpp = 2 if name in ("interleaved_1f1b", "zb_v") else 1
    return get_schedule(name)(pp, m, vpp)


# Configurations every schedule must build and validate.
GRID = ([("gpipe", p, m, 1) for p in (1, 2, 3, 4) for m in (1, 2, 5, 8)]
        + [("1f1b", p, m, 1) for p in (1, 2, 3, 4, 8) for m in (1, 2, 3, 8, 13)]
        + [("interleaved_1f1b", p, m, v) for p in (2, 3, 4) for v in (2, 3, 4) for m in (p, 2 * p, 3 * p)]
        + [("zb_h1", p, m, 1) for p in (1, 2, 3, 4, 8) for m in (p, p + 1, 2 * p, 3 * p + 1)]
        + [("dualpipe", p, m, 1) for p in (2, 4, 6, 8) for m in (2 * p, 2 * p + 2, 4 * p)]
        + [("zb_v", p, m, 2) for p in (1, 2, 3, 4, 8) for m in (p, 2 * p - 1, 2 * p, 3 * p + 1)])


# -- registry and text form -------------------------------------------------------------------

def test_registry_names_match_the_user_contract():
    assert tuple(SCHEDULES) == SCHEDULE_NAMES == ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "dualpipe", "zb_v")
    for name in SCHEDULE_NAMES:
        assert get_schedule(name) is SCHEDULES[name]


def test_get_schedule_unknown_name_lists_valid_names():
    with pytest.raises(ConfigError) as err:
        get_schedule("pipedream")
    assert err.value.field == "parallel.schedule"
    assert err.value.value == "pipedream"
    for name in SCHEDULE_NAMES:
        assert name in err.value.rule
    assert isinstance(err.value, ValueError)


def test_action_text_form():
    assert str(Action(2, 0, F, 0)) == "2F0"
    assert str(Action(1, 1, F, 0)) == "1F0@c1"
    assert str(Action(0, 0, BW, 3)) == "0BW3"
    assert str(Action(3, 0, W, 12)) == "3W12"
    assert format_action(Action(2, 0, F, 0), show_chunk=True) == "2F0@c0"
    assert format_action(Action(1, 1, F, 0), show_chunk=False) == "1F0"
    pair = Action.pair(Action(3, 0, F, 1), Action(3, 1, BW, 6))
    assert pair == Action(3, 0, FB, 1, 1, 6)
    assert str(pair) == "3F1&BW6@c1"
    assert format_action(pair, show_chunk=True) == "3F1@c0&BW6@c1"
    assert pair.halves() == (Action(3, 0, F, 1), Action(3, 1, BW, 6))


@pytest.mark.parametrize("text, expected", [
    ("2F0", Action(2, 0, F, 0)),
    ("1F0@c1", Action(1, 1, F, 0)),
    ("0B7@c0", Action(0, 0, B, 7)),
    ("0BW3", Action(0, 0, BW, 3)),
    ("5W11@c2", Action(5, 2, W, 11)),
    ("1SEND_F3", Action(1, 0, ActionKind.SEND_F, 3)),
    ("2RECV_B0@c1", Action(2, 1, ActionKind.RECV_B, 0)),
    ("3F1@c0&BW6@c1", Action(3, 0, FB, 1, 1, 6)),
    (" 3F1&BW6 ", Action(3, 0, FB, 1, 0, 6)),
])
def test_parse_action(text, expected):
    assert parse_action(text) == expected


@pytest.mark.parametrize("text", ["", "F0", "2X0", "2F", "2F0@1", "2F0@c", "3BW1&F2", "3F1&B2", "3F1&W2", "2F0 junk"])
def test_parse_action_rejects(text):
    with pytest.raises(ValueError):
        parse_action(text)


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_text_round_trip_of_every_action(name):
    s = build(name, 4, 8)
    for stage_actions in s:
        for a in stage_actions:
            assert parse_action(str(a)) == a
            assert parse_action(format_action(a, show_chunk=True)) == a


# -- every schedule is a valid step ---------------------------------------------------------

@pytest.mark.parametrize("name, pp, m, vpp", GRID)
def test_schedules_validate(name, pp, m, vpp):
    s = get_schedule(name)(pp, m, vpp)
    assert (s.name, s.pp, s.num_microbatches, s.vpp, len(s.actions)) == (name, pp, m, vpp, pp)
    validate(s)
    # Pure functions: the same arguments give the same table.
    assert get_schedule(name)(pp, m, vpp) == s
    # Every action is on its own stage's list, and compute only.
    for st, stage_actions in enumerate(s):
        assert all(a.stage == st and a.is_compute for a in stage_actions)


def test_kinds_used_by_each_schedule():
    kinds = {name: {a.kind for st in build(name, 4, 8) for a in st} for name in SCHEDULE_NAMES}
    assert kinds["gpipe"] == kinds["1f1b"] == kinds["interleaved_1f1b"] == {F, BW}
    assert kinds["zb_h1"] == {F, B, W}
    assert kinds["dualpipe"] == {F, B, W, BW, FB}


def test_model_chunk_placement_and_routes():
    inter = build("interleaved_1f1b", 4, 8, 3)
    assert inter.num_chunks == 3 and inter.num_model_chunks == 12
    for s in range(4):
        for c in range(3):
            assert model_chunk(inter, s, c) == c * 4 + s
    assert route(inter, 5) == tuple((k % 4, k // 4) for k in range(12))

    dual = build("dualpipe", 4, 8)
    assert dual.num_chunks == 2 and dual.num_model_chunks == 4
    assert [(model_chunk(dual, s, 0), model_chunk(dual, s, 1)) for s in range(4)] == [(0, 3), (1, 2), (2, 1), (3, 0)]
    assert route(dual, 0) == ((0, 0), (1, 0), (2, 0), (3, 0))      # fed at stage 0
    assert route(dual, 4) == ((3, 1), (2, 1), (1, 1), (0, 1))      # fed at stage pp-1
    # Two parameter copies: every model chunk lives on exactly two ranks, each rank holds two.
    holders = [sorted(s for s in range(4) for c in range(2) if model_chunk(dual, s, c) == k) for k in range(4)]
    assert holders == [[0, 3], [1, 2], [1, 2], [0, 3]]

    one = build("1f1b", 4, 8)
    assert [model_chunk(one, s, 0) for s in range(4)] == [0, 1, 2, 3]


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_route_position_agrees_with_route(name):
    s = build(name, 4, 8, 3 if name == "interleaved_1f1b" else None)
    position = route_position(s)
    for mb in range(-1, s.num_microbatches + 1):
        places = route(s, mb) if 0 <= mb < s.num_microbatches else ()
        for stage in range(-1, s.pp + 1):
            for chunk in range(-1, s.num_chunks + 1):
                expected = places.index((stage, chunk)) if (stage, chunk) in places else None
                assert position(stage, chunk, mb) == expected
        for k, (stage, chunk) in enumerate(places):
            assert model_chunk(s, stage, chunk) == k


def test_schedule_layout_is_checked():
    with pytest.raises(ValueError, match="layout"):
        Schedule("x", 2, 2, 1, [[], []], layout="v-shape")
    with pytest.raises(ValueError, match="2 chunks"):
        Schedule("x", 2, 2, 1, [[], []], layout="bidirectional")


# -- timing: a hand-computed case and the cost model -----------------------------------------

def test_timing_hand_computed_1f1b():
    # pp=2, m=2, F=1, full backward 2.  Stage 1: F0 [1,2] BW0 [2,4] F1 [4,5] BW1 [5,7];
    # stage 0: F0 [0,1] F1 [1,2] BW0 [4,6] BW1 [7,9].
    t = schedule_timing(build("1f1b", 2, 2), ActionCosts(f=1, b=1.5, w=0.5))
    assert t.start == [[0, 1, 4, 7], [1, 2, 4, 5]]
    assert t.end == [[1, 2, 6, 9], [2, 4, 5, 7]]
    assert t.step_time == 9 == (2 + 2 - 1) * (1 + 2)
    assert t.busy == [6, 6] and t.idle == [3, 3]
    assert t.bubble_time == 3 and t.bubble_fraction == pytest.approx(1 / 3)


def test_action_costs():
    c = ActionCosts(f=1, b=2, w=0.5)
    assert [c.duration(Action(0, 0, k, 0)) for k in (F, B, W, BW)] == [1, 2, 0.5, 2.5]
    assert c.duration(Action(0, 0, FB, 0, 1, 1)) == 3.5                # no overlap gain by default
    assert ActionCosts(1, 2, 0.5, fb=2.75).duration(Action(0, 0, FB, 0, 1, 1)) == 2.75
    assert c.duration(Action(0, 0, ActionKind.SEND_F, 0)) == 0


def test_timing_accepts_a_cost_function():
    s = build("1f1b", 4, 8)
    heavy_last = schedule_timing(s, lambda a: 2.0 if a.stage == 3 else 1.0)
    uniform = schedule_timing(s, ActionCosts(1, 1, 0))
    assert heavy_last.step_time > uniform.step_time
    assert heavy_last.busy[3] == 2 * uniform.busy[3]


def test_stages_never_run_two_actions_at_once():
    for name in SCHEDULE_NAMES:
        s = build(name, 4, 8)
        t = schedule_timing(s, ActionCosts(1, 2, 1, fb=2.5))
        for starts, ends in zip(t.start, t.end, strict=True):
            assert all(e0 <= s1 for e0, s1 in zip(ends, starts[1:], strict=False))


# -- bubbles against the closed forms --------------------------------------------------------

@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("pp", [1, 2, 4, 5])
@pytest.mark.parametrize("m", [1, 3, 8, 16])
@pytest.mark.parametrize("costs", [ActionCosts(1, 1, 0), ActionCosts(1, 2, 1)], ids=["unit", "F1-B2-W1"])
def test_bubble_gpipe_and_1f1b(name, pp, m, costs):
    t = schedule_timing(build(name, pp, m), costs)
    assert t.bubble_fraction == pytest.approx((pp - 1) / (m + pp - 1), abs=1e-12)
    # DeepSeek-V3 Table 2: 1F1B bubble (PP-1)(F+B), B the full backward.
    assert t.bubble_time == pytest.approx((pp - 1) * (costs.f + costs.b + costs.w))


@pytest.mark.parametrize("pp", [2, 4, 8])
@pytest.mark.parametrize("vpp", [2, 3, 4])
@pytest.mark.parametrize("rounds", [1, 2, 3])
def test_bubble_interleaved(pp, vpp, rounds):
    m = rounds * pp
    # A chunk's forward and full backward each cost 1/vpp of a non-interleaved stage's.
    t = schedule_timing(build("interleaved_1f1b", pp, m, vpp), ActionCosts(f=1 / vpp, b=1 / vpp, w=0))
    assert t.bubble_fraction == pytest.approx((pp - 1) / (vpp * m + pp - 1), rel=1e-12)
    assert t.bubble_time == pytest.approx((pp - 1) * 2 / vpp, rel=1e-12)


@pytest.mark.parametrize("pp", [2, 3, 4, 8])
@pytest.mark.parametrize("extra", [0, 1, 5])
@pytest.mark.parametrize("f, b, w", [(1, 1, 1), (1, 2, 1), (2, 3, 1), (1, 1, 0.5)])
def test_bubble_zb_h1(pp, extra, f, b, w):
    # The handcrafted schedule reaches the closed form when W <= F and W <= B (the paper's
    # figures use F = B = W); F=1, B=2, W=1 tells it apart from 1F1B's (p-1)(F+B+W).
    m = pp + extra
    t = schedule_timing(build("zb_h1", pp, m), ActionCosts(f, b, w))
    assert t.bubble_time == pytest.approx((pp - 1) * (f + b - w))                 # ZB paper notation
    b_full = b + w
    assert t.bubble_time == pytest.approx((pp - 1) * (f + b_full - 2 * w))        # DeepSeek Table 2 "ZB1P"
    one_f_one_b = schedule_timing(build("1f1b", pp, m), ActionCosts(f, b, w))
    assert one_f_one_b.bubble_time == pytest.approx((pp - 1) * (f + b_full))
    if pp > 1:
        assert t.bubble_time < one_f_one_b.bubble_time


def test_bubble_zb_h1_numbers():
    # pp=4, m=8, F=1, B=2, W=1: ZB-H1 idles 6 units (1F1B: 12), step 8*4 + 6 = 38.
    t = schedule_timing(build("zb_h1", 4, 8), ActionCosts(1, 2, 1))
    assert (t.bubble_time, t.step_time) == (6, 38)
    assert t.bubble_fraction == pytest.approx(6 / 38)


@pytest.mark.parametrize("pp", [2, 4, 6, 8])
@pytest.mark.parametrize("m_extra", [0, 2, 8])
@pytest.mark.parametrize("f, b, w, fb", [
    (1, 1, 1, 3.0),      # the README figure: F = B = W one cell, an F&B pair three cells
    (1, 1, 1, 2.5),      # an overlapped pair cheaper than F + full B
    (1, 1, 0.25, 2.0),   # F&B + B - 3W = 2.5; differs from F&B, F+B, F&B+B-2W
])
def test_bubble_dualpipe(pp, m_extra, f, b, w, fb):
    # Table 2's expression is exact for this timing model when the input-gradient backward
    # costs as much as the forward and B_full <= F&B <= F + B_full (see dualpipe.py).
    m = 2 * pp + m_extra
    t = schedule_timing(build("dualpipe", pp, m), ActionCosts(f, b, w, fb=fb))
    b_full = b + w
    assert t.bubble_time == pytest.approx((pp // 2 - 1) * (fb + b_full - 3 * w))


def test_bubble_dualpipe_numbers():
    # pp=8, m=20 (the README figure), F=B=W=1, F&B=3: bubble 3 * (3 + 2 - 3) = 6.
    t = schedule_timing(build("dualpipe", 8, 20), ActionCosts(1, 1, 1, fb=3))
    assert t.bubble_time == 6
    # The same costs under 1F1B / ZB-H1 on 8 stages: (PP-1)(F+B) = 21 and (PP-1)(F+B-2W) = 7.
    assert schedule_timing(build("1f1b", 8, 20), ActionCosts(1, 1, 1)).bubble_time == 21
    assert schedule_timing(build("zb_h1", 8, 20), ActionCosts(1, 1, 1)).bubble_time == 7


# -- warm-up counts against Megatron-Core's formulas -----------------------------------------

def forwards_before_first_backward(stage_actions) -> int:
    n = 0
    for a in stage_actions:
        if a.kind in (B, BW, FB):
            break
        n += a.kind is F
    return n


@pytest.mark.parametrize("pp", [1, 2, 4, 8])
@pytest.mark.parametrize("m", [1, 3, 8, 16])
def test_warmup_1f1b_matches_megatron(pp, m):
    s = build("1f1b", pp, m)
    for stage in range(pp):
        # megatron/core/pipeline_parallel/schedules.py, forward_backward_pipelining_without_interleaving:
        # num_warmup_microbatches = min(total_stages - current_stage - 1, num_microbatches)
        megatron = min(pp - stage - 1, m)
        assert warmup_1f1b(pp, stage, m) == megatron
        # The steady phase opens with one more forward before the first backward.
        assert forwards_before_first_backward(s[stage]) == min(megatron + 1, m)


@pytest.mark.parametrize("pp, vpp", [(2, 2), (3, 2), (4, 2), (4, 3), (4, 4), (8, 2), (8, 4)])
@pytest.mark.parametrize("rounds", [1, 2, 4])
def test_warmup_interleaved_matches_megatron(pp, vpp, rounds):
    m = rounds * pp
    s = build("interleaved_1f1b", pp, m, vpp)
    total = m * vpp
    for stage in range(pp):
        # get_pp_rank_microbatches: (pp - rank - 1) * 2 + (num_model_chunks - 1) * group, group = pp,
        # capped at the total number of (micro-batch, chunk) forwards.
        megatron = min((pp - stage - 1) * 2 + (vpp - 1) * pp, total)
        assert warmup_interleaved(pp, stage, vpp, m) == megatron
        assert forwards_before_first_backward(s[stage]) == min(megatron + 1, total)


def test_interleaved_order_matches_megatron_example():
    # Megatron-Core's comment for PP2 N3 M5 VP2: micro-batch 0 1 2 0 1 2 3 4 3 4, chunk 0 0 0 1 1 1 0 0 1 1.
    order = interleaved_order(5, 2, 3)
    assert [mb for mb, _ in order] == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert [c for _, c in order] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]
    s = get_schedule("interleaved_1f1b")(2, 5, 2, microbatch_group_size=3)
    validate(s)
    assert [str(a) for a in s[1][:4]] == ["1F0", "1F1", "1F2", "1F0@c1"]   # warm-up (2-1-1)*2 + 3 = 3


def test_interleaved_pp2_vpp2_m4_by_hand():
    s = build("interleaved_1f1b", 2, 4, 2)
    text = [[format_action(a, show_chunk=True) for a in st] for st in s]
    # Stage 0: warm-up 2 + 2 = 4 forwards, 4 steady F/B pairs, 4 cool-down backwards.
    assert text[0] == ["0F0@c0", "0F1@c0", "0F0@c1", "0F1@c1",
                       "0F2@c0", "0BW0@c1", "0F3@c0", "0BW1@c1", "0F2@c1", "0BW0@c0", "0F3@c1", "0BW1@c0",
                       "0BW2@c1", "0BW3@c1", "0BW2@c0", "0BW3@c0"]
    # Stage 1: warm-up 0 + 2 = 2 forwards.
    assert text[1] == ["1F0@c0", "1F1@c0",
                       "1F0@c1", "1BW0@c1", "1F1@c1", "1BW1@c1", "1F2@c0", "1BW0@c0", "1F3@c0", "1BW1@c0",
                       "1F2@c1", "1BW2@c1", "1F3@c1", "1BW3@c1",
                       "1BW2@c0", "1BW3@c0"]


# -- activations in flight -------------------------------------------------------------------

@pytest.mark.parametrize("pp", [1, 2, 4, 8])
@pytest.mark.parametrize("m", [1, 3, 8, 16])
def test_in_flight_gpipe_and_1f1b(pp, m):
    assert peak_in_flight(build("gpipe", pp, m)) == [m] * pp
    one = peak_in_flight(build("1f1b", pp, m))
    assert one == [min(pp - s, m) for s in range(pp)]
    assert max(one) == min(pp, m)          # stage 0 holds p when m >= p


@pytest.mark.parametrize("pp, vpp", [(2, 2), (4, 2), (4, 3), (8, 2), (8, 4)])
@pytest.mark.parametrize("rounds", [1, 2, 4])
def test_in_flight_interleaved_korthikanti(pp, vpp, rounds):
    m = rounds * pp
    peaks = peak_in_flight(build("interleaved_1f1b", pp, m, vpp))
    assert peaks == [min((pp - s - 1) * 2 + (vpp - 1) * pp + 1, m * vpp) for s in range(pp)]
    if m * vpp >= vpp * pp + pp - 1:
        # Korthikanti et al. 2022 §4.2.3: the first stage holds p * (1 + (p-1)/(p*v)) stages' worth
        # of activations; one chunk is 1/v of a stage.
        assert peaks[0] / vpp == pytest.approx(pp * (1 + (pp - 1) / (pp * vpp)))


@pytest.mark.parametrize("pp", [1, 2, 4, 8])
def test_in_flight_zb_h1_equals_1f1b_peak(pp):
    assert peak_in_flight(build("zb_h1", pp, 2 * pp)) == [pp] * pp


@pytest.mark.parametrize("pp", [2, 4, 6, 8])
@pytest.mark.parametrize("m_extra", [0, 2, 10])
def test_in_flight_dualpipe(pp, m_extra):
    # DeepSeek-V3 Table 2: activations PP+1 (chunks of 1/PP of the model), with 2x parameters
    # (see test_model_chunk_placement_and_routes).
    assert peak_in_flight(build("dualpipe", pp, 2 * pp + m_extra)) == [pp + 1] * pp


# -- golden tables ---------------------------------------------------------------------------

GOLDEN_CASES = [("gpipe", 4, 4, 1), ("1f1b", 4, 8, 1), ("interleaved_1f1b", 2, 4, 2), ("interleaved_1f1b", 4, 8, 2),
                ("zb_h1", 4, 8, 1), ("dualpipe", 4, 8, 1), ("dualpipe", 8, 20, 1), ("zb_v", 4, 8, 2)]


@pytest.mark.parametrize("name, pp, m, vpp", GOLDEN_CASES)
def test_golden_tables(name, pp, m, vpp):
    table = format_table(get_schedule(name)(pp, m, vpp))
    path = GOLDEN / (f"{name}_pp{pp}_m{m}" + (f"_vpp{vpp}" if vpp > 1 else "") + ".txt")
    if os.environ.get("CLUSTERSIM_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(table)
    assert table == path.read_text()


def test_format_table_forms():
    s = build("1f1b", 2, 2)
    assert format_table(s, timed=False) == ("slot  stage0  stage1\n"
                                            "0     0F0     1F0\n"
                                            "1     0F1     1BW0\n"
                                            "2     0BW0    1F1\n"
                                            "3     0BW1    1BW1\n")
    assert format_table(s) == ("slot  stage0  stage1\n"
                               "0     0F0     .\n"
                               "1     0F1     1F0\n"
                               "2     .       1BW0\n"
                               "3     0BW0    1F1\n"
                               "4     .       1BW1\n"
                               "5     0BW1    .\n")


# -- the validator rejects broken schedules, one test per rule -------------------------------

def edited(s: Schedule, stage: int, new_actions) -> Schedule:
    actions = [list(a) for a in s.actions]
    actions[stage] = list(new_actions)
    return dataclasses.replace(s, actions=actions)


def test_rejects_wrong_number_of_stage_lists():
    s = build("1f1b", 4, 8)
    with pytest.raises(ScheduleError, match="3 stage lists, pp = 4"):
        validate(dataclasses.replace(s, actions=s.actions[:3]))


def test_rejects_action_on_another_stages_list():
    s = build("1f1b", 2, 2)
    bad = edited(s, 0, [Action(1, 0, F, 0)] + s[0][1:])
    with pytest.raises(ScheduleError, match="listed under stage 0 but names stage 1") as err:
        validate(bad)
    assert err.value.stage == 0 and str(err.value.action) == "1F0"


def test_rejects_out_of_range_indices():
    s = build("1f1b", 2, 2)
    with pytest.raises(ScheduleError, match="micro-batch 2 out of range"):
        validate(edited(s, 1, s[1] + [Action(1, 0, F, 2)]))
    with pytest.raises(ScheduleError, match="chunk 1 out of range"):
        validate(edited(s, 1, s[1] + [Action(1, 1, F, 0)]))


def test_rejects_backward_half_on_a_non_fb_action():
    s = build("1f1b", 2, 2)
    with pytest.raises(ScheduleError, match="only an FB pair"):
        validate(edited(s, 0, [Action(0, 0, F, 0, 0, 1)] + s[0][1:]))


def test_rejects_wrong_stage_for_a_microbatch():
    # DualPipe: micro-batch 0 enters at stage 0 and uses chunk 0 everywhere.
    s = build("dualpipe", 4, 8)
    i = s[2].index(Action(2, 0, F, 0))
    bad = edited(s, 2, s[2][:i] + [Action(2, 1, F, 0)] + s[2][i + 1:])
    with pytest.raises(ScheduleError, match="micro-batch 0 does not visit stage 2 chunk 1") as err:
        validate(bad)
    assert err.value.stage == 2 and str(err.value.action) == "2F0@c1"


def test_rejects_duplicate_forward():
    s = build("1f1b", 4, 8)
    with pytest.raises(ScheduleError, match="micro-batch 3 chunk 0: 2 forwards") as err:
        validate(edited(s, 1, s[1] + [Action(1, 0, F, 3)]))
    assert err.value.stage == 1


def test_rejects_missing_forward():
    s = build("1f1b", 4, 8)
    with pytest.raises(ScheduleError, match="micro-batch 5 chunk 0: 0 forwards"):
        validate(edited(s, 2, [a for a in s[2] if a != Action(2, 0, F, 5)]))


def test_rejects_missing_backward():
    s = build("1f1b", 4, 8)
    with pytest.raises(ScheduleError, match="micro-batch 7 chunk 0: no backward") as err:
        validate(edited(s, 3, [a for a in s[3] if a != Action(3, 0, BW, 7)]))
    assert err.value.stage == 3


def test_rejects_duplicate_backward():
    s = build("1f1b", 4, 8)
    with pytest.raises(ScheduleError, match="backward listed more than once"):
        validate(edited(s, 0, s[0] + [Action(0, 0, BW, 0)]))


def test_rejects_full_and_split_backward_together():
    s = build("1f1b", 4, 8)
    with pytest.raises(ScheduleError, match="full backward BW and also a split B/W"):
        validate(edited(s, 0, s[0] + [Action(0, 0, W, 0)]))


def test_rejects_b_without_w():
    s = build("zb_h1", 4, 8)
    with pytest.raises(ScheduleError, match="a split backward needs both B and W") as err:
        validate(edited(s, 2, [a for a in s[2] if a != Action(2, 0, W, 4)]))
    assert str(err.value.action) == "2B4"


def test_rejects_backward_before_forward():
    s = build("1f1b", 2, 2)
    bad = edited(s, 1, [Action(1, 0, BW, 0), Action(1, 0, F, 0), Action(1, 0, F, 1), Action(1, 0, BW, 1)])
    with pytest.raises(ScheduleError, match="backward comes before its forward 1F0") as err:
        validate(bad)
    assert err.value.stage == 1 and str(err.value.action) == "1BW0"


def test_rejects_w_before_b():
    s = build("zb_h1", 2, 2)
    stage0 = [a for a in s[0] if a != Action(0, 0, W, 0)]
    i = stage0.index(Action(0, 0, B, 0))
    with pytest.raises(ScheduleError, match="W comes before its B 0B0") as err:
        validate(edited(s, 0, stage0[:i] + [Action(0, 0, W, 0)] + stage0[i:]))
    assert str(err.value.action) == "0W0"


def test_rejects_fb_pair_of_one_microbatch():
    s = build("dualpipe", 4, 8)
    with pytest.raises(ScheduleError, match="same micro-batch"):
        validate(edited(s, 0, s[0] + [Action(0, 0, FB, 1, 0, 1)]))


def test_rejects_cross_stage_deadlock():
    # Stage 0 runs BW0 before F1, stage 1 wants F1 before BW0: a cycle across the two stages.
    s = Schedule("custom", 2, 2, 1, [
        [Action(0, 0, F, 0), Action(0, 0, BW, 0), Action(0, 0, F, 1), Action(0, 0, BW, 1)],
        [Action(1, 0, F, 0), Action(1, 0, F, 1), Action(1, 0, BW, 0), Action(1, 0, BW, 1)],
    ])
    with pytest.raises(ScheduleError, match="deadlock") as err:
        validate(s)
    message = str(err.value)
    assert "stage 0 at 0BW0 waits for the input-gradient backward of micro-batch 0 at model chunk 1" in message
    assert "stage 1 at 1F1 waits for the forward of micro-batch 1 at model chunk 0" in message
    assert err.value.stage == 0 and str(err.value.action) == "0BW0"


def test_validator_skips_none_and_communication():
    s = build("1f1b", 2, 2)
    padded = edited(s, 1, [None, Action(1, 0, ActionKind.RECV_F, 0)] + s[1])
    validate(padded)
    assert schedule_timing(padded).step_time == schedule_timing(s).step_time


# -- configuration rules ----------------------------------------------------------------------

def test_min_microbatches():
    assert [min_microbatches(n, 4) for n in SCHEDULE_NAMES] == [1, 1, 4, 4, 8, 4]
    assert min_microbatches("interleaved_1f1b", 8, 2) == 8
    assert min_microbatches("dualpipe", 6) == 12


@pytest.mark.parametrize("name, pp, m, vpp, field, words", [
    ("nope", 4, 8, 1, "parallel.schedule", "valid names"),
    ("1f1b", 0, 8, 1, "parallel.pp", "positive integer"),
    ("1f1b", 4, 0, 1, "parallel.num_microbatches", "positive integer"),
    ("1f1b", 4, 8, 0, "parallel.vpp", "positive integer"),
    ("1f1b", 4, 8, 2, "parallel.vpp", "interleaved_1f1b"),
    ("gpipe", 4, 8, 2, "parallel.vpp", "interleaved_1f1b"),
    ("zb_h1", 4, 8, 2, "parallel.vpp", "interleaved_1f1b"),
    ("dualpipe", 4, 8, 2, "parallel.vpp", "interleaved_1f1b"),
    ("zb_v", 4, 8, 1, "parallel.vpp", "exactly 2"),
    ("zb_v", 4, 8, 4, "parallel.vpp", "exactly 2"),
    ("zb_v", 4, 3, 2, "parallel.num_microbatches", ">= 4"),
    ("interleaved_1f1b", 4, 8, 1, "parallel.vpp", "vpp >= 2"),
    ("interleaved_1f1b", 1, 8, 2, "parallel.pp", "pp >= 2"),
    ("interleaved_1f1b", 4, 2, 2, "parallel.num_microbatches", "at least 4"),
    ("interleaved_1f1b", 4, 6, 2, "parallel.num_microbatches", "multiple of pp = 4"),
    ("zb_h1", 4, 3, 1, "parallel.num_microbatches", ">= 4"),
    ("dualpipe", 3, 12, 1, "parallel.pp", "even pp"),
    ("dualpipe", 4, 9, 1, "parallel.num_microbatches", "even number"),
    ("dualpipe", 4, 6, 1, "parallel.num_microbatches", ">= 8"),
    ("1f1b", 4.0, 8, 1, "parallel.pp", "positive integer"),
    ("1f1b", True, 8, 1, "parallel.pp", "positive integer"),
])
def test_validate_schedule_config_names_the_field(name, pp, m, vpp, field, words):
    with pytest.raises(ConfigError) as err:
        validate_schedule_config(name, pp, m, vpp)
    assert err.value.field == field
    assert err.value.value == {"parallel.schedule": name, "parallel.pp": pp, "parallel.vpp": vpp,
                               "parallel.num_microbatches": m}[field]
    assert words in err.value.rule
    if name in SCHEDULES:                       # the generators apply the same rules
        with pytest.raises(ConfigError) as again:
            get_schedule(name)(pp, m, vpp)
        assert again.value.field == field


def test_validate_schedule_config_group_size_and_prefix():
    validate_schedule_config("interleaved_1f1b", 4, 10, 2, microbatch_group_size=5)
    with pytest.raises(ConfigError) as err:
        validate_schedule_config("interleaved_1f1b", 4, 10, 2, microbatch_group_size=3)
    assert err.value.field == "parallel.microbatch_group_size"
    with pytest.raises(ConfigError) as err:
        validate_schedule_config("interleaved_1f1b", 4, 13, 2, microbatch_group_size=5)  # 13 % 5 = 3 < pp
    assert err.value.field == "parallel.num_microbatches" and "must be 0 or >= pp" in err.value.rule
    with pytest.raises(ConfigError) as err:
        validate_schedule_config("1f1b", 4, 8, 1, microbatch_group_size=4)
    assert err.value.field == "parallel.microbatch_group_size"
    with pytest.raises(ConfigError) as err:
        validate_schedule_config("dualpipe", 3, 12, where="scenario.parallel")
    assert err.value.field == "scenario.parallel.pp"


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_minimum_is_accepted(name):
    pp = 4
    vpp = 2 if name in ("interleaved_1f1b", "zb_v") else 1
    m = min_microbatches(name, pp, vpp)
    validate(get_schedule(name)(pp, m, vpp))
    if m > 1:
        with pytest.raises(ConfigError):
            validate_schedule_config(name, pp, m - 1, vpp)


# -- zero-bubble orders against PyTorch pipelining -------------------------------------------

_PYTORCH = json.loads((GOLDEN / "pytorch_zero_bubble_orders.json").read_text())


def _pytorch_cases(table: str):
    for key, rows in sorted(_PYTORCH[table].items()):
        pp, m = (int(x) for x in key[2:].split("_m"))
        yield pytest.param(pp, m, rows, id=key)


@pytest.mark.parametrize("pp, m, rows", [c for c in _pytorch_cases("zb_v") if c.values[1] >= c.values[0]])
def test_zb_v_matches_pytorch_schedule_zbv_zero_bubble(pp, m, rows):
    s = build("zb_v", pp, m)
    assert [" ".join(str(a) for a in stage if a is not None) for stage in s.actions] == rows


@pytest.mark.parametrize("pp, m, rows", list(_pytorch_cases("zb_interleaved_one_stage")))
def test_zb_h1_matches_pytorch_interleaved_zero_bubble_with_one_stage_per_rank(pp, m, rows):
    s = build("zb_h1", pp, m)
    assert [" ".join(str(a) for a in stage if a is not None) for stage in s.actions] == rows


def test_the_oracle_file_covers_the_shapes_that_matter():
    # the V's warm-up differs per stage, so several pp; m below, at and above 2pp - 1
    keys = set(_PYTORCH["zb_v"])
    for pp in (2, 4, 8):
        assert {f"pp{pp}_m{pp}", f"pp{pp}_m{2 * pp - 1}", f"pp{pp}_m{3 * pp + 1}"} <= keys


@pytest.mark.parametrize("pp", [2, 3, 4, 6, 8])
@pytest.mark.parametrize("extra", [0, 1, 5])
def test_bubble_zb_v_equal_costs_is_the_first_forwards_fill(pp, extra):
    m = 2 * pp - 1 + extra
    t = schedule_timing(build("zb_v", pp, m), ActionCosts(1, 1, 1))
    assert t.bubble_time == pp - 1                      # (p-1) T_F per chunk
    # every stage is busy from its first action to its last
    for s in range(pp):
        starts = [x for x, a in zip(t.start[s], build("zb_v", pp, m).actions[s], strict=True) if a is not None]
        ends = [x for x, a in zip(t.end[s], build("zb_v", pp, m).actions[s], strict=True) if a is not None]
        assert max(ends) - min(starts) == 3 * 2 * m      # 2 chunks x (F + B + W) per micro-batch


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_zb_v_halves_zb_h1s_bubble_at_the_same_stage_cost(pp):
    # a ZB-V chunk is half a stage: F = B = W = 1 per chunk is 2 per stage for ZB-H1, whose
    # bubble is then (p-1)(2 + 2 - 2) = 2(p-1): twice ZB-V's (p-1)
    m = 3 * pp
    v = schedule_timing(build("zb_v", pp, m), ActionCosts(1, 1, 1)).bubble_time
    h1 = schedule_timing(build("zb_h1", pp, m), ActionCosts(2, 2, 2)).bubble_time
    assert h1 == 2 * (pp - 1) == 2 * v


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_zb_v_keeps_1f1b_peak_memory(pp):
    # 2pp chunk activation sets of half a stage each = pp stages' worth, 1F1B's stage-0 peak
    assert peak_in_flight(build("zb_v", pp, 3 * pp)) == [2 * pp] * pp
    assert peak_in_flight(build("1f1b", pp, 3 * pp))[0] == pp


def test_zb_v_places_chunks_in_a_v():
    s = build("zb_v", 4, 8)
    assert [(model_chunk(s, st, 0), model_chunk(s, st, 1)) for st in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert route(s, 3) == ((0, 0), (1, 0), (2, 0), (3, 0), (3, 1), (2, 1), (1, 1), (0, 1))
    position = route_position(s)
    assert [position(st, c, 3) for st, c in route(s, 3)] == list(range(8))
    assert s.num_model_chunks == 8
