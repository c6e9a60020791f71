"""The config boundary (racsim/config/spec.py): the composed config checked and typed once, and
a spec varied without touching the one it came from."""

from __future__ import annotations

import copy

import pytest

from racsim.analyses.grid import expand
from racsim.config.defaults import compose_config
from racsim.config.schema import RacsimConf
from racsim.config.spec import replace_at, scenario
from racsim.errors import ConfigError

J = "pipeline.channels.judge"


def test_scenario_is_the_typed_config_and_leaves_the_composed_one_as_it_is():
    cfg = compose_config("scenario=capacity/judge_rm_h100")
    before = copy.deepcopy(cfg)
    spec = scenario(cfg)
    assert isinstance(spec, RacsimConf) and spec.pipeline.channels["judge"].rm.gpus == cfg.pipeline.channels.judge.rm.gpus
    assert cfg == before
    assert scenario(cfg) == spec and scenario(cfg) is not spec  # a new tree each time


def test_scenario_refuses_what_the_schema_lacks_naming_the_key():
    with pytest.raises(ConfigError) as ex:
        scenario(compose_config("+pipeline.foo=1"))
    assert ex.value.key == "pipeline.foo"
    with pytest.raises(ConfigError) as ex:
        scenario(compose_config("corrector.alpha=nan"))
    assert ex.value.key == "corrector.alpha"


def test_replace_at_copies_along_the_path_only():
    spec = scenario(compose_config("scenario=capacity/judge_rm_h100", "+channel@pipeline.channels.verifier=code_verifier"))
    keep = copy.deepcopy(spec)
    new = replace_at(spec, f"{J}.rm.gpus", 5)
    assert new.pipeline.channels["judge"].rm.gpus == 5 and spec == keep  # the old tree is unchanged
    assert new.pipeline is not spec.pipeline and new.pipeline.channels is not spec.pipeline.channels
    assert isinstance(new.pipeline.channels, dict) and list(new.pipeline.channels) == list(spec.pipeline.channels)
    assert new.pipeline.channels["verifier"] is spec.pipeline.channels["verifier"]  # off the path: shared
    assert new.learner is spec.learner and new.pipeline.generate is spec.pipeline.generate
    assert replace_at(spec, "pipeline.steps", 7).pipeline.steps == 7
    assert replace_at(spec, f"{J}.autoscale", None).pipeline.channels["judge"].autoscale is None


@pytest.mark.parametrize("key", ["pipeline.nope", f"{J}.rm.nope", "pipeline.channels.nope.workers"])
def test_replace_at_refuses_a_key_the_spec_lacks(key):
    with pytest.raises(KeyError):
        replace_at(scenario(compose_config()), key, 1)


def test_the_model_takes_specs_not_the_composed_config():
    with pytest.raises(TypeError, match="scenario"):
        expand(compose_config())
