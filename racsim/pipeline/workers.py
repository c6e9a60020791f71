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
    last instant asked of that worker (the queries of a FIFO queue only grow); ``now``
    (lanes,) the latest arrival of a job on each lane (its queue's clock)."""

    def __init__(self, tl: Timeline):
        self.tl = tl
        self.L, self.W = tl.lanes, tl.servers
        self.horizon = -math.inf
        self._grow(0.0)
        self.k = np.zeros((self.L, self.W), dtype=np.int64)
        self.down = self.D[:, :, 0].copy()
        self.up = self.U[:, :, 0].copy()
        self.now = np.full(self.L, -math.inf)

    def _grow(self, t: float) -> None:
        """Cover every worker's outages past ``t`` (twice as far as asked) and stack them."""
        for w in range(self.W):
            self.tl.cover(w, 2.0 * t + 1.0)
        K = max(self.tl.up[w].shape[1] for w in range(self.W)) + 1  # and an outage at inf
        self.D = np.full((self.L, self.W, K), np.inf)
        self.U = np.full((self.L, self.W, K), np.inf)
        for w in range(self.W):
            n = self.tl.up[w].shape[1]
            self.D[:, w, :n], self.U[:, w, :n] = self.tl.down[w], self.tl.up[w]
        self.horizon = min(float(self.tl.up[w][:, -1].min()) for w in range(self.W))

    def advance_rows(self, rows, t: np.ndarray) -> None:
        """Move the cursors of every worker of lanes ``rows`` (indices, or a slice) to the first
        outage ending after ``t`` (those lanes, workers)."""
        lanes = np.arange(self.L)[rows]
        while True:
            m = self.up[rows] <= t
            if not m.any():
                return
            li, wi = np.nonzero(m)
            self._step(lanes[li], wi, float(np.max(t[m])))

    def sync(self, rows: np.ndarray) -> None:
        """``down``/``up`` of lanes ``rows`` read again at their index ``k`` (moved by a caller)."""
        at = (self.at(rows[:, None] * self.W + np.arange(self.W)) + self.k[rows]).ravel()
        self.down[rows] = self.D.reshape(-1)[at].reshape(rows.size, self.W)
        self.up[rows] = self.U.reshape(-1)[at].reshape(rows.size, self.W)

    def at(self, p: np.ndarray) -> np.ndarray:
        """Where flat (lane, worker) ``p`` (lane * workers + worker) starts in the flat stacks."""
        return p * self.D.shape[2]

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
    Returns (start, end, lost), each (lanes, jobs); a lost job's end is its failure instant.

    :class:`_Fast` serves the jobs unless one arrives before an earlier one or past the
    cursor's horizon; it never grows the timeline, so it is undone, and :func:`by_rule` run
    instead, when a job's end (the latest instant any step asks) reaches the horizon or a
    zero-length outage makes it read the cursor out of step with the rule."""
    if arrival.size == 0:
        return by_rule(arrival, service, free, cur, sent)
    prior = np.maximum.accumulate(np.hstack([cur.now[:, None], arrival[:, :-1]]), axis=1)
    if np.any(arrival < prior) or arrival.max() >= cur.horizon:
        return by_rule(arrival, service, free, cur, sent)
    saved = (free.copy(), cur.k.copy(), cur.down.copy(), cur.up.copy(), cur.now.copy())
    fast = _Fast(arrival[:, 0], free, cur)
    out = fast.run(arrival, service, sent)
    if fast.clean and out[1].max() < cur.horizon:
        fast.store(free)
        return out
    free[...], cur.k[...], cur.down[...], cur.up[...], cur.now[...] = saved
    return by_rule(arrival, service, free, cur, sent)


def by_rule(arrival: np.ndarray, service: np.ndarray, free: np.ndarray, cur: Cursor,
            sent: Optional[np.ndarray] = None):
    """:func:`fifo_assign_faults` job by job with :func:`_reference` on every lane: the rule
    itself, asking the cursor what the rule asks (the oracle of the fast path)."""
    lanes = np.arange(free.shape[0])
    start = np.empty_like(arrival)
    end = np.empty_like(arrival)
    lost = np.zeros(arrival.shape, dtype=bool)
    for j in range(arrival.shape[1]):
        np.maximum(cur.now, arrival[:, j], out=cur.now)
        start[:, j], end[:, j], lost[:, j] = _reference(cur, free, lanes, arrival[:, j], service[:, j],
                                                        None if sent is None else sent[:, j], cur.tl.spec.retries)
    return start, end, lost


def _reference(cur: Cursor, free: np.ndarray, rows: np.ndarray, a: np.ndarray, seconds: np.ndarray,
               sent: Optional[np.ndarray], retries: int):
    """One job on each of lanes ``rows`` by the rule (arriving at ``a``): the head starts at
    s = min_w next_up_w(max(a, free_w)) on the worker with that candidate free the longest.
    Returns (start, end, lost); ``free`` updated for the jobs sent."""
    f = free[rows]
    t = np.maximum(a[:, None], f)  # each worker's first chance at the job
    cur.advance_rows(rows, t)
    cand = np.where(cur.down[rows] <= t, cur.up[rows], t)  # up at t, else at the repair
    s = cand.min(axis=1)
    w = np.argmin(np.where(cand == s[:, None], f, np.inf), axis=1)  # then the lowest index
    e, lost = s.copy(), np.zeros(s.shape, dtype=bool)
    go = np.arange(rows.size) if sent is None else np.flatnonzero(sent)  # an unsent job takes no worker
    e[go], lost[go] = _serve(cur, rows[go] * cur.W + w[go], s[go], seconds[go], retries, grow=True)
    free[rows[go], w[go]] = e[go]
    return s, e, lost


class _Fast:
    """The rule with one argmin per job. Every worker's status is kept at tw = max(now, free):
    up, with ``key`` its free and ``nb`` its next failure, or down, with ``key`` = ``nb`` its
    repair (``dfree`` its free). While a job arrives before every lane's next status change
    (``nxt``, a lower bound of min nb), worker w's first chance at it is max(a, key_w): an up
    worker's free or the arrival, a down one's repair. So w = argmin key starts the job at
    s = max(a, key_w); it is the rule's choice (the smallest free, then the lowest index)
    unless key_w reaches ``rep``, the lane's first repair, where a down worker (free before
    its repair) may tie: those lanes take the rule's tie-break. A job that ends before its
    worker's next failure leaves it up with the same nb (only key changes); others are
    served outage by outage (:func:`_serve`). The cursor's index ``k`` steps as the
    rule's queries would make it step (never past the horizon: nothing is grown)."""

    def __init__(self, a: np.ndarray, free: np.ndarray, cur: Cursor):
        self.cur, self.lanes = cur, np.arange(free.shape[0])
        self.offs, self.retries = self.lanes * free.shape[1], cur.tl.spec.retries
        np.maximum(cur.now, a, out=cur.now)
        cur.advance_rows(slice(None), np.maximum(a[:, None], free))  # the first job's query of every worker
        self.key, self.nb, self.dfree = np.empty_like(free), np.empty_like(free), free.copy()
        self.nxt, self.rep = np.empty(free.shape[0]), np.empty(free.shape[0])
        self.clean = True  # False once a zero-length outage puts the cursor out of step
        self.keyf, self.nbf, self.dfreef = self.key.reshape(-1), self.nb.reshape(-1), self.dfree.reshape(-1)
        self._status(self.lanes)

    def _status(self, rows: np.ndarray) -> None:
        """Rows' statuses at tw = max(now, free), off the cursor (whose outages all end after tw)."""
        cur, f = self.cur, self.dfree[rows]
        d, u = cur.down[rows], cur.up[rows]
        up = d > np.maximum(cur.now[rows, None], f)
        self.key[rows], self.nb[rows] = np.where(up, f, u), np.where(up, d, u)
        self.nxt[rows], self.rep[rows] = _row_min(self.nb[rows]), _row_min(np.where(up, np.inf, u))

    def free(self, rows: np.ndarray) -> np.ndarray:
        """When rows' workers fell free."""
        key, nb = self.key[rows], self.nb[rows]
        return np.where(nb == key, self.dfree[rows], key)  # down iff nb == key (an up one's nb > free)

    def run(self, arrival: np.ndarray, service: np.ndarray, sent: Optional[np.ndarray]):
        """(start, end, lost) of the jobs, as :func:`fifo_assign_faults` (rows are jobs below):
        the lanes whose job meets an outage by :meth:`_at_once`, else :meth:`_serve`."""
        cur, key, rep, keyf, nbf = self.cur, self.key, self.rep, self.keyf, self.nbf  # flat: (lane, worker) -> one index
        arr, sec = np.ascontiguousarray(arrival.T), np.ascontiguousarray(service.T)
        go_all = None if sent is None else np.ascontiguousarray(sent.T)
        start, end = np.empty_like(arr), np.empty_like(arr)
        lost = np.zeros(arr.shape, dtype=bool)
        steady = bool(np.all(arr == arr[0]))  # one arrival per lane: no status changes after the first job
        a, offs = arr[0], self.offs
        for j in range(arr.shape[0]):
            if j and not steady:
                a = arr[j]
                np.maximum(cur.now, a, out=cur.now)
                g = (a >= self.nxt).nonzero()[0]
                if g.size:  # the clock passed a worker's failure or repair: the rule's query, then read again
                    cur.sync(g)
                    cur.advance_rows(g, np.maximum(a[g, None], self.free(g)))
                    self.dfree[g] = self.free(g)
                    self._status(g)
            w = key.argmin(axis=1)
            p = w + offs
            c = keyf[p]
            s = np.maximum(a, c)
            sj = sec[j]
            e = s + sj
            d = nbf[p]
            cut, odd = e >= d, c >= rep  # meets its worker's failure; a repair (down worker) at c
            start[j] = s
            if go_all is None:
                end[j] = keyf[p] = e
            else:
                go = go_all[j]
                cut &= go
                odd &= go
                end[j] = np.where(go, e, s)
                keyf[p] = np.where(go, e, c)
            if not np.count_nonzero(cut | odd):
                continue
            if self._at_once(cut, odd, p, c, e, d, sj, end[j], lost[j]):
                continue
            i = (cut | odd).nonzero()[0]
            keyf[p[i]] = c[i]
            end[j][i], lost[j][i] = self._serve(i, w[i], c[i], s[i], sj[i])
        return start.T.copy(), end.T.copy(), lost.T.copy()

    def _at_once(self, cut, odd, p, c, e, d, seconds, end, lost) -> bool:
        """A job cut once by its up worker's failure d, or started at a down worker's repair
        c = d, read off the stacked outages at once (the cursor's index k at the outage [d, u)):
        ``lose``: lost at d, the worker down until u; with retries: (re)started at u, done at
        u + seconds if that is before the next failure D[k + 1], the index one outage on.
        True once every such lane's ``end``/``lost`` (this job's rows) and worker are set;
        False, nothing changed, on a second cut, a job ending as its worker fails, a tie at a
        repair or a repair taken with ``lose`` (:meth:`_serve`)."""
        cur, key, rep, keyf, nbf = self.cur, self.key, self.rep, self.keyf, self.nbf
        i = cut.nonzero()[0]  # a down worker's job starts at its repair c = d: odd lanes are cut lanes
        no = np.count_nonzero(odd)
        r = i[odd[i]] if no else None
        if no and (r.size < no or np.count_nonzero(key[r] == c[r, None]) > no):
            return False  # a tie at a repair: the rule's tie-break
        pi, di = p[i], d[i]
        kf = cur.k.reshape(-1)
        k = kf[pi]
        q = cur.at(pi) + k
        u = cur.U.reshape(-1)[q]  # the repair of the outage at d
        if self.retries:
            e2, d2 = u + seconds[i], cur.D.reshape(-1)[q + 1]
            if np.count_nonzero((e2 >= d2) | (e[i] == di)):
                return False
            kf[pi], keyf[pi], nbf[pi], end[i] = k + 1, e2, d2, e2
            if no:  # a repaired worker taken: the lane's first repair again
                rep[r] = _row_min(np.where(self.nb[r] == key[r], key[r], np.inf))
            return True
        if no or np.count_nonzero((u <= di) | (e[i] == di)):
            return False
        keyf[pi], nbf[pi], self.dfreef[pi], end[i], lost[i] = u, u, di, di, True
        rep[i] = np.minimum(rep[i], u)
        return True

    def _serve(self, i: np.ndarray, w: np.ndarray, c: np.ndarray, s: np.ndarray, seconds: np.ndarray):
        """Lanes i's jobs (started at s) on the rule's worker, through its outages: (end, lost)."""
        key, cur = self.key, self.cur
        odd = (c >= self.rep[i]).nonzero()[0]
        if odd.size:  # a repair at c: the candidates at c, free the longest, then the lowest index
            r = i[odd]
            w[odd] = np.where(key[r] == c[odd, None], self.free(r), np.inf).argmin(axis=1)
        p = i * cur.W + w
        e, lost = _serve(cur, p, s, seconds, self.retries, grow=False)
        d, u = cur.down.reshape(-1)[p], cur.up.reshape(-1)[p]
        self.clean &= not np.count_nonzero(u <= e)  # a zero-length outage at e: the rule's next query steps it
        up = d > e
        self.keyf[p], self.nbf[p], self.dfreef[p] = np.where(up, e, u), np.where(up, d, u), e
        if odd.size or not up.all():  # a worker repaired or down: the first repair again
            self.rep[i] = _row_min(np.where(self.nb[i] == key[i], key[i], np.inf))
        return e, lost

    def store(self, free: np.ndarray) -> None:
        """Write every worker's free back, and the cursor's down/up at its index."""
        free[...] = self.free(self.lanes)
        self.cur.sync(self.lanes)


def _row_min(x: np.ndarray) -> np.ndarray:
    """x.min(axis=1) (by argmin: faster on short rows)."""
    return x[np.arange(x.shape[0]), x.argmin(axis=1)]


def _serve(cur: Cursor, p: np.ndarray, s: np.ndarray, seconds: np.ndarray, retries: int, grow: bool):
    """Jobs of ``seconds`` started at ``s`` on up flat (lane, worker) ``p`` (distinct): (end, lost),
    the rule of :meth:`Timeline.serve` on every pair at once, read off the cursor's stacked
    outages by index. Its index ``k`` (and ``down``/``up`` at it) steps as :meth:`Cursor._step`
    steps it: the pairs asked an instant at or past their outage's repair one outage on together,
    the timeline grown first, to the latest of those instants, when it reaches the horizon if
    ``grow`` (the rule's path), else never (the fast path: the caller checks the horizon)."""
    kf = cur.k.reshape(-1)
    k = kf[p]
    at, D, U = cur.at(p), cur.D.reshape(-1), cur.U.reshape(-1)  # where p starts in the flat stacks (read again once grown)

    def advance(act, t: np.ndarray) -> None:
        """The pairs ``p[act]`` to the first outage ending after ``t`` (a repair at ``t``: the next)."""
        nonlocal at, D, U
        while True:
            m = U[at[act] + k[act]] <= t
            if not np.count_nonzero(m):
                return
            if grow and t[m].max() >= cur.horizon:
                cur._grow(float(t[m].max()))
                at, D, U = cur.at(p), cur.D.reshape(-1), cur.U.reshape(-1)
            k[act] += m

    advance(slice(None), s)
    end = s + seconds
    lost = np.zeros(s.shape, dtype=bool)
    act = (end > D[at + k]).nonzero()[0]  # cut by a failure (few): attempt by attempt
    t, tries = s[act], 0
    while act.size:
        q = at[act] + k[act]
        d, u = D[q], U[q]
        cut = t + seconds[act] > d
        end[act[~cut]] = (t + seconds[act])[~cut]
        if tries == retries:
            end[act[cut]], lost[act[cut]] = d[cut], True
            break
        act, t, tries = act[cut], u[cut], tries + 1
        advance(act, t)
    kf[p] = k
    q = at + k
    cur.down.reshape(-1)[p], cur.up.reshape(-1)[p] = D[q], U[q]
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
