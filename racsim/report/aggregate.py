"""A sweep's answer: its gathered rows averaged over seeds, one row per cell and corrector,
and one plot per swept numeric knob (racsim.sweep.gather writes both; a sweep prints the table).

A seed axis is every override or study-grid key named ``seed`` or ending in ``seed``
(``seed``, ``learner.mdp_seed``): the rows that differ only there are replications of one
cell. The other axes (overrides, grid keys), with the descriptors that vary (scenario,
paper study, mode, K), tell the cells apart. Each figure is the mean over the cell's seeds
with its 95% t interval over them: mean +- t(0.975, n-1) s / sqrt(n), s the sample standard
deviation of the n seeds' values (NaNs left out; no interval for a single seed), cut to the
range of a bounded figure (BOUNDS: eta and the dropped share within [0, 1], biases (norms), ratios,
durations, loads and counts at least 0).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
from scipy import stats

from racsim.io import fmt
from racsim.report.plots import COLORS, MARKERS, _plt, _save, figure_legend, log_fits, scale_from_data
from racsim.report.tables import HEALTH, TABLE, fitted_text, health_flag, short_names

# The figures averaged (those the rows have), with their headers: the terminal table's, and the clock in seconds.
METRICS = ["bias_exact", "reduction_exact", "wallclock_ratio", "wallclock_s", "slack_eta", "J_at_naive_clock",
           "true_at_naive_clock", "true_final",
           # a capacity plan's answer (racsim.sweep.gather.capacity_rows): the fewest count and the figures there
           "recommended", "recommended_load", "recommended_bias", "recommended_step_s", "recommended_dropped"]
HEADERS = {**dict(TABLE), "wallclock_s": "clock s", "recommended": "fewest count", "recommended_load": "load",
           "recommended_bias": "bias there", "recommended_step_s": "s/step there",
           "recommended_dropped": "dropped there"}
PLOTTED = ["bias_exact", "wallclock_s", "recommended", "recommended_bias"]  # against each swept knob
DESCRIPTORS = ["scenario", "study", "mode", "K"]  # columns that tell cells apart where they vary
# The range a figure lies in where it is bounded (a share, a bias (a norm), a ratio, a duration, a load, a
# count): its interval is the t interval intersected with it, so a share's never reaches below 0 or above 1,
# nor a bias's below 0 (a capacity sweep's read [-1.66e-05, 0.00136]).
BOUNDS = {"slack_eta": (0.0, 1.0), "recommended_dropped": (0.0, 1.0),
          **{m: (0.0, math.inf) for m in ("bias_exact", "reduction_exact", "wallclock_ratio", "wallclock_s",
                                          "recommended", "recommended_load", "recommended_bias",
                                          "recommended_step_s")}}
LEVEL = 0.95
INTERVAL_NOTE = (f"mean over seeds with its {LEVEL:.0%} t interval [lo, hi] over them "
                 f"(mean +- t({(1 + LEVEL) / 2:g}, n-1) s / sqrt(n), n seeds; cut to [0, 1] for a share such as "
                 "eta, to >= 0 for a bias, a ratio, a duration, a load or a count)")


def is_seed(column: str) -> bool:
    """Whether a cell column is a seed axis: its key (less gather's ``override:`` prefix) is ``seed`` or ends in it."""
    return column.split(":", 1)[-1].endswith("seed")


def t_interval(values: np.ndarray, bounds: Tuple[float, float] = (-math.inf, math.inf)) -> Tuple[float, float, float]:
    """(mean, lo, hi) of the values that are not NaN: the 95% t interval of their mean (NaN bounds for one),
    intersected with ``bounds``, the range the mean lies in (a share's [0, 1]: the intersection covers
    the mean at least as often as the t interval does)."""
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    if not len(x):
        return math.nan, math.nan, math.nan
    mean = float(x.mean())
    if len(x) < 2:
        return mean, math.nan, math.nan
    with np.errstate(invalid="ignore"):  # an infinite value: an infinite mean, no interval
        half = float(stats.t.ppf((1 + LEVEL) / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return mean, max(mean - half, bounds[0]), min(mean + half, bounds[1])


def _varies(df: pd.DataFrame, column: str) -> bool:
    return column in df and df[column].nunique(dropna=False) > 1


def cell_keys(df: pd.DataFrame, axes: Sequence[str]) -> List[str]:
    """The columns that tell a row's cell apart: the axes that are not seeds, then the descriptors,
    those of them that vary (an override every job shares is no axis: :func:`fixed`)."""
    keys = [a for a in axes if not is_seed(a) and _varies(df, a)]
    return keys + [c for c in DESCRIPTORS if c not in keys and _varies(df, c)]


def fixed(df: pd.DataFrame, axes: Sequence[str]) -> Dict[str, object]:
    """The overrides (and grid keys) every row shares, with their value."""
    return {a: df[a].iloc[0] for a in axes if a in df and not is_seed(a) and not _varies(df, a)}


def aggregate(df: pd.DataFrame, axes: Sequence[str]) -> pd.DataFrame:
    """One row per cell (:func:`cell_keys`) and corrector, in order of first appearance: the cell's
    columns, ``corrector``, ``n`` (its rows: seeds, each counted once), and per metric of METRICS its mean, lo and hi
    (:func:`t_interval`) as ``METRIC``, ``METRIC_lo``, ``METRIC_hi``."""
    keys = cell_keys(df, axes) + (["corrector"] if "corrector" in df else [])
    metrics = [m for m in METRICS if m in df]
    rows = []
    keys = [k for k in keys if k not in HEALTH]  # a run's health is a figure of its cell, not an axis
    for values, group in df.groupby(keys, sort=False, dropna=False) if keys else [((), df)]:
        # the same cell run again at the same seeds (two run folders of one config) is one sample, not two
        group = group.drop_duplicates(subset=[c for c in group.columns if is_seed(c)] + metrics)
        row: Dict[str, object] = dict(zip(keys, values))
        row["n"] = len(group)
        row.update(cell_health(group))
        for m in metrics:
            row[m], row[f"{m}_lo"], row[f"{m}_hi"] = t_interval(group[m].to_numpy(dtype=float),
                                                                 BOUNDS.get(m, (-math.inf, math.inf)))
        rows.append(row)
    out = pd.DataFrame(rows)
    return out.astype({"stationary": "boolean"}) if "stationary" in out else out


def cell_health(rows: pd.DataFrame) -> Dict[str, object]:
    """A cell's health over its seeds (the rows' :data:`~racsim.report.tables.HEALTH` records, those they
    have): stationary only if every seed is (None: no seed's is known), the largest offered load and
    dropped share, and every warning any seed had, once each."""
    out: Dict[str, object] = {}
    if "stationary" in rows:
        known = rows["stationary"].dropna()
        out["stationary"] = bool(known.astype(bool).all()) if len(known) else None
    for c in ("offered_load", "dropped_share"):
        if c in rows:
            x = rows[c].to_numpy(dtype=float)
            out[c] = float(np.nanmax(x)) if np.isfinite(x).any() else math.nan
    if "warnings" in rows:
        seen = [w for text in rows["warnings"].dropna() for w in str(text).split("; ") if w]
        out["warnings"] = "; ".join(dict.fromkeys(seen))
    return out


def seed_axes(axes: Sequence[str]) -> List[str]:
    return [a for a in axes if is_seed(a)]


def format_aggregate(agg: pd.DataFrame, width: Optional[int] = None) -> str:
    """The aggregated table as text: the cell's columns (short names), corrector, n, each metric as
    ``mean [lo, hi]`` (the mean alone for a single seed, or seeds that agree); for a terminal at most
    ``width`` wide: the last metrics left out first, then n, then the cell's last columns (and named)."""
    metrics = [m for m in METRICS if m in agg]
    keys = [c for c in agg.columns if c not in metrics and not c.endswith(("_lo", "_hi")) and c not in HEALTH]
    cells = [k for k in keys if k not in ("corrector", "n")]
    out = {h: agg[k].map(fmt) for k, h in zip(cells, short_names(cells))}
    out.update({k: agg[k].map(fmt) for k in ("corrector", "n") if k in agg})
    if any(h in agg for h in HEALTH):
        out["health"] = health_flags(agg)
    for m in metrics:
        out[HEADERS[m]] = [fmt(v) if math.isnan(lo) or lo == hi else f"{fmt(v)} [{fmt(lo)}, {fmt(hi)}]"
                           for v, lo, hi in zip(agg[m], agg[f"{m}_lo"], agg[f"{m}_hi"])]
    if width is None:
        return pd.DataFrame(out).to_string(index=False)
    order = [HEADERS[m] for m in reversed(metrics[1:])] + ["n"] + list(reversed(short_names(cells)))
    return fitted_text(pd.DataFrame(out), width, order, "aggregate.csv and report.md")


def health_flags(agg: pd.DataFrame) -> List[str]:
    """Each row's health in a few words (racsim.report.tables.health_flag)."""
    get = {h: agg[h] if h in agg else pd.Series([None] * len(agg), index=agg.index) for h in HEALTH}
    return [health_flag(*values) for values in zip(*(get[h] for h in HEALTH))]


def unhealthy(agg: pd.DataFrame) -> List[Tuple[str, str]]:
    """(cell, what is wrong) of each cell whose health is not ``ok`` nor unknown, once per cell (its
    correctors share their runs), the cell named by its columns' values."""
    if not any(h in agg for h in HEALTH):
        return []
    cells = [c for c in cell_columns(agg) if c not in HEALTH]
    names = dict(zip(cells, short_names(cells)))
    out: Dict[str, str] = {}
    for (_, row), flag in zip(agg.iterrows(), health_flags(agg)):
        if flag not in ("ok", "?"):
            label = " ".join(f"{names[c]}={fmt(row[c])}" for c in cells if pd.notna(row[c])) or "the only cell"
            out.setdefault(label, flag)
    return list(out.items())


def health_line(agg: pd.DataFrame, shown: int = 5) -> str:
    """One warning naming the cells whose figures are not steady-state ones (:func:`unhealthy`), or ''."""
    bad = unhealthy(agg)
    if not bad:
        return ""
    cells = cell_columns(agg)
    total = len(agg.drop_duplicates(cells)) if cells else 1
    more = f"; and {len(bad) - shown} more" if len(bad) > shown else ""
    return (f"warning: {len(bad)} of {total} cells are not healthy: "
            + "; ".join(f"{cell} ({flag})" for cell, flag in bad[:shown]) + more
            + ": their figures are not steady-state ones (health in aggregate.csv; run one alone for its warnings)")


def knobs(agg: pd.DataFrame) -> List[str]:
    """The swept numeric knobs of an aggregated table: cell columns (not descriptors) holding
    two or more distinct numbers."""
    return [c for c in cell_columns(agg) if c not in DESCRIPTORS and pd.api.types.is_numeric_dtype(agg[c])
            and not pd.api.types.is_bool_dtype(agg[c]) and agg[c].nunique() > 1]


PANELS_PER_ROW = 4


def knob_figure(agg: pd.DataFrame, knob: str):
    """The plotted metrics (PLOTTED, those present) against ``knob``: one row of panels per metric,
    one panel per value of the other cell columns (titled with it), and in each panel one series per
    corrector, in that corrector's colour and marker everywhere (one legend for all), bars the
    interval of :func:`t_interval`; None when nothing to plot. Only the rows that set the knob are drawn
    (racsim-report over many runs gathers some that do not: they have no place on its axis), and the
    metrics they have."""
    agg = agg[np.isfinite(agg[knob].to_numpy(dtype=float))]
    plotted = [m for m in PLOTTED if m in agg and np.isfinite(agg[m].to_numpy(dtype=float)).any()]
    if not plotted:
        return None
    others = [c for c in cell_columns(agg) if c != knob]
    combos = list(agg.groupby(others, sort=False, dropna=False).groups) if others else [()]
    combos = [c if isinstance(c, tuple) else (c,) for c in combos]
    cols = min(PANELS_PER_ROW, len(combos))
    per_metric = -(-len(combos) // cols)
    plt = _plt()
    fig, axes = plt.subplots(len(plotted) * per_metric, cols, figsize=(4.6 * cols + 1.6, 3.4 * len(plotted) * per_metric),
                             squeeze=False, layout="constrained")
    names = dict(zip(others, short_names(others)))
    for mi, m in enumerate(plotted):
        for ci, combo in enumerate(combos):
            ax = axes[mi * per_metric + ci // cols][ci % cols]
            part = agg
            for k, v in zip(others, combo):
                part = part[part[k].isna()] if pd.isna(v) else part[part[k] == v]
            xs, ys = [], []
            for name, g in part.groupby("corrector", sort=False):
                g = g.sort_values(knob)
                x, y, lo, hi = (drawable(g[c]) for c in (knob, m, f"{m}_lo", f"{m}_hi"))
                xs.append(x)
                ys.append(y)
                bars = np.clip(np.nan_to_num(np.vstack([y - lo, hi - y])), 0, None)  # none past the mean
                ax.errorbar(x, y, yerr=bars, marker=MARKERS.get(name, "o"), color=COLORS.get(name), capsize=3,
                            label=name)
            drawn = np.isfinite(np.concatenate([[], *xs])) & np.isfinite(np.concatenate([[], *ys]))
            scale_from_data(ax, "x", np.concatenate([[], *xs])[drawn], log=log_fits(agg[knob], SPREAD))
            scale_from_data(ax, "y", np.concatenate([[], *ys])[drawn], log=log_fits(agg[m], SPREAD))
            ax.set_xlabel(knob)
            ax.set_ylabel(HEADERS[m] + (" (simulated)" if m == "wallclock_s" else ""))
            ax.set_title(", ".join(f"{names[k]}={fmt(v)}" for k, v in zip(others, combo)), fontsize=8)
            ax.grid(True, which="both", alpha=0.3)
        for ci in range(len(combos), per_metric * cols):  # the empty places of a last, partial row
            axes[mi * per_metric + ci // cols][ci % cols].set_visible(False)
    figure_legend(fig, axes[0][0], title="corrector", title_fontsize=8)
    fig.suptitle(f"Against {knob} (bars: the 95% t interval over seeds)", fontsize=10)
    return fig


SPREAD = 20  # a knob or a figure whose values are positive and span this factor is drawn on a log axis


def drawable(values: pd.Series) -> np.ndarray:
    """A column as a panel draws it: floats, an infinity as NaN (a gap, as a NaN is)."""
    x = values.to_numpy(dtype=float)
    return np.where(np.isfinite(x), x, np.nan)


def cell_columns(agg: pd.DataFrame) -> List[str]:
    """The cell columns of an aggregated table (those before ``corrector``)."""
    cols = list(agg.columns)
    return cols[: cols.index("corrector")] if "corrector" in cols else []


def plot_name(knob: str) -> str:
    return "sweep_" + re.sub(r"[^A-Za-z0-9_.-]", "_", knob.split(":", 1)[-1]) + ".png"


def write_knob_plots(agg: pd.DataFrame, folder: Path) -> List[Path]:
    """One PNG per swept numeric knob (:func:`knobs`) into ``folder``; the paths written."""
    written = []
    for knob in knobs(agg):
        fig = knob_figure(agg, knob)
        if fig is None:
            continue
        path = Path(folder) / plot_name(knob)
        _save(fig, path)
        _plt().close(fig)
        written.append(path)
    return written
