"""What a user reads of asynchronous generation (docs/generation.md, "What is reported"): one row of figures
per run (generation.csv), the lags' histogram (lag_histogram.csv) and the console's block. Everything is
read off a schedule's :class:`~racsim.pipeline.schedule.GenerationRecord`; the lags over the trained
samples of the measured window (the steps from the warm-up on), the time splits over the whole run
([0, S_{steps-1}], where the simulation stops), the rates over the window's steps.
"""

from __future__ import annotations

from typing import Dict, Tuple

import numpy as np
import pandas as pd

from racsim.pipeline.schedule import ArrivalSchedule, GenerationRecord

ENGINE_SPLIT = ("decoding", "prefill", "stalled", "idle")  # GenerationRecord.engine_time's columns


def versions_at(sync_end: np.ndarray, when: np.ndarray) -> np.ndarray:
    """The global version (syncs ended) at each instant ``when`` (trials, ...), per lane from its (trials,
    steps) sync ends: the number of E_t <= the instant (a sync ending at that instant counts)."""
    out = np.empty(when.shape, dtype=np.int64)
    for i in range(when.shape[0]):
        out[i] = np.searchsorted(sync_end[i], when[i], side="right")
    return out


def time_average(times: np.ndarray, lengths: np.ndarray, start: float, end: float) -> Tuple[float, int]:
    """(time-average, maximum) over [start, end) of a step function that is 0 before ``times[0]`` and
    ``lengths[i]`` from ``times[i]`` on (the queue-length timeline): a length set at ``start`` counts, one set
    at ``end`` does not."""
    if end <= start:
        return 0.0, 0
    before = np.searchsorted(times, start, side="right")  # changes up to start: the value at start
    inside = (times > start) & (times < end)
    edges = np.concatenate([[start], times[inside], [end]])
    values = np.concatenate([[lengths[before - 1] if before else 0], lengths[inside]])
    return float((np.diff(edges) * values).sum() / (end - start)), int(values.max())


def trainer_split(rec: GenerationRecord) -> Dict[str, float]:
    """The trainer's seconds busy (its steps' fast_score, submit and update), syncing weights and waiting for
    a batch over [0, S_{steps-1}], as shares, all lanes together (they sum to 1)."""
    s, p, e = rec.step_start, rec.publish, rec.sync_end
    busy = (p[:, :-1] - s[:, :-1]).sum()
    sync = (e[:, :-1] - p[:, :-1]).sum()
    wait = s[:, 0].sum() + (s[:, 1:] - e[:, :-1]).sum()
    total = s[:, -1].sum()
    return {"busy": busy / total, "sync": sync / total, "waiting": wait / total}


def engine_split(rec: GenerationRecord) -> Dict[str, float]:
    """The engines' seconds decoding, in prefill, stalled (weight syncs) and idle over [0, S_{steps-1}], as
    shares, every engine of every lane together."""
    t = rec.engine_time.sum(axis=(0, 1))
    return {name: float(v / t.sum()) for name, v in zip(ENGINE_SPLIT, t)}


def binding(trainer_waiting: float, engines_idle: float, both: float = 0.25) -> str:
    """Which side binds: the one that waits less (``trainer`` or ``engines``), or ``admission`` where both wait
    more than ``both`` of the time (the admission rule or the queue throttles generation, or long responses
    hold their groups back)."""
    if min(trainer_waiting, engines_idle) > both:
        return "admission"
    return "trainer" if trainer_waiting < engines_idle else "engines"


def generation_table(sched: ArrivalSchedule, warmup: int, scenario: str = "") -> pd.DataFrame:
    """One row of a run's generation figures (see the module docstring; docs/generation.md names each)."""
    rec = sched.generation
    n, steps, batch = rec.start_version.shape
    t = np.arange(steps)[None, :, None]
    win = slice(warmup, steps)
    head, mean, last = rec.head_lag[:, win], rec.mean_lag[:, win], (t - rec.last_version)[:, win]
    v_in = versions_at(rec.sync_end, rec.queue_in)[:, win]
    S = rec.group_size
    made = rec.finished.reshape(n, steps, batch // S, S).max(axis=-1).repeat(S, axis=-1)[:, win]
    span = rec.step_start[:, -1] - rec.step_start[:, warmup]
    per_step = float((steps - 1 - warmup) / span.mean()) if steps - 1 > warmup and span.mean() > 0 else 0.0
    tokens = (rec.prompt + rec.response)[:, win].sum(axis=2).mean()  # a step's, on average
    queue = [time_average(times, lengths, rec.step_start[i, warmup], rec.step_start[i, -1])
             for i, (times, lengths) in enumerate(rec.queue)]
    dropped = np.array([len(d[0]) for d in rec.dropped])
    dropped_resp = np.concatenate([d[2].reshape(-1) for d in rec.dropped]) if dropped.sum() else np.empty(0)
    generated = np.concatenate(rec.generated)
    wasted = rec.wasted_tokens.astype(np.float64)
    eng, trn = engine_split(rec), trainer_split(rec)
    row = {
        "scenario": scenario,
        "trials": n,
        "steps": steps,
        "warmup_steps": warmup,
        "batch_size": batch,
        "mean_lag": float(mean.mean()),
        "mean_lag_before_queue": float((v_in - rec.mean_version[:, win]).mean()),
        "mean_lag_in_queue": float((t[:, win] - v_in).mean()),
        "head_lag_mean": float(head.mean()),
        "head_lag_p50": float(np.percentile(head, 50)),
        "head_lag_p95": float(np.percentile(head, 95)),
        "head_lag_max": int(head.max()),
        "last_lag_mean": float(last.mean()),
        "generation_s": float((rec.finished - rec.taken)[:, win].mean()),
        "reward_wait_s": float((rec.queue_in[:, win] - made).mean()),
        "queue_s": float((rec.step_start[:, win, None] - rec.queue_in[:, win]).mean()),
        "steps_per_hour": 3600.0 * per_step,
        "samples_per_hour": 3600.0 * per_step * batch,
        "tokens_per_hour": 3600.0 * per_step * float(tokens),
        **{f"engine_{k}": v for k, v in eng.items()},
        **{f"trainer_{k}": v for k, v in trn.items()},
        "binds": binding(trn["waiting"], eng["idle"]),
        "queue_mean": float(np.mean([q[0] for q in queue])),
        "queue_max": int(max(q[1] for q in queue)),
        "groups_dropped": float(dropped.mean()),
        "dropped_share": float(dropped.sum() * S / max(generated.size, 1)),
        "response_trained_mean": float(rec.response[:, win].mean()),
        "response_generated_mean": float(generated.mean()) if generated.size else 0.0,
        "response_dropped_mean": float(dropped_resp.mean()) if dropped_resp.size else np.nan,
        "wasted_tokens": float(wasted.mean()),
        "wasted_share": float(wasted.sum() / (wasted.sum() + generated.sum())) if generated.size else 0.0,
    }
    return pd.DataFrame([row])


def lag_histogram(sched: ArrivalSchedule, warmup: int) -> pd.DataFrame:
    """The trained samples of the measured window by lag: head lag (t - start version) and mean lag
    (t - token-weighted mean version, binned [L, L + 1)), counts and shares, one row per L from 0."""
    rec = sched.generation
    head = rec.head_lag[:, warmup:].reshape(-1)
    mean = np.floor(rec.mean_lag[:, warmup:]).reshape(-1).astype(np.int64)
    top = int(max(head.max(), mean.max())) + 1
    h, m = np.bincount(head, minlength=top), np.bincount(mean, minlength=top)
    return pd.DataFrame({"lag": np.arange(top), "head_samples": h, "head_share": h / head.size,
                         "mean_samples": m, "mean_share": m / mean.size})
