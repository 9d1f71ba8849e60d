"""Step-time accuracy regression test on the shared reference sets (marker ``validation``).

Runs ``experiments/validate_all.py``'s sets the way CI can afford them (``make
test-validation``, about 6 minutes on 2 cores with 2 workers): the whole vTrain multi-node set (109 rows),
the deterministic H100 subset ``CI_MAX_GPUS`` (the 20 rows on at most 512 GPUs; the
1,024-2,304-GPU rows are weak-scaling copies of them and take most of the set's time), the
Blackwell rows on at most 64 GPUs (70 of 117; under a minute), vTrain's 1,440
single-host runs (under a minute) and the llm-foundry rows on at most 64 GPUs (189 of 216;
under a minute).
Fails if a row stops being simulated (coverage drops) or the median absolute step-time
error rises more than 1 point above the value reached when the calibration was last
changed (``REACHED``).  Update ``REACHED`` only together with a calibration change, with
the new numbers from ``python experiments/validate_all.py --subset ci``.
"""

from __future__ import annotations


import pytest

from simulator.validation.report import _stats
from tests.experiment_scripts import load_experiment

pytestmark = pytest.mark.validation


REACHED = {
    # set: (rows, simulated rows, median |error| in % reached)
    "vtrain": (109, 109, 4.43),
    # 2.82 % until CP ran as Transformer Engine's p2p ring (24 of the 34 rows use CP 2): the
    # CP time that was exposed (about 35 ms a step) is now hidden behind attention, and the
    # rows already predicted fast moved about 1 point further (docs/accuracy.md)
    "h100": (20, 20, 3.5),
    # Megatron-Bridge runs on 8-64 B200 / GB200 (Llama 3 8B / 70B, Qwen3 MoE, gpt-oss, and since
    # the hybrid Mamba presets the 20 Nemotron 3 Nano / Super rows; 3.5 Lightning has no sourced
    # preset): a guard on the harness's coverage and on the MoE gap it shows, not a target
    # reached.  The Nemotron rows (predicted fast, median -33 %) raised the median from 21.98
    # to 25.82 %; running the recipes' MoE dispatchers (HybridEP) and EP communication overlap
    # as the recipes set them moved it to 28.7 %: the overlap hides all-to-all time, and the
    # MoE rows were already predicted fast (their compute gap is issue-23 work).  33.1 % since
    # three mechanisms read from the frameworks' source were added, each of which removes time
    # from rows already predicted fast: Megatron-Core's partial CUDA-graph scopes (Nemotron 3's
    # attention and Mamba graphed: -33 % to -50 %), the flex dispatchers' tokens sent once per
    # destination rank and domain, on the NVLink tier inside an NVL72 domain, and the MoE overlap
    # with the interleaved schedule's p2p overlap.  The large positive outliers they explain
    # moved (DeepSeek-V3 on 256 B200 +140 % -> +4 %, Qwen3-235B on 256 GB200 +17 % -> +3 %);
    # what the rest lacks is MoE and Mamba compute and host time (docs/accuracy.md).  32.1 %
    # after the Mamba-2 layer measured on an H200 and gpt-oss's unfused element-wise work.
    # 30.6 % since Transformer Engine's per-expert launches cost the eager host (the host-bound
    # Qwen3-30B-A3B micro-batch-1 rows -41 % -> -24 %); the quantised SP gathers and the
    # overlapped backward re-gather leave the median where it is (they move the TP-2 rows of
    # Llama 3 70B NVFP4 and Nemotron 3 Super, both predicted fast, 0.5-4 points further).
    # 28.8 % once those per-expert kernels also pay the GPU's launch gap (MoE rows 0-3.6
    # points slower, dense rows unchanged).  28.4 % once MTP modules run on the last stage
    # (they were counted in the FLOPs and memory but never simulated): the Nemotron 3 Super
    # rows on 64 GB200 move 7 points slower (-50..-53 % to -43..-46 %).
    "blackwell": (70, 69, 28.4),
    # one-host runs, not a target: a regression guard on the host-bound regime (the host
    # cursor with one measured host's costs; see docs/modelling.md, "Host issue", and docs/accuracy.md)
    "vtrain_single": (1440, 1440, 15.53),
    # MosaicML llm-foundry's MPT benchmarks (PyTorch FSDP through Composer) on at most 64 GPUs:
    # a framework clustersim does not model yet (it runs them with Megatron-Core's kernels and
    # overlap rules), so a guard on coverage and the gap, not a target reached: every row
    # simulates since models built from dimensions take the architecture their stated size
    # names (MPT: GELU, learned positions, tied embeddings); predicted fast, worse on H100 and
    # at long sequence (docs/accuracy.md).  11.43 % on the llm_foundry kernel stack (its Triton
    # attention costed as FlashAttention v1, measured): short sequences land, long ones are
    # now predicted slow.  10.65 % once the architecture a row's notes state is taken as given
    # ("learned pos-emb": 155 rows had been built with RoPE, whose parameter count also came
    # within 1 %, and paid its rotary kernel: 0.2-1.9 % slower); the SHARD_GRAD_OP rows read as
    # ZeRO-2 are all on 128-512 GPUs, outside this subset.  Unchanged (10.656 %) once each row
    # takes its Composer MP mode's reduction dtype; the attn_impl: flash runs are all on
    # 128-512 GPUs, outside this subset too.
    "llmfoundry": (189, 189, 10.65),
}
"""Coverage and median absolute step-time error reached (see the module docstring)."""

TOLERANCE_POINTS = 1.0


def _validate_all():
    return load_experiment("validate_all")


@pytest.mark.parametrize("name", list(REACHED))
def test_step_time_accuracy_does_not_regress(name):
    rows, ok, median = REACHED[name]
    results = _validate_all().run_set(name, None, subset="ci", quiet=True, workers=2)     # CI has 2 cores
    s = _stats(results)
    bad = [(r["id"], r["status"]) for r in results if r["status"] != "ok"]
    assert s["rows"] == rows, f"{name}: {s['rows']} rows in the CI subset, expected {rows}"
    assert s["ok"] >= ok, f"{name}: coverage dropped to {s['ok']}/{rows}: {bad}"
    assert s["median"] <= median + TOLERANCE_POINTS, (
        f"{name}: median |step-time error| {s['median']:.2f}% > reached {median:.2f}% + {TOLERANCE_POINTS} point")
    _same_as_committed(name, results)


def _same_as_committed(name: str, results: list[dict]) -> None:
    """The committed prediction tables (experiments/predictions/, which the accuracy figures of
    README.md and docs/accuracy.md are drawn from) are what the code predicts today: every row
    of the subset has the committed status and predicted step (to the table's six significant
    digits, as ``validate`` writes them). After a change
    that moves predictions, `make validate` regenerates them."""
    committed = {r["id"]: r for r in load_experiment("docs_figures").predictions(name)}
    stale = []
    for r in results:
        c = committed.get(str(r["id"]))
        if c is None or c["status"] != r["status"]:
            stale.append((r["id"], r["status"], c and c["status"]))
            continue
        new = r["predicted_step_s"]
        new = f"{new:.6g}" if isinstance(new, float) else str(new)
        if new != c["predicted_step_s"]:
            stale.append((r["id"], new, c["predicted_step_s"]))
    assert not stale, (f"{name}: {len(stale)} rows differ from experiments/predictions/predictions_{name}.csv "
                       f"(run `make validate`): {stale[:5]}")
