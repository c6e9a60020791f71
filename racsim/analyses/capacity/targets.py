"""The targets a count must meet (``capacity.max_*``) and what a row of the curve fails: a count
meets a target when its figure's interval's upper end does."""

from __future__ import annotations

from typing import Any, Dict, List

from racsim.config.schema import CAPACITY_TARGETS, RacsimConf


# Each target (capacity.<key>) and the figure whose interval's upper end must meet it.
TARGET_FIGURES = {"max_bias": "bias_exact", "max_bias_vs_naive": "bias_vs_naive", "max_step_s": "step_s",
                  "max_dropped": "dropped_frac", "max_sojourn_p95_s": "sojourn_p95_s",
                  "max_sojourn_p99_s": "sojourn_p99_s", "max_delay_p95_steps": "delay_p95_steps",
                  "max_background_sojourn_p95_s": "background_sojourn_p95_s"}


def targets_of(cfg: RacsimConf) -> Dict[str, Any]:
    """The capacity targets a count must meet (``capacity.<name>`` of :data:`CAPACITY_TARGETS`; null: not one)."""
    return {k: getattr(cfg.capacity, k) for k in CAPACITY_TARGETS}


def failed(row: Any, targets: Dict[str, Any]) -> List[str]:
    """What one (count, corrector) row fails: "load" when it is overloaded and "stationarity" when
    it is not stationary (no steady-state figure, so no target is read), else each target that is
    set whose figure's interval's upper end exceeds it, or is undefined (NaN: not measured), or that
    the deciding replications left unresolved (``unresolved``: the safe side, racsim.analyses.capacity.stopping)."""
    st = row.get("status", "ok")
    if st != "ok":
        return ["load" if st.startswith("overloaded") else "stationarity"]
    open_ = unresolved(row)
    return [k for k, fig in TARGET_FIGURES.items()
            if targets.get(k) is not None and (not row[f"{fig}_hi"] <= targets[k] or k in open_)]


def unresolved(row: Any) -> List[str]:
    """The targets a row's deciding replications left unresolved (its ``unresolved`` cell, keys joined by
    ", "; empty or absent: none)."""
    cell = row.get("unresolved", "")
    return [k for k in cell.split(", ") if k] if isinstance(cell, str) else []


def feasible(row: Any, targets: Dict[str, Any]) -> bool:
    """Does one (count, corrector) row meet every target that is set? (:func:`failed` is empty.)"""
    return not failed(row, targets)


def fails_text(row: Any, targets: Dict[str, Any]) -> str:
    """:func:`failed` as the curve's ``fails`` column writes it ("" when the row meets the targets)."""
    return ", ".join(failed(row, targets))


def chosen_row(rows: List[dict], chosen: str) -> dict:
    """A count's curve row of the ``chosen`` corrector (``capacity.corrector``)."""
    return next(r for r in rows if r["corrector"] == chosen)


def meets(rows: List[dict], chosen: str, targets: Dict[str, Any]) -> bool:
    """Does a count (its curve rows) meet the targets with the ``chosen`` corrector?"""
    return feasible(chosen_row(rows, chosen), targets)
