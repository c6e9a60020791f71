"""Proposition 2.2 (per-step TV bound) measured on the tabular MDP.

From one policy ``theta`` two mean updates are taken, each with the exact
expectation of the finite-horizon Monte-Carlo gradient estimator
(:func:`~racsim.learner.mdp.finite_horizon_expectation`) per reward channel,
G = [G_fast, G_1, ..., G_K]:

* fast-only:     ``theta_fast = theta + lr * G_fast``            -> pi_t
* RAC-corrected: ``theta_rac  = theta + lr * (G_fast + sum_k (1 - eta_k) G_k)`` -> pi~_t

(the corrected update puts back the fraction 1 - eta_k of channel k, eta_k
the slack of Theorem 2.1; eta = 0 is a row-stochastic kernel). Then

    KL_t = E_{s ~ d}[KL(pi_t(.|s) || pi~_t(.|s))],  TV_t = E_{s ~ d}[TV(pi_t(.|s), pi~_t(.|s))]

with d the stationary distribution of the pre-update policy pi_theta (the
state distribution the step's rollouts were drawn from; it does not move
with lr), and Proposition 2.2 says TV_t <= min(sqrt(KL_t / 2), 1 - exp(-KL_t) / 2).

Per-state KL is evaluated from log-softmax logits, which equals
:func:`racsim.learner.theory.kl_divergence` on the softmax probabilities (tests hold
them together) but stays finite and accurate when a probability underflows at
large lr (``kl_divergence`` then returns inf for a KL that is actually ~0).
TV uses :func:`racsim.learner.theory.tv_distance` on :func:`racsim.learner.mdp.softmax_policy`.

Reachability. KL_t(lr) is not monotone and need not be unbounded: if in every
state the two updates favour the same action, both policies saturate onto it
and KL_t -> 0 as lr -> inf. That is the case on the canonical MDP
(``make_mdp(3, 2, shares=(0.5, 0.5))``, ``canonical_theta(3, 2)``, horizon 50,
eta = 0): KL_t peaks at about 1.41 near lr ~ 2e3, below the crossover
KL* ~ 1.626, so no target above KL* is reachable there and the
Bretagnolle-Huber branch is never the tight one. The default targets
(0.01, 0.5, 1.2) are all reachable there (all on the Pinsker side); an MDP
where some state's preferred action flips between the two updates (e.g.
``make_mdp(3, 2, mdp_seed=2, shares=(0.5, 0.5))``) reaches any KL.
"""

from __future__ import annotations

import math
import time
from typing import Any, Sequence

import numpy as np
import pandas as pd
from scipy.optimize import brentq

from racsim.analyses.bias_study import build_mdp
from racsim.analyses.result import RunResult
from racsim.errors import ConfigError
from racsim.learner import mdp as M
from racsim.learner.mdp import (
    TabularMDP,
    canonical_theta,
    finite_horizon_expectation,
    softmax_policy,
    stationary_distribution,
)
from racsim.learner.theory import (
    bh_bound,
    kl_crossover,
    pinsker_bound,
    tight_branch,
    tv_bound,
    tv_distance,
)

__all__ = [
    "DEFAULT_KL_TARGETS",
    "channel_gradients",
    "update_directions",
    "policy_pair",
    "state_divergences",
    "averaged_divergences",
    "max_reachable_kl",
    "tv_sweep",
    "lr_for_kl",
    "tv_experiment",
]


#: Reachable on the canonical 3x2 MDP at horizon 50 (its peak KL_t is ~1.41 < KL*).
DEFAULT_KL_TARGETS = (0.01, 0.5, 1.2)


#: Relative tolerance on the measured KL at a target.
KL_RTOL = 1e-6


#: The lr scan spans lr_unit * 10**[-SCAN_DECADES, SCAN_DECADES], lr_unit = 1 / max|direction difference|.
SCAN_DECADES = 6.0


SCAN_POINTS = 1201


_VIOLATION_TOL = 1e-12


def channel_gradients(mdp: TabularMDP, theta, horizon: int) -> np.ndarray:
    """(1 + K, S, A): exact finite-horizon gradient expectations for the
    reward channels [r_fast, r_slow_1, ..., r_slow_K]."""
    reward = np.concatenate([mdp.r_fast[None], mdp.r_slow], axis=0)
    return finite_horizon_expectation(mdp, np.asarray(theta, dtype=np.float64), horizon, reward=reward)


def _eta(eta, K: int) -> np.ndarray:
    if eta is None:
        return np.zeros(K)
    e = np.asarray(eta, dtype=np.float64)
    if e.ndim == 0:
        e = np.full(K, float(e))
    if e.shape != (K,):
        raise ValueError(f"eta must be a scalar or have shape ({K},) (one slack per slow channel), got {e.shape}")
    if not np.all(np.isfinite(e)) or np.any(e > 1.0):
        raise ValueError(f"eta = {eta!r}: finite slack(s) <= 1 (a negative one over-corrects, alpha > 1)")
    return e


def update_directions(G: np.ndarray, eta=None):
    """(fast, rac) update directions: G_fast and G_fast + sum_k (1 - eta_k) G_k."""
    e = _eta(eta, G.shape[0] - 1)
    fast = G[0]
    return fast, fast + np.tensordot(1.0 - e, G[1:], axes=(0, 0))


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def policy_pair(mdp: TabularMDP, theta, horizon: int, lr: float, eta=None):
    """(pi_t, pi~_t), each (S, A): the fast-only and the RAC-corrected policy
    after one step of size ``lr`` from ``theta``."""
    theta = np.asarray(theta, dtype=np.float64)
    fast, rac = update_directions(channel_gradients(mdp, theta, horizon), eta)
    return softmax_policy(theta + lr * fast), softmax_policy(theta + lr * rac)


def state_divergences(theta, fast, rac, lrs):
    """Per-state KL(pi_t || pi~_t) and TV for each lr: two (L, S) arrays."""
    lrs = np.atleast_1d(np.asarray(lrs, dtype=np.float64))
    zf = theta[None] + lrs[:, None, None] * fast[None]
    zr = theta[None] + lrs[:, None, None] * rac[None]
    lp, lq = _log_softmax(zf), _log_softmax(zr)
    p = np.exp(lp)
    kl = np.maximum(np.sum(p * (lp - lq), axis=-1), 0.0)
    tv = tv_distance(softmax_policy(zf), softmax_policy(zr))
    return kl, tv


def averaged_divergences(mdp: TabularMDP, theta, horizon: int, lrs, eta=None):
    """(KL_t, TV_t), each of shape (L,): the per-state divergences of
    :func:`state_divergences` averaged under d = stationary distribution of
    pi_theta (the pre-update policy)."""
    theta = np.asarray(theta, dtype=np.float64)
    fast, rac = update_directions(channel_gradients(mdp, theta, horizon), eta)
    d = stationary_distribution(mdp, softmax_policy(theta))
    kl, tv = state_divergences(theta, fast, rac, lrs)
    return kl @ d, tv @ d


class _Setup:
    def __init__(self, mdp: TabularMDP, theta, horizon: int, eta):
        self.theta = canonical_theta(mdp.n_states, mdp.n_actions) if theta is None else np.asarray(theta, dtype=np.float64)
        if self.theta.shape != (mdp.n_states, mdp.n_actions):
            raise ValueError(f"theta must be {(mdp.n_states, mdp.n_actions)}, got {self.theta.shape}")
        self.G = channel_gradients(mdp, self.theta, horizon)
        self.fast, self.rac = update_directions(self.G, eta)
        self.d = stationary_distribution(mdp, softmax_policy(self.theta))
        diff = self.rac - self.fast
        spread = float(np.max(np.abs(diff - diff.mean(axis=-1, keepdims=True))))
        self.lr_unit = 1.0 / spread if spread > 0 else 1.0
        self.degenerate = spread == 0

    def kl(self, lrs) -> np.ndarray:
        return state_divergences(self.theta, self.fast, self.rac, lrs)[0] @ self.d

    def both(self, lrs):
        kl, tv = state_divergences(self.theta, self.fast, self.rac, lrs)
        return kl @ self.d, tv @ self.d

    def scan(self):
        lrs = self.lr_unit * np.logspace(-SCAN_DECADES, SCAN_DECADES, SCAN_POINTS)
        return lrs, self.kl(lrs)


def max_reachable_kl(mdp: TabularMDP, theta, horizon: int, eta=None):
    """(max KL_t, lr at the max) over the lr scan (``SCAN_POINTS`` log-spaced
    points over 2 * ``SCAN_DECADES`` decades around 1 / max logit-difference
    of the two directions). A flipping MDP is still growing at the scan's end."""
    lrs, kl = _Setup(mdp, theta, horizon, eta).scan()
    i = int(np.argmax(kl))
    return float(kl[i]), float(lrs[i])


def _rows(lrs, kl, tv, form: str) -> pd.DataFrame:
    pins = pinsker_bound(kl)
    bh = bh_bound(kl, form)
    bound = tv_bound(kl, form)
    return pd.DataFrame({
        "lr": lrs,
        "kl": kl,
        "tv": tv,
        "pinsker": pins,
        "bh": bh,
        "bound": bound,
        "tight": tight_branch(kl, form),
        "slack": bound - tv,
        "violated": tv > bound + _VIOLATION_TOL,
    })


def tv_sweep(mdp: TabularMDP, theta, horizon: int, lrs, eta=None, form: str = "paper") -> pd.DataFrame:
    """Proposition 2.2 at the given step sizes: one row per lr with kl, tv,
    pinsker, bh, bound, tight (branch), slack = bound - tv and violated
    (tv > bound + 1e-12). ``theta`` None: the canonical theta."""
    s = _Setup(mdp, theta, horizon, eta)
    lrs = np.atleast_1d(np.asarray(lrs, dtype=np.float64))
    if np.any(~np.isfinite(lrs)) or np.any(lrs < 0):
        raise ValueError("lrs must be finite and >= 0")
    kl, tv = s.both(lrs)
    return _rows(lrs, kl, tv, form)


def _solve(s: _Setup, target: float, lrs: np.ndarray, kls: np.ndarray) -> float:
    hit = np.flatnonzero(kls >= target)
    if s.degenerate or hit.size == 0:
        i = int(np.argmax(kls))
        raise ValueError(
            f"KL target {target:g} is not reachable: the largest state-averaged KL over lr in "
            f"[{lrs[0]:.3g}, {lrs[-1]:.3g}] is {float(kls[i]):.6g} (at lr = {float(lrs[i]):.4g}); "
            "the two policies saturate onto the same actions as lr grows")
    j = int(hit[0])
    if j == 0:
        raise ValueError(f"KL target {target:g} is reached already at the smallest scanned lr {lrs[0]:.3g}; "
                         "use a larger target")
    f = lambda u: float(s.kl(math.exp(u))[0]) - target  # noqa: E731
    u = brentq(f, math.log(lrs[j - 1]), math.log(lrs[j]), xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=500)
    return math.exp(u)


def lr_for_kl(mdp: TabularMDP, theta, horizon: int, target: float, eta=None) -> float:
    """The smallest step size whose KL_t reaches ``target`` (Brent's method
    on log lr inside the first bracket of the scan). ValueError with the
    largest reachable KL when no lr of the scan reaches it."""
    if not (math.isfinite(target) and target > 0):
        raise ValueError(f"KL target {target!r}: a finite number > 0")
    s = _Setup(mdp, theta, horizon, eta)
    lrs, kls = s.scan()
    return _solve(s, float(target), lrs, kls)


def tv_experiment(
    mdp: TabularMDP,
    theta=None,
    horizon: int = 50,
    kl_targets: Sequence[float] = DEFAULT_KL_TARGETS,
    eta=None,
    form: str = "paper",
) -> pd.DataFrame:
    """Proposition 2.2 at chosen KL levels: one row per target.

    For each target the step size is solved (:func:`lr_for_kl`) so that the
    measured KL_t equals the target to ``KL_RTOL`` relative; the row gives
    kl_target, lr, kl, kl_rel_err, tv (measured), pinsker, bh, bound (the
    ``form`` of Bretagnolle-Huber, see :func:`racsim.learner.theory.bh_bound`),
    tight (``tight_branch``), slack = bound - tv, violated (tv > bound +
    1e-12), and kl_star. ``eta``: None (all 0), a scalar, or one slack per
    slow channel. ``theta`` None: ``canonical_theta``. Raises ValueError,
    naming the largest reachable KL, for an unreachable target.
    """
    s = _Setup(mdp, theta, horizon, eta)
    lrs, kls = s.scan()
    found = []
    for t in kl_targets:
        t = float(t)
        if not (math.isfinite(t) and t > 0):
            raise ValueError(f"KL target {t!r}: a finite number > 0")
        found.append(_solve(s, t, lrs, kls))
    found = np.asarray(found, dtype=np.float64)
    kl, tv = s.both(found)
    targets = np.asarray(kl_targets, dtype=np.float64)
    rel = np.abs(kl - targets) / targets
    if np.any(rel > KL_RTOL):  # pragma: no cover - Brent's tolerance is far tighter
        raise RuntimeError(f"root finder missed a KL target: relative errors {rel}")
    out = _rows(found, kl, tv, form)
    out.insert(0, "kl_target", targets)
    out.insert(3, "kl_rel_err", rel)
    out["kl_star"] = kl_crossover(form)
    return out


def tv_bound_study(cfg: Any) -> RunResult:
    """Proposition 2.2 on the tabular MDP at the configured KL levels."""
    lr = cfg.learner
    theta = M.canonical_theta(lr.n_states, lr.n_actions, seed=lr.theta_seed, scale=lr.theta_scale)
    t0 = time.perf_counter()
    try:
        table = tv_experiment(build_mdp(cfg), theta, lr.horizon, tuple(cfg.study.kl_targets))
    except ValueError as ex:
        raise ConfigError("study.kl_targets", list(cfg.study.kl_targets), str(ex)) from None
    table.insert(0, "scenario", cfg.name)
    table.insert(1, "study", cfg.study.paper or "")
    return RunResult(results=table, timings={"tv_bound_s": time.perf_counter() - t0})
