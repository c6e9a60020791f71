"""A FIFO gpu_rm pool fed a step at a time, in light passes: the batches cut by the limits
alone, the instants by a short recursion.

When a step's requests reach the pool at one instant a_t (``pipeline.arrivals: batch``), the
rule of :func:`racsim.pipeline.batcher._fifo_lanes` cuts them, from the first not yet
dispatched, into the same greedy chain over their tokens whatever the timing: every batch of
the chain but the last is full (``max_batch`` or the token budget stops it inside the step)
and leaves at

    tau_k = max(tau_{k-1}, earliest free replica, a_t if batch k is full else a_t + max_wait)

on the lowest-indexed replica free then, with the same requests, whatever comes after. Only
the step's last batch may differ: when a replica takes it no sooner than the next step's
arrival a_{t+1}, it takes that step's first requests too (and may leave sooner). Such a batch
is left to :func:`_fifo_lanes` itself, one batch, and the next step's chain then starts inside
that step: cut from there until one of its batches ends where one of the chain from the step's
start begins (often within some dozens, where both cut before the same long request), it follows
that chain. A blocking pipeline (``wait_for_slow``, no timeout) never meets
a_{t+1} (the optimizer waits for the step's last result); an asynchronous one knows every a_t
from the start.

:func:`plan` cuts many steps' chains at once, vectorised over lanes and steps, with their
seconds; :class:`Steps` serves a step's batches on the replicas, a few operations per batch
position, where :func:`_fifo_lanes` rebuilds each batch's window and arrivals. The same
instants, completions and batch log bit for bit (tests/test_chains.py).

A blocking pool whose replicas fail (``faults``) is served so too, its chains the same: from a
step's first instant to the next instant at which a replica goes down or comes back, the
replicas up are the pool and every batch that ends before then is the rule's
(:func:`serve_calm`: 97.5% of the batches of capacity/judge_rm_faults' blocking run at 6 GPUs);
from a lane's first batch that does not, :func:`_fifo_lanes`'s rule with outages
(:func:`serve_failing`), cut batches re-sent within the step. An asynchronous pool with faults
stays with :func:`_fifo_lanes`: its lanes are often backlogged, their steps begin inside, and
the light passes gain nothing there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import numpy as np

from racsim.pipeline.batcher import (GpuSpec, _Again, _billed, _dispatch_failing, _fifo_lanes, _FifoLanes,
                                     _resend_ahead, _resend_lanes, window)

# about the batches one plan holds (33 bytes each) and the window cells one pass of its cutting
# reads (about 40 bytes each, temporaries included): 35-40 MB at most
PLAN_CELLS = 1 << 20


@dataclass(frozen=True)
class Batches:
    """Batches as (rows, K) arrays, n = 0 past a row's last: first request (the lane's own
    index), size, seconds, billed tokens, and whether each is full (it leaves as soon as a
    replica is free, the same whatever comes after)."""

    head: np.ndarray
    n: np.ndarray
    seconds: np.ndarray
    billed: np.ndarray
    full: np.ndarray


@dataclass(frozen=True)
class Plan:
    """The chains of steps [t0, t0 + steps) from each step's first request, every lane:
    :class:`Batches` of (lanes, steps, K) arrays."""

    t0: int
    b: Batches

    @property
    def t1(self) -> int:
        """The step after the plan's last."""
        return self.t0 + self.b.n.shape[1]

    def step(self, t: int) -> Batches:
        """Step t's chains, (lanes, K)."""
        s = t - self.t0
        return Batches(*(a[:, s] for a in (self.b.head, self.b.n, self.b.seconds, self.b.billed, self.b.full)))


def plan_steps(lanes: int, requests_per_step: int, max_batch: int) -> int:
    """Steps one :class:`Plan` covers, one at least: as many as keep its batches (requests /
    ``max_batch`` where the budget does not bind) and its windows (rows x ``max_batch``) to
    about :data:`PLAN_CELLS`."""
    batches = PLAN_CELLS * max_batch // max(1, lanes * requests_per_step)
    return max(1, min(batches, PLAN_CELLS // max(1, lanes * max_batch)))


def _window(spec: GpuSpec, flat: np.ndarray, h: np.ndarray, e: np.ndarray):
    """The batch from each flat index ``h`` whose step ends at ``e`` (:func:`window`): (size,
    longest, full)."""
    _, _, mx, n = window(spec, flat, h, e)
    return n, mx[np.arange(h.size), n - 1], np.minimum(n, spec.max_batch - 1) < e - h


def _batches(spec: GpuSpec, cum, cum2, slow, G: int, lane: np.ndarray, head: np.ndarray, n: np.ndarray,
             longest: np.ndarray, full: np.ndarray) -> Batches:
    """:class:`Batches` of (rows, K) cuts (``lane``: each row's; ``head`` the lane's own indices):
    the seconds by the service model, as :func:`_fifo_lanes` computes them (times
    ``slow[lane, step]``, bursts), and the billed tokens."""
    at = np.nonzero(n)
    ln, h, k = lane[at[0]], head[at], n[at]
    ts = None if cum is None else cum[ln, h + k] - cum[ln, h]  # None: padded (see _prefix)
    sq = None if cum is None else cum2[ln, h + k] - cum2[ln, h]
    nf = k.astype(np.float64)
    sec = spec.model.seconds(nf, ts, sq, longest[at])
    seconds, billed = np.zeros(n.shape), np.zeros(n.shape)
    seconds[at] = sec if slow is None else sec * slow[ln, h // G]
    billed[at] = _billed(spec, nf, ts, longest[at])
    return Batches(head, n, seconds, billed, full)


def _stack(cuts: List[tuple], rows: int):
    """Per batch position (rows active, head, size, longest, full) -> (rows, K) arrays."""
    K = len(cuts)
    out = (np.zeros((rows, K), dtype=np.int64), np.zeros((rows, K), dtype=np.int64), np.zeros((rows, K)),
           np.zeros((rows, K), dtype=bool))
    for k, (act, *cols) in enumerate(cuts):
        for a, c in zip(out, cols):
            a[act, k] = c
    return out


def plan(spec: GpuSpec, tok: np.ndarray, cum: Optional[np.ndarray], cum2: Optional[np.ndarray], G: int, t0: int,
         t1: int, slow: Optional[np.ndarray] = None) -> Plan:
    """Cut steps [t0, t1) of every lane (``tok``: (lanes, requests), G a step) into their chains
    from each step's first request (:func:`_window`, all rows at once); ``cum``, ``cum2``:
    :func:`racsim.pipeline.batcher._prefix` of ``tok``; ``slow``: bursts' (lanes, steps) factors."""
    lanes, N = tok.shape
    S = t1 - t0
    flat = tok.reshape(-1)
    # rows lane-major (lane * S + step): each row's next request and its step's end, as flat indices
    head = (np.arange(lanes, dtype=np.int64)[:, None] * N + np.arange(t0, t1, dtype=np.int64) * G).reshape(-1)
    end = head + G
    cuts = []
    act = np.arange(lanes * S)
    while act.size:
        h = head[act]
        n, m, f = _window(spec, flat, h, end[act])
        cuts.append((act, h, n, m, f))
        head[act] = h + n
        act = act[head[act] < end[act]]
    hh, nn, mm, full = _stack(cuts, lanes * S)
    hh[nn > 0] %= N  # flat indices to each lane's own
    b = _batches(spec, cum, cum2, slow, G, np.repeat(np.arange(lanes), S), hh, nn, mm, full)
    return Plan(t0, Batches(*(a.reshape(lanes, S, -1) for a in (b.head, b.n, b.seconds, b.billed, b.full))))


class Steps:
    """A FIFO pool of ``spec`` fed a step at a time (module docstring), state ``st`` as
    :func:`_fifo_lanes` keeps it: ``tok`` (lanes, requests), G requests a step, ``cum``, ``cum2``
    their prefix sums, ``slow`` bursts' (lanes, steps) factors or None, ``group_time`` (lanes,
    steps) each step's arrival where known (inf where not), which :func:`_fifo_lanes` reads for a
    step's last batch that meets the next step."""

    def __init__(self, spec: GpuSpec, tok: np.ndarray, cum, cum2, G: int, slow, st: _FifoLanes,
                 group_time: np.ndarray, faults=None):
        self.spec, self.tok, self.cum, self.cum2, self.G, self.slow = spec, tok, cum, cum2, G, slow
        self.st, self.group_time, self.faults = st, group_time, faults
        self.plan: Optional[Plan] = None

    def _plan(self, t: int) -> Batches:
        lanes, steps = self.group_time.shape
        if self.plan is None or not self.plan.t0 <= t < self.plan.t1:
            t1 = min(steps, t + plan_steps(lanes, self.G, self.spec.max_batch))
            self.plan = plan(self.spec, self.tok, self.cum, self.cum2, self.G, t, t1, self.slow)
        return self.plan.step(t)

    def step(self, t: int, now: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        """Serve step t's requests, arrived at ``now`` (lanes,), the next step's at ``nxt`` (inf:
        later than anything this step does, or none): every request of step t dispatched, a
        lane's last batch that meets ``nxt`` by :func:`_fifo_lanes`. Returns each lane's last
        completion (-inf: none). A pool with faults is served blocking only (``nxt`` inf: the
        optimizer waits for every result, re-sent ones included): :func:`serve_calm` where no
        server goes down or comes back, the rule with outages (:func:`serve_failing`) after."""
        st, G = self.st, self.G
        b = self._plan(t)
        start = st.head - t * G
        if (start != 0).any():  # lanes whose step begins inside: their own chains, joining the plan's
            b = self._joined(b, t, start)
        if self.faults is not None:
            if not np.isinf(nxt).all():
                raise ValueError("a pool with faults is served a step at a time when blocking only")
            serve_failing(self.spec, b, now, st, G, self.faults, serve_calm(self.spec, b, now, st, G, self.faults))
            return st.comp[:, t * G:(t + 1) * G].max(axis=1)
        last = serve(self.spec, b, now, nxt, st, G)
        meet = st.head < (t + 1) * G  # a last batch left for the general rule
        if meet.any():
            _fifo_lanes(self.spec, self.tok, self.cum, self.cum2, self.group_time, G, self.tok.shape[1], st,
                        self.slow, stop=np.where(meet, st.head + 1, st.head))
        return last

    def _joined(self, b: Batches, t: int, start: np.ndarray) -> Batches:
        """Step t's batches (lanes, K) for lanes whose next request is ``start`` (lanes,) into the
        step: the plan's chain ``b`` where 0; none where the step is all dispatched (>= G); else
        their own chain from there (:func:`_window`) until one of its batches ends where one of
        the plan's begins, then the plan's from that one."""
        N, G = self.tok.shape[1], self.G
        odd = np.flatnonzero((start > 0) & (start < G))
        count = (b.n[odd] > 0).sum(axis=1)  # the plan's batches, first in each row
        heads = np.where(b.n[odd] > 0, b.head[odd], N + 1)
        h = odd * N + t * G + start[odd]  # flat indices
        e = odd * N + (t + 1) * G
        flat = self.tok.reshape(-1)
        cuts, act, join = [], np.arange(odd.size), count.copy()
        while act.size:
            n, m, f = _window(self.spec, flat, h[act], e[act])
            cuts.append((act, h[act] - odd[act] * N, n, m, f))
            h[act] += n
            own = h[act] - odd[act] * N
            j = (heads[act] < own[:, None]).sum(axis=1)
            hit = (j < count[act]) & (heads[act, np.minimum(j, heads.shape[1] - 1)] == own)
            join[act[hit]] = j[hit]
            act = act[~hit & (h[act] < e[act])]
        hh, nn, mm, full = _stack(cuts, odd.size)
        mine = _batches(self.spec, self.cum, self.cum2, self.slow, G, odd, hh, nn, mm, full)
        P = (nn > 0).sum(axis=1)
        K = max(b.n.shape[1], int((P + count - join).max(initial=0)))
        cols = list(zip((b.head, b.n, b.seconds, b.billed, b.full),
                        (mine.head, mine.n, mine.seconds, mine.billed, mine.full)))
        out = []
        for plans, own in cols:
            o = np.zeros((b.n.shape[0], K), dtype=plans.dtype)
            o[:, :plans.shape[1]] = plans
            o[start >= G] = 0
            for i, lane in enumerate(odd):
                o[lane] = 0
                o[lane, :P[i]] = own[i, :P[i]]
                o[lane, P[i]:P[i] + count[i] - join[i]] = plans[lane, join[i]:count[i]]
            out.append(o)
        return Batches(*out)


def place(spec: GpuSpec, b: Batches, now: np.ndarray, nxt: np.ndarray, free: np.ndarray, last: np.ndarray):
    """Each lane's batches ``b`` (lanes, K), its step's requests arrived at ``now``, the next
    step's at ``nxt``, on replicas free at ``free`` (lanes, replicas; updated in place), the last
    dispatch at ``last``: each leaves at tau_k (module docstring) on the lowest-indexed replica
    free then, except a last batch whose tau_k would be >= ``nxt``, left undispatched. Returns
    (has, tau, end, rep, last): batch position-major (K, lanes) whether each batch leaves, its
    instant, end (-inf where none leaves) and replica; each lane's last dispatch."""
    n = b.n
    lanes = n.shape[0]
    used = np.flatnonzero(n.any(axis=0))
    K = int(used.max()) + 1 if used.size else 0
    # batch position-major (K, lanes): each position's row contiguous
    has = n[:, :K].T > 0
    full = b.full[:, :K].T
    ready = np.where(full, now, now + spec.max_wait)  # min(T_full, deadline)
    sec = np.ascontiguousarray(b.seconds[:, :K].T)
    every = has.all(axis=1)
    tail = (has & ~full).any(axis=1)  # a lane's last batch, which may meet the next step
    last = last.copy()
    tau, end, rep = np.zeros((K, lanes)), np.full((K, lanes), -np.inf), np.zeros((K, lanes), dtype=np.int64)
    rows = np.arange(lanes)
    for k in range(K):
        if every[k] and not tail[k]:  # the common case: a full batch on every lane
            tk = np.maximum(np.maximum(last, free.min(axis=1)), ready[k])
            r = (free <= tk[:, None]).argmax(axis=1)
            ek = tk + sec[k]
            free[rows, r] = ek
            last = tk
            tau[k], end[k], rep[k] = tk, ek, r
            continue
        act = np.flatnonzero(has[k])
        f = free[act]
        tk = np.maximum(np.maximum(last[act], f.min(axis=1)), ready[k, act])
        if tail[k]:
            go = full[k, act] | (tk < nxt[act])
            has[k, act[~go]] = False
            act, f, tk = act[go], f[go], tk[go]
        r = (f <= tk[:, None]).argmax(axis=1)
        ek = tk + sec[k, act]
        free[act, r] = ek
        last[act] = tk
        tau[k, act], end[k, act], rep[k, act] = tk, ek, r
    return has, tau, end, rep, last


def commit(b: Batches, has: np.ndarray, tau: np.ndarray, end: np.ndarray, rep: np.ndarray, st: _FifoLanes, G: int,
           work: bool = False) -> None:
    """Write the batches :func:`place` dispatched (``has``) into ``st`` as :func:`_fifo_lanes`
    does: dispatches, completions, the batch log (``work``: with each batch's seconds, as a pool
    with faults logs them), heads. Free times and last dispatches are the caller's."""
    k, ln = np.nonzero(has)  # batch position-major, as _fifo_lanes logs its iterations
    if ln.size:
        h, m, tk, ek = b.head[ln, k], b.n[ln, k], tau[k, ln], end[k, ln]
        st.record(("disp", "comp"), ln, h, m, tk, ek)
        st.flush()
        row = (ln, rep[k, ln], tk, ek, m, b.billed[ln, k], h // G)
        st.log.append((*row, b.seconds[ln, k]) if work else row)
        np.maximum.at(st.head, ln, h + m)


def serve(spec: GpuSpec, b: Batches, now: np.ndarray, nxt: np.ndarray, st: _FifoLanes, G: int) -> np.ndarray:
    """:func:`place` and :func:`commit` step t's batches on ``st``'s replicas; returns each
    lane's last completion (-inf: none)."""
    has, tau, end, rep, st.last[:] = place(spec, b, now, nxt, st.free, st.last)
    commit(b, has, tau, end, rep, st, G)
    return end.max(axis=0, initial=-np.inf)


def serve_calm(spec: GpuSpec, b: Batches, now: np.ndarray, st: _FifoLanes, G: int, faults) -> np.ndarray:
    """:func:`place` a step on a pool with faults where nothing changes: from each lane's first
    instant (its last dispatch or the step's arrival) to the next instant hi at which a server
    goes down or comes back (``faults.calm_lanes``), the servers up then are the pool, and every
    batch that ends before hi is the rule's (a replica down takes nothing before hi; one up
    fails no sooner). Commits each lane's batches up to the first that does not end before hi
    (no cut batch waits: a blocking step's are re-sent within it). Returns each lane's next
    batch position for :func:`serve_failing`."""
    lanes = b.n.shape[0]
    hi, up = faults.calm_lanes(np.arange(lanes), np.maximum(st.last, now))
    has, tau, end, rep, _ = place(spec, b, now, np.full(lanes, np.inf), np.where(up, st.free, np.inf), st.last)
    ok = (b.n[:, :has.shape[0]].T == 0) | (has & (end < hi))  # has: False where no replica is up (tau inf)
    ok = np.logical_and.accumulate(ok, axis=0)  # the prefix of each lane's batches that the rule agrees with
    has &= ok
    commit(b, has, tau, end, rep, st, G, work=True)
    k, ln = np.nonzero(has)
    np.maximum.at(st.free, (ln, rep[k, ln]), end[k, ln])
    kk = np.where(has, np.arange(has.shape[0])[:, None], -1).max(axis=0, initial=-1)  # each lane's last dispatch
    done = np.flatnonzero(kk >= 0)
    st.last[done] = tau[kk[done], done]
    return ok.sum(axis=0)


def serve_failing(spec: GpuSpec, b: Batches, now: np.ndarray, st: _FifoLanes, G: int, faults,
                  pos: np.ndarray) -> None:
    """Each lane's batches ``b`` from position ``pos`` (those before it dispatched:
    :func:`serve_calm`) on a pool whose replicas fail (``faults``, a faults.Timeline), by
    :func:`_fifo_lanes`'s rule with outages: a batch is ready at max(last dispatch, a_t [+ max_wait
    if not full]) and leaves at the first instant a replica is free and up (the lowest-indexed on
    a tie); its seconds run through outages (``on_failure: retry``/``lose``), or a failure cuts it
    and it is re-sent (``resend``: first, when a replica takes it by the new batch's instant,
    :func:`_resend_lanes`, so that each lane goes through its batches at its own pace; those
    still waiting when the step's batches are all dispatched are re-sent then). Updates ``st``
    as :func:`_fifo_lanes` does."""
    count = (b.n > 0).sum(axis=1)
    resend = faults.spec.resend
    if resend and st.again is None:
        st.again = _Again.new(count.size)
    while True:
        act = np.flatnonzero(pos < count)
        if act.size == 0:
            break
        p = pos[act]
        full, sec = b.full[act, p], b.seconds[act, p]
        ready = np.maximum(st.last[act], np.where(full, now[act], now[act] + spec.max_wait))
        avail = faults.next_up_lanes(act, np.maximum(st.free[act], ready[:, None]))
        tau = avail.min(axis=1)
        if resend and st.again.waiting:  # a cut batch leaves first if a replica takes it by tau
            wait = np.intersect1d(st.again.lanes(), act, assume_unique=True)
            if wait.size:
                go = _resend_ahead(spec, st, faults, act, tau, wait)
                act, p, avail, tau, sec = act[go], p[go], avail[go], tau[go], sec[go]
                if act.size == 0:
                    continue
        h, n = b.head[act, p], b.n[act, p]
        _dispatch_failing(spec, st, faults, act, avail, tau, h, n, sec, b.billed[act, p], h // G)
        pos[act] += 1
    while resend and st.again.waiting:  # nothing comes after: every cut batch is re-sent now
        wait = st.again.lanes()
        _resend_lanes(spec, st, faults, wait, np.full(wait.size, np.inf))
    st.flush()
