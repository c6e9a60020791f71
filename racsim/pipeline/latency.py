"""Latency (duration) distributions, each matched to a target mean.

:func:`build_latency` turns a validated :class:`~racsim.config.schema.LatencyConf`
into a :class:`Latency`. Every distribution samples vectorised from a
``numpy.random.Generator`` and knows, exactly, the mean, CDF and quantile
function of what it samples *after* rounding (``discrete``) and clipping
(``low``/``high``): means are closed forms or exact sums over integer atoms,
never Monte Carlo.

A continuous kind is a base distribution X (``_Base`` subclasses below)
post-processed by ``clip(rint(X), low, high)`` (:class:`_Transformed`);
``low`` defaults to 0 and ``high`` to +inf. Rounding is numpy's ``rint``
(nearest integer, ties to even; ties have probability zero for continuous X).
The Cauchy is *truncated* (conditioned) to [low, high] by default, or clipped
like the others with ``cauchy_bounds: clip``.

Truncation vs clipping of the paper's Cauchy (median 18, scale 4, [1, 200]):
the truncated (conditioned) mean is 21.2461 and the clipped one (mass piled
on the bounds) is 21.0071 (21.0070 also rounded). The paper reports a
realised mean of "about 21.0", a 5% shift, which matches *clipping*, not the
truncation its text names. ``cauchy_bounds`` names which: ``truncate`` (the
default) or ``clip`` (the paper's realised draw, clip(round(18 + 4 C), 1, 200)).
See ``tests/test_latency.py::test_paper_cauchy_realised_mean``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
import math
from typing import Any, Optional, Tuple

import numpy as np
import pandas as pd
from scipy import optimize, special

from racsim.config.schema import LATENCY_KINDS, LatencyConf
from racsim.config.validate import MAX_SECONDS, validate_latency
from racsim.config.names import closest
from racsim.errors import ConfigError, listed
from racsim.pipeline.csvdata import first_fields, has_header, line_of, read_column

__all__ = ["Latency", "build_latency", "cauchy_truncated_mean", "solve_cauchy_location", "whole_number_law"]


# Tail mass below which atoms of a rounded distribution are not summed one by
# one but integrated in closed form (with an Euler-Maclaurin correction).
_TAIL_EPS = 1e-15


_MAX_ATOMS = 1_000_000


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.4g}"


class Latency(abc.ABC):
    """A non-negative duration distribution (seconds)."""

    changes: Tuple[str, ...] = ()  # what racsim did to a user's data (an empirical law: rescaled, clipped)

    @abc.abstractmethod
    def sample(self, rng: np.random.Generator, size: Any = None) -> np.ndarray:
        """``size`` float64 draws (>= 0), deterministic given ``rng``'s state."""

    def draw_raw(self, rng: np.random.Generator, size: Any = None) -> np.ndarray:
        """The draws :meth:`sample` makes, as drawn: :meth:`settle` turns them into its result
        (here already the result)."""
        return self.sample(rng, size)

    def settle(self, x: np.ndarray) -> np.ndarray:
        """:meth:`draw_raw`'s draws ``x`` turned, in place, into :meth:`sample`'s result."""
        return x

    @abc.abstractmethod
    def mean(self) -> float:
        """Exact mean of what :meth:`sample` draws."""

    @abc.abstractmethod
    def cdf(self, x: Any) -> np.ndarray:
        """P(draw <= x)."""

    @abc.abstractmethod
    def quantile(self, q: Any) -> np.ndarray:
        """Generalised inverse of :meth:`cdf`: inf{x : cdf(x) >= q}; nan outside [0, 1]."""

    @abc.abstractmethod
    def describe(self) -> str:
        """One line for logs and reports."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"


def _bad_q(q: np.ndarray) -> np.ndarray:
    return ~((q >= 0) & (q <= 1))


class _Deterministic(Latency):
    """Always the same value."""

    def __init__(self, value: float, label: str):
        self.value, self.label = float(value), label

    def sample(self, rng: np.random.Generator, size: Any = None) -> np.ndarray:
        return np.full(() if size is None else size, self.value, dtype=np.float64)

    def mean(self) -> float:
        return self.value

    def cdf(self, x: Any) -> np.ndarray:
        return (np.asarray(x, dtype=np.float64) >= self.value).astype(np.float64)

    def quantile(self, q: Any) -> np.ndarray:
        q = np.asarray(q, dtype=np.float64)
        return np.where(_bad_q(q), np.nan, self.value)

    def describe(self) -> str:
        return self.label


class _Empirical(Latency):
    """Uniform resampling (with replacement) of a finite set of values."""

    def __init__(self, values: np.ndarray, label: str, changes: Tuple[str, ...] = ()):
        self.values = np.sort(np.asarray(values, dtype=np.float64))
        self.label = label
        self.changes = changes

    def sample(self, rng: np.random.Generator, size: Any = None) -> np.ndarray:
        return self.values[rng.integers(0, self.values.size, size=size)]

    def mean(self) -> float:
        return math.fsum(self.values) / self.values.size

    def cdf(self, x: Any) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        return np.searchsorted(self.values, x, side="right") / self.values.size

    def quantile(self, q: Any) -> np.ndarray:
        q = np.asarray(q, dtype=np.float64)
        n = self.values.size
        # The relative slack absorbs float error in q*n (0.3*10 = 3.0000000000000004).
        k = np.ceil(np.nan_to_num(q) * n * (1 - 1e-12)).astype(np.int64) - 1
        return np.where(_bad_q(q), np.nan, self.values[np.clip(k, 0, n - 1)])

    def describe(self) -> str:
        return self.label


class _Geometric(Latency):
    """clip(X, low, high) for X geometric on the integers 0, 1, 2, ...: P(X = k) = p (1 - p)^k with
    p = 1 / (1 + m), so E[X] = m (a generation lag in policy versions, or any count of whole steps).
    Its mean is exact: E[clip(X, a, b)] = a + int_a^b P(X > x) dx with P(X > x) = q^(floor(x) + 1),
    q = 1 - p, summed as a geometric series over the whole steps between a and b."""

    def __init__(self, m: float, low: float, high: float, label: str):
        self.m, self.low, self.high, self.label = float(m), low, high, label
        self.p = 1.0 / (1.0 + self.m)
        self.q = self.m / (1.0 + self.m)

    def sample(self, rng: np.random.Generator, size: Any = None) -> np.ndarray:
        x = (rng.geometric(self.p, size) - 1).astype(np.float64)
        return np.clip(x, self.low, self.high, out=x) if isinstance(x, np.ndarray) else np.clip(x, self.low, self.high)

    def _above(self, a: float, b: float) -> float:
        """int_a^b q^(floor(x) + 1) dx for 0 <= a <= b (b may be inf)."""
        if b <= a:
            return 0.0
        i = math.floor(a)
        if math.isfinite(b) and math.floor(b) == i:
            return (b - a) * self.q ** (i + 1)
        head = (i + 1 - a) * self.q ** (i + 1)
        if math.isinf(b):
            return head + self.q ** (i + 2) / self.p
        j = math.floor(b)
        return head + (self.q ** (i + 2) - self.q ** (j + 1)) / self.p + (b - j) * self.q ** (j + 1)

    def mean(self) -> float:
        return self.low + self._above(self.low, self.high)

    def cdf(self, x: Any) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            k = np.floor(np.where(np.isfinite(x) & (x >= 0), x, 0.0))
            v = np.where(x < 0, 0.0, 1.0 - self.q ** (k + 1.0))
        v = np.where(x < self.low, 0.0, np.where(x >= self.high, 1.0, v))
        return np.where(np.isnan(x), np.nan, v)

    def quantile(self, q: Any) -> np.ndarray:
        u = np.asarray(q, dtype=np.float64)
        bad = _bad_q(u)
        u = np.where(bad, 0.5, u)
        with np.errstate(divide="ignore", invalid="ignore"):
            k = np.maximum(np.ceil(np.log1p(-u) / math.log(self.q) - 1.0), 0.0)
        k = np.where(u >= 1.0, np.inf, k)
        finite_k = np.isfinite(k)
        kk = np.where(finite_k, k, 0.0)
        # the float division can land one step off: the smallest k with 1 - q^(k + 1) >= u
        kk = np.where(finite_k & (kk > 0) & (1.0 - self.q ** kk >= u), kk - 1.0, kk)
        kk = np.where(finite_k & (1.0 - self.q ** (kk + 1.0) < u), kk + 1.0, kk)
        k = np.where(finite_k, kk, k)
        return np.where(bad, np.nan, np.clip(k, self.low, self.high))

    def describe(self) -> str:
        return self.label


class _Base(abc.ABC):
    """A continuous distribution X with closed-form partial means."""

    @abc.abstractmethod
    def cdf(self, x: np.ndarray) -> np.ndarray: ...

    @abc.abstractmethod
    def sf(self, x: np.ndarray) -> np.ndarray: ...

    @abc.abstractmethod
    def pdf(self, x: np.ndarray) -> np.ndarray: ...

    @abc.abstractmethod
    def ppf(self, q: np.ndarray) -> np.ndarray: ...

    @abc.abstractmethod
    def partial_mean(self, a: float, b: float) -> float:
        """E[X; a < X < b], for a <= b (either may be infinite)."""

    @abc.abstractmethod
    def mean(self) -> float: ...

    @abc.abstractmethod
    def draw(self, rng: np.random.Generator, size: Any) -> np.ndarray: ...

    @abc.abstractmethod
    def label(self) -> str: ...


class _Gaussian(_Base):
    def __init__(self, mu: float, std: float):
        self.mu, self.std = mu, std

    def _z(self, x):
        return (np.asarray(x, dtype=np.float64) - self.mu) / self.std

    def cdf(self, x):
        return special.ndtr(self._z(x))

    def sf(self, x):
        return special.ndtr(-self._z(x))

    def pdf(self, x):
        z = self._z(x)
        return np.exp(-0.5 * z * z) / (self.std * math.sqrt(2 * math.pi))

    def ppf(self, q):
        return self.mu + self.std * special.ndtri(q)

    def partial_mean(self, a, b):
        # x = mu + std z:  mu * P(a<X<b) + std * (phi(z_a) - phi(z_b))
        za, zb = float(self._z(a)), float(self._z(b))
        phi = lambda z: 0.0 if math.isinf(z) else math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)  # noqa: E731
        mass = float(special.ndtr(zb) - special.ndtr(za)) if zb < 0 else float(special.ndtr(-za) - special.ndtr(-zb))
        return self.mu * mass + self.std * (phi(za) - phi(zb))

    def mean(self):
        return self.mu

    def draw(self, rng, size):
        return rng.normal(self.mu, self.std, size)

    def label(self):
        return f"gaussian(mean={_fmt(self.mu)}, std={_fmt(self.std)})"


class _Lognormal(_Base):
    """ln X ~ N(mu, sigma^2) with mu = ln(mean) - sigma^2/2."""

    def __init__(self, mean: float, sigma: float):
        self.m, self.sigma = mean, sigma
        self.mu = math.log(mean) - 0.5 * sigma * sigma

    def _z(self, x):
        x = np.asarray(x, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(x > 0, (np.log(np.where(x > 0, x, 1.0)) - self.mu) / self.sigma, -np.inf)

    def cdf(self, x):
        return special.ndtr(self._z(x))

    def sf(self, x):
        return special.ndtr(-self._z(x))

    def pdf(self, x):
        x = np.asarray(x, dtype=np.float64)
        z = self._z(x)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            d = np.exp(-0.5 * z * z) / (np.where(x > 0, x, 1.0) * self.sigma * math.sqrt(2 * math.pi))
        return np.where((x > 0) & np.isfinite(x), d, 0.0)

    def ppf(self, q):
        return np.exp(self.mu + self.sigma * special.ndtri(q))

    def partial_mean(self, a, b):
        # x f(x) is mean times the lognormal density with mu + sigma^2.
        za, zb = float(self._z(a)) - self.sigma, float(self._z(b)) - self.sigma
        return self.m * float(special.ndtr(-za) - special.ndtr(-zb))

    def mean(self):
        return self.m

    def draw(self, rng, size):
        return rng.lognormal(self.mu, self.sigma, size)

    def label(self):
        return f"lognormal(mu={_fmt(self.mu)}, sigma={_fmt(self.sigma)})"


class _Pareto(_Base):
    """Classical Pareto: P(X > x) = (x_m / x)^alpha for x >= x_m."""

    def __init__(self, mean: float, alpha: float):
        self.m, self.alpha = mean, alpha
        self.xm = mean * (alpha - 1) / alpha

    def cdf(self, x):
        return 1.0 - self.sf(x)

    def sf(self, x):
        x = np.asarray(x, dtype=np.float64)
        return np.where(x > self.xm, (self.xm / np.maximum(x, self.xm)) ** self.alpha, 1.0)

    def pdf(self, x):
        x = np.asarray(x, dtype=np.float64)
        xx = np.maximum(x, self.xm)
        return np.where(x >= self.xm, self.alpha / xx * (self.xm / xx) ** self.alpha, 0.0)

    def ppf(self, q):
        with np.errstate(divide="ignore"):
            return self.xm * (1.0 - np.asarray(q, dtype=np.float64)) ** (-1.0 / self.alpha)

    def partial_mean(self, a, b):
        # int x * alpha xm^alpha x^(-alpha-1) dx = alpha xm / (alpha-1) * [(xm/x)^(alpha-1)]
        a, b = max(a, self.xm), max(b, self.xm)
        t = lambda x: (self.xm / x) ** (self.alpha - 1)  # noqa: E731
        return self.m * (t(a) - t(b))

    def mean(self):
        return self.m

    def draw(self, rng, size):
        # Generator.pareto draws the Lomax (Pareto II) law; 1 + it is classical Pareto(x_m = 1).
        return self.xm * (1.0 + rng.pareto(self.alpha, size))

    def label(self):
        return f"pareto(alpha={_fmt(self.alpha)}, x_m={_fmt(self.xm)})"


class _Exponential(_Base):
    def __init__(self, mean: float):
        self.m = mean

    def cdf(self, x):
        x = np.asarray(x, dtype=np.float64)
        return -np.expm1(-np.maximum(x, 0.0) / self.m)

    def sf(self, x):
        x = np.asarray(x, dtype=np.float64)
        return np.exp(-np.maximum(x, 0.0) / self.m)

    def pdf(self, x):
        x = np.asarray(x, dtype=np.float64)
        return np.where(x >= 0, np.exp(-np.maximum(x, 0.0) / self.m) / self.m, 0.0)

    def ppf(self, q):
        with np.errstate(divide="ignore"):
            return -self.m * np.log1p(-np.asarray(q, dtype=np.float64))

    def partial_mean(self, a, b):
        # int x e^(-x/m)/m dx = -(x + m) e^(-x/m)
        t = lambda x: 0.0 if math.isinf(x) else (x + self.m) * math.exp(-x / self.m)  # noqa: E731
        return t(max(a, 0.0)) - t(max(b, 0.0))

    def mean(self):
        return self.m

    def draw(self, rng, size):
        return rng.exponential(self.m, size)

    def label(self):
        return f"exponential(mean={_fmt(self.m)})"


class _Uniform(_Base):
    """U[a, b] (a < b)."""

    def __init__(self, a: float, b: float):
        self.a, self.b = a, b

    def cdf(self, x):
        x = np.asarray(x, dtype=np.float64)
        return np.clip((x - self.a) / (self.b - self.a), 0.0, 1.0)

    def sf(self, x):
        x = np.asarray(x, dtype=np.float64)
        return np.clip((self.b - x) / (self.b - self.a), 0.0, 1.0)

    def pdf(self, x):
        x = np.asarray(x, dtype=np.float64)
        return np.where((x >= self.a) & (x <= self.b), 1.0 / (self.b - self.a), 0.0)

    def ppf(self, q):
        return self.a + np.asarray(q, dtype=np.float64) * (self.b - self.a)

    def partial_mean(self, a, b):
        lo, hi = min(max(a, self.a), self.b), min(max(b, self.a), self.b)
        return (hi * hi - lo * lo) / (2.0 * (self.b - self.a))

    def mean(self):
        return 0.5 * (self.a + self.b)

    def draw(self, rng, size):
        return rng.uniform(self.a, self.b, size)

    def label(self):
        return f"uniform[{_fmt(self.a)}, {_fmt(self.b)}]"


def _atan_diff(x, y):
    """atan(x) - atan(y) without cancellation: arg((1 + ix)(1 - iy))."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    return np.arctan2(x - y, 1.0 + x * y)


def _log_ratio(x, y):
    """ln((1 + x^2) / (1 + y^2)) without cancellation."""
    return np.log1p((x - y) * (x + y) / (1.0 + y * y))


def cauchy_truncated_mean(loc: float, scale: float, low: float, high: float) -> float:
    """Mean of Cauchy(loc, scale) conditioned on [low, high], closed form.

    int x f(x) dx = loc * (atan z_b - atan z_a)/pi + scale/(2 pi) * ln((1 + z_b^2)/(1 + z_a^2)),
    divided by the mass (atan z_b - atan z_a)/pi.
    """
    return float(_trunc_mean(loc, scale, low, high))


def _trunc_mean(loc, scale: float, low: float, high: float):
    """Vectorised over ``loc``: see :func:`cauchy_truncated_mean`."""
    loc = np.asarray(loc, dtype=np.float64)
    za, zb = (low - loc) / scale, (high - loc) / scale
    return loc + scale * _log_ratio(zb, za) / (2.0 * _atan_diff(zb, za))


def solve_cauchy_location(target: float, scale: float, low: float, high: float, key: str = "latency") -> float:
    """The location whose [low, high]-truncated Cauchy has mean ``target``.

    The truncated mean is not monotone in the location: it tends to the
    midpoint both as loc -> +-inf and at loc = midpoint, and dips below
    (rises above) it in between. Of the two roots we take the one between
    the extremum and the midpoint, i.e. the location nearest the window.
    """
    mid = 0.5 * (low + high)
    if target == mid:
        return mid
    side = -1.0 if target < mid else 1.0
    far = mid + side * (10.0 * (high - low) + 10.0 * scale + (high - low) / 2)
    f = lambda m: side * _trunc_mean(m, scale, low, high)  # noqa: E731  (maximised)
    grid = np.linspace(mid, far, 4001)
    vals = f(grid)
    i = int(np.argmax(vals))
    lo_i, hi_i = max(i - 1, 0), min(i + 1, grid.size - 1)
    res = optimize.minimize_scalar(lambda m: -float(f(m)), bounds=tuple(sorted((grid[lo_i], grid[hi_i]))),
                                   method="bounded", options={"xatol": 1e-12 * max(1.0, abs(mid))})
    ext = res.x if -res.fun >= vals[i] else grid[i]
    reach = cauchy_truncated_mean(ext, scale, low, high)
    if not side * (target - reach) <= 0:
        raise ConfigError(f"{key}.mean", target,
                          f"a Cauchy of scale {scale:g} truncated to [{low:g}, {high:g}] can only have a mean "
                          f"between {min(reach, mid):.6g} and {max(reach, mid):.6g}")
    if target == reach:
        return float(ext)
    g = lambda m: cauchy_truncated_mean(m, scale, low, high) - target  # noqa: E731
    return float(optimize.brentq(g, min(ext, mid), max(ext, mid), xtol=1e-14, rtol=1e-15, maxiter=500))


class _TruncCauchy(_Base):
    """Cauchy(loc, scale) conditioned on [low, high]."""

    def __init__(self, loc: float, scale: float, low: float, high: float, solved_for: Optional[float] = None):
        self.loc, self.scale, self.low, self.high = loc, scale, low, high
        self.solved_for = solved_for
        self.za, self.zb = (low - loc) / scale, (high - loc) / scale
        self.width = float(_atan_diff(self.zb, self.za))  # pi * mass of the window

    def _z(self, x):
        return (np.clip(np.asarray(x, dtype=np.float64), self.low, self.high) - self.loc) / self.scale

    def cdf(self, x):
        return _atan_diff(self._z(x), self.za) / self.width

    def sf(self, x):
        return _atan_diff(self.zb, self._z(x)) / self.width

    def pdf(self, x):
        x = np.asarray(x, dtype=np.float64)
        z = (x - self.loc) / self.scale
        with np.errstate(over="ignore"):
            d = 1.0 / (self.scale * self.width * (1.0 + z * z))
        return np.where((x >= self.low) & (x <= self.high), d, 0.0)

    def ppf(self, q):
        q = np.asarray(q, dtype=np.float64)
        z = np.tan(np.arctan(self.za) + q * self.width)
        return np.clip(self.loc + self.scale * z, self.low, self.high)

    def partial_mean(self, a, b):
        a, b = min(max(a, self.low), self.high), min(max(b, self.low), self.high)
        za, zb = (a - self.loc) / self.scale, (b - self.loc) / self.scale
        return float(self.loc * _atan_diff(zb, za) + 0.5 * self.scale * _log_ratio(zb, za)) / self.width

    def mean(self):
        return cauchy_truncated_mean(self.loc, self.scale, self.low, self.high)

    def draw(self, rng, size):
        return self.ppf(rng.random(size))

    def label(self):
        solved = f" (solved for mean {_fmt(self.solved_for)})" if self.solved_for is not None else ""
        return (f"cauchy(median={_fmt(self.loc)}{solved}, scale={_fmt(self.scale)}) "
                f"truncated to [{_fmt(self.low)}, {_fmt(self.high)}]")


class _Cauchy(_Base):
    """Cauchy(loc, scale) on the whole line (clipped, not conditioned, by :class:`_Transformed`)."""

    def __init__(self, loc: float, scale: float):
        self.loc, self.scale = loc, scale

    def _z(self, x):
        return (np.asarray(x, dtype=np.float64) - self.loc) / self.scale

    def cdf(self, x):
        return 0.5 + np.arctan(self._z(x)) / np.pi

    def sf(self, x):
        return 0.5 - np.arctan(self._z(x)) / np.pi

    def pdf(self, x):
        z = self._z(x)
        return 1.0 / (np.pi * self.scale * (1.0 + z * z))

    def ppf(self, q):
        with np.errstate(divide="ignore"):
            return self.loc + self.scale * np.tan(np.pi * (np.asarray(q, dtype=np.float64) - 0.5))

    def partial_mean(self, a, b):
        # int_a^b x f(x) dx = loc (atan z_b - atan z_a)/pi + scale/(2 pi) ln((1 + z_b^2)/(1 + z_a^2))
        za, zb = float(self._z(a)), float(self._z(b))
        return float(self.loc * _atan_diff(zb, za) + 0.5 * self.scale * _log_ratio(zb, za)) / np.pi

    def mean(self):
        return float("nan")  # undefined; only its clipped versions are built

    def draw(self, rng, size):
        return self.loc + self.scale * rng.standard_cauchy(size)

    def label(self):
        return f"cauchy(median={_fmt(self.loc)}, scale={_fmt(self.scale)})"


def _clipped_mean(base: _Base, low: float, high: float) -> float:
    """E[clip(X, low, high)]."""
    top = 0.0 if math.isinf(high) else high * float(base.sf(high))
    return low * float(base.cdf(low)) + top + base.partial_mean(low, high)


def _rounded_mean(base: _Base, low: float, high: float) -> float:
    """E[clip(rint(X), low, high)], summing integer atoms.

    Atoms k with low < k < high have mass S(k - 1/2) - S(k + 1/2); they are
    summed by parts (k0 S(k0 - 1/2) - k1 S(k1 + 1/2) + sum S(k - 1/2)) so that
    far-tail atoms keep their relative precision. Atoms beyond the
    (1e-15, 1 - 1e-15) quantiles, or beyond a million atoms, are integrated
    in closed form with the Euler-Maclaurin correction (f(c) - f(d)) / 12.
    """
    k_first = math.floor(low) + 1.0  # first interior integer
    k_last = math.ceil(high) - 1.0 if math.isfinite(high) else math.inf
    total = low * float(base.cdf(math.floor(low) + 0.5))
    if math.isfinite(high):
        total += high * float(base.sf(math.ceil(high) - 0.5))
    if k_first > k_last:
        return total
    lo_q, hi_q = float(base.ppf(_TAIL_EPS)), float(base.ppf(1.0 - _TAIL_EPS))
    ka = max(k_first, math.floor(lo_q) if math.isfinite(lo_q) else k_first)
    kb = min(k_last, math.ceil(hi_q) if math.isfinite(hi_q) else k_last, ka + _MAX_ATOMS)
    if ka > k_first:  # negligible lower tail (< 1e-15 mass)
        total += base.partial_mean(k_first - 0.5, ka - 0.5)
    if ka <= kb:
        k = np.arange(ka + 1.0, kb + 1.0)
        total += ka * float(base.sf(ka - 0.5)) - kb * float(base.sf(kb + 0.5)) + float(np.sum(base.sf(k - 0.5)))
    else:
        kb = ka - 1.0
    if kb < k_last:  # upper tail in closed form
        c, d = kb + 0.5, k_last + 0.5
        total += base.partial_mean(c, d) + (float(base.pdf(c)) - float(base.pdf(d))) / 12.0
    return total


class _Transformed(Latency):
    """clip(rint(X), low, high) for a continuous base X (rint only if ``discrete``)."""

    def __init__(self, base: _Base, low: float, high: float, discrete: bool, label: str):
        self.base, self.low, self.high, self.discrete, self.label = base, low, high, discrete, label

    def sample(self, rng: np.random.Generator, size: Any = None) -> np.ndarray:
        return self.settle(self.draw_raw(rng, size))

    def draw_raw(self, rng: np.random.Generator, size: Any = None) -> np.ndarray:
        return np.asarray(self.base.draw(rng, size), dtype=np.float64)  # the base's own fresh draws: settled in place

    def settle(self, x: np.ndarray) -> np.ndarray:
        if self.discrete:
            np.rint(x, out=x)
        return np.clip(x, self.low, self.high, out=x)

    def mean(self) -> float:
        if self.discrete:
            return _rounded_mean(self.base, self.low, self.high)
        if math.isinf(self.high) and float(self.base.cdf(self.low)) == 0.0:
            return self.base.mean()  # no clipping can happen
        return _clipped_mean(self.base, self.low, self.high)

    def cdf(self, x: Any) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        # rint(X) <= x  <=>  X < floor(x) + 1/2 (ties have probability zero)
        t = np.floor(x) + 0.5 if self.discrete else x
        with np.errstate(invalid="ignore"):
            v = self.base.cdf(np.where(np.isfinite(t), t, 0.0))
        v = np.where(x < self.low, 0.0, np.where(x >= self.high, 1.0, v))
        return np.where(np.isnan(x), np.nan, v)

    def quantile(self, q: Any) -> np.ndarray:
        q = np.asarray(q, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            v = self.base.ppf(np.where(_bad_q(q), 0.5, q))
        if self.discrete:
            v = np.ceil(v - 0.5)  # smallest integer k with F(k + 1/2) >= q
        return np.where(_bad_q(q), np.nan, np.clip(v, self.low, self.high))

    def describe(self) -> str:
        return self.label


def _bounds(conf: LatencyConf) -> Tuple[float, float]:
    low = 0.0 if conf.low is None else float(conf.low)
    high = math.inf if conf.high is None else float(conf.high)
    return low, high


def _suffix(conf: LatencyConf, show_clip: bool) -> str:
    low, high = _bounds(conf)
    parts = ["rounded"] if conf.discrete else []
    if show_clip or conf.low is not None or conf.high is not None:
        parts.append(f"clipped to [{_fmt(low)}, {_fmt(high)}]")
    return (" " + ", ".join(parts)) if parts else ""


def _point(value: float, conf: LatencyConf, label: str) -> _Deterministic:
    low, high = _bounds(conf)
    v = float(np.rint(value)) if conf.discrete else float(value)
    return _Deterministic(min(max(v, low), high), label + _suffix(conf, False))


def _continuous(base: _Base, conf: LatencyConf) -> _Transformed:
    low, high = _bounds(conf)
    show = float(base.cdf(low)) > 0.0  # the default low = 0 clip is active
    return _Transformed(base, low, high, bool(conf.discrete), base.label() + _suffix(conf, show))


def _build_deterministic(conf: LatencyConf, key: str) -> Latency:
    return _point(conf.mean, conf, f"deterministic({_fmt(conf.mean)})")


def _build_gaussian(conf: LatencyConf, key: str) -> Latency:
    if conf.std == 0:
        return _point(conf.mean, conf, f"gaussian(mean={_fmt(conf.mean)}, std=0)")
    return _continuous(_Gaussian(float(conf.mean), float(conf.std)), conf)


def _build_lognormal(conf: LatencyConf, key: str) -> Latency:
    if conf.mean == 0:
        return _point(0.0, conf, "lognormal(mean=0)")
    return _continuous(_Lognormal(float(conf.mean), float(conf.sigma)), conf)


def _build_pareto(conf: LatencyConf, key: str) -> Latency:
    if conf.mean == 0:
        return _point(0.0, conf, "pareto(mean=0)")
    return _continuous(_Pareto(float(conf.mean), float(conf.alpha)), conf)


def _build_exponential(conf: LatencyConf, key: str) -> Latency:
    if conf.mean == 0:
        return _point(0.0, conf, "exponential(mean=0)")
    return _continuous(_Exponential(float(conf.mean)), conf)


def _build_cauchy(conf: LatencyConf, key: str) -> Latency:
    low, high, scale = float(conf.low), float(conf.high), float(conf.scale)
    if conf.cauchy_bounds == "clip":  # the paper's draw: clip(round(median + scale C), low, high)
        base = _Cauchy(float(conf.median), scale)
        label = f"{base.label()}{' rounded' if conf.discrete else ''}, clipped to [{_fmt(low)}, {_fmt(high)}]"
        return _Transformed(base, low, high, bool(conf.discrete), label)
    if conf.median is None:
        loc = solve_cauchy_location(float(conf.mean), scale, low, high, key)
        base = _TruncCauchy(loc, scale, low, high, solved_for=float(conf.mean))
    else:
        base = _TruncCauchy(float(conf.median), scale, low, high)
    # Rounding may step outside the window; clipping to it afterwards keeps draws inside.
    return _Transformed(base, low, high, bool(conf.discrete), base.label() + (" rounded" if conf.discrete else ""))


def _build_uniform(conf: LatencyConf, key: str) -> Latency:
    """U[low, high]; low defaults to 0 and high to 2 mean - low (matched to the mean)."""
    low = 0.0 if conf.low is None else float(conf.low)
    high = 2.0 * float(conf.mean) - low if conf.high is None else float(conf.high)
    if high <= low:
        return _point(low, conf, f"uniform[{_fmt(low)}, {_fmt(high)}]")
    base = _Uniform(low, high)
    return _Transformed(base, low, high, bool(conf.discrete), base.label() + (" rounded" if conf.discrete else ""))


def _build_geometric(conf: LatencyConf, key: str) -> Latency:
    """Integers 0, 1, 2, ... with mean ``mean`` (clipped to [low, high])."""
    label = f"geometric(mean={_fmt(conf.mean)}) on 0, 1, 2, ..."
    if conf.mean == 0:
        return _point(0.0, conf, label)
    low, high = _bounds(conf)
    return _Geometric(float(conf.mean), low, high, label + _suffix(conf, False))


def _read_column(conf: LatencyConf, key: str) -> np.ndarray:
    """The CSV column as float64 (racsim.pipeline.csvdata: ``#`` lines skipped, the header optional
    for a file of one column), or a ConfigError naming ``key.path``/``key.column`` and a bad value's line."""
    def readable(read):
        try:
            return read()
        except (OSError, ValueError, UnicodeDecodeError, pd.errors.ParserError) as e:  # EmptyDataError: a ValueError
            raise ConfigError(f"{key}.path", conf.path,
                              f"a readable CSV file: one column of numbers, or a header row naming the columns "
                              f"({type(e).__name__}: {e})") from e

    fields = readable(lambda: first_fields(conf.path))
    header = has_header(fields)
    col = conf.column
    if not header and len(fields) == 1:  # one column without a name: it is the data, whatever column says
        at = 0
    elif not header:
        raise ConfigError(f"{key}.path", conf.path, f"a header row naming its {len(fields)} columns (only a file "
                                                    f"of one column may go without one)")
    elif col not in fields:
        near = closest(str(col), fields)
        raise ConfigError(f"{key}.column", col, f"a column of {conf.path}" + (f" (did you mean {' or '.join(near)}?)"
                          if near else "") + f", which has {len(fields):,}: {listed(fields)}")
    else:
        at = fields.index(col)
    s = readable(lambda: read_column(conf.path, at, header))
    if not pd.api.types.is_numeric_dtype(s) or pd.api.types.is_bool_dtype(s):
        raise ConfigError(f"{key}.column", conf.column, f"a numeric column (it has dtype {s.dtype})")
    v = s.to_numpy(dtype=np.float64, na_value=np.nan)
    if v.size == 0:
        raise ConfigError(f"{key}.column", conf.column, "a column with at least one value (it is empty)")
    bad = np.flatnonzero(~np.isfinite(v))
    if bad.size:
        raise ConfigError(f"{key}.column", conf.column,
                          f"finite values only ({bad.size} are NaN, missing or infinite; the first on line "
                          f"{line_of(conf.path, int(bad[0]), header)} of {conf.path})")
    out = np.flatnonzero((v < 0) | (v > MAX_SECONDS))
    if out.size:
        raise ConfigError(f"{key}.column", conf.column,
                          f"durations in [0, {MAX_SECONDS:g}] seconds ({out.size} are not; the first, {v[out[0]]:g}, "
                          f"on line {line_of(conf.path, int(out[0]), header)} of {conf.path})")
    return v


def _build_empirical(conf: LatencyConf, key: str) -> Latency:
    """The column as measured; rescaled to ``mean`` when it is set, rounded (``discrete``) and
    clipped to [low, high]: each change a user's data undergoes is named in ``changes``."""
    v = _read_column(conf, key)
    label = f"empirical({conf.path}:{conf.column}, n={v.size}"
    changes = []
    if conf.mean is not None:
        col_mean = math.fsum(v) / v.size
        if col_mean == 0 and conf.mean != 0:
            raise ConfigError(f"{key}.mean", conf.mean, "null: the column is all zeros and cannot be rescaled")
        factor = 0.0 if conf.mean == 0 else float(conf.mean) / col_mean
        if not factor * v.max() <= MAX_SECONDS:  # inf or past it: a column of subnormal values, say
            raise ConfigError(f"{key}.mean", conf.mean, f"null: the column's mean ({col_mean:g} s) is too small to "
                                                        f"be rescaled to it (its largest value would pass {MAX_SECONDS:g} s)")
        v = v * factor
        label += f", rescaled x{factor:.4g} to mean {_fmt(conf.mean)}"
        changes.append(f"rescaled x{factor:.4g}, from its mean {_fmt(col_mean)} s to {key}.mean = {_fmt(conf.mean)} s "
                       f"({key}.mean=null uses the data as measured)")
    if conf.discrete:
        v = np.rint(v)
    low, high = _bounds(conf)
    clipped = int(np.count_nonzero((v < low) | (v > high)))
    if clipped:
        changes.append(f"{clipped} of {v.size} values clipped to [{_fmt(low)}, {_fmt(high)}] s ({key}.low, .high)")
    v = np.clip(v, low, high)
    return _Empirical(v, label + ")" + _suffix(conf, False), tuple(changes))


_BUILDERS = {
    "deterministic": _build_deterministic,
    "gaussian": _build_gaussian,
    "lognormal": _build_lognormal,
    "pareto": _build_pareto,
    "cauchy": _build_cauchy,
    "exponential": _build_exponential,
    "empirical": _build_empirical,
    "uniform": _build_uniform,
    "geometric": _build_geometric,
}


assert set(_BUILDERS) == set(LATENCY_KINDS), "latency.py must implement exactly config.LATENCY_KINDS"


def build_latency(conf: LatencyConf, key: str = "latency") -> Latency:
    """Validate ``conf`` (errors name ``key``) and build its distribution."""
    validate_latency(conf, key)
    return _BUILDERS[conf.kind](conf, key)


def whole_number_law(conf: LatencyConf, key: str) -> Latency:
    """:func:`build_latency` of a law of whole numbers >= 0 (a generation lag in policy versions,
    racsim.config.validate.pipeline.LAG_KINDS): an empirical column holding anything else is refused,
    naming the key and the first such value's line."""
    law = build_latency(conf, key)
    if isinstance(law, _Empirical):
        v = _read_column(conf, key)
        bad = np.flatnonzero(v != np.rint(v))
        if bad.size:
            header = has_header(first_fields(conf.path))
            raise ConfigError(f"{key}.column", conf.column,
                              f"whole numbers of policy versions ({bad.size} are not; the first, {v[bad[0]]:g}, on "
                              f"line {line_of(conf.path, int(bad[0]), header)} of {conf.path})")
    return law


TOKEN_CHUNK = 1 << 16  # requests whose token lengths TokenLengths.sample finishes at once


@dataclass(frozen=True)
class TokenLengths:
    """A request's token length for a reward model: rint(prompt) + rint(response), at least 1
    (float64, integer-valued), each of the two drawn from its own law, prompts first."""

    prompt: Latency
    response: Latency

    def sample(self, rng: np.random.Generator, size) -> np.ndarray:
        prompt = self.prompt.draw_raw(rng, size)
        response = self.response.draw_raw(rng, size)
        p, r = prompt.reshape(-1), response.reshape(-1)  # the prompts' draws take the result: no third array
        for i in range(0, p.size, TOKEN_CHUNK):  # a chunk at a time: its passes stay in the cache
            k = slice(i, i + TOKEN_CHUNK)
            a, b = self.prompt.settle(p[k]), self.response.settle(r[k])
            np.add(np.rint(a, out=a), np.rint(b, out=b), out=p[k])
            np.maximum(p[k], 1.0, out=p[k])
        return p.reshape(np.shape(prompt))


def token_lengths(prompt: LatencyConf, response: LatencyConf, key: str) -> TokenLengths:
    """The :class:`TokenLengths` of two token-length laws (errors name ``key``.prompt_tokens, ...)."""
    return TokenLengths(build_latency(prompt, f"{key}.prompt_tokens"), build_latency(response, f"{key}.response_tokens"))

