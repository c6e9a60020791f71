"""How fast the capacity run simulated: the lanes engine's requests per second of wall time in this
run, beside racsim's SimPy engine of record and a bare per-request SimPy model, timed here."""

from __future__ import annotations

import time
from typing import Dict

import numpy as np

from racsim.analyses.capacity.channel import with_count
from racsim.analyses.capacity.length import requests_per_schedule
from racsim.config.schema import RacsimConf
from racsim.pipeline.draws import draw
from racsim.pipeline.simpy_engine import run_simpy


def raw_simpy_rate(n_requests: int, servers: int, seed: int = 0, clock=time.perf_counter) -> float:
    """Requests per second of a bare SimPy M/M/c model: a process per request on
    a ``Resource`` of ``servers`` (the cheapest a per-request SimPy model gets);
    seconds of ``clock`` (wall-clock; time.process_time: this process's CPU)."""
    import simpy

    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0, n_requests).tolist()
    service = (rng.exponential(0.8 * servers, n_requests)).tolist()
    env = simpy.Environment()
    res = simpy.Resource(env, capacity=servers)

    def request(s):
        with res.request() as req:
            yield req
            yield env.timeout(s)

    def source():
        for g, s in zip(gaps, service):
            yield env.timeout(g)
            env.process(request(s))

    t0 = clock()
    env.process(source())
    env.run()
    return n_requests / (clock() - t0)


def benchmark(cfg: RacsimConf, key: str, middle: int, requests: int, pipeline_s: float) -> Dict[str, float]:
    """Simulated requests per second of wall time: the lanes engine as the capacity run
    itself used it (``requests`` in ``pipeline_s``: its draws and every schedule it simulated,
    nothing re-run), racsim's SimPy engine of record on 2 trials of the ``middle`` count, and raw
    SimPy on a bare per-request model, all timed in this run."""
    c = with_count(cfg, key, middle)
    draws = draw(c.pipeline, 2, np.random.default_rng(0))
    t0 = time.perf_counter()
    run_simpy(draws, False)
    simpy_engine_rate = requests_per_schedule(c) / c.learner.trials * 2 / (time.perf_counter() - t0)
    sample = int(min(requests, 50_000))
    raw = raw_simpy_rate(sample, servers=max(1, middle))
    return {
        "requests": float(requests),
        "lanes_s": pipeline_s,
        "lanes_requests_per_s": requests / pipeline_s,
        "simpy_engine_requests_per_s": simpy_engine_rate,
        "raw_simpy_requests_per_s": raw,
        "raw_simpy_sample": float(sample),
        "raw_simpy_s_for_all": requests / raw,
        "speedup_vs_raw_simpy": (requests / pipeline_s) / raw,
    }
