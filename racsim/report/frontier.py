"""The throughput-staleness frontier of an asynchronous generation sweep (docs/generation.md, "The frontier"):
what racsim-report (and a sweep's end) reads of jobs run with ``pipeline.generation.mode=async``.

One point per cell of the sweep (its settings: the cap eta, s or k, the queue, the concurrency, the engines'
and trainer's GPUs...), averaged over its seeds: the trainer's steps (and samples) per hour against the mean
lag of what it trains on, each with its 95% t interval over the seeds (racsim.report.aggregate.t_interval);
beside them the lag split before and in the queue, the head lag's p95, the engines' idle and the trainer's
waiting shares (which side binds), the queue's dropped share, and, per corrector, the steady-state bias and
J(theta) at equal wall-clock: every cell's training read at the same number of seconds, the shortest of the
jobs' training runs (naive's clock), so that a faster setting's extra steps count. The Pareto set (no other
point has at least the throughput and at most the lag, one of them strictly) is marked.

The figures are those of the async schedule (what every non-blocking corrector trains on), which every such
corrector's results row carries (racsim.analyses.bias_study.LAG_COLUMNS).
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

import numpy as np
import pandas as pd

from racsim.analyses.bias_study import objective_at
from racsim.generation.figures import binding
from racsim.io import fmt
from racsim.learner.correctors import BLOCKING, split_name
from racsim.report.aggregate import cell_keys, t_interval
from racsim.report.plots import _plt, _save
from racsim.report.tables import fitted_text, short_names

# The frontier's figures (a results row's, racsim.analyses.bias_study.LAG_COLUMNS), each averaged over seeds
# with its interval, and their headers on a terminal.
FIGURES = {"steps_per_hour": "steps/h", "mean_lag": "mean lag", "mean_lag_before_queue": "before q",
           "mean_lag_in_queue": "in q", "head_lag_p95": "head p95", "engine_idle": "eng idle",
           "trainer_waiting": "trn wait", "dropped_share": "dropped", "samples_per_hour": "samples/h"}
SHARES = ("engine_idle", "trainer_waiting", "dropped_share")  # bounded in [0, 1]
WITH_INTERVAL = ("steps_per_hour", "mean_lag")  # shown on a terminal as mean [lo, hi]
# Terminal columns left out first to fit its width.
LEAST_ESSENTIAL = ("samples/h", "dropped", "head p95", "J @ clock", "n", "binds")
REFERENCE = ("rac", "naive")  # the corrector whose bias and J a terminal shows: the first present


def pareto_set(throughput: np.ndarray, lag: np.ndarray) -> np.ndarray:
    """Which points are on the Pareto set of most ``throughput`` and least ``lag``: those no other point
    dominates (at least the throughput and at most the lag, one of the two strictly). Points with a NaN are
    off it. By lag, ascending: a point is on it when its throughput exceeds every point's of smaller lag and
    equals the largest at its own lag (equal points are all on it)."""
    thr, lag = np.asarray(throughput, dtype=np.float64), np.asarray(lag, dtype=np.float64)
    on = np.zeros(thr.size, dtype=bool)
    ok = np.flatnonzero(np.isfinite(thr) & np.isfinite(lag))
    best_before = -math.inf  # the largest throughput at a smaller lag
    for level in np.unique(lag[ok]):
        same = ok[lag[ok] == level]
        top = thr[same].max()
        on[same] = (thr[same] == top) & (thr[same] > best_before)
        best_before = max(best_before, top)
    return on


def equal_clock(training: Dict[str, pd.DataFrame]) -> Optional[float]:
    """The wall-clock every job's training reaches: the least, over the jobs, of naive's mean final
    wall-clock (its lanes'); None without training tables."""
    ends = [float(t[t.corrector == "naive"].groupby("lane").wallclock_s.max().mean())
            for t in training.values() if len(t) and (t.corrector == "naive").any()]
    return min(ends) if ends else None


def objective_at_clock(training: pd.DataFrame, corrector: str, seconds: float) -> float:
    """J(theta) of ``corrector``'s training (a job's training table: one row per lane and step) at the last
    step each lane completed by ``seconds``, mean over lanes (racsim.analyses.bias_study.objective_at)."""
    t = training[training.corrector == corrector].sort_values(["lane", "step"])
    if not len(t):
        return math.nan
    lanes = t.lane.nunique()
    return objective_at(t.wallclock_s.to_numpy().reshape(lanes, -1), t.J.to_numpy().reshape(lanes, -1), seconds)


def frontier_table(df: pd.DataFrame, axes: Sequence[str],
                   training: Optional[Dict[str, pd.DataFrame]] = None) -> pd.DataFrame:
    """One row per cell (racsim.report.aggregate.cell_keys) of a gathered table ``df`` (one row per job and
    corrector, with ``job_dir``; a study grid's ``cell``) of asynchronous runs: the cell's columns, ``n`` (its
    runs: seeds), each of
    :data:`FIGURES` as its mean over the seeds with ``_lo`` and ``_hi`` (the 95% t interval), ``binds`` (of the
    mean shares: racsim.generation.figures.binding), per corrector ``bias_exact:NAME`` and, with ``training``
    (job_dir -> its training table), ``J_at_clock:NAME`` at :func:`equal_clock` (also in ``clock_s``), and
    ``pareto`` (:func:`pareto_set` of the mean steps per hour and mean lag). Empty when no row has the async
    figures (a sweep of lockstep runs)."""
    if "steps_per_hour" not in df or not df.steps_per_hour.notna().any():
        return pd.DataFrame()
    df = df[df.steps_per_hour.notna()]
    keys = cell_keys(df, axes)
    clock = equal_clock(training or {})
    correctors = list(df.corrector.unique())
    rows: List[dict] = []
    for values, cell in df.groupby(keys, sort=False, dropna=False) if keys else [((), df)]:
        values = values if isinstance(values, tuple) else (values,)
        # one row per run (a job, or a cell of a job's study grid): the async schedule's figures, the same in
        # every non-blocking corrector's row
        blocking = cell.corrector.map(lambda n: split_name(n)[0] in BLOCKING)  # wait_for_slow, alone or +tis...
        jobs = cell[~blocking].drop_duplicates([c for c in ("job_dir", "cell") if c in cell])
        row: Dict[str, object] = dict(zip(keys, values))
        row["n"] = len(jobs)
        for f in FIGURES:
            bounds = (0.0, 1.0) if f in SHARES else (0.0, math.inf)
            row[f], row[f"{f}_lo"], row[f"{f}_hi"] = t_interval(jobs[f].to_numpy(dtype=float), bounds)
        row["binds"] = binding(row["trainer_waiting"], row["engine_idle"])
        for c in correctors:
            mine = cell[cell.corrector == c]
            row[f"bias_exact:{c}"] = float(mine.bias_exact.mean()) if "bias_exact" in mine else math.nan
            if clock is not None:
                js = [objective_at_clock(training[d], c, clock) for d in mine.job_dir if d in training]
                row[f"J_at_clock:{c}"] = float(np.nanmean(js)) if js and not np.isnan(js).all() else math.nan
        rows.append(row)
    out = pd.DataFrame(rows)
    if clock is not None:
        out["clock_s"] = clock
    out["pareto"] = pareto_set(out.steps_per_hour.to_numpy(), out.mean_lag.to_numpy())
    return out


def async_wins_from(front: pd.DataFrame, cap: str, corrector: str) -> Optional[float]:
    """The least value of the column ``cap`` (a staleness cap: eta, s or k) of a frontier over that cap alone at
    which ``corrector``'s J(theta) at equal wall-clock beats its own at the lockstep point (the row of the least
    cap, read only when its mean lag is 0: every sample on-policy): where asynchronous generation starts to pay
    (issue 47 point 5). None when no cap does, or when the frontier has no such lockstep point or no J of that
    corrector."""
    column = f"J_at_clock:{corrector}"
    if column not in front or not len(front):
        return None
    rows = front.sort_values(cap, kind="stable")
    base = rows.iloc[0]
    if base.mean_lag != 0 or not np.isfinite(base[column]):
        return None
    above = rows[rows[column] > base[column]]
    return float(above[cap].iloc[0]) if len(above) else None


def reference(front: pd.DataFrame) -> Optional[str]:
    """The corrector a terminal shows the bias and J of: the first of :data:`REFERENCE` with a bias column."""
    return next((c for c in REFERENCE if f"bias_exact:{c}" in front), None)


def cells_of(front: pd.DataFrame) -> List[str]:
    """A frontier's cell columns (those before ``n``)."""
    cols = list(front.columns)
    return cols[: cols.index("n")]


def format_frontier(front: pd.DataFrame, width: Optional[int] = None) -> str:
    """The frontier as text: the cell's columns (short names), its seeds, steps/h and mean lag as
    ``mean [lo, hi]``, the other figures' means, which side binds, the reference corrector's bias and J at
    equal wall-clock, and ``*`` on the Pareto set; at most ``width`` wide (the least essential columns left
    out first, and named)."""
    cells = cells_of(front)
    out = {h: front[k].map(fmt) for k, h in zip(cells, short_names(cells))}
    out["n"] = front["n"].map(fmt)
    for f, head in FIGURES.items():
        if f in WITH_INTERVAL:
            out[head] = [fmt(v) if math.isnan(lo) or lo == hi else f"{fmt(v)} [{fmt(lo)}, {fmt(hi)}]"
                         for v, lo, hi in zip(front[f], front[f"{f}_lo"], front[f"{f}_hi"])]
        elif f in SHARES:
            out[head] = [f"{v:.0%}" if np.isfinite(v) else "-" for v in front[f]]
        else:
            out[head] = front[f].map(fmt)
    out["binds"] = front["binds"]
    ref = reference(front)
    if ref is not None:
        out[f"bias {ref}"] = front[f"bias_exact:{ref}"].map(fmt)
        if f"J_at_clock:{ref}" in front:
            out["J @ clock"] = front[f"J_at_clock:{ref}"].map(fmt)
    out["pareto"] = np.where(front["pareto"], "*", "")
    table = pd.DataFrame(out)
    if width is None:
        return table.to_string(index=False)
    return fitted_text(table, width, list(LEAST_ESSENTIAL) + list(reversed(short_names(cells))),
                       "frontier.csv and report.md")


def frontier_note(front: pd.DataFrame) -> str:
    """How to read the frontier table, with the equal wall-clock where there is one."""
    clock = (f"; J @ clock: J(theta) at {fmt(float(front.clock_s.iloc[0]))} s of simulated wall-clock, the "
             f"shortest job's" if "clock_s" in front else "")
    return (f"one point per cell over its seeds (95% t intervals): steps/h against the mean lag in policy versions "
            f"(split before the queue and in it: before q, in q), the engines' idle and the trainer's waiting shares "
            f"of the run (eng idle, trn wait), * on the Pareto set (no cell has more steps/h at no more lag){clock}")


def frontier_figure(front: pd.DataFrame):
    """Steps per hour against the mean lag, one point per cell with its intervals both ways, labelled by its
    cell's values (cells at the same point, to 3 significant digits, share one label); the Pareto set filled
    and joined, the others hollow."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8.6, 5.0), layout="constrained")
    cells = cells_of(front)
    names = short_names(cells)
    labels: Dict[tuple, List[str]] = {}
    for _, r in front.iterrows():
        xerr = [[r.mean_lag - r.mean_lag_lo], [r.mean_lag_hi - r.mean_lag]] if np.isfinite(r.mean_lag_lo) else None
        yerr = ([[r.steps_per_hour - r.steps_per_hour_lo], [r.steps_per_hour_hi - r.steps_per_hour]]
                if np.isfinite(r.steps_per_hour_lo) else None)
        ax.errorbar(r.mean_lag, r.steps_per_hour, xerr=xerr, yerr=yerr, fmt="o", ms=7, capsize=2,
                    color="C0" if r.pareto else "C7", mfc="C0" if r.pareto else "white")
        at = (float(f"{r.mean_lag:.3g}"), float(f"{r.steps_per_hour:.3g}"))
        labels.setdefault(at, []).append(", ".join(f"{n}={fmt(r[c])}" for n, c in zip(names, cells)))
    for (x, y), text in labels.items():
        ax.annotate("\n".join(text), (x, y), textcoords="offset points", xytext=(5, 4), fontsize=7)
    on = front[front.pareto].sort_values("mean_lag")
    ax.plot(on.mean_lag, on.steps_per_hour, "-", color="C0", alpha=0.6, label="Pareto set")
    ax.set_xlabel("mean lag of the trained samples (policy versions; bars: 95% t interval over seeds)")
    ax.set_ylabel("trainer steps per hour (simulated)")
    ax.set_title("Throughput against staleness: up and left is better (filled: the Pareto set)", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return fig


def write_frontier_plot(front: pd.DataFrame, path) -> None:
    fig = frontier_figure(front)
    _save(fig, path)
    _plt().close(fig)
