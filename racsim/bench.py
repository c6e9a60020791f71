"""``racsim-bench``: speed figures, each as a ratio against a baseline timed in the same run.

1. Bias benchmark on the canonical 3x2 cell: racsim's vectorised trajectory
   sampling + score-function gradients vs a plain per-trajectory Python loop
   (the way a reference implementation is usually written), trajectories/s.
2. Pipeline: the lanes engine vs the SimPy engine of record on the default
   scenario's pipeline, trials/s (both produce the same schedule).
3. The default scenario end to end (``racsim`` with no arguments), seconds.

Machines are noisy: compare the ratios, not the absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Callable, Dict

import numpy as np

from . import mdp as M


def _best_of(fn: Callable[[], object], repeat: int) -> float:
    best = np.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def loop_gradients(mdp: M.TabularMDP, pi: np.ndarray, n: int, horizon: int, rng: np.random.Generator) -> np.ndarray:
    """Baseline: one trajectory at a time, one step at a time, in Python."""
    S, A = pi.shape
    rewards = mdp.reward_total
    out = np.zeros((n, S, A))
    for i in range(n):
        s = rng.choice(S, p=mdp.start)
        traj = []
        for _ in range(horizon):
            a = rng.choice(A, p=pi[s])
            traj.append((s, a, rewards[s, a]))
            s = rng.choice(S, p=mdp.P[s, a])
        G = 0.0
        for s, a, r in reversed(traj):
            G = r + mdp.gamma * G
            out[i, s] -= pi[s] * G / horizon
            out[i, s, a] += G / horizon
    return out


def vector_gradients(mdp: M.TabularMDP, pi: np.ndarray, n: int, horizon: int, rng: np.random.Generator):
    states, actions = M.sample_trajectories(mdp, pi, n, horizon, rng)
    r = mdp.reward_total[states, actions]
    return M.trajectory_gradients(states, actions, M.discounted_returns(r, mdp.gamma), pi)


def bench_bias(n_vec: int, n_loop: int, horizon: int = 50) -> Dict[str, float]:
    mdp = M.make_mdp(3, 2, mdp_seed=1337, shares=(0.5, 0.5))
    pi = M.softmax_policy(M.canonical_theta(3, 2))
    t_loop = _best_of(lambda: loop_gradients(mdp, pi, n_loop, horizon, np.random.default_rng(0)), 1)
    t_vec = _best_of(lambda: vector_gradients(mdp, pi, n_vec, horizon, np.random.default_rng(0)), 3)
    loop_rate, vec_rate = n_loop / t_loop, n_vec / t_vec
    return {
        "bias_loop_traj_per_s": loop_rate,
        "bias_vector_traj_per_s": vec_rate,
        "bias_speedup": vec_rate / loop_rate,
        "cell_1000_traj_s": 1000 / vec_rate,
    }


def _default_cfg(overrides=()):
    from hydra import compose, initialize_config_module

    from .config import register_configs

    register_configs()
    with initialize_config_module(version_base="1.3", config_module="racsim.conf"):
        return compose("config", overrides=list(overrides))


def bench_pipeline(trials: int) -> Dict[str, float]:
    from . import pipeline

    cfg = _default_cfg()
    draws = pipeline.draw(cfg.pipeline, trials, np.random.default_rng(0))
    t_simpy = _best_of(lambda: pipeline.run_simpy(draws, False), 1)
    t_lanes = _best_of(lambda: pipeline.run_lanes(draws, False), 3)
    return {
        "pipeline_simpy_trials_per_s": trials / t_simpy,
        "pipeline_lanes_trials_per_s": trials / t_lanes,
        "pipeline_speedup": t_simpy / t_lanes,
    }


def bench_default() -> Dict[str, float]:
    from .run import run

    cfg = _default_cfg(["output.plots=false"])
    t0 = time.perf_counter()
    res = run(cfg)
    return {"default_scenario_s": time.perf_counter() - t0, "default_trajectories": float(res.bias.trajectories)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="racsim-bench", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    n_vec, n_loop, trials = (20_000, 200, 50) if args.quick else (200_000, 2_000, 300)
    figures: Dict[str, float] = {}
    figures.update(bench_bias(n_vec, n_loop))
    figures.update(bench_pipeline(trials))
    if not args.quick:
        figures.update(bench_default())
    width = max(map(len, figures))
    for k, v in figures.items():
        print(f"{k:<{width}}  {v:,.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
