"""The last check before a results table is written: no NaN or inf where a number must be.

Every table a run writes (results, channels, capacity, the studies' own tables) goes
through :func:`check_finite` inside the staging folder (racsim.markers.publish): a
non-finite value stops the run with one line naming the table, the column, the row and
the knob most likely behind it, and nothing is published. The columns that are NaN by
design are declared in :data:`MAY_BE_NAN`, each with its reason (never inf).
"""

from __future__ import annotations

import fnmatch
import math
from typing import Callable, Optional, Union

import numpy as np
import pandas as pd

from racsim.errors import ConfigError

_NO_LAW = "no delay law predicts the kernel (a gpu_rm channel, a GPU fast scorer), so Theorem 2.1 has no prediction"
_NONE_LANDED = "no result of that channel landed in the measured window (all dropped, pending or unrouted)"

# column (fnmatch pattern; "TABLE:column" for one table's column) -> why NaN is a legitimate value there
MAY_BE_NAN = {
    "autoscale:cost_per_1000_steps": "a blocking corrector: the autoscaled pool's cost is measured on the "
                                     "asynchronous pipeline (racsim/analyses/capacity.py, autoscale_whatif)",
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
    "workers": "the channel has no worker limit (workers=null: as many servers as needed)",
    "utilisation": "the channel has no worker limit (workers=null), so it has no utilisation",
    "channels:availability": "no failures are modelled on that channel (no faults block), beside one that has them",
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


def check_finite(df: pd.DataFrame, table: str, cfg_yaml: Union[str, Callable[[], str]] = "") -> None:
    """Raise a ConfigError (one line) at the first non-finite value of ``df`` where a number
    must be: any inf, a NaN outside :data:`MAY_BE_NAN` and outside :func:`_absent`. The
    line names the run's most extreme setting (``cfg_yaml``, or a function giving it) as
    the likely knob, if any."""
    for column, series in df.items():
        bad = _non_finite(series)
        if not bad.any():
            continue
        values = series.to_numpy()
        isinf = np.array([isinstance(v, (float, np.floating)) and np.isinf(v) for v in values], bool)
        if may_be_nan(str(column), table) is not None:
            bad = isinf
        else:
            bad &= ~_absent(df, str(column), bad & ~isinf) | isinf
        if not bad.any():
            continue
        i = int(np.flatnonzero(bad)[0])
        row = ", ".join(f"{k}={df[k].iloc[i]}" for k in ROW_KEYS if k in df) or f"row {i}"
        raise ConfigError(f"{table} column {column}", float(values[i]),
                          f"a finite number: this run produced it at {row} ({int(bad.sum())} of {len(df)} rows); "
                          f"likely knob: {extreme_setting(cfg_yaml() if callable(cfg_yaml) else cfg_yaml) or KNOBS.get(table, 'an extreme setting')}; "
                          f"nothing was written")
