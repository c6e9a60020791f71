"""The static study (``study.mode=static`` or ``both``): the paper's own experiment
on every cell of a study grid (racsim/learner/static.py), one row per corrector.

Per cell: a fixed policy, ``learner.trials`` one-rollout trials of horizon T, each
slow result landing with its corrector's weight at a delay drawn from its
channel's kernel; the exact expectation beside the Monte-Carlo figure; and
``study.replications`` replications of that Monte Carlo (the interval of the
reduction the paper's procedure yields at its trial count). The trial stream is
seeded by (seed, learner.mdp_seed), so cells of one MDP and Monte-Carlo seed that
differ only in delays or correctors share their trajectories, and their
replications share their resamples: per-replication ratios can be averaged over
cells (the paper's aggregation) from ``static_replicates.parquet``.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pandas as pd

from racsim.analyses.bias_study import with_values, build_mdp, corrector_names, corrector_params
from racsim.errors import ConfigError
from racsim.learner import mdp as M
from racsim.learner import static as ST
from racsim.pipeline.draws import draw_kernel_delays
from racsim.pipeline.kernels import nominal_kernel
from racsim.progress import Progress
from racsim.seeds import rng_for


def draw_delays(kernel: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, K) delays, one per trial and channel, Delta_k ~ Lambda[k, .] (the pipeline's
    kernel draw, channel by channel); -1 where the result never lands (missing mass)."""
    lam = np.asarray(kernel, dtype=np.float64)
    return np.stack([draw_kernel_delays(list(row), rng, int(n)) for row in lam], axis=1).reshape(int(n), len(lam))


def static_cell(cfg: Any) -> Tuple[pd.DataFrame, pd.DataFrame]:
    """One cell: (results rows, one per corrector; replicate biases, long format)."""
    kernel = nominal_kernel(cfg.pipeline)
    if kernel is None:
        raise ConfigError("study.mode", cfg.study.mode,
                          "pipeline, unless every channel has a delay kernel (pipeline.delay_steps, "
                          "pipeline.delay_distribution or pipeline.channels.NAME.kernel): the static "
                          "mode draws each result's delay from its channel's kernel")
    lr, names, params = cfg.learner, corrector_names(cfg), corrector_params(cfg)
    mdp = build_mdp(cfg)
    theta = M.canonical_theta(lr.n_states, lr.n_actions, seed=lr.theta_seed, scale=lr.theta_scale)
    S, A, K = mdp.n_states, mdp.n_actions, mdp.n_channels
    table = np.concatenate([mdp.r_fast[None], mdp.r_slow])
    channel_exact = M.finite_horizon_expectation(mdp, theta, lr.horizon, table).reshape(K + 1, S * A)
    target = M.true_gradient(mdp, theta).ravel()
    rng = rng_for(cfg.seed, "static", lr.mdp_seed)
    grads = ST.channel_gradients(mdp, theta, lr.trials, lr.horizon, rng, lr.fast_noise_std)
    delays = draw_delays(kernel, lr.trials, rng)
    exact, est = {}, {}
    for name in names:
        w = ST.delay_weights(name, kernel, params, cfg.corrector.row_normalize)
        exact[name] = ST.static_exact(channel_exact, ST.expected_weights(w, kernel))
        est[name] = ST.static_estimates(grads, ST.trial_weights(w, delays))
    reps = None
    if cfg.study.replications:
        reps = ST.replicate_biases(est, exact, target, lr.trials, cfg.study.replications,
                                   rng_for(cfg.seed, "static_replication", lr.mdp_seed))
    summary = ST.summarize_static(est, exact, target, reps)
    rows = [{"scenario": cfg.name, "study": cfg.study.paper or "", "mode": "static", "corrector": name, "K": K,
             "trials": lr.trials, "seed": cfg.seed, "delay_mean": _kernel_mean(kernel),
             **summary[name]} for name in names]
    rep_table = pd.DataFrame()
    if reps is not None:
        R = cfg.study.replications
        rep_table = pd.DataFrame({"corrector": np.repeat(names, R), "replication": np.tile(np.arange(R), len(names)),
                                  "bias_mc": np.concatenate([reps[n] for n in names])})
    return pd.DataFrame(rows), rep_table


def _kernel_mean(kernel: np.ndarray) -> float:
    """Mean delay of the landed results, over the channels (steps)."""
    lam = np.asarray(kernel)
    mass = lam.sum()
    return float((lam * np.arange(lam.shape[1])).sum() / mass) if mass > 0 else float("nan")


def static_key(cfg: Any) -> tuple:
    """What fixes a cell's static rows: the learner, the correctors, the kernels, the seeds.
    Grid cells with equal keys (e.g. pipeline.drain true/false) give one set of rows."""
    kernel = nominal_kernel(cfg.pipeline)
    return (repr(cfg.learner), repr(cfg.corrector), None if kernel is None else kernel.tobytes(),
            None if kernel is None else kernel.shape, cfg.seed, cfg.study.replications, cfg.name)


def run_static_study(cells: List[tuple], progress: Optional[Progress] = None) -> Dict[str, pd.DataFrame]:
    """Every distinct cell (values, config) of a grid (:func:`static_key`): {"results": rows
    with the grid values in front, "replicates": the replications' biases likewise}. ``progress``:
    the phase ``static study``, a unit per distinct cell."""
    t0 = time.perf_counter()
    tables, reps, seen = [], [], set()
    keys = [static_key(ccfg) for _, ccfg in cells]
    if progress is not None:
        progress.start("static study", len(set(keys)), "cell")
    for i, ((values, ccfg), key) in enumerate(zip(cells, keys)):
        if key in seen:  # differs only in what the static reading ignores (drain, steps, clock)
            continue
        seen.add(key)
        if len(cells) > 1:
            values = {"cell": i, **values}
        rows, rep = static_cell(ccfg)
        tables.append((values, rows))
        if len(rep):
            reps.append((values, rep))
        if progress is not None:
            progress.advance()
    out = {"results": with_values(tables), "seconds": time.perf_counter() - t0}
    out["replicates"] = with_values(reps) if reps else pd.DataFrame()
    return out
