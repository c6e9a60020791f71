"""Theorem 2.1 (cumulative bias) by Monte Carlo, Proposition 2.2 (TV bound) on
random distributions, and the kernel estimator against a loop oracle."""

from __future__ import annotations

import math

import numpy as np
import pytest
from oracles import oracle_score

from racsim.learner.correctors import (
    CorrectorParams,
    age_weight,
    correction_weight,
    geometric_weight,
)
from racsim.learner.mdp import softmax_policy
from racsim.learner.rollouts import score_gradient
from racsim.learner.theory import (
    bh_bound,
    effective_kernel,
    kl_crossover,
    measured_kernel,
    kl_divergence,
    pinsker_bound,
    predicted_bias,
    slack,
    tight_branch,
    tv_bound,
    tv_distance,
)
from racsim.pipeline.schedule import DROPPED, INJECTED, PENDING

# --------------------------------------------------------------------------
# Kernels.


def test_effective_kernel_and_slack():
    lam = np.array([[0.5, 0.3, 0.0], [0.0, 0.0, 1.0]])
    eff = effective_kernel(lam, alpha=0.9, tau_age=4.0)
    w = np.exp(-np.arange(3) / 4.0)
    np.testing.assert_allclose(eff, 0.9 * w * lam, rtol=1e-15)
    np.testing.assert_allclose(slack(eff), 1.0 - (0.9 * w * lam).sum(axis=1), rtol=1e-15)
    assert slack(effective_kernel(lam)).shape == (2,)
    np.testing.assert_allclose(slack(effective_kernel(lam)), [0.2, 0.0], atol=1e-15)
    # tau_age = inf: no age discount; one row given as 1-D.
    assert np.array_equal(effective_kernel([0.25, 0.75]), [0.25, 0.75])
    # Saturated kernel with the paper's row normalisation alpha = 1 / w_age(D_bar): slack 0.
    eff = effective_kernel(lam[1], alpha=1.0 / w[2], tau_age=4.0)
    assert abs(slack(eff)[0]) < 1e-15
    # Per-row gains.
    eff = effective_kernel(lam, alpha=np.array([1.0, 2.0]), tau_age=math.inf)
    np.testing.assert_allclose(slack(eff), [0.2, -1.0])


def test_effective_kernel_validation_names_the_row():
    with pytest.raises(ValueError, match="row 1.*negative"):
        effective_kernel([[0.5, 0.5], [0.2, -0.1]])
    with pytest.raises(ValueError, match="row 2"):
        effective_kernel([[0.5, 0.5], [0.2, 0.1], [0.6, 0.5]])
    with pytest.raises(ValueError, match="row 0"):
        effective_kernel([[0.5, 0.5 + 1e-9]], alpha=1.0)
    effective_kernel([[0.5, 0.5 + 1e-13]], alpha=1.0)  # within 1e-12
    # Effective row above 1 is fine when alpha > 1 (over-correction), but not at alpha <= 1.
    effective_kernel([[0.0, 0.9]], alpha=1.5)
    with pytest.raises(ValueError, match="row 1 sums to 1.1"):
        effective_kernel([[0.5, 0.0], [0.9, 0.2]], alpha=0.5, tau_age=3.0)
    # ... and a row of Lambda itself may not exceed 1 whatever the gain.
    with pytest.raises(ValueError, match="row 0"):
        effective_kernel([[0.6, 0.6]], alpha=2.0)
    with pytest.raises(ValueError, match="alpha"):
        effective_kernel([[1.0]], alpha=0.0)
    with pytest.raises(ValueError):
        effective_kernel([[1.0]], alpha=[1.0, 1.0])


def measured_kernel_oracle(delay, status, width):
    K = delay.shape[-1]
    counts = np.zeros((K, width))
    totals = np.zeros(K)
    for idx in np.ndindex(*delay.shape):
        k = idx[-1]
        totals[k] += 1
        if status[idx] == INJECTED:
            counts[k, delay[idx]] += 1
    return counts / totals[:, None]


@pytest.mark.parametrize("seed", [0, 1])
def test_measured_kernel_matches_loop_oracle(seed):
    rng = np.random.default_rng(seed)
    shape = (4, 12, 5, 3)
    status = rng.choice(np.array([INJECTED, DROPPED, PENDING], dtype=np.int8), size=shape, p=[0.7, 0.2, 0.1])
    # Different delay ranges per channel.
    top = np.array([0, 4, 9])
    delay = np.where(status == INJECTED, np.floor(rng.random(shape) * (top + 1)).astype(int), -1)
    got = measured_kernel(delay, status)
    width = int(delay.max()) + 1
    assert got.shape == (3, width)
    np.testing.assert_allclose(got, measured_kernel_oracle(delay, status, width), rtol=1e-15)
    inj_frac = (status == INJECTED).reshape(-1, 3).mean(axis=0)
    np.testing.assert_allclose(got.sum(axis=1), inj_frac, rtol=1e-14)
    assert np.all(got.sum(axis=1) < 1.0)
    wide = measured_kernel(delay, status, max_delay=15)
    assert wide.shape == (3, 16) and np.array_equal(wide[:, :width], got) and not wide[:, width:].any()
    with pytest.raises(ValueError, match="max_delay"):
        measured_kernel(delay, status, max_delay=width - 2)
    # Nothing injected: an all-zero row of width 1.
    none = measured_kernel(np.full((3, 2), -1), np.full((3, 2), DROPPED))
    assert none.shape == (2, 1) and not none.any()


# --------------------------------------------------------------------------
# Theorem 2.1 by Monte Carlo on a synthetic residual model.
#
# Residuals X_k have a nonzero channel mean; delays are drawn from the kernel
# (the missing mass: dropped or pending, never returns); the importance ratio
# is drawn independently of X (CI) from {0.5, 2.5} with P(0.5) = 2/3, so the
# clip at rho_bar = 2 is active and E[rho_clip] = 2/3 * 0.5 + 1/3 * 2 = 1 (U).

RHO_BAR = 2.0


def sample_channel(rng, row, n):
    """Delays and statuses of n results of one channel with kernel row ``row``."""
    probs = np.append(row, max(0.0, 1.0 - row.sum()))
    cat = rng.choice(len(probs), size=n, p=probs / probs.sum())
    never = cat == len(row)
    status = np.where(never, np.where(rng.random(n) < 0.5, DROPPED, PENDING), INJECTED).astype(np.int8)
    delay = np.where(never, -1, cat)
    return delay, status


def sample_ratio(rng, n):
    return np.where(rng.random(n) < 2.0 / 3.0, 0.5, 2.5)


def random_kernel(rng, K, D):
    rows = rng.dirichlet(np.full(D + 1, 0.5), size=K)
    keep = 1.0 - rng.uniform(0.0, 0.4, size=(K, 1))  # part of the mass never returns
    return rows * keep


def test_effective_kernel_with_a_correctors_weight():
    """``weight`` in place of w_age: Lambda * (alpha * w), for any corrector's kernel."""
    rng = np.random.default_rng(3)
    lam = random_kernel(rng, 3, 6)
    D = np.arange(7)
    # w_age passed as a weight: the same bits as the default path.
    assert np.array_equal(effective_kernel(lam, alpha=0.7, weight=age_weight(D, 4.0)),
                          effective_kernel(lam, alpha=0.7, tau_age=4.0))
    gains = np.array([1.0, 2.0, 0.5])
    assert np.array_equal(effective_kernel(lam, alpha=gains, weight=age_weight(D, 4.0)),
                          effective_kernel(lam, alpha=gains, tau_age=4.0))
    # Retrace-A's geometric kernel, one row per channel, and a single row.
    w = geometric_weight(D, 0.6)
    np.testing.assert_array_equal(effective_kernel(lam, weight=w), lam * w)
    rows = rng.uniform(0.0, 1.0, (3, 7))
    np.testing.assert_array_equal(effective_kernel(lam, alpha=gains, weight=rows), lam * (gains[:, None] * rows))
    np.testing.assert_array_equal(effective_kernel(lam[0], weight=w), lam[0] * w)
    np.testing.assert_allclose(slack(effective_kernel(lam, weight=w)), 1.0 - (lam * w).sum(axis=1), rtol=1e-15)
    # A weight above 1 (bare_additive at alpha = 2) may over-correct: negative slack.
    assert slack(effective_kernel([[0.0, 0.9]], weight=[2.0, 2.0]))[0] == pytest.approx(-0.8)
    with pytest.raises(ValueError, match="weight must have shape"):
        effective_kernel(lam, weight=w[:-1])
    with pytest.raises(ValueError, match="finite and >= 0"):
        effective_kernel(lam, weight=-w)
    with pytest.raises(ValueError, match="finite and >= 0"):
        effective_kernel(lam, weight=np.full(7, np.nan))
    with pytest.raises(ValueError, match="row 0"):  # Lambda's own rows are still checked
        effective_kernel([[0.6, 0.6]], weight=[0.5, 0.5])


KERNEL_CASES = [(seed, K, D, tau) for seed, (K, D, tau) in enumerate(
    [(1, 0, 1000.0), (1, 30, 5.0), (2, 7, 1000.0), (3, 30, 20.0), (4, 12, math.inf), (4, 30, 30.0)]
)]


@pytest.mark.parametrize("seed,K,D,tau_age", KERNEL_CASES)
def test_theorem_2_1_unbiased_at_row_stochastic_effective_kernel(seed, K, D, tau_age):
    rng = np.random.default_rng(100 + seed)
    n = 60_000
    lam = random_kernel(rng, K, D)
    if seed % 2 == 1:  # a saturated row 1{D = D_bar} too
        lam[0] = 0.0
        lam[0, rng.integers(0, D + 1)] = 1.0
    w = age_weight(np.arange(D + 1), tau_age)
    alpha = 1.0 / (lam * w).sum(axis=1)  # row normalisation: sum_D Lambda~[k, D] = 1
    eta = slack(effective_kernel(lam, alpha=alpha, tau_age=tau_age))
    assert np.all(np.abs(eta) < 1e-12)
    eta_unnormalised = slack(effective_kernel(lam, alpha=1.0, tau_age=tau_age))

    mu = rng.choice([-1.0, 1.0], size=K) * rng.uniform(0.5, 2.0, size=K)
    powered = 0
    for k in range(K):
        X = mu[k] + rng.standard_t(5, size=n)
        delay, status = sample_channel(rng, lam[k], n)
        ratio = sample_ratio(rng, n)
        inj = status == INJECTED
        assert np.count_nonzero(inj & (ratio > RHO_BAR)) > 0  # the clip is active
        assert np.count_nonzero(inj & (ratio < RHO_BAR)) > 0  # and inactive
        params = CorrectorParams(alpha=float(alpha[k]), tau_age=tau_age, rho_bar=RHO_BAR)
        c = correction_weight("rac", delay, status, ratio, params)
        diff = c * X - X  # per-sample correction minus the synchronous target
        se = diff.std(ddof=1) / math.sqrt(n)
        assert abs((c * X).sum() / n - X.mean()) <= 4 * se, (k, diff.mean(), se)

        # The same samples at alpha = 1: biased by the slack, as predicted.
        c1 = correction_weight("rac", delay, status, ratio, CorrectorParams(alpha=1.0, tau_age=tau_age, rho_bar=RHO_BAR))
        d1 = c1 * X - X
        se1 = d1.std(ddof=1) / math.sqrt(n)
        pred = predicted_bias(eta_unnormalised[k:k + 1], np.array([mu[k]]))
        assert abs(d1.mean() - pred) <= 4 * se1, (k, d1.mean(), pred, se1)
        if abs(pred) > 8 * se1:  # here the unbiasedness check above would have failed
            assert abs(d1.mean()) > 4 * se1
            powered += 1
    if seed > 0:
        assert powered > 0, "no channel where a slack bias was detectable: the test has no power"


def test_theorem_2_1_slack_sweep_is_linear_in_eta():
    rng = np.random.default_rng(7)
    n = 20_000
    X = 0.8 + 1.5 * rng.standard_normal(n)  # ONE fixed sample set of residuals
    etas = np.array([0.05, 0.1, 0.15, 0.2, 0.3, 0.5])
    params = CorrectorParams(alpha=1.0, tau_age=1000.0, rho_bar=1.0)
    grid = np.arange(4)  # Delta = 0..3
    w_grid = correction_weight("rac", grid, np.full(4, INJECTED), None, params)

    # eta = 0: Lambda[0] = 1 is byte-for-byte unbiased.
    lam0 = np.array([[1.0, 0.0, 0.0, 0.0]])
    expected_c = (lam0[0] * w_grid).sum()
    assert expected_c * X.mean() - X.mean() == 0.0
    assert np.mean(expected_c * X) - np.mean(X) == 0.0

    exact, sampled = [], []
    for eta in etas:
        lam = np.array([[1.0 - eta, 0.0, 0.0, 0.0]])  # the rest never returns
        eff = effective_kernel(lam, alpha=params.alpha, tau_age=params.tau_age)
        # Expectation over the kernel, per sample: E_Delta[c_i] = sum_D Lambda[D] c(D).
        expected_c = (lam[0] * w_grid).sum()
        np.testing.assert_allclose(expected_c, eff.sum(), rtol=1e-15)
        bias = np.mean(expected_c * X) - np.mean(X)
        pred = predicted_bias(slack(eff), np.array([X.mean()]))
        np.testing.assert_allclose(bias, pred, rtol=1e-10)
        np.testing.assert_allclose(bias, -eta * X.mean(), rtol=1e-10)
        exact.append(bias)

        # Sampled delays on the same X.
        status = np.where(rng.random(n) < 1.0 - eta, INJECTED, DROPPED).astype(np.int8)
        delay = np.where(status == INJECTED, 0, -1)
        c = correction_weight("rac", delay, status, None, params)
        d = c * X - X
        se = d.std(ddof=1) / math.sqrt(n)
        assert abs(d.mean() - (-eta * X.mean())) <= 4 * se, (eta, d.mean(), se)
        sampled.append(d.mean())

    slope, intercept = np.polyfit(etas, np.array(exact), 1)
    assert abs(slope / (-X.mean()) - 1.0) < 1e-6
    assert abs(intercept) < 1e-9
    # The sampled biases lie on the same line (loosely: 6 points, each within 4 SE).
    s_slope = np.polyfit(etas, np.array(sampled), 1)[0]
    assert abs(s_slope / (-X.mean()) - 1.0) < 0.5


def test_predicted_bias_shapes_and_sum_over_channels():
    eta = np.array([0.1, 0.0, 0.5])
    m = np.array([[1.0, 2.0], [3.0, 4.0], [-2.0, 0.0]])
    np.testing.assert_allclose(predicted_bias(eta, m), [-(0.1 * 1 + 0.5 * -2), -(0.1 * 2)])
    assert np.ndim(predicted_bias(eta, m[:, 0])) == 0
    with pytest.raises(ValueError):
        predicted_bias(eta, m[:2])


def test_predicted_bias_from_a_measured_schedule():
    """From a simulated schedule: measure Lambda, predict, and compare with the
    bias of the corrections actually applied."""
    rng = np.random.default_rng(11)
    shape = (200, 50, 4)
    lam = np.array([[0.3, 0.2, 0.1, 0.1, 0.05], [0.0, 0.1, 0.2, 0.3, 0.35]])
    K = lam.shape[0]
    n = int(np.prod(shape))
    delay = np.empty(shape + (K,), dtype=int)
    status = np.empty(shape + (K,), dtype=np.int8)
    for k in range(K):
        dk, sk = sample_channel(rng, lam[k], n)
        delay[..., k], status[..., k] = dk.reshape(shape), sk.reshape(shape)
    measured = measured_kernel_oracle(delay, status, lam.shape[1])
    assert np.all(np.abs(measured - lam) < 5 * np.sqrt(lam * (1 - lam) / n) + 1e-12)
    params = CorrectorParams(alpha=1.0, tau_age=5.0, rho_bar=1.0)
    eta = slack(effective_kernel(measured, params.alpha, params.tau_age))
    mu = np.array([1.0, -0.6])
    X = mu + rng.standard_normal(shape + (K,))
    c = correction_weight("rac", delay, status, None, params)
    d = (c * X - X).reshape(-1, K)
    got = d.mean(axis=0)
    # Given the delays, mean(c - 1) = -eta of the measured kernel exactly, so the
    # only randomness left is X's unit noise: SE = sqrt(mean((c - 1)^2) / n).
    se = np.sqrt(((c.reshape(-1, K) - 1.0) ** 2).mean(axis=0) / n)
    pred = np.array([predicted_bias(eta[k:k + 1], mu[k:k + 1]) for k in range(K)])
    assert np.all(np.abs(got - pred) <= 4 * se), (got, pred, se)
    assert np.all(np.abs(pred) > 8 * se)  # and the slack bias is far from zero
    np.testing.assert_allclose(predicted_bias(eta, mu), pred.sum())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_score_gradient_is_linear_in_the_returns(seed):
    """The exact side of the bias benchmark, G_fast + sum_k E[c_k] G_k, rests on the
    score gradient being linear in the returns: the gradient of the corrected return
    G_fast + sum_k c_k G_k is G_fast's gradient plus sum_k c_k times channel k's. The
    one score gradient (all channels at once) against the per-step loop oracle."""
    rng = np.random.default_rng(40 + seed)
    n, T, S, A, K = int(rng.integers(1, 25)), int(rng.integers(1, 10)), 3, int(rng.integers(1, 5)), 2
    pi = softmax_policy(rng.normal(size=(S, A)))
    states, actions = rng.integers(0, S, (n, T)), rng.integers(0, A, (n, T))
    G = rng.normal(size=(n, 1 + K, T))
    c = rng.uniform(0.0, 1.2, K)
    g = score_gradient(states, actions, G, pi)  # (n, 1 + K, S, A)
    assert g.shape == (n, 1 + K, S, A)
    corrected = score_gradient(states, actions, G[:, 0] + np.einsum("k,nkt->nt", c, G[:, 1:]), pi)  # (n, S, A)
    for i in range(n):
        for k in range(1 + K):
            np.testing.assert_allclose(g[i, k], oracle_score(states[i], actions[i], G[i, k], pi), rtol=1e-12, atol=1e-13)
        ref = oracle_score(states[i], actions[i], G[i, 0] + c @ G[i, 1:], pi)
        np.testing.assert_allclose(corrected[i], ref, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(g[i, 0] + np.tensordot(c, g[i, 1:], axes=1), ref, rtol=1e-12, atol=1e-13)


# --------------------------------------------------------------------------
# Proposition 2.2: KL*, and the bounds on random distributions.


def test_kl_crossover():
    assert round(kl_crossover("paper"), 4) == 1.6259
    assert round(kl_crossover("tight"), 4) == 1.5936
    for form in ("paper", "tight"):
        x = kl_crossover(form)
        assert abs(pinsker_bound(x) - bh_bound(x, form)) < 1e-10
        kl = np.array([1e-6, 0.1, 1.0, x - 1e-6, x + 1e-6, 2.0, 10.0, np.inf])
        branch = tight_branch(kl, form)
        assert list(branch) == ["pinsker"] * 4 + ["bh"] * 4
        p, b = pinsker_bound(kl), bh_bound(kl, form)
        assert np.all(np.where(branch == "pinsker", p <= b, b <= p))
        assert np.array_equal(tv_bound(kl, form), np.minimum(p, b))
    with pytest.raises(ValueError):
        kl_crossover("loose")
    with pytest.raises(ValueError):
        bh_bound(1.0, "loose")
    with pytest.raises(ValueError):
        pinsker_bound(-0.1)


def kl_oracle(p, q):
    total = 0.0
    for a, b in zip(p, q):
        if a == 0.0:
            continue
        if b == 0.0:
            return math.inf
        total += a * math.log(a / b)
    return total


def tv_oracle(p, q):
    return 0.5 * sum(abs(a - b) for a, b in zip(p, q))


def random_pairs(rng):
    """10^4 pairs of categorical distributions, grouped by size."""
    groups = []
    sizes = [2, 3, 5, 10, 50]
    concs = [0.05, 0.3, 1.0, 5.0]
    per = 10_000 // (len(sizes) * len(concs))
    for n in sizes:
        for j, conc in enumerate(concs):
            p = rng.dirichlet(np.full(n, conc), size=per)
            mode = (j + n) % 4
            if mode == 0:  # q near p
                q = p * np.exp(0.1 * rng.standard_normal(p.shape))
            elif mode == 1:  # q independent
                q = rng.dirichlet(np.full(n, conc), size=per)
            elif mode == 2:  # near-degenerate q: almost all mass on one category
                q = np.full(p.shape, 1e-12)
                q[np.arange(per), rng.integers(0, n, per)] = 1.0
            else:  # exact zeros in q (some KL = inf) and in p
                q = rng.dirichlet(np.ones(n), size=per)
                q[rng.random(q.shape) < 0.2] = 0.0
                q[:, 0] += 1e-3
                p = np.where(rng.random(p.shape) < 0.2, 0.0, p)
                p[:, -1] += 1e-3
            p = p / p.sum(axis=1, keepdims=True)
            q = q / q.sum(axis=1, keepdims=True)
            groups.append((p, q))
    return groups


def test_kl_tv_match_loop_oracle():
    rng = np.random.default_rng(0)
    for p, q in random_pairs(rng)[::3]:
        kl, tv = kl_divergence(p, q), tv_distance(p, q)
        for i in range(0, len(p), 25):
            want_kl = kl_oracle(p[i], q[i])
            if math.isinf(want_kl):
                assert np.isinf(kl[i])
            else:
                assert abs(kl[i] - want_kl) <= 1e-12 + 1e-10 * want_kl
            assert abs(tv[i] - tv_oracle(p[i], q[i])) <= 1e-14
    # axis argument: distributions along axis 0.
    p, q = random_pairs(rng)[5]
    np.testing.assert_allclose(kl_divergence(p.T, q.T, axis=0), kl_divergence(p, q), rtol=1e-14)
    np.testing.assert_allclose(tv_distance(p.T, q.T, axis=0), tv_distance(p, q), rtol=1e-14)
    assert kl_divergence([1.0, 0.0], [1.0, 0.0]) == 0.0
    assert np.isinf(kl_divergence([0.5, 0.5], [1.0, 0.0]))
    with pytest.raises(ValueError):
        kl_divergence([0.5, 0.6], [0.5, 0.5])
    with pytest.raises(ValueError):
        tv_distance([1.5, -0.5], [0.5, 0.5])


def test_tv_bounds_hold_on_random_pairs():
    rng = np.random.default_rng(1)
    groups = random_pairs(rng)
    kl = np.concatenate([kl_divergence(p, q) for p, q in groups])
    tv = np.concatenate([tv_distance(p, q) for p, q in groups])
    assert kl.size >= 10_000
    tol = 1e-12
    assert np.all(tv <= pinsker_bound(kl) + tol)
    assert np.all(tv <= bh_bound(kl, "paper") + tol)
    assert np.all(tv <= bh_bound(kl, "tight") + tol)
    assert np.all(tv <= tv_bound(kl, "paper") + tol)
    assert np.all(tv <= tv_bound(kl, "tight") + tol)
    assert np.all(bh_bound(kl, "tight") <= bh_bound(kl, "paper") + tol)
    # The sample spans both branches, includes KL = inf, and would catch a wrong
    # Bretagnolle-Huber (1 - exp(-KL), without the 1/2, is not a TV bound).
    finite = np.isfinite(kl)
    assert np.count_nonzero(kl < kl_crossover()) > 1000
    assert np.count_nonzero(finite & (kl > kl_crossover())) > 1000
    assert np.count_nonzero(~finite) > 0
    assert np.any(tv > -np.expm1(-kl) + 1e-6)
    # Near-degenerate pairs come close to the bound (it is not vacuous there).
    assert np.max(tv / np.where(kl > 0, tv_bound(kl, "tight"), np.inf)) > 0.9


def test_state_averaged_tv_bound():
    """Proposition 2.2's form: mean_s TV(p_s, q_s) <= bound(mean_s KL(p_s || q_s))."""
    rng = np.random.default_rng(2)
    mean_kls = []
    for _ in range(300):
        S, A = rng.integers(2, 40), rng.integers(2, 12)
        theta = rng.standard_normal((S, A)) * rng.uniform(0.1, 3.0)
        drift = rng.standard_normal((S, A)) * 10.0 ** rng.uniform(-2.5, 0.8)
        p = np.exp(theta - theta.max(axis=1, keepdims=True))
        q = np.exp(theta + drift - (theta + drift).max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        q /= q.sum(axis=1, keepdims=True)
        mean_tv = tv_distance(p, q).mean()
        mean_kl = kl_divergence(p, q).mean()
        for form in ("paper", "tight"):
            assert mean_tv <= tv_bound(mean_kl, form) + 1e-12
        mean_kls.append(mean_kl)
    mean_kls = np.array(mean_kls)
    assert np.count_nonzero(tight_branch(mean_kls) == "bh") > 10
    assert np.count_nonzero(tight_branch(mean_kls) == "pinsker") > 10
