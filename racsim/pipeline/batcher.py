"""GPU-backed reward models (channel kind ``gpu_rm``): the batcher in front of replicas of an RM.

Each sample is ``sequences_per_sample`` requests with drawn token lengths; a batch
holds at most ``max_batch`` sequences and ``token_budget`` tokens (padded or
packed), taken in FIFO or shortest-first order, and leaves for an idle replica
when it is full or its oldest request has waited ``max_wait_s``. Everything that
happens at one instant is applied before the batcher decides.
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

from racsim.pipeline.service import build_service


@dataclass(frozen=True)
class GpuSpec:
    """What both engines need to serve a gpu_rm channel (built from its ``rm`` config)."""

    replicas: int  # gpus / tp
    max_batch: int
    budget: float  # tokens per batch (padded or packed, as ``padded`` says)
    max_wait: float  # seconds a request may wait for its batch to fill
    order: str  # fifo | shortest
    padded: bool
    model: Any  # racsim.pipeline.service.ServiceModel
    seqs: int  # sequences (requests) per pipeline sample
    chunked: bool = False  # continuous batching with chunked prefill (racsim/pipeline/cbatch.py)


def gpu_spec(rm: Any, key: str) -> GpuSpec:
    return GpuSpec(replicas=int(rm.gpus) // int(rm.tp), max_batch=int(rm.max_batch), budget=float(rm.token_budget),
                   max_wait=float(rm.max_wait_s), order=str(rm.order), padded=bool(rm.padded),
                   model=build_service(rm, key), seqs=int(rm.sequences_per_sample))


def _billed(spec: GpuSpec, count, tok_sum, mx):
    """Tokens a batch counts against the budget: count x longest when padded, else the sum."""
    return count * mx if spec.padded else tok_sum


@dataclass(frozen=True)
class _Batch:
    """A batch the dispatch rule sends off: the replica, its requests, its service
    seconds, the tokens it bills against the budget and the group of its oldest request."""

    replica: int
    ids: List[int]
    seconds: float
    billed: float
    group: int
    new: Optional[List[int]] = None  # requests dispatched for the first time (None: all of ids)
    last: Optional[List[int]] = None  # requests whose last tokens it scores (None: all of ids)

    @property
    def starts(self) -> List[int]:
        return self.ids if self.new is None else self.new

    @property
    def ends(self) -> List[int]:
        return self.ids if self.last is None else self.last


class _Waiting:
    """The requests a batcher holds, in the order it serves them: request index
    (fifo) or (tokens, index) (shortest first), and the batcher's dispatch rule
    (:meth:`dispatch`), which both event-loop engines call."""

    def __init__(self, spec: GpuSpec, tokens: List[float], group: int, slow: Optional[Sequence[float]] = None):
        self.spec, self.tok, self.G = spec, tokens, group
        self.slow = slow  # per group: factor on the seconds of a batch whose oldest request is of that group
        self.fifo = spec.order == "fifo"
        # FIFO: a deque of request ids (a backlog of many requests pops from its left in O(1));
        # shortest first: a sorted list of (tokens, id)
        self.keys: Any = deque() if self.fifo else []
        self.in_group: Dict[int, int] = {}
        self.groups: Deque[int] = deque()  # groups with requests waiting, oldest first
        # other tenants' requests (racsim/pipeline/background.py): request k is id and group -(k + 1)
        self.other_tok: Dict[int, float] = {}
        self.other_arr: Dict[int, float] = {}

    def __len__(self) -> int:
        return len(self.keys)

    def admit(self, g: int) -> None:
        self._admit(range(g * self.G, (g + 1) * self.G), g, self.G)

    def admit_other(self, k: int, tokens: float, arrival: float) -> None:
        """Another tenant's request ``k`` (its ``tokens``, arrived at ``arrival``): a group of one,
        id ``-(k + 1)``, batched with the learner's in the same order."""
        j = -(k + 1)
        self.other_tok[j], self.other_arr[j] = tokens, arrival
        self._admit((j,), j, 1)

    def _admit(self, ids, g: int, size: int) -> None:
        if self.fifo:
            self.keys.extend(ids)
        else:
            for j in ids:
                bisect.insort(self.keys, (self.tokens(j), j))
        self.in_group[g] = size
        self.groups.append(g)

    def tokens(self, j: int) -> float:
        """Request ``j``'s tokens (the learner's, or another tenant's for j < 0)."""
        return self.tok[j] if j >= 0 else self.other_tok[j]

    def group_of(self, j: int) -> int:
        return j // self.G if j >= 0 else j

    def oldest(self) -> int:
        """Group of the longest-waiting request."""
        while self.in_group[self.groups[0]] == 0:
            self.groups.popleft()
        return self.groups[0]

    def candidate(self):
        """(ids, count, token sum, sum of squares, longest, full): the batch the
        batcher would dispatch now; full when a limit stopped it."""
        s = self.spec
        ids: List[int] = []
        ts = sq = mx = 0.0
        full = False
        for key in itertools.islice(self.keys, s.max_batch + 1):
            j = key if self.fifo else key[1]
            L = self.tok[j] if j >= 0 else self.other_tok[j]
            n, m = len(ids) + 1, max(mx, L)
            cost = n * m if s.padded else ts + L
            if ids and (n > s.max_batch or cost > s.budget):
                full = True
                break
            ids.append(j)
            ts, sq, mx = ts + L, sq + L * L, m
        return ids, len(ids), ts, sq, mx, full or len(ids) == s.max_batch

    def remove(self, ids: List[int]) -> None:
        if self.fifo:
            for _ in ids:
                self.keys.popleft()
        else:
            del self.keys[: len(ids)]
        for j in ids:
            self.in_group[self.group_of(j)] -= 1

    def deadline(self, arrival: Sequence[float]) -> float:
        """When the oldest waiting request's batch leaves unfilled; ``arrival[g]``: group g's arrival."""
        g = self.oldest()
        return (arrival[g] if g >= 0 else self.other_arr[g]) + self.spec.max_wait

    def dispatch(self, idle: Sequence[int], tau: float, arrival: Sequence[float]) -> List[_Batch]:
        """The dispatch rule at instant ``tau``, once everything of that instant is in
        (arrivals admitted, finished replicas free): while requests wait and a replica
        of ``idle`` is left (ascending; each takes one batch at most, service seconds
        being positive), the candidate batch leaves on it if it is full or its oldest
        request's deadline has come (``arrival[g]``: group g's arrival). Removes what
        leaves; the engine starts each batch on its replica at ``tau`` for its
        ``seconds``. :func:`_fifo_lanes` is the vectorised form for FIFO order."""
        out: List[_Batch] = []
        for r in idle:
            if not self.keys:
                break
            ids, n, ts, sq, mx, full = self.candidate()
            if not (full or self.deadline(arrival) <= tau):
                break
            self.remove(ids)
            out.append(self._batch(r, ids, n, ts, sq, mx))
        return out

    def _batch(self, r: int, ids: List[int], n: int, ts: float, sq: float, mx: float) -> _Batch:
        """The batch of ``ids`` (a :meth:`candidate`'s statistics) on replica ``r``: its seconds
        by the service model (times its oldest group's bursts factor), its billed tokens. Its group:
        its oldest learner request's (-1: other tenants' requests only; no bursts with them)."""
        seconds = float(self.spec.model.seconds(np.float64(n), ts, sq, mx))
        first = min(ids)
        if first < 0:  # other tenants' requests among them
            first = min((j for j in ids if j >= 0), default=-1)
        g = first // self.G if first >= 0 else -1
        if self.slow is not None:
            seconds = seconds * self.slow[g]
        return _Batch(r, ids, seconds, _billed(self.spec, float(n), ts, mx), g)


WRITE_EVERY = 256  # iterations of _fifo_lanes whose requests' times are written at once


@dataclass
class _FifoLanes:
    """State of a FIFO batcher on every lane for :func:`_fifo_lanes`."""

    head: np.ndarray  # (lanes,) first request not dispatched
    free: np.ndarray  # (lanes, replicas) when each replica falls free
    last: np.ndarray  # (lanes,) instant of the last dispatch
    disp: np.ndarray  # (lanes, requests)
    comp: np.ndarray
    log: list
    lost: Optional[np.ndarray] = None  # (lanes, requests) lost to a failure (a pool with faults)
    again: Optional["_Again"] = None  # batches cut by a failure, to re-send (on_failure: resend)
    # requests' times not written yet, per columns written: (lanes, head, size, *a value per column)
    # of each iteration's batches (:meth:`record`, :meth:`flush`)
    writes: Dict[Tuple[str, ...], list] = field(default_factory=dict)

    def record(self, columns: Tuple[str, ...], lanes, head, size, *values) -> None:
        """Batches [head, head + size) of ``lanes`` whose requests take ``values`` in ``columns``:
        written by :meth:`flush` (once per WRITE_EVERY iterations: one scatter for many batches)."""
        self.writes.setdefault(columns, []).append((lanes, head, size, *values))

    def flush(self) -> None:
        """Write every :meth:`record`: each request its batch's value in each column."""
        for columns, recs in self.writes.items():
            if not recs:
                continue
            cols = [np.concatenate(c) for c in zip(*recs)]
            recs.clear()
            lane, h, n = cols[:3]
            if lane.size == 0:  # an iteration's batches all cut by a failure: nothing to write
                continue
            # the batches in the order of their first request's flat index (the columns are C-ordered
            # (lanes, requests)); a run of batches that follow each other there is one slice
            first = lane * self.disp.shape[1] + h
            order = np.argsort(first, kind="stable")
            first, n = first[order], n[order]
            last = first + n
            cuts = np.flatnonzero(first[1:] != last[:-1]) + 1
            lo, hi = first[np.r_[0, cuts]], last[np.r_[cuts - 1, n.size - 1]]
            at = np.r_[0, np.cumsum(hi - lo)]
            for name, v in zip(columns, cols[3:]):
                vals, out = np.repeat(v[order], n), getattr(self, name).reshape(-1)
                for a, b, i, j in zip(lo.tolist(), hi.tolist(), at[:-1].tolist(), at[1:].tolist()):
                    out[a:b] = vals[i:j]

    @classmethod
    def new(cls, lanes: int, requests: int, replicas: int) -> "_FifoLanes":
        return cls(np.zeros(lanes, dtype=np.int64), np.zeros((lanes, replicas)), np.zeros(lanes),
                   np.full((lanes, requests), np.nan), np.full((lanes, requests), np.inf), [])


@dataclass
class _Again:
    """Per lane, the batches a failure cut that wait to be re-sent (``on_failure: resend``), in
    slots (lanes, P): the cut instant (inf: an empty slot), the replica it was cut on, its
    requests [head, head + n), seconds, billed tokens, group and re-sends made so far."""

    d: np.ndarray
    r: np.ndarray
    h: np.ndarray
    n: np.ndarray
    sec: np.ndarray
    billed: np.ndarray
    group: np.ndarray
    tries: np.ndarray
    waiting: int = 0  # slots filled

    @classmethod
    def new(cls, lanes: int) -> "_Again":
        i, f = np.zeros((lanes, 1), dtype=np.int64), np.zeros((lanes, 1))
        return cls(np.full((lanes, 1), np.inf), i, i.copy(), i.copy(), f, f.copy(), i.copy(), i.copy())

    def lanes(self) -> np.ndarray:
        """The lanes with a cut batch waiting."""
        return np.flatnonzero(np.isfinite(self.d).any(axis=1)) if self.waiting else np.zeros(0, dtype=np.int64)

    def first(self, lanes: np.ndarray) -> np.ndarray:
        """Each lane's next batch to re-send: the earliest cut, then the lowest replica (a slot index)."""
        d = self.d[lanes]
        return np.where(d == d.min(axis=1)[:, None], self.r[lanes], np.iinfo(np.int64).max).argmin(axis=1)

    def put(self, lanes: np.ndarray, d, r, h, n, sec, billed, group, tries) -> None:
        """Queue a cut batch on each of ``lanes`` (distinct) in an empty slot (one more column if none)."""
        empty = np.isinf(self.d[lanes])
        if not empty.any(axis=1).all():
            for k in ("d", "r", "h", "n", "sec", "billed", "group", "tries"):
                a = getattr(self, k)
                setattr(self, k, np.hstack([a, np.full((a.shape[0], 1), np.inf if k == "d" else 0, dtype=a.dtype)]))
            empty = np.isinf(self.d[lanes])
        j = empty.argmax(axis=1)
        self.waiting += lanes.size
        for k, v in zip(("d", "r", "h", "n", "sec", "billed", "group", "tries"), (d, r, h, n, sec, billed, group, tries)):
            getattr(self, k)[lanes, j] = v


def _resend_lanes(spec: GpuSpec, st: "_FifoLanes", faults, lanes: np.ndarray, before: np.ndarray) -> np.ndarray:
    """Re-send, on each of ``lanes`` (with a cut batch waiting), its next cut batch if a replica
    takes it at or before ``before`` (the instant the lane's next new batch would leave): at
    tau = the first instant >= its cut at which a replica is free and up (the lowest index on a
    tie), ahead of new batches, from scratch (:func:`_attempt`). Returns the lanes that did."""
    ag = st.again
    j = ag.first(lanes)
    avail = faults.next_up_lanes(lanes, np.maximum(st.free[lanes], ag.d[lanes, j][:, None]))
    tau = avail.min(axis=1)
    go = tau <= before
    lanes, j, avail, tau = lanes[go], j[go], avail[go], tau[go]
    if lanes.size:
        r = np.argmax(avail == tau[:, None], axis=1)
        h, n, tries = ag.h[lanes, j], ag.n[lanes, j], ag.tries[lanes, j]
        ag.d[lanes, j] = np.inf  # the slot is free again (refilled if cut once more)
        ag.waiting -= lanes.size
        _attempt(spec, st, faults, lanes, r, tau, h, n, ag.sec[lanes, j], ag.billed[lanes, j], ag.group[lanes, j],
                 tries)
    return lanes


def _resend_ahead(spec: GpuSpec, st: "_FifoLanes", faults, act: np.ndarray, tau: np.ndarray,
                  wait: np.ndarray) -> np.ndarray:
    """Lanes ``wait`` have a cut batch waiting; lanes ``act`` (sorted) a new batch leaving at ``tau``:
    each cut batch leaves first if a replica takes it by its lane's new batch (any time, on a lane
    with none: :func:`_resend_lanes`). Returns which of ``act`` still send their new batch now."""
    before = np.full(st.head.size, np.inf)
    before[act] = tau
    return ~np.isin(act, _resend_lanes(spec, st, faults, wait, before[wait]))


def _dispatch_failing(spec: GpuSpec, st: "_FifoLanes", faults, lanes, avail, tau, h, n, seconds, billed,
                      group) -> None:
    """New batches [h, h + n) of ``lanes`` leave at ``tau`` on a pool with faults, each on the
    lowest-indexed replica that takes it then (``avail``: when each replica could): an attempt
    under ``on_failure: resend`` (:func:`_attempt`), else run through its replica's outages
    (``Timeline.serve_lanes``); logged, the lanes' heads and last dispatches moved on."""
    r = np.argmax(avail == tau[:, None], axis=1)
    st.head[lanes] = h + n
    st.last[lanes] = tau
    if faults.spec.resend:
        st.record(("disp",), lanes, h, n, tau)
        _attempt(spec, st, faults, lanes, r, tau, h, n, seconds, billed, group, np.zeros(lanes.size, dtype=np.int64))
        return
    e, lost = faults.serve_lanes(lanes, r, tau, seconds)
    st.free[lanes, r] = e
    st.record(("disp", "comp", "lost"), lanes, h, n, tau, e, lost)
    st.log.append((lanes, r, tau, e, n, billed, group, np.where(lost, 0.0, seconds)))


def _attempt(spec: GpuSpec, st: "_FifoLanes", faults, lanes, r, tau, h, n, seconds, billed, group, tries) -> None:
    """Batches [h, h + n) of ``lanes`` start on replicas ``r`` at ``tau`` under ``on_failure: resend``:
    each completes, or is cut at its replica's next failure d (its work lost, the replica free
    there) and queued to re-send from d, or past ``retries`` re-sends lost at d. Logs the attempt."""
    d, _ = faults.outage_lanes(lanes, r, tau)
    fin = tau + seconds
    ok = fin <= d
    e = np.where(ok, fin, d)
    lost = ~ok & (tries == faults.spec.retries)
    st.free[lanes, r] = e
    done = ok | lost
    if done.all():  # the common case: nothing cut
        st.record(("comp", "lost"), lanes, h, n, e, lost)
    else:
        st.record(("comp", "lost"), lanes[done], h[done], n[done], e[done], lost[done])
        cut = ~done
        st.again.put(lanes[cut], d[cut], r[cut], h[cut], n[cut], seconds[cut], billed[cut], group[cut], tries[cut] + 1)
    st.log.append((lanes, r, tau, e, n, billed, group, np.where(ok, seconds, 0.0)))


def window(spec: GpuSpec, flat: np.ndarray, h: np.ndarray, e: np.ndarray):
    """The window of ``max_batch`` requests from each flat index ``h`` of ``flat`` (the lanes'
    requests, C-ordered), those before ``e`` in view: (its flat indices, in view, running
    longest, how many fit ``max_batch`` and the token budget, the first always). Past ``e`` a
    window reads other requests (clipped at the last one): out of view, and the running figures
    are prefix ones, so those in view read only their own."""
    win = h[:, None] + np.arange(spec.max_batch)
    valid = win < e[:, None]
    L = flat.take(win, mode="clip")
    mx = np.maximum.accumulate(L, axis=1)
    cost = np.arange(1.0, spec.max_batch + 1.0) * mx if spec.padded else np.cumsum(L, axis=1)
    fits = valid & (cost <= spec.budget)
    fits[:, 0] = True
    return win, valid, mx, fits.sum(axis=1)


def _candidates(spec: GpuSpec, tok: np.ndarray, group_time: np.ndarray, G: int, end: int, st: "_FifoLanes",
                faults, act: np.ndarray):
    """The next new batch of each lane of ``act`` by :func:`_fifo_lanes`'s rule, per lane: its head,
    window (running longest, how many fit, arrivals: inf past ``end``), the
    replicas' free times, when each replica could take it (with faults; else their free times,
    unused) and its instant tau. ``tok`` and ``group_time`` read flat (fastest C-contiguous)."""
    N, M = tok.shape[1], spec.max_batch
    rows = np.arange(act.size)
    h = st.head[act]
    base = act * N
    win, valid, mx, n_lim = window(spec, tok.reshape(-1), base + h, base + end)
    at = np.minimum(win - base[:, None], N - 1)
    # arrival of each request of the window (inf past end: not known yet)
    t_win = group_time.take((at if G == 1 else at // G) + (act * group_time.shape[1])[:, None])
    if not valid.all():
        t_win[~valid] = np.inf
    # T_full: the arrival of the request that fills the batch (the max_batch-th, or the first that does
    # not fit), inf if it is not known; a full window's last request is valid, as everything that fits
    t_full = t_win[rows, np.minimum(n_lim, M - 1)]
    deadline = t_win[:, 0] + spec.max_wait
    free = st.free[act]
    if faults is None:
        avail = free
        tau = np.maximum(np.maximum(st.last[act], free.min(axis=1)), np.minimum(t_full, deadline))
    else:
        ready = np.maximum(st.last[act], np.minimum(t_full, deadline))
        avail = faults.next_up_lanes(act, np.maximum(free, ready[:, None]))  # (lanes, replicas)
        tau = avail.min(axis=1)
    return h, mx, n_lim, t_win, free, avail, tau


def _fifo_lanes(spec: GpuSpec, tok: np.ndarray, cum: np.ndarray, cum2: np.ndarray, group_time: np.ndarray,
                G: int, end: int, st: _FifoLanes, slow: Optional[np.ndarray] = None, faults=None,
                stop: Optional[np.ndarray] = None, tick: Optional[Callable[[float], None]] = None) -> None:
    """The dispatch rule of :meth:`_Waiting.dispatch` for a FIFO batcher in closed
    form, vectorised over lanes: a fast path of the same rule, not a second one.
    Dispatches every request below index ``end``, one batch per lane per iteration.
    The k-th batch from head h leaves at

        tau_k = max(tau_{k-1}, earliest free replica, min(T_full, a_h + max_wait))

    where T_full is the arrival of the request that makes the batch full (the
    max_batch-th, or the first that does not fit; inf if none below ``end``), and
    takes every request from h that has arrived by tau_k, up to the limits, on the
    lowest-indexed free replica. It equals the event loop that calls the rule
    (lanes' ``_LaneServer``; tests/test_gpu_rm.py checks it bit for bit).
    ``group_time``: (lanes, groups) arrival of each group of G requests (inf: not yet known), not
    decreasing along the groups (batch mode: one group per step; arrivals over time: one per
    sample, in ready order);
    ``slow``: (lanes, groups) factor on the seconds of a batch whose first request is of that group.
    ``faults``: a faults.Timeline (replicas go down): a replica takes a batch at the first
    instant >= its free time and the batch's ready time min(T_full, a_h + max_wait) at which
    it is up (tau_k is the earliest over replicas, the lowest-indexed on a tie), and the
    batch runs through its replica's outages (``Timeline.serve``); ``st.lost`` says what a failure lost.
    With ``on_failure: resend`` a batch cut by a failure waits in ``st.again`` and is re-sent
    (:func:`_resend_lanes`) before a new batch that would leave at the same instant or later.
    ``stop`` (lanes,): dispatch each lane's requests below it only, those up to ``end`` in view
    (a pool shared with other tenants, racsim/pipeline/shared.py). ``tick(share)``: told the share of
    the requests dispatched, every WRITE_EVERY iterations (progress inside a long serving).
    """
    resend = faults is not None and faults.spec.resend
    if resend and st.again is None:
        st.again = _Again.new(st.head.size)
    upto = end if stop is None else stop
    whole = max(float(np.broadcast_to(upto, st.head.shape).sum()), 1.0)  # requests to dispatch, all lanes
    for k in itertools.count(1):
        if k % WRITE_EVERY == 0:
            st.flush()
            if tick is not None:
                tick(float(np.minimum(st.head, upto).sum()) / whole)
        act = np.flatnonzero(st.head < upto)
        wait = st.again.lanes() if resend else act[:0]
        if act.size == 0 and wait.size == 0:
            st.flush()
            return
        if act.size:
            cand = _candidates(spec, tok, group_time, G, end, st, faults, act)
        if wait.size:  # lanes with a cut batch waiting: it leaves first if a replica takes it by their new batch's tau
            keep = _resend_ahead(spec, st, faults, act, cand[-1] if act.size else act[:0], wait)
            act = act[keep]
            if act.size == 0:
                continue
            cand = tuple(x[keep] for x in cand)
        rows = np.arange(act.size)
        h, mx, n_lim, t_win, free, avail, tau = cand
        # arrived by tau: a prefix of the window (arrival times do not decrease along the requests)
        n = np.minimum(n_lim, (t_win <= tau[:, None]).sum(axis=1))
        ts = None if cum is None else cum[act, h + n] - cum[act, h]  # None: padded (see _prefix)
        sq = None if cum is None else cum2[act, h + n] - cum2[act, h]
        m = mx[rows, n - 1]
        seconds = spec.model.seconds(n.astype(np.float64), ts, sq, m)
        seconds = seconds if slow is None else seconds * slow[act, h // G]
        billed = _billed(spec, n.astype(np.float64), ts, m)
        if faults is not None:
            _dispatch_failing(spec, st, faults, act, avail, tau, h, n, seconds, billed, h // G)
            continue
        e = tau + seconds
        r = np.argmax(free <= tau[:, None], axis=1)
        free[rows, r] = e
        st.free[act] = free
        st.record(("disp", "comp"), act, h, n, tau, e)
        st.log.append((act, r, tau, e, n, billed, h // G))
        st.head[act] = h + n
        st.last[act] = tau


def _prefix(tok: np.ndarray, padded: bool = False):
    """Each lane's prefix sums of its requests' tokens and of their squares, from 0: (lanes, N + 1);
    (None, None) for ``padded`` batches, whose seconds and budget read count x longest only (the
    service models and :func:`_billed`)."""
    if padded:
        return None, None
    out = np.empty((2, tok.shape[0], tok.shape[1] + 1))
    out[:, :, 0] = 0.0
    np.cumsum(tok, axis=1, out=out[0, :, 1:])
    np.cumsum(tok * tok, axis=1, out=out[1, :, 1:])
    return out[0], out[1]


def _batch_log(rows: list, replicas: int) -> Dict[str, np.ndarray]:
    """Columns of a batch log, sorted by (lane, start, replica); ``replicas`` the pool's size.
    A row (one attempt of a batch on a replica) is (lane, replica, start, end, size, tokens,
    step[, work]): ``work`` the seconds of service that delivered the batch's results, the last
    ``work`` seconds before ``end``: a pool with faults logs its batches' seconds (0 for an attempt
    cut or lost by a failure); without, every row's is ``end - start``."""
    if rows:
        rows = [r if len(r) > 7 else (*r, np.asarray(r[3]) - np.asarray(r[2])) for r in rows]
        lane, rep, start, end, size, tokens, step, work = (np.concatenate(c) for c in zip(*rows))
    else:
        lane = rep = size = step = np.zeros(0, dtype=np.int64)
        start = end = tokens = work = np.zeros(0)
    order = _log_order(lane, start, rep)
    return {"lane": lane.astype(np.int64)[order], "replica": rep.astype(np.int64)[order],
            "start": start.astype(np.float64)[order], "end": end.astype(np.float64)[order],
            "size": size.astype(np.int64)[order], "tokens": tokens.astype(np.float64)[order],
            "step": step.astype(np.int64)[order], "work": work.astype(np.float64)[order],
            "replicas": np.array(replicas, dtype=np.int64)}


def _log_order(lane: np.ndarray, start: np.ndarray, rep: np.ndarray) -> np.ndarray:
    """``np.lexsort((rep, start, lane))``: both sorts are stable, so a stable sort by lane alone
    (a radix sort below 2^16 lanes) is the same order when each lane's rows already come in
    (start, replica) order, as the engines log iterations; the full sort otherwise."""
    small = lane.size and 0 <= lane.min() and lane.max() < 1 << 16
    order = np.argsort(lane.astype(np.uint16) if small else lane, kind="stable")
    l, s, r = lane[order], start[order], rep[order]
    if np.all((l[1:] != l[:-1]) | (s[1:] > s[:-1]) | ((s[1:] == s[:-1]) & (r[1:] >= r[:-1]))):
        return order
    return np.lexsort((rep, start, lane))


def _per_sample(disp: np.ndarray, comp: np.ndarray, shape):
    """Requests (lanes, steps * batch * seqs) -> per sample (first dispatch, last completion)."""
    d = disp.reshape(shape)
    c = comp.reshape(shape)
    return d.min(axis=-1), c.max(axis=-1)
