"""Correctors: what a late slow reward does to the advantage.

Small pure functions over NumPy arrays, vectorised over every leading axis
(trials, steps, batch, channels), in the style of rlax. Timing lives elsewhere:
the pipeline produces an :class:`~racsim.pipeline.schedule.ArrivalSchedule` (a delay
and a status per trial, step, sample and channel) and the functions here turn
it into the weights that the learner applies.

Notation follows the paper (``paper/rac-paper.tex``, section "Method"):

* ``X = r_slow - r_fast_bl``, the slow residual of one sample and channel;
* eq. (1), ``eq:rac``: the retroactive correction of a result that lands
  ``Delta`` optimizer steps late is
  ``delta = w_age(Delta) * alpha * rho_clip * X``, with
  ``w_age(Delta) = exp(-Delta / tau_age)`` and
  ``rho_clip = min(rho_bar, pi_current / pi_behaviour)``;
* the corrected advantage is ``A~ = A + delta`` with ``A = r_fast - bl``.

Every corrector is described by one number per element, the weight ``c``
multiplying ``X`` (:func:`correction_weight`); :func:`corrected_advantage`
applies it.

``rac_adaptive`` (not in the paper) is eq. (1) with tau_age set from the delays
observed so far in the run (:func:`adaptive_tau_age`): at update u, channel k's
tau_age is ``adaptive_scale * max(1, Q_q)``, Q_q the ``adaptive_quantile`` of the
delays of the channel's results that landed at updates before u, and the prior
``tau_age`` until ``adaptive_min_results`` of them have landed. It is causal: a
weight depends only on results that landed before the update applying it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Tuple

import numpy as np

from racsim.config.schema import CORRECTORS, ROLLOUT_CORRECTORS
from racsim.errors import ConfigError
from racsim.pipeline.schedule import INJECTED

__all__ = [
    "CorrectorParams",
    "age_weight",
    "adaptive_tau_age",
    "kernel_tau_age",
    "geometric_weight",
    "clipped_ratio",
    "correction_weight",
    "corrected_advantage",
    "vtrace_advantage",
    "causal_running_mean",
    "BLOCKING",
    "SCHEDULE_FREE",
    "USES_RATIO",
    "split_name",
    "row_name",
    "reward_scalar",
    "rollout_weight",
    "kept",
]


#: Correctors whose optimizer blocks until the slow results of its own rollout
#: are back; the pipeline (not the learner) makes the clock wait for them.
BLOCKING = frozenset({"wait_for_slow"})


#: Correctors that ignore the arrival schedule altogether (their weight does
#: not depend on delay or status).
SCHEDULE_FREE = frozenset({"naive", "sync_oracle"})


#: Correctors whose weight carries eq. (1)'s clipped ratio min(rho_bar, pi_current / pi_behaviour).
USES_RATIO = frozenset({"rac", "rac_no_age", "retrace_a", "rac_adaptive"})


@dataclass(frozen=True)
class CorrectorParams:
    """The corrector knobs (paper eq. 1 and the Retrace-A baseline).

    alpha: global gain alpha > 0 of eq. (1).
    tau_age: time constant of the age kernel w_age(Delta) = exp(-Delta/tau_age),
        in optimizer steps; ``inf`` turns the age kernel off (w_age = 1).
    rho_bar: clip level of the importance ratio; ``inf`` disables the clip.
    retrace_gamma: per-step decay gamma of Retrace-A's kernel gamma**Delta.
    adaptive_quantile, adaptive_scale, adaptive_min_results: rac_adaptive's rule
        tau_age(u) = adaptive_scale * max(1, q-quantile of the delays landed before
        update u), with ``tau_age`` as the prior until adaptive_min_results have landed
        (per trial and channel). A result at the quantile keeps w_age = exp(-1/scale).
    tis_cap, decoupled_cap, version_cap: the rollout axis's knobs (:func:`rollout_weight`, :func:`kept`):
        truncated IS's cap on pi_now / pi_behaviour, the decoupled objective's cap on pi_prox / pi_behaviour
        (each >= 1, inf: none), and the largest generation lag drop trains on.
    """

    alpha: float = 1.0
    tau_age: float = 1000.0
    rho_bar: float = 1.0
    retrace_gamma: float = 0.5
    adaptive_quantile: float = 0.5
    adaptive_scale: float = 50.0
    adaptive_min_results: int = 10
    tis_cap: float = 2.0
    decoupled_cap: float = 5.0
    version_cap: int = 4

    def __post_init__(self) -> None:
        for key in ("alpha", "tau_age", "rho_bar"):
            v = getattr(self, key)
            if not (isinstance(v, (int, float, np.floating, np.integer)) and v > 0):
                raise ValueError(f"CorrectorParams.{key} = {v!r}: a positive number")
        if not (np.isfinite(self.alpha)):
            raise ValueError(f"CorrectorParams.alpha = {self.alpha!r}: a finite positive number")
        g = self.retrace_gamma
        if not (isinstance(g, (int, float, np.floating, np.integer)) and 0 <= g <= 1):
            raise ValueError(f"CorrectorParams.retrace_gamma = {g!r}: a number in [0, 1]")
        q = self.adaptive_quantile
        if not (isinstance(q, (int, float, np.floating, np.integer)) and 0 < q <= 1):
            raise ValueError(f"CorrectorParams.adaptive_quantile = {q!r}: a number in (0, 1]")
        c = self.adaptive_scale
        if not (isinstance(c, (int, float, np.floating, np.integer)) and 0 < c < np.inf):
            raise ValueError(f"CorrectorParams.adaptive_scale = {c!r}: a finite positive number")
        n = self.adaptive_min_results
        if not (isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 1):
            raise ValueError(f"CorrectorParams.adaptive_min_results = {n!r}: an integer >= 1")
        for key in ("tis_cap", "decoupled_cap"):
            v = getattr(self, key)
            if not (isinstance(v, (int, float, np.floating, np.integer)) and v >= 1):
                raise ValueError(f"CorrectorParams.{key} = {v!r}: a number >= 1 (or inf)")
        v = self.version_cap
        if not (isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0):
            raise ValueError(f"CorrectorParams.version_cap = {v!r}: an integer >= 0")


def age_weight(delay, tau_age) -> np.ndarray:
    """Age kernel of eq. (1): ``w_age(Delta) = exp(-Delta / tau_age)``.

    The paper writes it as gamma**Delta with gamma = exp(-1/tau_age).
    ``tau_age = inf`` gives 1 everywhere (no age discount). ``tau_age`` is a
    number or an array broadcastable to ``delay`` (one per element). float64 out.
    """
    d = np.asarray(delay, dtype=np.float64)
    tau = np.asarray(tau_age, dtype=np.float64)
    if not np.all(tau > 0):
        raise ValueError(f"tau_age = {tau_age!r}: a positive number (or inf)")
    if tau.ndim == 0 and np.isinf(tau):
        return np.ones_like(d)
    return np.exp(-d / tau)


def _quantile_index(hist: np.ndarray, q: float) -> np.ndarray:
    """Per row of a histogram over delays 0, 1, ... (last axis): the smallest delay d with
    at least a fraction q of the row's mass at delays <= d (0 for an empty row)."""
    cdf = np.cumsum(hist, axis=-1)
    return np.argmax(cdf >= q * cdf[..., -1:], axis=-1)


def _tau_from_quantile(quantile: np.ndarray, params: CorrectorParams) -> np.ndarray:
    """rac_adaptive's tau_age from a delay quantile: adaptive_scale * max(1, quantile); a product past
    the largest float is inf, the tau_age of no age weighting (a scale near 1e308 asks for that)."""
    with np.errstate(over="ignore"):
        return params.adaptive_scale * np.maximum(quantile, 1).astype(np.float64)


def adaptive_tau_age(delay, status, params: CorrectorParams) -> np.ndarray:
    """rac_adaptive's tau_age for every result of a schedule (its delay and status arrays,
    (trials, steps, batch, K)): for a result landing at update u = t + Delta, per trial
    and channel, ``adaptive_scale * max(1, Q)`` with Q the ``adaptive_quantile`` of the
    delays of the results that landed at updates before u (the smallest landed delay d
    with at least that fraction of them <= d); ``tau_age`` (the prior) while fewer than
    ``adaptive_min_results`` have landed, and where a result is not injected (its
    weight is 0). Causal: results landing at u or later do not change it. float64 out.
    """
    delay, status = np.asarray(delay), np.asarray(status)
    if delay.ndim != 4 or delay.shape != status.shape:
        raise ValueError(f"rac_adaptive needs a schedule's (trials, steps, batch, K) delays and statuses, "
                         f"got shapes {delay.shape} and {status.shape}")
    out = np.full(delay.shape, float(params.tau_age))
    injected = status == INJECTED
    if not injected.any():
        return out
    trial, step, _, chan = np.nonzero(injected)
    d = delay[injected]
    land = step + d
    order = np.argsort(land, kind="stable")
    updates, first = np.unique(land[order], return_index=True)
    ends = np.append(first[1:], len(order))
    counts = np.zeros((delay.shape[0], delay.shape[3], int(d.max()) + 1), dtype=np.int64)
    tau = np.empty(len(d))
    for lo, hi in zip(first, ends):  # one update at a time, in order: counts hold the earlier landings
        now = np.where(counts.sum(axis=-1) >= params.adaptive_min_results,
                       _tau_from_quantile(_quantile_index(counts, params.adaptive_quantile), params),
                       float(params.tau_age))
        sel = order[lo:hi]
        tau[sel] = now[trial[sel], chan[sel]]
        np.add.at(counts, (trial[sel], chan[sel], d[sel]), 1)
    out[injected] = tau
    return out


def kernel_tau_age(kernel, params: CorrectorParams) -> np.ndarray:
    """rac_adaptive's tau_age in the long run of a delay kernel Lambda (K, D+1), one per
    channel: ``adaptive_scale * max(1, Q)`` with Q the ``adaptive_quantile`` of the
    kernel's landed mass (what the running quantile of :func:`adaptive_tau_age` tends to
    when results land with that law); the prior ``tau_age`` for a channel none of whose
    results land. Used where a weight is needed without a history (Theorem 2.1's kernel,
    the row normalisation). float64 (K,)."""
    lam = np.asarray(kernel, dtype=np.float64)
    landed = lam.sum(axis=-1) > 0
    tau = _tau_from_quantile(_quantile_index(lam, params.adaptive_quantile), params)
    return np.where(landed, tau, float(params.tau_age))


def geometric_weight(delay, gamma: float) -> np.ndarray:
    """Retrace-A's geometric kernel ``gamma**Delta`` (in place of w_age in eq. 1).

    ``0**0 = 1``: a result used in its own step keeps full weight. float64 out.
    """
    if not 0 <= gamma <= 1:
        raise ValueError(f"gamma = {gamma!r}: a number in [0, 1]")
    d = np.asarray(delay, dtype=np.float64)
    return np.power(np.float64(gamma), d)


def clipped_ratio(ratio, rho_bar: float) -> np.ndarray:
    """V-trace-style clipped importance ratio of eq. (1):
    ``rho_clip = min(rho_bar, pi_current(a|s) / pi_behaviour(a|s))``.

    ``rho_bar = inf`` returns the ratio unchanged (as float64).
    """
    r = np.asarray(ratio, dtype=np.float64)
    if not rho_bar > 0:
        raise ValueError(f"rho_bar = {rho_bar!r}: a positive number (or inf)")
    if np.isinf(rho_bar):
        return r.copy()
    return np.minimum(np.float64(rho_bar), r)


def correction_weight(name: str, delay, status, ratio, params: CorrectorParams, tau_age=None) -> np.ndarray:
    """Weight ``c`` multiplying the slow residual ``X = r_slow - r_fast_bl``.

    Paper eq. (1): a RAC correction is ``delta = c * X`` with
    ``c = w_age(Delta) * alpha * rho_clip``. ``delay`` and ``status`` are
    integer arrays of equal shape (for example an
    :class:`~racsim.pipeline.schedule.ArrivalSchedule`'s (trials, steps, batch, K));
    ``ratio`` is the importance ratio pi_current / pi_behaviour at the step
    that uses the result, broadcastable to them, or None for ratio 1 (the
    identity actor). Wherever ``status != INJECTED`` the weight is 0, except
    for the schedule-free correctors. Per corrector:

    * ``naive``: 0 (the slow signal is ignored);
    * ``sync_oracle``: 1 (every slow result at Delta = 0; ignores the schedule);
    * ``wait_for_slow``: 1 where injected (its blocking pipeline uses a
      result in the step that produced it, under the behaviour policy, so no
      ratio);
    * ``rac``: ``alpha * exp(-Delta/tau_age) * min(rho_bar, ratio)`` (eq. 1);
    * ``rac_no_age``: ``alpha * min(rho_bar, ratio)`` (ablation: no w_age);
    * ``bare_additive``: ``alpha`` (ablation: no w_age, no clipped ratio);
    * ``retrace_a``: ``alpha * retrace_gamma**Delta * min(rho_bar, ratio)``;
    * ``rac_adaptive``: ``alpha * exp(-Delta/tau) * min(rho_bar, ratio)``, eq. (1)
      with ``tau`` from :func:`adaptive_tau_age` (then ``delay`` and ``status`` must
      be a whole schedule's (trials, steps, batch, K): the history is read from
      them), or ``tau_age`` when given (per element, broadcastable to ``delay``;
      only rac_adaptive takes it).

    Returns a float64 array of the broadcast shape of (delay, status, ratio).
    Raises :class:`~racsim.errors.ConfigError` for an unknown corrector.
    """
    if name not in _KNOWN:
        raise ConfigError("corrector.names", name, "one of " + ", ".join(CORRECTORS))
    if tau_age is not None and name != "rac_adaptive":
        raise ValueError(f"a per-element tau_age is rac_adaptive's; {name} takes params.tau_age")
    delay = np.asarray(delay)
    status = np.asarray(status)
    if delay.shape != status.shape:
        raise ValueError(f"delay shape {delay.shape} != status shape {status.shape}")
    if ratio is None:
        shape = delay.shape
    else:
        ratio = np.asarray(ratio, dtype=np.float64)
        try:
            shape = np.broadcast_shapes(delay.shape, ratio.shape)
        except ValueError:
            raise ValueError(f"ratio shape {ratio.shape} does not broadcast to delay shape {delay.shape}") from None

    if name == "naive":
        return np.zeros(shape, dtype=np.float64)
    if name == "sync_oracle":
        return np.ones(shape, dtype=np.float64)

    injected = status == INJECTED
    if name == "wait_for_slow":
        return np.broadcast_to(injected.astype(np.float64), shape).copy()

    if np.any(delay[injected] < 0):
        raise ValueError("an injected result has a negative delay")
    # Delay -1 marks "not injected": give those elements a harmless delay 0
    # so that no kernel is evaluated at a negative power, then mask them.
    d = np.where(injected, delay, 0)
    alpha = np.float64(params.alpha)
    if name == "bare_additive":
        w = np.full(d.shape, alpha)
    else:
        rho = clipped_ratio(1.0 if ratio is None else ratio, params.rho_bar)
        if name == "rac":
            kern = age_weight(d, params.tau_age)
        elif name == "rac_adaptive":
            kern = age_weight(d, adaptive_tau_age(delay, status, params) if tau_age is None else tau_age)
        elif name == "retrace_a":
            kern = geometric_weight(d, params.retrace_gamma)
        else:  # rac_no_age
            kern = np.ones(d.shape)
        w = alpha * kern * rho
    return np.broadcast_to(np.where(injected, w, 0.0), shape).astype(np.float64, copy=True)


def split_name(name: str) -> Tuple[str, str]:
    """(reward-axis corrector, rollout-axis corrector) of a row's name: ``rac+tis`` is (rac, tis), a
    corrector alone (``rac``) is (rac, none). Raises ConfigError for a name of neither list."""
    reward, _, rollout = name.partition("+")
    rollout = rollout or "none"
    if reward not in _KNOWN or rollout not in ROLLOUT_CORRECTORS or name.endswith("+none"):
        raise ConfigError("corrector.names", name, "one of " + ", ".join(CORRECTORS) + ", each alone or with "
                          "+" + ", +".join(r for r in ROLLOUT_CORRECTORS if r != "none"))
    return reward, rollout


def row_name(reward: str, rollout: str) -> str:
    """The row of a reward-axis corrector combined with a rollout-axis one: ``rac+tis``; ``rac`` with none."""
    return reward if rollout == "none" else f"{reward}+{rollout}"


def reward_scalar(name: str, delay, status, params: CorrectorParams, tau_age=None) -> np.ndarray:
    """The part of :func:`correction_weight`'s ``c`` that is one number per result: all of it for a
    corrector without eq. (1)'s ratio, and ``c`` at an unclipped ratio of 1 (``alpha * w(Delta)``) for
    one with it (:data:`USES_RATIO`), whose weight is then this times ``min(rho_bar, ratio)`` per decision
    (:func:`clipped_ratio`): the split the learner needs where the ratio moves with the policy."""
    unclipped = replace(params, rho_bar=np.inf) if name in USES_RATIO else params
    return correction_weight(name, delay, status, None, unclipped, tau_age=tau_age)


def rollout_weight(kind: str, pi_use, pi_behaviour, pi_prox, params: CorrectorParams) -> np.ndarray:
    """The rollout axis's weight on one decision (a, s) of a sample generated by the behaviour policy,
    used in the update of the policy ``pi_use`` (each argument its probability of the action taken, or
    whole (S, A) tables, elementwise):

    * ``none`` and ``drop``: 1 (drop acts on the whole sample instead: :func:`kept`);
    * ``tis``, truncated IS on the behaviour ratio: ``min(tis_cap, pi_use / pi_behaviour)``;
    * ``decoupled`` (AReaL's decoupled objective, one gradient step at pi_use): the behaviour weight
      ``min(decoupled_cap, pi_prox / pi_behaviour)`` times the proximal ratio ``pi_use / pi_prox``, with
      pi_prox the policy one version before pi_use, or the behaviour policy where that is newer (a sample
      of the current policy is its own proximal one: weight 1). PPO's clip of the proximal ratio is
      left out: it turns on the advantage's sign, which the exact expectation does not see.

    float64, the broadcast shape of the arguments (``pi_prox`` is read by decoupled alone)."""
    use, beh = np.asarray(pi_use, dtype=np.float64), np.asarray(pi_behaviour, dtype=np.float64)
    if kind in ("none", "drop"):
        return np.ones(np.broadcast_shapes(use.shape, beh.shape))
    if kind == "tis":
        return np.minimum(np.float64(params.tis_cap), use / beh)
    if kind == "decoupled":
        prox = np.asarray(pi_prox, dtype=np.float64)
        return np.minimum(np.float64(params.decoupled_cap), prox / beh) * (use / prox)
    raise ConfigError("corrector.rollout", kind, "one of " + ", ".join(ROLLOUT_CORRECTORS))


def kept(kind: str, lag, params: CorrectorParams) -> np.ndarray:
    """Which samples the rollout corrector ``kind`` trains on, by their generation lag: drop keeps those with
    ``lag <= version_cap``; every other kind keeps them all. bool, the shape of ``lag``."""
    lag = np.asarray(lag)
    return lag <= params.version_cap if kind == "drop" else np.ones(lag.shape, dtype=bool)


def corrected_advantage(r_fast, r_slow, baseline, weight) -> np.ndarray:
    """Corrected advantage of eq. (1) in replacement form.

    ``A~ = (r_fast - bl) + c * (r_slow - r_fast)`` with ``c`` the weight of
    :func:`correction_weight` and ``r_fast_bl = r_fast`` (the identity
    baseline of the fast estimate). It is evaluated as
    ``((1 - c) * r_fast + c * r_slow) - bl``, algebraically the same, so that
    at ``c = 1`` the result is ``r_slow - bl`` bit for bit: ``1 - 1`` is
    exactly 0, ``0 * r_fast`` is exactly (signed) zero, ``1 * r_slow`` is
    exactly ``r_slow``, and ``0 + y`` is exactly ``y`` in IEEE-754, so the
    final subtraction sees the very operands of :func:`vtrace_advantage`
    (only the sign of an exact zero may differ, which compares equal).
    The literal form ``r_fast - bl + (r_slow - r_fast)`` rounds twice and
    is not bit-identical. Finite inputs are assumed (``0 * inf`` is nan).
    """
    r_fast = np.asarray(r_fast, dtype=np.float64)
    r_slow = np.asarray(r_slow, dtype=np.float64)
    c = np.asarray(weight, dtype=np.float64)
    return ((1.0 - c) * r_fast + c * r_slow) - np.asarray(baseline, dtype=np.float64)


def vtrace_advantage(r_slow, baseline) -> np.ndarray:
    """On-policy V-trace advantage at the identity kernel Lambda = I:
    ``r_slow - bl`` (the boundary case of Theorem 2.1). Kept as a separate
    code path so that RAC's collapse onto it can be checked."""
    return np.asarray(r_slow, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)


def causal_running_mean(x, axis: int = -1) -> np.ndarray:
    """Causal baseline ``bl_t = mean(x_0, ..., x_{t-1})`` along ``axis``, ``bl_0 = 0``.

    Uses only the past, so the baseline of step t is independent of step t's
    own sample. float64 out, same shape as ``x``.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 0:
        raise ValueError("causal_running_mean needs an array with at least one axis")
    xm = np.moveaxis(x, axis, -1)
    n = xm.shape[-1]
    out = np.zeros_like(xm)
    if n > 1:
        cs = np.cumsum(xm[..., :-1], axis=-1)
        out[..., 1:] = cs / np.arange(1, n, dtype=np.float64)
    return np.moveaxis(out, -1, axis)


# The names come from the one list, config.CORRECTORS; that correction_weight implements
# each of them as documented is checked by tests/test_correctors.py against an oracle.
_KNOWN = frozenset(CORRECTORS)


assert BLOCKING <= _KNOWN and SCHEDULE_FREE <= _KNOWN and USES_RATIO <= _KNOWN
