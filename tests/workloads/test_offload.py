"""Host offload, FP8 attention, FP4 parameter gathers and the MoE paged stash: each against
its closed form (workloads.offload, workloads.costs.precision)."""

from __future__ import annotations

import dataclasses

import pytest

from topologies import ConfigError, get_gpu_spec
from workloads import ParallelConfig, load_model, memory_estimate
from workloads.costs.precision import FP4_PARAM_GATHER_BYTES_PER_PARAM, get_recipe
from workloads.blocks.moe import MoESpec
from workloads.memory import layer_activation_bytes
from workloads.offload import (CPU_ADAM_BYTES_PER_PARAM, PAGED_STASH_BUFFER_FACTOR, activation_offload_stalls,
                               host_dram_bytes_per_s, host_link_bytes_per_s, optimizer_offload_s)
from workloads.program import build_program

B200, GB200 = get_gpu_spec("B200"), get_gpu_spec("GB200")


def test_host_links_from_the_hardware():
    # PCIe Gen5 x16: 63 GB/s a direction x 0.8; GB200: C2C 450 x 0.8 = 360, capped by half a
    # Grace's 512 GB/s LPDDR5X
    assert host_link_bytes_per_s(B200) == pytest.approx(63e9 * 0.8)
    assert host_link_bytes_per_s(GB200) == pytest.approx(256e9)
    assert host_dram_bytes_per_s(GB200) == pytest.approx(256e9)
    assert host_dram_bytes_per_s(B200) == pytest.approx(76.8e9)


def test_offload_schedule_closed_forms():
    # copies shorter than the layers: nothing exposed
    f, b = activation_offload_stalls([1.0] * 6, [2.0] * 6, [0.9] * 6, 3)
    assert f == [0.0] * 6 and b == [0.0] * 6
    # copies of c > the forward f with L - n = 1 layer kept: the forward of layer k waits for
    # the offload of layer k - 1, which ends (k) c after the start; layer k starts at (k-1)c + f
    L, n, c, fw = 4, 3, 3.0, 1.0
    f, _ = activation_offload_stalls([fw] * L, [fw] * L, [c] * L, n)
    assert f == [0.0, c - fw, c - fw, c - fw]
    # total exposed time grows with the offloaded layers and with slower links
    slow = sum(sum(x) for x in activation_offload_stalls([1.0] * 8, [2.0] * 8, [3.0] * 8, 6))
    fast = sum(sum(x) for x in activation_offload_stalls([1.0] * 8, [2.0] * 8, [1.5] * 8, 6))
    assert slow > fast > 0
    with pytest.raises(ConfigError, match="offload.activations"):
        activation_offload_stalls([1.0] * 4, [1.0] * 4, [1.0] * 4, 4)


def test_cpu_optimizer_step_closed_form():
    n = 2e9
    link, dram = host_link_bytes_per_s(B200), host_dram_bytes_per_s(B200)
    seq = optimizer_offload_s(n, 0.5, B200, False)
    assert seq == pytest.approx(0.5 * n * (8.0 / link + CPU_ADAM_BYTES_PER_PARAM / dram))
    assert optimizer_offload_s(n, 0.5, B200, True) == pytest.approx(0.5 * n * CPU_ADAM_BYTES_PER_PARAM / dram)


def _par(**kw):
    base = dict(tp=1, pp=1, dp=1, micro_batch_size=1, global_batch_size=1, seq_len=2048, recompute="none")
    return ParallelConfig(**{**base, **kw})


def _compute_s(p):
    return sum(op.duration_s for op in p.classes[0].ops if op.kind == "compute")


def test_activation_offload_frees_memory_and_costs_the_exposed_copies():
    m = load_model("llama3-8b")
    L, n = m.num_layers, 8
    e0 = memory_estimate(m, _par())
    e1 = memory_estimate(m, _par(offload_activation_layers=n))
    per_layer = sum(layer_activation_bytes(m, _par(), 0).values())
    assert e0.activations_bytes - e1.activations_bytes == pytest.approx(n * per_layer)
    # on B200's PCIe the copies of a 2k-token layer outlast its compute: the step grows by
    # exactly the stalls of the schedule
    t0, t1 = (_compute_s(build_program(m, p, B200)) for p in (_par(), _par(offload_activation_layers=n)))
    assert t1 > t0
    # GB200's host link is five times faster: less exposed
    g0, g1 = (_compute_s(build_program(m, p, GB200)) for p in (_par(), _par(offload_activation_layers=n)))
    assert g1 - g0 < t1 - t0
    with pytest.raises(ConfigError, match="pipeline"):
        _par(offload_activation_layers=4, pp=2).check_model(m)
    with pytest.raises(ConfigError, match="recompute"):
        _par(offload_activation_layers=4, recompute="selective").check_model(m)
    with pytest.raises(ConfigError, match=f"below the model's {L}"):
        _par(offload_activation_layers=L).check_model(m)


def test_fine_grained_offload_takes_its_modules_terms_off_every_layer():
    m = load_model("llama3-8b")
    e0 = memory_estimate(m, _par())
    e1 = memory_estimate(m, _par(offload_modules=("qkv_linear",)))
    attn_input = layer_activation_bytes(m, _par(), 0)["attn_input"]
    assert e0.activations_bytes - e1.activations_bytes == pytest.approx(m.num_layers * attn_input)
    with pytest.raises(ConfigError, match="attn_proj needs core_attn"):
        _par(offload_modules=("attn_proj",)).check_model(m)
    with pytest.raises(ConfigError, match="offload.modules"):
        _par(offload_modules=("embedding",)).check_model(m)


def test_optimizer_offload_moves_the_state_and_the_step():
    m = load_model("llama3-8b")
    e0, e1 = memory_estimate(m, _par()), memory_estimate(m, _par(optimizer_offload_fraction=1.0))
    assert e1.master_weights_bytes == 0 and e1.optimizer_states_bytes == 0
    assert e1.weights_bytes == e0.weights_bytes

    def opt_s(p):
        return next(op.duration_s for op in build_program(m, p, B200).classes[0].ops if op.name == "optimizer")
    gpu, host = opt_s(_par()), opt_s(_par(optimizer_offload_fraction=1.0))
    params = e0.num_params
    assert host == pytest.approx(optimizer_offload_s(params, 1.0, B200, False), rel=0.02)
    assert host > gpu
    with pytest.raises(ConfigError, match="offload.optimizer"):
        _par(optimizer_offload_fraction=1.5).check_model(m)


def test_fp4_parameter_gather_and_fp8_attention_recipes():
    r = get_recipe("nvfp4", gpu=B200, fp4_param_gather=True)
    assert r.param_gather_bytes_per_param == FP4_PARAM_GATHER_BYTES_PER_PARAM == 0.5 + 1 / 16
    with pytest.raises(ConfigError, match="fp4_param_gather.*NVFP4"):
        get_recipe("mxfp8", gpu=B200, fp4_param_gather=True)
    assert get_recipe("mxfp8", gpu=B200, fp8_attention=True).attention_dtype == "fp8"
    with pytest.raises(ConfigError, match="fp8_attention"):
        get_recipe("bf16", fp8_attention=True)
    with pytest.raises(ConfigError, match="fp8_attention"):
        get_recipe("mxfp8", fp8_attention="yes")


def test_fp4_gathers_move_a_quarter_and_fp8_attention_runs_at_the_fp8_row():
    m = load_model("llama3-8b")
    par = _par(dp=2, global_batch_size=2)
    gathers = {}
    for gather in (False, True):
        p = build_program(m, par, B200, precision=get_recipe("nvfp4", gpu=B200, fp4_param_gather=gather))
        gathers[gather] = sum(op.size_bytes for op in p.classes[0].ops if op.name.startswith("param_gather"))
    assert gathers[True] / gathers[False] == pytest.approx(FP4_PARAM_GATHER_BYTES_PER_PARAM / 2.0)

    def attn(recipe):
        ops = build_program(m, _par(), B200, precision=recipe).classes[0].ops
        return sum(op.duration_s for op in ops if op.name == "attn" and op.phase == "F")
    assert attn(get_recipe("mxfp8", gpu=B200, fp8_attention=True)) < attn(get_recipe("mxfp8", gpu=B200))


def test_paged_stash_sizes_the_expert_activations_by_its_buffer():
    m = load_model("tiny-moe")
    moe = dataclasses.replace(m.moe, token_dispatcher="flex", flex_dispatcher_backend="hybridep",
                              expert_rank_capacity_factor=1.5)
    plain = dataclasses.replace(m, moe=moe)
    stash = dataclasses.replace(m, moe=dataclasses.replace(moe, paged_stash=True))
    par = _par(ep=2, dp=2, global_batch_size=2, seq_len=512)
    a0, a1 = memory_estimate(plain, par).activations, memory_estimate(stash, par).activations
    assert a1["expert_input"] == pytest.approx(PAGED_STASH_BUFFER_FACTOR * a0["expert_input"])
    # the packing copies run on side streams at HBM speed, waited for a layer later
    t0, t1 = (_compute_s(build_program(x, par, B200)) for x in (plain, stash))
    assert t1 >= t0
    with pytest.raises(ConfigError, match="paged_stash.*expert_rank_capacity_factor"):
        MoESpec.from_dict({**m.moe.to_dict(), "paged_stash": True})


def _scenario(**extra):
    from simulator.scenario.load import load_scenario
    return load_scenario({"model": "llama3-8b", "cluster": {"preset": "dgx-b200", "num_nodes": 1},
                          "parallel": {"tp": 1, "pp": 1, "dp": 8, "global_batch_size": 8, "seq_len": 1024,
                                       "recompute": "none"}, **extra})


def test_scenario_offload_section_and_its_errors():
    sc = _scenario(offload={"activations": 4, "optimizer": 0.5, "overlap_optimizer_copies": True})
    assert (sc.parallel.offload_activation_layers, sc.parallel.optimizer_offload_fraction,
            sc.parallel.overlap_optimizer_copies) == (4, 0.5, True)
    assert _scenario(offload={"activations": "all"}).parallel.offload_activation_layers == 31
    assert _scenario(offload={"modules": ["core_attn", "attn_proj"]}).parallel.offload_modules == ("core_attn",
                                                                                                   "attn_proj")
    for off, field, value in (({"activations": -1}, "offload.activations", "-1"),
                              ({"optimizer": 2}, "offload.optimizer", "2"),
                              ({"modules": ["mlp"]}, "offload.modules", "mlp"),
                              ({"overlap_optimizer_copies": 1}, "offload.overlap_optimizer_copies", "1"),
                              ({"everything": True}, "offload", "everything")):
        with pytest.raises(ConfigError) as err:
            _scenario(offload=off)
        assert field in str(err.value) and value in str(err.value)
    with pytest.raises(ConfigError, match="precision_options.fp8_attention"):
        _scenario(precision_options={"fp8_attention": True})


def test_table_cells_naming_offload_map():
    from simulator.validation.mapping import _recompute, _zero, _zero_offload
    assert _recompute("CPU activation offload (20 layers)") == {"recompute": "none", "offload_activation_layers": 20}
    assert _recompute("activation offload") == {"recompute": "none", "offload_activation_layers": "all"}
    assert _recompute("partial, 4 layers") == {"recompute": "full", "recompute_method": "block",
                                               "recompute_num_layers": 4}
    assert _zero("ZeRO-Offload") == 2 and _zero_offload("ZeRO-Offload")[0] == 1.0
    assert _zero("ZeRO-Infinity") == 3 and len(_zero_offload("ZeRO-Infinity")[1]) == 2
    assert _zero("ZeRO-3 + CPU offload") == 3 and _zero_offload("ZeRO-3")[0] == 0.0
