"""Explicit delay kernels Lambda[k, Delta]: from a latency law read in steps, the
configured kernels of a cell, the kernels a configuration predicts without
simulating it, and draining the results still in flight at the end.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import List, Optional

import numpy as np

from racsim.pipeline.draws import PipelineDraws
from racsim.pipeline.latency import build_latency
from racsim.config.schema import PHASES, LatencyConf, PipelineConf, phase_conf
from racsim.pipeline.schedule import INJECTED, PENDING, ArrivalSchedule

MAX_KERNEL_STEPS = 10_000


def distribution_kernel(conf: LatencyConf, key: str) -> List[float]:
    """P(round(X) = D) for D = 0, 1, ... from a latency distribution read in steps,
    up to the 1 - 1e-12 quantile or MAX_KERNEL_STEPS; the mass beyond never returns."""
    lat = build_latency(replace(conf, discrete=True), key)
    top = min(float(lat.quantile(1.0 - 1e-12)), MAX_KERNEL_STEPS)  # beyond: never returns
    grid = np.arange(int(math.ceil(top)) + 1, dtype=np.float64)
    cdf = lat.cdf(grid)
    pmf = np.diff(np.concatenate([[0.0], cdf]))
    return [float(x) for x in np.clip(pmf, 0.0, None)]


def nominal_kernel(pipeline: PipelineConf):
    """(K, D+1) configured kernels of ``pipeline.channels`` when every channel has one, else None."""
    rows = [list(ch.kernel) for ch in pipeline.channels.values() if ch.kernel is not None]
    if len(rows) != len(pipeline.channels):
        return None
    width = max(map(len, rows))
    return np.array([r + [0.0] * (width - len(r)) for r in rows])


def predicted_kernel(pipeline: PipelineConf, wait_timeout_s: Optional[float], blocking: bool = False) -> np.ndarray:
    """(K, D+1) delay kernel of every slow channel from the configuration alone: no
    queueing, no simulated schedule (the input of Theorem 2.1's prediction, eq.
    ``eq:thm-unbiased``, to set beside the simulated bias).

    A kernel channel: its configured kernel. A clock channel with a latency law X
    and a step of mean length s = sum of the phases' means, submitted a = generate
    + fast_score + submit into its step: Delta = max(1, ceil((a + X) / s)), the
    first later step that begins after the result is back. ``max_delay`` cuts
    the kernel (the rest is dropped); ``route_prob`` scales it (the unrouted share never
    has a result). ``blocking``: the optimizer waits, so a
    result lands at Delta = 0 unless it takes longer than
    ``wait_timeout_s`` (``corrector.wait_timeout_s``; for a kernel channel: Delta steps of s). NaN
    rows where no law predicts the delay: gpu_rm channels (batching and queues
    set it), every channel when the fast scorer runs on GPUs (``fast_rm``) or when a step's
    phases have a mean of 0 s.
    """
    p = pipeline
    means = {ph: float(build_latency(phase_conf(p, ph), f"pipeline.{ph}").mean()) for ph in PHASES}
    step = sum(means.values())
    offset = step - means["update"]
    timeout = wait_timeout_s
    rows = []
    for name, ch in p.channels.items():
        if ch.kind == "gpu_rm" or p.fast_rm is not None or not step > 0:  # a step of 0 s: no delay in steps
            rows.append(None)
            continue
        if ch.kernel is not None:
            pmf = np.asarray(list(ch.kernel), dtype=np.float64)
            if blocking:
                ok = np.arange(len(pmf)) * step <= (np.inf if timeout is None else timeout)
                rows.append(np.array([pmf[ok].sum()]) * ch.route_prob)
                continue
        else:
            lat = build_latency(ch.latency, f"pipeline.channels.{name}.latency")
            if blocking:
                rows.append(np.array([1.0 if timeout is None else float(lat.cdf(np.array([timeout]))[0])])
                            * ch.route_prob)
                continue
            reach = (offset + float(lat.quantile(1.0 - 1e-12))) / step  # inf or NaN past float range: the cap
            top = math.ceil(reach) if reach < MAX_KERNEL_STEPS else MAX_KERNEL_STEPS
            cdf = lat.cdf(np.arange(1, max(top, 1) + 1) * step - offset)  # P(Delta <= d), d = 1..top
            pmf = np.diff(np.concatenate([[0.0, 0.0], cdf]))  # Delta = 0 has no mass
        if ch.max_delay is not None:
            pmf = pmf[: ch.max_delay + 1]
        rows.append(np.clip(pmf, 0.0, None) * ch.route_prob)
    width = max((len(r) for r in rows if r is not None), default=1)
    return np.array([np.full(width, np.nan) if r is None else np.pad(r, (0, width - len(r))) for r in rows])


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
