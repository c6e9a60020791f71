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
server fails is interrupted there (the work done is lost); with ``on_failure: resend`` (a
gpu_rm channel's default, as serving stacks do) it goes back to the front of the queue at the failure instant
and restarts from scratch on the first replica free and up, at most ``max_retries`` times
(a gpu_rm channel; racsim/pipeline/lanes.py and simpy_engine.py); with ``retry`` it keeps
the server and restarts from scratch when the server is repaired, at most ``max_retries``
times; past the cap, or with ``on_failure: lose``, its results are lost at the failure
instant (the server is then free, and down until its repair).

With ``faults.schedule`` (a CSV of known outages: columns server, down_s, up_s; see
:func:`read_schedule`) the outages are the schedule's, the same in every lane, instead of
random ones (``mtbf_s`` null); the resend/retry/lose rule is the same.
"""

from __future__ import annotations

from dataclasses import dataclass
import math
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from racsim.errors import ConfigError

CHUNK = 64  # up/down cycles generated at a time per server (all lanes)


@dataclass(frozen=True)
class FaultSpec:
    """What the engines need: the server's mean up time, the mean repair time and the policy."""

    mtbf: float  # seconds, per server (mtbf_s / tp for a gpu_rm replica)
    mttr: float
    retries: int  # restarts allowed after an interruption (0 with on_failure: lose)
    resend: bool = False  # on_failure: resend: a restart goes to the first replica free and up, not its own


def fault_spec(faults: Any, tp: int = 1, gpu: bool = True) -> FaultSpec:
    """The spec of a channel's ``faults`` config; ``tp`` GPUs per server; ``gpu``: a gpu_rm channel's
    replicas (``on_failure`` null: resend), else a queue's workers (null: retry)."""
    retries = 0 if faults.on_failure == "lose" else int(faults.max_retries)
    resend = (faults.on_failure or ("resend" if gpu else "retry")) == "resend"
    if faults.mtbf_s is None:  # a schedule alone (``faults.schedule``): no random outages
        return FaultSpec(mtbf=math.inf, mttr=0.0, retries=retries, resend=resend)
    return FaultSpec(mtbf=float(faults.mtbf_s) / tp, mttr=float(faults.mttr_s), retries=retries, resend=resend)


def availability(spec: FaultSpec) -> float:
    """The long-run share of time a server of ``spec`` is up: mtbf / (mtbf + mttr) of its alternating
    exponential up and repair times (1 without random failures)."""
    return 1.0 if math.isinf(spec.mtbf) else spec.mtbf / (spec.mtbf + spec.mttr)


def resend_attempt(tl: "Timeline", lane: int, server: int, start: float, seconds: float, tries: int):
    """One attempt of a batch of ``seconds`` started at ``start`` on an up server under
    ``on_failure: resend``: (end, False) if it completes before the server's next failure;
    else the failure instant d and None (cut: re-sent from d) while fewer than the spec's
    ``retries`` re-sends were made (``tries``), or True (lost at d) past the cap."""
    d, _ = tl.outage(lane, server, start)
    if start + seconds <= d:
        return start + seconds, False
    return d, (True if tries == tl.spec.retries else None)


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


SCHEDULE_COLUMNS = ("server", "down_s", "up_s")
SCHEDULE_BYTES = 16 << 20  # the largest schedule read (about 500,000 outages)


def _read_capped(path: str, limit: int) -> str:
    """A small text file whole; ValueError past ``limit`` bytes or not UTF-8, OSError if unreadable."""
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than {limit} bytes")
    return data.decode("utf-8")


def read_schedule(path: str, key: str, servers: int) -> List[Tuple[np.ndarray, np.ndarray]]:
    """Each server's (down, up) outages from the CSV at ``path`` (columns server, down_s,
    up_s, any order, lines starting with # skipped), in time order; any fault in the file
    is one ConfigError naming ``key`` and the file."""

    def bad(what: str) -> ConfigError:
        return ConfigError(key, path, f"a CSV of outages (columns {', '.join(SCHEDULE_COLUMNS)}: a server index "
                                      f"< {servers}, seconds down_s < up_s): {what}")

    try:
        text = _read_capped(path, SCHEDULE_BYTES)
    except (OSError, ValueError) as e:
        raise bad(f"unreadable ({type(e).__name__}: {e})") from e
    lines = [(i, ln.strip()) for i, ln in enumerate(text.splitlines(), 1)
             if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise bad("the file is empty")
    head = [c.strip() for c in lines[0][1].split(",")]
    missing = [c for c in SCHEDULE_COLUMNS if c not in head]
    if missing:
        raise bad(f"no column {', '.join(missing)} (the header has: {', '.join(head)})")
    cols = [head.index(c) for c in SCHEDULE_COLUMNS]
    rows = []
    for i, ln in lines[1:]:
        cells = ln.split(",")
        if len(cells) != len(head):
            raise bad(f"line {i} has {len(cells)} cells, the header {len(head)}")
        row = []
        for name, c in zip(SCHEDULE_COLUMNS, cols):
            try:
                v = float(cells[c])
            except ValueError:
                raise bad(f"line {i}: {name} is {cells[c].strip()!r}, not a number") from None
            if not math.isfinite(v) or v < 0:
                raise bad(f"line {i}: {name} is {v!r}; a finite number >= 0")
            row.append(v)
        r, d, u = row
        if r != int(r) or r >= servers:
            raise bad(f"line {i}: server {r:g} is not a server index 0..{servers - 1} (the pool has {servers})")
        if d >= u:
            raise bad(f"line {i}: down_s {d:g} >= up_s {u:g}")
        rows.append((int(r), d, u))
    out = []
    for r in range(servers):
        mine = sorted((d, u) for s, d, u in rows if s == r)
        for (d0, u0), (d1, u1) in zip(mine, mine[1:]):
            if d1 <= u0:
                raise bad(f"server {r}'s outages [{d0:g}, {u0:g}) and [{d1:g}, {u1:g}) overlap or touch (merge them)")
        out.append((np.array([d for d, _ in mine]), np.array([u for _, u in mine])))
    return out


class Timeline:
    """Every lane's and server's outages [down, up), grown on demand (see the module docstring)."""

    def __init__(self, seed: int, lanes: int, servers: int, spec: FaultSpec,
                 schedule: Optional[Sequence[Tuple[np.ndarray, np.ndarray]]] = None):
        self.seed, self.lanes, self.spec = seed, lanes, spec
        self.down = [np.zeros((lanes, 0)) for _ in range(servers)]
        self.up = [np.zeros((lanes, 0)) for _ in range(servers)]
        if schedule is not None:  # known outages, the same in every lane, then none (an outage at inf)
            self.down = [np.tile(np.append(d, math.inf), (lanes, 1)) for d, _ in schedule]
            self.up = [np.tile(np.append(u, math.inf), (lanes, 1)) for _, u in schedule]
        self._last: dict = {}  # (lane, server) -> (t, down, up) of the last lookup
        self._at = np.ones((lanes, servers), dtype=np.int64)  # outage_lanes: index of each pair's last lookup
        # outage_lanes: each pair's last answer (down, up) and the up of the outage before it, between which
        # (before <= t < up) every lookup gets that answer again (before inf: none yet)
        self._hit = np.full((3, lanes * servers), np.inf)
        self._servers = np.arange(self.servers)[None, :]
        self._stack, self._stack_cover = None, -math.inf  # _reach: every server's outages in one array
        # calm_lanes: per lane, an instant lo, the next instant hi > lo at which a server goes down or
        # comes back, and which servers are up throughout [lo, hi) (hi -inf: none known yet)
        self._calm = (np.zeros(lanes), np.full(lanes, -np.inf), np.zeros((lanes, servers), dtype=bool))

    @property
    def servers(self) -> int:
        return len(self.down)

    def cover(self, server: int, t: float) -> None:
        """Generate server's outages until every lane's last repair is past ``t`` (finite: no
        run's instant is infinite, and no number of outages covers one)."""
        if not t < math.inf:
            raise ValueError(f"an outage timeline covers finite instants only, not {t}")
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
        with np.errstate(invalid="ignore", divide="ignore"):  # an empty window: NaN
            return np.clip(1.0 - down / (self.servers * span), 0.0, 1.0)  # summed outages round past the span


    def _reach(self, t: float):
        """(down, up, width) of every lane and server, flat: pair (lane, server)'s outages at
        pair * width + 1.. (a leading outage at -inf, so that the one before any lookup exists;
        padded with inf past the server's last), covering ``t``: every lane's and server's last
        real repair is after it."""
        if self._stack is None or self._stack_cover <= t:
            for r in range(self.servers):
                self.cover(r, t)
            K = max(u.shape[1] for u in self.up)
            lead, pad = np.full((self.lanes, 1), -np.inf), [np.full((self.lanes, K - u.shape[1]), np.inf) for u in self.up]
            self._stack = tuple(np.stack([np.hstack([lead, a, p]) for a, p in zip(arrays, pad)], axis=1).reshape(-1)
                                for arrays in (self.down, self.up)) + (K + 1,)
            self._stack_cover = min(float(u[:, -1].min()) for u in self.up)
        return self._stack

    def outage_lanes(self, lanes: np.ndarray, server: np.ndarray, t: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """:meth:`outage` vectorised: lane ``lanes[i]``, server ``server[i]`` at ``t[i]`` (any shape,
        each (lane, server) pair at most once), found by walking from that pair's last lookup
        (engines ask at times that mostly grow, so a step or two, and mostly none; where every pair's t lies
        between the up of the outage before its last answer and that answer's up, that answer at once)."""
        pair = lanes * self.servers + server  # flat indices: one take each, not 3-array fancy indexing
        hit = self._hit
        u = hit[1].take(pair)
        if ((hit[2].take(pair) <= t) & (t < u)).all():
            return hit[0].take(pair), u
        down, up, width = self._reach(float(t.max()))
        at = self._at.reshape(-1)
        i = pair * width + at.take(pair)
        back = up.take(i - 1) > t  # the outage before ends after t (the leading one never does)
        while back.any():
            i = i - back
            back = up.take(i - 1) > t
        u = up.take(i)
        fwd = u <= t  # this one ends by t
        while fwd.any():
            i = i + fwd
            u = up.take(i)
            fwd = u <= t
        at[pair] = i - pair * width
        d = down.take(i)
        hit[0, pair], hit[1, pair], hit[2, pair] = d, u, up.take(i - 1)
        return d, u

    def next_up_lanes(self, lanes: np.ndarray, t: np.ndarray) -> np.ndarray:
        """:meth:`next_up` of every server at once: ``t`` (len(lanes), servers) -> the same shape."""
        d, u = self.outage_lanes(lanes[:, None], self._servers, t)
        return np.where(d <= t, u, t)

    def calm_lanes(self, lanes: np.ndarray, t: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """For each of ``lanes`` (distinct) at ``t``: (hi, up), which servers are up throughout
        [t, hi), hi > t the next instant at which one goes down or comes back (a batch started in
        [t, hi) on a server up then completes if it ends by hi). Kept per lane as its calm span
        [lo, hi), looked up again (:meth:`outage_lanes`) once t leaves it."""
        lo, hi, up = self._calm
        stale = (t < lo[lanes]) | (t >= hi[lanes])
        if stale.any():
            s, ts = lanes[stale], t[stale]
            d, u = self.outage_lanes(s[:, None], self._servers, ts[:, None])
            down = d <= ts[:, None]
            lo[s], hi[s], up[s] = ts, np.where(down, u, d).min(axis=1), ~down
        return hi[lanes], up[lanes]

    def serve_lanes(self, lanes: np.ndarray, server: np.ndarray, start: np.ndarray, seconds: np.ndarray):
        """:meth:`serve` on many lanes at once (lane ``lanes[i]``'s batch on its ``server[i]``):
        (end, lost), the retry loop run with masks until every batch completed or was lost."""
        end, lost = np.empty_like(start), np.zeros(start.shape, dtype=bool)
        i, s, tries = np.arange(start.size), start, 0
        while i.size:
            d, u = self.outage_lanes(lanes[i], server[i], s)
            fin = s + seconds[i]
            ok = fin <= d
            cap = ~ok & (tries == self.spec.retries)
            end[i] = np.where(ok, fin, d)
            lost[i] = cap
            go = ~ok & ~cap
            i, s, tries = i[go], u[go], tries + 1
        return end, lost
