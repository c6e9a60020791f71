"""One capacity search from start to answer: the listed counts (a grid, side by side where that
saves time, or a bisection), the counts the list skipped where the fewest may lie, the counts the
answer depends on decided with enough evidence, then the answer, the autoscaled pool's what-if and
the engine's speed. A target the counts evaluated show out of reach of more capacity (reach.py)
stops the search there: no count above, no replications, no what-if; the answer says so."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from racsim.analyses.capacity import stopping
from racsim.analyses.capacity.channel import channel_of, count_key, fixed_pool, unit_name, units_per_server, with_count
from racsim.analyses.capacity.length import Settled, settle
from racsim.analyses.capacity.load import LoadBasis, channel_loads, load_basis
from racsim.analyses.capacity.memory import steps_that_fit
from racsim.analyses.capacity.pool import count_worker, pool_spec, workers_after_first, workers_at_start
from racsim.analyses.capacity.reach import OutOfReach, out_of_reach
from racsim.analyses.capacity.replications import decide_count, deciding_keys
from racsim.analyses.capacity.result import (CapacityResult, autoscale_whatif, binding, curve_frame, fewest,
                                             per_corrector, undecided_text)
from racsim.analyses.capacity.rows import count_note, count_rows, curve_rows
from racsim.analyses.capacity.search import (answer_counts, between_counts, counts_above, fewest_from, fewest_valid,
                                             first_passing, load_bound, load_bound_index, search_bound)
from racsim.analyses.capacity.speed import benchmark
from racsim.analyses.capacity.targets import chosen_row, failed, meets, targets_of
from racsim.config.schema import RacsimConf
from racsim.config.validate import check_limits, search_top, validate
from racsim.io import side_by_side
from racsim.progress import Progress

SEARCH, DECIDING = "capacity search", "deciding replications"  # phases of a search's progress (racsim.progress)


def run_capacity(cfg: RacsimConf, progress: Optional[Progress] = None) -> CapacityResult:
    """Evaluate the counts (all of them, or a bisection) and recommend one. The offered load
    of every count comes first; an overloaded count is never simulated nor recommended.
    ``cfg``: the scenario's spec (racsim.config.spec.scenario), left as it is. ``progress``: the
    phases of :func:`capacity_phases`, each with its total (an upper bound where the search may stop sooner)."""
    progress = progress or Progress.off()
    if not isinstance(cfg, RacsimConf):
        raise TypeError(f"run_capacity takes a RacsimConf (racsim.config.spec.scenario), not {type(cfg).__name__}")
    validate(cfg)
    cfg, lowered = steps_that_fit(cfg)
    check_limits(cfg)  # before the first count: a search too big for the machine is refused naming its knob
    name = channel_of(cfg)
    progress.plan(*capacity_phases(cfg, name))
    scaled = cfg if cfg.pipeline.channels[name].autoscale is not None else None
    listed = listed_counts(cfg, name)
    # the curve: fixed pools; the autoscaled pool is compared with them once the answer is known
    s = Search.start(cfg if scaled is None else fixed_pool(cfg, name), name, listed, progress)
    lowest, top = fewest_valid(s.cfg, name, s.key, listed[0]), search_top(s.cfg.capacity.max_count, listed)
    s.search(listed, lowest, top)
    if s.unreachable:  # no count up to top can meet a target: nothing left to decide or compare
        budget, decisions = stopping.Budget(0, 0.0), {}
    else:
        if scaled is not None:
            for n in autoscale_bounds(scaled, name):
                s.evaluate(n)
        budget, decisions = s.decide(lowest, top)
    s.timings["search_s"] = time.perf_counter() - s.started  # wall-clock: runs_s sums the processes' seconds
    result = s.result(listed, top, [n for n in (servers_note(cfg, name), lowered) if n], budget, decisions)
    auto = None if scaled is None or s.unreachable else s.autoscaled(scaled, result)
    result.speed = s.speed(scaled, auto)
    return result


def capacity_phases(cfg: RacsimConf, name: str) -> List[str]:
    """A search's phases, in order: the counts, the replications deciding the counts the answer
    depends on, the autoscaled pool's run, the speed figure."""
    cap = cfg.capacity
    return [SEARCH, *([DECIDING] if cap.decide_steps > 0 else []),
            *(["autoscaled pool"] if cfg.pipeline.channels[name].autoscale is not None else []),
            *(["speed benchmark"] if cap.benchmark and cfg.pipeline.engine == "lanes" else [])]


def autoscale_bounds(cfg: RacsimConf, name: str) -> Tuple[int, int]:
    """The counts of channel ``name``'s autoscale rule's min and max servers."""
    a, units = cfg.pipeline.channels[name].autoscale, units_per_server(cfg, name)
    return a.min * units, a.max * units


def listed_counts(cfg: RacsimConf, name: str) -> List[int]:
    """The counts asked for, ascending: those of ``capacity.counts`` that are whole servers (multiples
    of a gpu_rm channel's tp: :func:`whole_servers`), and an autoscaled pool's fixed pools of its
    rule's min and max (:func:`autoscale_bounds`)."""
    counts = set(whole_servers(cfg.capacity.counts, units_per_server(cfg, name))[0])
    if cfg.pipeline.channels[name].autoscale is not None:
        counts |= set(autoscale_bounds(cfg, name))
    return sorted(counts)


def whole_servers(counts, step: int) -> Tuple[List[int], List[int]]:
    """(the ``counts`` that are whole servers of ``step`` units, those that are not), each in its order."""
    return [int(n) for n in counts if n % step == 0], [int(n) for n in counts if n % step]


def servers_note(cfg: RacsimConf, name: str) -> Optional[str]:
    """What the search did with ``capacity.counts`` that are not whole servers (a gpu_rm channel's GPUs in
    replicas of tp: the scenario's list with rm.tp=4 keeps 4, 8, 12, 16), in a sentence; None when all are."""
    step = units_per_server(cfg, name)
    kept, left = whole_servers(cfg.capacity.counts, step)
    if not left:
        return None
    return (f"capacity.counts: {', '.join(map(str, kept))} {unit_name(cfg, name)} searched, the counts that are whole "
            f"replicas of rm.tp = {step}; {', '.join(map(str, left))} left out")


class Unreachable(Exception):
    """Raised inside a search (:meth:`Search.evaluate_or_stop`) once a target is out of reach."""


@dataclass
class Search:
    """A capacity search under way: its spec (fixed pools), the sized channel, what a count must
    meet, the loads, and per evaluated count its rows and settled run's result; ``timings`` and
    ``requests`` (simulated by the lanes engine, every pipeline of every count) add up the runs."""

    cfg: RacsimConf
    name: str
    key: str
    unit: str
    step: int  # units a server: counts searched are whole servers
    chosen: str
    targets: Dict[str, Any]
    basis: LoadBasis
    loads: Dict[int, Dict[str, float]]
    started: float
    progress: Progress = field(default_factory=Progress.off)
    runs: Dict[int, Any] = field(default_factory=dict)
    rows: Dict[int, List[dict]] = field(default_factory=dict)
    timings: Dict[str, float] = field(default_factory=lambda: {"runs_s": 0.0, "pipeline_s": 0.0})
    requests: int = 0
    replicated: int = 0  # steps the deciding replications simulated so far
    unreachable: List[OutOfReach] = field(default_factory=list)  # the targets out of reach: the search stopped

    @classmethod
    def start(cls, cfg: RacsimConf, name: str, counts: List[int], progress: Optional[Progress] = None) -> "Search":
        """A search of channel ``name`` with the offered load of every one of ``counts``, drawn once
        (the counts searched between the listed ones reuse the draws)."""
        started = time.perf_counter()
        key = count_key(cfg, name)
        basis = load_basis(cfg, name)
        s = cls(cfg, name, key, unit_name(cfg, name), units_per_server(cfg, name), str(cfg.capacity.corrector),
                targets_of(cfg), basis, channel_loads(cfg, name, key, counts, basis), started,
                progress or Progress.off())
        s.timings["load_s"] = time.perf_counter() - started
        return s

    def tell(self, what: str):
        """A line of progress on the count or phase ``what`` (a run doubled, a replication)."""
        return lambda note: self.progress.note(f"{what}: {note}", line=True)

    def load_of(self, n: int) -> Dict[str, float]:
        """Count ``n``'s loads (:func:`channel_loads`), computed the first time it is asked for."""
        if n not in self.loads:
            self.loads.update(channel_loads(self.cfg, self.name, self.key, [n], self.basis))
        return self.loads[n]

    def simulated_of(self, ns: List[int]) -> int:
        """How many of ``ns`` a search simulates (an overloaded count takes no run)."""
        return sum(1 for n in ns if self.load_of(n)["load"] < self.cfg.capacity.max_load)

    def spent(self, run: Settled, seconds: float) -> None:
        self.timings["runs_s"] += seconds
        self.timings["pipeline_s"] += run.pipeline_s
        self.requests += run.requests

    def record(self, n: int, run: Optional[Settled], found: List[dict], seconds: float) -> None:
        """Count ``n`` evaluated: its rows, its run's result and costs, and its note: a unit of the
        search phase where it was simulated there, otherwise a line."""
        self.rows[n] = found
        if run is not None:
            self.spent(run, seconds)
            self.runs[n] = run.res
        note = f"{n} {self.unit}: {count_note(found, self.chosen, self.targets)}"
        if run is not None and self.progress.phase.name == SEARCH:
            self.progress.advance(1, note)  # one more count simulated: the search's unit of work
        else:  # overloaded (no run), or one the answer's deciding needs (that phase's units: replicated steps)
            self.progress.note(note, line=True)

    def count_here(self, c: RacsimConf, nm: str, k: str, n: int, load: dict):
        """:func:`~racsim.analyses.capacity.pool.count_worker` in this process, with its progress notes."""
        t0 = time.perf_counter()
        run, out = count_rows(c, nm, k, n, load, self.tell(f"{n} {self.unit}"),
                              lambda text: self.progress.note(f"{n} {self.unit}: {text}"))
        return run, out, time.perf_counter() - t0

    def evaluate(self, n: int) -> bool:
        """Count ``n`` evaluated here (once): does it meet the targets?"""
        if n not in self.rows:
            self.progress.note(f"{n} {self.unit}: simulating")
            self.record(n, *self.count_here(self.cfg, self.name, self.key, n, self.load_of(n)))
        return meets(self.rows[n], self.chosen, self.targets)

    def reach(self, top: int) -> bool:
        """Is a target out of reach of every count up to ``top``, by the counts evaluated so far
        (:func:`~racsim.analyses.capacity.reach.out_of_reach`; ``unreachable`` then says which)?"""
        self.unreachable = out_of_reach(self.rows, self.chosen, self.targets, top)
        return bool(self.unreachable)

    def evaluate_or_stop(self, n: int, top: int) -> bool:
        """:meth:`evaluate`, then :class:`Unreachable` raised when the counts evaluated show a target out of reach."""
        passes = self.evaluate(n)
        if not passes and self.reach(top):
            raise Unreachable
        return passes

    def evaluate_grid(self, todo: List[int]) -> None:
        """Every count of ``todo``, side by side in a pool of processes where that saves time: from
        the start, this process simulating the first count and then those the pool has not started
        (:func:`~racsim.analyses.capacity.pool.workers_at_start`); else here until the first one
        simulated shows what a count takes, then the others in the pool. Where the longest runs do
        not fit side by side, the pool's are shorter (:func:`~racsim.analyses.capacity.pool.pooled_spec`)."""
        simulated = [n for n in todo if self.loads[n]["load"] < self.cfg.capacity.max_load]
        for n in todo:  # the overloaded counts first: no run, their rows at once
            if n not in simulated:
                self.evaluate(n)
        pooled = pool_spec(self.cfg, self.name, len(simulated))
        beside = workers_at_start(self.cfg, self.name, pooled, len(simulated))
        if beside:
            self.in_pool(pooled, beside, simulated, here=True)
            return
        while simulated and not self.runs:
            self.evaluate(simulated.pop(0))
        workers = workers_after_first(self.cfg, pooled, self.timings["runs_s"], len(simulated))
        if workers > 1:
            self.in_pool(pooled, workers, simulated)
        else:
            for n in simulated:
                self.evaluate(n)

    def in_pool(self, spec: RacsimConf, workers: int, counts: List[int], here: bool = False) -> None:
        """``counts`` simulated with ``spec`` side by side in a pool of ``workers`` processes
        (``here``: this one too, the first count and those the pool has not started when it is
        free); a count not stationary with a ``spec`` shorter than the search's is run again here."""
        again = []
        self.progress.note(f"{', '.join(map(str, counts))} {self.unit}: side by side in {workers + here} processes")
        for i, (run, found, seconds) in side_by_side(workers, count_worker,
                                                     [(spec, self.name, self.key, n, self.loads[n]) for n in counts],
                                                     self.count_here if here else None, share=True):
            if spec is not self.cfg and run is not None and not run.verdict.stationary:
                self.spent(run, seconds)  # its seconds count; its rows come from the longer run
                again.append(counts[i])
            else:
                self.record(counts[i], run, found, seconds)
        for n in again:
            self.evaluate(n)

    def search(self, listed: List[int], lowest: int, top: int) -> None:
        """The ``listed`` counts: all of them (with the count where the load binds, when the list
        skips it) or a bisection (``capacity.search``); then the fewest count meeting the targets,
        whatever the list: among the counts it skipped, those below it (from ``lowest``), or above
        it (up to ``top``), except above a largest count that only straddles its targets
        (:meth:`straddles`: the deciding phase settles it first, and searches above it where it fails).
        It stops as soon as the counts evaluated show a target that no count up to ``top`` can meet
        (:meth:`reach`; a failing count above the list: :meth:`evaluate_or_stop`)."""
        cap = self.cfg.capacity
        if cap.search == "bisect":  # assumes feasibility is monotone in the count
            self.progress.start(SEARCH, self.simulated_of(listed), "simulated count", upto=True)
            if self.evaluate(listed[-1]):
                first_passing(listed[:-1], self.evaluate)
        else:
            gap = [n for n in range(lowest, listed[-1]) if n % self.step == 0 and n not in self.loads]  # unlisted
            bound = load_bound(listed, gap, lambda n: self.load_of(n)["load"], cap.max_load)
            todo = listed if bound is None else sorted(listed + [bound])
            self.progress.start(SEARCH, self.simulated_of(todo), "simulated count")
            self.evaluate_grid(todo)
        if not meets(self.rows[max(self.rows)], self.chosen, self.targets) and self.reach(top):
            return
        between = between_counts(self.rows, self.chosen, self.targets, self.step, lowest)
        if between or not self.straddles(max(self.rows)):
            self.extend(between or counts_above(self.rows, self.chosen, self.targets, self.step, top), top)

    def extend(self, more: List[int], top: int) -> None:
        """The fewest of the unlisted counts ``more`` (ascending) that meets the targets, searched
        (:func:`fewest_from`) from the first under ``capacity.max_load``; it stops once a target is
        out of reach (:meth:`reach`)."""
        cap = self.cfg.capacity
        if more:
            k = load_bound_index(more, lambda n: self.load_of(n)["load"], cap.max_load)  # the first k fail, no run
            if k < len(more) and self.progress.phase.name == SEARCH:
                self.progress.grow(search_bound(len(more) - k), f"the fewest count meeting the targets lies among "
                                                               f"{len(more)} counts not listed", upto=True)
            if k:
                self.evaluate(more[k - 1])  # its row shows where the load bound sits
            if k < len(more):  # where the load binds, as it often does, the answer in one run
                try:
                    fewest_from(more[k:], 0, lambda n: self.evaluate_or_stop(n, top))
                except Unreachable:
                    pass

    def straddles(self, n: int) -> bool:
        """Whether count ``n`` fails only targets whose intervals straddle them and that its deciding
        replications settle (:func:`deciding_keys`; ``capacity.decide_steps`` > 0): the search then
        evaluates no count above it, as the deciding phase settles it first and searches above it
        (:meth:`extend`) only where it fails; a count that passes once settled (most do: its run's
        interval was wide) takes no run above it."""
        if not self.cfg.capacity.decide_steps > 0 or n not in self.runs:
            return False
        row = chosen_row(self.rows[n], self.chosen)
        fails = set(failed(row, self.targets))
        return bool(fails) and fails <= set(stopping.open_targets(row, self.targets, bias=True)) and fails <= set(
            deciding_keys(self.cfg, self.name, self.key, n, row, {**self.targets, "corrector": self.chosen},
                          self.loads[n]["work_per_s"]))

    def decide(self, lowest: int, top: int) -> Tuple[stopping.Budget, Dict[int, Optional[stopping.Decision]]]:
        """The counts the answer depends on (:func:`~racsim.analyses.capacity.search.answer_counts`),
        each evaluated and decided with enough evidence (:func:`decide_count`) in the order that function
        gives them: the count the answer would recommend first, so that the budget settles it before any
        other (were the fewer decided first, what its replications spent could leave the recommended count
        unresolved, and the answer would move up by the luck of the order: issue 50), then the one a
        server below it, which the answer moves down to only where it too is settled. Where the search
        stopped at a largest count that straddles its targets (:meth:`straddles`), that count is the
        candidate: decided failing, the counts above it are searched (:meth:`extend`) and the fewest
        of them meeting the targets is the next candidate (a tight budget may then leave it
        unresolved, where deciding it first would have settled it: the answer moves up, the safe
        side). Within one budget
        of ``capacity.decide_steps`` and ``capacity.decide_s`` for them all."""
        t0 = time.perf_counter()
        cap = self.cfg.capacity
        budget = stopping.Budget(int(cap.decide_steps), math.inf if cap.decide_s is None else float(cap.decide_s))
        if cap.decide_steps > 0:
            self.progress.start(DECIDING, int(cap.decide_steps), "replicated step", upto=True)
        decisions: Dict[int, Optional[stopping.Decision]] = {}
        while cap.decide_steps > 0 and (todo := [n for n in answer_counts(self.rows, self.chosen, self.targets,
                                                                          self.step, lowest, top)
                                                 if n not in decisions]):
            n = todo[0]
            if n > max(self.rows):  # the largest count (it straddled: :meth:`straddles`) is decided failing
                self.extend(counts_above(self.rows, self.chosen, self.targets, self.step, top), top)
                if self.unreachable:
                    break
                continue
            self.evaluate(n)
            decisions[n] = decide_count(self.cfg, self.name, self.key, n, self.rows[n], self.runs[n],
                                        {**self.targets, "corrector": self.chosen}, budget,
                                        self.loads[n]["work_per_s"], self.replicating(n)) \
                if n in self.runs else None
            self.progress.update(budget.used)
        self.timings["decide_s"] = time.perf_counter() - t0
        return budget, decisions

    def replicating(self, n: int) -> Callable[[str, int], None]:
        """Before each replication run of count ``n`` (``steps`` long): the steps replicated so far."""
        def tell(note: str, steps: int) -> None:
            self.progress.update(self.replicated, f"{n} {self.unit}: {note}", line=True)
            self.replicated += steps
        return tell

    def best_count(self, recommended: Optional[int]) -> Optional[int]:
        """The count whose run the answer shows: the ``recommended`` one, else the largest simulated
        (None: none was); its run's channel table gets the sized channel's offered load."""
        simulated = sorted(self.runs)
        best = recommended if recommended is not None else (max(simulated) if simulated else None)
        if best is not None:  # channels.csv of the run at that count: the sized channel's offered load
            chans = self.runs[best].channels
            chans.loc[chans.channel == self.name, "offered_load"] = self.loads[best]["load"]
        return best

    def result(self, listed: List[int], top: int, notes: List[str], budget: stopping.Budget,
               decisions: Dict[int, Optional[stopping.Decision]]) -> CapacityResult:
        """The answer: the curve, the fewest count meeting the targets and what binds it, per
        corrector too, and the notes: what the search changed to run (``notes``: the counts that were not
        whole servers, a lowered ``capacity.max_steps``) and the counts the replications left undecided."""
        cap = self.cfg.capacity
        curve = curve_frame(self.rows, self.name, self.targets)
        recommended = fewest(curve, self.chosen)
        best = self.best_count(recommended)
        undecided = [undecided_text(n, recommended, d, chosen_row(self.rows[n], self.chosen), self.targets)
                     for n, d in sorted(decisions.items()) if d is not None and not d.decided]
        return CapacityResult(curve=curve, channel=self.name, unit=self.unit, key=self.key, recommended=recommended,
                              per_corrector=per_corrector(curve, self.targets),
                              targets={**self.targets, "corrector": self.chosen},
                              best=self.runs.get(best), best_count=best, timings=self.timings, loads=self.loads,
                              level=float(cap.confidence), max_load=float(cap.max_load), listed=listed, top=top,
                              searched=sorted(n for n in self.rows if n not in listed),
                              binding=binding(curve, self.chosen, recommended, self.targets),
                              notes=notes + undecided, replicated_steps=budget.used,
                              unreachable=list(self.unreachable))

    def autoscaled(self, scaled: RacsimConf, result: CapacityResult) -> Settled:
        """The autoscaled pool's run (spec ``scaled``), from its rule's min servers, and its what-if
        against the fixed pools evaluated (``result.autoscale``)."""
        a = scaled.pipeline.channels[self.name].autoscale
        low, high = autoscale_bounds(scaled, self.name)
        t0 = time.perf_counter()
        self.progress.start("autoscaled pool", 1, "run", note=f"running from {a.min} servers")
        auto = settle(with_count(scaled, self.key, low), self.name, self.tell("autoscaled pool"))
        self.progress.advance()
        self.timings["runs_s"] += time.perf_counter() - t0
        whole = self.loads[low]
        pool = {**whole, "load": whole["work_per_s"] / (a.max * whole["availability"]),  # at most a.max servers
                "load_sampled": whole["load_sampled"] * a.min / a.max}
        result.autoscale = autoscale_whatif(scaled, self.name, self.rows, curve_rows(scaled, self.name, 0, auto, pool),
                                            auto.res, self.targets)
        return auto

    def speed(self, scaled: Optional[RacsimConf], auto: Optional[Settled]) -> Dict[str, float]:
        """The lanes engine's speed in this run (:func:`benchmark`; ``capacity.benchmark``, the lanes
        engine, a count simulated): on the autoscaled pool's run where there is one (``auto``), else at
        the middle simulated count (also when a target out of reach skipped the autoscaled pool's run)."""
        simulated = sorted(self.runs)
        if not (self.cfg.capacity.benchmark and self.cfg.pipeline.engine == "lanes" and simulated):
            return {}
        self.progress.start("speed benchmark", 1, note="raw SimPy timed on one count")
        if scaled is None or auto is None:
            return benchmark(self.cfg, self.key, simulated[len(simulated) // 2], self.requests,
                             self.timings["pipeline_s"])
        return benchmark(scaled, self.key, autoscale_bounds(scaled, self.name)[0], auto.requests, auto.pipeline_s)
