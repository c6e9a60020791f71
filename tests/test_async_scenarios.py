"""The shipped scenarios of asynchronous generation (scenarios/async/, issue 46 point 3): each is the setting its
header says (the admission rule, adoption, queue and gate it mirrors), each runs small in the fast tier with the
regime it is there to show, and each runs as shipped through the command line in the long stage."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from racsim.config.defaults import compose_config
from racsim.config.schema import warmup_steps
from racsim.config.spec import scenario
from racsim.config.validate import validate
from racsim.generation.figures import generation_table
from racsim.generation.schedule import async_schedules
from racsim.seeds import rng_for

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = sorted(p.stem for p in (REPO / "scenarios" / "async").glob("*.yaml"))
# What each mirrors: (admission rule and its knob, adoption, gate, queue capacity, max_lag)
SETTINGS = {
    "areal": (("areal", "eta", 4), "inflight", "fast", None, None),
    "verl_one_step_off": (("steps_ahead", "k", 1), "drain", "fast", None, None),
    "verl_fully_async": (("verl", "staleness", 0.3), "inflight", "fast", 64, None),
    "pipelinerl": (("none", None, None), "inflight", "fast", None, 4),
    "slow_judge": (("areal", "eta", 2), "inflight", "all", None, None),
    "pool_split": (("verl", "staleness", 0.3), "inflight", "fast", None, None),
}


def test_every_shipped_scenario_is_listed():
    assert SCENARIOS == sorted(SETTINGS)


@pytest.mark.parametrize("name", SCENARIOS)
def test_each_scenario_is_the_setting_it_says(name):
    cfg = scenario(compose_config(f"scenario=async/{name}"))
    validate(cfg)
    g = cfg.pipeline.generation
    (rule, knob, value), adoption, gate, capacity, max_lag = SETTINGS[name]
    assert g.mode == "async" and g.admission.rule == rule and g.adoption == adoption and g.gate == gate
    assert knob is None or getattr(g.admission, knob) == value
    assert g.queue.capacity == capacity and g.queue.max_lag == max_lag
    assert cfg.capacity.enabled == (name == "pool_split")
    assert cfg.learner.trials <= 16 and cfg.pipeline.steps <= 80  # runs in seconds


def figures(name: str, *overrides: str):
    """The scenario's generation figures on one trial of 24 steps of its lanes (no bias study)."""
    cfg = scenario(compose_config(f"scenario=async/{name}", "capacity.enabled=false", "pipeline.steps=24", *overrides))
    s = async_schedules(cfg.pipeline, 1, rng_for(0, "pipeline"), blocking=False, engine="lanes")["async"]
    return generation_table(s, warmup_steps(cfg.pipeline)).iloc[0]


def test_each_scenario_shows_its_regime():
    """One step off is one version behind at most at start; the fully async threshold buys steps per hour with
    lag; PipelineRL's max_lag drops groups and trains on shorter responses than it generates; gate all under a
    slow judge costs steps per hour and leaves the engines idle."""
    off, sync = figures("verl_one_step_off"), figures("verl_one_step_off", "pipeline.generation.admission.k=0")
    assert sync.mean_lag == 0 and 0 < off.mean_lag <= 2 and off.steps_per_hour > 1.5 * sync.steps_per_hour
    full = figures("verl_fully_async")
    assert full.steps_per_hour > off.steps_per_hour and full.mean_lag > off.mean_lag
    pipe = figures("pipelinerl")
    assert pipe.dropped_share > 0 and pipe.head_lag_max <= 4 + 1
    assert pipe.response_trained_mean < pipe.response_generated_mean
    slow_all, slow_fast = figures("slow_judge"), figures("slow_judge", "pipeline.generation.gate=fast")
    assert slow_all.reward_wait_s > 5 and slow_fast.reward_wait_s == 0
    assert slow_fast.steps_per_hour > 1.5 * slow_all.steps_per_hour and slow_all.engine_idle > slow_fast.engine_idle


@pytest.mark.long
@pytest.mark.parametrize("name", SCENARIOS)
def test_each_scenario_runs_as_shipped(name, tmp_path):
    p = subprocess.run([sys.executable, "-m", "racsim", f"scenario=async/{name}", "hydra.run.dir=run",
                        "output.progress=false"], cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stderr[-3000:]
    out = " ".join(p.stdout.split())
    if name == "pool_split":
        assert "16 GPUs: " in out and "steps/h [" in out and (tmp_path / "run" / "split.csv").is_file()
    else:
        assert "racsim: generation: mean lag" in out and (tmp_path / "run" / "generation.csv").is_file()
