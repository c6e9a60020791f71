"""The run length and the steady state: each count is simulated from ``pipeline.steps``, doubled
up to ``capacity.max_steps`` until the series of requests in the channel is stationary after its
warm-up (MSER-5, :func:`racsim.pipeline.steady.verdict`) and the window after it holds what the
slow regimes need (racsim/analyses/capacity/regimes.py); the bias study then reuses the simulated
asynchronous schedule."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from racsim.analyses.bias_study import Known, corrector_names, prefetch_trajectories, run_bias_study, share_note
from racsim.analyses.capacity.regimes import regime_warmup, regime_window
from racsim.analyses.grid import expand
from racsim.config.schema import RacsimConf, warmup_steps
from racsim.config.spec import replace_at
from racsim.config.validate import check_limits
from racsim.learner.correctors import BLOCKING
from racsim.pipeline import steady
from racsim.pipeline.draws import draw
from racsim.pipeline.engines import simulate
from racsim.seeds import rng_for


def requests_per_schedule(cfg: RacsimConf) -> int:
    """Requests one schedule simulates: trials x steps x batch x sequences, summed over channels."""
    p = cfg.pipeline
    per_sample = sum(int(ch.rm.sequences_per_sample) if ch.kind == "gpu_rm" else 1
                     for ch in p.channels.values())
    return int(cfg.learner.trials) * int(p.steps) * int(p.batch_size) * per_sample


def run_plan(cfg: RacsimConf, name: str, work_per_s: Optional[float] = None) -> Tuple[int, Optional[int], int]:
    """How :func:`sized_run` starts: (the window its slow regimes need after the warm-up, 0
    without; the warm-up they fix, None where MSER-5 or ``pipeline.warmup_steps`` decides; the
    steps it simulates first: ``pipeline.steps``, or with ``capacity.run_length=auto`` the
    regimes' window after their warm-up where longer, up to ``capacity.max_steps``). ``work_per_s``:
    the channel's long-run work, which the regime's warm-up depends on
    (:func:`~racsim.analyses.capacity.regimes.regime_warmup`; None: measured on the draws)."""
    cap, p = cfg.capacity, cfg.pipeline
    if cap.run_length != "auto":
        return 0, None, int(p.steps)
    need = regime_window(cfg, name)
    cut = regime_warmup(cfg, name, work_per_s) if p.warmup_steps is None else None
    longer = need + (cut or 0)
    return need, cut, min(longer, int(cap.max_steps)) if longer > int(p.steps) else int(p.steps)


def first_length(cfg: RacsimConf, name: str, work_per_s: Optional[float] = None) -> int:
    """The steps :func:`sized_run` simulates first (:func:`run_plan`)."""
    return run_plan(cfg, name, work_per_s)[2]


@dataclass
class Settled:
    """One count's run at the length that shows its steady state: the run, the verdict on its
    window, its length, and the seconds and requests of every pipeline simulated on the way."""

    res: Any
    verdict: steady.Verdict
    steps: int
    pipeline_s: float
    requests: int


@dataclass
class Sized:
    """One count's asynchronous pipeline at the length that shows its steady state
    (:func:`sized_run`): its spec at that length, draws, schedule, verdict, and the seconds and
    requests of every pipeline simulated on the way."""

    cfg: RacsimConf
    draws: Any
    sched: Any
    verdict: steady.Verdict
    steps: int
    pipeline_s: float
    requests: int


def sized_run(cfg: RacsimConf, name: str, tell=None, note=None, work_per_s: Optional[float] = None) -> Sized:
    """Simulate one count's asynchronous pipeline at a length that shows its steady state.
    ``capacity.run_length=auto``: from ``pipeline.steps``, doubled up to ``capacity.max_steps``
    until the series of requests in the channel at each step's start (mean over trials) is
    stationary after its warm-up (MSER-5 unless ``pipeline.warmup_steps`` is set;
    :func:`racsim.pipeline.steady.verdict`); ``fixed``: the length and warm-up as given. With
    slow regimes (:func:`~racsim.analyses.capacity.regimes.regime_window`) the run starts at the
    window they need and its warm-up (:func:`~racsim.analyses.capacity.regimes.regime_warmup`: the
    regime's chain's where the regimes start stationary, else MSER-5), up to ``capacity.max_steps`` and within
    the ``limits``, doubles until the window after the warm-up holds it too, and is judged by the
    trials' slopes (:func:`racsim.pipeline.steady.trials_verdict`).
    ``tell(note)``: called before each doubling (a long run says why it goes on); ``note(text)``: told
    how far each simulation is as it runs (racsim.analyses.bias_study.share_note); ``work_per_s``: as
    :func:`run_plan`'s."""
    cap = cfg.capacity
    auto = cap.run_length == "auto"
    need, cut, steps = run_plan(cfg, name, work_per_s)
    spent, requests = 0.0, 0
    if steps != int(cfg.pipeline.steps):  # the regimes' window after their warm-up
        check_limits(replace_at(cfg, "pipeline.steps", steps))  # refused before it runs when too big
    while True:
        c = replace_at(cfg, "pipeline.steps", steps)
        t0 = time.perf_counter()
        draws = draw(c.pipeline, int(c.learner.trials), rng_for(c.seed, "pipeline"))  # as the bias study draws
        sched = simulate(c.pipeline, int(c.learner.trials), None, draws=draws,
                         tick=share_note(note, f"simulating {steps:,} steps"))
        spent += time.perf_counter() - t0
        requests += requests_per_schedule(c)
        series = steady.in_system(sched, sched.channel_names.index(name))
        given = given_warmup(c, cut, need)
        v = steady.trials_verdict(series, given) if need else steady.verdict(series, given)
        if (v.stationary and steps - v.warmup >= need) or not auto:
            return Sized(c, draws, sched, v, steps, spent, requests)
        if steps * 2 > cap.max_steps:  # no longer run allowed: a window short of the regimes' is no steady state
            return Sized(c, draws, sched, short_of_regimes(v, steps, need, cap.max_steps), steps, spent, requests)
        if tell is not None:
            tell(doubling_note(v, steps, need))
        steps *= 2


def given_warmup(c: RacsimConf, cut: Optional[int], need: int = 0) -> Optional[int]:
    """The warm-up run ``c`` is given (None: MSER-5 finds it): the regimes' ``cut`` (:func:`run_plan`),
    at most half a run that ``capacity.max_steps`` keeps shorter than ``cut`` and the ``need`` steps
    after it; else ``pipeline.warmup_steps`` (with ``capacity.run_length=fixed``, a fifth of the run
    when null)."""
    if cut is not None:
        steps = int(c.pipeline.steps)
        return cut if steps >= cut + need else min(cut, steps // 2)
    return None if c.capacity.run_length == "auto" and c.pipeline.warmup_steps is None else warmup_steps(c.pipeline)


def short_of_regimes(v: steady.Verdict, steps: int, need: int, max_steps: int) -> steady.Verdict:
    """The verdict on the longest run allowed: a stationary window shorter than the ``need`` steps
    its slow regimes need is no steady state."""
    if not v.stationary:
        return v
    return steady.Verdict(v.warmup, False, f"{steps - v.warmup} steps after the warm-up, short of the "
                                           f"{need} its slow regimes need (capacity.max_steps = {max_steps})")


def doubling_note(v: steady.Verdict, steps: int, need: int) -> str:
    """Why a ``steps``-step run is doubled: not stationary, or its window short of the regimes' ``need``."""
    if not v.stationary:
        return f"not stationary at {steps} steps ({v.reason}), running {2 * steps}"
    return (f"{steps - v.warmup} steps after the warm-up at {steps} steps, short of the {need} the slow "
            f"regimes need, running {2 * steps}")


def settle(cfg: RacsimConf, name: str, tell=None, note=None, work_per_s: Optional[float] = None) -> Settled:
    """Run one count at a length that shows its steady state (:func:`sized_run`; ``tell``: its
    note before each doubling; ``note``: how far each simulation is; ``work_per_s``: as
    :func:`run_plan`'s); the bias study then reuses the simulated asynchronous schedule."""
    prefetch_trajectories(cfg, first_length(cfg, name, work_per_s))  # the bias study's, at the run's first length
    run = sized_run(cfg, name, tell, note, work_per_s)
    if note is not None:
        note(f"the bias study of {run.steps:,} steps")
    c = replace_at(run.cfg, "pipeline.warmup_steps", run.verdict.warmup)
    res = run_bias_study(expand(c), known=Known(run.draws, run.sched))
    requests = run.requests
    if any(n in BLOCKING for n in corrector_names(c)):  # the study simulated the blocking pipeline
        requests += requests_per_schedule(c)
    return Settled(res, run.verdict, run.steps, run.pipeline_s + float(res.timings.get("pipeline_s", 0.0)), requests)
