"""Autoscaled pools (``pipeline.channels.<name>.autoscale``): a queue channel's workers, or
a gpu_rm channel's replicas, whose number follows a rule instead of being fixed.

The rule, per trial: the pool starts with ``min`` servers, ready at time 0.

* Scale up: when more than ``queue_above`` requests have been waiting (queue
  channel: jobs; gpu_rm: sequences in the batcher) for ``for_s`` seconds without a
  break, no ready server is idle and fewer than ``max`` servers are billed, one
  server is requested; it serves from ``startup_s`` seconds later. The ``for_s``
  clock then restarts at that instant (the next one needs another ``for_s``).
* Scale down: a ready server idle for ``idle_s`` seconds is released while more
  than ``min`` are billed (lowest slot first).
* Billing: a server is billed from the instant it is requested to the instant it
  is released (initial servers from 0), at ``price_per_hour`` per server.

Order at an instant tau: arrivals are admitted and finished or started-up servers
are free first; then the dispatch rule sends work to idle ready servers (lowest
slot first, a new server taking the lowest slot free: the head job for a queue channel, :meth:`_Waiting.dispatch` for
gpu_rm); then scale-down; then scale-up. Every state change happens at an
instant both engines visit (an arrival, a completion, a start-up's end, a flush
deadline, ``idle_since + idle_s``, ``above_since + for_s``), and a decision at
any other instant changes nothing, so the lanes engine (:class:`AutoLanes`, a
per-lane event loop) and the SimPy engine (:class:`SimpyAutoPool`) agree to the bit.
With a rule that never fires the pool is a fixed pool of ``min``: the same
schedule as ``workers: min`` (or ``rm.gpus: min * tp``).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import numpy as np

from racsim.pipeline.arrivals import ReadyPool, group_arrivals, groups_per_step, ready_pool, step_arrivals
from racsim.pipeline.batcher import GpuSpec, _Batch, _batch_log, _per_sample
from racsim.pipeline.cbatch import waiting
from racsim.pipeline.fifoq import FifoWaiting
from racsim.pipeline.instant import EndOfInstant


@dataclass(frozen=True)
class ScaleRule:
    """An autoscale config as both engines read it (servers = workers, or replicas of tp GPUs)."""

    min: int
    max: int
    queue_above: int
    for_s: float
    startup_s: float
    idle_s: float
    price_per_hour: float  # USD per server-hour


def scale_rule(ch: Any) -> ScaleRule:
    """The rule of a channel's ``autoscale`` block; the price: ``cost_per_hour`` if set, else
    a gpu_rm replica's GPU-hours (catalog price x tp), else 0."""
    a = ch.autoscale
    price = a.cost_per_hour
    if price is None:
        price = float(ch.rm.gpu.price_per_hour) * int(ch.rm.tp) if ch.kind == "gpu_rm" else 0.0
    return ScaleRule(int(a.min), int(a.max), int(a.queue_above), float(a.for_s), float(a.startup_s),
                     float(a.idle_s), float(price))


class _FifoJobs:
    """A queue channel's waiting jobs, FIFO, with the interface of :class:`_Waiting`:
    one job per idle server, lowest index first; an unrouted job is never admitted."""

    def __init__(self, seconds: np.ndarray, sent: np.ndarray, group: int):
        self.sec, self.sent, self.G = seconds.tolist(), sent.tolist(), group
        self.keys: deque = deque()

    def __len__(self) -> int:
        return len(self.keys)

    def admit(self, g: int) -> None:
        self.keys.extend(j for j in range(g * self.G, (g + 1) * self.G) if self.sent[j])

    def deadline(self, arrival) -> float:
        return math.inf

    def dispatch(self, idle, tau: float, arrival) -> List[_Batch]:
        out = []
        for r in idle:
            if not self.keys:
                break
            j = self.keys.popleft()
            out.append(_Batch(r, [j], self.sec[j], 1.0, j // self.G))
        return out


class AutoPool:
    """One trial's autoscaled channel: its waiting requests, its servers and the rule.
    Server s (numbered in the order they are requested) sits in ``slot[s]``, the lowest
    slot (0 .. max - 1) free when it was requested: the replica the batch log names, and
    the order of "lowest index first". ``free[s]``: when it is next free (its start-up's
    end, then its last completion), which is also when it became idle; ``released[s]``:
    inf while billed. ``alive``: the servers billed, by slot. ``disp``, ``comp``: the first dispatch
    (nan before) and completion (inf before) of each request, filled in place."""

    def __init__(self, rule: ScaleRule, q, group_sizes: List[int], disp: np.ndarray, comp: np.ndarray):
        self.rule, self.q = rule, q
        self.requested = [0.0] * rule.min
        self.free = [0.0] * rule.min
        self.released = [math.inf] * rule.min
        self.alive = list(range(rule.min))
        self.slot = list(range(rule.min))
        self.above_since: Optional[float] = None
        self.arr: List[float] = [math.nan] * len(group_sizes)
        self.left = list(group_sizes)  # requests of each group not dispatched yet
        self.disp, self.comp = disp, comp
        self.batches: list = []

    def admit(self, g: int, time: float) -> None:
        self.arr[g] = float(time)
        self.q.admit(g)

    def idle(self, tau: float) -> List[int]:
        return [s for s in self.alive if self.free[s] <= tau]

    def decide(self, tau: float):
        """Dispatch, scale down, scale up at ``tau`` (everything else of the instant is in).
        Returns (batches started, servers requested, whether the for_s clock (re)started)."""
        r = self.rule
        started = self.q.dispatch(self.idle(tau), tau, self.arr)
        for b in started:
            self._start(b.replica, tau, b.ids, b.seconds, b.billed, b.group)
        for s in list(self.alive) if len(self.alive) > r.min else ():
            if self.free[s] + r.idle_s <= tau and len(self.alive) > r.min:
                self.alive.remove(s)
                self.released[s] = tau
        new, clock = 0, False
        if len(self.q) > r.queue_above:
            if self.above_since is None:
                self.above_since, clock = tau, True
            if tau >= self.above_since + r.for_s and len(self.alive) < r.max and not self.idle(tau):
                taken = {self.slot[s] for s in self.alive}
                self.slot.append(next(k for k in range(r.max) if k not in taken))
                bisect.insort(self.alive, len(self.free), key=self.slot.__getitem__)
                self.requested.append(tau)
                self.free.append(tau + r.startup_s)
                self.released.append(math.inf)
                self.above_since, new, clock = tau, 1, True
        else:
            self.above_since = None
        return started, new, clock

    def _start(self, s: int, tau: float, ids, seconds: float, billed: float, group: int) -> float:
        """Server ``s`` starts a batch of requests ``ids`` at ``tau``; returns when it ends."""
        end = tau + seconds
        self.free[s] = end
        self._served(ids, tau, end)
        self.batches.append((self.slot[s], tau, end, len(ids), billed, group))
        return end

    def serve_cut(self, now: float, until: float, stop=None) -> float:
        """Go on from ``now`` (decided) while the pool is a fixed pool whose servers take the
        batches the limits cut (:meth:`FifoWaiting.take`), up to ``until`` (the next arrival)
        or ``stop(tau)``; returns the last instant served. Exact: with every server busy at
        ``now``, each next instant is a completion (or a start-up's end) whose servers, lowest
        slot first, each take a cut batch, as :meth:`decide` does; then none is idle, so none is
        released and none requested (before ``above_since + for_s``, or with ``max`` billed), and
        the for_s clock stops once the queue is down to ``queue_above``. Instants between (flush
        deadlines) change nothing, and ``stop`` holds on from any of them to the next. Where no
        cut batch is left for a server, :meth:`decide` does the rest of that instant."""
        r, free, q = self.rule, self.free, self.q
        if any(free[s] <= now for s in self.alive):
            return now
        if self.above_since is not None and len(self.alive) < r.max:
            until = min(until, self.above_since + r.for_s)
        heap = [(free[s], self.slot[s], s) for s in self.alive]
        heapq.heapify(heap)
        while True:
            tau, k, s = heap[0]
            if tau > now and (tau >= until or (stop is not None and stop(tau))):
                return now
            now = tau
            got = q.take()
            if got is None:
                self.decide(tau)
                return tau
            h, n, seconds, billed = got
            heapq.heapreplace(heap, (self._start(s, tau, range(h, h + n), seconds, billed, h // q.G), k, s))
            if self.above_since is not None and len(q) <= r.queue_above:
                self.above_since = None

    def _served(self, ids, tau: float, end: float) -> None:
        """Requests ``ids`` dispatched at ``tau``, complete at ``end`` (a ``range``: by slices)."""
        disp, comp, left, G = self.disp, self.comp, self.left, self.q.G
        if type(ids) is range:
            a, b = ids.start, ids.stop
            disp[a:b], comp[a:b] = tau, end
            g, last = a // G, (b - 1) // G
            while g < last:  # the groups it spans, all but its last
                g += 1
                left[g - 1] -= g * G - a
                a = g * G
            left[last] -= b - a
            return
        for j in ids:
            disp[j], comp[j] = tau, end
            left[j // G] -= 1

    def next_timer(self, now: float) -> float:
        """The earliest instant after ``now`` at which the pool alone may change: a
        completion or start-up's end, an idle server's release, the scale-up clock, a flush."""
        r, c = self.rule, math.inf
        down = len(self.alive) > r.min
        for s in self.alive:
            f = self.free[s]
            if now < f < c:
                c = f
            if down and now < f + r.idle_s < c:
                c = f + r.idle_s
        if self.above_since is not None and now < self.above_since + r.for_s < c:
            c = self.above_since + r.for_s
        if self.q:
            d = self.q.deadline(self.arr)
            if now < d < c:
                c = d
        return c

    def log_rows(self, lane: int):
        """(lane, slot, requested, released) of every server this lane's pool ever billed."""
        n = len(self.requested)
        return np.full(n, lane), np.asarray(self.slot), np.asarray(self.requested), np.asarray(self.released)


def pool_log(rows: list, rule: ScaleRule) -> Dict[str, np.ndarray]:
    """Columns of the servers' billing log over lanes, and the price per server-hour."""
    cols = [np.concatenate([r[k] for r in rows]) for k in range(4)]
    return {"lane": cols[0].astype(np.int64), "server": cols[1].astype(np.int64),
            "requested": cols[2].astype(np.float64), "released": cols[3].astype(np.float64),
            "price_per_hour": np.array(rule.price_per_hour), "max": np.array(rule.max, dtype=np.int64)}


def billed_seconds(log: Dict[str, np.ndarray], lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """(lanes,) server-seconds billed inside each lane's window [lo, hi]: the integral of the
    number of billed servers over the window."""
    lane = log["lane"]
    inside = np.clip(np.minimum(log["released"], hi[lane]) - np.maximum(log["requested"], lo[lane]), 0, None)
    return np.bincount(lane, weights=inside, minlength=lo.shape[0])


def _pool(draws: Any, name: str, lane: int, fifo: bool = False, feed: Optional[ReadyPool] = None,
          times=None) -> AutoPool:
    """Lane ``lane``'s pool of channel ``name``, its requests numbered step by step, or with arrivals
    over time (``feed``) sample by sample in ready order, a group per sample (as a fixed gpu_rm
    pool's; a queue channel's group is then the sample's one job); ``fifo``: a FIFO batcher's
    waiting list is a :class:`FifoWaiting` (every cut batch formed at once); ``times``: the
    (disp, comp) rows it fills (default: new ones)."""
    rule = draws.autoscale[name]
    svc = draws.service[name][lane]
    steps, batch = svc.shape[:2]
    per = groups_per_step(feed)
    order = (lambda x: x) if feed is None else (lambda x: feed.to_ready(x[None], slice(lane, lane + 1))[0])
    times = times or (np.full(svc.size, math.nan), np.full(svc.size, math.inf))
    if name in draws.gpu:
        spec: GpuSpec = draws.gpu[name]
        G = svc[0].size // per
        slow = draws.slowdown_row(name, lane)
        slow = None if slow is None else np.repeat(slow, per)  # per group
        fast = fifo and spec.order == "fifo" and not spec.chunked
        q = (FifoWaiting if fast else waiting)(spec, order(svc.ravel()), G, slow)
        return AutoPool(rule, q, [G] * (steps * per), *times)
    sent = draws.routed[name][lane] if name in draws.routed else np.ones(svc.shape, dtype=bool)
    sent = order(sent.ravel())
    return AutoPool(rule, _FifoJobs(order(svc.ravel()), sent, batch // per),
                    sent.reshape(steps * per, -1).sum(axis=1).tolist(), *times)


def sample_times(draws: Any, name: str, disp: np.ndarray, comp: np.ndarray, submit: np.ndarray,
                 lanes=slice(None), feed: Optional[ReadyPool] = None):
    """(start, end) per sample of the trials ``lanes`` (a slice; their pools' ``disp`` and ``comp``,
    a row per trial, fed by ``feed``; ``submit`` their submission times): first dispatch and last
    completion; an unrouted sample keeps its submission time."""
    shape = disp.shape[:1] + draws.service[name].shape[1:]
    if feed is not None:  # back to sample order
        disp, comp = feed.from_ready(disp, lanes), feed.from_ready(comp, lanes)
    if name in draws.gpu:
        return _per_sample(disp, comp, shape)
    start, end = disp.reshape(shape), comp.reshape(shape)
    if name in draws.routed:
        sent = draws.routed[name][lanes]
        start, end = np.where(sent, start, submit), np.where(sent, end, submit)
    return start, end


def logs(draws: Any, name: str, pools: List[AutoPool], feed: Optional[ReadyPool] = None):
    """The batch log (gpu_rm; None for a queue channel, replicas = ``max``; a batch's group: its
    step) and the pool log; pool i is trial i's, fed by ``feed``."""
    rule = draws.autoscale[name]
    plog = pool_log([p.log_rows(i) for i, p in enumerate(pools)], rule)
    if name not in draws.gpu:
        return None, plog
    per = groups_per_step(feed)
    rows = [(np.full(len(p.batches), i), *zip(*p.batches)) for i, p in enumerate(pools) if p.batches]
    rows = [tuple(np.asarray(c) for c in r) for r in rows]
    return _batch_log([(*r[:6], r[6] // per) for r in rows], rule.max), plog


class AutoLanes:
    """An autoscaled channel in the lanes engine: a per-lane event loop over
    :class:`AutoPool` (decision instants: arrivals and the pool's timers); with a FIFO batcher,
    after each decision, the stretch that follows while the pool is a fixed pool of busy
    servers (:meth:`AutoPool.serve_cut`)."""

    def __init__(self, draws: Any, name: str):
        self.draws, self.name = draws, name
        n, N = draws.service[name].shape[0], draws.service[name][0].size
        self.feed = None if draws.offset is None else ready_pool(draws.offset)  # arrivals over time
        self.disp, self.comp = np.full((n, N), math.nan), np.full((n, N), math.inf)  # every pool's, a row each
        self.pools = [_pool(draws, name, i, True, self.feed, (self.disp[i], self.comp[i])) for i in range(n)]
        self.stretches = all(isinstance(p.q, FifoWaiting) for p in self.pools)
        self.known = [[] for _ in range(n)]  # arrival times handed over, per lane
        self.admitted = [0] * n
        self.now = [-math.inf] * n

    def _run(self, i: int, stop=None) -> None:
        p, arr, k, now = self.pools[i], self.known[i], self.admitted[i], self.now[i]
        while True:
            a = arr[k] if k < len(arr) else math.inf
            tau = min(a, p.next_timer(now))
            if tau == math.inf or (stop is not None and stop(tau)):
                break
            while k < len(arr) and arr[k] <= tau:
                p.admit(k, arr[k])
                k += 1
            p.decide(tau)
            now = tau
            if self.stretches:
                now = p.serve_cut(now, arr[k] if k < len(arr) else math.inf, stop)
        self.admitted[i], self.now[i] = k, now

    def run_async(self, submit: np.ndarray) -> None:
        """Every sample's submission known (lanes, steps, batch): serve them all."""
        for i, row in enumerate(group_arrivals(self.feed, submit)):
            self.known[i].extend(row.tolist())
            self._run(i)

    def step_blocking(self, t: int, now: np.ndarray, timeout: Optional[float], ready: np.ndarray) -> np.ndarray:
        """Step t's groups arrive (at ``now``, or with arrivals over time at ``ready``: :func:`step_arrivals`);
        run until they are all dispatched or the wait, from ``now``, times out. Returns when their
        last result is back (inf: not known by the timeout; ``now`` if none was sent)."""
        out = np.empty(len(self.pools))
        lim = math.inf if timeout is None else timeout
        per = groups_per_step(self.feed)
        lo, hi = t * per, (t + 1) * per  # the step's groups
        for i, (p, times) in enumerate(zip(self.pools, step_arrivals(self.feed, t, now, ready).tolist())):
            self.known[i].extend(times)
            until = now[i] + lim
            self._run(i, lambda tau: not any(p.left[lo:hi]) or tau >= until)
            if any(p.left[lo:hi]):
                out[i] = np.inf
            else:
                G = len(p.disp) // len(p.left)
                c = np.asarray(p.comp[lo * G:hi * G])
                c = c[np.isfinite(c)] if self.name not in self.draws.gpu else c
                out[i] = c.max() if c.size else now[i]
        return out

    def finish(self, submit: np.ndarray):
        """Serve what is left: (start, end) per sample, batch log (or None) and pool log."""
        for i in range(len(self.pools)):
            self._run(i)
        return (*sample_times(self.draws, self.name, self.disp, self.comp, submit, feed=self.feed),
                *logs(self.draws, self.name, self.pools, self.feed))


class SimpyAutoPool(EndOfInstant):
    """One trial's autoscaled channel in SimPy: a decider process that runs
    :meth:`AutoPool.decide` once everything of an instant is in (a late event, as the
    batcher's), a process per batch or job, and timeouts for the rule's clocks."""

    def __init__(self, env, draws: Any, name: str, lane: int, late_cls, feed: Optional[ReadyPool] = None):
        self.pool = _pool(draws, name, lane, feed=feed)
        self.rule = self.pool.rule
        self.max_wait = draws.gpu[name].max_wait if name in draws.gpu else None
        self.todo = list(self.pool.left)  # results of each group not back yet
        self.done = [env.event() for _ in self.todo]
        self._start_decider(env, late_cls)

    def arrive(self, g: int) -> None:
        self.pool.admit(g, self.env.now)
        if self.todo[g] == 0:
            self.done[g].succeed()
        if self.max_wait is not None:
            self._later(self.max_wait)
        self._poke()

    def _later(self, delay: float, then=None) -> None:
        ev = self.env.timeout(delay)
        ev.callbacks.append(then or self._poke)

    def _ready(self, _=None) -> None:
        self._later(self.rule.idle_s)
        self._poke()

    def _decide(self, tau: float) -> None:
        started, new, clock = self.pool.decide(tau)
        for b in started:
            self.env.process(self._serve(b))
        if new:
            self._later(self.rule.startup_s, self._ready)
        if clock:
            self._later(self.rule.for_s)

    def _serve(self, b: _Batch):
        yield self.env.timeout(b.seconds)
        G = self.pool.q.G
        for j in b.ids:
            g = j // G
            self.todo[g] -= 1
            if self.todo[g] == 0:
                self.done[g].succeed()
        self._later(self.rule.idle_s)
        self._poke()
