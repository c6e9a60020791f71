"""Routing (issue 11, item 1): ``route_prob``, the probability that a sample is sent to a channel.

Oracles written from the model, not from racsim/pipeline/*:

* the Kiefer-Wolfowitz workload recursion of a FIFO c-server queue fed only the
  routed samples (Lindley's recursion when c = 1): every routed job's wait;
* the routing draw: unrouted samples have status UNROUTED and no delay, the
  routed fraction is binomial around ``route_prob``;
* both engines equal to the last bit, asynchronous and blocking, with and without
  ``cancel_on_drop``; routing draws nothing else anew (common random numbers).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers import assert_same_schedule, det

from racsim.config.schema import ChannelConf, LatencyConf, PipelineConf
from racsim.config.validate import validate
from racsim.errors import ConfigError
from racsim.pipeline.draws import draw
from racsim.pipeline.lanes import run_lanes
from racsim.pipeline.schedule import DROPPED, INJECTED, PENDING, UNROUTED
from racsim.pipeline.simpy_engine import run_simpy
from racsim.pipeline.stats import channel_stats


def routed_pcfg(seed: int, cancel: bool = False) -> PipelineConf:
    """A queue of 1-3 workers, a channel without a queue and a kernel channel, each routed with
    its own probability (continuous durations: no ties)."""
    rng = np.random.default_rng(seed)
    batch = int(rng.integers(2, 6))
    p = [float(v) for v in rng.uniform(0.1, 0.9, 3)]
    workers = int(rng.integers(1, 4))
    lat = LatencyConf(kind=["exponential", "lognormal"][seed % 2], mean=float(rng.uniform(0.5, 1.5)) * workers * 3.0
                      / (batch * p[0]), sigma=0.7)  # load 0.5-1.5 of the routed samples
    chans = {
        "q": ChannelConf(latency=lat, workers=workers, max_delay=int(rng.integers(1, 5)), route_prob=p[0],
                         cancel_on_drop=cancel),
        "free": ChannelConf(latency=LatencyConf(kind="uniform", low=1.0, high=9.0, mean=5.0), route_prob=p[1]),
        "kern": ChannelConf(kernel=[0.3, 0.4, 0.2], max_delay=2, route_prob=p[2]),
    }
    return PipelineConf(steps=int(rng.integers(10, 25)), batch_size=batch,
                        generate=LatencyConf(kind="exponential", mean=2.0), fast_score=det(0.3), submit=det(0.05),
                        update=LatencyConf(kind="lognormal", mean=0.6, sigma=0.3), channels=chans)


def kiefer_wolfowitz_waits(arrival, service, c):
    """Waits of a FIFO c-server queue: W, the sorted workload each server still owes, is
    reduced by the inter-arrival time; the job waits W[0] and adds its service to it."""
    W = [0.0] * c
    waits = []
    for n, (a, s) in enumerate(zip(arrival, service)):
        if n:
            gap = a - arrival[n - 1]
            W = sorted(max(w - gap, 0.0) for w in W)
        waits.append(W[0])
        W[0] += s
    return np.array(waits)


@pytest.mark.parametrize("seed", range(6))
def test_routed_queue_is_kiefer_wolfowitz_on_the_routed_samples(seed):
    pcfg = routed_pcfg(seed)
    draws = draw(pcfg, 3, np.random.default_rng(seed))
    sched = run_lanes(draws, False)
    assert_same_schedule(sched, run_simpy(draws, False), f"seed {seed}")
    k = sched.channel_names.index("q")
    sent = draws.routed["q"]
    for i in range(3):
        m = sent[i].ravel()
        arr = sched.submit_time[i, ..., k].ravel()[m]
        wait = (sched.service_start[i, ..., k].ravel() - sched.submit_time[i, ..., k].ravel())[m]
        np.testing.assert_allclose(wait, kiefer_wolfowitz_waits(arr, draws.service["q"][i].ravel()[m],
                                                                pcfg.channels["q"].workers), rtol=0, atol=1e-9)
        # the unrouted samples: never sent, never waited, never served
        sub = sched.submit_time[i, ..., k].ravel()[~m]
        assert (sched.service_start[i, ..., k].ravel()[~m] == sub).all()
        assert (sched.completion[i, ..., k].ravel()[~m] == sub).all()
    for name in pcfg.channels:
        k = sched.channel_names.index(name)
        st, d = sched.status[..., k], sched.delay[..., k]
        assert ((st == UNROUTED) == ~draws.routed[name]).all()
        assert (d[st == UNROUTED] == -1).all()
        assert np.isin(st[draws.routed[name]], [INJECTED, DROPPED, PENDING]).all()
    assert (sched.status == INJECTED).any() and (sched.status == UNROUTED).any()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("cancel", [False, True])
def test_engines_agree_with_routing(seed, cancel):
    pcfg = routed_pcfg(seed, cancel)
    draws = draw(pcfg, 3, np.random.default_rng(seed))
    for blocking, timeout in ((False, None), (True, None), (True, 4.0)):
        a, b = run_lanes(draws, blocking, timeout), run_simpy(draws, blocking, timeout)
        assert_same_schedule(a, b, f"seed {seed} blocking {blocking} timeout {timeout}")
        if cancel:
            assert np.array_equal(a.cancelled, b.cancelled)
            assert not (a.cancelled & (a.status == UNROUTED)).any()


def test_routing_draws_nothing_else_anew_and_routes_the_right_fraction():
    pcfg = routed_pcfg(3)
    everyone = replace(pcfg, channels={n: replace(ch, route_prob=1.0) for n, ch in pcfg.channels.items()})
    a, b = draw(pcfg, 40, np.random.default_rng(5)), draw(everyone, 40, np.random.default_rng(5))
    assert np.array_equal(a.phase, b.phase) and not b.routed
    for name, ch in pcfg.channels.items():
        assert np.array_equal(a.service[name], b.service[name])
        m = a.routed[name]
        sd = np.sqrt(ch.route_prob * (1 - ch.route_prob) / m.size)
        assert abs(m.mean() - ch.route_prob) < 4 * sd
    # a queue that sees fewer samples waits less (same service draws, a subset of the jobs)
    s_all, s_some = run_lanes(b, False), run_lanes(a, False)
    k = s_all.channel_names.index("q")
    m = a.routed["q"]
    w_all = (s_all.service_start - s_all.submit_time)[..., k][m]
    w_some = (s_some.service_start - s_some.submit_time)[..., k][m]
    assert (w_some <= w_all + 1e-9).all() and w_some.sum() < w_all.sum()


def test_counts_and_channel_stats_leave_unrouted_samples_out():
    pcfg = routed_pcfg(1)
    draws = draw(pcfg, 4, np.random.default_rng(1))
    sched = run_lanes(draws, False)
    counts = sched.counts()
    table = channel_stats(sched, {n: ch.workers for n, ch in pcfg.channels.items()}).set_index("channel")
    for k, name in enumerate(sched.channel_names):
        m = draws.routed[name]
        c = counts[name]
        assert c["emitted"] == m.sum() and c["unrouted"] == (~m).sum()
        assert c["injected"] + c["dropped"] + c["pending"] == c["emitted"]
        row = table.loc[name]
        assert row.emitted == m.sum() and row.unrouted == (~m).sum()
        wait = (sched.service_start - sched.submit_time)[..., k][m]
        assert row.wait_mean_s == pytest.approx(wait.mean(), rel=1e-12, abs=1e-15)
        soj = (sched.completion - sched.submit_time)[..., k][m]
        soj = soj[np.isfinite(soj)]
        assert row.sojourn_mean_s == pytest.approx(soj.mean(), rel=1e-12)


def test_route_prob_is_validated():
    from hydra import compose, initialize_config_module

    from racsim.config.schema import register_configs

    register_configs()
    with initialize_config_module(version_base="1.3", config_module="racsim.conf"):
        validate(compose("config", overrides=["pipeline.channels.judge.route_prob=0.05"]))
        for bad in ("0", "1.5", "nan"):
            with pytest.raises(ConfigError, match="pipeline.channels.judge.route_prob"):
                validate(compose("config", overrides=[f"pipeline.channels.judge.route_prob={bad}"]))
        gpu = compose("config", overrides=["channel@pipeline.channels.judge=judge_gpu_rm",
                                           "pipeline.channels.judge.route_prob=0.5"])
        with pytest.raises(ConfigError, match="gpu_rm"):
            validate(gpu)
