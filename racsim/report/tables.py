"""The results as a fixed-width terminal table (also used in summary.md)."""

from __future__ import annotations

import ast
import math
from typing import Any, List, Optional, Sequence

import numpy as np
import pandas as pd

from racsim.errors import wrapped
from racsim.io import fmt

# Columns of the terminal table, in order, with their headers.
TABLE = [
    ("corrector", "corrector"),
    ("mode", "mode"),  # pipeline or static (study.mode)
    ("policy", "policy"),  # learner=lm: transformer, or its NumPy stand-in (bandit)
    ("wallclock_ratio", "clock x"),
    ("bias_mc", "bias (MC)"),
    ("mc_se", "MC s.e."),
    ("bias_exact", "bias (exact)"),
    ("bias_theorem", "bias (thm)"),
    ("reduction_exact", "reduction"),
    ("reduction_ci", "95% CI"),  # of the exact reduction (racsim.analyses.bias_study.exact_replicates)
    ("run_bias_exact", "run bias"),
    ("reduction_rep", "95% rep."),
    ("vif", "VIF"),
    ("slack_eta", "eta"),
    ("J_at_naive_clock", "J @ naive clock"),
    # learner=lm (racsim/analyses/lm_study.py); a "+-" column follows each with a _ci
    ("true_at_naive_clock", "true @ naive clock"),
    ("true_final", "true final"),
    ("proxy_final", "proxy final"),
    ("ratio_mean", "mean ratio (late)"),
    ("grad_missing", "slow grad missing"),
    ("missing_share", "slow missing (IS)"),  # learner=lm: 1 - delivered share (racsim.learner.grpo.missing_share)
    ("eta_steady", "eta (same steps)"),
]


def warmup_warning(results: pd.DataFrame, threshold: float = 0.05) -> str:
    """One line when the warm-up is too short for the delays (``delay_past_warmup``
    above ``threshold``): the steady-state figures then miss part of the slow results."""
    known = results.delay_past_warmup.dropna() if "delay_past_warmup" in results else ()
    if not len(known):
        return ""
    worst = results.loc[known.idxmax()]
    if worst.delay_past_warmup <= threshold:
        return ""
    return (f"warning: {worst.delay_past_warmup:.0%} of the slow results land (or are still in flight) more than "
            f"pipeline.warmup_steps={worst.warmup_steps} steps after their own step: the steady-state bias misses "
            "them; raise pipeline.warmup_steps (and pipeline.steps)")


def overload_note(load: float) -> str:
    """``offered load L >= 1: overloaded; `` when ``load`` is at or above :data:`OVERLOADED`, else ''."""
    return f"offered load {fmt(float(load))} >= 1: overloaded; " if load >= OVERLOADED else ""


FREE_CLOCK = 1.001  # a corrector within this wall-clock ratio of naive's costs no wall-clock


def answer_line(results: pd.DataFrame) -> str:
    """Which corrector to use, why, and at what cost, in one sentence, from a one-cell run's results: the
    least-biased (exact) corrector that costs no wall-clock (clock x within :data:`FREE_CLOCK`; the
    synchronous oracle, a reference, aside), its reduction of naive's bias with its interval, and what
    waiting for the slow results would buy and cost (wait_for_slow's reduction and clock, and the objective
    each trains to within naive's wall-clock where training ran). Empty for a grid, a run without those
    columns, or without a corrector that costs no wall-clock."""
    need = {"corrector", "bias_exact", "reduction_exact", "wallclock_ratio"}
    if "cell" in results or not need <= set(results):
        return ""
    r = results[results["mode"] == "pipeline"] if "mode" in results else results
    r = r.set_index("corrector")
    free = r.drop(index="sync_oracle", errors="ignore").query(f"wallclock_ratio <= {FREE_CLOCK}")
    if not len(free):
        return ""
    best = r.loc[free["bias_exact"].idxmin()]
    if best.name == "naive":
        head = "use naive: no corrector that costs no wall-clock has less bias here"
    else:
        ci = (f" [{fmt(best['reduction_ci_lo'])}, {fmt(best['reduction_ci_hi'])}]"
              if pd.notna(best.get("reduction_ci_lo", math.nan)) else "")
        head = (f"use {best.name}: the least-biased corrector at naive's wall-clock, {fmt(best['reduction_exact'])}x"
                f"{ci} less bias than naive at no cost in wall-clock")
    if "wait_for_slow" not in r.index or best.name == "wait_for_slow":
        return head
    wait = r.loc["wait_for_slow"]
    tail = (f"; wait_for_slow removes {fmt(wait['reduction_exact'])}x but takes {fmt(wait['wallclock_ratio'])}x "
            "the wall-clock")
    if "J_at_naive_clock" in r and pd.notna(wait["J_at_naive_clock"]):
        tail += (f", so within naive's time it trains to J = {fmt(wait['J_at_naive_clock'])} against "
                 f"{best.name}'s {fmt(best['J_at_naive_clock'])}")
    return head + tail


def stationarity_warning(channels: pd.DataFrame) -> str:
    """One line naming the channels that are not in a steady state over the measured window
    (``stationary`` False in channels.csv): their steady-state figures are not ones."""
    if "stationary" not in channels or channels.stationary.all():
        return ""
    bad = channels[~channels.stationary.astype(bool)].drop_duplicates("channel")
    names = "; ".join(f"{r['channel']} ({overload_note(r.get('offered_load', math.nan))}{r['steady_note']})"
                      for _, r in bad.iterrows())
    return (f"warning: not stationary over the measured window: {names}; its queue still drifts, so the "
            "steady-state figures are not steady-state ones: raise pipeline.steps, or the channel's capacity "
            "if its offered load is near or above 1 (racsim scenario=capacity/... finds it)")


# A run's health: whether its figures are steady-state ones (DESIGN.md, "Answers that hold for a whole run").
HEALTH = ("stationary", "offered_load", "dropped_share", "warnings")
OVERLOADED = 1.0  # an offered load at or above this: the channel's backlog grows for as long as the run lasts
DROPPED_FLAG = 0.01  # a larger share of a channel's results dropped is flagged (capacity.max_dropped's default)


def run_health(results: pd.DataFrame, channels: Optional[pd.DataFrame]) -> dict:
    """One run's (or one grid cell's) health record: ``stationary`` (every slow channel in a steady state
    over the measured window; None: not known), ``offered_load`` (the largest channel's, work arriving over
    its servers' capacity: racsim.pipeline.draws.sampled_loads; NaN: none known), ``dropped_share`` (the
    largest share of a channel's results dropped in the window) and ``warnings`` (what the run alone
    warns of, in short: a warm-up too short for the delays, channels not stationary; '' for none)."""
    chans = channels if channels is not None and len(channels) else None
    warnings = []
    if warmup_warning(results):
        warnings.append("warm-up too short")
    if chans is not None and stationarity_warning(chans):
        bad = chans[~chans.stationary.astype(bool)].channel.drop_duplicates()
        warnings.append(f"not stationary: {', '.join(map(str, bad))}")
    if chans is not None and "stationary" in chans:
        stationary = bool(chans.stationary.astype(bool).all())
    elif "stationary" in results and results.stationary.notna().any():
        stationary = bool(results.stationary.astype(bool).all())
    else:
        stationary = None
    load, dropped = math.nan, math.nan
    if chans is not None and "offered_load" in chans and chans.offered_load.notna().any():
        load = float(chans.offered_load.max())
    if chans is not None and {"dropped", "emitted"} <= set(chans):
        shares = chans.dropped.to_numpy(dtype=float) / np.maximum(chans.emitted.to_numpy(dtype=float), 1.0)
        dropped = float(shares.max())
    return {"stationary": stationary, "offered_load": load, "dropped_share": dropped,
            "warnings": "; ".join(warnings)}


def with_health(results: pd.DataFrame, channels: Optional[pd.DataFrame]) -> pd.DataFrame:
    """``results`` with the health record (:data:`HEALTH`, :func:`run_health`) on every row, as its last
    columns: a grid cell's own where the rows and the channels name their ``cell``, else the run's."""
    out = results.drop(columns=[c for c in HEALTH if c in results])
    if "cell" in results and channels is not None and "cell" in channels:
        each = {c: run_health(results[results["cell"] == c], channels[channels["cell"] == c])
                for c in results["cell"].unique()}
        records = [each[c] for c in results["cell"]]
    else:
        records = [run_health(results, channels)] * len(results)
    health = pd.DataFrame(records, columns=list(HEALTH), index=out.index)
    return pd.concat([out, health.astype({"stationary": "boolean"})], axis=1)


def health_flag(stationary: Any, load: float, dropped: float, warnings: Any) -> str:
    """A health record (:func:`run_health`, or a cell's over its seeds) in a few words for a table: ``ok``, or
    what is wrong: an offered load at or above :data:`OVERLOADED`, not stationary, more than
    :data:`DROPPED_FLAG` of a channel's results dropped, a warm-up too short; ``?`` when nothing is known
    (a run without slow channels' statistics, as the LM study's)."""
    load, dropped = (float(v) if pd.notna(v) else math.nan for v in (load, dropped))
    flags = [f"load {fmt(load)}"] if load >= OVERLOADED else []
    flags += ["not stationary"] if pd.notna(stationary) and not bool(stationary) else []
    flags += [f"{dropped:.0%} dropped"] if dropped > DROPPED_FLAG else []
    flags += ["warm-up short"] if pd.notna(warnings) and "warm-up" in str(warnings) else []
    known = pd.notna(stationary) or not math.isnan(load) or not math.isnan(dropped)
    return ", ".join(flags) if flags else "ok" if known else "?"


# The terminal shows what fits its width: these columns go first, in this order, when the table is wider
# (summary.md and results.csv keep every one).
LEAST_ESSENTIAL = ("95% rep.", "MC s.e.", "run bias", "VIF", "bias (thm)", "bias (MC)", "mean ratio (late)",
                   "eta (same steps)", "slow grad missing", "proxy final +-", "proxy final", "slow missing (IS)",
                   "policy", "95% CI", "true final +-", "true final")


def cell_text(value: Any) -> str:
    """A study grid's cell value as a person reads it: a latency law's dict (as the grid holds it, or
    its text) as ``kind(key=value, ..., flag)``, anything else as :func:`fmt` writes it."""
    if isinstance(value, str) and value.startswith("{"):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value
    if not isinstance(value, dict):
        return fmt(value)
    parts = [k if v is True else f"{k}={cell_text(v)}" for k, v in value.items()
             if k != "kind" and v is not None and v is not False]
    return f"{value.get('kind', '')}({', '.join(parts)})"


def fitted(table: pd.DataFrame, width: int, order: Sequence[str] = LEAST_ESSENTIAL) -> tuple:
    """(the table less its least essential columns (``order``, by default :data:`LEAST_ESSENTIAL`)
    until its text is at most ``width`` wide, the names of those left out). A column leaves with its
    ``+-`` column: an interval's half-width is never shown without the value it qualifies."""
    dropped: List[str] = []
    for name in order:
        if len(table.to_string(index=False).splitlines()[0]) <= width:
            break
        gone = [c for c in (name, f"{name} +-") if c in table]
        if name in table:
            table = table.drop(columns=gone)
            dropped.append(name)
    return table, dropped


def format_table(results: pd.DataFrame, width: Optional[int] = None, max_rows: Optional[int] = None) -> str:
    """The results as a fixed-width text table: every column (summary.md), or for a terminal at most
    ``width`` wide (less essential columns left out, and named) and ``max_rows`` rows."""
    df = results.copy()
    if "corrector" not in df:  # an analysis (probe, TV bound): every column
        return df.drop(columns=["scenario"], errors="ignore").map(fmt).to_string(index=False)
    if "reduction_ci_lo" in df:
        df["reduction_ci"] = [f"[{fmt(a)}, {fmt(b)}]" for a, b in zip(df.reduction_ci_lo, df.reduction_ci_hi)]
    if "reduction_rep_lo" in df:  # static mode: the replication interval of the MC ratio
        df["reduction_rep"] = [f"[{fmt(a)}, {fmt(b)}]" for a, b in zip(df.reduction_rep_lo, df.reduction_rep_hi)]
    cols = [(c, h) for c, h in TABLE if c in df and not (c == "mode" and df[c].nunique() == 1)]
    values = {h: df[c].map(cell_text) for c, h in grid_columns(df)}
    out = pd.DataFrame({**values, **{h: df[c].map(fmt) for c, h in cols}})
    for c, h in cols:
        if f"{c}_ci" in df:
            out.insert(list(out.columns).index(h) + 1, f"{h} +-", df[f"{c}_ci"].map(fmt))
    notes = []
    if max_rows is not None and len(out) > max_rows:
        notes.append(f"(the first {max_rows} of {len(out)} rows: results.csv and summary.md hold them all)")
        out = out.head(max_rows)
    if width is None:
        return "\n".join([out.to_string(index=False), *notes])
    return fitted_text(out, width, LEAST_ESSENTIAL, "results.csv and summary.md", notes)


def fitted_text(table: pd.DataFrame, width: int, order: Sequence[str], where: str, notes: Sequence[str] = ()) -> str:
    """``table`` as text for a terminal: at most ``width`` wide (:func:`fitted`, leaving out the columns of
    ``order`` first to last as needed), then ``notes`` and a note naming what was left out and ``where`` it is."""
    table, dropped = fitted(table, width, order)
    if dropped:
        notes = [*notes, f"(to fit {width} columns, left out here: {', '.join(dropped)}; in {where})"]
    return "\n".join([table.to_string(index=False), *(wrapped(n, width) for n in notes)])


def grid_columns(results: pd.DataFrame) -> list:
    """(column, header) of a grid run's cell values, which lead its rows: the columns before
    ``scenario`` (racsim.analyses.bias_study), headed by their last dotted part where that
    is unique. Empty for a one-cell run."""
    if "cell" not in results or "scenario" not in results:
        return []
    keys = [c for c in results.columns[: list(results.columns).index("scenario")] if c != "cell"]
    return list(zip(keys, short_names(keys)))


def short_names(keys: list) -> list:
    """Each dotted key by its last part (less gather's ``override:`` prefix) where that is unique, else in full."""
    short = [k.rsplit(".", 1)[-1].split(":", 1)[-1] for k in keys]
    return [s if short.count(s) == 1 else k for k, s in zip(keys, short)]


# What each of a run's timings (RunResult.timings, CapacityResult.timings) measures, for summary.md.
TIME_WORDS = {
    "pipeline_s": "pipeline (draws and schedules, summed over processes)",
    "bias_s": "bias",
    "training_s": "training",
    "static_s": "static mode",
    "load_s": "offered loads",
    "runs_s": "counts simulated (summed over processes)",
    "search_s": "search (wall-clock)",
    "decide_s": "replications deciding the answer (wall-clock, within the search)",
    "sensitivity_s": "sensitivity table (wall-clock)",
}


def time_section(timings: dict, tail: str = "") -> List[str]:
    """summary.md's "## Time": each timing in words (:data:`TIME_WORDS`), then ``tail``."""
    said = ", ".join(f"{TIME_WORDS.get(k, k.removesuffix('_s'))} {v:.2f} s" for k, v in timings.items())
    return ["## Time", "", said + tail, ""]

