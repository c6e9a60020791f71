"""A pool of GPUs split between the rollout engines, the trainer and the judge (racsim/analyses/capacity/split.py,
issue 46 point 4): the answer against an exhaustive evaluation written apart on a tiny pool (every split simulated,
its steps per hour, mean lag and judge load with their intervals by hand, the best split that meets the targets),
the deciding replications on a split whose interval straddles its cap, the answer line and files through the
command line, and a line naming the key for each bad value of the new keys."""

from __future__ import annotations

import copy
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from helpers import main_in_process, messages
from test_generation_run import changed
from racsim.analyses.bias_study import run_bias_study
from racsim.analyses.capacity import split as S
from racsim.analyses.grid import expand
from racsim.config.defaults import compose_config
from racsim.config.spec import scenario
from racsim.config.validate import validate
from racsim.errors import ConfigError
from racsim.generation.schedule import async_schedules
from racsim.pipeline import steady
from racsim.pipeline.stats import channel_stats, queue_workers
from racsim.seeds import rng_for

N, PER_GPU, WARMUP, LAG_CAP = 5, 4, 8, 1.5
TINY = ["scenario=async/areal", "pipeline.steps=32", f"pipeline.warmup_steps={WARMUP}", "pipeline.batch_size=16",
        "pipeline.generation.engines.concurrency=8", "pipeline.generation.engines.response_tokens.mean=256",
        "pipeline.generation.engines.max_response_tokens=1024", "pipeline.generation.admission.eta=2",
        "pipeline.channels.judge.latency.mean=1.0", "learner.trials=3", "learner.bootstrap=0",
        "learner.train.enabled=false", "output.plots=false", "output.progress=false", "corrector.names=[naive,rac]",
        "capacity.enabled=true", "capacity.run_length=fixed", f"capacity.split.gpus={N}",
        f"capacity.split.workers_per_gpu={PER_GPU}", "capacity.resamples=50", "capacity.max_bias_vs_naive=0.5",
        f"capacity.split.max_mean_lag={LAG_CAP}"]


@pytest.fixture(scope="module")
def spec():
    """The AReaL-like scenario on a pool of 5 GPUs (3 trials of 32 steps, a queue judge of 4 workers a GPU)."""
    return scenario(compose_config(*TINY, "capacity.decide_steps=0"))


@pytest.fixture(scope="module")
def answer(spec):
    """Its pool split without replications."""
    return S.run_split(spec)


def t_interval(values):
    """(mean, lo, hi): Student's t 95% interval of the mean of independent values, lo at least 0."""
    x = np.asarray(values, dtype=float)
    half = stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return x.mean(), max(0.0, x.mean() - half), x.mean() + half


def by_hand(cfg, e: int, t: int, j: int) -> dict:
    """One split simulated and read apart from the search: the trainer's seconds per step and mean lag per trial
    over the window (Student's t over the trials), the judge's load (a queue channel: batch x its law's mean per
    second of the mean step, over its workers), its dropped share, the steady verdict on the step seconds and
    lags, and rac's bias against naive's (the bias study on the split's spec)."""
    c = copy.deepcopy(cfg)
    c.capacity.enabled = False
    c.pipeline.generation.engines.gpus, c.pipeline.generation.trainer.gpus = e, t
    c.pipeline.channels["judge"].workers = j * PER_GPU
    sched = async_schedules(c.pipeline, 3, rng_for(c.seed, "pipeline"), blocking=False, engine="lanes")["async"]
    s = sched.generation.step_start
    per_step = (s[:, -1] - s[:, WARMUP]) / (s.shape[1] - 1 - WARMUP)
    step, step_lo, step_hi = t_interval(per_step)
    lag, lag_lo, lag_hi = t_interval(sched.generation.mean_lag[:, WARMUP:].mean(axis=(1, 2)))
    load = c.pipeline.batch_size * c.pipeline.channels["judge"].latency.mean / step / (j * PER_GPU)
    ch = channel_stats(sched, queue_workers(c.pipeline.channels), WARMUP).iloc[0]
    series = [np.diff(sched.step_start, axis=1), sched.generation.mean_lag.mean(axis=2),
              steady.in_system(sched, 0)]
    stationary = all(steady.verdict(x, WARMUP).stationary for x in series)
    res = run_bias_study(expand(c)).results.set_index("corrector")
    ratio = res.loc["rac", "bias_exact"] / res.loc["naive", "bias_exact"]
    ok = stationary and load < 0.95 and lag_hi <= LAG_CAP and ch.dropped == 0 and ratio < 0.4
    return {"steps_per_hour": 3600 / step, "steps_per_hour_lo": 3600 / step_hi, "steps_per_hour_hi": 3600 / step_lo,
            "mean_lag": lag, "mean_lag_lo": lag_lo, "mean_lag_hi": lag_hi, "load": load, "ok": ok}


@pytest.mark.long
def test_the_answer_is_the_exhaustive_evaluations(spec, answer):
    res = answer
    hand = {(e, t, N - e - t): by_hand(spec, e, t, N - e - t) for e in range(1, N) for t in range(1, N - e)}
    assert sorted((r.engines, r.trainer, r.judge) for r in res.table.itertuples()) == sorted(hand)
    for r in res.table.itertuples():
        h = hand[(r.engines, r.trainer, r.judge)]
        for k in ("steps_per_hour", "steps_per_hour_lo", "steps_per_hour_hi", "mean_lag", "mean_lag_lo",
                  "mean_lag_hi", "load"):
            assert getattr(r, k) == pytest.approx(h[k], rel=1e-9), (r, k)
        assert (r.fails in ("", "(bias not read)")) == h["ok"], r
    feasible = [k for k, h in hand.items() if h["ok"]]
    # the branches this case reaches: an overloaded judge, the lag cap, and splits that meet everything
    assert 0 < len(feasible) < len(hand) and (res.table.fails == "load").any()
    assert res.table.fails.str.contains("max_mean_lag").any()
    top = max(feasible, key=lambda k: (hand[k]["steps_per_hour"], -hand[k]["mean_lag"]))
    tied = [k for k in feasible if hand[k]["steps_per_hour_hi"] >= hand[top]["steps_per_hour_lo"]]
    best = min(tied, key=lambda k: (hand[k]["mean_lag"], k[0], k[2]))  # throughput ties: the smaller lag
    assert (res.recommended.engines, res.recommended.trainer, res.recommended.judge) == best
    rest = [k for k in feasible if k != best]
    if rest:
        second = max(rest, key=lambda k: (hand[k]["steps_per_hour"], -hand[k]["mean_lag"]))
        assert (res.runner_up.engines, res.runner_up.trainer, res.runner_up.judge) == second
    assert res.status == "recommended" and res.best is not None and res.replicated_steps == 0


def test_a_straddling_split_above_the_answer_is_replicated(answer):
    """The 2/1/2 split fails the lag cap only by its interval's upper end; with a budget it is replicated on
    independent streams until its interval lies on one side (or the budget ends, and a note says so), and the
    answer reads the replicated figures."""
    base = answer.table.set_index(["engines", "trainer", "judge"])
    row = base.loc[(2, 1, 2)]
    assert row.mean_lag_lo <= LAG_CAP < row.mean_lag_hi and row.fails == "max_mean_lag"  # straddles
    res = S.run_split(scenario(compose_config(*TINY, "capacity.decide_steps=320")))
    again = res.table.set_index(["engines", "trainer", "judge"]).loc[(2, 1, 2)]
    assert again.replications >= 2 and res.replicated_steps == 32 * (again.replications - 1)
    decided = not (again.mean_lag_lo <= LAG_CAP < again.mean_lag_hi)
    assert decided or any("2 engines, 1 trainer, 2 judge may meet" in n for n in res.notes)
    if decided and again.mean_lag_hi <= LAG_CAP:
        assert (res.recommended.engines, res.recommended.judge) == (2, 2)
    elif not decided:
        assert (res.recommended.engines, res.recommended.judge) != (2, 2)  # the safe side


def test_the_command_prints_one_answer_line_and_writes_the_table(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = main_in_process(monkeypatch, capsys, [*TINY, "capacity.decide_steps=0", "hydra.run.dir=run"])
    assert code == 0, err
    assert all(len(ln) <= 120 for ln in out.splitlines())
    flat = " ".join(out.split())
    assert f"{N} GPUs split between engines, trainer and judge, 6 splits" in flat
    answer = flat[flat.index(f"{N} GPUs: "):]
    assert "engines," in answer and "steps/h [" in answer and "at mean lag" in answer
    for name in ("split.csv", "split.parquet", "results.csv", "generation.csv", "summary.md", "done.json"):
        assert (tmp_path / "run" / name).is_file(), name
    assert "## Every split tried" in (tmp_path / "run" / "summary.md").read_text()
    # the answer's run gathers as a run's (racsim-report, a sweep of splits): its results, one row per corrector
    from racsim.sweep.gather import job_table

    rows = job_table(tmp_path / "run")
    results = pd.read_csv(tmp_path / "run" / "results.csv")
    assert list(rows.corrector) == list(results.corrector) and rows.bias_exact.tolist() == pytest.approx(
        results.bias_exact.tolist(), rel=1e-12)


def test_no_split_meeting_the_targets_exits_3(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = main_in_process(monkeypatch, capsys, [*TINY, "capacity.decide_steps=0", "hydra.run.dir=run",
                                                           "capacity.split.max_mean_lag=0.1"])
    assert code == 3, err
    assert f"{N} GPUs: no split meets the targets" in " ".join(out.split())


def test_splits_enumerated():
    cfg = scenario(compose_config(*TINY))
    assert [(s.engines, s.trainer, s.judge) for s in S.splits_of(cfg, "judge")] == [
        (e, N - e - j, j) for e in range(1, N) for j in range(1, N - 1) if N - e - j >= 1]
    listed = scenario(compose_config(*TINY, "capacity.split.engines=[1,3]", "capacity.split.judge=[2]"))
    assert [(s.engines, s.trainer, s.judge) for s in S.splits_of(listed, "judge")] == [(1, 2, 2)]
    assert S.Split(10, 4, 2).text() == "10 engines, 4 trainer, 2 judge"
    assert S.Split(3, 2, 0).text() == "3 engines, 2 trainer"


SP = "capacity__split__"
BAD = [  # (key, value, the key named)
    (SP + "gpus", None, "capacity.split.gpus"),
    (SP + "gpus", 2, "capacity.split.gpus"),
    (SP + "gpus", 2.5, "capacity.split.gpus"),
    (SP + "engines", [0, 2], "capacity.split.engines"),
    (SP + "engines", [5], "capacity.split.engines"),
    (SP + "engines", [], "capacity.split.engines"),
    (SP + "judge", [4], "capacity.split.judge"),
    (SP + "judge", ["two"], "capacity.split.judge"),
    (SP + "workers_per_gpu", 0, "capacity.split.workers_per_gpu"),
    (SP + "max_mean_lag", -1.0, "capacity.split.max_mean_lag"),
    (SP + "max_head_lag_p95", math.nan, "capacity.split.max_head_lag_p95"),
    ("pipeline__generation__trainer__service", "drawn", "pipeline.generation.trainer.service"),
    ("learner__trials", 1, "learner.trials"),
    ("capacity__channel", "nope", "capacity.channel"),
    ("capacity__max_dropped", 2.0, "capacity.max_dropped"),
    ("capacity__corrector", "retrace_a", "capacity.corrector"),
]


@pytest.mark.parametrize("key,value,named", BAD, ids=[f"{b[0].replace('__', '.')}={b[1]}" for b in BAD])
def test_each_bad_value_is_named_in_one_line(key, value, named):
    cfg = scenario(compose_config(*TINY))
    with pytest.raises(ConfigError) as e:
        validate(changed(cfg, **{key: value}))
    assert e.value.key == named and "\n" not in str(e.value)


def test_cross_rules_name_their_key():
    cfg = scenario(compose_config(*TINY))
    with pytest.raises(ConfigError) as e:  # a pool split reads its block in async mode only
        validate(changed(cfg, pipeline__generation__mode="sync"))
    assert e.value.key == "capacity.split.gpus" and "async" in e.value.allowed
    with pytest.raises(ConfigError) as e:  # other tenants on the judge: not in its load
        validate(scenario(compose_config(*TINY, "pipeline.channels.judge.background={rate_per_s: 20}")))
    assert e.value.key == "pipeline.channels.judge.background"
    with pytest.raises(ConfigError) as e:  # failing judge servers: not in its load
        validate(scenario(compose_config(*TINY, "pipeline.channels.judge.faults.mtbf_s=600",
                                         "pipeline.channels.judge.faults.mttr_s=60")))
    assert e.value.key == "pipeline.channels.judge.faults.mtbf_s"
    many = changed(cfg, capacity__split__gpus=40, limits__capacity_counts=20)
    with pytest.raises(ConfigError) as e:
        S.run_split(many)
    assert e.value.key == "capacity.split.gpus" and "capacity.split.engines" in e.value.allowed


def test_a_bad_split_value_on_the_command_line_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = main_in_process(monkeypatch, capsys, [*TINY, "capacity.split.engines=[9]"])
    lines = messages(err)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("racsim: error: capacity.split.engines")
    assert not list(tmp_path.iterdir())


@pytest.mark.long
def test_racsim_run_returns_the_split_table_and_answer():
    import racsim

    t = racsim.run("async/areal", overrides=TINY[1:] + ["capacity.decide_steps=0"])
    assert t.status == "recommended" and t.recommended is not None and len(t.curve) == 6
    assert {"engines", "trainer", "judge", "steps_per_hour", "mean_lag", "fails"} <= set(t.curve.columns)
    assert len(t.results) and "generation" in t.raw.best.extra


def test_a_moving_policys_bias_intervals_resample_its_trials():
    """Generation lags (a moving policy): each replicate of the bias is the norm of the weighted mean of the
    trials' own exact figures minus the target, a trial weighted by the share of its batches drawn (a loop),
    and the ratio to naive's is paired; the interval is that of the replicates."""
    from types import SimpleNamespace

    from racsim.analyses.capacity.intervals import Units, batch_units, bias_intervals, trial_weights

    rng = np.random.default_rng(47)
    for per in (1, 3):
        trials, steps, resamples, dims = 5, 9, 40, 4
        counts = rng.multinomial(trials * per, np.full(trials * per, 1.0 / (trials * per)), size=resamples)
        units = Units(batch_units(trials, steps, per), per, counts)
        figures = {n: rng.normal(size=(trials, dims)) for n in ("naive", "rac")}
        target = rng.normal(size=dims)
        run = SimpleNamespace(exact_trials={"steady": figures}, target_of=lambda view: target)
        w = trial_weights(units)
        for r in range(resamples):
            for t in range(trials):
                assert w[r, t] == pytest.approx(sum(counts[r, t * per + b] for b in range(per)) / per)
        got = bias_intervals(run, units, 0.9)
        boot = {}
        for n, e in figures.items():
            boot[n] = np.array([np.linalg.norm(sum(w[r, t] * e[t] for t in range(trials)) / trials - target)
                                for r in range(resamples)])
        for n in figures:
            ratio = boot[n] / boot["naive"]
            want = (*steady.percentile_interval(boot[n], 0.9), *steady.percentile_interval(ratio, 0.9))
            assert got[n] == pytest.approx(want, rel=1e-12)
