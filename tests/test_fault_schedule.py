"""Failures of gpu_rm replicas, part 2: the vectorised FIFO recursion with outages against
the per-lane event loop and the SimPy engine (random configs that reach every branch), and
a preemption schedule read from a CSV (``faults.schedule``): its reader's refusals, a
hand-checked pool, and random schedules against the per-request loop oracle of test_faults."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import assert_same_schedule, det, gpu, rm_model
from test_faults import LinearService, event_loop_oracle, oracle

from racsim.config.defaults import compose_config
from racsim.config.spec import scenario
from racsim.config.schema import ChannelConf, FaultsConf, LatencyConf, PipelineConf, RMConf
from racsim.config.validate import validate
from racsim.errors import ConfigError
from racsim.pipeline import faults as F
from racsim.pipeline.batcher import GpuSpec
from racsim.pipeline.draws import PipelineDraws, draw
from racsim.pipeline.faults import FaultSpec, Timeline, read_schedule
from racsim.pipeline.lanes import _GpuLanes, run_lanes
from racsim.pipeline.simpy_engine import run_simpy

KEY = "pipeline.channels.g.faults.schedule"


# ----------------------------------------------------------------------------
# The vectorised recursion with outages equals the event loop, bit for bit.


def random_pcfg(seed: int) -> PipelineConf:
    """A FIFO gpu_rm pool with failures: pools of 1..6 replicas, static (padded or packed,
    with or without waiting to fill) or continuous batches, bursts on or off, retry
    (caps 0..3) or lose, failures rare to frequent."""
    rng = np.random.default_rng(500 + seed)
    rm = RMConf(model=rm_model("8B"), gpu=gpu("H100", name="slow", peak_tflops=float(rng.uniform(40, 150))),
                gpus=int(rng.integers(1, 7)), tp=1, max_batch=int(rng.integers(1, 8)), token_budget=4000,
                max_wait_s=float(rng.choice([0.0, 0.2, 1.0])), order="fifo", padded=bool(seed % 2),
                batching=["static", "continuous"][seed % 3 == 2], sequences_per_sample=int(rng.integers(1, 3)),
                prompt_tokens=LatencyConf(kind="lognormal", mean=150.0, sigma=0.6, low=1.0),
                response_tokens=LatencyConf(kind="exponential", mean=300.0))
    faults = FaultsConf(mtbf_s=float(rng.choice([2.0, 8.0, 40.0])), mttr_s=float(rng.uniform(0.3, 4)),
                        on_failure=["retry", "lose"][seed % 4 == 3], max_retries=int(rng.integers(0, 4)))
    bursts = dict(degraded_factor=3.0, p_degrade=0.3, p_recover=0.4) if seed % 2 == 0 else {}
    chans = {"g": ChannelConf(kind="gpu_rm", rm=rm, faults=faults, max_delay=[None, 2][seed % 2], **bursts)}
    return PipelineConf(steps=int(rng.integers(8, 16)), batch_size=int(rng.integers(1, 5)),
                        generate=LatencyConf(kind="lognormal", mean=0.8, sigma=0.5),
                        fast_score=det(0.1), submit=det(0.05), update=det(0.2), channels=chans)


@pytest.mark.parametrize("seed", range(12))
def test_vectorised_pool_with_failures_equals_the_event_loop_and_simpy(seed):
    pcfg = random_pcfg(seed)
    draws = draw(pcfg, 4, np.random.default_rng(seed))
    assert _GpuLanes(draws, "g", False, None, False).vector  # the recursion, not the loop
    for blocking in (False, True):
        vec = run_lanes(draws, blocking)
        loop = run_lanes(draws, blocking, gpu_loop=True)
        assert_same_schedule(vec, loop, f"seed {seed} blocking {blocking}: vector vs loop")
        assert_same_schedule(vec, run_simpy(draws, blocking), f"seed {seed} blocking {blocking}: vector vs simpy")
        assert np.array_equal(vec.failed, loop.failed)


def test_the_random_configs_reach_every_branch():
    """Lost batches, restarted batches, pools of 1 and of several, continuous batches and bursts."""
    seen = dict(lost=0, restarted=0, single=0, pool=0, continuous=0, bursts=0)
    for seed in range(12):
        pcfg = random_pcfg(seed)
        draws = draw(pcfg, 4, np.random.default_rng(seed))
        s = run_lanes(draws, False)
        seen["lost"] += int(s.failed.sum())
        log = s.gpu_batches["g"]
        # a batch that ran longer than its undisturbed seconds was restarted: its end is past
        # start + seconds; the undisturbed seconds come from the same run without failures
        pcfg.channels["g"].faults = FaultsConf()
        clean = run_lanes(draw(pcfg, 4, np.random.default_rng(seed)), False).gpu_batches["g"]
        seen["restarted"] += int((log["end"] - log["start"]).max() > (clean["end"] - clean["start"]).max())
        seen["single" if draws.gpu["g"].replicas == 1 else "pool"] += 1
        seen["continuous"] += pcfg.channels["g"].rm.batching == "continuous"
        seen["bursts"] += "g" in draws.slowdown
    assert all(v > 0 for v in seen.values()), seen


# ----------------------------------------------------------------------------
# The schedule's reader.


def write(tmp_path, text, name="sched.csv"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_read_schedule_sorts_each_servers_outages(tmp_path):
    p = write(tmp_path, "# a maintenance window and two evictions\nup_s,server,down_s\n30,1,20\n8.5,0,2\n"
                        "\n50,0,40\n")
    got = read_schedule(p, KEY, 3)
    assert [d.tolist() for d, _ in got] == [[2.0, 40.0], [20.0], []]
    assert [u.tolist() for _, u in got] == [[8.5, 50.0], [30.0], []]


@pytest.mark.parametrize("text,what", [
    ("server,down_s\n0,1\n", "no column up_s"),
    ("server,down_s,up_s\n0,abc,3\n", "line 2: down_s is 'abc', not a number"),
    ("server,down_s,up_s\n0,1,\n", "line 2: up_s is '', not a number"),
    ("server,down_s,up_s\n0,nan,3\n", "down_s is nan; a finite number >= 0"),
    ("server,down_s,up_s\n0,1,1e400\n", "up_s is inf; a finite number >= 0"),
    ("server,down_s,up_s\n0,-1,3\n", "down_s is -1.0; a finite number >= 0"),
    ("server,down_s,up_s\n2,1,3\n", "server 2 is not a server index 0..1"),
    ("server,down_s,up_s\n0.5,1,3\n", "server 0.5 is not a server index"),
    ("server,down_s,up_s\n0,3,3\n", "down_s 3 >= up_s 3"),
    ("server,down_s,up_s\n0,5,9\n1,0,1\n0,8,12\n", "server 0's outages [5, 9) and [8, 12) overlap or touch"),
    ("server,down_s,up_s\n0,5,9\n0,9,12\n", "overlap or touch"),
    ("server,down_s,up_s\n0,1,3,4\n", "line 2 has 4 cells, the header 3"),
    ("# only a comment\n", "the file is empty"),
    ("server,down_s,up_s\n0,1,\xff\n", None),
])
def test_a_bad_schedule_is_one_line_naming_the_key_and_file(tmp_path, text, what):
    p = tmp_path / "s.csv"
    p.write_bytes(text.encode("latin-1"))
    with pytest.raises(ConfigError) as e:
        read_schedule(str(p), KEY, 2)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{KEY} = {str(p)!r}: ") and (what is None or what in msg), msg


def test_a_schedule_too_big_or_missing_is_refused(tmp_path, monkeypatch):
    p = write(tmp_path, "server,down_s,up_s\n" + "0,1,2\n" * 10)
    monkeypatch.setattr(F, "SCHEDULE_BYTES", 40)
    with pytest.raises(ConfigError, match=r"larger than 40 bytes"):
        read_schedule(p, KEY, 1)
    with pytest.raises(ConfigError, match=r"unreadable \(FileNotFoundError"):
        read_schedule(str(tmp_path / "none.csv"), KEY, 1)


def test_a_scheduled_timeline_is_the_schedule_in_every_lane():
    sched = [(np.array([2.0, 10.0]), np.array([5.0, 11.0])), (np.zeros(0), np.zeros(0))]
    tl = Timeline(0, 3, 2, FaultSpec(math.inf, 0.0, 1), sched)
    for lane in range(3):
        assert tl.outage(lane, 0, 0.0) == (2.0, 5.0) and tl.outage(lane, 0, 5.0) == (10.0, 11.0)
        assert tl.next_up(lane, 0, 2.0) == 5.0 and tl.next_up(lane, 0, 5.0) == 5.0
        assert tl.next_up(lane, 0, 11.0) == 11.0 and tl.next_up(lane, 1, 3.0) == 3.0
        assert tl.serve(lane, 0, 0.0, 2.0) == (2.0, False)  # ends as the outage begins: not cut
        assert tl.serve(lane, 0, 0.0, 3.0) == (8.0, False)  # cut at 2, restarted at 5
        assert tl.serve(lane, 0, 6.0, 5.0) == (16.0, False)  # cut at 10, restarted at 11
        assert tl.serve(lane, 0, 0.0, 6.0) == (10.0, True)  # cut at 2, restarted at 5, cut at 10: the cap is 1
    # up fraction over [0, 12]: 4 s down of 24 server-seconds; over [3, 4]: server 0 down
    assert np.allclose(tl.up_fraction(np.zeros(3), np.full(3, 12.0)), 1 - 4 / 24)
    assert np.allclose(tl.up_fraction(np.full(3, 3.0), np.full(3, 4.0)), 0.5)


# ----------------------------------------------------------------------------
# Pools on a schedule: by hand, and random schedules against the loop oracle.


def pool_draws(gen, tokens, c, sched, retries):
    lanes, steps = gen.shape
    zero = np.zeros((lanes, steps))
    return PipelineDraws(
        phase=np.stack([gen, zero, zero, zero]), service={"g": tokens}, kernel_channels=frozenset(),
        nominal_step=1.0, workers={"g": None}, max_delay={"g": None},
        gpu={"g": GpuSpec(replicas=c, max_batch=1, budget=1e12, max_wait=0.0, order="fifo", padded=False,
                          model=LinearService(1000.0), seqs=1)},
        faults={"g": Timeline(0, lanes, c, FaultSpec(math.inf, 0.0, retries), sched)},
    )


@pytest.mark.parametrize("retries,start,end,lost", [
    # one replica down [4, 6); 3 s jobs arriving at 2, 4, 6
    (1, [2, 9, 12], [9, 12, 15], [False] * 3),  # cut at 4, restarted at 6: 6 + 3 = 9; the others queue
    (0, [2, 6, 9], [4, 9, 12], [True, False, False]),  # lost at 4; the replica is back at 6
])
def test_a_hand_checked_pool_on_a_schedule(retries, start, end, lost):
    gen = np.full((2, 3), 2.0)
    tokens = np.full((2, 3, 1, 1), 3000.0)
    draws = pool_draws(gen, tokens, 1, [(np.array([4.0]), np.array([6.0]))], retries)
    for s in (run_lanes(draws, False), run_simpy(draws, False), run_lanes(draws, False, gpu_loop=True)):
        for lane in range(2):
            assert s.service_start[lane, :, 0, 0].tolist() == start
            assert s.completion[lane, :, 0, 0].tolist() == [math.inf if x else e for e, x in zip(end, lost)]
            assert s.failed[lane, :, 0, 0].tolist() == lost


def random_schedule(rng, c, horizon):
    """Per server: outages of random lengths with random gaps (never touching) up to ``horizon``."""
    out = []
    for _ in range(c):
        t, d, u = float(rng.uniform(0, 6)), [], []
        while t < horizon:
            d.append(t)
            t += float(rng.uniform(0.2, 4))
            u.append(t)
            t += float(rng.uniform(0.1, 12))
        out.append((np.array(d), np.array(u)))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_random_schedules_match_the_loop_oracle(seed):
    rng = np.random.default_rng(70 + seed)
    lanes, steps, batch, c, retries = 3, 40, 3, int(rng.integers(1, 4)), [0, 1, 3][seed % 3]
    tokens = np.maximum(np.rint(rng.exponential(2000.0, (lanes, steps, batch, 1))), 1.0)
    gen = rng.exponential(2.0, (lanes, steps))
    sched = random_schedule(rng, c, 400.0)
    draws = pool_draws(gen, tokens, c, sched, retries)
    got = run_lanes(draws, False)
    assert_same_schedule(got, run_simpy(draws, False), f"seed {seed}")
    assert_same_schedule(got, run_lanes(draws, False, gpu_loop=True), f"seed {seed} loop")
    lost_any = 0
    for i in range(lanes):
        arrival = np.repeat(np.cumsum(gen[i]), batch)
        service = (tokens[i, :, :, 0] / 1000.0).ravel()
        never = [math.inf]  # after its last outage a server stays up
        want = oracle(arrival, service, [[*d, *never] for d, _ in sched], [[*u, *never] for _, u in sched], retries)
        s, e, x = (np.array(v).reshape(steps, batch) for v in zip(*want))
        assert np.array_equal(got.service_start[i, :, :, 0], s)
        assert np.array_equal(got.completion[i, :, :, 0], np.where(x, np.inf, e))
        assert np.array_equal(got.failed[i, :, :, 0], x)
        lost_any += int(x.sum())
    assert lost_any > 0 or retries > 0  # the lose branch is reached without retries


# ----------------------------------------------------------------------------
# The knob in a config.


def test_the_schedule_knob_validates_and_draws(tmp_path):
    p = write(tmp_path, "server,down_s,up_s\n0,10,40\n2,5,6\n")
    J = "pipeline.channels.judge.faults"
    cfg = scenario(compose_config("scenario=capacity/judge_rm_faults", f"{J}.mtbf_s=null", f"{J}.mttr_s=null",
                                  f"{J}.schedule={p}", "pipeline.channels.judge.rm.gpus=3"))
    validate(cfg)
    d = draw(cfg.pipeline, 2, np.random.default_rng(0))
    tl = d.faults["judge"]
    assert tl.spec.retries == 3 and tl.outage(1, 0, 0.0) == (10.0, 40.0) and tl.next_up(0, 2, 5.5) == 6.0
    # the schedule draws no random number: the draws are those of the run without failures
    off = draw(scenario(compose_config("scenario=capacity/judge_rm_faults", f"{J}.mtbf_s=null", f"{J}.mttr_s=null",
                                       "pipeline.channels.judge.rm.gpus=3")).pipeline, 2, np.random.default_rng(0))
    assert np.array_equal(d.phase, off.phase) and np.array_equal(d.service["judge"], off.service["judge"])
    with pytest.raises(ConfigError, match=r"faults\.schedule = .*server 2 is not a server index 0\.\.1"):
        draw(scenario(compose_config("scenario=capacity/judge_rm_faults", f"{J}.mtbf_s=null", f"{J}.mttr_s=null",
                                     f"{J}.schedule={p}", "pipeline.channels.judge.rm.gpus=2")).pipeline, 1,
             np.random.default_rng(0))


@pytest.mark.parametrize("overrides,key", [
    (["pipeline.channels.judge.faults.schedule=x.csv"], "pipeline.channels.judge.faults.mtbf_s"),
    (["pipeline.channels.judge.faults.mtbf_s=null", "pipeline.channels.judge.faults.schedule=x.csv"],
     "pipeline.channels.judge.faults.mttr_s"),
    (["pipeline.channels.judge.faults.mtbf_s=null", "pipeline.channels.judge.faults.mttr_s=null",
      "pipeline.channels.judge.faults.schedule=' '"], "pipeline.channels.judge.faults.schedule"),
])
def test_a_schedule_with_random_failures_or_no_path_is_refused(overrides, key):
    cfg = compose_config("scenario=capacity/judge_rm_faults", *overrides)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.") + " = "):
        validate(cfg)


def test_a_schedule_needs_a_gpu_rm_channel_or_queue_workers(tmp_path):
    p = write(tmp_path, "server,down_s,up_s\n0,10,40\n")
    validate(compose_config(f"pipeline.channels.judge.faults.schedule={p}"))  # a queue with workers
    cfg = compose_config(f"pipeline.channels.judge.faults.schedule={p}", "pipeline.channels.judge.workers=null")
    with pytest.raises(ConfigError, match=r"pipeline\.channels\.judge\.faults\.schedule.*gpu_rm"):
        validate(cfg)


@pytest.mark.parametrize("seed", range(4))
def test_queue_workers_on_a_schedule_match_the_event_loop_oracle(seed):
    """The schedule's outages on a queue channel's workers (racsim/pipeline/workers.py): both
    engines against test_faults' per-request event loop, with retry caps 0, 1, 3 and lose."""
    rng = np.random.default_rng(90 + seed)
    lanes, steps, batch, c = 3, 40, 3, int(rng.integers(1, 4))
    f = FaultsConf(on_failure="lose" if seed == 3 else "retry", max_retries=[0, 1, 3, 3][seed])
    sched = random_schedule(rng, c, 400.0)
    gen, zero = rng.exponential(2.5, (lanes, steps)), np.zeros((lanes, steps))
    service = rng.exponential(2.0, (lanes, steps, batch))
    draws = PipelineDraws(phase=np.stack([gen, zero, zero, zero]), service={"q": service}, kernel_channels=frozenset(),
                          nominal_step=2.5, workers={"q": c}, max_delay={"q": None},
                          faults={"q": Timeline(0, lanes, c, F.fault_spec(f, 1), sched)})
    a = run_lanes(draws, False)
    assert_same_schedule(a, run_simpy(draws, False), f"seed {seed}")
    never, cut = [math.inf], 0
    for i in range(lanes):
        arrival = np.repeat(np.cumsum(gen[i]), batch)
        start, end, lost = event_loop_oracle(arrival, service[i].ravel(), [[*d, *never] for d, _ in sched],
                                             [[*u, *never] for _, u in sched], F.fault_spec(f, 1).retries)
        assert np.array_equal(a.service_start[i, :, :, 0].ravel(), start)
        assert np.array_equal(a.completion[i, :, :, 0].ravel(), np.where(lost, np.inf, end))
        assert np.array_equal(a.failed[i, :, :, 0].ravel(), lost)
        cut += int(lost.sum()) + int(np.sum(~lost & (end - start > service[i].ravel() + 1e-9)))
    assert cut > 0  # some job was cut by an outage: lost, or restarted and so longer than its service


def test_the_shipped_example_fits_every_count_of_its_scenario():
    from racsim.analyses.capacity import count_key, with_count

    cfg = scenario(compose_config("scenario=capacity/judge_rm_preempt", "pipeline.steps=2", "pipeline.warmup_steps=0"))
    validate(cfg)
    key = count_key(cfg, "judge")
    for n in cfg.capacity.counts:
        tl = draw(with_count(cfg, key, n).pipeline, 1, np.random.default_rng(0)).faults["judge"]
        assert tl.servers == n and tl.spec.mtbf == math.inf
        assert sum(u.size - 1 for u in tl.up) > 0  # outages besides the closing one at inf


def test_a_channel_without_faults_beside_one_with_them_passes_the_finite_check(tmp_path):
    """channels.csv's availability is NaN for a channel with no faults block (a queue
    channel here) beside a faulted one: declared, so the run writes its tables."""
    from racsim.pipeline.stats import channel_stats
    from racsim.report.finite import non_finite

    p = write(tmp_path, "server,down_s,up_s\n0,1,3\n")
    pcfg = random_pcfg(1)
    pcfg.channels["g"].faults = FaultsConf(schedule=p, on_failure="lose")
    pcfg.channels["q"] = ChannelConf(latency=LatencyConf(kind="exponential", mean=1.0), workers=2, max_delay=3)
    draws = draw(pcfg, 2, np.random.default_rng(0))
    df = channel_stats(run_lanes(draws, False), draws.workers, 0).set_index("channel")
    assert math.isnan(df.loc["q", "availability"]) and 0 < df.loc["g", "availability"] < 1
    assert non_finite(df.reset_index(), "channels") == []
