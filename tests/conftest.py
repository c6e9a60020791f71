"""The suite's own rules, kept by the suite (issue 42).

The README's test command (``python -m pytest -q -n auto``; pyproject.toml's addopts leave out
the tests marked ``long``) is a newcomer's front door and every change's feedback loop, so it
stays fast: a test it runs that takes longer than :data:`FAST_LIMIT_S` seconds (its setup and
call together) fails, naming itself and its time, and asks to be made smaller or marked ``long``.
The limit is generous (a loaded 2-core machine runs a 3 s test in 10 s) so that it does not
flake; ``RACSIM_FAST_LIMIT_S`` sets another (``0`` turns the rule off, e.g. under a profiler).
"""

from __future__ import annotations

import os

import pytest

pytest_plugins = ["pytester"]

FAST_LIMIT_S = 20.0


def fast_limit() -> float:
    """Seconds a test of the README's command may take: ``RACSIM_FAST_LIMIT_S``, else :data:`FAST_LIMIT_S`."""
    return float(os.environ.get("RACSIM_FAST_LIMIT_S", FAST_LIMIT_S))


def too_slow_text(nodeid: str, seconds: float, limit: float) -> str:
    return (f"{nodeid} took {seconds:.1f} s, over the README test command's {limit:g} s for one test: "
            f"make it smaller (fewer trials or steps, a shared fixture, in-process instead of a subprocess) "
            f"or mark it @pytest.mark.long (the long stage; RACSIM_FAST_LIMIT_S sets the limit)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    limit = item.config.stash[_LIMIT_S]
    if call.when == "setup":
        item.stash[_SETUP_S] = call.duration
        return
    if call.when != "call" or not report.passed or limit <= 0 or item.get_closest_marker("long"):
        return
    seconds = item.stash.get(_SETUP_S, 0.0) + call.duration
    if seconds > limit:
        report.outcome = "failed"
        report.longrepr = too_slow_text(item.nodeid, seconds, limit)


def pytest_configure(config):
    config.stash[_LIMIT_S] = fast_limit()  # read once: a test that sets the variable changes no limit


_SETUP_S = pytest.StashKey[float]()
_LIMIT_S = pytest.StashKey[float]()
