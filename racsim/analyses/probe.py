"""Static-batch advantage probe on scored (r_fast, r_slow) pairs.

The paper's appendix "Static-Batch Advantage-Quality Probe at 7B"
(``app:adv-quality-7b``) scores N prompts once with a fast head and a slow
oracle, treats sample t as optimizer step t, and compares three advantage
sequences over t = 0..N-1, all on one causal baseline ``bl``:

* ``A_sync    = r_slow - bl`` (the synchronous oracle),
* ``A_control = r_fast - bl`` (the slow signal discarded),
* ``A_rac[t]  = A_control[t] + sum_{s : s + Delta_s = t} w_age(Delta_s) (r_slow[s] - r_fast[s])``
  (RAC's forward injection with the identity actor, rho = 1, alpha = 1).

A correction that would land at t >= N is lost (the batch has ended); a
negative delay marks a result that never returns. Note that the probe lands a
result of delay Delta at step s + Delta, as the appendix writes it, whereas
eq. (1) of the method section injects it at step s + Delta + 1.

Also here: the identity-kernel collapse check (RAC at Lambda = I, rho = 1
equals the V-trace advantage, to the bit, through two code paths of
:mod:`racsim.learner.correctors`) and the slack sweep of Theorem 2.1 on the pairs
(Lambda[Delta = 0] = 1 - eta, the rest never returns).

The paper's pairs come from 7B reward models; :func:`synthetic_pairs` draws a
bivariate normal stand-in at a chosen Pearson correlation (the paper reports
r = -0.53 between its fast head and the oracle). Mind the moments: with equal
means the probe's l2 ratio is below 1 for every delay channel (a shifted
correction adds a second independent residual, so the error norm grows by
about sqrt(2)); the ratio exceeds 1 only when the mean offset between the two
heads dominates the residual's spread. :data:`PAPER_LIKE_MOMENTS` are moments
*fitted* (not reported by the paper) so that the large-N limit reproduces the
paper's deterministic-delay row; see its comment.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import replace
from typing import Any, Dict, Mapping, Sequence, Union

import numpy as np
import pandas as pd

from racsim.analyses.result import RunResult
from racsim.config.schema import LatencyConf
from racsim.config.validate import PROBE_DRAWS
from racsim.errors import ConfigError
from racsim.learner.correctors import (
    CorrectorParams,
    age_weight,
    causal_running_mean,
    corrected_advantage,
    correction_weight,
    vtrace_advantage,
)
from racsim.pipeline.latency import build_latency
from racsim.pipeline.schedule import INJECTED
from racsim.seeds import rng_for

__all__ = [
    "PAPER_CORRELATION",
    "PAPER_ETAS",
    "PAPER_LIKE_MOMENTS",
    "CHANNELS",
    "synthetic_pairs",
    "load_pairs",
    "probe_advantages",
    "probe_metrics",
    "paper_channel",
    "delays_from",
    "paper_delays",
    "identity_collapse",
    "slack_sweep",
    "run_probe",
]


#: Pearson correlation of the paper's random-init fast head against the oracle.
PAPER_CORRELATION = -0.53


#: Slack deficits of the paper's 7B slack verification (Appendix B).
PAPER_ETAS = (0.05, 0.10, 0.15, 0.20, 0.30, 0.50)


#: Moments of a synthetic stand-in fitted to the paper's probe table (an
#: inference, not a number the paper states). For large N, a causal baseline
#: bl ~ E[r_fast], correlation rho and deterministic delay Delta << N:
#: cos(A_control, A_sync) = rho s_s / sqrt(s_s^2 + m^2) and
#: l2_ratio^2 = (m^2 + v) / (2 v), with m = E[r_slow] - E[r_fast] and
#: v = Var(r_slow - r_fast). Solving cos = -0.22, l2 = 1.38 at rho = -0.53,
#: s_s = 1 gives m = 2.19 and s_f = 0.465; the third number of the row,
#: cos(A_rac, A_sync) = 0.73, then follows (0.729) without being fitted.
PAPER_LIKE_MOMENTS = {"slow_mean": 2.19, "slow_std": 1.0, "fast_mean": 0.0, "fast_std": 0.465}


_Rng = Union[np.random.Generator, int, None]


def _rng(rng: _Rng) -> np.random.Generator:
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


def _rewards(r_fast, r_slow):
    f = np.asarray(r_fast, dtype=np.float64)
    s = np.asarray(r_slow, dtype=np.float64)
    if f.ndim != 1 or s.shape != f.shape or f.size == 0:
        raise ValueError(f"r_fast and r_slow must be 1-D of one length >= 1, got shapes {f.shape} and {s.shape}")
    for name, v in (("r_fast", f), ("r_slow", s)):
        if not np.all(np.isfinite(v)):
            raise ValueError(f"{name} has {int(np.sum(~np.isfinite(v)))} non-finite value(s)")
    return f, s


def synthetic_pairs(
    n: int,
    correlation: float = PAPER_CORRELATION,
    rng: _Rng = None,
    slow_mean: float = 0.0,
    slow_std: float = 1.0,
    fast_mean: float = 0.0,
    fast_std: float = 1.0,
) -> pd.DataFrame:
    """``n`` bivariate-normal (r_fast, r_slow) pairs with Pearson correlation
    ``correlation`` (exact in the population; a sample of n has it within
    about 1/sqrt(n)).

    r_slow = slow_mean + slow_std z0,
    r_fast = fast_mean + fast_std (c z0 + sqrt(1 - c^2) z1), z0, z1 iid N(0, 1),
    drawn as one (2, n) standard-normal block from ``rng`` (a Generator or a
    seed). Returns a DataFrame with float64 columns ``r_fast``, ``r_slow``.
    """
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise ValueError(f"n = {n!r}: an integer >= 1")
    c = float(correlation)
    if not -1.0 <= c <= 1.0:
        raise ValueError(f"correlation = {correlation!r}: a number in [-1, 1]")
    for key, v in (("slow_std", slow_std), ("fast_std", fast_std)):
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"{key} = {v!r}: a finite number >= 0")
    for key, v in (("slow_mean", slow_mean), ("fast_mean", fast_mean)):
        if not math.isfinite(v):
            raise ValueError(f"{key} = {v!r}: a finite number")
    z = _rng(rng).standard_normal((2, int(n)))
    slow = slow_mean + slow_std * z[0]
    fast = fast_mean + fast_std * (c * z[0] + math.sqrt(1.0 - c * c) * z[1])
    return pd.DataFrame({"r_fast": fast, "r_slow": slow})


MAX_REWARD = 1e12  # |r| of a scored pair; past it the probe's sums of squares overflow to inf


def load_pairs(path, fast_col: str = "r_fast", slow_col: str = "r_slow") -> pd.DataFrame:
    """Read scored pairs from a ``.csv`` or ``.parquet`` file.

    Returns a DataFrame with float64 columns ``r_fast`` and ``r_slow`` (taken
    from ``fast_col`` and ``slow_col``), in file order, index 0..N-1.
    Raises ValueError naming the path or the column when the file is missing,
    unreadable or of another type, a column is missing, not numeric (booleans
    count as not numeric) or has a NaN/missing/infinite value, or there are
    fewer than 2 rows.
    """
    p = os.fspath(path)
    if not os.path.isfile(p):
        raise ValueError(f"pairs file {p!r}: no such file")
    ext = os.path.splitext(p)[1].lower()
    try:
        if ext == ".csv":
            df = pd.read_csv(p)
        elif ext in (".parquet", ".pq"):
            df = pd.read_parquet(p)
        else:
            raise ValueError(f"pairs file {p!r}: unknown type {ext or '(no extension)'!r}; use .csv or .parquet")
    except ValueError as e:
        if str(e).startswith("pairs file"):
            raise
        raise ValueError(f"pairs file {p!r}: cannot be read as {ext[1:]} ({type(e).__name__}: {e})") from e
    except Exception as e:  # parser, Arrow and OS errors of the readers
        raise ValueError(f"pairs file {p!r}: cannot be read as {ext[1:]} ({type(e).__name__}: {e})") from e
    out = {}
    for role, col in (("r_fast", fast_col), ("r_slow", slow_col)):
        if col not in df.columns:
            raise ValueError(f"pairs file {p!r}: no column {col!r} (for {role}); it has: "
                             + ", ".join(map(str, df.columns)))
        s = df[col]
        if not pd.api.types.is_numeric_dtype(s) or pd.api.types.is_bool_dtype(s):
            raise ValueError(f"pairs file {p!r}: column {col!r} is not numeric (dtype {s.dtype})")
        v = s.to_numpy(dtype=np.float64, na_value=np.nan)
        bad = np.flatnonzero(~np.isfinite(v))
        if bad.size:
            raise ValueError(f"pairs file {p!r}: column {col!r} has {bad.size} NaN, missing or infinite "
                             f"value(s), the first in row {int(bad[0])}")
        if v.size and np.abs(v).max() > MAX_REWARD:
            raise ValueError(f"pairs file {p!r}: column {col!r} has values beyond +-{MAX_REWARD:g} "
                             f"(the first in row {int(np.argmax(np.abs(v) > MAX_REWARD))}): not rewards")
        out[role] = v
    if len(df) < 2:
        raise ValueError(f"pairs file {p!r}: {len(df)} row(s); the probe needs at least 2")
    for role, col in (("r_fast", fast_col), ("r_slow", slow_col)):
        if np.ptp(out[role]) == 0:
            raise ValueError(f"pairs file {p!r}: column {col!r} is constant ({out[role][0]:g}): the probe needs "
                             f"rewards that vary (a correlation and a spread)")
    return pd.DataFrame(out)


def _delays(delays, n: int) -> np.ndarray:
    d = np.asarray(delays)
    if d.shape != (n,):
        raise ValueError(f"delays must have shape ({n},), got {d.shape}")
    if d.dtype.kind == "b" or d.dtype.kind not in "iuf":
        raise ValueError(f"delays must be integers (dtype {d.dtype})")
    if d.dtype.kind == "f":
        if not np.all(np.isfinite(d)) or np.any(d != np.round(d)):
            raise ValueError("delays must be whole numbers of steps (finite, integral)")
    return d.astype(np.int64)


def probe_advantages(r_fast, r_slow, delays, tau_age: float = 1000.0) -> Dict[str, np.ndarray]:
    """The probe's three advantage sequences (see the module docstring).

    ``delays[s]`` is the delay in steps of sample s's slow result: an integer
    >= 0 lands it at step s + delays[s] (lost if that is >= n), a negative one
    means it never returns. The baseline is ``causal_running_mean(r_fast)``:
    bl[t] is the mean of r_fast[0..t-1] (bl[0] = 0), i.e. only what is known
    at step t; all three sequences share it. Weights are
    ``w_age(Delta) = exp(-Delta / tau_age)`` (``tau_age = inf``: 1), alpha = 1,
    rho = 1.

    Evaluation: the delay-0 corrections (sample t's own result, landing at t)
    go through :func:`~racsim.learner.correctors.corrected_advantage` with weight
    w_age(0) = 1, i.e. in replacement form, and the delayed ones are summed
    per landing step with ``np.bincount`` and added. This is algebraically the
    formula above, and with every delay 0 it makes ``A_rac == A_sync`` bit
    for bit (the literal additive form differs in the last bit).

    Returns a dict of float64/int/bool arrays of length n: ``baseline``,
    ``A_sync``, ``A_control``, ``A_rac``, ``correction`` (the total weight *
    residual landing at each step, own result included), ``landing`` (step
    where sample s's correction lands, -1 if lost), ``never_returned``
    (delay < 0), ``past_end`` (lands at >= n) and ``lost`` (either).
    """
    f, s = _rewards(r_fast, r_slow)
    n = f.size
    d = _delays(delays, n)
    bl = causal_running_mean(f)
    x = s - f
    w = age_weight(np.maximum(d, 0), tau_age)
    land = np.arange(n) + d
    never = d < 0
    past = ~never & (land >= n)
    ok = ~(never | past)
    own = ok & (d == 0)
    late = ok & (d > 0)
    wx = w * x
    later = np.bincount(land[late], weights=wx[late], minlength=n)
    a_rac = corrected_advantage(f, s, bl, np.where(own, w, 0.0)) + later
    correction = np.bincount(land[ok], weights=wx[ok], minlength=n)
    return {
        "baseline": bl,
        "A_sync": vtrace_advantage(s, bl),
        "A_control": f - bl,
        "A_rac": a_rac,
        "correction": correction,
        "landing": np.where(ok, land, -1),
        "never_returned": never,
        "past_end": past,
        "lost": ~ok,
    }


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return math.nan
    return float(np.dot(a, b) / (na * nb))


def probe_metrics(adv: Mapping[str, np.ndarray]) -> Dict[str, float]:
    """Metrics of the paper's probe table from :func:`probe_advantages`' output.

    ``l2_control = ||A_control - A_sync||``, ``l2_rac = ||A_rac - A_sync||``,
    ``l2_ratio = l2_control / l2_rac`` (> 1: RAC is closer to the oracle;
    inf when l2_rac = 0 < l2_control, nan when both are 0),
    ``cos_control = cos(A_control, A_sync)``, ``cos_rac = cos(A_rac, A_sync)``
    (nan for a zero vector), and the fractions of corrections lost
    (``fraction_lost``), of results that never returned (``fraction_never``)
    and of those landing past the end of the batch (``fraction_past_end``).
    """
    sync, ctrl, rac = (np.asarray(adv[k], dtype=np.float64) for k in ("A_sync", "A_control", "A_rac"))
    l2c = float(np.linalg.norm(ctrl - sync))
    l2r = float(np.linalg.norm(rac - sync))
    if l2r > 0:
        ratio = l2c / l2r
    else:
        ratio = math.inf if l2c > 0 else math.nan
    return {
        "n": int(sync.size),
        "l2_control": l2c,
        "l2_rac": l2r,
        "l2_ratio": ratio,
        "cos_control": _cos(ctrl, sync),
        "cos_rac": _cos(rac, sync),
        "fraction_lost": float(np.mean(adv["lost"])),
        "fraction_never": float(np.mean(adv["never_returned"])),
        "fraction_past_end": float(np.mean(adv["past_end"])),
    }


#: The paper's three probe channels (delays in optimizer steps, rounded):
#: deterministic 5; lognormal with mu = 1.5, sigma = 0.8 (LatencyConf is
#: matched to the mean, so mean = exp(mu + sigma^2 / 2) = exp(1.82) ~ 6.17);
#: Pareto with alpha = 2.5. The paper gives no Pareto scale; we take the
#: classical Pareto with x_m = 1 (numpy's ``Generator.pareto`` draws the Lomax
#: law and 1 + Lomax is that Pareto; it is what LatencyConf's pareto samples),
#: whose mean is alpha / (alpha - 1) = 5/3. Every draw is then >= 1: about 64%
#: round to 1, 26% to 2.
CHANNELS = ("deterministic", "lognormal", "pareto")


def paper_channel(name: str) -> LatencyConf:
    """A fresh :class:`LatencyConf` for one of the paper's probe channels (see :data:`CHANNELS`)."""
    if name == "deterministic":
        return LatencyConf(kind="deterministic", mean=5.0, discrete=True)
    if name == "lognormal":
        mu, sigma = 1.5, 0.8
        return LatencyConf(kind="lognormal", mean=math.exp(mu + 0.5 * sigma * sigma), sigma=sigma, discrete=True)
    if name == "pareto":
        alpha = 2.5
        return LatencyConf(kind="pareto", mean=alpha / (alpha - 1.0), alpha=alpha, discrete=True)
    raise ValueError(f"delay channel {name!r}: one of {', '.join(CHANNELS)} (or pass a LatencyConf)")


def delays_from(spec: Union[str, LatencyConf], n: int, rng: _Rng = None) -> np.ndarray:
    """``n`` integer delays (steps) from a paper channel name or a LatencyConf.

    The LatencyConf is built with :func:`~racsim.pipeline.latency.build_latency` (its
    durations read as steps) and sampled with ``rng`` (a Generator or a
    seed); draws are rounded to the nearest integer whether or not the conf
    is ``discrete``. Returns an int64 array of shape (n,), all >= 0.
    """
    if isinstance(n, bool) or int(n) != n or n < 0:
        raise ValueError(f"n = {n!r}: an integer >= 0")
    if isinstance(spec, str):
        conf, key = paper_channel(spec), f"probe.delays.{spec}"
    elif isinstance(spec, LatencyConf):
        conf, key = replace(spec), "probe.delays"
    else:
        raise ValueError(f"delay spec {spec!r}: a channel name ({', '.join(CHANNELS)}) or a LatencyConf")
    draws = build_latency(conf, key).sample(_rng(rng), int(n))
    return np.rint(draws).astype(np.int64)


def paper_delays(n: int, rng: _Rng = None) -> Dict[str, np.ndarray]:
    """The paper's three channels, ``name -> delays_from(name, n, rng)``, drawn
    in the order of :data:`CHANNELS` from one generator."""
    g = _rng(rng)
    return {name: delays_from(name, n, g) for name in CHANNELS}


def identity_collapse(r_fast, r_slow) -> float:
    """``||A_RAC - A_V-trace||_inf`` at the identity kernel (paper: 0.0 in float64).

    A_RAC is :func:`~racsim.learner.correctors.corrected_advantage` with the weight
    that :func:`~racsim.learner.correctors.correction_weight` gives RAC for a result
    injected at Delta = 0 with ratio 1 (alpha = 1, rho_bar = 1, tau_age =
    1000: w_age(0) = 1); A_V-trace is
    :func:`~racsim.learner.correctors.vtrace_advantage`. Both use the causal running
    mean of r_fast as baseline. Exactly 0.0 for finite inputs.
    """
    f, s = _rewards(r_fast, r_slow)
    bl = causal_running_mean(f)
    delay = np.zeros(f.shape, dtype=np.int64)
    status = np.full(f.shape, INJECTED, dtype=np.int8)
    c = correction_weight("rac", delay, status, None, CorrectorParams(alpha=1.0, tau_age=1000.0, rho_bar=1.0))
    a_rac = corrected_advantage(f, s, bl, c)
    a_vt = vtrace_advantage(s, bl)
    return float(np.max(np.abs(a_rac - a_vt)))


def slack_sweep(r_fast, r_slow, etas: Sequence[float] = PAPER_ETAS, rng: _Rng = 0, draws: int = PROBE_DRAWS) -> pd.DataFrame:
    """Theorem 2.1's slack, checked per sample on the pairs (paper Appendix B).

    For each eta in [0, 1]: Lambda[Delta = 0] = 1 - eta and the rest of the
    mass never returns (alpha = 1, w_age(0) = 1, rho = 1). With x = r_slow -
    r_fast and bl the causal running mean of r_fast:

    * expected corrected advantage = corrected_advantage with weight 1 - eta
      (= A_control + (1 - eta) x); ``empirical`` bias = that - A_sync;
      ``predicted`` bias = -eta x. Columns ``ratio_mean``, ``ratio_std``,
      ``ratio_max_dev`` summarise empirical / predicted over the samples
      where predicted != 0 (``n_ratio`` of them); ``max_abs_bias`` is the
      largest |empirical| (exactly 0 at eta = 0).
    * sampled: ``draws`` independent Bernoulli(1 - eta) landings per sample
      (from ``rng``, a Generator or a seed); ``sampled_mean_bias`` is the
      mean over samples and draws of corrected - A_sync, to be set beside
      ``predicted_mean_bias = -eta mean(x)``; ``sampled_se`` is its exact
      standard error given the pairs, sqrt(eta (1 - eta) sum x^2) /
      (n sqrt(draws)), and ``sampled_z`` the difference in SE units.
    """
    f, s = _rewards(r_fast, r_slow)
    g = _rng(rng)
    if isinstance(draws, bool) or int(draws) != draws or draws < 1:
        raise ValueError(f"draws = {draws!r}: an integer >= 1")
    n = f.size
    bl = causal_running_mean(f)
    a_sync = vtrace_advantage(s, bl)
    x = s - f
    rows = []
    for eta in etas:
        eta = float(eta)
        if not 0.0 <= eta <= 1.0:
            raise ValueError(f"eta = {eta!r}: a number in [0, 1]")
        lam0 = 1.0 - eta
        emp = corrected_advantage(f, s, bl, lam0) - a_sync
        pred = -eta * x
        m = pred != 0
        ratio = emp[m] / pred[m]
        landed = (g.random((int(draws), n)) < lam0).astype(np.float64)
        sampled = corrected_advantage(f, s, bl, landed) - a_sync
        se = math.sqrt(eta * lam0 * float(np.sum(x * x))) / (n * math.sqrt(draws))
        pred_mean = -eta * float(np.mean(x))
        smean = float(np.mean(sampled))
        rows.append({
            "eta": eta,
            "lambda0": lam0,
            "n": n,
            "n_ratio": int(m.sum()),
            "ratio_mean": float(np.mean(ratio)) if ratio.size else math.nan,
            "ratio_std": float(np.std(ratio)) if ratio.size else math.nan,
            "ratio_max_dev": float(np.max(np.abs(ratio - 1.0))) if ratio.size else math.nan,
            "max_abs_bias": float(np.max(np.abs(emp))),
            "mean_bias": float(np.mean(emp)),
            "predicted_mean_bias": pred_mean,
            "sampled_mean_bias": smean,
            "sampled_se": se,
            "sampled_z": (smean - pred_mean) / se if se > 0 else (0.0 if smean == pred_mean else math.nan),
            "draws": int(draws),
        })
    return pd.DataFrame(rows)


def run_probe(pairs_df: pd.DataFrame, channels: Mapping[str, np.ndarray], tau_age: float = 1000.0) -> pd.DataFrame:
    """One row per delay channel: :func:`probe_metrics` of the probe on the pairs.

    ``pairs_df`` has columns ``r_fast`` and ``r_slow`` (as from
    :func:`load_pairs` or :func:`synthetic_pairs`); ``channels`` maps a name
    to its delays (length N, as from :func:`delays_from` or
    :func:`paper_delays`). Columns: channel, n, mean_delay (over results that
    return), tau_age, then the metrics.
    """
    for col in ("r_fast", "r_slow"):
        if col not in pairs_df.columns:
            raise ValueError(f"pairs_df has no column {col!r} (it has: {', '.join(map(str, pairs_df.columns))})")
    f = pairs_df["r_fast"].to_numpy(dtype=np.float64)
    s = pairs_df["r_slow"].to_numpy(dtype=np.float64)
    rows = []
    for name, delays in channels.items():
        adv = probe_advantages(f, s, delays, tau_age)
        d = _delays(delays, f.size)
        back = d[d >= 0]
        rows.append({"channel": name, "mean_delay": float(back.mean()) if back.size else math.nan,
                     "tau_age": float(tau_age), **probe_metrics(adv)})
    cols = ["channel", "n", "mean_delay", "tau_age"]
    df = pd.DataFrame(rows)
    return df[cols + [c for c in df.columns if c not in cols]] if rows else df


def probe_study(cfg: Any) -> RunResult:
    """The static-batch advantage probe (paper appendix G) on pairs from a file or synthetic."""
    pc = cfg.study.probe
    rng = rng_for(cfg.seed, "probe")
    if pc.pairs:
        try:
            pairs = load_pairs(pc.pairs, pc.fast_col, pc.slow_col)
        except ValueError as ex:
            raise ConfigError("study.probe.pairs", pc.pairs, str(ex)) from None
    else:
        pairs = synthetic_pairs(pc.n, pc.correlation, rng, slow_mean=pc.slow_mean, slow_std=pc.slow_std,
                                  fast_mean=pc.fast_mean, fast_std=pc.fast_std)
    t0 = time.perf_counter()
    table = run_probe(pairs, paper_delays(len(pairs), rng), tau_age=cfg.corrector.tau_age)
    table.insert(0, "scenario", cfg.name)
    table.insert(1, "study", cfg.study.paper or "")
    r_fast, r_slow = pairs["r_fast"].to_numpy(), pairs["r_slow"].to_numpy()
    identity = pd.DataFrame({"scenario": [cfg.name], "study": [cfg.study.paper or ""], "n": [len(pairs)],
                             "pearson_r": [float(np.corrcoef(r_fast, r_slow)[0, 1])],
                             "linf_rac_vs_vtrace": [identity_collapse(r_fast, r_slow)]})
    slack = slack_sweep(r_fast, r_slow, list(cfg.study.etas), rng=rng)
    return RunResult(results=table, timings={"probe_s": time.perf_counter() - t0},
                     extra={"identity": identity, "slack": slack})
