"""Steady-state capacity answers (racsim/pipeline/steady.py, racsim/analyses/capacity/) against
oracles written here: slow loops for the estimators, Erlang C for M/M/c queues, a hand-built
batching loop for the judge's offered load, an AR(1) process of known mean for the intervals."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from racsim.analyses.bias_study import simulate_schedules
from racsim.analyses.capacity import channel_loads, run_capacity
from racsim.config.defaults import compose_config
from racsim.config.spec import scenario
from racsim.learner.bias import bootstrap_counts
from racsim.pipeline import steady
from racsim.pipeline.draws import draw, work_seconds
from racsim.pipeline.service import build_service
from racsim.seeds import rng_for


def erlang_c_wait(c: int, lam: float, mu: float) -> float:
    """Mean wait in queue of an M/M/c queue (Erlang C)."""
    a = lam / mu
    rho = a / c
    head = sum(a ** k / math.factorial(k) for k in range(c))
    tail = a ** c / math.factorial(c) / (1.0 - rho)
    return tail / (head + tail) / (c * mu - lam)


def mmc(c: int, lam: float, steps: int, *more: str, batch: int = 2800):
    """An M/M/c queue as a racsim pipeline: exponential service of mean 1 s on ``c`` workers,
    Poisson arrivals at ``lam`` per second (``batch`` per deterministic step of batch / lam seconds)."""
    return scenario(compose_config(
        "scenario=capacity/code_verifier", "latency@pipeline.channels.verifier.latency=exponential",
        "pipeline.channels.verifier.latency.mean=1.0", "pipeline.channels.verifier.latency.low=0.0",
        "pipeline.channels.verifier.latency.high=null", "pipeline.arrivals.mode=poisson",
        "pipeline.generate.kind=deterministic", f"pipeline.generate.mean={batch / lam!r}",
        "pipeline.fast_score.mean=0.0", "pipeline.submit.mean=0.0", "pipeline.update.mean=0.0",
        f"pipeline.batch_size={batch}", "pipeline.channels.verifier.max_delay=100000",
        f"pipeline.channels.verifier.workers={c}", f"pipeline.steps={steps}", *more))


# ----------------------------------------------------------------------------
# The estimators against slow loops.


def mser_loop(x, m=5):
    b = len(x) // m
    if b < 4:
        return None
    z = [sum(x[j * m:(j + 1) * m]) / m for j in range(b)]
    crit = []
    for d in range(b // 2 + 1):
        rest = z[d:]
        mean = sum(rest) / len(rest)
        crit.append(sum((v - mean) ** 2 for v in rest) / len(rest) ** 2)
    arg = crit.index(min(crit))
    return None if arg == b // 2 else arg * m


@pytest.mark.parametrize("seed", range(30))
def test_mser_against_a_loop(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(10, 300))
    x = rng.standard_normal(n) * rng.uniform(0.1, 3)
    if seed % 3 == 0:  # a transient that decays: the warm-up to find
        x += 8 * np.exp(-np.arange(n) / rng.uniform(2, 30))
    if seed % 3 == 1:  # a ramp: the warm-up never ends
        x += np.linspace(0, 10, n)
    assert steady.mser(x) == mser_loop(list(x))


def test_mser_finds_a_transient_and_refuses_a_ramp():
    rng = np.random.default_rng(0)
    x = 20 * np.exp(-np.arange(400) / 10) + rng.standard_normal(400)
    d = steady.mser(x)
    assert d is not None and 20 <= d <= 80
    assert steady.mser(np.arange(200.0) + rng.standard_normal(200)) is None
    assert steady.mser(np.zeros(50)) == 0


def ar1(rng, n, phi, mean):
    e = rng.standard_normal(n + 500)
    x = np.empty_like(e)
    x[0] = e[0]
    for i in range(1, x.size):
        x[i] = phi * x[i - 1] + e[i]
    return mean + x[500:]


def test_batch_means_interval_covers_the_known_mean():
    """95% batch-means intervals of an AR(1) process of mean 3 (phi 0.6, 20 batches of 100):
    coverage within 0.90-0.98 over 200 replications."""
    rng = np.random.default_rng(1)
    hits = 0
    for _ in range(200):
        m, h = steady.batch_means_ci(ar1(rng, 2000, 0.6, 3.0), k=20)
        hits += abs(m - 3.0) <= h
    assert 0.90 <= hits / 200 <= 0.98


def test_batch_means_against_a_loop():
    x = np.random.default_rng(2).standard_normal(103)
    z = steady.batch_means(x, 10)
    want = [sum(x[3 + 10 * j: 13 + 10 * j]) / 10 for j in range(10)]  # the oldest 3 values dropped
    np.testing.assert_allclose(z, want, rtol=1e-12)
    m, h = steady.batch_means_ci(x, 10, 0.9)
    s = math.sqrt(sum((v - sum(want) / 10) ** 2 for v in want) / 9)
    from scipy.stats import t
    assert m == pytest.approx(sum(want) / 10) and h == pytest.approx(t.ppf(0.95, 9) * s / math.sqrt(10))


def test_verdict_on_stationary_and_drifting_series():
    rng = np.random.default_rng(3)
    ok = sum(steady.verdict(ar1(rng, 200, 0.5, 1.0)).stationary for _ in range(100))
    assert ok >= 85  # false alarms (they only lengthen a capacity run) stay rare
    # a drift of 10 (5 of the noise's standard deviations) over the run is always seen, one of 6 nearly always
    for amp, missed in ((10, 0), (6, 5)):
        assert sum(steady.verdict(np.linspace(0, amp, 200) + ar1(rng, 200, 0.5, 0.0)).stationary
                   for _ in range(50)) <= missed
    v = steady.verdict(np.ones(60), warmup=7)
    assert v == steady.Verdict(7, True, "")
    assert not steady.verdict(np.ones(30), warmup=20).stationary  # 10 steps left: too few batches


def ar1_trials(rng, trials, n, phi):
    """(trials, n) independent stationary AR(1) series of unit innovations."""
    e = rng.standard_normal((trials, n + 200))
    x = np.empty_like(e)
    x[:, 0] = e[:, 0]
    for i in range(1, x.shape[1]):
        x[:, i] = phi * x[:, i - 1] + e[:, i]
    return x[:, 200:]


def t_test_p(values):
    """The one-sample t-test's two-sided p that the mean of ``values`` is 0 (equal values: 1 or 0)."""
    from scipy import stats
    if max(values) - min(values) <= 1e-9:
        return 1.0 if abs(values[0]) <= 1e-9 else 0.0
    return stats.ttest_1samp(values, 0.0).pvalue


def replicated_mser_loop(x, m=5):
    """replicated_mser by hand: MSER on the mean (mser_loop); on the half's edge, the edge if the
    trials' differences between the batch before it and the window after, and their least-squares
    slopes after it, each have a mean a one-sample t-test keeps at 0 (p >= 0.01)."""
    mean = [sum(col) / len(col) for col in zip(*x)]
    d = mser_loop(mean, m)
    if d is not None:
        return d
    b = len(mean) // m
    if b < 4 or len(x) < 3:
        return None
    edge = (b // 2) * m
    slopes = [np.polyfit(np.arange(len(row) - edge), row[edge:], 1)[0] for row in x]
    steps = [sum(row[edge - m:edge]) / m - sum(row[edge:]) / (len(row) - edge) for row in x]
    return edge if t_test_p(slopes) >= 0.01 and t_test_p(steps) >= 0.01 else None


@pytest.mark.parametrize("seed", range(40))
def test_replicated_mser_against_a_loop(seed):
    """Random replications reaching every branch: an interior minimum, the edge with the trials flat
    after it (the edge kept), the edge with the batch before it off the window's level, with a
    slope after it, or both (None), under 3 trials, under 4 batches."""
    rng = np.random.default_rng(seed)
    trials, n = int(rng.integers(1, 12)), int(rng.integers(15, 80))
    x = ar1_trials(rng, trials, n, 0.5)
    kind = seed % 4
    if kind == 1:  # a transient that decays: an interior minimum, or one past the middle
        x += 6 * np.exp(-np.arange(n) / rng.uniform(2, 20))
    if kind == 2:  # a ramp: every trial still moving
        x += np.linspace(0, rng.uniform(2, 20), n)
    if kind == 3:  # a ramp from the middle on: level at the edge, a slope after it
        x[:, n // 2:] += np.linspace(0, rng.uniform(1, 6), n - n // 2)
    want = replicated_mser_loop(x.tolist())
    assert steady.replicated_mser(x) == want
    if want is not None:
        assert steady.verdict(x).warmup == want


def test_replicated_mser_reaches_the_edge_both_ways():
    """The edge kept where the trials are flat after it, refused where they still climb (a ramp
    whose mean's minimum is on the edge too; elsewhere the verdict's trend test sees the ramp)."""
    rng = np.random.default_rng(7)
    kept = edge = 0
    for _ in range(200):
        x = ar1_trials(rng, 20, 40, 0.5)
        if steady.mser(x.mean(axis=0)) is None:  # the mean's minimum on the edge
            kept += steady.replicated_mser(x) == 20
        ramp = x + np.linspace(0, 4, 40)
        assert not steady.verdict(ramp).stationary
        if steady.mser(ramp.mean(axis=0)) is None:
            edge += 1
            assert steady.replicated_mser(ramp) is None
    assert kept >= 15 and edge >= 15


def test_replications_clear_the_edge_and_still_see_a_warm_up():
    """At 40 steps, 20 stationary AR(1) replications (noise sd 1.15): their mean alone is flagged
    8-30% of the time (MSER-5's edge, measured 17%), with the trials' tests at most 5% (measured
    2%); a warm-up still 0.8-4.4 off the level at the middle of the run (6 e^{-t/tau}, tau 10 or
    20, or 12 e^{-t/10}) is flagged in at least 80 of 100 runs (measured 84-100; the mean alone
    99-100), a drift of 4 always."""
    rng = np.random.default_rng(11)
    xs = [ar1_trials(rng, 20, 40, 0.5) for _ in range(200)]
    alone = sum(not steady.verdict(x.mean(axis=0)).stationary for x in xs) / len(xs)
    trials = sum(not steady.verdict(x).stationary for x in xs) / len(xs)
    assert 0.08 <= alone <= 0.30 and trials <= 0.05, (alone, trials)
    for amp, tau in ((6, 10), (6, 20), (12, 10)):
        warm = amp * np.exp(-np.arange(40) / tau)
        assert sum(not steady.verdict(x - warm).stationary for x in xs[:100]) >= 80
    assert all(not steady.verdict(x + np.linspace(0, 4, 40)).stationary for x in xs[:100])


def linear_quantile(values, p):
    """The p quantile of ``values`` interpolating linearly between order statistics (NumPy's default)."""
    v = sorted(values)
    h = (len(v) - 1) * p
    i = math.floor(h)
    return v[i] if i + 1 >= len(v) else v[i] + (h - i) * (v[i + 1] - v[i])


def loop_bca(num, den, counts, level):
    """BCa of sum(num) / sum(den), one resample and one left-out unit at a time (the oracle of
    steady.bca_interval), with the standard library's normal distribution."""
    N = NormalDist()
    r = sum(num) / sum(den)
    boot = []
    for c in counts:
        db = sum(ci * b for ci, b in zip(c, den))
        if db > 0:
            boot.append(sum(ci * a for ci, a in zip(c, num)) / db)
    jack = [(sum(num) - a) / (sum(den) - b) for a, b in zip(num, den) if sum(den) - b > 0]
    mean = sum(jack) / len(jack)
    d = [mean - j for j in jack]
    ss = sum(x * x for x in d)
    if ss == 0 or all(b == r for b in boot):
        return r, r
    acc = sum(x ** 3 for x in d) / (6 * ss ** 1.5)
    share = (sum(b < r for b in boot) + 0.5 * sum(b == r for b in boot)) / len(boot)
    z0 = N.inv_cdf(min(max(share, 0.5 / len(boot)), 1 - 0.5 / len(boot)))
    ends = []
    for z in (N.inv_cdf((1 - level) / 2), N.inv_cdf((1 + level) / 2)):
        w = z0 + z
        at = N.cdf(z0 + w / (1 - acc * w)) if 1 - acc * w > 0 else (1.0 if w > 0 else 0.0)
        ends.append(linear_quantile(boot, at))
    return tuple(ends)


def loop_ratio_interval(num, den, counts, level):
    """bootstrap-t of sum(num) / sum(den), one resample at a time, or BCa with fewer than ten units
    of nonzero num, a minority of the units (the oracle of steady.ratio_interval)."""
    n, r = len(num), sum(num) / sum(den)
    se = math.sqrt(sum((a - r * b) ** 2 for a, b in zip(num, den)) * n / (n - 1)) / sum(den)
    if se == 0:
        return r, r
    carriers = sum(a != 0 for a in num)
    if carriers < 10 and 2 * carriers < n:
        return loop_bca(num, den, counts, level)
    ts = []
    for c in counts:
        nb, db = sum(ci * a for ci, a in zip(c, num)), sum(ci * b for ci, b in zip(c, den))
        if db == 0:
            continue
        rb = nb / db
        seb = math.sqrt(sum(ci * (a - rb * b) ** 2 for ci, a, b in zip(c, num, den)) * n / (n - 1)) / db
        if seb > 0:
            ts.append((rb - r) / seb)
    lo_t, hi_t = np.percentile(ts, [50 * (1 - level), 100 - 50 * (1 - level)])
    top = 1.0 if all(a <= b for a, b in zip(num, den)) else math.inf
    return min(max(r - hi_t * se, 0.0), top), min(max(r - lo_t * se, 0.0), top)


def test_bca_against_a_loop_in_every_branch():
    """steady.bca_interval against loop_bca on random units with few nonzero numerators: positive and
    negative acceleration, resamples tied with the estimate, resamples without a denominator, a
    level past the accelerated scale, and the degenerate cases."""
    rng = np.random.default_rng(2026)
    seen = set()
    for case in range(400):
        T = int(rng.integers(2, 15))
        num = (rng.random(T) < rng.uniform(0.05, 0.9)) * rng.integers(1, 30, T).astype(float)
        den = num + rng.integers(0 if case % 5 == 0 else 1, 40, T)
        if den.sum() == 0:
            den[0] = 1.0
        if case % 7 == 0:  # one dominant unit, at an extreme level: past the scale
            num = np.zeros(T)
            num[0], den = 50.0, np.full(T, 60.0)
        if case % 11 == 0:  # a unit without a denominator: some resamples hold no other
            T, num, den = 3, np.array([0.0, 1.0, 2.0]), np.array([0.0, 3.0, 7.0])
        level = 1 - 1e-12 if case % 7 == 0 else float(rng.choice([0.8, 0.9, 0.95]))
        counts = bootstrap_counts(T, int(rng.choice([20, 60])), rng)
        got = steady.bca_interval(num, den, counts, level)
        want = loop_bca(num.tolist(), den.tolist(), counts, level)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
        r = num.sum() / den.sum()
        assert got[0] <= got[1] and (got[0] <= r <= got[1] or got[0] == got[1] == r)
        dens = counts @ den
        boot = counts @ num / np.where(dens > 0, dens, np.nan)
        d = (num.sum() - num) / (den.sum() - den)
        d = d[np.isfinite(d)]
        d = d.mean() - d
        if not np.any(d) or np.all(boot[np.isfinite(boot)] == r):
            seen.add("degenerate")
            continue
        acc = np.sum(d ** 3) / (6 * np.sum(d * d) ** 1.5)
        seen.add("a > 0" if acc > 0 else "a < 0")
        seen.update(["no denominator"] * bool(np.isnan(boot).any()) + ["tie"] * bool(np.any(boot == r)))
        b = boot[np.isfinite(boot)]
        z = NormalDist().inv_cdf((1 + level) / 2)
        if level > 0.999 and 1 - acc * (z + abs(NormalDist().inv_cdf(0.5 / b.size))) <= 0:
            seen.add("past the scale")
    assert seen >= {"degenerate", "a > 0", "a < 0", "no denominator", "tie", "past the scale"}, seen
    assert all(math.isnan(v) for v in steady.bca_interval(np.array([]), np.array([]), np.zeros((5, 0)), 0.9))


def lower_quantile(values, q):
    """The first value whose cumulative share reaches q."""
    v = sorted(values)
    return v[max(math.ceil(q * len(v)) - 1, 0)]


@pytest.mark.parametrize("seed", range(12))
def test_ratio_and_quantile_intervals_against_loops(seed):
    rng = np.random.default_rng(seed)
    T = int(rng.integers(3, 12)) if seed < 6 else int(rng.integers(14, 40))  # BCa (< 10 units of drops) or t
    counts = bootstrap_counts(T, 60, rng)
    level = float(rng.choice([0.8, 0.9, 0.95]))
    rare = seed % 2 == 0  # most units without a drop: the lower end clipped at 0
    num = (rng.random(T) < 0.3) * rng.integers(1, 4, T) if rare else rng.integers(0, 9, T)
    den = num + rng.integers(0 if seed == 5 else 1, 20, T)
    if den.sum() == 0:
        den[0] = 1
    got = steady.ratio_interval(num, den, counts, level)
    want = loop_ratio_interval(num.tolist(), den.tolist(), counts, level)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    assert got[0] <= num.sum() / den.sum() <= got[1]
    big = num + 3 * den  # not a share: no upper clip
    np.testing.assert_allclose(steady.ratio_interval(big, den, counts, level),
                               loop_ratio_interval(big.tolist(), den.tolist(), counts, level), rtol=1e-9)
    assert steady.ratio_interval(2 * den, den, counts, level) == (2.0, 2.0)  # every residual 0
    assert all(math.isnan(v) for v in steady.ratio_interval(num, 0 * den, counts, level))
    for integer in (True, False):
        n = rng.integers(0, 40, T)
        n[0] += 1
        values = np.concatenate([(rng.integers(0, 9, k) if integer else rng.lognormal(0, 1, k)).astype(float)
                                 for k in n])
        unit = np.repeat(np.arange(T), n)
        for q in (0.5, 0.95):
            x = lower_quantile(values.tolist(), q)
            above = [sum(1 for v, u in zip(values, unit) if u == t and v > x) for t in range(T)]
            e_lo, e_hi = loop_ratio_interval(above, n.tolist(), counts, level)
            e = sum(above) / len(values)
            lo_q, hi_q = min(max(q - (e - e_lo), 0.0), 1.0), min(max(q + (e_hi - e), 0.0), 1.0)
            want = (lower_quantile(values.tolist(), lo_q), lower_quantile(values.tolist(), hi_q))
            got = steady.quantile_interval(values, unit, q, counts, level)
            assert got == pytest.approx(want), (integer, q)
            assert got[0] <= x <= got[1]
    assert all(math.isnan(v) for v in steady.quantile_interval(np.array([]), np.array([], int), 0.5, counts, level))
    a = rng.random(T)
    np.testing.assert_allclose(steady.boot_mean(a, counts), [(c @ a) / T for c in counts], rtol=1e-12)
    assert steady.percentile_interval(np.arange(101.0), 0.9) == pytest.approx((5.0, 95.0))


def test_in_system_against_a_loop():
    cfg = mmc(2, 2.2, 12, batch=6)  # load 1.1: a queue that grows
    s = simulate_schedules(cfg, 3, "pipeline", ["naive"])["async"]
    got = steady.in_system(s, 0)
    for i in range(3):
        for t in range(s.n_steps):
            at = s.step_start[i, t]
            sub = s.submit_time[i, ..., 0].ravel()
            gone = s.completion[i, ..., 0].ravel()
            want = sum(1 for a, g in zip(sub, gone) if a <= at and not g <= at)
            assert got[i, t] == want
    assert got[:, -1].mean() > got[:, 2].mean()  # overloaded: the backlog grows


# ----------------------------------------------------------------------------
# Queueing theory.


def test_detected_warmup_gives_erlang_c_wait():
    """M/M/4 at rho 0.7 started empty: after the detected warm-up the mean wait is within 2% of
    Erlang C (1.7 million customers; the batch-means interval holds Erlang C too)."""
    cfg = mmc(4, 2.8, 30)
    s = simulate_schedules(cfg, 20, "pipeline", ["naive"])["async"]
    v = steady.verdict(steady.in_system(s, 0).mean(axis=0))
    assert v.stationary
    wait = (s.service_start - s.submit_time)[:, v.warmup:, :, 0]
    want = erlang_c_wait(4, 2.8, 1.0)
    assert wait.mean() == pytest.approx(want, rel=0.02)
    m, h = steady.batch_means_ci(wait.mean(axis=(0, 2)), k=5, level=0.99)
    assert abs(m - want) <= h


@pytest.mark.parametrize("steps", [50, 400, pytest.param(2000, marks=pytest.mark.long)])  # 2000: 2.3 CPU s
def test_an_overloaded_queue_is_never_recommended(steps):
    """M/M/4 offered 1.05: never recommended, at any run length; its own series says so too. The
    list skips 5-7: the search finds 5 (offered 0.84), the fewest that meets the (load-only) targets."""
    cfg = mmc(4, 4.2, steps, "capacity.counts=[4,8]", "learner.trials=3", "capacity.max_steps=2000",
              "capacity.benchmark=false", "capacity.max_bias_vs_naive=null", "capacity.max_step_s=null",
              "learner.horizon=4", batch=21)
    res = run_capacity(cfg)
    four = res.curve[res.curve["count"] == 4]
    assert four.load.iloc[0] == pytest.approx(1.05, rel=0.02)
    assert four.status.str.startswith("overloaded").all() and not four.feasible.any()
    assert res.recommended == 5 and 5 in res.searched and res.listed == [4, 8]
    if steps >= 400:  # simulated anyway, it shows no steady state (the trend of its backlog)
        s = simulate_schedules(cfg, 3, "pipeline", ["naive"])["async"]
        assert not steady.verdict(steady.in_system(s, 0).mean(axis=0)).stationary


def test_a_stable_pool_gets_the_same_answer_at_any_length():
    """M/M/c offered 0.7 on 4 workers (0.93 on 3): the recommendation at 50 steps is the one at 2000."""
    answers = []
    for steps in (50, 2000):
        cfg = mmc(4, 2.8, steps, "capacity.counts=[2,4,6]", "learner.trials=3", "capacity.max_steps=2000",
                  "capacity.benchmark=false", "capacity.max_bias_vs_naive=null", "capacity.max_step_s=null",
                  "capacity.max_load=0.8", "learner.horizon=4", batch=8)
        res = run_capacity(cfg)
        rows = res.curve[res.curve.corrector == "rac"].set_index("count")
        assert rows.loc[4, "status"] == "ok"
        answers.append(res.recommended)
    assert answers == [4, 4]


# ----------------------------------------------------------------------------
# The offered load.


def test_judge_offered_load_by_hand():
    """The judge's offered load at 4 H100s: GPU-seconds of each step's 1024 sequences in FIFO full
    batches (32 sequences or 32768 padded tokens), by a plain loop over freshly drawn lengths, per
    second of the mean step, over 4 GPUs: within 1% of racsim's (1.11 at a flat MFU of 0.4, as the issue
    measured)."""
    cfg = scenario(compose_config("scenario=capacity/judge_rm_h100", "pipeline.channels.judge.rm.mfu=0.4"))
    rm = cfg.pipeline.channels["judge"].rm
    model = build_service(rm)
    rng = np.random.default_rng(123)

    def lengths(law, n):
        mu = math.log(law.mean) - law.sigma ** 2 / 2
        return np.maximum(rng.lognormal(mu, law.sigma, n), law.low)

    work = []
    for _ in range(60):  # steps
        tok = np.maximum(np.rint(lengths(rm.prompt_tokens, 1024)) + np.rint(lengths(rm.response_tokens, 1024)), 1)
        total, batch = 0.0, []
        for x in list(tok) + [None]:
            if x is not None and len(batch) < rm.max_batch and (len(batch) + 1) * max(batch + [x]) <= rm.token_budget:
                batch.append(x)
                continue
            b = np.array(batch)
            total += float(model.seconds(len(b), b.sum(), (b * b).sum(), b.max()))
            batch = [x]
        work.append(total)
    p = cfg.pipeline
    step = sum(getattr(p, phase).mean for phase in ("generate", "fast_score", "submit", "update"))
    want = np.mean(work) / step / 4
    got = channel_loads(cfg, "judge", "pipeline.channels.judge.rm.gpus", [4])[4]["load"]
    assert got == pytest.approx(want, rel=0.01)
    assert 1.09 < got < 1.13


def test_queue_work_is_the_routed_service_times():
    cfg = scenario(compose_config("scenario=capacity/code_verifier", "pipeline.channels.verifier.route_prob=0.5"))
    d = draw(cfg.pipeline, 3, rng_for(0, "pipeline"))
    w = work_seconds(d, "verifier")
    s, sent = d.service["verifier"], d.routed["verifier"]
    for i, t in np.ndindex(3, cfg.pipeline.steps):
        assert w[i, t] == pytest.approx(sum(s[i, t, b] for b in range(s.shape[2]) if sent[i, t, b]), rel=1e-12)


def test_load_counts_the_servers_that_are_up():
    """With failures the load is the work over the capacity up: x 1 / availability, which is near
    mtbf / (mtbf + mttr) for random outages."""
    cfg = scenario(compose_config("scenario=capacity/judge_rm_faults"))
    f = cfg.pipeline.channels["judge"].faults
    loads = channel_loads(cfg, "judge", "pipeline.channels.judge.rm.gpus", [5, 8])
    for n, v in loads.items():
        assert v["load"] == pytest.approx(v["work_per_s"] / (n * v["availability"]), rel=1e-12)
        assert v["availability"] == pytest.approx(f.mtbf_s / (f.mtbf_s + f.mttr_s), abs=0.05)


def test_ratio_interval_takes_bca_only_where_few_units_are_a_minority():
    """BCa where fewer than ten units carry the share and they are under half of the units; else
    bootstrap-t (ten trials, nine with drops: not a rare share)."""
    rng = np.random.default_rng(7)
    for n, k in [(50, 1), (50, 4), (140, 9), (10, 4), (10, 5), (10, 9), (50, 10), (8, 3)]:
        num = np.zeros(n)
        num[rng.choice(n, k, replace=False)] = rng.integers(1, 20, k)
        den = num + rng.integers(5, 40, n)
        counts = bootstrap_counts(n, 80, rng)
        got = steady.ratio_interval(num, den, counts, 0.95)
        bca = steady.bca_interval(num, den, counts, 0.95)
        assert (got == bca) == (k < 10 and 2 * k < n), (n, k, got, bca)


def test_the_t_tests_are_scipy_stats_ones():
    """steady's p-values, written out on scipy.special (a count's process never imports scipy.stats),
    against scipy.stats' own: the least-squares slope's (linregress), the trials' one-sample t-test
    (ttest_1samp), the batch-means interval's t quantile; flat, trending and two-point series."""
    from scipy import stats

    rng = np.random.default_rng(11)
    for _ in range(400):
        n = int(rng.integers(3, 60))
        z = rng.normal(size=n) + rng.choice([0.0, 0.02, 0.5]) * np.arange(n)
        assert steady.slope_p(z) == pytest.approx(stats.linregress(np.arange(n), z).pvalue, rel=1e-9, abs=1e-300)
        s = rng.normal(size=n) + rng.choice([0.0, 0.3, 3.0])
        t = s.mean() / (s.std(ddof=1) / np.sqrt(n))
        assert steady.two_sided_t(t, n - 1) == pytest.approx(stats.ttest_1samp(s, 0.0).pvalue, rel=1e-9, abs=1e-300)
    x = rng.normal(size=200)
    mean, half = steady.batch_means_ci(x, 10, 0.9)
    z = steady.batch_means(x, 10)
    assert half == pytest.approx(stats.t.ppf(0.95, 9) * z.std(ddof=1) / np.sqrt(10), rel=1e-12)
    assert steady.slope_p(np.full(7, 3.0)) == 1.0 and steady.slope_p(np.array([1.0, 2.0])) == 1.0
    assert steady.slope_p(np.arange(6.0)) == 0.0  # an exact line: no noise, p 0


@pytest.mark.parametrize("seed", range(12))
def test_interval_units_and_landed_weights_against_loops(seed):
    # Units.means: a ratio of resampled sums (each unit's steps over each unit's count of steps),
    # batches of unequal size included; landed_means: each weight in the update it lands in.
    from racsim.analyses.capacity.intervals import Units, batch_units
    from racsim.learner.bias import landed_means

    rng = np.random.default_rng(seed)
    T, W = int(rng.integers(1, 6)), int(rng.integers(2, 30))
    per = int(rng.integers(1, W + 1))
    units = Units(batch_units(T, W, per), per, bootstrap_counts(T * per, 25, rng))
    values = rng.normal(size=(T, W, 3))
    got = units.means(values)
    for r, c in enumerate(units.counts):
        num, den = np.zeros(3), 0.0
        for t in range(T):
            for s in range(W):
                u = units.of[t, s]
                num += c[u] * values[t, s]
                den += c[u]
        np.testing.assert_allclose(got[r], num / den, rtol=1e-12)
    np.testing.assert_allclose(units.means(values[..., 0]), got[:, 0], rtol=1e-12)  # a figure per step
    if per == 1:  # units are trials: the mean of the resampled trials' means
        np.testing.assert_allclose(got, units.counts @ values.mean(axis=1) / T, rtol=1e-12)
    steps, batch, K, warmup = W + int(rng.integers(0, 5)), int(rng.integers(1, 4)), 2, 0
    warmup = steps - W
    delay = rng.integers(-1, 6, size=(T, steps, batch, K))
    land = np.arange(steps)[None, :, None, None] + delay
    used = (delay >= 0) & (land >= warmup) & (land < steps)
    w = np.where(used, rng.random((T, steps, batch, K)), 0.0)
    want = np.zeros((T, W, K))
    for t, s, b, k in zip(*np.nonzero(used)):
        want[t, land[t, s, b, k] - warmup, k] += w[t, s, b, k] / batch
    np.testing.assert_allclose(landed_means(w, land, warmup), want, rtol=1e-12, atol=1e-15)
    # the whole window's mean weight per channel, as the bias study's steady view takes it
    np.testing.assert_allclose(want.sum(axis=1) / W, w.sum(axis=(1, 2)) / (W * batch), rtol=1e-12)


@pytest.mark.parametrize("seed", range(10))
def test_studentized_means_against_a_loop(seed):
    # bootstrap-t replicates of a vector ratio: per component m - t* se, t* = (m* - m) / se*,
    # se the delta method's; their percentiles are ratio_interval's bootstrap-t interval
    rng = np.random.default_rng(seed)
    n, K = int(rng.integers(3, 9) if seed < 3 else rng.integers(10, 25)), int(rng.integers(1, 4))
    sizes = rng.integers(1 if seed % 3 else 0, 9, n).astype(float)
    sizes[0] += 1
    sums = rng.gamma(2.0, 1.0, (n, K)) * sizes[:, None]
    sums[:, -1] = 0.7 * sizes if seed % 2 else sums[:, -1]  # a constant component: se 0, stays at m
    counts = bootstrap_counts(n, 40, rng)
    got = steady.studentized_means(sums, sizes, counts)
    scale = n / (n - 1)
    for k in range(K):
        m = sum(sums[:, k]) / sum(sizes)
        se = math.sqrt(scale * sum((sums[i, k] - m * sizes[i]) ** 2 for i in range(n))) / sum(sizes)
        for r, c in enumerate(counts):
            nb = sum(c[i] * sizes[i] for i in range(n))
            mb = sum(c[i] * sums[i, k] for i in range(n)) / nb
            seb = math.sqrt(scale * sum(c[i] * (sums[i, k] - mb * sizes[i]) ** 2 for i in range(n))) / nb
            if seed % 2 and k == K - 1:
                want = m  # no unit moves it
            elif n < 10:  # fewer than steady.MIN_STUDENTIZED units move it: the plain resampled mean
                want = mb
            elif seb <= 1e-9 * abs(mb):  # the resample's units all alike: no pivot
                want = math.nan
            else:
                want = m - (mb - m) / seb * se
            assert got[r, k] == pytest.approx(want, rel=1e-9, abs=1e-12, nan_ok=True)
        if k == K - 1 and seed % 2:
            assert np.all(got[:, k] == pytest.approx(0.7))
    # one unit of 30 off the rest: a resample without it has se* at rounding's scale; with so few
    # units moving it, the plain resampled means (a bootstrap-t would put an end 1e5 times off)
    few = np.tile([[0.7]], (30, 1)) * 3.0
    few[4] = 2.5
    c30 = bootstrap_counts(30, 50, rng)
    np.testing.assert_allclose(steady.studentized_means(few, np.full(30, 3.0), c30)[:, 0],
                               (c30 @ few[:, 0]) / (c30.sum(axis=1) * 3.0), rtol=1e-12)
    lvl = 0.9
    lo, hi = steady.percentile_interval(got[:, 0], lvl)
    num = sums[:, 0]
    if num.max() > sizes.max() and n >= 10:  # not a share: ratio_interval's bootstrap-t without the [0, 1] clip
        assert (lo, hi) == pytest.approx(steady.ratio_interval(num, sizes, counts, lvl), rel=1e-6)


def test_bias_intervals_push_the_studentized_weights_through_the_norm():
    # eq. (2)'s norm at each resample's bootstrap-t weights; against naive's constant weights
    # the ratio's interval is the bias's divided by naive's bias (one resample for both)
    from types import SimpleNamespace

    from racsim.analyses.capacity.intervals import Units, batch_units, bias_intervals

    rng = np.random.default_rng(3)
    T, W, K, SA = 6, 40, 2, 5
    per = 4
    units = Units(batch_units(T, W, per), per, bootstrap_counts(T * per, 300, rng))
    exact = rng.normal(size=(K + 1, SA))
    target = exact[0] + exact[1:].sum(axis=0) + 0.01 * rng.normal(size=SA)  # weights near 1 correct it
    rac = np.clip(1.0 - rng.gamma(0.5, 0.05, (T, W, K)), 0, None)
    run = SimpleNamespace(channel_exact=exact, target=target, exact_trials={},
                          step_weight={"rac": rac, "naive": np.full((T, W, K), 0.6)})
    out = bias_intervals(run, units, 0.9)
    m = steady.studentized_means(units.sums(rac), units.sizes(), units.counts)
    b = [float(np.linalg.norm(exact[0] + row @ exact[1:] - target)) for row in m]
    lo, hi = np.percentile(b, [5, 95])
    assert out["rac"][:2] == pytest.approx((lo, hi), rel=1e-12)
    naive = float(np.linalg.norm(exact[0] + 0.6 * exact[1:].sum(axis=0) - target))
    assert out["naive"][:2] == pytest.approx((naive, naive)) and out["naive"][2:] == pytest.approx((1.0, 1.0))
    assert out["rac"][2:] == pytest.approx((lo / naive, hi / naive), rel=1e-12)
    point = float(np.linalg.norm(exact[0] + rac.mean(axis=(0, 1)) @ exact[1:] - target))
    assert lo < point < hi
