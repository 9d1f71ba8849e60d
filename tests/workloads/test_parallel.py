"""ParallelConfig: degree forms, one test per validation rule, pipeline splits."""

from types import SimpleNamespace

import pytest

from topologies import ConfigError
from workloads.parallel import ParallelConfig, parse_pipeline_layout, split_layers


def model(**kw):
    """A stand-in with the ModelSpec attributes the checks read."""
    base = dict(num_attention_heads=64, num_kv_heads=8, moe=None, seq_len=8192, num_layers=80, mtp_layers=0)
    base.update(kw)
    return SimpleNamespace(**base)


MOE = SimpleNamespace(num_experts=64)


def test_five_degree_shorthand_carves_ep_from_dp():
    cfg = ParallelConfig.from_dict({"dp": 2, "tp": 2, "pp": 4, "cp": 1, "ep": 4})
    assert (cfg.dp, cfg.expert_tp, cfg.ep, cfg.expert_dp) == (8, 2, 4, 2)
    assert cfg.world_size == 64 == 2 * 2 * 4 * 1 * 4


def test_folded_form_derives_edp():
    cfg = ParallelConfig.from_dict({"tp": 2, "dp": 8, "pp": 4, "ep": 4, "etp": 1})
    assert (cfg.dp, cfg.expert_tp, cfg.ep, cfg.expert_dp, cfg.world_size) == (8, 1, 4, 4, 64)


def test_megatron_form_dp_includes_ep():
    cfg = ParallelConfig.from_megatron(tp=2, pp=4, ep=4, world_size=64)
    assert (cfg.dp, cfg.expert_tp, cfg.ep, cfg.expert_dp) == (8, 2, 4, 2)
    same = ParallelConfig.from_dict({"dp": 2, "tp": 2, "pp": 4, "ep": 4})
    assert (same.dp, same.expert_tp, same.expert_dp) == (cfg.dp, cfg.expert_tp, cfg.expert_dp)


def test_dp_minus_one_is_the_rest_and_world_size_must_match():
    cfg = ParallelConfig.from_dict({"tp": 8, "pp": 4, "dp": -1, "global_batch_size": 0})
    assert cfg.resolve(256).dp == 8
    with pytest.raises(ConfigError) as e:
        ParallelConfig(tp=8, pp=4, dp=2).resolve(256)
    assert e.value.field == "parallel" and "256" in e.value.rule


@pytest.mark.parametrize("cfg, mdl, field", [
    (dict(tp=3), model(), "parallel.tp"),                                   # heads 64 not divisible by 3
    (dict(tp=16), model(num_kv_heads=12, num_attention_heads=96), "parallel.tp"),  # kv heads 12 vs tp 16
    (dict(ep=3, etp=1, dp=3), model(moe=MOE), "parallel.ep"),               # 64 experts, ep 3
    (dict(ep=2, etp=1, dp=2), model(), "parallel.ep"),                      # EP without experts
    (dict(cp=4), model(seq_len=8196), "parallel.seq_len"),                  # 8196 not divisible by 2 cp = 8
    (dict(pp=3), model(), "parallel.pp"),                                   # 80 layers over 3 stages
])
def test_model_rules(cfg, mdl, field):
    with pytest.raises(ConfigError) as e:
        ParallelConfig.from_dict(cfg).check_model(mdl)
    assert e.value.field == field


def test_layer_split_error_names_the_knobs():
    with pytest.raises(ConfigError, match="num_layers_in_first_pipeline_stage.*pipeline_layout"):
        split_layers(126, ParallelConfig(pp=16))


@pytest.mark.parametrize("d, field", [
    ({"tp": 2, "dp": 4, "micro_batch_size": 2, "global_batch_size": 12}, "parallel.global_batch_size"),
    ({"dp": 4, "ep": 3, "etp": 1, "edp": 1}, "parallel.edp"),
    ({"tp": 0}, "parallel.tp"),
    ({"schedule": "zigzag"}, "parallel.schedule"),
    ({"recompute": "some"}, "parallel.recompute"),
    ({"recompute_modules": ["attention"]}, "parallel.recompute_modules"),
    ({"mesh_order": "tp-dp-pp"}, "parallel.mesh_order"),
    ({"zero_stage": 4}, "parallel.zero_stage"),
    ({"tensor_parallel": 2}, "parallel.tensor_parallel"),
    ({"tp": "2"}, "parallel.tp"),
    ({"sequence_parallel": "yes"}, "parallel.sequence_parallel"),
])
def test_config_rules(d, field):
    with pytest.raises(ConfigError) as e:
        ParallelConfig.from_dict(d)
    assert e.value.field == field


def test_microbatches_derived():
    cfg = ParallelConfig.from_dict({"tp": 8, "dp": 4, "micro_batch_size": 2, "global_batch_size": 64})
    assert cfg.num_microbatches == 8


def test_pipeline_splits():
    assert split_layers(80, ParallelConfig(pp=4)) == [[20], [20], [20], [20]]
    assert split_layers(80, ParallelConfig(pp=4, vpp=5, schedule="interleaved_1f1b")) == [[4] * 5] * 4
    # Llama-3.1 405B's 126 layers over 16 stages (NVIDIA recipe style: lighter edge stages)
    cfg = ParallelConfig(pp=16, num_layers_in_first_pipeline_stage=7, num_layers_in_last_pipeline_stage=7)
    assert split_layers(126, cfg) == [[7]] + [[8]] * 14 + [[7]]
    # embedding and loss counted as one layer each: 30 layers + 2 over 4 stages of 8 slots
    cfg = ParallelConfig(pp=4, account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
    assert split_layers(30, cfg) == [[7], [8], [8], [7]]
    cfg = ParallelConfig(pp=2, vpp=2, schedule="interleaved_1f1b", pipeline_layout="Et|(tt|)*2,tL")
    assert parse_pipeline_layout(cfg.pipeline_layout) == [["E", "t"], ["t", "t"], ["t", "t"], ["t", "L"]]
    assert split_layers(6, cfg) == [[1, 2], [2, 1]]          # virtual stage k = chunk k // pp of stage k % pp
    with pytest.raises(ConfigError, match="places 6 transformer layers"):
        split_layers(7, cfg)


@pytest.mark.parametrize("d, field", [
    ({"pp": 4, "dp": 1, "global_batch_size": 2, "schedule": "interleaved_1f1b", "vpp": 2}, "parallel.num_microbatches"),
    ({"pp": 4, "dp": 1, "global_batch_size": 6, "schedule": "dualpipe"}, "parallel.num_microbatches"),
    ({"pp": 4, "dp": 1, "global_batch_size": 8, "schedule": "1f1b", "vpp": 2}, "parallel.vpp"),
])
def test_schedule_rules_through_the_config(d, field):
    with pytest.raises(ConfigError) as e:
        ParallelConfig.from_dict(d).check_schedule()
    assert e.value.field == field


def test_a_moe_layout_that_misses_the_gpu_count_says_which_form_it_read():
    five = ParallelConfig.from_dict({"tp": 2, "pp": 2, "dp": 8, "ep": 8})
    with pytest.raises(ConfigError) as err:
        five.resolve(32)
    rule = err.value.rule
    assert "five-degree form" in rule and "dense dp = dp x ep = 64" in rule
    assert "write dp: 1 with ep: 8" in rule and "folded form dp: 8, ep: 8, etp: 2" in rule
    folded = ParallelConfig.from_dict({"tp": 2, "pp": 2, "dp": 4, "ep": 8, "etp": 1})
    with pytest.raises(ConfigError) as err:
        folded.resolve(32)
    rule = err.value.rule
    assert "folded form (dp = 4 is the dense degree" in rule and "write dp: 8" in rule
    assert "five-degree form dp: 1, ep: 8" in rule
    # each suggestion resolves
    ParallelConfig.from_dict({"tp": 2, "pp": 2, "dp": 1, "ep": 8}).resolve(32)
    ParallelConfig.from_dict({"tp": 2, "pp": 2, "dp": 8, "ep": 8, "etp": 2}).resolve(32)
    ParallelConfig.from_dict({"tp": 2, "pp": 2, "dp": 8, "ep": 8, "etp": 1}).resolve(32)
    # the marker is not a key users can write
    with pytest.raises(ConfigError, match="unknown key"):
        ParallelConfig.from_dict({"degree_form": "folded"})


@pytest.mark.parametrize("key", ["tp", "etp", "zero_stage", "global_batch_size", "vpp"])
def test_a_null_degree_is_refused_naming_the_field(key):
    """YAML's null for a field whose default is a number is an error naming the field, not a
    TypeError from the range checks (found by experiments/fuzz.py); a null where the
    default is None (seq_len) still means "not given"."""
    with pytest.raises(ConfigError, match=rf"parallel\.{key} = None: must be an integer"):
        ParallelConfig.from_dict({"tp": 1, key: None})
    assert ParallelConfig.from_dict({"seq_len": None}).seq_len is None


def test_a_mesh_order_that_splits_pipeline_stages_between_the_meshes_is_refused():
    """ep-pp-dp-tp-cp puts EP inside PP for the experts but nothing for the dense layers, so
    an expert-parallel group would span pipeline stages; it used to reach the program
    builder and fail there naming no field (found by experiments/fuzz.py)."""
    moe = SimpleNamespace(num_attention_heads=8, num_kv_heads=8, mamba=None, mla=None, seq_len=512,
                          moe=SimpleNamespace(num_experts=8), num_layers=4, mtp_layers=0)
    bad = ParallelConfig.from_dict({"tp": 2, "pp": 2, "dp": 4, "ep": 4, "etp": 1, "mesh_order": "ep-pp-dp-tp-cp"})
    with pytest.raises(ConfigError, match=r"parallel\.mesh_order = 'ep-pp-dp-tp-cp': the axes inside pp \(ep\) "
                                          r"span 1 ranks of the dense layers but 4"):
        bad.check_model(moe)
    for order in ("pp-ep-tp-dp-cp", "dp-ep-tp-cp-pp", "tp-cp-ep-dp-pp"):
        ParallelConfig.from_dict({"tp": 2, "pp": 2, "dp": 4, "ep": 4, "etp": 1, "mesh_order": order}).check_model(moe)
    dense = SimpleNamespace(**{**vars(moe), "moe": None})
    bad_for_moe = ParallelConfig.from_dict({"tp": 2, "pp": 2, "dp": 4, "mesh_order": "ep-pp-dp-tp-cp"})
    bad_for_moe.check_model(dense)          # no expert mesh: any order
