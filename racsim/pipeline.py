"""The asynchronous reward pipeline: when is each slow result usable?

Model (DESIGN.md, "The model"). Optimizer step t generates a batch of B
rollouts, fast-scores them, submits them to every slow channel, then updates;
each phase takes a duration drawn from the scenario. Slow channel k serves each
submitted sample for a latency drawn from its distribution, on one of c_k
workers behind a FIFO queue (or on as many as needed). A result is usable by
the first step that begins at or after it completes; its delay Delta is that
step's index minus t. A result older than the channel's admissible delay D_k
is dropped. With a blocking corrector (wait-for-slow) the optimizer instead
waits, after submitting, until its own batch's results are back (or a timeout
passes), and uses them in the same step (Delta = 0).

Two engines produce the same :class:`~racsim.schedule.ArrivalSchedule` from
the same random draws: ``simpy`` (the engine of record: one SimPy process per
trial's optimizer and per queued job) and ``lanes`` (all trials advance
together as numpy lanes, one vectorised operation per job position). A test
holds them equal to the last bit.

GPU-backed reward models (channel kind ``gpu_rm``, see "GPU-backed channels"
below): each sample is ``sequences_per_sample`` requests with drawn token
lengths; a batcher forms batches (at most ``max_batch`` sequences and
``token_budget`` tokens, padded or packed, in FIFO or shortest-first order) and
dispatches one to an idle replica of ``tp`` GPUs when it is full or when its
oldest waiting request has waited ``max_wait_s``; a service model
(racsim/service.py) gives the batch's seconds. A sample's result is back when
all its sequences are scored. Everything that happens at one instant
(arrivals, completions, flush deadlines) is applied before the batcher
decides. In SimPy: a batcher process, one ``Resource`` per replica, one
process per batch. In lanes: a vectorised batch-by-batch recursion for FIFO
batchers (asynchronous, or blocking without a timeout), and a per-lane event
loop otherwise.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np

from .config import PHASES, PipelineConf, phase_conf
from .latency import build_latency
from .schedule import DROPPED, INJECTED, PENDING, ArrivalSchedule


@dataclass(frozen=True)
class PipelineDraws:
    """Every random number a pipeline run uses, drawn once so that the two
    engines, and the blocking and non-blocking pipelines, share them.

    ``phase``: (4, trials, steps) seconds for generate, fast_score, submit,
    update. ``service``: per channel (trials, steps, batch) service seconds; for
    a kernel channel, its delay in steps (``-1`` = the result never returns).
    """

    phase: np.ndarray
    service: Dict[str, np.ndarray]
    kernel_channels: frozenset
    nominal_step: float
    workers: Dict[str, Optional[int]]
    max_delay: Dict[str, Optional[int]]
    # gpu_rm channels: their batcher and service model; ``service[name]`` then holds
    # the token length of each request, (trials, steps, batch, sequences_per_sample).
    gpu: Dict[str, "GpuSpec"] = field(default_factory=dict)


def draw(pcfg: PipelineConf, n_trials: int, rng: np.random.Generator) -> PipelineDraws:
    """Draw all durations and latencies of ``n_trials`` independent runs."""
    shape = (n_trials, pcfg.steps)
    phase_lat = [build_latency(phase_conf(pcfg, p), f"pipeline.{p}") for p in PHASES]
    phase = np.stack([lat.sample(rng, shape) for lat in phase_lat])
    service, kernel_channels, gpu = {}, set(), {}
    for name, ch in pcfg.channels.items():
        size = shape + (pcfg.batch_size,)
        if getattr(ch, "kind", "queue") == "gpu_rm":
            key = f"pipeline.channels.{name}.rm"
            gpu[name] = gpu_spec(ch.rm, key)
            service[name] = draw_tokens(ch.rm, rng, size + (gpu[name].seqs,), key)
        elif ch.kernel is not None:
            service[name] = _draw_kernel_delays(list(ch.kernel), rng, size)
            kernel_channels.add(name)
        else:
            service[name] = build_latency(ch.latency, f"pipeline.channels.{name}.latency").sample(rng, size)
    nominal = float(sum(lat.mean() for lat in phase_lat))
    fast_rm = getattr(pcfg, "fast_rm", None)
    if fast_rm is not None:  # the fast scorer's GPUs score the step's sequences: that is the phase
        spec = gpu_spec(fast_rm, "pipeline.fast_rm")
        tokens = draw_tokens(fast_rm, rng, shape + (pcfg.batch_size * spec.seqs,), "pipeline.fast_rm")
        phase[1] = fast_score_seconds(spec, tokens)
        nominal = float(sum(lat.mean() for i, lat in enumerate(phase_lat) if i != 1) + phase[1].mean())
    return PipelineDraws(
        phase=phase,
        service=service,
        kernel_channels=frozenset(kernel_channels),
        nominal_step=nominal,
        workers={n: ch.workers for n, ch in pcfg.channels.items()},
        max_delay={n: ch.max_delay for n, ch in pcfg.channels.items()},
        gpu=gpu,
    )


def _draw_kernel_delays(kernel: List[float], rng: np.random.Generator, size) -> np.ndarray:
    """Delays in steps drawn from Lambda[k, :]; the missing mass gives -1 (never returns)."""
    cdf = np.cumsum(np.asarray(kernel, dtype=np.float64))
    idx = np.searchsorted(cdf, rng.random(size), side="right")
    return np.where(idx >= len(kernel), -1, idx).astype(np.int64)


# ----------------------------------------------------------------------------
# Pure pieces shared by both engines.


def fifo_assign(arrival: np.ndarray, service: np.ndarray, free: np.ndarray):
    """Serve jobs in arrival order on identical workers (FIFO multi-server queue).

    ``arrival``/``service``: (lanes, jobs), jobs sorted by arrival within a lane;
    ``free``: (lanes, c) time each worker next falls free (updated in place).
    Each job takes the earliest-free worker, which is exactly FIFO service.
    Returns (start, completion), each (lanes, jobs).
    """
    lanes = np.arange(arrival.shape[0])
    start = np.empty_like(arrival)
    end = np.empty_like(arrival)
    for j in range(arrival.shape[1]):
        w = np.argmin(free, axis=1)
        s = np.maximum(arrival[:, j], free[lanes, w])
        e = s + service[:, j]
        free[lanes, w] = e
        start[:, j], end[:, j] = s, e
    return start, end


def _async_landing(draws: "PipelineDraws", names, step_start: np.ndarray,
                   end: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Landing steps of a non-blocking run: kernel channels at t + Delta (-1: lost),
    clock channels at the first later step that begins after completion."""
    steps = step_start.shape[1] - 1
    land = {}
    for nm in names:
        if nm in draws.kernel_channels:
            k = draws.service[nm]
            land[nm] = np.where(k < 0, -1, np.arange(steps)[None, :, None] + k)
        else:
            land[nm] = landing_step(step_start[:, :steps], end[nm])
    return land


def landing_step(step_start: np.ndarray, completion: np.ndarray) -> np.ndarray:
    """Index of the first step after the result's own that begins at or after ``completion``.

    ``step_start``: (lanes, steps) non-decreasing; ``completion``: (lanes, steps,
    batch), the result of step t being usable from step t + 1 on (step t has
    already committed its update). Returns ``steps`` where no step of the run
    begins after it (inf included).
    """
    n, steps = step_start.shape
    flat = completion.reshape(n, -1)
    out = np.empty(flat.shape, dtype=np.int64)
    for i in range(n):  # one searchsorted per lane: O(jobs log steps)
        out[i] = np.searchsorted(step_start[i], flat[i], side="left")
    earliest = np.arange(1, steps + 1)[None, :, None]
    return np.maximum(out.reshape(completion.shape), earliest)


def classify(land: np.ndarray, max_delay: Optional[int], n_steps: int):
    """Status and delay of each result from the step it lands at (async pipeline).

    ``land``: (lanes, steps, batch) landing step, ``>= n_steps`` if after the
    run, ``-1`` if the result is lost. Injected iff it lands within the run and
    within D steps; dropped iff lost, or its age passes D while the run is still
    going (the drop happens at step t + D + 1); otherwise pending at the end.
    """
    t = np.arange(n_steps)[None, :, None]
    lost = land < 0
    age = land - t
    limit = np.inf if max_delay is None else max_delay
    injected = ~lost & (land <= n_steps - 1) & (age <= limit)
    dropped = lost | (~injected & (age > limit) & (t + limit + 1 <= n_steps - 1))
    status = np.full(land.shape, PENDING, dtype=np.int8)
    status[injected] = INJECTED
    status[dropped] = DROPPED
    delay = np.where(injected, age, -1).astype(np.int64)
    return delay, status


def _assemble(draws, names, step_start, land, blocking, submit, start, end, gpu_log=None) -> ArrivalSchedule:
    steps = step_start.shape[1] - 1
    delays, statuses = [], []
    for name in names:
        if blocking:
            ok = land[name] >= 0
            d = np.where(ok, 0, -1).astype(np.int64)
            s = np.where(ok, INJECTED, DROPPED).astype(np.int8)
        else:
            d, s = classify(land[name], draws.max_delay[name], steps)
        delays.append(d)
        statuses.append(s)
    return ArrivalSchedule(
        delay=np.stack(delays, axis=-1),
        status=np.stack(statuses, axis=-1),
        step_start=step_start,
        blocking=blocking,
        channel_names=tuple(names),
        submit_time=np.stack([submit[nm] for nm in names], axis=-1),
        service_start=np.stack([start[nm] for nm in names], axis=-1),
        completion=np.stack([end[nm] for nm in names], axis=-1),
        gpu_batches=gpu_log or None,
        phase=draws.phase,
    )


# ----------------------------------------------------------------------------
# GPU-backed channels (kind gpu_rm): a batcher in front of replicas of an RM.


@dataclass(frozen=True)
class GpuSpec:
    """What both engines need to serve a gpu_rm channel (built from its ``rm`` config)."""

    replicas: int  # gpus / tp
    max_batch: int
    budget: float  # tokens per batch (padded or packed, as ``padded`` says)
    max_wait: float  # seconds a request may wait for its batch to fill
    order: str  # fifo | shortest
    padded: bool
    model: Any  # racsim.service.ServiceModel
    seqs: int  # sequences (requests) per pipeline sample


def gpu_spec(rm: Any, key: str) -> GpuSpec:
    from .service import build_service

    return GpuSpec(replicas=int(rm.gpus) // int(rm.tp), max_batch=int(rm.max_batch), budget=float(rm.token_budget),
                   max_wait=float(rm.max_wait_s), order=str(rm.order), padded=bool(rm.padded),
                   model=build_service(rm, key), seqs=int(rm.sequences_per_sample))


def draw_tokens(rm: Any, rng: np.random.Generator, size, key: str = "rm") -> np.ndarray:
    """Token length of each request: rint(prompt) + rint(response), at least 1 (float64, integer-valued)."""
    prompt = build_latency(rm.prompt_tokens, f"{key}.prompt_tokens").sample(rng, size)
    response = build_latency(rm.response_tokens, f"{key}.response_tokens").sample(rng, size)
    return np.maximum(np.rint(prompt) + np.rint(response), 1.0)


def _billed(spec: GpuSpec, count, tok_sum, mx):
    """Tokens a batch counts against the budget: count x longest when padded, else the sum."""
    return count * mx if spec.padded else tok_sum


class _Waiting:
    """The requests a batcher holds, in the order it serves them: request index
    (fifo) or (tokens, index) (shortest first). Both engines decide with it."""

    def __init__(self, spec: GpuSpec, tokens: List[float], group: int):
        self.spec, self.tok, self.G = spec, tokens, group
        self.fifo = spec.order == "fifo"
        self.keys: list = []
        self.in_group: Dict[int, int] = {}
        self.groups: List[int] = []  # groups with requests waiting, oldest first

    def __len__(self) -> int:
        return len(self.keys)

    def admit(self, g: int) -> None:
        ids = range(g * self.G, (g + 1) * self.G)
        if self.fifo:
            self.keys.extend(ids)
        else:
            for j in ids:
                bisect.insort(self.keys, (self.tok[j], j))
        self.in_group[g] = self.G
        self.groups.append(g)

    def oldest(self) -> int:
        """Group of the longest-waiting request."""
        while self.in_group[self.groups[0]] == 0:
            self.groups.pop(0)
        return self.groups[0]

    def candidate(self):
        """(ids, count, token sum, sum of squares, longest, full): the batch the
        batcher would dispatch now; full when a limit stopped it."""
        s = self.spec
        ids: List[int] = []
        ts = sq = mx = 0.0
        full = False
        for key in self.keys[: s.max_batch + 1]:
            j = key if self.fifo else key[1]
            L = self.tok[j]
            n, m = len(ids) + 1, max(mx, L)
            cost = n * m if s.padded else ts + L
            if ids and (n > s.max_batch or cost > s.budget):
                full = True
                break
            ids.append(j)
            ts, sq, mx = ts + L, sq + L * L, m
        return ids, len(ids), ts, sq, mx, full or len(ids) == s.max_batch

    def remove(self, ids: List[int]) -> None:
        del self.keys[: len(ids)]
        for j in ids:
            self.in_group[j // self.G] -= 1


class _LaneServer:
    """One trial's gpu_rm channel as a plain event loop (the lanes engine's general
    path): decision instants are arrivals, batch completions and flush deadlines."""

    def __init__(self, spec: GpuSpec, tokens: np.ndarray, group: int):
        self.spec, self.G = spec, group
        self.q = _Waiting(spec, tokens.tolist(), group)
        self.arr: List[float] = []
        self.left: List[int] = []  # requests of each group not dispatched yet
        self.admitted = 0
        self.free = [0.0] * spec.replicas
        self.now = -math.inf
        self.disp = np.full(tokens.size, np.nan)
        self.comp = np.full(tokens.size, np.inf)
        self.batches: list = []

    def add_group(self, time: float) -> None:
        self.arr.append(float(time))
        self.left.append(self.G)

    def _next(self) -> float:
        c = self.arr[self.admitted] if self.admitted < len(self.arr) else math.inf
        if self.q:
            for f in self.free:
                if self.now < f < c:
                    c = f
            d = self.arr[self.q.oldest()] + self.spec.max_wait
            if self.now < d < c:
                c = d
        return c

    def _decide(self, tau: float) -> None:
        while self.admitted < len(self.arr) and self.arr[self.admitted] <= tau:
            self.q.admit(self.admitted)
            self.admitted += 1
        w = self.spec.max_wait
        while self.q:
            idle = [r for r, f in enumerate(self.free) if f <= tau]
            if not idle:
                break
            ids, n, ts, sq, mx, full = self.q.candidate()
            if not (full or self.arr[self.q.oldest()] + w <= tau):
                break
            end = tau + float(self.spec.model.seconds(np.float64(n), ts, sq, mx))
            self.free[idle[0]] = end
            self.q.remove(ids)
            for j in ids:
                self.disp[j], self.comp[j] = tau, end
                self.left[j // self.G] -= 1
            self.batches.append((idle[0], tau, end, n, _billed(self.spec, float(n), ts, mx), min(ids) // self.G))
        self.now = tau

    def run(self, stop=None) -> None:
        """Process decision instants in time order until ``stop(instant)`` or none is left."""
        while True:
            tau = self._next()
            if tau == math.inf or (stop is not None and stop(tau)):
                return
            self._decide(tau)


@dataclass
class _FifoLanes:
    """State of a FIFO batcher on every lane for :func:`_fifo_lanes`."""

    head: np.ndarray  # (lanes,) first request not dispatched
    free: np.ndarray  # (lanes, replicas) when each replica falls free
    last: np.ndarray  # (lanes,) instant of the last dispatch
    disp: np.ndarray  # (lanes, requests)
    comp: np.ndarray
    log: list
    groups: np.ndarray  # (lanes,) groups arrived by ``last`` (times only grow, so a pointer)

    @classmethod
    def new(cls, lanes: int, requests: int, replicas: int) -> "_FifoLanes":
        return cls(np.zeros(lanes, dtype=np.int64), np.zeros((lanes, replicas)), np.zeros(lanes),
                   np.full((lanes, requests), np.nan), np.full((lanes, requests), np.inf), [],
                   np.zeros(lanes, dtype=np.int64))


def _fifo_lanes(spec: GpuSpec, tok: np.ndarray, cum: np.ndarray, cum2: np.ndarray, group_time: np.ndarray,
                G: int, end: int, st: _FifoLanes) -> None:
    """Dispatch every request below index ``end`` of a FIFO batcher, one batch per
    lane per iteration (vectorised over lanes). The k-th batch from head h leaves at

        tau_k = max(tau_{k-1}, earliest free replica, min(T_full, a_h + max_wait))

    where T_full is the arrival of the request that makes the batch full (the
    max_batch-th, or the first that does not fit; inf if none below ``end``), and
    takes every request from h that has arrived by tau_k, up to the limits. This
    equals the event loop of :class:`_LaneServer` (a test checks it).
    ``group_time``: (lanes, groups) arrival of each group of G requests (inf: not yet known).
    """
    N = tok.shape[1]
    M = spec.max_batch
    offs = np.arange(M)
    while True:
        act = np.flatnonzero(st.head < end)
        if act.size == 0:
            return
        rows = np.arange(act.size)
        h = st.head[act]
        win = h[:, None] + offs
        valid = win < end
        L = tok[act[:, None], np.minimum(win, N - 1)]
        mx = np.maximum.accumulate(L, axis=1)
        cost = (offs + 1.0) * mx if spec.padded else np.cumsum(L, axis=1)
        fits = valid & (cost <= spec.budget)
        fits[:, 0] = True
        n_lim = fits.sum(axis=1)
        nxt = np.minimum(n_lim, M - 1)
        limited = (n_lim == M) | ((n_lim < M) & valid[rows, nxt])
        gt = group_time[act]
        t_max = gt[rows, np.minimum(h + M - 1, N - 1) // G]
        t_next = gt[rows, np.minimum(h + n_lim, N - 1) // G]
        t_full = np.where(n_lim == M, t_max, np.where(limited, t_next, np.inf))
        deadline = gt[rows, h // G] + spec.max_wait
        free = st.free[act]
        tau = np.maximum(np.maximum(st.last[act], free.min(axis=1)), np.minimum(t_full, deadline))
        ng = st.groups[act]  # groups arrived by tau: advance the pointer (a group's time is known before tau)
        while True:
            more = (ng < gt.shape[1]) & (gt[rows, np.minimum(ng, gt.shape[1] - 1)] <= tau)
            if not more.any():
                break
            ng = ng + more
        st.groups[act] = ng
        arrived = np.minimum(ng * G, end)
        n = np.minimum(n_lim, arrived - h)
        ts = cum[act, h + n] - cum[act, h]
        sq = cum2[act, h + n] - cum2[act, h]
        m = mx[rows, n - 1]
        e = tau + spec.model.seconds(n.astype(np.float64), ts, sq, m)
        r = np.argmax(free <= tau[:, None], axis=1)
        free[rows, r] = e
        st.free[act] = free
        rr, cc = np.nonzero(offs[None, :] < n[:, None])
        st.disp[act[rr], win[rr, cc]] = tau[rr]
        st.comp[act[rr], win[rr, cc]] = e[rr]
        st.log.append((act, r, tau, e, n, _billed(spec, n.astype(np.float64), ts, m), h // G))
        st.head[act] = h + n
        st.last[act] = tau


def _prefix(tok: np.ndarray):
    z = np.zeros((tok.shape[0], 1))
    return np.hstack([z, np.cumsum(tok, axis=1)]), np.hstack([z, np.cumsum(tok * tok, axis=1)])


def fast_score_seconds(spec: GpuSpec, tokens: np.ndarray) -> np.ndarray:
    """Seconds a pool takes to score each step's sequences, all handed over at
    once and dispatched at once (no waiting to fill): ``tokens`` (trials, steps,
    sequences) -> (trials, steps)."""
    T, S, G = tokens.shape
    tok = tokens.reshape(T * S, G)
    if spec.order == "shortest":
        tok = np.sort(tok, axis=1, kind="stable")
    now = GpuSpec(**{**spec.__dict__, "max_wait": 0.0})
    st = _FifoLanes.new(T * S, G, spec.replicas)
    cum, cum2 = _prefix(tok)
    _fifo_lanes(now, tok, cum, cum2, np.zeros((T * S, 1)), G, G, st)
    return st.comp.max(axis=1).reshape(T, S)


def _batch_log(rows: list, replicas: int) -> Dict[str, np.ndarray]:
    """Columns of a batch log, sorted by (lane, start, replica); ``replicas`` the pool's size."""
    if rows:
        lane, rep, start, end, size, tokens, step = (np.concatenate([np.asarray(r[k]) for r in rows]) for k in range(7))
    else:
        lane = rep = size = step = np.zeros(0, dtype=np.int64)
        start = end = tokens = np.zeros(0)
    order = np.lexsort((rep, start, lane))
    return {"lane": lane.astype(np.int64)[order], "replica": rep.astype(np.int64)[order],
            "start": start.astype(np.float64)[order], "end": end.astype(np.float64)[order],
            "size": size.astype(np.int64)[order], "tokens": tokens.astype(np.float64)[order],
            "step": step.astype(np.int64)[order],
            "replicas": np.array(replicas, dtype=np.int64)}


def _per_sample(disp: np.ndarray, comp: np.ndarray, shape):
    """Requests (lanes, steps * batch * seqs) -> per sample (first dispatch, last completion)."""
    d = disp.reshape(shape)
    c = comp.reshape(shape)
    return d.min(axis=-1), c.max(axis=-1)


class _GpuLanes:
    """A gpu_rm channel in the lanes engine, all trials."""

    def __init__(self, draws: "PipelineDraws", name: str, blocking: bool, timeout: Optional[float], loop: bool):
        self.spec = spec = draws.gpu[name]
        tok4 = draws.service[name]
        self.shape = tok4.shape
        n, steps, batch, seqs = tok4.shape
        self.G = batch * seqs
        self.tok = tok4.reshape(n, steps * self.G)
        self.vector = not loop and spec.order == "fifo" and (not blocking or timeout is None)
        if self.vector:
            self.st = _FifoLanes.new(n, self.tok.shape[1], spec.replicas)
            self.cum, self.cum2 = _prefix(self.tok)
            self.group_time = np.full((n, steps), np.inf)
        else:
            self.servers = [_LaneServer(spec, self.tok[i], self.G) for i in range(n)]

    def run_async(self, submit_time: np.ndarray) -> None:
        """Every group's arrival known: serve them all. ``submit_time``: (lanes, steps)."""
        if self.vector:
            self.group_time[:] = submit_time
            _fifo_lanes(self.spec, self.tok, self.cum, self.cum2, self.group_time, self.G, self.tok.shape[1], self.st)
            return
        for srv, row in zip(self.servers, submit_time):
            for a in row:
                srv.add_group(a)
            srv.run()

    def step_blocking(self, t: int, now: np.ndarray, timeout: Optional[float]) -> np.ndarray:
        """Group t arrives at ``now``; serve until it is all dispatched (or the wait
        times out). Returns when the group's last result is back (inf: not known by the timeout)."""
        G = self.G
        if self.vector:
            self.group_time[:, t] = now
            _fifo_lanes(self.spec, self.tok, self.cum, self.cum2, self.group_time, G, (t + 1) * G, self.st)
            return self.st.comp[:, t * G:(t + 1) * G].max(axis=1)
        out = np.empty(len(self.servers))
        lim = np.inf if timeout is None else timeout
        for i, srv in enumerate(self.servers):
            srv.add_group(now[i])
            until = now[i] + lim
            srv.run(lambda tau: srv.left[t] == 0 or tau >= until)
            out[i] = srv.comp[t * G:(t + 1) * G].max() if srv.left[t] == 0 else np.inf
        return out

    def finish(self):
        """Serve what is left; (first dispatch, last completion) per sample and the batch log."""
        if self.vector:
            disp, comp, rows = self.st.disp, self.st.comp, self.st.log
        else:
            for srv in self.servers:
                srv.run()
            disp = np.stack([s.disp for s in self.servers])
            comp = np.stack([s.comp for s in self.servers])
            rows = [(np.full(len(s.batches), i), *zip(*s.batches)) for i, s in enumerate(self.servers) if s.batches]
            rows = [tuple(np.asarray(c) for c in r) for r in rows]
        start, end = _per_sample(disp, comp, self.shape)
        return start, end, _batch_log(rows, self.spec.replicas)


def _late_event_class():
    import simpy

    class _Late(simpy.events.Event):
        """An event at the current instant that SimPy processes after every other
        event of that instant (priorities: URGENT 0, NORMAL 1, this one 2), as
        :class:`simpy.events.Timeout` does at NORMAL."""

        def __init__(self, env):
            super().__init__(env)
            self._ok = True
            self._value = None
            env.schedule(self, 2)

    return _Late


class _SimpyServer:
    """One trial's gpu_rm channel in SimPy: a batcher process, a ``Resource`` per
    replica, a process per batch, and a flush timer per arriving group."""

    def __init__(self, env, spec: GpuSpec, tokens: np.ndarray, group: int, steps: int, late_cls, lane: int):
        import simpy

        self.env, self.spec, self.G, self.Late, self.lane = env, spec, group, late_cls, lane
        self.q = _Waiting(spec, tokens.tolist(), group)
        self.gpus = [simpy.Resource(env, capacity=1) for _ in range(spec.replicas)]
        self.arr: List[float] = [math.nan] * steps
        self.left = [group] * steps
        self.done = [env.event() for _ in range(steps)]
        self.disp = np.full(tokens.size, np.nan)
        self.comp = np.full(tokens.size, np.inf)
        self.batches: list = []
        self.wake = env.event()
        env.process(self._batcher())

    def arrive(self, g: int) -> None:
        self.arr[g] = self.env.now
        self.q.admit(g)
        self.env.timeout(self.spec.max_wait).callbacks.append(self._poke)
        self._poke()

    def _poke(self, _=None) -> None:
        if not self.wake.triggered:
            self.wake.succeed()

    def _batcher(self):
        while True:
            yield self.wake
            self.wake = self.env.event()
            yield self.Late(self.env)  # decide once the instant's arrivals and completions are in
            self._decide(self.env.now)

    def _decide(self, tau: float) -> None:
        w = self.spec.max_wait
        while self.q:
            idle = [r for r, res in enumerate(self.gpus) if res.count == 0]
            if not idle:
                break
            ids, n, ts, sq, mx, full = self.q.candidate()
            if not (full or self.arr[self.q.oldest()] + w <= tau):
                break
            req = self.gpus[idle[0]].request()  # granted at once: the replica is idle
            seconds = float(self.spec.model.seconds(np.float64(n), ts, sq, mx))
            self.q.remove(ids)
            self.disp[ids] = tau
            self.env.process(self._serve(idle[0], req, ids, seconds, _billed(self.spec, float(n), ts, mx)))

    def _serve(self, r: int, req, ids: List[int], seconds: float, billed: float):
        yield req
        start = self.env.now
        yield self.env.timeout(seconds)
        self.gpus[r].release(req)
        self.comp[ids] = self.env.now
        self.batches.append((self.lane, r, start, self.env.now, len(ids), billed, min(ids) // self.G))
        for j in ids:
            g = j // self.G
            self.left[g] -= 1
            if self.left[g] == 0:
                self.done[g].succeed()
        self._poke()


# ----------------------------------------------------------------------------
# Lanes engine: numpy over trials.


def run_lanes(draws: PipelineDraws, blocking: bool, wait_timeout: Optional[float] = None, *,
              gpu_loop: bool = False) -> ArrivalSchedule:
    """Vectorised engine: every trial is a lane; one array operation per job position.
    gpu_rm channels: see :class:`_GpuLanes` (``gpu_loop`` forces the per-lane event loop)."""
    gen, fast, sub, upd = draws.phase
    n, steps = gen.shape
    names = list(draws.service)
    batch = next(iter(draws.service.values())).shape[2]
    gpus = {nm: _GpuLanes(draws, nm, blocking, wait_timeout, gpu_loop) for nm in draws.gpu}
    resumed = np.empty((n, steps))
    step_start = np.zeros((n, steps + 1))
    submit = {nm: np.empty((n, steps, batch)) for nm in names}
    start = {nm: np.empty((n, steps, batch)) for nm in names}
    end = {nm: np.empty((n, steps, batch)) for nm in names}
    land = {nm: np.empty((n, steps, batch), dtype=np.int64) for nm in names}
    free = {nm: np.zeros((n, draws.workers[nm])) for nm in names if _queued(draws, nm)}
    timeout = np.inf if wait_timeout is None else wait_timeout
    for t in range(steps):
        now = step_start[:, t] + gen[:, t]
        now = now + fast[:, t]
        now = now + sub[:, t]
        done = now  # the time the optimizer may update, if it waits
        for nm in names:
            arr = np.repeat(now[:, None], batch, axis=1)
            if nm in gpus:
                submit[nm][:, t] = arr
                land[nm][:, t] = 0
                if blocking:
                    done = np.maximum(done, gpus[nm].step_blocking(t, now, wait_timeout))
                continue
            s, e, lost = _serve(draws, nm, t, arr, free.get(nm))
            submit[nm][:, t], start[nm][:, t], end[nm][:, t] = arr, s, e
            if blocking:
                done = np.maximum(done, np.where(lost, arr, e).max(axis=1))
            land[nm][:, t] = np.where(lost, -1, 0)
        if blocking:
            done = np.minimum(done, now + timeout)
            resumed[:, t] = done
            for nm in names:
                if nm not in gpus:
                    late = end[nm][:, t] > done[:, None]
                    land[nm][:, t] = np.where(late, -1, land[nm][:, t])
        step_start[:, t + 1] = done + upd[:, t]
    gpu_log = {}
    for nm, g in gpus.items():
        if not blocking:
            g.run_async(submit[nm][:, :, 0])
        start[nm], end[nm], gpu_log[nm] = g.finish()
        if blocking:  # late = completed after the optimizer resumed (ties count as in time)
            land[nm] = np.where(end[nm] > resumed[:, :, None], -1, 0)
    if not blocking:
        land.update(_async_landing(draws, names, step_start, end))
    return _assemble(draws, names, step_start, land, blocking, submit, start, end, gpu_log)


def _queued(draws: PipelineDraws, name: str) -> bool:
    return draws.workers[name] is not None and name not in draws.kernel_channels and name not in draws.gpu


def _service_seconds(draws: PipelineDraws, name: str, t: int):
    """Service time of step t's jobs and whether each is lost (kernel missing mass)."""
    s = draws.service[name][:, t]
    if name in draws.kernel_channels:
        lost = s < 0
        # A kernel channel on the clock: Delta steps of nominal step time.
        return np.where(lost, 0.0, s * draws.nominal_step), lost
    return s, np.zeros(s.shape, dtype=bool)


def _serve(draws, name, t, arrival, free):
    service, lost = _service_seconds(draws, name, t)
    if free is None:
        start = arrival.copy()
        end = arrival + service
    else:
        start, end = fifo_assign(arrival, service, free)
    end = np.where(lost, np.inf, end)
    return start, end, lost


# ----------------------------------------------------------------------------
# SimPy engine: the engine of record.


def run_simpy(draws: PipelineDraws, blocking: bool, wait_timeout: Optional[float] = None) -> ArrivalSchedule:
    """One SimPy environment per trial: an optimizer process, and for queued
    channels one process per job on a ``simpy.Resource`` of c workers."""
    import simpy

    gen, fast, sub, upd = draws.phase
    n, steps = gen.shape
    names = list(draws.service)
    batch = next(iter(draws.service.values())).shape[2]
    step_start = np.zeros((n, steps + 1))
    submit = {nm: np.empty((n, steps, batch)) for nm in names}
    start = {nm: np.empty((n, steps, batch)) for nm in names}
    end = {nm: np.full((n, steps, batch), np.inf) for nm in names}
    land = {nm: np.zeros((n, steps, batch), dtype=np.int64) for nm in names}
    late_cls = _late_event_class() if draws.gpu else None
    gpu_rows: Dict[str, list] = {nm: [] for nm in draws.gpu}

    for i in range(n):
        env = simpy.Environment()
        pools = {nm: simpy.Resource(env, capacity=draws.workers[nm]) for nm in names if _queued(draws, nm)}
        servers = {}
        for nm, spec in draws.gpu.items():
            tok4 = draws.service[nm]
            servers[nm] = _SimpyServer(env, spec, tok4[i].ravel(), batch * spec.seqs, steps, late_cls, i)

        def job(nm, t, b, service):
            with pools[nm].request() as req:
                yield req
                start[nm][i, t, b] = env.now
                yield env.timeout(service)
                end[nm][i, t, b] = env.now

        def optimizer():
            for t in range(steps):
                step_start[i, t] = env.now
                yield env.timeout(gen[i, t])
                yield env.timeout(fast[i, t])
                yield env.timeout(sub[i, t])
                waits = []
                for nm in names:
                    if nm in servers:
                        submit[nm][i, t] = env.now
                        servers[nm].arrive(t)
                        waits.append(servers[nm].done[t])
                        continue
                    service, lost = _service_seconds(draws, nm, t)
                    service, lost = service[i], lost[i]
                    submit[nm][i, t] = env.now
                    land[nm][i, t] = np.where(lost, -1, 0)
                    if nm in pools:
                        procs = [env.process(job(nm, t, b, service[b])) for b in range(batch)]
                        waits += [p for p, gone in zip(procs, lost) if not gone]
                    else:
                        start[nm][i, t] = env.now
                        end[nm][i, t] = np.where(lost, np.inf, env.now + service)
                        if (~lost).any():  # one event for the whole batch
                            waits.append(env.timeout(service[~lost].max()))
                if blocking:
                    if wait_timeout is None:
                        yield env.all_of(waits)
                    else:
                        yield env.all_of(waits) | env.timeout(wait_timeout)
                    resumed[t] = env.now
                yield env.timeout(upd[i, t])
            step_start[i, steps] = env.now

        resumed = np.empty(steps)  # when the blocking optimizer stopped waiting
        env.process(optimizer())
        env.run()  # runs on until every job is served, after the last step too
        for nm, srv in servers.items():
            shape = draws.service[nm].shape[1:]
            start[nm][i], end[nm][i] = _per_sample(srv.disp, srv.comp, shape)
            gpu_rows[nm].append(tuple(np.asarray(c) for c in zip(*srv.batches)) if srv.batches else None)
        if blocking:  # late = completed after the optimizer resumed (ties count as in time)
            for nm in names:
                land[nm][i] = np.where(end[nm][i] > resumed[:, None], -1, land[nm][i])

    if not blocking:
        land.update(_async_landing(draws, names, step_start, end))
    gpu_log = {nm: _batch_log([r for r in rows if r is not None], draws.gpu[nm].replicas)
               for nm, rows in gpu_rows.items()}
    return _assemble(draws, names, step_start, land, blocking, submit, start, end, gpu_log)


ENGINES = {"lanes": run_lanes, "simpy": run_simpy}


def simulate(
    pcfg: PipelineConf,
    n_trials: int,
    rng: np.random.Generator,
    *,
    blocking: bool = False,
    wait_timeout: Optional[float] = None,
    engine: Optional[str] = None,
    draws: Optional[PipelineDraws] = None,
) -> ArrivalSchedule:
    """Simulate ``n_trials`` independent runs of the pipeline; see the module docstring."""
    if draws is None:
        draws = draw(pcfg, n_trials, rng)
    return ENGINES[engine or pcfg.engine](draws, blocking, wait_timeout)
