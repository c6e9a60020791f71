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

from .config import TOPOLOGIES  # the names users may choose; built in _shape_topology

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
    "optimal_policy",
    "sample_trajectories",
    "discounted_returns",
    "trajectory_gradients",
    "score_gradient",
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
    r_slow = slow[None] * (w / w.sum())[:, None, None]
    if channel_noise_std > 0 and len(w) > 1:
        eps = rng.normal(0.0, channel_noise_std, (len(w) - 1, S, A))
        r_slow = r_slow + np.concatenate([eps, -eps.sum(0, keepdims=True)])
    P = softmax_policy(logits)  # softmax over the last axis
    if topology == "terminal":
        P[S - 1] = 1.0 / S  # the terminal state restarts the episode from the uniform start
    return TabularMDP(P=P, r_fast=r_fast, r_slow=r_slow, gamma=gamma, start=np.full(S, 1.0 / S))


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
    pi = np.asarray(pi, dtype=np.float64)
    if pi.shape != (mdp.n_states, mdp.n_actions):
        raise ValueError(f"pi must be {(mdp.n_states, mdp.n_actions)}, got {pi.shape}")
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
    """(S, S) state chain under pi: P_pi[s, s'] = sum_a pi(a|s) P(s'|s, a)."""
    return np.einsum("sa,sat->st", _check_pi(mdp, pi), mdp.P)


def stationary_distribution(mdp: TabularMDP, pi: np.ndarray) -> np.ndarray:
    """(S,) stationary distribution d of P_pi (d P_pi = d, sum d = 1).

    Solves d (I - P_pi + 1 1^T) = 1^T, non-singular for a unichain P_pi.
    """
    P_pi = state_transition(mdp, pi)
    S = mdp.n_states
    M = np.eye(S) - P_pi + 1.0
    d = np.linalg.solve(M.T, np.ones(S))
    d = np.clip(d, 0.0, None)
    return d / d.sum()


def _values(mdp: TabularMDP, pi: np.ndarray, r: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Q (C, S, A) and V (C, S) for a (C, S, A) reward, by one linear solve."""
    P_pi = state_transition(mdp, pi)
    r_pi = np.einsum("csa,sa->cs", r, pi)
    V = np.linalg.solve(np.eye(mdp.n_states) - mdp.gamma * P_pi, r_pi.T).T
    Q = r + mdp.gamma * np.einsum("sat,ct->csa", mdp.P, V)
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
    frozen. A float for an (S, A) reward, a (C,) array for (C, S, A).
    """
    r, single = _reward(mdp, reward)
    pi = softmax_policy(theta)
    _, V = _values(mdp, pi, r)
    mu = stationary_distribution(mdp, pi) if start is None else _start(mdp, start)
    J = (1.0 - mdp.gamma) * V @ mu
    return float(J[0]) if single else J


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
            Vh = np.einsum("csa,sa->cs", Qh, pi)
            Qh = r + mdp.gamma * np.einsum("sat,ct->csa", mdp.P, Vh)
        adv[h] = pi * (Qh - np.einsum("csa,sa->cs", Qh, pi)[..., None])
    mus = np.empty((T, mdp.n_states))
    mus[0] = mu
    for t in range(1, T):
        mus[t] = mus[t - 1] @ P_pi
    # at time t the remaining horizon is h = T - t, i.e. adv[T - t - 1]
    E = np.einsum("ts,tcsa->csa", mus, adv[::-1]) / T
    return E[0] if single else E


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


def _search_table(p: np.ndarray) -> np.ndarray:
    """(R, m - 1) inverse-CDF thresholds for the probability rows p (R, m).

    Entry j is cdf[j] = p[0] + ... + p[j]; entries at or after the row's last
    positive-probability index are +inf, so cumsum rounding (a total slightly
    below 1) can never select index m or a zero-probability tail index.
    """
    m = p.shape[1]
    cdf = np.cumsum(p, axis=1)[:, : m - 1]
    last = m - 1 - np.argmax(p[:, ::-1] > 0, axis=1)
    cdf[np.arange(m - 1)[None, :] >= last[:, None]] = np.inf
    return cdf


def _inverse_cdf(table: np.ndarray, rows: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Row-wise inverse CDF: k = #{j : cdf[rows, j] <= u}, i.e. cdf[k-1] <= u < cdf[k].

    One gather-compare pass per column of ``table`` (from ``_search_table``).
    """
    width = table.shape[1]
    flat = table.ravel()
    base = rows * width
    k = np.zeros(u.shape, dtype=np.int64)
    for j in range(width):
        k += np.take(flat, base + j) <= u
    return k


def sample_trajectories(
    mdp: TabularMDP, pi: np.ndarray, n: int, horizon: int, rng: np.random.Generator, time_major: bool = False
) -> Tuple[np.ndarray, np.ndarray]:
    """Sample n trajectories of T steps: s_0 ~ start, a_t ~ pi(.|s_t), s_{t+1} ~ P[s_t, a_t].

    ``pi`` is (S, A), or (n, S, A) for one policy per trajectory (lanes).
    Inverse-CDF on ``rng.random`` draws, vectorised over n (loop over T only):
    one draw of n for s_0, then per step one for the actions and, before the
    last step, one for the next states. Deterministic given the generator.
    Returns (states, actions), each (n, T) int64, or (T, n) with ``time_major``
    (the layout they are drawn in: no transpose).
    """
    n, T = int(n), int(horizon)
    if n < 0 or T < 1:
        raise ValueError(f"need n >= 0 and horizon >= 1, got {n}, {T}")
    S, A = mdp.n_states, mdp.n_actions
    pi = np.asarray(pi, dtype=np.float64)
    if pi.shape not in ((S, A), (n, S, A)):
        raise ValueError(f"pi must be {(S, A)} or {(n, S, A)}, got {pi.shape}")
    if np.any(pi < 0) or not np.allclose(pi.sum(-1), 1.0, atol=1e-8):
        raise ValueError("pi rows must be probability vectors")
    tab_start = _search_table(mdp.start[None])
    tab_pi = _search_table(pi.reshape(-1, A))
    # row of tab_pi for (trajectory i, state s): s, or i * S + s per trajectory
    lane = np.arange(n, dtype=np.int64) * S if pi.ndim == 3 else 0
    tab_P = _search_table(mdp.P.reshape(S * A, S))
    # time-major buffers (contiguous writes per step), transposed blockwise at the end
    st = np.empty((T, n), dtype=np.int64)
    ac = np.empty((T, n), dtype=np.int64)
    s = _inverse_cdf(tab_start, np.zeros(n, dtype=np.int64), rng.random(n))
    for t in range(T):
        a = _inverse_cdf(tab_pi, lane + s, rng.random(n))
        st[t] = s
        ac[t] = a
        if t + 1 < T:
            s = _inverse_cdf(tab_P, s * A + a, rng.random(n))
    if time_major:
        return st, ac
    return _transpose(st), _transpose(ac)


def _transpose(x: np.ndarray, block: int = 4096) -> np.ndarray:
    """C-contiguous x.T, copied in cache-sized column blocks (much faster than one strided copy)."""
    out = np.empty(x.shape[::-1], dtype=x.dtype)
    for i in range(0, x.shape[1], block):
        out[i : i + block] = x[:, i : i + block].T
    return out


def discounted_returns(rewards: np.ndarray, gamma: float, axis: int = -1) -> np.ndarray:
    """G_t = sum_{j=t}^{T-1} gamma^(j-t) r_j along ``axis`` (time; truncated at T); same shape.

    A backward recursion G_t = r_t + gamma G_{t+1}. With time on the last axis
    it runs on a time-major copy, so that each step is one contiguous vector
    operation; pass ``axis`` for arrays that are already time-major (no copy
    beyond the result itself).
    """
    r = np.asarray(rewards, dtype=np.float64)
    axis = axis % r.ndim
    if axis == r.ndim - 1 and r.ndim > 1:
        rT = np.moveaxis(r, -1, 0).copy()  # time-major, contiguous per step
        _recurse(rT, gamma, 0)
        return np.ascontiguousarray(np.moveaxis(rT, 0, -1))
    G = r.copy()
    _recurse(G, gamma, axis)
    return G


def _recurse(G: np.ndarray, gamma: float, axis: int) -> None:
    """In place: G[t] += gamma * G[t + 1] backwards along ``axis``."""
    idx = [slice(None)] * G.ndim
    for t in range(G.shape[axis] - 2, -1, -1):
        here, nxt = list(idx), list(idx)
        here[axis], nxt[axis] = t, t + 1
        G[tuple(here)] += gamma * G[tuple(nxt)]


def trajectory_gradients(
    states: np.ndarray, actions: np.ndarray, returns: np.ndarray, pi: np.ndarray, time_major: bool = False
) -> np.ndarray:
    """Per-trajectory softmax score-function gradients, (n, C, S, A).

    g[i, c, s, b] = (1/T) sum_t 1[s_t = s] (1[a_t = b] - pi(b|s)) returns[i, c, t].
    ``returns`` is (n, C, T), or (n, T) read as C = 1. Vectorised with
    np.bincount, one call per cache-sized block of 4096 trajectories (no loop
    over single trajectories or over time). With ``time_major``, states and
    actions are (T, n) and returns (C, T, n): one bincount, no transpose.
    """
    if time_major:
        return _gradients_time_major(states, actions, returns, pi)
    states = np.asarray(states)
    actions = np.asarray(actions)
    pi = np.asarray(pi, dtype=np.float64)
    R = np.asarray(returns, dtype=np.float64)
    if states.ndim != 2 or actions.shape != states.shape:
        raise ValueError("states and actions must both be (n, T)")
    n, T = states.shape
    if R.ndim == 2:
        R = R[:, None, :]
    if R.ndim != 3 or R.shape[0] != n or R.shape[2] != T:
        raise ValueError(f"returns must be (n, C, T) or (n, T) with n={n}, T={T}, got {np.shape(returns)}")
    if pi.ndim != 2:
        raise ValueError("pi must be (S, A)")
    S, A = pi.shape
    C = R.shape[1]
    if n == 0 or T == 0:
        return np.zeros((n, C, S, A))
    if states.min() < 0 or states.max() >= S or actions.min() < 0 or actions.max() >= A:
        raise ValueError("states or actions out of range for pi")
    SA = S * A
    out = np.empty((n, C, S, A))
    flat = out.reshape(n, C, SA)
    # cache-sized blocks of trajectories; within a block one bincount over
    # keys (i, c, s*A + a) sums returns[i, c, t] into the cell (s_t, a_t)
    block = 4096
    off = (np.arange(block * C, dtype=np.int64) * SA).reshape(block, C, 1)
    for i in range(0, n, block):
        m = min(block, n - i)
        sa = states[i : i + m].astype(np.int64) * A
        sa += actions[i : i + m]
        key = (off[:m] + sa[:, None, :]).ravel()
        flat[i : i + m] = np.bincount(key, weights=R[i : i + m].ravel(), minlength=m * C * SA).reshape(m, C, SA)
    # sum_t 1[s_t=s, a_t=b] G_t  -  pi(b|s) sum_t 1[s_t=s] G_t
    out -= pi * out.sum(axis=-1, keepdims=True)
    out /= T
    return out


def _gradients_time_major(states, actions, returns, pi) -> np.ndarray:
    states, actions = np.asarray(states), np.asarray(actions)
    R = np.asarray(returns, dtype=np.float64)
    pi = np.asarray(pi, dtype=np.float64)
    T, n = states.shape
    S, A = pi.shape
    C = R.shape[0]
    if R.shape != (C, T, n) or actions.shape != (T, n):
        raise ValueError(f"time-major inputs must be states/actions (T, n) and returns (C, T, n), got {R.shape}")
    SA = S * A
    key = np.arange(n, dtype=np.int64) * SA + states * A + actions  # (T, n): cell of trajectory i at t
    keys = (np.arange(C, dtype=np.int64)[:, None, None] * (n * SA) + key[None]).ravel()
    out = np.bincount(keys, weights=R.ravel(), minlength=C * n * SA).reshape(C, n, S, A)
    out -= pi * out.sum(axis=-1, keepdims=True)
    out /= T
    return out.transpose(1, 0, 2, 3)


def score_gradient(
    lanes: np.ndarray, states: np.ndarray, actions: np.ndarray, returns: np.ndarray, pi: np.ndarray
) -> np.ndarray:
    """Per-lane SUM of the trajectories' score-function gradients, (L, S, A).

    g[l, s, b] = sum_{i : lanes[i] = l} (1/T) sum_t 1[s_it = s] (1[a_it = b] - pi[l](b|s)) returns[i, t],
    i.e. the sum over each lane's rows of ``trajectory_gradients`` (same 1/T
    normalisation) with that lane's policy. ``lanes`` (n,) in [0, L);
    ``states``, ``actions``, ``returns`` (n, T); ``pi`` (L, S, A), or (S, A)
    for L = 1. One np.bincount, no loop.
    """
    pi = np.asarray(pi, dtype=np.float64)
    if pi.ndim == 2:
        pi = pi[None]
    if pi.ndim != 3:
        raise ValueError(f"pi must be (L, S, A) or (S, A), got {pi.shape}")
    L, S, A = pi.shape
    lanes = np.asarray(lanes)
    states = np.asarray(states)
    actions = np.asarray(actions)
    R = np.asarray(returns, dtype=np.float64)
    if states.ndim != 2 or actions.shape != states.shape or R.shape != states.shape:
        raise ValueError("states, actions and returns must all be (n, T)")
    n, T = states.shape
    if lanes.shape != (n,):
        raise ValueError(f"lanes must be ({n},), got {lanes.shape}")
    if n == 0 or T == 0:
        return np.zeros((L, S, A))
    if lanes.min() < 0 or lanes.max() >= L:
        raise ValueError("lanes out of range for pi")
    if states.min() < 0 or states.max() >= S or actions.min() < 0 or actions.max() >= A:
        raise ValueError("states or actions out of range for pi")
    key = states.astype(np.int64) * A
    key += actions
    key += lanes.astype(np.int64)[:, None] * (S * A)
    M = np.bincount(key.ravel(), weights=R.ravel(), minlength=L * S * A).reshape(L, S, A)
    return (M - pi * M.sum(axis=-1, keepdims=True)) / T
