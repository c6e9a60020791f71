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

from racsim.pipeline.batcher import GpuSpec, _Batch, _fifo_lanes, _FifoLanes, _Waiting, gpu_spec


def serving_spec(rm: Any, key: str) -> GpuSpec:
    """The :class:`GpuSpec` of an RM config: :func:`gpu_spec`, turned continuous
    (packed, no waiting to fill, ``chunked`` as ``rm.chunked_prefill``) when
    ``rm.batching`` is continuous."""
    spec = gpu_spec(rm, key)
    if getattr(rm, "batching", "static") != "continuous":
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
    none) and how many of its tokens are scored."""

    carry: np.ndarray = None  # (lanes, replicas) request index or -1
    done: np.ndarray = None  # (lanes, replicas) its tokens scored so far
    flat: np.ndarray = None  # the lanes' prefix sums, shifted by ``off`` (lanes,) to ascend across lanes
    off: np.ndarray = None

    @classmethod
    def new(cls, lanes: int, requests: int, replicas: int) -> "_ChunkedLanes":
        st = super().new(lanes, requests, replicas)
        st.carry = np.full((lanes, replicas), -1, dtype=np.int64)
        st.done = np.zeros((lanes, replicas))
        return st


def lanes_state(spec: GpuSpec, lanes: int, requests: int):
    """The state the vectorised FIFO rule of ``spec`` keeps (see :func:`fifo_lanes`)."""
    return (_ChunkedLanes if spec.chunked else _FifoLanes).new(lanes, requests, spec.replicas)


def fifo_lanes(spec: GpuSpec, tok, cum, cum2, group_time, G: int, end: int, st, slow=None) -> None:
    """The vectorised FIFO dispatch of a pool: :func:`_fifo_lanes` for static and
    unchunked continuous batching (``slow`` as there), :func:`_chunked_lanes` with chunked prefill."""
    if spec.chunked:
        _chunked_lanes(spec, tok, cum, cum2, group_time, G, end, st)
    else:
        _fifo_lanes(spec, tok, cum, cum2, group_time, G, end, st, slow)


def _chunked_lanes(spec: GpuSpec, tok: np.ndarray, cum: np.ndarray, cum2: np.ndarray, group_time: np.ndarray,
                   G: int, end: int, st: _ChunkedLanes) -> None:
    """The rule of :meth:`_Chunked.dispatch` for a FIFO pool in closed form, vectorised
    over lanes, one iteration per lane per pass, until every request below ``end`` is
    scored. The next iteration of a lane runs on the replica r that minimises
    (tau_r, r), tau_r = free_r if r carries a request, max(free_r, a_head) if a
    request waits, inf otherwise (the event loop's order: instants in time,
    replicas ascending within one; tau_r never precedes the lane's previous
    iteration, which would otherwise have been r's); it scores the carried rest (up to the
    budget), then whole requests from the head that have arrived by tau_r while
    sequences and budget last, then, if budget is left, a chunk of the next arrived
    request, carried on r. The whole requests that fit come from one search of the
    prefix sums ``cum`` (their tokens are integers, so every sum is exact); first
    dispatches and completions are written once per call. Arguments as :func:`_fifo_lanes`."""
    N, M, B = tok.shape[1], spec.max_batch, spec.budget
    offs = np.arange(M)
    if st.flat is None:  # every lane's prefix sums in one ascending array: lane i's shifted past lane i - 1's + B
        st.off = np.arange(tok.shape[0]) * (float(cum[:, -1].max()) + B + 1.0)
        st.flat = (cum + st.off[:, None]).ravel()
    done_by: list = []  # per iteration: lanes, head, whole requests, split one, start, end, carried request, its rest done
    while True:
        act = np.flatnonzero((st.head < end) | (st.carry >= 0).any(axis=1))
        if act.size == 0:
            break
        rows = np.arange(act.size)
        h, carry, done, free = st.head[act], st.carry[act], st.done[act], st.free[act]
        a_head = np.where(h < end, group_time[act, np.minimum(h, N - 1) // G], np.inf)
        ready = np.where(carry >= 0, free, np.maximum(free, a_head[:, None]))  # inf: nothing to do on r
        r = np.argmin(ready, axis=1)
        tau = ready[rows, r]
        cj, cd = carry[rows, r], done[rows, r]
        has_c = cj >= 0
        c_tok = tok[act, np.maximum(cj, 0)]
        c_len = np.where(has_c, np.minimum(c_tok - cd, B), 0.0)
        room = B - c_len
        win = h[:, None] + offs  # arrived from the head on, counted over the M the iteration can take
        avail = ((win < end) & (group_time[act[:, None], np.minimum(win, N - 1) // G] <= tau[:, None])).sum(axis=1)
        base = cum[act, h]
        fit = np.searchsorted(st.flat, base + room + st.off[act], side="right") - 1 - act * (N + 1) - h
        n_w = np.minimum(np.minimum(fit, avail), M - has_c)  # whole requests
        hn = h + n_w
        whole = cum[act, hn] - base
        left = room - whole
        split = (n_w < M - has_c) & (n_w < avail) & (left > 0)
        s_len = np.where(split, left, 0.0)
        ts = c_len + whole + s_len
        sq = chunk_squares(c_len, cd) + (cum2[act, hn] - cum2[act, h]) + s_len * s_len
        L = np.where(offs < n_w[:, None], tok[act[:, None], np.minimum(h[:, None] + offs, N - 1)], 0.0)
        mx = np.maximum(np.maximum(c_len, s_len), L.max(axis=1))
        n = has_c + n_w + split
        e = tau + spec.model.seconds(n.astype(np.float64), ts, sq, mx)
        c_fin = has_c & (cd + c_len == c_tok)
        keep = has_c & ~c_fin
        carry[rows, r] = np.where(split, hn, np.where(keep, cj, -1))
        done[rows, r] = np.where(split, s_len, np.where(keep, cd + c_len, 0.0))
        free[rows, r] = e
        st.carry[act], st.done[act], st.free[act] = carry, done, free
        st.log.append((act, r, tau, e, n, ts, np.where(has_c, cj, h) // G))
        done_by.append((act, h, n_w, split, tau, e, cj, c_fin))
        st.head[act] = hn + split
    if done_by:
        _mark(st, *(np.concatenate(c) for c in zip(*done_by)))


def _mark(st: _ChunkedLanes, lane, head, n_w, split, tau, e, cj, c_fin) -> None:
    """Write the iterations' first dispatches (the whole requests from ``head`` and the split one,
    at ``tau``) and completions (the whole ones, and a carried request whose rest ended, at ``e``)."""
    for k, when, at in ((n_w + split, st.disp, tau), (n_w, st.comp, e)):
        first = np.cumsum(k) - k
        idx = np.repeat(head - first, k) + np.arange(int(k.sum()))
        when[np.repeat(lane, k), idx] = np.repeat(at, k)
    st.comp[lane[c_fin], cj[c_fin]] = e[c_fin]
