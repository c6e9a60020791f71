"""Asynchronous generation in a run (issue 46): its config (one line naming the key for every bad value and
cross rule), the engines' memory rule, the bridge into the schedule (gate fast through the pipeline's engines,
gate all and the blocking schedule from the lane), the two engines equal on a whole run, sync mode drawing
what it drew before, the figures a user reads, and the shipped scenario through the command line."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from helpers import assert_same_schedule, main_in_process
from racsim.config.defaults import compose_config
from racsim.config.spec import scenario
from racsim.config.validate import validate
from racsim.errors import ConfigError
from racsim.generation.draws import check_engine_memory, kv_bytes_per_token, step_tokens, training_seconds
from racsim.generation.figures import (binding, engine_split, generation_table, lag_histogram, time_average,
                                       trainer_split, versions_at)
from racsim.generation.schedule import AsyncRun, async_schedules, clock_starts
from racsim.pipeline.draws import draw
from racsim.pipeline.schedule import INJECTED, UNROUTED
from racsim.pipeline.service import model_size
from racsim.seeds import rng_for

TINY = ["pipeline.steps=8", "pipeline.batch_size=16", "pipeline.generation.engines.gpus=2",
        "pipeline.generation.engines.concurrency=8", "pipeline.generation.engines.response_tokens.mean=256",
        "pipeline.generation.engines.max_response_tokens=1024", "learner.trials=3", "learner.bootstrap=0",
        "learner.train.enabled=false", "output.plots=false", "output.progress=false"]


@pytest.fixture(scope="module")
def base():
    """The shipped AReaL-like scenario, small (8 steps of 2 groups x 8, 2 engines x 8 sequences, 3 trials)."""
    return scenario(compose_config("scenario=async/areal", *TINY))


def changed(cfg, **keys):
    """A copy of the spec ``cfg`` with dotted keys (``pipeline__generation__gate``) set."""
    out = copy.deepcopy(cfg)
    for key, value in keys.items():
        *path, last = key.split("__")
        node = out
        for part in path:
            node = node[part] if isinstance(node, dict) else getattr(node, part)
        setattr(node, last, value)
    return out


G = "pipeline__generation__"
BAD = [  # (key, value, the key named)
    (G + "mode", "later", "pipeline.generation.mode"),
    (G + "group_size", 0, "pipeline.generation.group_size"),
    (G + "group_size", 3, "pipeline.batch_size"),
    (G + "engines", None, "pipeline.generation.engines"),
    (G + "engines__gpus", 0, "pipeline.generation.engines.gpus"),
    (G + "engines__tp", 5, "pipeline.generation.engines.tp"),
    (G + "engines__concurrency", 0, "pipeline.generation.engines.concurrency"),
    (G + "engines__service", "profiled", "pipeline.generation.engines.service"),
    (G + "engines__mfu", 0.0, "pipeline.generation.engines.mfu"),
    (G + "engines__overhead_s", -1.0, "pipeline.generation.engines.overhead_s"),
    (G + "engines__mem_util", 1.5, "pipeline.generation.engines.mem_util"),
    (G + "engines__max_prompt_tokens", 0, "pipeline.generation.engines.max_prompt_tokens"),
    (G + "engines__max_response_tokens", 0, "pipeline.generation.engines.max_response_tokens"),
    (G + "trainer__service", "measured", "pipeline.generation.trainer.service"),
    (G + "trainer__gpus", 0, "pipeline.generation.trainer.gpus"),
    (G + "trainer__mfu", 1.5, "pipeline.generation.trainer.mfu"),
    (G + "trainer__sync_s", -1.0, "pipeline.generation.trainer.sync_s"),
    (G + "admission__rule", "fifo", "pipeline.generation.admission.rule"),
    (G + "admission__eta", -1, "pipeline.generation.admission.eta"),
    (G + "admission__staleness", math.inf, "pipeline.generation.admission.staleness"),
    (G + "admission__k", -1, "pipeline.generation.admission.k"),
    (G + "queue__capacity", 1, "pipeline.generation.queue.capacity"),
    (G + "queue__full", "spill", "pipeline.generation.queue.full"),
    (G + "queue__max_lag", -1, "pipeline.generation.queue.max_lag"),
    (G + "adoption", "later", "pipeline.generation.adoption"),
    (G + "gate", "slow", "pipeline.generation.gate"),
    ("pipeline__arrivals__mode", "stream", "pipeline.arrivals.mode"),
    ("capacity__enabled", True, "capacity.split.gpus"),
]


@pytest.mark.parametrize("key,value,named", BAD, ids=[f"{b[0].replace('__', '.')}={b[1]}" for b in BAD])
def test_each_bad_value_is_named_in_one_line(base, key, value, named):
    with pytest.raises(ConfigError) as e:
        validate(changed(base, **{key: value}))
    assert e.value.key == named and "\n" not in str(e.value)


def test_the_engines_token_laws_are_checked(base):
    cfg = changed(base)
    cfg.pipeline.generation.engines.response_tokens.mean = -1.0
    with pytest.raises(ConfigError, match="pipeline.generation.engines.response_tokens.mean"):
        validate(cfg)


GATE_ALL = [("kernel", dict(kernel=[0.5, 0.5])), ("cancel_on_drop", dict(cancel_on_drop=True)),
            ("degraded_factor", dict(degraded_factor=2.0, p_degrade=0.1))]


@pytest.mark.parametrize("field,values", GATE_ALL)
def test_gate_all_takes_plain_queue_channels_and_says_why(base, field, values):
    cfg = changed(base, pipeline__generation__gate="all")
    validate(cfg)
    for key, value in values.items():
        setattr(cfg.pipeline.channels["judge"], key, value)
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert e.value.key == f"pipeline.channels.judge.{field}" and "gate=all" in e.value.allowed


def test_gate_all_refuses_a_gpu_judge():
    cfg = compose_config("scenario=async/areal", *TINY, "pipeline.generation.gate=all",
                         "+channel@pipeline.channels.rm=judge_gpu_rm")
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert e.value.key == "pipeline.channels.rm.kind" and "gpu_rm pool's batches" in e.value.allowed


def test_an_engines_block_without_its_picks_names_them():
    cfg = compose_config("pipeline.generation.mode=async", "pipeline.batch_size=8",
                         "pipeline.generation.engines.gpus=4")
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert e.value.key == "pipeline.generation.engines.model and pipeline.generation.engines.gpu"
    assert "+rm/model@pipeline.generation.engines.model=8b" in e.value.allowed


def test_the_policy_must_fit_its_gpus_with_the_kv_cache(base):
    e = base.pipeline.generation.engines  # 1.5B on an H100: 3 GB of weights, 28 KB of KV cache a token
    assert kv_bytes_per_token(e.model) == 2 * 28 * 2 * 128 * 2
    usable = 80e9 * 0.9
    fits = int((usable - model_size(e.model).total * 2) // (kv_bytes_per_token(e.model) * (1024 + 1024)))
    check_engine_memory(changed(e, concurrency=fits))
    with pytest.raises(ConfigError) as err:
        check_engine_memory(changed(e, concurrency=fits + 1))
    assert err.value.key == "pipeline.generation.engines.concurrency" and f"at most {fits}" in err.value.allowed
    small = changed(e, gpu=changed(e.gpu, memory_gb=3.0))  # not even the weights
    with pytest.raises(ConfigError) as err:
        check_engine_memory(small)
    assert err.value.key == "pipeline.generation.engines.tp"


@pytest.fixture(scope="module")
def fast_and_blocking(base):
    return async_schedules(base.pipeline, 3, rng_for(0, "pipeline"), blocking=True, engine="lanes")


def test_gate_fast_sends_each_trained_sample_when_its_group_is_generated(fast_and_blocking, base):
    s = fast_and_blocking["async"]
    rec = s.generation
    assert not s.blocking and np.array_equal(s.lag, rec.head_lag) and (s.lag >= 0).all()
    # the schedule's steps start at E_{t-1} (added as the pipeline's engines add them) ...
    assert np.allclose(s.step_start[:, 1:], rec.sync_end, rtol=1e-12)
    assert np.allclose(s.step_start[:, :-1], np.concatenate([np.zeros((3, 1)), rec.sync_end[:, :-1]], 1), rtol=1e-12)
    # ... the generate phase is the trainer's wait, the update the update plus the weight sync
    assert np.allclose(s.phase[0], rec.step_start - s.step_start[:, :-1], atol=1e-9)
    assert np.allclose(s.phase[3] - base.pipeline.generation.trainer.sync_s, rec.publish - rec.step_start
                       - s.phase[1] - s.phase[2], atol=1e-9)
    # the judge gets each sample at its group's queue entry (gate fast: when the group was generated)
    assert np.allclose(s.submit_time[..., 0], rec.queue_in, rtol=1e-12)
    assert (s.completion[..., 0] >= s.submit_time[..., 0]).all()


def test_wait_for_slow_reads_the_gate_all_schedule(fast_and_blocking):
    b = fast_and_blocking["blocking"]
    rec = b.generation
    sent = b.status == INJECTED
    assert b.blocking and set(np.unique(b.status)) <= {INJECTED, UNROUTED}
    assert (b.delay[sent] == 0).all() and (b.delay[~sent] == -1).all()
    # a group enters the queue once every slow result of its samples is back, and is trained after
    entry = np.repeat(rec.queue_in[..., None], b.n_channels, axis=-1)
    assert (b.completion[sent] <= entry[sent]).all() and (rec.queue_in <= rec.step_start[..., None]).all()
    assert np.array_equal(b.lag, rec.head_lag)


def test_the_simpy_engines_make_the_same_run(base):
    """pipeline.engine=simpy: the lane's SimPy engine of record and the pipeline's SimPy engine, the same
    schedules as the fast ones to the bit (gate fast through the judge's queue, and gate all)."""
    cfg = changed(base, pipeline__steps=5)
    one = async_schedules(cfg.pipeline, 2, rng_for(1, "pipeline"), blocking=True, engine="lanes")
    two = async_schedules(cfg.pipeline, 2, rng_for(1, "pipeline"), blocking=True, engine="simpy")
    for key in one:
        assert_same_schedule(one[key], two[key], key)
        for name in ("start_version", "mean_version", "taken", "queue_in", "engine_time", "wasted_tokens"):
            assert np.array_equal(getattr(one[key].generation, name), getattr(two[key].generation, name)), name


def test_sync_mode_draws_what_it_drew_before(base):
    """An async run draws the pipeline's numbers first, as a sync run does, and its own from one seed drawn
    last: the sync run's draws are untouched, and its schedule carries no generation record."""
    sync = changed(base, pipeline__generation__mode="sync")
    validate(sync)
    before = draw(sync.pipeline, 3, rng_for(0, "pipeline"))
    run = AsyncRun(base.pipeline, 3, rng_for(0, "pipeline"), "lanes")
    assert np.array_equal(before.phase, run.draws.phase)
    assert all(np.array_equal(before.service[k], run.draws.service[k]) for k in before.service)
    from racsim.analyses.bias_study import simulate_schedules

    s = simulate_schedules(sync, 2, "pipeline", ["naive"])["async"]
    assert s.generation is None and s.lag is None


def test_the_trainer_roofline_is_six_n_d(base):
    run = AsyncRun(base.pipeline, 2, rng_for(0, "pipeline"), "lanes")
    g, lane = base.pipeline.generation, run.lanes["fast"][1]
    tokens = step_tokens(lane.prompt, lane.response, run.G, run.steps)
    j = np.arange(run.G, 2 * run.G)  # step 1's groups as drawn
    assert tokens[1] == (lane.prompt[j] * run.S + lane.response[j].sum(axis=1)).sum()
    flops = 6 * model_size(g.engines.model).non_embedding * tokens[1]
    assert run.update[1, 1] == pytest.approx(flops / (g.trainer.gpus * g.engines.gpu.peak_tflops * 1e12 * g.trainer.mfu))
    assert training_seconds(10.0, np.array([2.0]), 3, 1e-12, 0.5)[0] == pytest.approx(6 * 10 * 2 / 1.5)
    assert np.array_equal(run.trainer, run.draws.phase[1] + run.draws.phase[2] + run.update)


def test_time_average_of_a_step_function_against_a_fine_grid():
    r = np.random.default_rng(5)
    for _ in range(30):
        times = np.sort(r.choice(np.arange(0.0, 20.0, 0.25), int(r.integers(1, 12)), replace=False))
        lengths = r.integers(0, 6, times.size)
        a, b = sorted(r.choice(np.arange(-1.0, 22.0, 0.25), 2, replace=False))
        grid = np.arange(a, b, 0.25) + 0.125  # the function is constant on each quarter
        value = np.array([lengths[np.searchsorted(times, x, side="right") - 1] if x >= times[0] else 0 for x in grid])
        mean, top = time_average(times, lengths, a, b)
        assert mean == pytest.approx(value.mean()) and top == value.max()


def test_figures_add_up(fast_and_blocking):
    s = fast_and_blocking["async"]
    rec = s.generation
    assert sum(trainer_split(rec).values()) == pytest.approx(1.0)
    assert sum(engine_split(rec).values()) == pytest.approx(1.0)
    row = generation_table(s, 2).iloc[0]
    assert row.mean_lag == pytest.approx(row.mean_lag_before_queue + row.mean_lag_in_queue)
    assert row.head_lag_max >= row.head_lag_p95 >= row.head_lag_p50 >= 0 and row.head_lag_mean >= row.mean_lag
    assert row.mean_lag >= row.last_lag_mean >= 0
    assert row.samples_per_hour == pytest.approx(16 * row.steps_per_hour)
    per_sample = (rec.prompt + rec.response)[:, 2:].mean()
    assert row.tokens_per_hour == pytest.approx(row.samples_per_hour * per_sample)
    h = lag_histogram(s, 2)
    assert h.head_share.sum() == pytest.approx(1.0) and h.head_samples.sum() == 3 * 6 * 16
    assert (h.lag * h.head_samples).sum() / h.head_samples.sum() == pytest.approx(row.head_lag_mean)
    v = versions_at(rec.sync_end, rec.sync_end)  # at E_t itself, t + 1 syncs have ended
    assert np.array_equal(v, np.broadcast_to(np.arange(1, rec.sync_end.shape[1] + 1), v.shape))
    assert (binding(0.01, 0.4), binding(0.4, 0.01), binding(0.5, 0.3)) == ("trainer", "engines", "admission")


def test_clock_starts_add_the_phases_in_order():
    phase = np.random.default_rng(2).random((4, 2, 5))
    out = clock_starts(phase)
    assert out[:, 0].tolist() == [0.0, 0.0]
    for t in range(5):
        assert np.array_equal(out[:, t + 1], out[:, t] + phase[0, :, t] + phase[1, :, t] + phase[2, :, t] + phase[3, :, t])


def test_wait_for_slow_with_a_gpu_judge_is_refused_in_async_mode(base):
    """The gate-all schedule wait_for_slow reads needs queue channels: a gpu_rm judge is named with the reason."""
    cfg = scenario(compose_config("scenario=async/areal", *TINY, "pipeline.steps=3",
                                  "+channel@pipeline.channels.rm=judge_gpu_rm"))
    async_schedules(cfg.pipeline, 1, rng_for(0, "pipeline"), blocking=False, engine="lanes")  # gate fast: fine
    with pytest.raises(ConfigError) as e:
        async_schedules(cfg.pipeline, 1, rng_for(0, "pipeline"), blocking=True, engine="lanes")
    assert e.value.key == "pipeline.channels.rm.kind" and "wait_for_slow" in e.value.allowed


@pytest.mark.long  # the shipped scenario through the command line: about 5 CPU s
def test_the_areal_scenario_through_the_command_line(tmp_path, monkeypatch, capsys):
    import pandas as pd

    monkeypatch.chdir(tmp_path)
    code, out, err = main_in_process(monkeypatch, capsys, ["scenario=async/areal", "hydra.run.dir=run",
                                                           "output.progress=false"])
    assert code == 0, err
    assert "racsim: generation: mean lag" in out and "steps/h" in out
    run = tmp_path / "run"
    gen = pd.read_csv(run / "generation.csv")
    assert list(gen.schedule) == ["async", "blocking"] and (gen.mean_lag > 0).all()
    hist = pd.read_csv(run / "lag_histogram.csv")
    assert hist.head_share.sum() == pytest.approx(1.0)
    res = pd.read_csv(run / "results.csv")
    assert {"mean_lag", "head_lag_p95", "steps_per_hour"} <= set(res.columns)
    assert "## Generation (asynchronous engines)" in (run / "summary.md").read_text()
    assert (run / "lag.png").exists() and (run / "generation_queue.png").exists()
