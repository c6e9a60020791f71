"""racsim-bench: a --token-budget the judge cannot take stops the command with one line naming
the key; --capacity's knobs compose and count the capacity run's requests (the benchmarks
themselves are timed by hand, not in CI)."""

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import messages
from racsim.tools.bench import main


@pytest.mark.parametrize("budget", ["0", "-5"])
def test_bad_token_budget_names_the_key(budget, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--gpu-rm", "chunked", "--token-budget", budget, "--quick"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"--token-budget {budget}" in err and "pipeline.channels.judge.rm.token_budget" in err


@pytest.mark.long
def test_capacity_knobs_compose_and_count_what_the_capacity_run_simulates():
    """racsim-bench --capacity: every knob's overrides compose a valid config (a README command
    renamed or refused would fail here), and its request count is the capacity run's for one
    count: trials x steps x batch x sequences, twice with a blocking corrector."""
    from racsim.analyses.capacity import requests_per_schedule
    from racsim.tools.bench import CAPACITY_KNOBS, bench_capacity
    from racsim.config.defaults import compose_config
    from racsim.config.spec import scenario
    from racsim.config.validate import validate
    from racsim.learner.correctors import BLOCKING

    for label, overrides in CAPACITY_KNOBS.items():
        validate(compose_config(*overrides))
    overrides = CAPACITY_KNOBS["verifier, worker failures"]
    t0 = time.perf_counter()
    f = bench_capacity([*overrides, "pipeline.steps=6"], trials=2)
    took = time.perf_counter() - t0
    cfg = scenario(compose_config(*overrides, "pipeline.steps=6", "learner.trials=2"))
    blocking = any(n in BLOCKING for n in cfg.corrector.names)
    assert f["requests"] == requests_per_schedule(cfg) * (2 if blocking else 1) == 2 * 6 * cfg.pipeline.batch_size * (
        1 + blocking)
    assert f["lanes_requests_per_s"] == pytest.approx(f["requests"] / f["lanes_s"])
    # the lanes time is the schedules' alone: inside the call, apart from the SimPy baselines it also times
    assert 0 < f["lanes_s"] < took - f["raw_simpy_sample"] / f["raw_simpy_requests_per_s"]
    counts = sorted(set(cfg.capacity.counts))
    assert f["count"] == counts[len(counts) // 2]


@pytest.mark.long  # 3 CPU s
def test_scale_grows_the_judge_batch_and_count_together(capsys):
    """racsim-bench --scale: scale k simulates k times the sequences on k times the GPUs (the count
    is 5 k, the requests k times scale 1's), a table row per scale."""
    from racsim.tools.bench import bench_capacity_scale

    f = bench_capacity_scale((1, 3), trials=2)
    assert (f["scale_1_count"], f["scale_3_count"]) == (5.0, 15.0)
    assert f["scale_3_requests"] == 3 * f["scale_1_requests"] > 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [r[0] for r in rows] == ["1", "3"] and rows[1][1] == f"{3 * 32 * 32:,}"


@pytest.mark.long  # 3 CPU s
def test_workers_bench_times_the_same_search_both_ways(capsys):
    """racsim-bench --workers: the same search one count at a time and in a pool of two, the same
    answer both ways, the ratio the two times'; a row per scenario."""
    from racsim.tools.bench import bench_capacity_workers

    f = bench_capacity_workers(("scenario=capacity/human_review",), repeat=1, workers=2)
    assert f["workers_human_review_ratio"] == f["workers_human_review_one_s"] / f["workers_human_review_pool_s"]
    row = capsys.readouterr().out.splitlines()[1].split()
    assert row[0] == "human_review" and row[1].isdigit()  # one answer both ways (two would read 6/7)


def _int_at_least_2(text: str) -> bool:
    try:
        return int(text) >= 2
    except ValueError:
        return False


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bad=st.one_of(st.integers(max_value=1), st.text(max_size=6).filter(lambda t: not _int_at_least_2(t))))
@pytest.mark.long
def test_capacity_trials_refused_unless_an_integer_of_two_or_more(bad, capsys):
    """racsim-bench --capacity --trials: generated bad values stop it with one line, before any run."""
    with pytest.raises(SystemExit) as e:
        main(["--capacity", "--trials", str(bad)])
    assert e.value.code == 2
    err = messages(capsys.readouterr().err)
    assert "--trials" in err[-1]


@pytest.mark.long  # 3 CPU s: the size for a few steps
def test_generation_bench_times_the_fast_engine_against_simpy():
    """racsim-bench --generation: the lane's seconds, samples and events a second against raw SimPy's and the
    SimPy engine of record's, and the regime, at the issue's size (64 engines x 256, 16 groups x 64)."""
    from racsim.tools.bench import ENGINE_BOUND, bench_generation

    f = bench_generation(steps=3, simpy_steps=2)
    assert f["generation_samples"] >= 3 * 1024 and f["generation_events"] > 0
    assert f["generation_speedup_vs_raw_simpy"] == pytest.approx(
        f["generation_samples_per_cpu_s"] / f["generation_raw_simpy_requests_per_cpu_s"], rel=1e-12)
    assert f["generation_speedup_vs_simpy_engine"] == pytest.approx(
        f["generation_events_per_cpu_s"] / f["generation_simpy_engine_events_per_cpu_s"], rel=1e-12)
    assert f["generation_load_1min"] >= 0 and f["generation_samples_per_cpu_s"] * f["generation_cpu_s"] == \
        pytest.approx(f["generation_samples"], rel=1e-12)
    assert sum(v for k, v in f.items() if "_binds_" in k) == 1.0
    g = bench_generation(steps=3, simpy_steps=2, overrides=ENGINE_BOUND, tag="bound")
    assert g["bound_engines_idle"] < f["generation_engines_idle"]
