"""The asynchronous reward pipeline (racsim.pipeline) against independent oracles.

Every oracle here is written from the model's description, not from the code:
a per-customer SimPy queue, the Kiefer-Wolfowitz workload recursion, Lindley's
recursion, Erlang C, per-element loops for the landing step and the status
rules, and hand-computed worked examples. All randomness uses fixed seeds.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import simpy
from helpers import assert_same_schedule, det, det_phases

from racsim.config.schema import ChannelConf, LatencyConf, PipelineConf
from racsim.pipeline.draws import PipelineDraws, draw
from racsim.pipeline.engines import ENGINES, simulate
from racsim.pipeline.landing import classify, landing_step
from racsim.pipeline.lanes import fifo_assign, run_lanes
from racsim.pipeline.schedule import DROPPED, INJECTED, PENDING
from racsim.pipeline.simpy_engine import run_simpy

# ----------------------------------------------------------------------------
# Random configurations (continuous durations: ties have probability zero).


def random_channel(rng: np.random.Generator, kernel: bool) -> ChannelConf:
    workers = [None, 1, 2, 3][rng.integers(4)]
    max_delay = [None, None, 0, 1, 2, 4][rng.integers(6)]
    if kernel:
        n = int(rng.integers(1, 5))
        p = rng.dirichlet(np.ones(n)) * rng.uniform(0.5, 0.9)  # sum < 1: some mass never returns
        return ChannelConf(kernel=[float(v) for v in p], max_delay=max_delay, workers=workers)
    mean = float(rng.uniform(0.5, 7.0))
    kind = ["exponential", "lognormal", "pareto", "gaussian", "deterministic"][rng.integers(5)]
    lat = LatencyConf(kind=kind, mean=mean, sigma=0.8, alpha=2.5, std=mean / 2)
    return ChannelConf(latency=lat, workers=workers, max_delay=max_delay)


def random_pcfg(seed: int) -> PipelineConf:
    rng = np.random.default_rng(1000 + seed)
    K = 1 + seed % 3
    chans = {}
    for k in range(K):
        chans[f"c{k}"] = random_channel(rng, kernel=(k == K - 1 and seed % 2 == 0))
    return PipelineConf(
        steps=int(rng.integers(8, 26)),
        batch_size=int(rng.integers(1, 5)),
        generate=LatencyConf(kind="lognormal", mean=1.0, sigma=0.5),
        fast_score=LatencyConf(kind="exponential", mean=0.2),
        submit=det(0.05),
        update=LatencyConf(kind="gaussian", mean=0.5, std=0.1, low=0.1),
        channels=chans,
    )


N_RANDOM = 8
MODES = [(False, None), (True, None), (True, 2.0)]  # (blocking, wait_timeout)
TRIALS = 4


@pytest.fixture(scope="module")
def cases():
    """(seed, blocking, timeout) -> (pcfg, draws, lanes schedule, simpy schedule)."""
    out = {}
    for seed in range(N_RANDOM):
        pcfg = random_pcfg(seed)
        draws = draw(pcfg, TRIALS, np.random.default_rng(seed))
        for blocking, timeout in MODES:
            a = run_lanes(draws, blocking, timeout)
            b = run_simpy(draws, blocking, timeout)
            out[(seed, blocking, timeout)] = (pcfg, draws, a, b)
    return out


# ----------------------------------------------------------------------------
# 1. Engine agreement.


@pytest.mark.parametrize("blocking,timeout", MODES)
@pytest.mark.parametrize("seed", range(N_RANDOM))
def test_engines_agree_on_random_configs(cases, seed, blocking, timeout):
    _, _, a, b = cases[(seed, blocking, timeout)]
    assert_same_schedule(a, b, f"seed={seed} blocking={blocking} timeout={timeout}")


def test_random_configs_cover_every_case(cases):
    """The agreement tests above are only as good as what the configs exercise."""
    seen = {"K": set(), "workers": set(), "kernel": False, "lost": False, "queued": False,
            "nb_injected": False, "nb_dropped_age": False, "nb_pending": False, "timeout_drop": False,
            "nowait_injected_all": True}
    for (seed, blocking, timeout), (pcfg, draws, a, _) in cases.items():
        seen["K"].add(len(pcfg.channels))
        for k, (name, ch) in enumerate(pcfg.channels.items()):
            seen["workers"].add(ch.workers)
            lost = (draws.service[name] < 0) if name in draws.kernel_channels else np.zeros(a.status.shape[:3], bool)
            if name in draws.kernel_channels:
                seen["kernel"] = True
                seen["lost"] |= bool(lost.any())
            elif ch.workers is not None:
                seen["queued"] |= bool((a.service_start[..., k] > a.submit_time[..., k]).any())
            st = a.status[..., k]
            if not blocking:
                seen["nb_injected"] |= bool((st == INJECTED).any())
                seen["nb_dropped_age"] |= bool(((st == DROPPED) & ~lost).any())
                seen["nb_pending"] |= bool((st == PENDING).any())
            elif timeout is not None:
                seen["timeout_drop"] |= bool(((st == DROPPED) & ~lost).any())
            else:
                seen["nowait_injected_all"] &= bool(np.all((st == INJECTED) == ~lost))
    assert seen.pop("K") == {1, 2, 3}
    assert {None, 1, 2, 3} <= seen.pop("workers")
    assert all(seen.values()), seen


def test_nonblocking_ignores_wait_timeout():
    pcfg = random_pcfg(3)
    draws = draw(pcfg, 3, np.random.default_rng(7))
    for run in (run_lanes, run_simpy):
        assert_same_schedule(run(draws, False, None), run(draws, False, 0.5), run.__name__)


def test_engines_agree_with_integer_ties():
    """Deterministic integer durations put completions exactly on step starts
    and on the wait deadline (no zero-length jobs): the engines still agree."""
    pcfg = PipelineConf(
        steps=12, batch_size=3, generate=det(1.0), fast_score=det(0.0), submit=det(0.0), update=det(1.0),
        channels={
            "a": ChannelConf(latency=det(1.0), workers=1, max_delay=2),
            "b": ChannelConf(latency=det(2.0), workers=2),
            "c": ChannelConf(latency=det(3.0)),
            "k": ChannelConf(kernel=[0.3, 0.3, 0.2], max_delay=1),
        },
    )
    draws = draw(pcfg, 3, np.random.default_rng(1))
    for blocking, timeout in [(False, None), (True, None), (True, 1.0), (True, 2.0), (True, 3.0), (True, 4.0)]:
        a = run_lanes(draws, blocking, timeout)
        b = run_simpy(draws, blocking, timeout)
        assert_same_schedule(a, b, f"blocking={blocking} timeout={timeout}")


def _tie_draws():
    """One step: generate 1 s, submit at t = 1 to a 1-worker channel; job 0
    serves 1 s (done at 2), job 1 serves 0 s behind it (also done at 2)."""
    return PipelineDraws(
        phase=np.array([1.0, 0.0, 0.0, 0.0]).reshape(4, 1, 1),
        service={"a": np.array([[[1.0, 0.0]]])},
        kernel_channels=frozenset(),
        nominal_step=1.0,
        workers={"a": 1},
        max_delay={"a": None},
    )


@pytest.mark.parametrize("engine", ["lanes", "simpy"])
def test_blocking_result_completing_at_the_deadline_is_injected(engine):
    """Wait-for-slow with timeout 1 s: the wait ends at 2.0 and both results
    completed at 2.0, i.e. they are "in by then" and must be injected."""
    s = ENGINES[engine](_tie_draws(), True, 1.0)
    assert s.completion[0, 0, :, 0].tolist() == [2.0, 2.0]
    assert s.step_start[0].tolist() == [0.0, 2.0]
    assert s.status[0, 0, :, 0].tolist() == [INJECTED, INJECTED]
    assert s.delay[0, 0, :, 0].tolist() == [0, 0]


def test_engines_agree_with_discrete_latencies_and_timeout():
    """Regression: SimPy used to decide lateness before a same-instant completion was processed."""
    pcfg = PipelineConf(
        steps=12, batch_size=3, generate=det(1.0), fast_score=det(0.0), submit=det(0.0), update=det(0.0),
        channels={"b": ChannelConf(latency=LatencyConf(kind="exponential", mean=1.0, discrete=True), workers=1)},
    )
    draws = draw(pcfg, 4, np.random.default_rng(1))
    assert_same_schedule(run_lanes(draws, True, 1.0), run_simpy(draws, True, 1.0))


# ----------------------------------------------------------------------------
# 2. FIFO multi-server queue against independent oracles.


def simpy_fifo_oracle(arrival: np.ndarray, service: np.ndarray, c: int):
    """One SimPy process per customer on a Resource of capacity c (1-D inputs)."""
    env = simpy.Environment()
    res = simpy.Resource(env, capacity=c)
    n = len(arrival)
    start, end = np.full(n, np.nan), np.full(n, np.nan)

    def customer(j):
        yield env.timeout(float(arrival[j]))
        with res.request() as req:
            yield req
            start[j] = env.now
            yield env.timeout(float(service[j]))
            end[j] = env.now

    for j in range(n):
        env.process(customer(j))
    env.run()
    return start, end


def kiefer_wolfowitz(arrival: np.ndarray, service: np.ndarray, c: int):
    """Workload vector W (sorted): W[0] is the wait of the arriving customer."""
    w = np.zeros(c)
    start = np.empty(len(arrival))
    for n in range(len(arrival)):
        start[n] = arrival[n] + w[0]
        w[0] += service[n]
        if n + 1 < len(arrival):
            w = np.sort(np.maximum(w - (arrival[n + 1] - arrival[n]), 0.0))
    return start, start + service


def lindley(arrival: np.ndarray, service: np.ndarray):
    wait = np.empty(len(arrival))
    wait[0] = 0.0
    for n in range(len(arrival) - 1):
        wait[n + 1] = max(0.0, wait[n] + service[n] - (arrival[n + 1] - arrival[n]))
    start = arrival + wait
    return start, start + service


def batched_arrivals(rng, lanes, groups, size):
    """Arrivals in groups of equal times (like a batch submission), plus singles."""
    gaps = rng.exponential(1.0, (lanes, groups))
    gaps[:, ::3] = 0.0  # some consecutive groups land at the very same time
    times = np.cumsum(gaps, axis=1)
    return np.repeat(times, size, axis=1)


@pytest.mark.parametrize("c", [1, 2, 3, 5])
def test_fifo_assign_matches_simpy_and_kiefer_wolfowitz(c):
    rng = np.random.default_rng(40 + c)
    lanes = 5
    arrival = batched_arrivals(rng, lanes, 60, 3)
    service = rng.lognormal(0.3, 0.9, arrival.shape) * c / 2.5
    service[:, ::7] = 0.0  # zero-length jobs too
    free = np.zeros((lanes, c))
    start, end, _ = fifo_assign(arrival, service, free.copy())
    for i in range(lanes):
        s_sim, e_sim = simpy_fifo_oracle(arrival[i], service[i], c)
        assert np.array_equal(start[i], s_sim), i
        assert np.array_equal(end[i], e_sim), i
        s_kw, e_kw = kiefer_wolfowitz(arrival[i], service[i], c)
        np.testing.assert_allclose(start[i], s_kw, rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(end[i], e_kw, rtol=1e-12, atol=1e-9)
    assert (start > arrival).any()  # the queue did form


def test_fifo_assign_single_server_is_lindley():
    rng = np.random.default_rng(11)
    lanes, n = 4, 400
    arrival = np.cumsum(rng.exponential(1.0, (lanes, n)), axis=1)
    service = rng.exponential(0.9, (lanes, n))
    start, end, _ = fifo_assign(arrival, service, np.zeros((lanes, 1)))
    for i in range(lanes):
        s_l, e_l = lindley(arrival[i], service[i])
        np.testing.assert_allclose(start[i], s_l, rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(end[i], e_l, rtol=1e-12, atol=1e-9)
    assert (start > arrival).mean() > 0.5


def test_fifo_assign_carries_worker_state():
    """``free`` is updated in place: two calls in a row equal one call."""
    rng = np.random.default_rng(5)
    arrival = np.sort(rng.uniform(0, 20, (3, 40)), axis=1)
    service = rng.exponential(2.0, (3, 40))
    free = np.zeros((3, 2))
    s1, e1, _ = fifo_assign(arrival[:, :25], service[:, :25], free)
    s2, e2, _ = fifo_assign(arrival[:, 25:], service[:, 25:], free)
    s, e, _ = fifo_assign(arrival, service, np.zeros((3, 2)))
    assert np.array_equal(np.hstack([s1, s2]), s) and np.array_equal(np.hstack([e1, e2]), e)
    assert np.array_equal(np.sort(free, axis=1), np.sort(np.stack([np.sort(e[i])[-2:] for i in range(3)]), axis=1))


@pytest.mark.parametrize("blocking,timeout", [(False, None), (True, 1.5)])
@pytest.mark.parametrize("c", [1, 2])
def test_pipeline_lane_queue_matches_simpy_oracle(c, blocking, timeout):
    """The pipeline's job start/completion times for one channel equal a FIFO
    queue fed with its own submit times and service draws, in sample order."""
    pcfg = PipelineConf(
        steps=30, batch_size=3,
        generate=LatencyConf(kind="lognormal", mean=1.0, sigma=0.6),
        fast_score=LatencyConf(kind="exponential", mean=0.1),
        submit=det(0.05), update=det(0.3),
        channels={"q": ChannelConf(latency=LatencyConf(kind="exponential", mean=1.2), workers=c),
                  "free": ChannelConf(latency=LatencyConf(kind="lognormal", mean=3.0))},
    )
    draws = draw(pcfg, 3, np.random.default_rng(21 + c))
    for run in (run_lanes, run_simpy):
        s = run(draws, blocking, timeout)
        for i in range(3):
            arr = s.submit_time[i, :, :, 0].ravel()
            svc = draws.service["q"][i].ravel()
            # submit = step start + generate + fast + submit, for every sample of the step
            exp_submit = s.step_start[i, :-1] + draws.phase[0, i] + draws.phase[1, i] + draws.phase[2, i]
            np.testing.assert_allclose(s.submit_time[i, :, :, 0], np.repeat(exp_submit[:, None], 3, 1), rtol=1e-13)
            s_sim, e_sim = simpy_fifo_oracle(arr, svc, c)
            assert np.array_equal(s.service_start[i, :, :, 0].ravel(), s_sim)
            assert np.array_equal(s.completion[i, :, :, 0].ravel(), e_sim)
            # The infinite-server channel: no wait at all.
            assert np.array_equal(s.service_start[i, :, :, 1], s.submit_time[i, :, :, 1])
            assert np.array_equal(s.completion[i, :, :, 1], s.submit_time[i, :, :, 1] + draws.service["free"][i])
        if not blocking:
            assert (s.service_start[..., 0] > s.submit_time[..., 0]).any()


# ----------------------------------------------------------------------------
# 3. Queueing theory: M/M/c (Erlang C) and M/M/1.


def erlang_c(c: int, lam: float, mu: float):
    """(P(wait > 0), mean wait in queue) of an M/M/c queue."""
    a = lam / mu
    rho = a / c
    assert rho < 1
    top = a**c / math.factorial(c) / (1.0 - rho)
    p_wait = top / (sum(a**k / math.factorial(k) for k in range(c)) + top)
    return p_wait, p_wait / (c * mu - lam)


@pytest.mark.parametrize("c,rho,seed", [(1, 0.7, 0), (3, 0.7, 1), (2, 0.5, 2)])
def test_fifo_assign_mmc_mean_wait_is_erlang_c(c, rho, seed):
    rng = np.random.default_rng(seed)
    lanes, jobs, warm = 1000, 2500, 500  # 2e6 customers after warm-up
    mu = 1.0 / 1.7
    lam = rho * c * mu
    arrival = np.cumsum(rng.exponential(1.0 / lam, (lanes, jobs)), axis=1)
    service = rng.exponential(1.0 / mu, (lanes, jobs))
    start, end, _ = fifo_assign(arrival, service, np.zeros((lanes, c)))
    wait = (start - arrival)[:, warm:]
    p_wait, wq = erlang_c(c, lam, mu)
    if c == 1:  # M/M/1, written separately: P(wait) = rho, Wq = rho / (mu - lambda)
        assert p_wait == pytest.approx(rho, rel=1e-12)
        assert wq == pytest.approx(rho / (mu - lam), rel=1e-12)
    assert wait.mean() == pytest.approx(wq, rel=0.05)
    assert (wait > 0).mean() == pytest.approx(p_wait, rel=0.05)
    np.testing.assert_allclose(end, start + service, rtol=0, atol=0)


def test_erlang_c_formula_sanity():
    # c = 2, a = 1 (rho = 0.5): C = (1/2 / 0.5) / (1 + 1 + 1) = 1/3.
    p, wq = erlang_c(2, 1.0, 1.0)
    assert p == pytest.approx(1 / 3, rel=1e-12) and wq == pytest.approx(1 / 3, rel=1e-12)


# ----------------------------------------------------------------------------
# 4. Landing step and status rules against per-element loops.


def landing_oracle(step_start_row, c, t):
    """The result of step t: the first later step that starts at or after completion."""
    for s, start in enumerate(step_start_row):
        if s > t and start >= c:
            return s
    return len(step_start_row)


def test_landing_step_matches_loop():
    rng = np.random.default_rng(3)
    lanes, steps = 6, 15
    inc = rng.exponential(1.0, (lanes, steps))
    inc[:, ::4] = 0.0  # repeated step starts
    step_start = np.cumsum(inc, axis=1) - inc[:, :1]
    comp = rng.uniform(-1.0, step_start[:, -1:].max() + 3.0, (lanes, steps, 3))
    # completions exactly on a step start, and results that never complete
    comp[:, 2, 0] = step_start[:, 5]
    comp[:, 3, 1] = step_start[:, 4]  # a repeated start: the first of the equal ones
    comp[:, 4, 2] = np.inf
    got = landing_step(step_start, comp)
    assert got.shape == comp.shape and got.dtype == np.int64
    for i, t, b in np.ndindex(*comp.shape):
        assert got[i, t, b] == landing_oracle(step_start[i], comp[i, t, b], t), (i, t, b)
    # both the "not before step t + 1" floor and the "after the run" answer occur
    floor_active = sum(
        any(step_start[i, s] >= comp[i, t, b] for s in range(t + 1)) for i, t, b in np.ndindex(*comp.shape)
    )
    assert floor_active > 0 and (got == steps).any()


def classify_oracle(land, t, max_delay, n_steps):
    """Narrative rule: a result of step t may be used up to step t + D; if step
    t + D + 1 begins (within the run) without it having been usable, it is dropped."""
    if land < 0:
        return DROPPED, -1
    deadline = math.inf if max_delay is None else t + max_delay
    if land <= min(deadline, n_steps - 1):
        return INJECTED, land - t
    if deadline + 1 <= n_steps - 1:
        return DROPPED, -1
    return PENDING, -1


@pytest.mark.parametrize("max_delay", [None, 0, 1, 3])
def test_classify_matches_if_else_oracle(max_delay):
    rng = np.random.default_rng(17 if max_delay is None else max_delay)
    lanes, steps, batch = 5, 12, 4
    t = np.arange(steps)[None, :, None]
    land = t + rng.integers(0, 8, (lanes, steps, batch))
    land = np.where(rng.random(land.shape) < 0.15, -1, land)
    delay, status = classify(land, max_delay, steps)
    assert delay.shape == status.shape == land.shape
    branches = set()
    for i, tt, b in np.ndindex(*land.shape):
        s, d = classify_oracle(int(land[i, tt, b]), tt, max_delay, steps)
        assert (status[i, tt, b], delay[i, tt, b]) == (s, d), (i, tt, b, land[i, tt, b])
        lost = land[i, tt, b] < 0
        branches.add("lost" if lost else {INJECTED: "injected", DROPPED: "aged", PENDING: "pending"}[s])
    expect = {"lost", "injected", "pending"} | (set() if max_delay is None else {"aged"})
    assert branches == expect


# ----------------------------------------------------------------------------
# 5. Conservation and status/delay consistency on the random configurations.


@pytest.mark.parametrize("blocking,timeout", MODES)
@pytest.mark.parametrize("seed", range(N_RANDOM))
def test_conservation_and_consistency(cases, seed, blocking, timeout):
    pcfg, draws, s, _ = cases[(seed, blocking, timeout)]
    n, steps, batch = TRIALS, pcfg.steps, pcfg.batch_size
    assert s.delay.shape == s.status.shape == (n, steps, batch, len(pcfg.channels))
    assert s.step_start.shape == (n, steps + 1)
    assert np.all(np.diff(s.step_start, axis=1) > 0)
    counts = s.counts()
    assert list(counts) == list(pcfg.channels)
    for k, name in enumerate(pcfg.channels):
        c = counts[name]
        st = s.status[..., k]
        assert c["emitted"] == n * steps * batch
        assert c["injected"] + c["dropped"] + c["pending"] == c["emitted"]
        assert c["injected"] == int((st == 0).sum()) and c["dropped"] == int((st == 1).sum())
        d = s.delay[..., k]
        assert set(np.unique(st)) <= {INJECTED, DROPPED, PENDING}
        assert np.array_equal(d >= 0, st == INJECTED)
        assert np.all(d[st != INJECTED] == -1)
        kernel = name in draws.kernel_channels
        if kernel:
            lost = draws.service[name] < 0
            assert np.all(st[lost] == DROPPED)
            assert np.all(np.isinf(s.completion[..., k][lost]))
        if blocking:
            assert np.all(d[st == INJECTED] == 0)
            assert not (st == PENDING).any()
            continue
        md = pcfg.channels[name].max_delay
        if md is not None:
            assert np.all(d <= md)
        t = np.arange(steps)[None, :, None]
        assert np.all(t + d < steps)
        if kernel:
            # lands at t + drawn delay: injected delay equals the kernel draw
            assert np.array_equal(d[st == INJECTED], draws.service[name][st == INJECTED])
            continue
        # Clock channels: never delay 0 (durations are positive), and the landing
        # step is the first step that begins at or after completion.
        assert np.all(d[st == INJECTED] >= 1)
        comp = s.completion[..., k]
        idx = np.where(st == INJECTED, t + d, 0)
        at = np.take_along_axis(s.step_start[:, :, None], idx.reshape(n, -1, 1), axis=1).reshape(idx.shape)
        before = np.take_along_axis(s.step_start[:, :, None], np.maximum(idx - 1, 0).reshape(n, -1, 1),
                                    axis=1).reshape(idx.shape)
        inj = st == INJECTED
        assert np.all(at[inj] >= comp[inj]) and np.all(before[inj] < comp[inj])
        # pending: not landed within the run; dropped: too old while the run went on
        last = s.step_start[:, steps - 1][:, None, None]
        assert np.all(comp[st == PENDING] > np.broadcast_to(last, comp.shape)[st == PENDING])
        if md is None:
            assert not (st == DROPPED).any()


@pytest.mark.parametrize("seed", range(N_RANDOM))
def test_blocking_injects_exactly_what_is_back_by_the_wait_end(cases, seed):
    pcfg, draws, s, _ = cases[(seed, True, 2.0)]
    upd = draws.phase[3]
    wait_end = s.step_start[:, 1:] - upd  # when the optimizer stopped waiting
    submit = s.submit_time[..., 0, 0]
    finite = np.where(np.isinf(s.completion), -np.inf, s.completion)
    expect_end = np.minimum(np.maximum(submit, finite.max(axis=(2, 3))), submit + 2.0)
    np.testing.assert_allclose(wait_end, expect_end, rtol=1e-12, atol=1e-9)
    inj = s.completion <= expect_end[:, :, None, None]
    assert np.array_equal(s.status == INJECTED, inj)


# ----------------------------------------------------------------------------
# 6. Blocking wall-clock.


@pytest.mark.parametrize("timeout", [None, 2.0, 0.7])
def test_blocking_wallclock_formula_infinite_workers(timeout):
    phases = dict(generate=det(1.0), fast_score=det(0.25), submit=det(0.125), update=det(0.5))
    pcfg = PipelineConf(
        steps=20, batch_size=3, **phases,
        channels={
            "x": ChannelConf(latency=LatencyConf(kind="exponential", mean=1.0)),
            "y": ChannelConf(latency=LatencyConf(kind="lognormal", mean=0.8, sigma=1.0), max_delay=1),
            "k": ChannelConf(kernel=[0.1, 0.1]),  # 80% never returns; 1 step = 1.875 s
        },
    )
    draws = draw(pcfg, 6, np.random.default_rng(31))
    nominal = 1.0 + 0.25 + 0.125 + 0.5
    assert draws.nominal_step == nominal
    svc = np.stack([draws.service["x"], draws.service["y"],
                    np.where(draws.service["k"] < 0, 0.0, draws.service["k"] * nominal)], axis=-1)
    wait = svc.max(axis=(2, 3))
    if timeout is not None:
        wait = np.minimum(wait, timeout)
    expect_step = 1.0 + 0.25 + 0.125 + wait + 0.5
    for run in (run_lanes, run_simpy):
        b = run(draws, True, timeout)
        nb = run(draws, False, timeout)
        np.testing.assert_allclose(np.diff(b.step_start, axis=1), expect_step, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(b.wallclock, expect_step.sum(axis=1), rtol=1e-12)
        np.testing.assert_allclose(nb.wallclock, 20 * nominal, rtol=1e-12)
        assert np.all(b.wallclock > nb.wallclock)


@pytest.mark.parametrize("seed", range(N_RANDOM))
def test_wait_for_slow_never_faster(cases, seed):
    _, draws, nb, _ = cases[(seed, False, None)]
    for timeout in (None, 2.0):
        b = cases[(seed, True, timeout)][2]
        assert np.all(b.wallclock >= nb.wallclock)
        assert np.all(np.diff(b.step_start, axis=1) >= np.diff(nb.step_start, axis=1) - 1e-12)
    assert np.all(cases[(seed, True, None)][2].wallclock >= cases[(seed, True, 2.0)][2].wallclock)


# ----------------------------------------------------------------------------
# 7. Worked example by hand.


def worked_pcfg(max_delay=None, workers=None):
    return PipelineConf(
        steps=10, batch_size=2, generate=det(1.0), fast_score=det(0.0), submit=det(0.0), update=det(0.0),
        channels={"v": ChannelConf(latency=det(2.5), workers=workers, max_delay=max_delay)},
    )


@pytest.mark.parametrize("engine", ["lanes", "simpy"])
@pytest.mark.parametrize(
    "max_delay,injected,dropped,pending",  # per trial: 10 steps x 2 samples = 20 results
    [
        (None, 12, 0, 8),  # t = 0..5 land at t + 4 <= 9; t = 6..9 land at 10..13 (after the run)
        (5, 12, 0, 8),
        (4, 12, 0, 8),
        (3, 0, 12, 8),  # age 4 > 3: dropped at step t + 4 when that step exists (t <= 5)
        (0, 0, 18, 2),  # dropped at step t + 1 when it exists (t <= 8); t = 9 is pending
    ],
)
def test_worked_example_nonblocking(engine, max_delay, injected, dropped, pending):
    pcfg = worked_pcfg(max_delay)
    s = simulate(pcfg, 2, np.random.default_rng(0), engine=engine)
    assert s.step_start.tolist() == [[float(x) for x in range(11)]] * 2
    t = np.arange(10)[:, None]
    assert np.array_equal(s.submit_time[0, :, :, 0], np.broadcast_to(t + 1.0, (10, 2)))
    assert np.array_equal(s.completion[0, :, :, 0], np.broadcast_to(t + 3.5, (10, 2)))
    assert s.counts() == {"v": {"emitted": 40, "injected": 2 * injected, "dropped": 2 * dropped,
                                "pending": 2 * pending, "unrouted": 0}}
    d = s.delay[0, :, :, 0]
    st = s.status[0, :, :, 0]
    if injected:
        assert np.all(d[:6] == 4) and np.all(st[:6] == INJECTED)
    elif max_delay == 3:
        assert np.all(st[:6] == DROPPED)
    first_pending = 10 - pending // 2  # pending per trial = 2 samples x last steps
    assert np.all(st[first_pending:] == PENDING) and np.all(st[:first_pending] != PENDING)
    assert np.all(d[st != INJECTED] == -1)
    assert np.all(s.wallclock == 10.0)


@pytest.mark.parametrize("engine", ["lanes", "simpy"])
def test_worked_example_blocking(engine):
    run = ENGINES[engine]
    draws = draw(worked_pcfg(), 1, np.random.default_rng(0))
    s = run(draws, True)  # each step: 1 s generate + 2.5 s wait
    np.testing.assert_array_equal(s.step_start[0], 3.5 * np.arange(11))
    assert np.all(s.delay == 0) and np.all(s.status == INJECTED)
    s = run(draws, True, 2.0)  # gives up after 2 s: every result dropped
    np.testing.assert_array_equal(s.step_start[0], 3.0 * np.arange(11))
    assert np.all(s.status == DROPPED) and np.all(s.delay == -1)
    # One worker: the two samples are served one after the other, 5 s of waiting.
    draws = draw(worked_pcfg(workers=1), 1, np.random.default_rng(0))
    s = run(draws, True)
    np.testing.assert_array_equal(s.step_start[0], 6.0 * np.arange(11))
    np.testing.assert_array_equal(s.service_start[0, :, :, 0], 6.0 * np.arange(10)[:, None] + [1.0, 3.5])
    # ... with a 3 s timeout the optimizer moves on at S_t + 4, but the late job keeps
    # its worker: the worker is busy from t = 1 on (5 s of work arrives every 4 s), so
    # job n = 2t + b runs over [1 + 2.5 n, 1 + 2.5 (n + 1)] and only job 0 (done at
    # 3.5 <= 4) beats its step's deadline 4t + 4; (1, 0) ends at 8.5 > 8, and so on.
    s = run(draws, True, 3.0)
    np.testing.assert_array_equal(s.step_start[0], 4.0 * np.arange(11))
    n = np.arange(20).reshape(10, 2)
    np.testing.assert_array_equal(s.service_start[0, :, :, 0], 1.0 + 2.5 * n)
    np.testing.assert_array_equal(s.completion[0, :, :, 0], 1.0 + 2.5 * (n + 1))
    expect = np.full((10, 2), DROPPED)
    expect[0, 0] = INJECTED
    np.testing.assert_array_equal(s.status[0, :, :, 0], expect)
    assert s.delay[0, 0, 0, 0] == 0


@pytest.mark.parametrize("engine", ["lanes", "simpy"])
def test_worked_example_one_worker_nonblocking(engine):
    """One worker, 2 arrivals per second, 2.5 s each: the server is busy from t = 1
    on, so job n = 2t + b completes at 1 + 2.5 (n + 1) and lands at ceil of that."""
    s = simulate(worked_pcfg(workers=1), 1, np.random.default_rng(0), engine=engine)
    n = np.arange(20).reshape(10, 2)
    comp = 1.0 + 2.5 * (n + 1)
    np.testing.assert_array_equal(s.completion[0, :, :, 0], comp)
    np.testing.assert_array_equal(s.service_start[0, :, :, 0], comp - 2.5)
    land = np.ceil(comp).astype(int)
    t = np.arange(10)[:, None]
    expect_status = np.where(land <= 9, INJECTED, PENDING)
    np.testing.assert_array_equal(s.status[0, :, :, 0], expect_status)
    np.testing.assert_array_equal(s.delay[0, :, :, 0], np.where(land <= 9, land - t, -1))
    # by hand: (0,0) -> 3.5 lands at 4; (0,1) -> 6 lands at 6; (1,0) -> 8.5 lands at 9
    assert s.delay[0, 0, :, 0].tolist() == [4, 6] and s.delay[0, 1, :, 0].tolist() == [8, -1]
    assert s.counts()["v"] == {"emitted": 20, "injected": 3, "dropped": 0, "pending": 17, "unrouted": 0}


# ----------------------------------------------------------------------------
# Kernel channels.


def test_kernel_delays_follow_the_kernel():
    kernel = [0.1, 0.4, 0.0, 0.3]  # 0.2 never returns
    pcfg = PipelineConf(steps=50, batch_size=8, **det_phases(6.0, 1.0, 0.1, 2.0), channels={"k": ChannelConf(kernel=kernel)})
    draws = draw(pcfg, 100, np.random.default_rng(9))
    k = draws.service["k"]
    assert k.dtype == np.int64 and k.shape == (100, 50, 8)
    n = k.size
    for value, p in [(-1, 0.2), (0, 0.1), (1, 0.4), (2, 0.0), (3, 0.3)]:
        freq = np.count_nonzero(k == value) / n
        assert abs(freq - p) <= 5 * math.sqrt(p * (1 - p) / n) + 1e-12, (value, freq, p)
    assert set(np.unique(k)) == {-1, 0, 1, 3}
    s = run_lanes(draws, False)
    t = np.arange(50)[None, :, None]
    land = t + k
    st = s.status[..., 0]
    assert np.array_equal(st == INJECTED, (k >= 0) & (land <= 49))
    assert np.array_equal(st == DROPPED, k < 0)
    assert (s.delay[..., 0] == 0).any()  # kernel channels can deliver in the same step


# ----------------------------------------------------------------------------
# 8. Reproducibility.


def test_same_seed_same_draws_and_schedules():
    pcfg = random_pcfg(4)
    d1 = draw(pcfg, 3, np.random.default_rng(2024))
    d2 = draw(pcfg, 3, np.random.default_rng(2024))
    d3 = draw(pcfg, 3, np.random.default_rng(2025))
    assert np.array_equal(d1.phase, d2.phase) and not np.array_equal(d1.phase, d3.phase)
    for name in pcfg.channels:
        assert np.array_equal(d1.service[name], d2.service[name])
        assert not np.array_equal(d1.service[name], d3.service[name])
    for engine in ("lanes", "simpy"):
        for blocking in (False, True):
            s1 = simulate(pcfg, 3, np.random.default_rng(2024), engine=engine, blocking=blocking)
            s2 = simulate(pcfg, 3, np.random.default_rng(2024), engine=engine, blocking=blocking)
            s3 = simulate(pcfg, 3, np.random.default_rng(2025), engine=engine, blocking=blocking)
            assert_same_schedule(s1, s2, engine)
            assert_same_schedule(s1, ENGINES[engine](d1, blocking), engine)
            assert not np.array_equal(s1.step_start, s3.step_start)
            assert not np.array_equal(s1.completion, s3.completion)
    # the default engine comes from the config
    s = simulate(replace(pcfg, engine="simpy"), 3, np.random.default_rng(2024))
    assert_same_schedule(s, run_simpy(d1, False))


# ----------------------------------------------------------------------------
# Degenerate zero-duration steps.


@pytest.mark.parametrize("engine", ["lanes", "simpy"])
def test_zero_duration_steps_never_give_negative_delays(engine):
    """Regression: a result of step t must never land before step t + 1."""
    z = det(0.0)
    pcfg = PipelineConf(steps=4, batch_size=1, generate=z, fast_score=z, submit=z, update=z,
                        channels={"a": ChannelConf(latency=z)})
    s = simulate(pcfg, 1, np.random.default_rng(0), engine=engine)
    inj = s.status == INJECTED
    # every result is back the instant it is submitted, yet usable only from the next step on:
    # steps 0..2 land one step late, the last step's result is still pending when the run ends
    assert inj.sum() == 3 and np.all(s.delay[inj] == 1), s.delay.ravel().tolist()
    assert s.status[0, -1, 0, 0] == PENDING
