"""The lanes engine: every trial is a lane of numpy arrays, one vectorised operation per
job position; gpu_rm channels by a vectorised FIFO batcher recursion or a per-lane
event loop. Bit-identical to the SimPy engine on the same draws (tests say so).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import replace
from typing import Callable, Dict, List, Optional

import numpy as np

from racsim.pipeline.batcher import (
    GpuSpec,
    _batch_log,
    _fifo_lanes,
    _per_sample,
    _prefix,
)
from racsim.pipeline.arrivals import group_arrivals, groups_per_step, in_ready_order, ready_pool, step_arrivals
from racsim.pipeline.autoscale import AutoLanes
from racsim.pipeline.background import BackgroundStream, background_log
from racsim.pipeline.chains import Steps
from racsim.pipeline.cbatch import fifo_lanes, lanes_state, waiting
from racsim.pipeline.draws import PipelineDraws, _queued, _service_seconds
from racsim.pipeline.faults import resend_attempt
from racsim.pipeline.landing import _assemble, _async_landing, drop_deadline
from racsim.pipeline.schedule import ArrivalSchedule
from racsim.pipeline.shared import SharedLanes
from racsim.pipeline.workers import Cursor, fifo_assign_faults


def fifo_assign(arrival: np.ndarray, service: np.ndarray, free: np.ndarray, deadline: Optional[np.ndarray] = None):
    """Serve jobs in arrival order on identical workers (FIFO multi-server queue).

    ``arrival``/``service``: (lanes, jobs), jobs sorted by arrival within a lane;
    ``free``: (lanes, c) time each worker next falls free (updated in place).
    Each job takes the earliest-free worker, which is exactly FIFO service.
    ``deadline`` (lanes, jobs), with ``cancel_on_drop``, non-decreasing in arrival
    order (as the pipeline's are; one before the arrival counts as the arrival): a job
    that would complete after its deadline, or start at it, is cancelled there: it
    leaves the queue, or frees its worker, at the deadline (its start and completion
    read min(start, deadline) and the deadline). Returns (start, completion,
    cancelled), each (lanes, jobs).
    """
    lanes = np.arange(arrival.shape[0])
    start = np.empty_like(arrival)
    end = np.empty_like(arrival)
    dl = None if deadline is None else np.maximum(deadline, arrival)
    for j in range(arrival.shape[1]):
        w = np.argmin(free, axis=1)
        s = np.maximum(arrival[:, j], free[lanes, w])
        e = s + service[:, j]
        start[:, j], end[:, j] = s, e
        # Deadlines in FIFO order: every worker is free by the head job's deadline, so a
        # job still waiting at its own deadline finds a worker free there and leaves.
        free[lanes, w] = e if dl is None else np.minimum(e, dl[:, j])
    if dl is None:
        return start, end, np.zeros(arrival.shape, dtype=bool)
    cut = (end > dl) | (start >= dl)
    return np.minimum(start, dl), np.minimum(end, dl), cut


class _LaneServer:
    """One trial's gpu_rm channel as a plain event loop (the lanes engine's general
    path): decision instants are arrivals, batch completions, flush deadlines and, with
    faults, repairs of idle replicas;
    at each, the batcher's rule (:meth:`_Waiting.dispatch`) says what leaves. With
    ``on_failure: resend`` a batch cut by its replica's failure at d waits in ``again``
    (ordered by (d, replica)) and, from d on, takes the first idle replica that is up,
    ahead of the batcher (lowest index first), restarting from scratch."""

    def __init__(self, spec: GpuSpec, tokens: np.ndarray, group: int, slow: Optional[np.ndarray] = None,
                 faults=None, lane: int = 0, other: Optional[BackgroundStream] = None):
        self.spec, self.G = spec, group
        self.others = None if other is None else _Others(other, lane)  # other tenants' requests
        self.faults, self.lane = faults, lane  # a faults.Timeline: replicas go down (None: never)
        self.lost = np.zeros(tokens.size, dtype=bool)
        self.q = waiting(spec, tokens, group, slow)
        self.arr: List[float] = []
        self.left: List[int] = []  # requests of each group not dispatched yet (their last chunk, if chunked)
        self.admitted = 0
        self.free = [0.0] * spec.replicas
        self.now = -math.inf
        self.disp = np.full(tokens.size, np.nan)
        self.comp = np.full(tokens.size, np.inf)
        self.batches: list = []
        self.again: list = []  # heap of batches cut by a failure, to re-send: (cut instant, replica, tries, batch)

    def add_group(self, time: float) -> None:
        self.arr.append(float(time))
        self.left.append(self.G)

    def _next(self) -> float:
        c = self.arr[self.admitted] if self.admitted < len(self.arr) else math.inf
        if self.others is not None:
            c = min(c, self.others.next())
        if self.q or self.again:  # a cut batch's instant is its replica's free
            for r, f in enumerate(self.free):
                if f <= self.now and self.faults is not None:  # idle: back when repaired
                    f = self.faults.next_up(self.lane, r, self.now)
                if self.now < f < c:
                    c = f
        if self.q:
            d = self.q.deadline(self.arr)
            if self.now < d < c:
                c = d
        return c

    def _decide(self, tau: float) -> None:
        while True:  # arrivals up to tau in arrival order (a tie: the learner's group first)
            a = self.arr[self.admitted] if self.admitted < len(self.arr) else math.inf
            o = math.inf if self.others is None else self.others.next()
            if a <= tau and a <= o:
                self.q.admit(self.admitted)
                self.admitted += 1
            elif o <= tau:
                self.others.admit(self.q)
            else:
                break
        idle = [r for r, f in enumerate(self.free) if f <= tau]
        if self.faults is not None:
            idle = [r for r in idle if self.faults.next_up(self.lane, r, tau) == tau]
        while self.again and self.again[0][0] <= tau and idle:  # re-sent batches first
            _, _, tries, b = heapq.heappop(self.again)
            self._start(replace(b, replica=idle.pop(0)), tau, tries)
        for b in self.q.dispatch(idle, tau, self.arr):
            for j in b.starts:
                if j >= 0:
                    self.disp[j] = tau
                else:
                    self.others.start[j] = tau
            self._start(b, tau, 0)
        self.now = tau

    def _start(self, b, tau: float, tries: int) -> None:
        """Batch ``b`` starts on its replica at ``tau`` (its ``tries``-th re-send): it completes, or
        a failure cuts it (:meth:`Timeline.serve`'s rule; with resend, one attempt, then ``again``)."""
        end, lost = tau + b.seconds, False
        if self.faults is not None and self.faults.spec.resend:
            end, lost = resend_attempt(self.faults, self.lane, b.replica, tau, b.seconds, tries)
            if lost is None:  # cut: its replica free (down) at the failure, the batch re-sent from then
                self.free[b.replica] = end
                self.batches.append((b.replica, tau, end, len(b.ids), b.billed, b.group, 0.0))
                heapq.heappush(self.again, (end, b.replica, tries + 1, b))
                return
        elif self.faults is not None:
            end, lost = self.faults.serve(self.lane, b.replica, tau, b.seconds)
        self.free[b.replica] = end
        for j in b.ends:
            if j < 0:
                self.others.done(j, end)
                continue
            self.comp[j], self.lost[j] = end, lost
            self.left[j // self.G] -= 1
        row = (b.replica, tau, end, len(b.ids), b.billed, b.group)
        self.batches.append(row if self.faults is None else (*row, 0.0 if lost else b.seconds))

    def end_others(self, until: float) -> None:
        """Other tenants' requests arrive until ``until`` (the run's end), none after."""
        if self.others is not None:
            self.others.until = float(until)

    def run(self, stop=None) -> None:
        """Process decision instants in time order until ``stop(instant)`` or none is left."""
        while True:
            tau = self._next()
            if tau == math.inf or (stop is not None and stop(tau)):
                return
            self._decide(tau)


class _Others:
    """Other tenants' requests on one lane of a gpu_rm pool (racsim/pipeline/background.py):
    admitted to the batcher as they arrive, up to ``until`` (the run's end, once known), and
    logged (:attr:`log`: lane, arrival, dispatch, completion) as they complete."""

    def __init__(self, stream: BackgroundStream, lane: int):
        self.stream, self.lane = stream, lane
        self.k = 0  # the next request not admitted
        self.until = math.inf
        self.start: Dict[int, float] = {}  # request id -> dispatch
        self.log: tuple = ([], [], [], [])

    def next(self) -> float:
        """The next request's arrival (inf: none left by ``until``)."""
        a = self.stream.first(self.lane, self.k)[0]
        return a if a <= self.until else math.inf

    def admit(self, q) -> None:
        a, tokens = self.stream.first(self.lane, self.k)
        q.admit_other(self.k, tokens, a)
        self.k += 1

    def done(self, j: int, end: float) -> None:
        """Request id ``j`` (< 0) completed at ``end``."""
        for col, x in zip(self.log, (self.lane, self.stream.first(self.lane, -j - 1)[0], self.start.pop(j), end)):
            col.append(x)


class _GpuLanes:
    """A gpu_rm channel in the lanes engine, all trials."""

    def __init__(self, draws: "PipelineDraws", name: str, blocking: bool, timeout: Optional[float], loop: bool):
        self.spec = spec = draws.gpu[name]
        tok4 = draws.service[name]
        self.shape = tok4.shape
        n, steps, batch, seqs = tok4.shape
        # pipeline.arrivals other than batch: one group per sample, in ready order (arrivals.ReadyPool)
        self.ready = None if draws.offset is None else ready_pool(draws.offset)
        self.per = groups_per_step(self.ready)
        self.G = batch * seqs // self.per
        self.tok = tok4.reshape(n, steps * batch * seqs)
        if self.ready is not None:
            self.tok = self.ready.to_ready(self.tok)
        self.faults = faults = draws.faults.get(name)
        other = draws.background.get(name)  # other tenants' requests (racsim/pipeline/background.py)
        self.vector = not loop and spec.order == "fifo" and (not blocking or timeout is None)
        self.slow = draws.slowdown.get(name)  # bursts: (lanes, steps) factor on batch seconds
        if self.ready is not None:
            self.slow = self.ready.slow(self.slow)  # per group
        self.shared = None  # a pool shared with them: merged into the vectorised rule (racsim/pipeline/shared.py)
        # a step's requests at one instant: served a step at a time in light passes (racsim/pipeline/chains.py)
        self.steps = None
        if self.vector and other is not None:
            self.shared = SharedLanes(spec, self.tok, self.G, BackgroundStream(other, n))
        elif self.vector:
            self.st = lanes_state(spec, n, self.tok.shape[1])
            self.cum, self.cum2 = _prefix(self.tok, spec.padded)
            self.group_time = np.full((n, steps * self.per), np.inf)
            if faults is not None:  # static or unchunked continuous batches (no chunked prefill with faults)
                self.st.lost = np.zeros(self.tok.shape, dtype=bool)
            # with faults, blocking only: an asynchronous pool's lanes are often backlogged, where
            # the light passes gain nothing on _fifo_lanes
            if self.ready is None and not spec.chunked and (faults is None or blocking):
                self.steps = Steps(spec, self.tok, self.cum, self.cum2, self.G, self.slow, self.st, self.group_time,
                                   faults)
        else:
            stream = None if other is None else BackgroundStream(other, n)
            self.servers = [_LaneServer(spec, self.tok[i], self.G, None if self.slow is None else self.slow[i],
                                        faults, i, stream) for i in range(n)]

    def _fifo(self, end: int, tick: Optional[Callable[[float], None]] = None) -> None:
        """The vectorised FIFO rule up to request ``end`` (with faults, batcher's, which has outages)."""
        if self.faults is None:
            fifo_lanes(self.spec, self.tok, self.cum, self.cum2, self.group_time, self.G, end, self.st, self.slow,
                       tick)
        else:
            _fifo_lanes(self.spec, self.tok, self.cum, self.cum2, self.group_time, self.G, end, self.st, self.slow,
                        self.faults, tick=tick)

    def run_async(self, submit: np.ndarray, until: np.ndarray, tick: Optional[Callable[[float], None]] = None) -> None:
        """Every sample's submission known: serve them all. ``submit``: (lanes, steps, batch);
        ``until``: (lanes,) the run's end (other tenants' requests arrive until then); ``tick(share)``:
        told the share served as it goes."""
        submit_time = group_arrivals(self.ready, submit)
        if self.shared is not None:
            self.shared.add(submit_time, until)
            return
        if self.vector:
            self.group_time[:] = submit_time
            if self.steps is None:
                self._fifo(self.tok.shape[1], tick)
                return
            for t in range(self.shape[1]):
                nxt = submit_time[:, t + 1] if t + 1 < self.shape[1] else np.full(submit_time.shape[0], np.inf)
                self.steps.step(t, submit_time[:, t], nxt)
                if tick is not None:
                    tick((t + 1) / self.shape[1])
            return
        for i, (srv, row, end) in enumerate(zip(self.servers, submit_time, until)):
            for a in row:
                srv.add_group(a)
            srv.end_others(end)
            srv.run()
            if tick is not None:
                tick((i + 1) / len(self.servers))

    def step_blocking(self, t: int, now: np.ndarray, timeout: Optional[float], ready: np.ndarray) -> np.ndarray:
        """Step t's groups arrive (at ``now``, or with arrivals over time at ``ready``, (lanes,
        batch): :func:`step_arrivals`); serve until they are all dispatched (or the wait, from ``now``, times out).
        Returns when the step's last result is back (inf: not known by the timeout)."""
        G, lo, hi = self.G, t * self.per, (t + 1) * self.per  # the step's groups
        times = step_arrivals(self.ready, t, now, ready)
        if self.shared is not None:
            self.shared.add(times)
            return self.shared.st.comp[np.arange(times.shape[0])[:, None], self.shared.pos[:, lo * G:hi * G]].max(axis=1)
        if self.steps is not None:  # the optimizer waits: the next step's requests come after every result
            self.group_time[:, t] = times[:, 0]
            return self.steps.step(t, times[:, 0], np.full(times.shape[0], np.inf))
        if self.vector:
            self.group_time[:, lo:hi] = times
            self._fifo(hi * G)
            return self.st.comp[:, lo * G:hi * G].max(axis=1)
        out = np.empty(len(self.servers))
        lim = np.inf if timeout is None else timeout
        for i, srv in enumerate(self.servers):
            for a in times[i]:
                srv.add_group(a)
            until = now[i] + lim
            srv.run(lambda tau: not any(srv.left[lo:hi]) or tau >= until)
            out[i] = srv.comp[lo * G:hi * G].max() if not any(srv.left[lo:hi]) else np.inf
        return out

    def others_log(self) -> dict:
        """Other tenants' requests served by every lane (:func:`background_log`)."""
        if self.shared is not None:
            return self.others
        logs = [srv.others.log for srv in self.servers]
        return background_log(*([np.array([x for log in logs for x in log[k]], dtype=np.float64)] for k in range(4)))

    def finish(self, until: np.ndarray):
        """Serve what is left (other tenants' requests: those arriving by ``until``, (lanes,) the
        run's end); (first dispatch, last completion) per sample and the batch log."""
        lost = None
        if self.shared is not None:
            self.st, self.others = self.shared.finish(until)
        if self.vector:
            disp, comp, rows, lost = self.st.disp, self.st.comp, self.st.log, self.st.lost
        else:
            for srv, end in zip(self.servers, until):
                srv.end_others(end)
                srv.run()
            disp = np.stack([s.disp for s in self.servers])
            lost = np.stack([s.lost for s in self.servers])
            comp = np.stack([s.comp for s in self.servers])
            rows = [(np.full(len(s.batches), i), *zip(*s.batches)) for i, s in enumerate(self.servers) if s.batches]
            rows = [tuple(np.asarray(c) for c in r) for r in rows]
        if self.ready is not None:  # back to sample order; a batch's group to its step
            disp, comp = self.ready.from_ready(disp), self.ready.from_ready(comp)
            lost = None if lost is None else self.ready.from_ready(lost)
            rows = [(*r[:6], np.asarray(r[6]) // self.per, *r[7:]) for r in rows]
        start, end = _per_sample(disp, comp, self.shape)
        self.failed = None if lost is None else lost.reshape(self.shape).any(axis=-1)  # (lanes, steps, batch)
        if self.failed is not None:  # a sample with a request lost to a failure never completes
            end[self.failed] = np.inf
        return start, end, _batch_log(rows, self.spec.replicas)


def run_lanes(draws: PipelineDraws, blocking: bool, wait_timeout: Optional[float] = None,
              tick: Optional[Callable[[float], None]] = None, *, gpu_loop: bool = False) -> ArrivalSchedule:
    """Vectorised engine: every trial is a lane; one array operation per job position.
    gpu_rm channels: see :class:`_GpuLanes` (``gpu_loop`` forces the per-lane event loop).
    ``tick(share)``: told the share of the simulation done: the steps, then each gpu_rm pool's serving
    of the requests they sent it (asynchronous: served once every submission is known), equal parts."""
    gen, fast, sub, upd = draws.phase
    n, steps = gen.shape
    names = list(draws.service)
    batch = next(iter(draws.service.values())).shape[2]
    gpus = {nm: _GpuLanes(draws, nm, blocking, wait_timeout, gpu_loop) for nm in draws.gpu if nm not in draws.autoscale}
    gpus.update({nm: AutoLanes(draws, nm) for nm in draws.autoscale})  # served like gpu_rm channels
    resumed = np.empty((n, steps))
    step_start = np.zeros((n, steps + 1))
    submit = {nm: np.empty((n, steps, batch)) for nm in names}
    start = {nm: np.empty((n, steps, batch)) for nm in names}
    end = {nm: np.empty((n, steps, batch)) for nm in names}
    land = {nm: np.empty((n, steps, batch), dtype=np.int64) for nm in names}
    free = {nm: np.zeros((n, draws.workers[nm])) for nm in names if _queued(draws, nm)}
    cut = {nm: np.zeros((n, steps, batch), dtype=bool) for nm in names}  # cancelled (cancel_on_drop)
    cursors = {nm: Cursor(draws.faults[nm]) for nm in free if nm in draws.faults}  # workers that fail
    lost_q = {nm: np.zeros((n, steps, batch), dtype=bool) for nm in cursors}  # lost to a worker's failure
    timeout = np.inf if wait_timeout is None else wait_timeout
    bg = {nm: _Background(BackgroundStream(spec, n))  # other tenants on a queue (a gpu_rm pool's: its _GpuLanes)
          for nm, spec in draws.background.items() if nm not in draws.gpu}
    serving = [] if blocking else [nm for nm in gpus if nm not in draws.autoscale]  # pools served after the steps
    part = 1.0 / (1 + len(serving))  # the steps' share of the simulation, and each such pool's
    for t in range(steps):
        now = step_start[:, t] + gen[:, t]
        now = now + fast[:, t]
        now = now + sub[:, t]
        done = now  # the time the optimizer may update, if it waits
        for nm in names:
            arr = np.repeat(now[:, None], batch, axis=1)
            if draws.offset is not None:  # each sample sent when it is ready (pipeline.arrivals)
                off = draws.offset[:, t]  # open_poisson: < 0 if ready before its step began; a blocking optimizer holds it
                arr = step_start[:, t, None] + (np.maximum(off, 0.0) if blocking else off)
            if nm in gpus:
                submit[nm][:, t] = arr
                land[nm][:, t] = 0
                if blocking:
                    back = gpus[nm].step_blocking(t, now, wait_timeout, arr)  # arr: when each sample is ready
                    done = np.maximum(done, back)
                continue
            submit[nm][:, t] = arr
            if nm in draws.cancel and not blocking:
                continue  # served once the clock is known: its deadlines are step starts
            if nm in cursors:  # ends at the failure instant if lost: a blocking optimizer waits until then
                start[nm][:, t], end[nm][:, t], lost_q[nm][:, t] = _serve_failing(draws, nm, t, arr, free[nm],
                                                                                  cursors[nm])
                if blocking:
                    done = np.maximum(done, end[nm][:, t].max(axis=1))
                land[nm][:, t] = np.where(lost_q[nm][:, t], -1, 0)
                continue
            dl = arr + timeout if nm in draws.cancel else None  # a timed-out result frees its worker
            s, e, lost, cut[nm][:, t] = _serve(draws, nm, t, arr, free.get(nm), dl, bg.get(nm))
            start[nm][:, t], end[nm][:, t] = s, e
            if blocking:
                done = np.maximum(done, np.where(lost, arr, e).max(axis=1))
            land[nm][:, t] = np.where(lost | cut[nm][:, t], -1, 0)
        if blocking:
            done = np.minimum(done, now + timeout)
            resumed[:, t] = done
            for nm in names:
                if nm not in gpus:
                    late = end[nm][:, t] > done[:, None]
                    land[nm][:, t] = np.where(late, -1, land[nm][:, t])
        step_start[:, t + 1] = done + upd[:, t]
        if tick is not None:
            tick(part * (t + 1) / steps)
    gpu_log, pool_log = {}, {}
    for nm, g in gpus.items():
        if nm in draws.autoscale:
            if not blocking:
                g.run_async(submit[nm])
            start[nm], end[nm], blog, pool_log[nm] = g.finish(submit[nm])
            if blog is not None:
                gpu_log[nm] = blog
        else:
            if not blocking:
                j = serving.index(nm) + 1  # its part of the simulation, after the steps and the pools before it
                g.run_async(submit[nm], step_start[:, -1], None if tick is None else
                            lambda share, j=j: tick(part * (j + share)))
            start[nm], end[nm], gpu_log[nm] = g.finish(step_start[:, -1])
        if blocking:  # late = completed after the optimizer resumed (ties count as in time)
            land[nm] = np.where(end[nm] > resumed[:, :, None], -1, 0)
    for nm, b in bg.items():  # the background's requests after the learner's last, until the run's end
        b.serve(np.empty((n, 0)), np.empty((n, 0)), free[nm], step_start[:, -1])
    failed = {nm: gpus[nm].failed for nm in draws.faults if nm in gpus}  # results lost to a server failure
    for nm, f in lost_q.items():
        failed[nm], end[nm] = f, np.where(f, np.inf, end[nm])
    if not blocking:
        for nm in draws.cancel:
            for t in range(steps):
                dl = np.repeat(drop_deadline(step_start, t, draws.max_delay[nm])[:, None], batch, axis=1)
                start[nm][:, t], end[nm][:, t], _, cut[nm][:, t] = _serve(draws, nm, t, submit[nm][:, t], free[nm], dl)
        land.update(_async_landing(draws, names, step_start, end, cut, failed))
    others = {nm: background_log(*b.log) for nm, b in bg.items()}
    others.update({nm: gpus[nm].others_log() for nm in draws.background if nm in draws.gpu})
    return _assemble(draws, names, step_start, land, blocking, submit, start, end, gpu_log, cut, pool_log, failed,
                     others)


class _Background:
    """A queue channel's background stream in the lanes engine, and the log of its requests served."""

    def __init__(self, stream: BackgroundStream):
        self.stream = stream
        self.log: tuple = ([], [], [], [])  # lane, arrival, start, end

    def serve(self, arrival: np.ndarray, service: np.ndarray, free: np.ndarray,
              until: Optional[np.ndarray] = None):
        """FIFO service (:func:`fifo_assign` on ``free``) of the step's jobs (lanes, jobs) and of the
        background requests that arrive by each lane's last job (or by ``until``), in arrival
        order (ties: the step's jobs first). A lane with fewer background requests than another
        is padded with jobs of 0 s at its last arrival, which delay nobody (every later job
        arrives after it). Returns (start, completion, cancelled) of the step's jobs."""
        n, m = arrival.shape
        cut = arrival.max(axis=1) if until is None else until
        taken = [self.stream.take(i, cut[i]) for i in range(n)]
        k = max(len(a) for a, _ in taken)
        arr = np.concatenate([arrival, np.repeat(cut[:, None], k, axis=1)], axis=1)
        svc = np.concatenate([service, np.zeros((n, k))], axis=1)
        for i, (a, sv) in enumerate(taken):
            arr[i, m:m + len(a)], svc[i, m:m + len(a)] = a, sv
        start, end, _ = in_ready_order(lambda a, sv: fifo_assign(a, sv, free), arr, svc)
        for i, (a, _) in enumerate(taken):
            for col, x in zip(self.log, (np.full(len(a), i), a, start[i, m:m + len(a)], end[i, m:m + len(a)])):
                col.append(x)
        return start[:, :m], end[:, :m], np.zeros(arrival.shape, dtype=bool)


def _serve(draws, name, t, arrival, free, deadline=None, background=None):
    """Step t's jobs of a clock channel: (start, completion, lost, cancelled); ``background``: a
    :class:`_Background` whose requests share the workers."""
    service, lost = _service_seconds(draws, name, t)
    if background is not None:  # validated: a fixed queue without faults or cancelling
        start, end, cut = background.serve(arrival, service, free)
    elif free is None:
        start = arrival.copy()
        end = arrival + service
        cut = np.zeros(lost.shape, dtype=bool)
    elif draws.offset is not None:  # samples ready at different seconds: served in the order they arrive
        start, end, cut = in_ready_order(lambda a, s, d: fifo_assign(a, s, free, d), arrival, service, deadline)
    else:
        start, end, cut = fifo_assign(arrival, service, free, deadline)
    if name in draws.routed:  # an unrouted sample was never sent: it keeps its submission time
        sent = draws.routed[name][:, t]
        start, end, cut = np.where(sent, start, arrival), np.where(sent, end, arrival), cut & sent
    end = np.where(lost, np.inf, end)
    return start, end, lost, cut


def _serve_failing(draws, name, t, arrival, free, cur):
    """Step t's jobs of a queue channel whose workers fail: (start, end, lost), a lost job's
    end its failure instant; an unrouted job keeps its submission time, as in :func:`_serve`."""
    service, _ = _service_seconds(draws, name, t)
    sent = draws.routed[name][:, t] if name in draws.routed else None
    assign = lambda a, s, k: fifo_assign_faults(a, s, free, cur, k)  # noqa: E731
    if draws.offset is not None:  # samples ready at different seconds: served in the order they arrive
        start, end, lost = in_ready_order(assign, arrival, service, sent)
    else:
        start, end, lost = assign(arrival, service, sent)
    if sent is not None:
        start, end, lost = np.where(sent, start, arrival), np.where(sent, end, arrival), lost & sent
    return start, end, lost
