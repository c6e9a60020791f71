"""Explicit delay kernels Lambda[k, Delta]: from a latency law read in steps, the
configured kernels of a cell, and draining the results still in flight at the end.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import List

import numpy as np
from omegaconf import DictConfig, OmegaConf

from racsim.pipeline.draws import PipelineDraws
from racsim.pipeline.latency import build_latency
from racsim.pipeline.schedule import INJECTED, PENDING, ArrivalSchedule

MAX_KERNEL_STEPS = 10_000


def distribution_kernel(conf, key: str) -> List[float]:
    """P(round(X) = D) for D = 0, 1, ... from a latency distribution read in steps,
    up to the 1 - 1e-12 quantile or MAX_KERNEL_STEPS; the mass beyond never returns."""
    conf = OmegaConf.to_object(conf) if isinstance(conf, DictConfig) else conf
    lat = build_latency(replace(conf, discrete=True), key)
    top = min(float(lat.quantile(1.0 - 1e-12)), MAX_KERNEL_STEPS)  # beyond: never returns
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


def drain(sched: ArrivalSchedule, draws: PipelineDraws) -> ArrivalSchedule:
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
