"""Markov-modulated latency (issue 11, item 5): ``degraded_factor``, ``p_degrade``, ``p_recover``.

Closed forms of a two-state Markov chain with switch probabilities a (normal ->
degraded) and b (back): stationary P(degraded) = pi = a / (a + b); the state's
autocorrelation at lag L is (1 - a - b)^L. With latency X (mean m) times factor f
in degraded steps, the stationary mean is m (1 + pi (f - 1)), and two samples of one
step share the state: Cov = m^2 Var(F), Var(F) = pi (1 - pi) (f - 1)^2.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers import assert_same_schedule, det

from racsim.config.schema import ChannelConf, LatencyConf, PipelineConf
from racsim.config.validate import validate
from racsim.errors import ConfigError
from racsim.pipeline.draws import draw, regime_path
from racsim.pipeline.lanes import run_lanes
from racsim.pipeline.simpy_engine import run_simpy

A, B, F, M = 0.05, 0.2, 6.0, 2.0
PI = A / (A + B)


def pcfg(steps=40, batch=4, factor=F, workers=2) -> PipelineConf:
    ch = ChannelConf(latency=LatencyConf(kind="exponential", mean=M), workers=workers, max_delay=3,
                     degraded_factor=factor, p_degrade=A, p_recover=B)
    return PipelineConf(steps=steps, batch_size=batch, generate=LatencyConf(kind="exponential", mean=2.0),
                        fast_score=det(0.3), submit=det(0.05), update=det(0.5), channels={"judge": ch})


def test_regime_path_is_the_markov_chain():
    s = regime_path(A, B, np.random.default_rng(0), (4000, 200)).astype(float)
    n = s.size
    assert s.mean() == pytest.approx(PI, abs=4 * np.sqrt(PI * (1 - PI) / n) * 6)  # steps are correlated
    assert s[:, 0].mean() == pytest.approx(PI, abs=4 * np.sqrt(PI * (1 - PI) / 4000))  # stationary from the start
    prev, nxt = s[:, :-1], s[:, 1:]
    assert nxt[prev == 0].mean() == pytest.approx(A, rel=0.03)  # normal -> degraded
    assert 1 - nxt[prev == 1].mean() == pytest.approx(B, rel=0.03)  # degraded -> normal
    z = s - PI
    for lag in (1, 3, 8):
        acf = (z[:, :-lag] * z[:, lag:]).mean() / (PI * (1 - PI))
        assert acf == pytest.approx((1 - A - B) ** lag, abs=0.02)


def test_stationary_mean_and_within_step_correlation_of_latency():
    d = draw(pcfg(steps=300, batch=2), 1000, np.random.default_rng(1))
    x = d.service["judge"]  # (lanes, steps, batch)
    mean = M * (1 + PI * (F - 1))
    assert x.mean() == pytest.approx(mean, rel=0.03)
    var_f = PI * (1 - PI) * (F - 1) ** 2
    ef2 = (1 - PI) + PI * F**2
    var_x = 2 * M**2 * ef2 - mean**2  # exponential: E[X^2] = 2 m^2
    corr = np.corrcoef(x[..., 0].ravel(), x[..., 1].ravel())[0, 1]
    assert corr == pytest.approx(M**2 * var_f / var_x, abs=0.03)
    # without bursts two samples of a step are independent, and the mean is m
    iid = draw(pcfg(steps=300, batch=2, factor=1.0), 1000, np.random.default_rng(1)).service["judge"]
    assert abs(np.corrcoef(iid[..., 0].ravel(), iid[..., 1].ravel())[0, 1]) < 0.01
    assert iid.mean() == pytest.approx(M, rel=0.01)


def test_bursts_leave_other_draws_alone_and_engines_agree():
    on, off = draw(pcfg(), 5, np.random.default_rng(3)), draw(pcfg(factor=1.0), 5, np.random.default_rng(3))
    assert np.array_equal(on.phase, off.phase)
    bad = on.service["judge"] != off.service["judge"]
    np.testing.assert_array_equal(on.service["judge"][bad], off.service["judge"][bad] * F)
    assert bad.any() and (~bad).any()
    assert (bad == bad[..., :1]).all()  # one state per step, shared by its samples
    for blocking in (False, True):
        assert_same_schedule(run_lanes(on, blocking), run_simpy(on, blocking), f"blocking {blocking}")


def test_regime_knobs_are_validated():
    from hydra import compose, initialize_config_module

    from racsim.config.schema import register_configs

    register_configs()
    with initialize_config_module(version_base="1.3", config_module="racsim.conf"):
        key = "pipeline.channels.judge"
        validate(compose("config", overrides=[f"{key}.degraded_factor=5", f"{key}.p_degrade=0.05"]))
        for bad, field in ((["degraded_factor=0"], "degraded_factor"), (["degraded_factor=5"], "p_degrade"),
                           (["degraded_factor=5", "p_degrade=0.1", "p_recover=0"], "p_recover")):
            with pytest.raises(ConfigError, match=f"{key}.{field}"):
                validate(compose("config", overrides=[f"{key}.{b}" for b in bad]))
        judge = "pipeline.channels.judge"
        burst = [f"{judge}.degraded_factor=2", f"{judge}.p_degrade=0.1"]
        validate(compose("config", overrides=["scenario=capacity/judge_rm_h100", *burst,
                                              f"{judge}.rm.batching=continuous"]))
        with pytest.raises(ConfigError, match=f"{judge}.degraded_factor.*chunked_prefill"):
            validate(compose("config", overrides=["scenario=capacity/judge_rm_h100", *burst,
                                                  f"{judge}.rm.batching=continuous", f"{judge}.rm.chunked_prefill=true"]))
