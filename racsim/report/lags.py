"""What a run with generation lags reads (issue 47): the pairs x lags table (steady bias with its interval
and J at naive's clock, per row and lag), the first-order law's lines (slope measured against predicted) and
the plot of both against the lag."""

from __future__ import annotations

import re
from pathlib import Path
from typing import List, Optional

import numpy as np
import pandas as pd

from racsim.io import fmt
from racsim.report.plots import COLORS, MARKERS, _plt, _save, figure_legend
from racsim.report.tables import cell_text, fitted_text

_LAG = re.compile(r"^bias_L(.+)$")


def lag_values(table: pd.DataFrame) -> List[str]:
    """The lags of a pairs x lags table (racsim.analyses.bias_study.lag_table), as its columns spell them."""
    return [m.group(1) for c in table.columns for m in [_LAG.match(c)] if m]


def _keys(table: pd.DataFrame) -> List[str]:
    """The columns that name a row: the grid's other keys, then corrector."""
    first = next(c for c in table.columns if _LAG.match(c))
    return list(table.columns[: list(table.columns).index(first)])


def _groups(table: pd.DataFrame) -> list:
    """(title, rows) per setting of the grid's other keys (one untitled group without them), in order."""
    keys = _keys(table)[:-1]
    if not keys:
        return [("", table)]
    out = []
    for value, rows in table.groupby(keys, sort=False):
        title = ", ".join(f"{k} = {cell_text(v)}" for k, v in zip(keys, np.atleast_1d(value)))
        out.append((title, rows))
    return out


def lag_text(table: pd.DataFrame, width: int) -> str:
    """The terminal's pairs x lags tables, one per setting of the grid's other keys: each row's steady bias
    (exact) at each lag, at most ``width`` wide."""
    lines = ["steady bias (exact) by generation lag L (intervals and J at naive's clock: lags.csv, summary.md)"]
    for title, rows in _groups(table):
        out = pd.DataFrame({"corrector": rows["corrector"]})
        for lag in lag_values(table):
            out[f"L={lag}"] = rows[f"bias_L{lag}"].map(fmt)
        lines += ([f"{title}:"] if title else []) + [fitted_text(out, width, (), "lags.csv")]
    return "\n".join(lines)


def _markdown(rows: pd.DataFrame, lags: List[str], cell) -> List[str]:
    head = "| corrector | " + " | ".join(f"L={x}" for x in lags) + " |"
    return [head, "|---|" + "---|" * len(lags)] + [
        "| " + " | ".join([row["corrector"]] + [cell(row, x) for x in lags]) + " |" for _, row in rows.iterrows()]


def lag_markdown(table: pd.DataFrame) -> List[str]:
    """summary.md's tables, per setting of the grid's other keys: the steady bias with its 95% interval at each
    lag, then J at naive's clock."""
    lags = lag_values(table)

    def bias(row, lag):
        text = fmt(row[f"bias_L{lag}"])
        if f"bias_lo_L{lag}" in row:
            text += f" [{fmt(row[f'bias_lo_L{lag}'])}, {fmt(row[f'bias_hi_L{lag}'])}]"
        return text

    out = []
    for title, rows in _groups(table):
        where = f" ({title})" if title else ""
        out += [f"Steady bias (exact) of one update by generation lag L{where}, with its bootstrap 95% interval "
                "over trials:", "", *_markdown(rows, lags, bias), ""]
        if f"J_L{lags[0]}" in table:
            out += [f"J at naive's wall-clock by generation lag L{where}:", "",
                    *_markdown(rows, lags, lambda row, lag: fmt(row[f"J_L{lag}"])), ""]
    return out


def first_order_lines(first: pd.DataFrame) -> List[str]:
    """One line per rollout corrector: the first-order law's slope measured on the exact figure at small
    steps beside the predicted one, and how far the law carries at the run's own step size."""
    lines = []
    run_lr = first["lr"].max()
    for rollout, rows in first.groupby("rollout", sort=False):
        at = rows[rows["lr"] == run_lr]
        small = rows[rows["lr"] < run_lr]
        if not np.isfinite(rows["slope_measured"].iloc[0]):
            lines.append(f"first-order law, {rollout}: none (a sample is kept whole or dropped whole, a step at "
                         f"the version cap): staleness bias {fmt(at['staleness_bias'].iloc[0])} at L = "
                         f"{at['lag'].iloc[0]}, {fmt(at['staleness_bias'].iloc[-1])} at L = {at['lag'].iloc[-1]}")
            continue
        ratio = at["staleness_bias"] / at["first_order_bias"]
        lines.append(f"first-order law, {rollout}: staleness bias = slope x lr x L, slope measured "
                     f"{fmt(rows['slope_measured'].iloc[0])} (exact, lr x L <= {fmt(small['lr_x_lag'].max())}), "
                     f"predicted {fmt(rows['slope_predicted'].iloc[0])}; at lr = {fmt(run_lr)} exact / first order "
                     f"= {fmt(ratio.iloc[0])} at L = {at['lag'].iloc[0]}, {fmt(ratio.iloc[-1])} at L = "
                     f"{at['lag'].iloc[-1]}")
    return lines


def lags_plot(res, path: Path) -> bool:
    """Steady bias (exact, with its interval) and J at naive's clock against the generation lag, one line
    per row, one column of panels per setting of the grid's other keys."""
    table: Optional[pd.DataFrame] = res.extra.get("lags")
    if table is None:
        return False
    lags = lag_values(table)
    x = np.array([float(v) for v in lags])
    groups = _groups(table)
    has_j = f"J_L{lags[0]}" in table
    plt = _plt()
    fig, axes = plt.subplots(1 + has_j, len(groups), figsize=(5.2 * len(groups) + 2.6, 3.6 * (1 + has_j)),
                             layout="constrained", squeeze=False)
    for j, (title, rows) in enumerate(groups):
        for _, row in rows.iterrows():
            name = row["corrector"]
            reward, _, rollout = name.partition("+")
            style = {"": "-", "tis": "--", "decoupled": "-.", "drop": ":"}[rollout]
            look = dict(color=COLORS.get(reward), marker=MARKERS.get(reward, "o"), ms=4)
            y = np.array([row[f"bias_L{v}"] for v in lags], dtype=float)
            axes[0, j].plot(x, y, style, label=name, **look)
            if f"bias_lo_L{lags[0]}" in table:
                lo = np.array([row[f"bias_lo_L{v}"] for v in lags], dtype=float)
                hi = np.array([row[f"bias_hi_L{v}"] for v in lags], dtype=float)
                axes[0, j].fill_between(x, lo, hi, color=look["color"], alpha=0.12)
            if has_j:
                axes[1, j].plot(x, [row[f"J_L{v}"] for v in lags], style, **look)
        axes[0, j].set_title(title or "steady bias", fontsize=9)
        axes[0, j].set_yscale("log")
        axes[0, j].set_ylabel("steady bias (exact)")
        axes[-1, j].set_xlabel("generation lag L (policy versions)")
        if has_j:
            axes[1, j].set_ylabel("J at naive's wall-clock")
        for a in axes[:, j]:
            a.grid(True, alpha=0.3)
    figure_legend(fig, axes[0, -1], title="row (colour: reward axis; line: rollout axis)")
    _save(fig, path)
    plt.close(fig)
    return True


__all__ = ["first_order_lines", "lag_markdown", "lag_text", "lag_values", "lags_plot"]
