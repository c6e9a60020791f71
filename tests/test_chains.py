"""A FIFO pool fed a step at a time, in light passes (racsim/pipeline/chains.py).

1. Against the rule it shortens, :func:`_fifo_lanes` as the lanes engine called it (step by
   step when blocking, once over every step when not): the same dispatches, completions, free
   times, heads, batch log and step ends bit for bit, on random pools: padded or packed, the
   budget binding or not (requests longer than the budget), ``max_wait`` 0 or long, steps
   smaller than a batch or holding a full last batch, bursts' factors, the next step arriving
   the instant the last ends, plans of a few steps; asynchronously, steps arriving together or
   in a backlog, so that last batches meet the next step and steps begin inside.
2. With faults (blocking): against :func:`_fifo_lanes` with outages, bit for bit, requests lost
   included, for ``on_failure`` resend, retry and lose, outages from rare to most of the time:
   steps wholly calm, calm up to a change and served by the rule after, never calm (no replica
   up), cut batches re-sent ahead of a new batch or after the step's last; and on generated pools
   (hypothesis).
3. In the engine: the lanes engine takes this path for a batch-mode FIFO pool, with faults when
   blocking, and agrees with the SimPy engine to the last bit, bursts and faults included; it
   does not where its premise fails (faults when asynchronous, arrivals over time, a timeout,
   the per-lane loop).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs
from helpers import assert_same_schedule, det, gpu, rm_model

from racsim.config.schema import ArrivalsConf, ChannelConf, FaultsConf, LatencyConf, PipelineConf, RMConf
from racsim.pipeline.batcher import _batch_log, _fifo_lanes, _FifoLanes, _prefix, gpu_spec
from racsim.pipeline import batcher, chains
from racsim.pipeline.chains import Steps
from racsim.pipeline.draws import draw
from racsim.pipeline.faults import FaultSpec, Timeline
from racsim.pipeline.lanes import _GpuLanes, run_lanes
from racsim.pipeline.simpy_engine import run_simpy


def random_case(rng: np.random.Generator):
    """A random pool spec, tokens (lanes, steps * G), G, steps and bursts' factors (or None)."""
    padded = bool(rng.integers(2))
    M = int(rng.integers(1, 9))
    rm = RMConf(model=rm_model("8B"), gpu=gpu("H100", name="slow", peak_tflops=float(rng.uniform(30, 150))),
                gpus=int(rng.integers(1, 7)), max_batch=M, token_budget=int(rng.integers(300, 4000)),
                max_wait_s=float(rng.choice([0.0, 0.05, 3.0])), padded=padded,
                overhead_s=float(rng.choice([0.0, 0.02])))
    spec = gpu_spec(rm, "rm")
    lanes, steps = int(rng.integers(1, 5)), int(rng.integers(1, 7))
    G = int(rng.choice([1, M, 2 * M, int(rng.integers(1, 40))]))  # a step of one request, of whole batches, any
    tok = rng.lognormal(np.log(400.0), 0.8, size=(lanes, steps * G))
    if rng.integers(2):
        tok = np.round(tok)
    slow = np.where(rng.random((lanes, steps)) < 0.3, 4.0, 1.0) if rng.integers(2) else None
    return spec, tok, G, steps, slow


def new_state(spec, tok, faults):
    st = _FifoLanes.new(tok.shape[0], tok.shape[1], spec.replicas)
    if faults is not None:
        st.lost = np.zeros(tok.shape, dtype=bool)
    return st


def reference(spec, tok, G, steps, slow, gaps, faults=None):
    """The lanes engine's old path: :func:`_fifo_lanes` on each step's requests as they arrive
    (``faults``: a Timeline, its replicas failing)."""
    lanes = tok.shape[0]
    st = new_state(spec, tok, faults)
    cum, cum2 = _prefix(tok, spec.padded)
    group_time = np.full((lanes, steps), np.inf)
    now, ends = np.zeros(lanes), []
    for t in range(steps):
        group_time[:, t] = now
        _fifo_lanes(spec, tok, cum, cum2, group_time, G, (t + 1) * G, st, slow, faults)
        ends.append(st.comp[:, t * G:(t + 1) * G].max(axis=1))
        now = ends[-1] + gaps[:, t]
    return st, np.array(ends)


def light(spec, tok, G, steps, slow, gaps, arrivals=None, faults=None):
    """The light passes (:class:`Steps`), blocking (``arrivals`` None: each step ``gaps`` after
    the last one's results) or asynchronous (every step's arrival known)."""
    lanes = tok.shape[0]
    st = new_state(spec, tok, faults)
    cum, cum2 = _prefix(tok, spec.padded)
    group_time = np.full((lanes, steps), np.inf) if arrivals is None else arrivals.copy()
    srv = Steps(spec, tok, cum, cum2, G, slow, st, group_time, faults)
    now, ends, inf = np.zeros(lanes), [], np.full(lanes, np.inf)
    for t in range(steps):
        if arrivals is None:
            group_time[:, t] = now
            ends.append(srv.step(t, now, inf))
            now = ends[-1] + gaps[:, t]
        else:
            srv.step(t, arrivals[:, t], arrivals[:, t + 1] if t + 1 < steps else inf)
    return st, np.array(ends)


def assert_same_state(got, ref, replicas):
    for k in ("disp", "comp", "free", "last", "head", "lost"):
        np.testing.assert_array_equal(getattr(got, k), getattr(ref, k), err_msg=k)
    a, b = _batch_log(got.log, replicas), _batch_log(ref.log, replicas)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert np.isfinite(got.comp).all() and not np.isnan(got.disp).any()  # every request served


@pytest.fixture(params=[24, 600])
def small_plans(request, monkeypatch):
    """Plans of one step or a few, so that runs go from one plan to the next."""
    monkeypatch.setattr(chains, "PLAN_CELLS", request.param)


@pytest.mark.parametrize("seed", range(40))
def test_blocking_steps_equal_the_rule_bit_for_bit(seed, small_plans):
    rng = np.random.default_rng(seed)
    spec, tok, G, steps, slow = random_case(rng)
    gaps = np.where(rng.random((tok.shape[0], steps)) < 0.3, 0.0, rng.exponential(2.0, (tok.shape[0], steps)))
    ref, ref_ends = reference(spec, tok, G, steps, slow, gaps)
    got, got_ends = light(spec, tok, G, steps, slow, gaps)
    np.testing.assert_array_equal(got_ends, ref_ends)
    assert_same_state(got, ref, spec.replicas)


def async_arrivals(rng, lanes: int, steps: int) -> np.ndarray:
    """Steps' arrivals, not decreasing: gaps of 0 (two steps at once), short (a backlog) or long."""
    gaps = rng.choice([0.0, 0.01, 0.3, 1.0, 5.0], size=(lanes, steps)) * rng.uniform(0.5, 1.5, (lanes, steps))
    return np.cumsum(gaps, axis=1)


@pytest.mark.parametrize("seed", range(60))
def test_asynchronous_steps_equal_the_rule_bit_for_bit(seed, small_plans):
    rng = np.random.default_rng(1000 + seed)
    spec, tok, G, steps, slow = random_case(rng)
    arrivals = async_arrivals(rng, tok.shape[0], steps)
    ref = _FifoLanes.new(tok.shape[0], tok.shape[1], spec.replicas)
    cum, cum2 = _prefix(tok, spec.padded)
    _fifo_lanes(spec, tok, cum, cum2, arrivals, G, tok.shape[1], ref, slow)
    got, _ = light(spec, tok, G, steps, slow, None, arrivals)
    assert_same_state(got, ref, spec.replicas)


def test_the_random_cases_reach_every_branch(monkeypatch, small_plans):
    """Budget-stopped and max_batch-stopped batches, a step's partial last batch and a full one,
    replicas all busy (a batch waits for one) and some idle, bursts; asynchronously, last batches
    that meet the next step, steps that begin inside (their own chain joining the plan's, or
    reaching the step's end alone) and steps a batch took whole."""
    seen = set()
    joined, general = chains.Steps._joined, chains._fifo_lanes

    def spy(self, b, t, start):
        out = joined(self, b, t, start)
        odd = (start > 0) & (start < self.G)
        seen.update({"begins inside"} if odd.any() else set(), {"taken whole"} if (start >= self.G).any() else set())
        for lane in np.flatnonzero(odd):  # joined: the row ends with the plan's last batch
            plans = b.head[lane][b.n[lane] > 0]
            row = out.head[lane][out.n[lane] > 0]
            seen.add("joins" if plans.size and plans[-1] == row[-1] else "own")
        return out

    def spied(*a, **k):
        seen.add("meets the next step")
        return general(*a, **k)

    monkeypatch.setattr(chains.Steps, "_joined", spy)
    monkeypatch.setattr(chains, "_fifo_lanes", spied)
    for seed in range(40):
        rng = np.random.default_rng(seed)
        spec, tok, G, steps, slow = random_case(rng)
        cum, cum2 = _prefix(tok, spec.padded)
        p = chains.plan(spec, tok, cum, cum2, G, 0, steps, slow).b
        n, full = p.n[p.n > 0], p.full[p.n > 0]
        per_step = (p.n > 0).sum(axis=2)
        for name, hit in [("max_batch", (n == spec.max_batch).any()), ("budget", ((n < spec.max_batch) & full).any()),
                          ("partial", (~full).any()), ("alone over budget", (tok > spec.budget).any()),
                          ("queued", (per_step > spec.replicas).any()), ("idle", (per_step < spec.replicas).any()),
                          ("bursts", slow is not None)]:
            seen.update({name} if hit else set())
    for seed in range(60):
        rng = np.random.default_rng(1000 + seed)
        spec, tok, G, steps, slow = random_case(rng)
        light(spec, tok, G, steps, slow, None, async_arrivals(rng, tok.shape[0], steps))
    assert seen == {"max_batch", "budget", "partial", "alone over budget", "queued", "idle", "bursts",
                    "begins inside", "taken whole", "joins", "own", "meets the next step"}


def failing(seed: int, lanes: int, replicas: int, mode: str, scale: float) -> Timeline:
    """Outages of mean length ``scale`` s, a replica up 3/4 of the time; ``mode`` on_failure."""
    return Timeline(seed, lanes, replicas, FaultSpec(mtbf=3.0 * scale, mttr=scale,
                                                     retries=0 if mode == "lose" else 2, resend=mode == "resend"))


def faulted_case(seed: int, mode: str):
    rng = np.random.default_rng(3000 + seed)
    spec, tok, G, steps, slow = random_case(rng)
    gaps = np.where(rng.random((tok.shape[0], steps)) < 0.3, 0.0, rng.exponential(2.0, (tok.shape[0], steps)))
    scale = float(rng.choice([0.3, 2.0, 20.0, 200.0]))  # outages within batches, within steps, rare
    return spec, tok, G, steps, slow, gaps, lambda: failing(seed, tok.shape[0], spec.replicas, mode, scale)


@pytest.mark.parametrize("mode", ["resend", "retry", "lose"])
@pytest.mark.parametrize("seed", range(25))
def test_blocking_steps_with_faults_equal_the_rule_bit_for_bit(seed, mode, small_plans):
    spec, tok, G, steps, slow, gaps, faults = faulted_case(seed, mode)
    ref, ref_ends = reference(spec, tok, G, steps, slow, gaps, faults())
    got, got_ends = light(spec, tok, G, steps, slow, gaps, faults=faults())
    np.testing.assert_array_equal(got_ends, ref_ends)
    assert_same_state(got, ref, spec.replicas)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(lanes=hs.integers(1, 4), replicas=hs.integers(1, 5), M=hs.integers(1, 6), budget=hs.integers(200, 3000),
       max_wait=hs.sampled_from([0.0, 0.05, 2.0]), G=hs.integers(1, 20), steps=hs.integers(1, 6),
       mtbf=hs.floats(0.05, 500.0), mttr=hs.floats(0.01, 50.0), mode=hs.sampled_from(["resend", "retry", "lose"]),
       padded=hs.booleans(), seed=hs.integers(0, 2 ** 16))
def test_blocking_steps_with_faults_equal_the_rule_on_generated_pools(lanes, replicas, M, budget, max_wait, G, steps,
                                                                      mtbf, mttr, mode, padded, seed):
    """Generated pools and outage laws: a replica up from 0.1% of the time to almost always."""
    rm = RMConf(model=rm_model("8B"), gpu=gpu("H100", name="slow", peak_tflops=80.0), gpus=replicas, max_batch=M,
                token_budget=budget, max_wait_s=max_wait, padded=padded)
    spec = gpu_spec(rm, "rm")
    rng = np.random.default_rng(seed)
    tok = np.round(rng.lognormal(np.log(400.0), 0.8, size=(lanes, steps * G)))
    gaps = rng.exponential(1.0, (lanes, steps))

    def faults():
        return Timeline(seed, lanes, replicas, FaultSpec(mtbf=mtbf, mttr=mttr, retries=0 if mode == "lose" else 2,
                                                         resend=mode == "resend"))
    ref, ref_ends = reference(spec, tok, G, steps, None, gaps, faults())
    got, got_ends = light(spec, tok, G, steps, None, gaps, faults=faults())
    np.testing.assert_array_equal(got_ends, ref_ends)
    assert_same_state(got, ref, spec.replicas)


def test_the_faulted_cases_reach_every_branch(monkeypatch):
    """Steps wholly calm, calm up to a change then the rule, calm for none of their batches (no
    replica up), batches cut and re-sent ahead of a new one or not, re-sent after the step's last
    new batch, lost; no cut batch waits when a step begins (serve_calm's premise)."""
    seen = set()
    calm, resend = chains.serve_calm, chains._resend_lanes

    def spy_calm(spec, b, now, st, G, faults):
        assert st.again is None or not st.again.waiting
        pos = calm(spec, b, now, st, G, faults)
        count = (b.n > 0).sum(axis=1)
        seen.update({"calm"} if (pos >= count).any() else set(),
                    {"calm, then the rule"} if ((pos > 0) & (pos < count)).any() else set(),
                    {"never calm"} if ((pos == 0) & (count > 0)).any() else set())
        return pos

    def spy_resend(spec, st, faults, lanes, before):
        seen.add("re-sent after the last" if np.isinf(before).all() else "re-sent first or not")
        return resend(spec, st, faults, lanes, before)

    monkeypatch.setattr(chains, "serve_calm", spy_calm)
    monkeypatch.setattr(chains, "_resend_lanes", spy_resend)  # after the last new batch
    monkeypatch.setattr(batcher, "_resend_lanes", spy_resend)  # ahead of a new one, or not
    for mode in ("resend", "lose"):
        for seed in range(25):
            spec, tok, G, steps, slow, gaps, faults = faulted_case(seed, mode)
            got, _ = light(spec, tok, G, steps, slow, gaps, faults=faults())
            seen.update({"lost"} if got.lost.any() else set())
    assert seen == {"calm", "calm, then the rule", "never calm", "re-sent after the last",
                    "re-sent first or not", "lost"}


def test_steps_with_faults_refuse_an_asynchronous_pool():
    spec, tok, G, steps, slow, gaps, faults = faulted_case(0, "resend")
    st = new_state(spec, tok, True)
    srv = Steps(spec, tok, *_prefix(tok, spec.padded), G, slow, st, np.zeros((tok.shape[0], steps)), faults())
    with pytest.raises(ValueError, match="blocking only"):
        srv.step(0, np.zeros(tok.shape[0]), np.ones(tok.shape[0]))


def judge_like(bursts: bool, padded: bool, arrivals: str = "batch", faults: bool = False) -> PipelineConf:
    rm = RMConf(model=rm_model("8B"), gpu=gpu("H100", name="slow", peak_tflops=60.0), gpus=3, max_batch=4,
                token_budget=2400, max_wait_s=0.05, padded=padded, sequences_per_sample=4,
                prompt_tokens=LatencyConf(kind="lognormal", mean=150.0, sigma=0.6, low=1.0),
                response_tokens=LatencyConf(kind="exponential", mean=300.0))
    extra = dict(degraded_factor=3.0, p_degrade=0.3, p_recover=0.4) if bursts else {}
    if faults:
        extra["faults"] = FaultsConf(mtbf_s=20.0, mttr_s=4.0)
    return PipelineConf(steps=8, batch_size=6, generate=LatencyConf(kind="lognormal", mean=1.0, sigma=0.5),
                        fast_score=det(0.1), submit=det(0.05), update=det(0.3), arrivals=ArrivalsConf(mode=arrivals),
                        channels={"judge": ChannelConf(kind="gpu_rm", rm=rm, max_delay=3, **extra)})


@pytest.mark.parametrize("blocking_,bursts,padded", [(True, False, True), (True, True, False), (False, True, True),
                                                     (False, False, False)])
def test_the_engine_takes_the_light_passes_and_agrees_with_simpy(blocking_, bursts, padded):
    draws = draw(judge_like(bursts, padded), 3, np.random.default_rng(7))
    assert _GpuLanes(draws, "judge", blocking_, None, False).steps is not None
    assert_same_schedule(run_lanes(draws, blocking_), run_simpy(draws, blocking_),
                         f"blocking {blocking_} bursts {bursts} padded {padded}")


@pytest.mark.parametrize("bursts,on_failure", [(False, "resend"), (True, "retry"), (False, "lose")])
def test_the_engine_takes_the_light_passes_with_faults_when_blocking_and_agrees_with_simpy(bursts, on_failure):
    pcfg = judge_like(bursts, False, faults=True)
    pcfg.channels["judge"].faults.on_failure = on_failure
    draws = draw(pcfg, 3, np.random.default_rng(11))
    assert _GpuLanes(draws, "judge", True, None, False).steps is not None
    assert _GpuLanes(draws, "judge", False, None, False).steps is None
    got, ref = run_lanes(draws, True), run_simpy(draws, True)
    assert_same_schedule(got, ref, f"bursts {bursts} {on_failure}")
    assert np.isfinite(got.gpu_batches["judge"]["end"]).all()


@pytest.mark.parametrize("change", ["faults asynchronous", "arrivals", "timeout", "loop"])
def test_the_light_passes_are_not_taken_where_their_premise_fails(change):
    pcfg = judge_like(False, True, arrivals="poisson" if change == "arrivals" else "batch",
                      faults=change.startswith("faults"))
    draws = draw(pcfg, 2, np.random.default_rng(3))
    timeout, loop = 0.6 if change == "timeout" else None, change == "loop"
    assert _GpuLanes(draws, "judge", not change.startswith("faults"), timeout, loop).steps is None
