"""``cancel_on_drop`` (issue 11, item 6): a result that can no longer be used frees its worker.

Oracles written from the model, not from racsim/pipeline/lanes.py:

* a per-request discrete-event loop (a heap of arrivals, completions and
  deadlines; FIFO queue; c workers) on the pipeline's own step clock, which a
  cumulative sum of the phase durations gives independently;
* conservation: every result injected, dropped or pending; the busy seconds
  equal the sum of served durations (the full service of every result that came
  back, the part up to its deadline of every cancelled one); never more than c
  jobs in service;
* sample-path monotonicity: freeing workers early never delays a job.
Both engines must agree to the last bit, asynchronous and blocking with a timeout.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import replace

import numpy as np
import pytest
from helpers import assert_same_schedule, det

from racsim.config.schema import ChannelConf, LatencyConf, PipelineConf
from racsim.config.validate import validate
from racsim.errors import ConfigError
from racsim.pipeline.draws import draw
from racsim.pipeline.lanes import run_lanes
from racsim.pipeline.schedule import DROPPED, INJECTED, PENDING
from racsim.pipeline.simpy_engine import run_simpy
from racsim.pipeline.stats import channel_stats


def overloaded_pcfg(seed: int) -> PipelineConf:
    """Queues of 1-3 workers at 0.8-3x their capacity (continuous draws: no ties), tight max_delay."""
    rng = np.random.default_rng(seed)
    batch = int(rng.integers(1, 4))
    chans = {}
    for k in range(2):
        workers = int(rng.integers(1, 4))
        kind = ["exponential", "lognormal", "uniform"][int(rng.integers(3))]
        load = float(rng.uniform(0.8, 3.0))
        lat = LatencyConf(kind=kind, mean=load * workers * 3.0 / batch, sigma=0.9)  # a step takes about 3 s
        chans[f"c{k}"] = ChannelConf(latency=lat, workers=workers, max_delay=int(rng.integers(0, 4)),
                                     cancel_on_drop=True)
    return PipelineConf(steps=int(rng.integers(12, 30)), batch_size=batch,
                        generate=LatencyConf(kind="exponential", mean=2.0), fast_score=det(0.3), submit=det(0.05),
                        update=LatencyConf(kind="uniform", mean=0.6, low=0.2, high=1.0), channels=chans)


def clock(phase: np.ndarray) -> tuple:
    """Submission times and step starts of the asynchronous optimizer, by a running sum."""
    gen, fast, sub, upd = phase
    n, steps = gen.shape
    start = np.zeros((n, steps + 1))
    submit = np.zeros((n, steps))
    for t in range(steps):
        submit[:, t] = start[:, t] + gen[:, t] + fast[:, t] + sub[:, t]
        start[:, t + 1] = submit[:, t] + upd[:, t]
    return submit, start


def event_loop(arrival, service, deadline, c):
    """One lane's FIFO queue with c workers and deadlines, request by request.
    Returns start, end (the second the job let go of the queue or its worker) and cancelled."""
    n = len(arrival)
    start, end, cut = [None] * n, [None] * n, [False] * n
    heap, seq = [], 0

    def push(time, prio, kind, j):
        nonlocal seq
        heapq.heappush(heap, (time, prio, seq, kind, j))
        seq += 1

    for j in range(n):
        push(arrival[j], 2, "arrive", j)
        push(deadline[j], 1, "deadline", j)
    queue, busy = deque(), set()

    def begin(now):
        while queue and len(busy) < c:
            j = queue.popleft()
            if now >= deadline[j]:  # its deadline is now: it would start too late
                start[j] = end[j] = now
                cut[j] = True
                continue
            start[j] = now
            busy.add(j)
            push(now + service[j], 0, "done", j)

    while heap:
        now, _, _, kind, j = heapq.heappop(heap)
        if kind == "arrive":
            if deadline[j] <= now:
                start[j] = end[j] = now
                cut[j] = True
            else:
                queue.append(j)
        elif kind == "done" and j in busy:
            busy.discard(j)
            end[j] = now
        elif kind == "deadline" and end[j] is None:
            cut[j] = True
            if j in busy:
                busy.discard(j)
                end[j] = now
            elif j in queue:
                queue.remove(j)
                start[j] = end[j] = now
        begin(now)
    return np.array(start), np.array(end), np.array(cut)


@pytest.mark.parametrize("seed", range(8))
def test_async_matches_event_loop_and_simpy(seed):
    pcfg = overloaded_pcfg(seed)
    draws = draw(pcfg, 3, np.random.default_rng(seed))
    lanes = run_lanes(draws, False)
    simpy = run_simpy(draws, False)
    assert_same_schedule(lanes, simpy, f"seed {seed}")
    assert np.array_equal(lanes.cancelled, simpy.cancelled)
    submit, step_start = clock(draws.phase)
    steps, batch = pcfg.steps, pcfg.batch_size
    assert np.array_equal(lanes.step_start, step_start)
    for k, (name, ch) in enumerate(pcfg.channels.items()):
        D = ch.max_delay
        for i in range(3):
            arr = np.repeat(submit[i], batch)
            dl = np.repeat([step_start[i, t + D] if t + D + 1 <= steps - 1 else np.inf for t in range(steps)], batch)
            s, e, cut = event_loop(arr, draws.service[name][i].ravel(), dl, ch.workers)
            np.testing.assert_allclose(lanes.service_start[i, ..., k].ravel(), s, rtol=1e-12)
            np.testing.assert_allclose(lanes.completion[i, ..., k].ravel(), e, rtol=1e-12)
            assert np.array_equal(lanes.cancelled[i, ..., k].ravel(), cut)
            status = lanes.status[i, ..., k].ravel()
            assert (status[cut] == DROPPED).all()
            assert not (status[~cut] == DROPPED).any()  # with cancel_on_drop, dropped = cancelled
    assert any(lanes.status.ravel() == DROPPED), "the configurations must overload their queues"


@pytest.mark.parametrize("seed", range(4))
def test_blocking_with_timeout_matches_simpy_and_frees_workers(seed):
    pcfg = overloaded_pcfg(seed)
    draws = draw(pcfg, 3, np.random.default_rng(seed))
    timeout = 2.5
    a, b = run_lanes(draws, True, timeout), run_simpy(draws, True, timeout)
    assert_same_schedule(a, b, f"seed {seed}")
    assert np.array_equal(a.cancelled, b.cancelled) and a.cancelled.any()
    for k in range(2):
        late = a.completion[..., k] - a.submit_time[..., k] > timeout * (1 + 1e-12)
        assert not late.any()  # a timed-out job lets go of its worker at the timeout
        gone = a.status[..., k] == DROPPED
        np.testing.assert_allclose(a.completion[..., k][gone], a.submit_time[..., k][gone] + timeout, rtol=1e-12)
    # every step waited at most the timeout, so each step starts with every worker free
    np.testing.assert_array_less(a.completion[:, :-1].max(axis=(2, 3)), a.submit_time[:, 1:, 0, 0])


@pytest.mark.parametrize("seed", range(6))
def test_conservation_and_monotonicity(seed):
    pcfg = overloaded_pcfg(seed)
    draws = draw(pcfg, 4, np.random.default_rng(seed))
    on = run_lanes(draws, False)
    off = run_lanes(replace(draws, cancel=frozenset()), False)
    n, steps, batch, K = on.status.shape
    for k, (name, ch) in enumerate(pcfg.channels.items()):
        st = on.status[..., k]
        assert np.isin(st, [INJECTED, DROPPED, PENDING]).all()
        counts = on.counts()[name]
        assert counts["injected"] + counts["dropped"] + counts["pending"] == counts["emitted"] == st.size
        service = draws.service[name]
        held = on.completion[..., k] - on.service_start[..., k]
        came_back = ~on.cancelled[..., k]
        assert np.array_equal(came_back, st != DROPPED)  # with cancel_on_drop, dropped = cancelled here
        np.testing.assert_allclose(held[came_back], service[came_back], rtol=0, atol=1e-9)
        assert (held[~came_back] < service[~came_back]).all() and (held >= 0).all()
        # busy seconds = full services of the results that came back + the held part of the cancelled ones
        assert held.sum() == pytest.approx(service[came_back].sum() + held[~came_back].sum(), rel=1e-12)
        # never more than c jobs in service: sweep each lane's start/end events
        for i in range(n):
            s, e = on.service_start[i, ..., k].ravel(), on.completion[i, ..., k].ravel()
            times = np.concatenate([s, e])
            delta = np.concatenate([np.ones_like(s), -np.ones_like(e)])
            order = np.lexsort((delta, times))  # at one instant, ends before starts
            assert np.cumsum(delta[order]).max() <= ch.workers
        # freeing workers early never delays a job that is served in full, and the pool is busy for less
        assert (on.service_start[..., k][came_back] <= off.service_start[..., k][came_back]).all()
        busy_off = (off.completion[..., k] - off.service_start[..., k]).sum()
        assert busy_off == pytest.approx(service.sum(), rel=1e-12)  # without cancelling: every service in full
        assert held.sum() < busy_off
        # the sojourn (submit to result) counts only the results that came back
        soj = (on.completion[..., k] - on.submit_time[..., k])[came_back]
        row = channel_stats(on, {name: ch.workers}, 0).iloc[k]
        assert row.sojourn_mean_s == pytest.approx(soj.mean(), rel=1e-12)
        assert row.sojourn_p95_s == pytest.approx(np.percentile(soj, 95), rel=1e-12)


def test_cancel_on_drop_needs_a_queue_with_workers():
    from hydra import compose, initialize_config_module

    from racsim.config.schema import register_configs

    register_configs()
    with initialize_config_module(version_base="1.3", config_module="racsim.conf"):
        validate(compose("config", overrides=["pipeline.channels.verifier.cancel_on_drop=true"]))
        for extra in (["pipeline.channels.verifier.workers=null"], ["channel@pipeline.channels.judge=judge_gpu_rm"]):
            name = "verifier" if "workers" in extra[0] else "judge"
            cfg = compose("config", overrides=extra + [f"pipeline.channels.{name}.cancel_on_drop=true"])
            with pytest.raises(ConfigError, match=f"pipeline.channels.{name}.cancel_on_drop"):
                validate(cfg)
