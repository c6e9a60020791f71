"""The suite's own rules, kept by the suite (issue 42).

The README's test command (``python -m pytest -q -n auto``; pyproject.toml's addopts leave out
the tests marked ``long``) is a newcomer's front door and every change's feedback loop, so it
stays fast: a test it runs whose setup and call together use more than :data:`FAST_LIMIT_S`
CPU seconds (its own process's and those of the processes it started and waited for), or wait
more than :data:`WALL_FACTOR` times that on the clock, fails, naming itself and its seconds, and
asks to be made smaller or marked ``long``. CPU seconds, not the clock, so that a loaded machine
(a 3 s test takes 10 s beside other work) does not fail a test that is fast; the clock catches a
test that sleeps or waits. ``RACSIM_FAST_LIMIT_S`` sets another limit (``0`` turns the rule off,
e.g. under a profiler).
"""

from __future__ import annotations

import os
import time

import pytest

from racsim.io import cpu_seconds

pytest_plugins = ["pytester"]

FAST_LIMIT_S = 20.0
WALL_FACTOR = 3.0


def fast_limit() -> float:
    """CPU seconds a test of the README's command may use: ``RACSIM_FAST_LIMIT_S``, else :data:`FAST_LIMIT_S`."""
    return float(os.environ.get("RACSIM_FAST_LIMIT_S", FAST_LIMIT_S))


def too_slow_text(nodeid: str, cpu: float, wall: float, limit: float) -> str:
    return (f"{nodeid} used {cpu:.1f} CPU s in {wall:.1f} s, over the README test command's {limit:g} CPU s "
            f"(or {WALL_FACTOR * limit:g} s waited) for one test: make it smaller (fewer trials or steps, a shared "
            f"fixture, in-process instead of a subprocess) or mark it @pytest.mark.long (the long stage; "
            f"RACSIM_FAST_LIMIT_S sets the limit)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    item.stash[_START] = (cpu_seconds(), time.perf_counter())
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield
    start = item.stash.get(_START, None)
    if start is not None:
        item.stash[_USED] = (cpu_seconds() - start[0], time.perf_counter() - start[1])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    limit = item.config.stash[_LIMIT_S]
    if call.when != "call" or not report.passed or limit <= 0 or item.get_closest_marker("long"):
        return
    cpu, wall = item.stash.get(_USED, (0.0, 0.0))
    if cpu > limit or wall > WALL_FACTOR * limit:
        report.outcome = "failed"
        report.longrepr = too_slow_text(item.nodeid, cpu, wall, limit)


# The long stage's heaviest tests, by node id prefix, with their seconds in CI (2 cores, 2 workers): started
# first, heaviest first, so that neither worker sits idle at the end while the other runs one of them. Only
# the order changes; a test not listed runs after these in collection order. One of the paper suite's two
# tests only: both wait on its one multirun (tests/test_paper.py), and two at once would idle a worker.
LONG_FIRST = {
    "tests/test_sweep.py::test_every_launcher_gathers_the_same_bytes_and_names_the_same_failures[ray]": 73,
    "tests/test_fuzz_generated.py::test_every_numeric_field_at_its_bounds": 46,
    "tests/test_capacity_regime.py::test_the_bias_interval_covers_the_long_run_under_slow_regimes": 40,
    "tests/test_capacity_regime.py::test_the_answer_at_20_seeds_is_the_documented_one": 36,
    "tests/test_paper.py::test_paper_jobs_reproduce_the_golden_tables": 34,
    "tests/test_sweep.py::test_a_killed_worker_loses_no_job[submitit_local]": 30,
    "tests/test_docs.py::test_every_documented_command_runs[lm.md": 24,
    "tests/test_sweep.py::test_every_launcher_gathers_the_same_bytes_and_names_the_same_failures[submitit": 22,
    "tests/test_sweep_generated.py::test_generated_sweeps_under_joblib": 19,
}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test starts with the SIGINT and SIGTERM handlers the worker had. Once in several runs of the suite a
    test found SIGINT ignored, left so by an earlier test of the same worker (not yet found: a run that
    recorded every test's SIGINT disposition did not reproduce it); test_pools asserts the disposition."""
    import signal

    saved = [(s, signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM)]
    yield
    for signum, handler in saved:
        if handler is not None and signal.getsignal(signum) is not handler:
            signal.signal(signum, handler)


def long_weight(nodeid: str) -> int:
    return max((s for prefix, s in LONG_FIRST.items() if nodeid.startswith(prefix)), default=0)


def pytest_collection_modifyitems(config, items):
    if config.getoption("markexpr") == "long":  # the long stage: its heaviest tests first (a stable sort)
        items.sort(key=lambda item: -long_weight(item.nodeid))


def pytest_configure(config):
    config.stash[_LIMIT_S] = fast_limit()  # read once: a test that sets the variable changes no limit


_START = pytest.StashKey[tuple]()
_USED = pytest.StashKey[tuple]()
_LIMIT_S = pytest.StashKey[float]()
