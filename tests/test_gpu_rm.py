"""GPU-backed reward-model channels (kind gpu_rm) in both pipeline engines.

1. Engine agreement: the lanes engine (vectorised FIFO recursion, and the
   per-lane event loop) and the SimPy engine of record give bit-identical
   schedules and batch logs on random gpu_rm configurations, blocking or not,
   with timeouts, FIFO or shortest-first, padded or packed, with queue and
   kernel channels beside them and a fast scorer on GPUs.
2. Invariants of the batcher: every request served once, limits respected,
   no replica serves two batches at once, nothing starts before it arrives.
3. Queueing theory, written independently here: the pool with batch size 1,
   exponential service and Poisson arrivals is M/M/c (Erlang C); one-group
   deterministic batches on one replica follow Lindley's recursion.

The engines share the batcher's rule (racsim/pipeline/batcher.py), so agreement
cannot see a wrong rule: tests/test_batcher_oracle.py checks the rule itself
against a batcher written from its specification.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as hs
import pytest
from helpers import assert_same_schedule, det, det_phases, gpu, rm_model

from racsim.config.schema import (
    ChannelConf,
    LatencyConf,
    PipelineConf,
    RMConf,
    RMModelConf,
)
from racsim.pipeline.batcher import GpuSpec, _fifo_lanes, _FifoLanes, _log_order, _prefix, gpu_spec
from racsim.pipeline.cbatch import drain_seconds
from racsim.pipeline.draws import PipelineDraws, draw, draw_tokens
from racsim.pipeline.latency import token_lengths
from racsim.pipeline.engines import ENGINES
from racsim.pipeline.lanes import run_lanes
from racsim.pipeline.schedule import DROPPED, INJECTED, PENDING
from racsim.pipeline.simpy_engine import run_simpy

# ----------------------------------------------------------------------------
# Random configurations: slow GPUs (peak 30..150 TFLOP/s) so that queues form.


def random_rm(rng: np.random.Generator, order: str) -> RMConf:
    return RMConf(
        model=rm_model("8B"),
        gpu=gpu("H100", name="slow", peak_tflops=float(rng.uniform(30, 150))),
        gpus=int(rng.integers(1, 4)),
        max_batch=int(rng.integers(1, 9)),
        token_budget=int(rng.integers(400, 5000)),
        max_wait_s=float(rng.choice([0.0, 0.15, 1.0])),
        order=order,
        padded=bool(rng.integers(2)),
        sequences_per_sample=int(rng.integers(1, 4)),
        overhead_s=float(rng.choice([0.0, 0.02])),
        prompt_tokens=LatencyConf(kind="lognormal", mean=150.0, sigma=0.6, low=1.0),
        response_tokens=LatencyConf(kind="exponential", mean=300.0),
    )


def random_pcfg(seed: int) -> PipelineConf:
    rng = np.random.default_rng(5000 + seed)
    bursts = dict(degraded_factor=4.0, p_degrade=0.3, p_recover=0.4) if seed % 3 == 2 else {}
    chans = {"g": ChannelConf(kind="gpu_rm", rm=random_rm(rng, "fifo" if seed % 2 == 0 else "shortest"),
                              max_delay=[None, 1, 3][seed % 3], **bursts)}
    if seed % 3 == 1:
        chans["h"] = ChannelConf(kind="gpu_rm", rm=random_rm(rng, "fifo"), max_delay=2)
    if seed % 4 == 2:
        chans["q"] = ChannelConf(latency=LatencyConf(kind="exponential", mean=1.5), workers=2, max_delay=4)
    if seed % 4 == 3:
        chans["k"] = ChannelConf(kernel=[0.3, 0.4])
    fast = random_rm(rng, "shortest") if seed % 5 == 4 else None
    return PipelineConf(
        steps=int(rng.integers(8, 20)), batch_size=int(rng.integers(1, 5)),
        generate=LatencyConf(kind="lognormal", mean=1.0, sigma=0.5),
        fast_score=LatencyConf(kind="exponential", mean=0.2), submit=det(0.05),
        update=LatencyConf(kind="gaussian", mean=0.4, std=0.1, low=0.05),
        channels=chans, fast_rm=fast,
    )


N_RANDOM = 10
MODES = [(False, None), (True, None), (True, 0.6)]


@pytest.fixture(scope="module")
def cases():
    out = {}
    for seed in range(N_RANDOM):
        pcfg = random_pcfg(seed)
        draws = draw(pcfg, 3, np.random.default_rng(seed))
        for blocking, timeout in MODES:
            runs = (run_lanes(draws, blocking, timeout),
                    run_lanes(draws, blocking, timeout, gpu_loop=True),
                    run_simpy(draws, blocking, timeout))
            out[(seed, blocking, timeout)] = (pcfg, draws, runs)
    return out


@pytest.mark.parametrize("blocking,timeout", MODES)
@pytest.mark.parametrize("seed", range(N_RANDOM))
def test_engines_agree_on_gpu_rm_channels(cases, seed, blocking, timeout):
    _, _, (vec, loop, sim) = cases[(seed, blocking, timeout)]
    assert_same_schedule(vec, sim, f"lanes vs simpy, seed {seed} blocking {blocking} timeout {timeout}")
    assert_same_schedule(loop, sim, f"lane loop vs simpy, seed {seed} blocking {blocking} timeout {timeout}")


def test_random_gpu_configs_cover_every_case(cases):
    seen = dict(queued=False, waited_for_fill=False, full_batches=False, multi_batch_sample=False, shortest=False,
                injected=False, dropped_age=False, pending=False, timeout_drop=False, two_gpu_channels=False,
                several_replicas_busy=False, fast_rm=False, packed=False, padded=False, bursts=False)
    for (seed, blocking, timeout), (pcfg, draws, (s, _, _)) in cases.items():
        seen["fast_rm"] |= pcfg.fast_rm is not None
        seen["two_gpu_channels"] |= len(draws.gpu) == 2
        seen["bursts"] |= any((f > 1).any() for f in draws.slowdown.values())
        for k, name in enumerate(s.channel_names):
            if name not in draws.gpu:
                continue
            spec, log = draws.gpu[name], s.gpu_batches[name]
            seen["shortest"] |= spec.order == "shortest"
            seen["packed"] |= not spec.padded
            seen["padded"] |= spec.padded
            seen["queued"] |= bool((s.service_start[..., k] > s.submit_time[..., k]).any())
            seen["full_batches"] |= bool((log["size"] == spec.max_batch).any() and spec.max_batch > 1)
            seen["waited_for_fill"] |= spec.max_wait > 0 and bool((log["size"] < spec.max_batch).any())
            seen["multi_batch_sample"] |= spec.seqs > 1 and bool((s.completion[..., k] > s.service_start[..., k]
                                                                  + (log["end"] - log["start"]).max()).any())
            seen["several_replicas_busy"] |= bool((log["replica"] > 0).any())
            st = s.status[..., k]
            if not blocking:
                seen["injected"] |= bool((st == INJECTED).any())
                seen["dropped_age"] |= bool((st == DROPPED).any())
                seen["pending"] |= bool((st == PENDING).any())
            elif timeout is not None:
                seen["timeout_drop"] |= bool((st == DROPPED).any())
    assert all(seen.values()), {k: v for k, v in seen.items() if not v}


@pytest.mark.parametrize("seed", range(N_RANDOM))
def test_batcher_invariants(cases, seed):
    for blocking, timeout in MODES:
        pcfg, draws, (s, _, _) = cases[(seed, blocking, timeout)]
        for k, name in enumerate(s.channel_names):
            if name not in draws.gpu:
                continue
            spec, log = draws.gpu[name], s.gpu_batches[name]
            tok = draws.service[name]  # (trials, steps, batch, seqs)
            n = tok.shape[0]
            assert log["size"].sum() == tok.size  # every request served exactly once
            assert np.all((log["size"] >= 1) & (log["size"] <= spec.max_batch))
            assert np.all((log["tokens"] <= spec.budget) | (log["size"] == 1))  # only a lone request may exceed
            assert np.all(log["end"] > log["start"])
            assert int(log["replicas"]) == spec.replicas and np.all(log["replica"] < spec.replicas)
            for i in range(n):
                for r in range(spec.replicas):
                    m = (log["lane"] == i) & (log["replica"] == r)
                    st, en = log["start"][m], log["end"][m]
                    assert np.all(st[1:] >= en[:-1])  # one batch at a time per replica
            assert np.all(s.service_start[..., k] >= s.submit_time[..., k])
            assert np.all(s.completion[..., k] > s.service_start[..., k])
            # a batch never starts before the step of its oldest request submitted it
            sub = s.submit_time[log["lane"], log["step"], 0, k]
            assert np.all(log["start"] >= sub)


def test_bursts_scale_each_batch_by_its_oldest_requests_step():
    """A degraded judge (Markov-modulated, issue 11 item 5) serves a batch in the service
    model's seconds times degraded_factor when the batch's oldest request was submitted in
    a degraded step: with every request the same length, a batch's duration is a function
    of its size alone, checked here batch by batch in both engines."""
    rm = replace(random_rm(np.random.default_rng(1), "fifo"), gpus=2, max_batch=3, max_wait_s=0.1,
                 prompt_tokens=det(100.0), response_tokens=det(200.0), sequences_per_sample=2)
    ch = ChannelConf(kind="gpu_rm", rm=rm, degraded_factor=3.0, p_degrade=0.3, p_recover=0.3)
    pcfg = PipelineConf(steps=30, batch_size=4, generate=LatencyConf(kind="exponential", mean=1.0),
                        fast_score=det(0.2), submit=det(0.05), update=det(0.3), channels={"g": ch})
    draws = draw(pcfg, 6, np.random.default_rng(2))
    factor = draws.slowdown["g"]
    assert set(np.unique(factor)) == {1.0, 3.0}
    spec = draws.gpu["g"]
    for s in (run_lanes(draws, False), run_lanes(draws, False, gpu_loop=True), run_simpy(draws, False),
              run_lanes(draws, True), run_simpy(draws, True, 2.0)):
        log = s.gpu_batches["g"]
        n = log["size"].astype(np.float64)
        plain = spec.model.seconds(n, n * 300.0, n * 300.0**2, np.full_like(n, 300.0))
        np.testing.assert_allclose(log["end"] - log["start"], plain * factor[log["lane"], log["step"]],
                                   rtol=1e-12, atol=1e-9)
        assert (log["step"][factor[log["lane"], log["step"]] == 3.0]).size > 0


def test_blocking_waits_for_the_whole_group():
    """Wait-for-slow on a gpu_rm channel: the step resumes exactly when its
    last sequence is scored, and every result is injected at delay 0."""
    rm = RMConf(model=rm_model("8B"), gpu=gpu("H100", peak_tflops=50.0), gpus=2, max_batch=4, sequences_per_sample=3)
    pcfg = PipelineConf(steps=10, batch_size=3, **det_phases(6.0, 1.0, 0.1, 2.0),
                        channels={"g": ChannelConf(kind="gpu_rm", rm=rm)})
    draws = draw(pcfg, 4, np.random.default_rng(3))
    for run in (run_lanes, run_simpy):
        s = run(draws, True)
        assert np.all(s.status == INJECTED) and np.all(s.delay == 0)
        resumed = s.step_start[:, 1:] - draws.phase[3]
        np.testing.assert_allclose(resumed, s.completion[..., 0].max(axis=2), rtol=1e-12)


# ----------------------------------------------------------------------------
# Queueing theory.


class LinearService:
    """seconds = tokens / rate: with exponential token counts, exponential service."""

    padded = False

    def __init__(self, rate: float):
        self.rate = rate

    def seconds(self, count, tok_sum, sq_sum, max_len):
        return np.asarray(tok_sum, dtype=np.float64) / self.rate


def erlang_c_wait(c: int, lam: float, mu: float) -> float:
    """Mean wait in queue of M/M/c: C(c, a) / (c mu - lam), a = lam / mu."""
    a = lam / mu
    rho = a / c
    tail = a**c / math.factorial(c) / (1 - rho)
    p_wait = tail / (sum(a**k / math.factorial(k) for k in range(c)) + tail)
    return p_wait / (c * mu - lam)


@pytest.mark.parametrize("c,rho", [pytest.param(1, 0.7, marks=pytest.mark.long), (3, 0.75),
                                   pytest.param(4, 0.6, marks=pytest.mark.long)])
def test_gpu_pool_is_erlang_c_with_batch_size_one(c, rho):
    """Batch size 1, no waiting to fill, Poisson arrivals (exponential steps, one
    request each), exponential service (tokens ~ Exp, time = tokens / rate):
    the mean wait in queue is Erlang C's within 5%."""
    lanes, steps, warm = 300, 3000, 300
    mean_tokens, rate = 2000.0, 1000.0  # mean service 2 s
    mu = rate / mean_tokens
    lam = rho * c * mu
    rng = np.random.default_rng(100 + c)
    tokens = np.maximum(np.rint(rng.exponential(mean_tokens, (lanes, steps, 1, 1))), 1.0)
    gen = rng.exponential(1.0 / lam, (lanes, steps))
    zero = np.zeros((lanes, steps))
    draws = PipelineDraws(
        phase=np.stack([gen, zero, zero, zero]), service={"g": tokens}, kernel_channels=frozenset(),
        nominal_step=1.0 / lam, workers={"g": None}, max_delay={"g": None},
        gpu={"g": GpuSpec(replicas=c, max_batch=1, budget=1e12, max_wait=0.0, order="fifo", padded=False,
                          model=LinearService(rate), seqs=1)},
    )
    s = run_lanes(draws, False)
    wait = (s.service_start - s.submit_time)[:, warm:, 0, 0]
    mean_service = float(np.mean(tokens)) / rate  # the rounded draws' own mean
    expected = erlang_c_wait(c, lam, 1.0 / mean_service)
    assert wait.mean() == pytest.approx(expected, rel=0.05)
    # and the SimPy engine of record gives the very same schedule on a few lanes
    few = PipelineDraws(phase=draws.phase[:, :3, :400], service={"g": tokens[:3, :400]},
                        kernel_channels=frozenset(), nominal_step=1.0, workers={"g": None}, max_delay={"g": None},
                        gpu=draws.gpu)
    assert_same_schedule(run_lanes(few, False), run_simpy(few, False), "M/M/c lanes vs simpy")


def lindley_starts(arrival, service):
    """Start times of a single FIFO server: W_{k+1} = max(0, W_k + S_k - (A_{k+1} - A_k))."""
    start = np.empty(len(arrival))
    wait = 0.0
    for k in range(len(arrival)):
        if k:
            wait = max(0.0, wait + service[k - 1] - (arrival[k] - arrival[k - 1]))
        start[k] = arrival[k] + wait
    return start


@pytest.mark.parametrize("engine", ["lanes", "simpy"])
@pytest.mark.parametrize("split,blocking", [(1, False), (2, False), (1, True)])
def test_deterministic_batches_follow_lindley(engine, split, blocking):
    """All sequences 450 tokens; each step's group of G requests forms ``split``
    batches of G / split (max_batch), one replica, no waiting to fill: batches are
    a G/D/1 queue whose start times follow Lindley's recursion, each taking the
    roofline time computed here by hand."""
    B, seqs = 4, 2
    G = B * seqs
    m = RMModelConf(name="t", layers=4, d_model=512, d_ff=1024, n_heads=8, n_kv_heads=8, vocab=1000, bytes_per_param=2.0)
    rm = RMConf(model=m, gpu=gpu("H100", peak_tflops=0.002, mem_bw_tbs=1.0), gpus=1, mfu=0.5, overhead_s=0.03,
                max_batch=G // split, token_budget=10**6, max_wait_s=0.0, padded=True, sequences_per_sample=seqs,
                prompt_tokens=det(150.0), response_tokens=det(300.0))
    pcfg = PipelineConf(steps=30, batch_size=B, generate=LatencyConf(kind="lognormal", mean=1.0, sigma=0.8),
                        fast_score=det(0.0), submit=det(0.0), update=det(0.2),
                        channels={"g": ChannelConf(kind="gpu_rm", rm=rm)})
    # by hand: per layer 2 d^2 (q, o) + 2 d^2 (k, v: 8 kv heads of 64) + 3 d d_ff + 2 d; + final norm and head
    d = 512
    params = 4 * (4 * d * d + 3 * d * 1024 + 2 * d) + 2 * d
    n = G // split
    flops = 2 * params * (n * 450) + 2 * 4 * d * n * 450**2
    D = flops / (0.002e12 * 0.5) + 0.03
    draws = draw(pcfg, 3, np.random.default_rng(9))
    s = ENGINES[engine](draws, blocking)
    log = s.gpu_batches["g"]
    np.testing.assert_allclose(log["end"] - log["start"], D, rtol=1e-12)
    for i in range(3):
        arrivals = np.repeat(s.submit_time[i, :, 0, 0], split)
        starts = lindley_starts(arrivals, np.full(arrivals.size, D))
        got = log["start"][log["lane"] == i]
        np.testing.assert_allclose(got, starts, rtol=1e-12, atol=1e-9)
        assert np.all(log["size"][log["lane"] == i] == n)
    assert (log["start"] > s.submit_time[log["lane"], log["step"], 0, 0] + 1e-9).any() or blocking  # queues formed


def test_fast_scorer_on_gpus_sets_the_fast_score_phase():
    """pipeline.fast_rm: the fast_score phase is the time its pool takes to score
    the step's sequences, all handed over at once: one batch on one replica is
    the service model's time for that batch; single-sequence batches on several
    replicas are list-scheduled (each on the replica that falls free first)."""
    rm = RMConf(model=rm_model("8B"), gpu=gpu("H100", peak_tflops=100.0, memory_gb=1e5), gpus=1, max_batch=64,
                token_budget=10**7, sequences_per_sample=2)
    phases = det_phases(6.0, 1.0, 0.1, 2.0)
    pcfg = PipelineConf(steps=5, batch_size=3, **phases, channels={"k": ChannelConf(kernel=[1.0])}, fast_rm=rm)
    draws = draw(pcfg, 2, np.random.default_rng(4))
    rng = np.random.default_rng(4)
    draw(PipelineConf(steps=5, batch_size=3, **phases, channels={"k": ChannelConf(kernel=[1.0])}), 2, rng)
    tok = draw_tokens(rm, rng, (2, 5, 6))  # the same stream, drawn after the channels
    model = gpu_spec(rm, "fast").model
    expect = model.seconds(6.0, tok.sum(-1), (tok**2).sum(-1), tok.max(-1))
    np.testing.assert_allclose(draws.phase[1], expect, rtol=1e-12)
    rm2 = RMConf(**{**rm.__dict__, "gpus": 2, "max_batch": 1})
    spec = gpu_spec(rm2, "fast")
    got = drain_seconds(spec, tok)
    for i, t in np.ndindex(2, 5):
        free = [0.0, 0.0]
        for L in tok[i, t]:
            r = int(np.argmin(free))
            free[r] += float(spec.model.seconds(1.0, L, L * L, L))
        assert got[i, t] == pytest.approx(max(free), rel=1e-12)


@pytest.mark.parametrize("padded,order,replicas", [(False, "fifo", 1), (True, "fifo", 1), (False, "shortest", 1),
                                                   (True, "shortest", 2), (False, "fifo", 3)])
def test_drain_seconds_is_the_fifo_rule_on_every_row(padded, order, replicas):
    """drain_seconds' shortcut on one replica (each batch as many from the head as fit, its seconds added in
    order) gives the bits the vectorised FIFO rule gives each row: batches cut by the budget before max_batch,
    a request over the budget alone, a last batch shorter than max_batch; the rule itself on 2-3 replicas."""
    rng = np.random.default_rng(replicas + 2 * padded)
    rm = RMConf(model=rm_model("8B"), gpu=gpu("H100"), gpus=replicas, max_batch=8,
                token_budget=12000 if padded else 6000,
                sequences_per_sample=4, padded=padded, order=order)
    spec = gpu_spec(rm, "fast")
    tok = np.round(rng.lognormal(np.log(450.0), 0.6, (4, 30, 37)))  # 37 = 4 batches of 8 and one of 5
    tok[0, :5, 3] = 13000.0  # a request over the budget: a batch of its own
    flat = tok.reshape(-1, 37)
    srt = np.sort(flat, axis=1, kind="stable") if order == "shortest" else flat
    now = GpuSpec(**{**spec.__dict__, "max_wait": 0.0})
    st = _FifoLanes.new(srt.shape[0], 37, replicas)
    cum, cum2 = _prefix(srt, padded)
    _fifo_lanes(now, srt, cum, cum2, np.zeros((srt.shape[0], 1)), 37, 37, st)
    want = st.comp.max(axis=1).reshape(4, 30)
    got = drain_seconds(spec, tok)
    assert np.array_equal(got, want)


@settings(max_examples=60, deadline=None)
@given(hs.integers(1, 40), hs.integers(1, 12), hs.integers(1, 3), hs.booleans(), hs.sampled_from(["fifo", "shortest"]),
       hs.floats(0.3, 3.0), hs.integers(0, 2**32 - 1))
def test_drain_seconds_is_the_fifo_rule_on_generated_pools(G, M, replicas, padded, order, budget_x, seed):
    """drain_seconds against the vectorised FIFO rule, bit for bit, on generated pools: any number of requests a
    row (1 to 40), max_batch 1 to 12, 1 to 3 replicas, a token budget from 0.3x to 3x a full batch of typical
    requests (so that the budget, max_batch or the row's end cuts a batch), padded or packed, fifo or shortest."""
    rng = np.random.default_rng(seed)
    budget = max(1, int(budget_x * M * 450))
    rm = RMConf(model=rm_model("8B"), gpu=gpu("H100"), gpus=replicas, max_batch=M, token_budget=budget,
                sequences_per_sample=1, padded=padded, order=order)
    spec = gpu_spec(rm, "fast")
    tok = np.maximum(np.round(rng.lognormal(np.log(450.0), 0.8, (3, 5, G))), 1.0)
    flat = tok.reshape(-1, G)
    srt = np.sort(flat, axis=1, kind="stable") if order == "shortest" else flat
    st = _FifoLanes.new(srt.shape[0], G, replicas)
    cum, cum2 = _prefix(srt, padded)
    _fifo_lanes(GpuSpec(**{**spec.__dict__, "max_wait": 0.0}), srt, cum, cum2, np.zeros((srt.shape[0], 1)), G, G, st)
    assert np.array_equal(drain_seconds(spec, tok), st.comp.max(axis=1).reshape(3, 5))


@pytest.mark.parametrize("seed", range(40))
def test_log_order_is_the_lexsort(seed):
    """_log_order, a stable sort by lane when each lane's rows come in (start, replica) order (as
    logged: ties in start included), a lexsort otherwise (rows shuffled, or one pair swapped), is
    np.lexsort((replica, start, lane)) on random logs, more than 2^16 lanes included."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 300))
    lane = rng.integers(0, [3, 40, 1 << 17][seed % 3], n)
    start = np.sort(rng.integers(0, 30, n).astype(float))  # ties in start
    rep = rng.integers(0, 4, n)
    rep = rep[np.lexsort((rep, start))]  # replicas ascending within a start: every lane in order
    orders = [np.arange(n), rng.permutation(n)]
    if n > 1:
        swap = np.arange(n)
        i = int(rng.integers(0, n - 1))
        swap[[i, i + 1]] = swap[[i + 1, i]]
        orders.append(swap)
    for o in orders:
        np.testing.assert_array_equal(_log_order(lane[o], start[o], rep[o]), np.lexsort((rep[o], start[o], lane[o])))



@pytest.mark.parametrize("every", [1, 3])
@pytest.mark.parametrize("seed", [0, 5, 9])
def test_requests_times_written_in_flushes_are_the_same(seed, every, monkeypatch):
    """The vectorised FIFO rule writes its requests' dispatch and completion (and lost flags) every
    WRITE_EVERY iterations and when it returns: flushes after one or three iterations give the
    SimPy engine's schedule (tests/test_arrivals_gpu.py's configs: failing pools, retried on
    seed 5 and lost on seed 9)."""
    from test_arrivals_gpu import arrivals_gpu_pcfg

    from racsim.pipeline import batcher

    monkeypatch.setattr(batcher, "WRITE_EVERY", every)
    pcfg = arrivals_gpu_pcfg(seed, "unused.csv")
    pcfg.arrivals = type(pcfg.arrivals)()  # batch arrivals
    draws = draw(pcfg, 2, np.random.default_rng(seed))
    assert (seed % 4 == 1) == bool(draws.faults)
    for blocking, timeout in MODES:
        sim = run_simpy(draws, blocking, timeout)
        assert_same_schedule(run_lanes(draws, blocking, timeout), sim, f"seed {seed} every {every} {blocking}")


def test_the_same_token_draw_is_drawn_once_and_the_same():
    """draw_tokens from the same generator state, laws and shape returns its last tokens (the same
    read-only array) and leaves the generator where a fresh draw does; other laws, another shape
    or another state draw anew; the numbers equal a draw made without it."""
    rm = random_rm(np.random.default_rng(3), "fifo")
    a, b = np.random.default_rng(11), np.random.default_rng(11)
    first = draw_tokens(rm, a, (2, 3, 4))
    again = draw_tokens(rm, b, (2, 3, 4))
    assert again is first and not first.flags.writeable
    assert a.bit_generator.state == b.bit_generator.state and a.random() == b.random()
    fresh = token_lengths(rm.prompt_tokens, rm.response_tokens, "rm").sample(np.random.default_rng(11), (2, 3, 4))
    np.testing.assert_array_equal(first, fresh)
    assert draw_tokens(rm, np.random.default_rng(12), (2, 3, 4)) is not first  # another state
    assert draw_tokens(rm, np.random.default_rng(11), (2, 3, 5)).shape == (2, 3, 5)  # another shape
    other = replace(rm, response_tokens=LatencyConf(kind="exponential", mean=30.0))
    np.testing.assert_array_less(draw_tokens(other, np.random.default_rng(11), (2, 3, 4)).mean(), first.mean())
