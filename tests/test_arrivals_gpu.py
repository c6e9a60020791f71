"""Arrivals over time into gpu_rm pools (issue 11, knob 2, ``pipeline.arrivals.mode`` with a gpu_rm channel).

Each sample (its ``sequences_per_sample`` requests) reaches the RM batcher at its step's
start + its offset, not the whole step at the submit instant. Checked against oracles
written from the specification, not from racsim/pipeline/*:

1. static batches: tests/test_batcher_oracle.py's request-by-request event loop, extended
   here to per-sample arrival times (:class:`ReadyOracle`): batches of at most max_batch
   requests and the token budget, a flush max_wait after the oldest waiting request's
   own arrival, FIFO by (arrival, index) over the lowest idle replica, shortest-first by
   (tokens, arrival, index); blocking or not, with timeouts; exact dyadic arithmetic, so
   the comparison is to the bit and ties at one instant happen;
2. continuous batching (chunked or not): tests/test_cbatch.py's iteration-level loop, fed
   the samples in the order they are ready;
3. both engines (lanes vectorised, lanes event loop, SimPy) bit-identical on random
   configs (static padded or packed, continuous, chunked, flush or none, bursts, failures,
   a cancel_on_drop queue beside, blocking, timeouts) in stream, poisson and trace mode;
4. a stream of equal lengths with nothing between generate and submit is batch mode,
   bit for bit (the samples arrive together, in sample order, at the submit instant).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from helpers import assert_same_schedule, det
from test_batcher_oracle import Oracle, engine_runs, grid, mismatches
from test_batcher_oracle import random_case as static_case
from test_cbatch import oracle as continuous_oracle
from test_cbatch import random_case as continuous_case
from test_gpu_rm import MODES, random_pcfg

from racsim.config.schema import ArrivalsConf, ChannelConf, FaultsConf, LatencyConf
from racsim.pipeline.arrivals import ready_pool
from racsim.pipeline.draws import draw
from racsim.pipeline.lanes import run_lanes
from racsim.pipeline.schedule import DROPPED
from racsim.pipeline.simpy_engine import run_simpy


class ReadyOracle(Oracle):
    """:class:`Oracle` with arrivals over time: request j of sample b of step t reaches the
    batcher at step t's start + ``offset[t, b]`` (``ready[j]``); the optimizer is unchanged
    (``arrival[t]``, the end of generate + fast_score + submit, is when a blocking one starts
    to wait). A step's samples are known once the step's start is."""

    def __init__(self, tokens, phases, offset, **kw):
        super().__init__(tokens, phases, **kw)
        self.offset = offset
        self.seqs = self.G // offset.shape[1]
        self.ready = [math.nan] * (self.steps * self.G)
        self.known = 0  # steps whose samples have their ready instants
        self.pending: list = []  # requests known, not arrived

    def arrived(self, j: int) -> float:
        return self.ready[j]

    def in_order(self) -> list:
        if self.order == "fifo":
            return sorted(self.waiting, key=lambda j: (self.ready[j], j))
        return sorted(self.waiting, key=lambda j: (self.tok[j], self.ready[j], j))

    def run(self) -> ReadyOracle:
        while True:
            while self.known < self.steps and self.step_start(self.known) is not None:
                t, s = self.known, self.step_start(self.known)
                for j in range(t * self.G, (t + 1) * self.G):
                    self.ready[j] = s + float(self.offset[t, (j % self.G) // self.seqs])
                    self.pending.append(j)
                self.known += 1
            arrive, wait_ends = self.next_arrival()
            instants = [x for x in (arrive, wait_ends) if x is not None]
            instants += [self.ready[j] for j in self.pending]
            instants += [b for b in self.busy_until if b > self.now]
            instants += [self.ready[j] + self.max_wait for j in self.waiting
                         if self.ready[j] + self.max_wait > self.now]
            if not instants:
                break
            tau = min(instants)
            assert tau > self.now
            self.now = tau
            while True:  # the optimizer's submit instants up to tau
                arrive, _ = self.next_arrival()
                if arrive is None or arrive > tau:
                    break
                self.arrival.append(arrive)
            self.waiting += [j for j in self.pending if self.ready[j] <= tau]
            self.pending = [j for j in self.pending if self.ready[j] > tau]
            self.decide(tau)
        self.step_start_all = [self.step_start(t) for t in range(self.steps + 1)]
        return self


def test_ready_order_is_by_step_then_offset_then_sample():
    """arrivals.ReadyPool against a sort written here: (step, offset, sample), ties of offset
    included; to_ready and from_ready are inverse, per sample and per request."""
    rng = np.random.default_rng(0)
    offset = rng.integers(0, 4, (3, 5, 6)).astype(float) / 4  # ties
    pool = ready_pool(offset)
    for i in range(3):
        want = sorted(range(30), key=lambda k: (k // 6, offset[i, k // 6, k % 6], k))
        assert pool.order[i].tolist() == want
    x = rng.random((3, 30 * 4))
    y = pool.to_ready(x)
    assert np.array_equal(y.reshape(3, 30, 4)[1, 7], x.reshape(3, 30, 4)[1, pool.order[1, 7]])
    one = slice(1, 2)  # one lane, as the SimPy engine asks
    assert np.array_equal(pool.from_ready(y), x)
    assert np.array_equal(pool.from_ready(pool.to_ready(x[one], one), one), x[one])
    assert np.array_equal(pool.slow(np.array([[2.0, 1.0, 1.0, 3.0, 1.0]]))[0], np.repeat([2.0, 1, 1, 3, 1], 6))


def ready_case(seed: int) -> dict:
    """tests/test_batcher_oracle.py's random case (dyadic phases and service) with every sample
    ready at a multiple of 1/64 s within its generate phase; on odd seeds // 2 the generate
    phase ends with the last one (stream, trace) and fast_score and submit are 0, so samples
    of consecutive steps can arrive at one instant with the next step's start; on seeds 3 mod 4
    (shortest-first) the tokens take two values."""
    case = static_case(seed)
    rng = np.random.default_rng(9000 + seed)
    gen = case["phases"][0]
    n, steps, batch = case["tokens"].shape[:3]
    offset = np.vectorize(lambda g: grid(rng, 0.0, g))(np.repeat(gen[..., None], batch, axis=2))
    if (seed // 2) % 2:
        case["phases"] = case["phases"].copy()
        case["phases"][0] = offset.max(axis=2)
        case["phases"][1:3] = 0.0
    if seed % 4 == 3:  # shortest-first with two lengths only: ties of length, broken by arrival
        m = case["tokens"].max()
        case["tokens"] = np.where(rng.random(case["tokens"].shape) < 0.5, np.ceil(m / 2), m)
    case["offset"] = offset
    return case


def ready_oracles(case: dict, cls=ReadyOracle) -> list:
    tokens = case["tokens"]
    n, steps = tokens.shape[:2]
    return [cls(tokens[i].reshape(steps, -1), case["phases"][:, i], case["offset"][i], blocking=case["blocking"],
                timeout=case["timeout"], **case["conf"]).run() for i in range(n)]


N_CASES = 36


@pytest.fixture(scope="module")
def compared():
    mp = pytest.MonkeyPatch()
    try:
        return [(c, ready_oracles(c), engine_runs(c, mp)) for c in (ready_case(s) for s in range(N_CASES))]
    finally:
        mp.undo()


@pytest.mark.parametrize("seed", range(N_CASES))
def test_static_batcher_matches_the_oracle_request_by_request(compared, seed):
    case, oracles, runs = compared[seed]
    bad = mismatches(case, oracles, runs)
    assert not bad, "\n".join(bad[:6])


def test_static_cases_reach_every_branch(compared):
    seen = Counter()
    for case, oracles, runs in compared:
        c = case["conf"]
        seen[c["order"]] += 1
        seen["padded" if c["padded"] else "packed"] += 1
        seen["async" if not case["blocking"] else "blocking" if case["timeout"] is None else "timeout"] += 1
        off = case["offset"]
        seen["samples out of index order"] += bool((np.diff(off, axis=2) < 0).any())
        seen["samples ready at one instant"] += bool((np.diff(np.sort(off, axis=2), axis=2) == 0).any())
        for o in oracles:
            why = Counter(b[6] for b in o.batches)
            seen["budget-limited"] += why["budget"] > 0
            seen["size-limited"] += why["size"] > 0 and c["max_batch"] > 1
            seen["flush at a request's own deadline"] += any(
                b[6] == "deadline" and c["max_wait"] > 0 and b[1] == b[7] + c["max_wait"] for b in o.batches)
            seen["no flush (max_wait 0)"] += c["max_wait"] == 0
            seen["a batch of two steps"] += any(
                len({j // o.G for j, k in enumerate(o.batch_of) if k == b}) > 1 for b in range(len(o.batches)))
            seen["dispatched before the submit instant"] += any(
                o.disp[j] < o.arrival[j // o.G] for j in range(len(o.disp)) if not math.isnan(o.disp[j]))
            seen["queued for a replica"] += any(o.disp[j] > o.ready[j] + c["max_wait"] for j in range(len(o.disp)))
            if case["timeout"] is not None:
                seen["blocking wait timed out"] += any(
                    max(o.comp[t * o.G:(t + 1) * o.G]) > o.arrival[t] + case["timeout"] for t in range(o.steps))
    need = ["fifo", "shortest", "padded", "packed", "async", "blocking", "timeout", "samples out of index order",
            "samples ready at one instant", "budget-limited", "size-limited", "flush at a request's own deadline",
            "no flush (max_wait 0)", "a batch of two steps", "dispatched before the submit instant",
            "queued for a replica", "blocking wait timed out"]
    assert all(seen[k] > 0 for k in need), str({k: seen[k] for k in need})


class FlushFromTheStep(ReadyOracle):
    """Wrong: the flush counted from the step's submit instant, as if the sample came with its step."""

    def deadline_passed(self, tau):
        return min(self.arrival[j // self.G] if j // self.G < len(self.arrival) else math.inf
                   for j in self.waiting) + self.max_wait <= tau


class IndexOrder(ReadyOracle):
    """Wrong: FIFO by sample index rather than by arrival."""

    def in_order(self):
        return sorted(self.waiting) if self.order == "fifo" else super().in_order()


class ShortestTiesByIndex(ReadyOracle):
    """Wrong: shortest-first ties of length by index, not by arrival."""

    def in_order(self):
        return super().in_order() if self.order == "fifo" else sorted(self.waiting, key=lambda j: (self.tok[j], j))


class WholeStepAtSubmit(ReadyOracle):
    """Wrong: every sample arrives with its step at the submit instant (batch mode)."""

    def __init__(self, tokens, phases, offset, **kw):
        at_submit = np.repeat((phases[0] + phases[1] + phases[2])[:, None], offset.shape[1], axis=1)
        super().__init__(tokens, phases, at_submit, **kw)


@pytest.mark.parametrize("mutant", [WholeStepAtSubmit, FlushFromTheStep, IndexOrder, ShortestTiesByIndex])
def test_a_wrong_rule_is_caught(compared, mutant):
    """Each mutant's requests are dispatched or completed elsewhere than the engines' (not only its arrivals)."""
    def wrong(case, runs):
        bad = mismatches(case, ready_oracles(case, mutant), runs)
        return any(" dispatch " in m or " completion " in m for m in bad)

    assert sum(wrong(case, runs) for case, _, runs in compared) > 0, f"{mutant.__name__} agrees with every engine run"


@pytest.mark.parametrize("seed", range(12))
def test_continuous_batching_matches_the_iteration_oracle(seed):
    """tests/test_cbatch.py's cases (chunked on seeds 0, 1 mod 4) with each sample ready at a
    uniform second of its generate phase; the oracle gets the samples in the order they are ready."""
    draws, spec, tokens = continuous_case(seed)
    draws = replace(draws, offset=draws.phase[0][..., None] * np.random.default_rng(seed).random(tokens.shape[:3]))
    for name, s in {"lanes": run_lanes(draws, False), "lane loop": run_lanes(draws, False, gpu_loop=True),
                    "simpy": run_simpy(draws, False)}.items():
        for i in range(tokens.shape[0]):
            ready = s.submit_time[i, ..., 0].ravel()
            order = np.argsort(ready, kind="stable")
            assert np.array_equal(ready, (s.step_start[i, :-1, None] + draws.offset[i]).ravel())
            first, done, _, _ = continuous_oracle(ready[order], tokens[i].reshape(-1, 1)[order], spec.replicas,
                                                  spec.max_batch, spec.budget, spec.chunked, spec.order, spec.model)
            np.testing.assert_array_equal(s.service_start[i, ..., 0].ravel()[order], first, err_msg=f"{name} {i}")
            np.testing.assert_array_equal(s.completion[i, ..., 0].ravel()[order], done, err_msg=f"{name} {i}")


# ----------------------------------------------------------------------------
# Engine agreement on random configurations.

ARRIVAL_MODES = ("stream", "poisson", "uniform", "trace")


@pytest.fixture(scope="module")
def trace_csv(tmp_path_factory):
    path = tmp_path_factory.mktemp("arr") / "offsets.csv"
    values = np.random.default_rng(11).uniform(0.0, 2.0, 7)
    values[3] = values[1]  # two samples ready at one instant
    path.write_text("offset_s\n" + "".join(f"{float(v)!r}\n" for v in values))
    return str(path)


def arrivals_gpu_pcfg(seed: int, trace_csv: str):
    """tests/test_gpu_rm.py's random gpu_rm config (FIFO / shortest, padded or packed, flush or
    none, bursts on seeds 2 mod 3, a second pool, a fast scorer on GPUs), fed by stream, poisson,
    uniform or trace arrivals (seed mod 4); continuous batching on seeds 3, 4 mod 6 (chunked on 4, without bursts),
    failures on seeds 1 mod 4 (re-sent, retried, lost) and a cancel_on_drop queue beside on seeds 2 mod 4."""
    pcfg = random_pcfg(seed)
    mode = ARRIVAL_MODES[seed % 4]
    pcfg.arrivals = ArrivalsConf(mode=mode, length=LatencyConf(kind="lognormal", mean=1.0, sigma=0.6),
                                 path=trace_csv if mode == "trace" else None)
    g = pcfg.channels["g"]
    if seed % 6 in (3, 4):
        g.rm.batching, g.rm.chunked_prefill = "continuous", seed % 6 == 4 and g.degraded_factor == 1
        g.rm.token_budget = min(g.rm.token_budget, 900)
    if seed % 4 == 1:
        g.faults = FaultsConf(mtbf_s=20.0, mttr_s=2.0, on_failure=["resend", "retry", "lose"][seed % 12 // 4],
                              max_retries=1)
    if seed % 4 == 2:
        pcfg.channels["q"] = ChannelConf(latency=LatencyConf(kind="exponential", mean=1.5), workers=2, max_delay=2,
                                         cancel_on_drop=True)
    return pcfg


N_RANDOM = 12


@pytest.fixture(scope="module")
def simpy_runs(trace_csv):
    out = {}
    for seed in range(N_RANDOM):
        pcfg = arrivals_gpu_pcfg(seed, trace_csv)
        draws = draw(pcfg, 3, np.random.default_rng(seed))
        out[seed] = (pcfg, draws, {m: run_simpy(draws, *m) for m in MODES})
    return out


@pytest.mark.parametrize("seed", range(N_RANDOM))
def test_engines_agree_with_arrivals_over_time(seed, simpy_runs):
    pcfg, draws, sims = simpy_runs[seed]
    assert draws.offset is not None and ("g" in draws.faults) == (seed % 4 == 1)
    for blocking, timeout in MODES:
        sim = sims[(blocking, timeout)]
        label = f"seed {seed} {pcfg.arrivals.mode} blocking {blocking} timeout {timeout}"
        assert_same_schedule(run_lanes(draws, blocking, timeout), sim, "lanes vs simpy, " + label)
        assert_same_schedule(run_lanes(draws, blocking, timeout, gpu_loop=True), sim, "lane loop vs simpy, " + label)
        k = sim.channel_names.index("g")
        np.testing.assert_array_equal(sim.submit_time[..., k], sim.step_start[:, :-1, None] + draws.offset)
        assert (sim.service_start[..., k] >= sim.submit_time[..., k]).all()
        for c in sim.counts().values():
            assert c["injected"] + c["dropped"] + c["pending"] == c["emitted"]


def test_random_configs_reach_every_branch(simpy_runs):
    seen = Counter()
    for seed, (pcfg, draws, sims) in simpy_runs.items():
        rm = pcfg.channels["g"].rm
        kind = "chunked" if rm.chunked_prefill else "continuous" if rm.batching == "continuous" else \
            "static padded" if rm.padded else "static packed"
        seen[kind] += 1
        seen[pcfg.arrivals.mode] += 1
        seen["bursts"] += "g" in draws.slowdown
        for (blocking, timeout), s in sims.items():
            k = s.channel_names.index("g")
            log = s.gpu_batches["g"]
            if rm.batching == "static":
                flush = np.isin(log["start"], s.submit_time[..., k] + rm.max_wait_s) & (log["size"] < rm.max_batch)
                seen["flush fired" if rm.max_wait_s > 0 and flush.any() else "no flush"] += 1
            submit = s.step_start[:, :-1] + s.phase[0] + s.phase[1] + s.phase[2]
            early = log["start"] < submit[log["lane"], log["step"]]
            seen["batch before its step's submit instant"] += bool(early.any())
            seen["async" if not blocking else "blocking" if timeout is None else "timeout"] += 1
            seen["timeout drops"] += timeout is not None and bool((s.status[..., k] == DROPPED).any())
            seen["cancelled on drop"] += s.cancelled is not None and bool(s.cancelled.any())
            seen["lost to a failure"] += s.failed is not None and bool(s.failed.any())
    need = ["static padded", "static packed", "continuous", "chunked", "stream", "poisson", "uniform", "trace", "bursts",
            "flush fired", "no flush", "batch before its step's submit instant", "async", "blocking", "timeout",
            "timeout drops", "cancelled on drop", "lost to a failure"]
    assert all(seen[k] > 0 for k in need), str({k: seen[k] for k in need})


def test_a_stream_of_equal_lengths_is_batch_mode():
    """Every rollout takes the generate phase and nothing comes between generate and submit:
    the samples reach the pool together at the submit instant, in sample order, as batch mode
    sends them: the same schedule and batch log, bit for bit (FIFO and shortest, bursts)."""
    for seed in (0, 1, 2, 5):
        base = random_pcfg(seed)
        base = replace(base, generate=det(1.25), fast_score=det(0.0), submit=det(0.0), fast_rm=None)
        stream = replace(base, arrivals=ArrivalsConf(mode="stream", length=det(1.25)))
        a, b = draw(stream, 3, np.random.default_rng(seed)), draw(base, 3, np.random.default_rng(seed))
        assert a.offset is not None and b.offset is None
        for blocking, timeout in MODES:
            want = run_simpy(b, blocking, timeout)
            assert_same_schedule(run_lanes(a, blocking, timeout), want, f"lanes seed {seed} {blocking} {timeout}")
            assert_same_schedule(run_simpy(a, blocking, timeout), want, f"simpy seed {seed} {blocking} {timeout}")


def test_spread_arrivals_are_back_sooner_after_the_submit_instant():
    """Samples spread over the generate phase (uniform: the same clock, the same tokens) are scored
    while the step is still generating: on average their results are back sooner after the step's
    submit instant than when the whole step arrives there."""
    pcfg = random_pcfg(0)
    a = draw(replace(pcfg, arrivals=ArrivalsConf(mode="uniform")), 20, np.random.default_rng(2))
    b = draw(pcfg, 20, np.random.default_rng(2))
    back = []
    for d in (a, b):
        s = run_lanes(d, False)
        submit = s.step_start[:, :-1] + d.phase[0] + d.phase[1] + d.phase[2]
        back.append((s.completion[..., 0] - submit[..., None]).mean())
    assert back[0] < back[1]
