"""Training loop: theta updated by the corrected gradient every optimizer step.

Each lane is one training run on the tabular MDP with its own softmax policy.
At step t the lane samples ``batch`` trajectories under its current policy and
takes a gradient step on the fast returns plus every slow correction that
lands at t according to the arrival schedule: the trajectory's slow return for
that channel times the corrector's weight, with the per-decision clipped
ratio pi_t(a|s) / pi_behaviour(a|s) (paper eq. 1), scored under the current
policy. Wall-clock comes from the same schedule, so wait-for-slow pays for its
waiting here. Reports the true objective J(theta) (long-run average reward)
and the l2 distance of pi_theta to the optimal policy after every step.

With generation lags (the schedule's ``lag``), sample b of step t is drawn by the
lane's own policy of version t - L (its policies kept, the lag cut at t), and a
row's rollout-axis corrector weighs each decision of its fast return at step t
and of its slow corrections at the step they land (racsim.learner.correctors,
rollout_weight; a sample past drop's version cap is not trained on at all).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import numpy as np

from racsim.learner import mdp as M
from racsim.learner.bias import schedule_for
from racsim.learner.drift import behaviour_version, effective_lag
from racsim.learner.correctors import (
    CorrectorParams,
    adaptive_tau_age,
    correction_weight,
    kept,
    rollout_weight,
    split_name,
)
from racsim.learner.rollouts import (
    discounted_returns,
    sample_trajectories,
    score_gradient,
)
from racsim.pipeline.schedule import ArrivalSchedule


@dataclass
class TrainCurve:
    """Per lane and step (lanes, steps + 1): simulated seconds, J(theta), ||pi - pi*||."""

    wallclock: np.ndarray
    objective: np.ndarray
    distance: np.ndarray


def landing_step(sched: ArrivalSchedule, name: str) -> np.ndarray:
    """Step at which each (lane, step, sample, channel) correction enters an update, -1 if never."""
    if name == "naive":
        return np.full(sched.delay.shape, -1)
    if name == "sync_oracle":
        return np.broadcast_to(np.arange(sched.n_steps)[None, :, None, None], sched.delay.shape)
    origin = np.arange(sched.n_steps)[None, :, None, None]
    return np.where(sched.injected, origin + sched.delay, -1)


def _record(mdp, theta, optimal):
    pi = M.softmax_policy(theta)
    J = M.objective(mdp, theta)  # every lane's at once (the same bits as one by one)
    dist = np.linalg.norm((pi - optimal[None]).reshape(len(theta), -1), axis=1)
    return J, dist


def train(
    mdp: M.TabularMDP,
    theta0: np.ndarray,
    sched: ArrivalSchedule,
    name: str,
    params: CorrectorParams,
    horizon: int,
    lr: float,
    rng: np.random.Generator,
    fast_noise_std: float = 0.0,
    copies: int = 1,
) -> TrainCurve:
    """Train ``sched.n_trials`` lanes with row ``name`` (a corrector, or one combined with a rollout-axis
    corrector) for ``sched.n_steps`` steps. ``copies`` > 1: the lanes are that many runs' lanes one after
    the other (:func:`stack_lanes`) that share ``rng``'s draws, each run's as if trained alone."""
    L, N, B, K = sched.delay.shape
    T = horizon
    name, rollout = split_name(name)
    rewards = np.concatenate([mdp.r_fast[None], mdp.r_slow])  # (C, S, A)
    optimal = M.optimal_policy(mdp)
    land = landing_step(sched, name)
    delay = np.where(name == "sync_oracle", 0, sched.delay)
    # rac_adaptive's tau_age per result, from the results landed before the update that uses it
    tau = adaptive_tau_age(sched.delay, sched.status, params) if name == "rac_adaptive" else None
    lagged = sched.lag is not None
    if lagged:  # each sample's behaviour version t - L and whether the rollout corrector keeps it
        version = behaviour_version(sched)
        keep = kept(rollout, effective_lag(sched), params).astype(np.float64)
        policies = np.empty((N, L) + theta0.shape)  # the lane's policy of every version so far
    theta = np.repeat(theta0[None].astype(np.float64), L, axis=0)
    states = np.zeros((L, N, B, T), dtype=np.int64)
    actions = np.zeros((L, N, B, T), dtype=np.int64)
    behaviour = np.ones((L, N, B, T))
    slow = np.zeros((L, N, B, K, T))
    J, dist = np.empty((L, N + 1)), np.empty((L, N + 1))
    J[:, 0], dist[:, 0] = _record(mdp, theta, optimal)
    lane_of = np.repeat(np.arange(L), B)
    rows = np.arange(L * B)[:, None]
    for t in range(N):
        pi = M.softmax_policy(theta)  # (L, S, A)
        if lagged:
            policies[t] = pi
            v = version[:, t].reshape(-1)  # lane-major, as lane_of
            s, a = sample_trajectories(mdp, policies[v, lane_of], L * B, T, rng, copies=copies)
            beh = policies[v, lane_of][rows, s, a]
        else:
            s, a = sample_trajectories(mdp, pi[lane_of], L * B, T, rng, copies=copies)
        r = rewards[:, s, a]
        if fast_noise_std > 0:
            r[0] = r[0] + fast_noise_std * np.tile(rng.standard_normal((L * B // copies, T)), (copies, 1))
        G = discounted_returns(r, mdp.gamma)  # (C, L*B, T)
        states[:, t], actions[:, t] = s.reshape(L, B, T), a.reshape(L, B, T)
        behaviour[:, t] = (beh if lagged else pi[lane_of[:, None], s, a]).reshape(L, B, T)
        slow[:, t] = G[1:].reshape(K, L, B, T).transpose(1, 2, 0, 3)
        # Corrections landing now: (lane, origin step, sample, channel).
        l_, o_, b_, k_ = np.nonzero(land == t)
        cs, ca = states[l_, o_, b_], actions[l_, o_, b_]
        ratio = pi[l_[:, None], cs, ca] / behaviour[l_, o_, b_]
        d = np.broadcast_to(delay[l_, o_, b_, k_][:, None], ratio.shape)
        st = np.broadcast_to(sched.status[l_, o_, b_, k_][:, None], d.shape)
        c = correction_weight(name, d, st, ratio, params,
                              tau_age=None if tau is None else tau[l_, o_, b_, k_][:, None])
        fast = G[0]
        if lagged:  # the rollout axis: each decision of a fast return now, and of a slow one landing now
            fast = fast * _stale_weight(rollout, policies, t, version[:, t].reshape(-1), lane_of, s, a, beh, params) \
                * keep[:, t].reshape(-1, 1)
            c = c * _stale_weight(rollout, policies, t, version[l_, o_, b_], l_, cs, ca, behaviour[l_, o_, b_],
                                  params) * keep[l_, o_, b_][:, None]
        grad = score_gradient(  # (L, S, A): each lane's sum over its rows
            np.concatenate([s, cs]),
            np.concatenate([a, ca]),
            np.concatenate([fast, c * slow[l_, o_, b_, k_]]),
            pi,
            lanes=np.concatenate([lane_of, l_]),
        )
        theta = theta + lr * grad / B
        J[:, t + 1], dist[:, t + 1] = _record(mdp, theta, optimal)
    return TrainCurve(wallclock=sched.step_start.copy(), objective=J, distance=dist)


def _stale_weight(rollout: str, policies: np.ndarray, t: int, version: np.ndarray, lane: np.ndarray,
                  states: np.ndarray, actions: np.ndarray, behaviour: np.ndarray, params: CorrectorParams) -> np.ndarray:
    """The rollout corrector's weight on each decision (rows x T) of samples generated by the lane's
    policy of ``version``, used at step t: pi_use = the lane's policy of version t, pi_prox = that of
    version max(version, t - 1) (racsim.learner.correctors.rollout_weight)."""
    rows = np.arange(len(lane))[:, None]
    use = policies[t, lane][rows, states, actions]
    prox = policies[np.maximum(version, t - 1), lane][rows, states, actions]
    return rollout_weight(rollout, use, behaviour, prox, params)


def train_all(mdp, theta0, schedules: Dict[str, ArrivalSchedule], names: List[str], params, horizon, lr, seed_seq,
              fast_noise_std=0.0, progress: Optional[Callable[[int], None]] = None,
              copies: int = 1) -> Dict[str, TrainCurve]:
    """One :func:`train` per corrector, each on its own child random stream; ``progress(1)`` after each
    (``copies``: :func:`train`'s)."""
    children = seed_seq.spawn(len(names))
    out = {}
    for name, child in zip(names, children):
        out[name] = train(mdp, theta0, schedule_for(name, schedules), name, params, horizon, lr,
                          np.random.default_rng(child), fast_noise_std, copies)
        if progress is not None:
            progress(1)
    return out


def stack_lanes(schedules: List[ArrivalSchedule]) -> ArrivalSchedule:
    """Several runs' schedules (of equal steps, batch and channels) as one, their lanes one after the other:
    what training reads of them (delays, statuses, the clock, the generation lags)."""
    first = schedules[0]
    lag = None if first.lag is None else np.concatenate([s.lag for s in schedules])
    return ArrivalSchedule(delay=np.concatenate([s.delay for s in schedules]),
                           status=np.concatenate([s.status for s in schedules]),
                           step_start=np.concatenate([s.step_start for s in schedules]),
                           blocking=first.blocking, channel_names=first.channel_names, lag=lag)


def split_lanes(curve: TrainCurve, copies: int) -> List[TrainCurve]:
    """The curves of each of ``copies`` runs trained together (:func:`stack_lanes`), in order."""
    return [TrainCurve(*(np.split(getattr(curve, f), copies)[i] for f in ("wallclock", "objective", "distance")))
            for i in range(copies)]
