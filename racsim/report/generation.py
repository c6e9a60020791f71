"""The console's block on asynchronous generation (pipeline.generation.mode=async): one paragraph read off
a run's generation.csv row (racsim/generation/figures.py)."""

from __future__ import annotations

import pandas as pd

from racsim.io import fmt

BINDS = {"trainer": "the trainer binds", "engines": "the engines bind",
         "admission": "both wait: the admission rule, the queue or long responses bind"}


def console_text(row: pd.Series) -> str:
    """The console's generation block: the lags, the rates, which side binds, the queue and the drops."""
    r = row
    return (f"generation: mean lag {fmt(r.mean_lag)} versions ({fmt(r.mean_lag_before_queue)} before the queue, "
            f"{fmt(r.mean_lag_in_queue)} in it), head lag p50 {fmt(r.head_lag_p50)}, p95 {fmt(r.head_lag_p95)}, "
            f"max {r.head_lag_max}; {fmt(r.steps_per_hour)} steps/h, {fmt(r.samples_per_hour)} samples/h, "
            f"{fmt(r.tokens_per_hour)} tokens/h; engines {r.engine_decoding:.0%} decoding, {r.engine_prefill:.0%} "
            f"prefill, {r.engine_stalled:.0%} syncing, {r.engine_idle:.0%} idle; trainer {r.trainer_busy:.0%} busy, "
            f"{r.trainer_sync:.0%} syncing, {r.trainer_waiting:.0%} waiting: {BINDS[r.binds]}; queue "
            f"{fmt(r.queue_mean)} groups on average (max {r.queue_max}), {fmt(r.groups_dropped)} dropped a run; "
            f"responses trained {fmt(r.response_trained_mean)} tokens, generated {fmt(r.response_generated_mean)}")
