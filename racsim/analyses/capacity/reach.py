"""Targets more capacity cannot meet (issue 43, point 3): a figure that fails its target surely and
does not fall with the count, so that no count the search may try meets it, shown from the counts
already evaluated instead of by running the rest.

The queue's figures (sojourn, delay, dropped share, seconds per step) fall as capacity is added,
by less and less: their waiting part vanishes as the offered load does. Others barely move once the
queue is stable: the bias of a corrector comes mostly from the learner and the correction, the
seconds per step have the generation and update under them. Such a target can be set below what
any count reaches (``capacity.max_bias_vs_naive=0.0001`` where rac reads 0.0167 x naive's from 5 to
32 GPUs), and a search would then try every count up to ``capacity.max_count`` and every
sensitivity variant for nothing.

The rule reads two stationary counts far apart: ``fewer``, the fewest evaluated (the queue at its
busiest), and ``more``, the largest evaluated, at no more than half of ``fewer``'s offered load
(:data:`FAR`: the queue has emptied out, its figures have had room to fall). A target is out of
reach when its figure's interval lies above it at both (its lower end over the target: it fails
for sure, not by the width of an interval), and when even the steepest fall the two intervals
allow (from the upper end at ``fewer`` to the lower end at ``more``), kept up beyond ``more``,
leaves it above the target at the largest count the search may try (``top``). Keeping up that
pace is optimistic for a figure that more capacity helps less and less (one convex in the count,
as a queue's waiting is: Dyer and Proll 1977), so a figure that does fall, as a reachable queue
target's does, is never cut off: the search goes on as before. The rule runs no count of its own."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from racsim.analyses.capacity.targets import TARGET_FIGURES, chosen_row

FAR = 0.5  # ``more``'s offered load is at most this share of ``fewer``'s


@dataclass(frozen=True)
class OutOfReach:
    """A target no count up to ``top`` meets: ``key`` (capacity.<key>) and its ``target``, the
    ``figure`` (a curve column) as (estimate, lo, hi) at counts ``fewer`` and ``more`` with their
    offered loads, whether it does not fall beyond the intervals (``flat``: its upper end at ``more``
    reaches its lower end at ``fewer``), the steepest fall per unit they allow (``slope``), and ``met_from``: the smallest upper end among the stationary counts
    evaluated, the least value of the target that one of them meets."""

    key: str
    target: float
    figure: str
    fewer: int
    more: int
    at_fewer: Tuple[float, float, float]
    at_more: Tuple[float, float, float]
    load_fewer: float
    load_more: float
    flat: bool
    slope: float
    met_from: float
    top: int

    @property
    def needs(self) -> Optional[int]:
        """The fewest count the steepest fall could reach the target at (None: it does not fall)."""
        if self.slope <= 0:
            return None
        return self.more + math.ceil((self.at_more[1] - self.target) / self.slope)


def _interval(row: Any, fig: str) -> Tuple[float, float, float]:
    return float(row[fig]), float(row.get(f"{fig}_lo", math.nan)), float(row.get(f"{fig}_hi", math.nan))


def out_of_reach(rows: Dict[int, List[dict]], chosen: str, targets: Dict[str, Any], top: int) -> List[OutOfReach]:
    """The targets the ``chosen`` corrector cannot meet at any count up to ``top`` (the module's rule),
    read off the evaluated counts' curve ``rows``; empty when no two stationary counts lie far enough
    apart (:data:`FAR`) or every failing figure may still fall under its target."""
    ok = sorted(n for n, rs in rows.items() if chosen_row(rs, chosen).get("status") == "ok")
    if len(ok) < 2:
        return []
    fewer, more = ok[0], ok[-1]
    ra, rb = chosen_row(rows[fewer], chosen), chosen_row(rows[more], chosen)
    if not rb["load"] <= FAR * ra["load"]:
        return []
    out = []
    for key, fig in TARGET_FIGURES.items():
        t = targets.get(key)
        if t is None or fig not in ra or fig not in rb:
            continue
        a, b = _interval(ra, fig), _interval(rb, fig)
        if not (a[1] > t and b[1] > t):  # a NaN end: not measured, nothing shown
            continue
        slope = max(0.0, a[2] - b[1]) / (more - fewer)
        if not b[1] - slope * (top - more) > t:
            continue
        his = [h for h in (_interval(chosen_row(rows[n], chosen), fig)[2] for n in ok) if h == h]
        out.append(OutOfReach(key, float(t), fig, fewer, more, a, b, float(ra["load"]), float(rb["load"]),
                              flat=b[2] >= a[1], slope=slope, met_from=min(his, default=math.nan), top=int(top)))
    return out
