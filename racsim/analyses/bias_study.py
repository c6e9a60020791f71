"""The bias study: pipeline -> arrival schedules -> bias benchmark (and training) -> tables, per grid cell."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import numpy as np
import pandas as pd

from racsim.analyses.grid import learner_key
from racsim.config.schema import warmup_steps
from racsim.io import auto_workers, sharing, spawn_pool
from racsim.analyses.result import RunResult
from racsim.learner import mdp as M
from racsim.learner.bias import (
    BiasRun,
    Cell,
    TrajectoryPlan,
    bootstrap_counts,
    run_bias_cells,
    schedule_for,
    summarize,
)
from racsim.learner.correctors import BLOCKING, CorrectorParams
from racsim.learner.training import TrainCurve, train_all
from racsim.pipeline import steady
from racsim.pipeline.draws import PipelineDraws, draw
from racsim.pipeline.engines import simulate
from racsim.pipeline.kernels import drain, nominal_kernel, predicted_kernel
from racsim.pipeline.schedule import INJECTED, PENDING, ArrivalSchedule
from racsim.pipeline.stats import channel_stats, queue_timeseries, queue_workers
from racsim.progress import Progress
from racsim.seeds import rng_for, seed_sequence


def corrector_names(cfg: Any) -> list:
    """Requested correctors, with naive first: it is the reference of every ratio."""
    names = list(cfg.corrector.names)
    return names if names and names[0] == "naive" else ["naive"] + [n for n in names if n != "naive"]


@dataclass(frozen=True)
class Known:
    """A one-cell run's draws and its async schedule, already simulated from them (the capacity
    search's steady-state check): the bias study uses them as they are."""

    draws: PipelineDraws
    schedule: ArrivalSchedule


def simulate_schedules(cfg: Any, n_trials: int, stream: str, names,
                       known: Optional[Known] = None) -> Dict[str, ArrivalSchedule]:
    """The async schedule every non-blocking corrector shares, and the blocking one
    wait-for-slow runs on, from the same draws (common random numbers); ``known``: the
    draws and async schedule, already made."""
    p = cfg.pipeline
    draws = known.draws if known is not None else draw(p, n_trials, rng_for(cfg.seed, stream))
    out = {"async": known.schedule if known is not None else simulate(p, n_trials, None, draws=draws)}
    if any(n in BLOCKING for n in names):
        out["blocking"] = simulate(p, n_trials, None, draws=draws, blocking=True,
                                            wait_timeout=cfg.corrector.wait_timeout_s)
    if p.drain:
        out = {k: drain(v, draws) for k, v in out.items()}
    return out


def build_mdp(cfg: Any) -> M.TabularMDP:
    lr = cfg.learner
    shares = tuple(float(ch.share) for ch in cfg.pipeline.channels.values())
    return M.make_mdp(lr.n_states, lr.n_actions, mdp_seed=lr.mdp_seed, shares=shares, gamma=lr.gamma,
                      slow_bump=lr.slow_bump, topology=lr.topology, channel_noise_std=lr.channel_noise_std,
                      split=lr.reward_split)


def policy_theta(lr: Any) -> np.ndarray:
    """The fixed policy's logits the bias benchmark measures (learner spec ``lr``)."""
    return M.canonical_theta(lr.n_states, lr.n_actions, seed=lr.theta_seed, scale=lr.theta_scale)


def prefetch_trajectories(cfg: Any, steps: int) -> None:
    """The trajectories' gradients a one-cell bias study of ``cfg`` at ``steps`` steps will take
    (:func:`_run_group`), computed now unless another process of the pool is computing them: a
    capacity search's counts share them and start together, and asked for first, one computes them
    while the others simulate their pipelines (where all waited for one, cores would stand idle).
    Nothing outside a pool that shares (racsim.io.sharing): there the bias study's own recall
    serves the next count, and a count whose run then grows longer would take other gradients."""
    if not sharing():
        return
    lr = cfg.learner
    mdp = build_mdp(cfg)
    plan = TrajectoryPlan.of(mdp, [mdp], [lr.fast_noise_std], lr.trials, steps * int(cfg.pipeline.batch_size))
    plan.gradients(mdp, M.softmax_policy(policy_theta(lr)), lr.horizon, rng_for(cfg.seed, "trajectories"), wait=False)


def corrector_params(cfg: Any) -> CorrectorParams:
    c = cfg.corrector
    return CorrectorParams(alpha=c.alpha, tau_age=c.tau_age, rho_bar=c.rho_bar, retrace_gamma=c.retrace_gamma,
                           adaptive_quantile=c.adaptive_quantile, adaptive_scale=c.adaptive_scale,
                           adaptive_min_results=c.adaptive_min_results)


@dataclass
class _GroupOut:
    """What one learner group contributes (computed in this process or a worker)."""

    rows: list  # (cell index, values, results table, channel table)
    bias: Optional[BiasRun]  # of the run's first cell, if it is in this group
    schedules: Optional[Dict[str, ArrivalSchedule]]  # likewise
    trajectories: int
    pipeline_s: float
    bias_s: float
    each: Optional[list] = None  # with keep=True: (BiasRun, schedules) of every member, in order


def _run_group(members: list, n_cells: int, progress: Optional[Progress] = None, keep: bool = False,
               known: Optional[Known] = None) -> _GroupOut:
    """Simulate every cell's pipeline, then the shared trajectories, then each cell's summary
    (``keep``: every member's BiasRun and schedules too, not only the run's first cell's;
    ``known``: a one-cell group's draws and async schedule, already simulated; ``progress``: told
    each cell's pipeline as it runs, and the trials as they are done)."""
    first = members[0][2]
    lr = first.learner
    theta = policy_theta(lr)
    t0 = time.perf_counter()
    bias_cells = []
    for i, _, ccfg in members:
        if progress is not None:
            progress.note(f"simulating the pipeline{f' of cell {i}' if n_cells > 1 else ''}")
        names = corrector_names(ccfg)
        predicted = {v: predicted_kernel(ccfg.pipeline, ccfg.corrector.wait_timeout_s, v == "blocking")
                     for v in ("async", "blocking")}
        bias_cells.append(Cell(simulate_schedules(ccfg, lr.trials, "pipeline", names, known), names,
                               corrector_params(ccfg), nominal_kernel(ccfg.pipeline), ccfg.corrector.row_normalize,
                               mdp=build_mdp(ccfg), fast_noise_std=ccfg.learner.fast_noise_std,
                               predicted=predicted,
                               warmup=warmup_steps(ccfg.pipeline),
                               route=np.array([ch.route_prob for ch in ccfg.pipeline.channels.values()])))
    pipeline_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    mdp = bias_cells[0].mdp  # transitions shared by the group; each cell brings its own rewards
    if progress is not None:
        progress.note(f"{lr.trials:,} trials of {len(bias_cells)} cell{'s' if len(bias_cells) > 1 else ''}")
    runs = run_bias_cells(mdp, theta, bias_cells, lr.horizon, rng_for(first.seed, "trajectories"),
                          fast_noise_std=lr.fast_noise_std, progress=None if progress is None else progress.advance)
    # One resample of the trials for the whole group: paired across its cells.
    counts = bootstrap_counts(lr.trials, lr.bootstrap, rng_for(first.seed, "bootstrap")) if lr.bootstrap else None
    rows = []
    for (i, values, ccfg), cell, brun in zip(members, bias_cells, runs):
        if n_cells > 1:
            values = {"cell": i, **values}
        summary = summarize(brun, lr.bootstrap, None, counts=counts, exact_boot=exact_replicates(brun, counts))
        workers = queue_workers(ccfg.pipeline.channels)
        chans = channel_stats(cell.schedules["async"], workers, warmup_steps(ccfg.pipeline))
        table = _results_table(ccfg, cell.names, cell.schedules, summary, brun)
        table["stationary"] = bool(chans.stationary.all())  # every channel in a steady state over the window
        rows.append((i, values, table, chans))
    head = members[0][0] == 0
    each = [(brun, cell.schedules) for cell, brun in zip(bias_cells, runs)] if keep else None
    return _GroupOut(rows, runs[0] if head else None, bias_cells[0].schedules if head else None,
                     runs[0].trajectories, pipeline_s, time.perf_counter() - t0, each)


def exact_replicates(run: BiasRun, counts: Optional[np.ndarray]) -> Optional[Dict[str, np.ndarray]]:
    """Per corrector: (R,) bootstrap replicates of its exact steady-state bias, the trials resampled by
    ``counts`` (R, trials; one resample for every corrector, so paired): eq. (2)'s norm at the mean
    correction weights of the resampled trials' updates (``BiasRun.step_weight``), bootstrap-t
    (racsim.pipeline.steady.norm_replicates). The exact bias depends on the trials through those
    weights alone (the arrival schedule), not through the sampled trajectories; None without ``counts``."""
    if counts is None:
        return None
    return {name: steady.norm_replicates(run.channel_exact[0], run.channel_exact[1:], run.target, sw.sum(axis=1),
                                         np.full(sw.shape[0], float(sw.shape[1])), counts)
            for name, sw in run.step_weight.items()}


def _group_worker(args) -> _GroupOut:
    members, n_cells = args
    return _run_group(members, n_cells)


def with_values(tables: list) -> pd.DataFrame:
    """Concatenate (cell values, table) pairs, the cells' grid values as leading
    columns (one per grid key; lists and dicts as text)."""
    df = pd.concat([t for _, t in tables], ignore_index=True)
    lengths = [len(t) for _, t in tables]
    keys: list = []
    for values, _ in tables:
        keys += [k for k in values if k not in keys]
    front = {}
    for k in keys:
        col = [v if not isinstance(v, (list, dict)) else str(v) for v in (vals.get(k) for vals, _ in tables)]
        front[k] = np.repeat(np.array(col, dtype=object), lengths)
    if not front:
        return df
    head = pd.DataFrame(front).infer_objects()
    return pd.concat([head, df.drop(columns=[k for k in front if k in df])], axis=1)


def _results_table(cfg, names, schedules, summary, bias) -> pd.DataFrame:
    p = cfg.pipeline
    warmup = warmup_steps(p)
    naive_clock = schedules["async"].wallclock.mean()
    rows = []
    for name in names:
        sched = schedule_for(name, schedules)
        counts = sched.counts()
        row: Dict[str, Any] = {
            "scenario": cfg.name,
            "study": cfg.study.paper or "",
            "mode": "pipeline",
            "corrector": name,
            "K": len(p.channels),
            "steps": p.steps,
            "warmup_steps": warmup,
            "batch_size": p.batch_size,
            "trials": cfg.learner.trials,
            "seed": cfg.seed,
        }
        row.update(summary[name])
        clock = naive_clock if name == "sync_oracle" else sched.wallclock.mean()
        row["wallclock_s"] = float(clock)
        row["wallclock_ratio"] = float(clock / naive_clock)
        # seconds per step in the steady state (the steps after the warm-up)
        timed = schedules["async"] if name == "sync_oracle" else sched
        row["step_s"] = float((timed.step_start[:, -1] - timed.step_start[:, warmup]).mean() / (p.steps - warmup))
        for key in ("emitted", "injected", "dropped", "pending"):
            row[key] = sum(v[key] for v in counts.values())
        if name == "sync_oracle":  # every slow result at Delta = 0, by definition
            row.update(injected=row["emitted"], dropped=0, pending=0)
        for k, ch in enumerate(sched.channel_names):
            row[f"eta_{ch}"] = float(bias.slack(name)[k])
        row["delay_past_warmup"] = past_warmup(sched, warmup)
        rows.append(row)
    return pd.DataFrame(rows)


def past_warmup(sched: ArrivalSchedule, warmup: int) -> float:
    """Share of the slow results that land, or are still in flight at the end, more
    than ``warmup`` steps after their own step, among the rollouts of steps that
    the run follows for that long (t <= steps - 1 - warmup). The steady-state
    view misses up to this share of a stationary update's slow results: ~0 when
    the warm-up covers the delays."""
    seen = sched.status[:, : sched.n_steps - warmup]
    late = (seen == PENDING) | ((seen == INJECTED) & (sched.delay[:, : sched.n_steps - warmup] > warmup))
    return float(late.mean())


def _add_training(results: pd.DataFrame, curves: Dict[str, TrainCurve]) -> pd.DataFrame:
    """Training figures per corrector: final J and distance, J within naive's wall-clock."""
    budget = curves["naive"].wallclock[:, -1].mean()
    results = results.copy()
    results["J_final"] = [float(curves[n].objective[:, -1].mean()) for n in results.corrector]
    results["distance_final"] = [float(curves[n].distance[:, -1].mean()) for n in results.corrector]
    results["J_at_naive_clock"] = [_value_at(curves[n], budget) for n in results.corrector]
    return results


def _value_at(curve: TrainCurve, seconds: float) -> float:
    """Mean over lanes of J(theta) at the last step completed by ``seconds`` of wall-clock."""
    done = (curve.wallclock[:, 1:] <= seconds + 1e-9).sum(axis=1)  # steps completed per lane
    return float(curve.objective[np.arange(len(done)), done].mean())


def _training_table(curves: Dict[str, TrainCurve]) -> pd.DataFrame:
    frames = []
    for name, cv in curves.items():
        L, n = cv.objective.shape
        frames.append(pd.DataFrame({
            "corrector": name,
            "lane": np.repeat(np.arange(L), n),
            "step": np.tile(np.arange(n), L),
            "wallclock_s": cv.wallclock.ravel(),
            "J": cv.objective.ravel(),
            "distance": cv.distance.ravel(),
        }))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def run_bias_study(cells: list, progress: Optional[Progress] = None, known: Optional[Known] = None) -> RunResult:
    """The bias benchmark on every cell (values, config) of a study grid and, for a
    single cell, the training loop. Cells sharing a learner form a group; with
    ``study.workers`` != 1 the groups run in that many processes (0: every core),
    with the same results as serially (each group seeds itself). ``known``: a single
    cell's draws and async schedule, already simulated. ``progress``: the phases ``bias
    benchmark`` (every group's trials) and ``training`` (its correctors)."""
    if known is not None and len(cells) != 1:
        raise ValueError("a known schedule belongs to a single cell")
    groups: Dict[tuple, list] = {}
    for i, (values, ccfg) in enumerate(cells):
        groups.setdefault(learner_key(ccfg), []).append((i, values, ccfg))
    workers = min(cells[0][1].study.workers or auto_workers(), len(groups))
    if progress is not None:
        progress.start("bias benchmark", sum(m[0][2].learner.trials for m in groups.values()), "trial")
    if workers > 1:
        jobs = [(m, len(cells)) for m in groups.values()]
        if progress is not None:
            progress.note(f"{len(jobs)} groups of cells in {workers} processes")
        with spawn_pool(workers) as pool:
            outs = []
            for (members, _), out in zip(jobs, pool.map(_group_worker, jobs)):  # map keeps the order
                outs.append(out)
                if progress is not None:
                    progress.advance(members[0][2].learner.trials)
    else:
        outs = [_run_group(m, len(cells), progress, known=known) for m in groups.values()]
    return _assemble(cells, outs, progress)


def same_numbers_key(cfg: Any) -> tuple:
    """Cells with equal keys share their trajectories and every number computed from them
    (transitions, policy, horizon, trials, steps, batch, reward tables, fast noise): each
    one's figures are then those of the cell run alone, to the last bit. A study grid
    shares more (:func:`racsim.analyses.grid.learner_key`: other rewards too, through
    reward atoms that may round differently)."""
    m = build_mdp(cfg)
    arrays = (m.P, m.r_fast, m.r_slow, m.start)
    return (learner_key(cfg), m.gamma, cfg.learner.fast_noise_std, *(a.shape for a in arrays),
            *(a.tobytes() for a in arrays))


def run_bias_each(cells: list) -> List[RunResult]:
    """``run_bias_study([cell])`` of every cell (values, config), byte for byte, with the
    trajectories sampled once per :func:`same_numbers_key` (what makes a sweep of one-cell
    jobs run at the in-process grid's pace)."""
    groups: Dict[tuple, list] = {}
    for i, (_, ccfg) in enumerate(cells):
        groups.setdefault(same_numbers_key(ccfg), []).append(i)
    out: List[Optional[RunResult]] = [None] * len(cells)
    for idx in groups.values():
        g = _run_group([(k, cells[i][0], cells[i][1]) for k, i in enumerate(idx)], 1, keep=True)
        for (_, values, table, chans), (brun, schedules), i in zip(g.rows, g.each, idx):
            one = _GroupOut([(0, values, table, chans)], brun, schedules, g.trajectories,
                            g.pipeline_s / len(idx), g.bias_s / len(idx))
            out[i] = _assemble([cells[i]], [one])
    return out


def _assemble(cells: list, outs: List[_GroupOut], progress: Optional[Progress] = None) -> RunResult:
    """The run's tables from its groups' outputs and, for a single cell, its training (``progress``:
    the phase ``training``, a unit per corrector)."""
    tables: list = [None] * len(cells)
    channel_tables: list = [None] * len(cells)
    for out in outs:
        for i, values, table, chans in out.rows:
            tables[i], channel_tables[i] = (values, table), (values, chans)
    head = next(o for o in outs if o.bias is not None)
    timings = {"pipeline_s": sum(o.pipeline_s for o in outs), "bias_s": sum(o.bias_s for o in outs)}
    results = with_values(tables)
    curves: Dict[str, TrainCurve] = {}
    values, ccfg = cells[0]
    schedules = None
    if len(cells) == 1:
        names = corrector_names(ccfg)
        schedules = head.schedules
        if ccfg.learner.train.enabled:
            t0 = time.perf_counter()
            lr = ccfg.learner
            if progress is not None:
                progress.start("training", len(names), "corrector", note="simulating the training pipeline")
            mdp = build_mdp(ccfg)
            theta = M.canonical_theta(lr.n_states, lr.n_actions, seed=lr.theta_seed, scale=lr.theta_scale)
            train_sched = simulate_schedules(ccfg, lr.train.lanes, "train_pipeline", names)
            curves = train_all(mdp, theta, train_sched, names, corrector_params(ccfg), lr.horizon, lr.train.lr,
                               seed_sequence(ccfg.seed, "training"), lr.fast_noise_std,
                               None if progress is None else progress.advance)
            timings["training_s"] = time.perf_counter() - t0
            results = _add_training(results, curves)
    return RunResult(
        results=results,
        channels=with_values(channel_tables),
        timeline=queue_timeseries(schedules["async"]) if schedules else pd.DataFrame(),
        training=_training_table(curves),
        bias=head.bias,
        schedules=schedules or {},
        curves=curves,
        timings=timings,
        trajectories=sum(o.trajectories for o in outs),
    )
