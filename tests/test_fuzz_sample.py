"""Samples of the seeded fuzz driver (experiments/fuzz.py): a quick one in the default suite,
300 draws under the ``fuzz`` marker (``make test-fuzz``, run by CI)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# imported by name from experiments/: the driver's worker processes (spawned, with this
# process's sys.path) import it the same way
sys.path.insert(0, str(ROOT / "experiments"))
import fuzz  # noqa: E402


def _report(tally) -> str:
    return "\n\n".join(f"draw {f['draw']} ({f['family']}): {f['reason']}\n{f['scenario']}" for f in tally.failures)


def test_a_quick_sample_of_draws():
    """30 draws of every family: nothing fails, and the families each produce what they must."""
    tally = fuzz.fuzz(seed=7, draws=30, workers=1, timeout_s=30, quiet=True)
    assert not tally.failures, _report(tally)
    assert tally.counts["ran"] >= 15 and tally.counts["refused"] >= 3 and tally.counts["timeout"] == 0


@pytest.mark.fuzz
def test_300_draws():
    tally = fuzz.fuzz(seed=300, draws=300, workers=2, timeout_s=60, quiet=True)
    assert not tally.failures, _report(tally)
    assert tally.counts["timeout"] == 0, tally.timeouts


def test_draws_are_a_function_of_seed_and_index_only():
    """The same draw in another process, under another hash seed, is the same text: a failure
    can be replayed from its seed and index alone."""
    here = [fuzz.make_draw(5, i) for i in range(12)]
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import fuzz; "
            "print(json.dumps([fuzz.make_draw(5, i).text for i in range(12)]))")
    env = {**os.environ, "PYTHONHASHSEED": "4321", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code, str(ROOT / "experiments")], env=env,
                         capture_output=True, text=True, check=True, timeout=120)
    import json
    assert json.loads(out.stdout) == [d.text for d in here]
    assert {d.family for d in (fuzz.make_draw(5, i) for i in range(200))} == {"valid", "invalid", "oversized"}


def test_a_draw_over_the_time_limit_is_a_timeout_and_the_pool_goes_on():
    """A worker busy past the limit is killed and replaced; the draw is reported as a timeout
    with the limit, not as a failure, and the next draw still runs."""
    tally = fuzz.fuzz(seed=7, draws=2, workers=1, timeout_s=0.05, quiet=True)
    assert tally.counts["timeout"] == 2 and not tally.failures
    assert [t["draw"] for t in tally.timeouts] == ["7:0", "7:1"]


def test_the_classifier_holds_each_family_to_its_contract():
    valid = fuzz.Draw(0, 0, fuzz.VALID, "model: x\n")
    bad = fuzz.Draw(0, 1, fuzz.INVALID, "model: x\n", ("parallel.tp",), note="tp is a string")
    big = fuzz.Draw(0, 2, fuzz.OVERSIZED, "model: x\n", ("parallel",))

    def o(rc, err="", wall=0.01, **kw):
        return {"rc": rc, "stdout": "", "stderr": err, "wall_s": wall, "traceback": None, "invariant": None, **kw}

    one_line = "clustersim: error: parallel.tp = 'two': must be an integer\n"
    assert fuzz.classify(valid, o(0)) == ("ran", "")
    assert fuzz.classify(valid, o(2, one_line))[0] == "failed"                  # a valid draw refused
    assert fuzz.classify(valid, o(1, "clustersim: job stopped at t = 0 s: ...\n"))[0] == "failed"   # may not stop
    assert fuzz.classify(valid, o(0, invariant="invariant 'x' broken"))[0] == "failed"
    assert fuzz.classify(bad, o(2, one_line)) == ("refused", "")
    assert fuzz.classify(bad, o(0))[0] == "failed"                              # an invalid draw accepted
    assert fuzz.classify(bad, o(2, "clustersim: error: parallel.pp = 0: must be >= 1\n"))[0] == "failed"
    assert fuzz.classify(bad, o(2, one_line + "Traceback ...\n"))[0] == "failed"
    too_slow = "clustersim: error: parallel = 'tp=8': tp*cp*dp*pp = 8 must equal the number of GPUs, 16\n"
    assert fuzz.classify(big, o(2, too_slow, wall=0.2)) == ("refused", "")
    assert fuzz.classify(big, o(2, too_slow, wall=3.0))[0] == "failed"


def test_bad_input_draws_are_refused_in_one_line_before_any_work():
    """Files and arguments that are no scenario (binary, a folder, empty, a key twice, a
    batch of 0, a broken --set, an unusable --model-config, unwritable output paths): every
    kind, twice, exit 2 with one line naming the argument, the engine never reached."""
    n = 2 * len(fuzz.BAD_KINDS)
    tally = fuzz.fuzz(seed=7, draws=0, workers=1, timeout_s=30, quiet=True, bad_inputs=n)
    assert not tally.failures, _report(tally)
    assert tally.by_family == {"bad_input": {"refused": n}}


def test_bad_input_draws_leave_the_other_draws_as_they_were():
    """Bad-input draws have their own index space: draw I of seed S is the text it was
    before they existed (this digest was taken from the driver without them; it moved once
    since, when the qwen3-next-80b-a3b preset joined the presets the draws pick from)."""
    import hashlib
    text = "".join(fuzz.make_draw(7, i).text for i in range(30))
    assert hashlib.sha256(text.encode()).hexdigest() == \
        "ffd50d48e55f8126186ffb1807205c26470028f1b4d6243b0425722ce7f65f1e"
    assert fuzz.make_bad_draw(7, 3).ref == "7:b3" and fuzz.make_draw(7, 3).ref == "7:3"
    assert fuzz.make_bad_draw(7, 3).text == fuzz.make_bad_draw(7, 3).text


def test_a_bad_input_that_reaches_the_simulation_fails_even_when_refused():
    d = fuzz.make_bad_draw(0, 0)
    one_line = "clustersim: error: scenario = 'x': the file is empty (expected a mapping of sections)\n"
    o = {"rc": 2, "stdout": "", "stderr": one_line, "wall_s": 0.01, "traceback": None, "invariant": None}
    assert fuzz.classify(d, o) == ("refused", "")
    assert fuzz.classify(d, {**o, "simulated": True})[0] == "failed"
