"""Tabular MDPs with a softmax policy: racsim's bias benchmark.

The paper's closed-form benchmark (rac-paper.tex, "Empirical Demonstration"
and the "MDP-Size Scaling" appendix) is a softmax policy over a small tabular
MDP whose reward is a fast channel plus K slow channels. This module builds
those MDPs, solves them exactly (Q-values, stationary distribution, the true
policy gradient, the optimal policy), computes the exact expectation of the
finite-horizon Monte-Carlo gradient estimator, and samples trajectories for
that estimator. Everything is NumPy, pure and vectorised.

Conventions: ``theta`` and ``pi`` are (S, A); a reward is (S, A), or (C, S, A)
for C channels at once (the result then gains a leading C axis). The
estimator's returns are discounted and truncated at the horizon T.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np

from racsim.config.schema import REWARD_SPLITS as SPLITS, TOPOLOGIES

__all__ = [
    "TabularMDP",
    "make_mdp",
    "canonical_theta",
    "softmax_policy",
    "state_transition",
    "stationary_distribution",
    "q_values",
    "objective",
    "true_gradient",
    "finite_horizon_expectation",
    "behaviour_moments",
    "behaviour_moments_jvp",
    "policy_path",
    "optimal_policy",
]


def _frozen(x, ndim: int, name: str) -> np.ndarray:
    a = np.array(x, dtype=np.float64, copy=True)
    if a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {a.shape}")
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class TabularMDP:
    """A tabular MDP with a fast reward channel and K slow channels.

    ``P`` (S, A, S) transition probabilities; ``r_fast`` (S, A) fast-channel
    mean reward; ``r_slow`` (K, S, A) slow reward of each channel (their sum
    is the slow reward); ``gamma`` discount; ``start`` (S,) initial-state
    distribution. Arrays are copied to read-only float64 on construction.
    Equality is identity (arrays have no single truth value).
    """

    P: np.ndarray
    r_fast: np.ndarray
    r_slow: np.ndarray
    gamma: float
    start: np.ndarray

    def __post_init__(self) -> None:
        P = _frozen(self.P, 3, "P")
        S, A, S2 = P.shape
        if S2 != S or S < 1 or A < 1:
            raise ValueError(f"P must be (S, A, S), got shape {P.shape}")
        if np.any(P < 0) or not np.allclose(P.sum(-1), 1.0, atol=1e-10):
            raise ValueError("P[s, a] must be probability vectors")
        r_fast = _frozen(self.r_fast, 2, "r_fast")
        r_slow = _frozen(self.r_slow, 3, "r_slow")
        start = _frozen(self.start, 1, "start")
        if r_fast.shape != (S, A):
            raise ValueError(f"r_fast must be {(S, A)}, got {r_fast.shape}")
        if r_slow.shape[1:] != (S, A) or r_slow.shape[0] < 1:
            raise ValueError(f"r_slow must be (K, {S}, {A}) with K >= 1, got {r_slow.shape}")
        if start.shape != (S,) or np.any(start < 0) or not np.isclose(start.sum(), 1.0, atol=1e-10):
            raise ValueError("start must be a probability vector over the S states")
        gamma = float(self.gamma)
        if not 0.0 <= gamma < 1.0:
            raise ValueError(f"gamma must be in [0, 1), got {gamma}")
        for name, value in (("P", P), ("r_fast", r_fast), ("r_slow", r_slow), ("start", start), ("gamma", gamma)):
            object.__setattr__(self, name, value)

    @property
    def n_states(self) -> int:
        return self.P.shape[0]

    @property
    def n_actions(self) -> int:
        return self.P.shape[1]

    @property
    def n_channels(self) -> int:
        """K, the number of slow channels."""
        return self.r_slow.shape[0]

    @property
    def reward_total(self) -> np.ndarray:
        """(S, A) ground-truth reward: r_fast + sum over the K slow channels."""
        return self.r_fast + self.r_slow.sum(0)


def make_mdp(
    n_states: int,
    n_actions: int,
    *,
    mdp_seed: int = 1337,
    shares: Sequence[float] = (1.0,),
    gamma: float = 0.9,
    slow_bump: float = 0.6,
    topology: str = "random",
    channel_noise_std: float = 0.0,
    split: str = "slow",
) -> TabularMDP:
    """The paper's MDP recipe (MDP-Size Scaling appendix), uniform start.

    Draws from ``np.random.default_rng(mdp_seed)``, in this order: transition
    logits N(0, 1) of shape (S, A, S), softmaxed over next states; fast reward
    U(-0.5, 0.5) (S, A); slow jitter U(-0.3, 0.3) (S, A); then, only when
    ``channel_noise_std`` > 0, the channel noise. The slow reward is the jitter
    plus ``slow_bump`` at (s=0, a=A-1); channel k gets the fraction
    shares[k] / sum(shares) of it, so K = len(shares). With channel noise
    (the cross-topology study's split), channel k also gets eps_k ~ N(0, std^2)
    per (s, a), the last channel's eps pinned to minus the sum of the others so
    that the channels still sum to the slow reward. ``topology`` reshapes the
    transitions and rewards after the draws (see :func:`_shape_topology`).

    ``split="total"`` is the paper's K-sweep decomposition (Cross-Topology
    appendix): the total reward r_fast + r_slow is split into C = K + 1 equal
    parts r_total / C + eps_c (eps as above, last one pinned; ``shares`` only
    fix K), part 0 the fast channel that naive sees, parts 1..K the slow channels.
    """
    S, A = int(n_states), int(n_actions)
    if S < 1 or A < 1:
        raise ValueError(f"n_states and n_actions must be >= 1, got {S}, {A}")
    if topology not in TOPOLOGIES:
        raise ValueError(f"topology must be one of {TOPOLOGIES}, got {topology!r}")
    w = np.asarray(shares, dtype=np.float64)
    if w.ndim != 1 or w.size < 1:
        raise ValueError("shares must be a non-empty sequence")
    if np.any(~np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"shares must be finite, >= 0 and sum to > 0, got {tuple(w)}")
    rng = np.random.default_rng(mdp_seed)
    logits = rng.standard_normal((S, A, S))
    r_fast = rng.uniform(-0.5, 0.5, (S, A))
    slow = rng.uniform(-0.3, 0.3, (S, A))
    logits, r_fast, slow = _shape_topology(topology, logits, r_fast, slow)
    slow[0, A - 1] += slow_bump
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if split == "total":
        parts = np.broadcast_to((r_fast + slow) / (len(w) + 1), (len(w) + 1, S, A))
        parts = parts + _pinned_noise(rng, channel_noise_std, len(w) + 1, S, A)
        r_fast, r_slow = parts[0], parts[1:]
    else:
        r_slow = slow[None] * (w / w.sum())[:, None, None]
        if channel_noise_std > 0 and len(w) > 1:
            r_slow = r_slow + _pinned_noise(rng, channel_noise_std, len(w), S, A)
    P = softmax_policy(logits)  # softmax over the last axis
    if topology == "terminal":
        P[S - 1] = 1.0 / S  # the terminal state restarts the episode from the uniform start
    return TabularMDP(P=P, r_fast=r_fast, r_slow=r_slow, gamma=gamma, start=np.full(S, 1.0 / S))


def _pinned_noise(rng: np.random.Generator, std: float, C: int, S: int, A: int) -> np.ndarray:
    """(C, S, A) eps_c ~ N(0, std^2) for c < C - 1, the last pinned to minus their sum
    (the channels keep their sum); zeros, and no draw, when std = 0 or C = 1."""
    if not std > 0 or C < 2:
        return np.zeros((C, S, A))
    eps = rng.normal(0.0, std, (C - 1, S, A))
    return np.concatenate([eps, -eps.sum(0, keepdims=True)])


def _shape_topology(topology: str, logits: np.ndarray, r_fast: np.ndarray, slow: np.ndarray):
    """Turn the recipe's draws into one of the paper's five topologies.

    The paper names them only; these are racsim's constructions, each keeping
    the recipe's random draws so that seeds still matter:

    - ``random`` (the canonical recipe): softmax of N(0, 1) logits, every
      next state reachable with a smooth, random probability.
    - ``chain``: states on a line; action a pushes towards neighbour
      s - 1 + 2a/(A - 1) (left ... right), clamped at the ends: +4 on that
      logit, so about 80-90% of the mass goes there. Sparse, local transitions.
    - ``cyclic``: states on a ring; action a moves a steps forward (a = 0
      stays), +4 on that logit. Every state recurs; no ends.
    - ``dense``: the logits shrunk to a quarter (N(0, 1/16)): nearly uniform,
      every state a step away from every other.
    - ``terminal``: the last state is terminal: every action there restarts
      the episode from the uniform start; the fast reward and slow jitter are
      zero except on the terminal state (sparse rewards); the slow bump stays
      at (0, A - 1).
    """
    S, A, _ = logits.shape
    logits = logits.copy()
    if topology == "chain":
        for a in range(A):
            step = 0 if A == 1 else round(-1 + 2 * a / (A - 1))
            target = np.clip(np.arange(S) + step, 0, S - 1)
            logits[np.arange(S), a, target] += 4.0
    elif topology == "cyclic":
        for a in range(A):
            logits[np.arange(S), a, (np.arange(S) + a) % S] += 4.0
    elif topology == "dense":
        logits = logits / 4.0
    elif topology == "terminal":
        mask = np.zeros((S, 1))
        mask[S - 1] = 1.0
        r_fast, slow = r_fast * mask, slow * mask
    return logits, r_fast, slow


def canonical_theta(n_states: int, n_actions: int, seed: int = 7, scale: float = 0.3) -> np.ndarray:
    """The benchmark's fixed policy logits: N(0, scale^2) of shape (S, A) from default_rng(seed)."""
    return np.random.default_rng(seed).normal(scale=scale, size=(n_states, n_actions))


def softmax_policy(theta: np.ndarray) -> np.ndarray:
    """Softmax over the last axis (max-subtracted, so large logits do not overflow)."""
    z = np.asarray(theta, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def _check_pi(mdp: TabularMDP, pi: np.ndarray) -> np.ndarray:
    """``pi`` as float64, (S, A) or a stack of policies (..., S, A)."""
    pi = np.asarray(pi, dtype=np.float64)
    if pi.shape[-2:] != (mdp.n_states, mdp.n_actions) or pi.ndim < 2:
        raise ValueError(f"pi must be {(mdp.n_states, mdp.n_actions)} (or a stack of them), got {pi.shape}")
    return pi


def _reward(mdp: TabularMDP, reward) -> Tuple[np.ndarray, bool]:
    """Reward as (C, S, A) plus whether the caller passed a single (S, A) reward."""
    r = mdp.reward_total if reward is None else np.asarray(reward, dtype=np.float64)
    sa = (mdp.n_states, mdp.n_actions)
    if r.shape == sa:
        return r[None], True
    if r.ndim == 3 and r.shape[1:] == sa:
        return r, False
    raise ValueError(f"reward must be {sa} or (C, {sa[0]}, {sa[1]}), got {r.shape}")


def state_transition(mdp: TabularMDP, pi: np.ndarray) -> np.ndarray:
    """(S, S) state chain under pi: P_pi[s, s'] = sum_a pi(a|s) P(s'|s, a); (..., S, S) for a stack of policies."""
    return np.einsum("...sa,sat->...st", _check_pi(mdp, pi), mdp.P)


def stationary_distribution(mdp: TabularMDP, pi: np.ndarray) -> np.ndarray:
    """(S,) stationary distribution d of P_pi (d P_pi = d, sum d = 1); (..., S) for a stack of policies.

    Solves d (I - P_pi + 1 1^T) = 1^T, non-singular for a unichain P_pi.
    """
    P_pi = state_transition(mdp, pi)
    S = mdp.n_states
    M = np.eye(S) - P_pi + 1.0
    d = np.linalg.solve(np.swapaxes(M, -1, -2), np.ones(P_pi.shape[:-1])[..., None])[..., 0]
    d = np.clip(d, 0.0, None)
    return d / d.sum(axis=-1, keepdims=True)


def _values(mdp: TabularMDP, pi: np.ndarray, r: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Q (C, S, A) and V (C, S) for a (C, S, A) reward, by one linear solve; (..., C, S, A) and
    (..., C, S) for a stack of policies (..., S, A)."""
    P_pi = state_transition(mdp, pi)
    r_pi = np.einsum("csa,...sa->...cs", r, pi)
    V = np.swapaxes(np.linalg.solve(np.eye(mdp.n_states) - mdp.gamma * P_pi, np.swapaxes(r_pi, -1, -2)), -1, -2)
    Q = r + mdp.gamma * np.einsum("sat,...ct->...csa", mdp.P, V)
    return Q, V


def q_values(mdp: TabularMDP, pi: np.ndarray, reward: Optional[np.ndarray] = None) -> np.ndarray:
    """Q^pi by a linear solve: V = (I - gamma P_pi)^-1 r_pi, Q = r + gamma P V.

    ``reward`` defaults to ``mdp.reward_total``; (S, A) -> (S, A) and
    (C, S, A) -> (C, S, A).
    """
    r, single = _reward(mdp, reward)
    Q, _ = _values(mdp, _check_pi(mdp, pi), r)
    return Q[0] if single else Q


def _start(mdp: TabularMDP, start) -> np.ndarray:
    mu = np.asarray(start, dtype=np.float64)
    if mu.shape != (mdp.n_states,):
        raise ValueError(f"start must be ({mdp.n_states},), got {mu.shape}")
    return mu


def objective(mdp: TabularMDP, theta: np.ndarray, reward=None, start=None):
    """J(theta) = (1 - gamma) mu^T V_theta for the softmax policy pi_theta.

    mu = ``start`` if given, else the stationary distribution d of pi_theta;
    then J equals the long-run average reward d . r_pi. Note that with
    start=None, d moves with theta: ``true_gradient(start=None)`` is NOT the
    gradient of this function but of ``objective(., start=d(theta))`` with d
    frozen. A float for an (S, A) reward, a (C,) array for (C, S, A); for a stack of policies ``theta``
    (..., S, A), one J each (as computed one by one, to the bit): (...) or (..., C).
    """
    r, single = _reward(mdp, reward)
    pi = softmax_policy(theta)
    _, V = _values(mdp, pi, r)
    mu = stationary_distribution(mdp, pi) if start is None else np.broadcast_to(_start(mdp, start), pi.shape[:-1])
    J = ((1.0 - mdp.gamma) * V @ mu[..., None])[..., 0]
    J = J[..., 0] if single else J
    return float(J) if J.ndim == 0 else J


def true_gradient(mdp: TabularMDP, theta: np.ndarray, reward=None, start=None) -> np.ndarray:
    """Closed-form policy gradient (policy-gradient theorem, softmax score).

    g[s, b] = nu(s) pi(b|s) (Q(s, b) - V(s)) with
    nu = (1 - gamma) mu^T (I - gamma P_pi)^-1 for ``start`` = mu: exactly the
    gradient of theta -> objective(theta, start=mu) for a FIXED mu.
    With start=None, nu = d_pi(theta) (since d^T (I - gamma P_pi)^-1 =
    d^T / (1 - gamma)): this is g*, the gradient of objective(., start=d)
    with d frozen at d_pi(theta), not of objective(., start=None).
    Shape (S, A), or (C, S, A) for a (C, S, A) reward.
    """
    r, single = _reward(mdp, reward)
    pi = softmax_policy(theta)
    Q, V = _values(mdp, pi, r)
    if start is None:
        nu = stationary_distribution(mdp, pi)
    else:
        P_pi = state_transition(mdp, pi)
        M = np.eye(mdp.n_states) - mdp.gamma * P_pi
        nu = (1.0 - mdp.gamma) * np.linalg.solve(M.T, _start(mdp, start))
    g = nu[None, :, None] * pi[None] * (Q - V[..., None])
    return g[0] if single else g


def finite_horizon_expectation(
    mdp: TabularMDP, theta: np.ndarray, horizon: int, reward=None, start=None
) -> np.ndarray:
    """Exact E[g_hat] of the T-step Monte-Carlo estimator, without sampling.

    g_hat = (1/T) sum_{t<T} grad log pi(a_t|s_t) G_t, G_t the discounted return
    of ``reward`` truncated at T, s_0 ~ ``start`` (default mdp.start). With
    mu_t = mu_0 P_pi^t and h-step truncated Q-values Q^(1) = r,
    Q^(h) = r + gamma P pi Q^(h-1):
    E[s, b] = (1/T) sum_t mu_t(s) pi(b|s) (Q^(T-t)(s, b) - sum_a pi(a|s) Q^(T-t)(s, a)).
    Linear in the reward; tends to ``true_gradient(start=None)`` as T grows
    (the gap is O(1/T)). (S, A), or (C, S, A) for a (C, S, A) reward.
    """
    T = int(horizon)
    if T < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    r, single = _reward(mdp, reward)
    pi = softmax_policy(theta)
    P_pi = state_transition(mdp, pi)
    mu = mdp.start if start is None else _start(mdp, start)
    # adv[h - 1] = pi * (Q^(h) - V^(h)), for h = 1..T
    adv = np.empty((T,) + r.shape)
    Qh = r
    for h in range(T):
        if h > 0:
            Qh = _backup(mdp, r, pi, Qh)
        adv[h] = pi * (Qh - np.einsum("csa,sa->cs", Qh, pi)[..., None])
    mus = _marginals(mu, P_pi, T)
    # at time t the remaining horizon is h = T - t, i.e. adv[T - t - 1]
    E = np.einsum("ts,tcsa->csa", mus, adv[::-1]) / T
    return E[0] if single else E


def _backup(mdp: TabularMDP, r: np.ndarray, pi: np.ndarray, Qh: np.ndarray) -> np.ndarray:
    """Q^(h+1) = r + gamma P V^(h), V^(h)(s) = sum_a pi(a|s) Q^(h)(s, a): one more step of horizon."""
    Vh = np.einsum("csa,sa->cs", Qh, pi)
    return r + mdp.gamma * np.einsum("sat,ct->csa", mdp.P, Vh)


def _marginals(mu: np.ndarray, P_pi: np.ndarray, T: int) -> np.ndarray:
    """(T, S) the state's law at times 0..T-1 of a chain started from ``mu``: mu_t = mu_0 P_pi^t."""
    mus = np.empty((T, len(mu)))
    mus[0] = mu
    for t in range(1, T):
        mus[t] = mus[t - 1] @ P_pi
    return mus


def behaviour_moments(mdp: TabularMDP, theta_b: np.ndarray, horizon: int, reward=None) -> np.ndarray:
    """M = E[sum_{t<T} 1[s_t = s, a_t = a] G_t] over T-step trajectories of the behaviour policy
    mu = softmax(``theta_b``) from ``mdp.start``, G_t the return truncated at T:

        M[s, a] = sum_t mu_t(s) mu(a|s) Q_mu^(T-t)(s, a),

    mu_t the state's law at time t and Q_mu^(h) the h-step truncated Q-values, both under mu. The
    score-function estimator of a policy pi on those trajectories, with a weight w(s, a) on each decision,
    then has the exact expectation ``rollouts.softmax_score(w * M, pi, T)`` (linear in M cell by cell); with
    pi = mu and w = 1 that is :func:`finite_horizon_expectation`. (S, A), or (C, S, A) for (C, S, A) rewards.
    """
    T = int(horizon)
    if T < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    r, single = _reward(mdp, reward)
    mu = softmax_policy(theta_b)
    mus = _marginals(mdp.start, state_transition(mdp, mu), T)
    M = np.zeros(r.shape)
    Qh = r
    for h in range(1, T + 1):  # Q^(h) weighs time t = T - h
        if h > 1:
            Qh = _backup(mdp, r, mu, Qh)
        M += mus[T - h][None, :, None] * mu[None] * Qh
    return M[0] if single else M


def behaviour_moments_jvp(mdp: TabularMDP, theta_b: np.ndarray, horizon: int, direction: np.ndarray,
                          reward=None) -> Tuple[np.ndarray, np.ndarray]:
    """(M, dM): :func:`behaviour_moments` at ``theta_b`` and its derivative along ``direction`` (S, A),
    d/de M(theta_b + e * direction) at e = 0, by forward-mode through the same recursions:
    dmu = mu (x - sum_a mu x), dmu_{t+1} = dmu_t P_mu + mu_t dP_mu, dQ^(h+1) = gamma P dV^(h),
    dV^(h) = sum_a (dmu Q^(h) + mu dQ^(h)). The first-order law of a lagged update reads it
    (racsim.learner.theory.first_order_staleness)."""
    T = int(horizon)
    if T < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    r, single = _reward(mdp, reward)
    mu = softmax_policy(theta_b)
    x = np.asarray(direction, dtype=np.float64)
    dmu = mu * (x - (mu * x).sum(axis=-1, keepdims=True))
    P_mu, dP = state_transition(mdp, mu), np.einsum("sa,sat->st", dmu, mdp.P)
    mus = _marginals(mdp.start, P_mu, T)
    dmus = np.zeros_like(mus)
    for t in range(1, T):
        dmus[t] = dmus[t - 1] @ P_mu + mus[t - 1] @ dP
    M, dM = np.zeros(r.shape), np.zeros(r.shape)
    Qh, dQh = r, np.zeros(r.shape)
    for h in range(1, T + 1):
        if h > 1:
            dV = np.einsum("csa,sa->cs", Qh, dmu) + np.einsum("csa,sa->cs", dQh, mu)
            dQh = mdp.gamma * np.einsum("sat,ct->csa", mdp.P, dV)
            Qh = _backup(mdp, r, mu, Qh)
        m, dm = mus[T - h][None, :, None], dmus[T - h][None, :, None]
        M += m * mu[None] * Qh
        dM += dm * mu[None] * Qh + m * dmu[None] * Qh + m * mu[None] * dQh
    return (M[0], dM[0]) if single else (M, dM)


def policy_path(mdp: TabularMDP, theta0: np.ndarray, lr: float, length: int) -> np.ndarray:
    """(length, S, A) the policies a learner passes through by expected policy-gradient ascent on the true
    gradient (:func:`true_gradient`, the bias benchmark's target) at step size ``lr``:
    theta_0 = ``theta0``, theta_{t+1} = theta_t + lr * g*(theta_t). Version t is theta_t."""
    out = np.empty((int(length),) + np.shape(theta0))
    out[0] = theta0
    for t in range(1, int(length)):
        out[t] = out[t - 1] + lr * true_gradient(mdp, out[t - 1])
    return out


def optimal_policy(mdp: TabularMDP, reward: Optional[np.ndarray] = None) -> np.ndarray:
    """(S, A) one-hot greedy policy of Q*, by exact policy iteration.

    Starts from the greedy policy of the reward; switches an action only on
    a strict improvement (beyond rounding), so it terminates.
    """
    r, single = _reward(mdp, reward)
    if not single:
        raise ValueError("optimal_policy takes one (S, A) reward")
    S, A = mdp.n_states, mdp.n_actions
    rows = np.arange(S)
    act = r[0].argmax(axis=1)
    for _ in range(10_000):
        pi = np.zeros((S, A))
        pi[rows, act] = 1.0
        Q = _values(mdp, pi, r)[0][0]
        best = Q.argmax(axis=1)
        tol = 1e-12 * (1.0 + np.abs(Q).max())
        improve = Q[rows, best] > Q[rows, act] + tol
        if not improve.any():
            return pi
        act = np.where(improve, best, act)
    raise RuntimeError("policy iteration did not converge")  # pragma: no cover
