"""Results do not move: 73 scenarios reproduce their stored digests bit for bit.

The cases and the digest are defined in :mod:`tests.golden.cases` (every schedule, ZeRO
0-3, CP and EP layouts, skewed / Zipf / trace routing, every host mode and overlap switch,
every what-if, folded and unfolded, free communication, four jobs at real sizes).  A
refactor must keep every digest; a change meant to move results regenerates them with
``python -m tests.golden.cases --write`` and says so in its commit.
"""

from __future__ import annotations

import json

import pytest

from tests.golden.cases import DIGESTS, cases, compute

STORED = json.loads(DIGESTS.read_text())


def test_every_case_has_a_digest_and_there_are_at_least_50():
    assert set(STORED) == set(cases())
    assert len(STORED) >= 50


@pytest.mark.parametrize("name", sorted(cases()))
def test_results_identical_to_the_stored_digest(name):
    got = compute(name)
    want = STORED[name]
    assert got.get("step_time_s") == want.get("step_time_s"), "the step time moved"
    assert got == want, "same step time, but some op's start/end or a metric moved"
