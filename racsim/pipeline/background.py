"""Background traffic (issue 28, point 7): other tenants' requests on a shared channel
(``pipeline.channels.<ch>.background``).

An independent Poisson stream per lane, ``rate_per_s`` requests a second from time 0. On a
queue channel each request is served a draw of its latency law on the channel's workers, FIFO
with the learner's samples; on a gpu_rm pool each is one sequence of drawn tokens, batched with
the learner's sequences in the batcher's order (:meth:`~racsim.pipeline.batcher._Waiting.admit_other`)
and served for the batch's seconds. A blocking optimizer's waits stretch the run, so its length
is not known in advance: each lane draws its stream in chunks of CHUNK requests (gaps, then
service times or token lengths) from its own generator, as far as the run needs, so both
engines see the same requests whatever the run's length. Requests that arrive by the end of the
run are served; none is ever injected into training: the schedule keeps them apart
(:attr:`ArrivalSchedule.background`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, List, Tuple

import numpy as np

from racsim.pipeline.cbatch import drain_seconds, serving_spec
from racsim.pipeline.latency import build_latency, token_lengths

CHUNK = 256  # requests drawn at a time per lane
LOAD_REQUESTS = 32768  # other tenants' requests whose full batches give a gpu_rm pool's work per request
LOAD_SEED = 20281  # their draws' seed: the same figure at every seed of a run


@dataclass(frozen=True)
class BackgroundSpec:
    """A channel's background stream: its seed, rate (requests a second) and each request's
    law: its service seconds (a queue) or token length (a gpu_rm pool), as ``law.sample(rng, size)``."""

    seed: int
    rate: float
    law: Any


def background_spec(ch: Any, name: str, seed: int) -> BackgroundSpec:
    """Channel ``name``'s :class:`BackgroundSpec`: a queue's background latency (or the channel's
    own), a gpu_rm pool's token laws (each its own or the rm's)."""
    b, key = ch.background, f"pipeline.channels.{name}"
    if ch.kind == "gpu_rm":
        own = b.prompt_tokens is not None or b.response_tokens is not None
        law = token_lengths(b.prompt_tokens or ch.rm.prompt_tokens, b.response_tokens or ch.rm.response_tokens,
                            f"{key}.background" if own else f"{key}.rm")
        return BackgroundSpec(seed, float(b.rate_per_s), law)
    lat = f"{key}.background.latency" if b.latency is not None else f"{key}.latency"
    return BackgroundSpec(seed, float(b.rate_per_s), build_latency(b.latency or ch.latency, lat))


def background_work(ch: Any, name: str) -> float:
    """Server-seconds a second that channel ``name``'s background brings its servers (0 without
    background): its part of the offered load, rho = lambda E[S] / c. A queue's E[S] is its law's
    mean; a gpu_rm pool's the seconds one replica takes per request when it serves them in full
    batches (as the learner's work, :func:`~racsim.pipeline.draws.work_seconds`), over
    LOAD_REQUESTS requests drawn with a fixed seed."""
    if getattr(ch, "background", None) is None:
        return 0.0
    spec = background_spec(ch, name, 0)
    if ch.kind != "gpu_rm":
        return spec.rate * float(spec.law.mean())
    one = replace(serving_spec(ch.rm, f"pipeline.channels.{name}.rm"), replicas=1)
    tok = spec.law.sample(np.random.default_rng(LOAD_SEED), (1, LOAD_REQUESTS))
    return spec.rate * float(drain_seconds(one, tok)[0]) / LOAD_REQUESTS


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
            service = self.spec.law.sample(rng, (CHUNK,))
            self.arrival[lane] = np.concatenate([self.arrival[lane], last + np.cumsum(gaps)])
            self.service[lane] = np.concatenate([self.service[lane], service])

    def take(self, lane: int, until: float) -> Tuple[np.ndarray, np.ndarray]:
        """(arrival, service) of lane ``lane``'s requests not taken yet that arrive by ``until``."""
        self._cover(lane, until)
        lo = self.taken[lane]
        hi = lo + int(np.searchsorted(self.arrival[lane][lo:], until, side="right"))
        self.taken[lane] = hi
        return self.arrival[lane][lo:hi], self.service[lane][lo:hi]

    def ahead(self, lane: int, k: int, until: float, extra: int = 0) -> Tuple[np.ndarray, np.ndarray]:
        """(arrival, service) of lane ``lane``'s requests from ``k`` on that arrive by ``until``, and
        ``extra`` more after them, drawn if need be (a shared gpu_rm pool's merge, racsim/pipeline/shared.py)."""
        self._cover(lane, until)
        hi = max(k, int(np.searchsorted(self.arrival[lane], until, side="right"))) + extra
        if hi:
            self.first(lane, hi - 1)
        return self.arrival[lane][k:hi], self.service[lane][k:hi]

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
