"""A pool of GPUs split between the rollout engines, the trainer and the judge (issue 46, point 4;
docs/generation.md, "Splitting a pool of GPUs"): ``capacity.enabled`` with ``pipeline.generation.mode=async``
and ``capacity.split.gpus`` = N.

Each split (e engine GPUs, t trainer GPUs, j judge GPUs, e + t + j = N) is one run of the asynchronous
pipeline at a length that shows its steady state: its steps' seconds, the mean lag of each step's batch and the
judge's requests in the system, each read by MSER-5 and batch means (racsim.pipeline.steady) after the latest
of their warm-ups; with ``capacity.run_length=auto`` the run doubles up to ``capacity.max_steps`` until they are
stationary. It is read as a capacity count is: the trainer's steps per hour and the mean lag with Student's t
intervals over the trials (independent replications from empty), the head lag's p95 with the interval of a
pooled quantile (racsim.pipeline.steady.quantile_interval), the judge's offered load (its work per step,
racsim.analyses.capacity.load, over the trainer's mean step and its servers), its dropped share and service
figures with their intervals, and where a bias target is set the exact bias of ``capacity.corrector`` and its
ratio to naive's (racsim.analyses.capacity.intervals). A split meets a target when the upper end of its
figure's interval does (racsim.analyses.capacity.targets), the lag caps likewise.

The answer is, among the splits that meet every target, the one with the smallest mean lag of those whose
interval of steps per hour overlaps the best one's (splits the runs cannot tell apart by throughput are tied,
and their point estimates' order is a seed's luck). It depends on the splits ranked above it, each of which must fail for sure: one
whose only failures are intervals straddling their targets is simulated again as independent replications
until each lies on one side or ``capacity.decide_steps`` runs out (racsim.analyses.capacity.stopping, the
capacity search's rule); a split left undecided is named in a note and the answer stays on the safe side, the
split known to meet the targets. Splits are visited by their steps per hour, so that the bias study, the
costliest figure, runs only where it decides the answer.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pandas as pd

from racsim.analyses.bias_study import Known, run_bias_study
from racsim.analyses.capacity import stopping
from racsim.analyses.capacity.channel import count_key, is_gpu, units_per_server
from racsim.analyses.capacity.intervals import (Units, batch_units, bias_intervals, channel_intervals, interval_units,
                                                replicate_figures)
from racsim.analyses.capacity.length import doubling_note
from racsim.analyses.capacity.load import LoadBasis, load_basis
from racsim.analyses.capacity.replications import apply_decision, judged_only
from racsim.analyses.capacity.rows import bias_figures, channel_figures, status
from racsim.analyses.capacity.targets import TARGET_FIGURES, failed, targets_of
from racsim.analyses.grid import expand
from racsim.config.schema import RacsimConf, warmup_steps
from racsim.config.spec import replace_at
from racsim.config.validate import split_judge, split_unit, validate
from racsim.errors import ConfigError
from racsim.generation.figures import generation_table
from racsim.generation.schedule import async_schedules
from racsim.learner.bias import bootstrap_counts
from racsim.pipeline import steady
from racsim.pipeline.stats import channel_stats, queue_workers
from racsim.progress import Progress
from racsim.seeds import rng_for

ENGINES_KEY = "pipeline.generation.engines.gpus"
TRAINER_KEY = "pipeline.generation.trainer.gpus"
SPLITS, DECIDING, ANSWER = "pool split", "deciding replications", "the answer's run"  # progress phases
BIAS_KEYS = tuple(stopping.BIAS_TARGETS)
# capacity's targets on the judge's figures: not targets where no judge is sized
JUDGE_KEYS = tuple(k for k in TARGET_FIGURES if k not in BIAS_KEYS and k != "max_step_s")


@dataclass(frozen=True)
class Split:
    """GPUs of the engines, the trainer and the judge (0: no judge sized)."""

    engines: int
    trainer: int
    judge: int

    def text(self) -> str:
        return f"{self.engines} engines, {self.trainer} trainer" + (f", {self.judge} judge" if self.judge else "")


def splits_of(cfg: RacsimConf, judge: Optional[str]) -> List[Split]:
    """Every split tried: the engines' GPU counts (``capacity.split.engines``, or every multiple of their tp) by
    the judge's (``capacity.split.judge``, or every multiple of a server's GPUs; none without a judge), each
    leaving the trainer at least one GPU, in that order."""
    s, tp = cfg.capacity.split, int(cfg.pipeline.generation.engines.tp)
    n, unit = int(s.gpus), split_unit(cfg, judge)
    engines = sorted(set(s.engines)) if s.engines is not None else list(range(tp, n, tp))
    judges = ([0] if judge is None else sorted(set(s.judge)) if s.judge is not None
              else list(range(unit, n - tp, unit)))
    return [Split(e, n - e - j, j) for e in engines for j in judges if n - e - j >= 1]


def judge_count(cfg: RacsimConf, judge: str, gpus: int) -> int:
    """The judge's count at ``gpus`` GPUs: a gpu_rm pool's GPUs, or a queue channel's workers
    (``capacity.split.workers_per_gpu`` a GPU)."""
    return gpus if is_gpu(cfg, judge) else gpus * int(cfg.capacity.split.workers_per_gpu)


def at_split(cfg: RacsimConf, s: Split, judge: Optional[str]) -> RacsimConf:
    """A new spec: one ordinary async run at split ``s`` (capacity planning off)."""
    c = replace_at(replace_at(replace_at(cfg, "capacity.enabled", False), ENGINES_KEY, s.engines), TRAINER_KEY,
                   s.trainer)
    return c if judge is None else replace_at(c, count_key(cfg, judge), judge_count(cfg, judge, s.judge))


def split_targets(cfg: RacsimConf, judge: Optional[str]) -> Dict[str, Any]:
    """What a split must meet: capacity's targets (the judge's only where one is sized) and the lag caps."""
    t = targets_of(cfg)
    if judge is None:
        t.update({k: None for k in JUDGE_KEYS})
    t.update({k: getattr(cfg.capacity.split, k) for k in stopping.LAG_TARGETS})
    return t


def split_fails(row: Dict[str, Any], targets: Dict[str, Any]) -> List[str]:
    """What a split's row fails (racsim.analyses.capacity.targets.failed, then the lag caps): "load" when its
    judge is overloaded, "stationarity" when it shows no steady state, else each target whose figure's
    interval's upper end exceeds it."""
    out = failed(row, targets)
    if row["status"] != "ok":
        return out
    return out + [k for k, fig in stopping.LAG_TARGETS.items()
                  if targets.get(k) is not None and not row[f"{fig}_hi"] <= targets[k]]


def fails_text(row: Dict[str, Any], targets: Dict[str, Any]) -> str:
    """:func:`split_fails` as the table's ``fails`` column writes it; a split ranked below the answer whose
    bias was not needed (a bias target set, nothing else failed) says so."""
    unread = needs_bias(targets) and row["status"] == "ok" and "bias_exact" not in row
    out = split_fails(row, {**targets, **{k: None for k in BIAS_KEYS}} if unread else targets)
    return ", ".join(out) if out or not unread else "(bias not read)"


def needs_bias(targets: Dict[str, Any]) -> bool:
    return any(targets.get(k) is not None for k in BIAS_KEYS)


def schedule_of(c: RacsimConf, rng: np.random.Generator):
    """The async schedule of spec ``c`` (what every non-blocking corrector reads) from the stream ``rng``."""
    return async_schedules(c.pipeline, int(c.learner.trials), rng, blocking=False, engine=c.pipeline.engine)["async"]


def step_series(sched, judge: Optional[str]) -> List[np.ndarray]:
    """The (trials, steps) series a split's steady state is read on: each step's seconds, the mean lag of the
    batch it trains, and the judge's requests in the system at each step's start."""
    out = [np.diff(sched.step_start, axis=1), sched.generation.mean_lag.mean(axis=2)]
    if judge is not None:
        out.append(steady.in_system(sched, sched.channel_names.index(judge)))
    return out


def joint_verdict(xs: List[np.ndarray], given: Optional[int]) -> steady.Verdict:
    """One verdict on several per-step series of one run (racsim.pipeline.steady.verdict): not stationary when
    one is not; else the latest of their warm-ups (``given``: the warm-up itself), after which each must be."""
    first = [steady.verdict(x, given) for x in xs]
    bad = next((v for v in first if not v.stationary), None)
    if bad is not None:
        return bad
    warm = max(v.warmup for v in first)
    again = [steady.verdict(x, warm) for x in xs]
    return next((v for v in again if not v.stationary), steady.Verdict(warm, True))


@dataclass
class Run:
    """A split's run at the length that shows its steady state: its spec there (the warm-up set), its async
    schedule, the verdict, its length and the seconds every doubling took."""

    cfg: RacsimConf
    sched: Any
    verdict: steady.Verdict
    steps: int
    seconds: float


def settle(cfg: RacsimConf, judge: Optional[str], hopeless=None, tell=None) -> Run:
    """Split ``cfg`` (:func:`at_split`) run from ``pipeline.steps`` and, with ``capacity.run_length=auto``,
    doubled up to ``capacity.max_steps`` until :func:`joint_verdict` finds it stationary (its warm-up by MSER-5
    unless ``pipeline.warmup_steps`` is set; ``fixed``: as given), or ``hopeless(sched, verdict)`` says why no
    longer run can make it meet the targets (its verdict's reason then says so). ``tell(note)``: before each
    doubling."""
    cap, t0, steps = cfg.capacity, time.perf_counter(), int(cfg.pipeline.steps)
    auto = cap.run_length == "auto"
    while True:
        c = replace_at(cfg, "pipeline.steps", steps)
        sched = schedule_of(c, rng_for(c.seed, "pipeline"))  # the stream the bias study draws the same schedule from
        given = None if auto and c.pipeline.warmup_steps is None else warmup_steps(c.pipeline)
        v = joint_verdict(step_series(sched, judge), given)
        why = None if v.stationary or hopeless is None else hopeless(sched, v)
        if why:
            v = steady.Verdict(v.warmup, False, f"{v.reason}; {why}")
        if v.stationary or why or not auto or steps * 2 > cap.max_steps:
            return Run(replace_at(c, "pipeline.warmup_steps", int(v.warmup)), sched, v, steps,
                       time.perf_counter() - t0)
        if tell is not None:
            tell(doubling_note(v, steps, 0))
        steps *= 2


def lag_rising_above(sched, warmup: int, cap: Optional[float], level: float) -> bool:
    """Whether a run's mean lag lies above ``cap`` and still rises: the lower end of its interval over the
    window from ``warmup`` exceeds the cap, and the window's last quarter is at least as stale as the whole.
    A longer run then reads it higher still (a growing lag, or a warm-up toward a level above the cap)."""
    if cap is None:
        return False
    lag = sched.generation.mean_lag[:, warmup:].mean(axis=2)  # (trials, window steps)
    _, lo, _ = stopping.mean_interval(lag.mean(axis=1), level)
    return bool(lo > cap and lag[:, -max(1, lag.shape[1] // 4):].mean() >= lag.mean())


def split_units(c: RacsimConf, judge: Optional[str], trials: int, warmup: int, steps: int) -> Units:
    """The units a split's bootstrap intervals resample: the judge's (racsim.analyses.capacity.intervals), or
    the trials where no judge is sized."""
    if judge is not None:
        return interval_units(c, judge, trials, warmup, steps)
    counts = bootstrap_counts(trials, int(c.capacity.resamples), rng_for(c.seed, "capacity_intervals"))
    return Units(batch_units(trials, steps - warmup, 1), 1, counts)


def lag_figures(sched, warmup: int, units: Optional[Units] = None, level: float = 0.95) -> Dict[str, float]:
    """The lags of a run's trained samples from step ``warmup`` on: the mean lag (t minus the token-weighted
    version) and the head lag's p95 (the first lag whose cumulative share reaches 0.95), with ``units`` their
    intervals: Student's t over the trials' means, and the pooled quantile's
    (racsim.pipeline.steady.quantile_interval)."""
    rec = sched.generation
    head = rec.head_lag[:, warmup:]
    out = {"mean_lag": float(rec.mean_lag[:, warmup:].mean()),
           "head_lag_p95": float(np.quantile(head, 0.95, method="inverted_cdf"))}
    if units is not None:
        _, out["mean_lag_lo"], out["mean_lag_hi"] = stopping.mean_interval(
            rec.mean_lag[:, warmup:].mean(axis=(1, 2)), level)
        unit = np.broadcast_to(units.of[:, :, None], head.shape)
        out["head_lag_p95_lo"], out["head_lag_p95_hi"] = steady.quantile_interval(
            head.ravel(), unit.ravel(), 0.95, units.counts, level)
    return out


def rate_figures(sched, warmup: int, level: float) -> Dict[str, float]:
    """The trainer's mean seconds per step from step ``warmup`` on (each trial's, Student's t interval over the
    trials) and the steps per hour it makes, whose interval is the seconds' read upside down."""
    s = sched.generation.step_start
    per = (s[:, -1] - s[:, warmup]) / (s.shape[1] - 1 - warmup)
    step, lo, hi = stopping.mean_interval(per, level)
    return {"steps_per_hour": 3600.0 / step, "steps_per_hour_lo": 3600.0 / hi,
            "steps_per_hour_hi": 3600.0 / lo if lo > 0 else math.inf, "step_s": step, "step_s_lo": lo, "step_s_hi": hi}


def split_row(cfg: RacsimConf, s: Split, run: Run, judge: Optional[str], basis: Optional[LoadBasis]) -> Dict[str, Any]:
    """A split's row of the table: its GPUs, run, rates, lags (each with its interval), the lag split and the
    idle shares (racsim.generation.figures), and the judge's offered load and figures (with their intervals)."""
    c, sched, w, lvl = run.cfg, run.sched, int(run.verdict.warmup), float(cfg.capacity.confidence)
    gen = generation_table(sched, w).iloc[0]
    units = split_units(c, judge, sched.n_trials, w, run.steps)
    row: Dict[str, Any] = {"engines": s.engines, "trainer": s.trainer, "judge": s.judge, "steps": run.steps,
                           "warmup_steps": w, "stationary": bool(run.verdict.stationary),
                           **rate_figures(sched, w, lvl), **lag_figures(sched, w, units, lvl)}
    row.update({k: gen[k] for k in ("mean_lag_before_queue", "mean_lag_in_queue", "engine_idle", "trainer_waiting",
                                    "binds")})
    row["queue_dropped"] = float(gen["dropped_share"])
    row["load"] = 0.0
    if judge is not None:
        row["load"] = judge_load(cfg, s, judge, basis, row["step_s"])
        chans = channel_stats(sched, queue_workers(c.pipeline.channels), w)
        ch = chans[chans.channel == judge].iloc[0]
        row.update(channel_figures(ch))
        row.update(channel_intervals(sched, sched.channel_names.index(judge), ch["workers"], w, units, lvl))
    row["replications"] = 1
    row["status"] = status(row, cfg)
    if row["status"].startswith("not stationary"):
        row["status"] = f"not stationary at {run.steps} steps ({run.verdict.reason})"
    return row


def judge_load(cfg: RacsimConf, s: Split, judge: str, basis: LoadBasis, step_s: float) -> float:
    """The judge's offered load at split ``s``: its work per step (``basis``, racsim.analyses.capacity.load:
    the same at every split) per second of the trainer's mean step ``step_s``, over its servers."""
    servers = judge_count(cfg, judge, s.judge) // units_per_server(cfg, judge)
    return steady.offered_load(basis.work_step, step_s, servers)


def bias_row(cfg: RacsimConf, run: Run, judge: Optional[str]) -> Dict[str, float]:
    """``capacity.corrector``'s exact bias on a split's run and its ratio to naive's, with their intervals
    (the bias study on the run's schedule, those two correctors: racsim.analyses.capacity.replications.judged_only)."""
    chosen = str(cfg.capacity.corrector)
    res = run_bias_study(expand(judged_only(run.cfg, chosen)), known=Known(None, run.sched))
    r = res.results.set_index("corrector")
    units = split_units(run.cfg, judge, run.sched.n_trials, int(run.verdict.warmup), run.steps)
    return bias_figures(r.loc[chosen], bias_intervals(res.bias, units, float(cfg.capacity.confidence))[chosen],
                        r.loc["naive"])


@dataclass
class SplitResult:
    """A pool split's answer: one row per split tried (``table``: split.csv), the recommended split (None: none
    meets the targets) and the next best, the targets, the run at the answer (a RunResult: every corrector),
    the notes (splits the replications left undecided) and timings."""

    table: pd.DataFrame
    gpus: int
    judge: Optional[str]
    recommended: Optional[Split]
    targets: Dict[str, Any]
    runner_up: Optional[Split] = None  # the split with the most steps per hour, the answer aside, that meets them
    best: Any = None
    notes: List[str] = field(default_factory=list)
    timings: Dict[str, float] = field(default_factory=dict)
    replicated_steps: int = 0
    level: float = 0.95
    corrector: str = "rac"

    @property
    def status(self) -> str:
        """``recommended``, or ``infeasible`` when no split of the pool meets the targets (the command exits 3)."""
        return "recommended" if self.recommended is not None else "infeasible"


@dataclass
class SplitSearch:
    """A pool split under way: the spec, the judge, the targets, and per split evaluated its row and run."""

    cfg: RacsimConf
    judge: Optional[str]
    targets: Dict[str, Any]
    basis: Optional[LoadBasis]
    progress: Progress
    rows: Dict[Split, Dict[str, Any]] = field(default_factory=dict)
    runs: Dict[Split, Run] = field(default_factory=dict)
    timings: Dict[str, float] = field(default_factory=lambda: {"runs_s": 0.0, "bias_s": 0.0})

    def hopeless(self, s: Split):
        """Why no longer run of split ``s`` can meet the targets, or None: its judge overloaded (load at least
        capacity.max_load over the run so far), or its mean lag above capacity.split.max_mean_lag and rising
        (:func:`lag_rising_above`). A split that settles neither way doubles as a capacity count does."""
        cap = self.cfg.capacity

        def why(sched, v: steady.Verdict) -> Optional[str]:
            w = min(int(v.warmup), sched.n_steps - 2)
            if self.judge is not None:
                load = judge_load(self.cfg, s, self.judge, self.basis, rate_figures(sched, w, 0.95)["step_s"])
                if load >= cap.max_load:
                    return f"its judge overloaded (load {load:.3g} >= capacity.max_load {cap.max_load:g})"
            if lag_rising_above(sched, w, cap.split.max_mean_lag, float(cap.confidence)):
                return f"its mean lag above capacity.split.max_mean_lag = {cap.split.max_mean_lag:g} and rising"
            return None

        return why

    def evaluate(self, s: Split) -> None:
        """Split ``s`` run to its steady state and read (:func:`split_row`)."""
        run = settle(at_split(self.cfg, s, self.judge), self.judge, self.hopeless(s),
                     lambda note: self.progress.note(f"{s.text()}: {note}", line=True))
        self.timings["runs_s"] += run.seconds
        self.runs[s] = run
        self.rows[s] = split_row(self.cfg, s, run, self.judge, self.basis)

    def with_bias(self, s: Split) -> Dict[str, Any]:
        """Split ``s``'s row, its bias figures added first where a bias target is set and it is steady."""
        row = self.rows[s]
        if needs_bias(self.targets) and row["status"] == "ok" and "bias_exact" not in row:
            t0 = time.perf_counter()
            row.update(bias_row(self.cfg, self.runs[s], self.judge))
            self.timings["bias_s"] += time.perf_counter() - t0
        return row

    def passes(self, s: Split) -> bool:
        """Does split ``s`` meet every target? Its bias is computed only where nothing else fails."""
        row = self.rows[s]
        if split_fails(row, {**self.targets, **{k: None for k in BIAS_KEYS}}):
            return False
        return not split_fails(self.with_bias(s), self.targets)

    def ranked(self) -> List[Split]:
        """The splits by steps per hour (most first; ties: the smaller mean lag, then fewer engine GPUs)."""
        def key(s: Split):
            r = self.rows[s]
            return (-np.nan_to_num(r["steps_per_hour"], nan=-np.inf), np.nan_to_num(r["mean_lag"], nan=np.inf),
                    s.engines, s.judge)
        return sorted(self.rows, key=key)

    def answer(self) -> Optional[Split]:
        """Of the splits that meet every target (None: none does), the one with the smallest mean lag (then fewer
        engine, then judge GPUs) among those whose interval of steps per hour overlaps that of the one with the
        most: splits whose steps per hour the runs cannot tell apart are tied, and the point estimates' order
        among them is a seed's luck."""
        passing = [s for s in self.ranked() if self.passes(s)]
        if not passing:
            return None
        top = self.rows[passing[0]]
        tied = [s for s in passing if self.rows[s]["steps_per_hour_hi"] >= top["steps_per_hour_lo"]]
        return min(tied, key=lambda s: (self.rows[s]["mean_lag"], s.engines, s.judge))

    def open_keys(self, s: Split) -> List[str]:
        """The targets split ``s`` fails only by an interval straddling them (stopping.open_targets), where it
        fails nothing for sure; else none (replications cannot make it pass). Its bias is read only where no
        other target fails for sure."""
        row = self.rows[s]
        if row["status"] != "ok":
            return []
        others = {**self.targets, **{k: None for k in BIAS_KEYS}}
        if set(split_fails(row, others)) - set(stopping.open_targets(row, others, zero=False, bias=True)):
            return []
        row = self.with_bias(s)
        keys = stopping.open_targets(row, self.targets, zero=False, bias=True)
        return keys if keys and set(split_fails(row, self.targets)) <= set(keys) else []

    def decide(self) -> tuple:
        """Each split ranked above the answer that fails only by intervals straddling their targets, decided by
        independent replications (:func:`decide_split`) within one budget of ``capacity.decide_steps`` and
        ``capacity.decide_s``; the answer read again after each. Returns (budget, decisions)."""
        cap = self.cfg.capacity
        budget = stopping.Budget(int(cap.decide_steps), math.inf if cap.decide_s is None else float(cap.decide_s))
        if cap.decide_steps > 0:
            self.progress.start(DECIDING, int(cap.decide_steps), "replicated step", upto=True)
        decisions: Dict[Split, stopping.Decision] = {}
        while True:
            best = self.answer()
            ranked = self.ranked()
            above = ranked[: ranked.index(best)] if best is not None else ranked
            todo = [(s, keys) for s in above if s not in decisions for keys in [self.open_keys(s)] if keys]
            if not todo:
                return budget, decisions
            s, keys = todo[0]
            decisions[s] = decide_split(self.cfg, s, self.runs[s], self.rows[s], self.judge, keys, self.targets,
                                        budget, lambda note, s=s: self.progress.note(f"{s.text()}: {note}", line=True))
            if cap.decide_steps > 0:
                self.progress.update(budget.used)


def split_figures(c: RacsimConf, sched, judge: Optional[str], warmup: int) -> stopping.Replicate:
    """A run's figures as a replication (:class:`stopping.Replicate`) from step ``warmup`` on: the judge's
    rare-event figures (racsim.analyses.capacity.intervals.replicate_figures; none without a judge) and its
    lags among the figures read over the runs."""
    if judge is not None:
        out = replicate_figures(sched, c, judge, warmup)
    else:
        none = np.zeros(sched.n_trials)
        out = stopping.Replicate(dropped=none, sent=none, episodes=none.astype(np.int64),
                                 steps=int(sched.generation.mean_lag.shape[1]) - warmup, samples={})
    out.means.update(lag_figures(sched, warmup))
    return out


def replicate_split(cfg: RacsimConf, s: Split, run: Run, judge: Optional[str], lanes: int, steps: int, r: int,
                    bias: bool) -> stopping.Replicate:
    """Replication ``r`` (>= 1) of split ``s``: its asynchronous pipeline alone on ``lanes`` trials of ``steps``
    steps, warm from the settled run's warm-up, drawn from the stream ``capacity_replication`` split by ``r``,
    its lanes and its length (the same for every split): :func:`split_figures`, and with ``bias`` the chosen
    corrector's bias figures on its schedule."""
    w = int(run.verdict.warmup)
    c = replace_at(replace_at(run.cfg, "pipeline.steps", int(steps)), "learner.trials", int(lanes))
    sched = schedule_of(c, rng_for(cfg.seed, "capacity_replication", r, int(lanes), int(steps)))
    out = split_figures(c, sched, judge, w)
    if bias:
        row = bias_row(cfg, Run(c, sched, run.verdict, int(steps), 0.0), judge)
        out.means.update({fig: row[fig] for fig in stopping.BIAS_TARGETS.values()})
    return out


def decide_split(cfg: RacsimConf, s: Split, run: Run, row: Dict[str, Any], judge: Optional[str], keys: List[str],
                 targets: Dict[str, Any], budget: stopping.Budget, tell=None) -> stopping.Decision:
    """Split ``s``'s undecided figures (``keys``) decided by independent replications (stopping.sequential, the
    settled run the first, each stage as long as all before it: no chain sizes them); their intervals on the
    replications replace the row's (in place)."""
    w, lanes = int(run.verdict.warmup), int(run.sched.n_trials)
    first = split_figures(run.cfg, run.sched, judge, w)
    first.means.update({fig: row.get(fig, np.nan) for fig in stopping.BIAS_TARGETS.values()})
    bias = bool(set(keys) & set(BIAS_KEYS))
    plan = stopping.Plan(need=0.0, length=0.0, warmup=w, lanes=lanes, first=run.steps - w, cap=run.steps)

    def replicate(r: int, runs: List[Tuple[int, int]]) -> List[stopping.Replicate]:
        if tell is not None:
            tell(f"replication {r + 1}{f'-{r + len(runs)}' if len(runs) > 1 else ''}, {', '.join(keys)} undecided")
        return [replicate_split(cfg, s, run, judge, n, k, r + i, bias) for i, (n, k) in enumerate(runs)]

    found = stopping.sequential(first, replicate, keys, targets, float(cfg.capacity.confidence), plan, budget)
    apply_decision([row], row, found)
    return found


def undecided_note(s: Split, d: stopping.Decision, targets: Dict[str, Any]) -> str:
    """A split ranked above the answer that the replications left undecided, and the side the answer keeps."""
    what = "; ".join(f"{k.removeprefix('max_').replace('_', ' ')} {v:.4g} [{lo:.4g}, {hi:.4g}] against "
                     f"{targets[k]:g}" for k, (v, lo, hi) in d.found.items() if k in d.open)
    return (f"Note: {s.text()} may meet the targets ({what}, in {len(d.reps)} replications; capacity.decide_steps "
            f"or capacity.decide_s ran out): the answer keeps the split known to meet them.")


def run_split(cfg: RacsimConf, progress: Optional[Progress] = None) -> SplitResult:
    """Every split of ``capacity.split.gpus`` evaluated and the answer decided (see the module docstring);
    then the ordinary run at the answer (every corrector, with its training), for its files.
    ``progress``: the phases ``pool split`` (a unit per split), ``deciding replications``, ``the answer's run``."""
    progress = progress or Progress.off()
    validate(cfg)
    t0 = time.perf_counter()
    judge = split_judge(cfg.capacity, cfg.pipeline.channels)
    splits = splits_of(cfg, judge)
    limit = int(cfg.limits.capacity_counts)
    if len(splits) > limit:
        raise ConfigError("capacity.split.gpus", cfg.capacity.split.gpus,
                          f"a pool of at most {limit} splits (limits.capacity_counts): it has {len(splits)}; list "
                          f"the counts to try in capacity.split.engines and capacity.split.judge")
    targets = split_targets(cfg, judge)
    progress.plan(SPLITS, *([DECIDING] if cfg.capacity.decide_steps > 0 else []), ANSWER)
    progress.start(SPLITS, len(splits), "split")
    search = SplitSearch(cfg, judge, targets, load_basis(cfg, judge) if judge is not None else None, progress)
    for s in splits:
        search.evaluate(s)
        progress.advance(1, f"{s.text()}: {search.rows[s]['steps_per_hour']:.4g} steps/h")
    budget, decisions = search.decide()
    best = search.answer()
    ranked = search.ranked()
    runner = None if best is None else next((s for s in ranked if s != best and search.passes(s)), None)
    notes = [undecided_note(s, d, targets) for s, d in decisions.items() if not d.decided]
    for row in search.rows.values():  # what each split fails, once its figures are final
        row["fails"] = fails_text(row, targets)
    table = pd.DataFrame([search.rows[s] for s in splits])
    res = None
    if best is not None:
        progress.start(ANSWER, 1, "run", note=best.text())
        run = search.runs[best]
        res = run_bias_study(expand(run.cfg), known=Known(None, run.sched))
        progress.advance()
    search.timings["split_s"] = time.perf_counter() - t0
    return SplitResult(table=table, gpus=int(cfg.capacity.split.gpus), judge=judge, recommended=best,
                       runner_up=runner, targets=targets, best=res, notes=notes, timings=search.timings,
                       replicated_steps=budget.used,
                       level=float(cfg.capacity.confidence), corrector=str(cfg.capacity.corrector))
