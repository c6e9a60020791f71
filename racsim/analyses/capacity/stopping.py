"""Deciding with enough evidence, then stopping (docs/DESIGN "Answers that hold for a whole run").

A figure driven by rare events (results dropped when two replicas are evicted together, a burst
that overflows the drop horizon, the sojourn's and the delay's upper quantiles) is too narrow or
too wide by chance in one fixed-length run: it holds an episode or not. Where such a figure's
interval straddles its target (lo <= target < hi), or reads [0, 0] (a run that saw no event at
all), the count is simulated again as independent replications, and the figure's interval is
rebuilt on the spread between replications: a Student-t interval on the replications' point
estimates, the dropped share pooled by events over sent. Replications are added until every such
interval lies on one side of its target or the budget ends (:func:`sequential`).

This module is the pure rule: what a replication yields (:class:`Replicate`, a dict of figures)
and how they are read; the simulation of one replication is the caller's
(racsim.analyses.capacity.replications.replicate_count)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Tuple

import numpy as np
from scipy import special

# Targets whose figure is driven by rare events, and the figure (a column of the capacity curve).
RARE_TARGETS = {"max_dropped": "dropped_frac", "max_sojourn_p95_s": "sojourn_p95_s",
                "max_sojourn_p99_s": "sojourn_p99_s", "max_delay_p95_steps": "delay_p95_steps"}
# The chosen corrector's bias targets: under outages or bursts the same rare episodes (results lost
# together) drive them, so they are decided the same way there; each replication then runs the
# bias study on its schedule.
BIAS_TARGETS = {"max_bias": "bias_exact", "max_bias_vs_naive": "bias_vs_naive"}
# A pool split's lag caps (capacity.split.*; racsim/analyses/capacity/split.py), decided the same way.
LAG_TARGETS = {"max_mean_lag": "mean_lag", "max_head_lag_p95": "head_lag_p95"}
FIGURES = {**RARE_TARGETS, **BIAS_TARGETS, **LAG_TARGETS}
MIN_REPLICATIONS = 2  # an interval on the replications' spread is read from two on

# A replication's figures: ``dropped`` and ``sent`` (counts), each quantile figure of RARE_TARGETS, and
# where a bias target is open, the chosen corrector's figures of BIAS_TARGETS.
Replicate = Dict[str, float]


def open_targets(row, targets: Dict[str, float], zero: bool = True, bias: bool = False) -> List[str]:
    """The rare-event targets (:data:`RARE_TARGETS`, and with ``bias`` :data:`BIAS_TARGETS` and a pool split's
    :data:`LAG_TARGETS`) that are
    set above 0 and that ``row``'s interval leaves undecided: its [lo, hi] straddles the target
    (lo <= target < hi) or, with ``zero`` (a channel with a slow random regime, whose rare events a
    run may miss), reads [0, 0] exactly."""
    out = []
    for key, fig in (FIGURES if bias else RARE_TARGETS).items():
        t = targets.get(key)
        if t is None or t <= 0:  # a target of 0: any event seen fails it for sure, and none seen cannot settle it
            continue
        lo, hi = float(row[f"{fig}_lo"]), float(row[f"{fig}_hi"])
        if (lo <= t < hi) or (zero and lo == 0.0 and hi == 0.0):
            out.append(key)
    return out


def t_quantile(level: float, df: int) -> float:
    """Student's t quantile of a central ``level`` interval with ``df`` degrees of freedom."""
    return float(special.stdtrit(df, 0.5 + level / 2.0))


def mean_interval(values: np.ndarray, level: float) -> Tuple[float, float, float]:
    """(mean, lo, hi): the Student-t interval on the mean of independent replications' estimates of a
    figure that is never negative (a quantile of seconds or steps, a bias norm or ratio): lo >= 0."""
    v = np.asarray(values, dtype=np.float64)
    m = float(v.mean())
    half = t_quantile(level, v.size - 1) * float(v.std(ddof=1)) / np.sqrt(v.size)
    return m, max(0.0, m - half), m + half


def ratio_interval(num: np.ndarray, den: np.ndarray, level: float) -> Tuple[float, float, float]:
    """(r, lo, hi): a share pooled by events over sent, r = sum(num) / sum(den), with the
    delta-method standard error over the replications (at least the binomial one of sum(den)
    independent requests) and Student's t on R - 1 degrees of freedom, within [0, 1]. No event in any replication: [0, the exact binomial upper end with none in
    sum(den) sent] (optimistic where events cluster in episodes, but never [0, 0])."""
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    total, R = float(den.sum()), num.size
    r = float(num.sum()) / total
    if num.sum() == 0:
        return 0.0, 0.0, float(1.0 - ((1.0 - level) / 2.0) ** (1.0 / total))
    # never below the binomial spread of independent requests (a few replications that happen to agree)
    se = max(float(np.sqrt(np.sum((num - r * den) ** 2) * R / (R - 1))) / total, float(np.sqrt(r * (1 - r) / total)))
    half = t_quantile(level, R - 1) * se
    return r, max(0.0, r - half), min(1.0, r + half)


def intervals(reps: List[Replicate], keys: List[str], level: float) -> Dict[str, Tuple[float, float, float]]:
    """Per target key: (figure, lo, hi) on the replications ``reps`` (at least two)."""
    out = {}
    for key in keys:
        if key == "max_dropped":
            out[key] = ratio_interval(np.array([r["dropped"] for r in reps]), np.array([r["sent"] for r in reps]),
                                      level)
        else:
            out[key] = mean_interval(np.array([r[FIGURES[key]] for r in reps]), level)
    return out


def undecided(found: Dict[str, Tuple[float, float, float]], targets: Dict[str, float]) -> List[str]:
    """The keys whose interval still straddles its target (lo <= target < hi)."""
    return [k for k, (_, lo, hi) in found.items() if lo <= targets[k] < hi]


@dataclass
class Budget:
    """What the extra replications of a whole answer may take together: ``steps`` simulated steps
    (capacity.decide_steps) and ``seconds`` of this process's wall-clock (capacity.decide_s), from
    its creation; ``used``: the steps granted so far."""

    steps: int
    seconds: float
    used: int = 0
    started: float = field(default_factory=time.perf_counter)

    def affords(self, steps: int) -> bool:
        """Grant one more replication of ``steps`` steps when both budgets allow it (and count it)."""
        if self.used + steps > self.steps or time.perf_counter() - self.started >= self.seconds:
            return False
        self.used += steps
        return True


@dataclass
class Decision:
    """What :func:`sequential` found: the replications (the first is the settled run), the rebuilt
    intervals per target key, and the keys left undecided when the budget ended."""

    reps: List[Replicate]
    found: Dict[str, Tuple[float, float, float]]
    open: List[str] = field(default_factory=list)

    @property
    def decided(self) -> bool:
        return not self.open


def sequential(first: Replicate, replicate: Callable[[int], Replicate], keys: List[str],
               targets: Dict[str, float], level: float, affords: Callable[[int], bool]) -> Decision:
    """Add replications to ``first`` (replication 0) until each of ``keys``' intervals lies on one
    side of its target, read from :data:`MIN_REPLICATIONS` replications on. ``replicate(r)``:
    replication r's figures; ``affords(r)``: whether the budget allows replication r (r >= 1)."""
    reps = [first]
    while True:
        if len(reps) >= MIN_REPLICATIONS:
            found = intervals(reps, keys, level)
            left = undecided(found, targets)
            if not left or not affords(len(reps)):
                return Decision(reps, found, left)
        elif not affords(len(reps)):
            return Decision(reps, {}, list(keys))
        reps.append(replicate(len(reps)))
