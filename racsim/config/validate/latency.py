"""A duration law (:class:`~racsim.config.schema.LatencyConf`): its kind, the parameters the kind
is given by, its bounds and, for an empirical law, its CSV. Pipeline phases, channel latencies,
an RM's token counts and streamed rollout lengths are all checked here."""

from __future__ import annotations

import math
from typing import Any

from racsim.config.schema import CAUCHY_BOUNDS, LATENCY_KINDS, LatencyConf
from racsim.config.validate.common import finite, need, need_file, need_one_of
from racsim.errors import ConfigError

MAX_SECONDS = 1e12  # a duration's mean, spread, bounds and samples (30,000 years): sums of them stay finite
MAX_SIGMA = 30.0  # a lognormal's sigma: exp(sigma^2 / 2), which matches its mean, stays finite
MAX_ALPHA = 1e6  # a pareto's tail index: past it the draws are its mean and its quantiles overflow


def cauchy_window_mass(median: float, scale: float, low: float, high: float) -> float:
    """P(low <= X <= high) for X ~ Cauchy(median, scale)."""
    return (math.atan((high - median) / scale) - math.atan((low - median) / scale)) / math.pi


def seconds_in_range(x: Any) -> bool:
    """A finite duration in [0, MAX_SECONDS]."""
    return finite(x) and 0 <= x <= MAX_SECONDS


def validate_latency(c: LatencyConf, key: str) -> None:
    """Range checks for one latency distribution (the sampler builds from it)."""
    need_one_of(f"{key}.kind", c.kind, LATENCY_KINDS)
    need_one_of(f"{key}.cauchy_bounds", c.cauchy_bounds, CAUCHY_BOUNDS)
    if c.kind == "cauchy":
        _cauchy(c, key)
    _mean(c, key)
    _shape(c, key)
    _bounds(c, key)
    if c.kind == "uniform" and c.mean is not None:
        _uniform_mean(c, key)
    if c.kind == "empirical":
        need_file(f"{key}.path", c.path, "the path of a CSV file with the latency samples")
        need(bool(c.column), f"{key}.column", c.column, "the name of a numeric column of that CSV")


def _cauchy(c: LatencyConf, key: str) -> None:
    """A truncated Cauchy: its window, its median (or a mean to solve it from), a scale that puts mass there."""
    need(c.low is not None and c.high is not None, f"{key}.low", c.low,
         "cauchy needs finite truncation bounds low < high")
    if c.cauchy_bounds == "clip":
        need(c.median is not None and finite(c.median), f"{key}.median", c.median,
             "a finite number: a clipped cauchy is given by its median (no mean is solved for)")
    elif c.median is None:
        need(c.mean is not None, f"{key}.median", c.median, "a number, or set mean so it can be solved")
    else:
        need(finite(c.median), f"{key}.median", c.median, "a finite number")
    need(finite(c.scale) and 0 < c.scale <= MAX_SECONDS, f"{key}.scale", c.scale,
         f"a positive number <= {MAX_SECONDS:g} (seconds)")
    if c.median is not None and finite(c.low) and finite(c.high):
        mass = cauchy_window_mass(c.median, c.scale, c.low, c.high)
        need(mass > 1e-9, f"{key}.median", c.median,
             f"a median whose Cauchy(scale {c.scale:g}) puts mass on [low, high] = [{c.low:g}, {c.high:g}] "
             f"(it puts {mass:.3g} there: nothing could be drawn)")


def _mean(c: LatencyConf, key: str) -> None:
    """The mean: in range when set; required by the kinds that are matched to it."""
    if c.mean is not None:
        need(seconds_in_range(c.mean), f"{key}.mean", c.mean,
             f"a finite number >= 0 and <= {MAX_SECONDS:g} (seconds)")
    elif c.kind == "uniform":
        need(c.high is not None, f"{key}.high", c.high, "a number > low: uniform needs mean, or high (and low)")
    elif c.kind not in ("cauchy", "empirical"):
        raise ConfigError(f"{key}.mean", c.mean, f"a finite number >= 0: {c.kind} is matched to its mean")


def _shape(c: LatencyConf, key: str) -> None:
    """The spread parameter of the kinds that have one (gaussian std, lognormal sigma, pareto alpha)."""
    if c.kind == "gaussian":
        need(seconds_in_range(c.std), f"{key}.std", c.std,
             f"a finite number >= 0 and <= {MAX_SECONDS:g} (seconds)")
    if c.kind == "lognormal":
        need(finite(c.sigma) and 0 < c.sigma <= MAX_SIGMA, f"{key}.sigma", c.sigma,
             f"a positive number <= {MAX_SIGMA:g} (exp(sigma^2 / 2), which matches the mean, must stay finite)")
    if c.kind == "pareto":
        need(finite(c.alpha) and 1 < c.alpha <= MAX_ALPHA, f"{key}.alpha", c.alpha,
             f"a number > 1 (finite mean) and <= {MAX_ALPHA:g} (past it, use kind=deterministic)")


def _bounds(c: LatencyConf, key: str) -> None:
    """low and high: each null or a duration, low < high when both are set."""
    for b in ("low", "high"):
        v = getattr(c, b)
        if v is not None:
            need(seconds_in_range(v), f"{key}.{b}", v,
                 f"null or a finite number >= 0 and <= {MAX_SECONDS:g} (seconds)")
    if c.low is not None and c.high is not None:
        need(c.low < c.high, f"{key}.high", c.high, f"a number > low ({c.low})")


def _uniform_mean(c: LatencyConf, key: str) -> None:
    """A uniform's mean: at least low, and the midpoint of [low, high] when high is set."""
    lo = 0.0 if c.low is None else c.low
    if c.high is None:
        need(lo <= c.mean, f"{key}.mean", c.mean, f"a number >= low ({lo}): uniform on [low, 2 mean - low]")
    else:
        mid = 0.5 * (lo + c.high)
        need(abs(c.mean - mid) <= 1e-9 * max(1.0, mid), f"{key}.mean", c.mean,
             f"null or the midpoint {mid:g} of [low, high] = [{lo:g}, {c.high:g}]")
