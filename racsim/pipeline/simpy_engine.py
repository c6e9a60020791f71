"""The SimPy engine, the engine of record: one environment per trial with an optimizer
process, one process per queued job on a ``simpy.Resource``, and for gpu_rm
channels a batcher process with a ``Resource`` per replica.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import replace
from typing import Callable, Dict, List, Optional

import numpy as np

from racsim.pipeline.arrivals import async_starts, ready_pool
from racsim.pipeline.background import BackgroundStream, background_log
from racsim.pipeline.autoscale import SimpyAutoPool, logs, sample_times
from racsim.pipeline.batcher import GpuSpec, _Batch, _batch_log, _per_sample
from racsim.pipeline.cbatch import waiting
from racsim.pipeline.draws import PipelineDraws, _queued, _service_seconds
from racsim.pipeline.faults import resend_attempt
from racsim.pipeline.instant import EndOfInstant
from racsim.pipeline.landing import _assemble, _async_landing
from racsim.pipeline.schedule import ArrivalSchedule
from racsim.pipeline.workers import SimpyWorkers


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


def _at(env, when: float):
    """An event at the absolute instant ``when`` (NORMAL priority, as a timeout): a timeline's
    outage instant exactly, where a relative timeout's ``now + (when - now)`` can round off it.
    SimPy schedules only relative delays, so this pushes onto its event queue as
    :meth:`simpy.Environment.schedule` does."""
    import simpy

    ev = simpy.events.Event(env)
    ev._ok, ev._value = True, None
    heapq.heappush(env._queue, (when, simpy.events.NORMAL, next(env._eid), ev))
    return ev


class _SimpyServer(EndOfInstant):
    """One trial's gpu_rm channel in SimPy: a batcher process, a ``Resource`` per
    replica, a process per batch, and a flush timer per arriving group; the batcher
    decides by the rule of :meth:`_Waiting.dispatch`."""

    def __init__(self, env, spec: GpuSpec, tokens: np.ndarray, group: int, steps: int, late_cls, lane: int,
                 slow: Optional[np.ndarray] = None, faults=None):
        import simpy

        self.spec, self.G, self.lane = spec, group, lane
        self.faults = faults  # a faults.Timeline: replicas go down (None: never)
        self.lost = np.zeros(tokens.size, dtype=bool)
        self.q = waiting(spec, tokens, group, slow)
        self.gpus = [simpy.Resource(env, capacity=1) for _ in range(spec.replicas)]
        self.arr: List[float] = [math.nan] * steps
        self.left = [group] * steps
        self.done = [env.event() for _ in range(steps)]
        self.disp = np.full(tokens.size, np.nan)
        self.comp = np.full(tokens.size, np.inf)
        self.batches: list = []
        self.again: list = []  # heap of batches cut by a failure, to re-send: (cut instant, replica, tries, batch)
        self.other_start: Dict[int, float] = {}  # other tenants' requests: id -> dispatch
        self.others: tuple = ([], [], [], [])  # and those served: lane, arrival, dispatch, completion
        self._start_decider(env, late_cls)  # decide once the instant's arrivals and completions are in

    def arrive(self, g: int) -> None:
        self.arr[g] = self.env.now
        self.q.admit(g)
        self.env.timeout(self.spec.max_wait).callbacks.append(self._poke)
        self._poke()

    def arrive_other(self, k: int, tokens: float) -> None:
        """Another tenant's request ``k`` arrives now (racsim/pipeline/background.py)."""
        self.q.admit_other(k, tokens, self.env.now)
        self.env.timeout(self.spec.max_wait).callbacks.append(self._poke)
        self._poke()

    def _decide(self, tau: float) -> None:
        idle = [r for r, res in enumerate(self.gpus) if res.count == 0]
        down = [r for r in idle if self.faults is not None and self.faults.next_up(self.lane, r, tau) > tau]
        up = [r for r in idle if r not in down]
        while self.again and up:  # batches cut by a failure (resend) first: their cut instants have come
            _, _, tries, b = heapq.heappop(self.again)
            b = replace(b, replica=up.pop(0))
            self.env.process(self._serve(b, self.gpus[b.replica].request(), tries))
        for b in self.q.dispatch(up, tau, self.arr):
            req = self.gpus[b.replica].request()  # granted at once: the replica is idle
            for j in b.starts:
                if j >= 0:
                    self.disp[j] = tau
                else:
                    self.other_start[j] = tau
            self.env.process(self._serve(b, req))
        if (self.q or self.again) and down:  # wake when the first idle replica that is down is repaired
            back = min(self.faults.next_up(self.lane, r, tau) for r in down)
            _at(self.env, back).callbacks.append(self._poke)

    def _serve(self, b: _Batch, req, tries: int = 0):
        """Batch ``b`` (its ``tries``-th re-send) on its replica: completed, lost, or (resend) cut
        and queued in ``again`` at the failure instant, its replica released."""
        yield req
        start = self.env.now
        lost = yield from self._attempts(b, tries)
        self.gpus[b.replica].release(req)
        if lost is None:  # cut, to re-send
            self.batches.append((self.lane, b.replica, start, self.env.now, len(b.ids), b.billed, b.group, 0.0))
            heapq.heappush(self.again, (self.env.now, b.replica, tries + 1, b))
            self._poke()
            return
        row = (self.lane, b.replica, start, self.env.now, len(b.ids), b.billed, b.group)
        self.batches.append(row if self.faults is None else (*row, 0.0 if lost else b.seconds))
        for j in b.ends:
            if j < 0:  # another tenant's: logged (lane, arrival, dispatch, completion)
                for col, x in zip(self.others, (self.lane, self.q.other_arr[j], self.other_start.pop(j), self.env.now)):
                    col.append(x)
                continue
            self.comp[j] = self.env.now
            self.lost[j] = lost
            g = j // self.G
            self.left[g] -= 1
            if self.left[g] == 0:
                self.done[g].succeed()
        self._poke()

    def _attempts(self, b: _Batch, tries: int):
        """Serve batch ``b`` on its replica through the replica's outages: interrupted at a
        failure, restarted at the repair while retries are left, else lost. Returns lost;
        with resend one attempt (:func:`resend_attempt`): None when cut, to be re-sent."""
        if self.faults is None:
            yield self.env.timeout(b.seconds)
            return False
        if self.faults.spec.resend:
            end, lost = resend_attempt(self.faults, self.lane, b.replica, self.env.now, b.seconds, tries)
            yield (self.env.timeout(b.seconds) if lost is False else _at(self.env, end))
            return lost
        while True:
            down, up = self.faults.outage(self.lane, b.replica, self.env.now)
            if self.env.now + b.seconds <= down:
                yield self.env.timeout(b.seconds)
                return False
            yield _at(self.env, down)  # the replica fails
            if tries == self.faults.spec.retries:
                return True
            tries += 1
            yield _at(self.env, up)  # repaired: start again


def run_simpy(draws: PipelineDraws, blocking: bool, wait_timeout: Optional[float] = None,
              tick: Optional[Callable[[float], None]] = None) -> ArrivalSchedule:
    """One SimPy environment per trial: an optimizer process, and for queued
    channels one process per job on a ``simpy.Resource`` of c workers. ``tick(share)``:
    told the share of the trials simulated after each one."""
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
    cut = {nm: np.zeros((n, steps, batch), dtype=bool) for nm in names}  # cancelled (cancel_on_drop)
    late_cls = _late_event_class() if draws.gpu or draws.autoscale or draws.faults else None
    gpu_rows: Dict[str, list] = {nm: [] for nm in draws.gpu if nm not in draws.autoscale}
    auto: Dict[str, list] = {nm: [] for nm in draws.autoscale}  # each trial's AutoPool
    failed = {nm: np.zeros((n, steps, batch), dtype=bool) for nm in draws.faults}  # lost to a server failure
    # pipeline.arrivals other than batch: a gpu_rm pool takes one group per sample, in ready order
    feed = None if draws.offset is None else ready_pool(draws.offset)
    # offsets < 0 (open_poisson): an asynchronous run's step starts are known in advance, every
    # sample's process starts at 0 and is sent at its instant, before its step began or after
    early = not blocking and draws.offset is not None and bool((draws.offset < 0).any())
    streams = {nm: BackgroundStream(spec, n) for nm, spec in draws.background.items()}  # other tenants
    bg_log = {nm: ([], [], [], []) for nm in streams}  # lane, arrival, start, end

    for i in range(n):
        env = simpy.Environment()
        pools = {nm: simpy.Resource(env, capacity=draws.workers[nm]) if nm not in draws.faults
                 else SimpyWorkers(env, draws.workers[nm], draws.faults[nm], i, late_cls, _at)  # workers that fail
                 for nm in names if _queued(draws, nm)}
        servers = {}
        for nm, spec in draws.gpu.items():
            if nm in draws.autoscale:
                continue  # an autoscaled pool: SimpyAutoPool below
            tok4 = draws.service[nm]
            if feed is not None:  # one group per sample, numbered in ready order
                lane = slice(i, i + 1)
                slow = feed.slow(draws.slowdown[nm][lane]) if nm in draws.slowdown else None
                servers[nm] = _SimpyServer(env, spec, feed.to_ready(tok4[lane].reshape(1, -1), lane)[0], spec.seqs,
                                           steps * batch, late_cls, i, None if slow is None else slow[0],
                                           draws.faults.get(nm))
                continue
            servers[nm] = _SimpyServer(env, spec, tok4[i].ravel(), batch * spec.seqs, steps, late_cls, i,
                                       draws.slowdown_row(nm, i),
                                       draws.faults.get(nm))
        servers.update({nm: SimpyAutoPool(env, draws, nm, i, late_cls, feed) for nm in draws.autoscale})

        def job(nm, t, b, service, dl):
            if nm in draws.faults:  # a lost job ends at its failure instant (a blocking optimizer waits until then)
                start[nm][i, t, b], end[nm][i, t, b], failed[nm][i, t, b] = yield from pools[nm].job(service)
                return
            with pools[nm].request() as req:
                if dl is None:
                    yield req
                    start[nm][i, t, b] = env.now
                    yield env.timeout(service)
                    end[nm][i, t, b] = env.now
                    return
                yield req | dl  # cancel_on_drop: the deadline ends the wait, or the service
                s = start[nm][i, t, b] = env.now
                if not dl.processed:
                    yield env.timeout(service) | dl
                    if not dl.processed or env.now >= s + service:
                        end[nm][i, t, b] = env.now
                        return
                end[nm][i, t, b] = env.now  # the worker (if it had one) is free from now on
                cut[nm][i, t, b] = True

        def background(nm, opt):
            """Other tenants' requests on pool ``nm``, each sent at its instant while the run (``opt``) lasts."""
            k = 0
            while True:
                a, service = streams[nm].first(i, k)
                yield _at(env, a)
                if opt.triggered and a > step_start[i, steps]:
                    return
                if nm in servers:  # a gpu_rm pool: its batcher takes it (``service``: its tokens)
                    servers[nm].arrive_other(k, service)
                else:
                    env.process(background_job(nm, a, service))
                k += 1

        def background_job(nm, a, service):
            with pools[nm].request() as req:
                yield req
                s = env.now
                yield env.timeout(service)
                for col, x in zip(bg_log[nm], (i, a, s, env.now)):
                    col.append(np.array([x]))

        def streamed(t, s0=None):
            """pipeline.arrivals: one process per sample and channel, sent the second it is ready
            (a gpu_rm pool: one process per step that hands its samples over in ready order).
            ``s0``: the step's start, known before it (open_poisson, asynchronous: see ``early``)."""
            procs = []
            for nm in names:
                if nm in servers:
                    procs.append(env.process(to_pool(nm, t, s0)))
                    continue
                service, lost = _service_seconds(draws, nm, t)
                land[nm][i, t] = np.where(lost[i], -1, 0)
                sent = draws.routed[nm][i, t] if nm in draws.routed else np.ones(batch, dtype=bool)
                procs += [env.process(ready(nm, t, b, service[i, b], lost[i, b], sent[b], s0)) for b in range(batch)]
            return procs

        def ready(nm, t, b, service, lost, sent, s0):
            off = draws.offset[i, t, b]
            if s0 is None:  # a blocking optimizer holds a sample ready before its step (open_poisson)
                yield env.timeout(max(off, 0.0) if blocking else off)
            else:
                yield _at(env, s0 + off)
            submit[nm][i, t, b] = start[nm][i, t, b] = end[nm][i, t, b] = env.now  # what an unrouted one keeps
            if nm in pools:
                if sent:
                    yield from job(nm, t, b, service, deadline(nm, t))  # a blocking timeout runs from now
            elif lost:
                end[nm][i, t, b] = math.inf
            else:
                end[nm][i, t, b] = env.now + service
                yield env.timeout(service)

        def to_pool(nm, t, s0=None):
            """Step t's samples join pool ``nm``'s batcher, each at its step's start + its offset, in
            ready order (groups t * batch ... of :class:`ReadyPool`); done when all are scored."""
            srv, s0 = servers[nm], env.now if s0 is None else s0
            for g in range(t * batch, (t + 1) * batch):
                b = feed.order[i, g] - t * batch
                when = s0 + draws.offset[i, t, b]
                if when > env.now:
                    yield _at(env, when)
                submit[nm][i, t, b] = env.now
                srv.arrive(g)
            yield env.all_of([srv.done[g] for g in range(t * batch, (t + 1) * batch)])

        def deadline(nm, t):
            """The event after which step t's results of a cancel_on_drop channel are of no use."""
            if nm not in draws.cancel:
                return None
            if blocking:
                return None if wait_timeout is None else env.timeout(wait_timeout)
            d = draws.max_delay[nm]
            return None if d is None or t + d + 1 > steps - 1 else begin[t + d]

        def optimizer():
            for t in range(steps):
                step_start[i, t] = env.now
                if begin:
                    begin[t].succeed()
                ready_now = [] if draws.offset is None or early else streamed(t)
                yield env.timeout(gen[i, t])
                yield env.timeout(fast[i, t])
                yield env.timeout(sub[i, t])
                waits = ready_now
                for nm in names if draws.offset is None else ():  # streamed samples were sent as they were ready
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
                        dl = deadline(nm, t)
                        sent = draws.routed[nm][i, t] if nm in draws.routed else np.ones(batch, dtype=bool)
                        start[nm][i, t] = end[nm][i, t] = env.now  # what an unrouted sample keeps
                        waits += [env.process(job(nm, t, b, service[b], dl)) for b in range(batch) if sent[b]]
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
        begin = [env.event() for _ in range(steps)] if draws.cancel else None  # step t begins
        opt = env.process(optimizer())
        for nm in streams:
            env.process(background(nm, opt))
        if early:  # open_poisson, asynchronous: samples ready before their step began are sent then
            for t, s0 in enumerate(async_starts(draws.phase[:, i:i + 1])[0]):
                streamed(t, s0)
        env.run()  # runs on until every job is served, after the last step too
        if tick is not None:
            tick((i + 1) / n)
        for nm in pools:
            if nm in draws.faults:
                end[nm][i] = np.where(failed[nm][i], np.inf, end[nm][i])
        for nm, srv in servers.items():
            if nm in auto:
                auto[nm].append(srv.pool)
                times = sample_times(draws, nm, srv.pool.disp[None], srv.pool.comp[None], submit[nm][i],
                                     slice(i, i + 1), feed)
                start[nm][i], end[nm][i] = (x[0] for x in times)
                continue
            shape = draws.service[nm].shape[1:]
            disp, comp, lost, rows = srv.disp, srv.comp, srv.lost, [np.asarray(c) for c in zip(*srv.batches)]
            if feed is not None:  # back to sample order; a batch's group to its step
                lane = slice(i, i + 1)
                disp, comp, lost = (feed.from_ready(x[None], lane)[0] for x in (disp, comp, lost))
                rows[6] = rows[6] // batch
            start[nm][i], end[nm][i] = _per_sample(disp, np.where(lost, np.inf, comp), shape)
            if nm in draws.faults:
                failed[nm][i] = lost.reshape(shape).any(axis=-1)
            gpu_rows[nm].append(tuple(rows) if srv.batches else None)
            if nm in bg_log:  # other tenants' requests it served
                for col, xs in zip(bg_log[nm], srv.others):
                    col.append(np.asarray(xs, dtype=np.float64))
        if blocking:  # late = completed after the optimizer resumed (ties count as in time)
            for nm in names:
                land[nm][i] = np.where((end[nm][i] > resumed[:, None]) | cut[nm][i], -1, land[nm][i])

    if not blocking:
        land.update(_async_landing(draws, names, step_start, end, cut, failed))
    gpu_log = {nm: _batch_log([r for r in rows if r is not None], draws.gpu[nm].replicas)
               for nm, rows in gpu_rows.items()}
    pool_log = {}
    for nm, pools in auto.items():
        blog, pool_log[nm] = logs(draws, nm, pools, feed)
        if blog is not None:
            gpu_log[nm] = blog
    return _assemble(draws, names, step_start, land, blocking, submit, start, end, gpu_log, cut, pool_log, failed,
                     {nm: background_log(*cols) for nm, cols in bg_log.items()})
