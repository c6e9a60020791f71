"""Background traffic (issue 28, point 7): other tenants' requests on a shared queue channel
(``pipeline.channels.<ch>.background``).

An independent Poisson stream per lane, ``rate_per_s`` requests a second from time 0, each
served a draw of its latency law on the channel's workers, FIFO with the learner's samples. A
blocking optimizer's waits stretch the run, so its length is not known in advance: each lane
draws its stream in chunks of CHUNK requests (gaps, then service times) from its own
generator, as far as the run needs, so both engines see the same requests whatever the run's
length. Requests that arrive by the end of the run are served; none is ever injected into
training: the schedule keeps them apart (:attr:`ArrivalSchedule.background`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Tuple

import numpy as np

from racsim.pipeline.latency import build_latency

CHUNK = 256  # requests drawn at a time per lane


@dataclass(frozen=True)
class BackgroundSpec:
    """A channel's background stream: its seed, rate (requests a second) and service law."""

    seed: int
    rate: float
    latency: Any  # a racsim.pipeline.latency law (its sample(rng, size))


def background_spec(ch: Any, name: str, seed: int) -> BackgroundSpec:
    """Channel ``name``'s :class:`BackgroundSpec` (its background's latency, or the channel's own)."""
    b = ch.background
    key = f"pipeline.channels.{name}.background.latency" if b.latency is not None else f"pipeline.channels.{name}.latency"
    return BackgroundSpec(seed, float(b.rate_per_s), build_latency(b.latency or ch.latency, key))


def background_work(ch: Any, name: str) -> float:
    """Server-seconds a second that channel ``name``'s background brings its workers, rate x mean
    service time (0 without background): its part of the offered load, rho = lambda E[S] / c."""
    if getattr(ch, "background", None) is None:
        return 0.0
    spec = background_spec(ch, name, 0)
    return spec.rate * float(spec.latency.mean())


class BackgroundStream:
    """Every lane's requests of one :class:`BackgroundSpec`, drawn as far as asked, and handed
    out once each, in arrival order (:meth:`take`)."""

    def __init__(self, spec: BackgroundSpec, lanes: int):
        self.spec = spec
        self.rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(spec.seed).spawn(lanes)]
        self.arrival: List[np.ndarray] = [np.empty(0)] * lanes
        self.service: List[np.ndarray] = [np.empty(0)] * lanes
        self.taken = [0] * lanes

    def _cover(self, lane: int, until: float) -> None:
        """Draw lane ``lane``'s requests until one arrives after ``until``."""
        while not self.arrival[lane].size or self.arrival[lane][-1] <= until:
            rng, last = self.rngs[lane], self.arrival[lane][-1] if self.arrival[lane].size else 0.0
            gaps = rng.exponential(1.0 / self.spec.rate, CHUNK)
            service = self.spec.latency.sample(rng, (CHUNK,))
            self.arrival[lane] = np.concatenate([self.arrival[lane], last + np.cumsum(gaps)])
            self.service[lane] = np.concatenate([self.service[lane], service])

    def take(self, lane: int, until: float) -> Tuple[np.ndarray, np.ndarray]:
        """(arrival, service) of lane ``lane``'s requests not taken yet that arrive by ``until``."""
        self._cover(lane, until)
        lo = self.taken[lane]
        hi = lo + int(np.searchsorted(self.arrival[lane][lo:], until, side="right"))
        self.taken[lane] = hi
        return self.arrival[lane][lo:hi], self.service[lane][lo:hi]

    def first(self, lane: int, k: int) -> Tuple[float, float]:
        """Lane ``lane``'s request ``k`` (arrival, service), drawn if need be (SimPy's feed)."""
        while self.arrival[lane].size <= k:
            self._cover(lane, self.arrival[lane][-1] if self.arrival[lane].size else 0.0)
        return float(self.arrival[lane][k]), float(self.service[lane][k])


def background_log(lanes: List[np.ndarray], arrival: List[np.ndarray], start: List[np.ndarray],
                   end: List[np.ndarray]) -> dict:
    """A channel's served background requests as flat arrays lane, arrival, start, end, sorted
    by (lane, arrival) whatever order they were served in; each argument a list of arrays."""
    cols = [np.concatenate(xs) if xs else np.empty(0) for xs in (lanes, arrival, start, end)]
    order = np.lexsort((cols[1], cols[0]))
    return dict(zip(("lane", "arrival", "start", "end"), (cols[0][order].astype(np.int64),
                                                          *(c[order] for c in cols[1:]))))
