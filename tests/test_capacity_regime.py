"""Slow regimes in the capacity search (issue 28, points 2 and 5): the regimes' time scales
against their closed forms, the run sized in their cycles, the stationarity check on independent
trials, the batch-means units against a loop, the coverage of the channel's intervals under
outages and bursts (long), and the answer over seeds."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from racsim.analyses.capacity import BATCH_CYCLES, channel_loads, run_capacity
from racsim.analyses.capacity.intervals import batch_units, channel_intervals, interval_units
from racsim.analyses.capacity.episodes import count_episodes
from racsim.analyses.capacity.length import first_length, sized_run
from racsim.analyses.capacity.regimes import regime_cycle, regime_scales, regime_window
from racsim.analyses.capacity.intervals import replicate_figures
from racsim.analyses.capacity.rows import rare_figures
from racsim.config.defaults import compose_config
from racsim.config.spec import replace_at, scenario
from racsim.pipeline import steady
from racsim.pipeline.draws import draw
from racsim.pipeline.engines import simulate
from racsim.pipeline.schedule import DROPPED, UNROUTED
from racsim.report.capacity import interval_units_text, method_text
from racsim.tools.seeds import main as seeds_main, seed_answers, seed_statement

JUDGE_STEP = 6.0 + 1.0 + 0.1 + 1.5  # capacity/judge_rm_h100's phases: generate, fast_score, submit, update (s)


def spec(*over):
    return scenario(compose_config(*over))


@pytest.mark.parametrize("seed", range(4))
def test_regime_scales_are_the_closed_forms(tmp_path, seed):
    rng = np.random.default_rng(seed)
    mtbf, mttr, tp = (float(v) for v in (rng.uniform(100, 5000), rng.uniform(10, 600), rng.choice([1, 2])))
    pd_, pr = float(rng.uniform(0.001, 0.2)), float(rng.uniform(0.01, 0.9))
    f, s, i = (float(v) for v in rng.uniform(1, 60, 3))
    csv = tmp_path / "out.csv"
    ends = rng.uniform(100, 900, 3)
    csv.write_text("server,down_s,up_s\n" + "".join(f"{r},{e - 50:.3f},{e:.3f}\n" for r, e in enumerate(ends)))
    j = "pipeline.channels.judge"
    c = spec("scenario=capacity/judge_rm_h100", f"{j}.rm.tp={int(tp)}", f"capacity.counts=[{4 * int(tp)}]",
             f"{j}.faults.mtbf_s={mtbf!r}", f"{j}.faults.mttr_s={mttr!r}", f"{j}.degraded_factor=2.0",
             f"{j}.p_degrade={pd_!r}", f"{j}.p_recover={pr!r}")
    got = regime_scales(c, "judge")
    assert got["faults"] == pytest.approx((mtbf / tp + mttr) / JUDGE_STEP)  # a replica fails when any GPU does
    assert got["bursts"] == pytest.approx(1 / pd_ + 1 / pr)
    assert regime_cycle(c, "judge") == int(np.ceil(max(got.values())))
    auto = spec("scenario=capacity/judge_rm_autoscale", f"{j}.autoscale.for_s={f!r}",
                f"{j}.autoscale.startup_s={s!r}", f"{j}.autoscale.idle_s={i!r}")
    assert regime_scales(auto, "judge") == {"autoscale": pytest.approx((f + s + i) / JUDGE_STEP)}
    assert "schedule" not in got
    assert regime_cycle(c, "judge") == int(np.ceil(max(got.values())))
    sched = spec("scenario=capacity/judge_rm_h100", f"{j}.faults.schedule={csv}", "capacity.counts=[3,4]")
    assert regime_scales(sched, "judge") == {"schedule": pytest.approx(float(np.round(ends, 3).max()) / JUDGE_STEP)}
    assert regime_cycle(sched, "judge") == 0  # a schedule happens once: it sizes the run, not the batches
    assert regime_window(sched, "judge") == int(np.ceil(np.round(ends, 3).max() / JUDGE_STEP))


def test_regime_window_holds_the_cycles():
    j = "pipeline.channels.judge"
    base = ("scenario=capacity/judge_rm_faults", f"{j}.faults.mtbf_s=1000.0", f"{j}.faults.mttr_s=275.0")
    cycle = (1000 + 275) / JUDGE_STEP  # 148.3 steps
    for trials, k in ((50, 100), (10, 100), (400, 100), (50, 20)):
        c = spec(*base, f"learner.trials={trials}", f"capacity.regime_cycles={k}")
        assert regime_cycle(c, "judge") == 149
        assert regime_window(c, "judge") == max(149, int(np.ceil(k * 149 / trials)))
    off = spec(*base, "capacity.regime_cycles=0")
    assert regime_cycle(off, "judge") == 0 and regime_window(off, "judge") == 0
    assert regime_window(spec("scenario=capacity/judge_rm_h100"), "judge") == 0  # no slow regime


@pytest.mark.parametrize("seed", range(6))
def test_batch_units_against_a_loop(seed):
    rng = np.random.default_rng(seed)
    trials, steps = int(rng.integers(1, 6)), int(rng.integers(1, 90))
    batches = int(rng.integers(1, steps + 1))
    got = batch_units(trials, steps, batches)
    size, extra = steps // batches, steps % batches
    for t in range(trials):
        for s in range(steps):
            b = 0 if s < extra + size else (s - extra) // size
            assert got[t, s] == t * batches + b
    assert np.bincount(got.ravel()).min() >= size  # every batch at least size steps: none empty


def ar1(rng, trials, steps, phi):
    """Stationary AR(1) series per trial (started from its stationary law)."""
    x = np.empty((trials, steps))
    x[:, 0] = rng.standard_normal(trials) / np.sqrt(1 - phi ** 2)
    e = rng.standard_normal((trials, steps))
    for t in range(1, steps):
        x[:, t] = phi * x[:, t - 1] + e[:, t]
    return x


def test_trials_verdict_takes_a_slow_regime_for_no_trend_and_sees_a_drift():
    rng = np.random.default_rng(3)
    ok_new = ok_old = 0
    for _ in range(100):  # a regime of ~100 steps' correlation, windows of 160 steps
        x = ar1(rng, 30, 160, 0.99)
        ok_new += steady.trials_verdict(x, warmup=0).stationary
        ok_old += steady.verdict(x.mean(axis=0), warmup=0).stationary
    assert ok_new >= 95  # the t-test over independent trials holds its level (1%)
    assert ok_old < 80  # batch means of one series read the regime's excursions as trends
    drift = ar1(rng, 30, 160, 0.99) + np.linspace(0, 20, 160)  # 3 of the regime's standard deviations over the run
    assert not steady.trials_verdict(drift, warmup=0).stationary
    assert "slopes" in steady.trials_verdict(drift, warmup=0).reason
    flat = np.ones((5, 40))
    assert steady.trials_verdict(flat, warmup=0).stationary
    assert not steady.trials_verdict(flat + np.arange(40), warmup=0).stationary  # the same slope everywhere
    two = ar1(rng, 2, 200, 0.5)  # under 3 trials: the verdict on their mean
    assert steady.trials_verdict(two, warmup=0) == steady.verdict(two.mean(axis=0), warmup=0)


def small(kind: str, *more: str):
    """A cheap queue (4 workers, 8 exponential requests every 4 s, results older than 4 steps
    dropped, 10 trials) with outages (mtbf 400 s, mttr 40 s: a 110-step cycle) or bursts (twice
    as slow in spells of 10 steps, 50 steps apart)."""
    v = "pipeline.channels.verifier"
    reg = {"faults": [f"{v}.faults.mtbf_s=400.0", f"{v}.faults.mttr_s=40.0", f"{v}.latency.mean=1.3"],
           "bursts": [f"{v}.degraded_factor=2.0", f"{v}.p_degrade=0.02", f"{v}.p_recover=0.1",
                      f"{v}.latency.mean=1.2"]}[kind]
    return spec("scenario=capacity/code_verifier", f"latency@{v}.latency=exponential", f"{v}.latency.low=0.0",
                f"{v}.latency.high=null", "pipeline.generate.kind=deterministic", "pipeline.generate.mean=4.0",
                "pipeline.fast_score.mean=0.0", "pipeline.submit.mean=0.0", "pipeline.update.mean=0.0",
                "pipeline.batch_size=8", f"{v}.max_delay=4", f"{v}.workers=4", "pipeline.steps=40",
                "learner.trials=10", "capacity.enabled=false", "capacity.max_steps=4000", *reg, *more)


def long_run(cfg, steps=20000, trials=20, warmup=200):
    """Dropped share and sojourn p95 of one long run (the long-run figures the intervals must cover)."""
    c = replace_at(cfg, "pipeline.steps", steps)
    sched = simulate(c.pipeline, trials, None, draws=draw(c.pipeline, trials, np.random.default_rng(10 ** 6)))
    st = sched.status[:, warmup:, :, 0]
    soj = (sched.completion - sched.submit_time)[:, warmup:, :, 0]
    back = np.isfinite(soj) & (st != UNROUTED)
    return (st == DROPPED).sum() / (st != UNROUTED).sum(), np.quantile(soj[back], 0.95, method="inverted_cdf")


def coverage(cfg, seeds) -> np.ndarray:
    """Per seed: whether its dropped share's and its sojourn p95's intervals, as the capacity curve reads
    them off one run (its trials; under a chain, racsim.analyses.capacity.rows.rare_figures), hold the long
    run's (a row each)."""
    dropped, p95 = long_run(cfg)
    hits = []
    load = channel_loads(cfg, "verifier", "pipeline.channels.verifier.workers", [4])[4]
    for s in seeds:
        c = replace_at(cfg, "seed", int(s))
        run = sized_run(c, "verifier", work_per_s=load["work_per_s"])
        w, level = run.verdict.warmup, float(c.capacity.confidence)
        units = interval_units(c, "verifier", c.learner.trials, w, run.steps, whole=True)
        f = channel_intervals(run.sched, run.sched.channel_names.index("verifier"), 4, w, units, level)
        f.update(rare_figures(c, "verifier", 4, load, replicate_figures(run.sched, c, "verifier", w), level))
        hits.append([f["dropped_frac_lo"] <= dropped <= f["dropped_frac_hi"],
                     f["sojourn_p95_s_lo"] <= p95 <= f["sojourn_p95_s_hi"]])
    return np.array(hits, dtype=float)


ROOT = Path(__file__).resolve().parents[1]
DOCUMENTED = {  # (dropped, p95) without the slow-regime analysis, then with it, as docs/capacity.md says them
    "faults": r"under outages (\d+)% and (\d+)% of the time without the slow-regime analysis, (\d+)% and (\d+)% with it",
    "bursts": r"under bursts (\d+)% and (\d+)%, then (\d+)% and (\d+)%"}


@pytest.mark.long
@pytest.mark.parametrize("kind", ["faults", "bursts"])
def test_intervals_cover_the_long_run_under_slow_regimes(kind):
    # Measured over seeds 0-59 (capacity.regime_cycles 0 -> 100; the warm-up one regime cycle,
    # shares and quantiles by bootstrap-t): faults dropped 60% -> 92%, sojourn p95 78% -> 97%;
    # bursts 83% -> 95%, 83% -> 90% (a binomial sd of 3-4%). Over seeds 0-29, which this test
    # runs: faults 50% -> 90%, 60% -> 100%; bursts 83% -> 100%, 80% -> 93% (without the analysis
    # the units are the 10 trials, a minority of which carry the drops in a short run: BCa there,
    # steady.MIN_STUDENTIZED; bootstrap-t read 67% and 87%, 83%). With percentile intervals and
    # an MSER-5 warm-up (two versions back) faults read 82% and 83% over 0-59. Without the analysis
    # faults read 60% and 80% over 0-29 while a warm-up on MSER-5's edge always doubled the run (by
    # chance a longer run); kept where the trials show it over (steady.replicated_mser), 50% and 60%.
    # Issue 41: the dropped share's 95% interval holds the long run's (20,000 steps x 20 trials, 500 times a
    # run's length) at >= 90% of 60 seeds under each regime, the p95's at >= 85%. Issue 50 (the channel's
    # figures on the trials alone, the warm-up the chain's, a share's interval floored by its episodes):
    # measured 90% and 95% (p95: 90%, 98%); over seeds 0-29 93%/93% and 97%/97%.
    hits = coverage(small(kind), range(60))
    assert hits[:, 0].mean() >= 0.9 and hits[:, 1].mean() >= 0.85, hits.mean(axis=0)
    got = hits[:30].mean(axis=0)
    before = coverage(small(kind, "capacity.regime_cycles=0"), range(30)).mean(axis=0)
    assert (before < got).any(), (before, got)
    # docs/capacity.md states these figures: within one seed of 30 (another CPU's last bits may move one)
    text = " ".join((ROOT / "docs" / "capacity.md").read_text().split())
    m = re.search(DOCUMENTED[kind], text)
    assert m, f"docs/capacity.md no longer states the {kind} coverage"
    documented = np.array([int(v) for v in m.groups()]) / 100
    np.testing.assert_allclose(documented, np.concatenate([before, got]), atol=1.5 / 30)
    # and the dropped share's over seeds 0-59, within one seed of 60
    m = re.search(r"Over seeds 0-59 the dropped share's interval, with the analysis, holds the long run "
                  r"\(20,000 steps x 20 trials\) ([\d.]+)% of the time under outages and ([\d.]+)% under bursts", text)
    assert m, "docs/capacity.md no longer states the dropped share's coverage over seeds 0-59"
    said = float(m.group(1 if kind == "faults" else 2)) / 100
    assert abs(said - hits[:, 0].mean()) <= 1.5 / 60, (said, hits[:, 0].mean())


# 4's row alone: no search above (capacity.max_count) nor below (3 workers overloaded under capacity.max_load 0.9,
# so not simulated; 4's row the same as with 3 run beside it): test_the_bias_run_simulates_four_workers_alone
# one run's interval is what the coverage test measures: no replications (capacity.decide_steps=0) rebuild it
BIAS_RUN = ("capacity.enabled=true", "capacity.counts=[4]", "capacity.benchmark=false",
            "capacity.sensitivity.enabled=false", "capacity.max_load=0.9", "corrector.names=[rac,naive]",
            "capacity.max_count=4", "capacity.decide_steps=0")


def rac_bias(kind: str, seed: int, *more: str) -> dict:
    """rac's exact bias and its interval at the small queue's 4 workers, by the capacity search."""
    res = run_capacity(replace_at(small(kind, *BIAS_RUN, *more), "seed", seed))
    r = res.curve[(res.curve.corrector == "rac") & (res.curve["count"] == 4)].iloc[0]  # not a count searched below
    return {k: float(r[k]) for k in ("bias_exact", "bias_exact_lo", "bias_exact_hi")}


@pytest.mark.parametrize("kind", ["faults", "bursts"])
def test_the_bias_run_simulates_four_workers_alone(kind):
    """The long bias-coverage test's premise: under BIAS_RUN 3 workers are overloaded (long-run loads
    0.953 under outages, 0.933 under bursts) and 4 are not (0.715, 0.7), so a search evaluates 4 only."""
    cfg = small(kind, *BIAS_RUN, "pipeline.steps=12", "learner.trials=4", "capacity.max_steps=24")
    loads = channel_loads(cfg, "verifier", "pipeline.channels.verifier.workers", [3, 4])
    want = {"faults": (0.953, 0.715), "bursts": (0.933, 0.7)}[kind]
    np.testing.assert_allclose([loads[3]["load"], loads[4]["load"]], want, atol=5e-4)
    assert loads[3]["load"] >= cfg.capacity.max_load > loads[4]["load"]
    res = run_capacity(cfg)
    assert set(res.curve["count"]) == {4} and res.searched == []


BIAS_DOCUMENTED = r"rac's exact bias under outages (\d+)% of the time, under bursts (\d+)%"
# The long run the bias intervals are held to, computed once (17 CPU s each) and stored with how it was made:
# python tests/test_capacity_regime.py (rerun it where the simulator or the bias study changes on purpose:
# tests/golden.py's digests of the same code then change too).
BIAS_TRUTH = Path(__file__).resolve().parent / "data" / "bias_truth.json"
BIAS_LONG = ("capacity.run_length=fixed", "pipeline.steps=6000", "learner.trials=100", "pipeline.warmup_steps=300")
BIAS_TRUTH_SEED = 10 ** 6


def store_bias_truths() -> None:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    BIAS_TRUTH.write_text(json.dumps({kind: {
        "bias_exact": rac_bias(kind, BIAS_TRUTH_SEED, *BIAS_LONG)["bias_exact"], "seed": BIAS_TRUTH_SEED,
        "overrides": list(BIAS_LONG), "command": "python tests/test_capacity_regime.py", "commit": commit}
        for kind in ("faults", "bursts")}, indent=1, sort_keys=True) + "\n")


@pytest.mark.long
@pytest.mark.parametrize("kind", ["faults", "bursts"])
def test_the_bias_interval_covers_the_long_run_under_slow_regimes(kind):
    # The long run: one run of 100 trials x 6000 steps (the truth's own standard error about 6%
    # of the bias, a seventh of an interval's half-width; a second such run moved it by 0.13 of a
    # half-width and no seed's verdict). Measured over seeds 0-59 against four such runs: 95% under
    # outages and under bursts (the trials resampled, percentile intervals of the resampled bias,
    # one version back: 82% and 88%, the misses all above the interval).
    stored = json.loads(BIAS_TRUTH.read_text())[kind]
    assert stored["overrides"] == list(BIAS_LONG) and stored["seed"] == BIAS_TRUTH_SEED
    truth = stored["bias_exact"]
    rows = [rac_bias(kind, s) for s in range(30)]
    got = np.mean([r["bias_exact_lo"] <= truth <= r["bias_exact_hi"] for r in rows])
    assert got >= 0.85, (got, truth)
    text = " ".join((ROOT / "docs" / "capacity.md").read_text().split())
    m = re.search(BIAS_DOCUMENTED, text)
    assert m, "docs/capacity.md no longer states the bias interval's coverage"
    assert abs(int(m.group(1 if kind == "faults" else 2)) / 100 - got) <= 1.5 / 30, (got, truth)


def test_sized_run_holds_the_cycles():
    cfg = small("bursts", "capacity.regime_cycles=30", "capacity.max_steps=400")
    run = sized_run(cfg, "verifier")
    # the window it needs, max(60, 30 x 60 / 10) = 180 steps, after the warm-up the burst chain gives the
    # count (it starts in its stationary law; racsim/analyses/capacity/episodes.py), at least the drop horizon
    warm = max(count_episodes(cfg, "verifier").warmup, 4)
    assert run.steps == 180 + warm and run.verdict.warmup == warm
    assert first_length(cfg, "verifier") == 180 + warm
    old = sized_run(small("bursts", "capacity.regime_cycles=0"), "verifier")
    assert old.steps < run.steps
    short = sized_run(small("bursts", "capacity.regime_cycles=30", "capacity.max_steps=200"), "verifier")
    assert short.steps == 200 and not short.verdict.stationary  # the 180-step window after 60 does not fit
    assert "short of the 180 its slow regimes need (capacity.max_steps = 200)" in short.verdict.reason


def test_seed_statement():
    assert seed_statement([7] * 16 + [6] * 4, "GPUs") == "7 GPUs; 6 meets the targets in 4 of 20 seeds"
    assert seed_statement([5] * 20, "GPUs") == "5 GPUs at all 20 seeds"
    assert seed_statement([8, 6, 7, 8], "workers") == ("8 workers; 7 meets the targets in 2 of 4 seeds; "
                                                       "6 meets the targets in 1 of 4 seeds")
    assert seed_statement([None, 7], "GPUs") == "no count meets the targets in 1 of 2 seeds; 7 GPUs in the others"
    assert seed_statement([None, None], "GPUs") == "no count meets the targets in any of 2 seeds"


@pytest.mark.long
def test_seed_answers_are_the_runs_answers():
    cfg = spec("scenario=capacity/judge_rm_faults", "learner.trials=6", "learner.bootstrap=0", "pipeline.steps=12",
               "capacity.benchmark=false", "capacity.max_steps=48", "capacity.resamples=40",
               "capacity.counts=[4,6,8]", "pipeline.channels.judge.rm.sequences_per_sample=4")
    table = seed_answers(cfg, [3, 5])
    assert list(table.seed) == [3, 5] and (table.unit == "GPUs").all()
    for s, got in zip((3, 5), table.recommended):
        want = run_capacity(replace_at(cfg, "seed", s)).recommended
        assert (got is None and want is None) or got == want
    side = seed_answers(cfg, [3, 5], jobs=2)  # two processes: the same rows, in the seeds' order
    assert side.drop(columns=["cpu_s", "seconds"]).equals(table.drop(columns=["cpu_s", "seconds"]))
    assert (table.cpu_s > 0).all()


@pytest.mark.long  # the seeds tool on two seeds: 2.3 CPU s
def test_the_seeds_command_takes_overrides_before_and_after_its_options(capsys, tmp_path):
    """As the capacity page writes it: the scenario, --seeds N, then more overrides (argparse's plain
    parse refused the overrides after an option as unrecognized)."""
    seeds_main(["scenario=capacity/judge_rm_faults", "--seeds", "2", "learner.trials=4", "pipeline.steps=12",
                "capacity.run_length=fixed", "capacity.resamples=20", "capacity.benchmark=false",
                "capacity.counts=[4,12]", "--csv", str(tmp_path / "t.csv"), "capacity.max_dropped=1"])
    out = capsys.readouterr().out.splitlines()
    assert out[-1] in ("12 GPUs at all 2 seeds", "no count meets the targets in any of 2 seeds"), out
    assert len(pd.read_csv(tmp_path / "t.csv")) == 2


# The shipped capacity scenarios whose 20 seeds the long stage holds within its time (the judge's
# about 12 s a seed, human review's 1 s, on 2 cores); code_verifier and judge_rm_autoscale (all 20
# seeds one count there too), judge_rm_preempt and judge_rm_faults are held by the generated block
# (python -m racsim.app.docs capacity.seeds), which the CI does not rerun.
SEEDS_HELD = ("capacity/judge_rm_h100", "capacity/human_review")


@pytest.mark.long
@pytest.mark.parametrize("name", SEEDS_HELD)
def test_the_answer_at_20_seeds_is_the_documented_one(name):
    """Issue 28's 'the same answer at any seed': seeds 0-19 of a shipped capacity scenario, as the
    docs' generated block capacity.seeds runs them, give the statement docs/capacity.md prints for
    it (for these, one count at every seed)."""
    cfg = spec(f"scenario={name}", "capacity.sensitivity.enabled=false", "capacity.benchmark=false")
    table = seed_answers(cfg, range(20), jobs=2)
    got = seed_statement(list(table.recommended), str(table.unit.iloc[0]))
    text = (ROOT / "docs" / "capacity.md").read_text()
    row = re.search(rf"^\| {re.escape(name)} \| ([^|]+) \|", text, re.M)
    assert row, f"docs/capacity.md has no capacity.seeds row for {name}"
    assert got == row.group(1).strip() and "at all 20 seeds" in got, (got, row.group(1))


@pytest.mark.parametrize("scen, regime", [("capacity/judge_rm_faults", "faults"), ("capacity/judge_rm_autoscale", "autoscale"),
                                          ("capacity/judge_rm_h100", None), ("capacity/judge_rm_preempt", None)])
def test_the_summary_says_what_the_intervals_resample(scen, regime):
    """summary.md's method names the units interval_units resamples: batches of BATCH_CYCLES cycles of the
    slowest regime (its name and cycle) where there is one, else the trials; never a percentile over trials
    for the bias."""
    cfg = spec(f"scenario={scen}")
    res = SimpleNamespace(channel="judge", level=0.95, max_load=0.95)
    text = interval_units_text(res, cfg)
    assert (regime_cycle(cfg, "judge") > 0) == (regime is not None)  # interval_units cuts batches by it
    if regime is None:
        assert text.startswith(f"the {cfg.learner.trials} trials")
    else:
        assert f"batches of at least {BATCH_CYCLES} cycles" in text
        assert f"({regime}: {regime_cycle(cfg, 'judge')} steps a cycle)" in text
    method = method_text(res, cfg)
    assert text in method and "bootstrap-t" in method and "percentile interval" not in method
    # steady.quantile_interval inverts the exceedance share's interval; the busy share resamples whole trials
    assert "quantile by inverting" in method and "busy share (whole trials resampled)" in method


if __name__ == "__main__":
    store_bias_truths()
