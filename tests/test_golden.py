"""The fixed set of golden runs (tests/golden.py) gives the result tables recorded
in tests/golden.json, to the last bit of every value, on the CPU profile they pin."""

import json

import golden
import pytest


@pytest.fixture(scope="module")
def now():
    why = golden.unreachable(json.loads(golden.DIGESTS.read_text()))
    if why:
        pytest.skip(why)
    return golden.digest_all(workers=1)


@pytest.mark.long  # the golden runs take minutes: the long stage (python -m pytest -q -n auto -m long)
def test_golden_runs_reproduce_the_recorded_tables(now):
    recorded = json.loads(golden.DIGESTS.read_text())["runs"]
    assert golden.compare(recorded, now, raw=False) == []


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
