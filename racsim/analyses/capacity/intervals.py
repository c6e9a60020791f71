"""The intervals of a count's figures (``capacity.confidence``): bootstrap resamples of
independent units, the trials or, under slow regimes, batches of their windows (batch means), for
the channel's figures, the wall-clock per step and the exact bias (eq. (2)'s norm)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np
import pandas as pd

from racsim.analyses.capacity.regimes import regime_cycle
from racsim.config.schema import RacsimConf
from racsim.learner.bias import bootstrap_counts, group_sums
from racsim.pipeline import steady
from racsim.pipeline.schedule import DROPPED, INJECTED, UNROUTED
from racsim.pipeline.stats import busy_seconds
from racsim.seeds import rng_for

# Cycles of the slowest regime a batch of the intervals' batch means holds at least: adjacent
# batches of a trial share a backlog across their boundary; two cycles keep that correlation small.
BATCH_CYCLES = 2


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


def batch_units(n_trials: int, steps: int, batches: int) -> np.ndarray:
    """(n_trials, steps) the batch-means unit of each (trial, step) of a window: trial t's
    ``batches`` consecutive equal batches are units t * batches .. t * batches + batches - 1 (the
    first steps mod ``batches`` go to the first batch)."""
    size = steps // batches
    b = np.maximum(np.arange(steps) - steps % batches, 0) // size
    return np.arange(n_trials)[:, None] * batches + b[None, :]


def step_seconds(sched, warmup: int) -> np.ndarray:
    """(trials, steps - warmup) wall-clock seconds of each step after the warm-up."""
    return np.diff(sched.step_start[:, warmup:], axis=1)


def worker_limit(workers) -> Optional[int]:
    """A channel table's ``workers`` cell as :func:`busy_seconds` takes it (None: no worker limit)."""
    return None if workers is None or pd.isna(workers) else int(workers)


def channel_intervals(sched, k: int, workers, w: int, units: Units, level: float) -> Dict[str, float]:
    """Intervals of channel ``k``'s figures measured from step ``w`` on, the :class:`Units`
    resampled: delay p50/p95 (steps), sojourn p95/p99 (s), dropped share and utilisation. A
    unit is a trial or one of its window's batches (:func:`batch_units`; batch means, each batch
    at least one slow regime's cycle, so that the units are nearly independent); a request
    belongs to the unit of its step, and the utilisation resamples whole trials (each weighing
    its batches' counts)."""
    st = sched.status[:, w:, :, k]
    unit = np.broadcast_to(units.of[:, :, None], st.shape)
    sent = st != UNROUTED
    out = quantile_intervals(sched, k, w, unit, sent, units.counts, level)
    out["dropped_frac_lo"], out["dropped_frac_hi"] = steady.ratio_interval(
        units.sums((st == DROPPED).sum(axis=2)), units.sums(sent.sum(axis=2)), units.counts, level)
    out["utilisation_lo"], out["utilisation_hi"] = utilisation_interval(sched, k, workers, w, units, level)
    bg = (sched.background or {}).get(sched.channel_names[k])
    if bg is not None:  # other tenants' requests (a shared channel), each in the unit of its arrival's step
        out["background_sojourn_p95_s_lo"], out["background_sojourn_p95_s_hi"] = steady.quantile_interval(
            *background_sojourns(sched.step_start, bg, w, units.of), 0.95, units.counts, level)
    return out


def quantile_intervals(sched, k: int, w: int, unit: np.ndarray, sent: np.ndarray, counts: np.ndarray,
                       level: float) -> Dict[str, float]:
    """Intervals of channel ``k``'s delay p50/p95 (steps; its results injected) and sojourn p95/p99
    (s; its requests sent that came back, cancelled ones aside) from step ``w`` on, each request in
    the ``unit`` of its step (trials, window steps, requests)."""
    delay = sched.delay[:, w:, :, k]
    ok = sched.status[:, w:, :, k] == INJECTED
    soj = sched.completion[:, w:, :, k] - sched.submit_time[:, w:, :, k]
    back = np.isfinite(soj) & sent
    if sched.cancelled is not None:
        back &= ~sched.cancelled[:, w:, :, k]
    out = {}
    for q in (50, 95):
        out[f"delay_p{q}_steps_lo"], out[f"delay_p{q}_steps_hi"] = steady.quantile_interval(
            delay[ok], unit[ok], q / 100, counts, level)
    for q in (95, 99):
        out[f"sojourn_p{q}_s_lo"], out[f"sojourn_p{q}_s_hi"] = steady.quantile_interval(
            soj[back], unit[back], q / 100, counts, level)
    return out


def utilisation_interval(sched, k: int, workers, w: int, units: Units, level: float) -> Tuple[float, float]:
    """The interval of channel ``k``'s utilisation from step ``w`` on (busy server-seconds over its
    servers' time), whole trials resampled, each weighing its batches' counts; NaN without a worker limit."""
    t0, t1 = sched.step_start[:, w], sched.step_start[:, -1]
    busy = busy_seconds(sched, k, worker_limit(workers), t0, t1)
    if busy is None:
        return np.nan, np.nan
    counts = units.counts
    by_trial = counts.reshape(counts.shape[0], sched.n_trials, units.per).sum(axis=2) / units.per
    return steady.percentile_interval(steady.boot_mean(busy[0] / (busy[1] * (t1 - t0)), by_trial), level)


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
    boot = {name: steady.norm_replicates(run.channel_exact[0], run.channel_exact[1:], run.target, units.sums(sw),
                                         sizes, units.counts) for name, sw in run.step_weight.items()}
    base = boot.get("naive")
    out = {}
    for name, b in boot.items():
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = b / base if base is not None else np.full_like(b, np.nan)
        out[name] = (*steady.percentile_interval(b, level), *steady.percentile_interval(ratio, level))
    return out
