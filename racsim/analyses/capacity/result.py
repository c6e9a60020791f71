"""The capacity search's answer: the curve (a row per count and corrector, and what each fails),
the fewest count per corrector and what binds it, the autoscaled pool against the fixed ones, and
the line of a count the replications left undecided."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np
import pandas as pd

from racsim.analyses.capacity import stopping
from racsim.analyses.capacity.channel import units_per_server
from racsim.analyses.capacity.reach import OutOfReach
from racsim.analyses.capacity.rows import CURVE_COLUMNS
from racsim.analyses.capacity.targets import TARGET_FIGURES, fails_text, feasible
from racsim.config.schema import RacsimConf
from racsim.learner.correctors import BLOCKING


@dataclass
class CapacityResult:
    """One row per (count, corrector) in ``curve``; the recommendation and the run
    at the recommended count (for its timeline)."""

    curve: pd.DataFrame
    channel: str
    unit: str  # "GPUs" or "workers"
    key: str  # the config key varied
    recommended: Optional[int]
    per_corrector: pd.DataFrame  # fewest units meeting the targets, for every corrector
    targets: Dict[str, Any]
    best: Any = None  # RunResult at the recommended (or largest simulated) count; None if none was simulated
    best_count: Optional[int] = None
    timings: Dict[str, float] = field(default_factory=dict)
    speed: Dict[str, float] = field(default_factory=dict)
    autoscale: Optional[pd.DataFrame] = None  # the channel's autoscaled pool vs the evaluated fixed pools
    loads: Dict[int, Dict[str, float]] = field(default_factory=dict)  # per count: load, work_per_s, availability, load_sampled
    level: float = 0.95  # capacity.confidence: the level of every interval
    max_load: float = 0.95  # capacity.max_load: overloaded from this offered load on
    listed: List[int] = field(default_factory=list)  # the counts asked for (capacity.counts, an autoscale's bounds)
    searched: List[int] = field(default_factory=list)  # the unlisted counts tried for the fewest (between_counts, counts_above)
    top: Optional[int] = None  # the largest count the search may try (search_top)
    binding: List[str] = field(default_factory=list)  # what the count below the recommended one fails (binding)
    sensitivity: Optional[pd.DataFrame] = None  # the answer with each guessed input moved (racsim/analyses/sensitivity.py)
    notes: List[str] = field(default_factory=list)  # what the search changed to run (steps_that_fit), counts undecided
    replicated_steps: int = 0  # steps the replications deciding the answer simulated (capacity.decide_steps)
    unreachable: List[OutOfReach] = field(default_factory=list)  # targets no count up to top meets (reach.py)

    @property
    def status(self) -> str:
        """What the search found, as :data:`STATUSES` words it: ``recommended`` (a count meets the
        targets), ``infeasible`` (a target is out of reach of more capacity: the search stopped early,
        ``unreachable`` says which; the command exits 3) or ``not_found`` (no count up to ``top`` met them)."""
        if self.recommended is not None:
            return "recommended"
        return "infeasible" if self.unreachable else "not_found"


STATUSES = {"recommended": "a count meets the targets: the fewest is recommended",
            "infeasible": "a target no count up to capacity.max_count can meet, shown from the counts evaluated: "
                          "the search stopped there",
            "not_found": "no count up to capacity.max_count met the targets (a larger capacity.max_count may)"}


def curve_frame(rows: Dict[int, List[dict]], name: str, targets: Dict[str, Any]) -> pd.DataFrame:
    """The curve of channel ``name``: every evaluated count's ``rows`` by count, with every figure's
    column (:data:`CURVE_COLUMNS`, even when none was simulated), what each row fails and whether it
    meets the ``targets``."""
    curve = pd.DataFrame([r for n in sorted(rows) for r in rows[n]])
    curve = curve.reindex(columns=list(curve.columns) + [c for c in CURVE_COLUMNS if c not in curve])
    curve.insert(0, "channel", name)
    curve["fails"] = [fails_text(r, targets) for _, r in curve.iterrows()]
    curve["feasible"] = curve["fails"] == ""
    return curve


def per_corrector(curve: pd.DataFrame, targets: Dict[str, Any]) -> pd.DataFrame:
    """Per corrector (sync_oracle aside: a reference, not a pipeline): its fewest count meeting the
    ``targets`` (:func:`fewest`) and what binds it (:func:`binding`)."""
    names = [c for c in curve.corrector.unique() if c != "sync_oracle"]
    least = [fewest(curve, c) for c in names]
    return pd.DataFrame({"corrector": names, "fewest": pd.Series(least, dtype=object),
                         "binds": [", ".join(binding(curve, c, n, targets)) for c, n in zip(names, least)]})


def fewest(curve: pd.DataFrame, corrector: str) -> Optional[int]:
    """The fewest units meeting the targets, above which every evaluated count does too."""
    sub = curve[curve.corrector == corrector].sort_values("count")
    ok = sub.feasible.to_numpy()
    if not ok.any() or not ok[-1]:
        return None
    last_bad = np.flatnonzero(~ok)
    i = last_bad[-1] + 1 if last_bad.size else 0
    return int(sub["count"].iloc[i])


def binding(curve: pd.DataFrame, corrector: str, n: Optional[int],
            targets: Optional[Dict[str, Any]] = None) -> List[str]:
    """What makes ``n`` the fewest count for ``corrector``: the ``fails`` of the next smaller
    evaluated count (a target's key, "load" or "stationarity"); with ``targets``, those it fails for
    sure (a target's interval wholly above it) where there are any, not the ones it fails by an upper
    end alone (a bias still straddling once the dropped share decided the count: racsim.analyses.
    capacity.stopping.sequential asks no more of it); empty when ``n`` is None or the smallest count
    evaluated."""
    sub = curve[(curve.corrector == corrector) & (curve["count"] < n)] if n is not None else curve.iloc[:0]
    if sub.empty:
        return []
    row = sub.loc[sub["count"].idxmax()]
    fails = [f for f in row["fails"].split(", ") if f]
    if targets is None:
        return fails
    sure = [f for f in fails if f not in TARGET_FIGURES or row.get(f"{TARGET_FIGURES[f]}_lo", np.nan) > targets[f]]
    return sure or fails


def autoscale_whatif(cfg: RacsimConf, name: str, fixed_rows: Dict[int, List[dict]], auto_rows: List[dict], auto,
                     targets: dict) -> pd.DataFrame:
    """Autoscaled pool against every fixed pool the search evaluated (whole servers; the rule's
    min and max are always among them): per pool and corrector, servers (mean billed, autoscaled),
    bias, wall-clock per step, cost per 1000 steps and whether the row meets the capacity targets.
    ``fixed_rows``: capacity rows by unit count; ``auto_rows``, ``auto``: the autoscaled run's rows
    and result. The autoscaled pool's cost is measured on the asynchronous pipeline, so it is not
    given for blocking correctors."""
    units = units_per_server(cfg, name)
    out = []
    for n in sorted(c for c in fixed_rows if c % units == 0):
        out += [{"pool": f"fixed {n // units}", "servers": float(n // units), **_whatif(r, targets)}
                for r in fixed_rows[n]]
    ch = auto.channels[auto.channels.channel == name].iloc[0]
    for r in auto_rows:
        r["cost_per_1000_steps"] = np.nan if r["corrector"] in BLOCKING else float(ch["cost_per_1000_steps"])
        out.append({"pool": "autoscaled", "servers": float(ch["servers_billed_mean"]), **_whatif(r, targets)})
    return pd.DataFrame(out)


def _whatif(r: dict, targets: dict) -> dict:
    keys = ("corrector", "status", *(k for fig in TARGET_FIGURES.values() for k in (fig, f"{fig}_hi")),
            "cost_per_1000_steps")
    return {**{k: r.get(k, np.nan) for k in keys}, "meets": feasible(r, targets), "fails": fails_text(r, targets)}


FIGURE_WORDS = {"dropped_frac": "dropped", "sojourn_p95_s": "sojourn p95", "sojourn_p99_s": "sojourn p99",
                "delay_p95_steps": "delay p95", "bias_exact": "bias", "bias_vs_naive": "bias x naive's"}


def figure_text(fig: str, v: float) -> str:
    """A rare-event figure as the answer's lines write it: a share in %, seconds, steps, a bias."""
    if fig.startswith("bias"):
        return f"{v:.3g}"
    return f"{v:.2%}" if fig == "dropped_frac" else f"{v:.3g} {'s' if fig.endswith('_s') else 'steps'}"


def undecided_text(n: int, answer: Optional[int], d: stopping.Decision, row: dict, targets: Dict[str, Any]) -> str:
    """The line of a count left unresolved when the replications stopped, from its ``row`` (its figures
    on the replications): '6 or 7: dropped at 6 unresolved, 0.62% [0.31%, 1.1%] against 1.00%, after
    3 runs (77,000 trial-steps measured, 14 drop episodes seen; the regime's chain asks for ...)' (the
    larger, safe count is the one recommended)."""
    figs = []
    for k in d.open:
        fig = stopping.FIGURES[k]
        figs.append(f"{FIGURE_WORDS[fig]} at {n} unresolved, {figure_text(fig, row[fig])} "
                    f"[{figure_text(fig, row[f'{fig}_lo'])}, {figure_text(fig, row[f'{fig}_hi'])}] against "
                    f"{figure_text(fig, targets[k])}")
    p = d.plan
    if math.isinf(p.need):
        need = "; the regime's chain puts the share at its target: no budget settles it"
    elif p.need > 0:
        need = (f"; the regime's chain asks for {p.need:,.0f} trial-steps, {p.expected:.3g} expected episodes of "
                f"{p.length:.3g} steps, to settle it at {stopping.POWER:.0%} of seeds")
    else:
        need = ""
    runs = len(d.reps)
    return (f"{n} or {answer if answer is not None else 'more'}: " + "; ".join(figs)
            + f", after {runs} run{'s' if runs > 1 else ''} ({stopping.exposure(d.reps):,} trial-steps measured, "
            f"{stopping.episodes_seen(d.reps)} drop episodes seen{need}); capacity.decide_steps or "
            "capacity.decide_s cannot afford to settle it, so the larger count is recommended")
