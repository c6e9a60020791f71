"""Static mode: the paper's own bias experiment on the tabular MDP.

The paper (rac-paper.tex, "Empirical Demonstration" and the appendices on the
K-sweep, the heavy-tail stress and MDP-size scaling) fixes the policy, draws
one rollout of horizon T per trial, and lets every slow result land with its
corrector's weight at its delay: nothing is lost because a run ends. A trial's
estimate is the score-function gradient of the fast return plus, per slow
channel k, the channel's gradient times the corrector's weight c_k at the
trial's delay Delta_k (eq. 1, identity actor rho = 1):

    g_hat = g_fast + sum_k c_k(Delta_k) g_k,    Delta_k ~ Lambda[k, .]

The delays are independent of the trajectory, so the exact expectation is
G_fast + sum_k E[c_k] G_k with G the finite-T expectation per reward channel
and E[c_k] = sum_D Lambda[k, D] c_k(D) (+ the lost mass times the weight of a
lost result: 0, or 1 for the schedule-free sync oracle). Bias is
||E[g_hat] - g*|| against the stationary true gradient g*, as in
racsim.learner.bias.

The paper reports ratios of Monte-Carlo biases at 1000 trials; their
denominators sit near the noise floor. :func:`replicate_biases` gives the
sampling distribution of that procedure: replicates centred on the exact
expectation with trajectory deviations resampled from a pool.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np

from racsim.learner import mdp as M
from racsim.learner.correctors import BLOCKING, SCHEDULE_FREE, CorrectorParams, correction_weight
from racsim.learner.rollouts import discounted_returns, sample_trajectories, score_gradient
from racsim.pipeline.schedule import DROPPED, INJECTED

__all__ = [
    "delay_weights",
    "expected_weights",
    "trial_weights",
    "channel_gradients",
    "static_exact",
    "static_estimates",
    "bias_of_mean",
    "replicate_biases",
]


def delay_weights(name: str, kernel: np.ndarray, params: CorrectorParams,
                  row_normalize: bool = False) -> np.ndarray:
    """(K, D+2): the corrector's weight at each delay 0..D of ``kernel`` (K, D+1), and, in
    the last column, the weight of a result that never lands. With ``row_normalize``
    a schedule-driven corrector's weights of channel k are scaled by 1 / sum_D
    Lambda[k, D] c(D) (Theorem 2.1's condition R; 1 where that mass is 0)."""
    lam = np.asarray(kernel, dtype=np.float64)
    K, width = lam.shape
    delay = np.broadcast_to(np.arange(-1, width), (K, width + 1))
    status = np.where(delay >= 0, INJECTED, DROPPED)
    w = correction_weight(name, delay, status, None, params)
    w = np.concatenate([w[:, 1:], w[:, :1]], axis=1)  # landed 0..D, then lost
    if row_normalize and name not in SCHEDULE_FREE and name not in BLOCKING:
        mass = (lam * w[:, :-1]).sum(axis=1)
        w = w * np.where(mass > 0, 1.0 / np.where(mass > 0, mass, 1.0), 1.0)[:, None]
    return w


def expected_weights(weights: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """(K,) E[c_k] = sum_D Lambda[k, D] c_k(D) + (1 - sum_D Lambda[k, D]) c_k(lost)."""
    lam = np.asarray(kernel, dtype=np.float64)
    lost = np.clip(1.0 - lam.sum(axis=1), 0.0, None)
    return (lam * weights[:, :-1]).sum(axis=1) + lost * weights[:, -1]


def trial_weights(weights: np.ndarray, delays: np.ndarray) -> np.ndarray:
    """(n, K) c_k(Delta_k) per trial: ``weights`` (K, D+2) from :func:`delay_weights`
    looked up at ``delays`` (n, K) (-1: the last, "lost" column)."""
    K = weights.shape[0]
    col = np.where(delays >= 0, delays, weights.shape[1] - 1)
    return weights[np.arange(K)[None], col]


def channel_gradients(mdp: M.TabularMDP, theta: np.ndarray, n: int, horizon: int,
                      rng: np.random.Generator, fast_noise_std: float = 0.0) -> np.ndarray:
    """(n, K+1, S*A) per-trajectory score-function gradients (1/T) sum_t grad log pi G_t of
    each reward channel (0: fast, with N(0, fast_noise_std^2) noise on every step's
    fast reward; 1..K: slow), on n one-rollout trials of horizon T."""
    S, A = mdp.n_states, mdp.n_actions
    pi = M.softmax_policy(theta)
    states, actions = sample_trajectories(mdp, pi, n, horizon, rng, time_major=True)  # (T, n)
    table = np.concatenate([mdp.r_fast[None], mdp.r_slow])  # (K+1, S, A)
    r = table[:, states, actions]  # (K+1, T, n)
    if fast_noise_std > 0:
        r[0] += fast_noise_std * rng.standard_normal((horizon, n))
    G = discounted_returns(r, mdp.gamma, axis=1)
    return np.ascontiguousarray(score_gradient(states, actions, G, pi, time_major=True).reshape(n, -1, S * A))


def static_exact(channel_exact: np.ndarray, mean_weight: np.ndarray) -> np.ndarray:
    """E[g_hat] = G_fast + sum_k E[c_k] G_k; ``channel_exact`` (K+1, S*A) from
    :func:`racsim.learner.mdp.finite_horizon_expectation`, ``mean_weight`` (K,)."""
    return channel_exact[0] + np.asarray(mean_weight) @ channel_exact[1:]


def static_estimates(grads: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(n, S*A) g_hat = g_fast + sum_k c_k g_k per trial; ``grads`` (n, K+1, S*A), ``weights`` (n, K)."""
    return grads[:, 0] + np.einsum("nk,nks->ns", weights, grads[:, 1:])


def bias_of_mean(estimates: np.ndarray, target: np.ndarray, axis: int = 0) -> float:
    """||mean(estimates) - g*||, the Monte-Carlo bias of a set of trials."""
    return float(np.linalg.norm(np.asarray(estimates).mean(axis=axis) - target))


def replicate_biases(pool: Dict[str, np.ndarray], exact: Dict[str, np.ndarray], target: np.ndarray,
                     trials: int, replications: int, rng: np.random.Generator) -> Dict[str, np.ndarray]:
    """(replications,) Monte-Carlo biases ||mean of ``trials`` trials - g*|| per corrector,
    as the paper's procedure would give them on fresh draws: each replicate is the exact
    expectation plus the mean deviation of ``trials`` trials resampled (with
    replacement) from ``pool`` (name -> (N, S*A) estimates), centred on the pool's mean.
    One resample serves every corrector (common random numbers, as in one run)."""
    N = next(iter(pool.values())).shape[0]
    idx = rng.integers(0, N, size=(replications, trials)) + N * np.arange(replications)[:, None]
    counts = np.bincount(idx.ravel(), minlength=replications * N).reshape(replications, N) / trials
    out = {}
    for name, est in pool.items():
        dev = est - est.mean(axis=0)
        out[name] = np.linalg.norm(exact[name] - target + counts @ dev, axis=1)
    return out


def reductions(biases: Dict[str, np.ndarray], baseline: str = "naive") -> Dict[str, np.ndarray]:
    """Per-corrector ratio bias(baseline) / bias(corrector), elementwise (inf where 0)."""
    base = np.asarray(biases[baseline], dtype=np.float64)
    out = {}
    for name, b in biases.items():
        b = np.asarray(b, dtype=np.float64)
        out[name] = np.divide(base, b, out=np.full(np.broadcast_shapes(base.shape, b.shape), np.inf),
                              where=b > 0)
    return out


def names_first(names: Sequence[str], first: str = "naive") -> List[str]:
    """``names`` with ``first`` at the front (the reference of every ratio)."""
    names = list(names)
    return [first] + [n for n in names if n != first]


def summarize_static(estimates: Dict[str, np.ndarray], exact: Dict[str, np.ndarray], target: np.ndarray,
                     replicates: Optional[Dict[str, np.ndarray]] = None) -> Dict[str, dict]:
    """Headline columns of a static cell per corrector: bias_mc, mc_se, bias_exact, the
    replication interval of the MC bias (bias_ci_lo/hi: 2.5/97.5% of the replicates),
    reduction_mc and reduction_exact against naive, and the replication interval of
    reduction_mc (reduction_rep_lo/hi) with its replicates' mean and s.d."""
    rows: Dict[str, dict] = {}
    for name, est in estimates.items():
        n = est.shape[0]
        rows[name] = {
            "bias_mc": bias_of_mean(est, target),
            "mc_se": float(np.sqrt(est.var(axis=0, ddof=1).sum() / n)) if n > 1 else float("nan"),
            "bias_exact": float(np.linalg.norm(exact[name] - target)),
        }
        if replicates is not None:
            rows[name]["bias_ci_lo"], rows[name]["bias_ci_hi"] = map(float, np.percentile(replicates[name], [2.5, 97.5]))
    if "naive" in rows:
        mc = reductions({k: v["bias_mc"] for k, v in rows.items()})
        ex = reductions({k: v["bias_exact"] for k, v in rows.items()})
        rep = reductions(replicates) if replicates is not None else None
        for name, row in rows.items():
            row["reduction_mc"], row["reduction_exact"] = float(mc[name]), float(ex[name])
            if rep is not None:
                r = rep[name]
                row["reduction_rep_lo"], row["reduction_rep_hi"] = map(float, np.percentile(r, [2.5, 97.5]))
                finite = r[np.isfinite(r)]
                row["reduction_rep_mean"] = float(finite.mean()) if finite.size else float("inf")
                row["reduction_rep_sd"] = float(finite.std(ddof=1)) if finite.size > 1 else float("nan")
    return rows
