"""Steady-state bias and the theorem's prediction from the configured delay law.

* the steady view (updates after the warm-up) equals the long-run limit: the
  kernel expectation sum_D Lambda(D) w(D) that a drained run reaches, and the
  slack of a run so long that its end-of-run loss vanishes;
* ``predicted_kernel`` against the delays a queue-free pipeline produces;
* Theorem 2.1 from the nominal kernel agrees with the simulation where the
  model holds (no queue) and disagrees where it does not (a busy queue).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_bias import make_cfg

import racsim.analyses.dispatch as R
from racsim.config.schema import ChannelConf, LatencyConf
from racsim.pipeline.kernels import predicted_kernel
from racsim.pipeline.latency import build_latency
from racsim.pipeline.schedule import INJECTED, UNROUTED

TAU = 3.0  # rac's age kernel: the weight depends on the delay


def rac_weight(d):
    return np.exp(-np.asarray(d, dtype=float) / TAU)


@pytest.mark.parametrize("seed", [0, 1])
def test_steady_state_equals_the_drained_long_run_limit(seed):
    rows = {"a": [0.3, 0.4, 0.2], "b": [0.1, 0.2, 0.3, 0.3]}  # a loses 0.1, b loses 0.1
    limit = np.array([np.dot(r, rac_weight(np.arange(len(r)))) for r in rows.values()])
    out = {}
    for label, steps, warmup, drain in (("steady", 12, 4, False), ("drained", 12, 0, True)):
        cfg = make_cfg({k: ChannelConf(kernel=r) for k, r in rows.items()}, names=["naive", "rac", "sync_oracle"],
                       seed=seed, steps=steps, batch=2, trials=1000, horizon=4, tau_age=TAU, warmup=warmup)
        cfg.pipeline.drain = drain
        out[label] = R.run(cfg)
    n = 1000 * 8 * 2  # results per channel in the steady window
    se = 0.5 / math.sqrt(n)
    steady = out["steady"].bias.mean_weight["steady"]["rac"]
    drained = out["drained"].bias.mean_weight["run"]["rac"]
    assert np.all(np.abs(steady - limit) < 5 * se), (steady, limit)
    assert np.all(np.abs(drained - limit) < 5 * se), (drained, limit)
    # ... while the undrained run view of the same short run loses its last results
    short = out["steady"].bias.mean_weight["run"]["rac"]
    assert np.all(limit - short > 10 * se)
    # the exact biases: one limit, up to the weights' sampling error
    b = out["steady"].bias
    G = b.channel_exact
    lim_bias = np.linalg.norm(G[0] + limit @ G[1:] - b.target)
    tol = 5 * se * np.linalg.norm(G[1:], axis=1).sum()
    for label, view in (("steady", "steady"), ("drained", "run")):
        got = np.linalg.norm(out[label].bias.exact("rac", view) - b.target)
        assert abs(got - lim_bias) < tol, (label, got, lim_bias)
    # and Theorem 2.1 on the configured kernels predicts that limit exactly
    np.testing.assert_allclose(b.nominal_slack["rac"], 1 - limit, rtol=0, atol=1e-14)


def test_steady_state_of_a_queue_is_the_long_run_limit():
    """A clock channel behind a queue: the steady view of a 60-step run with a
    20-step warm-up has the slack of a 600-step run, whose end-of-run loss is
    ten times smaller; the 60-step run's own run view has a clearly larger one."""
    lat = LatencyConf(kind="lognormal", mean=20.0, sigma=0.6)
    ch = {"q": ChannelConf(latency=lat, workers=6)}  # utilisation 2 * 20 / (6 * 9.1) = 0.73
    short = R.run(make_cfg(ch, names=["naive", "rac"], seed=5, steps=60, batch=2, trials=200, horizon=3,
                           tau_age=TAU, warmup=20)).results.set_index("corrector").loc["rac"]
    long = R.run(make_cfg(ch, names=["naive", "rac"], seed=6, steps=600, batch=2, trials=40, horizon=3,
                          tau_age=TAU, warmup=20)).results.set_index("corrector").loc["rac"]
    assert short.delay_past_warmup < 0.01
    assert abs(short.slack_eta - long.run_slack_eta) < 0.01 + long.eta_end_of_run, (short.slack_eta, long.run_slack_eta)
    assert abs(short.slack_eta - long.slack_eta) < 0.01
    assert short.eta_end_of_run > 0.01  # the 60-step run loses its last results ...
    assert short.eta_end_of_run > 5 * long.eta_end_of_run  # ... a longer run much less


@pytest.mark.parametrize("max_delay", [None, 2])
def test_predicted_kernel_matches_a_queue_free_pipeline(max_delay):
    """No queue and a deterministic clock: the landing delays follow Delta =
    max(1, ceil((a + X) / s)) exactly, so their histogram is the predicted kernel
    up to binomial noise (max_delay cuts it)."""
    lat = LatencyConf(kind="lognormal", mean=12.0, sigma=0.7)
    cfg = make_cfg({"q": ChannelConf(latency=lat, max_delay=max_delay)}, names=["naive", "rac"], seed=2, steps=40,
                   batch=4, trials=200, horizon=2, warmup=10)
    lam = predicted_kernel(cfg.pipeline, cfg.corrector.wait_timeout_s)[0]
    assert lam[0] == 0.0 and (lam >= 0).all() and lam.sum() <= 1 + 1e-12
    if max_delay is not None:
        assert len(lam) == max_delay + 1 and lam.sum() < 0.99
    res = R.run(cfg)
    sched = res.schedules["async"]
    m = min(len(lam), 12)  # delays 0..m-1 (the law's tail beyond is < 1e-3)
    d, st = sched.delay[:, : sched.n_steps - m], sched.status[:, : sched.n_steps - m]  # followed past them
    n = d.size
    hist = np.array([np.count_nonzero((st == INJECTED) & (d == k)) for k in range(m)]) / n
    lam = lam[:m]
    assert np.all(np.abs(hist - lam) <= 5 * np.sqrt(lam * (1 - lam) / n) + 1e-12), (hist, lam)
    # blocking without a timeout: every result at Delta = 0; with one, those back in time
    assert predicted_kernel(cfg.pipeline, cfg.corrector.wait_timeout_s, blocking=True).tolist() == [[1.0]]
    cfg.corrector.wait_timeout_s = 10.0
    cfg.corrector.names = ["naive", "wait_for_slow"]
    p_in_time = predicted_kernel(cfg.pipeline, cfg.corrector.wait_timeout_s, blocking=True)[0, 0]
    assert p_in_time == pytest.approx(float(np.mean(lat_cdf_samples(lat) <= 10.0)), abs=0.01)
    waited = R.run(cfg).schedules["blocking"]
    n = waited.status.size
    assert abs(waited.injected.mean() - p_in_time) < 5 * math.sqrt(p_in_time * (1 - p_in_time) / n)


def lat_cdf_samples(lat, n=200_000):
    return build_latency(lat, "x").sample(np.random.default_rng(0), n)


def test_no_law_no_prediction():
    """A GPU fast scorer (or a gpu_rm channel): no delay law predicts the kernel, so
    the theorem's columns are NaN rather than a number that looks like one."""
    cfg = make_cfg({"q": ChannelConf(latency=LatencyConf(kind="exponential", mean=5.0))}, names=["naive", "rac"],
                   steps=6, batch=2, trials=20, horizon=2, warmup=1)
    assert not np.isnan(predicted_kernel(cfg.pipeline, cfg.corrector.wait_timeout_s)).any()
    cfg.pipeline.channels["g"] = ChannelConf(kind="gpu_rm")
    lam = predicted_kernel(cfg.pipeline, cfg.corrector.wait_timeout_s)
    assert not np.isnan(lam[0]).any() and np.isnan(lam[1]).all()


def test_theorem_from_the_nominal_kernel_can_disagree():
    """Where the configured law is the whole story (no queue), Theorem 2.1's
    prediction matches the simulated steady-state slack; behind a busy queue the
    delays grow past the law's, rac's age kernel puts back less, and the
    prediction is too optimistic: a gap the table reports."""
    lat = LatencyConf(kind="exponential", mean=15.0)
    got = {}
    for workers in (None, 4):  # 4 workers: utilisation 2 * 15 / (4 * 9.1) = 0.82
        cfg = make_cfg({"q": ChannelConf(latency=lat, workers=workers)}, names=["naive", "rac"], seed=1, steps=80,
                       batch=2, trials=150, horizon=3, tau_age=TAU, warmup=30)
        got[workers] = R.run(cfg).results.set_index("corrector").loc["rac"]
    free, busy = got[None], got[4]
    assert free.eta_nominal == busy.eta_nominal  # the law alone: the same prediction
    assert abs(free.slack_eta - free.eta_nominal) < 0.01
    assert busy.slack_eta - busy.eta_nominal > 0.03  # 10x the free case's tolerance
    assert abs(busy.theorem_gap) > 5 * abs(free.theorem_gap)


def test_routed_channel_is_reweighted_by_its_routing_probability():
    """A channel that scores half the samples: its unrouted samples carry no result,
    and the schedule-driven correctors weigh the routed ones by 1 / 0.5, so RAC's
    mean weight (and the theorem's slack) is that of a channel scoring every sample."""
    cfg = make_cfg({"r": ChannelConf(kernel=[0.6, 0.4], route_prob=0.5)}, names=["naive", "rac", "sync_oracle"],
                   seed=4, steps=20, batch=2, trials=500, horizon=3, warmup=2)
    res = R.run(cfg)
    st = res.schedules["async"].status
    routed = (st != UNROUTED).mean()
    n = st.size
    assert abs(routed - 0.5) < 5 * math.sqrt(0.25 / n)
    w = res.bias.mean_weight["steady"]["rac"][0]
    assert abs(w - 1.0) < 5 * math.sqrt(1.0 / (500 * 18 * 2))  # c in {0, 2}: sd 1
    np.testing.assert_allclose(res.bias.nominal_slack["rac"], [0.0], atol=1e-15)
    assert res.bias.mean_weight["steady"]["sync_oracle"][0] == 1.0  # the oracle sees every sample's reward
