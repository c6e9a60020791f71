"""The offered load a capacity plan decides on is the model's long-run figure, not a sample (issue 28,
point 1): the burst chain's stationary slow-down and the servers' availability, each checked against a
long simulation written here, and the load of every count the same at every seed within the draws'
small sampling noise, while the sampled load beside it moves with the seed."""

from __future__ import annotations

import numpy as np
import pytest
from hydra import compose, initialize_config_module

from racsim.analyses.capacity import channel_loads, count_key
from racsim.config.schema import register_configs
from racsim.config.spec import scenario
from racsim.pipeline.draws import PHASES, phase_conf, regime_path, stationary_slowdown
from racsim.pipeline.faults import FaultSpec, Timeline, availability
from racsim.pipeline.latency import build_latency


@pytest.mark.parametrize("factor, p_degrade, p_recover", [(2.0, 0.05, 0.2), (3.5, 0.01, 0.5), (1.5, 0.3, 0.3),
                                                           (2.0, 0.0, 0.2), (1.0, 0.4, 0.1)])
def test_the_burst_slowdown_is_the_long_chains_mean(factor, p_degrade, p_recover):
    path = regime_path(p_degrade, p_recover, np.random.default_rng(1), (200, 2000)) if p_degrade + p_recover else None
    mean = np.where(path, factor, 1.0).mean()
    assert stationary_slowdown(factor, p_degrade, p_recover) == pytest.approx(mean, abs=0.01 * factor)


@pytest.mark.parametrize("mtbf, mttr", [(3600.0, 300.0), (600.0, 60.0), (100.0, 100.0)])
def test_availability_is_the_long_run_up_share_of_a_timeline(mtbf, mttr):
    spec = FaultSpec(mtbf=mtbf, mttr=mttr, retries=3)
    horizon = 2000 * (mtbf + mttr)
    up = Timeline(7, 4, 8, spec).up_fraction(np.zeros(4), np.full(4, horizon)).mean()
    assert availability(spec) == pytest.approx(mtbf / (mtbf + mttr), rel=1e-15)
    assert availability(spec) == pytest.approx(up, abs=0.01)
    assert availability(FaultSpec(mtbf=np.inf, mttr=0.0, retries=0)) == 1.0


def _loads(scenario_name, seed, counts, *extra):
    with initialize_config_module(config_module="racsim.conf", version_base="1.3"):
        register_configs()
        cfg = scenario(compose(config_name="config", overrides=[f"scenario={scenario_name}", f"seed={seed}", *extra]))
    return channel_loads(cfg, "judge", count_key(cfg, "judge"), counts)


@pytest.mark.parametrize("scenario_name, extra", [
    ("capacity/judge_rm_faults", ()),
    ("capacity/judge_rm_h100", ("pipeline.channels.judge.degraded_factor=2", "pipeline.channels.judge.p_degrade=0.05",
                                "pipeline.channels.judge.p_recover=0.2")),
])
@pytest.mark.long  # 3 CPU s a case
def test_a_counts_load_does_not_move_with_the_seed(scenario_name, extra):
    counts = [5, 6, 7]
    runs = [_loads(scenario_name, seed, counts, *extra) for seed in range(8)]
    for n in counts:
        long_run = np.array([r[n]["load"] for r in runs])
        sampled = np.array([r[n]["load_sampled"] for r in runs])
        assert long_run.max() / long_run.min() < 1.03, (n, long_run)  # the draws' token noise alone
        assert np.ptp(sampled) > 2 * np.ptp(long_run), (n, sampled, long_run)  # what the slow regime did to a sample
    for r in runs:  # the same work over n servers up: load x n is one number
        assert r[5]["load"] * 5 == pytest.approx(r[7]["load"] * 7, rel=1e-12)


def _verifier_loads(seed, counts, *extra):
    with initialize_config_module(config_module="racsim.conf", version_base="1.3"):
        register_configs()
        cfg = scenario(compose(config_name="config", overrides=["scenario=capacity/code_verifier", f"seed={seed}",
                                                                *extra]))
    return cfg, channel_loads(cfg, "verifier", count_key(cfg, "verifier"), counts)


@pytest.mark.parametrize("extra", [(), ("pipeline.channels.verifier.route_prob=0.5",),
                                   ("pipeline.arrivals.mode=poisson", "pipeline.channels.verifier.degraded_factor=2",
                                    "pipeline.channels.verifier.p_degrade=0.1", "pipeline.channels.verifier.p_recover=0.3")])
def test_a_queue_channels_load_is_the_laws_closed_form_at_every_seed(extra):
    """A queue channel's load is batch x route_prob x its law's mean x the burst chain's slow-down over the
    phases' mean sum and the workers: the same number at every seed (no sample in it), the sampled one beside."""
    counts = [64, 85, 96]
    runs = [_verifier_loads(seed, counts, *extra) for seed in range(4)]
    cfg = runs[0][0]
    p, ch = cfg.pipeline, cfg.pipeline.channels["verifier"]
    # the laws' means from a million draws of each (clipping included), not from racsim's mean()
    rng = np.random.default_rng(5)
    service = build_latency(ch.latency).sample(rng, 10**6).mean()
    clock = sum(build_latency(phase_conf(p, ph)).sample(rng, 10**6).mean() for ph in PHASES)
    slow = stationary_slowdown(ch.degraded_factor, ch.p_degrade, ch.p_recover)
    for n in counts:
        loads = {r[1][n]["load"] for r in runs}
        assert len(loads) == 1, loads  # the seed moves nothing
        want = p.batch_size * ch.route_prob * service * slow / (clock * n)
        assert loads.pop() == pytest.approx(want, rel=5e-3)
        assert len({r[1][n]["load_sampled"] for r in runs}) == 4  # the sample does move
