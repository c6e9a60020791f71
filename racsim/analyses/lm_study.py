"""The LM study (``learner.kind=lm``): pipeline -> arrival schedules -> GRPO with
every corrector on ``learner.lm.seeds`` runs -> tables, per grid cell.

The schedules come from the same simulation as the tabular learner's
(:func:`racsim.analyses.bias_study.simulate_schedules`, one lane per seed); a
pipeline sample is one prompt's group of responses. Every corrector's run of
seed s starts from the same weights and draws from the same random stream
(common random numbers: the same prompts and the same uniforms behind every
sampled token at every step, the same delays, wait_for_slow's from the same
draws), so the curves differ by the corrector alone, and the study compares
correctors by paired differences over seeds (:func:`paired_differences`), with a
seed count a pilot's variance decides (:func:`seed_rule`) when
``learner.lm.pilot_seeds`` > 0.
"""

from __future__ import annotations

import textwrap
import time
from typing import Any, Dict, List, Optional

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
from racsim.errors import ConfigError
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


def paired_differences(values: Dict[str, np.ndarray], base: str, effect_size: float) -> pd.DataFrame:
    """``base`` minus each other corrector, seed by seed (entry s of every array is seed s:
    common random numbers), one row per pair: mean difference over seeds, its 95%
    t-interval (t over seeds, n - 1 degrees of freedom), the standard deviation of the
    differences, and whether the interval excludes 0 or is narrower than ``effect_size``."""
    rows = []
    for other in values:
        if other == base:
            continue
        d = np.asarray(values[base], dtype=np.float64) - np.asarray(values[other], dtype=np.float64)
        n, m, sd = len(d), float(d.mean()), float(d.std(ddof=1))
        h = float(t_halfwidth(sd, n))
        rows.append({"pair": f"{base} - {other}", "seeds": n, "diff": m, "ci_lo": m - h, "ci_hi": m + h,
                     "ci_half": h, "sd": sd, "excludes_zero": bool(m - h > 0 or m + h < 0),
                     "narrower_than_effect": bool(2 * h < effect_size)})
    return pd.DataFrame(rows)


SEARCH_SEEDS = 10**6  # the seed counts the rule searches: 2 .. SEARCH_SEEDS


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


def seeds_needed(mean: float, sd: float, n0: int, effect_size: float, power: float = 0.8) -> tuple:
    """The seed counts a paired difference needs, from ``n0`` pilot seeds with mean
    ``mean`` and standard deviation ``sd``: (n_precision, n_separation), the smallest
    n >= 2 with 2 t_{0.975, n-1} sd / sqrt(n) < effect_size (the 95% interval narrower
    than the effect size), and with (t_{0.975, n-1} + t_{power, n-1}) sd / sqrt(n) <= e
    (the interval excludes 0 with probability ``power`` when the true difference is e),
    e = |mean| - t_{0.975, n0-1} sd / sqrt(n0), the smallest effect the pilot's own 95%
    interval allows (no n when that interval holds 0); SEARCH_SEEDS where no n up to
    it does. Both sides fall as n grows, so :func:`first_n` finds them."""
    effect = abs(mean) - float(t_halfwidth(sd, n0))
    n_prec = first_n(lambda n: 2 * float(t_halfwidth(sd, n)) < effect_size)
    if effect <= 0:
        return n_prec, SEARCH_SEEDS
    return n_prec, first_n(lambda n: (stats.t.ppf(0.975, n - 1) + stats.t.ppf(power, n - 1)) * sd / np.sqrt(n) <= effect)


def seed_rule(pilot: pd.DataFrame, effect_size: float, max_seeds: int) -> tuple:
    """The study's seed count from a :func:`paired_differences` table of the seeds run so
    far: each pair needs min(n_precision, n_separation) seeds (:func:`seeds_needed`), the
    study the largest of these, at least the seeds already run and at most ``max_seeds``
    (the pilot's seeds count among them: an internal pilot). Returns (seeds, the table
    of the rule's inputs and counts per pair)."""
    n0 = int(pilot["seeds"].iloc[0])
    rows = []
    for _, r in pilot.iterrows():
        n_prec, n_sep = seeds_needed(r["diff"], r["sd"], n0, effect_size)
        rows.append({"pair": r["pair"], "pilot_seeds": n0, "pilot_diff": float(r["diff"]),
                     "pilot_sd": float(r["sd"]), "effect_size": effect_size, "n_precision": n_prec,
                     "n_separation": n_sep, "n_pair": min(n_prec, n_sep)})
    table = pd.DataFrame(rows)
    seeds = int(min(max_seeds, max(n0, int(table["n_pair"].max()))))
    table["seeds"] = seeds
    table["capped"] = bool(table["n_pair"].max() > max_seeds)
    return seeds, table


def rule_text(table: pd.DataFrame, max_seeds: int) -> str:
    """The seed rule and its inputs, one line per pair, as the study prints them (within 120 columns
    after a ``racsim: NAME: `` of up to 20)."""
    first = table.iloc[0]
    lines = [f"seed rule on {first.pilot_seeds} seeds: per pair n = min(n_precision, n_separation); seeds = the "
             f"largest n, at most learner.lm.max_seeds={max_seeds}",
             f"  n_precision: 2 t_0.975 sd / sqrt(n) < {first.effect_size:g}; n_separation: (t_0.975 + t_0.8) sd / "
             "sqrt(n) <= |diff| - the seeds' own 95% half-width"]
    lines += [f"  {r.pair:<28} diff {r.pilot_diff:+.4f} sd {r.pilot_sd:.4f}: n_precision {r.n_precision}, "
              f"n_separation {r.n_separation} -> {r.n_pair}" for r in table.itertuples()]
    lines.append(f"  seeds = {first.seeds}" + (" (capped: some pair needs more)" if first.capped else ""))
    return "\n".join(textwrap.fill(line, 100, subsequent_indent="    ", break_long_words=False) for line in lines)


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


def paired_table(out: Dict[str, Any], seeds: int, window: int, effect_size: float) -> pd.DataFrame:
    """:func:`paired_differences` of both metrics (rac minus each other corrector)."""
    per = {name: lane_metrics(out, name, seeds, window) for name in out["names"]}
    frames = [paired_differences({n: per[n][m] for n in out["names"]}, BASE, effect_size).assign(metric=m)
              for m in PAIRED_METRICS]
    df = pd.concat(frames, ignore_index=True)
    return df[["metric"] + [c for c in df.columns if c != "metric"]]


def first_seeds(lm: Any) -> int:
    """The seeds a cell trains before any seed rule: the pilot's, or ``learner.lm.seeds``."""
    return lm.pilot_seeds if lm.pilot_seeds > 0 else lm.seeds


def seed_steps(cfg: Any, seeds: int) -> int:
    """The GRPO steps of ``seeds`` seeds of every corrector of a cell (the unit of an LM run's progress)."""
    return cfg.pipeline.steps * len(corrector_names(cfg)) * seeds


def run_cell(cfg: Any, progress: Optional[Progress] = None) -> Dict[str, Any]:
    """Every corrector's GRPO runs on one cell: results rows, curves and gradient records.
    With ``learner.lm.pilot_seeds`` > 0 (and rac among the correctors) the pilot's seeds
    run first and :func:`seed_rule` sets how many run in all. ``progress`` (racsim.progress): k
    seed-steps after each step of each seed batch (k seeds), a note as each corrector's batch
    starts, and its total grown by the seed-steps the rule adds."""
    lm = cfg.learner.lm
    p = cfg.pipeline
    names = corrector_names(cfg)
    params = corrector_params(cfg)
    shares = np.array([float(ch.share) for ch in p.channels.values()])
    power = lm.pilot_seeds > 0
    if power and (BASE not in names or len(names) < 2):
        raise ConfigError("learner.lm.pilot_seeds", lm.pilot_seeds, f"0 unless corrector.names holds {BASE} and "
                          f"another corrector (the paired differences are {BASE} minus each other one)")
    lanes = lm.max_seeds if power else lm.seeds
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
    t0 = time.perf_counter()
    seeds = first_seeds(lm)
    train(0, seeds)
    if power:  # the pilot, then the rule on every seed run so far until it asks for no more (at most 3 stages)
        rules = []
        for _ in range(3):
            paired = paired_table(out, seeds, window, lm.effect_size)
            more, rule = seed_rule(paired[paired.metric == PAIRED_METRICS[0]], lm.effect_size, lm.max_seeds)
            rules.append(rule.assign(stage=len(rules)))
            print(f"racsim: {cfg.name}: " + rule_text(rule, lm.max_seeds), flush=True)
            if more <= seeds:
                break
            if progress is not None:
                progress.grow(seed_steps(cfg, more - seeds), f"the seed rule asks for {more} seeds")
            train(seeds, more)
            seeds = more
        out["paired"] = paired_table(out, seeds, window, lm.effect_size)
        out["seed_rule"] = pd.concat(rules, ignore_index=True)
    elif BASE in names and len(names) > 1 and seeds > 1:  # every run's verdict, and what the rule would ask
        out["paired"] = paired_table(out, seeds, window, lm.effect_size)
        first = out["paired"][out["paired"].metric == PAIRED_METRICS[0]]
        out["seed_rule"] = seed_rule(first, lm.effect_size, lm.max_seeds)[1].assign(stage=0)
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
    schedules; with rac and another corrector, the paired differences (``lm_paired``) and the
    seed rule on them (``lm_seed_rule``: a power study's stages, or what the rule would ask).
    ``progress``: as :func:`run_cell`'s, its phase ``GRPO`` started with the seed-steps every cell
    will run before any seed rule."""
    if progress is not None:
        progress.start("GRPO", sum(seed_steps(c, first_seeds(c.learner.lm)) for _, c in cells), "seed-step")
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
