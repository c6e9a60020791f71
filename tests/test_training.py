"""The training loop (racsim.learner.training) against a plain-loop oracle and on behaviour.

The oracle re-implements one optimizer step from the model's description:
sample the batch under the lane's CURRENT policy (a copy of the same seeded
generator), add the fast returns' score, add every slow correction landing at
this step with the per-decision clipped ratio pi_now(a|s) / pi_behaviour(a|s)
times the corrector's kernel, score everything under the current policy, and
step theta by lr * grad / batch. All randomness uses fixed seeds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import det_phases
from omegaconf import OmegaConf
from oracles import oracle_adaptive_tau, oracle_returns, oracle_score, oracle_weight

import racsim.analyses.dispatch as R
from racsim.analyses import bias_study as BS
from racsim.config.defaults import default_config
from racsim.config.spec import scenario
from racsim.config.schema import (
    ChannelConf,
    LatencyConf,
    OutputConf,
    PipelineConf,
    TrainConf,
)
from racsim.learner import mdp as M
from racsim.learner.correctors import CorrectorParams
from racsim.learner.rollouts import sample_trajectories, score_gradient
from racsim.learner.training import train
from racsim.pipeline.schedule import DROPPED, INJECTED, PENDING, ArrivalSchedule

ASYNC_NAMES = ["naive", "retrace_a", "rac", "rac_no_age", "bare_additive", "sync_oracle", "rac_adaptive"]


# --------------------------------------------------------------------------
# The oracle.


def softmax_row(row):
    m = max(row)
    e = [math.exp(x - m) for x in row]
    z = sum(e)
    return [x / z for x in e]


def oracle_train(mdp, theta0, sched, name, params, T, lr, rng, noise):
    """theta of every lane after every step, plus every ratio a correction used."""
    L, N, Bt, K = sched.delay.shape
    S, A = mdp.n_states, mdp.n_actions
    theta = [np.array(theta0, dtype=float) for _ in range(L)]
    history = [[th.copy() for th in theta]]
    memory = {}  # (lane, step, sample) -> (states, actions, behaviour probs, slow returns per channel)
    ratios = []
    for t in range(N):
        pis = [np.array([softmax_row(list(th[s])) for s in range(S)]) for th in theta]
        pi_rows = np.array([pis[l] for l in range(L) for _ in range(Bt)])
        states, actions = sample_trajectories(mdp, pi_rows, L * Bt, T, rng)
        eps = rng.standard_normal((L * Bt, T)) if noise > 0 else np.zeros((L * Bt, T))
        new_theta = []
        for l in range(L):
            pi = pis[l]
            grad = np.zeros((S, A))

            def add_score(st, ac, ret, c):
                for u in range(T):
                    s, a = int(st[u]), int(ac[u])
                    for b in range(A):
                        grad[s, b] += c[u] * ((1.0 if b == a else 0.0) - pi[s, b]) * ret[u] / T

            for b in range(Bt):
                i = l * Bt + b
                st, ac = states[i], actions[i]
                fast = [mdp.r_fast[st[u], ac[u]] + noise * eps[i, u] for u in range(T)]
                slow = [oracle_returns([mdp.r_slow[k, st[u], ac[u]] for u in range(T)], mdp.gamma) for k in range(K)]
                memory[l, t, b] = (st, ac, [pi[st[u], ac[u]] for u in range(T)], slow)
                add_score(st, ac, oracle_returns(fast, mdp.gamma), [1.0] * T)
            # Slow corrections landing at step t, from any earlier (or this) step.
            for o in range(t + 1):
                for b in range(Bt):
                    for k in range(K):
                        status = sched.status[l, o, b, k]
                        delay = int(sched.delay[l, o, b, k])
                        if name == "naive":
                            continue
                        if name == "sync_oracle":
                            if o != t:
                                continue
                            delay = 0
                        elif status != INJECTED or o + delay != t:
                            continue
                        st, ac, beh, slow = memory[l, o, b]
                        tau = None
                        if name == "rac_adaptive":
                            tau = oracle_adaptive_tau(sched.delay, sched.status, l, t, k, params.adaptive_quantile,
                                                      params.adaptive_scale, params.adaptive_min_results,
                                                      params.tau_age)
                        cs = []
                        for u in range(T):
                            ratio = pi[st[u], ac[u]] / beh[u]
                            if name in ("rac", "rac_no_age", "retrace_a") and o < t:
                                ratios.append(ratio)
                            cs.append(oracle_weight(name, delay, status, ratio, params.alpha, params.tau_age, params.rho_bar,
                                                    params.retrace_gamma, tau))
                        add_score(st, ac, slow[k], cs)
            new_theta.append(theta[l] + lr * grad / Bt)
        theta = new_theta
        history.append([th.copy() for th in theta])
    return history, np.array(ratios)


def hand_schedule(seed, L, N, Bt, K, blocking=False):
    rng = np.random.default_rng(seed)
    shape = (L, N, Bt, K)
    t = np.arange(N)[None, :, None, None]
    if blocking:
        status = np.where(rng.random(shape) < 0.6, INJECTED, DROPPED).astype(np.int8)
        delay = np.where(status == INJECTED, 0, -1)
    else:
        land = t + rng.integers(0, 4, size=shape)
        lost = rng.random(shape) < 0.15
        status = np.where(lost, DROPPED, np.where(land <= N - 1, INJECTED, PENDING)).astype(np.int8)
        delay = np.where(status == INJECTED, land - t, -1)
    step_start = np.cumsum(rng.uniform(1, 2, size=(L, N + 1)), axis=1)
    return ArrivalSchedule(delay=delay.astype(np.int64), status=status, step_start=step_start, blocking=blocking,
                           channel_names=tuple(f"c{k}" for k in range(K)))


def check_against_oracle(mdp, theta0, sched, name, params, T, lr, seed, noise):
    curve = train(mdp, theta0, sched, name, params, T, lr, np.random.default_rng(seed), noise)
    history, ratios = oracle_train(mdp, theta0, sched, name, params, T, lr, np.random.default_rng(seed), noise)
    L, N = sched.n_trials, sched.n_steps
    opt = M.optimal_policy(mdp)
    assert curve.objective.shape == curve.distance.shape == curve.wallclock.shape == (L, N + 1)
    np.testing.assert_array_equal(curve.wallclock, sched.step_start)
    for step in range(N + 1):
        for l in range(L):
            th = history[step][l]
            J = M.objective(mdp, th)
            assert abs(curve.objective[l, step] - J) <= 1e-10, (name, step, l, curve.objective[l, step], J)
            d = np.linalg.norm(M.softmax_policy(th) - opt)
            assert abs(curve.distance[l, step] - d) <= 1e-10, (name, step, l)
    return curve, history, ratios


# --------------------------------------------------------------------------
# 1. One training step equals the loop oracle.


@pytest.fixture(scope="module")
def small_mdp():
    mdp = M.make_mdp(3, 3, mdp_seed=21, shares=(0.6, 0.4), gamma=0.85, slow_bump=1.5)
    theta0 = M.canonical_theta(3, 3, seed=2, scale=0.5)
    return mdp, theta0


@pytest.mark.parametrize("lanes", [1, 2])
@pytest.mark.parametrize("name", ASYNC_NAMES)
def test_train_matches_loop_oracle(small_mdp, name, lanes):
    mdp, theta0 = small_mdp
    sched = hand_schedule(3, lanes, 6, 3, 2)
    st = sched.status
    assert (st == INJECTED).any() and (st == DROPPED).any() and (st == PENDING).any()
    assert set(np.unique(sched.delay[st == INJECTED])) == {0, 1, 2, 3}
    # rac_adaptive: its prior for the first 4 landed results of a lane and channel, then 1.5 x their median
    params = CorrectorParams(alpha=0.9, tau_age=2.5, rho_bar=1.0, retrace_gamma=0.7, adaptive_scale=1.5,
                             adaptive_min_results=4)
    noise = 0.4 if lanes == 2 else 0.0
    check_against_oracle(mdp, theta0, sched, name, params, 5, 3.0, 17, noise)


def test_wait_for_slow_matches_loop_oracle(small_mdp):
    mdp, theta0 = small_mdp
    sched = hand_schedule(4, 2, 6, 3, 2, blocking=True)
    assert (sched.status == DROPPED).any() and (sched.status == INJECTED).any()
    check_against_oracle(mdp, theta0, sched, "wait_for_slow", CorrectorParams(), 5, 3.0, 8, 0.3)


def test_train_clip_active_and_inactive(small_mdp):
    """The policy drifts enough between rollout and landing that some ratios
    exceed rho_bar = 1 (the clip is active) while others fall below it; with
    a clip level above every ratio the clip never acts. Both match the oracle,
    and the clip changes the run."""
    mdp, theta0 = small_mdp
    sched = hand_schedule(3, 1, 6, 3, 2)
    clipped = CorrectorParams(alpha=1.0, tau_age=4.0, rho_bar=1.0)
    curve_c, _, ratios_c = check_against_oracle(mdp, theta0, sched, "rac", clipped, 5, 3.0, 17, 0.0)
    assert (ratios_c > 1.0 + 1e-6).sum() > 5, ratios_c  # clip active
    assert (ratios_c < 1.0 - 1e-6).sum() > 5, ratios_c  # ratio used as is
    free = CorrectorParams(alpha=1.0, tau_age=4.0, rho_bar=1e6)
    curve_f, _, ratios_f = check_against_oracle(mdp, theta0, sched, "rac", free, 5, 3.0, 17, 0.0)
    assert ratios_f.max() < 1e6 and (np.abs(ratios_f - 1) > 1e-3).sum() > 5
    assert np.abs(curve_c.objective[:, -1] - curve_f.objective[:, -1]).max() > 1e-6
    # rac_no_age with the clip off differs from bare_additive only through the ratio.
    a = train(mdp, theta0, sched, "rac_no_age", free, 5, 3.0, np.random.default_rng(17))
    b = train(mdp, theta0, sched, "bare_additive", free, 5, 3.0, np.random.default_rng(17))
    assert np.abs(a.objective[:, -1] - b.objective[:, -1]).max() > 1e-6


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_score_gradient_per_lane_matches_loop_oracle(seed):
    """The one score gradient as train calls it: rows of several lanes in any order
    (fresh rollouts, then late corrections), each lane's rows summed under that lane's
    own policy, the returns weighted per step (c * G). Against the per-step loop oracle."""
    rng = np.random.default_rng(700 + seed)
    L, n, T, S, A = int(rng.integers(1, 5)), int(rng.integers(1, 30)), int(rng.integers(1, 9)), 3, int(rng.integers(1, 5))
    pi = M.softmax_policy(rng.normal(size=(L, S, A)))
    lanes = rng.integers(0, L, n)
    states, actions = rng.integers(0, S, (n, T)), rng.integers(0, A, (n, T))
    c = rng.uniform(0.0, 1.5, (n, T))
    G = np.array([oracle_returns(list(r), 0.9) for r in rng.normal(size=(n, T))])
    got = score_gradient(states, actions, c * G, pi, lanes=lanes)
    assert got.shape == (L, S, A)
    ref = np.zeros((L, S, A))
    for i in range(n):
        ref[lanes[i]] += oracle_score(states[i], actions[i], list(c[i] * G[i]), pi[lanes[i]])
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-13)
    with pytest.raises(ValueError, match="lanes"):
        score_gradient(states, actions, G, pi, lanes=np.full(n, L))


# --------------------------------------------------------------------------
# 2. Behaviour on the canonical 3x2 MDP.


def canonical():
    mdp = M.make_mdp(3, 2)
    return mdp, M.canonical_theta(3, 2)


def flat_schedule(L, N, Bt, K=1):
    z = np.zeros((L, N, Bt, K))
    return ArrivalSchedule(delay=z.astype(np.int64), status=z.astype(np.int8),
                           step_start=np.tile(np.arange(N + 1.0), (L, 1)), blocking=False,
                           channel_names=tuple(f"c{k}" for k in range(K)))


def test_tiny_learning_rate_barely_moves_J_and_is_linear():
    mdp, theta0 = canonical()
    sched = flat_schedule(3, 40, 4)
    J0 = M.objective(mdp, theta0)
    for name in ("naive", "sync_oracle", "rac"):
        a = train(mdp, theta0, sched, name, CorrectorParams(), 20, 1e-6, np.random.default_rng(4))
        b = train(mdp, theta0, sched, name, CorrectorParams(), 20, 2e-6, np.random.default_rng(4))
        np.testing.assert_allclose(a.objective[:, 0], J0, rtol=1e-14)
        dJa, dJb = a.objective[:, -1] - J0, b.objective[:, -1] - J0
        assert np.abs(dJa).max() < 1e-4, name
        assert np.abs(dJa).min() > 0, name
        # First order in lr on the same trajectories: doubling lr doubles the change.
        np.testing.assert_allclose(dJb / dJa, 2.0, rtol=1e-3, err_msg=name)
        big = train(mdp, theta0, sched, name, CorrectorParams(), 20, 2.0, np.random.default_rng(4))
        assert np.abs(big.objective[:, -1] - J0).min() > 100 * np.abs(dJa).max(), name


def test_naive_learns_the_fast_optimum_sync_oracle_the_total_one():
    mdp, theta0 = canonical()
    opt_total, opt_fast = M.optimal_policy(mdp), M.optimal_policy(mdp, mdp.r_fast)
    assert not np.array_equal(opt_total, opt_fast)  # the slow reward changes the best action
    # The same MDP without slow reward: its optimum is the fast one, and naive's
    # update (which ignores the slow channels) is the same there.
    fast_only = M.TabularMDP(P=mdp.P, r_fast=mdp.r_fast, r_slow=np.zeros_like(mdp.r_slow), gamma=mdp.gamma,
                             start=mdp.start)
    sched = flat_schedule(8, 300, 8)
    lr, T = 2.0, 50
    naive = train(mdp, theta0, sched, "naive", CorrectorParams(), T, lr, np.random.default_rng(1))
    naive_f = train(fast_only, theta0, sched, "naive", CorrectorParams(), T, lr, np.random.default_rng(1))
    sync = train(mdp, theta0, sched, "sync_oracle", CorrectorParams(), T, lr, np.random.default_rng(1))
    d0 = naive.distance[:, 0].mean()
    assert sync.distance[:, 0].mean() == d0
    # naive approaches the fast optimum and stays far from the total one
    assert naive_f.distance[:, -1].mean() < 0.5 * naive_f.distance[:, 0].mean()
    assert naive.distance[:, -1].mean() > 0.85 * d0
    # the sync oracle approaches the total-reward optimum
    assert sync.distance[:, -1].mean() < 0.25 * d0
    assert (sync.distance[:, -1] < naive.distance[:, -1]).all()
    assert sync.objective[:, -1].mean() > naive.objective[:, -1].mean()
    assert (sync.objective[:, -1] > sync.objective[:, 0]).all()


# --------------------------------------------------------------------------
# 3. Wall-clock and recording through run.run.


def test_training_wallclock_and_recording_through_run():
    steps, lanes, batch = 7, 3, 2
    base = default_config("~scenario")  # the learner's and corrector's other knobs: conf/'s defaults
    base.name, base.seed = "t", 6
    # a deterministic clock (6 + 1 + 0.1 + 2 s a step) on the lanes engine
    base.pipeline = PipelineConf(steps=steps, warmup_steps=None, batch_size=batch, engine="lanes",
                                 **det_phases(6.0, 1.0, 0.1, 2.0), channels={
        "verifier": ChannelConf(latency=LatencyConf(kind="lognormal", mean=12.0), workers=2, max_delay=3),
        "judge": ChannelConf(kernel=[0.2, 0.5, 0.2]),
    })
    base.corrector.names = ["naive", "wait_for_slow", "rac", "sync_oracle"]
    base.learner.horizon, base.learner.trials, base.learner.bootstrap = 8, 4, 0
    base.learner.train = TrainConf(enabled=True, lanes=lanes, lr=1.0, each_cell=False)
    base.output = OutputConf(plots=False, progress=False)
    cfg = scenario(OmegaConf.structured(base))  # typed as a composed config, then the config boundary
    res = R.run(cfg)
    names = BS.corrector_names(cfg)
    scheds = BS.simulate_schedules(cfg, lanes, "train_pipeline", names)
    mdp = BS.build_mdp(cfg)
    theta0 = M.canonical_theta(3, 2, seed=cfg.learner.theta_seed, scale=cfg.learner.theta_scale)
    J0 = M.objective(mdp, theta0)
    for name in names:
        cv = res.curves[name]
        assert cv.objective.shape == cv.distance.shape == cv.wallclock.shape == (lanes, steps + 1), name
        np.testing.assert_allclose(cv.objective[:, 0], J0, rtol=1e-14)
        sub = res.training[res.training["corrector"] == name]
        assert len(sub) == lanes * (steps + 1)
        for l in range(lanes):
            rows = sub[sub["lane"] == l]
            assert rows["step"].tolist() == list(range(steps + 1))
            np.testing.assert_array_equal(rows["J"].to_numpy(), cv.objective[l])
            np.testing.assert_array_equal(rows["wallclock_s"].to_numpy(), cv.wallclock[l])
    np.testing.assert_array_equal(res.curves["wait_for_slow"].wallclock, scheds["blocking"].step_start)
    np.testing.assert_array_equal(res.curves["naive"].wallclock, scheds["async"].step_start)
    np.testing.assert_array_equal(res.curves["rac"].wallclock, scheds["async"].step_start)
    # Waiting only ever adds time: every step of the blocking run is at least as long.
    wait = np.diff(res.curves["wait_for_slow"].wallclock, axis=1)
    free = np.diff(res.curves["naive"].wallclock, axis=1)
    assert (wait >= free - 1e-9).all() and (wait > free + 1e-9).any()
    row = res.results.set_index("corrector")
    for name in names:
        assert row.loc[name, "J_final"] == pytest.approx(res.curves[name].objective[:, -1].mean(), rel=1e-14)
