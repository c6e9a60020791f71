"""Steady-state channel statistics after ``pipeline.warmup_steps`` (issue 11, item 3).

Oracles written from the model, not from racsim/pipeline/stats.py:

* a per-job loop over simulated schedules that recomputes every figure of the
  channels table (counts, delay and sojourn quantiles by hand-written linear
  interpolation, waits, busy seconds inside the measured window by interval);
* Erlang C: an M/M/4 queue at rho = 0.9 fed by the pipeline itself (one sample a
  step, exponential step time), started empty: the mean wait measured after the
  warm-up matches the closed form, the one measured from the first step does not.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import det

from racsim.config.schema import ChannelConf, LatencyConf, PipelineConf
from racsim.pipeline.draws import PipelineDraws, draw
from racsim.pipeline.lanes import run_lanes
from racsim.pipeline.schedule import DROPPED, INJECTED, PENDING
from racsim.pipeline.stats import channel_stats


def pct(values, q):
    """Linear-interpolation percentile of a list, by hand (numpy's default rule)."""
    v = sorted(values)
    if not v:
        return math.nan
    h = (len(v) - 1) * q / 100.0
    lo = math.floor(h)
    return v[lo] + (h - lo) * (v[min(lo + 1, len(v) - 1)] - v[lo])


def oracle(sched, workers, w):
    """Every figure of the channels table by a loop over jobs."""
    n, steps, batch, K = sched.delay.shape
    out = {}
    for k, name in enumerate(sched.channel_names):
        cnt = {INJECTED: 0, DROPPED: 0, PENDING: 0}
        delays, waits, sojourns = [], [], []
        for i in range(n):
            for t in range(w, steps):
                for b in range(batch):
                    st = int(sched.status[i, t, b, k])
                    cnt[st] += 1
                    if st == INJECTED:
                        delays.append(int(sched.delay[i, t, b, k]))
                    waits.append(sched.service_start[i, t, b, k] - sched.submit_time[i, t, b, k])
                    if sched.completion[i, t, b, k] != math.inf:
                        sojourns.append(sched.completion[i, t, b, k] - sched.submit_time[i, t, b, k])
        util = math.nan
        if workers[name]:
            ratios = []
            for i in range(n):
                lo, hi = sched.step_start[i, w], sched.step_start[i, steps]
                busy = 0.0
                for t in range(steps):  # warm-up jobs too: they occupy the window's first seconds
                    for b in range(batch):
                        s, e = sched.service_start[i, t, b, k], sched.completion[i, t, b, k]
                        busy += max(0.0, min(e, hi) - max(s, lo))
                ratios.append(busy / (workers[name] * (hi - lo)))
            util = sum(ratios) / n
        out[name] = dict(emitted=n * (steps - w) * batch, injected=cnt[INJECTED], dropped=cnt[DROPPED],
                         pending=cnt[PENDING], delays=delays, waits=waits, sojourns=sojourns, util=util)
    return out


def random_pcfg(seed: int) -> PipelineConf:
    """A busy pipeline: queues of 1-3 workers near or past saturation, a channel without a queue."""
    rng = np.random.default_rng(seed)
    chans = {}
    for k in range(3):
        workers = [None, 1, 2, 3][k if k else int(rng.integers(4))]
        kind = ["exponential", "lognormal", "pareto", "uniform"][int(rng.integers(4))]
        lat = LatencyConf(kind=kind, mean=float(rng.uniform(1.0, 9.0)), sigma=0.8, alpha=2.5)
        chans[f"c{k}"] = ChannelConf(latency=lat, workers=workers, max_delay=[None, 1, 3][int(rng.integers(3))])
    return PipelineConf(steps=int(rng.integers(10, 30)), batch_size=int(rng.integers(1, 4)),
                        generate=LatencyConf(kind="exponential", mean=1.5), fast_score=det(0.2), submit=det(0.05),
                        update=det(0.4), channels=chans)


@pytest.mark.parametrize("seed", range(6))
def test_channel_stats_match_a_per_job_loop(seed):
    pcfg = random_pcfg(seed)
    rng = np.random.default_rng(seed)
    draws = draw(pcfg, 4, rng)
    sched = run_lanes(draws, False)
    workers = {n: ch.workers for n, ch in pcfg.channels.items()}
    for w in sorted({0, 1, int(rng.integers(2, pcfg.steps))}):
        table = channel_stats(sched, workers, w).set_index("channel")
        ref = oracle(sched, workers, w)
        for name, r in ref.items():
            row = table.loc[name]
            assert row.measured_from_step == w
            assert [row.emitted, row.injected, row.dropped, row.pending] == [
                r["emitted"], r["injected"], r["dropped"], r["pending"]]
            for q in (50, 95, 99):
                np.testing.assert_allclose(row[f"delay_p{q}_steps"], pct(r["delays"], q), rtol=1e-12)
                np.testing.assert_allclose(row[f"sojourn_p{q}_s"], pct(r["sojourns"], q), rtol=1e-12)
            np.testing.assert_allclose(row.sojourn_mean_s, sum(r["sojourns"]) / len(r["sojourns"]), rtol=1e-12)
            np.testing.assert_allclose(row.wait_mean_s, sum(r["waits"]) / len(r["waits"]), rtol=1e-12, atol=1e-12)
            if workers[name]:
                np.testing.assert_allclose(row.wait_p95_s, pct(r["waits"], 95), rtol=1e-12, atol=1e-12)
                np.testing.assert_allclose(row.utilisation, r["util"], rtol=1e-12)
            else:
                assert row.wait_p95_s == 0.0 and np.isnan(row.utilisation)
                # no queue: the sojourn is the service time itself
                np.testing.assert_allclose(row.sojourn_p50_s, pct(list(draws.service[name][:, w:].ravel()), 50),
                                           rtol=1e-12)


def erlang_c_wait(c: int, lam: float, mu: float) -> float:
    """Mean wait in queue of M/M/c: C(c, a) / (c mu - lambda), a = lambda / mu."""
    a = lam / mu
    top = a**c / math.factorial(c) * (c / (c - a))
    return top / (sum(a**j / math.factorial(j) for j in range(c)) + top) / (c * mu - lam)


def mmc_draws(lanes: int, steps: int, c: int, lam: float, mu: float, seed: int) -> PipelineDraws:
    """The pipeline as an M/M/c queue: one sample a step, an exponential step (generate) and no other phase."""
    rng = np.random.default_rng(seed)
    phase = np.zeros((4, lanes, steps))
    phase[0] = rng.exponential(1.0 / lam, (lanes, steps))
    return PipelineDraws(phase=phase, service={"q": rng.exponential(1.0 / mu, (lanes, steps, 1))},
                         kernel_channels=frozenset(), nominal_step=1.0 / lam, workers={"q": c},
                         max_delay={"q": None})


def test_steady_state_wait_is_erlang_c_and_warmup_matters():
    c, rho, mu = 4, 0.9, 1.0
    lam = rho * c * mu
    wq = erlang_c_wait(c, lam, mu)
    assert erlang_c_wait(1, 0.5, 1.0) == pytest.approx(0.5 / (1.0 - 0.5), rel=1e-12)  # M/M/1: rho / (mu - lam)
    # 1200 lanes x 2000 measured customers: the mean wait's standard error is about 2% at rho = 0.9
    sched = run_lanes(mmc_draws(1200, 3000, c, lam, mu, seed=12), False)
    warm = channel_stats(sched, {"q": c}, 1000).iloc[0]
    assert warm.wait_mean_s == pytest.approx(wq, rel=0.06)
    assert warm.sojourn_mean_s == pytest.approx(wq + 1.0 / mu, rel=0.04)
    assert warm.utilisation == pytest.approx(rho, rel=0.01)
    # Started empty, the first steps see short queues: measured from step 0 of a short run, the
    # mean wait is well below the steady state; the warm-up removes that.
    short = run_lanes(mmc_draws(400, 400, c, lam, mu, seed=12), False)
    cold = channel_stats(short, {"q": c}, 0).iloc[0]
    assert cold.wait_mean_s < 0.85 * wq
