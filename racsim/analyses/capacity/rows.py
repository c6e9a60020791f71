"""One count's rows of the capacity curve, one per corrector: its settled run's figures, each with
its interval, its load and cost, and its status; an overloaded count's rows without a run."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from racsim.analyses.bias_study import corrector_names
from racsim.analyses.capacity import stopping
from racsim.analyses.capacity.channel import count_key, unit_price, with_count
from racsim.analyses.capacity.episodes import count_episodes
from racsim.analyses.capacity.intervals import (Units, bias_intervals, channel_intervals, interval_units,
                                                replicate_figures, step_seconds, worker_limit)
from racsim.analyses.capacity.length import Settled, settle
from racsim.analyses.capacity.targets import chosen_row, fails_text
from racsim.config.schema import RacsimConf
from racsim.learner.correctors import BLOCKING
from racsim.pipeline import steady
from racsim.pipeline.stats import useful_share


# Every figure of a simulated count: the curve has these columns even when no count was simulated.
CURVE_COLUMNS = ("steps", "warmup_steps", "bias_exact", "bias_exact_lo", "bias_exact_hi", "bias_mc", "mc_se",
                 "bias_vs_naive", "bias_vs_naive_lo", "bias_vs_naive_hi", "step_s", "step_s_lo", "step_s_hi", "eta",
                 "delay_p50_steps", "delay_p95_steps", "dropped_frac", "pending_frac", "wait_p95_s", "sojourn_p95_s",
                 "sojourn_p99_s", "utilisation", "replications", "measured_steps", "drop_episodes", "useful",
                 "available", "cost_per_1000_steps")


def count_rows(cfg: RacsimConf, name: str, key: str, n: int, load: dict,
               tell=None, note=None) -> Tuple[Optional[Settled], List[dict]]:
    """One count's settled run and curve rows; an overloaded count (its ``load`` reaches
    ``capacity.max_load``) is not simulated: no run, and its rows of NaN (:func:`overloaded_rows`).
    ``tell``, ``note``: as :func:`settle`'s."""
    if load["load"] >= cfg.capacity.max_load:
        return None, overloaded_rows(cfg, name, n, load)
    run = settle(with_count(cfg, key, n), name, tell, note, load["work_per_s"])
    return run, curve_rows(cfg, name, n, run, load)


def curve_rows(cfg: RacsimConf, name: str, n: int, run: Settled, load: dict) -> List[dict]:
    """The capacity curve's rows for one count, from its settled run's tables, each figure with
    its interval (``capacity.confidence``; the trials resampled ``capacity.resamples`` times)."""
    res, v, lvl = run.res, run.verdict, float(cfg.capacity.confidence)
    ch = res.channels[res.channels.channel == name].iloc[0]
    sched = res.schedules["async"]
    k = sched.channel_names.index(name)
    units = interval_units(cfg, name, sched.n_trials, v.warmup, run.steps)
    bias = bias_intervals(res.bias, units, lvl)
    lanes = interval_units(cfg, name, sched.n_trials, v.warmup, run.steps, whole=True)  # the channel's: trials
    first = replicate_figures(sched, cfg, name, v.warmup)
    # replications: the independent runs the rare-event figures rest on (decide_count)
    served = {**channel_figures(ch), "replications": 1, "drop_episodes": stopping.episodes_seen([first]),
              "measured_steps": stopping.exposure([first]),
              **channel_intervals(sched, k, ch["workers"], v.warmup, lanes, lvl),
              **rare_figures(cfg, name, n, load, first, lvl),
              # useful: the share of server-seconds whose work delivered results, from the run (<= busy);
              # available: the long-run share up the load assumes
              "useful": useful_share(sched, k, worker_limit(ch["workers"]), sched.step_start[:, v.warmup],
                                     sched.step_start[:, -1]),
              "available": load["availability"]}
    naive = res.results[res.results.corrector == "naive"].iloc[0]
    price = unit_price(cfg, name)
    out = []
    for _, r in res.results.iterrows():
        step = step_figures(r, res.schedules, units, v.warmup, lvl)
        row = {"count": int(n), "corrector": r["corrector"], "load": load["load"], "load_sampled": load["load_sampled"],
               "headroom": 1.0 - load["load"], "steps": int(run.steps), "warmup_steps": int(v.warmup),
               "stationary": bool(v.stationary), **bias_figures(r, bias[r["corrector"]], naive), **step,
               "eta": float(r.get(f"eta_{name}", np.nan)), **served, "cost_per_hour": n * price,
               "cost_per_1000_steps": n * price * step["step_s"] * 1000.0 / 3600.0, **optional_figures(ch, load)}
        row["status"] = status(row, cfg)
        out.append(row)
    return out


def rare_figures(cfg: RacsimConf, name: str, n: int, load: dict, first: stopping.Replicate,
                 level: float) -> Dict[str, float]:
    """Under a regime with a chain (racsim.analyses.capacity.episodes), the rare-event figures of count
    ``n`` (each with its interval) as the deciding replications read them, its settled run's lanes
    ``first`` the replications (racsim.analyses.capacity.stopping.intervals: the dropped share over the
    lanes, never below what its episodes allow, and with none seen bounded by the chain's episode
    length); elsewhere none (the trials' bootstrap intervals stand)."""
    found = count_episodes(with_count(cfg, count_key(cfg, name), n), name, load["work_per_s"]) \
        if cfg.capacity.regime_cycles else None
    if found is None:
        return {}
    out = {}
    for k, (v, lo, hi) in stopping.intervals([first], list(stopping.RARE_TARGETS), level, found.length).items():
        fig = stopping.FIGURES[k]
        out.update({fig: v, f"{fig}_lo": lo, f"{fig}_hi": hi})
    return out


def bias_figures(r: Any, interval: tuple, naive: Any) -> Dict[str, float]:
    """A corrector's bias figures from its results row ``r``: the exact bias (eq. (2)'s norm) and
    its ratio to ``naive``'s, each with its ``interval`` (:func:`bias_intervals`), and the
    Monte-Carlo bias with its standard error."""
    ratio = float(r["bias_exact"]) / float(naive["bias_exact"]) if naive["bias_exact"] > 0 else np.nan
    return {"bias_exact": float(r["bias_exact"]), "bias_exact_lo": interval[0], "bias_exact_hi": interval[1],
            "bias_mc": float(r["bias_mc"]), "mc_se": float(r["mc_se"]),
            "bias_vs_naive": ratio, "bias_vs_naive_lo": interval[2], "bias_vs_naive_hi": interval[3]}


def step_figures(r: Any, schedules: Dict[str, Any], units: Units, warmup: int, level: float) -> Dict[str, float]:
    """A corrector's mean wall-clock per step and its interval, on the schedule it ran on (the
    blocking pipeline for a blocking corrector)."""
    step_s = float(r["step_s"])
    timed = schedules.get("blocking") if r["corrector"] in BLOCKING else schedules["async"]
    lo, hi = (steady.percentile_interval(units.means(step_seconds(timed, warmup)), level) if timed is not None
              else (step_s, step_s))
    return {"step_s": step_s, "step_s_lo": lo, "step_s_hi": hi}


def channel_figures(ch: Any) -> Dict[str, float]:
    """The sized channel's figures from its row ``ch`` of the channel table."""
    return {"delay_p50_steps": float(ch["delay_p50_steps"]), "delay_p95_steps": float(ch["delay_p95_steps"]),
            "dropped_frac": float(ch["dropped"]) / float(ch["emitted"]),
            "pending_frac": float(ch["pending"]) / float(ch["emitted"]),
            "wait_p95_s": float(ch["wait_p95_s"]), "sojourn_p95_s": float(ch["sojourn_p95_s"]),
            "sojourn_p99_s": float(ch["sojourn_p99_s"]),
            "utilisation": float(ch["utilisation"])}  # busy: server-seconds holding work


def optional_figures(ch: Any, load: dict) -> Dict[str, float]:
    """What a shared channel's other tenants take (their part of the load, their sojourn) and what
    a channel with faults loses (its replicas' uptime, results lost to failures), where it has them."""
    out = {}
    if "background_jobs" in ch:
        out.update(load_background=load["load_background"], background_jobs=int(ch["background_jobs"]),
                   background_sojourn_p95_s=float(ch["background_sojourn_p95_s"]))
    if "availability" in ch:
        out.update(availability=float(ch["availability"]),
                   lost_to_failure_frac=float(ch["lost_to_failure"]) / float(ch["emitted"]))
    return out


def overloaded_rows(cfg: RacsimConf, name: str, n: int, load: dict) -> List[dict]:
    """The rows of a count whose offered load reaches ``capacity.max_load``: not simulated
    (its queue has no steady state), so every figure but the load and the price is NaN."""
    price = unit_price(cfg, name)
    shared = {"load_background": load["load_background"]} if cfg.pipeline.channels[name].background else {}
    return [{"count": int(n), "corrector": c, "load": load["load"], "load_sampled": load["load_sampled"], **shared,
             "headroom": 1.0 - load["load"],
             "stationary": False, "replications": 0, "cost_per_hour": n * price,
             "status": status({"load": load["load"]}, cfg)}
            for c in corrector_names(cfg)]


def status(row: dict, cfg: RacsimConf) -> str:
    """'ok', or why the count's figures are not steady-state ones."""
    if row["load"] >= cfg.capacity.max_load:
        return f"overloaded: load {row['load']:.3g} >= capacity.max_load {cfg.capacity.max_load:g}"
    if not row["stationary"]:
        return f"not stationary at {row['steps']} steps (capacity.max_steps {cfg.capacity.max_steps})"
    return "ok"


def count_note(rows: List[dict], chosen: str, targets: Dict[str, Any]) -> str:
    """A count's progress note: its load, run length and what it fails (or that it meets the targets)."""
    r = chosen_row(rows, chosen)
    fails, steps = fails_text(r, targets), f"{r['steps']} steps, " if "steps" in r else ""
    return f"load {r['load']:.3g}, {steps}" + (f"fails {fails}" if fails else "meets the targets")
