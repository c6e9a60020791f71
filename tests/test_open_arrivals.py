"""Open Poisson arrivals and background traffic (issue 28, point 7).

``pipeline.arrivals.mode=open_poisson`` feeds the slow channels an open Poisson stream of rate
B / nominal step (the optimizer's clock follows it); ``pipeline.channels.<ch>.background`` adds
other tenants' Poisson stream on a queue channel's workers. Oracles written apart from racsim:

* queueing closed forms (tests/oracles.py): Erlang C's P(wait > 0) and mean wait for M/M/c, at
  rho 0.7 and 0.95, the learner's stream alone and with background traffic at the combined rate;
  Pollaczek-Khinchine for M/G/1 with a mixture of the two streams' service laws; each within 4
  standard errors of the mean over independent lanes; M/G/c by Allen-Cunneen, loosely (10%);
* the Kiefer-Wolfowitz workload recursion of a FIFO c-server queue fed the learner's samples at
  their ready times and the background's requests at theirs, merged: every job's wait;
* the clock: a step lasts its generate phase (until its last sample is ready, 0 if that was before
  it began) + fast_score + submit + update; a sample is sent at its step's start + its offset
  (asynchronous), not before its step's start (blocking);
* both engines equal to the last bit, the background's requests too; nothing lost.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers import assert_same_schedule, det
from oracles import allen_cunneen_mean_wait, erlang_c, mg1_mean_wait, mmc_mean_wait
from test_arrivals import _compose, arrivals_pcfg
from test_arrivals_gpu import arrivals_gpu_pcfg
from test_routing import kiefer_wolfowitz_waits

from racsim.config.schema import ArrivalsConf, BackgroundConf, ChannelConf, LatencyConf, PipelineConf
from racsim.errors import ConfigError
from racsim.pipeline.draws import draw
from racsim.pipeline.lanes import run_lanes
from racsim.pipeline.simpy_engine import run_simpy
from racsim.pipeline.stats import channel_stats

B, STEP = 28, 10.0  # the case: 28 requests per 10 s step


def queue_pcfg(mode: str, rho: float, c: int, steps: int, background=None, service=None) -> PipelineConf:
    """A queue of c workers with exponential service at load ``rho`` from the learner's stream (B per
    ``STEP`` seconds), fed by ``mode`` arrivals; ``background`` beside, if any."""
    lat = service or LatencyConf(kind="exponential", mean=rho * c * STEP / B)
    return PipelineConf(steps=steps, batch_size=B, generate=det(8.0), fast_score=det(1.0), submit=det(0.0),
                        update=det(1.0), channels={"q": ChannelConf(latency=lat, workers=c, background=background)},
                        arrivals=ArrivalsConf(mode=mode))


def lane_waits(sched, warm: int):
    """(learner waits, background waits) per lane, of jobs sent from step ``warm``'s start on."""
    learner = (sched.service_start - sched.submit_time)[:, warm:, :, 0].reshape(sched.n_trials, -1)
    bg = (sched.background or {}).get("q")
    if bg is None:
        return list(learner), []
    keep = bg["arrival"] >= sched.step_start[bg["lane"], warm]
    w = bg["start"] - bg["arrival"]
    return list(learner), [w[keep & (bg["lane"] == i)] for i in range(sched.n_trials)]


def near(per_lane, exact: float, what: str, k: float = 4.0) -> float:
    """The mean over lanes is within ``k`` standard errors of ``exact``; returns the mean."""
    x = np.asarray(per_lane)
    mean, se = x.mean(), x.std(ddof=1) / np.sqrt(x.size)
    assert abs(mean - exact) < k * se, f"{what}: {mean:.4f} +- {se:.4f} (SE) vs {exact:.4f}"
    return float(mean)


@pytest.mark.parametrize("rho,steps", [(0.7, 400), (0.95, 1500)])
def test_open_poisson_waits_are_erlang_c_and_the_closed_mode_waits_less(rho, steps):
    c, lanes = 4, 32
    lam, mean = B / STEP, rho * c * STEP / B
    exact_w, exact_c = mmc_mean_wait(c, lam, mean), erlang_c(c, lam * mean)
    waits = {}
    for mode in ("open_poisson", "poisson"):
        sched = run_lanes(draw(queue_pcfg(mode, rho, c, steps), lanes, np.random.default_rng(1)), False)
        w, _ = lane_waits(sched, steps // 5)
        waits[mode] = [x.mean() for x in w]
        if mode == "open_poisson":
            near(waits[mode], exact_w, f"open_poisson mean wait at rho {rho}")
            near([(x > 0).mean() for x in w], exact_c, f"open_poisson P(wait > 0) at rho {rho}")
            assert abs(np.diff(sched.step_start, axis=1).mean() - STEP) < 0.01 * STEP  # the clock keeps its mean
    closed = np.asarray(waits["poisson"])
    assert closed.mean() + 4 * closed.std(ddof=1) / np.sqrt(lanes) < 0.8 * exact_w  # B a step: well below Erlang C


def test_background_adds_its_load_at_erlang_c():
    """The learner's open stream at load 0.5 and other tenants' at 0.3 on the same service law: both
    see M/M/c at the combined rate (Poisson arrivals see time averages)."""
    c, lanes, steps = 3, 32, 600
    mean = 0.5 * c * STEP / B
    other = 0.3 * c / mean  # requests a second
    sched = run_lanes(draw(queue_pcfg("open_poisson", 0.5, c, steps, BackgroundConf(rate_per_s=other)), lanes,
                           np.random.default_rng(2)), False)
    learner, bg = lane_waits(sched, steps // 5)
    exact = mmc_mean_wait(c, B / STEP + other, mean)
    near([x.mean() for x in learner], exact, "learner's wait beside background")
    near([x.mean() for x in bg], exact, "background's wait")
    near([(x > 0).mean() for x in learner + bg], erlang_c(c, (B / STEP + other) * mean), "P(wait > 0)")
    row = channel_stats(sched, {"q": c}, steps // 5).iloc[0]
    assert row.background_jobs == sum(x.size for x in bg)
    assert abs(row.utilisation - 0.8) < 0.03  # the background's busy seconds count too


def test_pollaczek_khinchine_with_a_background_of_another_law():
    """One worker, the learner's exponential service and a background of uniform service: M/G/1 whose
    service law is the mixture of the two weighted by their rates (Pollaczek-Khinchine, exact)."""
    lanes, steps = 32, 600
    s1 = 0.4 * STEP / B  # learner at load 0.4
    lo, hi = 0.5, 3.5  # background uniform[0.5, 3.5]: mean 2, E[S^2] = (lo^2 + lo hi + hi^2) / 3
    lam1, lam2 = B / STEP, 0.35 / 2.0  # background at load 0.35
    bg = BackgroundConf(rate_per_s=lam2, latency=LatencyConf(kind="uniform", low=lo, high=hi, mean=2.0))
    pcfg = queue_pcfg("open_poisson", 0.4, 1, steps, bg, LatencyConf(kind="exponential", mean=s1))
    sched = run_lanes(draw(pcfg, lanes, np.random.default_rng(3)), False)
    learner, other = lane_waits(sched, steps // 5)
    lam = lam1 + lam2
    m1 = (lam1 * s1 + lam2 * 2.0) / lam
    m2 = (lam1 * 2 * s1 ** 2 + lam2 * (lo * lo + lo * hi + hi * hi) / 3) / lam
    exact = mg1_mean_wait(lam, m1, m2)
    near([x.mean() for x in learner], exact, "M/G/1 learner's wait")
    near([x.mean() for x in other], exact, "M/G/1 background's wait")


@pytest.mark.parametrize("c,rho", [(4, 0.8), (8, 0.9)])
def test_general_service_is_near_allen_cunneen(c, rho):
    """Uniform[0, 2 E[S]] service (cs^2 = 1/3): M/G/c has no closed form; the Allen-Cunneen
    approximation is within a few percent here (a loose 10%)."""
    mean = rho * c * STEP / B
    lat = LatencyConf(kind="uniform", low=0.0, high=2 * mean, mean=mean)
    sched = run_lanes(draw(queue_pcfg("open_poisson", rho, c, 800, service=lat), 32, np.random.default_rng(4)), False)
    w, _ = lane_waits(sched, 160)
    per = np.array([x.mean() for x in w])
    exact = allen_cunneen_mean_wait(c, B / STEP, mean, 1 / 3)
    assert abs(per.mean() - exact) < 0.1 * exact + 4 * per.std(ddof=1) / np.sqrt(per.size), (per.mean(), exact)


@pytest.mark.parametrize("seed", range(6))
def test_the_clock_and_the_merged_queue_against_kiefer_wolfowitz(seed):
    pcfg = arrivals_pcfg(seed, "open_poisson")
    if seed % 2:
        pcfg.channels["q"] = replace(pcfg.channels["q"], background=BackgroundConf(rate_per_s=0.4))
    draws = draw(pcfg, 3, np.random.default_rng(seed))
    off, gen = draws.offset, draws.phase[0]
    assert (off < 0).any()  # a sample ready before its step began: the stream never waits
    np.testing.assert_array_equal(gen, np.maximum(off[:, :, -1], 0.0))
    ready = np.concatenate([np.zeros((3, 1)), np.cumsum(draws.phase.sum(axis=0), axis=1)], axis=1)[:, :-1, None] + off
    assert (np.diff(ready.reshape(3, -1), axis=1) > 0).all()  # one stream, in sample order over the steps
    for blocking in (False, True):
        sched = run_lanes(draws, blocking)
        start = sched.step_start[:, :-1, None]
        if not blocking:
            np.testing.assert_allclose(np.diff(sched.step_start, axis=1), draws.phase.sum(axis=0), rtol=1e-12)
        sub = start + (np.maximum(off, 0.0) if blocking else off)
        k = sched.channel_names.index("q")
        np.testing.assert_allclose(sched.submit_time[..., k], sub, rtol=0, atol=1e-9)
        sent = draws.routed["q"] if "q" in draws.routed else np.ones(off.shape, dtype=bool)
        bg = (sched.background or {}).get("q")
        for i in range(3):
            jobs = [(sub[i, t, b], draws.service["q"][i, t, b], (t, b)) for t, b in zip(*np.nonzero(sent[i]))]
            if bg is not None:
                rows = np.nonzero(bg["lane"] == i)[0]
                assert bg["arrival"][rows].max() <= sched.step_start[i, -1] < bg["arrival"][rows].max() + 60
                jobs += [(bg["arrival"][r], bg["end"][r] - bg["start"][r], r) for r in rows]
            jobs.sort(key=lambda j: j[0])
            waits = kiefer_wolfowitz_waits([j[0] for j in jobs], [j[1] for j in jobs], pcfg.channels["q"].workers)
            for (a, _, who), w in zip(jobs, waits):
                got = sched.service_start[i, who[0], who[1], k] - a if isinstance(who, tuple) else bg["start"][who] - a
                assert abs(got - w) < 1e-9
        for c in sched.counts().values():  # every sample of the stream is one of the learner's
            assert c["injected"] + c["dropped"] + c["pending"] + c["unrouted"] == off.size


@pytest.mark.parametrize("seed", range(4))
def test_engines_agree_with_open_arrivals_and_background(seed):
    pcfg = arrivals_pcfg(seed, "open_poisson", cancel=seed % 2 == 1)
    if seed % 2 == 0:
        pcfg.channels["q"] = replace(pcfg.channels["q"], background=BackgroundConf(
            rate_per_s=0.3, latency=LatencyConf(kind="exponential", mean=2.0) if seed else None))
    draws = draw(pcfg, 3, np.random.default_rng(seed))
    for blocking, timeout in ((False, None), (True, None), (True, 3.0)):
        a, b = run_lanes(draws, blocking, timeout), run_simpy(draws, blocking, timeout)
        assert_same_schedule(a, b, f"seed {seed} blocking {blocking} timeout {timeout}")
        for key in ("lane", "arrival", "start", "end") if seed % 2 == 0 else ():
            np.testing.assert_array_equal(a.background["q"][key], b.background["q"][key])


@pytest.mark.parametrize("seed", [0, 1, 3, 6])
def test_engines_agree_on_gpu_pools_fed_by_an_open_stream(seed):
    """tests/test_arrivals_gpu.py's random gpu_rm configs (failures on seed 1, continuous batching on 3)."""
    pcfg = arrivals_gpu_pcfg(seed, "unused.csv")
    pcfg.arrivals = ArrivalsConf(mode="open_poisson")
    draws = draw(pcfg, 2, np.random.default_rng(seed))
    for blocking, timeout in ((False, None), (True, None), (True, 3.0)):
        sim = run_simpy(draws, blocking, timeout)
        assert_same_schedule(run_lanes(draws, blocking, timeout), sim, f"seed {seed} blocking {blocking}")
        assert_same_schedule(run_lanes(draws, blocking, timeout, gpu_loop=True), sim, f"loop, seed {seed}")


@pytest.mark.parametrize("case", range(6))
def test_engines_agree_on_autoscaled_and_failing_pools_fed_by_an_open_stream(case):
    """tests/test_autoscale.py's autoscaled queue and judge, tests/test_faults.py's failing workers."""
    from test_autoscale import judge_pcfg, queue_pcfg, random_rule
    from test_faults import random_queue_pcfg

    if case < 2:
        pcfg = queue_pcfg(case)
    elif case < 4:
        rule = random_rule(np.random.default_rng(case))
        pcfg = judge_pcfg(case, replace(rule, max=rule.min + 2))
    else:
        pcfg = random_queue_pcfg(case)
    pcfg = replace(pcfg, arrivals=ArrivalsConf(mode="open_poisson"))
    draws = draw(pcfg, 3, np.random.default_rng(case))
    for blocking, timeout in ((False, None), (True, None), (True, 2.0)):
        assert_same_schedule(run_lanes(draws, blocking, timeout), run_simpy(draws, blocking, timeout),
                             f"case {case} blocking {blocking} timeout {timeout}")


def test_the_capacity_load_counts_the_background():
    """The capacity search's offered load of a count: the learner's work plus rate x mean service."""
    from racsim.analyses.capacity import channel_loads
    from racsim.config.spec import scenario

    cfg = scenario(_compose("scenario=capacity/code_verifier"))
    key = "pipeline.channels.verifier.workers"
    base = channel_loads(cfg, "verifier", key, [64, 96])
    ch = cfg.pipeline.channels["verifier"]
    cfg.pipeline.channels["verifier"] = replace(ch, background=BackgroundConf(
        rate_per_s=0.5, latency=LatencyConf(kind="exponential", mean=6.0)))
    more = channel_loads(cfg, "verifier", key, [64, 96])
    for n in (64, 96):
        assert more[n]["load"] == pytest.approx(base[n]["load"] + 0.5 * 6.0 / n, rel=1e-12)
        assert more[n]["load_sampled"] == pytest.approx(base[n]["load_sampled"] + 0.5 * 6.0 / n, rel=1e-12)


def test_open_poisson_and_background_draw_nothing_else_anew():
    """Both are drawn last: a run without them draws what it drew before."""
    pcfg = arrivals_pcfg(3, "open_poisson")
    a = draw(pcfg, 5, np.random.default_rng(9))
    b = draw(replace(pcfg, arrivals=ArrivalsConf()), 5, np.random.default_rng(9))
    assert np.array_equal(a.phase[1:], b.phase[1:])
    assert all(np.array_equal(a.service[n], b.service[n]) for n in pcfg.channels)
    assert all(np.array_equal(a.routed[n], b.routed[n]) for n in a.routed)
    chans = {**pcfg.channels, "q": replace(pcfg.channels["q"], background=BackgroundConf(rate_per_s=1.0))}
    c = draw(replace(pcfg, channels=chans), 5, np.random.default_rng(9))
    assert np.array_equal(a.offset, c.offset) and np.array_equal(a.phase, c.phase) and set(c.background) == {"q"}


def test_arrivals_and_background_are_validated():
    """open_poisson feeds queue and gpu_rm channels alike; background on a queue needs fixed workers.
    (A background block is set in a scenario's or a channel's YAML: the command line cannot add a
    node under a null one, as for autoscale.)"""
    from racsim.config.spec import scenario
    from racsim.config.validate import validate

    validate(_compose("pipeline.arrivals.mode=open_poisson"))
    validate(_compose("pipeline.arrivals.mode=open_poisson", "channel@pipeline.channels.judge=judge_gpu_rm"))

    def with_background(bg, *overrides, channel="verifier", **change):
        cfg = scenario(_compose(*overrides))
        cfg.pipeline.channels[channel] = replace(cfg.pipeline.channels[channel], background=bg, **change)
        return cfg

    validate(with_background(BackgroundConf(rate_per_s=2.5)))
    q = "pipeline.channels.verifier"
    bad = [
        (with_background(BackgroundConf(rate_per_s=0.0)), f"{q}.background.rate_per_s"),
        (with_background(BackgroundConf(rate_per_s=1.0, latency=LatencyConf(kind="exponential", mean=-1.0))),
         f"{q}.background.latency.mean"),
        (with_background(BackgroundConf(rate_per_s=1.0), cancel_on_drop=True), f"{q}.background"),
        (with_background(BackgroundConf(rate_per_s=1.0), workers=None), f"{q}.background"),
    ]  # a gpu_rm pool's background: tests/test_gpu_background.py
    for cfg, match in bad:
        with pytest.raises(ConfigError, match=match) as err:
            validate(cfg)
        assert "\n" not in str(err.value)
