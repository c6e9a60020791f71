"""The deciding replications: the counts the answer depends on, where a rare-event figure's
interval straddles its target (or reads [0, 0] under slow regimes), are simulated again on
independent streams until the stopping rule (racsim/analyses/capacity/stopping.py) is met or the
budget ends; their intervals then replace the figures."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np

from racsim.analyses.bias_study import Known, corrector_names, run_bias_study
from racsim.analyses.capacity import stopping
from racsim.analyses.capacity.channel import with_count
from racsim.analyses.capacity.regimes import regime_scales
from racsim.analyses.capacity.targets import chosen_row, failed
from racsim.analyses.grid import expand
from racsim.config.schema import RacsimConf
from racsim.config.spec import replace_at
from racsim.pipeline.draws import draw
from racsim.pipeline.engines import simulate
from racsim.pipeline.stats import channel_stats, queue_workers
from racsim.seeds import rng_for


def replicate_figures(sched, cfg: RacsimConf, name: str, warmup: int) -> stopping.Replicate:
    """One replication's rare-event figures of channel ``name`` (:data:`stopping.RARE_TARGETS`),
    measured from step ``warmup`` as the channel table measures them (racsim.pipeline.stats.channel_stats):
    results dropped and sent, delay p95 (steps), sojourn p95 and p99 (s)."""
    chans = channel_stats(sched, queue_workers(cfg.pipeline.channels), warmup)
    row = chans[chans.channel == name].iloc[0]
    return {"dropped": float(row["dropped"]), "sent": float(row["emitted"]),
            **{fig: float(row[fig]) for fig in stopping.RARE_TARGETS.values() if fig != "dropped_frac"}}


def judged_only(cfg: RacsimConf, chosen: str) -> RacsimConf:
    """The spec with only the correctors a count's verdict reads: ``chosen`` and naive (the
    reference of its bias ratio). Each corrector's figures come from the same schedule on their
    own, so the verdict is unchanged, without the other correctors' bias or the blocking pipeline
    that wait_for_slow alone needs (about a third of a count's time on the judge)."""
    return replace_at(cfg, "corrector.names", [n for n in corrector_names(cfg) if n in ("naive", chosen)])


def replicate_count(cfg: RacsimConf, name: str, key: str, n: int, steps: int, warmup: int, r: int,
                    bias: bool = False) -> stopping.Replicate:
    """Replication ``r`` (>= 1) of count ``n``: its asynchronous pipeline alone, at the settled run's
    ``steps`` and ``warmup``, drawn from the stream ``capacity_replication`` split by ``r``
    (racsim.seeds: independent of the settled run's ``pipeline`` stream, and the same for every count,
    so that counts are compared on common random numbers replication by replication); with ``bias``,
    the bias study on its schedule too, for ``capacity.corrector`` and naive (:func:`judged_only`)."""
    c = replace_at(with_count(cfg, key, n), "pipeline.steps", int(steps))
    draws = draw(c.pipeline, int(c.learner.trials), rng_for(c.seed, "capacity_replication", r))
    sched = simulate(c.pipeline, int(c.learner.trials), None, draws=draws)
    out = replicate_figures(sched, c, name, warmup)
    if bias:
        chosen = str(cfg.capacity.corrector)
        study = replace_at(judged_only(c, chosen), "pipeline.warmup_steps", int(warmup))
        res = run_bias_study(expand(study), known=Known(draws, sched)).results.set_index("corrector")
        naive = float(res.loc["naive", "bias_exact"])
        out.update(bias_exact=float(res.loc[chosen, "bias_exact"]),
                   bias_vs_naive=float(res.loc[chosen, "bias_exact"]) / naive if naive > 0 else np.nan)
    return out


def decide_count(cfg: RacsimConf, name: str, key: str, n: int, rows: List[dict], res: Any,
                 targets: Dict[str, Any], budget: stopping.Budget, tell=None) -> Optional[stopping.Decision]:
    """Count ``n``'s rare-event figures decided by independent replications (:func:`stopping.sequential`):
    None where its row (``capacity.corrector``'s) is not steady, leaves none undecided (a [0, 0]
    reading is undecided only under slow regimes: :func:`regime_scales`) or fails a target that is
    not undecided (no replication can make it pass); else the replications' intervals replace the
    figures, their lo and hi (the channel's in every row of ``n``, ``rows``, in place; the bias
    figures in the chosen corrector's), and ``replications`` says how many they rest on (the
    settled run ``res`` is the first).
    ``tell(note)``: called before each replication."""
    row = chosen_row(rows, targets["corrector"])
    slow = bool(regime_scales(cfg, name))  # outages, bursts...: a run may miss their rare events
    keys = stopping.open_targets(row, targets, zero=slow, bias=slow) if row["status"] == "ok" else []
    if not keys or set(failed(row, targets)) - set(keys):  # none open, or it fails another target for sure
        return None
    steps, w = int(row["steps"]), int(row["warmup_steps"])
    bias = bool(set(keys) & set(stopping.BIAS_TARGETS))
    first = {**replicate_figures(res.schedules["async"], with_count(cfg, key, n), name, w),
             **{fig: float(row[fig]) for fig in stopping.BIAS_TARGETS.values()}}

    def replicate(r: int) -> stopping.Replicate:
        if tell is not None:
            tell(f"replication {r + 1}, {', '.join(keys)} undecided")
        return replicate_count(cfg, name, key, n, steps, w, r, bias)

    found = stopping.sequential(first, replicate, keys, targets, float(cfg.capacity.confidence),
                                lambda r: budget.affords(steps))
    apply_decision(rows, row, found)
    return found


def apply_decision(rows: List[dict], chosen: dict, found: stopping.Decision) -> None:
    """A count's ``rows`` (in place) with the replications' figures and intervals: the channel's in
    every row, the bias figures in the ``chosen`` corrector's, and how many replications they rest on."""
    for r in rows:
        for k, (v, lo, hi) in found.found.items():
            fig = stopping.FIGURES[k]
            if k in stopping.RARE_TARGETS or r is chosen:
                r[fig], r[f"{fig}_lo"], r[f"{fig}_hi"] = v, lo, hi
        r["replications"] = len(found.reps)
