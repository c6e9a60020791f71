"""The correctors compared (:class:`~racsim.config.schema.CorrectorConf`): which, and each one's knobs."""

from __future__ import annotations

from typing import Any

from racsim.config.schema import CORRECTORS, ROLLOUT_CORRECTORS
from racsim.config.validate.common import MAX_GAIN, finite, fraction, int_at_least, need, positive


def validate_corrector(c: Any) -> None:
    """``corrector``: the names, then the knobs of importance weighting, retrace and the adaptive wait."""
    names = list(c.names)
    need(len(names) >= 1, "corrector.names", names, "a non-empty list of " + ", ".join(CORRECTORS))
    for n in names:
        need(n in CORRECTORS, "corrector.names", n, "each one of " + ", ".join(CORRECTORS))
    need(len(set(names)) == len(names), "corrector.names", names, "each corrector at most once")
    positive("corrector.alpha", c.alpha)
    need(c.alpha <= MAX_GAIN, "corrector.alpha", c.alpha,
         f"a positive number <= {MAX_GAIN:g} (a gain on the slow residual; the paper's is 1)")
    positive("corrector.tau_age", c.tau_age, allow_inf=True)
    positive("corrector.rho_bar", c.rho_bar, allow_inf=True)
    need(finite(c.retrace_gamma) and 0 <= c.retrace_gamma <= 1, "corrector.retrace_gamma",
         c.retrace_gamma, "a number in [0, 1]")
    fraction("corrector.adaptive_quantile", c.adaptive_quantile)
    positive("corrector.adaptive_scale", c.adaptive_scale)
    int_at_least("corrector.adaptive_min_results", c.adaptive_min_results, 1)
    if c.wait_timeout_s is not None:
        positive("corrector.wait_timeout_s", c.wait_timeout_s)
    validate_rollout(c)


def validate_rollout(c: Any) -> None:
    """The rollout-axis correctors and their knobs: each cap at least 1, so that a sample of the current
    policy (ratio 1) keeps its whole weight (inf: no truncation)."""
    rollout = list(c.rollout)
    need(len(rollout) >= 1, "corrector.rollout", rollout, "a non-empty list of " + ", ".join(ROLLOUT_CORRECTORS))
    for r in rollout:
        need(r in ROLLOUT_CORRECTORS, "corrector.rollout", r, "each one of " + ", ".join(ROLLOUT_CORRECTORS))
    need(len(set(rollout)) == len(rollout), "corrector.rollout", rollout, "each rollout corrector at most once")
    for key in ("tis_cap", "decoupled_cap"):
        v = getattr(c, key)
        need(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 1, f"corrector.{key}", v,
             "a number >= 1 (or inf): a sample of the current policy has ratio 1 and keeps its weight")
    int_at_least("corrector.version_cap", c.version_cap, 0)


def validate_lag_use(cfg: Any) -> None:
    """A generation lag (pipeline.generation.lag) and the rollout-axis correctors are read by the pipeline
    study (the tabular learner's and the LM learner's): the static experiment and a capacity plan refuse them."""
    gen = getattr(cfg.pipeline, "generation", None)
    lag = gen is not None and gen.lag is not None
    rollout = list(cfg.corrector.rollout) != ["none"]
    for on, key, value in ((lag, "pipeline.generation.lag", "null"), (rollout, "corrector.rollout", "[none]")):
        if not on:
            continue
        need(cfg.study.mode == "pipeline", key, "set", f"{value} with study.mode={cfg.study.mode}: the static "
                                                       f"experiment has no generation lag (study.mode=pipeline does)")
        need(not cfg.capacity.enabled, key, "set", f"{value} in a capacity plan, which reads no generation lag")
