"""Server failures of gpu_rm channels (racsim/pipeline/faults.py): the timeline against the
two-state availability law, a FIFO pool with failures against a per-request loop oracle
written here (retry and lose), conservation, and the two engines bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import assert_same_schedule, det, gpu, rm_model

from racsim.config.defaults import compose_config
from racsim.config.spec import scenario
from racsim.config.schema import ChannelConf, FaultsConf, LatencyConf, PipelineConf, RMConf
from racsim.config.validate import validate
from racsim.errors import ConfigError
from racsim.pipeline.batcher import GpuSpec
from racsim.pipeline.draws import PipelineDraws, draw
from racsim.pipeline.faults import FaultSpec, Timeline, fault_spec
from racsim.pipeline.lanes import run_lanes
from racsim.pipeline.schedule import DROPPED, INJECTED, PENDING, UNROUTED
from racsim.pipeline.simpy_engine import run_simpy
from racsim.pipeline.stats import channel_stats


def test_long_run_fraction_up_is_mtbf_over_mtbf_plus_mttr():
    """Fraction of server-time up over a long horizon, from the simulated timeline, against
    MTBF / (MTBF + MTTR). The process starts stationary, so the expectation is exact at any
    horizon; the tolerance is 5 standard errors of a two-state Markov chain's time average:
    Var = 2 a^2 b^2 / ((a + b)^3 H) per server (a = MTBF, b = MTTR), over N independent servers."""
    a, b, H, lanes, servers = 40.0, 10.0, 4000.0, 100, 3
    tl = Timeline(7, lanes, servers, FaultSpec(mtbf=a, mttr=b, retries=0))
    frac = tl.up_fraction(np.zeros(lanes), np.full(lanes, H))
    assert abs(frac.mean() - a / (a + b)) < 5 * availability_se(a, b, H, lanes * servers)
    # the same figure by a plain loop over one lane's outages
    down = 0.0
    for r in range(servers):
        for d, u in zip(tl.down[r][3], tl.up[r][3]):
            down += max(0.0, min(u, H) - max(d, 0.0))
    assert frac[3] == pytest.approx(1 - down / (servers * H), rel=1e-12)
    # up and down times are exponential with the configured means (within 5 standard errors)
    ups = np.concatenate([(tl.down[r][:, 1:] - tl.up[r][:, :-1]).ravel() for r in range(servers)])
    downs = np.concatenate([(tl.up[r] - tl.down[r]).ravel() for r in range(servers)])
    assert abs(ups.mean() - a) < 5 * a / math.sqrt(ups.size)
    assert abs(downs.mean() - b) < 5 * b / math.sqrt(downs.size)
    # the stationary start: down at time 0 with probability b / (a + b)
    at0 = np.array([[tl.down[r][i, 0] == 0 for r in range(servers)] for i in range(lanes)])
    p = b / (a + b)
    assert abs(at0.mean() - p) < 5 * math.sqrt(p * (1 - p) / at0.size)


def availability_se(a: float, b: float, H: float, n: int) -> float:
    """Standard error of the mean fraction of time up of n independent stationary two-state
    chains over H seconds (MTBF a, MTTR b): Var = 2 a^2 b^2 / ((a + b)^3 H) per chain."""
    return math.sqrt(2 * a**2 * b**2 / ((a + b) ** 3 * H) / n)


def test_a_replica_of_tp_gpus_fails_tp_times_as_often():
    f = FaultsConf(mtbf_s=1000.0, mttr_s=60.0, on_failure="lose", max_retries=5)
    assert fault_spec(f, tp=4) == FaultSpec(mtbf=250.0, mttr=60.0, retries=0)
    f.on_failure = "retry"
    assert fault_spec(f, tp=2).retries == 5


def test_timeline_does_not_depend_on_the_order_it_is_read_in():
    spec = FaultSpec(mtbf=5.0, mttr=1.0, retries=1)
    x, y = Timeline(3, 4, 2, spec), Timeline(3, 4, 2, spec)
    x.outage(2, 1, 900.0)  # grows server 1 far first
    for t in (0.0, 3.3, 50.0, 700.0):
        for lane in range(4):
            for r in range(2):
                assert y.outage(lane, r, t) == x.outage(lane, r, t)


# ----------------------------------------------------------------------------
# A FIFO pool with failures: batch size 1, no waiting to fill, so each request is served
# alone on the lowest-indexed replica that is idle and up when it reaches the head.


class LinearService:
    def __init__(self, rate: float):
        self.rate = rate

    def seconds(self, n, ts, sq, mx):
        return ts / self.rate


def oracle(arrival, service, down, up, retries):
    """One lane, requests in FIFO order: (start, end, lost) by a plain loop. ``down[r]``/``up[r]``:
    replica r's outages [down, up) in time order."""
    c = len(down)

    def first_up(r, t):
        for d, u in zip(down[r], up[r]):
            if d <= t < u:
                return u
        return t

    free = [0.0] * c
    out = []
    for a, s in zip(arrival, service):
        avail = [first_up(r, max(a, free[r])) for r in range(c)]
        r = min(range(c), key=lambda k: (avail[k], k))
        t, tries, start = avail[r], 0, avail[r]
        while True:
            nxt = next((d, u) for d, u in zip(down[r], up[r]) if u > t)
            if t + s <= nxt[0]:
                end, lost = t + s, False
                break
            if tries == retries:
                end, lost = nxt[0], True
                break
            t, tries = nxt[1], tries + 1
        free[r] = end
        out.append((start, end, lost))
    return out


@pytest.mark.parametrize("retries", [0, 1, 3])
def test_fifo_pool_with_failures_matches_a_per_request_oracle(retries):
    lanes, steps, batch, c = 6, 60, 3, 3
    rng = np.random.default_rng(40 + retries)
    tokens = np.maximum(np.rint(rng.exponential(2000.0, (lanes, steps, batch, 1))), 1.0)  # 2 s on average
    gen = rng.exponential(2.5, (lanes, steps))
    zero = np.zeros((lanes, steps))
    tl = Timeline(11 + retries, lanes, c, FaultSpec(mtbf=15.0, mttr=4.0, retries=retries))
    draws = PipelineDraws(
        phase=np.stack([gen, zero, zero, zero]), service={"g": tokens}, kernel_channels=frozenset(),
        nominal_step=2.5, workers={"g": None}, max_delay={"g": None},
        gpu={"g": GpuSpec(replicas=c, max_batch=1, budget=1e12, max_wait=0.0, order="fifo", padded=False,
                          model=LinearService(1000.0), seqs=1)},
        faults={"g": tl},
    )
    lanes_s, simpy_s = run_lanes(draws, False), run_simpy(draws, False)
    assert_same_schedule(lanes_s, simpy_s, "pool with failures")
    assert np.array_equal(lanes_s.failed, simpy_s.failed)
    seen_lost = seen_retry = 0
    for i in range(lanes):
        arrival = np.repeat(np.cumsum(gen[i]), batch)  # each step's submit time, batch requests at once
        service = (tokens[i, :, :, 0] / 1000.0).ravel()
        horizon = float(arrival[-1] + service.sum() + 1000.0)
        for r in range(c):
            tl.cover(r, horizon)
        got = oracle(arrival, service, [tl.down[r][i] for r in range(c)], [tl.up[r][i] for r in range(c)], retries)
        start, end, lost = (np.array(v).reshape(steps, batch) for v in zip(*got))
        assert np.array_equal(lanes_s.service_start[i, :, :, 0], start)
        assert np.array_equal(lanes_s.completion[i, :, :, 0], np.where(lost, np.inf, end))
        assert np.array_equal(lanes_s.failed[i, :, :, 0], lost)
        seen_lost += int(lost.sum())
        seen_retry += int(np.sum(~lost & (end - start > service.reshape(steps, batch) + 1e-9)))
    assert seen_lost > 0  # the lose branch is reached in every case (MTBF 15 s, 2 s jobs)
    assert (seen_retry > 0) == (retries > 0)  # a restarted request took longer than its service


# ----------------------------------------------------------------------------
# Random configurations: engines agree, results are conserved.


def random_pcfg(seed: int) -> PipelineConf:
    rng = np.random.default_rng(9000 + seed)

    def rm(order):
        return RMConf(model=rm_model("8B"), gpu=gpu("H100", name="slow", peak_tflops=float(rng.uniform(40, 150))),
                      mfu=0.4, gpus=int(rng.integers(1, 4)) * 2, tp=int(rng.choice([1, 2])), max_batch=int(rng.integers(1, 6)),
                      token_budget=4000, max_wait_s=float(rng.choice([0.0, 0.3])), order=order,
                      sequences_per_sample=int(rng.integers(1, 3)),
                      prompt_tokens=LatencyConf(kind="lognormal", mean=150.0, sigma=0.6, low=1.0),
                      response_tokens=LatencyConf(kind="exponential", mean=300.0))

    faults = FaultsConf(mtbf_s=float(rng.uniform(3, 30)), mttr_s=float(rng.uniform(0.5, 5)),
                        on_failure=["retry", "lose"][seed % 2], max_retries=int(rng.integers(0, 3)))
    chans = {"g": ChannelConf(kind="gpu_rm", rm=rm("fifo" if seed % 3 else "shortest"), faults=faults,
                              max_delay=[None, 2][seed % 2])}
    if seed % 2:
        chans["q"] = ChannelConf(latency=LatencyConf(kind="exponential", mean=1.0), workers=2, max_delay=3)
    return PipelineConf(steps=int(rng.integers(10, 18)), batch_size=int(rng.integers(1, 4)),
                        generate=LatencyConf(kind="lognormal", mean=1.0, sigma=0.5),
                        fast_score=det(0.1), submit=det(0.05), update=det(0.3), channels=chans)


def assert_engines_agree_and_failures_accounted(pcfg: PipelineConf, name: str, seed: int) -> None:
    """Both engines bit for bit, async and blocking (with and without a timeout), on channel
    ``name`` with failures; every routed result injected, dropped or pending; a result lost to
    a failure is dropped, never injected, and counted in channels.csv's ``lost_to_failure``."""
    draws = draw(pcfg, 3, np.random.default_rng(seed))
    k = list(pcfg.channels).index(name)
    for blocking, timeout in [(False, None), (True, None), (True, 0.8)]:
        a, b = run_lanes(draws, blocking, timeout), run_simpy(draws, blocking, timeout)
        assert_same_schedule(a, b, f"seed {seed} blocking {blocking} timeout {timeout}")
        assert np.array_equal(a.failed, b.failed)
        st = a.status[..., k]
        assert np.all(np.isin(st, (INJECTED, DROPPED, PENDING, UNROUTED)))
        assert np.all(st[a.failed[..., k]] == DROPPED)  # a result lost to a failure is dropped, never injected
        assert np.all(np.isinf(a.completion[..., k][a.failed[..., k]]))
        c = a.counts()[name]
        assert c["injected"] + c["dropped"] + c["pending"] == c["emitted"] == np.count_nonzero(st != UNROUTED)
        row = channel_stats(a, draws.workers, 0).set_index("channel").loc[name]
        assert row.lost_to_failure == int(a.failed[..., k].sum()) <= row.dropped
        assert 0 < row.availability <= 1
        assert 0 <= row.utilisation <= 1  # a request lost to a failure counts no busy seconds past its loss


@pytest.mark.parametrize("seed", range(6))
def test_engines_agree_and_nothing_is_lost_with_failures(seed):
    pcfg = random_pcfg(seed)
    assert_engines_agree_and_failures_accounted(pcfg, "g", seed)


def test_random_failure_configs_reach_every_branch():
    """Lose loses results; retry with a generous cap loses none on the same timeline."""
    for seed in (1, 3):
        pcfg = random_pcfg(seed)
        assert pcfg.channels["g"].faults.on_failure == "lose"
        assert run_lanes(draw(pcfg, 3, np.random.default_rng(seed)), False).failed.sum() > 0
        pcfg.channels["g"].faults.on_failure, pcfg.channels["g"].faults.max_retries = "retry", 1000
        assert run_lanes(draw(pcfg, 3, np.random.default_rng(seed)), False).failed.sum() == 0


def test_faults_keep_the_draws_of_every_other_random_number():
    """The fault seed is drawn last: a run with faults draws what it drew before faults existed."""
    pcfg = random_pcfg(0)
    on = draw(pcfg, 2, np.random.default_rng(1))
    pcfg.channels["g"].faults = FaultsConf()
    off = draw(pcfg, 2, np.random.default_rng(1))
    assert not off.faults and set(on.faults) == {"g"}
    assert np.array_equal(on.phase, off.phase) and np.array_equal(on.service["g"], off.service["g"])


@pytest.mark.parametrize("override,key", [
    ("pipeline.channels.judge.faults.mtbf_s=-5", "pipeline.channels.judge.faults.mtbf_s"),
    ("pipeline.channels.judge.faults.on_failure=sometimes", "pipeline.channels.judge.faults.on_failure"),
    ("pipeline.channels.judge.faults.max_retries=-1", "pipeline.channels.judge.faults.max_retries"),
    ("pipeline.channels.judge.faults.mttr_s=null", "pipeline.channels.judge.faults.mttr_s"),
])
def test_bad_fault_configs_name_the_key(override, key):
    cfg = compose_config("scenario=capacity/judge_rm_faults", override)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(cfg)


@pytest.mark.parametrize("override,why", [
    ("pipeline.channels.judge.workers=null", "workers set"),  # a queue with no limit has no worker to fail
    ("pipeline.channels.judge.kernel=[0.5,0.5]", "not a kernel"),
    ("pipeline.channels.judge.cancel_on_drop=true", "cancel_on_drop"),
])
def test_faults_need_a_gpu_rm_channel_or_queue_workers(override, why):
    on = ("pipeline.channels.judge.faults.mtbf_s=100", "pipeline.channels.judge.faults.mttr_s=10")
    validate(compose_config(*on))  # the default judge: a queue channel of 16 workers
    with pytest.raises(ConfigError, match=r"pipeline\.channels\.judge\.faults\.mtbf_s.*" + why):
        validate(compose_config(*on, override))


def test_capacity_search_runs_every_count_with_the_faults_on():
    from racsim.analyses.capacity import count_key, with_count

    cfg = scenario(compose_config("scenario=capacity/judge_rm_faults", "pipeline.steps=2", "pipeline.warmup_steps=0"))
    key = count_key(cfg, "judge")
    for n in (2, 6):
        d = draw(with_count(cfg, key, n).pipeline, 1, np.random.default_rng(0))
        assert d.faults["judge"].servers == n and d.faults["judge"].spec == FaultSpec(1800.0, 300.0, 3, resend=True)



# ----------------------------------------------------------------------------
# Queue channels whose workers fail (racsim/pipeline/workers.py).


def event_loop_oracle(arrival, service, down, up, retries, sent=None):
    """One lane's FIFO queue on workers that fail, as a plain event loop: (start, end, lost) per
    job. Events at one instant apply first (completions, then failures and repairs, then
    arrivals); then, while jobs wait and a worker is up and idle, the head takes the worker
    idle the longest (lowest index on ties). A failure interrupts the job in service: it
    restarts at the repair (at most ``retries`` times) or is lost then, its worker idle."""
    import heapq

    c, n = len(down), len(arrival)
    sent = [True] * n if sent is None else sent
    ev = []  # (time, order, kind, payload): order 0 completion, 1 failure, 1 repair, 2 arrival
    for w in range(c):
        for d, u in zip(down[w], up[w]):
            heapq.heappush(ev, (d, 1, "fail", w))
            heapq.heappush(ev, (u, 1, "repair", w))
    for j in range(n):
        heapq.heappush(ev, (arrival[j], 2, "arrive", j))
    is_up, job_on, idle_since, tries = [True] * c, [None] * c, [0.0] * c, [0] * n
    version = [0] * c  # invalidates a completion cut by a failure
    start, end, lost = [np.nan] * n, [np.nan] * n, [False] * n
    queue, left = [], n
    while ev and left:
        tau = ev[0][0]
        while ev and ev[0][0] == tau:
            _, _, kind, x = heapq.heappop(ev)
            if kind == "arrive":
                if sent[x]:
                    queue.append(x)
                else:
                    start[x] = end[x] = arrival[x]
                    left -= 1
            elif kind == "done":
                w, v = x
                if v == version[w]:
                    j = job_on[w]
                    end[j], job_on[w], idle_since[w] = tau, None, tau
                    left -= 1
            elif kind == "fail":
                is_up[x] = False
                j = job_on[x]
                if j is not None:
                    version[x] += 1
                    if tries[j] == retries:
                        end[j], lost[j], job_on[x], idle_since[x] = tau, True, None, tau
                        left -= 1
                    else:
                        tries[j] += 1
            else:  # repair: an interrupted job starts again from scratch
                is_up[x] = True
                j = job_on[x]
                if j is not None:
                    heapq.heappush(ev, (tau + service[j], 0, "done", (x, version[x])))
        while queue:
            free = [w for w in range(c) if is_up[w] and job_on[w] is None]
            if not free:
                break
            w = min(free, key=lambda k: (idle_since[k], k))
            j = queue.pop(0)
            start[j], job_on[w] = tau, j
            heapq.heappush(ev, (tau + service[j], 0, "done", (w, version[w])))
    return np.array(start), np.array(end), np.array(lost)


def queue_draws(rng, lanes, steps, batch, c, faults: FaultsConf, route=None, offset=None):
    """Draws of one queue channel "q" of c workers that fail: exponential service (mean 2 s),
    steps every Exp(2.5) s (generate only), a fault timeline seeded from ``rng``."""
    gen = rng.exponential(2.5, (lanes, steps))
    zero = np.zeros((lanes, steps))
    service = rng.exponential(2.0, (lanes, steps, batch))
    routed = {} if route is None else {"q": rng.random((lanes, steps, batch)) < route}
    if route is not None:
        service = np.where(routed["q"], service, 0.0)
    tl = Timeline(int(rng.integers(2**62)), lanes, c, fault_spec(faults, 1))
    return PipelineDraws(phase=np.stack([gen, zero, zero, zero]), service={"q": service}, kernel_channels=frozenset(),
                         nominal_step=2.5, workers={"q": c}, max_delay={"q": None}, routed=routed, offset=offset,
                         faults={"q": tl})


@pytest.mark.parametrize("policy,cap", [("retry", 0), ("retry", 1), ("retry", 3), ("lose", 3)])
@pytest.mark.parametrize("route", [None, 0.6])
def test_queue_workers_with_failures_match_an_event_loop_oracle(policy, cap, route):
    lanes, steps, batch, c = 5, 50, 3, 3
    f = FaultsConf(mtbf_s=12.0, mttr_s=3.0, on_failure=policy, max_retries=cap)
    draws = queue_draws(np.random.default_rng([cap, route is None]), lanes, steps, batch, c, f, route)
    a, b = run_lanes(draws, False), run_simpy(draws, False)
    assert_same_schedule(a, b, f"{policy} {cap}")
    assert np.array_equal(a.failed, b.failed)
    tl, retries = draws.faults["q"], fault_spec(f).retries
    seen_lost = seen_retry = 0
    for i in range(lanes):
        arrival = np.repeat(np.cumsum(draws.phase[0][i]), batch)
        service = draws.service["q"][i].ravel()
        for w in range(c):
            tl.cover(w, float(arrival[-1] + service.sum() + 500.0))
        sent = draws.routed["q"][i].ravel() if route else None
        start, end, lost = event_loop_oracle(arrival, service, [tl.down[w][i] for w in range(c)],
                                             [tl.up[w][i] for w in range(c)], retries, sent)
        assert np.array_equal(a.service_start[i, :, :, 0].ravel(), start)
        assert np.array_equal(a.completion[i, :, :, 0].ravel(), np.where(lost, np.inf, end))
        assert np.array_equal(a.failed[i, :, :, 0].ravel(), lost)
        seen_lost += int(lost.sum())
        seen_retry += int(np.sum(~lost & (end - start > service + 1e-9)))
    assert seen_lost > 0  # MTBF 12 s against 2 s jobs: the cap is reached in every case
    assert (seen_retry > 0) == (retries > 0)  # a restarted job took longer than its service
    if route:
        assert np.all(~a.failed[..., 0][~draws.routed["q"]])  # an unsent job is never lost


def random_queue_pcfg(seed: int) -> PipelineConf:
    """A queue channel with workers that fail, with routing, bursts, arrivals over time, ties and
    a second (plain) queue channel drawn at random, so every combination is reached."""
    rng = np.random.default_rng(7000 + seed)
    faults = FaultsConf(mtbf_s=float(rng.uniform(3, 30)), mttr_s=float(rng.uniform(0.5, 5)),
                        on_failure=["retry", "lose"][seed % 2], max_retries=int(rng.integers(0, 3)))
    q = ChannelConf(latency=LatencyConf(kind="lognormal", mean=float(rng.uniform(0.5, 3)), sigma=0.8),
                    workers=int(rng.integers(1, 5)), max_delay=[None, 2][seed % 2], faults=faults,
                    route_prob=[1.0, 0.7][(seed // 2) % 2])
    if seed % 3 == 0:
        q.degraded_factor, q.p_degrade, q.p_recover = 3.0, 0.3, 0.5
    chans = {"q": q}
    if seed % 4 == 1:
        chans["p"] = ChannelConf(latency=LatencyConf(kind="exponential", mean=1.0), workers=2, max_delay=3)
    pcfg = PipelineConf(steps=int(rng.integers(10, 18)), batch_size=int(rng.integers(1, 5)),
                        generate=LatencyConf(kind="lognormal", mean=1.0, sigma=0.5),
                        fast_score=det(0.1), submit=det(0.05), update=det(0.3), channels=chans)
    pcfg.arrivals.mode = ["batch", "stream", "poisson"][seed % 3]
    if seed % 4 == 2:  # deterministic times: workers fall free at the same instants (the tie-break)
        q.latency, pcfg.generate = det(1.0), det(1.0)
    return pcfg


@pytest.mark.parametrize("seed", range(8))
def test_queue_faults_engines_agree_and_results_are_conserved(seed):
    pcfg = random_queue_pcfg(seed)
    assert_engines_agree_and_failures_accounted(pcfg, "q", seed)


def test_random_queue_fault_configs_reach_every_branch():
    """Across the random configs: results lost, retries that save them, each arrival mode,
    routing and bursts; a generous retry cap loses nothing on the same timeline."""
    lost = {}
    for seed in range(8):
        pcfg = random_queue_pcfg(seed)
        lost[seed] = int(run_lanes(draw(pcfg, 3, np.random.default_rng(seed)), False).failed.sum())
    assert all(lost[s] > 0 for s in (1, 3, 5, 7))  # lose
    pcfg = random_queue_pcfg(1)
    pcfg.channels["q"].faults.on_failure, pcfg.channels["q"].faults.max_retries = "retry", 1000
    assert run_lanes(draw(pcfg, 3, np.random.default_rng(1)), False).failed.sum() == 0


def test_queue_workers_long_run_capacity_up_is_mtbf_over_mtbf_plus_mttr():
    """channels.csv's availability of a queue channel: each worker is a 1-GPU server (MTBF not
    divided), so the long-run fraction of worker-seconds up is MTBF / (MTBF + MTTR)."""
    a, b, lanes, c = 30.0, 10.0, 40, 4
    pcfg = PipelineConf(steps=400, batch_size=2, generate=det(10.0), fast_score=det(0.0), submit=det(0.0),
                        update=det(0.0), channels={"q": ChannelConf(
                            latency=det(1.0), workers=c, faults=FaultsConf(mtbf_s=a, mttr_s=b))})
    draws = draw(pcfg, lanes, np.random.default_rng(0))
    assert draws.faults["q"].servers == c and draws.faults["q"].spec == FaultSpec(a, b, 3)
    sched = run_lanes(draws, False)
    row = channel_stats(sched, draws.workers, 0).set_index("channel").loc["q"]
    H = float(np.mean(sched.step_start[:, -1]))
    assert abs(row.availability - a / (a + b)) < 5 * availability_se(a, b, H, lanes * c)


def test_queue_faults_keep_every_other_draw():
    pcfg = random_queue_pcfg(2)
    on = draw(pcfg, 2, np.random.default_rng(1))
    pcfg.channels["q"].faults = FaultsConf()
    off = draw(pcfg, 2, np.random.default_rng(1))
    assert not off.faults and set(on.faults) == {"q"}
    assert np.array_equal(on.phase, off.phase) and np.array_equal(on.service["q"], off.service["q"])
    assert np.array_equal(on.offset, off.offset) and np.array_equal(on.routed["q"], off.routed["q"])



def fast_path_inputs(seed: int):
    """A pool's timeline and calls of jobs for :func:`workers.fifo_assign_faults`, drawn at random:
    random or scheduled (integer, tying) outages, retry caps 0/1/3 or lose, steady or spread
    arrivals, routing, zero-second jobs (with a call that arrives before the last one), times
    past the cursor's horizon."""
    rng = np.random.default_rng(900 + seed)
    lanes, c = int(rng.integers(1, 9)), int(rng.integers(1, 9))
    retries = [0, 1, 3][seed % 3]
    if seed % 4 == 3:  # known outages at whole seconds: ties between repairs, frees and arrivals
        sched = []
        for _ in range(c):  # gaps and repairs of 1..5 s, never touching (as read_schedule wants)
            gap, rep = rng.integers(1, 6, 30).astype(float), rng.integers(1, 4, 30).astype(float)
            up = np.cumsum(gap + rep)
            sched.append((up - rep, up))
        spec = FaultSpec(math.inf, 0.0, retries)
        make = lambda: Timeline(0, lanes, c, spec, sched)  # noqa: E731
    else:
        spec = FaultSpec(float(rng.uniform(0.3, 20)), float(rng.uniform(0.05, 5)), retries)
        make = lambda: Timeline(seed, lanes, c, spec)  # noqa: E731
    calls, t = [], np.zeros(lanes)
    for n in range(int(rng.integers(3, 12))):
        jobs = int(rng.integers(1, 3 * c + 3))
        if rng.random() < 0.5:  # one arrival per lane (a step's batch)
            arrival = np.repeat((t + rng.exponential(2.0, lanes))[:, None], jobs, axis=1)
        else:
            arrival = np.sort(t[:, None] + rng.exponential(2.0, (lanes, jobs)).cumsum(axis=1) / 2, axis=1)
        if seed % 4 == 3:
            arrival = np.floor(arrival)
        if n == 2 and seed % 5 == 0:
            arrival = arrival - 3.0  # before the last call's arrivals
        t = arrival[:, -1] + (40.0 if rng.random() < 0.1 else 0.0)
        service = rng.exponential(float(rng.uniform(0.3, 3)), (lanes, jobs))
        if seed % 4 == 3:
            service = np.ceil(service)
        if seed % 5 == 0:
            service[rng.random((lanes, jobs)) < 0.1] = 0.0
        sent = rng.random((lanes, jobs)) < 0.7 if seed % 2 else None
        calls.append((arrival, service, sent))
    return make, c, lanes, calls


def test_fast_path_and_its_fallbacks_match_the_rule(monkeypatch):
    """workers.fifo_assign_faults (one argmin per job; a cut or a repair taken read off the
    stacked outages; the rule's serve on a tie or a second cut; undone for by_rule past the
    cursor's horizon or for arrivals out of order) against by_rule, the rule job by job, on
    the same calls: start, end, lost, free, cursor and timeline bit for bit; and against the
    event-loop oracle. Random inputs reach every branch."""
    from racsim.pipeline import workers

    seen = {"run": 0, "kept": 0, "serve": 0, "at once": 0, "lost at once": 0, "by_rule": 0}
    rule = workers.by_rule

    def count(name, f, tally=lambda out, *a: 1):
        def counted(*a):
            out = f(*a)
            seen[name] += tally(out, *a)
            return out
        return counted

    monkeypatch.setattr(workers._Fast, "run", count("run", workers._Fast.run))
    monkeypatch.setattr(workers._Fast, "store", count("kept", workers._Fast.store))
    monkeypatch.setattr(workers._Fast, "_serve", count("serve", workers._Fast._serve))
    monkeypatch.setattr(workers._Fast, "_at_once", count("at once", workers._Fast._at_once, lambda out, *a: out))
    monkeypatch.setattr(workers._Fast, "_at_once", count("lost at once", workers._Fast._at_once,
                                                         lambda out, self, *a: out and not self.retries))
    monkeypatch.setattr(workers, "by_rule", count("by_rule", rule))
    for seed in range(40):
        make, c, lanes, calls = fast_path_inputs(seed)
        tl_a, tl_b = make(), make()
        cur_a, cur_b = workers.Cursor(tl_a), workers.Cursor(tl_b)
        free_a, free_b = np.zeros((lanes, c)), np.zeros((lanes, c))
        got = []
        for n, (arrival, service, sent) in enumerate(calls):
            if seed % 3 == 1 and n == len(calls) - 1 and math.isfinite(cur_a.horizon):  # ends past the horizon
                arrival[...] = arrival - arrival.min() + cur_a.horizon - 0.5
            a = workers.fifo_assign_faults(arrival, service, free_a, cur_a, sent)
            b = rule(arrival, service, free_b, cur_b, sent)
            for x, y in zip(a, b):
                assert np.array_equal(x, y), f"seed {seed}"
            got.append(a)
            assert np.array_equal(free_a, free_b) and np.array_equal(cur_a.now, cur_b.now)
            for x, y in ((cur_a.k, cur_b.k), (cur_a.down, cur_b.down), (cur_a.up, cur_b.up)):
                assert np.array_equal(x, y), f"seed {seed}: cursor"
        assert [u.shape for u in tl_a.up] == [u.shape for u in tl_b.up], f"seed {seed}: timeline grown alike"
        if seed % 5 and seed % 2 == 0 and seed % 3 != 1:  # arrivals in order, every job sent: one queue a lane
            for i in range(lanes):
                arrival = np.concatenate([x[0][i] for x in calls])
                service = np.concatenate([x[1][i] for x in calls])
                for w in range(c):
                    tl_a.cover(w, float(arrival[-1] + service.sum() + 100.0))
                want = event_loop_oracle(arrival, service, [tl_a.down[w][i] for w in range(c)],
                                         [tl_a.up[w][i] for w in range(c)], tl_a.spec.retries)
                for x, y in zip((np.concatenate([g[k][i] for g in got]) for k in range(3)), want):
                    assert np.array_equal(x, y), f"seed {seed} lane {i}: oracle"
    assert seen["by_rule"] > seen["run"] - seen["kept"] > 0  # by_rule past the horizon (undone), or out of order
    assert seen["serve"] and seen["at once"] and seen["lost at once"]  # the rule's serve; cuts and repairs read at once


V = "pipeline.channels.verifier"


@pytest.mark.parametrize("override,key", [
    (f"{V}.faults.mtbf_s=0", f"{V}.faults.mtbf_s"),
    (f"{V}.faults.mttr_s=-1", f"{V}.faults.mttr_s"),
    (f"{V}.faults.on_failure=never", f"{V}.faults.on_failure"),
    (f"{V}.faults.max_retries=-2", f"{V}.faults.max_retries"),
    (f"{V}.cancel_on_drop=true", f"{V}.faults.mtbf_s"),
])
def test_bad_queue_fault_configs_give_one_line_naming_the_key(override, key):
    cfg = compose_config("scenario=capacity/code_verifier", f"{V}.workers=32", f"{V}.faults.mtbf_s=600",
                         f"{V}.faults.mttr_s=60", override)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as e:
        validate(cfg)
    assert "\n" not in str(e.value)


def test_capacity_search_sizes_the_failing_workers():
    from racsim.analyses.capacity import count_key, with_count

    cfg = scenario(compose_config("scenario=capacity/code_verifier", f"{V}.faults.mtbf_s=600", f"{V}.faults.mttr_s=60",
                                  "pipeline.steps=2", "pipeline.warmup_steps=0"))
    key = count_key(cfg, "verifier")
    for n in (8, 48):
        d = draw(with_count(cfg, key, n).pipeline, 1, np.random.default_rng(0))
        assert d.faults["verifier"].servers == n and d.faults["verifier"].spec == FaultSpec(600.0, 60.0, 3)


def test_a_timeline_refuses_to_cover_an_infinite_instant():
    # no number of outages covers t = inf: an error, not a loop that never ends (a schedule's too)
    for tl in (Timeline(3, 2, 2, FaultSpec(mtbf=5.0, mttr=1.0, retries=0)),
               Timeline(3, 2, 1, FaultSpec(mtbf=5.0, mttr=1.0, retries=0), schedule=[(np.array([1.0]), np.array([2.0]))])):
        with pytest.raises(ValueError, match="finite"):
            tl.outage_lanes(np.array([0, 1]), np.array([0, 0]), np.array([1.0, math.inf]))
        d, u = tl.outage_lanes(np.array([0, 1]), np.array([0, 0]), np.array([1.5, 0.5]))
        assert np.all(u > [1.5, 0.5]) and np.all(d < u)  # finite lookups still answer: the outage ending after t
    assert (d.tolist(), u.tolist()) == ([1.0, 1.0], [2.0, 2.0])  # the schedule's one outage, in both lanes


@pytest.mark.parametrize("seed", range(6))
def test_vectorised_lookups_are_the_scalar_ones_in_any_order(seed):
    """Timeline.outage_lanes (its answers kept per pair between lookups, the walk otherwise) gives every (lane,
    server, t) the outage a fresh timeline's scalar lookup gives: times that grow, stay, jump back before the
    last answer's outage and far ahead (new outages generated), t on an up or a down instant exactly."""
    rng = np.random.default_rng(seed)
    lanes, servers = 3, 4
    spec = FaultSpec(mtbf=5.0, mttr=2.0, retries=0)
    tl, ref = Timeline(seed, lanes, servers, spec), Timeline(seed, lanes, servers, spec)
    t = np.zeros((lanes, servers))
    hits = 0
    for k in range(300):
        move = rng.choice(["grow", "stay", "back", "far"], p=[0.6, 0.15, 0.15, 0.1])
        if move == "grow":
            t = t + rng.exponential(0.7, t.shape)
        elif move == "back":
            t = np.maximum(t - rng.exponential(4.0, t.shape), 0.0)
        elif move == "far":
            t = t + rng.exponential(80.0, t.shape)
        if k % 7 == 3:  # exactly on an outage's ends, where the answer changes
            d0, u0 = tl.outage_lanes(np.arange(lanes)[:, None], np.arange(servers)[None, :], t)
            t = np.where(rng.random(t.shape) < 0.5, d0, u0)
        lanes_ix = np.arange(lanes)[:, None]
        before = tl._hit.copy()
        d, u = tl.outage_lanes(lanes_ix, np.arange(servers)[None, :], t)
        hits += int(np.array_equal(before, tl._hit))
        for i, r in np.ndindex(lanes, servers):
            assert (d[i, r], u[i, r]) == ref.outage(i, r, float(t[i, r])), (k, move, i, r)
    assert 0 < hits < 300  # both ways of answering were taken
