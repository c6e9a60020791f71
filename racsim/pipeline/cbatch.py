"""Continuous batching for gpu_rm pools (``rm.batching: continuous``), beside static batches.

Static batching (``rm.batching: static``, the default, racsim/pipeline/batcher.py)
forms a batch and holds it until it is full or its oldest request has waited
``max_wait_s``, padded or packed, as a Hugging Face pipeline or a Triton
dynamic batcher does. Continuous batching is iteration-level scheduling, as
vLLM and SGLang (and TGI's router) schedule prefill-only pooling models such as
reward models: whenever a replica is free, one iteration takes the waiting
requests in ``order`` up to ``token_budget`` packed tokens and ``max_batch``
sequences at once, without waiting to fill (``max_wait_s`` and ``padded`` do
not apply: varlen attention packs the tokens). A request longer than the
budget runs alone, in one iteration.

With ``rm.chunked_prefill`` (vLLM's chunked prefill, SGLang's
``chunked_prefill_size``), the request that does not fit the budget left in an
iteration is split: its first ``budget left`` tokens are scored in this
iteration, and its rest opens the next iteration on the same replica (chunk
by chunk, if still over the budget). A request is done when its last chunk
is; its first dispatch is its first chunk's. An iteration's seconds come from
the channel's service model on its chunks (racsim/pipeline/service.py), a chunk
of ``l`` tokens after ``c`` tokens of its request already scored counting

    tokens  = l
    squares = (c + l)^2 - c^2 = l * (l + 2 c)

so the attention term (``2 layers d_model squares``) of a chunk counts its
context, the tokens already processed plus the chunk, and a request's chunks
add up to its unchunked cost L^2.

Without chunking, continuous batching of prefill-only requests is the static
rule with ``max_wait_s = 0`` on packed batches (a replica that falls free takes
what waits, and only then), so :func:`serving_spec` hands that spec to the
static machinery, vectorised FIFO path included; with chunking,
:class:`_Chunked` is the dispatch rule both event-loop engines call, and
:func:`_chunked_lanes` its vectorised form for FIFO order in the lanes engine.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from racsim.pipeline.batcher import GpuSpec, _Batch, _fifo_lanes, _FifoLanes, _prefix, _Waiting, gpu_spec, window
from racsim.pipeline.rangemax import RangeMax


def serving_spec(rm: Any, key: str) -> GpuSpec:
    """The :class:`GpuSpec` of an RM config: :func:`gpu_spec`, turned continuous
    (packed, no waiting to fill, ``chunked`` as ``rm.chunked_prefill``) when
    ``rm.batching`` is continuous."""
    spec = gpu_spec(rm, key)
    if rm.batching != "continuous":
        return spec
    model = copy.copy(spec.model)
    model.padded = False  # continuous batches pack their tokens
    return GpuSpec(**{**spec.__dict__, "max_wait": 0.0, "padded": False, "model": model,
                      "chunked": bool(rm.chunked_prefill)})


def chunk_squares(length: float, context: float) -> float:
    """The attention term of a chunk of ``length`` tokens after ``context`` tokens of
    its request: (context + length)^2 - context^2 (module docstring)."""
    return length * (length + 2.0 * context)


def waiting(spec: GpuSpec, tokens: np.ndarray, group: int, slow: Optional[np.ndarray] = None) -> _Waiting:
    """The waiting list and dispatch rule a server of ``spec`` uses, for one lane's request
    ``tokens`` (``slow``: bursts' per-group factor on batch seconds, or None; validation
    refuses bursts with chunked prefill)."""
    tok = np.asarray(tokens).tolist()
    if spec.chunked:
        return _Chunked(spec, tok, group)
    return _Waiting(spec, tok, group, None if slow is None else np.asarray(slow).tolist())


class _Chunked(_Waiting):
    """Continuous batching with chunked prefill (module docstring): the waiting
    requests, in ``order``, and per replica the request whose rest it scores next."""

    def __init__(self, spec: GpuSpec, tokens: List[float], group: int):
        super().__init__(spec, tokens, group)
        self.carry: Dict[int, Tuple[int, float]] = {}  # replica -> (request, tokens already scored)

    def __len__(self) -> int:
        return len(self.keys) + len(self.carry)

    def deadline(self, arrival: Sequence[float]) -> float:
        """Never: an iteration does not wait to fill."""
        return math.inf

    def dispatch(self, idle: Sequence[int], tau: float, arrival: Sequence[float]) -> List[_Batch]:
        """At instant ``tau``, each replica of ``idle`` (ascending) with work runs one
        iteration: its carried request's rest first, then waiting requests in order
        while sequences and budget are left, the one that does not fit split."""
        out: List[_Batch] = []
        s = self.spec
        for r in idle:
            if not self.keys and r not in self.carry:
                continue
            ids: List[int] = []
            new: List[int] = []
            last: List[int] = []
            room, ts, sq, mx = s.budget, 0.0, 0.0, 0.0
            head = self.carry.pop(r, None)  # (request, tokens already scored)
            while room > 0 and len(ids) < s.max_batch and (head is not None or self.keys):
                if head is None:
                    key = self.keys[0]
                    head = (key if self.fifo else key[1], 0.0)
                    self.remove([head[0]])
                    new.append(head[0])
                (j, done), head = head, None
                size = min(self.tok[j] - done, room)
                ids.append(j)
                ts, sq, mx, room = ts + size, sq + chunk_squares(size, done), max(mx, size), room - size
                if done + size < self.tok[j]:
                    self.carry[r] = (j, done + size)
                    break
                last.append(j)
            seconds = float(s.model.seconds(np.float64(len(ids)), ts, sq, mx))
            out.append(_Batch(r, ids, seconds, ts, min(ids) // self.G, new, last))
        return out


@dataclass
class _ChunkedLanes(_FifoLanes):
    """State of a FIFO chunked-prefill pool on every lane for :func:`_chunked_lanes`:
    :class:`_FifoLanes` and, per replica, the request whose rest it scores next (-1:
    none) and how many of its tokens are scored; ``tab``: the lanes' :class:`_Tables`."""

    carry: np.ndarray = None  # (lanes, replicas) request index or -1
    done: np.ndarray = None  # (lanes, replicas) its tokens scored so far
    tab: "_Tables" = None

    @classmethod
    def new(cls, lanes: int, requests: int, replicas: int) -> "_ChunkedLanes":
        st = super().new(lanes, requests, replicas)
        st.carry = np.full((lanes, replicas), -1, dtype=np.int64)
        st.done = np.zeros((lanes, replicas))
        return st


class _Tables:
    """Every lane's requests flattened, lane i's N + 1 entries from i (N + 1) on (a request's
    flat index): ``flat`` the prefix sums of tokens shifted to ascend across lanes (then a
    sentinel past them all), ``cum2`` those of squares, ``tok`` the tokens (0 at each lane's
    end), ``range_max(lo, n)`` the longest of n requests from flat index lo
    (:class:`RangeMax`), ``tmin`` the fewest tokens of a request. Tokens are integers: every
    sum and difference here is exact."""

    def __init__(self, tok: np.ndarray, cum: np.ndarray, cum2: np.ndarray, budget: float, max_batch: int):
        lanes, N = tok.shape
        step = float(cum[:, -1].max()) + budget + 1.0
        self.flat = np.append((cum + np.arange(lanes)[:, None] * step).ravel(), lanes * step + budget)
        self.cum2 = cum2.ravel()
        self.tok = np.hstack([tok, np.zeros((lanes, 1))]).ravel()
        self.tmin = float(tok.min())
        self.range_max = RangeMax(self.tok, min(max_batch, N))  # a range holds at most N requests


def lanes_state(spec: GpuSpec, lanes: int, requests: int):
    """The state the vectorised FIFO rule of ``spec`` keeps (see :func:`fifo_lanes`)."""
    return (_ChunkedLanes if spec.chunked else _FifoLanes).new(lanes, requests, spec.replicas)


def fifo_lanes(spec: GpuSpec, tok, cum, cum2, group_time, G: int, end: int, st, slow=None, tick=None) -> None:
    """The vectorised FIFO dispatch of a pool: :func:`_fifo_lanes` for static and
    unchunked continuous batching (``slow``, ``tick`` as there), :func:`_chunked_lanes` with chunked prefill."""
    if spec.chunked:
        _chunked_lanes(spec, tok, cum, cum2, group_time, G, end, st)
    else:
        _fifo_lanes(spec, tok, cum, cum2, group_time, G, end, st, slow, tick=tick)


def drain_seconds(spec: GpuSpec, tokens: np.ndarray) -> np.ndarray:
    """Seconds a pool of ``spec`` takes to serve each row's requests, all handed over at once and
    dispatched at once (no waiting to fill): ``tokens`` (..., sequences) -> (...). The fast
    scorer's phase (``pipeline.fast_rm``) and, on one replica, the work a step brings a channel
    in full batches (the offered load, :func:`racsim.pipeline.draws.work_seconds`)."""
    shape, G = tokens.shape[:-1], tokens.shape[-1]
    tok = tokens.reshape(-1, G)
    if spec.order == "shortest":
        tok = np.sort(tok, axis=1, kind="stable")
    now = GpuSpec(**{**spec.__dict__, "max_wait": 0.0})
    cum, cum2 = _prefix(tok, now.padded)
    if not now.chunked and now.replicas == 1:
        return _one_replica_drain(now, tok, cum, cum2).reshape(shape)
    st = lanes_state(now, tok.shape[0], G)
    fifo_lanes(now, tok, cum, cum2, np.zeros((tok.shape[0], 1)), G, G, st)
    return st.comp.max(axis=1).reshape(shape)


def _one_replica_drain(spec: GpuSpec, tok: np.ndarray, cum, cum2) -> np.ndarray:
    """:func:`drain_seconds` on one replica: with every request there at 0 and no wait to fill, the FIFO rule
    takes each batch (:func:`~racsim.pipeline.batcher.window`: as many from the head as fit) when the one before
    ends, so a row's seconds are its batches' seconds added in order: the bits :func:`fifo_lanes` gives, without
    its arrivals, replicas and per-request times (tokens are integers: the prefix sums' differences are exact)."""
    rows, G = tok.shape
    flat, base = tok.reshape(-1), np.arange(rows) * G
    head, end = np.zeros(rows, dtype=np.int64), np.zeros(rows)
    live = np.arange(rows)
    while live.size:
        h = head[live]
        _, _, mx, n = window(spec, flat, base[live] + h, base[live] + G)
        ts = None if cum is None else cum[live, h + n] - cum[live, h]  # None: padded
        sq = None if cum is None else cum2[live, h + n] - cum2[live, h]
        end[live] = end[live] + spec.model.seconds(n.astype(np.float64), ts, sq, mx[np.arange(live.size), n - 1])
        head[live] = h + n
        live = live[head[live] < G]
    return end


ROUND = 16  # iterations a round of _chunked_lanes aims at: whole cycles of the replicas, one at least


def _chunked_lanes(spec: GpuSpec, tok: np.ndarray, cum: np.ndarray, cum2: np.ndarray, group_time: np.ndarray,
                   G: int, end: int, st: _ChunkedLanes) -> None:
    """The rule of :meth:`_Chunked.dispatch` for a FIFO pool in closed form, vectorised
    over lanes, until every request below ``end`` (a multiple of G) is scored. The next
    iteration of a lane runs on the replica r that minimises (tau_r, r), tau_r = free_r if
    r carries a request, max(free_r, a_head) if a request waits, inf otherwise (the event
    loop's order: instants in time, replicas ascending within one; tau_r never precedes the
    lane's previous iteration, which would otherwise have been r's); it scores the carried
    rest (up to the budget), then whole requests from the head that have arrived by tau_r
    while sequences and budget last, then, if budget is left, a chunk of the next arrived
    request, carried on r. Each pass runs a round of up to ``ROUND`` iterations per lane
    (:meth:`_Work.round`). First dispatches and completions are written once per call.
    Arguments as :func:`_fifo_lanes`."""
    if st.tab is None:
        st.tab = _Tables(tok, cum, cum2, spec.budget, spec.max_batch)
    gt = np.full((tok.shape[0], group_time.shape[1] + 1), np.inf)  # groups from end // G on: not arrived yet
    gt[:, :end // G] = group_time[:, :end // G]
    R = spec.replicas
    w = _Work(st, np.arange(tok.shape[0]), gt, G, R * max(1, ROUND // R))
    log = _Log()
    while w.act.size:
        done = w.round(spec, st.tab, log)
        if done is not None:
            w = w.keep(st, ~done)
    if log.raw or log.kept:
        tau, e, ts, lane, r, h, hn, split, cj, c_fin, has_c = log.rows()
        n_w = hn - h
        _mark(st, h - lane, n_w, split, tau, e, cj - lane, c_fin)  # flat (N + 1 a lane) to (lanes, N)
        base = lane * (tok.shape[1] + 1)
        st.log.append((lane, r, tau, e, has_c + n_w + split, ts, np.where(has_c, cj - base, h - base) // G))


class _Log:
    """The rounds' iterations: per round, columns (slots, lanes) and the mask of those kept
    (masked in bulk, every ``1 << 18`` slots or so)."""

    def __init__(self):
        self.raw: list = []
        self.kept: list = []
        self.pending = 0

    def add(self, ok: np.ndarray, *cols: np.ndarray) -> None:
        self.raw.append((ok, cols))
        self.pending += ok.size
        if self.pending > 1 << 18:
            self._compact()

    def _compact(self) -> None:
        if self.raw:
            ok = np.concatenate([r[0].T for r in self.raw])  # (lanes of each round, slots): a lane's in order
            self.kept.append([np.concatenate([a.T for a in c])[ok] for c in zip(*(r[1] for r in self.raw))])
            self.raw, self.pending = [], 0

    def rows(self) -> list:
        """Every kept column, concatenated (empty: nothing kept)."""
        self._compact()
        return [np.concatenate(c) for c in zip(*self.kept)]


class _Work:
    """The active lanes ``act`` of :func:`_chunked_lanes`, requests as flat indices
    (:class:`_Tables`): head ``h``, per replica its free instant, carried request ``cj``,
    its tokens left ``rest`` (0: none) and scored ``cd``; ``AE`` the end of the requests
    known to have arrived (``ge``: groups; ``gt``: the groups' arrivals); rounds of ``K`` slots."""

    def __init__(self, st: _ChunkedLanes, act: np.ndarray, gt: np.ndarray, G: int, K: int):
        self.act, self.groups, self.G, self.K = act, gt, G, K
        self.gt = gt.ravel()
        self.base = act * (st.disp.shape[1] + 1)
        self.gbase = act * gt.shape[1]
        self.h = st.head[act] + self.base
        self.free = st.free[act]
        c = st.carry[act]
        self.cj = c + self.base[:, None]
        self.cd = st.done[act]
        self.rest = np.where(c >= 0, st.tab.tok.take(self.cj, mode="clip") - self.cd, 0.0)
        self.ge = st.head[act] // G
        self.AE = self.base + self.ge * G
        R, a = self.free.shape[1], act.size
        self.cols, self.rows, self.lane = np.arange(a), np.arange(a) * R, np.tile(act, (K, 1))

    def keep(self, st: _ChunkedLanes, on: np.ndarray) -> "_Work":
        """Write the state back to ``st``; a _Work of the lanes ``on`` (bool)."""
        act, live = self.act, self.rest > 0
        st.head[act] = self.h - self.base
        st.free[act] = self.free
        st.carry[act] = np.where(live, self.cj - self.base[:, None], -1)
        st.done[act] = np.where(live, self.cd, 0.0)
        return _Work(st, act[on], self.groups, self.G, self.K)

    def _arrived(self, t1: np.ndarray) -> None:
        """Advance ``AE`` over the groups arrived by ``t1`` (a lane's tau_1 never decreases)."""
        while True:
            now = self.gt.take(self.gbase + self.ge) <= t1
            if not now.any():
                return
            self.ge += now
            self.AE = self.base + self.ge * self.G

    def round(self, spec: GpuSpec, tab: _Tables, log: _Log) -> Optional[np.ndarray]:
        """One pass: slot j = c R + p of the round runs replica order[p], the replicas sorted by
        (tau_r, r), cycle after cycle, as if every earlier slot took its whole room from the
        head (:func:`_heads`), with the arrivals known by tau_1 and max_batch as limits
        (:func:`_content`); slot j > 0 starts at the end of slot j - R on its replica. The
        longest prefix of slots that are exactly the rule's next iterations is kept
        (:func:`_exact`). Returns the lanes with nothing left (bool), or None after a round."""
        R, a = self.free.shape[1], self.act.size
        a_head = self.gt.take(self.gbase + (self.h - self.base) // self.G)
        ready = np.where(self.rest > 0, self.free, np.maximum(self.free, a_head[:, None]))
        order = ready.argsort(axis=1, kind="stable").T  # (R, lanes): position p's replica
        idx = order + self.rows
        tau0 = ready.take(idx)
        if tau0[0].max() == np.inf:
            return tau0[0] == np.inf
        self._arrived(tau0[0])
        rest = self.rest.take(idx)
        H, TS, TG, rest, c_len, kr = _heads(tab, spec.budget, spec.max_batch, self.h, rest, self.K)
        x = _content(spec, tab, self.AE, H, TS, TG, rest, c_len, kr, self.cd.take(idx), self.cj.take(idx))
        e = np.cumsum(np.concatenate([tau0, x.sec]).reshape(-1, R, a), axis=0)[1:].reshape(self.K, a)
        tau = np.concatenate([tau0, e[:-R]])
        ok = _exact(H, x.hn, x.ha, self.AE, tau, e, R)
        nacc = ok.sum(axis=0)
        p = np.arange(R)[:, None]
        last = (p + R * ((nacc - 1 - p) // R)) * a + self.cols  # flat slot of position p's last iteration
        touched = nacc > p
        new = (e, np.where(x.split, tab.tok.take(x.hn) - x.s_len, rest - c_len), x.cd[R:], x.cj[R:])
        for arr, val in zip((self.free, self.rest, self.cd, self.cj), new):
            arr.put(idx, np.where(touched, val.take(last, mode="clip"), arr.take(idx)))
        self.h = x.ha.take((nacc - 1) * a + self.cols)
        log.add(ok, tau, e, x.ts, self.lane, np.tile(order, (self.K // R, 1)), H, x.hn, x.split, x.cj[:-R],
                x.has_c & (c_len == rest), x.has_c)
        return None


def _heads(tab: _Tables, B: float, M: int, h: np.ndarray, rest0: np.ndarray, K: int):
    """Slot by slot, the head H_j each of ``K`` slots starts from (flat), its prefix sum TS_j, its
    target TG_j = TS_j + room_j, its carried tokens left ``rest`` and scored now ``c_len``,
    if every earlier slot took its whole room or its ``M`` sequences: the next head is the first
    boundary at or after TG_j, or M sequences on, and a slot's carry is what its replica's
    previous slot left (``rest0``: position p's before the round) of a carried request longer
    than B plus the split request's rest (the boundary past TG_j, if any, less TG_j); ``kr`` the
    last boundary at or before TG_j. If B <= (M - 1) tmin, the M sequences never bind: the
    boundaries from H_j on below TG_j <= TS_j + B, tmin apart at least, number ceil(B / tmin)
    <= M - 1 <= seqs at most, so the next head is the search's; and ``flat`` ascending strictly
    (tmin > 0), kr is that head, if TG_j is a boundary, or the one before."""
    R, a = rest0.shape
    capped = B > (M - 1) * tab.tmin
    H = np.empty((K + 1, a), dtype=np.int64)
    TS, TG, rest, c_len = np.empty((K + 1, a)), np.empty((K, a)), np.empty((K, a)), np.empty((K, a))
    rest[:R] = rest0
    np.minimum(rest0, B, out=c_len[:R])
    H[0] = h
    tab.flat.take(h, out=TS[0])
    for c in range(0, K, R):  # a cycle's carries come from the cycle before, all known
        if c:
            now, before = slice(c, c + R), slice(c - R, c)
            np.add(rest[before] - c_len[before], np.maximum(TS[c - R + 1:c + 1] - TG[before], 0.0), out=rest[now])
            np.minimum(rest[now], B, out=c_len[now])
        room, seqs = B - c_len[c:c + R], M - (rest[c:c + R] > 0)
        for j in range(c, c + R):
            np.add(TS[j], room[j - c], out=TG[j])
            H[j + 1] = tab.flat.searchsorted(TG[j])
            if capped:
                np.minimum(H[j + 1], H[j] + seqs[j - c], out=H[j + 1])
            tab.flat.take(H[j + 1], out=TS[j + 1], mode="clip")
    if capped:
        kr = tab.flat.searchsorted(TG.T, side="right").T - 1  # the targets ascend lane by lane: a fast search
    else:
        kr = H[1:] - (TS[1:] != TG)
    return H[:K], TS[:K], TG, rest, c_len, kr


class _Slots:
    """What :func:`_content` computes for each slot: arrays (slots, lanes)."""


def _content(spec: GpuSpec, tab: _Tables, AE, H, TS, TG, rest, c_len, kr, cd0, cj0) -> _Slots:
    """Each slot's iteration from its start (H, TS, TG, rest, c_len, kr: :func:`_heads`) as the
    rule scores it with the requests below ``AE`` arrived: whole requests while sequences
    and budget last, up to ``hn``, then the ``split`` one's first ``s_len`` tokens (``ha``:
    the head after); the carried request ``cj`` and its scored tokens ``cd`` cycle by cycle
    (position p's before the round: ``cd0``, ``cj0``; after slot j: row j + R); its seconds."""
    R, K = cd0.shape[0], H.shape[0]
    x = _Slots()
    x.has_c = rest > 0
    room = spec.budget - c_len
    HM = H + (spec.max_batch - x.has_c)
    x.hn = hn = np.minimum(np.minimum(kr, AE), HM)
    whole = tab.flat.take(hn) - TS
    left = room - whole
    x.split = split = (hn < HM) & (hn < AE) & (left > 0)
    x.s_len = s_len = np.where(split, left, 0.0)
    x.ha = hn + split
    x.ts = c_len + whole + s_len
    x.cd, x.cj = np.empty((K + R,) + H.shape[1:]), np.empty((K + R,) + H.shape[1:], dtype=np.int64)
    x.cd[:R], x.cj[:R] = cd0, cj0
    for c in range(0, K, R):
        now, nxt = slice(c, c + R), slice(c + R, c + 2 * R)
        x.cd[nxt] = np.where(split[now], s_len[now], x.cd[now] + c_len[now])
        x.cj[nxt] = np.where(split[now], hn[now], x.cj[now])
    n_w = hn - H
    sq = chunk_squares(c_len, x.cd[:K]) + (tab.cum2.take(hn) - tab.cum2.take(H, mode="clip")) + s_len * s_len
    mx = np.maximum(np.maximum(c_len, s_len), tab.range_max(H, n_w))
    x.sec = spec.model.seconds((x.has_c + n_w + split).astype(np.float64), x.ts, sq, mx)
    return x


def _exact(H, hn, ha, AE, tau, e, R: int) -> np.ndarray:
    """(slots, lanes) True on the longest prefix of slots that are the rule's next iterations.
    Slot 0 is. Slot j > 0 is when slot j - 1 is and (a) slot j - 1 ended at H_j, so slot j
    starts where assumed, and so does every carry (:func:`_heads`: a split leaves the boundary
    past TG less TG, no split whole <= room, so 0 past TG); (b) its whole requests end
    before AE: arrivals after tau_1 would change nothing, and with a_head <= tau_1 no
    replica's tau_r moved, tau_j is its replica's previous end (or its tau before the
    round); (c) every other replica comes free after tau_j: the slots of the last R - 1
    (those of the round before, for the replicas not run yet) end after it."""
    K, a = H.shape
    E = e.reshape(K // R, R, a)
    win = np.full(E.shape, np.inf)  # min end over slots j - R + 1 .. j - 1
    win[:, 1:] = np.minimum.accumulate(E, axis=1)[:, :-1]
    win[1:, :-1] = np.minimum(win[1:, :-1], np.minimum.accumulate(E[:, ::-1], axis=1)[:-1, -2::-1])
    ok = np.empty((K, a), dtype=bool)
    ok[0] = True
    ok[1:] = (ha[:-1] == H[1:]) & (hn[1:] < AE) & (win.reshape(K, a)[1:] > tau[1:])
    return np.logical_and.accumulate(ok, axis=0)


def _mark(st: _ChunkedLanes, head, n_w, split, tau, e, cj, c_fin) -> None:
    """Write the iterations' first dispatches (the whole requests from ``head`` and the split one,
    at ``tau``) and completions (the whole ones, and a carried request ``cj`` whose rest ended,
    at ``e``); requests as indices into the flattened (lanes, requests) arrays."""
    for k, when, at in ((n_w + split, st.disp, tau), (n_w, st.comp, e)):
        idx = np.repeat(head - (np.cumsum(k) - k), k)
        idx += np.arange(idx.size)
        when.reshape(-1)[idx] = np.repeat(at, k)
    st.comp.reshape(-1)[cj[c_fin]] = e[c_fin]
