"""Rollouts of a tabular softmax policy and their score-function gradients:
trajectories sampled in bulk, discounted returns, and the REINFORCE gradient
sum_t G_t grad log pi(a_t | s_t) per trajectory.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np

from racsim.learner.mdp import TabularMDP


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
