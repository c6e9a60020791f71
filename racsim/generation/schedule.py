"""The bridge from asynchronous generation to the one schedule the learner reads: a run's
:class:`~racsim.pipeline.schedule.ArrivalSchedule` in async mode (docs/generation.md, "What the learner reads").

Each lane (trial) runs the generation model (racsim/generation/lane.py, or its SimPy engine of record with
``pipeline.engine=simpy``). The schedule's step t then lasts: the trainer's wait for its batch (the
generate phase, W_t = S_t - E_{t-1}), fast_score, submit, and the update plus the weight sync (the update
phase), so that its steps start at E_{t-1} (added in the pipeline engines' order, to their last bit).

* Gate fast: a group's samples reach the slow channels when the group is generated (its queue entry), so
  the slow channels are simulated by the pipeline's own engines (racsim/pipeline/engines.py, lanes or
  simpy) from those instants: ``offset`` (racsim/pipeline/arrivals.py), negative where a sample was sent
  before its step began, as open_poisson's are. Only the trained samples are sent: a group dropped from
  the queue, or still in flight when the run ends, is not (the slow channels' load leaves them out).
* Gate all: the lane's own queue channels held each group until its slow results were back, so they fill
  the schedule: every routed result injected at delay 0.
* A blocking corrector (wait_for_slow) in async mode reads the gate-all schedule of the same draws: the
  trainer cannot train a group before its slow results are back, so waiting for them is gate all
  (corrector.wait_timeout_s does not apply there).

``lag`` is each trained sample's head lag (t minus its start version) and ``generation`` the
:class:`~racsim.pipeline.schedule.GenerationRecord` of every lane.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Dict, List

import numpy as np

from racsim.config.validate.generation import gate_all_channel
from racsim.errors import ConfigError
from racsim.generation.draws import KEY, LaneDraws, engine_model, first_groups, step_tokens, training_seconds
from racsim.generation.lane import LaneInputs, LaneTrace, Starved, simulate_lane
from racsim.generation.simpy_lane import simulate_lane_simpy
from racsim.pipeline.draws import PipelineDraws, draw
from racsim.pipeline.engines import ENGINES
from racsim.pipeline.schedule import INJECTED, UNROUTED, ArrivalSchedule, GenerationRecord
from racsim.pipeline.service import model_size

LANES = {"lanes": simulate_lane, "simpy": simulate_lane_simpy}


def clock_starts(phase: np.ndarray) -> np.ndarray:
    """(trials, steps + 1) the schedule's step starts and the run's end: each step's four phases added to
    its start in order, as the pipeline engines add them (racsim.pipeline.arrivals.async_starts)."""
    out = np.zeros((phase.shape[1], phase.shape[2] + 1))
    for t in range(phase.shape[2]):
        out[:, t + 1] = out[:, t] + phase[0, :, t] + phase[1, :, t] + phase[2, :, t] + phase[3, :, t]
    return out


class AsyncRun:
    """One run's draws and the lanes' inputs (``pcfg``: the pipeline spec, mode async)."""

    def __init__(self, pcfg, n_trials: int, rng: np.random.Generator, engine: str):
        self.p, self.n, self.engine = pcfg, n_trials, engine
        self.gen = g = pcfg.generation
        self.draws: PipelineDraws = draw(pcfg, n_trials, rng)
        self.seed = int(rng.integers(2**62))  # drawn last, in async mode only: a sync run draws as it did
        self.model = engine_model(g.engines)
        self.S = int(g.group_size)
        self.G = int(pcfg.batch_size) // self.S
        self.replicas = int(g.engines.gpus) // int(g.engines.tp)
        self.steps = int(pcfg.steps)
        self.channels = list(pcfg.channels.items())
        self.lanes = {gate: [LaneDraws(g, self.channels if gate == "all" else [], self.seed, i) for i in range(n_trials)]
                      for gate in ("fast", "all")}
        fast, sub, upd = self.draws.phase[1], self.draws.phase[2], self.draws.phase[3]
        if g.trainer.service == "roofline":
            for lane in self.lanes["fast"]:
                lane.grow(self.G * self.steps)
            tokens = np.stack([step_tokens(d.prompt, d.response, self.G, self.steps) for d in self.lanes["fast"]])
            upd = training_seconds(float(model_size(g.engines.model).non_embedding), tokens, int(g.trainer.gpus),
                                   float(g.engines.gpu.peak_tflops), float(g.trainer.mfu))
        self.update = upd
        self.trainer = fast + sub + upd  # (trials, steps): P_t - S_t
        if not (self.trainer > 0).all():
            raise ConfigError("pipeline.update", "...", "a law whose draws are > 0 in async mode (with fast_score "
                              "and submit, a trainer step that takes 0 s would publish at the instant it starts)")

    def inputs(self, lane: int, gate: str, n: int) -> LaneInputs:
        g, d = self.gen, self.lanes[gate][lane]
        d.grow(n)
        channels = tuple((w, s[:n * self.S], None if r is None else r[:n]) for w, s, r in d.channel_inputs())
        adm = g.admission
        return LaneInputs(steps=self.steps, groups_per_step=self.G, group_size=self.S, engines=self.replicas,
                          concurrency=int(g.engines.concurrency), prompt=d.prompt[:n], response=d.response[:n],
                          decode_seconds=self.model.decode_step, prefill_seconds=self.model.seconds,
                          trainer_seconds=self.trainer[lane], sync_s=float(g.trainer.sync_s), admission=adm.rule,
                          eta=int(adm.eta), staleness=float(adm.staleness), ahead=int(adm.k),
                          capacity=g.queue.capacity, full=g.queue.full, max_lag=g.queue.max_lag,
                          adoption=g.adoption, gate=gate, channels=channels)

    def run_lane(self, lane: int, gate: str) -> LaneTrace:
        """Lane ``lane`` with ``gate``, more groups drawn until it has enough."""
        n = first_groups(self.steps, self.G, self.replicas, int(self.gen.engines.concurrency), self.S,
                         self.gen.queue.capacity)
        while True:
            try:
                return LANES[self.engine](self.inputs(lane, gate, n))
            except Starved as e:
                raise starved_error(e) from None
            except ValueError as e:
                if str(e) != "more groups needed":
                    raise
                n *= 2

    def phase(self, traces: List[LaneTrace]) -> np.ndarray:
        """(4, trials, steps): the trainer's wait, fast_score, submit, update + weight sync."""
        start = np.stack([tr.step_start for tr in traces])
        end = np.stack([tr.sync_end for tr in traces])
        before = np.concatenate([np.zeros((self.n, 1)), end[:, :-1]], axis=1)
        sync = np.full(start.shape, float(self.gen.trainer.sync_s))
        return np.stack([start - before, self.draws.phase[1], self.draws.phase[2], self.update + sync])

    def record(self, traces: List[LaneTrace], gate: str) -> GenerationRecord:
        stack = lambda name: np.stack([getattr(tr, name) for tr in traces])  # noqa: E731
        drawn = self.lanes[gate]
        return GenerationRecord(
            start_version=stack("start_version"), mean_version=stack("mean_version"),
            last_version=stack("last_version"), prompt=stack("prompt"), response=stack("response"),
            taken=stack("taken"), finished=stack("finished"), queue_in=stack("queue_in"),
            step_start=stack("step_start"), publish=stack("publish"), sync_end=stack("sync_end"),
            engine_time=stack("engine_time"), queue=tuple((tr.queue_times, tr.queue_length) for tr in traces),
            dropped=tuple((tr.dropped, tr.dropped_at, d.response[tr.dropped]) for tr, d in zip(traces, drawn)),
            wasted_tokens=np.array([tr.wasted_tokens for tr in traces], dtype=np.int64),
            groups_admitted=np.array([tr.groups_admitted for tr in traces], dtype=np.int64),
            generated=tuple(d.response[:tr.groups_admitted][np.isfinite(tr.generated)].reshape(-1)
                            for tr, d in zip(traces, drawn)), group_size=self.S)

    def fast_schedule(self) -> ArrivalSchedule:
        """Gate fast: the slow channels simulated by the pipeline's engines from the trained samples' queue
        entries (see the module docstring)."""
        traces = [self.run_lane(i, "fast") for i in range(self.n)]
        phase = self.phase(traces)
        rec = self.record(traces, "fast")
        offset = rec.queue_in - clock_starts(phase)[:, :-1, None]
        sched = ENGINES[self.engine](replace(self.draws, phase=phase, offset=offset), False)
        return replace(sched, lag=rec.head_lag, generation=rec)

    def all_schedule(self, blocking: bool) -> ArrivalSchedule:
        """Gate all: the lane's own queue channels' results, every routed one injected at delay 0."""
        traces = [self.run_lane(i, "all") for i in range(self.n)]
        phase = self.phase(traces)
        rec = self.record(traces, "all")
        sent = np.moveaxis(np.stack([np.isfinite(tr.slow_submit) for tr in traces]), 1, -1)  # (trials, steps, B, K)
        shape = rec.finished.shape
        made = rec.finished.reshape(shape[0], shape[1], self.G, self.S).max(axis=-1)  # the group's generation
        made = np.repeat(made, self.S, axis=-1)[..., None]

        def times(name: str) -> np.ndarray:
            t = np.moveaxis(np.stack([getattr(tr, name) for tr in traces]), 1, -1)  # (trials, steps, B, K)
            return np.where(sent, t, made)  # an unrouted sample keeps the instant it would have been sent

        return ArrivalSchedule(
            delay=np.where(sent, 0, -1).astype(np.int64), status=np.where(sent, INJECTED, UNROUTED).astype(np.int8),
            step_start=clock_starts(phase), blocking=blocking, channel_names=tuple(n for n, _ in self.channels),
            submit_time=times("slow_submit"), service_start=times("slow_start"), completion=times("slow_done"),
            phase=phase, lag=rec.head_lag, generation=rec)


def starved_error(e: Starved) -> ConfigError:
    """A trainer that can never get a batch (no setting known makes one: a guard), as one line."""
    return ConfigError(f"{KEY}.queue", "...", f"settings under which the trainer gets its batches: {e}")


def async_schedules(pcfg, n_trials: int, rng: np.random.Generator, *, blocking: bool,
                    engine: str) -> Dict[str, ArrivalSchedule]:
    """The schedules of an async run: ``async`` (what every non-blocking corrector reads: gate fast or all as
    set) and, with ``blocking`` (a blocking corrector is asked for), ``blocking`` (the gate-all schedule)."""
    run = AsyncRun(pcfg, n_trials, rng, engine)
    out = {}
    if run.gen.gate == "fast":
        out["async"] = run.fast_schedule()
    if run.gen.gate == "all" or blocking:
        if run.gen.gate == "fast":
            for name, ch in run.channels:
                gate_all_channel(ch, f"pipeline.channels.{name}",
                                 "with wait_for_slow in async mode (it reads the gate-all schedule)")
        every = run.all_schedule(blocking=False)
        out.setdefault("async", every)
        if blocking:
            out["blocking"] = replace(every, blocking=True)
    return out
