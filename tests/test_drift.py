"""The bias of one update along a training trajectory (racsim.learner.drift, issue 47): the exact
expectation against a slow loop over every trajectory of a tiny MDP, the Monte Carlo against the
estimator written out decision by decision on the same trajectories, and the fixed-policy benchmark as
the path that stands still (lr = 0)."""

from __future__ import annotations

import itertools
import math
import numpy as np
import pytest

from racsim.learner import mdp as M
from racsim.learner.bias import Cell, run_bias_cells
from racsim.learner.correctors import CorrectorParams, row_name, split_name
from racsim.learner.drift import lagged_bias_run, row_terms
from racsim.learner.rollouts import sample_trajectories
from racsim.pipeline.schedule import DROPPED, INJECTED, PENDING, ArrivalSchedule


def tiny_mdp(seed: int, K: int = 2) -> M.TabularMDP:
    """A random 2-state, 2-action MDP with K slow channels (its rewards drawn, not the recipe's)."""
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.ones(2), size=(2, 2))
    return M.TabularMDP(P=P, r_fast=rng.uniform(-1, 1, (2, 2)), r_slow=rng.uniform(-1, 1, (K, 2, 2)),
                        gamma=0.8, start=rng.dirichlet(np.ones(2)))


def random_schedule(seed: int, trials: int = 3, steps: int = 8, batch: int = 2, K: int = 2, max_lag: int = 4,
                    blocking: bool = False) -> ArrivalSchedule:
    """Random delays (0..3) and statuses (injected, dropped, pending) and generation lags (0..max_lag); a
    blocking schedule lands every injected result in its own step."""
    rng = np.random.default_rng(seed)
    shape = (trials, steps, batch, K)
    status = rng.choice([INJECTED, INJECTED, INJECTED, DROPPED, PENDING], size=shape).astype(np.int8)
    delay = np.zeros(shape, dtype=np.int64) if blocking else rng.integers(0, 4, size=shape)
    t = np.arange(steps)[None, :, None, None]
    status = np.where((status == INJECTED) & (t + delay >= steps), PENDING, status).astype(np.int8)
    delay = np.where(status == INJECTED, delay, -1)
    lag = rng.integers(0, max_lag + 1, size=shape[:3])
    start = np.cumsum(np.ones((trials, steps + 1)), axis=1)
    return ArrivalSchedule(delay=delay, status=status, step_start=start, blocking=blocking,
                           channel_names=tuple(f"ch{k}" for k in range(K)), lag=lag)


class Oracle:
    """Exact expected estimates by brute force: every trajectory of the tiny MDP enumerated with its
    probability under the behaviour policy, the estimator written out per decision (weights from the
    correctors' formulas, the score of the current softmax policy)."""

    def __init__(self, mdp, theta0, lr, horizon, steps, p: CorrectorParams):
        self.mdp, self.T, self.p = mdp, horizon, p
        path = [np.array(theta0, dtype=float)]
        for _ in range(steps + 8):
            path.append(path[-1] + lr * M.true_gradient(mdp, path[-1]))
        self.pis = [M.softmax_policy(th) for th in path]
        rewards = [mdp.r_fast] + list(mdp.r_slow)
        self.paths = []  # (states, actions, returns per channel and decision)
        for cells in itertools.product(range(4), repeat=horizon):
            s, a = [x // 2 for x in cells], [x % 2 for x in cells]
            G = [[sum(mdp.gamma ** (j - h) * r[s[j], a[j]] for j in range(h, horizon)) for h in range(horizon)]
                 for r in rewards]
            self.paths.append((s, a, G))
        self.memo = {}

    def prob(self, v, s, a):
        pv, out = self.pis[v], self.mdp.start[s[0]]
        for h in range(self.T):
            out *= pv[s[h], a[h]] * (self.mdp.P[s[h], a[h], s[h + 1]] if h + 1 < self.T else 1.0)
        return out

    def expect(self, u, v, c, ratio, rollout):
        """E over trajectories of policy v of (1/T) sum_h w(s_h, a_h) score_u(s_h, a_h) G^c_h."""
        key = (u, v, c, ratio, rollout)
        if key in self.memo:
            return self.memo[key]
        p, out = self.p, np.zeros((2, 2))
        pu, pv, pp = self.pis[u], self.pis[v], self.pis[max(v, u - 1)]
        for s, a, G in self.paths:
            prob = self.prob(v, s, a)
            for h in range(self.T):
                x, y = s[h], a[h]
                w = 1.0
                if rollout == "tis":
                    w = min(p.tis_cap, pu[x, y] / pv[x, y])
                elif rollout == "decoupled":
                    w = min(p.decoupled_cap, pp[x, y] / pv[x, y]) * pu[x, y] / pp[x, y]
                if ratio:
                    w *= min(p.rho_bar, pu[x, y] / pv[x, y])
                f = prob * w * G[c][h] / self.T
                out[x] -= f * pu[x]
                out[x, y] += f
        self.memo[key] = out
        return out

    def estimates(self, schedules, name, warmup: int, view: str = "steady"):
        """Per trial, the exact expected estimate of the view's mean update."""
        p = self.p
        reward, rollout = split_name(name)
        sched = schedules["blocking" if reward == "wait_for_slow" else "async"]
        trials, steps, batch, K = sched.delay.shape
        scalar = {"rac": lambda d: p.alpha * math.exp(-d / p.tau_age), "retrace_a": lambda d: p.alpha * p.retrace_gamma ** d,
                  "rac_no_age": lambda d: p.alpha, "bare_additive": lambda d: p.alpha,
                  "wait_for_slow": lambda d: 1.0, "sync_oracle": lambda d: 1.0}.get(reward)
        window = range(warmup if view == "steady" else 0, steps)
        out = np.zeros((trials, 4))
        for i in range(trials):
            total = np.zeros((2, 2))
            for t in range(steps):
                for b in range(batch):
                    L = min(int(sched.lag[i, t, b]), t)
                    if rollout == "drop" and L > p.version_cap:
                        continue
                    v = t - L
                    if t in window:
                        total += self.expect(t, v, 0, False, rollout)
                    for k in range(K if reward != "naive" else 0):
                        if reward == "sync_oracle":
                            u, delta = t, 0
                        elif sched.status[i, t, b, k] == INJECTED:
                            u, delta = t + int(sched.delay[i, t, b, k]), int(sched.delay[i, t, b, k])
                        else:
                            continue
                        if u in window:
                            uses = reward in ("rac", "retrace_a", "rac_no_age")
                            total += scalar(delta) * self.expect(u, v, k + 1, uses, rollout)
            out[i] = (total / (len(window) * batch)).ravel()
        return out


NAMES = ["naive", "wait_for_slow", "rac", "retrace_a", "rac_no_age", "bare_additive", "sync_oracle"]


@pytest.mark.parametrize("seed, rho_bar, names", [
    (1, 1.0, ["naive", "rac+tis", "retrace_a+decoupled", "bare_additive+drop", "wait_for_slow+tis"]),
    (2, np.inf, ["rac", "rac_no_age+tis", "sync_oracle+decoupled", "rac+drop", "naive+decoupled"]),
    (3, 1.2, ["naive+tis", "rac+decoupled", "wait_for_slow+drop", "sync_oracle", "retrace_a+tis"]),
])
def test_exact_matches_a_loop_over_every_trajectory(seed, rho_bar, names):
    """Lag and delay both non-zero, drops and pending results, the clip active (rho_bar 1) and not (inf),
    a version cap that drops some samples, the rollout caps binding (tis_cap 1.05, decoupled_cap 1: the
    proximal policy matters): the exact figure of every row equals the brute-force oracle per trial, in
    both views."""
    mdp = tiny_mdp(seed)
    theta0 = np.random.default_rng(seed + 10).normal(size=(2, 2))
    params = CorrectorParams(alpha=0.9, tau_age=3.0, rho_bar=rho_bar, retrace_gamma=0.6, tis_cap=1.05,
                             decoupled_cap=1.0, version_cap=2)
    schedules = {"async": random_schedule(seed), "blocking": random_schedule(seed + 100, blocking=True)}
    schedules["blocking"] = ArrivalSchedule(**{**schedules["blocking"].__dict__, "lag": schedules["async"].lag})
    cell = Cell(schedules, names, params, warmup=3)
    horizon, lr = 3, 0.7
    run = lagged_bias_run(mdp, theta0, cell, horizon, lr, np.random.default_rng(0))
    oracle = Oracle(mdp, theta0, lr, horizon, 8, params)
    for name in names:
        for view in ("steady", "run"):
            want = oracle.estimates(schedules, name, 3, view)
            np.testing.assert_allclose(run.exact_trials[view][name], want, rtol=1e-10, atol=1e-13,
                                       err_msg=f"{name} {view}")


def test_monte_carlo_is_the_estimator_written_out():
    """The Monte-Carlo estimate of each trial equals the estimator computed decision by decision (score of
    the current policy, the corrector's weights, the returns) on the same trajectories, drawn as the run
    draws them: one chunk, each sample under its behaviour policy, then the fast noise."""
    seed, horizon, lr, noise = 4, 3, 0.5, 0.3
    mdp = tiny_mdp(seed)
    theta0 = np.random.default_rng(1).normal(size=(2, 2))
    params = CorrectorParams(tau_age=4.0, tis_cap=1.1, decoupled_cap=1.0, version_cap=2)
    sched = random_schedule(seed)
    names = ["rac+tis", "naive+drop", "retrace_a+decoupled"]
    cell = Cell({"async": sched}, names, params, warmup=2)
    run = lagged_bias_run(mdp, theta0, cell, horizon, lr, np.random.default_rng(7), fast_noise_std=noise)
    again = lagged_bias_run(mdp, theta0, cell, horizon, lr, np.random.default_rng(7), fast_noise_std=noise)
    for name in names:  # the same inputs and seed: the same bits
        np.testing.assert_array_equal(again.estimates["steady"][name], run.estimates["steady"][name])
    trials, steps, batch, K = sched.delay.shape
    path = M.policy_path(mdp, theta0, lr, steps + 8)
    pis = M.softmax_policy(path)
    version = np.arange(steps)[None, :, None] - np.minimum(sched.lag, np.arange(steps)[None, :, None])
    rng = np.random.default_rng(7)
    st, ac = sample_trajectories(mdp, pis[version.ravel()], version.size, horizon, rng, time_major=True)
    eps = rng.standard_normal((version.size, horizon)).T
    rewards = np.concatenate([mdp.r_fast[None], mdp.r_slow])
    for name in names:
        reward, rollout = split_name(name)
        tm = row_terms(name, cell)
        for view in ("steady", "run"):
            first = 2 if view == "steady" else 0
            window = steps - first
            want = np.zeros((trials, 4))
            for j in range(len(tm.trial)):
                n, u, v, c = tm.sample[j], tm.update[j], tm.version[j], tm.channel[j]
                if not first <= u < steps:
                    continue
                g = np.zeros((2, 2))
                for h in range(horizon):
                    G = sum(mdp.gamma ** (x - h) * (rewards[c][st[x, n], ac[x, n]] + (noise * eps[x, n] if c == 0
                                                                                     else 0.0))
                            for x in range(h, horizon))
                    s, a = st[h, n], ac[h, n]
                    pu, pv, pp = pis[u][s, a], pis[v][s, a], pis[max(v, u - 1)][s, a]
                    w = {"none": 1.0, "drop": 1.0, "tis": min(params.tis_cap, pu / pv),
                         "decoupled": min(params.decoupled_cap, pp / pv) * pu / pp}[rollout]
                    if tm.ratio[j]:
                        w *= min(params.rho_bar, pu / pv)
                    score = np.zeros((2, 2))
                    score[s] -= pis[u][s]
                    score[s, a] += 1.0
                    g += tm.scalar[j] * w * score * G / horizon
                want[tm.trial[j]] += g.ravel() / (window * batch)
            np.testing.assert_allclose(run.estimates[view][name], want, rtol=1e-10, atol=1e-13,
                                       err_msg=f"{name} {view}")


def test_a_path_that_stands_still_is_the_fixed_policy_benchmark():
    """lr = 0: every version is theta_0, so each row's exact figure is the fixed-policy benchmark's (and every
    rollout corrector's weight 1: rac+tis is rac), in both views, whatever the lags."""
    mdp = M.make_mdp(3, 2, shares=(1.0, 2.0))
    theta = M.canonical_theta(3, 2)
    sched = random_schedule(5, trials=4, steps=10, batch=3, max_lag=6)
    names = ["naive", "rac", "retrace_a", "bare_additive", "sync_oracle"]
    params = CorrectorParams(tau_age=5.0)
    lagged = lagged_bias_run(mdp, theta, Cell({"async": sched}, names + ["rac+tis", "rac+decoupled"], params,
                                              warmup=4), 6, 0.0, np.random.default_rng(0))
    fixed = run_bias_cells(mdp, theta, [Cell({"async": sched}, names, params, warmup=4)], 6,
                           np.random.default_rng(0))[0]
    for name in names:
        for view in ("steady", "run"):
            np.testing.assert_allclose(lagged.exact(name, view), fixed.exact(name, view), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(lagged.target_of("steady"), fixed.target, rtol=1e-14)
    for rollout in ("tis", "decoupled"):
        np.testing.assert_allclose(lagged.exact(row_name("rac", rollout)), lagged.exact("rac"), rtol=1e-14)


def test_monte_carlo_agrees_with_exact():
    """Over many trials the Monte-Carlo mean of each row sits within 4 standard errors of its exact
    expectation (canonical MDP, geometric-like lags, a moving policy)."""
    mdp = M.make_mdp(3, 2, shares=(1.0, 1.0))
    theta = M.canonical_theta(3, 2)
    sched = random_schedule(6, trials=400, steps=10, batch=2, max_lag=5)
    names = ["naive", "rac+tis", "retrace_a+decoupled", "bare_additive+drop"]
    run = lagged_bias_run(mdp, theta, Cell({"async": sched}, names, CorrectorParams(version_cap=3), warmup=4),
                          8, 1.0, np.random.default_rng(3))
    for name in names:
        est = run.estimates["steady"][name] - run.exact_trials["steady"][name]
        se = est.std(axis=0, ddof=1) / math.sqrt(len(est))
        assert np.all(np.abs(est.mean(axis=0)) <= 4 * se + 1e-12), name


def test_chunks_of_trials_give_the_same_exact_figures(monkeypatch):
    """Trials taken a chunk at a time (the memory bound of a large run): the exact figures are those of one
    pass, and every trajectory is sampled once."""
    import racsim.learner.drift as D
    mdp = tiny_mdp(8)
    theta0 = np.zeros((2, 2))
    sched = random_schedule(8, trials=7, steps=6, batch=2)
    cell = Cell({"async": sched}, ["rac+tis", "naive+drop"], CorrectorParams(version_cap=1), warmup=2)
    whole = lagged_bias_run(mdp, theta0, cell, 4, 0.5, np.random.default_rng(1))
    monkeypatch.setattr(D, "CHUNK_TRAJECTORIES", 3 * 6 * 2)  # three trials a chunk: 3 + 3 + 1
    chunked = lagged_bias_run(mdp, theta0, cell, 4, 0.5, np.random.default_rng(1))
    assert chunked.trajectories == whole.trajectories == 7 * 6 * 2
    for view in ("steady", "run"):
        for name in cell.names:
            np.testing.assert_allclose(chunked.exact_trials[view][name], whole.exact_trials[view][name],
                                       rtol=1e-13, atol=1e-16)
            assert np.isfinite(chunked.estimates[view][name]).all()
