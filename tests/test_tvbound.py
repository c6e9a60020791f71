"""Proposition 2.2 on the tabular MDP: the measured state-averaged TV between
the fast-only and the RAC-corrected policy never exceeds the bound."""

from __future__ import annotations

import numpy as np
import pytest

from racsim.analyses.tvbound import (
    DEFAULT_KL_TARGETS,
    averaged_divergences,
    lr_for_kl,
    max_reachable_kl,
    policy_pair,
    tv_experiment,
    tv_sweep,
)
from racsim.learner.mdp import (
    canonical_theta,
    finite_horizon_expectation,
    make_mdp,
    softmax_policy,
    stationary_distribution,
)
from racsim.learner.theory import kl_crossover, kl_divergence, tv_bound, tv_distance

HORIZON = 50
CANONICAL = dict(n_states=3, n_actions=2, shares=(0.5, 0.5))
# MDPs where some state's preferred action flips between the two updates (KL unbounded in lr).
FLIPPING = [(3, 2, 2), (3, 2, 5), (5, 3, 1), (5, 3, 4), (5, 3, 9)]


def canonical():
    return make_mdp(3, 2, shares=(0.5, 0.5)), canonical_theta(3, 2)


def loop_divergences(mdp, theta, horizon, lr, eta):
    """Per-state loop from the brief, every piece from mdp/theory, one channel at a time."""
    g_fast = finite_horizon_expectation(mdp, theta, horizon, reward=mdp.r_fast)
    step_rac = g_fast.copy()
    for k in range(mdp.n_channels):
        step_rac = step_rac + (1.0 - eta[k]) * finite_horizon_expectation(mdp, theta, horizon, reward=mdp.r_slow[k])
    pi = softmax_policy(theta + lr * g_fast)
    pit = softmax_policy(theta + lr * step_rac)
    d = stationary_distribution(mdp, softmax_policy(theta))
    kl = tv = 0.0
    for s in range(mdp.n_states):
        kl += d[s] * float(kl_divergence(pi[s], pit[s]))
        tv += d[s] * float(tv_distance(pi[s], pit[s]))
    return kl, tv


@pytest.mark.parametrize("case", ["canonical", (3, 2, 2, (0.5, 0.5)), (5, 3, 4, (0.2, 0.8)), (3, 2, 5, (0.1, 0.3, 0.6))])
@pytest.mark.parametrize("eta", [0.0, (0.2, 0.7, 0.4)])
def test_divergences_match_per_state_loop(case, eta):
    if case == "canonical":
        mdp, theta = canonical()
    else:
        S, A, seed, shares = case
        mdp, theta = make_mdp(S, A, mdp_seed=seed, shares=shares), canonical_theta(S, A)
    eta = np.broadcast_to(eta, (3,))[: mdp.n_channels]  # channels with unequal shares have unequal G_k
    lrs = np.array([0.5, 3.0, 40.0, 250.0])
    kl, tv = averaged_divergences(mdp, theta, HORIZON, lrs, eta)
    sweep = tv_sweep(mdp, theta, HORIZON, lrs, eta)
    for i, lr in enumerate(lrs):
        k_ref, t_ref = loop_divergences(mdp, theta, HORIZON, lr, eta)
        assert kl[i] == pytest.approx(k_ref, rel=1e-9, abs=1e-15)
        assert tv[i] == pytest.approx(t_ref, rel=1e-9, abs=1e-15)
        assert sweep["kl"].iloc[i] == kl[i] and sweep["tv"].iloc[i] == tv[i]
    assert kl[-1] > 1e-3  # the lrs are not all trivially close to the start


def test_policy_pair_directions():
    mdp, theta = canonical()
    pi, pit = policy_pair(mdp, theta, HORIZON, 10.0, eta=(1.0, 1.0))
    np.testing.assert_array_equal(pi, pit)  # eta = 1: nothing put back, same policy
    pi, pit = policy_pair(mdp, theta, HORIZON, 10.0)
    assert np.max(np.abs(pi - pit)) > 1e-3


def test_bound_never_violated_across_lr():
    lrs = np.logspace(-2, 5, 300)
    cases = [canonical()] + [(make_mdp(S, A, mdp_seed=seed, shares=(0.5, 0.5)), canonical_theta(S, A))
                             for S, A, seed in FLIPPING]
    reached_bh = 0
    for mdp, theta in cases:
        for eta in (None, (0.3, 0.1)):
            for form in ("paper", "tight"):
                out = tv_sweep(mdp, theta, HORIZON, lrs, eta, form)
                assert np.all(np.isfinite(out["kl"])) and np.all(out["tv"] >= 0)
                assert not out["violated"].any()
                assert np.all(out["tv"] <= tv_bound(out["kl"], form) + 1e-12)
                np.testing.assert_array_equal(out["tight"] == "bh", out["kl"] > kl_crossover(form))
                reached_bh += int((out["tight"] == "bh").any())
    assert reached_bh >= 10  # the sweep exercises both branches


def test_large_lr_kl_stays_finite():
    # Softmax probabilities underflow there; theory.kl_divergence would return inf.
    mdp, theta = canonical()
    out = tv_sweep(mdp, theta, HORIZON, [6e3, 1e5, 1e7])
    assert np.all(np.isfinite(out["kl"])) and out["kl"].iloc[-1] < 1e-12


def test_canonical_targets_hit_and_are_reachable():
    mdp, theta = canonical()
    out = tv_experiment(mdp, theta, HORIZON)
    assert list(out["kl_target"]) == list(DEFAULT_KL_TARGETS)
    assert np.all(np.abs(out["kl"] / out["kl_target"] - 1) < 1e-6)
    assert not out["violated"].any()
    assert list(out["tight"]) == ["pinsker"] * 3  # KL* is out of reach on this MDP
    assert np.all(np.diff(out["lr"]) > 0)
    # Re-measure at the returned lr through the per-state loop.
    for _, row in out.iterrows():
        k_ref, t_ref = loop_divergences(mdp, theta, HORIZON, row["lr"], (0.0, 0.0))
        assert k_ref == pytest.approx(row["kl_target"], rel=1e-6)
        assert t_ref == pytest.approx(row["tv"], rel=1e-9)


def test_canonical_large_target_is_unreachable():
    mdp, theta = canonical()
    kmax, lr_at = max_reachable_kl(mdp, theta, HORIZON)
    assert 1.3 < kmax < kl_crossover()
    with pytest.raises(ValueError, match=rf"not reachable.*{kmax:.6g}"):
        tv_experiment(mdp, theta, HORIZON, kl_targets=(0.01, 0.5, 3.0))
    # Fully slack: both updates are the same, nothing is reachable.
    with pytest.raises(ValueError, match="not reachable"):
        lr_for_kl(mdp, theta, HORIZON, 0.01, eta=1.0)


@pytest.mark.parametrize("S, A, seed", FLIPPING[:3])
def test_targets_on_both_sides_of_crossover(S, A, seed):
    mdp = make_mdp(S, A, mdp_seed=seed, shares=(0.5, 0.5))
    out = tv_experiment(mdp, canonical_theta(S, A), HORIZON, kl_targets=(0.01, 0.5, 3.0))
    assert np.all(np.abs(out["kl"] / out["kl_target"] - 1) < 1e-6)
    assert list(out["tight"]) == ["pinsker", "pinsker", "bh"]
    assert not out["violated"].any() and np.all(out["slack"] >= -1e-12)
    np.testing.assert_allclose(out["bound"], np.minimum(out["pinsker"], out["bh"]), rtol=0, atol=0)
    # The step found is the first one to reach the target.
    below = tv_sweep(mdp, canonical_theta(S, A), HORIZON, np.linspace(0, 1, 200)[:-1] * out["lr"].iloc[-1])
    assert below["kl"].max() < 3.0


def test_eta_validation():
    mdp, theta = canonical()
    with pytest.raises(ValueError, match="eta"):
        tv_experiment(mdp, theta, HORIZON, eta=(0.1, 0.2, 0.3))
    with pytest.raises(ValueError, match="eta"):
        tv_experiment(mdp, theta, HORIZON, eta=1.5)
