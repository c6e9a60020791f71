"""The LM study (``learner.kind=lm``): pipeline -> arrival schedules -> GRPO with
every corrector on ``learner.lm.seeds`` runs -> tables, per grid cell.

The schedules come from the same simulation as the tabular learner's
(:func:`racsim.analyses.bias_study.simulate_schedules`, one lane per seed); a
pipeline sample is one prompt's group of responses. Every corrector's run of
seed s starts from the same weights and draws from the same random stream
(common random numbers: the same prompts and the same uniforms behind every
sampled token at every step, the same delays, wait_for_slow's from the same
draws), so the curves differ by the corrector alone, and the study compares
correctors by paired differences over seeds (:func:`paired_differences`).

How many seeds: the seed rule (:func:`sequential_seeds`) trains stages of seeds
(``learner.lm.seeds``, then doubling up to ``max_seeds``; each stage's seeds of a
corrector as one batch) and reads every pair's interval after each stage, until
the pairs of ``learner.lm.decide`` are answered: better or worse (the interval
excludes 0) or the same (narrower than ``learner.lm.bound``). Reading the
intervals again after each stage would make a wrong answer likelier than a
single interval's 5%; each look's interval is therefore at the level
:func:`look_level` gives (Bonferroni over the planned looks), so that all of a
pair's intervals hold together with 95% confidence. A time budget
(``budget_s``) may end the rule before a stage it projects would not finish in
time, and the run then says so: the seeds, not the clock, decide otherwise, so
the same config and seed give the same answer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import pandas as pd
from scipy import stats

from racsim.analyses.bias_study import with_values, corrector_names, corrector_params, simulate_schedules
from racsim.analyses.result import RunResult
from racsim.learner.bandit import BanditPolicy
from racsim.learner.bias import corrector_slack, kernel_slack, schedule_for
from racsim.learner.theory import measured_kernel
from racsim.learner.grpo import (
    LaneCurve,
    Policy,
    RewardTask,
    lane_slices,
    make_task,
    missing_fraction,
    missing_share,
    train_lane,
    train_lanes,
)
from racsim.pipeline.stats import queue_timeseries
from racsim.progress import Progress
from racsim.seeds import seed_sequence

Z95 = 1.959963984540054  # two-sided 95% normal quantile: the CIs over seeds are mean +- Z95 * s.e.


def build_task(lm: Any) -> RewardTask:
    return make_task(lm.n_prompts, lm.prompt_len, lm.response_len, lm.vocab, lm.proxy_correlation, lm.task_seed)


def make_policy(lm: Any, task: RewardTask, seed: int) -> Policy:
    """The transformer policy, or its NumPy stand-in (``learner.lm.policy=bandit``)."""
    if lm.policy == "bandit":
        return BanditPolicy(task, lm.n_responses, lm.optimizer, lm.lr, seed)
    from racsim.learner.lm import TransformerPolicy  # lazy: torch and transformers load only for this learner

    return TransformerPolicy(task.prompts, lm.vocab, lm.response_len, lm, seed, reference=lm.kl_coef > 0)


def checkpoint_steps(steps: int, count: int) -> List[int]:
    """``count`` evenly spaced steps strictly inside the run (distinct)."""
    return sorted({int(round((i + 1) * steps / (count + 1))) for i in range(count)} - {steps})


def mean_ci(x: np.ndarray) -> tuple:
    """Mean over seeds (axis 0) and the half-width of its normal 95% CI."""
    x = np.asarray(x, dtype=np.float64)
    return x.mean(axis=0), Z95 * x.std(axis=0, ddof=1) / np.sqrt(x.shape[0])


def value_at_clock(wallclock: np.ndarray, values: np.ndarray, seconds, window: int) -> np.ndarray:
    """Per lane: the mean of ``values`` over the last ``window`` steps completed within
    ``seconds`` of simulated wall-clock (a number, or one per lane; entry i of ``values``
    belongs to the policy after i updates; wallclock (lanes, steps + 1) as in an ArrivalSchedule)."""
    budget = np.broadcast_to(np.asarray(seconds, dtype=np.float64), (wallclock.shape[0],))[:, None]
    done = (wallclock[:, 1:] - wallclock[:, :1] <= budget + 1e-9).sum(axis=1)
    return np.array([values[i, max(0, d - window + 1): d + 1].mean() for i, d in enumerate(done)])


def t_halfwidth(sd, n: int, level: float = 0.95):
    """Half-width of the two-sided Student-t interval of a mean of ``n`` values with
    standard deviation ``sd``: t_{(1 + level) / 2, n - 1} sd / sqrt(n)."""
    return stats.t.ppf(0.5 + level / 2, n - 1) * np.asarray(sd) / np.sqrt(n)


LEVEL = 0.95  # the confidence that a pair's intervals hold with, all of the seed rule's looks together


def look_plan(first: int, most: int) -> List[int]:
    """The seed counts at which the seed rule reads the paired intervals: ``first``, doubled until
    ``most`` (the last look at ``most`` itself; ``first`` alone when ``most`` <= ``first``)."""
    plan = [first]
    while plan[-1] < most:
        plan.append(min(2 * plan[-1], most))
    return plan


def look_level(looks: int, level: float = LEVEL) -> float:
    """The confidence of each look's interval such that the intervals of all ``looks`` planned looks
    hold together with probability at least ``level`` (Bonferroni): 1 - (1 - level) / looks."""
    return 1.0 - (1.0 - level) / looks


def answer(lo: float, hi: float, bound: float) -> str:
    """A pair's answer from its interval [lo, hi] on (rac minus the other): ``better`` or ``worse``
    when it excludes 0, ``same`` when it is narrower than ``bound`` (then it lies within
    +-bound, since it holds 0), else ``open``."""
    if lo > 0 or hi < 0:
        return "better" if lo > 0 else "worse"
    return "same" if hi - lo < bound else "open"


def paired_differences(values: Dict[str, np.ndarray], base: str, bound: float, level: float = LEVEL) -> pd.DataFrame:
    """``base`` minus each other corrector, seed by seed (entry s of every array is seed s:
    common random numbers), one row per pair: mean difference over seeds, its t-interval at
    ``level`` (t over seeds, n - 1 degrees of freedom), the standard deviation of the
    differences, and the pair's :func:`answer` (``bound``: the width below which the two are
    the same)."""
    rows = []
    for other in values:
        if other == base:
            continue
        d = np.asarray(values[base], dtype=np.float64) - np.asarray(values[other], dtype=np.float64)
        n, m, sd = len(d), float(d.mean()), float(d.std(ddof=1))
        h = float(t_halfwidth(sd, n, level))
        rows.append({"pair": f"{base} - {other}", "seeds": n, "level": level, "diff": m, "ci_lo": m - h,
                     "ci_hi": m + h, "ci_half": h, "sd": sd, "answer": answer(m - h, m + h, bound)})
    return pd.DataFrame(rows)


SEARCH_SEEDS = 10**6  # the seed counts a projection searches: 2 .. SEARCH_SEEDS


def first_n(ok) -> int:
    """The smallest n in [2, SEARCH_SEEDS] with ``ok(n)`` for a condition that, once true,
    stays true as n grows (doubling, then bisection); SEARCH_SEEDS when none is."""
    hi = 2
    while not ok(hi):
        if hi >= SEARCH_SEEDS:
            return SEARCH_SEEDS
        hi = min(2 * hi, SEARCH_SEEDS)
    lo = max(2, hi // 2)  # ok(hi) holds; below lo it does not (or lo is 2)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid + 1, hi)
    return hi


def seeds_to_decide(diff: float, sd: float, bound: float, level: float) -> int:
    """A projection for an open pair: the fewest seeds n >= 2 at which a pair whose differences
    keep this mean ``diff`` and standard deviation ``sd`` would be answered at ``level``: its
    interval (half-width t_{(1 + level) / 2, n - 1} sd / sqrt(n)) narrower than ``|diff|``
    (excluding 0) or than ``bound`` (the same); SEARCH_SEEDS when no n up to it is. A rough
    guide (the mean and sd are estimates), not a promise."""
    return first_n(lambda n: float(t_halfwidth(sd, n, level)) < max(abs(diff), bound / 2))


class TimeBudget:
    """The seconds the seed rule's stages may take (None: no limit), from its creation: a stage is
    granted when, at the seconds per seed-step measured so far, it would end within them."""

    def __init__(self, seconds: Optional[float], clock: Callable[[], float] = time.perf_counter):
        self.seconds, self.clock, self.started = seconds, clock, clock()
        self.would_end = float("nan")  # the last refused stage's projected end (s from the start)

    def affords(self, done: float, more: float) -> bool:
        """Whether ``more`` units of work fit after ``done`` units took the seconds so far."""
        if self.seconds is None:
            return True
        spent = self.clock() - self.started
        self.would_end = spent + spent / max(done, 1e-12) * more
        return self.would_end <= self.seconds


@dataclass
class Stop:
    """What the seed rule did: the seed counts it looked at (``looks``) of those it planned (``plan``),
    why it ended (``decided``: every waited-for pair answered; ``max_seeds``: the plan ran out;
    ``budget``: the next stage would not have ended within the time budget; ``fixed``: no pair was
    waited for, one look), and the waited-for pairs left open."""

    looks: List[int]
    plan: List[int]
    ended: str
    open: List[str] = field(default_factory=list)

    @property
    def seeds(self) -> int:
        return self.looks[-1]


def sequential_seeds(plan: List[int], train: Callable[[int, int], None], look: Callable[[int], Dict[str, str]],
                     wanted: List[str], affords: Callable[[int, int], bool]) -> Stop:
    """The seed rule: train the stages of ``plan`` (seed counts, increasing) in order, each stage's
    seeds [previous count, count) at once (``train(first, last)``), and after each read every pair's
    answer on the seeds so far (``look(n)``: pair -> better, worse, same or open); stop as soon as
    every pair of ``wanted`` is answered (not open), when the plan runs out, or when
    ``affords(seeds done, seeds more)`` refuses the next stage. The first stage always runs."""
    looks: List[int] = []
    left = list(wanted)
    for n in plan:
        done = looks[-1] if looks else 0
        if looks and not affords(done, n - done):
            return Stop(looks, plan, "budget", left)
        train(done, n)
        looks.append(n)
        answers = look(n)
        left = [p for p in wanted if answers[p] == "open"]
        if not wanted:
            return Stop(looks, plan, "fixed")
        if not left:
            return Stop(looks, plan, "decided")
    return Stop(looks, plan, "max_seeds", left)


def lane_metrics(out: Dict[str, Any], name: str, seeds: int, window: int) -> Dict[str, np.ndarray]:
    """Per seed (the first ``seeds`` lanes): the true reward at the seed's own naive wall-clock
    (:func:`value_at_clock`) and the final true reward (mean of the last ``window`` entries)."""
    naive_clock = schedule_for("naive", out["schedules"]).wallclock[:seeds]
    clock = schedule_for(name, out["schedules"]).step_start[:seeds]  # the sync oracle: on the async clock
    true = np.stack([c.true for c in out["curves"][name][:seeds]])
    return {"true_at_naive_clock": value_at_clock(clock, true, naive_clock, window),
            "true_final": true[:, -window:].mean(axis=1)}


PAIRED_METRICS = ("true_at_naive_clock", "true_final")
BASE = "rac"  # the corrector every paired difference starts from


def paired_table(out: Dict[str, Any], seeds: int, window: int, bound: float, level: float = LEVEL) -> pd.DataFrame:
    """:func:`paired_differences` of both metrics (rac minus each other corrector) on the first ``seeds`` seeds."""
    per = {name: lane_metrics(out, name, seeds, window) for name in out["names"]}
    frames = [paired_differences({n: per[n][m] for n in out["names"]}, BASE, bound, level).assign(metric=m)
              for m in PAIRED_METRICS]
    df = pd.concat(frames, ignore_index=True)
    return df[["metric"] + [c for c in df.columns if c != "metric"]]


def waited_pairs(lm: Any) -> List[str]:
    """The pairs the seed rule waits for (``learner.lm.decide``: rac minus each of those correctors)."""
    return [f"{BASE} - {other}" for other in lm.decide]


def planned_looks(lm: Any) -> List[int]:
    """The seed counts a cell may look at: :func:`look_plan` from ``learner.lm.seeds`` to ``max_seeds``
    when some pair is waited for, else ``seeds`` alone."""
    return look_plan(lm.seeds, lm.max_seeds) if lm.decide else [lm.seeds]


def seed_steps(cfg: Any, seeds: int) -> int:
    """The GRPO steps of ``seeds`` seeds of every corrector of a cell (the unit of an LM run's progress)."""
    return cfg.pipeline.steps * len(corrector_names(cfg)) * seeds


def rule_table(looks: List[pd.DataFrame], stop: Stop, lm: Any, budget: TimeBudget) -> pd.DataFrame:
    """The seed rule's record: at each look, every pair's interval and answer on the first metric
    (true reward at naive's clock), whether the rule waited for the pair, and the rule's settings
    and why it ended (the same on every row)."""
    df = pd.concat(looks, ignore_index=True)
    df = df[df.metric == PAIRED_METRICS[0]].drop(columns=["metric", "ci_half"])
    waited = set(waited_pairs(lm))
    return df.assign(waited=[p in waited for p in df.pair], bound=lm.bound, max_seeds=lm.max_seeds,
                     budget_s=np.nan if lm.budget_s is None else float(lm.budget_s),
                     planned=",".join(map(str, stop.plan)), ended=stop.ended,
                     next_would_end_s=budget.would_end if stop.ended == "budget" else np.nan).reset_index(drop=True)


def run_cell(cfg: Any, progress: Optional[Progress] = None) -> Dict[str, Any]:
    """Every corrector's GRPO runs on one cell: results rows, curves and gradient records, and with rac
    and another corrector the paired differences, by the seed rule (:func:`sequential_seeds`): stages
    of seeds from ``learner.lm.seeds``, doubling up to ``max_seeds``, each stage's seeds trained as one
    batch, until every pair of ``learner.lm.decide`` is answered or ``budget_s`` ends it (no pair to
    decide: ``seeds`` seeds, one look). ``progress`` (racsim.progress): k seed-steps after each step of
    each seed batch (k seeds), a note as each corrector's batch starts, and its total grown by the
    seed-steps of each stage the rule adds."""
    lm = cfg.learner.lm
    p = cfg.pipeline
    names = corrector_names(cfg)
    params = corrector_params(cfg)
    shares = np.array([float(ch.share) for ch in p.channels.values()])
    plan = planned_looks(lm)
    lanes = plan[-1]
    t0 = time.perf_counter()
    schedules = simulate_schedules(cfg, lanes, "train_pipeline", names)
    pipeline_s = time.perf_counter() - t0
    task = build_task(lm)
    stream = seed_sequence(cfg.seed, "lm").spawn(lanes)
    grad_stream = seed_sequence(cfg.seed, "lm_gradient").spawn(lanes)
    checkpoints = checkpoint_steps(p.steps, lm.checkpoints)
    curves: Dict[str, List[LaneCurve]] = {name: [] for name in names}
    etas: Dict[str, float] = {}
    slices = {name: lane_slices(schedule_for(name, schedules), name) for name in names}
    for name in names:
        etas[name] = float(shares @ corrector_slack(name, schedule_for(name, schedules), params) / shares.sum())

    out: Dict[str, Any] = {"names": names, "schedules": schedules, "curves": curves, "etas": etas,
                           "pipeline_s": pipeline_s}

    def train(first: int, last: int) -> None:
        """Lanes [first, last) of every corrector: the transformer's as one batch (each seed's
        run as it would be alone: the same tokens, floats within rounding), the bandit's one
        at a time."""
        if last <= first:
            return
        rngs = lambda streams: [np.random.default_rng(streams[lane]) for lane in range(first, last)]  # noqa: E731
        for name in names:
            if progress is not None:
                progress.note(f"{name}: seeds {first}..{last - 1}", line=True)
            if lm.policy != "bandit":
                from racsim.learner.lm import BatchedTransformerPolicy  # lazy: torch loads only for this learner

                batch = BatchedTransformerPolicy(task.prompts, lm.vocab, lm.response_len, lm,
                                                 [lm.init_seed + lane for lane in range(first, last)],
                                                 reference=lm.kl_coef > 0)
                out["params"] = batch.n_params
                d, s, land = zip(*slices[name][first:last])
                curves[name].extend(train_lanes(batch, task, d, s, land, name, params, shares, lm.group_size,
                                                lm.kl_coef, rngs(stream), rngs(grad_stream), checkpoints,
                                                lm.sync_batch, progress and progress.advance))
                continue
            for lane, (d, s, land) in enumerate(slices[name][first:last], start=first):
                policy = make_policy(lm, task, lm.init_seed + lane)
                out["params"] = policy.n_params
                curves[name].append(train_lane(policy, task, d, s, land, name, params, shares, lm.group_size,
                                               lm.kl_coef, np.random.default_rng(stream[lane]),
                                               np.random.default_rng(grad_stream[lane]), checkpoints, lm.sync_batch,
                                               progress and progress.advance))

    window = max(1, (p.steps + 1) // 10)
    level = look_level(len(plan))
    looks: List[pd.DataFrame] = []
    budget = TimeBudget(lm.budget_s)

    def look(n: int) -> Dict[str, str]:
        table = paired_table(out, n, window, lm.bound, level)
        looks.append(table.assign(look=len(looks)))
        first = table[table.metric == PAIRED_METRICS[0]]
        return dict(zip(first.pair, first.answer))

    def affords(done: int, more: int) -> bool:
        ok = budget.affords(done, more)
        if ok and progress is not None:
            progress.grow(seed_steps(cfg, more), f"the seed rule adds seeds {done}..{done + more - 1}")
        return ok

    t0 = time.perf_counter()
    if BASE in names and len(names) > 1 and lm.seeds > 1:
        stop = sequential_seeds(plan, train, look, waited_pairs(lm), affords)
        out["paired"] = looks[-1].drop(columns="look")
        out["seed_rule"] = rule_table(looks, stop, lm, budget)
        seeds = stop.seeds
    else:  # no pair to compare
        seeds = lm.seeds
        train(0, seeds)
    out["seeds"] = seeds
    out["training_s"] = time.perf_counter() - t0
    return out


def model_size(lm: Any, out: Dict[str, Any]) -> Dict[str, int]:
    """The policy's size: trainable parameters, and the transformer's layers and width
    (0 for the bandit stand-in, which has neither), vocabulary and response length."""
    tf = lm.policy == "transformer"
    return {"params": int(out["params"]), "layers": lm.layers if tf else 0, "d_model": lm.d_model if tf else 0,
            "vocab": lm.vocab, "response_len": lm.response_len}


def share_origins(sched, steps: int) -> np.ndarray:
    """The steps whose slow results :func:`~racsim.learner.grpo.missing_share` counts: those
    that every injected result of the schedule can reach within the run (origin + the
    largest injected delay < steps); every step when none is that early."""
    top = int(sched.delay[sched.injected].max()) if sched.injected.any() else 0
    early = np.arange(steps)[np.arange(steps) + top < steps]
    return early if len(early) else np.arange(steps)


def results_table(cfg: Any, out: Dict[str, Any]) -> pd.DataFrame:
    lm, p = cfg.learner.lm, cfg.pipeline
    N = p.steps
    n = out["seeds"]
    window = max(1, (N + 1) // 10)
    naive_clock = schedule_for("naive", out["schedules"]).wallclock[:n]
    per_step = out["training_s"] / sum(len(cv) * N for cv in out["curves"].values())
    shares = np.array([float(ch.share) for ch in p.channels.values()])
    params = corrector_params(cfg)
    rows = []
    for name in out["names"]:
        sched = schedule_for(name, out["schedules"])
        clock = sched.step_start[:n]
        cv = out["curves"][name][:n]
        fast = np.stack([c.fast for c in cv])
        metric = lane_metrics(out, name, n, window)
        tf, tf_ci = mean_ci(metric["true_final"])
        pf, pf_ci = mean_ci(fast[:, -window:].mean(axis=1))
        tc, tc_ci = mean_ci(metric["true_at_naive_clock"])
        ratios = np.concatenate([c.ratio for c in cv])
        origins = share_origins(sched, N)
        share = [missing_share(c.delivered[None], c.owed[None], shares, origins) for c in cv]
        ms, ms_ci = mean_ci(np.array(share))
        lam = measured_kernel(sched.delay[:n, origins], sched.status[:n, origins])
        per_seed = [missing_fraction(*(np.array([g[k] for g in c.gradients]) for k in ("c0", "late_dot", "res_dot")))
                    for c in cv if c.gradients]
        row: Dict[str, Any] = {
            "scenario": cfg.name, "study": cfg.study.paper or "", "corrector": name, "policy": lm.policy,
            "K": len(p.channels), "steps": N, "prompts": p.batch_size, "group_size": lm.group_size,
            "seeds": n, "seed": cfg.seed, "proxy_correlation": lm.proxy_correlation,
            "wallclock_s": float(clock[:, -1].mean() - clock[:, 0].mean()),
            "wallclock_ratio": float((clock[:, -1] - clock[:, 0]).mean() / naive_clock.mean()),
            "true_at_naive_clock": float(tc), "true_at_naive_clock_ci": float(tc_ci),
            "true_final": float(tf), "true_final_ci": float(tf_ci),
            "proxy_final": float(pf), "proxy_final_ci": float(pf_ci),
            "slack_eta": out["etas"][name],
            "missing_share": float(ms), "missing_share_ci": float(ms_ci),
            "eta_steady": float(shares @ kernel_slack(name, lam, params, 1.0) / shares.sum()),
            "late_rows": int(ratios.size),
            "ratio_mean": float(ratios.mean()) if ratios.size else np.nan,
            "seconds_per_step": per_step,
            **model_size(lm, out),
        }
        if per_seed:
            m, h = mean_ci(np.array(per_seed))
            row["grad_missing"], row["grad_missing_ci"] = float(m), float(h)
            row["grad_cosine"] = float(np.nanmean([g["cosine"] for c in cv for g in c.gradients]))
        rows.append(row)
    return pd.DataFrame(rows)


def curves_table(out: Dict[str, Any]) -> pd.DataFrame:
    frames = []
    for name, cv in out["curves"].items():
        clock = schedule_for(name if name != "sync_oracle" else "naive", out["schedules"]).step_start
        for lane, c in enumerate(cv):
            frames.append(pd.DataFrame({"corrector": name, "seed_lane": lane, "step": np.arange(len(c.true)),
                                        "wallclock_s": clock[lane] - clock[lane, 0], "true": c.true,
                                        "proxy": c.fast}))
    return pd.concat(frames, ignore_index=True)


def gradients_table(out: Dict[str, Any]) -> pd.DataFrame:
    rows = [{"corrector": name, "seed_lane": lane, **g, "slack_eta": out["etas"][name]}
            for name, cv in out["curves"].items() for lane, c in enumerate(cv) for g in c.gradients]
    return pd.DataFrame(rows)


def run_lm_study(cells: list, progress: Optional[Progress] = None) -> RunResult:
    """Every cell of the grid; a single cell also keeps its curves, gradient records and
    schedules; with rac and another corrector, the paired differences at the last look
    (``lm_paired``) and the seed rule's record of every look (``lm_seed_rule``).
    ``progress``: as :func:`run_cell`'s, its phase ``GRPO`` started with the seed-steps every cell's
    first stage will run."""
    if progress is not None:
        progress.start("GRPO", sum(seed_steps(c, c.learner.lm.seeds) for _, c in cells), "seed-step")
    tables: Dict[str, list] = {"results": [], "lm_paired": [], "lm_seed_rule": []}
    timings = {"pipeline_s": 0.0, "training_s": 0.0}
    out: Dict[str, Any] = {}
    for values, ccfg in cells:
        out = run_cell(ccfg, progress)
        timings["pipeline_s"] += out["pipeline_s"]
        timings["training_s"] += out["training_s"]
        vals = {"cell": len(tables["results"]), **values} if len(cells) > 1 else values
        tables["results"].append((vals, results_table(ccfg, out)))
        for key, name in (("lm_paired", "paired"), ("lm_seed_rule", "seed_rule")):
            if name in out:
                tables[key].append((vals, out[name]))
    extra: Dict[str, pd.DataFrame] = {k: with_values(v) for k, v in tables.items() if k != "results" and v}
    schedules: Dict[str, Any] = {}
    timeline = pd.DataFrame()
    if len(cells) == 1:
        extra["lm_curves"] = curves_table(out)
        grads = gradients_table(out)
        if len(grads):
            extra["lm_gradients"] = grads
        schedules = out["schedules"]
        timeline = queue_timeseries(schedules["async"])
    return RunResult(results=with_values(tables["results"]), timeline=timeline, schedules=schedules,
                     timings=timings, extra=extra)
