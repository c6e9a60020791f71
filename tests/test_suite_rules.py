"""The suite's rules hold (tests/conftest.py): a test of the README's command that runs past the
limit fails and names itself, its time and the way out; a test marked long, a fast one, and a
failing one are left as they are."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFTEST = (Path(__file__).with_name("conftest.py")).read_text()

TESTS = """
import subprocess
import sys
import time
import pytest

def busy(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass

@pytest.fixture
def slow_setup():
    busy(0.2)

def test_slow_call():
    busy(0.3)

def test_slow_setup(slow_setup):
    busy(0.2)

def test_slow_child():  # CPU seconds of a process it started and waited for count
    code = "import time; end = time.process_time() + 0.3; all(iter(lambda: time.process_time() < end, False))"
    subprocess.run([sys.executable, "-c", code], check=True)

def test_sleeps():  # the clock, at 3 times the limit, catches a test that only waits
    time.sleep(0.8)

@pytest.mark.long
def test_slow_but_long():
    busy(0.3)

def test_fast():
    pass

def test_fails_on_its_own():
    assert False, "its own failure"
"""


def run(pytester, monkeypatch, limit: str):
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nmarkers =\n    long: the long stage\n")
    pytester.makepyfile(test_timed=TESTS)
    monkeypatch.setenv("RACSIM_FAST_LIMIT_S", limit)
    return pytester.runpytest("-p", "no:cacheprovider")


def test_a_slow_fast_tier_test_fails_naming_itself_and_the_way_out(pytester, monkeypatch):
    res = run(pytester, monkeypatch, "0.25")
    res.assert_outcomes(passed=2, failed=5)
    out = res.stdout.str()
    for name in ("test_slow_call", "test_slow_setup", "test_slow_child", "test_sleeps"):
        assert f"test_timed.py::{name} used " in out, out
    assert "mark it @pytest.mark.long" in out and "RACSIM_FAST_LIMIT_S" in out
    assert "test_slow_but_long used" not in out and "test_fast used" not in out
    assert "its own failure" in out  # a failing test keeps its own report


@pytest.mark.long
def test_the_limit_can_be_raised_or_turned_off(pytester, monkeypatch):
    run(pytester, monkeypatch, "30").assert_outcomes(passed=6, failed=1)
    run(pytester, monkeypatch, "0").assert_outcomes(passed=6, failed=1)


def test_the_readme_says_how_many_tests_its_command_runs(request):
    """README.md's "about N tests" is within a tenth of what its command collects (checked when the
    whole suite runs, as that command runs it; a run of some files collects fewer)."""
    import re

    c = request.config
    if c.args not in ([], ["tests"]) or c.getoption("markexpr") != "not long" or c.getoption("keyword"):
        pytest.skip("the README's count is of its whole command's tests")
    text = " ".join((Path(__file__).parents[1] / "README.md").read_text().split())
    said = int(re.search(r"runs about ([\d,]+) tests", text).group(1).replace(",", ""))
    assert abs(request.session.testscollected - said) <= said / 10, (request.session.testscollected, said)


def test_every_long_first_entry_names_a_long_test():
    """conftest.LONG_FIRST orders the long stage by node id prefixes: each must still name a test of its
    file (a renamed test would silently lose its place)."""
    import ast

    from conftest import LONG_FIRST

    root = Path(__file__).parents[1]
    for prefix in LONG_FIRST:
        path, name = prefix.split("::")
        tree = ast.parse((root / path).read_text())
        tests = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}
        assert name.split("[")[0] in tests, prefix
