"""Pipeline statistics from an arrival schedule: delays, queue waits, utilisation."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np
import pandas as pd

from racsim.pipeline.autoscale import billed_seconds
from racsim.pipeline.steady import in_system, verdict
from racsim.pipeline.schedule import DROPPED, INJECTED, PENDING, UNROUTED, ArrivalSchedule


def queue_workers(channels: Dict[str, Any]) -> Dict[str, Optional[int]]:
    """The workers each channel's results queue for: ``workers``, but None (no limit, no
    utilisation) for a kernel channel, whose kernel gives every delay whatever its workers."""
    return {n: None if ch.kernel is not None else ch.workers for n, ch in channels.items()}


def channel_stats(sched: ArrivalSchedule, workers: Dict[str, Optional[int]], warmup_steps: int = 0,
                  loads: Optional[Dict[str, float]] = None) -> pd.DataFrame:
    """One row per channel, in the steady state after ``warmup_steps`` (``pipeline.warmup_steps``):
    result counts, delay quantiles (steps), queue wait and sojourn (s) of the jobs submitted
    at steps >= warmup_steps, and utilisation over the window from that step's start to the
    run's end (busy seconds of every job inside the window, warm-up jobs included). ``loads``:
    each channel's offered load on all its servers (racsim.pipeline.draws.sampled_loads), as
    ``offered_load`` over the servers up where failures take some down (``availability``)."""
    rows = []
    w = int(warmup_steps)
    t0, t1 = sched.step_start[:, w], sched.step_start[:, -1]
    span = t1 - t0  # (trials,)
    for k, name in enumerate(sched.channel_names):
        st = sched.status[:, w:, :, k]
        d = sched.delay[:, w:, :, k][st == 0]
        sent = st != UNROUTED
        row = {"channel": name, "measured_from_step": w,
               "emitted": int(np.count_nonzero(sent)), "injected": int(np.count_nonzero(st == INJECTED)),
               "dropped": int(np.count_nonzero(st == DROPPED)), "pending": int(np.count_nonzero(st == PENDING)),
               "unrouted": int(st.size - np.count_nonzero(sent))}
        if sched.failed is not None:  # gpu_rm faults: results lost to a failure (among dropped), capacity up
            row["lost_to_failure"] = int(np.count_nonzero(sched.failed[:, w:, :, k]))
            tl = (sched.faults or {}).get(name)
            row["availability"] = float(np.mean(tl.up_fraction(t0, t1))) if tl is not None else float("nan")
        row["delay_mean_steps"] = float(d.mean()) if d.size else float("nan")
        for q, v in zip((50, 95, 99), _quantiles(d)):
            row[f"delay_p{q}_steps"] = v
        sub = sched.submit_time[:, w:, :, k]
        wait = (sched.service_start[:, w:, :, k] - sub)[sent]
        row["wait_mean_s"] = float(wait.mean()) if wait.size else float("nan")
        # without a queue (no workers limit) nothing ever waits: skip the quantile
        queued = workers.get(name) or name in (sched.gpu_batches or {})
        row["wait_p95_s"] = _quantiles(wait)[1] if queued else 0.0
        soj = sched.completion[:, w:, :, k] - sub
        back = np.isfinite(soj) & sent  # unrouted samples are never sent, lost results never complete, cancelled ones never come back
        if sched.cancelled is not None:
            back &= ~sched.cancelled[:, w:, :, k]
        soj = soj[back]
        row["sojourn_mean_s"] = float(soj.mean()) if soj.size else float("nan")
        for q, v in zip((50, 95, 99), _quantiles(soj)):
            row[f"sojourn_p{q}_s"] = v
        busy = busy_seconds(sched, k, workers.get(name), t0, t1)
        bg = (sched.background or {}).get(name)
        if bg is not None:  # other tenants' requests: counted apart (busy_seconds counts their busy seconds)
            row.update(background_row(bg, t0, t1))
        row["workers"] = workers.get(name) if busy is None else busy[1]
        # Busy seconds inside the measured window over server-seconds (NaN: no worker limit)
        row["utilisation"] = float("nan") if busy is None else float(np.mean(busy[0] / (busy[1] * span)))
        pool = (sched.pools or {}).get(name)
        if pool is not None:
            row.update(pool_row(sched, k, pool, t0, t1, w))
        if loads is not None:
            up = row.get("availability", float("nan"))
            up = 1.0 if np.isnan(up) else up  # a channel without faults (another one's failing) is always up
            row["offered_load"] = loads.get(name, float("nan")) / up if up > 0 else float("nan")
        row.update(stationarity(sched, k, w, queued=row["workers"] is not None))
        rows.append(row)
    return pd.DataFrame(rows)


def background_row(bg: Dict[str, np.ndarray], t0: np.ndarray, t1: np.ndarray) -> dict:
    """A channel's background requests that arrived inside the measured window [t0, t1] of their
    lane: their count (all trials), queue wait (mean, p95, s: to their service's or batch's
    start) and sojourn p95 (s: to their result)."""
    lane = bg["lane"]
    inside = (bg["arrival"] >= t0[lane]) & (bg["arrival"] <= t1[lane])
    wait = (bg["start"] - bg["arrival"])[inside]
    return {"background_jobs": int(np.count_nonzero(inside)),
            "background_wait_mean_s": float(wait.mean()) if wait.size else float("nan"),
            "background_wait_p95_s": _quantiles(wait)[1],
            "background_sojourn_p95_s": _quantiles((bg["end"] - bg["arrival"])[inside])[1]}


def stationarity(sched: ArrivalSchedule, k: int, warmup: int, queued: bool = True) -> dict:
    """Is channel ``k`` in a steady state over the measured window? The verdict of
    :func:`racsim.pipeline.steady.verdict` on its requests in the system at each step's start
    (mean over trials) from step ``warmup`` on: ``stationary`` and, when not, ``steady_note``
    saying why. A channel without a server limit (``queued`` False: a delay kernel, or no
    ``workers``) has no queue to drift: stationary by construction."""
    if sched.submit_time is None or not queued:
        return {"stationary": True, "steady_note": ""}
    v = verdict(in_system(sched, k).mean(axis=0), warmup)
    return {"stationary": v.stationary, "steady_note": v.reason}


def busy_seconds(sched: ArrivalSchedule, k: int, workers: Optional[int], t0: np.ndarray,
                 t1: np.ndarray) -> Optional[Tuple[np.ndarray, int]]:
    """(busy seconds per trial inside the window [t0, t1], servers) of channel ``k``: a gpu_rm
    pool's replica-seconds busy with batches, a queue's worker-seconds busy with jobs (a job
    lost to a worker's failure keeps no end: no busy seconds counted), other tenants' requests
    (background) included; None without a worker limit."""
    gpu = (sched.gpu_batches or {}).get(sched.channel_names[k])
    if gpu is not None:
        lane = gpu["lane"]
        busy = np.bincount(lane, weights=_inside(gpu["start"], gpu["end"], t0[lane], t1[lane]),
                           minlength=sched.n_trials)
        return busy, int(gpu["replicas"])
    if not workers:
        return None
    done = sched.completion[..., k]
    if sched.failed is not None:
        done = np.where(sched.failed[..., k], sched.service_start[..., k], done)
    busy = _inside(sched.service_start[..., k], done, t0[:, None, None], t1[:, None, None]).sum(axis=(1, 2))
    bg = (sched.background or {}).get(sched.channel_names[k])
    if bg is not None:
        lane = bg["lane"]
        busy = busy + np.bincount(lane, weights=_inside(bg["start"], bg["end"], t0[lane], t1[lane]),
                                  minlength=sched.n_trials)
    return busy, workers


def useful_share(sched: ArrivalSchedule, k: int, workers: Optional[int], t0: np.ndarray, t1: np.ndarray) -> float:
    """Channel ``k``'s useful share over the window [t0, t1] (mean over trials), on the same
    server-seconds as its utilisation (servers x window; an autoscaled pool's billed seconds):
    the seconds of service that delivered results, a gpu_rm batch's last ``work`` seconds (the
    batch log's: not an attempt a failure cut or lost, nor a batch's wait on its replica's
    repair), a queue's busy seconds (:func:`busy_seconds`: a lost job counts none). A subset of
    the busy seconds, so useful <= busy by construction. NaN without a worker limit."""
    busy = busy_seconds(sched, k, workers, t0, t1)
    if busy is None:
        return float("nan")
    work = busy[0]
    gpu = (sched.gpu_batches or {}).get(sched.channel_names[k])
    if gpu is not None:
        lane = gpu["lane"]
        work = np.bincount(lane, weights=_inside(gpu["end"] - gpu["work"], gpu["end"], t0[lane], t1[lane]),
                           minlength=sched.n_trials)
    pool = (sched.pools or {}).get(sched.channel_names[k])
    per = billed_seconds(pool, t0, t1) if pool is not None else busy[1] * (t1 - t0)
    return float(np.mean(work / per))


def pool_row(sched: ArrivalSchedule, k: int, pool: Dict[str, np.ndarray], t0: np.ndarray, t1: np.ndarray,
             w: int) -> dict:
    """An autoscaled channel's pool over the measured window [t0, t1] (mean over trials):
    its largest size (``workers``), servers billed on average, server-seconds billed, cost per 1000 optimizer steps at the
    pool's price per server-hour, and utilisation = busy seconds / billed server-seconds."""
    billed = billed_seconds(pool, t0, t1)
    gpu = (sched.gpu_batches or {}).get(sched.channel_names[k])
    if gpu is not None:
        lane = gpu["lane"]
        busy = np.bincount(lane, weights=_inside(gpu["start"], gpu["end"], t0[lane], t1[lane]), minlength=len(t0))
    else:
        busy = _inside(sched.service_start[..., k], sched.completion[..., k],
                       t0[:, None, None], t1[:, None, None]).sum(axis=(1, 2))
    steps = sched.n_steps - w
    return {"workers": int(pool["max"]), "utilisation": float(np.mean(busy / billed)),
            "servers_billed_mean": float(np.mean(billed / (t1 - t0))), "server_seconds": float(np.mean(billed)),
            "cost_per_1000_steps": float(np.mean(billed)) / steps * 1000.0 * float(pool["price_per_hour"]) / 3600.0}


def _quantiles(x: np.ndarray) -> list:
    """p50, p95, p99 of ``x`` (NaN when empty), one partition for all three."""
    return [float(v) for v in np.percentile(x, (50, 95, 99))] if x.size else [float("nan")] * 3


def _inside(start: np.ndarray, end: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Seconds of each busy interval [start, end) inside the window [lo, hi]."""
    return np.clip(np.minimum(end, hi) - np.maximum(start, lo), 0, None)


def queue_timeseries(sched: ArrivalSchedule, points: int = 200) -> pd.DataFrame:
    """Mean over trials of jobs waiting and jobs in service per channel, on a time grid."""
    grid = np.linspace(0.0, float(np.median(sched.wallclock)), points)
    out = {"time_s": grid}
    for k, name in enumerate(sched.channel_names):
        sub = np.sort(sched.submit_time[..., k].reshape(sched.n_trials, -1), axis=1)
        beg = np.sort(sched.service_start[..., k].reshape(sched.n_trials, -1), axis=1)
        end = np.sort(sched.completion[..., k].reshape(sched.n_trials, -1), axis=1)
        n_sub = _count_le(sub, grid)
        n_beg = _count_le(beg, grid)
        n_end = _count_le(end, grid)
        out[f"{name}_queued"] = (n_sub - n_beg).mean(axis=0)
        out[f"{name}_in_service"] = (n_beg - n_end).mean(axis=0)
    return pd.DataFrame(out)


def _count_le(sorted_times: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """(trials, points): how many of each trial's times are <= each grid point."""
    return np.stack([np.searchsorted(row, grid, side="right") for row in sorted_times])
