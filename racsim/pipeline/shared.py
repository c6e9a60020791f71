"""A gpu_rm pool shared with other tenants (``background`` on a gpu_rm channel), vectorised.

The lanes engine's FIFO batcher (:func:`~racsim.pipeline.batcher._fifo_lanes`) serves one
sequence of requests per lane in order. With other tenants, that sequence is the learner's
requests merged with theirs by arrival (a tie: the learner's first, as the event loop admits
them; racsim/pipeline/background.py draws their stream). An asynchronous run knows every arrival
in advance and merges once. A blocking one learns each step's arrivals only when its optimizer
submits them, so :class:`SharedLanes` merges step by step: each lane's buffer holds what was
dispatched, then the step's requests with the other tenants' arriving before them, then
``max_batch`` more of theirs (provisional: they may arrive after the next step's), and the rule
dispatches until the step's last request has left. Every batch of the step leaves before the
next step arrives, so a provisional request that arrived by a batch's instant truly precedes the
next step; one that did not can only set the instant a batch would fill, later than its flush
deadline, which the batch meets first. At the next step the buffer is rewritten from its first
request not dispatched (all the other tenants' by then). Positions past the real requests hold
requests that arrive at inf: never in a batch, never dispatched.
"""

from __future__ import annotations

from typing import Dict

import numpy as np

from racsim.pipeline.background import BackgroundStream, background_log
from racsim.pipeline.batcher import GpuSpec, _fifo_lanes
from racsim.pipeline.cbatch import lanes_state


class SharedLanes:
    """The vectorised FIFO rule of a pool of ``spec`` on every lane: the learner's requests
    ``tok`` (lanes, N) in groups of ``G`` (:meth:`add`) merged with the other tenants' of
    ``stream``; :meth:`finish` serves the rest and gives the learner's state and their log."""

    def __init__(self, spec: GpuSpec, tok: np.ndarray, G: int, stream: BackgroundStream):
        self.spec, self.tok, self.G, self.stream = spec, tok, G, stream
        lanes, N = tok.shape
        self.cap = N + 4 * spec.max_batch
        self.arr = np.full((lanes, self.cap), np.inf)  # each position's arrival (inf: no request)
        self.mtok = np.ones((lanes, self.cap))
        # prefix sums of tokens and squares: none for padded batches (batcher._prefix)
        self.cum = None if spec.padded else np.zeros((lanes, self.cap + 1))
        self.cum2 = None if spec.padded else np.zeros((lanes, self.cap + 1))
        self.learner = np.full((lanes, self.cap), -1, dtype=np.int64)  # the learner's request there, or -1
        self.other = np.full((lanes, self.cap), -1, dtype=np.int64)  # the other tenants' request there, or -1
        self.pos = np.full((lanes, N), -1, dtype=np.int64)  # where each learner request went
        self.st = lanes_state(spec, lanes, self.cap)
        self.added = 0  # learner requests placed (on every lane)
        self.next_other = np.zeros(lanes, dtype=np.int64)  # each lane's first other request not dispatched
        self.end = np.zeros(lanes, dtype=np.int64)  # each lane's positions holding a request

    def add(self, group_time: np.ndarray, until: np.ndarray = None) -> None:
        """The next groups' arrivals (lanes, groups): place them among the other tenants' requests and
        dispatch until their last has left. ``until`` (lanes,): the run's end, known: place every
        other request arriving by then and dispatch them all."""
        lanes, groups = group_time.shape
        own = np.repeat(group_time, self.G, axis=1)
        first, last = self.added, self.added + own.shape[1]
        stop = np.empty(lanes, dtype=np.int64)
        placed = np.empty(lanes, dtype=np.int64)
        for i in range(lanes):
            if until is None:  # those arriving by the step's last request, and max_batch more
                a, t = self.stream.ahead(i, int(self.next_other[i]), own[i, -1], self.spec.max_batch)
            else:
                a, t = self.stream.ahead(i, int(self.next_other[i]), until[i])
            stop[i] = self._place(i, own[i], a, t, first, last, until is None)
            placed[i] = a.size
        self.added = last
        _fifo_lanes(self.spec, self.mtok, self.cum, self.cum2, self.arr, 1, self.cap, self.st, stop=stop)
        # the first other request not dispatched: at the head (past the stop, only theirs), or none left
        head = self.st.head
        rows = np.arange(lanes)
        self.next_other = np.where(head < self.end, self.other[rows, np.minimum(head, self.cap - 1)],
                                   self.next_other + placed)

    def _place(self, i: int, own: np.ndarray, a: np.ndarray, t: np.ndarray, first: int, last: int,
               step: bool) -> int:
        """Rewrite lane i's buffer from its head: the learner's requests ``first``..``last`` arriving at
        ``own`` and the other tenants' from ``next_other`` (arriving at ``a``, of ``t`` tokens), merged
        (each of theirs after the learner's that arrive by it). Returns where the rule stops: past
        the learner's last (``step``), or past everything placed."""
        h = int(self.st.head[i])
        at = np.searchsorted(own, a, side="right") + np.arange(a.size)  # their places in the merge
        n = own.size + a.size
        self._room(h + n)
        ours = np.ones(n, dtype=bool)
        ours[at] = False
        span = slice(h, h + n)
        self.arr[i, span][ours], self.arr[i, span][~ours] = own, a
        self.mtok[i, span][ours], self.mtok[i, span][~ours] = self.tok[i, first:last], t
        self.learner[i, span] = -1
        self.learner[i, span][ours] = np.arange(first, last)
        self.other[i, span] = -1
        self.other[i, span][~ours] = self.next_other[i] + np.arange(a.size)
        self.pos[i, first:last] = h + np.flatnonzero(ours)
        gone = slice(h + n, max(h + n, int(self.end[i])))  # provisional ones of the last step, not placed again
        self.arr[i, gone], self.mtok[i, gone], self.learner[i, gone], self.other[i, gone] = np.inf, 1.0, -1, -1
        self.end[i] = h + n
        if self.cum is not None:
            self.cum[i, h + 1:h + n + 1] = self.cum[i, h] + np.cumsum(self.mtok[i, span])
            self.cum2[i, h + 1:h + n + 1] = self.cum2[i, h] + np.cumsum(self.mtok[i, span] ** 2)
        return h + (int(np.flatnonzero(ours)[-1]) + 1 if step and own.size else n)

    def _room(self, size: int) -> None:
        """At least ``size`` positions (and max_batch more, a window's), doubling."""
        if size + self.spec.max_batch <= self.cap:
            return
        grow = max(self.cap, size + self.spec.max_batch - self.cap)
        lanes = self.arr.shape[0]
        pad = lambda x, v: np.hstack([x, np.full((lanes, grow), v, dtype=x.dtype)])  # noqa: E731
        self.arr, self.mtok = pad(self.arr, np.inf), pad(self.mtok, 1.0)
        if self.cum is not None:
            self.cum, self.cum2 = pad(self.cum, 0.0), pad(self.cum2, 0.0)
        self.learner, self.other = pad(self.learner, -1), pad(self.other, -1)
        self.st.disp, self.st.comp = pad(self.st.disp, np.nan), pad(self.st.comp, np.inf)
        self.cap += grow

    def finish(self, until: np.ndarray):
        """Serve the other tenants' requests left that arrive by ``until`` (lanes,: the run's end);
        the learner's state (:func:`~racsim.pipeline.cbatch.lanes_state`: dispatch, completion and
        the batch log, a batch's group its first learner request's, -1 for none, as
        :meth:`~racsim.pipeline.batcher._Waiting._batch` says) and the other tenants' log."""
        lanes, N = self.tok.shape
        self.add(np.empty((lanes, 0)), until)
        M = self.cap
        nxt = np.where(self.learner >= 0, np.arange(M), M)  # the first learner position at or after each
        nxt = np.hstack([np.minimum.accumulate(nxt[:, ::-1], axis=1)[:, ::-1], np.full((lanes, 1), M)])
        rows = []
        for lane, r, tau, e, n, billed, h in self.st.log:
            f = nxt[lane, h]
            first = self.learner[lane, np.minimum(f, M - 1)]
            rows.append((lane, r, tau, e, n, billed, np.where(f < h + n, first // self.G, -1)))
        ix = np.arange(lanes)[:, None]
        out = lanes_state(self.spec, lanes, N)
        out.disp, out.comp, out.log = self.st.disp[ix, self.pos], self.st.comp[ix, self.pos], rows
        cols: Dict[str, list] = {"lane": [], "arrival": [], "start": [], "end": []}
        for i in range(lanes):
            m = self.other[i] >= 0
            for k, v in zip(cols, (np.full(int(m.sum()), i), self.arr[i, m], self.st.disp[i, m], self.st.comp[i, m])):
                cols[k].append(v)
        return out, background_log(*cols.values())
