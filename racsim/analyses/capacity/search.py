"""Where the fewest count lies: bisection and exponential search over counts whose feasibility
grows with the count, the count where the offered load binds, and the counts the list skipped
(between the evaluated ones, below them, above them) that the answer may need."""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional

from racsim.analyses.capacity.channel import units_per_server, with_count
from racsim.analyses.capacity.targets import meets
from racsim.config.schema import RacsimConf
from racsim.config.validate import validate
from racsim.errors import ConfigError
from racsim.pipeline.faults import read_schedule


def first_passing(counts: List[int], passes) -> Optional[int]:
    """The first of ``counts`` (ascending) for which ``passes`` holds, by bisection (``passes`` is
    monotone in the count); None when none does."""
    lo, hi = 0, len(counts)
    while lo < hi:
        mid = (lo + hi) // 2
        if passes(counts[mid]):
            hi = mid
        else:
            lo = mid + 1
    return counts[lo] if lo < len(counts) else None


def fewest_from(counts: List[int], start: int, passes: Callable[[int], bool]) -> Optional[int]:
    """The fewest of ``counts`` (ascending) for which ``passes`` holds (monotone in the count), searched
    from index ``start``: galloping away from it 1, 2, 4... places until the answer is bracketed,
    then bisecting inside (:func:`first_passing`): exponential search (Bentley & Yao 1976), about
    2 log2(d) evaluations for an answer d places from the start. None when none passes."""
    lo, hi, step = -1, len(counts), 1  # counts[lo] fails, counts[hi] passes (-1, len: none known)
    if passes(counts[start]):
        hi = start
        while hi > 0:
            j = max(hi - step, 0)
            if not passes(counts[j]):
                lo = j
                break
            hi, step = j, 2 * step
    else:
        lo = start
        while lo < len(counts) - 1:
            j = min(lo + step, len(counts) - 1)
            if passes(counts[j]):
                hi = j
                break
            lo, step = j, 2 * step
    inside = first_passing(counts[lo + 1:hi], passes)
    return inside if inside is not None else (counts[hi] if hi < len(counts) else None)


def search_bound(n: int) -> int:
    """The most of ``n`` counts :func:`fewest_from` evaluates from the first (a gallop, then a bisection)."""
    return 1 if n <= 1 else min(n, 2 * math.ceil(math.log2(n)))


def load_bound_index(counts: List[int], load: Callable[[int], float], max_load: float) -> int:
    """How many of ``counts`` (ascending) are overloaded: the index of the first whose long-run
    ``load`` (decreasing in the count) is under ``max_load``, by bisection (len: none is)."""
    first = first_passing(counts, lambda n: load(n) < max_load)
    return len(counts) if first is None else counts.index(first)


def load_bound(listed: List[int], unlisted: List[int], load: Callable[[int], float], max_load: float) -> Optional[int]:
    """The count where the load binds, when the list skips it: the fewest of ``unlisted``
    (ascending, whole servers) under ``max_load`` that lies between the listed counts over it and
    the fewest listed under it, or None (the list holds it, or no listed count is under max_load).
    ``load(n)``: a count's long-run offered load, decreasing in the count, so a bisection finds it
    (:func:`load_bound_index`, a few loads). Where the targets bind no later than the load, this
    count is the answer: the grid evaluates it with the listed ones (side by side where a pool runs)."""
    k = load_bound_index(listed, load, max_load)  # listed[k]: the fewest listed under max_load
    if k == len(listed):
        return None
    inside = [n for n in unlisted if (k == 0 or n > listed[k - 1]) and n < listed[k]]
    j = load_bound_index(inside, load, max_load)
    return inside[j] if j < len(inside) else None


def fewest_valid(cfg: RacsimConf, name: str, key: str, upto: int) -> int:
    """The fewest count of channel ``name`` (whole servers) below ``upto`` that makes a valid spec
    whose outage schedule, if any, names only servers it has (one naming replica 2 needs 3), or ``upto``."""
    step = units_per_server(cfg, name)
    for n in range(step, upto, step):
        c = with_count(cfg, key, n)
        schedule = c.pipeline.channels[name].faults.schedule
        try:
            validate(c)
            if schedule is not None:
                read_schedule(schedule, f"pipeline.channels.{name}.faults.schedule", n // step)
        except ConfigError:
            continue
        return n
    return upto


def between_counts(rows: Dict[int, List[dict]], chosen: str, targets: Dict[str, Any], step: int,
                   lowest: int) -> List[int]:
    """The counts (multiples of ``step``: whole servers) strictly between the largest evaluated count that
    fails the targets and the fewest that meets them, above which every evaluated count does: where
    the fewest count may lie that the list skipped; when every evaluated count meets them, those from
    ``lowest`` (the fewest the channel can have: :func:`fewest_valid`) up to the first. Empty when
    they are neighbours, or none meets them."""
    ok = passing(rows, chosen, targets)
    top = last_failing(ok, lowest)
    above = [n for n in ok if ok[n] and n > top]
    if not above:
        return []
    return [n for n in range(top + 1, min(above)) if n % step == 0]


def counts_above(rows: Dict[int, List[dict]], chosen: str, targets: Dict[str, Any], step: int,
                 top: int) -> List[int]:
    """The counts (multiples of ``step``: whole servers) above the largest evaluated one up to ``top``,
    when that one fails the targets: where the fewest count meeting them lies if the list stops
    short of it (feasibility growing with the count). Empty when the largest evaluated count meets them."""
    largest = max(rows)
    if meets(rows[largest], chosen, targets):
        return []
    return [n for n in range(largest + 1, top + 1) if n % step == 0]


def answer_counts(rows: Dict[int, List[dict]], chosen: str, targets: Dict[str, Any], step: int, lowest: int,
                  top: int) -> List[int]:
    """The counts the answer depends on, in the order they are decided (the answer's candidate first):
    the fewest meeting the targets above which every evaluated count does, then the one a server below
    it (from ``lowest``); where the largest evaluated count fails, it, then the one a server above it
    (up to ``top``)."""
    ok = passing(rows, chosen, targets)
    ns = sorted(ok)
    if ok[ns[-1]]:
        bad = last_failing(ok, lowest)
        f = min(n for n in ns if n > bad)
        return [f] + ([f - step] if f - step >= lowest else [])
    return [ns[-1]] + ([ns[-1] + step] if ns[-1] + step <= top else [])


def passing(rows: Dict[int, List[dict]], chosen: str, targets: Dict[str, Any]) -> Dict[int, bool]:
    """Per evaluated count (its curve ``rows``): does it meet the targets with the ``chosen`` corrector?"""
    return {n: meets(rs, chosen, targets) for n, rs in rows.items()}


def last_failing(ok: Dict[int, bool], lowest: int) -> int:
    """The largest count that fails the targets (``ok``: :func:`passing`); ``lowest`` - 1 when none does."""
    return max((n for n in ok if not ok[n]), default=lowest - 1)
