"""The correctors compared (:class:`~racsim.config.schema.CorrectorConf`): which, and each one's knobs."""

from __future__ import annotations

from typing import Any

from racsim.config.schema import CORRECTORS
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
