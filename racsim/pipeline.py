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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

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


def draw(pcfg: PipelineConf, n_trials: int, rng: np.random.Generator) -> PipelineDraws:
    """Draw all durations and latencies of ``n_trials`` independent runs."""
    shape = (n_trials, pcfg.steps)
    phase_lat = [build_latency(phase_conf(pcfg, p), f"pipeline.{p}") for p in PHASES]
    phase = np.stack([lat.sample(rng, shape) for lat in phase_lat])
    service, kernel_channels = {}, set()
    for name, ch in pcfg.channels.items():
        size = shape + (pcfg.batch_size,)
        if ch.kernel is not None:
            service[name] = _draw_kernel_delays(list(ch.kernel), rng, size)
            kernel_channels.add(name)
        else:
            service[name] = build_latency(ch.latency, f"pipeline.channels.{name}.latency").sample(rng, size)
    return PipelineDraws(
        phase=phase,
        service=service,
        kernel_channels=frozenset(kernel_channels),
        nominal_step=float(sum(lat.mean() for lat in phase_lat)),
        workers={n: ch.workers for n, ch in pcfg.channels.items()},
        max_delay={n: ch.max_delay for n, ch in pcfg.channels.items()},
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


def _assemble(draws, names, step_start, land, blocking, submit, start, end) -> ArrivalSchedule:
    n, steps = step_start.shape[0], step_start.shape[1] - 1
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
    )


# ----------------------------------------------------------------------------
# Lanes engine: numpy over trials.


def run_lanes(draws: PipelineDraws, blocking: bool, wait_timeout: Optional[float] = None) -> ArrivalSchedule:
    """Vectorised engine: every trial is a lane; one array operation per job position."""
    gen, fast, sub, upd = draws.phase
    n, steps = gen.shape
    names = list(draws.service)
    batch = next(iter(draws.service.values())).shape[2]
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
            s, e, lost = _serve(draws, nm, t, arr, free.get(nm), blocking)
            submit[nm][:, t], start[nm][:, t], end[nm][:, t] = arr, s, e
            if blocking:
                done = np.maximum(done, np.where(lost, arr, e).max(axis=1))
            land[nm][:, t] = np.where(lost, -1, 0)
        if blocking:
            done = np.minimum(done, now + timeout)
            for nm in names:
                late = end[nm][:, t] > done[:, None]
                land[nm][:, t] = np.where(late, -1, land[nm][:, t])
        step_start[:, t + 1] = done + upd[:, t]
    if not blocking:
        for nm in names:
            if nm in draws.kernel_channels:
                k = draws.service[nm]
                land[nm] = np.where(k < 0, -1, np.arange(steps)[None, :, None] + k)
            else:
                land[nm] = landing_step(step_start[:, :steps], end[nm])
    return _assemble(draws, names, step_start, land, blocking, submit, start, end)


def _queued(draws: PipelineDraws, name: str) -> bool:
    return draws.workers[name] is not None and name not in draws.kernel_channels


def _service_seconds(draws: PipelineDraws, name: str, t: int):
    """Service time of step t's jobs and whether each is lost (kernel missing mass)."""
    s = draws.service[name][:, t]
    if name in draws.kernel_channels:
        lost = s < 0
        # A kernel channel on the clock: Delta steps of nominal step time.
        return np.where(lost, 0.0, s * draws.nominal_step), lost
    return s, np.zeros(s.shape, dtype=bool)


def _serve(draws, name, t, arrival, free, blocking):
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

    for i in range(n):
        env = simpy.Environment()
        pools = {nm: simpy.Resource(env, capacity=draws.workers[nm]) for nm in names if _queued(draws, nm)}

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
        if blocking:  # late = completed after the optimizer resumed (ties count as in time)
            for nm in names:
                land[nm][i] = np.where(end[nm][i] > resumed[:, None], -1, land[nm][i])

    if not blocking:
        for nm in names:
            if nm in draws.kernel_channels:
                k = draws.service[nm]
                land[nm] = np.where(k < 0, -1, np.arange(steps)[None, :, None] + k)
            else:
                land[nm] = landing_step(step_start[:, :steps], end[nm])
    return _assemble(draws, names, step_start, land, blocking, submit, start, end)


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
