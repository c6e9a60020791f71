"""From completion times to what the learner sees: the step at which each slow result
lands, its delay in steps and its status (injected, dropped or pending), assembled
into an :class:`~racsim.pipeline.schedule.ArrivalSchedule`. Shared by both engines.
"""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np

from racsim.pipeline.draws import PipelineDraws
from racsim.pipeline.schedule import DROPPED, INJECTED, PENDING, UNROUTED, ArrivalSchedule


def _async_landing(draws: "PipelineDraws", names, step_start: np.ndarray,
                   end: Dict[str, np.ndarray], cut: Optional[Dict[str, np.ndarray]] = None,
                   failed: Optional[Dict[str, np.ndarray]] = None) -> Dict[str, np.ndarray]:
    """Landing steps of a non-blocking run: kernel channels at t + Delta (-1: lost),
    clock channels at the first later step that begins after completion; a result
    cancelled by ``cancel_on_drop`` (``cut``) or lost to a server failure (``failed``) never lands (-1)."""
    steps = step_start.shape[1] - 1
    land = {}
    for nm in names:
        if nm in draws.kernel_channels:
            k = draws.service[nm]
            land[nm] = np.where(k < 0, -1, np.arange(steps)[None, :, None] + k)
        else:
            land[nm] = landing_step(step_start[:, :steps], end[nm])
        if cut is not None and nm in draws.cancel:
            land[nm] = np.where(cut[nm], -1, land[nm])
        if failed and nm in failed:
            land[nm] = np.where(failed[nm], -1, land[nm])
    return land


def drop_deadline(step_start: np.ndarray, t: int, max_delay: Optional[int]) -> np.ndarray:
    """(lanes,) the second after which step t's results can no longer land within D steps:
    the start of step t + D (a result completing later lands at t + D + 1 or after, and is
    dropped there); inf where no drop happens within the run (no D, or t + D + 1 past the last step)."""
    steps = step_start.shape[1] - 1
    if max_delay is None or t + max_delay + 1 > steps - 1:
        return np.full(step_start.shape[0], np.inf)
    return step_start[:, t + max_delay]


def landing_step(step_start: np.ndarray, completion: np.ndarray) -> np.ndarray:
    """Index of the first step after the result's own that begins at or after ``completion``.

    ``step_start``: (lanes, steps) non-decreasing; ``completion``: (lanes, steps,
    batch), the result of step t being usable from step t + 1 on (step t has
    already committed its update). Returns ``steps`` where no step of the run
    begins after it (inf included).
    """
    n, steps = step_start.shape
    flat = completion.reshape(n, -1)
    out = np.empty(flat.shape, dtype=np.int64)
    for i in range(n):  # one searchsorted per lane: O(jobs log steps)
        out[i] = np.searchsorted(step_start[i], flat[i], side="left")
    earliest = np.arange(1, steps + 1)[None, :, None]
    return np.maximum(out.reshape(completion.shape), earliest)


def classify(land: np.ndarray, max_delay: Optional[int], n_steps: int):
    """Status and delay of each result from the step it lands at (async pipeline).

    ``land``: (lanes, steps, batch) landing step, ``>= n_steps`` if after the
    run, ``-1`` if the result is lost. Injected iff it lands within the run and
    within D steps; dropped iff lost, or its age passes D while the run is still
    going (the drop happens at step t + D + 1); otherwise pending at the end.
    """
    t = np.arange(n_steps)[None, :, None]
    lost = land < 0
    age = land - t
    limit = np.inf if max_delay is None else max_delay
    injected = ~lost & (land <= n_steps - 1) & (age <= limit)
    dropped = lost | (~injected & (age > limit) & (t + limit + 1 <= n_steps - 1))
    status = np.full(land.shape, PENDING, dtype=np.int8)
    status[injected] = INJECTED
    status[dropped] = DROPPED
    delay = np.where(injected, age, -1).astype(np.int64)
    return delay, status


def _assemble(draws, names, step_start, land, blocking, submit, start, end, gpu_log=None, cut=None,
              pool_log=None, failed=None, background=None) -> ArrivalSchedule:
    steps = step_start.shape[1] - 1
    delays, statuses = [], []
    for name in names:
        if blocking:
            ok = land[name] >= 0
            d = np.where(ok, 0, -1).astype(np.int64)
            s = np.where(ok, INJECTED, DROPPED).astype(np.int8)
        else:
            d, s = classify(land[name], draws.max_delay[name], steps)
        if name in draws.routed:
            d = np.where(draws.routed[name], d, -1)
            s = np.where(draws.routed[name], s, UNROUTED).astype(np.int8)
        delays.append(d)
        statuses.append(s)
    return ArrivalSchedule(
        delay=np.stack(delays, axis=-1),
        status=np.stack(statuses, axis=-1),
        step_start=step_start,
        blocking=blocking,
        channel_names=tuple(names),
        submit_time=np.stack([submit[nm] for nm in names], axis=-1),
        service_start=np.stack([start[nm] for nm in names], axis=-1),
        completion=np.stack([end[nm] for nm in names], axis=-1),
        gpu_batches=gpu_log or None,
        cancelled=np.stack([cut[nm] for nm in names], axis=-1) if draws.cancel else None,
        phase=draws.phase,
        pools=pool_log or None,
        failed=np.stack([failed.get(nm, np.zeros(land[nm].shape, dtype=bool)) for nm in names], axis=-1)
        if failed else None,
        faults=dict(draws.faults) or None,
        background=background or None,
    )
