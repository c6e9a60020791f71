"""The deciding replications: the counts the answer depends on read their rare-event figures off
independent replications, the trials of their settled run and of more runs on independent streams,
sized from the regime's chain where there is one (racsim/analyses/capacity/episodes.py), until the
stopping rule (racsim/analyses/capacity/stopping.py) is met or the budget ends; their intervals then
replace the figures."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from racsim.analyses.bias_study import Known, corrector_names, run_bias_study
from racsim.analyses.capacity import stopping
from racsim.analyses.capacity.channel import with_count
from racsim.analyses.capacity.episodes import count_episodes
from racsim.analyses.capacity.intervals import replicate_figures
from racsim.analyses.capacity.length import requests_per_schedule
from racsim.analyses.capacity.pool import COUNT_REQUESTS_PER_S, pool_size
from racsim.analyses.capacity.regimes import regime_scales
from racsim.analyses.capacity.targets import chosen_row, failed
from racsim.analyses.grid import expand
from racsim.config.schema import RacsimConf
from racsim.config.spec import replace_at
from racsim.io import side_by_side
from racsim.pipeline.draws import draw
from racsim.pipeline.engines import simulate
from racsim.seeds import rng_for


def judged_only(cfg: RacsimConf, chosen: str) -> RacsimConf:
    """The spec with only the correctors a count's verdict reads: ``chosen`` and naive (the
    reference of its bias ratio). Each corrector's figures come from the same schedule on their
    own, so the verdict is unchanged, without the other correctors' bias or the blocking pipeline
    that wait_for_slow alone needs (about a third of a count's time on the judge)."""
    return replace_at(cfg, "corrector.names", [n for n in corrector_names(cfg) if n in ("naive", chosen)])


def replicate_count(cfg: RacsimConf, name: str, key: str, n: int, lanes: int, steps: int, warmup: int, r: int,
                    bias: bool = False) -> stopping.Replicate:
    """Replication run ``r`` (>= 1) of count ``n``: its asynchronous pipeline alone on ``lanes`` trials,
    ``steps`` steps measured from ``warmup``, drawn from the stream ``capacity_replication`` split by
    ``r``, its lanes and its length (racsim.seeds: independent of the settled run's ``pipeline`` stream,
    and the same for every count, so that counts run alike are compared on common random numbers); with
    ``bias``, the bias study on its schedule too, for ``capacity.corrector`` and naive (:func:`judged_only`)."""
    c = replace_at(replace_at(with_count(cfg, key, n), "pipeline.steps", int(steps)), "learner.trials", int(lanes))
    draws = draw(c.pipeline, int(lanes), rng_for(c.seed, "capacity_replication", r, int(lanes), int(steps)))
    sched = simulate(c.pipeline, int(lanes), None, draws=draws)
    out = replicate_figures(sched, c, name, warmup)
    if bias:
        chosen = str(cfg.capacity.corrector)
        study = replace_at(judged_only(c, chosen), "pipeline.warmup_steps", int(warmup))
        res = run_bias_study(expand(study), known=Known(draws, sched)).results.set_index("corrector")
        naive = float(res.loc["naive", "bias_exact"])
        out.means = {"bias_exact": float(res.loc[chosen, "bias_exact"]),
                    "bias_vs_naive": float(res.loc[chosen, "bias_exact"]) / naive if naive > 0 else np.nan}
    return out


def replicate_runs(cfg: RacsimConf, name: str, key: str, n: int, runs: List[Tuple[int, int]], warmup: int, r: int,
                   bias: bool = False) -> List[stopping.Replicate]:
    """A stage's replication runs of count ``n`` (each (lanes, steps)), numbered from ``r``
    (:func:`replicate_count`): side by side where a pool saves time (racsim.analyses.capacity.pool.pool_size:
    ``capacity.workers``, the memory, a run's seconds at its lower bound against the pool's start),
    this process among them; the same figures in any of them."""
    args = [(cfg, name, key, n, lanes, steps, warmup, r + i, bias) for i, (lanes, steps) in enumerate(runs)]
    lanes, steps = runs[0]
    one = replace_at(replace_at(cfg, "learner.trials", lanes), "pipeline.steps", steps)
    seconds = requests_per_schedule(one) / COUNT_REQUESTS_PER_S  # a lower bound on a run's seconds
    workers = pool_size(cfg, seconds, len(runs))
    if workers < 2:
        return [replicate_count(*a) for a in args]
    out: List[Optional[stopping.Replicate]] = [None] * len(runs)
    for i, rep in side_by_side(workers - 1, replicate_count, args, here=replicate_count):
        out[i] = rep
    return out


def count_plan(cfg: RacsimConf, name: str, key: str, n: int, row: dict, keys: List[str], targets: Dict[str, Any],
               work_per_s: float) -> stopping.Plan:
    """How count ``n``'s replications are sized (:class:`stopping.Plan`): the trial-steps its chain
    asks for the rare-event ``keys`` (:func:`stopping.need_of`: what settles the chain's dropped share
    against its target at :data:`stopping.POWER`; none without a chain, or with
    ``capacity.regime_cycles`` 0), each run warm from the settled run's warm-up (``row``'s), its trials'
    steps at most those of the longest run the search makes (``capacity.max_steps`` or the settled
    run's: what fits in memory), a stage's runs in a multiple of :data:`stopping.STAGE_MULTIPLE`
    (the same on any machine, in any process)."""
    found = count_episodes(with_count(cfg, key, n), name, work_per_s) if cfg.capacity.regime_cycles else None
    share, rate, length = (found.share, found.rate, found.length) if found is not None else (0.0, 0.0, 0.0)
    steps, w = int(row["steps"]), int(row["warmup_steps"])
    need = stopping.need_of(share, rate, length, targets, keys, float(cfg.capacity.confidence))
    return stopping.Plan(need=need, length=length, warmup=w, lanes=int(cfg.learner.trials), first=steps - w,
                         cap=max(steps, int(cfg.capacity.max_steps)), rate=rate,
                         together=stopping.STAGE_MULTIPLE, share=share)


def deciding_keys(cfg: RacsimConf, name: str, key: str, n: int, row: dict, targets: Dict[str, Any],
                  work_per_s: float) -> List[str]:
    """The targets count ``n``'s deciding replications settle (:func:`decide_count`), from its chosen
    corrector's ``row``: under a regime with a chain (racsim.analyses.capacity.episodes.regime_terms)
    every rare-event target that is set, and a bias target whose interval straddles it; elsewhere each
    target whose interval straddles it (or reads [0, 0] under slow regimes: :func:`regime_scales`).
    Empty where the row is not steady, has no such target, or fails another target for sure (no
    replication can make it pass)."""
    if row["status"] != "ok":
        return []
    if cfg.capacity.regime_cycles and count_episodes(with_count(cfg, key, n), name, work_per_s) is not None:
        keys = stopping.set_targets(targets) + [k for k in stopping.open_targets(row, targets, bias=True)
                                                if k in stopping.BIAS_TARGETS]
    else:
        slow = bool(regime_scales(cfg, name))  # outages, bursts...: a run may miss their rare events
        keys = stopping.open_targets(row, targets, zero=slow, bias=slow)
    if set(failed(row, targets)) - set(keys):  # it fails another target for sure
        return []
    return keys


def decide_count(cfg: RacsimConf, name: str, key: str, n: int, rows: List[dict], res: Any,
                 targets: Dict[str, Any], budget: stopping.Budget, work_per_s: float,
                 tell=None) -> Optional[stopping.Decision]:
    """Count ``n``'s rare-event figures decided by independent replications (:func:`stopping.sequential`):
    those of :func:`deciding_keys`, sized from the regime's chain where there is one. None where
    there are none (its row, ``capacity.corrector``'s, not steady, no such target, or another target
    failed for sure); else the replications' intervals replace the figures, their lo and hi (the
    channel's in every row of ``n``, ``rows``, in place; the bias figures in the chosen
    corrector's), ``replications`` says how many runs they rest on (the settled run ``res`` is the
    first), ``measured_steps`` their trial-steps, ``drop_episodes`` the drop episodes they saw and
    ``unresolved`` the targets left open (each then fails: the safe side).
    ``work_per_s``: the channel's long-run work (the chain's); ``tell(note, steps)``: called before each
    replication run of ``steps`` steps."""
    row = chosen_row(rows, targets["corrector"])
    keys = deciding_keys(cfg, name, key, n, row, targets, work_per_s)
    if not keys:
        return None
    c = with_count(cfg, key, n)
    w = int(row["warmup_steps"])
    bias = bool(set(keys) & set(stopping.BIAS_TARGETS))
    first = replicate_figures(res.schedules["async"], c, name, w)
    first.means = {fig: float(row[fig]) for fig in stopping.BIAS_TARGETS.values()}
    plan = count_plan(cfg, name, key, n, row, keys, targets, work_per_s)

    told = set()  # the stages told (a stage made again with its bias study: its steps are counted once)

    def replicate(r: int, runs: List[Tuple[int, int]], study: bool = True) -> List[stopping.Replicate]:
        if tell is not None:
            tell(f"replication {r + 1}{f'-{r + len(runs)}' if len(runs) > 1 else ''} ({len(runs)} x {runs[0][0]} "
                 f"trials x {runs[0][1]} steps), {', '.join(keys)} open"
                 f"{', the bias study once they read the dropped share' if bias and not study else ''}",
                 0 if r in told else -(-sum(a * b for a, b in runs) // plan.lanes))
            told.add(r)
        return replicate_runs(cfg, name, key, n, runs, w, r, bias and study)

    found = stopping.sequential(first, replicate, keys, targets, float(cfg.capacity.confidence), plan, budget)
    apply_decision(rows, row, found)
    return found


def apply_decision(rows: List[dict], chosen: dict, found: stopping.Decision) -> None:
    """A count's ``rows`` (in place) with the replications' figures and intervals: the channel's in
    every row, the bias figures in the ``chosen`` corrector's, how many runs they rest on and the drop
    episodes those saw."""
    for r in rows:
        for k, (v, lo, hi) in found.found.items():
            fig = stopping.FIGURES[k]
            if k in stopping.RARE_TARGETS or r is chosen:
                r[fig], r[f"{fig}_lo"], r[f"{fig}_hi"] = v, lo, hi
        r["replications"] = len(found.reps)
        r["unresolved"] = ", ".join(found.open)
        r["measured_steps"] = stopping.exposure(found.reps)
        r["drop_episodes"] = stopping.episodes_seen(found.reps)
