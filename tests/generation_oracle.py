"""An independent event loop for asynchronous generation (issue 46, point 5): the test oracle.

Written from the model's spec alone (issue 46's contract, kept with the project's shared
notes), apart from racsim/generation/, and importing nothing of racsim. It is slow and plain on
purpose: a loop over instants, each instant processed in the spec's order (1. publishes, sync
ends, stall ends; 2. engine events in engine order; 3. gate-all entries in group order; 4. the
trainer; 5. pulls in engine order), with plain lists and one record per sequence, group and
engine.

:class:`Inputs` has the field names of ``racsim.generation.lane.LaneInputs`` and :func:`simulate`
returns a :class:`Trace` with the fields of ``LaneTrace`` (same names and meaning), plus
``queue_log`` (every group that entered the queue: index, entry, exit or None) for Little's law.

Where the spec leaves a choice, the reading taken here is one of the numbered list of
docs/generation_theory.md ("Where the spec leaves a choice"), marked "(choice N)" below; most
are pinned by a lane worked out by hand in tests/test_generation_oracle.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import numpy as np

DECODING, PREFILL, STALLED, IDLE = range(4)  # the columns of engine_time


@dataclass(frozen=True)
class Inputs:
    """One lane, everything drawn: the fields of racsim.generation.lane.LaneInputs."""

    steps: int
    groups_per_step: int
    group_size: int
    engines: int
    concurrency: int
    prompt: np.ndarray
    response: np.ndarray
    decode_seconds: Callable[[int, float], float]
    prefill_seconds: Callable[[int, float, float, float], float]
    trainer_seconds: np.ndarray
    sync_s: float
    admission: str = "none"
    eta: int = 0
    staleness: float = 0.0
    ahead: int = 0
    capacity: Optional[int] = None
    full: str = "block"
    max_lag: Optional[int] = None
    adoption: str = "inflight"
    gate: str = "fast"
    channels: Tuple[Tuple[Optional[int], np.ndarray, Optional[np.ndarray]], ...] = ()


@dataclass(frozen=True)
class Trace:
    """The fields of racsim.generation.lane.LaneTrace, plus ``queue_log``."""

    step_start: np.ndarray
    publish: np.ndarray
    sync_end: np.ndarray
    group: np.ndarray
    start_version: np.ndarray
    mean_version: np.ndarray
    last_version: np.ndarray
    taken: np.ndarray
    finished: np.ndarray
    queue_in: np.ndarray
    prompt: np.ndarray
    response: np.ndarray
    slow_submit: np.ndarray
    slow_start: np.ndarray
    slow_done: np.ndarray
    dropped: np.ndarray
    dropped_at: np.ndarray
    engine_time: np.ndarray
    queue_times: np.ndarray
    queue_length: np.ndarray
    wasted_tokens: int
    groups_admitted: int
    queue_log: list  # (group, entry, exit or None: taken by a step or dropped; None: still queued)


class Seq:
    """One sequence (sample i of group j) and its latest attempt."""

    def __init__(self, j, i, prompt, response):
        self.j, self.i, self.P, self.N = j, i, prompt, response
        self.reset()
        self.finished = None

    def reset(self):
        self.taken = None  # the instant it was taken
        self.version = None  # its start version
        self.k0 = None  # the engine's counter when it began decoding (None: not yet)
        self.segs = []  # (version, tokens produced before that version began), in order

    def key(self):
        return (self.j, self.i)

    def finish_counter(self):
        return self.k0 + self.N

    def tokens_at(self, k):
        """Tokens produced when the engine's counter reads k: token m at k0 + m."""
        if self.k0 is None:
            return 0
        return max(0, min(self.N, math.floor(k - self.k0)))

    def mean_and_last_version(self):
        total, last = 0, None
        for q, (v, before) in enumerate(self.segs):
            after = self.segs[q + 1][1] if q + 1 < len(self.segs) else self.N
            total += v * (after - before)
            if before < self.N:
                last = v
        return total / self.N, last


class Engine:
    def __init__(self, index):
        self.index = index
        self.version = 0
        self.k = 0.0  # the decode counter at t_last
        self.t_last = 0.0
        self.tau = None  # seconds a decode step, for the interval that began at t_last
        self.running = []  # sequences taken and not finished (prefilling or decoding), in take order
        self.prefill_end = None  # the instant the running prefill pass ends
        self.prefill_left = None  # seconds of a prefill suspended by a stall
        self.stall_until = None
        self.drain_stall = False  # the stall is drain adoption's own (not a publish's)
        self.draining = False  # drain: a publish seen, no pulling until the adoption
        self.time = [0.0, 0.0, 0.0, 0.0]

    def advancing(self):
        """Whether the counter moves now: decoding, neither in prefill nor stalled."""
        return (bool(self.running) and self.stall_until is None and self.prefill_end is None
                and self.prefill_left is None)

    def state(self):
        if self.stall_until is not None:
            return STALLED
        if self.prefill_end is not None or self.prefill_left is not None:
            return PREFILL
        return DECODING if self.running else IDLE


class Lane:
    def __init__(self, inp: Inputs):
        self.inp = inp
        self.G, self.S = inp.groups_per_step, inp.group_size
        self.B = self.G * self.S
        self.n_groups = len(inp.prompt)
        self.engines = [Engine(e) for e in range(inp.engines)]
        self.seqs = {}  # (j, i) -> Seq, once admitted
        self.fifo = []  # pending sequences, in admission order
        self.admitted = 0  # groups admitted so far (the next index)
        self.A = 0  # areal: samples admitted minus those of dropped groups
        self.W = 0  # verl: samples admitted since V_g last changed
        self.V = 0  # V_g: syncs ended
        self.published = 0  # the latest version published
        self.done = {}  # j -> sequences finished
        self.generated = {}  # j -> instant
        self.queue_in = {}  # j -> instant it entered the queue
        self.queue = []  # queued groups
        self.entry_due = {}  # gate all: j -> instant its last routed result is back
        self.queue_log = {}  # j -> [entry, exit]
        self.dropped, self.dropped_at = [], []
        self.length_rows = []  # (instant, queue length at its end)
        self.length_before = 0
        self.wasted = 0
        # the trainer
        self.step = 0  # the step it waits for or runs
        self.running_step = False
        self.publish_at = self.sync_at = None
        self.step_start, self.publish, self.sync_end, self.batches = [], [], [], []
        # slow channels (gate all): per channel, its servers' free instants and jobs submitted
        self.K = len(inp.channels) if inp.gate == "all" else 0
        self.servers = [None if inp.channels[c][0] is None else [0.0] * inp.channels[c][0] for c in range(self.K)]
        self.jobs = [0] * self.K
        self.slow = {}  # (c, j, i) -> (submit, start, done)

    # -- the decode counter ---------------------------------------------------------------------

    def next_completion(self, e):
        if not e.advancing():
            return math.inf
        kf = min(s.finish_counter() for s in e.running)
        return e.t_last + (kf - e.k) * e.tau

    def counter(self, e, now):
        """The counter at ``now`` (exactly the finish counter reached at a completion instant)."""
        if not e.advancing():
            return e.k
        kf = min(s.finish_counter() for s in e.running)
        if now == self.next_completion(e):
            return kf
        return min(e.k + (now - e.t_last) / e.tau, math.nextafter(kf, -math.inf))

    def freeze(self, e, now):
        """An event of engine e (its own events only, choice 1): the counter is brought to ``now``
        (call before its state changes)."""
        e.k = self.counter(e, now)
        e.t_last = now

    def retau(self, e):
        """A new decode interval: tau(b, X), X from the running sequences' prompts and whole tokens
        (choice 2) now (call after the change)."""
        if e.advancing():
            x = sum(s.P + s.tokens_at(e.k) for s in e.running)
            e.tau = float(self.inp.decode_seconds(len(e.running), float(x)))
            assert e.tau > 0, e.tau

    # -- the queue ------------------------------------------------------------------------------

    def oldest_first(self, groups):
        return sorted(groups, key=lambda j: (self.queue_in[j], j))

    def enter(self, j, now):
        self.queue.append(j)
        self.queue_in[j] = now
        self.queue_log[j] = [now, None]
        q = self.inp.capacity
        if self.inp.full == "drop_oldest" and q is not None and len(self.queue) > q:
            self.drop(self.oldest_first(self.queue)[0], now)

    def drop(self, j, now):
        self.queue.remove(j)
        self.queue_log[j][1] = now
        self.dropped.append(j)
        self.dropped_at.append(now)
        self.A -= self.S

    def v_min(self, j):
        return min(self.seqs[(j, i)].version for i in range(self.S))

    # -- groups ---------------------------------------------------------------------------------

    def may_admit(self):
        inp, j = self.inp, self.admitted
        if inp.capacity is not None and inp.full == "block" and len(self.queue) >= inp.capacity:
            return False
        if inp.admission == "none":
            return True
        if inp.admission in ("steps_ahead", "sync"):
            k = inp.ahead if inp.admission == "steps_ahead" else 0
            return j // self.G <= self.V + k
        if inp.admission == "areal":
            return self.A + self.S <= (inp.eta + self.V + 1) * self.B
        if inp.admission == "verl":
            return self.W + self.S <= math.floor((1 + inp.staleness) * self.B)
        raise AssertionError(inp.admission)

    def admit(self):
        j = self.admitted
        if j >= self.n_groups:
            raise ValueError("more groups needed")
        self.admitted += 1
        self.A += self.S
        self.W += self.S
        self.done[j] = 0
        for i in range(self.S):
            s = Seq(j, i, int(self.inp.prompt[j]), int(self.inp.response[j, i]))
            self.seqs[(j, i)] = s
            self.fifo.append(s)

    def group_generated(self, j, now):
        self.generated[j] = now
        if self.inp.gate == "fast":
            self.enter(j, now)
            return
        due = now
        for c in range(self.K):
            workers, service, routed = self.inp.channels[c]
            for i in range(self.S):
                if routed is not None and not routed[j, i]:  # no draw used (choice 7)
                    continue
                n = self.jobs[c]
                self.jobs[c] += 1
                if workers is None:
                    start = now
                else:
                    free = self.servers[c]
                    w = free.index(min(free))
                    start = max(now, free[w])
                    free[w] = start + float(service[n])
                end = start + float(service[n])
                self.slow[(c, j, i)] = (now, start, end)
                due = max(due, end)
        self.entry_due[j] = due

    def finished(self, s, now):
        s.finished = now
        self.done[s.j] += 1
        if self.done[s.j] == self.S:
            self.group_generated(s.j, now)

    # -- adoption -------------------------------------------------------------------------------

    def stall(self, e, now, until):
        self.freeze(e, now)
        if e.prefill_end is not None and e.prefill_end > now:  # one ending now ends now (choice 3)
            e.prefill_left = e.prefill_end - now
            e.prefill_end = None
        e.stall_until = until

    def start_drain_stall(self, e, now):
        if self.inp.sync_s == 0:  # choice 9
            e.version = self.published
            e.draining = False
            return
        e.stall_until = now + self.inp.sync_s
        e.drain_stall = True

    def end_stall(self, e, now):
        e.stall_until = None
        if e.drain_stall:
            e.drain_stall = False
            e.version = self.published
            e.draining = False
        if e.prefill_left is not None:
            e.prefill_end = now + e.prefill_left
            e.prefill_left = None
        e.t_last = now
        self.retau(e)

    def adopt_inflight(self, e, v):
        for s in e.running:  # tokens the counter has reached are the old version's (choice 4)
            s.segs.append((v, s.tokens_at(e.k)))
        e.version = v

    def abort(self, e, v):
        back = []
        for s in e.running:
            self.wasted += s.tokens_at(e.k)
            s.reset()
            back.append(s)
        e.running = []
        e.prefill_end = e.prefill_left = None
        self.fifo = sorted(back + self.fifo, key=Seq.key)  # choice 6
        e.version = v

    # -- one instant, in the spec's order ---------------------------------------------------------

    def step1(self, now):
        inp = self.inp
        if self.publish_at == now:
            self.publish_at = None
            self.published = self.step + 1
            for e in self.engines:
                if inp.adoption in ("inflight", "abort"):
                    self.stall(e, now, self.sync_at)
                    continue
                if e.draining or e.drain_stall:  # drain: already on its way to an adoption
                    continue
                e.draining = True
                if not e.running:
                    self.start_drain_stall(e, now)
        if self.sync_at == now:
            self.sync_at = None
            v = self.step + 1
            self.V, self.W = v, 0
            self.step, self.running_step = v, False
            for e in self.engines:
                if inp.adoption == "inflight":
                    self.adopt_inflight(e, v)
                elif inp.adoption == "abort":
                    self.abort(e, v)  # before this instant's completions (choice 5)
        for e in self.engines:
            if e.stall_until == now:
                self.end_stall(e, now)

    def step2(self, now):
        for e in self.engines:
            if e.prefill_end == now:
                e.prefill_end = None
                for s in e.running:
                    if s.k0 is None:
                        s.k0 = e.k
                e.t_last = now
                self.retau(e)
            k = self.counter(e, now)  # a stall begun this instant froze it here (choice 3)
            ended = [s for s in e.running if s.k0 is not None and s.finish_counter() <= k]
            if not ended:
                continue
            self.freeze(e, now)
            for s in sorted(ended, key=lambda s: (s.finish_counter(), s.key())):
                e.running.remove(s)
                self.finished(s, now)
            self.retau(e)
            if e.draining and not e.running and not e.drain_stall:
                self.start_drain_stall(e, now)

    def step3(self, now):
        for j in sorted(self.entry_due):
            if self.entry_due[j] == now:
                del self.entry_due[j]
                self.enter(j, now)

    def step4(self, now):
        """The trainer; True once the last step has started (the simulation stops there)."""
        if self.running_step:
            return False
        t, inp = self.step, self.inp
        if inp.max_lag is not None:
            for j in self.oldest_first(self.queue):  # choice 10
                if t - self.v_min(j) > inp.max_lag:
                    self.drop(j, now)
        if len(self.queue) < self.G:
            return False
        batch = self.oldest_first(self.queue)[: self.G]
        for j in batch:
            self.queue.remove(j)
            self.queue_log[j][1] = now
        self.batches.append(batch)
        self.step_start.append(now)
        self.publish.append(now + float(inp.trainer_seconds[t]))
        self.sync_end.append(self.publish[-1] + inp.sync_s)
        if t == inp.steps - 1:  # the run stops here, before the pulls (choice 8)
            return True
        self.running_step = True
        self.publish_at, self.sync_at = self.publish[-1], self.sync_end[-1]
        return False

    def step5(self, now):
        inp = self.inp
        for e in self.engines:
            if e.stall_until is not None or e.prefill_end is not None or e.draining:
                continue
            taken = []
            while len(e.running) + len(taken) < inp.concurrency:
                if not self.fifo:
                    if not self.may_admit():
                        break
                    self.admit()
                taken.append(self.fifo.pop(0))
            if not taken:
                continue
            self.freeze(e, now)
            for s in taken:
                s.taken, s.version, s.segs = now, e.version, [(e.version, 0)]
                e.running.append(s)
            prompts = [s.P for s in taken]
            e.prefill_end = now + float(inp.prefill_seconds(len(taken), float(sum(prompts)),
                                                            float(sum(p * p for p in prompts)), float(max(prompts))))

    def next_instant(self, now):
        times = [self.publish_at, self.sync_at] + list(self.entry_due.values())
        for e in self.engines:
            times += [e.stall_until, e.prefill_end, self.next_completion(e)]
        later = min(t for t in times if t is not None)
        if later == math.inf:
            raise RuntimeError(f"the lane stops before step {self.step} can start: nothing left to happen")
        assert later >= now, (later, now)
        return later

    def account(self, start, end):
        """[start, end) in each engine's state then (a stall counts as stalled, choice 12)."""
        for e in self.engines:
            e.time[e.state()] += end - start

    def note_length(self, now):
        """One row per instant whose closing queue length differs from the one before (choice 11)."""
        if len(self.queue) != self.length_before:
            self.length_rows.append((now, len(self.queue)))
            self.length_before = len(self.queue)

    def run(self) -> Trace:
        now = before = 0.0
        while True:
            self.account(before, now)
            before = now
            self.step1(now)
            self.step2(now)
            self.step3(now)
            last = self.step4(now)
            if self.length_rows and self.length_rows[-1][0] == now:  # a second pass at one instant
                self.length_rows.pop()
                self.length_before = self.length_rows[-1][1] if self.length_rows else 0
            self.note_length(now)
            if last:
                return self.trace()
            self.step5(now)
            now = self.next_instant(now)

    # -- what is recorded -------------------------------------------------------------------------

    def trace(self) -> Trace:
        T, B, S = self.inp.steps, self.B, self.S
        per = {name: np.zeros((T, B)) for name in ("mean_version", "taken", "finished", "queue_in")}
        ints = {name: np.zeros((T, B), dtype=np.int64)
                for name in ("group", "start_version", "last_version", "prompt", "response")}
        slow = [np.full((self.K, T, B), math.inf) for _ in range(3)]
        for t, batch in enumerate(self.batches):
            for g, j in enumerate(batch):
                for i in range(S):
                    s, b = self.seqs[(j, i)], g * S + i
                    mean, last = s.mean_and_last_version()
                    ints["group"][t, b], ints["start_version"][t, b], ints["last_version"][t, b] = j, s.version, last
                    ints["prompt"][t, b], ints["response"][t, b] = s.P, s.N
                    per["mean_version"][t, b], per["taken"][t, b] = mean, s.taken
                    per["finished"][t, b], per["queue_in"][t, b] = s.finished, self.queue_in[j]
                    for c in range(self.K):
                        for a in range(3):
                            slow[a][c, t, b] = self.slow.get((c, j, i), (math.inf,) * 3)[a]
        rows = self.length_rows
        return Trace(
            step_start=np.array(self.step_start), publish=np.array(self.publish), sync_end=np.array(self.sync_end),
            **ints, **per, slow_submit=slow[0], slow_start=slow[1], slow_done=slow[2],
            dropped=np.array(self.dropped, dtype=np.int64), dropped_at=np.array(self.dropped_at, dtype=np.float64),
            engine_time=np.array([e.time for e in self.engines]),
            queue_times=np.array([r[0] for r in rows], dtype=np.float64),
            queue_length=np.array([r[1] for r in rows], dtype=np.int64),
            wasted_tokens=self.wasted, groups_admitted=self.admitted,
            queue_log=[(j, a, b) for j, (a, b) in self.queue_log.items()])


def simulate(inputs) -> Trace:
    """One lane through the oracle (``inputs``: an :class:`Inputs`, or anything with its fields)."""
    return Lane(inputs).run()
