"""Pipeline statistics from an arrival schedule: delays, queue waits, utilisation."""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import pandas as pd

from racsim.pipeline.schedule import ArrivalSchedule


def channel_stats(sched: ArrivalSchedule, workers: Dict[str, Optional[int]]) -> pd.DataFrame:
    """One row per channel: result counts, delay quantiles (steps), queue wait (s), utilisation."""
    rows = []
    span = sched.wallclock  # (trials,)
    counts = sched.counts()
    for k, name in enumerate(sched.channel_names):
        st = sched.status[..., k]
        d = sched.delay[..., k][st == 0]
        row = {"channel": name, **counts[name]}
        row["delay_mean_steps"] = float(d.mean()) if d.size else float("nan")
        qs = np.percentile(d, (50, 95, 99)) if d.size else [float("nan")] * 3  # one partition for all three
        for q, v in zip((50, 95, 99), qs):
            row[f"delay_p{q}_steps"] = float(v)
        wait = (sched.service_start[..., k] - sched.submit_time[..., k]).ravel()
        row["wait_mean_s"] = float(wait.mean())
        # without a queue (no workers limit) nothing ever waits: skip the quantile
        row["wait_p95_s"] = float(np.percentile(wait, 95)) if workers.get(name) or name in (sched.gpu_batches or {}) else 0.0
        row["workers"] = workers.get(name)
        gpu = (sched.gpu_batches or {}).get(name)
        if gpu is not None:  # a gpu_rm channel: replica-seconds busy with batches
            row["workers"] = int(gpu["replicas"])
            end = np.minimum(gpu["end"], sched.step_start[gpu["lane"], -1])
            busy = np.bincount(gpu["lane"], weights=np.clip(end - gpu["start"], 0, None), minlength=sched.n_trials)
            row["utilisation"] = float(np.mean(busy / (row["workers"] * span)))
        elif workers.get(name):
            # Busy seconds inside the run's window over worker-seconds available.
            end = np.minimum(sched.completion[..., k], sched.step_start[:, -1, None, None])
            busy = np.clip(end - sched.service_start[..., k], 0, None).sum(axis=(1, 2))
            row["utilisation"] = float(np.mean(busy / (workers[name] * span)))
        else:
            row["utilisation"] = float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


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
