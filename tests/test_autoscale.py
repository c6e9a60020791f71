"""Autoscaled pools (issue 11, item 8): ``pipeline.channels.*.autoscale``.

Oracles written from the rule as the README states it, not from racsim/pipeline/autoscale.py:

* a per-request event loop (a heap of candidate instants; FIFO queue; servers that
  are requested, start up, serve and are released) on the asynchronous optimizer's
  clock, which a running sum of the phase durations gives independently: every
  job's start and end and every server's request and release times, request by request;
* conservation: every routed request served exactly once for its drawn duration, never
  more jobs in service than ready servers, billed server-seconds = the integral of the
  pool's size over time, a pool always within [min, max];
* a rule that can never fire gives exactly the fixed pool of ``min`` (the whole schedule);
* both engines agree to the last bit on random configs (queue and gpu_rm channels,
  asynchronous and blocking with and without a timeout) reaching every branch;
* with arrivals over time (``pipeline.arrivals``): the same event loop fed each sample's
  ready instant (its step's start + offset, by a running sum), and for a gpu_rm pool a rule
  that never fires gives the fixed pool of ``min`` fed the same way (which
  tests/test_arrivals_gpu.py holds to the batcher oracle).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import replace

import numpy as np
import pytest
from helpers import assert_same_schedule, det, gpu, rm_model

from racsim.config.schema import ArrivalsConf, AutoscaleConf, ChannelConf, LatencyConf, PipelineConf, RMConf
from racsim.config.validate import validate
from racsim.errors import ConfigError
from racsim.pipeline.draws import draw
from racsim.pipeline.lanes import run_lanes
from racsim.pipeline.simpy_engine import run_simpy
from racsim.pipeline.stats import channel_stats


def random_rule(rng) -> AutoscaleConf:
    lo = int(rng.integers(1, 3))
    return AutoscaleConf(min=lo, max=lo + int(rng.integers(0, 4)), queue_above=int(rng.integers(0, 4)),
                         for_s=float(rng.uniform(0.2, 3.0)), startup_s=float(rng.uniform(0.5, 5.0)),
                         idle_s=float(rng.uniform(0.5, 6.0)), cost_per_hour=float(rng.uniform(0.5, 3.0)))


def queue_pcfg(seed: int) -> PipelineConf:
    """One or two autoscaled queue channels at 0.5-3x the load their min pool serves (continuous
    draws: no ties), some with routing; one fixed queue channel beside them on odd seeds."""
    rng = np.random.default_rng(700 + seed)
    batch = int(rng.integers(1, 5))
    chans = {}
    for k in range(1 + seed % 2):
        rule = random_rule(rng)
        lat = LatencyConf(kind=["exponential", "lognormal"][k], mean=float(rng.uniform(0.5, 3.0)) * rule.min * 3.0 / batch,
                          sigma=0.8)
        chans[f"a{k}"] = ChannelConf(latency=lat, workers=1, max_delay=int(rng.integers(0, 5)), autoscale=rule,
                                     route_prob=[1.0, 0.7][int(rng.integers(2))])
    if seed % 2:
        chans["f"] = ChannelConf(latency=LatencyConf(kind="exponential", mean=2.0), workers=2, max_delay=3)
    return PipelineConf(steps=int(rng.integers(10, 25)), batch_size=batch,
                        generate=LatencyConf(kind="exponential", mean=2.0), fast_score=det(0.3), submit=det(0.05),
                        update=LatencyConf(kind="uniform", mean=0.6, low=0.2, high=1.0), channels=chans)


def clock(phase: np.ndarray) -> np.ndarray:
    """Submission times of the asynchronous optimizer, by a running sum of the phases."""
    gen, fast, sub, upd = phase
    n, steps = gen.shape
    submit, start = np.zeros((n, steps)), np.zeros(n)
    for t in range(steps):
        submit[:, t] = start + gen[:, t] + fast[:, t] + sub[:, t]
        start = submit[:, t] + upd[:, t]
    return submit


def step_starts(phase: np.ndarray) -> np.ndarray:
    """(trials, steps) start of each step of the asynchronous optimizer, by a running sum of the phases."""
    gen, fast, sub, upd = phase
    start = np.zeros(gen.shape)
    for t in range(1, gen.shape[1]):
        start[:, t] = start[:, t - 1] + gen[:, t - 1] + fast[:, t - 1] + sub[:, t - 1] + upd[:, t - 1]
    return start


def oracle(arrival, service, rule):
    """One lane's autoscaled FIFO queue, request by request. ``arrival`` non-decreasing.
    Returns start, end per job and (slot, requested, released) per server ever billed, in the
    order they were requested; a new server takes the lowest slot free, and "first" means by slot."""
    heap = list(arrival)
    heapq.heapify(heap)
    queue, nxt = deque(), 0
    servers = [{"slot": k, "req": 0.0, "ready": 0.0, "busy_to": 0.0, "rel": math.inf} for k in range(rule.min)]
    start, end = [math.nan] * len(arrival), [math.nan] * len(arrival)
    above = None
    while heap:
        tau = heapq.heappop(heap)
        while heap and heap[0] == tau:
            heapq.heappop(heap)
        while nxt < len(arrival) and arrival[nxt] <= tau:
            queue.append(nxt)
            nxt += 1
        live = sorted((s for s in servers if s["rel"] == math.inf), key=lambda s: s["slot"])
        for s in live:  # the head job to each idle ready server, lowest index first
            if queue and s["ready"] <= tau and s["busy_to"] <= tau:
                j = queue.popleft()
                start[j], end[j] = tau, tau + service[j]
                s["busy_to"] = end[j]
                heapq.heappush(heap, end[j])
                heapq.heappush(heap, end[j] + rule.idle_s)
        for s in live:  # idle since max(ready, last completion) for idle_s: released
            idle_from = max(s["ready"], s["busy_to"])
            n_live = sum(x["rel"] == math.inf for x in servers)
            if n_live > rule.min and idle_from <= tau and tau >= idle_from + rule.idle_s:
                s["rel"] = tau
        live = [s for s in servers if s["rel"] == math.inf]
        if len(queue) > rule.queue_above:
            if above is None:
                above = tau
                heapq.heappush(heap, tau + rule.for_s)
            idle = any(s["ready"] <= tau and s["busy_to"] <= tau for s in live)
            if tau >= above + rule.for_s and len(live) < rule.max and not idle:
                ready = tau + rule.startup_s
                slot = min(set(range(rule.max)) - {s["slot"] for s in live})  # the lowest slot free
                servers.append({"slot": slot, "req": tau, "ready": ready, "busy_to": ready, "rel": math.inf})
                heapq.heappush(heap, ready)
                heapq.heappush(heap, ready + rule.idle_s)
                above = tau
                heapq.heappush(heap, tau + rule.for_s)
        else:
            above = None
    return np.array(start), np.array(end), [(s["slot"], s["req"], s["rel"]) for s in servers]


N_SEEDS = 8


@pytest.fixture(scope="module")
def queue_cases():
    out = {}
    for seed in range(N_SEEDS):
        pcfg = queue_pcfg(seed)
        draws = draw(pcfg, 3, np.random.default_rng(seed))
        out[seed] = (pcfg, draws, run_lanes(draws, False), run_simpy(draws, False))
    return out


@pytest.mark.parametrize("seed", range(N_SEEDS))
def test_queue_pool_matches_event_loop_oracle(queue_cases, seed):
    pcfg, draws, lanes, sim = queue_cases[seed]
    assert_same_schedule(lanes, sim, f"seed {seed}")
    submit = clock(draws.phase)
    for k, nm in enumerate(lanes.channel_names):
        if nm not in draws.autoscale:
            continue
        rule = pcfg.channels[nm].autoscale
        log = lanes.pools[nm]
        for i in range(draws.phase.shape[1]):
            sent = draws.routed[nm][i] if nm in draws.routed else np.ones(draws.service[nm][i].shape, bool)
            arr = np.repeat(submit[i], pcfg.batch_size).reshape(sent.shape)[sent]
            s, e, srv = oracle(arr.tolist(), draws.service[nm][i][sent].tolist(), rule)
            np.testing.assert_array_equal(lanes.service_start[i, ..., k][sent], s)
            np.testing.assert_array_equal(lanes.completion[i, ..., k][sent], e)
            mine = log["lane"] == i
            np.testing.assert_array_equal(log["server"][mine], [k for k, _, _ in srv])
            np.testing.assert_array_equal(log["requested"][mine], [r for _, r, _ in srv])
            np.testing.assert_array_equal(log["released"][mine], [r for _, _, r in srv])


@pytest.mark.parametrize("mode", ["poisson", "stream"])
@pytest.mark.parametrize("seed", range(4))
def test_queue_pool_with_arrivals_over_time_matches_event_loop_oracle(seed, mode):
    """Each sample joins the autoscaled queue the second it is ready, as its own job."""
    pcfg = replace(queue_pcfg(seed), arrivals=ArrivalsConf(mode=mode))
    draws = draw(pcfg, 3, np.random.default_rng(seed))
    lanes = run_lanes(draws, False)
    assert_same_schedule(lanes, run_simpy(draws, False), f"seed {seed} {mode}")
    start = step_starts(draws.phase)
    for k, nm in enumerate(lanes.channel_names):
        if nm not in draws.autoscale:
            continue
        log = lanes.pools[nm]
        for i in range(draws.phase.shape[1]):
            sent = draws.routed[nm][i] if nm in draws.routed else np.ones(draws.service[nm][i].shape, bool)
            ready = start[i][:, None] + draws.offset[i]
            order = np.argsort(ready[sent], kind="stable")  # steps never overlap: one sort over the run
            s, e, srv = oracle(ready[sent][order].tolist(), draws.service[nm][i][sent][order].tolist(),
                               pcfg.channels[nm].autoscale)
            np.testing.assert_array_equal(lanes.service_start[i, ..., k][sent][order], s)
            np.testing.assert_array_equal(lanes.completion[i, ..., k][sent][order], e)
            mine = log["lane"] == i
            np.testing.assert_array_equal(log["requested"][mine], [r for _, r, _ in srv])
            np.testing.assert_array_equal(log["released"][mine], [r for _, _, r in srv])


def test_random_configs_reach_every_branch(queue_cases):
    seen = dict(scaled_up=False, reached_max=False, scaled_down=False, stayed_min=False, routed=False, dropped=False,
                slot_reused=False)
    for pcfg, draws, lanes, _ in queue_cases.values():
        for nm, log in lanes.pools.items():
            rule = pcfg.channels[nm].autoscale
            per_lane = np.bincount(log["lane"])
            seen["scaled_up"] |= bool((per_lane > rule.min).any())
            seen["stayed_min"] |= bool((per_lane == rule.min).any())
            seen["scaled_down"] |= bool(np.isfinite(log["released"]).any())
            seen["reached_max"] |= rule.max > rule.min and max_alive(log).max() == rule.max
            seen["routed"] |= nm in draws.routed
            for i in np.unique(log["lane"]):
                slots = log["server"][log["lane"] == i]
                seen["slot_reused"] |= len(set(slots.tolist())) < len(slots)
        seen["dropped"] |= bool((lanes.status == 1).any())
    assert all(seen.values()), seen


def max_alive(log) -> np.ndarray:
    """Per lane, the most servers billed at once (a sweep over request/release instants)."""
    out = []
    for i in np.unique(log["lane"]):
        m = log["lane"] == i
        ev = sorted([(t, 1) for t in log["requested"][m]] + [(t, -1) for t in log["released"][m] if np.isfinite(t)],
                    key=lambda x: (x[0], x[1]))
        out.append(max(np.cumsum([d for _, d in ev])))
    return np.array(out)


@pytest.mark.parametrize("seed", range(N_SEEDS))
def test_conservation(queue_cases, seed):
    pcfg, draws, lanes, _ = queue_cases[seed]
    stats = channel_stats(lanes, draws.workers).set_index("channel")
    t0, t1 = lanes.step_start[:, 0], lanes.step_start[:, -1]
    for k, nm in enumerate(lanes.channel_names):
        if nm not in draws.autoscale:
            continue
        rule, log = pcfg.channels[nm].autoscale, lanes.pools[nm]
        sent = draws.routed[nm] if nm in draws.routed else np.ones(draws.service[nm].shape, bool)
        st, en = lanes.service_start[..., k][sent], lanes.completion[..., k][sent]
        assert np.all(np.isfinite(en)) and np.array_equal(en - st, (st + draws.service[nm][sent]) - st)
        assert np.all(st >= lanes.submit_time[..., k][sent])
        assert max_alive(log).max() <= rule.max and np.all(np.bincount(log["lane"]) >= rule.min)
        integral = []
        for i in range(lanes.n_trials):  # the pool's size, integrated piece by piece over [t0, t1]
            m = log["lane"] == i
            req, rel = log["requested"][m], log["released"][m]
            cuts = np.unique(np.clip(np.concatenate([req, rel[np.isfinite(rel)], [t0[i], t1[i]]]), t0[i], t1[i]))
            mid = (cuts[:-1] + cuts[1:]) / 2
            size = ((req[None, :] <= mid[:, None]) & (rel[None, :] > mid[:, None])).sum(axis=1)
            assert np.all(size >= rule.min)
            integral.append(float((size * np.diff(cuts)).sum()))
            # never more jobs in service than ready servers, at every job start
            ready = req + np.where(req > 0, rule.startup_s, 0.0)
            s_i, e_i = lanes.service_start[i, ..., k][sent[i]], lanes.completion[i, ..., k][sent[i]]
            for tau in s_i:
                busy = np.count_nonzero((s_i <= tau) & (e_i > tau))
                assert busy <= np.count_nonzero((ready <= tau) & (rel > tau))
        assert stats.loc[nm, "server_seconds"] == pytest.approx(np.mean(integral), rel=1e-12)
        span = t1 - t0
        assert stats.loc[nm, "servers_billed_mean"] == pytest.approx(np.mean(np.array(integral) / span), rel=1e-12)
        cost = np.mean(integral) / pcfg.steps * 1000 * rule.cost_per_hour / 3600
        assert stats.loc[nm, "cost_per_1000_steps"] == pytest.approx(cost, rel=1e-12)


def judge_pcfg(seed: int, rule) -> PipelineConf:
    rng = np.random.default_rng(900 + seed)
    rm = RMConf(model=rm_model("8B"), gpu=gpu("H100", name="slow", peak_tflops=float(rng.uniform(30, 120))),
                gpus=1, max_batch=int(rng.integers(1, 9)), token_budget=int(rng.integers(800, 5000)),
                max_wait_s=float(rng.choice([0.0, 0.15, 1.0])), order=["fifo", "shortest"][seed % 2],
                sequences_per_sample=int(rng.integers(1, 4)),
                prompt_tokens=LatencyConf(kind="lognormal", mean=150.0, sigma=0.6, low=1.0),
                response_tokens=LatencyConf(kind="exponential", mean=300.0))
    chans = {"g": ChannelConf(kind="gpu_rm", rm=rm, max_delay=[None, 1, 3][seed % 3], autoscale=rule)}
    if seed % 2:
        chans["q"] = ChannelConf(latency=LatencyConf(kind="exponential", mean=3.0), workers=1, max_delay=2,
                                 autoscale=random_rule(rng), route_prob=0.6)
    return PipelineConf(steps=int(rng.integers(8, 18)), batch_size=int(rng.integers(1, 5)),
                        generate=LatencyConf(kind="lognormal", mean=1.0, sigma=0.5),
                        fast_score=LatencyConf(kind="exponential", mean=0.2), submit=det(0.05),
                        update=LatencyConf(kind="gaussian", mean=0.4, std=0.1, low=0.05), channels=chans)


MODES = [(False, None), (True, None), (True, 0.6)]
ARRIVALS = ["batch", "poisson"]


N_GPU = 5


@pytest.fixture(scope="module")
def gpu_cases():
    out = {}
    for seed in range(N_GPU):
        rng = np.random.default_rng(seed)
        rule = random_rule(rng)
        rule = replace(rule, max=rule.min + 2, queue_above=int(rng.integers(0, 3)))  # room to scale up
        for mode in ARRIVALS:
            pcfg = replace(judge_pcfg(seed, rule), arrivals=ArrivalsConf(mode=mode))
            draws = draw(pcfg, 3, np.random.default_rng(seed))
            for blocking, timeout in MODES:
                out[(seed, mode, blocking, timeout)] = (draws, run_lanes(draws, blocking, timeout),
                                                        run_simpy(draws, blocking, timeout))
    return out


@pytest.mark.parametrize("blocking,timeout", MODES)
@pytest.mark.parametrize("mode", ARRIVALS)
@pytest.mark.parametrize("seed", range(N_GPU))
def test_engines_agree_with_gpu_rm_and_blocking(gpu_cases, seed, mode, blocking, timeout):
    draws, a, b = gpu_cases[(seed, mode, blocking, timeout)]
    assert_same_schedule(a, b, f"seed {seed} {mode} blocking {blocking} timeout {timeout}")
    for nm in draws.autoscale:
        assert all(np.array_equal(a.pools[nm][c], b.pools[nm][c]) for c in a.pools[nm]), nm
        assert a.pools[nm]["server"].max() < draws.autoscale[nm].max  # slots: one track per replica
    for nm, log in (a.gpu_batches or {}).items():
        assert log["replica"].max() < log["replicas"]


def test_gpu_cases_scale_in_every_mode(gpu_cases):
    seen = set()
    for (seed, mode, blocking, timeout), (draws, a, _) in gpu_cases.items():
        for nm, log in a.pools.items():
            if np.bincount(log["lane"]).max() > draws.autoscale[nm].min:
                seen.add((nm, mode, blocking, timeout))
            if np.isfinite(log["released"]).any():
                seen.add((nm, "down", mode, blocking))
        if blocking and timeout is not None and (a.status == 1).any():
            seen.add(("timeout_drop", mode))
    want = {("g", m, b, t) for b, t in MODES for m in ARRIVALS} | \
        {x for m in ARRIVALS for x in [("g", "down", m, False), ("g", "down", m, True), ("timeout_drop", m)]}
    assert want <= seen, want - seen


@pytest.mark.parametrize("blocking,timeout", MODES)
@pytest.mark.parametrize("seed,mode", [(0, "batch"), (1, "batch"), (2, "batch"), (0, "stream"), (1, "poisson")])
def test_a_rule_that_never_fires_is_the_fixed_pool_of_min(seed, mode, blocking, timeout):
    rng = np.random.default_rng(seed)
    never = replace(random_rule(rng), queue_above=10**9)
    auto = replace(judge_pcfg(seed, never), arrivals=ArrivalsConf(mode=mode))
    fixed = {}
    bursts = {} if mode == "batch" else dict(degraded_factor=3.0, p_degrade=0.3, p_recover=0.4)  # per step, by group
    for nm, ch in auto.channels.items():
        ch = replace(ch, autoscale=replace(ch.autoscale, queue_above=10**9), **bursts)
        auto.channels[nm] = ch
        n = ch.autoscale.min
        fixed[nm] = replace(ch, autoscale=None, rm=replace(ch.rm, gpus=n * ch.rm.tp)) if ch.kind == "gpu_rm" \
            else replace(ch, autoscale=None, workers=n)
    d_auto = draw(auto, 3, np.random.default_rng(seed))
    d_fixed = draw(replace(auto, channels=fixed), 3, np.random.default_rng(seed))
    for engine in (run_lanes, run_simpy):
        a, f = engine(d_auto, blocking, timeout), engine(d_fixed, blocking, timeout)
        # the batch log's pool size reads max for an autoscaled pool: the rest is the fixed pool's
        logs = {nm: {**log, "replicas": a.gpu_batches[nm]["replicas"]} for nm, log in f.gpu_batches.items()}
        assert_same_schedule(a, replace(f, gpu_batches=logs), f"{engine.__name__} seed {seed}")
        for nm in d_auto.autoscale:
            assert np.bincount(a.pools[nm]["lane"]).tolist() == [d_auto.autoscale[nm].min] * 3
            assert not np.isfinite(a.pools[nm]["released"]).any()


def compose_cfg(overrides, channel="verifier", **rule):
    """The default config (with ``overrides``) and an autoscale block on ``channel`` (set in
    Python: a command line sets one through a scenario YAML, then changes its fields)."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from racsim.config.schema import register_configs

    register_configs()
    with initialize_config_module(version_base="1.3", config_module="racsim.conf"):
        cfg = compose("config", overrides=overrides)
    base = dict(min=1, max=3, queue_above=2, for_s=1.0, startup_s=5.0, idle_s=10.0)
    cfg.pipeline.channels[channel].autoscale = OmegaConf.structured(AutoscaleConf(**{**base, **rule}))
    return cfg


@pytest.mark.parametrize("change", [
    dict(min=0), dict(max=0), dict(queue_above=-1), dict(for_s=0.0), dict(startup_s=-1.0), dict(idle_s=float("nan")),
    dict(cost_per_hour=-2.0),
])
def test_bad_rules_name_the_key(change):
    validate(compose_cfg([]))
    with pytest.raises(ConfigError, match=f"pipeline.channels.verifier.autoscale.{next(iter(change))}"):
        validate(compose_cfg([], **change))


@pytest.mark.parametrize("extra", [["pipeline.channels.verifier.workers=null"],
                                   ["pipeline.channels.verifier.cancel_on_drop=true"]])
def test_autoscale_needs_a_queue_with_workers_or_gpu_rm(extra):
    with pytest.raises(ConfigError, match="pipeline.channels.verifier.autoscale"):
        validate(compose_cfg(extra))
    validate(compose_cfg(["channel@pipeline.channels.judge=judge_gpu_rm"], channel="judge"))


@pytest.mark.long  # 2.2 CPU s
def test_capacity_whatif_compares_with_every_fixed_pool_evaluated():
    from hydra import compose, initialize_config_module

    from racsim.analyses.capacity import run_capacity
    from racsim.analyses.capacity.targets import feasible
    from racsim.config.schema import register_configs
    from racsim.config.spec import scenario
    from racsim.report.capacity import autoscale_verdict, capacity_summary_markdown

    small = ["learner.trials=2", "learner.bootstrap=0", "pipeline.steps=10", "pipeline.warmup_steps=2",
             "capacity.benchmark=false", "capacity.counts=[3]", "pipeline.channels.judge.autoscale.for_s=3",
             "pipeline.channels.judge.autoscale.startup_s=20", "pipeline.channels.judge.autoscale.queue_above=256"]
    register_configs()
    with initialize_config_module(version_base="1.3", config_module="racsim.conf"):
        cfg = scenario(compose("config", overrides=["scenario=capacity/judge_rm_autoscale"] + small))
    res = run_capacity(cfg)
    counts = sorted({2, 3, 8} | set(res.searched))  # the counts, the rule's min and max, and the search's between
    assert sorted(res.curve["count"].unique()) == counts and all(3 < n < 8 for n in res.searched)
    w = res.autoscale.set_index(["pool", "corrector"])
    assert sorted(res.autoscale.pool.unique()) == sorted(["autoscaled"] + [f"fixed {n}" for n in counts])
    for pool, n in ((f"fixed {n}", n) for n in counts):
        curve = res.curve[res.curve["count"] == n].set_index("corrector")
        for c in curve.index:
            for col in ("bias_exact", "step_s", "cost_per_1000_steps"):
                a, b = w.loc[(pool, c), col], curve.loc[c, col]
                assert a == b or (np.isnan(a) and np.isnan(b)), (pool, c, col)  # NaN: an overloaded pool
            assert w.loc[(pool, c), "meets"] == curve.loc[c, "feasible"], (pool, c)
    auto = w.xs("autoscaled")
    assert 2 < auto.servers.iloc[0] <= 8  # it scaled up, within the rule's bounds
    assert np.isnan(auto.loc["wait_for_slow", "cost_per_1000_steps"])
    for c in auto.index:  # the autoscaled rows are judged against the same targets
        assert auto.loc[c, "meets"] == feasible(auto.loc[c].to_dict(), res.targets)
    # fixed 2 is overloaded (not simulated): its price per hour bounds the autoscaled pool's cost from below
    assert w.loc[("fixed 2", "naive"), "status"].startswith("overloaded")
    step = auto.loc["naive", "step_s"]
    cheap = res.curve[res.curve["count"] == 2].cost_per_hour.iloc[0] * step * 1000 / 3600
    dear = w.loc[("fixed 8", "naive"), "cost_per_1000_steps"]
    assert cheap < auto.loc["naive", "cost_per_1000_steps"] < dear
    md = capacity_summary_markdown(cfg, res, [])
    assert "## Autoscaling what-if" in md and autoscale_verdict(res.autoscale, res.targets["corrector"]) in md


def test_autoscale_verdict_names_the_cheapest_fixed_pool_meeting_the_targets():
    import pandas as pd

    from racsim.report.capacity import autoscale_verdict

    rng = np.random.default_rng(7)
    for _ in range(50):
        n = int(rng.integers(1, 6))
        servers = rng.choice(np.arange(1, 20), n, replace=False)
        cost = rng.uniform(1, 50, n)
        meets = rng.random(n) < 0.5
        t = pd.DataFrame({"pool": [f"fixed {s}" for s in servers] + ["autoscaled"], "corrector": "rac",
                          "servers": list(servers.astype(float)) + [3.5], "meets": list(meets) + [bool(rng.random() < .5)],
                          "cost_per_1000_steps": list(cost) + [rng.choice([np.nan, 10.0])]})
        v = autoscale_verdict(t, "rac")
        ok = [(c, s) for c, s, m in zip(cost, servers, meets) if m]  # loop oracle: the cheapest meeting pool
        if ok:
            c, s = min(ok)
            assert f"{s} servers, costs ${c:.2f}" in v, v
        else:
            assert "no evaluated fixed pool meets them" in v
        assert ("unmeasured" in v) == bool(np.isnan(t.cost_per_1000_steps.iloc[-1]))
