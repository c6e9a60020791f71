"""Theory: the paper's predictions, as pure functions to set beside measurements.

* Theorem 2.1 (``thm:unbiased``): with the effective delay kernel
  ``Lambda~[k, D] = alpha * w_age(D) * Lambda[k, D]`` and the slack
  ``eta_k = 1 - sum_D Lambda~[k, D]``, the expected cumulative correction of
  channel k is ``(1 - eta_k) * sum_t E[X_k]``, so its bias against the
  synchronous target is ``-eta_k * sum_t E[X_k]`` (eq. ``eq:thm-unbiased``).
* Proposition 2.2 (``prop:tv-bound``): the state-averaged total variation
  between the fast-only and the corrected policy is at most
  ``min(sqrt(KL/2), 1 - exp(-KL)/2)`` (eq. ``eq:tv-bound``), Pinsker's
  inequality below the crossover KL* and Bretagnolle-Huber above it.
* The first-order law of a stale sample (issue 47; the 2025 staleness-scaling
  results state the bias as O(S x eta)): on a path of step size eta, version
  u - L sits about eta L g*(theta_u) behind version u, so the expected update
  from samples L versions old moves off the fresh one by about eta L D, D the
  derivative of that expectation along the path (:func:`first_order_staleness`).

For the bias benchmark's prediction the kernel Lambda comes from the
configuration (:func:`racsim.pipeline.kernels.predicted_kernel`), so that it can
disagree with what the simulated pipeline did; :func:`measured_kernel` is the
kernel a simulated schedule realised (the LM study's slack beside its measurement).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy.optimize import brentq
from scipy.special import rel_entr

from racsim.learner import mdp as M
from racsim.learner.correctors import CorrectorParams, age_weight
from racsim.learner.rollouts import softmax_score
from racsim.pipeline.schedule import INJECTED

__all__ = [
    "effective_kernel",
    "slack",
    "predicted_bias",
    "measured_kernel",
    "kl_divergence",
    "tv_distance",
    "pinsker_bound",
    "bh_bound",
    "tv_bound",
    "kl_crossover",
    "tight_branch",
    "first_order_staleness",
    "staleness_derivative",
]


_ROW_TOL = 1e-12


_BH_FORMS = ("paper", "tight")


def _kernel_array(kernel, what: str = "kernel") -> np.ndarray:
    lam = np.asarray(kernel, dtype=np.float64)
    if lam.ndim not in (1, 2) or lam.shape[-1] == 0:
        raise ValueError(f"{what} must have shape (K, D+1) (or (D+1,) for one channel), got {lam.shape}")
    if not np.all(np.isfinite(lam)):
        bad = np.argwhere(~np.isfinite(np.atleast_2d(lam)))[0]
        raise ValueError(f"{what} row {bad[0]} has a non-finite entry at Delta = {bad[1]}")
    neg = np.argwhere(np.atleast_2d(lam) < 0)
    if neg.size:
        k, d = neg[0]
        raise ValueError(f"{what} row {k} has a negative entry {float(np.atleast_2d(lam)[k, d])!r} at Delta = {d}")
    return lam


def effective_kernel(kernel, alpha=1.0, tau_age: float = math.inf, weight=None) -> np.ndarray:
    """Effective delay kernel of Theorem 2.1:
    ``Lambda~[k, D] = alpha * w_age(D) * Lambda[k, D]``, ``w_age(D) = exp(-D/tau_age)``.

    ``kernel`` has shape (K, D+1) (row k: channel k, column D: probability of
    delay D steps; a row may sum to less than 1, the missing mass never
    returns) or (D+1,) for one channel; the result has the same shape.
    ``alpha`` is the global gain (a scalar) or one gain per row, shape (K,),
    as in the row normalisation ``alpha_k = 1 / sum_D w_age(D) Lambda[k, D]``.
    ``weight``, when given, replaces w_age by another corrector's weight at
    each delay (Retrace-A's gamma**D, an ablation's constant, ...): shape
    (D+1,) or (K, D+1), finite and >= 0; ``tau_age`` is then unused.
    Computed as ``Lambda * (alpha * w)``.

    Raises ValueError naming the row if the kernel has a negative or
    non-finite entry, if a row of Lambda sums above 1, or, where that row's
    weights alpha * w(D) are all <= 1 (for w_age: alpha <= 1), if a row of
    Lambda~ sums above 1 (+1e-12). With a larger weight a row may exceed 1
    (over-correction: negative slack).
    """
    lam = _kernel_array(kernel)
    lam2 = np.atleast_2d(lam)
    K, W = lam2.shape
    a = np.asarray(alpha, dtype=np.float64)
    if a.ndim > 1 or (a.ndim == 1 and a.shape[0] != K):
        raise ValueError(f"alpha must be a scalar or have shape ({K},), got {a.shape}")
    if not np.all(np.isfinite(a) & (a > 0)):
        raise ValueError(f"alpha = {alpha!r}: positive finite gain(s)")
    if weight is None:
        if not tau_age > 0:
            raise ValueError(f"tau_age = {tau_age!r}: a positive number (or inf)")
        w = age_weight(np.arange(W), tau_age)[None, :]
    else:
        w = np.asarray(weight, dtype=np.float64)
        if w.shape not in ((W,), (K, W)):
            raise ValueError(f"weight must have shape ({W},) or ({K}, {W}), got {w.shape}")
        if not np.all(np.isfinite(w) & (w >= 0)):
            raise ValueError("weight must be finite and >= 0")
        w = np.atleast_2d(w)
    raw = lam2.sum(axis=1)
    over = np.flatnonzero(raw > 1.0 + _ROW_TOL)
    if over.size:
        k = over[0]
        raise ValueError(f"kernel row {k} sums to {float(raw[k])!r} > 1: a delay kernel row is a (sub-)probability")
    a_rows = np.broadcast_to(a, (K,))
    scale = a_rows[:, None] * w
    eff = lam2 * scale
    sums = eff.sum(axis=1)
    over = np.flatnonzero((scale.max(axis=1) <= 1.0) & (sums > 1.0 + _ROW_TOL))
    if over.size:
        k = over[0]
        raise ValueError(f"effective kernel row {k} sums to {float(sums[k])!r} > 1 with alpha = {float(a_rows[k])!r} "
                         f"and weights <= 1")
    return eff if lam.ndim == 2 else eff[0]


def slack(effective) -> np.ndarray:
    """Row slack of Theorem 2.1: ``eta_k = 1 - sum_D Lambda~[k, D]``, shape (K,).

    0 for a row-stochastic row (condition (R): the correction is unbiased);
    negative only when alpha > 1 over-corrects.
    """
    eff = np.atleast_2d(_kernel_array(effective, "effective kernel"))
    return 1.0 - eff.sum(axis=1)


def predicted_bias(eta, residual_mean) -> np.ndarray:
    """Predicted cumulative bias of Theorem 2.1 (eq. ``eq:thm-unbiased``):
    ``E[sum corrections] - sum_k E[X_k] = -sum_k eta_k * E[X_k]``.

    ``eta`` has shape (K,); ``residual_mean`` has shape (K, ...) and holds,
    per channel, the (summed or averaged) mean residual ``E[r_slow - r_fast_bl]``;
    the result has shape (...), in the same units.
    """
    e = np.asarray(eta, dtype=np.float64)
    m = np.asarray(residual_mean, dtype=np.float64)
    if e.ndim != 1:
        raise ValueError(f"eta must have shape (K,), got {e.shape}")
    if m.ndim == 0 or m.shape[0] != e.shape[0]:
        raise ValueError(f"residual_mean must have shape ({e.shape[0]}, ...), got {m.shape}")
    return -np.tensordot(e, m, axes=(0, 0))


def measured_kernel(delay, status, max_delay=None) -> np.ndarray:
    """Delay kernel measured from an arrival schedule.

    ``Lambda[k, D]`` is the fraction of ALL results emitted on channel k (the
    last axis of ``delay``/``status``; every other axis is pooled) that were
    injected with a delay of D optimizer steps. Dropped and pending results
    are the row's missing mass, so row k sums to channel k's injected
    fraction (<= 1). Shape (K, W) with W = the largest injected delay + 1
    (1 when nothing was injected), or ``max_delay + 1`` when given (an
    injected delay above ``max_delay`` is then an error).
    """
    d = np.asarray(delay)
    s = np.asarray(status)
    if d.shape != s.shape:
        raise ValueError(f"delay shape {d.shape} != status shape {s.shape}")
    if d.ndim < 1 or d.shape[-1] == 0:
        raise ValueError(f"delay/status need a last (channel) axis, got shape {d.shape}")
    K = d.shape[-1]
    d2 = d.reshape(-1, K)
    inj = s.reshape(-1, K) == INJECTED
    n = d2.shape[0]
    dinj = d2[inj]
    if dinj.size and dinj.min() < 0:
        raise ValueError("an injected result has a negative delay")
    top = int(dinj.max()) if dinj.size else -1
    if max_delay is None:
        width = max(top, 0) + 1
    else:
        if int(max_delay) != max_delay or max_delay < 0:
            raise ValueError(f"max_delay = {max_delay!r}: an integer >= 0")
        width = int(max_delay) + 1
        if top >= width:
            raise ValueError(f"an injected delay {top} exceeds max_delay = {max_delay}")
    if n == 0:
        return np.zeros((K, width))
    chan = np.broadcast_to(np.arange(K), d2.shape)[inj]
    counts = np.bincount(chan * width + dinj.astype(np.int64), minlength=K * width)
    return counts.reshape(K, width) / float(n)



def _categorical(p, what: str, axis: int) -> np.ndarray:
    p = np.asarray(p, dtype=np.float64)
    if p.ndim == 0:
        raise ValueError(f"{what} must have a category axis")
    if np.any(~np.isfinite(p)) or np.any(p < 0):
        raise ValueError(f"{what} has a negative or non-finite probability")
    tot = p.sum(axis=axis)
    if np.any(np.abs(tot - 1.0) > 1e-9):
        raise ValueError(f"{what}: a row sums to {float(np.ravel(tot)[np.argmax(np.abs(tot - 1.0))])!r}, not 1")
    return p


def kl_divergence(p, q, axis: int = -1) -> np.ndarray:
    """``KL(p || q) = sum_i p_i log(p_i / q_i)`` over ``axis`` (nats), with
    0 log 0 = 0 and ``inf`` where p_i > 0 = q_i. Rows must be categorical."""
    p = _categorical(p, "p", axis)
    q = _categorical(q, "q", axis)
    kl = np.sum(rel_entr(p, q), axis=axis)
    # Rounding can leave a true 0 at -1e-17; KL is non-negative.
    return np.maximum(kl, 0.0)


def tv_distance(p, q, axis: int = -1) -> np.ndarray:
    """Total variation ``TV(p, q) = 1/2 sum_i |p_i - q_i|`` over ``axis``."""
    p = _categorical(p, "p", axis)
    q = _categorical(q, "q", axis)
    return 0.5 * np.sum(np.abs(p - q), axis=axis)


def _kl_array(kl) -> np.ndarray:
    k = np.asarray(kl, dtype=np.float64)
    if np.any(np.isnan(k)) or np.any(k < -_ROW_TOL):
        raise ValueError("kl must be >= 0 (inf allowed)")
    return np.maximum(k, 0.0)


def pinsker_bound(kl) -> np.ndarray:
    """Pinsker's inequality: ``TV <= sqrt(KL / 2)`` (first branch of eq. ``eq:tv-bound``)."""
    return np.sqrt(_kl_array(kl) / 2.0)


def bh_bound(kl, form: str = "paper") -> np.ndarray:
    """Bretagnolle-Huber bound on TV from KL.

    ``form="paper"``: ``1 - exp(-KL)/2``, the second branch of the paper's
    eq. ``eq:tv-bound``. ``form="tight"``: ``sqrt(1 - exp(-KL))``, the sharper
    form of the same lemma (it is never above the paper's form).
    """
    k = _kl_array(kl)
    if form == "paper":
        return 1.0 - 0.5 * np.exp(-k)
    if form == "tight":
        return np.sqrt(-np.expm1(-k))
    raise ValueError(f"form = {form!r}: one of {', '.join(_BH_FORMS)}")


def tv_bound(kl, form: str = "paper") -> np.ndarray:
    """Proposition 2.2 (eq. ``eq:tv-bound``): ``TV <= min(Pinsker, Bretagnolle-Huber)``.

    Holds per state and, both branches being concave in KL, for the
    state-averaged TV at the state-averaged KL.
    """
    return np.minimum(pinsker_bound(kl), bh_bound(kl, form))


@functools.lru_cache(maxsize=None)
def kl_crossover(form: str = "paper") -> float:
    """KL* of Proposition 2.2: the root on (0, inf) of ``sqrt(KL/2) = BH(KL)``,
    found by Brent's method (about 1.6259 for the paper's form, 1.5936 for
    the tight form). Pinsker is tighter below it, Bretagnolle-Huber above."""
    if form not in _BH_FORMS:
        raise ValueError(f"form = {form!r}: one of {', '.join(_BH_FORMS)}")

    def gap(x: float) -> float:
        return float(pinsker_bound(x) - bh_bound(x, form))

    # gap < 0 near 0 (Pinsker -> 0 faster than either BH form) and > 0 at 8
    # (sqrt(4) = 2 > 1 >= BH).
    return float(brentq(gap, 1e-9, 8.0, xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=200))


def tight_branch(kl, form: str = "paper") -> np.ndarray:
    """Which branch of :func:`tv_bound` is the smaller one: ``"pinsker"`` for
    KL <= KL*, ``"bh"`` above (array of str, shape of ``kl``)."""
    k = _kl_array(kl)
    return np.where(k <= kl_crossover(form), "pinsker", "bh")


def first_order_staleness(mdp: M.TabularMDP, theta: np.ndarray, horizon: int, rollout: str,
                          params: CorrectorParams, lag: int) -> np.ndarray:
    """D (S*A,): the staleness bias of one update per unit of eta x L, to first order, for the synchronous
    estimator (every reward at Delta = 0) at the current policy ``theta`` whose samples come from a policy
    ``lag`` versions back on a path of small steps eta along g* (racsim.learner.mdp.policy_path):

        E(e) = softmax_score(phi_e * M(theta - e g*), pi, T),  D = dE/de at e = 0+,  bias ~ eta L ||D||,

    M the behaviour moments, their derivative by forward mode (racsim.learner.mdp.behaviour_moments_jvp),
    and phi_e the rollout corrector's weight (:func:`staleness_derivative`). NaN for drop."""
    g = M.true_gradient(mdp, theta)
    jvp = M.behaviour_moments_jvp(mdp, theta, horizon, -g, mdp.reward_total)
    return staleness_derivative(M.softmax_policy(theta), g, jvp, horizon, rollout, params, lag)


def staleness_derivative(pi: np.ndarray, g: np.ndarray, jvp, horizon: int, rollout: str, params: CorrectorParams,
                         lag: int) -> np.ndarray:
    """:func:`first_order_staleness` from the current policy ``pi``, its true gradient ``g`` and the behaviour
    moments with their derivative along -g, ``jvp`` = (M, dM). The weight's derivative uses
    r' = d(pi / mu_e)/de = -dmu / mu: none, 0; tis, r' (its cap > 1) or min(0, r') (a cap of 1: one-sided, the
    kink of min at ratio 1); decoupled, r' (cap > 1: to first order the proximal policy cancels) or
    min(0, (1 - 1/L) r') + r' / L (cap 1, the proximal policy a version back, 1/L of the way). drop has no such
    law (all of a sample or none of it, a step at its cap): NaN."""
    if rollout == "drop":
        return np.full(pi.size, np.nan)
    moments, dmoments = jvp
    dmu = pi * (-g - (pi * -g).sum(axis=-1, keepdims=True))
    r = -dmu / pi
    if rollout == "none":
        dphi = np.zeros_like(r)
    elif rollout == "tis":
        dphi = r if params.tis_cap > 1 else np.minimum(r, 0.0)
    elif params.decoupled_cap > 1:
        dphi = r
    else:
        dphi = np.minimum((1.0 - 1.0 / lag) * r, 0.0) + r / lag
    return softmax_score(dphi * moments + dmoments, pi, horizon).ravel()
