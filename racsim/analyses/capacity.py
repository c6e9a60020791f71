"""Capacity planning: how many GPUs (or workers) behind a slow channel?

A capacity run repeats the scenario for each count of the chosen channel's
GPUs (``rm.gpus`` of a gpu_rm channel) or workers (a queue channel), through
the ordinary run machinery (:func:`racsim.analyses.bias_study.run_bias_study`: the same pipeline, bias
benchmark and tables as any run, the same seed, so the counts are compared on
common random numbers), and collects per count and corrector: the delay in
optimizer steps (p50/p95) and the sojourn in seconds (p95), measured after
``pipeline.warmup_steps`` (the steady state), the slack eta, the exact and Monte-Carlo bias, the
wall-clock per step, the pool's utilisation and its cost. It then recommends
the fewest units for which the chosen corrector meets the targets
(``capacity.max_bias``, ``capacity.max_bias_vs_naive``, ``capacity.max_step_s``, and the
channel's service targets ``capacity.max_dropped``, ``capacity.max_sojourn_p95_s``,
``capacity.max_sojourn_p99_s``, ``capacity.max_delay_p95_steps``), and names the target that
binds: the one the next smaller count fails. The counts the answer depends on (the fewest that
passes and the one below) are then decided with enough evidence: a rare-event figure whose
interval straddles its target (or reads [0, 0] under slow regimes) is rebuilt on independent
replications until it lies on one side, within a budget (racsim/analyses/decide.py,
:func:`decide_count`).

Why one run that loops, rather than a Hydra multirun: the answer is a
comparison across counts (a curve, a minimum), which a single process can
compute, plot and summarise in one folder without a second "gather" step, and
a bisection needs each answer before choosing the next count, which a
multirun's fixed job list cannot do. A plain Hydra sweep still works for
anyone who wants one folder per count (``racsim -m scenario=...
pipeline.channels.judge.rm.gpus=1,2,4,8 capacity.enabled=false``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import pandas as pd

from racsim.pipeline import steady
from racsim.pipeline.background import background_work
from racsim.analyses import decide
from racsim.analyses.bias_study import Known, corrector_names, prefetch_trajectories, run_bias_study
from racsim.analyses.grid import expand
from racsim.config.schema import CAPACITY_TARGETS, RacsimConf, warmup_steps
from racsim.config.spec import replace_at
from racsim.config.validate import (check_limits, faults_on, longest_steps, memory_room, run_estimate, runs_that_fit,
                                    search_top, validate)
from racsim.io import auto_workers, side_by_side
from racsim.config.validate.pipeline import nominal_step
from racsim.errors import ConfigError
from racsim.learner.bias import bootstrap_counts, group_sums
from racsim.learner.correctors import BLOCKING
from racsim.pipeline.draws import (draw, fault_timeline, mean_step_seconds, mean_work_seconds,
                                   stationary_slowdown, work_seconds)
from racsim.pipeline.faults import availability, fault_spec, read_schedule
from racsim.pipeline.engines import simulate
from racsim.pipeline.schedule import DROPPED, INJECTED, UNROUTED
from racsim.pipeline.simpy_engine import run_simpy
from racsim.pipeline.stats import busy_seconds, channel_stats, queue_workers, useful_share
from racsim.progress import Progress
from racsim.seeds import rng_for


@dataclass
class CapacityResult:
    """One row per (count, corrector) in ``curve``; the recommendation and the run
    at the recommended count (for its timeline)."""

    curve: pd.DataFrame
    channel: str
    unit: str  # "GPUs" or "workers"
    key: str  # the config key varied
    recommended: Optional[int]
    per_corrector: pd.DataFrame  # fewest units meeting the targets, for every corrector
    targets: Dict[str, Any]
    best: Any = None  # RunResult at the recommended (or largest simulated) count; None if none was simulated
    best_count: Optional[int] = None
    timings: Dict[str, float] = field(default_factory=dict)
    speed: Dict[str, float] = field(default_factory=dict)
    autoscale: Optional[pd.DataFrame] = None  # the channel's autoscaled pool vs the evaluated fixed pools
    loads: Dict[int, Dict[str, float]] = field(default_factory=dict)  # per count: load, work_per_s, availability, load_sampled
    level: float = 0.95  # capacity.confidence: the level of every interval
    max_load: float = 0.95  # capacity.max_load: overloaded from this offered load on
    listed: List[int] = field(default_factory=list)  # the counts asked for (capacity.counts, an autoscale's bounds)
    searched: List[int] = field(default_factory=list)  # the unlisted counts tried for the fewest (between_counts, counts_above)
    top: Optional[int] = None  # the largest count the search may try (search_top)
    binding: List[str] = field(default_factory=list)  # what the count below the recommended one fails (binding)
    sensitivity: Optional[pd.DataFrame] = None  # the answer with each guessed input moved (racsim/analyses/sensitivity.py)
    notes: List[str] = field(default_factory=list)  # what the search changed to run (steps_that_fit), counts undecided
    replicated_steps: int = 0  # steps the replications deciding the answer simulated (capacity.decide_steps)


def channel_of(cfg: RacsimConf) -> str:
    """The channel to size: ``capacity.channel``, or the only sizable one."""
    if cfg.capacity.channel is not None:
        return str(cfg.capacity.channel)
    chans = cfg.pipeline.channels
    return next(n for n, ch in chans.items() if ch.kind == "gpu_rm" or ch.workers is not None)


def _is_gpu(cfg: RacsimConf, name: str) -> bool:
    return cfg.pipeline.channels[name].kind == "gpu_rm"


def count_key(cfg: RacsimConf, name: str) -> str:
    return f"pipeline.channels.{name}.rm.gpus" if _is_gpu(cfg, name) else f"pipeline.channels.{name}.workers"


def unit_price(cfg: RacsimConf, name: str) -> float:
    """USD per unit-hour: the GPU's price, or ``capacity.price_per_unit_hour`` (0 when unset)."""
    if _is_gpu(cfg, name):
        return float(cfg.pipeline.channels[name].rm.gpu.price_per_hour)
    p = cfg.capacity.price_per_unit_hour
    return 0.0 if p is None else float(p)


def with_count(cfg: RacsimConf, key: str, n: int) -> RacsimConf:
    """A new spec: ``key`` (:func:`count_key`) set to ``n``, capacity planning off (one ordinary run)."""
    return replace_at(replace_at(cfg, "capacity.enabled", False), key, int(n))


def units_per_server(cfg: RacsimConf, name: str) -> int:
    """GPUs per replica (tp) of a gpu_rm channel, 1 worker per server of a queue channel."""
    return int(cfg.pipeline.channels[name].rm.tp) if _is_gpu(cfg, name) else 1


def fixed_pool(cfg: RacsimConf, name: str) -> RacsimConf:
    """A new spec: ``name``'s autoscale rule removed (a fixed pool of its count)."""
    return replace_at(cfg, f"pipeline.channels.{name}.autoscale", None)


def autoscale_whatif(cfg: RacsimConf, name: str, fixed_rows: Dict[int, List[dict]], auto_rows: List[dict], auto,
                     targets: dict) -> pd.DataFrame:
    """Autoscaled pool against every fixed pool the search evaluated (whole servers; the rule's
    min and max are always among them): per pool and corrector, servers (mean billed, autoscaled),
    bias, wall-clock per step, cost per 1000 steps and whether the row meets the capacity targets.
    ``fixed_rows``: capacity rows by unit count; ``auto_rows``, ``auto``: the autoscaled run's rows
    and result. The autoscaled pool's cost is measured on the asynchronous pipeline, so it is not
    given for blocking correctors."""
    units = units_per_server(cfg, name)
    out = []
    for n in sorted(c for c in fixed_rows if c % units == 0):
        out += [{"pool": f"fixed {n // units}", "servers": float(n // units), **_whatif(r, targets)}
                for r in fixed_rows[n]]
    ch = auto.channels[auto.channels.channel == name].iloc[0]
    for r in auto_rows:
        r["cost_per_1000_steps"] = np.nan if r["corrector"] in BLOCKING else float(ch["cost_per_1000_steps"])
        out.append({"pool": "autoscaled", "servers": float(ch["servers_billed_mean"]), **_whatif(r, targets)})
    return pd.DataFrame(out)


def _whatif(r: dict, targets: dict) -> dict:
    keys = ("corrector", "status", *(k for fig in TARGET_FIGURES.values() for k in (fig, f"{fig}_hi")),
            "cost_per_1000_steps")
    return {**{k: r.get(k, np.nan) for k in keys}, "meets": feasible(r, targets), "fails": fails_text(r, targets)}


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


def regime_scales(cfg: RacsimConf, name: str) -> Dict[str, float]:
    """The time scales of channel ``name``'s slow regimes, in optimizer steps of the scenario's
    nominal step (its phases' means, s), one key per regime it has:

    * ``faults`` (random outages): one server's cycle, (mtbf_s / tp + mttr_s) / s. The pool's up
      count is a sum of independent alternating up/repair processes, each with autocorrelation
      exp(-t (1/mtbf + 1/mttr)), so the pool moves on one server's scale whatever its size (its
      failures, n times as frequent, overlap within it); the cycle is at least 4 of those
      relaxation times mtbf mttr / (mtbf + mttr) (AM-GM), so batches of one cycle are nearly
      independent.
    * ``bursts`` (the degrade/recover chain): a normal and a degraded spell, 1/p_degrade +
      1/p_recover steps (the chain's correlation time 1/(p_degrade + p_recover) is at most a
      quarter of it).
    * ``horizon`` (with outages or bursts, and a drop horizon ``max_delay``): :data:`HORIZONS` drop
      horizons. A result is known dropped only max_delay steps after it is sent (until then it is
      pending, out of the dropped share), and the backlog that drops it builds from the run's empty
      start over several horizons: with a window of a few horizons the dropped share reads low
      whatever the regime's own cycle (the bursty judge, 1/0.05 + 1/0.2 = 25 steps, max_delay 20:
      0.0% dropped at 6 GPUs in 75 steps with a 25-step warm-up, 0.3-0.4% in 300, 0.6% in 1200
      with a 100-step warm-up).
    * ``autoscale``: a scale-up and back down, (for_s + startup_s + idle_s) / s.
    * ``schedule`` (known outages, once): its span, up to the last outage's end, / s."""
    ch, step = cfg.pipeline.channels[name], nominal_step(cfg.pipeline)
    out = {}
    if ch.faults.mtbf_s is not None:
        spec = fault_spec(ch.faults, units_per_server(cfg, name))
        out["faults"] = (spec.mtbf + spec.mttr) / step
    if ch.faults.schedule is not None:
        key = f"pipeline.channels.{name}.faults.schedule"
        units = units_per_server(cfg, name)
        pool = max([int(ch.rm.gpus if _is_gpu(cfg, name) else ch.workers or 0), *cfg.capacity.counts]) // units
        ends = [u.max() for _, u in read_schedule(ch.faults.schedule, key, pool) if u.size]
        out["schedule"] = float(max(ends, default=0.0)) / step
    if ch.degraded_factor != 1 and ch.p_degrade > 0:
        out["bursts"] = 1.0 / ch.p_degrade + 1.0 / ch.p_recover
    if {"faults", "bursts"} & set(out) and ch.max_delay is not None:  # the drop horizon under a random regime
        out["horizon"] = float(HORIZONS * ch.max_delay)
    if ch.autoscale is not None:
        a = ch.autoscale
        out["autoscale"] = (a.for_s + a.startup_s + a.idle_s) / step
    return out


# Drop horizons (max_delay steps) a cycle of a random regime holds at least (regime_scales' horizon).
HORIZONS = 5


def slowest_regime(cfg: RacsimConf, name: str) -> Tuple[str, int]:
    """The slowest recurring regime (:func:`regime_scales` but a schedule's span) and its cycle
    in whole steps (a batch of the intervals' batch means holds :data:`BATCH_CYCLES` of them);
    ('', 0) when there is none or ``capacity.regime_cycles`` is 0."""
    scales = {k: v for k, v in regime_scales(cfg, name).items() if k != "schedule"}
    if not scales or not cfg.capacity.regime_cycles:
        return "", 0
    kind = max(scales, key=scales.get)
    return kind, int(np.ceil(scales[kind]))


def regime_cycle(cfg: RacsimConf, name: str) -> int:
    """The cycle of :func:`slowest_regime`, in whole steps (0: none)."""
    return slowest_regime(cfg, name)[1]


def regime_warmup(cfg: RacsimConf, name: str) -> Optional[int]:
    """The warm-up of a channel whose slow regimes all start in their stationary law (random
    outages, the burst chain: racsim.pipeline.faults, racsim.pipeline.draws.regime_path): one
    cycle of the slowest (:func:`regime_cycle`), in which the queue forgets its empty start.
    None (MSER-5 decides) without slow regimes, with ``capacity.regime_cycles`` 0, or with an
    autoscaler or a schedule of outages, whose start is not their long run. MSER-5 on a series
    that slow regimes move takes an early excursion for a transient and cuts it: the dropped share
    read low (a test's queue under outages: 0.0327 against 0.0354 with one cycle cut, sd 0.0087
    against 0.0080 over 60 seeds; tests/test_capacity_regime.py)."""
    kinds = regime_scales(cfg, name)
    if not kinds or not cfg.capacity.regime_cycles or set(kinds) - {"faults", "bursts", "horizon"}:
        return None
    return regime_cycle(cfg, name)


def regime_window(cfg: RacsimConf, name: str) -> int:
    """Steps each trial's measured window needs (0: no slow regime): together the trials'
    windows hold ``capacity.regime_cycles`` cycles (:func:`regime_cycle`), each trial's at least
    one, max(c, ceil(K c / trials)); and a schedule's span, all of it."""
    if not cfg.capacity.regime_cycles:
        return 0
    c = regime_cycle(cfg, name)
    span = regime_scales(cfg, name).get("schedule", 0.0)
    return int(max(c, np.ceil(cfg.capacity.regime_cycles * c / int(cfg.learner.trials)), np.ceil(span)))


def run_plan(cfg: RacsimConf, name: str) -> Tuple[int, Optional[int], int]:
    """How :func:`sized_run` starts: (the window its slow regimes need after the warm-up, 0
    without; the warm-up they fix, None where MSER-5 or ``pipeline.warmup_steps`` decides; the
    steps it simulates first: ``pipeline.steps``, or with ``capacity.run_length=auto`` the
    regimes' window after their warm-up where longer, up to ``capacity.max_steps``)."""
    cap, p = cfg.capacity, cfg.pipeline
    if cap.run_length != "auto":
        return 0, None, int(p.steps)
    need = regime_window(cfg, name)
    cut = regime_warmup(cfg, name) if p.warmup_steps is None else None
    longer = need + (cut or 0)
    return need, cut, min(longer, int(cap.max_steps)) if longer > int(p.steps) else int(p.steps)


def first_length(cfg: RacsimConf, name: str) -> int:
    """The steps :func:`sized_run` simulates first (:func:`run_plan`)."""
    return run_plan(cfg, name)[2]


@dataclass
class Settled:
    """One count's run at the length that shows its steady state: the run, the verdict on its
    window, its length, and the seconds and requests of every pipeline simulated on the way."""

    res: Any
    verdict: steady.Verdict
    steps: int
    pipeline_s: float
    requests: int


# Cycles of the slowest regime a batch of the intervals' batch means holds at least: adjacent
# batches of a trial share a backlog across their boundary; two cycles keep that correlation small.
BATCH_CYCLES = 2


@dataclass
class Sized:
    """One count's asynchronous pipeline at the length that shows its steady state
    (:func:`sized_run`): its spec at that length, draws, schedule, verdict, and the seconds and
    requests of every pipeline simulated on the way."""

    cfg: RacsimConf
    draws: Any
    sched: Any
    verdict: steady.Verdict
    steps: int
    pipeline_s: float
    requests: int


def sized_run(cfg: RacsimConf, name: str, tell=None) -> Sized:
    """Simulate one count's asynchronous pipeline at a length that shows its steady state.
    ``capacity.run_length=auto``: from ``pipeline.steps``, doubled up to ``capacity.max_steps``
    until the series of requests in the channel at each step's start (mean over trials) is
    stationary after its warm-up (MSER-5 unless ``pipeline.warmup_steps`` is set;
    :func:`racsim.pipeline.steady.verdict`); ``fixed``: the length and warm-up as given. With
    slow regimes (:func:`regime_window`) the run starts at the window they need and its warm-up
    (:func:`regime_warmup`: one cycle where the regimes start stationary, else MSER-5), up to
    ``capacity.max_steps`` and within the ``limits``, doubles until the window after the warm-up
    holds it too, and is judged by the trials' slopes (:func:`racsim.pipeline.steady.trials_verdict`).
    ``tell(note)``: called before each doubling (a long run says why it goes on)."""
    cap, p = cfg.capacity, cfg.pipeline
    auto = cap.run_length == "auto"
    need, cut, steps = run_plan(cfg, name)
    spent, requests = 0.0, 0
    if steps != int(p.steps):  # the regimes' window after their warm-up
        check_limits(replace_at(cfg, "pipeline.steps", steps))  # refused before it runs when too big
    while True:
        c = replace_at(cfg, "pipeline.steps", steps)
        if cut is not None:
            given = min(cut, steps // 2)  # a run capacity.max_steps keeps shorter than the cycle
        else:
            given = None if auto and p.warmup_steps is None else warmup_steps(c.pipeline)
        t0 = time.perf_counter()
        draws = draw(c.pipeline, int(c.learner.trials), rng_for(c.seed, "pipeline"))  # as the bias study draws
        sched = simulate(c.pipeline, int(c.learner.trials), None, draws=draws)
        spent += time.perf_counter() - t0
        requests += requests_per_schedule(c)
        series = steady.in_system(sched, sched.channel_names.index(name))
        v = steady.trials_verdict(series, given) if need else steady.verdict(series, given)
        if (v.stationary and steps - v.warmup >= need) or not auto:
            return Sized(c, draws, sched, v, steps, spent, requests)
        if steps * 2 > cap.max_steps:  # no longer run allowed: a window short of the regimes' is no steady state
            if v.stationary:
                v = steady.Verdict(v.warmup, False, f"{steps - v.warmup} steps after the warm-up, short of the "
                                                    f"{need} its slow regimes need (capacity.max_steps = {cap.max_steps})")
            return Sized(c, draws, sched, v, steps, spent, requests)
        if tell is not None:
            tell(f"not stationary at {steps} steps ({v.reason}), running {2 * steps}" if not v.stationary else
                 f"{steps - v.warmup} steps after the warm-up at {steps} steps, short of the {need} the slow "
                 f"regimes need, running {2 * steps}")
        steps *= 2


def settle(cfg: RacsimConf, name: str, tell=None) -> Settled:
    """Run one count at a length that shows its steady state (:func:`sized_run`; ``tell``: its
    note before each doubling); the bias study then reuses the simulated asynchronous schedule."""
    prefetch_trajectories(cfg, first_length(cfg, name))  # the bias study's, at the run's first length
    run = sized_run(cfg, name, tell)
    c = replace_at(run.cfg, "pipeline.warmup_steps", run.verdict.warmup)
    res = run_bias_study(expand(c), known=Known(run.draws, run.sched))
    requests = run.requests
    if any(n in BLOCKING for n in corrector_names(c)):  # the study simulated the blocking pipeline
        requests += requests_per_schedule(c)
    return Settled(res, run.verdict, run.steps, run.pipeline_s + float(res.timings.get("pipeline_s", 0.0)), requests)


@dataclass
class Units:
    """The independent units a count's intervals resample, over the window from its warm-up:
    trials, or with a slow regime (:func:`regime_cycle`) batches of at least :data:`BATCH_CYCLES`
    cycles, as many as each trial's window holds (one, the whole window, when it holds fewer).
    ``of``: (trials, window steps) each step's unit (:func:`batch_units`); ``per``: batches a
    trial; ``counts``: (resamples, units) the bootstrap's counts."""

    of: np.ndarray
    per: int
    counts: np.ndarray

    def sums(self, values: np.ndarray) -> np.ndarray:
        """(units, ...) ``values`` (trials, window steps, ...) summed over each unit's steps."""
        n = self.counts.shape[1]
        flat = values.reshape(self.of.size, -1)
        return group_sums(self.of.reshape(-1, 1), flat, n).reshape((n, *values.shape[2:]))

    def sizes(self) -> np.ndarray:
        """(units,) the steps in each unit."""
        return np.bincount(self.of.ravel(), minlength=self.counts.shape[1]).astype(np.float64)

    def means(self, values: np.ndarray) -> np.ndarray:
        """(resamples, ...) bootstrap replicates of the mean over steps of ``values`` (trials, window steps, ...)."""
        size = self.counts @ self.sizes()
        s = np.tensordot(self.counts, self.sums(values), axes=1)
        return s / size.reshape((-1,) + (1,) * (s.ndim - 1))


def interval_units(cfg: RacsimConf, name: str, n_trials: int, warmup: int, steps: int) -> Units:
    """Channel ``name``'s interval units (:class:`Units`) for a ``steps``-step run warm from ``warmup``."""
    cap = cfg.capacity
    cycle = regime_cycle(cfg, name) * BATCH_CYCLES
    per = max(1, (steps - warmup) // cycle) if cycle else 1
    stream = "capacity_intervals" if per == 1 else "capacity_batches"
    counts = bootstrap_counts(n_trials * per, int(cap.resamples), rng_for(cfg.seed, stream))
    return Units(batch_units(n_trials, steps - warmup, per), per, counts)


def _rows(cfg: RacsimConf, name: str, n: int, run: Settled, load: dict) -> List[dict]:
    """The capacity curve's rows for one count, from its settled run's tables, each figure with
    its interval (``capacity.confidence``; the trials resampled ``capacity.resamples`` times)."""
    cap, res, v, steps = cfg.capacity, run.res, run.verdict, run.steps
    ch = res.channels[res.channels.channel == name].iloc[0]
    price = unit_price(cfg, name)
    naive = res.results[res.results.corrector == "naive"].iloc[0]
    sched = res.schedules["async"]
    units = interval_units(cfg, name, sched.n_trials, v.warmup, steps)
    lvl = float(cap.confidence)
    chan = channel_intervals(sched, sched.channel_names.index(name), ch["workers"], v.warmup, units, lvl)
    bias = bias_intervals(res.bias, units, lvl)
    useful = useful_share(sched, sched.channel_names.index(name), _workers(ch["workers"]),
                          sched.step_start[:, v.warmup], sched.step_start[:, -1])
    out = []
    for _, r in res.results.iterrows():
        step_s = float(r["step_s"])
        timed = res.schedules.get("blocking") if r["corrector"] in BLOCKING else sched
        step_lo, step_hi = steady.percentile_interval(
            units.means(step_seconds(timed, v.warmup)), lvl) if timed is not None else (step_s, step_s)
        row = {
            "count": int(n),
            "corrector": r["corrector"],
            "load": load["load"],
            "load_sampled": load["load_sampled"],
            "headroom": 1.0 - load["load"],
            "steps": int(steps),
            "warmup_steps": int(v.warmup),
            "stationary": bool(v.stationary),
            "bias_exact": float(r["bias_exact"]),
            "bias_exact_lo": bias[r["corrector"]][0], "bias_exact_hi": bias[r["corrector"]][1],
            "bias_mc": float(r["bias_mc"]),
            "mc_se": float(r["mc_se"]),
            "bias_vs_naive": float(r["bias_exact"]) / float(naive["bias_exact"]) if naive["bias_exact"] > 0 else np.nan,
            "bias_vs_naive_lo": bias[r["corrector"]][2], "bias_vs_naive_hi": bias[r["corrector"]][3],
            "step_s": step_s, "step_s_lo": step_lo, "step_s_hi": step_hi,
            "eta": float(r.get(f"eta_{name}", np.nan)),
            "delay_p50_steps": float(ch["delay_p50_steps"]),
            "delay_p95_steps": float(ch["delay_p95_steps"]),
            "dropped_frac": float(ch["dropped"]) / float(ch["emitted"]),
            "pending_frac": float(ch["pending"]) / float(ch["emitted"]),
            "wait_p95_s": float(ch["wait_p95_s"]),
            "sojourn_p95_s": float(ch["sojourn_p95_s"]),
            "sojourn_p99_s": float(ch["sojourn_p99_s"]),
            "utilisation": float(ch["utilisation"]),  # busy: server-seconds holding work
            "replications": 1,  # independent runs the rare-event figures rest on (decide_count)
            **chan,
            # useful: the share of server-seconds whose work delivered results, from the run (<= busy);
            # available: the long-run share up the load assumes
            "useful": useful,
            "available": load["availability"],
            "cost_per_hour": n * price,
            "cost_per_1000_steps": n * price * step_s * 1000.0 / 3600.0,
        }
        if "background_jobs" in ch:  # a shared channel: its other tenants' part of the load, their sojourn
            row.update(load_background=load["load_background"], background_jobs=int(ch["background_jobs"]),
                       background_sojourn_p95_s=float(ch["background_sojourn_p95_s"]))
        if "availability" in ch:  # a channel with faults: its replicas' uptime, results lost to failures
            row.update(availability=float(ch["availability"]),
                       lost_to_failure_frac=float(ch["lost_to_failure"]) / float(ch["emitted"]))
        row["status"] = status(row, cfg)
        out.append(row)
    return out


# Every figure of a simulated count: the curve has these columns even when no count was simulated.
CURVE_COLUMNS = ("steps", "warmup_steps", "bias_exact", "bias_exact_lo", "bias_exact_hi", "bias_mc", "mc_se",
                 "bias_vs_naive", "bias_vs_naive_lo", "bias_vs_naive_hi", "step_s", "step_s_lo", "step_s_hi", "eta",
                 "delay_p50_steps", "delay_p95_steps", "dropped_frac", "pending_frac", "wait_p95_s", "sojourn_p95_s",
                 "sojourn_p99_s", "utilisation", "replications", "useful", "available", "cost_per_1000_steps")


def overloaded_rows(cfg: RacsimConf, name: str, n: int, load: dict) -> List[dict]:
    """The rows of a count whose offered load reaches ``capacity.max_load``: not simulated
    (its queue has no steady state), so every figure but the load and the price is NaN."""
    price = unit_price(cfg, name)
    shared = {"load_background": load["load_background"]} if cfg.pipeline.channels[name].background else {}
    return [{"count": int(n), "corrector": c, "load": load["load"], "load_sampled": load["load_sampled"], **shared,
             "headroom": 1.0 - load["load"],
             "stationary": False, "replications": 0, "cost_per_hour": n * price,
             "status": status({"load": load["load"]}, cfg)}
            for c in corrector_names(cfg)]


def status(row: dict, cfg: RacsimConf) -> str:
    """'ok', or why the count's figures are not steady-state ones."""
    if row["load"] >= cfg.capacity.max_load:
        return f"overloaded: load {row['load']:.3g} >= capacity.max_load {cfg.capacity.max_load:g}"
    if not row["stationary"]:
        return f"not stationary at {row['steps']} steps (capacity.max_steps {cfg.capacity.max_steps})"
    return "ok"


def step_seconds(sched, warmup: int) -> np.ndarray:
    """(trials, steps - warmup) wall-clock seconds of each step after the warm-up."""
    return np.diff(sched.step_start[:, warmup:], axis=1)


def _workers(workers) -> Optional[int]:
    """A channel table's ``workers`` cell as :func:`busy_seconds` takes it (None: no worker limit)."""
    return None if workers is None or pd.isna(workers) else int(workers)


def batch_units(n_trials: int, steps: int, batches: int) -> np.ndarray:
    """(n_trials, steps) the batch-means unit of each (trial, step) of a window: trial t's
    ``batches`` consecutive equal batches are units t * batches .. t * batches + batches - 1 (the
    first steps mod ``batches`` go to the first batch)."""
    size = steps // batches
    b = np.maximum(np.arange(steps) - steps % batches, 0) // size
    return np.arange(n_trials)[:, None] * batches + b[None, :]


def channel_intervals(sched, k: int, workers, w: int, units: Units, level: float) -> Dict[str, float]:
    """Intervals of channel ``k``'s figures measured from step ``w`` on, the :class:`Units`
    resampled: delay p50/p95 (steps), sojourn p95/p99 (s), dropped share and utilisation. A
    unit is a trial or one of its window's batches (:func:`batch_units`; batch means, each batch
    at least one slow regime's cycle, so that the units are nearly independent); a request
    belongs to the unit of its step, and the utilisation resamples whole trials (each weighing
    its batches' counts)."""
    T, counts, unit = sched.n_trials, units.counts, units.of
    trial = np.broadcast_to(unit[:, :, None], sched.status[:, w:, :, k].shape)
    st = sched.status[:, w:, :, k]
    ok = st == INJECTED
    delay, d_trial = sched.delay[:, w:, :, k][ok], trial[ok]
    sent = st != UNROUTED
    soj = sched.completion[:, w:, :, k] - sched.submit_time[:, w:, :, k]
    back = np.isfinite(soj) & sent
    if sched.cancelled is not None:
        back &= ~sched.cancelled[:, w:, :, k]
    out = {}
    for q in (50, 95):
        out[f"delay_p{q}_steps_lo"], out[f"delay_p{q}_steps_hi"] = steady.quantile_interval(
            delay, d_trial, q / 100, counts, level)
    soj, soj_trial = soj[back], trial[back]
    for q in (95, 99):
        out[f"sojourn_p{q}_s_lo"], out[f"sojourn_p{q}_s_hi"] = steady.quantile_interval(
            soj, soj_trial, q / 100, counts, level)
    out["dropped_frac_lo"], out["dropped_frac_hi"] = steady.ratio_interval(
        units.sums((st == DROPPED).sum(axis=2)), units.sums(sent.sum(axis=2)), counts, level)
    t0, t1 = sched.step_start[:, w], sched.step_start[:, -1]
    busy = busy_seconds(sched, k, _workers(workers), t0, t1)
    by_trial = counts.reshape(counts.shape[0], T, units.per).sum(axis=2) / units.per
    out["utilisation_lo"], out["utilisation_hi"] = (steady.percentile_interval(
        steady.boot_mean(busy[0] / (busy[1] * (t1 - t0)), by_trial), level) if busy is not None else (np.nan, np.nan))
    bg = (sched.background or {}).get(sched.channel_names[k])
    if bg is not None:  # other tenants' requests (a shared channel), each in the unit of its arrival's step
        out["background_sojourn_p95_s_lo"], out["background_sojourn_p95_s_hi"] = steady.quantile_interval(
            *background_sojourns(sched.step_start, bg, w, unit), 0.95, counts, level)
    return out


def background_sojourns(step_start: np.ndarray, bg: Dict[str, np.ndarray], w: int,
                        unit: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(sojourn s, unit) of the other tenants' requests that arrived in the window from step ``w``'s
    start to the run's end (as the channel table counts them), each in ``unit[lane, step - w]`` of
    the step it arrived in."""
    lane, arr = bg["lane"], bg["arrival"]
    inside = (arr >= step_start[lane, w]) & (arr <= step_start[lane, -1])
    lane, arr = lane[inside], arr[inside]
    steps = step_start.shape[1] - 1
    step = np.empty(lane.size, dtype=np.int64)
    for i in np.unique(lane):
        m = lane == i
        step[m] = np.searchsorted(step_start[i], arr[m], side="right") - 1
    return (bg["end"] - bg["arrival"])[inside], unit[lane, np.minimum(step, steps - 1) - w]


def bias_intervals(run, units: Units, level: float) -> Dict[str, tuple]:
    """Per corrector: the interval of its exact steady-state bias, eq. (2)'s norm at its mean
    correction weights (the updates' means ``BiasRun.step_weight`` over the :class:`Units`), and
    of its ratio to naive's (paired: one resample for both), the weights' bootstrap-t replicates
    (:func:`~racsim.pipeline.steady.studentized_means`) pushed through the norm. A window with
    fewer outages reads both fewer weights missing and a narrower spread: percentile intervals
    of the resampled bias missed the long run from below there."""
    sizes = units.sizes()
    boot = {name: np.linalg.norm(run.channel_exact[0] + steady.studentized_means(units.sums(sw), sizes, units.counts)
                                 @ run.channel_exact[1:] - run.target, axis=1) for name, sw in run.step_weight.items()}
    base = boot.get("naive")
    out = {}
    for name, b in boot.items():
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = b / base if base is not None else np.full_like(b, np.nan)
        out[name] = (*steady.percentile_interval(b, level), *steady.percentile_interval(ratio, level))
    return out


# Each target (capacity.<key>) and the figure whose interval's upper end must meet it.
TARGET_FIGURES = {"max_bias": "bias_exact", "max_bias_vs_naive": "bias_vs_naive", "max_step_s": "step_s",
                  "max_dropped": "dropped_frac", "max_sojourn_p95_s": "sojourn_p95_s",
                  "max_sojourn_p99_s": "sojourn_p99_s", "max_delay_p95_steps": "delay_p95_steps",
                  "max_background_sojourn_p95_s": "background_sojourn_p95_s"}


def failed(row: Any, targets: Dict[str, Any]) -> List[str]:
    """What one (count, corrector) row fails: "load" when it is overloaded and "stationarity" when
    it is not stationary (no steady-state figure, so no target is read), else each target that is
    set whose figure's interval's upper end exceeds it, or is undefined (NaN: not measured)."""
    st = row.get("status", "ok")
    if st != "ok":
        return ["load" if st.startswith("overloaded") else "stationarity"]
    return [k for k, fig in TARGET_FIGURES.items()
            if targets.get(k) is not None and not row[f"{fig}_hi"] <= targets[k]]


def feasible(row: Any, targets: Dict[str, Any]) -> bool:
    """Does one (count, corrector) row meet every target that is set? (:func:`failed` is empty.)"""
    return not failed(row, targets)


def fails_text(row: Any, targets: Dict[str, Any]) -> str:
    """:func:`failed` as the curve's ``fails`` column writes it ("" when the row meets the targets)."""
    return ", ".join(failed(row, targets))


def binding(curve: pd.DataFrame, corrector: str, n: Optional[int]) -> List[str]:
    """What makes ``n`` the fewest count for ``corrector``: the ``fails`` of the next smaller
    evaluated count (a target's key, "load" or "stationarity"); empty when ``n`` is None or the
    smallest count evaluated."""
    sub = curve[(curve.corrector == corrector) & (curve["count"] < n)] if n is not None else curve.iloc[:0]
    if sub.empty:
        return []
    return [f for f in sub.loc[sub["count"].idxmax(), "fails"].split(", ") if f]


def targets_of(cfg: RacsimConf) -> Dict[str, Any]:
    """The capacity targets a count must meet (``capacity.<name>`` of :data:`CAPACITY_TARGETS`; null: not one)."""
    return {k: getattr(cfg.capacity, k) for k in CAPACITY_TARGETS}


def chosen_row(rows: List[dict], chosen: str) -> dict:
    """A count's curve row of the ``chosen`` corrector (``capacity.corrector``)."""
    return next(r for r in rows if r["corrector"] == chosen)


def meets(rows: List[dict], chosen: str, targets: Dict[str, Any]) -> bool:
    """Does a count (its curve rows) meet the targets with the ``chosen`` corrector?"""
    return feasible(chosen_row(rows, chosen), targets)


def count_note(rows: List[dict], chosen: str, targets: Dict[str, Any]) -> str:
    """A count's progress note: its load, run length and what it fails (or that it meets the targets)."""
    r = chosen_row(rows, chosen)
    fails, steps = fails_text(r, targets), f"{r['steps']} steps, " if "steps" in r else ""
    return f"load {r['load']:.3g}, {steps}" + (f"fails {fails}" if fails else "meets the targets")


def count_rows(cfg: RacsimConf, name: str, key: str, n: int, load: dict,
               tell=None) -> Tuple[Optional[Settled], List[dict]]:
    """One count's settled run and curve rows; an overloaded count (its ``load`` reaches
    ``capacity.max_load``) is not simulated: no run, and its rows of NaN (:func:`overloaded_rows`).
    ``tell``: as :func:`settle`'s."""
    if load["load"] >= cfg.capacity.max_load:
        return None, overloaded_rows(cfg, name, n, load)
    run = settle(with_count(cfg, key, n), name, tell)
    return run, _rows(cfg, name, n, run, load)


def replicate_figures(sched, cfg: RacsimConf, name: str, warmup: int) -> decide.Replicate:
    """One replication's rare-event figures of channel ``name`` (:data:`~racsim.analyses.decide.RARE_TARGETS`),
    measured from step ``warmup`` as the channel table measures them (racsim.pipeline.stats.channel_stats):
    results dropped and sent, delay p95 (steps), sojourn p95 and p99 (s)."""
    chans = channel_stats(sched, queue_workers(cfg.pipeline.channels), warmup)
    row = chans[chans.channel == name].iloc[0]
    return {"dropped": float(row["dropped"]), "sent": float(row["emitted"]),
            **{fig: float(row[fig]) for fig in decide.RARE_TARGETS.values() if fig != "dropped_frac"}}


def judged_only(cfg: RacsimConf, chosen: str) -> RacsimConf:
    """The spec with only the correctors a count's verdict reads: ``chosen`` and naive (the
    reference of its bias ratio). Each corrector's figures come from the same schedule on their
    own, so the verdict is unchanged, without the other correctors' bias or the blocking pipeline
    that wait_for_slow alone needs (about a third of a count's time on the judge)."""
    return replace_at(cfg, "corrector.names", [n for n in corrector_names(cfg) if n in ("naive", chosen)])


def replicate_count(cfg: RacsimConf, name: str, key: str, n: int, steps: int, warmup: int, r: int,
                    bias: bool = False) -> decide.Replicate:
    """Replication ``r`` (>= 1) of count ``n``: its asynchronous pipeline alone, at the settled run's
    ``steps`` and ``warmup``, drawn from the stream ``capacity_replication`` split by ``r``
    (racsim.seeds: independent of the settled run's ``pipeline`` stream, and the same for every count,
    so that counts are compared on common random numbers replication by replication); with ``bias``,
    the bias study on its schedule too, for ``capacity.corrector`` and naive (:func:`judged_only`)."""
    c = replace_at(with_count(cfg, key, n), "pipeline.steps", int(steps))
    draws = draw(c.pipeline, int(c.learner.trials), rng_for(c.seed, "capacity_replication", r))
    sched = simulate(c.pipeline, int(c.learner.trials), None, draws=draws)
    out = replicate_figures(sched, c, name, warmup)
    if bias:
        chosen = str(cfg.capacity.corrector)
        study = replace_at(judged_only(c, chosen), "pipeline.warmup_steps", int(warmup))
        res = run_bias_study(expand(study), known=Known(draws, sched)).results.set_index("corrector")
        naive = float(res.loc["naive", "bias_exact"])
        out.update(bias_exact=float(res.loc[chosen, "bias_exact"]),
                   bias_vs_naive=float(res.loc[chosen, "bias_exact"]) / naive if naive > 0 else np.nan)
    return out


def decide_count(cfg: RacsimConf, name: str, key: str, n: int, rows: List[dict], res: Any,
                 targets: Dict[str, Any], budget: decide.Budget, tell=None) -> Optional[decide.Decision]:
    """Count ``n``'s rare-event figures decided by independent replications (racsim.analyses.decide):
    None where its row (``capacity.corrector``'s) is not steady, leaves none undecided (a [0, 0]
    reading is undecided only under slow regimes: :func:`regime_scales`) or fails a target that is
    not undecided (no replication can make it pass); else the replications' intervals replace the
    figures, their lo and hi (the channel's in every row of ``n``, ``rows``, in place; the bias
    figures in the chosen corrector's), and ``replications`` says how many they rest on (the
    settled run ``res`` is the first).
    ``tell(note)``: called before each replication."""
    row = chosen_row(rows, targets["corrector"])
    slow = bool(regime_scales(cfg, name))  # outages, bursts...: a run may miss their rare events
    keys = decide.open_targets(row, targets, zero=slow, bias=slow) if row["status"] == "ok" else []
    if not keys or set(failed(row, targets)) - set(keys):  # none open, or it fails another target for sure
        return None
    steps, w = int(row["steps"]), int(row["warmup_steps"])
    bias = bool(set(keys) & set(decide.BIAS_TARGETS))
    first = {**replicate_figures(res.schedules["async"], with_count(cfg, key, n), name, w),
             **{fig: float(row[fig]) for fig in decide.BIAS_TARGETS.values()}}

    def replicate(r: int) -> decide.Replicate:
        if tell is not None:
            tell(f"replication {r + 1}, {', '.join(keys)} undecided")
        return replicate_count(cfg, name, key, n, steps, w, r, bias)

    found = decide.sequential(first, replicate, keys, targets, float(cfg.capacity.confidence),
                              lambda r: budget.affords(steps))
    for r in rows:  # the channel's figures are every corrector's; the bias figures the chosen one's
        for k, (v, lo, hi) in found.found.items():
            fig = decide.FIGURES[k]
            if k in decide.RARE_TARGETS or r is row:
                r[fig], r[f"{fig}_lo"], r[f"{fig}_hi"] = v, lo, hi
        r["replications"] = len(found.reps)
    return found


def answer_counts(rows: Dict[int, List[dict]], chosen: str, targets: Dict[str, Any], step: int, lowest: int,
                  top: int) -> List[int]:
    """The counts the answer depends on: the fewest meeting the targets above which every evaluated
    count does, and the one a server below it (from ``lowest``); where the largest evaluated count
    fails, it and the one a server above it (up to ``top``)."""
    ok = {n: meets(rs, chosen, targets) for n, rs in rows.items()}
    ns = sorted(ok)
    if ok[ns[-1]]:
        f = min(n for n in ns if n > max((n for n in ns if not ok[n]), default=lowest - 1))
        return [f] + ([f - step] if f - step >= lowest else [])
    return [ns[-1]] + ([ns[-1] + step] if ns[-1] + step <= top else [])


FIGURE_WORDS = {"dropped_frac": "dropped", "sojourn_p95_s": "sojourn p95", "sojourn_p99_s": "sojourn p99",
                "delay_p95_steps": "delay p95", "bias_exact": "bias", "bias_vs_naive": "bias x naive's"}


def figure_text(fig: str, v: float) -> str:
    """A rare-event figure as the answer's lines write it: a share in %, seconds, steps, a bias."""
    if fig.startswith("bias"):
        return f"{v:.3g}"
    return f"{v:.2%}" if fig == "dropped_frac" else f"{v:.3g} {'s' if fig.endswith('_s') else 'steps'}"


def undecided_text(n: int, answer: Optional[int], d: decide.Decision, row: dict, targets: Dict[str, Any]) -> str:
    """The line of a count left undecided when the budget ended, from its ``row`` (its figures, on the
    replications where there were any): '7 or 8: dropped at 7 is 0.4% [0.1%, 1.3%] against 1.00% after
    N steps in R replications' (the larger, safe count is the one recommended)."""
    figs = []
    for k in d.open:
        fig = decide.FIGURES[k]
        figs.append(f"{FIGURE_WORDS[fig]} at {n} is {figure_text(fig, row[fig])} [{figure_text(fig, row[f'{fig}_lo'])}, "
                    f"{figure_text(fig, row[f'{fig}_hi'])}] against {figure_text(fig, targets[k])}")
    return (f"{n} or {answer if answer is not None else 'more'}: " + "; ".join(figs)
            + f" after {int(row['steps']) * len(d.reps)} steps in {len(d.reps)} replication"
            + ("s" if len(d.reps) > 1 else "") + " (capacity.decide_steps or capacity.decide_s ran out; the larger "
            "count is recommended)")


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


def _count_worker(cfg: RacsimConf, name: str, key: str, n: int, load: dict):
    """:func:`count_rows` in a pool's process: the settled run, the rows and the seconds they took."""
    t0 = time.perf_counter()
    run, out = count_rows(cfg, name, key, n, load)
    return run, out, time.perf_counter() - t0


def fitting_steps(cfg: RacsimConf, runs: int = 1) -> Optional[int]:
    """Where ``runs`` runs of a capacity search's longest length (``pipeline.steps`` doubled up to
    ``capacity.max_steps``: :func:`~racsim.config.validate.longest_steps`; ``capacity.run_length=auto``)
    do not fit in memory side by side (:func:`~racsim.config.validate.memory_room`) but ``runs`` of its
    first ones do: the longest doubling that fits; else None (they fit, or not even the first do)."""
    cap, steps = cfg.capacity, int(cfg.pipeline.steps)
    if cap.run_length != "auto":
        return None
    room = memory_room(cfg)
    top = fits = longest_steps(steps, int(cap.max_steps))
    while fits >= steps and runs * run_estimate(replace_at(cfg, "capacity.max_steps", fits))["memory"] > room:
        fits //= 2
    return fits if steps <= fits < top else None


def steps_that_fit(cfg: RacsimConf) -> Tuple[RacsimConf, Optional[str]]:
    """A search whose runs may double (``capacity.run_length=auto``) up to a length that does
    not fit in memory (:func:`fitting_steps`), though its first run does: ``capacity.max_steps``
    lowered to the longest doubling that fits, and a note that says so (a count that would need
    a longer run is then found not stationary, never recommended); else ``cfg`` as it is and None
    (:func:`check_limits` refuses a first run too big, naming its knob)."""
    fits = fitting_steps(cfg)
    if fits is None:
        return cfg, None
    need = run_estimate(replace_at(cfg, "capacity.max_steps", 2 * fits))["memory"]
    return replace_at(cfg, "capacity.max_steps", fits), (
        f"capacity.max_steps lowered from {cfg.capacity.max_steps} to {fits}: a run of {2 * fits} steps needs about "
        f"{need / 1e9:.3g} GB, past the {memory_room(cfg) / 1e9:.3g} GB a run may take (limits.memory_gb, and what this "
        f"process can have); raise limits.memory_gb or lower learner.trials to allow longer runs")


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


SEARCH, DECIDING = "capacity search", "deciding replications"  # phases of a search's progress (racsim.progress)


def capacity_phases(cfg: RacsimConf, name: str) -> List[str]:
    """A search's phases, in order: the counts, the replications deciding the counts the answer
    depends on, the autoscaled pool's run, the speed figure."""
    cap = cfg.capacity
    return [SEARCH, *([DECIDING] if cap.decide_steps > 0 else []),
            *(["autoscaled pool"] if cfg.pipeline.channels[name].autoscale is not None else []),
            *(["speed benchmark"] if cap.benchmark and cfg.pipeline.engine == "lanes" else [])]


def search_bound(n: int) -> int:
    """The most of ``n`` counts :func:`fewest_from` evaluates from the first (a gallop, then a bisection)."""
    return 1 if n <= 1 else min(n, 2 * math.ceil(math.log2(n)))


def run_capacity(cfg: RacsimConf, progress: Optional[Progress] = None) -> CapacityResult:
    """Evaluate the counts (all of them, or a bisection) and recommend one. The offered load
    of every count comes first; an overloaded count is never simulated nor recommended.
    ``cfg``: the scenario's spec (racsim.config.spec.scenario), left as it is. ``progress``: the
    phases of :func:`capacity_phases`, each with its total (an upper bound where the search may stop sooner)."""
    progress = progress or Progress.off()
    if not isinstance(cfg, RacsimConf):
        raise TypeError(f"run_capacity takes a RacsimConf (racsim.config.spec.scenario), not {type(cfg).__name__}")
    validate(cfg)
    cfg, lowered = steps_that_fit(cfg)
    check_limits(cfg)  # before the first count: a search too big for the machine is refused naming its knob
    cap = cfg.capacity
    name = channel_of(cfg)
    progress.plan(*capacity_phases(cfg, name))
    scaled = cfg if cfg.pipeline.channels[name].autoscale is not None else None
    if scaled is not None:  # the curve: fixed pools; the autoscaled pool is compared with them below
        cfg = fixed_pool(cfg, name)
    key = count_key(cfg, name)
    counts = sorted(set(int(n) for n in cap.counts))
    if scaled is not None:  # the fixed pools of the rule's min and max are on the curve
        a, units = scaled.pipeline.channels[name].autoscale, units_per_server(scaled, name)
        counts = sorted(set(counts) | {a.min * units, a.max * units})
    targets = targets_of(cfg)
    chosen = str(cap.corrector)
    runs: Dict[int, Any] = {}
    rows: Dict[int, List[dict]] = {}
    timings = {"runs_s": 0.0, "pipeline_s": 0.0}
    requests = [0]  # simulated by the lanes engine, every pipeline of every count
    t0 = started = time.perf_counter()
    basis = load_basis(cfg, name)  # drawn once: the counts searched between the listed ones reuse it
    loads = channel_loads(cfg, name, key, counts, basis)
    timings["load_s"] = time.perf_counter() - t0
    unit = "GPUs" if _is_gpu(cfg, name) else "workers"

    def tell(what: str):
        """A line of progress on the count or phase ``what`` (a run doubled, a replication)."""
        return lambda note: progress.note(f"{what}: {note}", line=True)

    def spent(run: Settled, seconds: float) -> None:
        timings["runs_s"] += seconds
        timings["pipeline_s"] += run.pipeline_s
        requests[0] += run.requests

    def record(n: int, run: Optional[Settled], found: List[dict], seconds: float) -> None:
        rows[n] = found
        if run is not None:
            spent(run, seconds)
            runs[n] = run.res
        note = f"{n} {unit}: {count_note(rows[n], chosen, targets)}"
        if run is not None and progress.phase.name == SEARCH:
            progress.advance(1, note)  # one more count simulated: the search's unit of work
        else:  # overloaded (no run), or one the answer's deciding needs (that phase's units: replicated steps)
            progress.note(note, line=True)

    def load_of(n: int) -> Dict[str, float]:
        if n not in loads:
            loads.update(channel_loads(cfg, name, key, [n], basis))
        return loads[n]

    def simulated_of(ns: List[int]) -> int:
        """How many of ``ns`` a search simulates (an overloaded count takes no run)."""
        return sum(1 for n in ns if load_of(n)["load"] < cap.max_load)

    def evaluate(n: int) -> bool:
        if n not in rows:
            t0 = time.perf_counter()
            progress.note(f"{n} {unit}: simulating")
            run, out = count_rows(cfg, name, key, n, load_of(n), tell(f"{n} {unit}"))
            record(n, run, out, time.perf_counter() - t0)
        return meets(rows[n], chosen, targets)

    def evaluate_grid(todo: List[int]) -> None:
        """Every count of ``todo``, side by side in a pool of processes where that saves time
        (:func:`pool_size`): from the start, this process simulating the first count and then
        those the pool has not started, when a lower bound on a count's seconds
        (:func:`count_seconds`) says so and one more run fits in memory; else here until the
        first one simulated shows what a count takes, then the others in the pool. Where the
        longest runs do not fit side by side, the pool's are shorter (:func:`pooled_spec`)."""
        simulated = [n for n in todo if loads[n]["load"] < cap.max_load]
        for n in todo:  # the overloaded counts first: no run, their rows at once
            if n not in simulated:
                evaluate(n)
        pooled = pooled_spec(cfg, name, min(int(cap.workers) or auto_workers(), len(simulated)))
        at_once = pool_size(pooled, count_seconds(cfg, name), len(simulated)) if simulated else 1
        # beside this process: capacity.workers - 1 asked, or up to every usable core, as many as end
        # the counts soonest (:func:`soonest`), within the counts and the memory left
        workers = min(at_once - (1 if int(cap.workers) else 0), len(simulated) - 1, runs_that_fit(pooled) - 1)
        if not int(cap.workers):
            workers = soonest(len(simulated), auto_workers(), workers + 1) - 1
        if at_once > 1 and workers >= 1:
            in_pool(pooled, workers, simulated, here=True)
            return
        while simulated and not runs:
            evaluate(simulated.pop(0))
        workers = pool_size(pooled, timings["runs_s"], len(simulated))
        if not int(cap.workers):
            workers = soonest(len(simulated), auto_workers(), workers)
        if workers > 1:
            in_pool(pooled, workers, simulated)
        else:
            for n in simulated:
                evaluate(n)

    def count_here(c: RacsimConf, nm: str, k: str, n: int, load: dict):
        """:func:`_count_worker` in this process, with its progress notes."""
        t0 = time.perf_counter()
        run, out = count_rows(c, nm, k, n, load, tell(f"{n} {unit}"))
        return run, out, time.perf_counter() - t0

    def in_pool(spec: RacsimConf, workers: int, counts: List[int], here: bool = False) -> None:
        """``counts`` simulated with ``spec`` side by side in a pool of ``workers`` processes
        (``here``: this one too, the first count and those the pool has not started when it is
        free); a count not stationary with a ``spec`` shorter than ``cfg`` is run again here."""
        again = []
        progress.note(f"{', '.join(map(str, counts))} {unit}: side by side in {workers + here} processes")
        for i, (run, found, seconds) in side_by_side(workers, _count_worker,
                                                     [(spec, name, key, n, loads[n]) for n in counts],
                                                     count_here if here else None, share=True):
            if spec is not cfg and run is not None and not run.verdict.stationary:
                spent(run, seconds)  # its seconds count; its rows come from the longer run
                again.append(counts[i])
            else:
                record(counts[i], run, found, seconds)
        for n in again:
            evaluate(n)

    step = units_per_server(cfg, name)
    lowest = fewest_valid(cfg, name, key, counts[0])
    if cap.search == "bisect":  # assumes feasibility is monotone in the count
        progress.start(SEARCH, simulated_of(counts), "simulated count", upto=True)
        if evaluate(counts[-1]):
            first_passing(counts[:-1], evaluate)
    else:
        gap = [n for n in range(lowest, counts[-1]) if n % step == 0 and n not in loads]  # unlisted
        bound = load_bound(counts, gap, lambda n: load_of(n)["load"], cap.max_load)
        todo = counts if bound is None else sorted(counts + [bound])
        progress.start(SEARCH, simulated_of(todo), "simulated count")
        evaluate_grid(todo)
    top = search_top(cap.max_count, counts)  # the listed ones and an autoscale's bounds
    # the fewest count meeting the targets, whatever the list: the counts it skipped, those below it, or above it
    more = between_counts(rows, chosen, targets, step, lowest) or counts_above(rows, chosen, targets, step, top)
    if more:
        k = load_bound_index(more, lambda n: load_of(n)["load"], cap.max_load)  # the first k fail, no run
        if k < len(more):
            progress.grow(search_bound(len(more) - k), f"the fewest count meeting the targets lies among "
                                                      f"{len(more)} counts not listed", upto=True)
        if k:
            evaluate(more[k - 1])  # its row shows where the load bound sits
        if k < len(more):  # where the load binds, as it often does, the answer in one run
            fewest_from(more[k:], 0, evaluate)
    if scaled is not None:
        for n in (a.min * units, a.max * units):
            evaluate(n)
    t0 = time.perf_counter()
    budget = decide.Budget(int(cap.decide_steps), math.inf if cap.decide_s is None else float(cap.decide_s))
    if cap.decide_steps > 0:
        progress.start(DECIDING, int(cap.decide_steps), "replicated step", upto=True)

    def replicating(n: int):
        """Before each replication of count ``n``: the steps replicated so far (the budget less the one granted)."""
        return lambda note: progress.update(budget.used - int(chosen_row(rows[n], chosen)["steps"]),
                                            f"{n} {unit}: {note}", line=True)

    decisions: Dict[int, Optional[decide.Decision]] = {}
    while True:  # the counts the answer depends on, decided with enough evidence (racsim.analyses.decide)
        todo = [n for n in answer_counts(rows, chosen, targets, step, lowest, top) if n not in decisions]
        if not todo:
            break
        n = todo[0]
        evaluate(n)
        decisions[n] = decide_count(cfg, name, key, n, rows[n], runs[n], {**targets, "corrector": chosen},
                                    budget, replicating(n)) if n in runs else None
        if cap.decide_steps > 0:
            progress.update(budget.used)
    timings["decide_s"] = time.perf_counter() - t0
    timings["search_s"] = time.perf_counter() - started  # wall-clock: runs_s sums the processes' seconds

    curve = pd.DataFrame([r for n in sorted(rows) for r in rows[n]])
    curve = curve.reindex(columns=list(curve.columns) + [c for c in CURVE_COLUMNS if c not in curve])  # none simulated
    curve.insert(0, "channel", name)
    curve["fails"] = [fails_text(r, targets) for _, r in curve.iterrows()]
    curve["feasible"] = curve["fails"] == ""
    recommended = fewest(curve, chosen)
    names = [c for c in curve.corrector.unique() if c != "sync_oracle"]  # a reference, not a pipeline
    least = [fewest(curve, c) for c in names]
    per = pd.DataFrame({"corrector": names, "fewest": pd.Series(least, dtype=object),
                        "binds": [", ".join(binding(curve, c, n)) for c, n in zip(names, least)]})
    simulated = sorted(runs)
    best_n = recommended if recommended is not None else (max(simulated) if simulated else None)
    if best_n is not None:  # channels.csv of the run at that count: the sized channel's offered load
        chans = runs[best_n].channels
        chans.loc[chans.channel == name, "offered_load"] = loads[best_n]["load"]
    result = CapacityResult(curve=curve, channel=name, unit=unit, key=key,
                            recommended=recommended, per_corrector=per, targets={**targets, "corrector": chosen},
                            best=runs.get(best_n), best_count=best_n, timings=timings, loads=loads, level=float(cap.confidence),
                            max_load=float(cap.max_load), listed=counts, top=top,
                            searched=sorted(n for n in rows if n not in counts),
                            binding=binding(curve, chosen, recommended), notes=[lowered] if lowered else [])
    result.replicated_steps = budget.used
    result.notes += [undecided_text(n, recommended, d, chosen_row(rows[n], chosen), targets)
                     for n, d in sorted(decisions.items()) if d is not None and not d.decided]
    if scaled is not None:
        t0 = time.perf_counter()
        progress.start("autoscaled pool", 1, "run", note=f"running from {a.min} servers")
        auto = settle(with_count(scaled, key, a.min * units), name, tell("autoscaled pool"))
        progress.advance()
        timings["runs_s"] += time.perf_counter() - t0
        whole = loads[a.min * units]
        pool = {**whole, "load": whole["work_per_s"] / (a.max * whole["availability"]),  # at most a.max servers
                "load_sampled": whole["load_sampled"] * a.min / a.max}
        result.autoscale = autoscale_whatif(scaled, name, rows, _rows(scaled, name, 0, auto, pool), auto.res, targets)
    if cap.benchmark and cfg.pipeline.engine == "lanes" and simulated:  # the figure is the lanes engine's
        progress.start("speed benchmark", 1, note="raw SimPy timed on one count")
        result.speed = (benchmark(cfg, key, simulated[len(simulated) // 2], requests[0], timings["pipeline_s"])
                        if scaled is None else
                        benchmark(scaled, key, a.min * units, auto.requests, auto.pipeline_s))
    return result


def first_passing(counts: List[int], passes) -> Optional[int]:
    """The first of ``counts`` (ascending) for which ``passes`` holds, by bisection (``passes`` is
    monotone in the count); None when none does."""
    lo, hi = 0, len(counts)
    while lo < hi:
        mid = (lo + hi) // 2
        if passes(counts[mid]):
            hi = mid
        else:
            lo = mid + 1
    return counts[lo] if lo < len(counts) else None


def fewest_from(counts: List[int], start: int, passes: Callable[[int], bool]) -> Optional[int]:
    """The fewest of ``counts`` (ascending) for which ``passes`` holds (monotone in the count), searched
    from index ``start``: galloping away from it 1, 2, 4... places until the answer is bracketed,
    then bisecting inside (:func:`first_passing`): exponential search (Bentley & Yao 1976), about
    2 log2(d) evaluations for an answer d places from the start. None when none passes."""
    lo, hi, step = -1, len(counts), 1  # counts[lo] fails, counts[hi] passes (-1, len: none known)
    if passes(counts[start]):
        hi = start
        while hi > 0:
            j = max(hi - step, 0)
            if not passes(counts[j]):
                lo = j
                break
            hi, step = j, 2 * step
    else:
        lo = start
        while lo < len(counts) - 1:
            j = min(lo + step, len(counts) - 1)
            if passes(counts[j]):
                hi = j
                break
            lo, step = j, 2 * step
    inside = first_passing(counts[lo + 1:hi], passes)
    return inside if inside is not None else (counts[hi] if hi < len(counts) else None)


def load_bound_index(counts: List[int], load: Callable[[int], float], max_load: float) -> int:
    """How many of ``counts`` (ascending) are overloaded: the index of the first whose long-run
    ``load`` (decreasing in the count) is under ``max_load``, by bisection (len: none is)."""
    first = first_passing(counts, lambda n: load(n) < max_load)
    return len(counts) if first is None else counts.index(first)


def load_bound(listed: List[int], unlisted: List[int], load: Callable[[int], float], max_load: float) -> Optional[int]:
    """The count where the load binds, when the list skips it: the fewest of ``unlisted``
    (ascending, whole servers) under ``max_load`` that lies between the listed counts over it and
    the fewest listed under it, or None (the list holds it, or no listed count is under max_load).
    ``load(n)``: a count's long-run offered load, decreasing in the count, so a bisection finds it
    (:func:`load_bound_index`, a few loads). Where the targets bind no later than the load, this
    count is the answer: the grid evaluates it with the listed ones (side by side where a pool runs)."""
    k = load_bound_index(listed, load, max_load)  # listed[k]: the fewest listed under max_load
    if k == len(listed):
        return None
    inside = [n for n in unlisted if (k == 0 or n > listed[k - 1]) and n < listed[k]]
    j = load_bound_index(inside, load, max_load)
    return inside[j] if j < len(inside) else None


def between_counts(rows: Dict[int, List[dict]], chosen: str, targets: Dict[str, Any], step: int,
                   lowest: int) -> List[int]:
    """The counts (multiples of ``step``: whole servers) strictly between the largest evaluated count that
    fails the targets and the fewest that meets them, above which every evaluated count does: where
    the fewest count may lie that the list skipped; when every evaluated count meets them, those from
    ``lowest`` (the fewest the channel can have: :func:`fewest_valid`) up to the first. Empty when
    they are neighbours, or none meets them."""
    ok = {n: meets(rs, chosen, targets) for n, rs in rows.items()}
    bad = [n for n in ok if not ok[n]]
    top = max(bad, default=lowest - 1)
    above = [n for n in ok if ok[n] and n > top]
    if not above:
        return []
    return [n for n in range(top + 1, min(above)) if n % step == 0]


def counts_above(rows: Dict[int, List[dict]], chosen: str, targets: Dict[str, Any], step: int,
                 top: int) -> List[int]:
    """The counts (multiples of ``step``: whole servers) above the largest evaluated one up to ``top``,
    when that one fails the targets: where the fewest count meeting them lies if the list stops
    short of it (feasibility growing with the count). Empty when the largest evaluated count meets them."""
    largest = max(rows)
    if meets(rows[largest], chosen, targets):
        return []
    return [n for n in range(largest + 1, top + 1) if n % step == 0]


def fewest_valid(cfg: RacsimConf, name: str, key: str, upto: int) -> int:
    """The fewest count of channel ``name`` (whole servers) below ``upto`` that makes a valid spec
    whose outage schedule, if any, names only servers it has (one naming replica 2 needs 3), or ``upto``."""
    step = units_per_server(cfg, name)
    for n in range(step, upto, step):
        c = with_count(cfg, key, n)
        schedule = c.pipeline.channels[name].faults.schedule
        try:
            validate(c)
            if schedule is not None:
                read_schedule(schedule, f"pipeline.channels.{name}.faults.schedule", n // step)
        except ConfigError:
            continue
        return n
    return upto


def fewest(curve: pd.DataFrame, corrector: str) -> Optional[int]:
    """The fewest units meeting the targets, above which every evaluated count does too."""
    sub = curve[curve.corrector == corrector].sort_values("count")
    ok = sub.feasible.to_numpy()
    if not ok.any() or not ok[-1]:
        return None
    last_bad = np.flatnonzero(~ok)
    i = last_bad[-1] + 1 if last_bad.size else 0
    return int(sub["count"].iloc[i])


def requests_per_schedule(cfg: RacsimConf) -> int:
    """Requests one schedule simulates: trials x steps x batch x sequences, summed over channels."""
    p = cfg.pipeline
    per_sample = sum(int(ch.rm.sequences_per_sample) if ch.kind == "gpu_rm" else 1
                     for ch in p.channels.values())
    return int(cfg.learner.trials) * int(p.steps) * int(p.batch_size) * per_sample


def raw_simpy_rate(n_requests: int, servers: int, seed: int = 0) -> float:
    """Requests per second of a bare SimPy M/M/c model: a process per request on
    a ``Resource`` of ``servers`` (the cheapest a per-request SimPy model gets)."""
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

    t0 = time.perf_counter()
    env.process(source())
    env.run()
    return n_requests / (time.perf_counter() - t0)


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
