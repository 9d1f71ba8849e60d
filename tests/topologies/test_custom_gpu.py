"""A GPU given by its specs (``cluster.gpu`` as a mapping), the AMD presets, and ``presets``."""

import json
import subprocess
import sys

import pytest

from simulator.cli import main
from topologies import ConfigError, build_cluster
from topologies.specs import GPU_SPECS, get_gpu_spec
from workloads.costs.compute import GemmModel, num_sms

SPEC = {"name": "accel-x", "peak_tflops": {"bf16": 1200, "fp8": 2400}, "hbm_gb": 128, "hbm_bandwidth": "5 TB/s",
        "scaleup_bandwidth": "100 GB/s", "scaleup_topology": "mesh", "nic": "400 Gb/s", "power_w": 900}


def test_custom_gpu_from_a_mapping_and_its_derived_values():
    g = get_gpu_spec(SPEC)
    assert (g.name, g.generation, g.scaleup_topology) == ("accel-x", "hopper", "mesh")
    assert g.peak_flops == {"bf16": 1200e12, "fp8": 2400e12}
    assert g.hbm_bytes == 128 * 2**30 and g.hbm_bandwidth_bytes_per_s == 5e12
    assert g.nvlink_bandwidth_bytes_per_s == 100e9 and g.nic_bandwidth_bytes_per_s == 50e9 and g.power_w == 900
    # unmeasured GEMM efficiency and SM count: the borrowed generation's (Hopper 0.803 / 0.709, 132 SMs)
    gm = GemmModel.for_gpu(g)
    assert gm.mamf_flops["bf16"] == pytest.approx(1200e12 * 0.803)
    assert gm.mamf_flops["fp8"] == pytest.approx(2400e12 * 0.709)
    assert num_sms(g) == 132
    own = get_gpu_spec({**SPEC, "mamf_tflops": {"bf16": 700}, "sm_count": 240, "generation": "blackwell"})
    assert GemmModel.for_gpu(own).mamf_flops["bf16"] == 700e12 and num_sms(own) == 240


def test_custom_gpu_in_a_cluster_takes_its_scaleup_and_nic():
    c = build_cluster({"gpu": SPEC, "num_nodes": 2})
    assert c.spec.scaleup_topology == "mesh" and c.spec.nic_bandwidth_bytes_per_s == 50e9
    assert c.spec.nvlink_bandwidth_bytes_per_s == 100e9
    assert "accel-x" in c.summary() and "full mesh" in c.summary()
    # the cluster's own NIC wins over the GPU's default
    assert build_cluster({"gpu": SPEC, "nic": "xdr"}).spec.nic_bandwidth_bytes_per_s == 100e9
    sw = build_cluster({"gpu": {**SPEC, "scaleup_topology": "switch", "nvls": True}})
    assert sw.spec.scaleup_topology == "switch" and "nvsw0" in sw.graph


@pytest.mark.parametrize("change, field, rule", [
    ({"hbm": 80}, "cluster.gpu.hbm", "unknown key; did you mean 'hbm_gb'?"),
    ({"peak_tflops": {"bf17": 1}}, "cluster.gpu.peak_tflops.bf17", "unknown dtype"),
    ({"peak_tflops": {"fp8": 1000}}, "cluster.gpu.peak_tflops", "needs a bf16 entry"),
    ({"peak_tflops": {"bf16": -5}}, "cluster.gpu.peak_tflops.bf16", "must be a positive number"),
    ({"hbm_gb": "lots"}, "cluster.gpu.hbm_gb", "must be a positive number"),
    ({"hbm_bandwidth": "fast"}, "cluster.gpu.hbm_bandwidth", "expected bytes/s"),
    ({"scaleup_topology": "torus"}, "cluster.gpu.scaleup_topology", "must be one of switch, mesh"),
    ({"scaleup_domain": 0}, "cluster.gpu.scaleup_domain", "must be a positive integer"),
    ({"nvls": True}, "cluster.gpu.nvls", "needs scaleup_topology: switch"),
    ({"generation": "cdna3"}, "cluster.gpu.generation", "must be one of ampere, hopper, blackwell"),
    ({"mamf_tflops": {"bf16": 2000}}, "cluster.gpu.mamf_tflops.bf16", "must not exceed its peak_tflops"),
    ({"power_w": True}, "cluster.gpu.power_w", "must be a positive number"),
    ({"nic": "fast"}, "cluster.gpu.nic", "expected bytes/s"),
])
def test_custom_gpu_bad_values_name_field_value_and_rule(change, field, rule):
    with pytest.raises(ConfigError) as e:
        build_cluster({"gpu": {**SPEC, **change}})
    assert e.value.field == field and rule in e.value.rule


def test_custom_gpu_missing_required_key():
    spec = {k: v for k, v in SPEC.items() if k != "hbm_bandwidth"}
    with pytest.raises(ConfigError, match=r"cluster.gpu.hbm_bandwidth = None: required"):
        build_cluster({"gpu": spec})


def test_mesh_domain_size_is_bounded():
    with pytest.raises(ConfigError, match="cluster.nvlink_domain_size = 64: a full-mesh"):
        build_cluster({"gpu": {**SPEC, "scaleup_domain": 64}, "num_nodes": 8})


def test_amd_presets():
    for name, gpu, link in (("mi300x", "MI300X", 64e9), ("mi325x", "MI325X", 64e9), ("mi355x", "MI355X", 76.8e9)):
        c = build_cluster(name)
        g = c.gpu
        assert g.name == gpu and g.vendor == "amd" and g.scaleup_topology == "mesh" and not g.nvls
        assert c.num_gpus == 8 and c.spec.nvlink_bandwidth_bytes_per_s == link and c.spec.nic_bandwidth_bytes_per_s == 50e9
        assert c.num_links == 8 * 7 + 2 * 8              # the mesh (per direction) and the GPU-NIC links
    assert GPU_SPECS["MI300X"].peak_flops["bf16"] == 1307.4e12 and GPU_SPECS["MI300X"].hbm_bytes == 192 * 2**30
    assert GPU_SPECS["MI355X"].peak_flops["fp4"] == 10066.3e12 and num_sms(GPU_SPECS["MI300X"]) == 304
    assert get_gpu_spec("mi325x") is GPU_SPECS["MI325X"]


def test_scenario_yaml_with_a_custom_gpu_runs_from_the_cli(tmp_path, capsys):
    cfg = tmp_path / "s.yaml"
    cfg.write_text("model: tiny-dense\ncluster:\n  preset: mi300x\n  gpu:\n"
                   + "".join(f"    {k}: {json.dumps(v)}\n" for k, v in SPEC.items())
                   + "parallel: {tp: 4, pp: 1, dp: 2, global_batch_size: 8, seq_len: 512}\nnum_steps: 1\n")
    assert main(["run", str(cfg), "--json"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["num_gpus"] == 8 and m["step_time_s"] > 0
    assert main(["topo", str(cfg), "--route", "0", "3"]) == 0
    assert "gpu0 -> gpu3  100 GB/s" in capsys.readouterr().out


def test_cli_set_custom_gpu_and_one_line_errors(capsys):
    flow = "{peak_tflops: {bf16: 1000}, hbm_gb: 96, hbm_bandwidth: 4 TB/s, scaleup_bandwidth: 64 GB/s, " \
           "scaleup_topology: mesh}"
    assert main(["topo", "dgx-h100", "--set", f"gpu={flow}"]) == 0
    assert "scale-up full mesh, 64 GB/s per link" in capsys.readouterr().out
    p = subprocess.run([sys.executable, "-m", "simulator.cli", "topo", "mi300x", "--set",
                        "gpu={peak_tflops: {bf16: 1000}, hbm_gb: 96, hbm_bw: 4 TB/s}"], capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0
    assert "cluster.gpu.hbm_bw" in p.stderr and "unknown key" in p.stderr


def test_presets_lists_sizes(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("mi300x"))
    assert line.split()[1:4] == ["8", "MI300X", "192"]
    assert any(ln.split()[:2] == ["h100-16k", "16,384"] for ln in out.splitlines())
    assert any(ln.split()[:4] == ["deepseek-v3", "671", "B", "37.6"] for ln in out.splitlines())
    assert any(ln.split()[:1] == ["MI355X"] and "mesh of 8, 76.8 GB/s per link" in ln for ln in out.splitlines())
    assert main(["presets", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {"cluster": "mi325x", "GPUs": "8", "GPU": "MI325X", "HBM per GPU": "256 GiB", "HBM in all": "2 TiB"} \
        in rows["clusters"]
    assert next(r for r in rows["models"] if r["model"] == "llama3.1-405b")["parameters"] == "406 B"
