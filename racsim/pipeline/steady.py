"""Steady-state output analysis: is there a steady state, where does it start, how sure are we?

A figure racsim calls steady-state must come from a steady state that exists and was found
(DESIGN.md, "Answers that hold for a whole run"). The methods are the textbook ones of
discrete-event output analysis:

* **Offered load first** (:func:`offered_load`): work arriving per second of the optimizer's
  clock over the capacity that is up. A queue at load >= 1 has no steady state; its backlog
  grows for as long as the run lasts.
* **Warm-up by MSER-5** (:func:`mser`; White, 1997; Franklin and White, 2008): the truncation
  point that minimises the marginal standard error of the mean of the remaining batches of 5.
  A minimum in the second half of the series means the run is too short to show the warm-up.
* **Stationarity by batch means** (:func:`verdict`): the window after the warm-up is cut into
  batches; their means must show no trend (an ordinary least-squares slope test), else the run
  is too short or the queue still drifts.
* **Intervals** by batch means (:func:`batch_means_ci`) on one series, and by resampling the
  independent trials (:func:`boot_weighted_quantile`, :func:`boot_mean`, :func:`boot_ratio`),
  which are independent replications of the whole pipeline from empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
from scipy import stats

MSER_BATCH = 5  # MSER-5: the series is batched in fives before the truncation rule
N_BATCHES = 10  # batch means of the measured window for the stationarity verdict
TREND_P = 0.01  # a slope of the batch means significant at this level is a trend


def mser(x: np.ndarray, m: int = MSER_BATCH) -> Optional[int]:
    """MSER-m truncation point of the series ``x`` (in its own index units, a multiple of ``m``):
    the d minimising sum_{j > d} (Z_j - mean(Z_{>d}))^2 / (b - d)^2 over the b batch means Z of
    ``m`` consecutive values (a trailing partial batch dropped), d searched in the first half of
    the batches, as the method prescribes (past it the criterion is too noisy to read). None when
    the minimum sits on the half's edge (the warm-up may go on past it: the run is too short to
    show where it ends) or there are fewer than 4 batches."""
    x = np.asarray(x, dtype=np.float64)
    b = x.size // m
    if b < 4:
        return None
    z = x[: b * m].reshape(b, m).mean(axis=1)
    # tail sums from each d: n_d = b - d values, their sum and sum of squares
    n = np.arange(b, 0, -1, dtype=np.float64)
    s1 = np.cumsum(z[::-1])[::-1]
    s2 = np.cumsum((z * z)[::-1])[::-1]
    half = b // 2
    sse = np.maximum(s2[: half + 1] - s1[: half + 1] ** 2 / n[: half + 1], 0.0)
    d = int(np.argmin(sse / n[: half + 1] ** 2))
    return None if d == half else d * m


def batch_means(x: np.ndarray, k: int) -> np.ndarray:
    """Means of ``k`` equal consecutive batches of ``x`` (the first len(x) mod k values dropped:
    they are the oldest, the nearest the warm-up)."""
    x = np.asarray(x, dtype=np.float64)
    size = x.size // k
    if size < 1:
        raise ValueError(f"{x.size} values cannot make {k} batches")
    return x[x.size - k * size:].reshape(k, size).mean(axis=1)


def batch_means_ci(x: np.ndarray, k: int = N_BATCHES, level: float = 0.95) -> Tuple[float, float]:
    """(mean, half-width) of the ``level`` interval for the mean of a stationary series by
    non-overlapping batch means: mean of the k batch means +- t_{k-1} s / sqrt(k)."""
    z = batch_means(x, k)
    half = stats.t.ppf(0.5 + level / 2, k - 1) * z.std(ddof=1) / np.sqrt(k)
    return float(z.mean()), float(half)


def slope_p(z: np.ndarray) -> float:
    """Two-sided p-value of the least-squares slope of ``z`` against its index (1.0 for a
    constant series: nothing trends)."""
    z = np.asarray(z, dtype=np.float64)
    if np.ptp(z) <= 1e-12 * max(1.0, float(np.abs(z).max())):
        return 1.0
    return float(stats.linregress(np.arange(z.size), z).pvalue)


@dataclass(frozen=True)
class Verdict:
    """Where the steady state starts (``warmup``, steps) and whether the window after it is
    stationary; ``reason`` says why not ('' when it is)."""

    warmup: int
    stationary: bool
    reason: str = ""


def verdict(x: np.ndarray, warmup: Optional[int] = None, k: int = N_BATCHES) -> Verdict:
    """The steady-state verdict on one per-step series ``x``: the warm-up by MSER-5 unless
    ``warmup`` is given, at least 2k steps after it, and the window's ``k`` batch means with no
    trend (least-squares slope p >= :data:`TREND_P`). The intervals themselves come from the
    independent trials, so batch means only need to show the drift of a queue without a steady
    state. Measured on AR(1) noise: a stationary series is flagged 1 time in 6 at 40 steps (mostly
    MSER-5's edge: it then runs longer), 1 in 80 at 200 steps; a drift of 10 noise standard
    deviations over the run is always seen (tests/test_capacity_steady.py)."""
    x = np.asarray(x, dtype=np.float64)
    if warmup is None:
        d = mser(x)
        if d is None:
            return Verdict(x.size // 2, False, "warm-up not over by the middle of the run (MSER-5)")
    else:
        d = int(warmup)
    window = x[d:]
    if window.size < 2 * k:
        return Verdict(d, False, f"{window.size} steps after the warm-up: fewer than {2 * k}")
    z = batch_means(window, k)
    p = slope_p(z)
    if p < TREND_P:
        return Verdict(d, False, f"trend in the batch means (slope p = {p:.2g})")
    return Verdict(d, True)


def trials_verdict(x: np.ndarray, warmup: Optional[int] = None, k: int = N_BATCHES) -> Verdict:
    """The steady-state verdict on a (trials, steps) series whose trials are independent
    replications, for a system with slow regimes: the warm-up by MSER-5 on the mean over trials
    unless ``warmup`` is given, at least 2k steps after it, and no trend: each trial's
    least-squares slope over the window, their mean tested against 0 by a one-sample t-test
    over the trials (p >= :data:`TREND_P`). The trials are independent whatever the regimes'
    autocorrelation within a trial, so a window short against a regime's cycle is not taken for a
    trend (batch means of one series would be: a slow regime's excursion reads as a slope); with
    fewer than 3 trials, :func:`verdict` on their mean."""
    x = np.asarray(x, dtype=np.float64)
    if x.shape[0] < 3:
        return verdict(x.mean(axis=0), warmup, k)
    d = mser(x.mean(axis=0)) if warmup is None else int(warmup)
    if d is None:
        return Verdict(x.shape[1] // 2, False, "warm-up not over by the middle of the run (MSER-5)")
    window = x[:, d:]
    if window.shape[1] < 2 * k:
        return Verdict(d, False, f"{window.shape[1]} steps after the warm-up: fewer than {2 * k}")
    t = np.arange(window.shape[1]) - (window.shape[1] - 1) / 2.0
    slopes = window @ t / (t @ t)  # (trials,) least-squares slopes
    tol = 1e-12 * max(1.0, float(np.abs(window).max()))
    if np.ptp(slopes) <= tol:  # the same slope in every trial: a trend unless it is none
        p = 1.0 if abs(slopes.mean()) <= tol else 0.0
    else:
        p = float(stats.ttest_1samp(slopes, 0.0).pvalue)
    if p < TREND_P:
        return Verdict(d, False, f"trend in the trials' slopes (mean slope p = {p:.2g})")
    return Verdict(d, True)


def in_system(sched, k: int) -> np.ndarray:
    """(trials, steps) requests of channel ``k`` in the system (waiting or in service) at each
    step's start: submitted by then and not yet gone. A job leaves at its completion; one lost
    to a failure at its service start; one never served stays."""
    sub = sched.submit_time[..., k].reshape(sched.n_trials, -1)
    gone = sched.completion[..., k]
    if sched.failed is not None:
        gone = np.where(sched.failed[..., k] & np.isfinite(sched.service_start[..., k]),
                        sched.service_start[..., k], gone)
    gone = gone.reshape(sched.n_trials, -1)
    at = sched.step_start[:, : sched.n_steps]
    out = np.empty(at.shape)
    for i in range(sched.n_trials):
        s, g = np.sort(sub[i][np.isfinite(sub[i])]), np.sort(gone[i])
        out[i] = np.searchsorted(s, at[i], side="right") - np.searchsorted(g, at[i], side="right")
    return out


def offered_load(work: np.ndarray, clock: np.ndarray, servers: float) -> float:
    """Offered load: work arriving per second of the clock over the servers that are up,
    sum(work) / (sum(clock) x servers). ``work`` and ``clock``: seconds per (trial, step)."""
    return float(np.sum(work) / (np.sum(clock) * servers))


def percentile_interval(boot: np.ndarray, level: float) -> Tuple[float, float]:
    """The central ``level`` percentile interval of bootstrap replicates (NaN ones ignored)."""
    a = 50.0 * (1.0 - level)
    b = np.asarray(boot, dtype=np.float64)
    b = b[np.isfinite(b)]
    if not b.size:
        return float("nan"), float("nan")
    lo, hi = np.percentile(b, [a, 100.0 - a])
    return float(lo), float(hi)


def boot_mean(per_trial: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Bootstrap replicates of the mean over trials: ``counts`` (R, trials) resample counts."""
    return counts @ np.asarray(per_trial, dtype=np.float64) / counts.shape[1]


def boot_ratio(num: np.ndarray, den: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Bootstrap replicates of sum(num) / sum(den) over resampled trials (NaN where 0 / 0)."""
    n, d = counts @ np.asarray(num, dtype=np.float64), counts @ np.asarray(den, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(d > 0, n / np.where(d > 0, d, 1.0), np.nan)


QUANTILE_GRID = 4000  # candidate values a resampled quantile is read from (all of them when fewer are distinct)


def boot_weighted_quantile(values: np.ndarray, trial: np.ndarray, q: float, counts: np.ndarray) -> np.ndarray:
    """Bootstrap replicates of the ``q`` quantile (0..1, lower: the first value whose cumulative
    weight reaches q of the total) of ``values`` pooled over resampled trials: each value weighs
    its trial's resample count (``counts`` (R, trials); ``trial``: each value's trial index).
    Read off the distinct values when there are at most :data:`QUANTILE_GRID` of them (exact),
    else off that many of the pooled sample's order statistics between its q - 0.2 and q + 0.2
    quantiles, and its extremes."""
    values = np.asarray(values, dtype=np.float64)
    if not values.size:
        return np.full(counts.shape[0], np.nan)
    cand = np.unique(values)
    if cand.size > QUANTILE_GRID:
        ranks = np.linspace(max(0.0, q - 0.2), min(1.0, q + 0.2), QUANTILE_GRID - 2)
        cand = np.unique(np.concatenate([[cand[0], cand[-1]], np.quantile(values, ranks, method="inverted_cdf")]))
    trial = np.asarray(trial)
    below = np.stack([np.searchsorted(np.sort(values[trial == t]), cand, side="right")
                      for t in range(counts.shape[1])]).astype(np.float64)  # (trials, candidates)
    cdf = counts @ below  # (R, candidates) resampled counts at or below each candidate
    total = cdf[:, -1:]
    first = np.argmax(cdf >= q * total, axis=1)
    return np.where(total[:, 0] > 0, cand[first], np.nan)
