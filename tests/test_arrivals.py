"""Arrivals over time (issue 11, item 2): ``pipeline.arrivals.mode`` stream, poisson and trace.

Oracles written from the model, not from racsim/pipeline/*:

* the clock: a step lasts its generate phase (the last rollout's offset in stream and trace
  modes) + fast_score + submit + update, and each sample reaches every channel at its step's
  start + its offset;
* the Kiefer-Wolfowitz workload recursion of a FIFO c-server queue fed the routed samples in
  the order they are ready (ties in sample order): every job's wait;
* the offsets' laws: uniform on the generate phase (poisson), the length law (stream), the
  CSV's values in order, cycled (trace);
* both engines equal to the last bit, asynchronous and blocking; batch mode draws nothing
  new, and a stream of equal lengths is the batch clock.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers import assert_same_schedule, det
from test_cancel import event_loop
from test_routing import kiefer_wolfowitz_waits

from racsim.config.schema import ArrivalsConf, ChannelConf, LatencyConf, PipelineConf
from racsim.errors import ConfigError
from racsim.pipeline.draws import draw
from racsim.pipeline.lanes import run_lanes
from racsim.pipeline.schedule import DROPPED, UNROUTED
from racsim.pipeline.simpy_engine import run_simpy

MODES = ("stream", "poisson", "uniform", "trace")


def arrivals_pcfg(seed: int, mode: str, trace_csv=None, cancel: bool = False) -> PipelineConf:
    """A queue of 1-3 workers (routed or not, bursty or not, cancelling on drop or not), a channel
    without a queue and a kernel channel, fed by ``mode`` arrivals (continuous durations: no ties)."""
    rng = np.random.default_rng(seed)
    batch = int(rng.integers(2, 7))
    workers = int(rng.integers(1, 4))
    p = float(rng.uniform(0.4, 0.9)) if seed % 2 else 1.0
    lat = LatencyConf(kind=["exponential", "lognormal"][seed % 2], mean=float(rng.uniform(0.5, 1.5)) * workers * 4.0
                      / (batch * p), sigma=0.7)  # load 0.5-1.5 of the routed samples
    burst = dict(degraded_factor=3.0, p_degrade=0.2, p_recover=0.5) if seed % 3 == 0 else {}
    chans = {
        "q": ChannelConf(latency=lat, workers=workers, max_delay=int(rng.integers(1, 5)), route_prob=p,
                         cancel_on_drop=cancel, **burst),
        "free": ChannelConf(latency=LatencyConf(kind="uniform", low=1.0, high=9.0, mean=5.0)),
        "kern": ChannelConf(kernel=[0.3, 0.4, 0.2], max_delay=2),
    }
    arrivals = ArrivalsConf(mode=mode, length=LatencyConf(kind="lognormal", mean=2.0, sigma=0.6), path=trace_csv)
    return PipelineConf(steps=int(rng.integers(10, 25)), batch_size=batch,
                        generate=LatencyConf(kind="exponential", mean=2.5), fast_score=det(0.3), submit=det(0.05),
                        update=LatencyConf(kind="lognormal", mean=0.6, sigma=0.3), channels=chans, arrivals=arrivals)


@pytest.fixture
def trace_csv(tmp_path):
    path = tmp_path / "offsets.csv"
    values = np.random.default_rng(7).uniform(0.0, 4.0, 13)  # 13 rows: cycled across steps and samples
    path.write_text("offset_s,other\n" + "".join(f"{float(v)!r},1\n" for v in values))
    return str(path), values


def _pcfg(seed, mode, trace_csv, cancel=False):
    return arrivals_pcfg(seed, mode, trace_csv[0] if mode == "trace" else None, cancel)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("cancel", [False, True])
def test_engines_agree_and_nothing_is_lost(seed, mode, cancel, trace_csv):
    pcfg = _pcfg(seed, mode, trace_csv, cancel)
    draws = draw(pcfg, 3, np.random.default_rng(seed))
    for blocking, timeout in ((False, None), (True, None), (True, 3.0)):
        a, b = run_lanes(draws, blocking, timeout), run_simpy(draws, blocking, timeout)
        assert_same_schedule(a, b, f"{mode} seed {seed} blocking {blocking} timeout {timeout}")
        for c in a.counts().values():
            assert c["injected"] + c["dropped"] + c["pending"] == c["emitted"]
        if cancel:
            assert np.array_equal(a.cancelled, b.cancelled)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(6))
def test_clock_and_queue_against_kiefer_wolfowitz_on_ready_times(seed, mode, trace_csv):
    pcfg = _pcfg(seed, mode, trace_csv)
    draws = draw(pcfg, 3, np.random.default_rng(seed))
    sched = run_lanes(draws, False)
    off, gen = draws.offset, draws.phase[0]
    span = draws.phase.sum(axis=0) if mode == "poisson" else gen  # poisson: over the step's whole length
    assert (off >= 0).all() and (off <= span[..., None]).all()
    if mode not in ("poisson", "uniform"):  # the generate phase ends with the step's last rollout
        assert np.array_equal(gen, off.max(axis=2))
    step = gen + 0.3 + 0.05 + draws.phase[3]
    np.testing.assert_allclose(np.diff(sched.step_start, axis=1), step, rtol=1e-12, atol=1e-9)
    ready = sched.step_start[:, :-1, None] + off
    for k, name in enumerate(sched.channel_names):
        np.testing.assert_allclose(sched.submit_time[..., k], ready, rtol=0, atol=1e-9)
    k = sched.channel_names.index("q")
    sent = draws.routed["q"] if "q" in draws.routed else np.ones(off.shape, dtype=bool)
    steps, batch = off.shape[1:]
    for i in range(3):
        jobs = sorted((ready[i, t, b], t, b) for t in range(steps) for b in range(batch) if sent[i, t, b])
        arr = np.array([j[0] for j in jobs])
        service = np.array([draws.service["q"][i, t, b] for _, t, b in jobs])
        wait = np.array([sched.service_start[i, t, b, k] - sched.submit_time[i, t, b, k] for _, t, b in jobs])
        np.testing.assert_allclose(wait, kiefer_wolfowitz_waits(arr, service, pcfg.channels["q"].workers),
                                   rtol=0, atol=1e-9)
        assert (sched.status[i, ..., k][~sent[i]] == UNROUTED).all()
    f = sched.channel_names.index("free")
    np.testing.assert_allclose(sched.completion[..., f], ready + draws.service["free"], rtol=1e-12)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(4))
def test_cancel_on_drop_against_an_event_loop_on_ready_times(seed, mode, trace_csv):
    """Asynchronous: step t's results leave at the start of step t + D (test_cancel's request-by-request
    event loop, fed the routed samples at their ready times). Blocking with a timeout: each sample
    lets go of the queue or its worker at the latest its own submission + the timeout."""
    pcfg = _pcfg(seed, mode, trace_csv, cancel=True)
    draws = draw(pcfg, 3, np.random.default_rng(seed))
    sched = run_lanes(draws, False)
    k, ch = sched.channel_names.index("q"), pcfg.channels["q"]
    steps, batch = draws.offset.shape[1:]
    sent = draws.routed["q"] if "q" in draws.routed else np.ones(draws.offset.shape, dtype=bool)
    for i in range(3):
        m = sent[i].ravel()
        arr = (sched.step_start[i, :-1, None] + draws.offset[i]).ravel()[m]
        dl = np.repeat([sched.step_start[i, t + ch.max_delay] if t + ch.max_delay + 1 <= steps - 1 else np.inf
                        for t in range(steps)], batch)[m]
        s, e, cut = event_loop(arr, draws.service["q"][i].ravel()[m], dl, ch.workers)
        np.testing.assert_allclose(sched.service_start[i, ..., k].ravel()[m], s, rtol=1e-12)
        np.testing.assert_allclose(sched.completion[i, ..., k].ravel()[m], e, rtol=1e-12)
        assert np.array_equal(sched.cancelled[i, ..., k].ravel()[m], cut)
    timeout = 3.0
    b = run_lanes(draws, True, timeout)
    held = b.completion[..., k] - b.submit_time[..., k]
    assert (held <= timeout * (1 + 1e-12)).all()
    np.testing.assert_allclose(held[b.cancelled[..., k]], timeout, rtol=1e-12)
    assert b.cancelled[..., k].any() and (b.status[..., k][b.cancelled[..., k]] == DROPPED).all()


def test_offset_laws(trace_csv):
    n = 400
    grid = np.linspace(0.05, 0.95, 19)
    for mode in ("uniform", "poisson"):  # uniform on the generate phase / on the step's whole length
        d = draw(replace(arrivals_pcfg(1, mode), steps=10), n, np.random.default_rng(3))
        span = d.phase[0] if mode == "uniform" else d.phase.sum(axis=0)
        u = (d.offset / span[..., None]).ravel()
        ecdf = (u[:, None] <= grid).mean(axis=0)
        assert np.abs(ecdf - grid).max() < 4 * np.sqrt(0.25 / u.size)
    law = arrivals_pcfg(1, "stream").arrivals.length
    st = draw(replace(arrivals_pcfg(1, "stream"), steps=10), n, np.random.default_rng(4))
    x = st.offset.ravel()
    sd = law.mean * np.sqrt(np.exp(law.sigma ** 2) - 1)  # lognormal's standard deviation
    assert abs(x.mean() - law.mean) < 4 * sd / np.sqrt(x.size)
    assert abs(np.log(x).std() - law.sigma) < 0.02
    path, values = trace_csv
    tr = draw(arrivals_pcfg(2, "trace", path), 2, np.random.default_rng(0))
    steps, batch = tr.offset.shape[1:]
    for t in range(steps):
        for b in range(batch):
            assert tr.offset[0, t, b] == tr.offset[1, t, b] == values[(t * batch + b) % len(values)]


@pytest.mark.parametrize("mode", MODES)
def test_arrivals_draw_nothing_else_anew(mode, trace_csv):
    pcfg = _pcfg(3, mode, trace_csv)
    a = draw(pcfg, 5, np.random.default_rng(9))
    b = draw(replace(pcfg, arrivals=ArrivalsConf()), 5, np.random.default_rng(9))
    assert b.offset is None and a.offset.shape == b.phase[0].shape + (pcfg.batch_size,)
    assert np.array_equal(a.phase[1:], b.phase[1:])
    if mode in ("poisson", "uniform"):
        assert np.array_equal(a.phase[0], b.phase[0]) and a.nominal_step == b.nominal_step
    for name in pcfg.channels:
        assert np.array_equal(a.service[name], b.service[name])
    assert set(a.routed) == set(b.routed) and all(np.array_equal(a.routed[n], b.routed[n]) for n in a.routed)


@pytest.mark.parametrize("batch", [32, 400])
def test_poisson_gaps_follow_the_exponential_law(batch):
    """pipeline.arrivals.mode=poisson: the gaps between consecutive arrivals over the whole clock
    (steps joined) have the exponential law's mean E[L] / B and variance ratio var / mean^2 = 1
    (B / (B + 2) given B per step of a fixed length); uniform, arriving only while generating,
    is burstier (the gaps across the scoring and update phases)."""
    base = replace(arrivals_pcfg(6, "poisson"), steps=60, batch_size=batch, generate=det(6.0),
                   fast_score=det(1.0), submit=det(0.0), update=det(1.5))
    ratio = {}
    for mode in ("poisson", "uniform"):
        d = draw(replace(base, arrivals=ArrivalsConf(mode=mode)), 20, np.random.default_rng(11))
        L = d.phase.sum(axis=0)  # (trials, steps) the asynchronous clock's steps
        start = np.concatenate([np.zeros((20, 1)), np.cumsum(L, axis=1)[:, :-1]], axis=1)
        t = np.sort((start[..., None] + d.offset).reshape(20, -1), axis=1)
        gaps = np.diff(t, axis=1).ravel()
        ratio[mode] = gaps.var() / gaps.mean() ** 2
        if mode == "poisson":
            mean = L.mean() / batch
            assert abs(gaps.mean() - mean) < 0.01 * mean
            assert abs(ratio[mode] - batch / (batch + 2)) < 0.05
    assert ratio["uniform"] > 1.2 * ratio["poisson"]


def test_a_stream_of_equal_lengths_is_the_batch_clock():
    """Every rollout takes L seconds and fast_score, submit take 0: each sample is sent at step
    start + L, as batch mode sends them after a generate phase of L."""
    base = arrivals_pcfg(4, "stream")
    base = replace(base, generate=det(2.5), fast_score=det(0.0), submit=det(0.0), channels={n: replace(ch, route_prob=1.0)
                                                                        for n, ch in base.channels.items()})
    stream = replace(base, arrivals=ArrivalsConf(mode="stream", length=det(2.5)))
    batch = replace(base, arrivals=ArrivalsConf())
    a, b = draw(stream, 3, np.random.default_rng(1)), draw(batch, 3, np.random.default_rng(1))
    for blocking in (False, True):
        assert_same_schedule(run_lanes(a, blocking), run_lanes(b, blocking), f"blocking {blocking}")
        assert_same_schedule(run_simpy(a, blocking), run_lanes(b, blocking), f"simpy blocking {blocking}")


def test_streaming_spreads_the_queue_load():
    """Samples spread over the generate phase wait less than a whole step's batch arriving at once
    (same service draws; the stream's clock is the same: uniform keeps the drawn generate phase)."""
    pcfg = arrivals_pcfg(5, "uniform")
    a = draw(pcfg, 20, np.random.default_rng(2))
    b = draw(replace(pcfg, arrivals=ArrivalsConf()), 20, np.random.default_rng(2))
    k = list(pcfg.channels).index("q")
    wait = [(s.service_start - s.submit_time)[..., k].mean() for s in (run_lanes(a, False), run_lanes(b, False))]
    assert wait[0] < wait[1]


def _compose(*overrides):
    from hydra import compose, initialize_config_module

    from racsim.config.schema import register_configs

    register_configs()
    with initialize_config_module(version_base="1.3", config_module="racsim.conf"):
        return compose("config", overrides=list(overrides))


def test_arrivals_are_validated(tmp_path):
    from racsim.config.validate import validate

    for mode in ("batch", "stream", "poisson"):
        validate(_compose(f"pipeline.arrivals.mode={mode}"))
    validate(_compose("pipeline.arrivals.mode=stream", "channel@pipeline.channels.judge=judge_gpu_rm"))  # gpu_rm fed too
    bad = [
        (("pipeline.arrivals.mode=burst",), "pipeline.arrivals.mode"),
        (("pipeline.arrivals.mode=stream", "pipeline.arrivals.length.mean=-1"), "pipeline.arrivals.length.mean"),
        (("pipeline.arrivals.mode=trace",), "pipeline.arrivals.path"),
    ]
    for overrides, match in bad:
        with pytest.raises(ConfigError, match=match):
            validate(_compose(*overrides))
    csv = tmp_path / "t.csv"
    for text, match in (("x\n1.0\n", "pipeline.arrivals.column"), ("offset_s\n1.0\n-2\n", "pipeline.arrivals.column"),
                        ("offset_s\n", "pipeline.arrivals.column")):
        csv.write_text(text)
        pcfg = replace(arrivals_pcfg(0, "trace", str(csv)))
        with pytest.raises(ConfigError, match=match):
            draw(pcfg, 1, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="pipeline.arrivals.path"):
        draw(arrivals_pcfg(0, "trace", str(tmp_path / "none.csv")), 1, np.random.default_rng(0))


def test_bench_times_the_pipeline_with_arrivals_on(capsys):
    from racsim.tools import bench

    fig = bench.bench_pipeline(3, ["scenario=capacity/code_verifier", "pipeline.arrivals.mode=stream",
                                   "pipeline.steps=4"])
    assert fig["pipeline_lanes_requests_per_s"] == pytest.approx(fig["pipeline_lanes_trials_per_s"] * 4 * 32)
    assert fig["pipeline_simpy_requests_per_s"] > 0
    for bad in (["pipeline.arrivals.mode=burst"], ["pipeline.arrivals.nope=1"]):
        with pytest.raises(SystemExit) as ex:
            bench.main(["--set", *bad])
        err = capsys.readouterr().err
        assert ex.value.code == 2 and "Traceback" not in err and "pipeline.arrivals" in err
