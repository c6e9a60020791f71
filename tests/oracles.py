"""Slow, obvious reference implementations shared by several test files.

Written from the model's description (paper eq. 1 and the corrector table in
the README), one element or one time step at a time, never calling racsim.
"""

import math


def oracle_weight(name, delay, status, ratio, alpha, tau_age, rho_bar, gamma):
    """Corrector weight c of one (sample, channel) element; plain Python floats.
    ``status`` 0 means injected; ``ratio`` is pi_now / pi_behaviour (1 at an identity actor)."""
    if name == "naive":
        return 0.0
    if name == "sync_oracle":
        return 1.0
    if status != 0:  # dropped or pending: the slow result never reaches the update
        return 0.0
    if name == "wait_for_slow":
        return 1.0
    if name == "bare_additive":
        return alpha
    rho = rho_bar if ratio > rho_bar else ratio
    if name == "rac":
        return alpha * math.exp(-delay / tau_age) * rho
    if name == "rac_no_age":
        return alpha * rho
    if name == "retrace_a":
        return alpha * gamma**delay * rho
    raise AssertionError(name)


def oracle_returns(rewards, gamma):
    """G_t = sum_{j >= t} gamma^(j - t) r_j, truncated at the horizon; plain floats."""
    T = len(rewards)
    return [sum(gamma ** (j - t) * rewards[j] for j in range(t, T)) for t in range(T)]
