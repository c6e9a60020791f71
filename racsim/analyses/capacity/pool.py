"""Counts side by side: how many processes simulate a grid's counts at once (within the cores and
the memory, and only where the pool saves more than its start), and the spec they run with."""

from __future__ import annotations

import math
import time

from racsim.analyses.bias_study import corrector_names
from racsim.analyses.capacity.length import first_length, requests_per_schedule
from racsim.analyses.capacity.memory import fitting_steps
from racsim.analyses.capacity.rows import count_rows
from racsim.config.schema import RacsimConf
from racsim.config.spec import replace_at
from racsim.config.validate import runs_that_fit
from racsim.io import auto_workers
from racsim.learner.correctors import BLOCKING


# Seconds a spawned process takes to start: importing racsim, numpy, scipy and pandas (1.2-1.3 s
# measured on 2 cores), with a margin.
POOL_START_S = 1.5


def pool_size(cfg: RacsimConf, first_s: float, left: int) -> int:
    """Processes that simulate ``left`` more counts side by side (1: this one alone):
    ``capacity.workers`` (0: every usable core), at most ``left`` and as many runs as fit in
    memory at once (racsim.config.validate.runs_that_fit); with 0, only when the first count's
    ``first_s`` seconds say the pool saves more than its start (:data:`POOL_START_S`)."""
    asked = int(cfg.capacity.workers)
    workers = min(asked or auto_workers(), left, runs_that_fit(cfg))
    if workers > 1 and asked == 0 and first_s * (left - math.ceil(left / workers)) <= POOL_START_S:
        return 1
    return max(workers, 1)


def makespan(jobs: int, at_once: int, cores: int) -> float:
    """Time ``jobs`` equal runs take, in one run's time on a core of its own, ``at_once`` of them
    side by side on ``cores`` cores that the OS shares fairly: in rounds of ``at_once`` runs (and
    one of the rest), j runs of a round each getting min(1, cores / j) of a core."""
    full, rest = divmod(jobs, at_once)
    return (full * max(at_once, cores) + (max(rest, cores) if rest else 0)) / cores


def soonest(jobs: int, cores: int, most: int) -> int:
    """How many of ``jobs`` equal runs to run at once, at most ``most``, that all end soonest
    (:func:`makespan`), the fewest on a tie: 4 runs on 2 cores end after 2 runs' time two at a
    time, where three at a time take 2.5 (three, then one alone on two cores)."""
    ks = range(1, max(1, min(jobs, most)) + 1)
    return min(ks, key=lambda k: (makespan(jobs, k, cores), k))


# Simulated requests a second one count's run reaches at most in one process, both pipelines and
# the bias study included (the lanes engine alone: 2.6e6-6.5e6 measured on 2 cores, 1x to 64x the
# judge): :func:`count_seconds` is a lower bound.
COUNT_REQUESTS_PER_S = 1e7


def count_seconds(cfg: RacsimConf, name: str) -> float:
    """A lower bound on the seconds one count's run takes, before any has run: the requests of
    its first length (:func:`first_length`), twice where a blocking corrector needs the blocking
    pipeline too, at :data:`COUNT_REQUESTS_PER_S`."""
    c = replace_at(cfg, "pipeline.steps", first_length(cfg, name))
    pipelines = 2 if any(n in BLOCKING for n in corrector_names(c)) else 1
    return pipelines * requests_per_schedule(c) / COUNT_REQUESTS_PER_S


def count_worker(cfg: RacsimConf, name: str, key: str, n: int, load: dict):
    """:func:`count_rows` in a pool's process: the settled run, the rows and the seconds they took."""
    t0 = time.perf_counter()
    run, out = count_rows(cfg, name, key, n, load)
    return run, out, time.perf_counter() - t0


def pooled_spec(cfg: RacsimConf, name: str, runs: int) -> RacsimConf:
    """The spec counts run with side by side in a pool of ``runs`` processes: ``cfg``, or where
    ``runs`` of its longest runs do not fit in memory at once but its first ones do
    (:func:`fitting_steps`), ``capacity.max_steps`` lowered to the longest doubling that does. The
    lengths such a run goes through are the first of ``cfg``'s, so a count found stationary there
    is found so, the same to the last bit, by ``cfg``; one that is not is run again alone with
    ``cfg``. Runs that start at their slow regimes' window (:func:`run_plan`) keep ``cfg``."""
    if runs < 2 or first_length(cfg, name) != int(cfg.pipeline.steps):
        return cfg
    fits = fitting_steps(cfg, runs)
    return cfg if fits is None else replace_at(cfg, "capacity.max_steps", fits)


def pool_spec(cfg: RacsimConf, name: str, counts: int) -> RacsimConf:
    """The spec ``counts`` counts run with in a pool of the processes asked for (``capacity.workers``;
    0: every usable core): :func:`pooled_spec`."""
    return pooled_spec(cfg, name, min(int(cfg.capacity.workers) or auto_workers(), counts))


def workers_at_start(cfg: RacsimConf, name: str, pooled: RacsimConf, counts: int) -> int:
    """Processes to start beside this one before any of ``counts`` counts has run (0: none, the
    first count runs here alone): where a lower bound on a count's seconds (:func:`count_seconds`)
    says the pool saves time (:func:`pool_size`), ``capacity.workers`` - 1, or with 0 as many as
    end the counts soonest (:func:`soonest`), within the counts and the runs that fit in memory."""
    asked = int(cfg.capacity.workers)
    at_once = pool_size(pooled, count_seconds(cfg, name), counts) if counts else 1
    workers = min(at_once - (1 if asked else 0), counts - 1, runs_that_fit(pooled) - 1)
    if not asked:
        workers = soonest(counts, auto_workers(), workers + 1) - 1
    return workers if at_once > 1 and workers >= 1 else 0


def workers_after_first(cfg: RacsimConf, pooled: RacsimConf, first_s: float, left: int) -> int:
    """Processes for the ``left`` counts once the first simulated took ``first_s`` seconds (1: this
    one alone): :func:`pool_size`, with ``capacity.workers`` 0 as many as end them soonest."""
    workers = pool_size(pooled, first_s, left)
    if not int(cfg.capacity.workers):
        workers = soonest(left, auto_workers(), workers)
    return workers
