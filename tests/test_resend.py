"""A batch cut by its replica's failure re-sent to a healthy one (``faults.on_failure: resend``,
a gpu_rm channel's default): a pool on a known failure schedule against a slow event loop
oracle written here, the engines bit for bit on random configs (every result accounted for),
and ``useful`` <= ``busy`` on random scenarios with and without failures."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import assert_same_schedule
from test_fault_schedule import pool_draws, random_pcfg as scheduled_pcfg, random_schedule
from test_faults import assert_engines_agree_and_failures_accounted, random_pcfg

from racsim.config.defaults import compose_config
from racsim.config.schema import FaultsConf
from racsim.config.validate import validate
from racsim.errors import ConfigError
from racsim.pipeline.draws import draw
from racsim.pipeline.faults import FaultSpec, fault_spec
from racsim.pipeline.lanes import _GpuLanes, run_lanes
from racsim.pipeline.simpy_engine import run_simpy
from racsim.pipeline.stats import channel_stats, useful_share


def resend_oracle(arrival, service, down, up, retries):
    """One lane, one request a batch, FIFO, replicas failing on ``down[r]``/``up[r]`` (outages
    [down, up), time order, the last at inf): (first start, end, lost) per request by stepping
    from instant to instant. At each instant every completion, cut and arrival is applied, then
    idle replicas that are up take, lowest index first, the cut requests (by cut instant, then
    replica) before the queue's head. A request's attempt on r from s is cut at r's first
    failure after s if it would end past it; past ``retries`` re-sends it is lost there."""
    n, c = len(arrival), len(down)
    instants = sorted({*arrival, *(u for ups in up for u in ups if math.isfinite(u))})
    start, end, lost = [math.nan] * n, [math.inf] * n, [False] * n
    tries = [0] * n
    running = {}  # replica -> (request, instant its attempt ends or is cut, cut?)
    cut_wait = []  # (cut instant, replica, request)
    queue, nxt_arrival, t = [], 0, -math.inf
    while True:
        later = [x for x in instants if x > t] + [e for _, e, _ in running.values() if e > t]
        if not later:
            break
        t = min(later)
        for r in sorted(running):
            j, e, is_cut = running[r]
            if e != t:
                continue
            del running[r]
            if not is_cut:
                end[j] = e
            elif tries[j] == retries:
                end[j], lost[j] = e, True
            else:
                tries[j] += 1
                cut_wait.append((e, r, j))
        while nxt_arrival < n and arrival[nxt_arrival] <= t:
            queue.append(nxt_arrival)
            nxt_arrival += 1
        cut_wait.sort()
        for r in range(c):
            up_now = not any(d <= t < u for d, u in zip(down[r], up[r]))
            if r in running or not up_now:
                continue
            if cut_wait:
                j = cut_wait.pop(0)[2]
            elif queue:
                j = queue.pop(0)
                start[j] = t
            else:
                break
            fail = min(d for d in down[r] if d > t)
            running[r] = (j, t + service[j], False) if t + service[j] <= fail else (j, fail, True)
    return start, end, lost


def resend_draws(gen, tokens, c, sched, retries):
    d = pool_draws(gen, tokens, c, sched, retries)
    d.faults["g"].spec = FaultSpec(math.inf, 0.0, retries, resend=True)
    return d


@pytest.mark.parametrize("resend,start,end", [
    # replicas 0 and 1, replica 0 down [4, 6); 3 s requests at 2, 2 and 4.5. The first, on replica 0, is cut at 4.
    (True, [2, 2, 6], [8, 5, 9]),  # re-sent: replica 1 falls free at 5 and takes it ahead of the third, which waits
    (False, [2, 2, 5], [9, 5, 8]),  # retry: it waits for replica 0's repair at 6; the third takes replica 1 at 5
])
def test_a_hand_checked_pool_re_sends_a_cut_batch(resend, start, end):
    gen = np.array([[2.0, 0.0, 2.5]])
    tokens = np.full((1, 3, 1, 1), 3000.0)
    sched = [(np.array([4.0]), np.array([6.0])), (np.zeros(0), np.zeros(0))]
    d = (resend_draws if resend else pool_draws)(gen, tokens, 2, sched, 1)
    for s in (run_lanes(d, False), run_simpy(d, False)):
        assert s.service_start[0, :, 0, 0].tolist() == start
        assert s.completion[0, :, 0, 0].tolist() == end
        log = s.gpu_batches["g"]
        assert log["work"].tolist() == ([0.0, 3.0, 3.0, 3.0] if resend else [3.0, 3.0, 3.0])


@pytest.mark.parametrize("seed", range(6))
def test_resend_on_a_failure_schedule_matches_the_oracle(seed):
    rng = np.random.default_rng(310 + seed)
    lanes, steps, batch, c, retries = 3, 40, 3, int(rng.integers(1, 5)), [0, 1, 3][seed % 3]
    tokens = np.maximum(np.rint(rng.exponential(2000.0, (lanes, steps, batch, 1))), 1.0)
    gen = rng.exponential(2.0, (lanes, steps))
    sched = random_schedule(rng, c, 400.0)
    if seed == 5:  # two replicas failing at the same instant: re-sent by replica index
        sched[-1] = (np.concatenate([sched[0][0][:3], [1e6]]), np.concatenate([sched[0][0][:3] + 0.5, [1e6 + 1]]))
    draws = resend_draws(gen, tokens, c, sched, retries)
    got = run_lanes(draws, False)
    assert _GpuLanes(draws, "g", False, None, False).vector  # the vectorised recursion, beside the loop and SimPy
    assert_same_schedule(got, run_simpy(draws, False), f"seed {seed}")
    assert_same_schedule(got, run_lanes(draws, False, gpu_loop=True), f"seed {seed} loop")
    resent = lost_any = 0
    for i in range(lanes):
        arrival = [float(a) for a in np.repeat(np.cumsum(gen[i]), batch)]
        service = [float(x) for x in (tokens[i, :, :, 0] / 1000.0).ravel()]
        s, e, x = resend_oracle(arrival, service, [[*d, math.inf] for d, _ in sched],
                                [[*u, math.inf] for _, u in sched], retries)
        s, e, x = (np.array(v).reshape(steps, batch) for v in (s, e, x))
        assert np.array_equal(got.service_start[i, :, :, 0], s)
        assert np.array_equal(got.completion[i, :, :, 0], np.where(x, np.inf, e))
        assert np.array_equal(got.failed[i, :, :, 0], x)
        lost_any += int(x.sum())
        resent += int(np.sum(~x & (e - s > np.array(service).reshape(steps, batch) + 1e-9)))
    log = got.gpu_batches["g"]
    cut = log["work"] == 0  # attempts cut (or lost) by a failure: busy, no useful work
    # a re-sent batch restarts from zero: its last attempt is its whole work
    np.testing.assert_allclose(log["work"][~cut], log["end"][~cut] - log["start"][~cut], rtol=1e-12, atol=1e-12)
    assert cut.sum() >= lost_any and (resent > 0 or retries == 0) and (lost_any > 0 or retries > 0)


@pytest.mark.parametrize("seed", range(6))
def test_engines_agree_and_every_result_is_accounted_for_with_resend(seed):
    pcfg = random_pcfg(seed)
    pcfg.channels["g"].faults.on_failure = "resend"
    assert_engines_agree_and_failures_accounted(pcfg, "g", seed)


@pytest.mark.parametrize("seed", range(8))
def test_resend_with_bursts_continuous_batches_and_blocking_agrees(seed):
    pcfg = scheduled_pcfg(seed)
    pcfg.channels["g"].faults.on_failure = "resend"
    draws = draw(pcfg, 4, np.random.default_rng(seed))
    assert _GpuLanes(draws, "g", False, None, False).vector
    for blocking in (False, True):
        vec = run_lanes(draws, blocking)
        assert_same_schedule(vec, run_simpy(draws, blocking), f"seed {seed} {blocking}: vector vs simpy")
        assert_same_schedule(vec, run_lanes(draws, blocking, gpu_loop=True), f"seed {seed} {blocking}: vs loop")


def test_the_default_re_sends_on_gpu_rm_and_retries_on_workers():
    f = FaultsConf(mtbf_s=100.0, mttr_s=10.0)
    assert fault_spec(f, 1).resend and fault_spec(f, 1).retries == 3
    assert not fault_spec(f, 1, gpu=False).resend and fault_spec(f, 1, gpu=False).retries == 3
    f.on_failure = "retry"
    assert not fault_spec(f, 2).resend
    J = "pipeline.channels.judge.faults"
    validate(compose_config("scenario=capacity/judge_rm_faults", f"{J}.on_failure=resend"))
    validate(compose_config(f"{J}.mtbf_s=100", f"{J}.mttr_s=10"))  # a queue channel's workers: null means retry
    with pytest.raises(ConfigError) as e:
        validate(compose_config(f"{J}.mtbf_s=100", f"{J}.mttr_s=10", f"{J}.on_failure=resend"))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{J}.on_failure = 'resend': ") and "retry, lose or null" in msg
    with pytest.raises(ConfigError, match=r"faults\.on_failure = 'sometimes': one of resend, retry, lose, or null"):
        validate(compose_config("scenario=capacity/judge_rm_faults", f"{J}.on_failure=sometimes"))


# ----------------------------------------------------------------------------
# useful <= busy, both in [0, 1], from the same run.


@pytest.mark.parametrize("seed", range(12))
def test_useful_never_exceeds_busy(seed):
    pcfg = random_pcfg(seed) if seed % 2 else scheduled_pcfg(seed)
    pcfg.channels["g"].faults.on_failure = ["resend", "retry", "lose", None][seed % 4]
    if seed % 6 == 5:
        pcfg.channels["g"].faults = FaultsConf()  # no failures: every busy second is useful
    draws = draw(pcfg, 3, np.random.default_rng(seed))
    sched = run_lanes(draws, False)
    w = int(pcfg.steps) // 3
    t0, t1 = sched.step_start[:, w], sched.step_start[:, -1]
    table = channel_stats(sched, draws.workers, w).set_index("channel")
    for k, name in enumerate(sched.channel_names):
        busy = table.loc[name, "utilisation"]
        useful = useful_share(sched, k, draws.workers[name], t0, t1)
        assert 0.0 <= useful <= busy + 1e-12 <= 1.0 + 1e-12, (name, useful, busy)
        log = (sched.gpu_batches or {}).get(name)
        if log is not None and np.any((log["work"] == 0) & (log["end"] > t0[log["lane"]] + 1e-6)
                                      & (log["start"] < t1[log["lane"]] - 1e-6)):
            assert useful < busy - 1e-9  # an attempt a failure cut or lost in the window: busy, delivered nothing
        if sched.faults is None or name not in sched.faults:
            assert useful == pytest.approx(busy, rel=1e-12)  # nothing fails: all of it


def test_a_capacity_run_with_failures_prints_up_and_useful_from_the_run():
    """`up (%)` is the simulated run's share of replica-seconds up (not the load's long-run
    figure) and `useful` <= `busy`, both from the run, at every simulated count."""
    from racsim.analyses.capacity import run_capacity
    from racsim.config.spec import scenario
    from racsim.report.capacity import format_curve
    from racsim.io import fmt

    J = "pipeline.channels.judge"
    cfg = scenario(compose_config(
        "scenario=capacity/judge_rm_faults", "capacity.counts=[6,8]", "learner.trials=4", "learner.bootstrap=0",
        "pipeline.steps=12", "capacity.benchmark=false", "capacity.run_length=fixed", "capacity.resamples=20",
        "pipeline.warmup_steps=2", f"{J}.rm.sequences_per_sample=16", "pipeline.batch_size=16",
        "pipeline.generate.mean=1.5", "pipeline.fast_score.mean=0.25", "pipeline.update.mean=0.375",
        f"{J}.faults.mtbf_s=40", f"{J}.faults.mttr_s=10", f"{J}.max_delay=6", "capacity.max_count=8",
        f"{J}.rm.mfu=0.4"))
    res = run_capacity(cfg)
    c = res.curve[(res.curve.corrector == res.targets["corrector"]) & res.curve.utilisation.notna()]  # simulated
    assert len(c) == 2
    assert np.all((0 <= c.useful) & (c.useful < c.utilisation) & (c.utilisation <= 1))  # cut attempts: busy, not useful
    assert np.all(c.availability != c.available) and np.all((0 < c.availability) & (c.availability < 1))
    table = format_curve(res).splitlines()
    assert "up (%)" in table[0]
    for _, r in c.iterrows():
        line = next(ln for ln in table[1:] if ln.split()[0] == str(int(r["count"])))
        cells = line.replace("(", " ").replace(")", " ").split()  # whole cells: '80' is not in 'max_steps 800'
        assert fmt(100 * r.availability) in cells and fmt(100 * r.available) not in cells, (line, r.availability)
