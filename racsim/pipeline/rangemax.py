"""The longest of any run of requests, by a sparse table (both vectorised FIFO batchers use it)."""

from __future__ import annotations

import numpy as np


class RangeMax:
    """``max(x[lo:lo + n])`` elementwise over indices ``lo`` and lengths ``0 <= n <= longest``
    (0 for n = 0), from the maxima over spans of 1, 2, 4, ... entries: two reads a query.
    ``x`` holds integers >= 0 (token lengths), stored in the narrowest dtype that holds them
    exactly (uint16 below 2^16, float32 below 2^24); a read past the end reads the last entry."""

    def __init__(self, x: np.ndarray, longest: int):
        top = float(x.max(initial=0))
        kind = np.uint16 if top < 2 ** 16 else np.float32 if top < 2 ** 24 else np.float64
        rows, w = [np.zeros(x.size, kind), x.astype(kind)], 1  # row 0: the empty range
        while 2 * w <= longest:
            rows.append(np.maximum(rows[-1], np.append(rows[-1][w:], np.zeros(w, kind))))
            w *= 2
        self.table = np.concatenate(rows)
        level = np.array([n.bit_length() for n in range(longest + 1)])  # 1 + floor(log2 n), 0 for n = 0
        self.row = level * x.size
        self.span = np.where(level > 0, 1 << np.maximum(level - 1, 0), 0)

    def __call__(self, lo: np.ndarray, n: np.ndarray) -> np.ndarray:
        r, w = self.row.take(n, mode="clip"), self.span.take(n, mode="clip")
        return np.maximum(self.table.take(r + lo, mode="clip"), self.table.take(r + lo + n - w, mode="clip"))
