"""The fixed set of golden runs (tests/golden.py) gives the result tables recorded
in tests/golden.json, to the last bit of every value, on the CPU profile they pin."""

import json

import golden
import pytest


# One case per run, so that the long stage's workers share them; the paper runs are compared with the
# jobs of tests/test_paper.py's multirun of the same scenarios (golden.SUITE_RUNS), which is run anyway.
@pytest.mark.long  # the golden runs take minutes: the long stage (python -m pytest -q -n auto -m long)
@pytest.mark.parametrize("name", [n for n in golden.RUNS if n not in golden.SUITE_RUNS])
def test_golden_runs_reproduce_the_recorded_tables(name, tmp_path):
    recorded = json.loads(golden.DIGESTS.read_text())
    why = golden.unreachable(recorded)
    if why:
        pytest.skip(why)
    now = {name: golden.digest_run(name, golden.RUNS[name], tmp_path)}
    assert golden.compare({name: recorded["runs"][name]}, now, raw=False) == []


def test_every_golden_run_is_compared_by_a_test():
    assert set(golden.SUITE_RUNS) <= set(golden.RUNS)
    from test_paper import SCENARIOS

    assert [f"paper/{s}" for s in SCENARIOS] == golden.SUITE_RUNS  # the multirun's jobs, in order


def test_canonical_form_tells_apart_the_last_bit():
    import pandas as pd

    a = pd.DataFrame({"x": [0.1 + 0.2]})
    b = pd.DataFrame({"x": [0.3]})
    assert golden.canonical(a) != golden.canonical(b)
    assert golden.canonical(a) == golden.canonical(a.copy())


def test_a_machine_off_the_recorded_profile_is_told_so(monkeypatch):
    recorded = json.loads(golden.DIGESTS.read_text())
    monkeypatch.setattr(golden, "profile", lambda: ["aarch64"])
    assert "not compared" in golden.unreachable(recorded)
    monkeypatch.setattr(golden, "profile", lambda: list(recorded["profile"]))
    assert golden.unreachable(recorded) == ""
