"""``experiments/validate_all.py``'s row filter (``--match``): the rows it keeps and its refusal
of a pattern that is not a regular expression."""

import pytest

from tests.experiment_scripts import load_experiment


def _module():
    return load_experiment("validate_all")


def test_match_keeps_only_the_rows_it_finds(tmp_path, capsys):
    mod = _module()
    rows = mod.run_set("blackwell", None, match="^(236|280)$", quiet=True)
    assert sorted(str(r["id"]) for r in rows) == ["236", "280"]
    assert all("Nemotron_3_Nano" in str(r["model"]) for r in rows)
    assert mod.main(["--set", "blackwell", "--match", "^236$", "--no-plot", "--quiet",
                     "--out-dir", str(tmp_path)]) == 0
    assert (tmp_path / "predictions_blackwell.csv").read_text().count("\n") == 2   # header + 1 row


def test_match_refuses_a_bad_pattern(capsys):
    with pytest.raises(SystemExit) as e:
        _module().main(["--set", "blackwell", "--match", "(", "--no-plot"])
    assert e.value.code == 2 and "--match '('" in capsys.readouterr().err
