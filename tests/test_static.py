"""Static mode (racsim/learner/static.py): the paper's one-rollout experiment.

Oracles written here, independent of racsim's recursions: a brute-force
enumeration of every trajectory of a short horizon, per-delay weights from the
paper's formulas in plain Python, and loops for the per-trial lookups.
"""

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from racsim.analyses.static_study import draw_delays
from racsim.config.schema import CORRECTORS, LatencyConf
from racsim.errors import ConfigError
from racsim.learner import mdp as M
from racsim.learner import static as ST
from racsim.learner.correctors import CorrectorParams
from racsim.pipeline.latency import build_latency

STATIC_NAMES = [n for n in CORRECTORS if n != "rac_adaptive"]


def _weight_oracle(name, delay, params):
    """Eq. (1) weight of a result landing ``delay`` steps late (None: never lands), identity actor."""
    if name == "naive":
        return 0.0
    if name == "sync_oracle":
        return 1.0
    if delay is None:
        return 0.0
    rho = min(params.rho_bar, 1.0)
    return {
        "wait_for_slow": 1.0,
        "rac": params.alpha * math.exp(-delay / params.tau_age) * rho,
        "rac_no_age": params.alpha * rho,
        "bare_additive": params.alpha,
        "retrace_a": params.alpha * params.retrace_gamma ** delay * rho,
    }[name]


def _random_kernel(rng, K, D):
    """(K, D+1) rows summing to at most one (some rows lose mass, some are one-hot)."""
    lam = rng.random((K, D + 1)) * (rng.random((K, D + 1)) < 0.6)
    lam[0] = 0.0
    lam[0, rng.integers(D + 1)] = 1.0  # a deterministic channel
    lam = lam / np.maximum(lam.sum(1, keepdims=True), 1e-12)
    if K > 1:
        lam[1] *= 0.7  # a channel that loses 30% of its results
    return lam


def _enumerate_expectation(mdp, theta, T, mean_weight):
    """E[g_fast + sum_k E[c_k] g_k] by summing over every trajectory of T steps."""
    S, A = mdp.n_states, mdp.n_actions
    pi = M.softmax_policy(theta)
    r = mdp.r_fast + np.tensordot(mean_weight, mdp.r_slow, axes=1)
    total = np.zeros((S, A))
    for path in itertools.product(range(S * A), repeat=T):
        s_a = [(c // A, c % A) for c in path]
        p = mdp.start[s_a[0][0]]
        for t, (s, a) in enumerate(s_a):
            p *= pi[s, a]
            if t + 1 < T:
                p *= mdp.P[s, a, s_a[t + 1][0]]
        if p == 0:
            continue
        g = np.zeros((S, A))
        for t, (s, a) in enumerate(s_a):
            G = sum(mdp.gamma ** (j - t) * r[s_a[j]] for j in range(t, T))
            grad = -pi[s].copy()
            grad[a] += 1.0
            g[s] += grad * G / T
        total += p * g
    return total.ravel()


@pytest.mark.parametrize("case", range(4))
def test_exact_matches_enumeration(case):
    rng = np.random.default_rng(100 + case)
    S, A, K, T = (2, 2, 2, 3) if case % 2 == 0 else (3, 2, 1, 2)
    mdp = M.make_mdp(S, A, mdp_seed=case, shares=(1.0,) * K, gamma=0.8 + 0.05 * case,
                     split="total" if case == 3 else "slow", channel_noise_std=0.3 * (case == 3))
    theta = rng.normal(size=(S, A))
    params = CorrectorParams(alpha=rng.uniform(0.5, 1.0), tau_age=rng.uniform(1.0, 20.0),
                             rho_bar=rng.choice([0.5, 1.0, np.inf]), retrace_gamma=rng.uniform(0.2, 0.9))
    kernel = _random_kernel(rng, K, D=4)
    table = np.concatenate([mdp.r_fast[None], mdp.r_slow])
    G = M.finite_horizon_expectation(mdp, theta, T, table).reshape(K + 1, S * A)
    for name in STATIC_NAMES:
        w = ST.delay_weights(name, kernel, params)
        mean_w = ST.expected_weights(w, kernel)
        want = np.array([sum(kernel[k, d] * _weight_oracle(name, d, params) for d in range(kernel.shape[1]))
                         + (1 - kernel[k].sum()) * _weight_oracle(name, None, params) for k in range(K)])
        np.testing.assert_allclose(mean_w, want, rtol=1e-12, atol=1e-15, err_msg=name)
        got = ST.static_exact(G, mean_w)
        np.testing.assert_allclose(got, _enumerate_expectation(mdp, theta, T, want), rtol=1e-10, atol=1e-13,
                                   err_msg=name)


def test_row_normalize_makes_rows_stochastic():
    rng = np.random.default_rng(5)
    kernel = _random_kernel(rng, 3, 6)
    params = CorrectorParams(tau_age=3.0, retrace_gamma=0.5)
    for name in ("rac", "retrace_a", "rac_no_age", "bare_additive"):
        w = ST.delay_weights(name, kernel, params, row_normalize=True)
        landed = (kernel * w[:, :-1]).sum(1)
        np.testing.assert_allclose(landed, np.where(kernel.sum(1) > 0, 1.0, 0.0), rtol=1e-12)
    for name in ("naive", "sync_oracle", "wait_for_slow"):  # untouched by the normalisation
        np.testing.assert_array_equal(ST.delay_weights(name, kernel, params, True), ST.delay_weights(name, kernel, params))


def test_draws_and_lookup_against_loops():
    rng = np.random.default_rng(9)
    kernel = _random_kernel(rng, 2, 5)
    d = draw_delays(kernel, 200_000, np.random.default_rng(1))
    assert d.shape == (200_000, 2) and d.min() >= -1 and d.max() <= 5
    for k in range(2):
        freq = np.array([(d[:, k] == j).mean() for j in range(6)])
        se = np.sqrt(kernel[k] * (1 - kernel[k]) / len(d)) + 1e-9
        assert np.all(np.abs(freq - kernel[k]) < 5 * se)
        assert abs((d[:, k] == -1).mean() - (1 - kernel[k].sum())) < 5 * math.sqrt(0.25 / len(d)) + 1e-9
    params = CorrectorParams(tau_age=4.0)
    w = ST.delay_weights("rac", kernel, params)
    small = d[:50]
    tw = ST.trial_weights(w, small)
    for i in range(50):
        for k in range(2):
            want = _weight_oracle("rac", None if small[i, k] < 0 else int(small[i, k]), params)
            assert tw[i, k] == pytest.approx(want, rel=1e-13, abs=0)


def _setup(seed=3, sd=0.5, tau=2.0):
    mdp = M.make_mdp(3, 2, mdp_seed=1337, shares=(1.0, 1.0))
    theta = M.canonical_theta(3, 2, seed=7)
    kernel = np.zeros((2, 8))
    kernel[0, 2], kernel[1, 3:8] = 1.0, 0.18  # one deterministic, one spread channel losing 10%
    params = CorrectorParams(tau_age=tau)
    table = np.concatenate([mdp.r_fast[None], mdp.r_slow])
    G = M.finite_horizon_expectation(mdp, theta, 50, table).reshape(3, 6)
    return mdp, theta, kernel, params, G


def test_mc_mean_converges_to_exact():
    mdp, theta, kernel, params, G = _setup()
    rng = np.random.default_rng(11)
    n = 20_000
    grads = ST.channel_gradients(mdp, theta, n, 50, rng, fast_noise_std=0.5)
    delays = draw_delays(kernel, n, rng)
    for name in ("naive", "rac", "retrace_a", "sync_oracle"):
        w = ST.delay_weights(name, kernel, params)
        est = ST.static_estimates(grads, ST.trial_weights(w, delays))
        exact = ST.static_exact(G, ST.expected_weights(w, kernel))
        se = est.std(axis=0, ddof=1) / math.sqrt(n)
        z = (est.mean(0) - exact) / se
        assert np.all(np.abs(z) < 4.5), (name, z)
        # the per-trial estimate is the loop over channels
        i = 7
        c = ST.trial_weights(w, delays[i:i + 1])[0]
        assert np.allclose(est[i], grads[i, 0] + c[0] * grads[i, 1] + c[1] * grads[i, 2], rtol=1e-13, atol=1e-15)


def _procedure(mdp, theta, kernel, params, trials, seed):
    """The paper's procedure once: MC biases of naive and rac on ``trials`` fresh trials."""
    rng = np.random.default_rng(seed)
    grads = ST.channel_gradients(mdp, theta, trials, 50, rng, fast_noise_std=0.5)
    delays = draw_delays(kernel, trials, rng)
    target = M.true_gradient(mdp, theta).ravel()
    out = {}
    for name in ("naive", "rac"):
        est = ST.static_estimates(grads, ST.trial_weights(ST.delay_weights(name, kernel, params), delays))
        out[name] = est
    return out, target


def test_replication_interval_covers_fresh_runs_and_shrinks():
    mdp, theta, kernel, params, G = _setup(tau=5.0)
    exact = {n: ST.static_exact(G, ST.expected_weights(ST.delay_weights(n, kernel, params), kernel))
             for n in ("naive", "rac")}
    pool, target = _procedure(mdp, theta, kernel, params, 4000, seed=2024)
    width = {}
    for trials in (250, 1000, 4000):
        reps = ST.replicate_biases(pool, exact, target, trials, 400, np.random.default_rng(1))
        ratio = ST.reductions(reps)["rac"]
        lo, hi = np.percentile(ratio, [2.5, 97.5])
        width[trials] = hi - lo
        if trials == 1000:
            inside = 0
            for fresh in range(20):  # independent procedures, seeds unrelated to the pool's
                est, _ = _procedure(mdp, theta, kernel, params, 1000, seed=90_000 + 7 * fresh)
                b = {n: ST.bias_of_mean(e, target) for n, e in est.items()}
                inside += lo <= b["naive"] / b["rac"] <= hi
            assert inside >= 16  # a 95% interval: 20 fresh runs, at least 16 inside (P(fail) < 0.02)
    assert width[4000] < width[1000] < width[250]


def test_summary_columns_and_ratios():
    mdp, theta, kernel, params, G = _setup()
    est, target = _procedure(mdp, theta, kernel, params, 300, seed=4)
    exact = {n: ST.static_exact(G, ST.expected_weights(ST.delay_weights(n, kernel, params), kernel)) for n in est}
    reps = ST.replicate_biases(est, exact, target, 300, 50, np.random.default_rng(0))
    rows = ST.summarize_static(est, exact, target, reps)
    for name, row in rows.items():
        assert row["bias_exact"] == pytest.approx(float(np.linalg.norm(exact[name] - target)))
        assert row["bias_mc"] == pytest.approx(float(np.linalg.norm(est[name].mean(0) - target)))
        assert row["bias_ci_lo"] <= row["bias_ci_hi"]
        assert row["reduction_mc"] == pytest.approx(rows["naive"]["bias_mc"] / row["bias_mc"])
        assert row["reduction_rep_lo"] <= row["reduction_rep_hi"]


def test_total_split_sums_to_the_total_reward():
    base = M.make_mdp(4, 3, mdp_seed=42, shares=(1.0,))
    for K in (1, 2, 4):
        m = M.make_mdp(4, 3, mdp_seed=42, shares=(1.0,) * K, split="total", channel_noise_std=0.3)
        assert m.n_channels == K
        np.testing.assert_allclose(m.r_fast + m.r_slow.sum(0), base.reward_total, rtol=0, atol=1e-14)
        parts = np.concatenate([m.r_fast[None], m.r_slow])
        assert np.std(parts - base.reward_total / (K + 1)) > 0.1  # the eps noise is there
    with pytest.raises(ValueError, match="split"):
        M.make_mdp(3, 2, split="bogus")


def test_clipped_cauchy_is_the_papers_draw():
    conf = LatencyConf(kind="cauchy", mean=None, median=18.0, scale=4.0, low=1.0, high=200.0, discrete=True,
                       cauchy_bounds="clip")
    lat = build_latency(conf, "d")
    x = lat.sample(np.random.default_rng(0), 400_000)
    rng = np.random.default_rng(0)
    oracle = np.clip(np.rint(18.0 + 4.0 * rng.standard_cauchy(400_000)), 1, 200)
    np.testing.assert_array_equal(x, oracle)
    assert lat.mean() == pytest.approx(21.0, abs=0.05)  # the paper's realised pooled mean
    assert abs(x.mean() - lat.mean()) < 5 * x.std() / math.sqrt(x.size)
    trunc = build_latency(LatencyConf(kind="cauchy", mean=None, median=18.0, scale=4.0, low=1.0, high=200.0,
                                      discrete=True), "d")
    assert trunc.mean() > lat.mean() + 0.2  # conditioning piles no mass on the bounds
    with pytest.raises(ConfigError, match="cauchy_bounds"):
        build_latency(LatencyConf(kind="cauchy", median=18.0, low=1.0, high=200.0, cauchy_bounds="fold"), "d")
    with pytest.raises(ConfigError, match="median"):
        build_latency(LatencyConf(kind="cauchy", mean=20.0, low=1.0, high=200.0, cauchy_bounds="clip"), "d")


def _run(*overrides):
    from racsim.config.defaults import compose_config
    from racsim.config.spec import scenario
    from racsim.analyses.dispatch import run

    return run(scenario(compose_config(*overrides)))


def test_study_modes_rows_and_errors():
    base = ("scenario=paper/identity_kernel", "pipeline.channels.ch1.kernel=[0,0.5,0.3]", "learner.trials=60",
            "learner.bootstrap=20", "study.replications=30", "corrector.names=[naive,rac,sync_oracle]")
    both = _run(*base, "study.mode=both").results
    assert list(both["mode"].unique()) == ["pipeline", "static"]
    st = both[both["mode"] == "static"].set_index("corrector")
    for col in ("bias_mc", "mc_se", "bias_exact", "bias_ci_lo", "bias_ci_hi", "reduction_mc", "reduction_exact"):
        assert st[col].notna().all(), col
    assert st.loc["rac", "reduction_exact"] == pytest.approx(st.loc["naive", "bias_exact"] / st.loc["rac", "bias_exact"])
    static = _run(*base, "study.mode=static")
    assert (static.results["mode"] == "static").all()
    cols = list(static.results.columns)  # static rows do not depend on whether the pipeline ran too
    pd.testing.assert_frame_equal(static.results[cols], both[both["mode"] == "static"].reset_index(drop=True)[cols])
    assert len(static.extra["static_replicates"]) == 3 * 30
    with pytest.raises(ConfigError, match="study.mode"):
        _run(*base, "study.mode=sometimes")
    with pytest.raises(ConfigError, match="study.mode"):  # a queue channel has no delay kernel
        _run("scenario=paper/baselines_k2", "learner.trials=10", "study.mode=static")


def test_report_replication_interval_aggregates_each_replication_over_cells():
    from racsim.report.paper import replication_interval

    rng = np.random.default_rng(3)
    cells, R = [0, 1, 2], 40
    reps = pd.DataFrame([{"job_dir": "j", "cell": c, "corrector": n, "replication": r, "bias_mc": rng.uniform(0.01, 1)}
                         for c in cells + [9] for n in ("naive", "rac") for r in range(R)])
    rows = pd.DataFrame([{"job_dir": "j", "cell": c, "corrector": n} for c in cells for n in ("naive", "rac")])
    for agg in (np.mean, np.min, np.median):
        per_rep = []
        for r in range(R):  # the oracle: per replication, the ratio in each cell (cell 9 is not in rows), aggregated
            ratios = []
            for c in cells:
                pick = reps[(reps.cell == c) & (reps.replication == r)].set_index("corrector").bias_mc
                ratios.append(pick["naive"] / pick["rac"])
            per_rep.append(agg(ratios))
        lo, hi = replication_interval(rows, reps, "rac", agg)
        assert (lo, hi) == pytest.approx(tuple(np.percentile(per_rep, [2.5, 97.5])), rel=1e-12)
