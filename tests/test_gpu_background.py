"""Other tenants' traffic on a shared gpu_rm pool (issue 28, point 7): a Poisson stream of single
sequences per lane (``pipeline.channels.<ch>.background`` on a gpu_rm channel), batched with the
learner's sequences by the pool's batcher, never injected.

Checked here:
* both event-loop engines (SimPy, the lanes engine's per-lane loop) equal to the last bit on
  random pools (FIFO / shortest, padded or packed, flush or none, blocking or not, open arrivals,
  the background's own token laws or the pool's), the other tenants' requests included; nothing
  lost: every request that arrives by the run's end is served once, in a batch of the log;
* with one sequence a batch, the pool is a FIFO c-server queue of the merged stream: every
  other tenant's wait and every sample's result equal a Kiefer-Wolfowitz recursion written here;
* with one replica, Poisson arrivals of both (``open_poisson``) and two token lengths, the mean
  wait of both classes is Pollaczek-Khinchine's within noise; the channel table counts the
  background's requests and their busy seconds;
* the capacity search's offered load adds rate x a request's seconds in full batches;
* what is refused (chunked prefill, bursts, faults, a latency law) is named.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from helpers import assert_same_schedule, det
from oracles import mg1_mean_wait
from test_arrivals import _compose
from test_gpu_rm import random_pcfg
from test_open_arrivals import near

from racsim.config.schema import ArrivalsConf, BackgroundConf, FaultsConf, LatencyConf, PipelineConf
from racsim.errors import ConfigError
from racsim.pipeline.background import LOAD_REQUESTS, BackgroundStream
from racsim.pipeline.cbatch import serving_spec
from racsim.pipeline.draws import draw
from racsim.pipeline.lanes import run_lanes
from racsim.pipeline.simpy_engine import run_simpy
from racsim.pipeline.stats import channel_stats

MODES = [(False, None), (True, None), (True, 0.6)]


def shared_pcfg(seed: int) -> PipelineConf:
    """tests/test_gpu_rm.py's random config without bursts, its pool ``g`` shared with another
    tenant (its own token laws on odd seeds), fed by open Poisson arrivals on seeds 2 mod 3."""
    pcfg = random_pcfg(seed)
    g = pcfg.channels["g"]
    own = dict(prompt_tokens=det(80.0), response_tokens=LatencyConf(kind="uniform", mean=200.0, low=50.0)) \
        if seed % 2 else {}
    pcfg.channels["g"] = replace(g, degraded_factor=1.0, background=BackgroundConf(rate_per_s=1.5, **own))
    if seed % 3 == 2:
        pcfg.arrivals = ArrivalsConf(mode="open_poisson")
    return pcfg


@pytest.mark.parametrize("seed", range(8))
def test_engines_agree_and_every_request_of_the_other_tenant_is_served_once(seed):
    pcfg = shared_pcfg(seed)
    draws = draw(pcfg, 3, np.random.default_rng(seed))
    stream = BackgroundStream(draws.background["g"], 3)
    for blocking, timeout in MODES:
        label = f"seed {seed} blocking {blocking} timeout {timeout}"
        sched = run_lanes(draws, blocking, timeout)
        assert_same_schedule(sched, run_simpy(draws, blocking, timeout), label)
        assert_same_schedule(sched, run_lanes(draws, blocking, timeout, gpu_loop=True), label)
        bg, log = sched.background["g"], sched.gpu_batches["g"]
        for lane in range(3):
            mine = bg["lane"] == lane
            arrived = stream.take(lane, sched.step_start[lane, -1])[0]  # all that arrive by the run's end
            assert np.array_equal(bg["arrival"][mine], arrived), label
        assert np.all(bg["arrival"] <= bg["start"]) and np.all(bg["start"] < bg["end"]), label
        assert np.isfinite(bg["end"]).all(), label
        learner = draws.service["g"].size  # every request of the learner's, and the other tenant's, in one batch
        assert log["size"].sum() == learner + bg["arrival"].size, label
        stream = BackgroundStream(draws.background["g"], 3)


def kiefer_wolfowitz(arrival, service, c):
    """(start, end) of each job of a FIFO c-server queue, jobs in the order given (a slow loop)."""
    free = [0.0] * c
    start, end = [], []
    for a, s in zip(arrival, service):
        k = min(range(c), key=lambda r: free[r])
        t = max(a, free[k])
        start.append(t)
        end.append(t + s)
        free[k] = t + s
    return np.array(start), np.array(end)


@pytest.mark.parametrize("seed", range(6))
def test_one_sequence_a_batch_is_a_fifo_queue_of_the_merged_stream(seed):
    """max_batch 1, no flush: each request leaves alone on the first free replica, in arrival
    order across both tenants (a tie: the learner's first). The merged queue, replayed here."""
    pcfg = shared_pcfg(seed)
    g = pcfg.channels["g"]
    pcfg.channels = {"g": replace(g, rm=replace(g.rm, max_batch=1, max_wait_s=0.0, order="fifo"))}
    pcfg.fast_rm = None
    pcfg.arrivals = ArrivalsConf()
    draws = draw(pcfg, 2, np.random.default_rng(seed))
    sched = run_lanes(draws, False)
    assert_same_schedule(sched, run_simpy(draws, False), f"seed {seed}")
    spec = draws.gpu["g"]
    one = lambda L: float(spec.model.seconds(np.float64(1.0), L, L * L, L))  # noqa: E731
    bg = sched.background["g"]
    for lane in range(2):
        tok = draws.service["g"][lane]  # (steps, batch, seqs)
        sub = sched.submit_time[lane, ..., 0]  # (steps, batch)
        mine = bg["lane"] == lane
        jobs = [(a, 0, i, one(L)) for i, (a, L) in enumerate(zip(np.repeat(sub.ravel(), tok.shape[2]), tok.ravel()))]
        stream = BackgroundStream(draws.background["g"], 2)
        jobs += [(a, 1, k, one(L)) for k, (a, L) in enumerate(zip(*stream.take(lane, sched.step_start[lane, -1])))]
        jobs.sort(key=lambda j: j[:3])
        start, end = kiefer_wolfowitz([j[0] for j in jobs], [j[3] for j in jobs], spec.replicas)
        other = np.array([j[1] == 1 for j in jobs])
        np.testing.assert_allclose(bg["start"][mine], start[other], rtol=0, atol=1e-9)
        np.testing.assert_allclose(bg["end"][mine], end[other], rtol=0, atol=1e-9)
        order = np.array([j[2] for j in jobs])[~other]
        done = np.empty(tok.size)
        done[order] = end[~other]
        np.testing.assert_allclose(sched.completion[lane, ..., 0], done.reshape(tok.shape).max(axis=-1),
                                   rtol=0, atol=1e-9)


B, STEP = 20, 10.0


@pytest.mark.parametrize("rho", [0.5, pytest.param(0.8, marks=pytest.mark.long)])  # the heavier load: 3 s
def test_pollaczek_khinchine_for_both_tenants_on_one_replica(rho):
    """One replica, one sequence a batch: an M/G/1 queue of two Poisson classes (the learner's
    open_poisson stream of B per STEP s, the other tenant's), each of one token length, so two
    service times S1, S2 from the pool's service model. FIFO: both wait
    W = (l1 E[S1^2] + l2 E[S2^2]) / (2 (1 - rho)) on average."""
    from test_gpu_rm import random_rm

    rm = replace(random_rm(np.random.default_rng(7), "fifo"), gpus=1, max_batch=1, max_wait_s=0.0,
                 sequences_per_sample=1, prompt_tokens=det(150.0), response_tokens=det(300.0))
    model = serving_spec(rm, "rm").model
    s1, s2 = (float(model.seconds(np.float64(1.0), L, L * L, L)) for L in (450.0, 900.0))
    lam1 = B / STEP
    lam2 = (rho - lam1 * s1) / s2
    assert lam2 > 0.1  # the other tenant carries a real part of the load
    from racsim.config.schema import ChannelConf

    bgc = BackgroundConf(rate_per_s=lam2, prompt_tokens=det(300.0), response_tokens=det(600.0))
    pcfg = PipelineConf(steps=500, batch_size=B, generate=det(8.0), fast_score=det(1.0), submit=det(0.0),
                        update=det(1.0), arrivals=ArrivalsConf(mode="open_poisson"),
                        channels={"g": ChannelConf(kind="gpu_rm", rm=rm, background=bgc)})
    draws = draw(pcfg, 8, np.random.default_rng(11))
    sched = run_lanes(draws, False)
    exact = mg1_mean_wait(lam1 + lam2, (lam1 * s1 + lam2 * s2) / (lam1 + lam2),
                          (lam1 * s1 * s1 + lam2 * s2 * s2) / (lam1 + lam2))
    warm = 20
    learner = (sched.service_start - sched.submit_time)[:, warm:, :, 0].reshape(8, -1)
    bg = sched.background["g"]
    keep = bg["arrival"] >= sched.step_start[bg["lane"], warm]
    other = [(bg["start"] - bg["arrival"])[keep & (bg["lane"] == i)] for i in range(8)]
    near([x.mean() for x in learner], exact, "the learner's wait")
    near([x.mean() for x in other], exact, "the other tenant's wait")
    row = channel_stats(sched, {"g": None}, warm).iloc[0]
    t0, t1 = sched.step_start[:, warm], sched.step_start[:, -1]
    inside = (bg["arrival"] >= t0[bg["lane"]]) & (bg["arrival"] <= t1[bg["lane"]])
    assert row.background_jobs == int(inside.sum())
    assert row.background_sojourn_p95_s >= row.background_wait_p95_s + s2 - 1e-9
    assert abs(row.utilisation - rho) < 0.03  # the other tenant's busy seconds count too


def test_the_capacity_load_counts_the_other_tenant_in_full_batches():
    """The offered load of a count: the learner's work plus rate x the seconds of a full batch of
    the other tenant's requests over its size (fixed token lengths: every batch full)."""
    from racsim.analyses.capacity import channel_loads
    from racsim.config.spec import scenario

    cfg = scenario(_compose("scenario=capacity/judge_rm_h100"))
    key = "pipeline.channels.judge.rm.gpus"
    base = channel_loads(cfg, "judge", key, [5, 8])
    ch = cfg.pipeline.channels["judge"]
    cfg.pipeline.channels["judge"] = replace(ch, background=BackgroundConf(
        rate_per_s=4.0, prompt_tokens=det(200.0), response_tokens=det(400.0)))
    more = channel_loads(cfg, "judge", key, [5, 8])
    M, L = ch.rm.max_batch, 600.0
    assert LOAD_REQUESTS % M == 0 and M * M * L <= ch.rm.token_budget * M  # whole, full batches
    per_request = float(serving_spec(ch.rm, "rm").model.seconds(np.float64(M), M * L, M * L * L, L)) / M
    for n in (5, 8):
        assert more[n]["load"] == pytest.approx(base[n]["load"] + 4.0 * per_request / n, rel=1e-9)
        assert more[n]["load_sampled"] == pytest.approx(base[n]["load_sampled"] + 4.0 * per_request / n, rel=1e-9)


@pytest.mark.long  # 2.1 CPU s
def test_what_a_shared_pool_refuses_is_named():
    from racsim.config.spec import scenario
    from racsim.config.validate import validate

    def with_background(bg, **change):
        cfg = scenario(_compose("channel@pipeline.channels.judge=judge_gpu_rm"))
        ch = cfg.pipeline.channels["judge"]
        rm = change.pop("rm", {})
        cfg.pipeline.channels["judge"] = replace(ch, background=bg, rm=replace(ch.rm, **rm), **change)
        return cfg

    validate(with_background(BackgroundConf(rate_per_s=2.0)))
    validate(with_background(BackgroundConf(rate_per_s=2.0, response_tokens=det(100.0))))
    key = "pipeline.channels.judge.background"
    bad = [
        (with_background(BackgroundConf(rate_per_s=2.0), rm={"batching": "continuous", "chunked_prefill": True}),
         key, "chunked_prefill"),
        (with_background(BackgroundConf(rate_per_s=2.0), degraded_factor=3.0, p_degrade=0.1, p_recover=0.5),
         key, "bursts"),
        (with_background(BackgroundConf(rate_per_s=2.0), faults=FaultsConf(mtbf_s=100.0, mttr_s=5.0)), key, "faults"),
        (with_background(BackgroundConf(rate_per_s=2.0, latency=det(1.0))), f"{key}.latency", "prompt_tokens"),
        (with_background(BackgroundConf(rate_per_s=2.0, prompt_tokens=LatencyConf(kind="lognormal", mean=-5.0))),
         f"{key}.prompt_tokens.mean", ""),
    ]
    for cfg, where, says in bad:
        with pytest.raises(ConfigError) as e:
            validate(cfg)
        assert e.value.key == where and says in str(e.value), (where, str(e.value))
    queue = scenario(_compose())
    ch = queue.pipeline.channels["verifier"]
    queue.pipeline.channels["verifier"] = replace(ch, background=BackgroundConf(rate_per_s=1.0,
                                                                                prompt_tokens=det(10.0)))
    with pytest.raises(ConfigError) as e:
        validate(queue)
    assert e.value.key == "pipeline.channels.verifier.background.prompt_tokens" and "gpu_rm" in str(e.value)


def test_other_tenants_sojourns_fall_in_the_unit_of_their_arrivals_step():
    """:func:`background_sojourns` against a loop: a request arriving in [step_start[lane, w],
    step_start[lane, -1]] belongs to the step whose start it follows (the last step for the end
    itself), and to that step's unit; the others are left out."""
    from racsim.analyses.capacity.intervals import background_sojourns, batch_units

    rng = np.random.default_rng(3)
    for _ in range(40):
        T, S, w = int(rng.integers(1, 5)), int(rng.integers(2, 12)), 0
        w = int(rng.integers(0, S - 1))
        step_start = np.cumsum(rng.exponential(1.0, (T, S + 1)), axis=1)
        n = int(rng.integers(0, 60))
        lane = rng.integers(0, T, n)
        arrival = rng.uniform(0, step_start[:, -1].max() + 1, n)
        edges = rng.random(n) < 0.2  # some exactly on a step's start, the run's end among them
        pick = rng.integers(0, S + 1, n)
        arrival[edges] = step_start[lane[edges], pick[edges]]
        bg = {"lane": lane, "arrival": arrival, "end": arrival + rng.exponential(2.0, n)}
        unit = batch_units(T, S - w, int(rng.integers(1, S - w + 1)))
        soj, got = background_sojourns(step_start, bg, w, unit)
        want_soj, want_unit = [], []
        for i in range(n):
            s = step_start[lane[i]]
            if not s[w] <= arrival[i] <= s[-1]:
                continue
            step = max(k for k in range(S) if s[k] <= arrival[i])
            want_soj.append(bg["end"][i] - arrival[i])
            want_unit.append(unit[lane[i], step - w])
        np.testing.assert_array_equal(soj, want_soj)
        np.testing.assert_array_equal(got, want_unit)


@pytest.mark.long
def test_a_shared_judge_is_sized_for_its_other_tenants():
    """A capacity search on a judge shared with another tenant: each count's load carries the other
    tenant's work (rate x seconds per request in full batches over the GPUs), its sojourn p95 comes
    with an interval around the estimate, and a target on it that no count meets binds every count (the
    search says so: status infeasible).
    Counts simulated side by side in spawned processes give the same curve to the last bit."""
    from racsim.analyses.capacity import run_capacity
    from racsim.config.defaults import compose_config
    from racsim.config.spec import scenario
    from racsim.pipeline.background import background_work
    from racsim.report.capacity import recommendation_text
    from test_capacity_slo import SMALL

    cfg = scenario(compose_config("scenario=capacity/judge_rm_h100", *SMALL, "capacity.max_background_sojourn_p95_s=0.01"))
    ch = cfg.pipeline.channels["judge"]
    cfg.pipeline.channels["judge"] = replace(ch, background=BackgroundConf(rate_per_s=6.0))
    cfg = replace(cfg, capacity=replace(cfg.capacity, counts=[4, 6, 8]))  # the first here, two left to a pool
    res = run_capacity(replace(cfg, capacity=replace(cfg.capacity, workers=1)))
    pooled = run_capacity(replace(cfg, capacity=replace(cfg.capacity, workers=2)))
    pd.testing.assert_frame_equal(res.curve, pooled.curve, check_exact=True)
    rac = res.curve[res.curve.corrector == "rac"].set_index("count")
    other = background_work(cfg.pipeline.channels["judge"], "judge")
    for n, r in rac.iterrows():
        assert r.load_background == pytest.approx(other / n, rel=1e-12)
        if r.status == "ok":
            assert r.background_sojourn_p95_s_lo <= r.background_sojourn_p95_s <= r.background_sojourn_p95_s_hi
            assert r.background_jobs > 0 and r.fails == "max_background_sojourn_p95_s"
    assert (rac.status == "ok").any() and res.recommended is None
    # the other tenant's sojourn stays seconds over 0.01 s at every count: the search says no count can meet it
    assert res.status == "infeasible" and [u.key for u in res.unreachable] == ["max_background_sojourn_p95_s"]
    text = recommendation_text(res)
    assert "capacity.max_background_sojourn_p95_s = 0.01 cannot be met by" in text
    assert "other tenants' sojourn p95 is" in text


@pytest.mark.parametrize("seed", range(8, 14))
def test_a_blocking_run_merges_step_by_step_as_the_event_loop_batches(seed, monkeypatch):
    """racsim/pipeline/shared.py: a blocking run places each step's requests among the other tenants'
    with max_batch provisional ones after them, rewritten at the next step; at several rates it
    equals the per-lane event loop to the last bit, its buffer grown past its first size."""
    from racsim.pipeline.shared import SharedLanes

    sizes = []
    finish = SharedLanes.finish
    monkeypatch.setattr(SharedLanes, "finish", lambda self, until: (
        sizes.append((self.tok.shape[1] + 4 * self.spec.max_batch, self.cap)), finish(self, until))[1])
    pcfg = replace(shared_pcfg(seed), steps=40)
    g = pcfg.channels["g"]
    rate = [1.0, 2.0, 4.0][seed % 3]
    pcfg.channels["g"] = replace(g, rm=replace(g.rm, order="fifo"),
                                 background=replace(g.background, rate_per_s=rate))
    draws = draw(pcfg, 3, np.random.default_rng(seed))
    vec = run_lanes(draws, True)
    assert_same_schedule(vec, run_lanes(draws, True, gpu_loop=True), f"seed {seed} rate {rate}")
    (first, last), = sizes
    assert last > first  # the other tenants' requests outgrew the learner's
