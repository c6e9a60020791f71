"""Issue 11's capacity knobs together: the combinations both engines model agree bit for
bit, and the ones racsim does not model are refused with one line naming the key."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_same_schedule

from racsim.config.defaults import compose_config
from racsim.config.spec import scenario
from racsim.config.validate import validate
from racsim.errors import ConfigError
from racsim.pipeline.draws import draw
from racsim.pipeline.lanes import run_lanes
from racsim.pipeline.simpy_engine import run_simpy

J = "pipeline.channels.judge"
SMALL = ["pipeline.steps=10", "pipeline.warmup_steps=2", "pipeline.batch_size=4", f"{J}.rm.sequences_per_sample=4",
         f"{J}.autoscale.queue_above=8", f"{J}.autoscale.for_s=2", f"{J}.autoscale.startup_s=3",
         f"{J}.autoscale.idle_s=2", f"{J}.rm.gpu.peak_tflops=20"]
BURSTS = [f"{J}.degraded_factor=4", f"{J}.p_degrade=0.3", f"{J}.p_recover=0.3"]


@pytest.mark.parametrize("batching", ["static", "continuous"])
def test_autoscaled_bursty_judge_engines_agree_and_bursts_slow_it(batching):
    cfg = scenario(compose_config("scenario=capacity/judge_rm_autoscale", *SMALL, *BURSTS, f"{J}.rm.batching={batching}"))
    validate(cfg)
    draws = draw(cfg.pipeline, 3, np.random.default_rng(0))
    assert (draws.slowdown["judge"] == 4.0).any()
    for blocking, timeout in ((False, None), (True, None), (True, 5.0)):
        a, b = run_lanes(draws, blocking, timeout), run_simpy(draws, blocking, timeout)
        assert_same_schedule(a, b, f"{batching} blocking {blocking} timeout {timeout}")
    calm = draw(scenario(compose_config("scenario=capacity/judge_rm_autoscale", *SMALL, f"{J}.rm.batching={batching}"))
                .pipeline, 3, np.random.default_rng(0))
    log, calm_log = run_lanes(draws, False).gpu_batches["judge"], run_lanes(calm, False).gpu_batches["judge"]
    assert (log["end"] - log["start"]).sum() > (calm_log["end"] - calm_log["start"]).sum()


@pytest.mark.parametrize("overrides,key", [
    (["scenario=capacity/judge_rm_autoscale", f"{J}.rm.batching=continuous", f"{J}.rm.chunked_prefill=true"],
     f"{J}.autoscale"),
    (["scenario=capacity/judge_rm_h100", f"{J}.rm.batching=continuous", f"{J}.rm.chunked_prefill=true", *BURSTS],
     f"{J}.degraded_factor"),
    (["scenario=capacity/judge_rm_faults", f"{J}.rm.batching=continuous", f"{J}.rm.chunked_prefill=true"],
     f"{J}.faults.mtbf_s"),
    (["scenario=capacity/judge_rm_autoscale", f"{J}.faults.mtbf_s=3600", f"{J}.faults.mttr_s=60"], f"{J}.faults.mtbf_s"),
])
def test_combinations_not_modelled_are_refused(overrides, key):
    with pytest.raises(ConfigError) as info:
        validate(compose_config(*overrides))
    assert info.value.key == key and "\n" not in str(info.value)


@pytest.mark.parametrize("batching", ["static", "continuous"])
def test_failing_bursty_judge_engines_agree(batching):
    cfg = scenario(compose_config("scenario=capacity/judge_rm_faults", *SMALL[:4], *BURSTS, f"{J}.rm.batching={batching}",
                                  f"{J}.rm.gpus=2", f"{J}.faults.mtbf_s=40", f"{J}.faults.mttr_s=5"))
    validate(cfg)
    draws = draw(cfg.pipeline, 3, np.random.default_rng(0))
    assert "judge" in draws.faults and (draws.slowdown["judge"] == 4.0).any()
    for blocking, timeout in ((False, None), (True, None), (True, 5.0)):
        a, b = run_lanes(draws, blocking, timeout), run_simpy(draws, blocking, timeout)
        assert_same_schedule(a, b, f"{batching} blocking {blocking} timeout {timeout}")
