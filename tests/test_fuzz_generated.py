"""Bad input generated, not listed: hypothesis draws a config key of the default
config and a value of any kind (huge integers, NaN, inf, text, lists, null) and
composes and expands it as ``racsim KEY=VALUE`` would. Either it is accepted or it
is refused with a ConfigError or Hydra/OmegaConf's own error, which the command
line turns into one line: never another exception (a traceback for the user)."""

import pytest
from hydra.errors import HydraException
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from racsim.analyses.grid import expand
from racsim.config.defaults import compose_config
from racsim.errors import ConfigError


def leaf_keys(cfg, prefix=""):
    for k in cfg.keys():
        node = None if OmegaConf.is_missing(cfg, k) else cfg[k]
        if isinstance(node, DictConfig):
            yield from leaf_keys(node, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}"


KEYS = sorted(set(leaf_keys(compose_config())))
VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["null", "true", "abc", "[]", "[1,2]", "{}", "1e400", "-0", "''", "[a]", "-1", "0"]),
)


def refused_cleanly(override: str) -> bool:
    """True when racsim refuses the override as a user mistake, False when it accepts it;
    any other exception propagates (the test then fails with it)."""
    try:
        expand(compose_config(override))
    except (ConfigError, OmegaConfBaseException, HydraException):
        return True
    return False


def test_the_keys_cover_every_group():
    assert len(KEYS) > 100
    assert {k.split(".")[0] for k in KEYS} >= {"pipeline", "corrector", "learner", "study", "capacity", "output"}


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(KEYS), VALUES)
def test_any_value_of_any_key_is_accepted_or_refused_cleanly(key, value):
    refused_cleanly(f"{key}={value}")


def test_refused_cleanly_can_tell(monkeypatch):
    assert refused_cleanly("learner.trials=-1") and refused_cleanly("pipeline.steps=abc")
    assert not refused_cleanly("learner.trials=10")

    def crash(cfg):
        raise OverflowError("a traceback the user would see")

    monkeypatch.setattr(__import__(__name__), "expand", crash)
    with pytest.raises(OverflowError):
        refused_cleanly("learner.trials=10")
