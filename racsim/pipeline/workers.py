"""Failures of a queue channel's workers (``pipeline.channels.NAME.faults`` with ``workers``).

Each worker fails and is repaired as a gpu_rm replica of one GPU does
(racsim/pipeline/faults.py: the same :class:`Timeline`, the same retry/lose rule). The
queue stays FIFO: the request at the head starts at the first instant a worker is free
and up; when several are, it takes the one free the longest (lowest index on ties), the
rule of the queue without failures. A request cut by its worker's failure keeps the worker
and restarts from scratch at the repair (``retry``, at most ``max_retries`` times), or is
lost at the failure instant, the worker then free (and down until its repair).

:func:`fifo_assign_faults` is the lanes engine's form (vectorised over lanes, one step
per request, like :func:`racsim.pipeline.lanes.fifo_assign`); :class:`SimpyWorkers` the
SimPy engine's (a pool deciding at the end of each instant); they agree bit for bit.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Optional

import numpy as np

from racsim.pipeline.faults import Timeline
from racsim.pipeline.instant import EndOfInstant


class Cursor:
    """Every lane's and worker's current outage on a :class:`Timeline`, read forward only:
    ``down``/``up`` (lanes, workers) hold the first outage [down, up) that ends after the
    last instant asked of that worker (the queries of a FIFO queue only grow)."""

    def __init__(self, tl: Timeline):
        self.tl = tl
        self.L, self.W = tl.lanes, tl.servers
        self.horizon = -math.inf
        self._grow(0.0)
        self.k = np.zeros((self.L, self.W), dtype=np.int64)
        self.down = self.D[:, :, 0].copy()
        self.up = self.U[:, :, 0].copy()

    def _grow(self, t: float) -> None:
        """Cover every worker's outages past ``t`` (twice as far as asked) and stack them."""
        for w in range(self.W):
            self.tl.cover(w, 2.0 * t + 1.0)
        K = max(self.tl.up[w].shape[1] for w in range(self.W))
        self.D = np.full((self.L, self.W, K), np.inf)
        self.U = np.full((self.L, self.W, K), np.inf)
        for w in range(self.W):
            n = self.tl.up[w].shape[1]
            self.D[:, w, :n], self.U[:, w, :n] = self.tl.down[w], self.tl.up[w]
        self.horizon = min(float(self.tl.up[w][:, -1].min()) for w in range(self.W))

    def advance(self, lane: np.ndarray, w: np.ndarray, t: np.ndarray) -> None:
        """Move the cursors (lane[i], w[i]) to the first outage ending after t[i]."""
        while True:
            m = self.up[lane, w] <= t
            if not m.any():
                return
            self._step(lane[m], w[m], float(np.max(t[m])))

    def advance_all(self, t: np.ndarray) -> None:
        """:meth:`advance` for every lane and worker, ``t`` (lanes, workers)."""
        while True:
            m = self.up <= t
            if not m.any():
                return
            li, wi = np.nonzero(m)
            self._step(li, wi, float(np.max(t[m])))

    def _step(self, li: np.ndarray, wi: np.ndarray, t: float) -> None:
        """The cursors (li, wi) one outage on; ``t`` the latest instant asked."""
        if t >= self.horizon:
            self._grow(t)
        k = self.k[li, wi] + 1
        self.k[li, wi] = k
        self.down[li, wi], self.up[li, wi] = self.D[li, wi, k], self.U[li, wi, k]


def fifo_assign_faults(arrival: np.ndarray, service: np.ndarray, free: np.ndarray, cur: Cursor,
                       sent: Optional[np.ndarray] = None):
    """FIFO service on workers that fail (the module docstring's rule), vectorised over lanes.

    ``arrival``/``service``: (lanes, jobs), sorted by arrival within a lane; ``free``: (lanes,
    workers) when each worker fell free (updated in place); ``cur``: the workers' outages;
    ``sent`` (lanes, jobs): False for a job never sent (routing), which takes no worker.
    Returns (start, end, lost), each (lanes, jobs); a lost job's end is its failure instant."""
    lanes = np.arange(free.shape[0])
    start = np.empty_like(arrival)
    end = np.empty_like(arrival)
    lost = np.zeros(arrival.shape, dtype=bool)
    retries = cur.tl.spec.retries
    t = np.empty_like(free)
    key = np.empty_like(free)
    for j in range(arrival.shape[1]):
        np.maximum(arrival[:, j, None], free, out=t)  # each worker's first chance at the job
        cur.advance_all(t)
        cand = np.where(cur.down <= t, cur.up, t)  # up at t, else at the repair
        s = cand.min(axis=1)
        np.copyto(key, np.inf)
        np.copyto(key, free, where=cand == s[:, None])
        w = np.argmin(key, axis=1)  # among the first up, the one free the longest, then the lowest
        start[:, j] = s
        if sent is None:
            e, lost[:, j] = _serve(cur, lanes, w, s, service[:, j], retries)
            end[:, j] = free[lanes, w] = e
            continue
        end[:, j] = s
        go = lanes[sent[:, j]]  # an unsent job takes no worker
        end[go, j], lost[go, j] = _serve(cur, go, w[go], s[go], service[go, j], retries)
        free[go, w[go]] = end[go, j]
    return start, end, lost


def _serve(cur: Cursor, lanes: np.ndarray, w: np.ndarray, s: np.ndarray, seconds: np.ndarray, retries: int):
    """Jobs of ``seconds`` started at ``s`` on up workers ``w`` of ``lanes`` (one each):
    (end, lost), the rule of :meth:`Timeline.serve` on every lane at once."""
    cur.advance(lanes, w, s)
    end = s + seconds
    lost = np.zeros(s.shape, dtype=bool)
    act = np.flatnonzero(end > cur.down[lanes, w])  # cut by a failure (few): attempt by attempt
    t, tries = s[act], 0
    while act.size:
        d, u = cur.down[lanes[act], w[act]], cur.up[lanes[act], w[act]]
        cut = t + seconds[act] > d
        end[act[~cut]] = (t + seconds[act])[~cut]
        if tries == retries:
            end[act[cut]], lost[act[cut]] = d[cut], True
            break
        act, t, tries = act[cut], u[cut], tries + 1
        cur.advance(lanes[act], w[act], t)
    return end, lost


class SimpyWorkers(EndOfInstant):
    """A queue channel's workers in one trial's SimPy environment, with failures: requests wait
    in FIFO order; at the end of each instant (after its arrivals and releases) the head takes
    a worker that is free and up, the one free the longest; with none, a repair wakes it."""

    def __init__(self, env, workers: int, faults: Timeline, lane: int, late_cls, at):
        self.tl, self.lane = faults, lane
        self.at = at  # at(env, when): an event at that absolute instant (simpy_engine._at)
        self.free = [0.0] * workers  # when each worker fell free
        self.busy = [False] * workers
        self.queue: deque = deque()
        self._start_decider(env, late_cls)  # decide once the instant's arrivals and releases are in

    def _decide(self, tau: float) -> None:
        idle = [w for w, b in enumerate(self.busy) if not b]
        back = {w: self.tl.next_up(self.lane, w, tau) for w in idle}
        for _, w in sorted((self.free[w], w) for w in idle if back[w] == tau):
            if not self.queue:
                return
            self.busy[w] = True
            self.queue.popleft().succeed(w)
        down = [u for u in back.values() if u > tau]
        if self.queue and down:  # wake at the first repair of an idle worker
            self.at(self.env, min(down)).callbacks.append(self._poke)

    def job(self, seconds: float):
        """A request's process: wait for a worker, serve through its outages. Returns
        (start, end, lost); the worker is free again at ``end``."""
        ev = self.env.event()
        self.queue.append(ev)
        self._poke()
        w = yield ev
        start = self.env.now
        tries, lost = 0, False
        while True:
            down, up = self.tl.outage(self.lane, w, self.env.now)
            if self.env.now + seconds <= down:
                yield self.env.timeout(seconds)
                break
            yield self.at(self.env, down)  # the worker fails
            if tries == self.tl.spec.retries:
                lost = True
                break
            tries += 1
            yield self.at(self.env, up)  # repaired: start again
        self.busy[w], self.free[w] = False, self.env.now
        self._poke()
        return start, self.env.now, lost
