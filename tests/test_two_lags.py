"""Both lags (issue 47): the generation-lag law, the rollout-axis correctors, training on stale samples
(against a loop oracle), the first-order law against the exact figure, stacked objectives and shared draws,
bad input for every new key, and a run across lags end to end."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import racsim.app.api as api
from racsim.analyses import bias_study as BS
from racsim.config.defaults import default_config
from racsim.config.schema import LatencyConf
from racsim.config.validate import validate
from racsim.errors import ConfigError
from racsim.learner import mdp as M
from racsim.learner.correctors import (
    USES_RATIO,
    CorrectorParams,
    clipped_ratio,
    correction_weight,
    kept,
    reward_scalar,
    rollout_weight,
    row_name,
    split_name,
)
from racsim.learner.drift import first_order_table, staleness_bias
from racsim.learner.rollouts import sample_trajectories
from racsim.learner.theory import first_order_staleness
from racsim.learner.training import split_lanes, stack_lanes, train
from racsim.pipeline.draws import draw_lags
from racsim.pipeline.schedule import DROPPED, INJECTED, PENDING, ArrivalSchedule
from tests.oracles import oracle_returns, oracle_weight


# --------------------------------------------------------------------------
# The lag law: drawn from a stream of its own, only when set.


def lagged(*overrides: str):
    """The default config with a lag law and small sizes (no file written)."""
    cfg = default_config(*overrides)
    cfg.learner.trials, cfg.learner.bootstrap, cfg.learner.train.lanes = 20, 0, 2
    cfg.output.plots, cfg.output.progress = False, False
    return cfg


def test_lags_are_drawn_only_when_set_and_from_their_own_stream():
    """No law: no lags (None). A law: the schedules carry them, and every other draw is what it was."""
    cfg = lagged()
    cfg.pipeline.steps = 12
    names = BS.row_names(cfg)
    plain = BS.simulate_schedules(cfg, 6, "pipeline", names)
    assert plain["async"].lag is None and draw_lags(cfg.pipeline, 6, np.random.default_rng(0)) is None
    cfg.pipeline.generation.lag = LatencyConf(kind="geometric", mean=2.0)
    with_lag = BS.simulate_schedules(cfg, 6, "pipeline", names)
    for kind in plain:
        np.testing.assert_array_equal(with_lag[kind].delay, plain[kind].delay)
        np.testing.assert_array_equal(with_lag[kind].step_start, plain[kind].step_start)
        assert with_lag[kind].lag.shape == (6, cfg.pipeline.steps, cfg.pipeline.batch_size)
    np.testing.assert_array_equal(with_lag["async"].lag, with_lag["blocking"].lag)  # both pipelines share them
    again = BS.simulate_schedules(cfg, 6, "pipeline", names)["async"].lag
    np.testing.assert_array_equal(again, with_lag["async"].lag)
    assert not np.array_equal(BS.simulate_schedules(cfg, 6, "train_pipeline", names)["async"].lag[:, :5],
                              again[:, :5])


@pytest.mark.parametrize("law, mean", [(LatencyConf(kind="deterministic", mean=3.0), 3.0),
                                       (LatencyConf(kind="geometric", mean=2.5), 2.5),
                                       (LatencyConf(kind="geometric", mean=4.0, high=6.0), None)])
def test_lag_laws_draw_whole_versions_with_their_mean(law, mean):
    """Deterministic and geometric lags: whole numbers >= 0 whose mean is the law's exact mean."""
    cfg = lagged()
    cfg.pipeline.generation.lag = law
    cfg.pipeline.steps = 500
    lags = draw_lags(cfg.pipeline, 50, np.random.default_rng(3))
    assert lags.dtype == np.int64 and lags.min() >= 0
    from racsim.pipeline.latency import build_latency
    exact = build_latency(law).mean()
    if mean is not None:
        assert exact == pytest.approx(mean, rel=1e-12)
    se = lags.std() / math.sqrt(lags.size) + 1e-12
    assert abs(lags.mean() - exact) <= 5 * se
    if law.high is not None:
        assert lags.max() <= law.high


def test_geometric_atoms_and_quantiles():
    """P(X = k) = p (1 - p)^k with p = 1 / (1 + mean), its mean summed atom by atom, clipped to [1, 7]."""
    from racsim.pipeline.latency import build_latency
    m, low, high = 2.5, 1.0, 7.0
    law = build_latency(LatencyConf(kind="geometric", mean=m, low=low, high=high))
    p = 1.0 / (1.0 + m)
    atoms = {k: p * (1 - p) ** k for k in range(2000)}
    want = sum(min(max(k, low), high) * w for k, w in atoms.items())
    assert law.mean() == pytest.approx(want, rel=1e-12)
    for x in (0.0, 1.0, 3.5, 6.9, 7.0):
        cdf = sum(w for k, w in atoms.items() if min(max(k, low), high) <= x)
        assert law.cdf(x) == pytest.approx(cdf, rel=1e-12, abs=1e-15)
    for q in (0.05, 0.3, 0.5, 0.9, 0.99):
        k = float(law.quantile(q))
        assert law.cdf(k) >= q - 1e-12 and (k == low or law.cdf(k - 1) < q)


def test_an_empirical_lag_is_resampled_and_must_hold_whole_versions(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lags.csv").write_text("lag\n0\n1\n1\n4\n")
    cfg = lagged()
    cfg.pipeline.generation.lag = LatencyConf(kind="empirical", mean=None, path="lags.csv", column="lag")
    validate(cfg)
    lags = draw_lags(cfg.pipeline, 200, np.random.default_rng(0))
    assert set(np.unique(lags)) == {0, 1, 4}
    (tmp_path / "lags.csv").write_text("lag\n0\n1.5\n")
    with pytest.raises(ConfigError) as info:
        draw_lags(cfg.pipeline, 2, np.random.default_rng(0))
    assert info.value.key == "pipeline.generation.lag.column" and "line 3" in info.value.allowed


BAD = [
    ("pipeline.generation.lag", dict(kind="lognormal", mean=2.0), "pipeline.generation.lag.kind", "whole number"),
    ("pipeline.generation.lag", dict(kind="deterministic", mean=1.5), "pipeline.generation.lag.mean", "whole number"),
    ("pipeline.generation.lag", dict(kind="geometric", mean=-1.0), "pipeline.generation.lag.mean", ">= 0"),
    ("pipeline.generation.lag", dict(kind="geometric", mean=2.0, high=3.5), "pipeline.generation.lag.high",
     "whole number"),
    ("pipeline.generation.lag", dict(kind="empirical", mean=2.0, path="x.csv", column="lag"),
     "pipeline.generation.lag.mean", "as measured"),
    ("corrector.rollout", ["none", "ppo"], "corrector.rollout", "tis"),
    ("corrector.rollout", ["tis", "tis"], "corrector.rollout", "at most once"),
    ("corrector.rollout", [], "corrector.rollout", "non-empty"),
    ("corrector.tis_cap", 0.5, "corrector.tis_cap", ">= 1"),
    ("corrector.decoupled_cap", float("nan"), "corrector.decoupled_cap", ">= 1"),
    ("corrector.version_cap", -1, "corrector.version_cap", ">= 0"),
]


@pytest.mark.parametrize("key, value, named, says", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_values_of_each_new_key(key, value, named, says, tmp_path, monkeypatch):
    """One ConfigError naming the key and what is allowed, never a traceback."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.csv").write_text("lag\n1\n")
    cfg = lagged()
    parent, leaf = key.rsplit(".", 1)
    node = cfg
    for part in parent.split("."):
        node = getattr(node, part)
    setattr(node, leaf, LatencyConf(**value) if isinstance(value, dict) else value)
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    assert info.value.key == named and says in info.value.allowed, str(info.value)


@pytest.mark.parametrize("where", ["lm", "static", "capacity"])
@pytest.mark.parametrize("key", ["pipeline.generation.lag", "corrector.rollout"])
def test_the_lags_are_the_pipeline_studys(where, key):
    """The static experiment and a capacity plan refuse a lag law and rollout correctors; the LM learner
    reads them (its stale generation: tests/test_lm_stale.py)."""
    cfg = lagged()
    cfg.capacity.enabled = where == "capacity"  # refused before the plan's own keys are read
    if key == "pipeline.generation.lag":
        cfg.pipeline.generation.lag = LatencyConf(kind="deterministic", mean=1.0)
    else:
        cfg.corrector.rollout = ["none", "tis"]
    if where == "lm":
        cfg.learner.kind, cfg.learner.lm.policy = "lm", "bandit"
        validate(cfg)
        return
    if where == "static":
        cfg.study.mode = "static"
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    assert info.value.key == key, str(info.value)


# --------------------------------------------------------------------------
# The rollout axis's weights.


def test_names_combine_and_split():
    for reward in ("naive", "rac", "wait_for_slow"):
        for rollout in ("none", "tis", "decoupled", "drop"):
            assert split_name(row_name(reward, rollout)) == (reward, rollout)
    assert row_name("rac", "none") == "rac"
    for bad in ("rac+none", "rac+ppo", "ppo", "rac+tis+drop"):
        with pytest.raises(ConfigError):
            split_name(bad)


def test_rollout_weights_are_their_formulas():
    rng = np.random.default_rng(0)
    use, beh, prox = rng.uniform(0.05, 1, (3, 400))
    p = CorrectorParams(tis_cap=1.3, decoupled_cap=1.7, version_cap=2)
    for i in range(400):
        assert rollout_weight("none", use[i], beh[i], prox[i], p) == 1.0
        assert rollout_weight("drop", use[i], beh[i], prox[i], p) == 1.0
        assert rollout_weight("tis", use[i], beh[i], prox[i], p) == min(1.3, use[i] / beh[i])
        want = min(1.7, prox[i] / beh[i]) * use[i] / prox[i]
        assert rollout_weight("decoupled", use[i], beh[i], prox[i], p) == pytest.approx(want, rel=1e-15)
    np.testing.assert_array_equal(kept("drop", np.arange(5), p), [True, True, True, False, False])
    assert kept("tis", np.arange(5), p).all()
    same = rng.uniform(0.05, 1, 50)
    for kind in ("tis", "decoupled"):  # a sample of the current policy keeps its weight
        np.testing.assert_array_equal(rollout_weight(kind, same, same, same, CorrectorParams()), 1.0)


def test_reward_scalar_times_the_clipped_ratio_is_the_correction_weight():
    rng = np.random.default_rng(1)
    delay = rng.integers(0, 6, (4, 5, 3, 2))
    status = rng.choice([INJECTED, DROPPED, PENDING], size=delay.shape).astype(np.int8)
    delay = np.where(status == INJECTED, delay, -1)
    ratio = rng.uniform(0.3, 2.0, delay.shape)
    p = CorrectorParams(alpha=0.8, tau_age=5.0, rho_bar=1.2, retrace_gamma=0.7, adaptive_min_results=2)
    for name in ("naive", "wait_for_slow", "rac", "retrace_a", "rac_no_age", "bare_additive", "sync_oracle",
                 "rac_adaptive"):
        scalar = reward_scalar(name, delay, status, p)
        got = scalar * (clipped_ratio(ratio, p.rho_bar) if name in USES_RATIO else 1.0)
        np.testing.assert_allclose(got, correction_weight(name, delay, status, ratio, p), rtol=1e-15, atol=0)


# --------------------------------------------------------------------------
# The MDP's new pieces.


def test_a_stack_of_policies_has_the_objectives_one_by_one_to_the_bit():
    for S, A, top in [(3, 2, "random"), (4, 3, "cyclic"), (12, 5, "dense")]:
        mdp = M.make_mdp(S, A, topology=top, shares=(1.0, 2.0))
        th = np.random.default_rng(S).normal(size=(6, S, A)) * 2
        np.testing.assert_array_equal(M.objective(mdp, th), [M.objective(mdp, t) for t in th])
        np.testing.assert_array_equal(M.stationary_distribution(mdp, M.softmax_policy(th))[2],
                                      M.stationary_distribution(mdp, M.softmax_policy(th[2])))


def test_behaviour_moments_and_their_derivative():
    """At the current policy, score(M) is the finite-horizon expectation; the forward-mode derivative is the
    central difference's; the path is ascent on the true gradient."""
    from racsim.learner.rollouts import softmax_score
    mdp = M.make_mdp(4, 3, topology="cyclic", shares=(1.0, 1.0))
    th = M.canonical_theta(4, 3, seed=3)
    R = np.concatenate([mdp.r_fast[None], mdp.r_slow])
    np.testing.assert_allclose(softmax_score(M.behaviour_moments(mdp, th, 9, R), M.softmax_policy(th), 9),
                               M.finite_horizon_expectation(mdp, th, 9, R), rtol=1e-12, atol=1e-15)
    x = np.random.default_rng(2).normal(size=th.shape)
    moments, d = M.behaviour_moments_jvp(mdp, th, 9, x, R)
    np.testing.assert_allclose(moments, M.behaviour_moments(mdp, th, 9, R), rtol=1e-13)
    fd = (M.behaviour_moments(mdp, th + 1e-6 * x, 9, R) - M.behaviour_moments(mdp, th - 1e-6 * x, 9, R)) / 2e-6
    np.testing.assert_allclose(d, fd, rtol=1e-6, atol=1e-8)
    path = M.policy_path(mdp, th, 0.3, 4)
    np.testing.assert_allclose(path[2], path[1] + 0.3 * M.true_gradient(mdp, path[1]), rtol=1e-15)


def test_copies_of_a_draw_are_the_draws_of_each_alone():
    mdp = M.make_mdp(3, 2)
    pi = M.softmax_policy(np.random.default_rng(0).normal(size=(12, 3, 2)))
    s, a = sample_trajectories(mdp, pi, 12, 7, np.random.default_rng(9), copies=3)
    for c in range(3):
        s1, a1 = sample_trajectories(mdp, pi[4 * c:4 * c + 4], 4, 7, np.random.default_rng(9))
        np.testing.assert_array_equal(s[4 * c:4 * c + 4], s1)
        np.testing.assert_array_equal(a[4 * c:4 * c + 4], a1)


# --------------------------------------------------------------------------
# Training on stale samples, against a loop.


def softmax(th):
    z = np.exp(th - th.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def oracle_lagged_train(mdp, theta0, sched, name, p, T, lr, rng, noise):
    """Every lane's theta after every step, written out: sample b of step t drawn by the lane's policy of
    version t - min(L, t); its fast return weighted per decision by the rollout corrector at step t, each slow
    result by the reward-axis weight (ratio to the cached behaviour policy) times the rollout corrector's at
    the step it lands; a sample past drop's cap not trained on."""
    reward, rollout = split_name(name)
    L, N, B, K = sched.delay.shape
    S, A = mdp.n_states, mdp.n_actions
    hist = [[np.array(theta0, dtype=float) for _ in range(L)]]
    memory = {}

    def weight(pu, pv, pp):
        return {"none": 1.0, "drop": 1.0, "tis": min(p.tis_cap, pu / pv),
                "decoupled": min(p.decoupled_cap, pp / pv) * pu / pp}[rollout]

    for t in range(N):
        pis = [[softmax(th) for th in step] for step in hist]
        version = [[t - min(int(sched.lag[l, t, b]), t) for b in range(B)] for l in range(L)]
        rows = np.array([pis[version[l][b]][l] for l in range(L) for b in range(B)])
        states, actions = sample_trajectories(mdp, rows, L * B, T, rng)
        eps = rng.standard_normal((L * B, T)) if noise > 0 else np.zeros((L * B, T))
        new = []
        for l in range(L):
            pi = pis[t][l]
            grad = np.zeros((S, A))

            def add(st, ac, ret, ws):
                for u in range(T):
                    s, a = int(st[u]), int(ac[u])
                    for b2 in range(A):
                        grad[s, b2] += ws[u] * ((1.0 if b2 == a else 0.0) - pi[s, b2]) * ret[u] / T

            for b in range(B):
                i, v = l * B + b, version[l][b]
                st, ac = states[i], actions[i]
                keep = rollout != "drop" or t - v <= p.version_cap
                beh = [pis[v][l][st[u], ac[u]] for u in range(T)]
                memory[l, t, b] = (st, ac, beh, v, keep)
                fast = oracle_returns([mdp.r_fast[st[u], ac[u]] + noise * eps[i, u] for u in range(T)], mdp.gamma)
                pp = pis[max(v, t - 1)][l]
                ws = [weight(pi[st[u], ac[u]], beh[u], pp[st[u], ac[u]]) * keep for u in range(T)]
                add(st, ac, fast, ws)
            for o in range(t + 1):
                for b in range(B):
                    for k in range(K):
                        status, delay = sched.status[l, o, b, k], int(sched.delay[l, o, b, k])
                        if reward == "naive" or (reward != "sync_oracle" and (status != INJECTED
                                                                                or o + delay != t)):
                            continue
                        if reward == "sync_oracle":
                            if o != t:
                                continue
                            delay = 0
                        st, ac, beh, v, keep = memory[l, o, b]
                        pp = pis[max(v, t - 1)][l]
                        slow = oracle_returns([mdp.r_slow[k, st[u], ac[u]] for u in range(T)], mdp.gamma)
                        ws = []
                        for u in range(T):
                            pu = pi[st[u], ac[u]]
                            c = oracle_weight(reward, delay, status, pu / beh[u], p.alpha, p.tau_age, p.rho_bar,
                                              p.retrace_gamma)
                            ws.append(c * weight(pu, beh[u], pp[st[u], ac[u]]) * keep)
                        add(st, ac, slow, ws)
            new.append(hist[t][l] + lr * grad / B)
        hist.append(new)
    return hist


def lag_schedule(seed, L=2, N=7, B=2, K=2):
    rng = np.random.default_rng(seed)
    shape = (L, N, B, K)
    t = np.arange(N)[None, :, None, None]
    land = t + rng.integers(0, 3, size=shape)
    status = np.where(rng.random(shape) < 0.15, DROPPED, np.where(land <= N - 1, INJECTED, PENDING)).astype(np.int8)
    return ArrivalSchedule(delay=np.where(status == INJECTED, land - t, -1), status=status,
                           step_start=np.cumsum(np.ones((L, N + 1)), axis=1), blocking=False,
                           channel_names=("a", "b"), lag=rng.integers(0, 5, size=shape[:3]))


@pytest.mark.parametrize("name, noise", [("rac+tis", 0.0), ("retrace_a+decoupled", 0.4), ("bare_additive+drop", 0.0),
                                         ("sync_oracle+tis", 0.0), ("naive", 0.3)])
def test_training_on_stale_samples_is_the_loop(name, noise):
    mdp = M.make_mdp(3, 2, mdp_seed=4, shares=(0.6, 0.4), slow_bump=1.2)
    theta0 = M.canonical_theta(3, 2, seed=2, scale=0.5)
    p = CorrectorParams(tau_age=4.0, rho_bar=1.1, tis_cap=1.2, decoupled_cap=1.0, version_cap=2)
    sched = lag_schedule(11)
    curve = train(mdp, theta0, sched, name, p, 5, 0.8, np.random.default_rng(5), noise)
    hist = oracle_lagged_train(mdp, theta0, sched, name, p, 5, 0.8, np.random.default_rng(5), noise)
    for step, thetas in enumerate(hist):
        for lane, th in enumerate(thetas):
            assert abs(curve.objective[lane, step] - M.objective(mdp, th)) <= 1e-10, (name, step, lane)


def test_cells_trained_together_are_each_as_alone():
    """Lanes of several runs on one stream of draws (the cells of a grid that share a learner): each run's
    curves equal those of it trained alone, to the bit."""
    mdp = M.make_mdp(3, 2, shares=(1.0, 1.0))
    theta0 = M.canonical_theta(3, 2)
    p = CorrectorParams(tis_cap=1.5)
    scheds = [lag_schedule(s) for s in (1, 2, 3)]
    together = train(mdp, theta0, stack_lanes(scheds), "rac+tis", p, 6, 1.0, np.random.default_rng(4), 0.3, copies=3)
    for sched, part in zip(scheds, split_lanes(together, 3)):
        alone = train(mdp, theta0, sched, "rac+tis", p, 6, 1.0, np.random.default_rng(4), 0.3)
        for f in ("wallclock", "objective", "distance"):
            np.testing.assert_array_equal(getattr(part, f), getattr(alone, f))


# --------------------------------------------------------------------------
# The first-order law against the exact figure.


@pytest.mark.parametrize("rollout, tis_cap, decoupled_cap", [("none", 2.0, 5.0), ("tis", 2.0, 5.0),
                                                             ("tis", 1.0, 5.0), ("decoupled", 2.0, 5.0),
                                                             ("decoupled", 2.0, 1.0)])
def test_the_first_order_law_holds_at_small_steps(rollout, tis_cap, decoupled_cap):
    """At eta x L -> 0 the exact staleness bias over eta L tends to the predicted ||D|| (its second-order
    remainder shrinks with eta), for each lag; caps of 1 take the one-sided derivative."""
    mdp = M.make_mdp(3, 2, shares=(1.0, 1.0))
    th = M.canonical_theta(3, 2)
    p = CorrectorParams(tis_cap=tis_cap, decoupled_cap=decoupled_cap)
    for L in (1, 3):
        D = np.linalg.norm(first_order_staleness(mdp, th, 12, rollout, p, L))
        gaps = [abs(np.linalg.norm(staleness_bias(mdp, th, eta, 12, [L], rollout, p, 14, 6)[0]) / (eta * L) - D)
                for eta in (4e-3, 1e-3)]
        assert D > 0
        assert gaps[1] < 0.02 * D and gaps[1] < gaps[0], (rollout, L, D, gaps)


def test_the_first_order_table_measures_and_predicts():
    mdp = M.make_mdp(3, 2, shares=(1.0, 1.0))
    rows = pd.DataFrame(first_order_table(mdp, M.canonical_theta(3, 2), 12, CorrectorParams(),
                                          ["none", "tis", "drop"], 14, 6, 1.0, lags=(1, 2)))
    for rollout, g in rows.groupby("rollout"):
        if rollout == "drop":
            assert g.slope_measured.isna().all() and g.first_order_bias.isna().all()
            continue
        m, pr = g.slope_measured.iloc[0], g.slope_predicted.iloc[0]
        assert abs(m - pr) <= 0.02 * pr, (rollout, m, pr)
        small = g[g.lr < 1.0]
        np.testing.assert_allclose(small.staleness_bias, small.first_order_bias, rtol=0.02)
    assert set(rows.lr) == {1e-3, 4e-3, 1.0}


# --------------------------------------------------------------------------
# A run across lags, end to end.


SMALL = ["learner.trials=6", "learner.bootstrap=20", "learner.horizon=6", "learner.train.lanes=2",
         "pipeline.steps=8", "pipeline.warmup_steps=3", "corrector.names=[naive,rac]",
         "corrector.rollout=[none,tis,drop]", "corrector.version_cap=1", "~study.grid",
         "+study.grid={pipeline.delay_distribution.mean: [1.0], pipeline.generation.lag.mean: [0.0, 2.0]}",
         "output.progress=false", "output.plots=false"]


def test_a_run_across_lags_has_the_lag_a_row_per_pair_and_its_tables(tmp_path):
    t = api.run("two_lags", SMALL, out=tmp_path / "out")
    r, extra = t.results, t.raw.extra
    names = ["naive", "rac", "naive+tis", "rac+tis", "naive+drop", "rac+drop"]
    assert list(r.corrector[:6]) == names and len(r) == 12
    assert sorted(r.lag_mean.unique()) == [0.0, 2.0]
    assert r.loc[r.corrector.str.endswith("+drop") & (r.lag_mean == 2.0), "lag_dropped"].eq(1.0).all()
    for col in ("J_at_naive_clock", "bias_exact_ci_lo", "bias_exact_ci_hi", "lr"):
        assert r[col].notna().all(), col
    assert (r.bias_exact_ci_lo <= r.bias_exact + 1e-15).all() and (r.bias_exact <= r.bias_exact_ci_hi + 1e-15).all()
    at0 = r[r.lag_mean == 0.0].set_index("corrector")
    assert at0.loc["rac+tis", "bias_exact"] != at0.loc["rac", "bias_exact"]  # the reward delay moves the policy too
    assert at0.loc["rac+drop", "bias_exact"] == at0.loc["rac", "bias_exact"]  # at L = 0 drop keeps everything
    lags = extra["lags"]
    assert list(lags.corrector) == names and {"bias_L0", "bias_L2", "J_L0", "J_L2", "bias_lo_L2"} <= set(lags)
    assert set(extra["first_order"].rollout) == {"none", "tis", "drop"}
    out = tmp_path / "out"
    for f in ("results.csv", "lags.csv", "first_order.csv", "summary.md"):
        assert (out / f).exists(), f
    text = (out / "summary.md").read_text()
    assert "## Both lags" in text and "First-order law, tis" in text and "| rac+tis |" in text
