"""The LM study (``learner.kind=lm``): pipeline -> arrival schedules -> GRPO with
every corrector on ``learner.lm.seeds`` runs -> tables, per grid cell.

The schedules come from the same simulation as the tabular learner's
(:func:`racsim.analyses.bias_study.simulate_schedules`, one lane per seed); a
pipeline sample is one prompt's group of responses. Every corrector's run of
seed s starts from the same weights and draws from the same random stream
(common random numbers), so the curves differ by the corrector alone.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List

import numpy as np
import pandas as pd

from racsim.analyses.bias_study import with_values, corrector_names, corrector_params, simulate_schedules
from racsim.analyses.result import RunResult
from racsim.learner.bandit import BanditPolicy
from racsim.learner.bias import corrector_slack, schedule_for
from racsim.learner.grpo import (
    LaneCurve,
    Policy,
    RewardTask,
    lane_slices,
    make_task,
    missing_fraction,
    train_lane,
)
from racsim.pipeline.stats import queue_timeseries
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


def value_at_clock(wallclock: np.ndarray, values: np.ndarray, seconds: float, window: int) -> np.ndarray:
    """Per lane: the mean of ``values`` over the last ``window`` steps completed within
    ``seconds`` of simulated wall-clock (entry i of ``values`` belongs to the policy
    after i updates; wallclock (lanes, steps + 1) as in an ArrivalSchedule)."""
    done = (wallclock[:, 1:] - wallclock[:, :1] <= seconds + 1e-9).sum(axis=1)
    return np.array([values[i, max(0, d - window + 1): d + 1].mean() for i, d in enumerate(done)])


def run_cell(cfg: Any) -> Dict[str, Any]:
    """Every corrector's GRPO runs on one cell: results rows, curves and gradient records."""
    lm = cfg.learner.lm
    p = cfg.pipeline
    names = corrector_names(cfg)
    params = corrector_params(cfg)
    shares = np.array([float(ch.share) for ch in p.channels.values()])
    t0 = time.perf_counter()
    schedules = simulate_schedules(cfg, lm.seeds, "train_pipeline", names)
    pipeline_s = time.perf_counter() - t0
    task = build_task(lm)
    stream = seed_sequence(cfg.seed, "lm").spawn(lm.seeds)
    grad_stream = seed_sequence(cfg.seed, "lm_gradient").spawn(lm.seeds)
    checkpoints = checkpoint_steps(p.steps, lm.checkpoints)
    curves: Dict[str, List[LaneCurve]] = {}
    etas: Dict[str, float] = {}
    t0 = time.perf_counter()
    for name in names:
        sched = schedule_for(name, schedules)
        etas[name] = float(shares @ corrector_slack(name, sched, params) / shares.sum())
        curves[name] = [
            train_lane(make_policy(lm, task, lm.init_seed + lane), task, d, s, land, name, params, shares,
                       lm.group_size, lm.kl_coef, np.random.default_rng(stream[lane]),
                       np.random.default_rng(grad_stream[lane]), checkpoints, lm.sync_batch)
            for lane, (d, s, land) in enumerate(lane_slices(sched, name))
        ]
    training_s = time.perf_counter() - t0
    return {"names": names, "schedules": schedules, "curves": curves, "etas": etas,
            "pipeline_s": pipeline_s, "training_s": training_s}


def results_table(cfg: Any, out: Dict[str, Any]) -> pd.DataFrame:
    lm, p = cfg.learner.lm, cfg.pipeline
    N = p.steps
    window = max(1, (N + 1) // 10)
    naive_clock = schedule_for("naive", out["schedules"]).wallclock
    budget = float(naive_clock.mean())
    per_step = out["training_s"] / (len(out["names"]) * lm.seeds * N)
    rows = []
    for name in out["names"]:
        sched = schedule_for(name, out["schedules"])
        clock = sched.step_start if name != "sync_oracle" else schedule_for("naive", out["schedules"]).step_start
        cv = out["curves"][name]
        true = np.stack([c.true for c in cv])
        fast = np.stack([c.fast for c in cv])
        tf, tf_ci = mean_ci(true[:, -window:].mean(axis=1))
        pf, pf_ci = mean_ci(fast[:, -window:].mean(axis=1))
        tc, tc_ci = mean_ci(value_at_clock(clock, true, budget, window))
        ratios = np.concatenate([c.ratio for c in cv])
        per_seed = [missing_fraction(*(np.array([g[k] for g in c.gradients]) for k in ("c0", "late_dot", "res_dot")))
                    for c in cv if c.gradients]
        row: Dict[str, Any] = {
            "scenario": cfg.name, "study": cfg.study.paper or "", "corrector": name, "policy": lm.policy,
            "K": len(p.channels), "steps": N, "prompts": p.batch_size, "group_size": lm.group_size,
            "seeds": lm.seeds, "seed": cfg.seed, "proxy_correlation": lm.proxy_correlation,
            "wallclock_s": float(clock[:, -1].mean() - clock[:, 0].mean()),
            "wallclock_ratio": float((clock[:, -1] - clock[:, 0]).mean() / naive_clock.mean()),
            "true_at_naive_clock": float(tc), "true_at_naive_clock_ci": float(tc_ci),
            "true_final": float(tf), "true_final_ci": float(tf_ci),
            "proxy_final": float(pf), "proxy_final_ci": float(pf_ci),
            "slack_eta": out["etas"][name],
            "late_rows": int(ratios.size),
            "ratio_mean": float(ratios.mean()) if ratios.size else np.nan,
            "seconds_per_step": per_step,
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


def run_lm_study(cells: list) -> RunResult:
    """Every cell of the grid; a single cell also keeps its curves, gradient records and schedules."""
    tables = []
    timings = {"pipeline_s": 0.0, "training_s": 0.0}
    out: Dict[str, Any] = {}
    for values, ccfg in cells:
        out = run_cell(ccfg)
        timings["pipeline_s"] += out["pipeline_s"]
        timings["training_s"] += out["training_s"]
        tables.append(({"cell": len(tables), **values} if len(cells) > 1 else values, results_table(ccfg, out)))
    extra: Dict[str, pd.DataFrame] = {}
    schedules: Dict[str, Any] = {}
    timeline = pd.DataFrame()
    if len(cells) == 1:
        extra = {"lm_curves": curves_table(out)}
        grads = gradients_table(out)
        if len(grads):
            extra["lm_gradients"] = grads
        schedules = out["schedules"]
        timeline = queue_timeseries(schedules["async"])
    return RunResult(results=with_values(tables), timeline=timeline, schedules=schedules, timings=timings,
                     extra=extra)
