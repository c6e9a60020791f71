"""Every random number a pipeline run uses, drawn once, so that the two engines and the
blocking and non-blocking pipelines share them (common random numbers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np

from racsim.config.schema import PHASES, PipelineConf, phase_conf
from racsim.config.validate import faults_on
from racsim.io import recall
from racsim.pipeline.arrivals import draw_offsets
from racsim.pipeline.autoscale import scale_rule
from racsim.pipeline.background import BackgroundSpec, background_spec, background_work
from racsim.pipeline.batcher import GpuSpec
from racsim.pipeline.cbatch import drain_seconds, serving_spec
from racsim.pipeline.faults import Timeline, fault_spec, read_schedule
from racsim.pipeline.latency import build_latency, token_lengths, whole_number_law
from racsim.pipeline.steady import offered_load


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
    # queue channels with ``cancel_on_drop``: a result past its deadline frees its worker.
    cancel: frozenset = frozenset()
    # channels with route_prob < 1: (trials, steps, batch) True where the sample is sent to it.
    routed: Dict[str, np.ndarray] = field(default_factory=dict)
    # gpu_rm channels with bursts: (trials, steps) factor on the seconds of every batch whose
    # oldest request was submitted at that step (degraded_factor in degraded steps, else 1).
    slowdown: Dict[str, np.ndarray] = field(default_factory=dict)
    # pipeline.arrivals other than batch: (trials, steps, batch) seconds from its step's start
    # at which each sample is ready and sent to the slow channels (racsim/pipeline/arrivals.py).
    offset: Optional[np.ndarray] = None
    # channels with an ``autoscale`` rule (racsim/pipeline/autoscale.py): their pool's rule.
    autoscale: Dict[str, Any] = field(default_factory=dict)
    # channels with ``faults``: each gpu_rm replica's or queue worker's outages per lane (racsim/pipeline/faults.py).
    faults: Dict[str, Timeline] = field(default_factory=dict)
    # queue channels with ``background``: other tenants' stream (racsim/pipeline/background.py).
    background: Dict[str, BackgroundSpec] = field(default_factory=dict)

    def slowdown_row(self, name: str, lane: int) -> Optional[np.ndarray]:
        """Lane ``lane``'s per-step factor on channel ``name``'s batch seconds (bursts), or None."""
        return self.slowdown[name][lane] if name in self.slowdown else None


def draw(pcfg: PipelineConf, n_trials: int, rng: np.random.Generator) -> PipelineDraws:
    """Draw all durations and latencies of ``n_trials`` independent runs."""
    shape = (n_trials, pcfg.steps)
    phase_lat = [build_latency(phase_conf(pcfg, p), f"pipeline.{p}") for p in PHASES]
    phase = np.stack([lat.sample(rng, shape) for lat in phase_lat])
    service, kernel_channels, gpu = {}, set(), {}
    for name, ch in pcfg.channels.items():
        size = shape + (pcfg.batch_size,)
        if ch.kind == "gpu_rm":
            key = f"pipeline.channels.{name}.rm"
            gpu[name] = serving_spec(ch.rm, key)
            service[name] = draw_tokens(ch.rm, rng, size + (gpu[name].seqs,), key)
        elif ch.kernel is not None:
            service[name] = draw_kernel_delays(list(ch.kernel), rng, size)
            kernel_channels.add(name)
        else:
            service[name] = build_latency(ch.latency, f"pipeline.channels.{name}.latency").sample(rng, size)
    nominal = float(sum(lat.mean() for lat in phase_lat))
    fast_rm = pcfg.fast_rm
    if fast_rm is not None:  # the fast scorer's GPUs score the step's sequences: that is the phase
        spec = serving_spec(fast_rm, "pipeline.fast_rm")
        tokens = draw_tokens(fast_rm, rng, shape + (pcfg.batch_size * spec.seqs,), "pipeline.fast_rm")
        phase[1] = drain_seconds(spec, tokens)
        nominal = float(sum(lat.mean() for i, lat in enumerate(phase_lat) if i != 1) + phase[1].mean())
    # drawn last, so that a run without routing draws what it drew before routing existed
    routed = {n: rng.random(shape + (pcfg.batch_size,)) < ch.route_prob
              for n, ch in pcfg.channels.items() if ch.route_prob < 1}
    slowdown = {}
    for n, ch in pcfg.channels.items():
        if ch.degraded_factor != 1:
            factor = np.where(regime_path(ch.p_degrade, ch.p_recover, rng, shape), ch.degraded_factor, 1.0)
            if n in gpu:  # a degraded judge serves its batches slower; its requests' tokens stay
                slowdown[n] = factor
            else:
                service[n] = service[n] * factor[..., None]
    arrivals, offset = pcfg.arrivals, None
    if arrivals.mode != "batch":  # drawn last too, and only when on
        offset, gen = draw_offsets(arrivals, phase, pcfg.batch_size, rng, nominal)
        if arrivals.mode not in ("poisson", "uniform"):  # stream, trace, open_poisson: the generate phase ends with the last rollout
            nominal += float(gen.mean()) - phase_lat[0].mean()
            phase[0] = gen
    faults = {}  # drawn last, and only with faults on: every other run draws what it drew before
    for n, ch in pcfg.channels.items():
        if faults_on(ch):
            servers = gpu[n].replicas if n in gpu else ch.workers  # a queue's workers
            seed = 0 if ch.faults.schedule is not None else int(rng.integers(2**62))  # known outages: nothing drawn
            faults[n] = fault_timeline(ch, n, n_trials, servers, seed)
    background = {n: background_spec(ch, n, int(rng.integers(2**62)))  # drawn last, and only when on
                  for n, ch in pcfg.channels.items() if ch.background is not None}
    return PipelineDraws(
        phase=phase,
        service=service,
        kernel_channels=frozenset(kernel_channels),
        nominal_step=nominal,
        workers={n: ch.workers for n, ch in pcfg.channels.items()},
        max_delay={n: ch.max_delay for n, ch in pcfg.channels.items()},
        gpu=gpu,
        cancel=frozenset(n for n, ch in pcfg.channels.items() if ch.cancel_on_drop),
        routed=routed,
        slowdown=slowdown,
        offset=offset,
        autoscale={n: scale_rule(ch) for n, ch in pcfg.channels.items() if ch.autoscale is not None},
        faults=faults,
        background=background,
    )


def draw_lags(pcfg: PipelineConf, n_trials: int, rng: np.random.Generator) -> Optional[np.ndarray]:
    """(trials, steps, batch) int64: each sample's generation lag L from ``pipeline.generation.lag``
    (policy versions between the one that generated it and the step that trains on it), drawn from
    ``rng`` alone, a stream of its own (racsim.seeds: every other draw stays what it was); None when
    no law is set (every sample on-policy)."""
    law = pcfg.generation.lag
    if law is None:
        return None
    draws = whole_number_law(law, "pipeline.generation.lag").sample(rng, (n_trials, pcfg.steps, pcfg.batch_size))
    return draws.astype(np.int64)


def fault_timeline(ch: Any, name: str, n_trials: int, servers: int, seed: int) -> Timeline:
    """The outages of channel ``name``'s ``servers`` (gpu_rm replicas of ``rm.tp`` GPUs, or queue
    workers) in every lane: its ``faults.schedule``'s known ones, or drawn from ``seed``."""
    tp = int(ch.rm.tp) if ch.kind == "gpu_rm" else 1
    spec = fault_spec(ch.faults, tp, gpu=ch.kind == "gpu_rm")
    if ch.faults.schedule is not None:
        return Timeline(0, n_trials, servers, spec,
                        read_schedule(ch.faults.schedule, f"pipeline.channels.{name}.faults.schedule", servers))
    return Timeline(seed, n_trials, servers, spec)


def regime_path(p_degrade: float, p_recover: float, rng: np.random.Generator, shape) -> np.ndarray:
    """(lanes, steps) hidden state of a two-state Markov chain, True = degraded: the first step
    from the stationary law P(degraded) = p_degrade / (p_degrade + p_recover), then each step
    leaves normal with probability p_degrade and degraded with p_recover."""
    u = rng.random(shape)
    out = np.empty(shape, dtype=bool)
    out[:, 0] = u[:, 0] < p_degrade / (p_degrade + p_recover)
    for t in range(1, shape[1]):
        out[:, t] = np.where(out[:, t - 1], u[:, t] >= p_recover, u[:, t] < p_degrade)
    return out


def stationary_slowdown(factor: float, p_degrade: float, p_recover: float) -> float:
    """The long-run mean of a burst chain's multiplier (:func:`regime_path`): 1 in the normal state,
    ``factor`` in the degraded one, whose stationary probability is p_degrade / (p_degrade + p_recover)."""
    if factor == 1 or p_degrade == 0:
        return 1.0
    return 1.0 + (factor - 1.0) * p_degrade / (p_degrade + p_recover)


def draw_kernel_delays(kernel: List[float], rng: np.random.Generator, size) -> np.ndarray:
    """Delays in steps drawn from Lambda[k, :]; the missing mass gives -1 (never returns)."""
    cdf = np.cumsum(np.asarray(kernel, dtype=np.float64))
    idx = np.searchsorted(cdf, rng.random(size), side="right")
    return np.where(idx >= len(kernel), -1, idx).astype(np.int64)


def draw_tokens(rm: Any, rng: np.random.Generator, size, key: str = "rm") -> np.ndarray:
    """Token length of each request of an RM config (:class:`~racsim.pipeline.latency.TokenLengths`),
    read-only. The same laws in the same shape from the same generator state give the same tokens,
    drawn once (racsim.io.recall: a capacity search's counts, which differ in their GPUs alone, in
    one process or in a pool's), the generator moved on as the draw moved it."""
    what = repr((rm.prompt_tokens, rm.response_tokens, tuple(np.atleast_1d(size).tolist()), rng.bit_generator.state))

    def fresh():
        return token_lengths(rm.prompt_tokens, rm.response_tokens, key).sample(rng, size), rng.bit_generator.state

    tokens, state = recall("tokens", what, fresh)
    rng.bit_generator.state = state
    return tokens


def _queued(draws: PipelineDraws, name: str) -> bool:
    return draws.workers[name] is not None and name not in draws.kernel_channels and name not in draws.gpu


def _service_seconds(draws: PipelineDraws, name: str, t: int):
    """Service time of step t's jobs and whether each is lost (kernel missing mass).
    An unrouted job takes 0 s: in a FIFO queue it then delays nobody (it leaves its
    worker free when it found it, or at its arrival, before any later arrival)."""
    s = draws.service[name][:, t]
    if name in draws.kernel_channels:
        lost = s < 0
        # A kernel channel on the clock: Delta steps of nominal step time.
        s, lost = np.where(lost, 0.0, s * draws.nominal_step), lost
    else:
        lost = np.zeros(s.shape, dtype=bool)
    if name in draws.routed:
        s = np.where(draws.routed[name][:, t], s, 0.0)
    return s, lost


def mean_step_seconds(pcfg: PipelineConf) -> Optional[float]:
    """The optimizer's mean step on the asynchronous clock, exactly: the sum of its phases' means
    (each law's mean as sampled, clipping and rounding included), or None where the clock is not
    made of those laws alone (a fast RM's batches, arrivals that end the generate phase with the
    last rollout: their mean is a sample's)."""
    if pcfg.fast_rm is not None or pcfg.arrivals.mode not in ("batch", "poisson", "uniform"):
        return None
    return float(sum(build_latency(phase_conf(pcfg, p), f"pipeline.{p}").mean() for p in PHASES))


def mean_work_seconds(pcfg: PipelineConf, name: str) -> Optional[float]:
    """The mean of :func:`work_seconds` per step for queue channel ``name``, exactly: batch size x
    route_prob x its latency law's mean (bursts left out: the caller scales by the chain's
    stationary slow-down); None for a gpu_rm pool (full batches of drawn tokens: no closed form)
    or a kernel channel."""
    ch = pcfg.channels[name]
    if ch.kind == "gpu_rm" or ch.kernel is not None:
        return None
    mean = build_latency(ch.latency, f"pipeline.channels.{name}.latency").mean()
    return float(pcfg.batch_size) * float(ch.route_prob) * float(mean)


def work_seconds(draws: PipelineDraws, name: str) -> np.ndarray:
    """(trials, steps) server-seconds of work that each step's samples bring channel ``name``:
    a queue's service times of the samples sent to it; a gpu_rm pool's seconds for one replica
    to serve the step's requests in full batches (:func:`~racsim.pipeline.cbatch.drain_seconds`:
    the least work the batcher can make of them, what it does under a backlog), times the step's
    burst factor and the share of the step's samples routed to the channel. Divided by the clock
    and the servers up, the offered load (:func:`racsim.pipeline.steady.offered_load`)."""
    if name in draws.gpu:
        spec = draws.gpu[name]
        one = GpuSpec(**{**spec.__dict__, "replicas": 1})
        tok = draws.service[name]
        work = drain_seconds(one, tok.reshape(tok.shape[:2] + (-1,)))
        if name in draws.slowdown:
            work = work * draws.slowdown[name]
        if name in draws.routed:
            work = work * draws.routed[name].mean(axis=2)
        return work
    s = draws.service[name]
    if name in draws.routed:
        s = np.where(draws.routed[name], s, 0.0)
    return s.sum(axis=2)


def sampled_loads(pcfg: PipelineConf, draws: PipelineDraws) -> Dict[str, float]:
    """Each channel's offered load as its run drew it, rho = work / (clock x servers)
    (:func:`racsim.pipeline.steady.offered_load`): the server-seconds of work its samples brought
    (:func:`work_seconds`; other tenants' at their long-run rate) per second of the asynchronous
    optimizer's clock, over its servers (a queue's workers, a gpu_rm pool's replicas). At or above 1
    the channel's backlog grows for as long as the run lasts. NaN where there is no fixed number of
    servers: a kernel channel, a queue without a worker limit, an autoscaled pool."""
    clock = draws.phase.sum(axis=0)  # (trials, steps): the asynchronous optimizer's step seconds
    out: Dict[str, float] = {}
    for name, ch in pcfg.channels.items():
        servers = draws.gpu[name].replicas if name in draws.gpu else draws.workers.get(name)
        if name in draws.kernel_channels or name in draws.autoscale or not servers:
            out[name] = float("nan")
            continue
        work = work_seconds(draws, name) + background_work(ch, name) * clock
        out[name] = offered_load(work, clock, servers)
    return out
