"""The lanes engine's stretches of an autoscaled FIFO gpu_rm pool served as a fixed pool
(:meth:`AutoPool.serve_cut`, batches from :meth:`FifoWaiting.take`).

On random FIFO configs (padded and packed, static and continuous batching, budgets and
``max_batch`` that cut, flush deadlines, bursts, equal token lengths so that servers finish
together, rules that scale up and down) and every schedule (asynchronous, blocking with and
without a timeout), the lanes engine with its stretches, the lanes engine without them (every
instant by :meth:`AutoPool.decide`) and the SimPy engine give the same schedules, batch logs
and pool logs to the last bit; the cases reach every way a stretch ends.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from helpers import assert_same_schedule, det, gpu, rm_model

from racsim.config.schema import AutoscaleConf, ChannelConf, LatencyConf, PipelineConf, RMConf
from racsim.pipeline.autoscale import AutoPool
from racsim.pipeline.draws import draw
from racsim.pipeline.lanes import run_lanes
from racsim.pipeline.simpy_engine import run_simpy

MODES = [(False, None), (True, None), (True, 0.4), (True, 2.0)]
N_CASES = 24


def cut_pcfg(seed: int) -> PipelineConf:
    """An autoscaled FIFO gpu_rm channel under a load that makes its queue grow and drain."""
    rng = np.random.default_rng(4000 + seed)
    lo = int(rng.integers(1, 3))
    rule = AutoscaleConf(min=lo, max=lo + int(rng.integers(1, 4)), queue_above=int(rng.choice([0, 2, 8, 30])),
                         for_s=float(rng.uniform(0.1, 2.0)), startup_s=float(rng.choice([0.3, 1.0, 3.0])),
                         idle_s=float(rng.uniform(0.2, 3.0)), cost_per_hour=1.0)
    same = seed % 3 == 0  # every request of equal length: full batches take equal seconds
    rm = RMConf(model=rm_model("8B"), gpu=gpu("H100", name="slow", peak_tflops=float(rng.uniform(10, 60))),
                gpus=1, max_batch=int(rng.choice([1, 2, 4, 8])), token_budget=int(rng.integers(500, 3000)),
                max_wait_s=float(rng.choice([0.0, 0.1, 1.0])), order="fifo", padded=bool(seed % 2),
                batching="continuous" if seed % 4 == 3 else "static", sequences_per_sample=int(rng.integers(1, 5)),
                prompt_tokens=det(100.0) if same else LatencyConf(kind="lognormal", mean=150.0, sigma=0.6, low=1.0),
                response_tokens=det(200.0) if same else LatencyConf(kind="exponential", mean=300.0))
    burst = dict(degraded_factor=2.5, p_degrade=0.3, p_recover=0.5) if seed % 5 == 1 else {}
    chans = {"g": ChannelConf(kind="gpu_rm", rm=rm, max_delay=[None, 2][seed % 2], autoscale=rule, **burst)}
    return PipelineConf(steps=int(rng.integers(8, 16)), batch_size=int(rng.integers(2, 8)),
                        generate=LatencyConf(kind="lognormal", mean=float(rng.uniform(0.3, 2.0)), sigma=0.7),
                        fast_score=det(0.1), submit=det(0.05), update=det(0.2), channels=chans)


def run_tallied(draws, blocking, timeout, seen: Counter):
    """run_lanes, counting how each of its stretches ended (``seen``)."""
    serve_cut, decide = AutoPool.serve_cut, AutoPool.decide
    inside = []

    def spy_decide(self, tau):
        if inside:
            inside[-1] = "partial instant" if any(b[1] == tau for b in self.batches[inside[-2]:]) else "no cut batch"
        return decide(self, tau)

    def spy_cut(self, now, until, stop=None):
        r, clock = self.rule, self.above_since
        idle = any(self.free[s] <= now for s in self.alive)
        end_clock = clock + r.for_s if clock is not None and len(self.alive) < r.max else np.inf
        inside[:] = [len(self.batches), None]
        out = serve_cut(self, now, until, stop)
        got, how = self.batches[inside[0]:], inside[1]
        inside.clear()
        starts = [b[1] for b in got]
        seen["served"] += bool(got)
        seen["tie"] += len(starts) > len(set(starts))
        seen["clock stopped"] += clock is not None and self.above_since is None
        nxt = min(self.free[s] for s in self.alive)
        if how:
            seen[how] += 1
        elif idle:
            seen["idle at entry"] += 1
        elif nxt >= until:
            seen["arrival"] += 1
        elif nxt >= end_clock:
            seen["for_s"] += 1
        else:
            assert stop is not None and stop(nxt)
            seen["stop"] += 1
        return out

    AutoPool.serve_cut, AutoPool.decide = spy_cut, spy_decide
    try:
        return run_lanes(draws, blocking, timeout)
    finally:
        AutoPool.serve_cut, AutoPool.decide = serve_cut, decide


@pytest.fixture(scope="module")
def cut_cases():
    seen, out = Counter(), {}
    for seed in range(N_CASES):
        draws = draw(cut_pcfg(seed), 3, np.random.default_rng(seed))
        for blocking, timeout in MODES:
            out[(seed, blocking, timeout)] = (draws, run_tallied(draws, blocking, timeout, seen))
    return out, seen


@pytest.mark.parametrize("blocking,timeout", MODES)
@pytest.mark.parametrize("seed", range(N_CASES))
def test_stretches_serve_what_decide_and_simpy_do(cut_cases, monkeypatch, seed, blocking, timeout):
    draws, fast = cut_cases[0][(seed, blocking, timeout)]
    monkeypatch.setattr(AutoPool, "serve_cut", lambda self, now, until, stop=None: now)  # every instant by decide
    for ref, name in ((run_lanes(draws, blocking, timeout), "decide"), (run_simpy(draws, blocking, timeout), "simpy")):
        label = f"seed {seed} blocking {blocking} timeout {timeout} vs {name}"
        assert_same_schedule(fast, ref, label)
        assert all(np.array_equal(fast.pools["g"][c], ref.pools["g"][c]) for c in ref.pools["g"]), label


def test_stretches_end_every_way(cut_cases):
    seen = cut_cases[1]
    want = {"served", "tie", "clock stopped", "partial instant", "no cut batch", "idle at entry", "arrival", "for_s",
            "stop"}
    assert want <= set(seen), (want - set(seen), seen)
