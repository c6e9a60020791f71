"""Rollouts of a tabular softmax policy and their score-function gradients:
trajectories sampled in bulk, discounted returns, and the REINFORCE gradient
(1/T) sum_t G_t grad log pi(a_t | s_t), per trajectory or summed per lane.

Small pure functions over arrays, in the style of rlax: :func:`cell_index`,
:func:`cell_sums` and :func:`softmax_score` are the steps of the one score
gradient, :func:`score_gradient`, which every caller uses.
"""

from __future__ import annotations

from typing import Optional, Tuple

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
    mdp: TabularMDP, pi: np.ndarray, n: int, horizon: int, rng: np.random.Generator, time_major: bool = False,
    copies: int = 1,
) -> Tuple[np.ndarray, np.ndarray]:
    """Sample n trajectories of T steps: s_0 ~ start, a_t ~ pi(.|s_t), s_{t+1} ~ P[s_t, a_t].

    ``pi`` is (S, A), or (n, S, A) for one policy per trajectory (lanes).
    Inverse-CDF on ``rng.random`` draws, vectorised over n (loop over T only):
    one draw of n for s_0, then per step one for the actions and, before the
    last step, one for the next states. Deterministic given the generator.
    Returns (states, actions), each (n, T) int64, or (T, n) with ``time_major``
    (the layout they are drawn in: no transpose). ``copies`` > 1: each draw is
    of n / copies numbers, repeated ``copies`` times (trajectory i uses those
    of i mod n / copies): the trajectories of ``copies`` runs that share one
    random stream, each as it is drawn alone (racsim.learner.training.train_cells).
    """
    n, T = int(n), int(horizon)
    if n < 0 or T < 1:
        raise ValueError(f"need n >= 0 and horizon >= 1, got {n}, {T}")
    if copies < 1 or n % copies:
        raise ValueError(f"copies = {copies}: a divisor of n = {n}")
    m = n // copies

    def uniform() -> np.ndarray:
        u = rng.random(m)
        return u if copies == 1 else np.tile(u, copies)

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
    s = _inverse_cdf(tab_start, np.zeros(n, dtype=np.int64), uniform())
    for t in range(T):
        a = _inverse_cdf(tab_pi, lane + s, uniform())
        st[t] = s
        ac[t] = a
        if t + 1 < T:
            s = _inverse_cdf(tab_P, s * A + a, uniform())
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

    The backward recursion G_{T-1} = r_{T-1}, G_t = r_t + gamma G_{t+1}, one time step at a
    time over every other axis at once: each step rounds fl(r_t + fl(gamma G_{t+1})), as the
    recursion written out does, signed zeros included. C-contiguous float64 out.
    """
    r = np.asarray(rewards, dtype=np.float64)
    axis = axis % r.ndim
    G = np.empty(r.shape)
    x, g = np.moveaxis(r, axis, 0), np.moveaxis(G, axis, 0)  # time first: views
    T, gamma = x.shape[0], float(gamma)
    g[T - 1] = x[T - 1]
    for t in range(T - 2, -1, -1):  # slices, not items: arrays even when time is the only axis
        now = g[t:t + 1]
        np.multiply(g[t + 1:t + 2], gamma, out=now)
        now += x[t:t + 1]  # fl(r_t + fl(gamma G_{t+1})): addition commutes exactly
    return G


def cell_index(states: np.ndarray, actions: np.ndarray, n_actions: int) -> np.ndarray:
    """The (s, a) cell ``s * A + a`` of every step, int64, the shape of ``states``."""
    key = np.asarray(states).astype(np.int64) * n_actions
    key += actions
    return key


def cell_sums(keys: np.ndarray, weights: np.ndarray, n_bins: int) -> np.ndarray:
    """M[j] = sum of ``weights`` where ``keys == j``, shape (n_bins,).

    One ``np.bincount``: each bin adds its weights one by one in the order of
    the flattened arrays, so two layouts that list each bin's weights in the
    same order give the same bits.
    """
    return np.bincount(keys.ravel(), weights=weights.ravel(), minlength=n_bins)


def softmax_score(M: np.ndarray, pi: np.ndarray, horizon: int) -> np.ndarray:
    """(1/T) sum_t G_t grad_theta log pi(a_t|s_t) from the per-cell sums of G.

    For the tabular softmax, d log pi(a|s) / d theta[s', b] =
    1[s' = s] (1[b = a] - pi(b|s)); contracted with
    ``M[..., s, b] = sum_t 1[s_t = s, a_t = b] G_t`` this is
    ``(M[s, b] - pi(b|s) sum_a M[s, a]) / T``. ``M`` is (..., S, A) and
    ``pi`` broadcasts to it.
    """
    return (M - pi * M.sum(axis=-1, keepdims=True)) / horizon


def score_gradient(
    states: np.ndarray,
    actions: np.ndarray,
    returns: np.ndarray,
    pi: np.ndarray,
    lanes: Optional[np.ndarray] = None,
    time_major: bool = False,
) -> np.ndarray:
    """REINFORCE score-function gradient of a tabular softmax policy (eq. 1's
    corrected returns enter as ``returns``), per lane:

        g[l, c, s, b] = sum_{i : lane(i) = l} (1/T) sum_t 1[s_it = s] (1[a_it = b] - pi_l(b|s)) G[i, c, t]

    ``states``, ``actions``: (n, T) ints, or (T, n) with ``time_major``.
    ``returns`` G: (n, T), or (n, C, T) for C channels at once; time-major
    (T, n) or (C, T, n). ``lanes``: None for one gradient per trajectory
    (lane i = trajectory i, L = n, ``pi`` (S, A) shared or (n, S, A)); else
    (n,) ints in [0, L), each lane's gradients summed under its own policy
    ``pi`` (L, S, A), or (S, A) for L = 1.

    Returns (L, S, A), or (L, C, S, A) when ``returns`` has a channel axis
    (time-major: a transposed view of a (C, L, S, A) array). Steps:
    :func:`cell_index`, one :func:`cell_sums` over keys (lane, channel,
    cell), :func:`softmax_score`; no loop. A bin adds its returns in the
    order of the flattened ``returns``: in time order in both layouts when
    ``lanes`` is None (so the layouts agree to the bit); a lane's bin runs
    over trajectories then time (batch-major) or time then trajectories
    (time-major), which may differ in the last bits.
    """
    states, actions = np.asarray(states), np.asarray(actions)
    G = np.asarray(returns, dtype=np.float64)
    pi = np.asarray(pi, dtype=np.float64)
    if states.ndim != 2 or actions.shape != states.shape:
        raise ValueError(f"states and actions must both be {'(T, n)' if time_major else '(n, T)'}")
    T, n = states.shape if time_major else states.shape[::-1]
    steps = (T, n) if time_major else (n, T)
    channels = G.ndim == 3  # the channel axis leads (time-major) or is the middle one
    if channels:
        G3 = G
        ok = G.shape[1:] == steps if time_major else (G.shape[0], G.shape[2]) == steps
    else:
        G3 = G[None] if time_major else G[:, None]
        ok = G.shape == steps
    if not ok:
        want = "(T, n) or (C, T, n)" if time_major else "(n, T) or (n, C, T)"
        raise ValueError(f"returns must be {want} with n={n}, T={T}, got {G.shape}")
    C = G3.shape[0] if time_major else G3.shape[1]
    if pi.ndim not in (2, 3):
        raise ValueError(f"pi must be (S, A) or (L, S, A), got {pi.shape}")
    S, A = pi.shape[-2:]
    if lanes is None:
        L = n
        if pi.ndim == 3 and pi.shape[0] != n:
            raise ValueError(f"per-trajectory pi must be ({n}, S, A), got {pi.shape}")
        lane = np.arange(n, dtype=np.int64)
    else:
        L = pi.shape[0] if pi.ndim == 3 else 1
        lane = np.asarray(lanes)
        if lane.shape != (n,):
            raise ValueError(f"lanes must be ({n},), got {lane.shape}")
        if n and (lane.min() < 0 or lane.max() >= L):
            raise ValueError("lanes out of range for pi")
        lane = lane.astype(np.int64)
    if n and T and (states.min() < 0 or states.max() >= S or actions.min() < 0 or actions.max() >= A):
        raise ValueError("states or actions out of range for pi")
    SA = S * A
    T = max(T, 1)  # no steps: every sum is 0 and so is the gradient
    cell = cell_index(states, actions, A)
    chan = np.arange(C, dtype=np.int64)
    if time_major:  # keys (C, T, n): bins (channel, lane, cell)
        keys = ((chan[:, None] * L + lane[None]) * SA)[:, None, :] + cell[None]
        M = cell_sums(keys, G3, C * L * SA).reshape(C, L, S, A)
        g = softmax_score(M, pi, T).transpose(1, 0, 2, 3)
    else:  # keys (n, C, T): bins (lane, channel, cell)
        keys = ((lane[:, None] * C + chan[None]) * SA)[:, :, None] + cell[:, None, :]
        M = cell_sums(keys, G3, L * C * SA).reshape(L, C, S, A)
        g = softmax_score(M, pi[:, None] if pi.ndim == 3 else pi, T)
    return g if channels else g[:, 0]
