"""The last check before a results table is written: no NaN or inf where a number must be.

Every table a run writes (results, channels, capacity, the studies' own tables) goes
through :func:`non_finite` in the staging folder (racsim.sweep.markers.publish). A value that
is undefined by construction (a ratio of nothing, a cosine against a zero gradient) is
NaN in a column declared in :data:`MAY_BE_NAN`, each with its reason, and summary.md
says which columns hold such NaNs and why (:func:`undefined_notes`); never inf. Any
other non-finite value signals a bug or an extreme setting: the run still writes
everything it computed, then fails with one line naming the table, the column, the
rows and the knob most likely behind it (:func:`failure`). A finished run is never
thrown away by this check.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd

from racsim.errors import ConfigError

_NO_LAW = ("no delay law predicts the kernel (a gpu_rm channel, a GPU fast scorer), or the policy moves (generation "
           "lags: condition (U) fails), so Theorem 2.1 has no prediction")
_NO_SLOPE = ("drop has no first-order law: a sample is kept whole or dropped whole, a step at the version cap "
             "(racsim.learner.theory.staleness_derivative)")
_NO_ANGLE = ("the cosine of the update's gradient and synchronous GRPO's is undefined where either gradient is "
             "zero (no angle to a zero vector): with every group's rewards tied, every group-relative "
             "advantage is 0")
_NONE_LANDED = "no result of that channel landed in the measured window (all dropped, pending or unrouted)"

# column (fnmatch pattern; "TABLE:column" for one table's column) -> why NaN is a legitimate value there
MAY_BE_NAN = {
    "*.*": "a study grid's config key (a dotted name) left null in that cell: it does not apply there",
    "autoscale:cost_per_1000_steps": "a blocking corrector: the autoscaled pool's cost is measured on the "
                                     "asynchronous pipeline (racsim/analyses/capacity/result.py, autoscale_whatif)",
    "bias_theorem": _NO_LAW,
    "theorem_gap": _NO_LAW,
    "eta_nominal": _NO_LAW,
    "bias_vs_sync_theorem": _NO_LAW,
    "theorem_ratio_*": _NO_LAW + ", or the prediction equals sync at every state (no ratio to take)",
    "eta_ch*": "a channel index beyond this cell's K (a grid over the number of channels)",
    "ratio_*": "no ratio to take: the probe's eta = 0 predicts no bias anywhere, an LM corrector uses no "
               "importance ratio",
    "delay_*_steps": _NONE_LANDED,
    "sojourn_*_s": "no result of that channel came back in the measured window",
    "wait_*_s": "no sample was sent to that channel in the measured window (route_prob: none was routed to it)",
    "background_*": "that channel has no background traffic (no background block), beside one that has; or "
                    "none of its background requests arrived in the measured window",
    "workers": "the channel has no worker limit (workers=null: as many servers as needed)",
    "utilisation": "the channel has no worker limit (workers=null), so it has no utilisation",
    "autoscale:*": "a fixed pool whose offered load reaches capacity.max_load is not simulated (no steady state)",
    "capacity:*": "a count whose offered load reaches capacity.max_load is not simulated: its queue has no "
                  "steady state, so it has no steady-state figure (racsim/analyses/capacity/rows.py)",
    "channels:offered_load": "the channel has no fixed number of servers (a kernel channel, workers=null, an "
                             "autoscaled pool), or every one of them was down over the measured window",
    "channels:availability": "no failures are modelled on that channel (no faults block), beside one that has them",
    "lm_gradients:cosine": _NO_ANGLE,
    "lm_seed_rule:budget_s": "the seed rule had no time budget (learner.lm.budget_s=null)",
    "lm_seed_rule:next_would_end_s": "the time budget did not end the seed rule (its column ended says what did)",
    "grad_cosine": _NO_ANGLE + " (at every checkpoint of every seed)",
    "generation:response_dropped_mean": "no group was dropped from the trainer's queue",
    "first_order:first_order_bias": _NO_SLOPE,
    "first_order:slope_*": _NO_SLOPE,
    "split:*": "a pool split's figure not read at that split: its bias where no bias target needed it (ranked "
               "below the answer, or failing another target), a judge's figure with no result in the window "
               "(racsim/analyses/capacity/split.py)",
}

ROW_KEYS = ("cell", "mode", "corrector", "channel", "count", "eta", "K")  # what names a row, when present

# table -> the knobs most likely behind a non-finite value in it
KNOBS = {
    "results": "corrector.* (alpha, rho_bar, tau_age) or an extreme latency or learner setting",
    "channels": "that channel's latency, workers or rm block",
    "capacity": "capacity.counts or the channel's rm block (a profile with a zero-size row?)",
}


def may_be_nan(column: str, table: str = "") -> Optional[str]:
    """The declared reason why ``column`` (of ``table``) may hold NaN, or None when it must be finite."""
    return next((why for pat, why in MAY_BE_NAN.items()
                 if fnmatch.fnmatchcase(column, pat) or fnmatch.fnmatchcase(f"{table}:{column}", pat)), None)


def _absent(df: pd.DataFrame, column: str, bad: np.ndarray) -> np.ndarray:
    """The rows where ``column`` is NaN because their kind of row does not produce it: a
    table of pipeline and static rows (study.mode=both) holds each mode's own columns,
    NaN in every row of the other mode."""
    out = np.zeros(len(df), bool)
    if "mode" not in df:
        return out
    modes = df["mode"].to_numpy()
    for m in pd.unique(modes):
        rows = modes == m
        if bad[rows].all() and not bad[~rows].all():
            out |= rows
    return out


def _non_finite(values: pd.Series) -> np.ndarray:
    if values.dtype.kind in "fc":
        return ~np.isfinite(values.to_numpy(dtype=float))
    if values.dtype == object:
        return np.array([isinstance(v, float) and not np.isfinite(v) for v in values], bool)
    return np.zeros(len(values), bool)  # integers, booleans, text: always finite


def extreme_setting(cfg_yaml: str) -> Optional[str]:
    """``'KEY = VALUE'`` for the setting of a run's config (as YAML) farthest from 1 in orders
    of magnitude, when it is beyond 1e12 or below 1e-12; None otherwise."""
    import yaml

    best, found = 12.0, None
    stack = [("", yaml.safe_load(cfg_yaml) if cfg_yaml else None)]
    while stack:
        key, node = stack.pop()
        if isinstance(node, dict):
            stack += [(f"{key}.{k}" if key else str(k), v) for k, v in node.items()]
        elif isinstance(node, (int, float)) and not isinstance(node, bool) and node != 0 and math.isfinite(node):
            mag = abs(math.log10(abs(node)))
            if mag > best:
                best, found = mag, f"{key} = {node!r}"
    return found


def _row_label(df: pd.DataFrame, i: int) -> str:
    return ", ".join(f"{k}={df[k].iloc[i]}" for k in ROW_KEYS if k in df) or f"row {i}"


@dataclass(frozen=True)
class Unwritable:
    """A column of a table whose values must be finite and are not: the first such value and
    every such row's label."""

    table: str
    column: str
    value: float
    rows: Tuple[str, ...]
    total: int  # rows of the table

    def where(self, shown: int = 3) -> str:
        more = f" and {len(self.rows) - shown} more" if len(self.rows) > shown else ""
        return f"{'; '.join(self.rows[:shown])}{more} ({len(self.rows)} of {self.total} rows)"


def non_finite(df: pd.DataFrame, table: str) -> List[Unwritable]:
    """Every column of ``df`` with a value that must be finite and is not: any inf, a NaN
    outside :data:`MAY_BE_NAN` and outside :func:`_absent`."""
    found = []
    for column, series in df.items():
        if "." in str(column):  # a study grid's config key: an input the user gave (null, or inf as tau_age=inf)
            continue
        bad = _non_finite(series)
        if not bad.any():
            continue
        values = series.to_numpy()
        isinf = np.array([isinstance(v, (float, np.floating)) and np.isinf(v) for v in values], bool)
        if may_be_nan(str(column), table) is not None:
            bad = isinf
        else:
            bad &= ~_absent(df, str(column), bad & ~isinf) | isinf
        rows = np.flatnonzero(bad)
        if len(rows):
            found.append(Unwritable(table, str(column), float(values[rows[0]]),
                                    tuple(_row_label(df, int(i)) for i in rows), len(df)))
    return found


def undefined_notes(df: pd.DataFrame, table: str) -> List[str]:
    """One line per declared column of ``df`` that holds NaN: how many rows, and why the
    value is undefined there (:data:`MAY_BE_NAN`)."""
    notes = []
    for column, series in df.items():
        why = may_be_nan(str(column), table)
        nan = series.isna().to_numpy() if why is not None and series.dtype.kind in "fcO" else None
        if nan is not None and nan.any():
            notes.append(f"`{table}.{column}`: NaN in {int(nan.sum())} of {len(df)} rows: {why}")
    return notes


def failure(found: Sequence[Unwritable], cfg_yaml: Union[str, Callable[[], str]], outcome: str) -> ConfigError:
    """The one line a run fails with when ``found`` is not empty: the first column's first
    value and rows, the other columns, the likely knob (the run's most extreme setting in
    ``cfg_yaml``, or the table's usual suspects) and ``outcome`` (what was written)."""
    first = found[0]
    names = [f"{u.table}.{u.column}" for u in found[1:]]
    others = (f"; also {', '.join(names[:3])}" + (f" and {len(names) - 3} more" if len(names) > 3 else "")
              + " (summary.md lists every row)") if names else ""
    knob = extreme_setting(cfg_yaml() if callable(cfg_yaml) else cfg_yaml) or KNOBS.get(first.table,
                                                                                     "an extreme setting")
    return ConfigError(f"{first.table} column {first.column}", first.value,
                       f"a finite number: this run produced it at {first.where()}{others}; likely knob: {knob}; "
                       f"{outcome}")


def summary_lines(notes: Sequence[str], found: Sequence[Unwritable]) -> List[str]:
    """summary.md's account of the non-finite values written: the undefined ones (``notes``)
    and those that failed the run (``found``)."""
    lines: List[str] = []
    if notes:
        lines += ["## Undefined values (NaN by construction)", ""] + [f"- {n}" for n in notes] + [""]
    if found:
        lines += ["## Non-finite values where a number must be (the run failed)", "",
                  "A bug or an extreme setting; the rows, as written in the tables:", ""]
        lines += [f"- `{u.table}.{u.column}` = {u.value}: {'; '.join(u.rows)}" for u in found] + [""]
    return lines



def checked(written: list, bad: Sequence[Unwritable], found: Optional[list], cfg_yaml: Union[str, Callable[[], str]],
            out_dir) -> list:
    """``written`` (a writer's files), or, when its caller does not collect the non-finite
    values (``found`` None) and there are some (``bad``), their ConfigError: everything is
    written by then."""
    if bad and found is None:
        raise failure(bad, cfg_yaml, f"everything computed is written to {out_dir} (summary.md names the rows)")
    return written
