"""What a pool split (racsim/analyses/capacity/split.py) prints and writes: its answer in one paragraph, the
table of the splits tried (ranked by steps per hour on a terminal; split.csv keeps every column), summary.md."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np
import pandas as pd

from racsim.analyses.capacity.split import SplitResult
from racsim.config.schema import RacsimConf
from racsim.io import atomic_write, fmt, write_text
from racsim.report.capacity import _ci, closed, csv_tables, goals_text
from racsim.report.finite import Unwritable
from racsim.report.tables import fitted_text

TERMINAL_SPLITS = 12  # splits a terminal shows, by steps per hour (and the answer's row)
LEAST_ESSENTIAL = ("trainer waits", "engines idle", "in queue", "before queue", "drop %", "load")


def lag_goals(res: SplitResult) -> str:
    """The lag caps in words (none: "")."""
    t = res.targets
    caps = [f"mean lag <= {t['max_mean_lag']:g}" if t.get("max_mean_lag") is not None else "",
            f"head lag p95 <= {t['max_head_lag_p95']:g}" if t.get("max_head_lag_p95") is not None else ""]
    return " and ".join(c for c in caps if c)


def all_goals(res: SplitResult) -> str:
    """Every target in words: the lag caps, then capacity's (racsim.report.capacity.goals_text)."""
    other = goals_text(res)
    lags = lag_goals(res)
    if not lags:
        return other
    return lags if other.startswith("no target") else f"{lags} and {other}"


def split_line(row, res: SplitResult) -> str:
    """A split's figures in a line: steps per hour and the lags with their intervals, then the judge's load
    and dropped share and the chosen corrector's bias where there are."""
    s = (f"{fmt(row.steps_per_hour)} steps/h [{fmt(row.steps_per_hour_lo)}, {fmt(row.steps_per_hour_hi)}] at mean "
         f"lag {_ci(row, 'mean_lag')} (head lag p95 {_ci(row, 'head_lag_p95', fmt)}; {fmt(row.mean_lag_before_queue)} "
         f"before the queue, {fmt(row.mean_lag_in_queue)} in it; engines {row.engine_idle:.0%} idle, trainer "
         f"{row.trainer_waiting:.0%} waiting)")
    if res.judge is not None:
        s += (f", judge load {row.load:.3g}, dropped {_ci(row, 'dropped_frac', lambda v: f'{100 * v:.1f}%')}")
    if "bias_exact" in row and pd.notna(row.get("bias_exact")):
        bias = _ci(row, "bias_exact", lambda v: f"{v:.3g}")
        s += (f", {res.corrector} bias {bias} ({_ci(row, 'bias_vs_naive')} x naive's, over training steps "
              f"{int(row.warmup_steps)}-{int(row.steps)}: the policy still moves, and the share of its bias that "
              f"the generation lag makes shrinks as training settles)")
    return s


def answer_text(res: SplitResult) -> str:
    """The answer in one paragraph: the split, its figures with their intervals and the next best split; or
    that none of the pool's splits meets the targets, and what the most productive one fails."""
    t = res.table
    ranked = t.assign(_k=-t.steps_per_hour.fillna(-np.inf)).sort_values(["_k", "mean_lag"], kind="stable")
    goal = f"{all_goals(res)}, each met by the upper end of its {res.level:.0%} interval"
    notes = "".join(" " + n for n in res.notes)
    if res.recommended is None:
        top = ranked.iloc[0]
        return (f"{res.gpus} GPUs: no split meets the targets ({goal}). The most steps per hour, "
                f"{_split_name(top, res)}: {split_line(top, res)}, fails {top.fails}." + notes)
    r, row = res.recommended, row_of(t, res.recommended)
    nxt = ""
    if res.runner_up is not None:
        o = row_of(t, res.runner_up)
        close = o.steps_per_hour_hi >= row.steps_per_hour_lo
        nxt = (f" Next best: {res.runner_up.text()}: {fmt(o.steps_per_hour)} steps/h [{fmt(o.steps_per_hour_lo)}, "
               f"{fmt(o.steps_per_hour_hi)}] at mean lag {fmt(o.mean_lag)}"
               + (" (the two intervals of steps per hour overlap: either split serves)." if close else "."))
    higher = ranked[ranked.steps_per_hour > row.steps_per_hour]
    failing = higher[~higher.fails.isin(["", "(bias not read)"])]
    tied = len(higher) - len(failing)  # meet every target, with steps per hour the intervals cannot tell apart
    named = "; ".join(f"{_split_name(h, res)} {h.fails}" for _, h in failing.head(3).iterrows()) + (
        "; ..." if len(failing) > 3 else "")
    if not tied:
        why = f" Every split with more steps per hour fails a target ({len(failing)}: {named})." if len(failing) else ""
    else:
        why = (f" Of the splits with more steps per hour, {tied} meet{'s' if tied == 1 else ''} every target with "
               f"steps per hour the intervals cannot tell from this split's, at a larger mean lag"
               + (f", and {len(failing)} fail{'s' if len(failing) == 1 else ''} one ({named})" if len(failing) else "")
               + ".")
    return (f"{res.gpus} GPUs: {r.text()}: {split_line(row, res)} ({goal}; steady state: warm-up "
            f"{int(row.warmup_steps)} of {int(row.steps)} steps)." + why + nxt + notes)


def row_of(table: pd.DataFrame, s) -> pd.Series:
    """Split ``s``'s row of a pool split's table."""
    return table[(table.engines == s.engines) & (table.trainer == s.trainer) & (table.judge == s.judge)].iloc[0]


def _split_name(row, res: SplitResult) -> str:
    return f"{int(row.engines)}/{int(row.trainer)}" + (f"/{int(row.judge)}" if res.judge is not None else "")


def format_splits(res: SplitResult, width: Optional[int] = None, rows: Optional[int] = None) -> str:
    """The splits tried as text, by steps per hour (``rows``: the first so many, and the answer's): GPUs of the
    engines, trainer and judge, steps/h and mean lag with their intervals, the head lag's p95, the lag split,
    the idle shares, the judge's load and dropped share, the chosen corrector's bias, and what each fails."""
    t = res.table.assign(_k=-res.table.steps_per_hour.fillna(-np.inf)).sort_values(["_k", "mean_lag"], kind="stable")
    if rows is not None and len(t) > rows:
        r = res.recommended
        keep = np.arange(len(t)) < rows
        if r is not None:
            keep |= ((t.engines == r.engines) & (t.trainer == r.trainer) & (t.judge == r.judge)).to_numpy()
        t = t[keep]
    ci = lambda col, f=fmt: [f"{f(v)} [{f(lo)}, {f(hi)}]" for v, lo, hi in  # noqa: E731
                             zip(t[col], t[f"{col}_lo"], t[f"{col}_hi"])]
    out = {"engines": t.engines, "trainer": t.trainer}
    if res.judge is not None:
        out["judge"] = t.judge
    out.update({"steps/h [95%]": ci("steps_per_hour"), "mean lag [95%]": ci("mean_lag"),
                "head p95": t.head_lag_p95.map(fmt), "before queue": t.mean_lag_before_queue.map(fmt),
                "in queue": t.mean_lag_in_queue.map(fmt), "engines idle": t.engine_idle.map(lambda v: f"{v:.0%}"),
                "trainer waits": t.trainer_waiting.map(lambda v: f"{v:.0%}")})
    if res.judge is not None:
        out["load"] = t.load.map(fmt)
        out["drop %"] = t.dropped_frac.map(lambda v: fmt(100 * v))
    if "bias_exact" in t:
        out[f"bias {res.corrector}"] = t.bias_exact.map(fmt)
    out["fails"] = t.fails
    table = pd.DataFrame(out)
    if width is None:
        return table.to_string(index=False)
    return fitted_text(table, width, LEAST_ESSENTIAL, "split.csv and summary.md")


def terminal_splits(res: SplitResult, width: int) -> str:
    """The terminal's table: the :data:`TERMINAL_SPLITS` splits with the most steps per hour (and the answer)."""
    more = len(res.table) - TERMINAL_SPLITS
    tail = [f"({more} more splits in split.csv)"] if more > 0 else []
    return "\n".join([format_splits(res, width, TERMINAL_SPLITS), *tail])


def split_summary_markdown(cfg: RacsimConf, res: SplitResult, files: List[str]) -> str:
    """summary.md of a pool split: the answer, how it was made, every split tried."""
    lines = [f"# racsim pool split: {cfg.name}", "", answer_text(res), "",
             "## How it was made", "",
             f"Each split of {res.gpus} GPUs between the rollout engines, the trainer"
             + (f" and the judge ({res.judge})" if res.judge else "") + " is one run of the asynchronous pipeline "
             f"({cfg.learner.trials} trials, independent replications) at a length that shows its steady state (its "
             f"steps' seconds, each batch's mean lag and the judge's queue stationary after the warm-up: MSER-5 and "
             f"batch means). Steps per hour and the mean lag come with Student's t intervals over the trials, the head "
             f"lag's p95 with a pooled quantile's; the judge's load is its work per step over the trainer's mean step. "
             f"A split meets a target when the upper end of its figure's {res.level:.0%} interval does; the answer is "
             f"among those that do, the one with the smallest mean lag of those whose steps per hour the intervals "
             f"cannot tell from the most, every split ranked above it failing for "
             f"sure (one failing only by an interval that straddles its target is replicated: "
             f"{res.replicated_steps} steps, capacity.decide_steps). docs/generation.md says more.", "",
             "## Every split tried", "", "```", format_splits(res), "```", "",
             "Files: " + ", ".join(f"`{f}`" for f in files), ""]
    return "\n".join(lines)


def write_split(out_dir: Path, cfg: RacsimConf, res: SplitResult, cfg_yaml: str, plots: bool = True,
                found: Optional[List[Unwritable]] = None, about: Sequence[str] = ()) -> list:
    """Write a pool split's files into ``out_dir``: split.csv and split.parquet (every split tried), the
    answer's run tables (results, channels, generation, as CSV and Parquet), config.yaml, its trace and summary.md; returns the
    paths written. ``found``, ``about``: as racsim.report.writers.write_outputs's."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list = []
    bad: List[Unwritable] = [] if found is None else found
    notes: List[str] = []
    tables = [("split", res.table)]
    if res.best is not None:
        tables += [("results", res.best.results), ("channels", res.best.channels)]
        tables += [(k, v) for k, v in res.best.extra.items() if k == "generation"]
    written += csv_tables(out_dir, tables, bad, notes)
    for stem, df in tables:  # and as Parquet: the answer's run then gathers as a run's (racsim.sweep.gather)
        p = out_dir / f"{stem}.parquet"
        atomic_write(p, lambda t, df=df: df.to_parquet(t, index=False))
        written.append(p)
    write_text(out_dir / "config.yaml", cfg_yaml)
    written.append(out_dir / "config.yaml")
    return closed(out_dir, res.best, lambda files: split_summary_markdown(cfg, res, files), written, bad, notes,
                  found, cfg_yaml, about, plots)
