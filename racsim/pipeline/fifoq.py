"""A FIFO batcher's waiting list for the lanes engine's per-lane event loops, with every
batch the limits can cut precomputed.

In FIFO order the waiting requests of a lane are always one run of indices [head, tail):
groups arrive whole and in order, and batches leave from the head. So the batch the
rule of :meth:`_Waiting.candidate` takes from head h, when at least as many requests wait
as the limits let in (``max_batch`` sequences, ``token_budget`` tokens padded or packed),
depends on h alone: :func:`fifo_batches` computes it for every h at once, with NumPy, and
:class:`FifoWaiting` reads it instead of looping over the requests and calling the service
model once per batch. A batch cut short by the requests waiting (a flush) takes the loop.
Token lengths are integers, so the token sums are exact in any order, and the service
model is elementwise, so each batch gets the same seconds, bit for bit, as the loop gives.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np

from racsim.pipeline.batcher import GpuSpec, _Batch, _billed, _Waiting


def fifo_batches(spec: GpuSpec, tok: np.ndarray, slow: Optional[np.ndarray], group: int):
    """For every lane and head h of the lanes' requests ``tok`` (lanes, N): the size n of
    the batch the limits cut from h (the requests from h that fit ``max_batch`` and the
    budget; at least one), its seconds (times the bursts factor ``slow`` (lanes, groups) of
    h's group, if any) and its billed tokens, each (lanes, N). The batch grows one request
    at a time over every head at once, as the loop of :meth:`_Waiting.candidate` grows one."""
    N, M = tok.shape[1], spec.max_batch
    n = np.ones(tok.shape, dtype=np.int64)
    run = tok.copy()  # over [h, h + k]: the longest (padded) or the token sum (packed)
    mx = tok.copy()  # the longest of the batch
    alive = np.ones(tok.shape, dtype=bool)  # no limit met yet
    for k in range(1, min(M, N)):
        L, r = tok[:, k:], run[:, :-k]
        np.maximum(r, L, out=r) if spec.padded else np.add(r, L, out=r)
        ok = alive[:, :-k] & ((k + 1.0) * r <= spec.budget if spec.padded else r <= spec.budget)
        alive[:, :-k] = ok
        alive[:, N - k:] = False  # no request k places on
        if not ok.any():
            break
        n[:, :-k] += ok
        np.maximum(mx[:, :-k], np.where(ok, L, 0.0), out=mx[:, :-k])
    z = np.zeros((tok.shape[0], 1))
    cum, cum2 = np.hstack([z, np.cumsum(tok, axis=1)]), np.hstack([z, np.cumsum(tok * tok, axis=1)])
    h = np.arange(N)
    ts = np.take_along_axis(cum, h + n, axis=1) - cum[:, :N]
    sq = np.take_along_axis(cum2, h + n, axis=1) - cum2[:, :N]
    count = n.astype(np.float64)
    seconds = np.asarray(spec.model.seconds(count, ts, sq, mx), dtype=np.float64)
    if slow is not None:
        seconds = seconds * np.repeat(slow, group, axis=1)
    return n, seconds, _billed(spec, count, ts, mx)


class FifoWaiting(_Waiting):
    """:class:`_Waiting` for FIFO order (not chunked) as the run [head, tail) of indices,
    the batches the limits cut read from :func:`fifo_batches`. A table batch's ``ids`` is a
    ``range``."""

    def __init__(self, spec: GpuSpec, tokens: np.ndarray, group: int, table, slow: Optional[Sequence[float]] = None):
        super().__init__(spec, np.asarray(tokens).tolist(), group, slow)
        self.head = self.tail = 0
        self.n, self.seconds, self.billed = (np.asarray(x).tolist() for x in table)  # a lane's fifo_batches

    @property
    def keys(self) -> range:
        return range(self.head, self.tail)

    @keys.setter
    def keys(self, value) -> None:  # _Waiting.__init__ sets an empty list
        assert not value

    def __len__(self) -> int:
        return self.tail - self.head

    def admit(self, g: int) -> None:
        self.tail += self.G

    def oldest(self) -> int:
        return self.head // self.G

    def remove(self, ids: Sequence[int]) -> None:
        self.head += len(ids)

    def candidate(self):
        """As :meth:`_Waiting.candidate`; from the table when the limits, not the requests
        waiting, cut the batch (the statistics are then not needed: :meth:`_batch` reads them)."""
        h = self.head
        n = self.n[h]
        if self.tail - h < n:
            return super().candidate()
        return range(h, h + n), n, None, None, None, self.tail - h > n or n == self.spec.max_batch

    def _batch(self, r: int, ids: List[int], n: int, ts, sq, mx) -> _Batch:
        if type(ids) is not range:
            return super()._batch(r, ids, n, ts, sq, mx)
        h = ids.start
        return _Batch(r, ids, self.seconds[h], self.billed[h], h // self.G)
