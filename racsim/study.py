"""Studies: the bias benchmark over a grid of cells, in one process.

A scenario's ``study.grid`` maps config keys to lists of values; the cells are
their cartesian product (a key "a,b" takes tuples, so that values that belong
together move together). Cells that share the learner (MDP, policy, horizon,
trials, steps, batch and seed) are evaluated on the same trajectories, so a
grid over delay distributions or corrector knobs costs one trajectory pass
and its comparisons are paired (common random numbers).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import Any, Dict, List, Tuple

import numpy as np
from omegaconf import DictConfig, OmegaConf, open_dict

from . import pipeline
from .config import ChannelConf, ConfigError, validate
from .latency import build_latency
from .schedule import INJECTED, PENDING, ArrivalSchedule

Values = Dict[str, Any]


def expand(cfg: DictConfig) -> List[Tuple[Values, DictConfig]]:
    """The cells of ``cfg.study.grid`` (one cell, with no values, when it is empty),
    each resolved (:func:`resolve`) and validated. Accepts a :class:`RacsimConf` too."""
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.structured(cfg)
    grid = OmegaConf.to_container(cfg.study.grid, resolve=True) if cfg.study.grid else {}
    axes = []
    for key, values in grid.items():
        names = [k.strip() for k in key.split(",")]
        if not isinstance(values, list) or not values:
            raise ConfigError(f"study.grid.{key}", values, "a non-empty list of values")
        for name in names:
            if OmegaConf.select(cfg, name, default=_MISSING) is _MISSING:
                raise ConfigError(f"study.grid.{key}", name, "a config key (e.g. learner.mdp_seed)")
        for v in values:
            if len(names) > 1 and (not isinstance(v, list) or len(v) != len(names)):
                raise ConfigError(f"study.grid.{key}", v, f"a list of {len(names)} values per cell")
        axes.append((names, values))
    cells = []
    for combo in itertools.product(*[values for _, values in axes]):
        cell = cfg.copy()
        values: Values = {}
        with open_dict(cell):
            cell.study.grid = {}
        for (names, _), v in zip(axes, combo):
            vs = v if len(names) > 1 else [v]
            for name, value in zip(names, vs):
                OmegaConf.update(cell, name, value, merge=False)
                values[name] = value
        cells.append((values, resolve(cell)))
    return cells


_MISSING = object()


def resolve(cfg: DictConfig) -> DictConfig:
    """Turn the pipeline shortcuts into explicit channels, then validate.

    ``pipeline.delay_steps=[d1, ..., dK]``: K channels ch1..chK, equal shares,
    with deterministic delays of d_k steps (one-hot kernels).
    ``pipeline.delay_distribution``: every channel's kernel is the law of the
    rounded draw of that distribution, in steps (mass beyond the 1 - 1e-12
    quantile, if any, never returns).
    """
    p = cfg.pipeline
    if p.delay_steps is None and p.delay_distribution is None:
        validate(cfg)
        return cfg
    cfg = cfg.copy()
    p = cfg.pipeline
    if p.delay_steps is not None:
        steps = list(p.delay_steps)
        if len(p.channels):
            raise ConfigError("pipeline.delay_steps", steps, "null when pipeline.channels are given (use one or the other)")
        if not steps or any(not isinstance(d, int) or d < 0 for d in steps):
            raise ConfigError("pipeline.delay_steps", steps, "a non-empty list of integer delays >= 0 (steps)")
        p.channels = {f"ch{k + 1}": ChannelConf(kernel=_one_hot(d), share=1.0) for k, d in enumerate(steps)}
    if p.delay_distribution is not None:
        kernel = distribution_kernel(p.delay_distribution, "pipeline.delay_distribution")
        if not len(p.channels):
            raise ConfigError("pipeline.delay_distribution", "set", "channels to apply it to (pipeline.channels or delay_steps)")
        for ch in p.channels.values():
            ch.kernel = kernel
    p.delay_steps = None
    p.delay_distribution = None
    validate(cfg)
    return cfg


def _one_hot(d: int) -> List[float]:
    k = [0.0] * (d + 1)
    k[d] = 1.0
    return k


def distribution_kernel(conf, key: str) -> List[float]:
    """P(round(X) = D) for D = 0, 1, ... from a latency distribution read in steps."""
    conf = OmegaConf.to_object(conf) if isinstance(conf, DictConfig) else conf
    lat = build_latency(replace(conf, discrete=True), key)
    top = float(lat.quantile(1.0 - 1e-12))
    if not math.isfinite(top) or top > 100_000:
        raise ConfigError(key, top, "a distribution whose 1 - 1e-12 quantile is at most 100000 steps (set high)")
    grid = np.arange(int(math.ceil(top)) + 1, dtype=np.float64)
    cdf = lat.cdf(grid)
    pmf = np.diff(np.concatenate([[0.0], cdf]))
    return [float(x) for x in np.clip(pmf, 0.0, None)]


def nominal_kernel(cfg: DictConfig):
    """(K, D+1) configured kernels when every channel has one, else None."""
    rows = [list(ch.kernel) for ch in cfg.pipeline.channels.values() if ch.kernel is not None]
    if len(rows) != len(cfg.pipeline.channels):
        return None
    width = max(map(len, rows))
    return np.array([r + [0.0] * (width - len(r)) for r in rows])


def drain(sched: ArrivalSchedule, draws: pipeline.PipelineDraws) -> ArrivalSchedule:
    """Land the kernel channels' results still in flight at the end (within D)."""
    delay, status = sched.delay.copy(), sched.status.copy()
    for k, name in enumerate(sched.channel_names):
        if name not in draws.kernel_channels:
            continue
        d = draws.service[name]
        limit = np.inf if draws.max_delay[name] is None else draws.max_delay[name]
        late = (status[..., k] == PENDING) & (d >= 0) & (d <= limit)
        status[..., k][late] = INJECTED
        delay[..., k][late] = d[late]
    return replace(sched, delay=delay, status=status)


def learner_key(cfg: DictConfig) -> tuple:
    """What fixes a cell's trajectories: cells with equal keys share them."""
    lr, p = cfg.learner, cfg.pipeline
    shares = tuple(float(ch.share) for ch in p.channels.values())
    return (
        lr.kind, lr.topology, lr.n_states, lr.n_actions, lr.mdp_seed, lr.theta_seed, lr.theta_scale, lr.gamma,
        lr.horizon, lr.slow_bump, lr.fast_noise_std, lr.channel_noise_std, lr.trials, shares,
        p.steps, p.batch_size, cfg.seed,
    )
