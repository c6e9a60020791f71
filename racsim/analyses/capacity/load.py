"""The offered load of every count, drawn once for all of them (common random numbers): the work
arriving per second over the servers up, rho = work / (clock x servers x availability)
(:func:`~racsim.pipeline.steady.offered_load`). A count whose load reaches ``capacity.max_load``
is overloaded: never simulated nor recommended."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np

from racsim.analyses.capacity.channel import units_per_server
from racsim.config.schema import RacsimConf
from racsim.config.spec import replace_at
from racsim.config.validate import faults_on
from racsim.pipeline import steady
from racsim.pipeline.background import background_work
from racsim.pipeline.draws import (draw, fault_timeline, mean_step_seconds, mean_work_seconds, stationary_slowdown,
                                   work_seconds)
from racsim.pipeline.faults import availability, fault_spec
from racsim.seeds import rng_for

LOAD_TRIALS = 10  # trials of the scenario's draws the offered load is measured on (at least)
# A gpu_rm pool's work has no closed form (full batches of drawn tokens): its load is measured on
# at least this many sequences, so that its sampling error (about 0.1% of the load on the judge)
# is far below the gap between a count's load and capacity.max_load, and the seed moves no answer.
LOAD_SEQUENCES = 2**20
LOAD_MAX_TRIALS = 200


def load_trials(cfg: RacsimConf, name: str) -> int:
    """Trials of the draws :func:`channel_loads` measures channel ``name``'s load on:
    :data:`LOAD_TRIALS` (at most ``learner.trials``), and for a gpu_rm pool as many more as
    :data:`LOAD_SEQUENCES` sequences take (at most :data:`LOAD_MAX_TRIALS`)."""
    p, ch = cfg.pipeline, cfg.pipeline.channels[name]
    base = min(int(cfg.learner.trials), LOAD_TRIALS)
    if ch.kind != "gpu_rm":
        return base
    per_trial = int(p.steps) * int(p.batch_size) * int(ch.rm.sequences_per_sample)
    return max(base, min(LOAD_MAX_TRIALS, -(-LOAD_SEQUENCES // per_trial)))


@dataclass
class LoadBasis:
    """What every count's load is made of (:func:`load_basis`), drawn once per spec: the long-run
    work and clock per step (s), the sampled ones per (trial, step), and the trials drawn."""

    work_step: float
    clock_step: float
    work_s: np.ndarray
    clock_s: np.ndarray
    trials: int
    other: float  # of work_step per second: other tenants' (background) server-seconds a second


def load_basis(cfg: RacsimConf, name: str) -> LoadBasis:
    """The draws behind :func:`channel_loads`, the same for every count (common random numbers)."""
    trials = load_trials(cfg, name)
    ch = cfg.pipeline.channels[name]
    sampled = draw(cfg.pipeline, trials, rng_for(cfg.seed, "pipeline"))
    slow = stationary_slowdown(ch.degraded_factor, ch.p_degrade, ch.p_recover)
    work_s, clock_s = work_seconds(sampled, name), sampled.phase.sum(axis=0)
    exact_work, exact_clock = mean_work_seconds(cfg.pipeline, name), mean_step_seconds(cfg.pipeline)
    if exact_work is None:  # a gpu_rm pool: its draws' work without bursts (drawn after the service
        calm = sampled if ch.degraded_factor == 1 else draw(  # draws, so these are the same), times the slow-down
            replace_at(cfg, f"pipeline.channels.{name}.degraded_factor", 1.0).pipeline, trials,
            rng_for(cfg.seed, "pipeline"))
        work_step = float((work_seconds(calm, name) * slow).mean())
    else:
        work_step = exact_work * slow
    clock_step = float(clock_s.mean()) if exact_clock is None else exact_clock  # bursts leave the phases alone
    other = background_work(ch, name)  # other tenants' server-seconds a second (its long-run mean: both loads)
    return LoadBasis(work_step + other * clock_step, clock_step, work_s + other * clock_s, clock_s, trials, other)


def channel_loads(cfg: RacsimConf, name: str, key: str, counts: List[int],
                  basis: Optional[LoadBasis] = None) -> Dict[int, Dict[str, float]]:
    """Per count: the channel's long-run offered load, the work it is offered (server-seconds per
    second of the asynchronous optimizer's clock), the fraction of its servers' time up, and beside
    them the load as sampled (``load_sampled``: a check). Where the model knows a long-run figure
    it is used, not a sample of it: a burst chain's stationary slow-down
    (:func:`~racsim.pipeline.draws.stationary_slowdown`) times the work of the scenario's draws
    without bursts (:func:`load_trials` trials; the same for every count: common random numbers),
    and random failures' availability mtbf / (mtbf + mttr) of a server (a replica fails when any of
    its tp GPUs does); a schedule of known outages by its up-time over the sampled clock. The
    sampled load takes the bursts and outages the draws happened to hold. Background traffic
    (other tenants') adds its long-run work, rate x mean service, to both. The work and the clock
    are their exact means where the laws give them (:func:`~racsim.pipeline.draws.mean_work_seconds`,
    :func:`~racsim.pipeline.draws.mean_step_seconds`: a queue channel's batch x route_prob x its
    law's mean, the phases' means), so that such a load does not move with the seed; a gpu_rm
    pool's work is its draws' (full batches of drawn tokens)."""
    b = load_basis(cfg, name) if basis is None else basis
    ch = cfg.pipeline.channels[name]
    units = units_per_server(cfg, name)
    out = {}
    for n in counts:
        servers = n // units
        up = up_s = 1.0
        if faults_on(ch):
            tl = fault_timeline(ch, name, b.trials, servers, int(rng_for(cfg.seed, "capacity_load").integers(2**62)))
            up_s = float(np.mean(tl.up_fraction(np.zeros(b.trials), b.clock_s.sum(axis=1))))
            up = up_s if ch.faults.mtbf_s is None else availability(fault_spec(ch.faults, units))
        out[n] = {"load": steady.offered_load(b.work_step, b.clock_step, servers * up),
                  "load_background": steady.offered_load(b.other, 1.0, servers * up),
                  "work_per_s": b.work_step / b.clock_step, "availability": up,
                  "load_sampled": steady.offered_load(b.work_s, b.clock_s, servers * up_s)}
    return out
