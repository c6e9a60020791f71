"""A FIFO batcher's waiting list for the lanes engine's per-lane event loops, its batches'
seconds computed many at a time.

In FIFO order the waiting requests of a lane are always one run of indices [head, tail):
groups arrive whole and in order, and batches leave from the head. A batch that the
limits cut (``max_batch`` sequences, or ``token_budget`` tokens, reached by a request
waiting: :meth:`_Waiting.candidate`'s ``full``) depends on its head alone, whatever
arrives later; so does the batch that follows it. :class:`FifoWaiting` therefore
forms, from the head, every batch the limits cut among the requests waiting (the rule of
:meth:`_Waiting.candidate` by prefix maxima or sums, :meth:`FifoWaiting._limit`) and
computes their seconds in one call of the service model, where the loop called it once
per batch; it reads them as the head reaches them. A batch cut short by the requests
waiting (a flush) takes the plain path. Token lengths are integers, so every token sum
is exact in any order, and the service model is elementwise: each batch gets the same
seconds, bit for bit (tests/test_fifoq.py drives both side by side).
"""

from __future__ import annotations

import bisect
from itertools import accumulate
from operator import mul
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from racsim.pipeline.batcher import GpuSpec, _Batch, _billed, _Waiting


class FifoWaiting(_Waiting):
    """:class:`_Waiting` for FIFO order (static or unchunked continuous batching) as the run
    [head, tail) of request indices; ``cut[h]``: (size, seconds, billed tokens) of the batch
    the limits cut from head h, once formed. Such a batch's ``ids`` is a ``range``."""

    def __init__(self, spec: GpuSpec, tokens: np.ndarray, group: int, slow: Optional[Sequence[float]] = None):
        super().__init__(spec, np.asarray(tokens).tolist(), group, None if slow is None else np.asarray(slow).tolist())
        self.head = self.tail = 0
        tok = np.asarray(tokens, dtype=np.float64)
        self.cum = np.concatenate([[0.0], np.cumsum(tok)]).tolist()  # exact: token lengths are integers
        self.cum2 = np.concatenate([[0.0], np.cumsum(tok * tok)]).tolist()
        self.counts = [k + 1.0 for k in range(spec.max_batch + 1)]  # a padded batch's sizes, as floats
        self.cut: Dict[int, Tuple[int, float, float]] = {}

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

    def _limit(self, h: int) -> Optional[Tuple[int, float, float, float]]:
        """(size, token sum, sum of squares, longest) of the batch the limits cut from head ``h``
        among the requests waiting, or None if they reach no limit: the rule of
        :meth:`_Waiting.candidate` (a request joins while the batch has fewer than ``max_batch``
        and its cost, count x longest padded or the token sum packed, stays within the budget;
        the first always joins) by prefix maxima or sums, whose costs never decrease."""
        s, tok = self.spec, self.tok
        L = tok[h:min(h + s.max_batch + 1, self.tail)]
        if not L:
            return None
        if s.padded:
            run = list(accumulate(L, max))
            n = bisect.bisect_right(list(map(mul, self.counts, run)), s.budget)
        else:
            run = list(accumulate(L))
            n = bisect.bisect_right(run, s.budget)
        n = max(1, min(n, s.max_batch))
        if n == len(run) and n < s.max_batch:
            return None
        cum, cum2 = self.cum, self.cum2
        return n, cum[h + n] - cum[h], cum2[h + n] - cum2[h], run[n - 1] if s.padded else max(L[:n])

    def _chain(self, h: int) -> bool:
        """Form the batches the limits cut from head ``h`` on, one after the next, among the
        requests waiting, their seconds and billed tokens in one call of the service model.
        False if the limits do not cut the first."""
        rows: List[tuple] = []
        while True:
            got = self._limit(h)
            if got is None:
                break
            rows.append((h,) + got)
            h += got[0]
        if not rows:
            return False
        heads, n, ts, sq, mx = (np.array(c) for c in zip(*rows))
        count = n.astype(np.float64)
        seconds = np.asarray(self.spec.model.seconds(count, ts, sq, mx), dtype=np.float64)
        if self.slow is not None:
            seconds = seconds * np.asarray(self.slow)[heads // self.G]
        billed = _billed(self.spec, count, ts, mx)
        self.cut.update(zip(heads.tolist(), zip(n.tolist(), seconds.tolist(), billed.tolist())))
        return True

    def candidate(self):
        """As :meth:`_Waiting.candidate`; a batch the limits cut comes formed (its statistics are
        then not needed: :meth:`_batch` reads its seconds)."""
        h = self.head
        if h not in self.cut and not self._chain(h):
            return super().candidate()
        n = self.cut[h][0]
        return range(h, h + n), n, None, None, None, True

    def _batch(self, r: int, ids: List[int], n: int, ts, sq, mx) -> _Batch:
        if type(ids) is not range:
            return super()._batch(r, ids, n, ts, sq, mx)
        h = ids.start
        _, seconds, billed = self.cut.pop(h)
        return _Batch(r, ids, seconds, billed, h // self.G)
