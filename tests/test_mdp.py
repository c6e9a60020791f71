"""Tests for racsim.learner.mdp: construction, exact solutions, the finite-horizon
estimator's expectation, and the Monte-Carlo machinery, each against an
independent reference (a rebuild, finite differences, enumeration, loops)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from oracles import oracle_backward_returns, oracle_returns, oracle_score

from racsim.learner.mdp import (
    TabularMDP,
    canonical_theta,
    finite_horizon_expectation,
    make_mdp,
    objective,
    optimal_policy,
    q_values,
    softmax_policy,
    state_transition,
    stationary_distribution,
    true_gradient,
)
from racsim.learner.rollouts import (
    discounted_returns,
    sample_trajectories,
    score_gradient,
)

# ----------------------------------------------------------------- helpers


def _ref_softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _canonical():
    """The canonical 3x2 benchmark with K = 2 unequal slow channels."""
    return make_mdp(3, 2, shares=(0.6, 0.4)), canonical_theta(3, 2)


def _random_5x3():
    return make_mdp(5, 3, mdp_seed=2024, shares=(1.0, 2.0, 0.5)), np.random.default_rng(11).normal(size=(5, 3))


def _channels(mdp):
    """(C, S, A) rewards: total, fast, then each slow channel."""
    return np.concatenate([mdp.reward_total[None], mdp.r_fast[None], mdp.r_slow])


def _loop_values(mdp, pi, r):
    """V of pi by iterating the Bellman operator with explicit loops (slow, obvious)."""
    S, A = pi.shape
    V = np.zeros(S)
    for _ in range(2000):
        new = np.zeros(S)
        for s in range(S):
            for a in range(A):
                nxt = sum(mdp.P[s, a, t] * V[t] for t in range(S))
                new[s] += pi[s, a] * (r[s, a] + mdp.gamma * nxt)
        V = new
    return V


# ------------------------------------------------------------ construction


def test_make_mdp_reproduces_documented_draw_order():
    S, A, shares = 4, 3, (0.2, 0.5, 0.3)
    mdp = make_mdp(S, A, mdp_seed=1337, shares=shares, gamma=0.8, slow_bump=0.6)
    rng = np.random.default_rng(1337)
    logits = rng.standard_normal((S, A, S))
    P = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    r_fast = rng.uniform(-0.5, 0.5, (S, A))
    jitter = rng.uniform(-0.3, 0.3, (S, A))
    np.testing.assert_allclose(mdp.P, P, rtol=1e-13, atol=0)
    np.testing.assert_array_equal(mdp.r_fast, r_fast)
    slow = jitter.copy()
    slow[0, A - 1] += 0.6
    for k, w in enumerate(shares):
        np.testing.assert_allclose(mdp.r_slow[k], slow * w / sum(shares), rtol=1e-14, atol=1e-16)
    # the channels sum to the slow reward, and the bump is at (0, A-1) only
    np.testing.assert_allclose(mdp.r_slow.sum(0), slow, rtol=1e-14, atol=1e-15)
    bump = mdp.r_slow.sum(0) - jitter
    assert bump[0, A - 1] == pytest.approx(0.6, abs=1e-14)
    bump[0, A - 1] = 0.0
    np.testing.assert_allclose(bump, 0.0, atol=1e-15)
    np.testing.assert_allclose(mdp.reward_total, r_fast + slow, atol=1e-15)
    np.testing.assert_array_equal(mdp.start, np.full(S, 1 / S))
    assert (mdp.n_states, mdp.n_actions, mdp.n_channels, mdp.gamma) == (S, A, 3, 0.8)


def test_make_mdp_defaults_and_validation():
    mdp = make_mdp(3, 2)
    assert mdp.n_channels == 1 and mdp.gamma == 0.9
    assert not np.allclose(mdp.P, make_mdp(3, 2, mdp_seed=1338).P)
    # shares only split the slow reward: P and the total are unchanged
    other = make_mdp(3, 2, shares=(3.0, 0.0, 1.0))
    np.testing.assert_array_equal(other.P, mdp.P)
    np.testing.assert_allclose(other.reward_total, mdp.reward_total, atol=1e-15)
    np.testing.assert_array_equal(other.r_slow[1], 0.0)
    with pytest.raises(ValueError, match="shares"):
        make_mdp(3, 2, shares=(1.0, -0.5))
    with pytest.raises(ValueError, match="shares"):
        make_mdp(3, 2, shares=(0.0, 0.0))
    with pytest.raises(ValueError, match="gamma"):
        make_mdp(3, 2, gamma=1.0)
    with pytest.raises(ValueError):  # arrays are read-only copies
        mdp.P[0, 0, 0] = 1.0


def test_canonical_theta_and_stable_softmax():
    np.testing.assert_array_equal(canonical_theta(3, 2), np.random.default_rng(7).normal(scale=0.3, size=(3, 2)))
    theta = np.array([[1000.0, 999.0, -1000.0], [0.0, 0.0, 0.0]])
    pi = softmax_policy(theta)
    assert np.all(np.isfinite(pi))
    np.testing.assert_allclose(pi.sum(-1), 1.0)
    np.testing.assert_allclose(pi[0, :2], _ref_softmax(np.array([1.0, 0.0])), rtol=1e-12)
    np.testing.assert_allclose(pi[1], 1 / 3)


# ----------------------------------------------------------- exact solutions


@pytest.mark.parametrize("make", [_canonical, _random_5x3], ids=["canonical3x2", "random5x3"])
def test_bellman_stationary_and_objective(make):
    mdp, theta = make()
    pi = softmax_policy(theta)
    S, A = pi.shape
    P_pi = state_transition(mdp, pi)
    loop_P_pi = np.array([[sum(pi[s, a] * mdp.P[s, a, t] for a in range(A)) for t in range(S)] for s in range(S)])
    np.testing.assert_allclose(P_pi, loop_P_pi, atol=1e-15)

    R = _channels(mdp)
    Q = q_values(mdp, pi, R)
    assert Q.shape == R.shape
    for c in range(R.shape[0]):
        V = (pi * Q[c]).sum(-1)
        np.testing.assert_allclose(Q[c], R[c] + mdp.gamma * mdp.P @ V, atol=1e-12)  # Bellman equation
        np.testing.assert_allclose(q_values(mdp, pi, R[c]), Q[c], atol=1e-14)
    np.testing.assert_allclose(q_values(mdp, pi), Q[0], atol=1e-14)  # default reward_total
    np.testing.assert_allclose((pi * Q[0]).sum(-1), _loop_values(mdp, pi, R[0]), atol=1e-10)

    d = stationary_distribution(mdp, pi)
    np.testing.assert_allclose(d @ P_pi, d, atol=1e-14)
    assert d.min() > 0 and d.sum() == pytest.approx(1.0, abs=1e-14)
    np.testing.assert_allclose(d, np.linalg.matrix_power(P_pi, 500)[0], atol=1e-12)

    r_pi = (pi * mdp.reward_total).sum(-1)
    V = (pi * Q[0]).sum(-1)
    assert objective(mdp, theta) == pytest.approx(d @ r_pi, abs=1e-13)
    assert objective(mdp, theta) == pytest.approx((1 - mdp.gamma) * d @ V, abs=1e-13)
    mu = np.arange(1.0, S + 1) / np.arange(1.0, S + 1).sum()
    assert objective(mdp, theta, start=mu) == pytest.approx((1 - mdp.gamma) * mu @ V, abs=1e-13)
    per_channel = [objective(mdp, theta, reward=r) for r in R]
    np.testing.assert_allclose(objective(mdp, theta, reward=R), per_channel, atol=1e-14)


def _fd_gradient(f, theta, eps=1e-5):
    g = np.zeros_like(theta)
    for idx in np.ndindex(theta.shape):
        e = np.zeros_like(theta)
        e[idx] = eps
        g[idx] = (f(theta + e) - f(theta - e)) / (2 * eps)
    return g


@pytest.mark.parametrize("make", [_canonical, _random_5x3], ids=["canonical3x2", "random5x3"])
@pytest.mark.parametrize("which", ["uniform", "stationary"])
def test_true_gradient_matches_finite_differences(make, which):
    mdp, theta = make()
    S = mdp.n_states
    d = stationary_distribution(mdp, softmax_policy(theta))
    mu = np.full(S, 1 / S) if which == "uniform" else d
    fd = _fd_gradient(lambda th: objective(mdp, th, start=mu), theta)  # mu frozen
    g = true_gradient(mdp, theta, start=mu)
    assert np.linalg.norm(g - fd) / np.linalg.norm(g) < 1e-6
    if which == "stationary":
        # with mu = d_pi(theta) frozen, the gradient is g* = true_gradient(start=None)
        g_star = true_gradient(mdp, theta)
        assert np.linalg.norm(g_star - fd) / np.linalg.norm(g_star) < 1e-6
        # ...which is not the gradient of objective(start=None), where d moves with theta
        fd_moving = _fd_gradient(lambda th: objective(mdp, th), theta)
        assert np.linalg.norm(g_star - fd_moving) / np.linalg.norm(g_star) > 1e-3
    # per-channel: linear in the reward
    R = _channels(mdp)
    gc = true_gradient(mdp, theta, reward=R, start=mu)
    for c in range(R.shape[0]):
        np.testing.assert_allclose(gc[c], true_gradient(mdp, theta, reward=R[c], start=mu), atol=1e-15)
    np.testing.assert_allclose(gc[0], gc[1] + gc[2:].sum(0), atol=1e-14)


# ---------------------------------------------- finite-horizon expectation


def _enumerated_expectation(mdp, pi, T, rewards, mu):
    """E[g_hat] by summing over every trajectory (s_0, a_0, ..., s_{T-1}, a_{T-1})."""
    S, A = pi.shape
    C = rewards.shape[0]
    E = np.zeros((C, S, A))
    for traj in itertools.product(range(S * A), repeat=T):
        s = [x // A for x in traj]
        a = [x % A for x in traj]
        p = mu[s[0]]
        for t in range(T):
            p *= pi[s[t], a[t]]
            if t + 1 < T:
                p *= mdp.P[s[t], a[t], s[t + 1]]
        if p == 0.0:
            continue
        for c in range(C):
            r = [rewards[c, s[t], a[t]] for t in range(T)]
            for t in range(T):
                G = sum(mdp.gamma ** (j - t) * r[j] for j in range(t, T))
                for b in range(A):
                    E[c, s[t], b] += p * ((a[t] == b) - pi[s[t], b]) * G / T
    return E


@pytest.mark.parametrize(
    "S,A,T,seed",
    [(2, 2, 1, 1), (2, 2, 2, 2), (2, 2, 3, 3), (2, 2, 4, 4), (2, 2, 5, 5), (3, 2, 4, 6)],
)
def test_finite_horizon_expectation_matches_enumeration(S, A, T, seed):
    mdp = make_mdp(S, A, mdp_seed=seed, shares=(0.3, 0.7), gamma=0.85)
    theta = np.random.default_rng(seed).normal(size=(S, A))
    pi = softmax_policy(theta)
    rewards = np.concatenate([_channels(mdp), np.random.default_rng(100 + seed).normal(size=(1, S, A))])
    got = finite_horizon_expectation(mdp, theta, T, reward=rewards)
    np.testing.assert_allclose(got, _enumerated_expectation(mdp, pi, T, rewards, mdp.start), atol=1e-13)
    np.testing.assert_allclose(finite_horizon_expectation(mdp, theta, T), got[0], atol=1e-15)
    mu = np.random.default_rng(seed).dirichlet(np.ones(S))
    np.testing.assert_allclose(
        finite_horizon_expectation(mdp, theta, T, reward=rewards, start=mu),
        _enumerated_expectation(mdp, pi, T, rewards, mu),
        atol=1e-13,
    )


@pytest.mark.parametrize("T", [1, 10, 50])
def test_finite_horizon_expectation_matches_monte_carlo(T):
    mdp, theta = _canonical()
    pi = softmax_policy(theta)
    R = _channels(mdp)  # total, fast, slow_0, slow_1
    n = 100_000
    states, actions = sample_trajectories(mdp, pi, n, T, np.random.default_rng(20240 + T))
    rewards = np.moveaxis(R[:, states, actions], 0, 1)  # (n, C, T)
    g = score_gradient(states, actions, discounted_returns(rewards, mdp.gamma), pi)
    mean, se = g.mean(0), g.std(0, ddof=1) / np.sqrt(n)
    expected = finite_horizon_expectation(mdp, theta, T, reward=R)
    assert se.max() > 0
    z = np.abs(mean - expected) / np.maximum(se, 1e-300)
    assert np.all(np.abs(mean - expected) <= 4 * se + 1e-14), f"max z = {z.max():.2f}"


def test_finite_horizon_expectation_converges_to_stationary_gradient():
    """E_T - g* = c / T + O(T max(gamma, lambda_2)^T), with c in closed form.

    Splitting E_T - g* into the start-up transient of mu_t and the truncation
    of Q at the horizon gives c = w(s) A[Q](s, b) + d(s) A[D](s, b), where
    A[X](s, b) = pi(b|s)(X(s, b) - sum_a pi(a|s) X(s, a)),
    w = sum_t (mu_t - d) = (mu_0 - d)(I - P_pi + 1 d^T)^-1 and
    D = sum_{h>=1} (Q^(h) - Q) = -(I - gamma M)^-1 (Q - r), M = P pi on (S*A).
    """
    mdp, theta = _canonical()
    pi = softmax_policy(theta)
    S, A = pi.shape
    r = mdp.reward_total
    Q = q_values(mdp, pi)
    d = stationary_distribution(mdp, pi)
    P_pi = state_transition(mdp, pi)

    def adv(X):
        return pi * (X - (pi * X).sum(-1, keepdims=True))

    w = np.linalg.solve((np.eye(S) - P_pi + np.outer(np.ones(S), d)).T, mdp.start - d)
    M = np.einsum("sat,tb->satb", mdp.P, pi).reshape(S * A, S * A)
    D = -np.linalg.solve(np.eye(S * A) - mdp.gamma * M, (Q - r).ravel()).reshape(S, A)
    c = w[:, None] * adv(Q) + d[:, None] * adv(D)
    g_star = true_gradient(mdp, theta)
    assert np.abs(c).max() > 1e-3  # the gap really is order 1/T

    errs = {}
    for T in (400, 800):
        gap = finite_horizon_expectation(mdp, theta, T) - g_star
        np.testing.assert_allclose(T * gap, c, atol=1e-9)
        errs[T] = np.abs(gap).max()
        assert errs[T] <= (np.abs(c).max() + 1e-9) / T
    assert errs[400] / np.abs(g_star).max() < 1e-2
    assert errs[800] == pytest.approx(errs[400] / 2, rel=1e-6)
    # started from d itself only the horizon truncation remains
    gap_d = finite_horizon_expectation(mdp, theta, 400, start=d) - g_star
    np.testing.assert_allclose(400 * gap_d, d[:, None] * adv(D), atol=1e-9)


# --------------------------------------------------- Monte-Carlo machinery


def _loop_trajectory_gradients(states, actions, returns, pi):
    n, C = returns.shape[:2]
    return np.array([[oracle_score(states[i], actions[i], returns[i, c], pi) for c in range(C)] for i in range(n)])


@pytest.mark.parametrize("seed", [5, 50, 51, 52])
def test_score_gradient_matches_loop_oracle(seed):
    rng = np.random.default_rng(seed)
    if seed == 5:
        n, C, T, S, A = 9, 2, 6, 3, 4
    else:
        n, C, T, S, A = (int(x) for x in rng.integers(1, [30, 4, 12, 6, 6]))
    pi = softmax_policy(rng.normal(size=(S, A)))
    states, actions = rng.integers(0, S, (n, T)), rng.integers(0, A, (n, T))
    returns = rng.normal(size=(n, C, T))
    g = score_gradient(states, actions, returns, pi)
    assert g.shape == (n, C, S, A)
    np.testing.assert_allclose(g, _loop_trajectory_gradients(states, actions, returns, pi), atol=1e-14)
    # (n, T) returns are one channel, without the channel axis
    g1 = score_gradient(states, actions, returns[:, C - 1], pi)
    assert g1.shape == (n, S, A)
    np.testing.assert_array_equal(g1, g[:, C - 1])
    # time-major inputs: the same bits (every cell sums its returns in time order either way)
    tm = score_gradient(states.T, actions.T, returns.transpose(1, 2, 0), pi, time_major=True)
    assert tm.shape == (n, C, S, A)
    np.testing.assert_array_equal(tm, g)
    np.testing.assert_array_equal(score_gradient(states.T, actions.T, returns[:, 0].T, pi, time_major=True), g[:, 0])
    # one policy per trajectory
    pis = softmax_policy(rng.normal(size=(n, S, A)))
    ref = np.array([[oracle_score(states[i], actions[i], returns[i, c], pis[i]) for c in range(C)] for i in range(n)])
    np.testing.assert_allclose(score_gradient(states, actions, returns, pis), ref, atol=1e-14)
    with pytest.raises(ValueError):
        score_gradient(states, np.full_like(actions, A), returns, pi)
    with pytest.raises(ValueError):
        score_gradient(states, actions, returns[:, :, :-1], pi)
    with pytest.raises(ValueError):
        score_gradient(states, actions, returns, pi, time_major=True)


def test_score_gradient_many_trajectories():
    """More than 4096 trajectories: rows must not leak between trajectories."""
    rng = np.random.default_rng(6)
    n, C, T, S, A = 2 * 4096 + 37, 3, 3, 2, 3
    pi = softmax_policy(rng.normal(size=(S, A)))
    states, actions = rng.integers(0, S, (n, T)), rng.integers(0, A, (n, T))
    returns = rng.normal(size=(n, C, T))
    onehot_s = np.eye(S)[states]  # (n, T, S)
    score = np.eye(A)[actions][:, :, None, :] - pi[None, None]  # (n, T, S, A) for state s_t
    ref = np.einsum("nts,ntsa,nct->ncsa", onehot_s, score, returns) / T
    np.testing.assert_allclose(score_gradient(states, actions, returns, pi), ref, atol=1e-13)


def test_discounted_returns():
    rng = np.random.default_rng(8)
    for T in (1, 7, 300):
        r = rng.normal(size=(2, 3, T))
        G = discounted_returns(r, 0.9)
        ref = np.empty_like(r)
        for t in range(T):
            ref[..., t] = (r[..., t:] * 0.9 ** np.arange(T - t)).sum(-1)
        np.testing.assert_allclose(G, ref, atol=1e-12)
        np.testing.assert_allclose(G[0, 1], oracle_returns(list(r[0, 1]), 0.9), atol=1e-12)
    np.testing.assert_array_equal(discounted_returns(np.ones(4), 0.0), np.ones(4))


def test_discounted_returns_is_the_recursion_to_the_bit():
    """Bit for bit the step-by-step recursion G_t = r_t + gamma G_{t+1}, along any
    axis, at any gamma, signed zeros included (rewards that are exactly -0.0 or
    +0.0, as a terminal topology's masked rewards are)."""
    rng = np.random.default_rng(9)
    for case in range(300):
        nd = int(rng.integers(1, 4))
        shape = tuple(int(x) for x in rng.integers(1, 9, nd))
        axis = int(rng.integers(-nd, nd))
        gamma = float(rng.choice([0.0, 0.5, 0.9, 0.999, rng.random()]))
        r = rng.normal(size=shape) * 10.0 ** rng.integers(-5, 6, shape)
        r *= rng.random(shape) < 0.7  # zeros of both signs
        G = discounted_returns(r, gamma, axis=axis)
        assert G.shape == r.shape and G.flags.c_contiguous
        rm, Gm = np.moveaxis(r, axis, -1), np.moveaxis(G, axis, -1)
        for idx in np.ndindex(rm.shape[:-1]):
            ref = np.array(oracle_backward_returns(list(rm[idx]), gamma))
            assert np.array_equal(Gm[idx].view(np.uint64), ref.view(np.uint64)), (case, idx, Gm[idx], ref)


def test_sample_trajectories_reproducible_and_distributed():
    mdp, theta = _canonical()
    pi = softmax_policy(theta)
    s1, a1 = sample_trajectories(mdp, pi, 5000, 20, np.random.default_rng(3))
    s2, a2 = sample_trajectories(mdp, pi, 5000, 20, np.random.default_rng(3))
    s3, _ = sample_trajectories(mdp, pi, 5000, 20, np.random.default_rng(4))
    assert s1.shape == a1.shape == (5000, 20) and s1.dtype == a1.dtype == np.int64
    np.testing.assert_array_equal(s1, s2)
    np.testing.assert_array_equal(a1, a2)
    assert not np.array_equal(s1, s3)

    n = 200_000
    S, A = pi.shape
    s, a = sample_trajectories(mdp, pi, n, 2, np.random.default_rng(9))

    def within(counts, total, p):
        freq = counts / total
        se = np.sqrt(p * (1 - p) / total)
        return np.all(np.abs(freq - p) <= 5 * se + 1e-12)

    assert within(np.bincount(s[:, 0] * A + a[:, 0], minlength=S * A), n, (mdp.start[:, None] * pi).ravel())
    for s0 in range(S):
        for a0 in range(A):
            m = (s[:, 0] == s0) & (a[:, 0] == a0)
            assert within(np.bincount(s[m, 1], minlength=S), m.sum(), mdp.P[s0, a0])


def test_sample_trajectories_per_trajectory_policies():
    mdp, theta = _canonical()
    pi = softmax_policy(theta)
    n, S, A = 3000, mdp.n_states, mdp.n_actions
    # n copies of one policy: the same draws give the same trajectories
    shared = sample_trajectories(mdp, pi, n, 15, np.random.default_rng(1))
    stacked = sample_trajectories(mdp, np.broadcast_to(pi, (n, S, A)), n, 15, np.random.default_rng(1))
    np.testing.assert_array_equal(shared[0], stacked[0])
    np.testing.assert_array_equal(shared[1], stacked[1])
    # deterministic policies: trajectory i always plays action i % A
    lanes_pi = np.eye(A)[np.arange(n) % A][:, None, :].repeat(S, axis=1)
    _, a = sample_trajectories(mdp, lanes_pi, n, 15, np.random.default_rng(2))
    np.testing.assert_array_equal(a, (np.arange(n) % A)[:, None].repeat(15, axis=1))
    with pytest.raises(ValueError):
        sample_trajectories(mdp, lanes_pi[:-1], n, 15, np.random.default_rng(2))


def test_score_gradient_sums_lanes_with_their_own_policy():
    rng = np.random.default_rng(12)
    L, n, T, S, A = 3, 40, 5, 3, 2
    pi = softmax_policy(rng.normal(size=(L, S, A)))
    lanes = rng.integers(0, L, n)
    states, actions = rng.integers(0, S, (n, T)), rng.integers(0, A, (n, T))
    returns = rng.normal(size=(n, T))
    ref = np.zeros((L, S, A))
    for i in range(n):
        for t in range(T):
            s, a = states[i, t], actions[i, t]
            for b in range(A):
                ref[lanes[i], s, b] += ((a == b) - pi[lanes[i], s, b]) * returns[i, t] / T
    np.testing.assert_allclose(score_gradient(states, actions, returns, pi, lanes=lanes), ref, atol=1e-14)
    oracle = np.zeros((L, S, A))
    for i in range(n):
        oracle[lanes[i]] += oracle_score(states[i], actions[i], returns[i], pi[lanes[i]])
    np.testing.assert_allclose(score_gradient(states, actions, returns, pi, lanes=lanes), oracle, atol=1e-14)
    # one lane: the sum of the per-trajectory gradients
    g1 = score_gradient(states, actions, returns, pi[0], lanes=np.zeros(n, int))
    assert g1.shape == (1, S, A)
    np.testing.assert_allclose(g1[0], score_gradient(states, actions, returns, pi[0]).sum(0), atol=1e-13)
    with pytest.raises(ValueError, match="lanes"):
        score_gradient(states, actions, returns, pi, lanes=lanes[:-1])


class _ConstantRng:
    """Stands in for a Generator whose random() always returns u."""

    def __init__(self, u):
        self.u = u

    def random(self, n):
        return np.full(n, self.u)


def test_inverse_cdf_guards_rounding_and_zero_probabilities():
    n = 11
    row = np.array([0.1] * 10 + [0.0])  # cumsum ends at 0.9999999999999999 < 1, then a zero
    assert np.cumsum(row)[-1] < 1.0
    zeros = np.zeros((n, n))
    mdp = TabularMDP(P=np.broadcast_to(row, (n, n, n)), r_fast=zeros, r_slow=zeros[None], gamma=0.9, start=row)
    pi = np.broadcast_to(row, (n, n))
    top = np.nextafter(1.0, 0.0)
    assert np.cumsum(row)[-1] <= top  # an unguarded inverse CDF would return index 10 here
    s, a = sample_trajectories(mdp, pi, 4, 5, _ConstantRng(top))
    np.testing.assert_array_equal(s, 9)
    np.testing.assert_array_equal(a, 9)
    # u = 0 must skip a leading zero-probability index
    rev = row[::-1].copy()
    mdp0 = TabularMDP(P=np.broadcast_to(rev, (n, n, n)), r_fast=zeros, r_slow=zeros[None], gamma=0.9, start=rev)
    s, a = sample_trajectories(mdp0, np.broadcast_to(rev, (n, n)), 4, 5, _ConstantRng(0.0))
    np.testing.assert_array_equal(s, 1)
    np.testing.assert_array_equal(a, 1)


# ------------------------------------------------------------- optimal policy


def _policy_values(mdp, pi, r):
    return (pi * q_values(mdp, pi, r)).sum(-1)


@pytest.mark.parametrize("make", [_canonical, _random_5x3], ids=["canonical3x2", "random5x3"])
@pytest.mark.parametrize("which", ["total", "fast"])
def test_optimal_policy(make, which):
    mdp, _ = make()
    r = mdp.reward_total if which == "total" else mdp.r_fast
    pi_star = optimal_policy(mdp, None if which == "total" else r)
    S, A = pi_star.shape
    assert set(np.unique(pi_star)) <= {0.0, 1.0} and np.all(pi_star.sum(1) == 1)
    Q = q_values(mdp, pi_star, r)
    # Bellman optimality, and pi* is greedy in its own Q
    np.testing.assert_allclose(Q, r + mdp.gamma * mdp.P @ Q.max(1), atol=1e-12)
    assert np.all(Q[np.arange(S), pi_star.argmax(1)] >= Q.max(1) - 1e-12)
    # value iteration written here agrees
    Qvi = np.zeros((S, A))
    for _ in range(2000):
        Qvi = r + mdp.gamma * mdp.P @ Qvi.max(1)
    np.testing.assert_allclose(Q, Qvi, atol=1e-10)
    # no single-state deviation, deterministic or stochastic, improves V anywhere
    V = _policy_values(mdp, pi_star, r)
    rng = np.random.default_rng(0)
    for s in range(S):
        for dev in list(np.eye(A)) + [rng.dirichlet(np.ones(A))]:
            pi = pi_star.copy()
            pi[s] = dev
            assert np.all(_policy_values(mdp, pi, r) <= V + 1e-12)
    # and no deterministic policy at all beats it (brute force, A^S policies)
    for acts in itertools.product(range(A), repeat=S):
        assert np.all(_policy_values(mdp, np.eye(A)[list(acts)], r) <= V + 1e-12)
