"""A FIFO batcher's waiting list for the lanes engine's per-lane event loops, every batch
the limits can cut formed at once.

In FIFO order the waiting requests of a lane are always one run of indices [head, tail):
groups arrive whole and in order, and batches leave from the head. A batch that the
limits cut (``max_batch`` sequences, or ``token_budget`` tokens, reached by a request
waiting: :meth:`_Waiting.candidate`'s ``full``) depends on its head alone, whatever
arrives later. :class:`FifoWaiting` therefore forms, for every request index h, the
batch the limits would cut from head h were every request waiting (:func:`limit_sizes`:
the rule of :meth:`_Waiting.candidate` by running maxima or sums, whose costs never
decrease) and computes all their seconds in one call of the service model, where the
loop called it once per batch. With the requests [head, tail) waiting, the batch from
head h is cut exactly when the request that cuts it (the first that does not fit, or
the ``max_batch``-th) is waiting: ``reach[h] < tail``; it is then that batch, since its
requests and the one that stops it are all waiting. Any other batch (a flush) takes the
plain path. Token lengths are integers, so every token sum is exact in any order, and
the service model is elementwise: each batch gets the same seconds, bit for bit
(tests/test_fifoq.py drives both side by side).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from racsim.pipeline.batcher import GpuSpec, _Batch, _billed, _Waiting
from racsim.pipeline.rangemax import RangeMax


def limit_sizes(spec: GpuSpec, tok: np.ndarray):
    """(size, longest) of the batch the limits cut from each request index h, the requests after
    the last one never fitting: a request joins while the batch has fewer than ``max_batch`` and
    its cost (count x longest padded, the token sum packed) stays within the budget, the first
    always. Token lengths (at least 1) and the budget are integers, so every cost is exact and:
    packed, the size is the most k whose prefix sum stays within the budget (a search in the
    prefix sums); padded, k requests fit when k <= c_j = floor(budget / tok_j) for each of them,
    so the size is min over d of max(d, c_{h+d}) (d from 0 to M - 1; c is 0 past the last
    request), floor(budget / tok_j) being exact in floating point. Then clipped to [1, M]; the
    longest by :class:`RangeMax`. No batch passes the last
    request, and any batch of at most M requests fits M x the longest: so M is max_batch at
    most N + 1, and the budget at most M x the longest (which keeps every cost exact)."""
    N = tok.size
    M = min(spec.max_batch, N + 1)
    B = min(spec.budget, M * float(tok.max(initial=0.0)))
    h = np.arange(N)
    if spec.padded:
        c = np.concatenate([np.floor(B / tok), np.zeros(M)])
        fit, spread = c[:N].copy(), np.empty(N)
        for d in range(1, M):
            np.minimum(fit, np.maximum(c[d:d + N], d, out=spread), out=fit)
        size = np.clip(fit, 1, M).astype(np.int64)
    else:
        cum = np.concatenate([[0.0], np.cumsum(tok)])
        size = np.clip(np.searchsorted(cum, cum[:-1] + B, side="right") - 1 - h, 1, M)
    return size, RangeMax(tok, M)(h, size).astype(np.float64)


class FifoWaiting(_Waiting):
    """:class:`_Waiting` for FIFO order (static or unchunked continuous batching) as the run
    [head, tail) of request indices; per head h: ``reach[h]``, the request whose arrival cuts
    the batch from h, and that batch's (size, seconds, billed tokens). Such a batch's ``ids``
    is a ``range``."""

    def __init__(self, spec: GpuSpec, tokens: np.ndarray, group: int, slow: Optional[Sequence[float]] = None):
        tok = np.asarray(tokens, dtype=np.float64)
        super().__init__(spec, tok, group, None if slow is None else np.asarray(slow).tolist())
        self.head = self.tail = 0
        n, mx = limit_sizes(spec, tok)
        h = np.arange(tok.size)
        cum = np.concatenate([[0.0], np.cumsum(tok)])  # exact: token lengths are integers
        cum2 = np.concatenate([[0.0], np.cumsum(tok * tok)])
        count, ts, sq = n.astype(np.float64), cum[h + n] - cum[h], cum2[h + n] - cum2[h]
        seconds = np.asarray(spec.model.seconds(count, ts, sq, mx), dtype=np.float64)
        if slow is not None:
            seconds = seconds * np.asarray(slow)[h // group]
        self.size, self.seconds = n, seconds
        self.billed = np.asarray(_billed(spec, count, ts, mx), dtype=np.float64)
        self.reach = np.append(h + n - (n == spec.max_batch), tok.size)  # [N]: none left

    @property
    def keys(self) -> range:
        return range(self.head, self.tail)

    @keys.setter
    def keys(self, value) -> None:  # _Waiting.__init__ sets an empty list
        assert not value

    def __len__(self) -> int:
        return self.tail - self.head

    def admit(self, g: int) -> None:
        """Group ``g`` arrives (groups arrive in order: its requests extend the run)."""
        assert self.tail == g * self.G, (self.tail, g)
        self.tail += self.G

    def oldest(self) -> int:
        return self.head // self.G

    def remove(self, ids: Sequence[int]) -> None:
        self.head += len(ids)

    def take(self) -> Optional[Tuple[int, int, float, float]]:
        """The batch the limits cut from the head, removed: (head, size, seconds, billed tokens);
        None if they cut none among the requests waiting."""
        h = self.head
        if self.reach.item(h) >= self.tail:
            return None
        n = self.size.item(h)
        self.head = h + n
        return h, n, self.seconds.item(h), self.billed.item(h)

    def dispatch(self, idle: Sequence[int], tau: float, arrival: Sequence[float]) -> List[_Batch]:
        """:meth:`_Waiting.dispatch`: a batch the limits cut leaves at once (it is full), formed;
        from the first that is not, the rule's own loop (a flush)."""
        out: List[_Batch] = []
        for i, r in enumerate(idle):
            got = self.take()
            if got is None:
                return out + super().dispatch(idle[i:], tau, arrival)
            h, n, seconds, billed = got
            out.append(_Batch(r, range(h, h + n), seconds, billed, h // self.G))
        return out
