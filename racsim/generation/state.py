"""The model of one lane of asynchronous generation as a state machine (docs/generation.md; the contract
both engines and the tests' oracle follow is the spec of issue 46). Two drivers advance it: the fast event
loop (racsim/generation/lane.py, heapq) and the SimPy engine of record (racsim/generation/simpy_lane.py);
they differ only in how they keep time and the slow channels' queues, so a test holds them equal to the bit.

A driver delivers the model's events in the order of one instant: (time, class, index), classes
:data:`PUBLISH`, :data:`SYNC_END`, :data:`STALL_END` (a drained engine's own weight sync), :data:`ENGINE`
(prefill ends, then completions, engine by engine) and :data:`ENTRY` (gate all: a group enters the queue),
then :meth:`LaneState.end_of_round` (the trainer, then the engines' pulls). Events that a round schedules for
the same instant make another round of it. The model tells its driver what to schedule through ``hooks``:
``at(time, class, index)`` for a one-off event, ``engine_changed(e, now)`` when engine e's next event
(:meth:`LaneState.engine_next`) moved (its state final for the event or pull delivered at ``now``), and
``generated(j, now)`` (gate all) when group j's last sample finished, to be sent to the slow channels; the
driver then delivers ``ENTRY`` j when its results are back.

Two shortcuts save work without changing a result (tests hold them to the spec's own reading): a prefill
pass that fills its engine is folded (:meth:`LaneState._fold`: its end taken at once, so the engine's next
event is its next completion, and an engine-bound lane has one event a sequence, not two), and the versions
of a sequence's tokens are read off its engine's switches once, at the end, for every trained sequence
together (:func:`version_sums`), not at each completion.

Choices where the spec leaves room (they are the same in both engines):

* Tokens decoded by a sequence at counter k: floor(k - k0) in exact arithmetic (k and k0 are floats; the
  floor is taken of their exact difference, so that summing it over an engine's running sequences is a
  bisection over their counters' fractional parts, not a loop). A token produced exactly when a weight
  switch freezes the counter carries the old version.
* The counter reaches a finish counter f at the instant t_a + (f - k_a) * tau computed from the interval's
  anchor (t_a, k_a); every sequence whose instant is due completes in that event (by f, then sequence) and
  the counter is set to the last such f. An event of the engine at another instant reads the counter as
  k_a + (t - t_a) / tau, never past the next finish counter.
* An engine event due at the instant its engine stalls (a completion or a prefill end at P_t) still
  happens then, in step 2: the work was done by then. Under abort with ``sync_s = 0`` the sequences are
  aborted first (step 1), as the spec's order says.
* Drain: a publish while an engine is in its own weight sync leaves it there; at the sync's end the engine
  adopts the latest version published (the spec's words), so that publish needs no second sync. A drain
  sync of 0 s adopts at once.
* The queue-length timeline keeps one point per instant (the length at its end) where the length moved.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right, insort
from heapq import heapify, heappop, heappush
from collections import deque
from typing import Any, List, Optional

import numpy as np

INF = math.inf
PUBLISH, SYNC_END, STALL_END, ENGINE, ENTRY = range(5)  # event classes, in their order within one instant
DECODING, PREFILL, STALLED, IDLE = range(4)  # an engine's time split (LaneTrace.engine_time's columns)
ADMISSIONS = ("none", "areal", "verl", "steps_ahead", "sync")
ADOPTIONS = ("inflight", "abort", "drain")
QUEUE_FULL = ("block", "drop_oldest")
GATES = ("fast", "all")


class Starved(ValueError):
    """The trainer waits for groups that can never come: no event is left before the last step starts (a
    guard: the lanes' checks keep the queue at least a step, and drops take only groups admitted ahead)."""


def floor_diff(x: float, a: float) -> int:
    """floor(x - a) of two floats in exact arithmetic: the tokens a sequence that began at counter ``a`` has
    decoded when the counter is at ``x`` (x - a rounded in floats can land on the wrong side of an integer)."""
    fx, fa = math.floor(x), math.floor(a)
    return fx - fa - (1 if x - fx < a - fa else 0)


def version_sums(switch_k: List[float], switch_v: List[int], k0: np.ndarray, n: np.ndarray) -> tuple:
    """(token-weighted mean version, last version) of each of several sequences that ran on one engine (the
    spec's reading: token m < n is produced when the counter reaches k0 + m exactly, the last at k0 + n, and a
    token produced when the counter stands at a switch carries the version before it), for arrays: ``k0`` (float) and ``n`` (int) the sequences' start counters and
    lengths, their finish counters k0 + n.

    A switch i at counter x_i, from version u to u + d_i, inside a sequence adds d_i x (n - c_i), c_i its
    tokens by then, floor_diff(x_i, k0) = floor(x_i) - floor(k0) - [frac(x_i) < frac(k0)]; summed over the
    switches inside, the first two terms are differences of running sums over the engine's switches, and only
    the last is counted switch by switch. Integers throughout, so the sums are exact."""
    sk = np.asarray(switch_k, dtype=np.float64)
    before = np.concatenate([[0], np.asarray(switch_v, dtype=np.int64)])  # the version before switch i: before[i]
    d = np.diff(before)
    whole = np.floor(sk)
    frac = sk - whole
    tally = np.concatenate([[0], np.cumsum(d * whole.astype(np.int64))])  # sum of d_i floor(x_i) over i < j
    first = np.searchsorted(sk, k0, side="right")  # the switches strictly after a sequence's start ...
    end = np.searchsorted(sk, k0 + n, side="left")  # ... and before its last token, [first, end)
    fa = np.floor(k0)
    inside = end - first
    ends = np.cumsum(inside)
    idx = np.arange(ends[-1] if len(ends) else 0) - np.repeat(ends - inside - first, inside)
    early = np.concatenate([[0], np.cumsum(np.where(frac[idx] < np.repeat(k0 - fa, inside), d[idx], 0))])
    rose = before[end] - before[first]
    total = (n * before[first] + (n + fa.astype(np.int64)) * rose - (tally[end] - tally[first])
             + early[ends] - early[ends - inside])
    return total / n, before[end]


class Engine:
    """One rollout engine (a replica): its version, decode counter and the sequences it runs."""

    __slots__ = ("index", "version", "k", "t_a", "tau", "heap", "fracs", "sum_a", "sum_p", "b", "prefill",
                 "prefill_end", "prefill_left", "folded", "resume", "stalled", "pending", "switch_k", "switch_v",
                 "state", "since", "time")

    def __init__(self, index: int):
        self.index = index
        self.version = 0
        self.k = 0.0  # the decode counter at the anchor t_a (decode steps done)
        self.t_a = 0.0
        self.tau = INF  # seconds per decode step over the interval from t_a
        self.heap: list = []  # running sequences: (finish counter, sequence)
        self.fracs: list = []  # sorted fractional parts of the running sequences' start counters
        self.sum_a = 0  # sum of their start counters' integer parts
        self.sum_p = 0  # sum of their prompts
        self.b = 0  # running sequences (decoding, prefill excluded)
        self.prefill: Optional[list] = None  # sequences in the prefill pass
        self.prefill_end = INF
        self.prefill_left = 0.0  # a prefill's seconds left while a weight sync suspends it
        self.folded: Optional[list] = None  # a folded prefill pass's sequences (LaneState._fold), running from:
        self.resume = INF  # the instant that pass ends
        self.stalled = False
        self.pending = False  # drain: a version published since the engine last adopted; it pulls no work
        self.switch_k: list = []  # counters at which the engine adopted a version, and the versions
        self.switch_v: list = []
        self.state = IDLE
        self.since = 0.0
        self.time = [0.0, 0.0, 0.0, 0.0]  # seconds decoding, prefill, stalled, idle


class LaneState:
    """One lane of the model: the engines, the pending FIFO, admission, the queue, the trainer and what is
    recorded. ``inputs``: a :class:`~racsim.generation.lane.LaneInputs` (checked by the caller)."""

    def __init__(self, inputs: Any, hooks: Any):
        self.x, self.hooks = inputs, hooks
        self.engine_changed = hooks.engine_changed
        x = inputs
        self.G, self.S, self.C = int(x.groups_per_step), int(x.group_size), int(x.concurrency)
        self.B = self.G * self.S
        self.n_groups = int(x.prompt.shape[0])
        self.P = x.prompt.tolist()
        self.N = x.response.reshape(-1).tolist()  # by sequence id j * S + i
        self.decode, self.prefill_s = x.decode_seconds, x.prefill_seconds
        self.one_prefill: dict = {}  # prompt length -> a prefill pass of that one prompt
        self.rule, self.gate_fast = x.admission, x.gate == "fast"
        self.eta, self.ahead = int(x.eta), 0 if x.admission == "sync" else int(x.ahead)
        self.verl_cap = math.floor((1.0 + float(x.staleness)) * self.B)
        self.block = None if x.full != "block" or x.capacity is None else int(x.capacity)
        self.max_lag = None if x.max_lag is None else int(x.max_lag)
        self.engines = [Engine(e) for e in range(int(x.engines))]
        n_seq = self.n_groups * self.S
        self.fifo: deque = deque()
        self.next_group = 0  # admission index of the next group
        self.a_samples = 0  # areal: samples admitted minus those of dropped groups
        self.w_samples = 0  # verl: samples admitted since the global version last changed
        self.v_global = 0  # syncs ended
        self.published = 0  # versions published
        # per sequence
        # per sequence (typed arrays: numpy reads them in place at the end)
        self.k0 = array("d", [0.0]) * n_seq
        self.taken = array("d", [0.0]) * n_seq
        self.start_v = array("q", [0]) * n_seq
        self.finished = array("d", [0.0]) * n_seq
        self.engine_of = array("q", [0]) * n_seq  # the engine that took it (last)
        # per group
        self.left = [self.S] * self.n_groups
        self.generated = [INF] * self.n_groups
        self.queue_in = [INF] * self.n_groups
        self.vmin = [0] * self.n_groups
        self.queue: list = []  # (entry instant, group), oldest first
        self.q_times: List[float] = []
        self.q_lengths: List[int] = []
        self.dropped: List[int] = []
        self.dropped_at: List[float] = []
        self.wasted = 0
        # the trainer
        steps = int(x.steps)
        self.steps = steps
        self.step = 0  # the step it waits for, or runs
        self.ready = True  # its previous weight sync has ended (E_{t-1} <= now)
        self.look = True  # max_lag drops and intake are due (the sync just ended, or a group entered)
        self.step_start = [INF] * steps
        self.publish_at = [INF] * steps
        self.sync_end = [INF] * steps
        self.batches: List[List[int]] = []  # groups trained by each step, in batch order
        self.done = False
        self.hungry: set = set()  # engines that could pull but found no work allowed
        self.touched = set(range(len(self.engines)))  # engines whose state changed this round (all, at 0)
        self.resumed = 0  # folded prefill passes that ended (:meth:`_fold`): each an event of the model

    # ---- the engines' clock -------------------------------------------------------------------------------

    def engine_next(self, e: int) -> float:
        """The instant of engine e's next :data:`ENGINE` event (inf: none): its prefill's end, its next
        completion, or, right when it stalled, a completion or prefill end that was due then."""
        g = self.engines[e]
        if g.stalled:
            if g.prefill is not None:
                return g.t_a if g.prefill_left == 0.0 else INF
            return g.t_a if g.b and g.heap[0][0] <= g.k else INF
        if g.prefill is not None:
            return g.prefill_end
        if g.b:
            return g.t_a + (g.heap[0][0] - g.k) * g.tau
        return INF

    def _counter(self, g: Engine, now: float) -> float:
        """Engine g's decode counter at ``now`` while it decodes: never past its next finish counter, and
        that counter where that completion is due (:meth:`engine_next`)."""
        f = g.heap[0][0]
        if g.t_a + (f - g.k) * g.tau <= now:
            return f
        return min(g.k + (now - g.t_a) / g.tau, f)

    def _retime(self, g: Engine) -> None:
        """Seconds per decode step from now on: b running sequences over their KV context X (prompts plus
        tokens decoded, held for the interval: docs/generation.md)."""
        b = g.b
        if b:
            k = g.k
            kf = math.floor(k)
            above = b - bisect_right(g.fracs, k - kf)  # sequences whose start counter's fraction is above k's
            context = g.sum_p + b * kf - g.sum_a - above
            tau = g.tau = self.decode(b, float(context))
            if not tau > 0:
                raise ValueError(f"decode_seconds({b}, {context}) = {tau}: a decode step takes > 0 s")

    def _set_state(self, g: Engine, now: float, s: Optional[int] = None) -> None:
        """Engine g is in state ``s`` (by default, what its flags say) from ``now``: its time split."""
        if s is None:
            s = STALLED if g.stalled else PREFILL if g.prefill is not None else DECODING if g.b else IDLE
        if s != g.state:
            g.time[g.state] += now - g.since
            g.state, g.since = s, now

    def _freeze(self, g: Engine, now: float) -> None:
        """Decoding stops at ``now`` (a prefill or a stall begins): the counter is read and held."""
        if g.b and g.prefill is None and not g.stalled:
            g.k = self._counter(g, now)
        g.t_a = now

    def _adopt(self, g: Engine, version: int) -> None:
        g.version = version
        g.switch_k.append(g.k)
        g.switch_v.append(version)

    # ---- events (step 1: publishes, sync ends, stall ends) -----------------------------------------------

    def fire(self, now: float, cls: int, idx: int) -> None:
        """Deliver one event of class ``cls`` (its index: a step, an engine or a group)."""
        if cls == ENGINE:
            self.engine_event(now, idx)
        elif cls == ENTRY:
            self.enter(now, idx)
        elif cls == PUBLISH:
            self.publish(now, idx)
        elif cls == SYNC_END:
            self.end_sync(now, idx)
        else:
            self.end_drain(now, idx)

    def publish(self, now: float, t: int) -> None:
        """Step t publishes version t + 1 at P_t: every engine stalls (inflight, abort) or stops pulling
        (drain), and the trainer's weight sync ends sync_s later."""
        self.published = t + 1
        self.publish_at[t] = now
        end = now + float(self.x.sync_s)
        self.sync_end[t] = end
        self.hooks.at(end, SYNC_END, t)
        drain = self.x.adoption == "drain"
        for g in self.engines:
            if drain:
                g.pending = True
                self.hungry.discard(g.index)
                if not g.stalled and g.prefill is None and not g.b:
                    self._drain_stall(g, now)
                continue
            if g.folded is not None:
                if now <= g.resume:
                    self._unfold(g)
                else:
                    self._resume(g)
            if g.prefill is not None:
                g.prefill_left = g.prefill_end - now
            self._freeze(g, now)
            g.stalled = True
            self.hungry.discard(g.index)
            self._set_state(g, now)
            self.engine_changed(g.index, now)

    def end_sync(self, now: float, t: int) -> None:
        """E_t: the global version becomes t + 1; with inflight or abort every engine adopts it (abort: its
        running and prefilling sequences go back to the front of the FIFO, their tokens wasted) and resumes."""
        self.v_global = t + 1
        self.w_samples = 0
        self.ready, self.look = True, True
        if self.x.adoption == "drain":
            return
        aborted: list = []
        for g in self.engines:
            if self.x.adoption == "abort":
                for f, sid in g.heap:
                    self.wasted += min(max(floor_diff(g.k, self.k0[sid]), 0), self.N[sid])
                    aborted.append(sid)
                if g.prefill is not None:
                    aborted += g.prefill
                g.heap, g.fracs, g.sum_a, g.sum_p, g.b, g.prefill = [], [], 0, 0, 0, None
            self._adopt(g, t + 1)
            g.stalled = False
            if g.prefill is not None:
                g.prefill_end = now + g.prefill_left
            g.t_a = now
            self._retime(g)
            self._set_state(g, now)
            self.touched.add(g.index)
            self.engine_changed(g.index, now)
        if aborted:
            aborted.sort()
            self.fifo.extendleft(reversed(aborted))

    def _drain_stall(self, g: Engine, now: float) -> None:
        """Drain: engine g, empty, syncs its weights for sync_s, then adopts the latest version."""
        if float(self.x.sync_s) == 0.0:
            self._adopt(g, self.published)
            g.pending = False
            self.touched.add(g.index)
            return
        g.stalled = True
        g.t_a = now
        self._set_state(g, now)
        self.hooks.at(now + float(self.x.sync_s), STALL_END, g.index)

    def end_drain(self, now: float, e: int) -> None:
        g = self.engines[e]
        self._adopt(g, self.published)
        g.pending = False
        g.stalled = False
        self._set_state(g, now)
        self.touched.add(e)

    # ---- step 2: prefill ends and completions, engine by engine ------------------------------------------

    def engine_event(self, now: float, e: int) -> None:
        """Engine e's prefill end, then its completions due by ``now``: every running sequence whose instant is
        due, by finish counter then sequence (step 2)."""
        g = self.engines[e]
        if g.folded is not None:
            self._resume(g)
        elif g.prefill is not None:
            if not (g.prefill_left == 0.0 if g.stalled else g.prefill_end <= now):
                return
            self._end_prefill(g, now)
        heap = g.heap
        if heap:
            stalled, k, t_a, tau = g.stalled, g.k, g.t_a, g.tau
            f = heap[0][0]
            if (f <= k) if stalled else (t_a + (f - k) * tau <= now):
                fracs, k0s, P, S, finished, left = g.fracs, self.k0, self.P, self.S, self.finished, self.left
                sum_a, sum_p, b = g.sum_a, g.sum_p, g.b
                while True:
                    sid = heappop(heap)[1]
                    last = f
                    k0 = k0s[sid]
                    a = math.floor(k0)
                    del fracs[bisect_left(fracs, k0 - a)]
                    sum_a -= a
                    j = sid // S
                    sum_p -= P[j]
                    b -= 1
                    finished[sid] = now
                    left[j] -= 1
                    if not left[j]:
                        self._generated(j, now)
                    if not heap:
                        break
                    f = heap[0][0]
                    if (f > k) if stalled else (t_a + (f - k) * tau > now):
                        break
                g.sum_a, g.sum_p, g.b = sum_a, sum_p, b
                if not stalled:
                    g.k, g.t_a = last, now
                    self._retime(g)
        if g.pending and not g.b and g.prefill is None and not g.stalled:
            self._drain_stall(g, now)
        self._set_state(g, now)
        self.touched.add(e)
        self.engine_changed(e, now)

    def _end_prefill(self, g: Engine, now: float) -> None:
        """Engine g's prefill pass ends at ``now``: its sequences decode from the counter k (their k0)."""
        k = g.k
        a = math.floor(k)
        y = k - a
        seqs, heap, k0s, N, P, S = g.prefill, g.heap, self.k0, self.N, self.P, self.S
        lo = bisect_left(g.fracs, y)
        g.fracs[lo:lo] = [y] * len(seqs)
        sum_p = g.sum_p
        for sid in seqs:
            k0s[sid] = k
            heappush(heap, (k + N[sid], sid))
            sum_p += P[sid // S]
        g.sum_p = sum_p
        g.sum_a += a * len(seqs)
        g.b += len(seqs)
        g.prefill = None
        if not g.stalled:
            g.t_a = now
            self._retime(g)

    def _fold(self, g: Engine, now: float) -> None:
        """Engine g, full, starts a prefill pass at ``now``: until the pass ends nothing but a publish can reach
        it (it takes no work, decodes nothing), so the pass's end is taken at once and its sequences decode
        from then (``resume``): the engine's next event is its next completion, one event fewer a sequence. A
        publish before or at ``resume`` unfolds it (:meth:`_unfold`); whatever reaches it later finds the pass
        over and its time split at ``resume`` (:meth:`_resume`)."""
        self._set_state(g, now, PREFILL)
        g.folded, g.resume = g.prefill, g.prefill_end
        self._end_prefill(g, g.prefill_end)

    def _unfold(self, g: Engine) -> None:
        """A folded prefill pass back in the spec's state: its sequences in the pass, out of the running set."""
        seqs, g.prefill, g.prefill_end = g.folded, g.folded, g.resume
        g.folded, g.resume = None, INF
        out = set(seqs)
        g.heap = [entry for entry in g.heap if entry[1] not in out]
        heapify(g.heap)
        a = math.floor(g.k)
        lo = bisect_left(g.fracs, g.k - a)
        del g.fracs[lo:lo + len(seqs)]
        g.sum_a -= a * len(seqs)
        g.sum_p -= sum(self.P[sid // self.S] for sid in seqs)
        g.b -= len(seqs)

    def _resume(self, g: Engine) -> None:
        """A folded prefill pass over by now: the engine has decoded since its end."""
        t, g.folded, g.resume = g.resume, None, INF
        self._set_state(g, t, DECODING)
        self.resumed += 1

    def _generated(self, j: int, now: float) -> None:
        """Group j's last sequence finished at ``now`` (the versions of its tokens are read off its engines'
        switches at the end: :func:`version_sums`): to the queue (gate fast) or the slow channels."""
        self.generated[j] = now
        self.vmin[j] = min(self.start_v[j * self.S:(j + 1) * self.S])
        if self.gate_fast:
            self.enter(now, j)
        else:
            self.hooks.generated(j, now)

    # ---- the queue (steps 2 and 3) -----------------------------------------------------------------------

    def _queue_changed(self, now: float) -> None:
        n = len(self.queue)
        if self.q_times and self.q_times[-1] == now:
            self.q_lengths[-1] = n
            if len(self.q_lengths) > 1 and self.q_lengths[-2] == n:  # back where it was: no change this instant
                self.q_times.pop()
                self.q_lengths.pop()
        elif (self.q_lengths[-1] if self.q_lengths else 0) != n:
            self.q_times.append(now)
            self.q_lengths.append(n)

    def enter(self, now: float, j: int) -> None:
        """Group j enters the queue (gate fast: when generated; gate all: when its slow results are back)."""
        self.queue_in[j] = now
        insort(self.queue, (now, j))
        cap = self.x.capacity
        if self.block is None and cap is not None and len(self.queue) > cap:
            _, old = self.queue.pop(0)
            self._drop(old, now)
        self._queue_changed(now)
        self.look = True

    def _drop(self, j: int, now: float) -> None:
        self.dropped.append(j)
        self.dropped_at.append(now)
        self.a_samples -= self.S

    # ---- steps 4 and 5: the trainer, then the engines' pulls ---------------------------------------------

    def end_of_round(self, now: float) -> None:
        """The trainer (max_lag drops, intake, the publish scheduled), then each engine that may pull takes
        work (engines in index order). Sets ``done`` at the instant the last step starts."""
        if self.ready and self.look:
            self.look = False
            self._trainer(now)
            if self.done:
                for g in self.engines:
                    if g.resume <= now:
                        self._resume(g)
                    g.time[g.state] += now - g.since
                    g.since = now
                return
        candidates, hungry = self.touched, self.hungry
        if not (candidates or hungry):
            return
        work = bool(self.fifo) or self._admissible()
        if work and hungry:
            candidates = candidates | hungry
        if len(candidates) == 1:
            self.touched = set()
            for e in candidates:
                self._pull(self.engines[e], now, work)
        elif candidates:
            self.touched = set()
            for e in sorted(candidates):
                work = self._pull(self.engines[e], now, work)

    def _trainer(self, now: float) -> None:
        t, q = self.step, self.queue
        if self.max_lag is not None and q:
            keep = []
            for entry in q:
                if t - self.vmin[entry[1]] > self.max_lag:
                    self._drop(entry[1], now)
                else:
                    keep.append(entry)
            if len(keep) != len(q):
                self.queue = q = keep
                self._queue_changed(now)
        if len(q) < self.G:
            return
        batch = [j for _, j in q[:self.G]]
        del q[:self.G]
        self._queue_changed(now)
        self.batches.append(batch)
        self.step_start[t] = now
        self.ready = False
        self.step = t + 1
        if t == self.steps - 1:
            self.done = True
            return
        self.hooks.at(now + float(self.x.trainer_seconds[t]), PUBLISH, t)

    def _admissible(self) -> bool:
        """Whether the admission rule and a blocking queue let group ``next_group`` in now."""
        if self.block is not None and len(self.queue) >= self.block:
            return False
        rule, S, B = self.rule, self.S, self.B
        if rule == "none":
            return True
        if rule == "areal":  # AReaL: running + accepted <= (eta + version + 1) x B
            return self.a_samples + S <= (self.eta + self.v_global + 1) * B
        if rule == "verl":  # verl: samples started since the last sync <= (1 + s) x B
            return self.w_samples + S <= self.verl_cap
        return self.next_group // self.G <= self.v_global + self.ahead  # PRIME-RL, NeMo-RL, Tinker

    def _admit(self, now: float) -> None:
        j = self.next_group
        if j >= self.n_groups:
            raise ValueError("more groups needed")
        self.next_group = j + 1
        self.a_samples += self.S
        self.w_samples += self.S
        self.fifo.extend(range(j * self.S, (j + 1) * self.S))

    def _pull(self, g: Engine, now: float, work: bool) -> bool:
        """Engine g, if it may pull (idle or decoding, not syncing or draining), fills its free slots from
        the FIFO, admitting groups as the rule allows, and starts one prefill pass over what it took.
        ``work``: whether the FIFO or the rule had any to give; returns whether they still have."""
        free = self.C - g.b
        if g.stalled or g.prefill is not None or g.pending or free <= 0:
            self.hungry.discard(g.index)
            return work
        if not work:
            self.hungry.add(g.index)
            return work
        took = []
        fifo = self.fifo
        while free:
            if not fifo:
                if not self._admissible():
                    break
                self._admit(now)
            if free == 1:
                took.append(fifo.popleft())
                free = 0
            else:
                n = min(free, len(fifo))
                took += [fifo.popleft() for _ in range(n)]
                free -= n
        if free:
            self.hungry.add(g.index)
            work = False
        else:
            self.hungry.discard(g.index)
            work = bool(fifo) or self._admissible()
        if not took:
            return work
        version, e, taken, start_v, engine_of = g.version, g.index, self.taken, self.start_v, self.engine_of
        for sid in took:
            taken[sid] = now
            start_v[sid] = version
            engine_of[sid] = e
        self._freeze(g, now)
        g.prefill = took
        g.prefill_end = now + self._prefill_seconds(took)
        if free:
            self._set_state(g, now)
        else:
            self._fold(g, now)
        self.engine_changed(g.index, now)
        return work

    def _prefill_seconds(self, seqs: List[int]) -> float:
        """pi(k, sum P, sum P^2, max P) of one prefill pass over sequences ``seqs``; a single prompt's is kept
        (most passes start one sequence, in a slot a completion freed, and prompt lengths repeat)."""
        if len(seqs) == 1:
            p = self.P[seqs[0] // self.S]
            s = self.one_prefill.get(p)
            if s is None:
                s = self.one_prefill[p] = self.prefill_s(1, float(p), float(p * p), float(p))
            return s
        prompts = [self.P[sid // self.S] for sid in seqs]
        return self.prefill_s(len(prompts), float(sum(prompts)), float(sum(p * p for p in prompts)),
                              float(max(prompts)))

    def starved(self) -> Starved:
        return Starved(f"the trainer starves at step {self.step}: {len(self.queue)} of {self.G} groups queued "
                       "and no event left that could bring more")

    def _versions(self, sid: np.ndarray) -> tuple:
        """(mean version, last version) of the finished sequences ``sid`` (:func:`version_sums`, engine by
        engine)."""
        on = np.frombuffer(self.engine_of, dtype=np.int64)[sid]
        k0 = np.frombuffer(self.k0)[sid]
        n = np.asarray(self.x.response, dtype=np.int64).reshape(-1)[sid]
        mean_v, last_v = np.zeros(len(sid)), np.zeros(len(sid), dtype=np.int64)
        by_engine = np.argsort(on, kind="stable")
        bounds = np.searchsorted(on[by_engine], np.arange(len(self.engines) + 1))
        for g in self.engines:
            mine = by_engine[bounds[g.index]:bounds[g.index + 1]]
            if len(mine):
                mean_v[mine], last_v[mine] = version_sums(g.switch_k, g.switch_v, k0[mine], n[mine])
        return mean_v, last_v

    def trace_arrays(self) -> dict:
        """The per-sample records of the trained batches, (steps, B) each, and the per-lane figures."""
        groups = np.asarray(self.batches, dtype=np.int64).reshape(self.steps, self.G)
        sid = (groups[:, :, None] * self.S + np.arange(self.S)[None, None, :]).reshape(self.steps, self.B)
        gid = sid // self.S
        mean_v, last_v = self._versions(sid.reshape(-1))
        return dict(
            step_start=np.asarray(self.step_start), publish=np.asarray(self.publish_at),
            sync_end=np.asarray(self.sync_end), group=gid,
            start_version=np.frombuffer(self.start_v, dtype=np.int64)[sid],
            mean_version=mean_v.reshape(sid.shape), last_version=last_v.reshape(sid.shape),
            taken=np.frombuffer(self.taken)[sid], finished=np.frombuffer(self.finished)[sid],
            queue_in=np.asarray(self.queue_in)[gid], prompt=np.asarray(self.x.prompt, dtype=np.int64)[gid],
            response=np.asarray(self.x.response, dtype=np.int64).reshape(-1)[sid],
            dropped=np.asarray(self.dropped, dtype=np.int64), dropped_at=np.asarray(self.dropped_at),
            engine_time=np.asarray([g.time for g in self.engines]), queue_times=np.asarray(self.q_times),
            queue_length=np.asarray(self.q_lengths, dtype=np.int64), wasted_tokens=int(self.wasted),
            groups_admitted=int(self.next_group), generated=np.asarray(self.generated[:self.next_group]),
            entered=np.asarray(self.queue_in[:self.next_group]))
