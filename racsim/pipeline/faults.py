"""Server failures (``pipeline.channels.NAME.faults``): GPU replicas of a gpu_rm channel go
down and come back.

Each server (a replica of ``tp`` GPUs) alternates up times Exp(mtbf_s / tp) -- it fails
when any of its GPUs does -- and repair times Exp(mttr_s); each
process starts from its stationary law (down at time 0 with probability
MTTR / (MTBF + MTTR), then for an Exp(MTTR) repair: memoryless). The
timeline is a pure function of (seed, server, lane): chunk c of server r's cycles comes
from ``numpy.random.default_rng([seed, r, c])`` for every lane at once, generated when an
engine first looks past the end of what exists, so both engines read the same outages
whatever order they ask in. A down server takes no work. A batch in service when its
server fails is interrupted there; with ``on_failure: retry`` it keeps the server and
restarts from scratch when the server is repaired, at most ``max_retries`` times; past
the cap, or with ``on_failure: lose``, its results are lost at the failure instant (the
server is then free, and down until its repair).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Tuple

import numpy as np

CHUNK = 64  # up/down cycles generated at a time per server (all lanes)


@dataclass(frozen=True)
class FaultSpec:
    """What the engines need: the server's mean up time, the mean repair time and the policy."""

    mtbf: float  # seconds, per server (mtbf_s / tp for a gpu_rm replica)
    mttr: float
    retries: int  # restarts allowed after an interruption (0 with on_failure: lose)


def fault_spec(faults: Any, tp: int = 1) -> FaultSpec:
    """The spec of a channel's ``faults`` config; ``tp`` GPUs per server."""
    retries = int(faults.max_retries) if faults.on_failure == "retry" else 0
    return FaultSpec(mtbf=float(faults.mtbf_s) / tp, mttr=float(faults.mttr_s), retries=retries)


def cycles(seed: int, server: int, chunk: int, lanes: int, spec: FaultSpec, start: np.ndarray):
    """(down, up), each (lanes, CHUNK): chunk ``chunk`` of a server's outages, its first
    up time starting at ``start`` (lanes,): d_k = u_{k-1} + Exp(mtbf), u_k = d_k + Exp(mttr);
    chunk 0 has its first up time 0 (down from time 0) with the stationary probability."""
    rng = np.random.default_rng([seed, server, chunk])
    up_s = rng.exponential(spec.mtbf, (lanes, CHUNK))
    down_s = rng.exponential(spec.mttr, (lanes, CHUNK))
    if chunk == 0:
        up_s[:, 0] *= rng.random(lanes) >= spec.mttr / (spec.mtbf + spec.mttr)
    steps = np.stack([up_s, down_s], axis=-1).reshape(lanes, 2 * CHUNK)
    t = np.cumsum(np.hstack([start[:, None], steps]), axis=1)[:, 1:]
    return t[:, 0::2], t[:, 1::2]


class Timeline:
    """Every lane's and server's outages [down, up), grown on demand (see the module docstring)."""

    def __init__(self, seed: int, lanes: int, servers: int, spec: FaultSpec):
        self.seed, self.lanes, self.spec = seed, lanes, spec
        self.down = [np.zeros((lanes, 0)) for _ in range(servers)]
        self.up = [np.zeros((lanes, 0)) for _ in range(servers)]
        self._last: dict = {}  # (lane, server) -> (t, down, up) of the last lookup

    @property
    def servers(self) -> int:
        return len(self.down)

    def cover(self, server: int, t: float) -> None:
        """Generate server's outages until every lane's last repair is past ``t``."""
        while self.up[server].shape[1] == 0 or self.up[server][:, -1].min() <= t:
            n = self.up[server].shape[1] // CHUNK
            start = self.up[server][:, -1] if n else np.zeros(self.lanes)
            d, u = cycles(self.seed, server, n, self.lanes, self.spec, start)
            self.down[server] = np.hstack([self.down[server], d])
            self.up[server] = np.hstack([self.up[server], u])

    def outage(self, lane: int, server: int, t: float) -> Tuple[float, float]:
        """(down, up) of the first outage that ends after ``t``: the server is down at t iff down <= t."""
        last = self._last.get((lane, server))
        if last is not None and last[0] <= t < last[2]:  # the same outage answers every t in [t_last, up)
            return last[1], last[2]
        self.cover(server, t)
        k = int(np.searchsorted(self.up[server][lane], t, side="right"))
        d, u = float(self.down[server][lane, k]), float(self.up[server][lane, k])
        self._last[(lane, server)] = (t, d, u)
        return d, u

    def next_up(self, lane: int, server: int, t: float) -> float:
        """The first instant >= t at which the server is up."""
        d, u = self.outage(lane, server, t)
        return u if d <= t else t

    def serve(self, lane: int, server: int, start: float, seconds: float) -> Tuple[float, bool]:
        """A batch of ``seconds`` started at ``start`` on an up server: (end, lost).
        It completes at start + seconds if no outage begins before; else it is interrupted at
        the outage's start and restarts at its end (at most ``retries`` times) or is lost there."""
        s, tries = start, 0
        while True:
            d, u = self.outage(lane, server, s)
            if s + seconds <= d:
                return s + seconds, False
            if tries == self.spec.retries:
                return d, True
            s, tries = u, tries + 1

    def up_fraction(self, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
        """(lanes,) fraction of server-seconds up in each lane's window [t0, t1]."""
        span = np.maximum(t1 - t0, 0.0)
        down = np.zeros(self.lanes)
        for r in range(self.servers):
            self.cover(r, float(np.max(t1)))
            d, u = self.down[r], self.up[r]
            down += np.clip(np.minimum(u, t1[:, None]) - np.maximum(d, t0[:, None]), 0, None).sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return 1.0 - down / (self.servers * span)

