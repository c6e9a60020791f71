"""One lane (trial) of asynchronous generation: its inputs (:class:`LaneInputs`, everything drawn already),
what it records (:class:`LaneTrace`), and the fast engine (:func:`simulate_lane`): a heapq event loop over
the model of racsim/generation/state.py, one event per engine between its prefill ends, completions and
weight updates (never one per token). The SimPy engine of record (racsim/generation/simpy_lane.py) drives the
same model; a test holds the two equal to the bit.

The simulation stops at the instant the last step starts (S_{steps-1}): ``engine_time`` covers [0, S_{steps-1}];
the last step's publish and sync end are its start plus its trainer seconds, plus ``sync_s``.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace
from typing import Callable, Optional, Tuple

import numpy as np

from racsim.generation.state import (ADMISSIONS, ADOPTIONS, ENGINE, ENTRY, GATES, INF, QUEUE_FULL, LaneState,
                                     Starved)

__all__ = ["LaneInputs", "LaneTrace", "Starved", "simulate_lane", "check_inputs", "trace_of", "FifoChannel"]


@dataclass(frozen=True)
class LaneInputs:
    """One lane; everything drawn already (units: seconds, tokens, versions)."""

    steps: int  # trainer steps to simulate
    groups_per_step: int  # G
    group_size: int  # S
    engines: int  # E
    concurrency: int  # C
    prompt: np.ndarray  # (n_groups,) int64 >= 1, by admission index j
    response: np.ndarray  # (n_groups, S) int64 >= 1
    decode_seconds: Callable[[int, float], float]  # tau(b, X)
    prefill_seconds: Callable[[int, float, float, float], float]  # pi(k, sum P, sum P^2, max P)
    trainer_seconds: np.ndarray  # (steps,) fast_score + submit + update of step t
    sync_s: float
    admission: str = "none"  # none | areal | verl | steps_ahead | sync
    eta: int = 0  # areal
    staleness: float = 0.0  # verl
    ahead: int = 0  # steps_ahead k
    capacity: Optional[int] = None  # Q groups
    full: str = "block"  # block | drop_oldest
    max_lag: Optional[int] = None
    adoption: str = "inflight"  # inflight | abort | drain
    gate: str = "fast"  # fast | all
    # gate all only: per slow channel, (workers or None, service seconds (n_jobs,) by submission order on
    # that channel, routed (n_groups, S) bool or None = every sample)
    channels: Tuple[Tuple[Optional[int], np.ndarray, Optional[np.ndarray]], ...] = ()


@dataclass(frozen=True)
class LaneTrace:
    """What one lane recorded: per step, per trained sample (steps, B) at position g * S + i of its batch, and
    per lane. Gate all: the slow channels' submit, service start and completion (K, steps, B), inf where not
    routed (K = 0 with gate fast)."""

    step_start: np.ndarray  # (steps,) S_t
    publish: np.ndarray  # (steps,) P_t
    sync_end: np.ndarray  # (steps,) E_t
    group: np.ndarray  # (steps, B) admission index j of each trained sample
    start_version: np.ndarray  # (steps, B) int
    mean_version: np.ndarray  # (steps, B) float: token-weighted
    last_version: np.ndarray  # (steps, B) int: the version of its last token
    taken: np.ndarray  # (steps, B) the instant the sequence was taken (its final, successful start)
    finished: np.ndarray  # (steps, B)
    queue_in: np.ndarray  # (steps, B) its group's queue entry
    prompt: np.ndarray  # (steps, B)
    response: np.ndarray  # (steps, B)
    slow_submit: np.ndarray  # (K, steps, B)
    slow_start: np.ndarray
    slow_done: np.ndarray
    dropped: np.ndarray  # (n_dropped,) admission indices of dropped groups, in drop order
    dropped_at: np.ndarray  # (n_dropped,) instants
    engine_time: np.ndarray  # (E, 4) seconds decoding, prefill, stalled, idle over [0, S_{steps-1}]
    queue_times: np.ndarray  # every instant the queue length changed, and
    queue_length: np.ndarray  # the length from then on
    wasted_tokens: int  # tokens decoded by aborted sequences
    groups_admitted: int
    generated: Optional[np.ndarray] = None  # (groups_admitted,) the instant each was generated (inf: not yet)
    entered: Optional[np.ndarray] = None  # (groups_admitted,) the instant each entered the queue (inf: not yet)
    events: int = 0  # events of the model the fast engine delivered, a folded prefill's end one (its speed's unit)


def check_inputs(x: LaneInputs) -> None:
    """ValueError naming what is wrong with ``x`` (the config's validation names the keys; this guards the
    engines' own callers)."""
    def need(ok: bool, what: str) -> None:
        if not ok:
            raise ValueError(what)

    for name in ("steps", "groups_per_step", "group_size", "engines", "concurrency"):
        need(int(getattr(x, name)) >= 1, f"{name} >= 1")
    S = int(x.group_size)
    need(x.prompt.ndim == 1 and x.response.shape == (x.prompt.shape[0], S), "prompt (n_groups,), response (n_groups, S)")
    need(bool((x.prompt >= 1).all() and (x.response >= 1).all()), "prompt and response lengths >= 1")
    need(np.shape(x.trainer_seconds) == (int(x.steps),) and bool((np.asarray(x.trainer_seconds) > 0).all()),
         "trainer_seconds: (steps,) seconds > 0")
    need(float(x.sync_s) >= 0, "sync_s >= 0")
    need(x.admission in ADMISSIONS, f"admission one of {ADMISSIONS}")
    need(x.adoption in ADOPTIONS, f"adoption one of {ADOPTIONS}")
    need(x.full in QUEUE_FULL, f"full one of {QUEUE_FULL}")
    need(x.gate in GATES, f"gate one of {GATES}")
    need(x.capacity is None or int(x.capacity) >= int(x.groups_per_step), "capacity None or >= groups_per_step")
    need(x.max_lag is None or int(x.max_lag) >= 0, "max_lag None or >= 0")
    need(int(x.eta) >= 0 and float(x.staleness) >= 0 and int(x.ahead) >= 0, "eta, staleness, ahead >= 0")
    need(x.gate == "all" or not x.channels, "channels with gate all only")
    for workers, service, routed in x.channels:
        need(workers is None or int(workers) >= 1, "a channel's workers None or >= 1")
        need(service.ndim == 1 and bool((service >= 0).all()), "a channel's service seconds (n_jobs,) >= 0")
        need(routed is None or routed.shape == x.response.shape, "a channel's routed (n_groups, S) or None")


class FifoChannel:
    """A gate-all slow channel in the fast engine: FIFO on ``workers`` servers (None: no queue); its n-th job
    takes the n-th service draw and the earliest-free worker (lowest index on ties), so each job's service
    start and completion are known when it is submitted."""

    def __init__(self, workers: Optional[int], service: np.ndarray, routed: Optional[np.ndarray]):
        self.free = None if workers is None else [(0.0, w) for w in range(int(workers))]  # a heap: (free at, worker)
        self.service, self.routed, self.n = service.tolist(), routed, 0

    def submit(self, j: int, i: int, now: float) -> Optional[Tuple[float, float]]:
        """(service start, completion) of sample i of group j sent at ``now``; None if not routed."""
        if self.routed is not None and not self.routed[j, i]:
            return None
        if self.n >= len(self.service):
            raise ValueError("more groups needed")
        s = self.service[self.n]
        self.n += 1
        if self.free is None:
            return now, now + s
        free, w = self.free[0]
        start = now if now > free else free
        heapq.heapreplace(self.free, (start + s, w))
        return start, start + s


def slow_records(x: LaneInputs) -> np.ndarray:
    """(3, K, n_groups * S) submit, service start, completion per channel and sequence, inf until sent."""
    return np.full((3, len(x.channels), x.prompt.shape[0] * int(x.group_size)), INF)


def trace_of(state: LaneState, slow: np.ndarray) -> LaneTrace:
    """The :class:`LaneTrace` of a lane run to its end (``slow``: :func:`slow_records`, filled)."""
    a = state.trace_arrays()
    x = state.x
    last = state.steps - 1
    a["publish"][last] = a["step_start"][last] + float(x.trainer_seconds[last])
    a["sync_end"][last] = a["publish"][last] + float(x.sync_s)
    S = int(x.group_size)
    sid = a["group"] * S + np.arange(a["group"].shape[1]) % S
    sub, start, done = (slow[k][:, sid] for k in range(3))
    return LaneTrace(slow_submit=sub, slow_start=start, slow_done=done, **a)


def simulate_lane(inputs: LaneInputs) -> LaneTrace:
    """Run one lane to the instant its last step starts (the fast engine: a heapq event loop). Raises
    ValueError("more groups needed") when ``inputs`` holds too few groups, :class:`Starved` when the trainer
    can never get a batch.

    An engine whose next event moved is scheduled at once if that event is due in the instant being
    delivered, else once its round is over (most often it moves again in the round's pulls); its token voids
    the entry it had."""
    check_inputs(inputs)
    heap: list = []
    push, pop = heapq.heappush, heapq.heappop
    token = [0] * int(inputs.engines)
    later: dict = {}  # engine -> its next event, to schedule once the round is over
    channels = [FifoChannel(*c) for c in inputs.channels]
    slow = slow_records(inputs)
    S = int(inputs.group_size)

    class Hooks:
        @staticmethod
        def at(time: float, cls: int, idx: int) -> None:
            push(heap, (time, cls, idx, -1))

        @staticmethod
        def engine_changed(e: int, now: float) -> None:
            token[e] += 1
            t = engine_next(e)
            if t <= now:
                push(heap, (t, ENGINE, e, token[e]))
                later.pop(e, None)
            else:
                later[e] = t

        @staticmethod
        def generated(j: int, now: float) -> None:
            entry = now
            for i in range(S):
                for k, ch in enumerate(channels):
                    got = ch.submit(j, i, now)
                    if got is not None:
                        slow[:, k, j * S + i] = (now, *got)
                        entry = max(entry, got[1])
            push(heap, (entry, ENTRY, j, -1))

    def schedule_later() -> None:
        for e, t in later.items():
            if t < INF:
                push(heap, (t, ENGINE, e, token[e]))
        later.clear()

    state = LaneState(inputs, Hooks)
    fire, end_of_round, engine_event = state.fire, state.end_of_round, state.engine_event
    engine_next = state.engine_next
    end_of_round(0.0)
    schedule_later()
    events = 0
    while not state.done:
        if not heap:
            raise state.starved()
        now = heap[0][0]
        while heap and heap[0][0] == now:
            _, cls, idx, tok = pop(heap)
            if cls != ENGINE:
                fire(now, cls, idx)
            elif tok == token[idx]:
                engine_event(now, idx)
            else:
                continue
            events += 1
        end_of_round(now)
        if later:
            schedule_later()
    return replace(trace_of(state, slow), events=events + state.resumed)
