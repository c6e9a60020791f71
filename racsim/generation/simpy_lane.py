"""The SimPy engine of record of one lane of asynchronous generation: the model of
racsim/generation/state.py driven by a SimPy environment. Each rollout engine is a process that sleeps until
its next event (a prefill's end or a completion) and is interrupted when that moves; each gate-all slow
job is a process on a ``simpy.Resource`` of the channel's workers (none without workers); the trainer's
publishes and syncs, the drained engines' own syncs and the groups' queue entries are events at their
instants. The order within one instant (the spec's) is the events' priority: (class, index) ahead of an
end-of-round event that runs the trainer and the pulls once everything else of the instant is in. A test
holds it equal to the fast engine (racsim/generation/lane.py) to the bit.
"""

from __future__ import annotations

import heapq

import numpy as np

from racsim.generation.lane import LaneInputs, LaneTrace, check_inputs, slow_records, trace_of
from racsim.generation.state import ENGINE, ENTRY, INF, LaneState


def simulate_lane_simpy(inputs: LaneInputs) -> LaneTrace:
    """Run one lane to the instant its last step starts, in SimPy (see the module docstring); the same
    trace as :func:`racsim.generation.lane.simulate_lane`, and the same errors."""
    import simpy

    check_inputs(inputs)
    env = simpy.Environment()
    E, S = int(inputs.engines), int(inputs.group_size)
    span = max(E, int(inputs.steps), int(inputs.prompt.shape[0])) + 1
    late = 10 + 5 * span  # the end-of-round event: after every event of the instant

    def at(when: float, cls: int, idx: int):
        """An event at the absolute instant ``when`` with the priority of (``cls``, ``idx``)."""
        return at_priority(when, 10 + cls * span + idx)

    def at_priority(when: float, priority: int):
        """SimPy schedules relative delays only (now + delay can round off ``when``), so the event is pushed
        onto its queue as Environment.schedule does."""
        ev = simpy.events.Event(env)
        ev._ok, ev._value = True, None
        heapq.heappush(env._queue, (when, priority, next(env._eid), ev))
        return ev

    finished = env.event()
    poked = [False]

    def end_of_round(_ev) -> None:
        poked[0] = False
        state.end_of_round(env.now)
        if state.done and not finished.triggered:
            finished.succeed()

    def poke() -> None:
        if not poked[0]:
            poked[0] = True
            at_priority(env.now, late).callbacks.append(end_of_round)

    def fire(cls: int, idx: int):
        def go(_ev) -> None:
            state.fire(env.now, cls, idx)
            poke()
        return go

    resources = [None if w is None else simpy.Resource(env, capacity=int(w)) for w, _, _ in inputs.channels]
    service = [s for _, s, _ in inputs.channels]
    routed = [r for _, _, r in inputs.channels]
    jobs_sent = [0] * len(inputs.channels)
    slow = slow_records(inputs)

    def job(k: int, sid: int, seconds: float):
        slow[0, k, sid] = env.now
        if resources[k] is None:
            slow[1, k, sid] = env.now
            yield env.timeout(seconds)
        else:
            with resources[k].request() as req:
                yield req
                slow[1, k, sid] = env.now
                yield env.timeout(seconds)
        slow[2, k, sid] = env.now

    def group(j: int):
        procs = []
        for i in range(S):
            for k in range(len(service)):
                if routed[k] is not None and not routed[k][j, i]:
                    continue
                n = jobs_sent[k]
                if n >= len(service[k]):
                    raise ValueError("more groups needed")
                jobs_sent[k] = n + 1
                procs.append(env.process(job(k, j * S + i, float(service[k][n]))))
        if procs:
            yield env.all_of(procs)
        at(env.now, ENTRY, j).callbacks.append(fire(ENTRY, j))

    procs: list = [None] * E
    moved = [False] * E  # engine e's next event moved while its own process ran the model

    def engine(e: int):
        while True:
            t = state.engine_next(e)
            try:
                yield env.event() if t == INF else at(t, ENGINE, e)
            except simpy.Interrupt:
                continue
            moved[e] = True
            state.fire(env.now, ENGINE, e)
            moved[e] = False
            poke()

    class Hooks:
        @staticmethod
        def at(time: float, cls: int, idx: int) -> None:
            at(time, cls, idx).callbacks.append(fire(cls, idx))

        @staticmethod
        def engine_changed(e: int, now: float) -> None:
            if not moved[e] and procs[e] is not None:  # its own process looks again once the model is done
                procs[e].interrupt()

        @staticmethod
        def generated(j: int, now: float) -> None:
            env.process(group(j))

    state = LaneState(inputs, Hooks)
    for e in range(E):
        procs[e] = env.process(engine(e))
    poke()
    try:
        env.run(until=finished)
    except RuntimeError as err:  # no event left before the last step started
        if "No scheduled events left" not in str(err):
            raise
        raise state.starved() from None
    return trace_of(state, np.asarray(slow))
