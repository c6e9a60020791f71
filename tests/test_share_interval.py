"""A sweep's interval of a bounded figure stays in its range (issue 27): eta, a share, never has a
negative lower end nor an upper end above 1; durations, loads, biases and ratios never go below 0 (issue 49: a
capacity sweep's bias read [-1.66e-05, 0.00136]); an unbounded
figure keeps the plain t interval. Checked against a slow loop oracle of the t interval on random
seeds, with cases where the cut binds below, above and not at all."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from racsim.report.aggregate import BOUNDS, aggregate, format_aggregate


def _oracle(x):
    """The 95% t interval of the mean, one value at a time."""
    n = len(x)
    mean = sum(x) / n
    s = math.sqrt(sum((v - mean) ** 2 for v in x) / (n - 1))
    half = stats.t.ppf(0.975, n - 1) * s / math.sqrt(n)
    return mean, mean - half, mean + half


def test_a_share_interval_stays_in_0_1_and_the_unbounded_ones_do_not_move():
    rng = np.random.default_rng(27)
    seen = {"cut below": 0, "cut above": 0, "inside": 0, "cut at 0": 0}
    for _ in range(60):
        n = int(rng.integers(2, 6))
        centre = rng.choice([0.02, 0.5, 0.98])
        eta = np.clip(centre + rng.normal(0, 0.2, n), 0, 1)
        reward = rng.normal(0, 1, n)
        clock = np.abs(rng.normal(0.5, 1, n))
        bias = np.abs(rng.normal(6e-4, 8e-4, n))  # a norm near 0, as a capacity plan's at its count
        df = pd.DataFrame({"seed": range(n), "corrector": "rac", "slack_eta": eta, "true_final": reward,
                           "wallclock_s": clock, "recommended_bias": bias})
        row = aggregate(df, ["seed"]).iloc[0]
        assert row["n"] == n
        m, lo, hi = _oracle(list(eta))
        assert math.isclose(row.slack_eta, m)
        assert 0 <= row.slack_eta_lo <= row.slack_eta <= row.slack_eta_hi <= 1
        assert math.isclose(row.slack_eta_lo, max(lo, 0.0), abs_tol=1e-12)
        assert math.isclose(row.slack_eta_hi, min(hi, 1.0), abs_tol=1e-12)
        seen["cut below"] += lo < 0
        seen["cut above"] += hi > 1
        seen["inside"] += 0 <= lo and hi <= 1
        rm, rlo, rhi = _oracle(list(reward))  # unbounded: the t interval as it is
        assert math.isclose(row.true_final_lo, rlo) and math.isclose(row.true_final_hi, rhi)
        for col, values in (("wallclock_s", clock), ("recommended_bias", bias)):  # at least 0
            _, lo_, hi_ = _oracle(list(values))
            assert math.isclose(row[f"{col}_lo"], max(lo_, 0.0), abs_tol=1e-12) and math.isclose(row[f"{col}_hi"], hi_)
            assert 0 <= row[f"{col}_lo"] <= row[col] <= row[f"{col}_hi"]
            seen["cut at 0"] += lo_ < 0
        printed = format_aggregate(aggregate(df[["seed", "corrector", "slack_eta"]], ["seed"])).splitlines()[1]
        assert "-" not in printed.split("rac", 1)[1]  # no negative end printed for eta
    assert min(seen.values()) >= 3, seen
    assert BOUNDS["slack_eta"] == (0.0, 1.0)
    assert all(BOUNDS[m] == (0.0, math.inf) for m in ("bias_exact", "reduction_exact", "recommended_bias"))


def test_one_seed_has_no_interval_and_agreeing_seeds_a_point():
    df = pd.DataFrame({"seed": [0], "corrector": "naive", "slack_eta": [1.0]})
    row = aggregate(df, ["seed"]).iloc[0]
    assert row.slack_eta == 1.0 and math.isnan(row.slack_eta_lo) and math.isnan(row.slack_eta_hi)
    df = pd.DataFrame({"seed": [0, 1, 2], "corrector": "naive", "slack_eta": [1.0, 1.0, 1.0]})
    row = aggregate(df, ["seed"]).iloc[0]
    assert row.slack_eta_lo == row.slack_eta_hi == 1.0
