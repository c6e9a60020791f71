"""The bias study: pipeline -> arrival schedules -> bias benchmark (and training) -> tables, per grid cell."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import pandas as pd

from racsim.analyses.grid import learner_key
from racsim.config.schema import warmup_steps
from racsim.generation.figures import generation_table, lag_histogram
from racsim.generation.schedule import async_schedules
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
from racsim.learner.correctors import BLOCKING, CorrectorParams, row_name, split_name
from racsim.learner.drift import first_order_table, has_lags, lag_figures, lagged_bias_run
from racsim.learner.training import TrainCurve, split_lanes, stack_lanes, train_all
from racsim.pipeline import steady
from racsim.pipeline.draws import PipelineDraws, draw, draw_lags, sampled_loads
from racsim.pipeline.engines import simulate
from racsim.pipeline.kernels import drain, nominal_kernel, predicted_kernel
from racsim.pipeline.schedule import INJECTED, PENDING, ArrivalSchedule
from racsim.pipeline.stats import channel_stats, queue_timeseries, queue_workers
from racsim.progress import Progress
from racsim.seeds import STREAMS, rng_for, seed_sequence


def corrector_names(cfg: Any) -> list:
    """Requested correctors, with naive first: it is the reference of every ratio."""
    names = list(cfg.corrector.names)
    return names if names and names[0] == "naive" else ["naive"] + [n for n in names if n != "naive"]


def row_names(cfg: Any) -> list:
    """The bias study's rows: every corrector (:func:`corrector_names`) with each rollout-axis corrector of
    ``corrector.rollout`` in turn (``rac+tis``; with ``none`` the corrector alone, so the default's rows
    are :func:`corrector_names`), naive first."""
    return [row_name(n, r) for r in cfg.corrector.rollout for n in corrector_names(cfg)]


@dataclass(frozen=True)
class Known:
    """A one-cell run's draws and its async schedule, already simulated from them (the capacity
    search's steady-state check): the bias study uses them as they are."""

    draws: PipelineDraws
    schedule: ArrivalSchedule


def pipeline_draws(cfg: Any, n_trials: int, stream: str, known: Optional[Known] = None) -> PipelineDraws:
    """The draws of :func:`simulate_schedules` (``known``'s, when they are made already)."""
    return known.draws if known is not None else draw(cfg.pipeline, n_trials, rng_for(cfg.seed, stream))


def simulate_schedules(cfg: Any, n_trials: int, stream: str, names, known: Optional[Known] = None,
                       draws: Optional[PipelineDraws] = None,
                       note: Optional[Callable[[str], None]] = None) -> Dict[str, ArrivalSchedule]:
    """The async schedule every non-blocking corrector shares, and the blocking one
    wait-for-slow runs on, from the same draws (common random numbers); ``known``: the
    draws and async schedule, already made; ``draws``: those of :func:`pipeline_draws`, drawn already;
    ``note(text)``: told how far each simulation is as it runs (progress inside a long one)."""
    p = cfg.pipeline
    blocking = any(split_name(n)[0] in BLOCKING for n in names)
    if p.generation.mode == "async":  # rollout engines ahead of the trainer (racsim/generation/schedule.py)
        return async_schedules(p, n_trials, rng_for(cfg.seed, stream), blocking=blocking, engine=p.engine)
    draws = pipeline_draws(cfg, n_trials, stream, known) if draws is None else draws
    out = {"async": known.schedule if known is not None else
           simulate(p, n_trials, None, draws=draws, tick=share_note(note, "simulating the pipeline"))}
    if blocking:
        out["blocking"] = simulate(p, n_trials, None, draws=draws, blocking=True,
                                   wait_timeout=cfg.corrector.wait_timeout_s,
                                   tick=share_note(note, "simulating the blocking pipeline (wait-for-slow)"))
    if p.drain:
        out = {k: drain(v, draws) for k, v in out.items()}
    # the generation lags (pipeline.generation.lag), from a stream of their own: both pipelines share them
    lag = draw_lags(p, n_trials, rng_for(cfg.seed, "generation_lag", STREAMS[stream]))
    return out if lag is None else {k: replace(v, lag=lag) for k, v in out.items()}


def share_note(note: Optional[Callable[[str], None]], what: str) -> Optional[Callable[[float], None]]:
    """An engine's ``tick(share)`` (racsim.pipeline.engines.simulate) as ``note("WHAT: 45%")``, said when
    the whole percent moves; None without ``note``."""
    if note is None:
        return None
    said = [-1]

    def tick(share: float) -> None:
        pct = int(100 * share)
        if pct != said[0]:
            said[0] = pct
            note(f"{what}: {pct}%")

    return tick


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
                           adaptive_min_results=c.adaptive_min_results, tis_cap=c.tis_cap,
                           decoupled_cap=c.decoupled_cap, version_cap=c.version_cap)


@dataclass
class _GroupOut:
    """What one learner group contributes (computed in this process or a worker)."""

    rows: list  # (cell index, values, results table, channel table, generation table or None)
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
    bias_cells, loads = [], []
    for i, _, ccfg in members:
        if progress is not None:
            progress.note(f"simulating the pipeline{f' of cell {i}' if n_cells > 1 else ''}")
        names = row_names(ccfg)
        predicted = {v: predicted_kernel(ccfg.pipeline, ccfg.corrector.wait_timeout_s, v == "blocking")
                     for v in ("async", "blocking")}
        draws = pipeline_draws(ccfg, lr.trials, "pipeline", known)
        where = f" (cell {i})" if n_cells > 1 else ""
        told = None if progress is None else lambda text, where=where: progress.note(text + where)
        schedules = simulate_schedules(ccfg, lr.trials, "pipeline", names, known, draws, told)
        # the load on the clock the run kept (async generation: the trainer's, not the drawn generate phase)
        clock = schedules["async"].phase
        loads.append(sampled_loads(ccfg.pipeline, draws if clock is None else replace(draws, phase=clock)))
        bias_cells.append(Cell(schedules, names,
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
    advance = None if progress is None else progress.advance
    runs: list = [None] * len(bias_cells)
    fixed = [i for i, cell in enumerate(bias_cells) if not has_lags(cell)]  # a fixed policy: shared trajectories
    if fixed:
        shared = run_bias_cells(mdp, theta, [bias_cells[i] for i in fixed], lr.horizon,
                                rng_for(first.seed, "trajectories"), fast_noise_std=lr.fast_noise_std, progress=advance)
        for i, brun in zip(fixed, shared):
            runs[i] = brun
    for i, (cell, (_, _, ccfg)) in enumerate(zip(bias_cells, members)):
        if runs[i] is None:  # generation lags: a moving policy, each cell its own trajectories (racsim.learner.drift)
            noise = lr.fast_noise_std if cell.fast_noise_std is None else cell.fast_noise_std
            runs[i] = lagged_bias_run(cell.mdp, theta, cell, lr.horizon, ccfg.learner.train.lr,
                                      rng_for(ccfg.seed, "trajectories"), noise, advance)
    # One resample of the trials for the whole group: paired across its cells.
    counts = bootstrap_counts(lr.trials, lr.bootstrap, rng_for(first.seed, "bootstrap")) if lr.bootstrap else None
    rows = []
    for (i, values, ccfg), cell, brun, load in zip(members, bias_cells, runs, loads):
        if n_cells > 1:
            values = {"cell": i, **values}
        summary = summarize(brun, lr.bootstrap, None, counts=counts, exact_boot=exact_replicates(brun, counts))
        workers = queue_workers(ccfg.pipeline.channels)
        chans = channel_stats(cell.schedules["async"], workers, warmup_steps(ccfg.pipeline), load)
        gen = generation_tables(ccfg, cell.schedules)
        table = _results_table(ccfg, cell.names, cell.schedules, summary, brun, gen)
        table["stationary"] = bool(chans.stationary.all())  # every channel in a steady state over the window
        rows.append((i, values, table, chans, gen))
    head = members[0][0] == 0
    each = [(brun, cell.schedules) for cell, brun in zip(bias_cells, runs)] if keep else None
    sampled = (runs[fixed[0]].trajectories if fixed else 0) + sum(runs[i].trajectories for i in range(len(runs))
                                                                  if i not in fixed)
    return _GroupOut(rows, runs[0] if head else None, bias_cells[0].schedules if head else None,
                     sampled, pipeline_s, time.perf_counter() - t0, each)


def carries_lags(cfg: Any) -> bool:
    """Whether a cell's schedules carry generation lags: a lag law (sync), or engines that run ahead (async)."""
    g = cfg.pipeline.generation
    return g.lag is not None or g.mode != "sync"


def progress_units(members: list) -> int:
    """The trials a group's bias benchmark advances its progress by: once for the cells that share
    trajectories (a fixed policy), once more for each cell with generation lags (its own)."""
    lagged = sum(carries_lags(ccfg) for _, _, ccfg in members)
    return members[0][2].learner.trials * (lagged + (lagged < len(members)))


def exact_replicates(run: BiasRun, counts: Optional[np.ndarray]) -> Optional[Dict[str, np.ndarray]]:
    """Per corrector: (R,) bootstrap replicates of its exact steady-state bias, the trials resampled by
    ``counts`` (R, trials; one resample for every corrector, so paired). A fixed policy: eq. (2)'s norm at
    the mean correction weights of the resampled trials' updates (``BiasRun.step_weight``), bootstrap-t
    (racsim.pipeline.steady.norm_replicates): the exact bias depends on the trials through those weights
    alone (the arrival schedule), not through the sampled trajectories. A moving policy (generation lags,
    racsim.learner.drift): the norm of the resampled mean of the trials' own exact figures. None without
    ``counts``."""
    if counts is None:
        return None
    if run.exact_trials.get("steady"):
        g, n = run.target_of("steady"), counts.shape[1]
        return {name: np.linalg.norm(counts @ e / n - g, axis=1) for name, e in run.exact_trials["steady"].items()}
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


def generation_tables(cfg, schedules: Dict[str, ArrivalSchedule]) -> Optional[pd.DataFrame]:
    """Async generation: the generation figures of each schedule (racsim.generation.figures), a row each:
    ``async`` (what the non-blocking correctors read) and ``blocking`` (wait_for_slow's gate-all schedule);
    None in sync mode."""
    if schedules["async"].generation is None:
        return None
    rows = [generation_table(sched, warmup_steps(cfg.pipeline), cfg.name).assign(schedule=key)
            for key, sched in schedules.items()]
    table = pd.concat(rows, ignore_index=True)
    return table[["schedule"] + [c for c in table.columns if c != "schedule"]]


# Async generation: the figures of a corrector's schedule its results row carries (generation.csv has them all).
LAG_COLUMNS = ("mean_lag", "head_lag_p95", "head_lag_max", "steps_per_hour", "samples_per_hour")


def _results_table(cfg, names, schedules, summary, bias, gen: Optional[pd.DataFrame] = None) -> pd.DataFrame:
    p = cfg.pipeline
    warmup = warmup_steps(p)
    naive_clock = schedules["async"].wallclock.mean()
    rows = []
    params = corrector_params(cfg)
    for name in names:
        base = split_name(name)[0]
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
        if sched.lag is not None:  # the generation lags its steady updates train on (racsim.learner.drift)
            row.update(lag_figures(sched, warmup, name, params))
            row["lr"] = float(cfg.learner.train.lr)
        row.update(summary[name])
        clock = naive_clock if base == "sync_oracle" else sched.wallclock.mean()
        row["wallclock_s"] = float(clock)
        row["wallclock_ratio"] = float(clock / naive_clock)
        # seconds per step in the steady state (the steps after the warm-up)
        timed = schedules["async"] if base == "sync_oracle" else sched
        row["step_s"] = float((timed.step_start[:, -1] - timed.step_start[:, warmup]).mean() / (p.steps - warmup))
        for key in ("emitted", "injected", "dropped", "pending"):
            row[key] = sum(v[key] for v in counts.values())
        if base == "sync_oracle":  # every slow result at Delta = 0, by definition
            row.update(injected=row["emitted"], dropped=0, pending=0)
        for k, ch in enumerate(sched.channel_names):
            row[f"eta_{ch}"] = float(bias.slack(name)[k])
        row["delay_past_warmup"] = past_warmup(sched, warmup)
        if gen is not None:  # the lags of the schedule it reads (sync_oracle: the async one's)
            key = "blocking" if name in BLOCKING else "async"
            row.update(gen.loc[gen.schedule == key, list(LAG_COLUMNS)].iloc[0].to_dict())
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


LAG_KEY = "pipeline.generation.lag"  # a study grid's lag keys start so


def lag_tables(cells: list, results: pd.DataFrame) -> Dict[str, pd.DataFrame]:
    """A run with generation lags: ``first_order``, the first-order law of its first lagged cell checked
    against the exact figure (racsim.learner.drift.first_order_table, at its rollout correctors, steps,
    warm-up and learner.train.lr); and, where its cells span several lags of a law, ``lags``: one row per cell of its
    other grid keys and row, the steady bias (exact) with its interval and J at naive's clock at each lag
    (:func:`lag_table`). Empty without lags."""
    lagged = [c for _, c in cells if carries_lags(c)]
    if not lagged:
        return {}
    c, lr = lagged[0], lagged[0].learner
    p = c.pipeline
    rows = first_order_table(build_mdp(c), policy_theta(lr), lr.horizon, corrector_params(c), list(c.corrector.rollout),
                             p.steps, warmup_steps(p), lr.train.lr)
    out = {"first_order": pd.DataFrame(rows)}
    if results["lag_mean"].nunique() > 1 and all(x.pipeline.generation.mode == "sync" for x in lagged):
        out["lags"] = lag_table(results)  # lags set by a law, cell by cell (async engines: each row's own lag)
    return out


def lag_table(results: pd.DataFrame) -> pd.DataFrame:
    """The pairs x lags table: one row per value of the grid's other keys and row (corrector), in the order
    they first come; per mean lag L its steady bias (exact) ``bias_L<L>`` with its bootstrap interval
    (``bias_lo_L<L>``, ``bias_hi_L<L>``, where the run resampled) and J at naive's clock (``J_L<L>``, where it
    trained each cell)."""
    r = results.assign(lag=results["lag_mean"].round(6))
    front = list(r.columns[: list(r.columns).index("scenario")]) if "scenario" in r else []
    keys = [k for k in front if k != "cell" and not k.startswith(LAG_KEY)] + ["corrector"]
    what = {"bias": "bias_exact", "bias_lo": "bias_exact_ci_lo", "bias_hi": "bias_exact_ci_hi",
            "J": "J_at_naive_clock"}
    rows: Dict[tuple, dict] = {}
    for _, row in r.iterrows():
        at = rows.setdefault(tuple(str(row[k]) for k in keys), {k: row[k] for k in keys})
        tag = f"{row['lag']:g}"
        for prefix, col in what.items():
            if col in r:
                at[f"{prefix}_L{tag}"] = row[col]
    return pd.DataFrame(list(rows.values()))


def trains(cells: list) -> bool:
    """Whether a run of these cells (values, config) trains: a single cell, or each cell of a grid with
    ``learner.train.each_cell``, when ``learner.train.enabled``."""
    train = cells[0][1].learner.train
    return bool(train.enabled and (len(cells) == 1 or train.each_cell))


def training_key(cfg: Any) -> tuple:
    """Cells with equal keys train on the same draws (the learner, its rewards, rows and knobs, the seed):
    they train together as one run's lanes (:func:`train_cells`), each cell's curves those of its own run."""
    lr = cfg.learner
    return same_numbers_key(cfg), tuple(row_names(cfg)), corrector_params(cfg), lr.train.lanes, lr.train.lr


def train_cells(cfgs: list, progress: Optional[Progress] = None) -> List[Dict[str, TrainCurve]]:
    """The training curves of every row of each cell (racsim.learner.training) of cells that share a
    :func:`training_key`, each on its own training pipeline and all on one stream of draws, as each
    would be trained alone: one run of their lanes together (``progress``: told each row as it is done,
    a unit per cell)."""
    cfg, lr = cfgs[0], cfgs[0].learner
    names = row_names(cfg)
    scheds = [simulate_schedules(c, lr.train.lanes, "train_pipeline", names) for c in cfgs]
    stacked = {kind: stack_lanes([s[kind] for s in scheds]) for kind in scheds[0]}
    advance = None if progress is None else (lambda k: progress.advance(k * len(cfgs)))
    curves = train_all(build_mdp(cfg), policy_theta(lr), stacked, names, corrector_params(cfg), lr.horizon,
                       lr.train.lr, seed_sequence(cfg.seed, "training"), lr.fast_noise_std, advance, copies=len(cfgs))
    split = {name: split_lanes(cv, len(cfgs)) for name, cv in curves.items()}
    return [{name: split[name][i] for name in names} for i in range(len(cfgs))]


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
        progress.start("bias benchmark", sum(progress_units(m) for m in groups.values()), "trial")
    if workers > 1:
        jobs = [(m, len(cells)) for m in groups.values()]
        if progress is not None:
            progress.note(f"{len(jobs)} groups of cells in {workers} processes")
        with spawn_pool(workers) as pool:
            outs = []
            for (members, _), out in zip(jobs, pool.map(_group_worker, jobs)):  # map keeps the order
                outs.append(out)
                if progress is not None:
                    progress.advance(progress_units(members))
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


def run_bias_each(cells: list, progress: Optional[Progress] = None) -> Iterator[Tuple[int, RunResult]]:
    """(index, ``run_bias_study([cell])``) of every cell (values, config), byte for byte, each as soon
    as it is computed, with the trajectories sampled once per :func:`same_numbers_key` (what makes a
    sweep of one-cell jobs run at the in-process grid's pace): the cells of one group together, the
    groups in order of their first cell. ``progress``: its phase's units are the cells' trials, each
    counted twice (its group's bias benchmark, then its tables and training)."""
    groups: Dict[tuple, list] = {}
    for i, (_, ccfg) in enumerate(cells):
        groups.setdefault(same_numbers_key(ccfg), []).append(i)
    if progress is not None:
        trials = [c.learner.trials for _, c in cells]
        progress.start("computing", sum(trials[idx[0]] for idx in groups.values()) + sum(trials), "trial")
    for idx in groups.values():
        g = _run_group([(k, cells[i][0], cells[i][1]) for k, i in enumerate(idx)], 1, progress, keep=True)
        for (_, values, table, chans, gen), (brun, schedules), i in zip(g.rows, g.each, idx):
            one = _GroupOut([(0, values, table, chans, gen)], brun, schedules, g.trajectories,
                            g.pipeline_s / len(idx), g.bias_s / len(idx))
            res = _assemble([cells[i]], [one])
            if progress is not None:
                progress.advance(cells[i][1].learner.trials)
            yield i, res


def _assemble(cells: list, outs: List[_GroupOut], progress: Optional[Progress] = None) -> RunResult:
    """The run's tables from its groups' outputs and, for a single cell (or every cell, with
    ``learner.train.each_cell``), its training (``progress``: the phase ``training``, a unit per row)."""
    tables: list = [None] * len(cells)
    channel_tables: list = [None] * len(cells)
    gen_tables: list = [None] * len(cells)
    for out in outs:
        for i, values, table, chans, gen in out.rows:
            tables[i], channel_tables[i], gen_tables[i] = (values, table), (values, chans), (values, gen)
    head = next(o for o in outs if o.bias is not None)
    timings = {"pipeline_s": sum(o.pipeline_s for o in outs), "bias_s": sum(o.bias_s for o in outs)}
    curves: Dict[str, TrainCurve] = {}
    schedules = head.schedules if len(cells) == 1 else None
    if trains(cells):
        t0 = time.perf_counter()
        if progress is not None:
            progress.start("training", sum(len(row_names(c)) for _, c in cells), "corrector",
                           note="simulating the training pipeline")
        together: Dict[tuple, list] = {}
        for i, (_, ccfg) in enumerate(cells):
            together.setdefault(training_key(ccfg), []).append(i)
        for group in together.values():
            for i, trained in zip(group, train_cells([cells[i][1] for i in group], progress)):
                tables[i] = (tables[i][0], _add_training(tables[i][1], trained))
                curves = trained if len(cells) == 1 else curves
        timings["training_s"] = time.perf_counter() - t0
    results = with_values(tables)
    extra = lag_tables(cells, results)
    if all(gen is not None for _, gen in gen_tables):  # async generation (racsim/generation/figures.py)
        extra["generation"] = with_values(gen_tables)
        if schedules:
            extra["lag_histogram"] = lag_histogram(schedules["async"], warmup_steps(cells[0][1].pipeline))
    return RunResult(
        results=results,
        extra=extra,
        channels=with_values(channel_tables),
        timeline=queue_timeseries(schedules["async"]) if schedules else pd.DataFrame(),
        training=_training_table(curves),
        bias=head.bias,
        schedules=schedules or {},
        curves=curves,
        timings=timings,
        trajectories=sum(o.trajectories for o in outs),
    )
