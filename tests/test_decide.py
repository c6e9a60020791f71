"""Deciding with enough evidence (issues 41, 50): the sequential rule of racsim/analyses/capacity/stopping.py on
toys whose truth is known in closed form (lanes whose drops come in Poisson episodes of geometric length:
a compound Poisson share, rate x length), and a capacity search that reads the rare-event figures of the
counts its answer depends on off replications sized from the regime's chain."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from helpers import Recorder
from racsim.analyses.capacity import run_capacity, with_count
from racsim.analyses.capacity import stopping as D
from racsim.analyses.capacity.episodes import EPISODES, count_episodes
from racsim.analyses.capacity.targets import failed, unresolved
from racsim.config.defaults import compose_config
from racsim.config.spec import scenario
from racsim.pipeline import steady

PER_STEP = 32  # results a toy lane sends a step


def lane_draws(rng, rate: float, length: float, lanes: int, steps: int) -> D.Replicate:
    """Toy lanes: Poisson(rate x steps) drop episodes a lane, each dropping a geometric number of steps
    (mean ``length``) of PER_STEP results; quantile samples: PER_STEP delays a step, slow in episodes."""
    eps = rng.poisson(rate * steps, lanes)
    dropped = np.array([rng.geometric(1.0 / length, e).sum() for e in eps], dtype=np.float64) * PER_STEP
    dropped = np.minimum(dropped, steps * PER_STEP)
    values = rng.exponential(1.0, lanes * 50)
    return D.Replicate(dropped=dropped, sent=np.full(lanes, steps * PER_STEP, dtype=np.float64), episodes=eps,
                       steps=steps, samples={"delay": (values, np.repeat(np.arange(lanes), 50)),
                                             "sojourn": (values * 2, np.repeat(np.arange(lanes), 50))})


def toy(rate: float, length: float, seed: int):
    """A toy's replication runs: a stage's runs ((lanes, steps) each, the plan's warm-up cut) as lane_draws."""
    rng = np.random.default_rng(seed)
    return lambda r, runs: [lane_draws(rng, rate, length, lanes, steps - PLAN.warmup) for lanes, steps in runs]


def first_of(rate: float, length: float, seed: int) -> D.Replicate:
    """A toy's settled run: 20 lanes of 100 measured steps."""
    return lane_draws(np.random.default_rng(seed), rate, length, 20, 100)


PLAN = D.Plan(need=0.0, length=10.0, warmup=20, lanes=20, first=100, cap=400)


def plan(**over) -> D.Plan:
    return D.Plan(**{**PLAN.__dict__, **over})


def row(lo: float, hi: float) -> dict:
    return {"dropped_frac_lo": lo, "dropped_frac_hi": hi}


@pytest.mark.parametrize("events", [0, 1, 3, 12, 40])
def test_poisson_interval_is_the_exact_one(events):
    lo, hi = D.poisson_interval(events, 0.95)
    assert stats.poisson.cdf(events, hi) == pytest.approx(0.025)  # no more than seen: 2.5% at the upper end
    if events:
        assert stats.poisson.sf(events - 1, lo) == pytest.approx(0.025)  # at least as many: 2.5% at the lower
    else:
        assert lo == 0.0 and hi == pytest.approx(-math.log(0.025))


def test_ratio_interval_with_nothing_seen():
    sent = np.full(10, 1000.0)
    r, lo, hi = D.ratio_interval(np.zeros(10), sent, 0.95, 0, exposure=500.0, length=4.0)
    assert (r, lo) == (0.0, 0.0) and hi == pytest.approx(-math.log(0.025) * 4.0 / 500.0)  # 3.69 episodes of 4 steps
    r, lo, hi = D.ratio_interval(np.zeros(10), sent, 0.95)  # no chain: the binomial upper end of 10,000 requests
    assert hi == pytest.approx(1 - 0.025 ** (1 / 10000))


def test_a_few_small_episodes_read_no_narrower_than_the_chains():
    """One episode of a step where the chain's average 30: the upper end is at least what one episode
    of 30 steps allows, as none seen would be (never the narrower for having seen a small one)."""
    sent = np.full(50, 200.0 * 32)
    num = np.zeros(50)
    num[3] = 32.0  # one step's results dropped, in 10,000 trial-steps
    r, lo, hi = D.ratio_interval(num, sent, 0.95, episodes=1, exposure=10000.0, length=30.0)
    none = D.ratio_interval(np.zeros(50), sent, 0.95, 0, 10000.0, 30.0)[2]
    assert hi == pytest.approx(D.poisson_interval(1, 0.95)[1] * 30.0 / 10000.0) and hi > none > r


def test_ratio_interval_is_never_narrower_than_its_episodes_allow():
    num, den = np.full(30, 5.0), np.full(30, 1000.0)  # every lane alike: the spread between lanes is 0
    r, lo, hi = D.ratio_interval(num, den, 0.95, episodes=4)
    e = 4 / (1 + D.SIZE_CV2)  # episodes of random size: their effective count
    p_lo, p_hi = D.poisson_interval(e, 0.95)
    assert r == pytest.approx(0.005) and lo == pytest.approx(r * p_lo / e) and hi == pytest.approx(r * p_hi / e)
    many = D.ratio_interval(num, den, 0.95, episodes=10 ** 6)  # then the binomial spread of 30,000 requests
    half = D.t_quantile(0.95, 29) * math.sqrt(r * (1 - r) / 30000)
    assert many[1:] == pytest.approx((r - half, r + half))


@pytest.mark.parametrize("expected", [8, 30])
def test_ratio_interval_covers_a_compound_poisson_share(expected):
    """A share made of a few episodes of random length: the interval over the lanes, floored by the
    episodes' Poisson count, covers the truth rate x length about 95% of the time (not below 90%)."""
    rng = np.random.default_rng(expected)
    rate, length, lanes = 0.002, 12.0, 50
    steps = int(expected / (rate * lanes))
    hits = []
    for _ in range(400):
        rep = lane_draws(rng, rate, length, lanes, steps)
        _, lo, hi = D.ratio_interval(rep.dropped, rep.sent, 0.95, int(rep.episodes.sum()), lanes * steps, length)
        hits.append(lo <= rate * length <= hi)
    assert 0.9 <= np.mean(hits) <= 0.995, np.mean(hits)


def chance_loop(exposure, share, rate, length, target, runs=20000, seed=0):
    """Monte-Carlo of decide_chance: Poisson episodes, Gamma sizes (mean length, squared cv SIZE_CV2), the
    interval ratio_interval's Poisson ends on the effective count, its upper end at least that many episodes
    of the chain's length (its spread over trials left aside)."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(runs):
        n = rng.poisson(rate * exposure)
        if n == 0:
            hi, lo = D.poisson_interval(0, 0.95)[1] * length / exposure, 0.0
        else:
            r = rng.gamma(n / D.SIZE_CV2, length * D.SIZE_CV2) / exposure
            e = n / (1 + D.SIZE_CV2)
            lo, hi = (r * x / e for x in D.poisson_interval(e, 0.95))
            if n < EPISODES:  # never below n episodes of the chain's length while few were seen
                hi = max(hi, D.poisson_interval(n, 0.95)[1] * length / exposure)
        hits += hi <= target if share < target else lo > target
    return hits / runs


@pytest.mark.parametrize("share, target, exposure", [(0.003, 0.01, 1.2e5), (0.004, 0.01, 4e4), (0.04, 0.01, 1e4),
                                                     (0.012, 0.01, 3e5), (1e-6, 0.01, 3000)])
def test_decide_chance_against_a_loop(share, target, exposure):
    length = 25.0
    rate = share / length
    got = D.decide_chance(exposure, share, rate, length, target, 0.95)
    assert got == pytest.approx(chance_loop(exposure, share, rate, length, target), abs=0.012)


def test_need_for_settles_at_the_power():
    share, length, target = 0.003, 25.0, 0.01
    need = D.need_for(share, share / length, length, target, 0.95)
    assert D.decide_chance(need, share, share / length, length, target, 0.95) >= D.POWER
    assert D.decide_chance(0.95 * need, share, share / length, length, target, 0.95) < D.POWER  # the fewest (1%)
    assert D.need_for(0.0, 0.0, 0.0, target, 0.95) == 0.0  # the chain drops nothing: nothing to size
    assert D.need_for(target, target / length, length, target, 0.95) == math.inf  # at the target: never settled
    # a quantile target: EPISODES episodes over its tail; the most of the keys
    t = {"max_dropped": target, "max_sojourn_p99_s": 30.0}
    assert D.need_of(share, share / length, length, t, ["max_sojourn_p99_s"], 0.95) == pytest.approx(
        EPISODES * length / 0.01)
    assert D.need_of(share, share / length, length, t, ["max_dropped", "max_sojourn_p99_s", "max_bias"], 0.95) == max(
        need, EPISODES * length / 0.01)


@pytest.mark.parametrize("seed", range(6))
def test_stage_reaches_the_need_then_doubles_within_memory(seed):
    rng = np.random.default_rng(seed)
    p = plan(need=float(rng.integers(1000, 400000)), warmup=int(rng.integers(1, 300)), lanes=int(rng.integers(2, 60)),
             first=int(rng.integers(20, 500)), cap=int(rng.integers(100, 2000)), together=int(rng.integers(1, 4)))
    reps = [lane_draws(rng, 0.001, 5.0, p.lanes, p.first)]
    for _ in range(3):
        runs = D.stage(reps, p)
        now = D.exposure(reps)
        add = sum(n * (s - p.warmup) for n, s in runs)
        want = max(p.need - now, now, p.lanes * max(p.first, 2 * p.warmup))
        assert want <= add < want + len(runs) * max(n for n, _ in runs)  # rounded up a step a lane at most
        assert len({r for r in runs}) == 1  # equal runs
        lanes, steps = runs[0]
        if len(runs) == 1 and lanes == p.lanes:
            assert lanes * steps <= p.lanes * p.cap or steps == p.warmup + math.ceil(want / p.lanes)
        else:  # past what a run of the plan's lanes holds: as many lanes of at least four warm-ups as fit
            assert lanes * steps <= p.lanes * p.cap + lanes * (steps - p.warmup) / len(runs) + lanes
            assert steps >= 4 * p.warmup or steps >= p.cap
            assert len(runs) % p.together == 0  # no process idles while another runs a last one
        reps += [lane_draws(rng, 0.001, 5.0, n, s - p.warmup) for n, s in runs]


def test_far_above_the_target_stops_early():
    rate, length = 0.004, 10.0  # 4% dropped against a 1% target
    p = plan(need=D.need_of(rate * length, rate, length, {"max_dropped": 0.01}, ["max_dropped"], 0.95))
    d = D.sequential(first_of(rate, length, 1), toy(rate, length, 2), ["max_dropped"], {"max_dropped": 0.01},
                     0.95, p, D.Budget(10 ** 6, 1e9))
    assert d.decided and D.episodes_seen(d.reps) >= EPISODES
    assert len(d.reps) == 1 + len(D.stage(d.reps[:1], p))  # one stage: up to the need (in runs that fit)
    v, lo, hi = d.found["max_dropped"]
    assert lo > 0.01 and lo <= rate * length <= hi


def test_a_target_decided_failing_ends_the_replications():
    """The dropped share far above its target, once resolved, fails the count: a bias ratio still straddling
    its target (runs alternating 0.05 and 0.15 against 0.1: never settled) asks for no more stages."""
    rate, length = 0.004, 10.0
    keys, targets = ["max_dropped", "max_bias_vs_naive"], {"max_dropped": 0.01, "max_bias_vs_naive": 0.1}
    p = plan(need=D.need_of(rate * length, rate, length, targets, keys, 0.95))
    runs = toy(rate, length, 2)

    def replicate(r, stage_runs):
        out = runs(r, stage_runs)
        for i, rep in enumerate(out):
            rep.means = {"bias_vs_naive": (0.05, 0.15)[(r + i) % 2]}
        return out

    first = first_of(rate, length, 1)
    first.means = {"bias_vs_naive": 0.05}
    budget = D.Budget(10 ** 6, 1e9)
    d = D.sequential(first, replicate, keys, targets, 0.95, p, budget)
    assert d.decided and d.open == [] and D.failing(d.found, keys, targets, d.reps, p) == ["max_dropped"]
    assert len(d.reps) == 1 + len(D.stage(d.reps[:1], p))  # the stage that resolved the share, no other
    _, lo, hi = d.found["max_bias_vs_naive"]
    assert lo <= 0.1 < hi  # still straddling: replicating on would have gone on to the budget's end
    assert budget.used == math.ceil(sum(n * s for n, s in D.stage(d.reps[:1], p)) / p.lanes)


@pytest.mark.parametrize("chain,drawn", [(0.04, 0.004), (0.04, 0.002), (0.04, 0.0), (0.04, 0.0005), (0.004, 0.004)])
def test_the_bias_study_waits_where_the_chain_expects_the_share_to_fail(chain, drawn):
    """The chain's long-run dropped share ``chain`` (against a 1% target), the runs' own rate ``drawn``, a
    bias ratio open beside the share: where the chain is above the target, stages are made without the
    bias study while the share is open; decided failing, none ever is (the bias read no further), decided
    passing, every stage made without it is made again with it (the same runs: the same figures) and
    those are kept. At or below the target, every stage with it."""
    length = 10.0
    keys, targets = ["max_dropped", "max_bias_vs_naive"], {"max_dropped": 0.01, "max_bias_vs_naive": 0.1}
    p = plan(need=D.need_of(chain, chain / length, length, targets, keys, 0.95), share=chain)
    calls, made = [], {}

    def replicate(r, runs, bias=True):  # bias: the stage's bias study with its runs
        calls.append((r, tuple(runs), bias))
        out = toy(drawn, length, r)(r, runs)  # each run its own seed's: the same figures made again
        made.setdefault(r, out)
        for i, rep in enumerate(out):
            if bias:
                rep.means = {"bias_vs_naive": 0.05 + 0.002 * ((r + i) % 5)}
        return out

    first = first_of(drawn, length, 1)
    first.means = {"bias_vs_naive": 0.12}  # straddles 0.1 alone (no interval before two runs)
    d = D.sequential(first, replicate, keys, targets, 0.95, p, D.Budget(10 ** 7, 1e9))
    assert d.decided and calls
    if chain <= 0.01:
        assert all(bias for *_, bias in calls)
        return
    waited = [(r, runs) for r, runs, bias in calls if not bias]
    assert waited and calls[:len(waited)] == [(r, runs, False) for r, runs in waited]  # stages, in order
    if D.failing(d.found, keys, targets, d.reps, p):  # decided failing on the share: no bias study made
        assert D.failing(d.found, keys, targets, d.reps, p) == ["max_dropped"] and len(calls) == len(waited)
        assert "max_bias_vs_naive" not in d.found and all(not r.means for r in d.reps[1:])
    else:  # decided passing: every stage made again with its bias study, those kept
        assert calls[len(waited):2 * len(waited)] == [(r, runs, True) for r, runs in waited]
        assert all(r.means for r in d.reps[1:]) and "max_bias_vs_naive" in d.found
        kept = [rep for r, runs in waited for rep in d.reps[r:r + len(runs)]]
        assert all(np.array_equal(a.dropped, b.dropped) for a, b in zip(kept, (x for r, _ in waited for x in made[r])))
    if drawn == 0.002:
        assert len(waited) >= 2  # the share decided after more than one stage, none of them with the bias


def test_nothing_seen_is_replicated_up_to_the_need_then_passes():
    calls = []

    def replicate(r, runs):
        calls.extend(runs)
        return toy(0.0, 10.0, r)(r, runs)

    p = plan(need=20000.0)
    d = D.sequential(first_of(0.0, 10.0, 0), replicate, ["max_dropped"], {"max_dropped": 0.01}, 0.95, p,
                     D.Budget(10 ** 6, 1e9))
    assert d.decided and D.exposure(d.reps) >= p.need and len(calls) >= 1
    v, lo, hi = d.found["max_dropped"]
    assert v == lo == 0.0 and hi == pytest.approx(-math.log(0.025) * 10.0 / D.exposure(d.reps))
    assert hi <= -math.log(0.025) * 10.0 / 20000.0


def test_truth_at_the_target_runs_out_of_budget():
    rate, length = 0.001, 10.0  # 1%: the target set at the truth
    budget = D.Budget(2000, 1e9)
    d = D.sequential(first_of(rate, length, 3), toy(rate, length, 4), ["max_dropped"], {"max_dropped": 0.01},
                     0.95, plan(need=2e4), budget)
    assert not d.decided and d.open == ["max_dropped"] and budget.used <= 2000
    v, lo, hi = d.found["max_dropped"]
    assert lo <= 0.01 < hi
    runs = D.stage(d.reps, plan(need=2e4))  # the stage it was refused
    assert budget.used + math.ceil(sum(n * s for n, s in runs) / PLAN.lanes) > 2000


def test_no_budget_no_replication():
    d = D.sequential(first_of(0.001, 10.0, 0), toy(0.001, 10.0, 5), ["max_dropped"], {"max_dropped": 0.01},
                     0.95, plan(need=1e5), D.Budget(0, 1e9))
    assert len(d.reps) == 1 and d.open == ["max_dropped"]


def test_quantiles_pool_the_lanes_of_every_run():
    rng = np.random.default_rng(7)
    reps = [lane_draws(rng, 0.001, 5.0, n, 100) for n in (20, 7, 12)]
    found = D.intervals(reps, ["max_sojourn_p95_s", "max_delay_p95_steps"], 0.95)
    values = np.concatenate([r.samples["sojourn"][0] for r in reps])
    unit = np.concatenate([r.samples["sojourn"][1] + off for r, off in zip(reps, (0, 20, 27))])
    share = lambda a, b: D.ratio_interval(a, b, 0.95)[1:]  # noqa: E731
    want = steady.quantile_interval(values, unit, 0.95, None, 0.95, share=share)
    assert found["max_sojourn_p95_s"] == pytest.approx((np.quantile(values, 0.95, method="inverted_cdf"), *want))
    assert found["max_delay_p95_steps"][1] <= found["max_delay_p95_steps"][0] <= found["max_delay_p95_steps"][2]


def test_bias_reads_the_runs_from_two_on():
    rng = np.random.default_rng(2)
    reps = [lane_draws(rng, 0.001, 5.0, 10, 50) for _ in range(3)]
    for r, b in zip(reps, (0.010, 0.012, 0.011)):
        r.means = {"bias_vs_naive": b}
    assert "max_bias_vs_naive" not in D.intervals(reps[:1], ["max_bias_vs_naive"], 0.95)
    assert D.intervals(reps, ["max_bias_vs_naive"], 0.95)["max_bias_vs_naive"] == pytest.approx(
        D.mean_interval(np.array([0.010, 0.012, 0.011]), 0.95))


def test_open_targets_straddle_or_zero():
    t = {"max_dropped": 0.01, "max_sojourn_p95_s": None}
    assert D.open_targets(row(0.002, 0.02), t) == ["max_dropped"]  # straddles
    assert D.open_targets(row(0.01, 0.02), t) == ["max_dropped"]  # lo on the target
    assert D.open_targets(row(0.0, 0.0), t) == ["max_dropped"]  # a run that saw no event
    assert D.open_targets(row(0.0, 0.0), t, zero=False) == []  # one without slow regimes to miss
    assert D.open_targets(row(0.0, 0.005), t) == []  # passes
    assert D.open_targets(row(0.02, 0.03), t) == []  # fails
    assert D.open_targets(row(0.002, 0.02), {"max_dropped": None}) == []  # no target
    assert D.open_targets(row(0.0, 0.02), {"max_dropped": 0.0}) == []  # an event seen fails a target of 0
    assert D.open_targets(row(0.0, 0.0), {"max_dropped": 0.0}) == []  # and none seen cannot settle it
    assert D.set_targets({"max_dropped": 0.0, "max_sojourn_p95_s": 3.0, "max_bias": 1.0}) == ["max_sojourn_p95_s"]


def test_bias_targets_are_open_only_where_asked():
    r = {**row(0.0, 0.005), "bias_vs_naive_lo": 0.01, "bias_vs_naive_hi": 0.3, "bias_exact_lo": 1.0, "bias_exact_hi": 2.0}
    t = {"max_dropped": 0.01, "max_bias_vs_naive": 0.1, "max_bias": 3.0}
    assert D.open_targets(r, t) == []  # no slow regime: the trials' intervals stand
    assert D.open_targets(r, t, bias=True) == ["max_bias_vs_naive"]  # straddles; the bias is clear


def test_budget_counts_steps_and_seconds():
    b = D.Budget(steps=100, seconds=1e9)
    assert b.affords(60) and not b.affords(60) and b.affords(40) and b.used == 100
    assert not D.Budget(steps=100, seconds=0.0).affords(1)


V = "pipeline.channels.verifier"
# A cheap queue with outages: 3-6 workers, 8 exponential requests every 4 s, results older than 4 steps dropped.
SMALL_QUEUE = ("scenario=capacity/code_verifier", f"latency@{V}.latency=exponential", f"{V}.latency.low=0.0",
               f"{V}.latency.high=null", f"{V}.latency.mean=1.3", "pipeline.generate.kind=deterministic",
               "pipeline.generate.mean=4.0", "pipeline.fast_score.mean=0.0", "pipeline.submit.mean=0.0",
               "pipeline.update.mean=0.0", "pipeline.batch_size=8", f"{V}.max_delay=4",
               f"{V}.faults.mtbf_s=400.0", f"{V}.faults.mttr_s=40.0", "pipeline.steps=40", "pipeline.warmup_steps=8",
               "learner.trials=6", "learner.bootstrap=0", "capacity.run_length=fixed", "capacity.resamples=20",
               "capacity.benchmark=false", "capacity.sensitivity.enabled=false", "capacity.workers=1",
               "capacity.counts=[3,4,5]", "capacity.max_bias_vs_naive=null", "capacity.max_step_s=null",
               "corrector.names=[naive,rac]")


def small_search(*more, progress=None):
    return run_capacity(scenario(compose_config(*SMALL_QUEUE, *more)), progress)


def rac(curve: pd.DataFrame) -> pd.DataFrame:
    return curve[curve.corrector == "rac"].set_index("count")


def need_at(res, m: int, target: float) -> float:
    """The trial-steps the chain of the small queue at ``m`` workers asks for, for a dropped-share target."""
    cfg = scenario(compose_config(*SMALL_QUEUE))
    found = count_episodes(with_count(cfg, f"{V}.workers", m), "verifier", res.loads[m]["work_per_s"])
    return D.need_of(found.share, found.rate, found.length, {"max_dropped": target}, ["max_dropped"], 0.95)


def test_the_answers_counts_read_their_rare_figures_off_sized_replications():
    rec = Recorder()
    res = small_search("capacity.max_dropped=0.05", "capacity.decide_steps=3000", progress=rec)
    got = rac(res.curve)
    answer = res.recommended
    assert answer is not None and not res.notes
    replicated = [m for m in got.index if got.loc[m, "replications"] > 1]
    # the counts the answer depended on as it moved down (a count that passes makes the one below it matter)
    assert answer in replicated and min(replicated) >= answer - 1
    for m in (answer, answer - 1):
        r = got.loc[m]
        if r["status"] != "ok":
            continue
        # resolved: the trial-steps the chain asks for, or EPISODES drop episodes seen; then decided
        assert r["measured_steps"] >= need_at(res, m, 0.05) or r["drop_episodes"] >= EPISODES
        assert r["unresolved"] == "" and (r["dropped_frac_hi"] <= 0.05 or r["dropped_frac_lo"] > 0.05)
    said = [c for c in rec.calls if "replication" in c[4]]  # a line before each run, the steps done before it
    assert {(phase, total) for _, phase, _, total, _ in said} == {("deciding replications", 3000)}
    done = [d for _, _, d, _, _ in said]
    assert done == sorted(done) and done[0] == 0 and done[-1] < res.replicated_steps <= 3000
    assert "max_dropped open" in said[0][4] and " trials x " in said[0][4]


def test_a_budget_that_cannot_size_the_replications_leaves_the_figure_unresolved():
    res = small_search("capacity.max_dropped=0.05", "capacity.decide_steps=10")
    got = rac(res.curve)
    lines = [t for t in res.notes if "unresolved" in t]
    assert lines and res.replicated_steps <= 10
    for t in lines:  # each count left open says so, and fails: the answer is above it (the safe side)
        m = int(t.split(" or ")[0])
        assert got.loc[m, "unresolved"] == "max_dropped" and "max_dropped" in got.loc[m, "fails"]
        assert res.recommended is None or res.recommended > m
        assert f"dropped at {m} unresolved" in t and "the regime's chain" in t and "nan" not in t
        assert "cannot afford to settle it, so the larger count is recommended" in t


def test_budget_zero_leaves_the_first_readings():
    base = small_search("capacity.decide_steps=0")
    assert base.replicated_steps == 0 and set(rac(base.curve)["replications"]) <= {0, 1}


def test_an_undecided_bias_ratio_is_replicated_with_the_bias_study():
    first = rac(small_search("capacity.decide_steps=0", "capacity.max_dropped=null").curve)
    n = next(n for n in (5, 6, 7) if n in first.index and first.loc[n, "bias_vs_naive_lo"] < first.loc[n, "bias_vs_naive_hi"])
    target = float(first.loc[n, ["bias_vs_naive_lo", "bias_vs_naive_hi"]].mean())
    res = small_search("capacity.max_dropped=null", f"capacity.max_bias_vs_naive={target!r}", "capacity.decide_steps=120")
    curve = res.curve.set_index(["count", "corrector"])
    done = [m for m in curve.index.levels[0] if curve.loc[(m, "rac"), "replications"] > 1]
    assert done and res.replicated_steps <= 120
    for m in done:  # the chosen corrector's bias ratio rebuilt on the replications; naive's row keeps its own
        assert curve.loc[(m, "rac"), "bias_vs_naive"] != first.loc[m, "bias_vs_naive"]
        assert curve.loc[(m, "naive"), "bias_vs_naive"] == pytest.approx(1.0)
        assert curve.loc[(m, "naive"), "replications"] == curve.loc[(m, "rac"), "replications"]


def test_an_unresolved_target_fails_its_count():
    """The safe side: a target the replications left open fails, whatever its interval reads."""
    r = {"status": "ok", "dropped_frac_hi": 0.004, "sojourn_p95_s_hi": 3.0, "unresolved": "max_dropped"}
    t = {"max_dropped": 0.01, "max_sojourn_p95_s": 5.0}
    assert failed(r, t) == ["max_dropped"] and unresolved(r) == ["max_dropped"]
    assert failed({**r, "unresolved": ""}, t) == [] and unresolved({**r, "unresolved": float("nan")}) == []
    assert failed({**r, "unresolved": "max_dropped, max_sojourn_p95_s"}, t) == ["max_dropped", "max_sojourn_p95_s"]


def test_the_curve_reads_rare_figures_off_the_trials():
    """Under a chain, every simulated count's dropped share is the ratio over its trials, never narrower
    than its episodes' Poisson count allows, bounded by the chain's episode where none was seen."""
    res = small_search("capacity.decide_steps=0", "capacity.counts=[4,5,6,8,12]")
    got = rac(res.curve)
    cfg = scenario(compose_config(*SMALL_QUEUE))
    for m in got.index[got["status"] == "ok"]:
        r = got.loc[m]
        assert r["measured_steps"] == cfg.learner.trials * (r["steps"] - r["warmup_steps"])
        e = r["drop_episodes"]
        if e == 0:
            found = count_episodes(with_count(cfg, f"{V}.workers", m), "verifier", res.loads[m]["work_per_s"])
            assert r["dropped_frac"] == r["dropped_frac_lo"] == 0.0
            assert r["dropped_frac_hi"] == pytest.approx(-math.log(0.025) * found.length / r["measured_steps"])
        else:
            k = e / (1 + D.SIZE_CV2)
            lo, hi = D.poisson_interval(k, 0.95)
            assert r["dropped_frac_lo"] <= r["dropped_frac"] * lo / k + 1e-12
            assert r["dropped_frac_hi"] >= r["dropped_frac"] * hi / k - 1e-12


def test_the_recommended_count_is_decided_before_the_one_below_it(monkeypatch):
    """The budget settles the answer's candidate first (issue 50: deciding the fewer first let its
    replications spend what the candidate needed, so the answer moved up by the luck of the order)."""
    import racsim.analyses.capacity.run as run_module

    target, listed = "capacity.max_dropped=0.2", "capacity.counts=[3,4,5,6,7]"  # 7 listed: the search's answer
    f = small_search(target, listed, "capacity.decide_steps=0").recommended
    order, real = [], run_module.decide_count
    monkeypatch.setattr(run_module, "decide_count", lambda *a, **k: order.append(a[3]) or real(*a, **k))
    res = small_search(target, listed, "capacity.decide_steps=3000")
    got = rac(res.curve)
    assert f is not None and f - 1 in got.index and got.loc[f - 1, "replications"] > 1  # both were replicated
    assert order[:2] == [f, f - 1]


@pytest.mark.parametrize("target,budget", [("0.2", 3000), ("0.1", 3000), ("0.2", 1), ("0.1", 40), ("0.05", 40)])
def test_a_largest_count_that_straddles_is_decided_before_any_count_above_it(monkeypatch, target, budget):
    """The list stops at 5 workers, whose dropped share straddles the target: the deciding phase settles
    5 first, and the search runs no count above it where 5 passes once settled; where it fails (or the
    budget leaves it open), the counts above are searched as before and the fewest meeting the targets
    decided next. Either way the answer is the one of a search that lists the counts above 5 and
    decides from the top (the same replications at each count decided in both)."""
    import racsim.analyses.capacity.run as run_module

    order, real = [], run_module.decide_count
    monkeypatch.setattr(run_module, "decide_count", lambda *a, **k: order.append(a[3]) or real(*a, **k))
    more = (f"capacity.max_dropped={target}", f"capacity.decide_steps={budget}")
    full = small_search(*more, "capacity.counts=[3,4,5,6,7,8,9,10]")
    order.clear()
    res = small_search(*more)
    got, five = rac(res.curve), rac(small_search(*more, "capacity.decide_steps=0").curve).loc[5]
    assert five["dropped_frac_lo"] <= float(target) < five["dropped_frac_hi"]  # 5 straddles as the search reads it
    assert order[0] == 5 and res.recommended == full.recommended
    if got.loc[5, "feasible"]:  # settled passing: nothing above 5 was simulated
        assert max(got.index) == 5 and order == [5, 4]
    else:  # the counts above searched, their fewest meeting the targets decided next
        assert max(got.index) > 5 and order[1] > 5
    for n in order:
        cols = ["dropped_frac", "dropped_frac_lo", "dropped_frac_hi", "replications"]
        if got.loc[n, "replications"] == rac(full.curve).loc[n, "replications"]:
            assert got.loc[n, cols].tolist() == rac(full.curve).loc[n, cols].tolist()


def test_a_count_is_replicated_alike_on_any_machine_and_in_any_process(monkeypatch):
    """A count's plan (and so its stages, and every figure read off them) is the same whatever
    capacity.workers, the machine's cores, or a pool's worker running the search (where a pool would
    else run one process: a sweep's job, a seeds table): before, a stage's runs were rounded up to a
    multiple of the processes at hand, so 3 runs on 2 cores were 4 there and 3 in a worker."""
    import racsim.io
    from racsim.analyses.capacity.replications import count_plan
    from racsim.analyses.capacity.targets import targets_of

    res = small_search("capacity.decide_steps=0")
    row, work = rac(res.curve).loc[5].to_dict(), res.loads[5]["work_per_s"]
    plans = []
    for workers in (0, 1, 3):
        for cores in (1, 2, 16):
            monkeypatch.setattr(racsim.io, "usable_cores", lambda cores=cores: cores)
            cfg = scenario(compose_config(*SMALL_QUEUE, f"capacity.workers={workers}"))
            plans.append(count_plan(cfg, "verifier", f"{V}.workers", 5, row, ["max_dropped"], targets_of(cfg), work))
    assert all(p == plans[0] for p in plans) and plans[0].together == D.STAGE_MULTIPLE
    runs = D.stage([lane_draws(np.random.default_rng(0), 0.001, 5.0, 20, 100)], plan(need=3e4, cap=120, warmup=20,
                                                                                   together=D.STAGE_MULTIPLE))
    assert len(runs) % D.STAGE_MULTIPLE == 0 and len(runs) > 1

