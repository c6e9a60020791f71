"""The static-batch advantage probe (paper appendix app:adv-quality-7b) and its
Theorem 2.1 checks, against slow per-sample oracles written from the paper."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from racsim.analyses.probe import (
    CHANNELS,
    PAPER_ETAS,
    PAPER_LIKE_MOMENTS,
    delays_from,
    identity_collapse,
    load_pairs,
    paper_delays,
    probe_advantages,
    probe_metrics,
    run_probe,
    slack_sweep,
    synthetic_pairs,
)
from racsim.config.schema import LatencyConf

# --------------------------------------------------------------------------
# Oracle: one sample at a time, plain Python floats.


def oracle_probe(r_fast, r_slow, delays, tau_age):
    n = len(r_fast)
    bl = []
    total = 0.0
    for t in range(n):
        bl.append(total / t if t > 0 else 0.0)
        total += float(r_fast[t])
    sync = [float(r_slow[t]) - bl[t] for t in range(n)]
    ctrl = [float(r_fast[t]) - bl[t] for t in range(n)]
    rac = list(ctrl)
    lost = []
    for s in range(n):
        d = int(delays[s])
        if d < 0 or s + d >= n:
            lost.append(True)
            continue
        lost.append(False)
        w = 1.0 if math.isinf(tau_age) else math.exp(-d / tau_age)
        rac[s + d] += w * (float(r_slow[s]) - float(r_fast[s]))
    return np.array(bl), np.array(sync), np.array(ctrl), np.array(rac), np.array(lost)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("tau_age", [7.0, 1000.0, math.inf])
def test_probe_advantages_match_loop_oracle(seed, tau_age):
    rng = np.random.default_rng(seed)
    n = 80
    f = rng.normal(0.3, 1.2, n)
    s = rng.normal(-1.0, 0.7, n)
    delays = rng.integers(-3, 15, n)  # negative: never returns; large: lands past the end
    delays[:5] = 0
    adv = probe_advantages(f, s, delays, tau_age)
    bl, sync, ctrl, rac, lost = oracle_probe(f, s, delays, tau_age)

    # The random inputs reach every branch, including several results landing on one step.
    land = np.arange(n) + delays
    assert np.any(delays < 0) and np.any(delays == 0) and np.any((delays >= 0) & (land >= n))
    ok = (delays >= 0) & (land < n)
    assert np.bincount(land[ok], minlength=n).max() >= 2

    np.testing.assert_allclose(adv["baseline"], bl, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(adv["A_sync"], sync, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(adv["A_control"], ctrl, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(adv["A_rac"], rac, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(adv["A_rac"] - adv["A_control"], adv["correction"], rtol=1e-12, atol=1e-12)
    assert np.array_equal(adv["lost"], lost)
    assert np.array_equal(adv["never_returned"], delays < 0)
    assert np.array_equal(adv["past_end"], (delays >= 0) & (land >= n))
    assert np.array_equal(adv["landing"], np.where(ok, land, -1))
    m = probe_metrics(adv)
    assert m["fraction_lost"] == pytest.approx(lost.mean())
    assert m["fraction_lost"] == pytest.approx(m["fraction_never"] + m["fraction_past_end"])


def test_probe_advantages_vectorised_by_landing_not_by_sample():
    # A late result does not touch its own step, only s + delay.
    f = np.array([1.0, 2.0, 3.0, 4.0])
    s = np.array([11.0, 2.0, 3.0, 4.0])
    adv = probe_advantages(f, s, [2, -1, -1, -1], tau_age=math.inf)
    np.testing.assert_array_equal(adv["A_rac"] - adv["A_control"], [0.0, 0.0, 10.0, 0.0])


def test_zero_delay_rac_equals_sync_bit_for_bit():
    df = synthetic_pairs(500, -0.53, 3, **PAPER_LIKE_MOMENTS)
    f, s = df["r_fast"].to_numpy(), df["r_slow"].to_numpy()
    for tau in (math.inf, 1000.0, 3.0):
        adv = probe_advantages(f, s, np.zeros(500, dtype=int), tau)
        assert np.array_equal(adv["A_rac"], adv["A_sync"])
    # The additive form of the same algebra is only equal up to rounding.
    additive = adv["A_control"] + (s - f)
    assert np.allclose(additive, adv["A_sync"], rtol=0, atol=1e-12)


@pytest.mark.parametrize("bad", [np.zeros(3), [0.5] * 4, [0, 1, np.nan, 2], [True] * 4])
def test_probe_advantages_rejects_bad_delays(bad):
    with pytest.raises(ValueError, match="delays"):
        probe_advantages(np.ones(4), np.ones(4), bad)


def test_probe_rejects_non_finite_rewards():
    with pytest.raises(ValueError, match="r_slow"):
        probe_advantages(np.ones(4), [1.0, np.inf, 0.0, 0.0], np.zeros(4, dtype=int))


# --------------------------------------------------------------------------
# Pairs.


@pytest.mark.parametrize("rho", [-0.53, 0.0, 0.9, -1.0])
def test_synthetic_pairs_correlation_and_moments(rho):
    n = 4000
    df = synthetic_pairs(n, rho, 11, slow_mean=2.0, slow_std=3.0, fast_mean=-1.0, fast_std=0.5)
    assert list(df.columns) == ["r_fast", "r_slow"] and len(df) == n
    r = np.corrcoef(df["r_fast"], df["r_slow"])[0, 1]
    assert abs(r - rho) < 3 / math.sqrt(n)
    assert df["r_slow"].mean() == pytest.approx(2.0, abs=4 * 3.0 / math.sqrt(n))
    assert df["r_fast"].std() == pytest.approx(0.5, rel=0.05)
    # Seeded: the same seed gives the same pairs.
    pd.testing.assert_frame_equal(df, synthetic_pairs(n, rho, 11, slow_mean=2.0, slow_std=3.0,
                                                      fast_mean=-1.0, fast_std=0.5))


def test_synthetic_pairs_rejects_bad_correlation():
    with pytest.raises(ValueError, match="correlation"):
        synthetic_pairs(10, 1.5, 0)


def test_load_pairs_round_trips_csv_and_parquet(tmp_path):
    df = synthetic_pairs(50, -0.53, 5)
    src = pd.DataFrame({"id": np.arange(50), "fast": df["r_fast"], "slow": df["r_slow"]})
    csv, pq = tmp_path / "pairs.csv", tmp_path / "pairs.parquet"
    src.to_csv(csv, index=False)
    src.to_parquet(pq, index=False)
    for path in (csv, str(pq)):
        got = load_pairs(path, fast_col="fast", slow_col="slow")
        assert list(got.columns) == ["r_fast", "r_slow"]
        np.testing.assert_array_equal(got["r_fast"].to_numpy(), df["r_fast"].to_numpy())
        np.testing.assert_array_equal(got["r_slow"].to_numpy(), df["r_slow"].to_numpy())
    # Default column names, integers accepted.
    pd.DataFrame({"r_fast": [1, 2, 3], "r_slow": [0, 5, 1]}).to_csv(tmp_path / "ints.csv", index=False)
    assert load_pairs(tmp_path / "ints.csv")["r_slow"].tolist() == [0.0, 5.0, 1.0]


def test_load_pairs_rejects_bad_files(tmp_path):
    missing = tmp_path / "nope.csv"
    with pytest.raises(ValueError, match="nope.csv"):
        load_pairs(missing)
    txt = tmp_path / "pairs.txt"
    txt.write_text("r_fast,r_slow\n1,2\n3,4\n")
    with pytest.raises(ValueError, match=r"pairs\.txt.*\.csv or \.parquet"):
        load_pairs(txt)
    p = tmp_path / "a.csv"
    pd.DataFrame({"r_fast": [1.0, 2.0], "other": [1.0, 2.0]}).to_csv(p, index=False)
    with pytest.raises(ValueError, match=r"no column 'r_slow'.*r_fast, other"):
        load_pairs(p)
    pd.DataFrame({"r_fast": [1.0, 2.0], "r_slow": ["x", "y"]}).to_csv(p, index=False)
    with pytest.raises(ValueError, match=r"column 'r_slow' is not numeric"):
        load_pairs(p)
    pd.DataFrame({"r_fast": [1.0, np.nan, 3.0], "r_slow": [1.0, 2.0, 3.0]}).to_csv(p, index=False)
    with pytest.raises(ValueError, match=r"column 'r_fast' has 1 NaN.*row 1"):
        load_pairs(p)
    pd.DataFrame({"r_fast": [1.0], "r_slow": [2.0]}).to_csv(p, index=False)
    with pytest.raises(ValueError, match=r"a\.csv.*at least 2"):
        load_pairs(p)
    q = tmp_path / "b.parquet"
    pd.DataFrame({"r_fast": [True, False], "r_slow": [1.0, 2.0]}).to_parquet(q)
    with pytest.raises(ValueError, match=r"b\.parquet.*'r_fast' is not numeric"):
        load_pairs(q)
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not a parquet file")
    with pytest.raises(ValueError, match="broken.parquet"):
        load_pairs(broken)


# --------------------------------------------------------------------------
# Theorem 2.1 on the pairs.


def test_identity_collapse_is_exactly_zero():
    df = synthetic_pairs(500, -0.53, 42)
    assert identity_collapse(df["r_fast"], df["r_slow"]) == 0.0
    rng = np.random.default_rng(9)
    n = 500  # magnitudes from 1e-150 to 1e150, both signs: the rounding of the sums is wild
    wide_f = rng.choice([-1.0, 1.0], n) * 10.0 ** rng.uniform(-150, 150, n)
    wide_s = rng.choice([-1.0, 1.0], n) * 10.0 ** rng.uniform(-150, 150, n)
    assert identity_collapse(wide_f, wide_s) == 0.0
    # The additive literal form is not exact on such data: the check has teeth.
    bl = np.concatenate([[0.0], np.cumsum(wide_f)[:-1] / np.arange(1, n)])
    assert np.max(np.abs((wide_f - bl) + (wide_s - wide_f) - (wide_s - bl))) > 0


@pytest.mark.parametrize("seed, moments", [(42, {}), (7, PAPER_LIKE_MOMENTS)])
def test_slack_sweep_is_linear_in_eta(seed, moments):
    df = synthetic_pairs(500, -0.53, seed, **moments)
    out = slack_sweep(df["r_fast"], df["r_slow"], (0.0,) + PAPER_ETAS, rng=seed)
    assert list(out["eta"]) == [0.0] + list(PAPER_ETAS)
    zero, rest = out.iloc[0], out.iloc[1:]
    assert zero["max_abs_bias"] == 0.0  # Lambda[0] = 1: byte-for-byte unbiased
    assert (rest["n_ratio"] == 500).all()
    assert np.all(np.abs(rest["ratio_mean"] - 1.0) < 1e-12)
    assert np.all(rest["ratio_std"] < 1e-12)
    x = df["r_slow"].to_numpy() - df["r_fast"].to_numpy()
    np.testing.assert_allclose(rest["predicted_mean_bias"], -rest["eta"] * x.mean(), rtol=1e-12)
    np.testing.assert_allclose(rest["mean_bias"], rest["predicted_mean_bias"], rtol=1e-9)
    # Sampled landings agree with the prediction within 4 standard errors...
    assert np.all(np.abs(rest["sampled_z"]) < 4)
    # ...and the SE is the binomial one.
    np.testing.assert_allclose(rest["sampled_se"], np.sqrt(rest["eta"] * (1 - rest["eta"]) * np.sum(x * x)) /
                               (500 * np.sqrt(200)), rtol=1e-12)


def test_slack_sweep_se_is_calibrated():
    # Over many seeds, z is roughly standard normal (a wrong SE or a biased sampler fails).
    df = synthetic_pairs(200, -0.53, 1, **PAPER_LIKE_MOMENTS)
    z = np.concatenate([slack_sweep(df["r_fast"], df["r_slow"], (0.1, 0.5), rng=k, draws=20)["sampled_z"]
                        for k in range(60)])
    assert abs(z.mean()) < 4 / math.sqrt(z.size)
    assert 0.75 < z.std() < 1.25


# --------------------------------------------------------------------------
# Delay channels and the probe table.


def test_delays_from_paper_channels():
    n = 20000
    det = delays_from("deterministic", n, 0)
    assert det.dtype == np.int64 and np.all(det == 5)
    logn = delays_from("lognormal", n, 1)
    # mu = 1.5, sigma = 0.8: median exp(1.5) = 4.48 (rounded: 4), mean of the rounded draws ~ exp(1.82).
    assert np.median(logn) == 4
    assert logn.mean() == pytest.approx(math.exp(1.5 + 0.32), rel=0.03)
    par = delays_from("pareto", n, 2)
    # Classical Pareto, x_m = 1, alpha = 2.5: P(round = 1) = P(X < 1.5) = 1 - 1.5**-2.5.
    assert par.min() == 1
    assert np.mean(par == 1) == pytest.approx(1 - 1.5 ** -2.5, abs=0.015)
    # Any LatencyConf works (durations read as steps and rounded).
    g = delays_from(LatencyConf(kind="exponential", mean=3.0), n, 3)
    assert g.dtype == np.int64 and g.min() >= 0 and g.mean() == pytest.approx(3.0, rel=0.05)
    with pytest.raises(ValueError, match="'gamma'"):
        delays_from("gamma", 10, 0)
    d = paper_delays(100, 4)
    assert list(d) == list(CHANNELS) and all(v.shape == (100,) for v in d.values())


def test_probe_table_correction_helps_with_small_delays():
    n = 500
    df = synthetic_pairs(n, -0.53, 42, **PAPER_LIKE_MOMENTS)
    table = run_probe(df, {"det5": delays_from("deterministic", n, 42)}, tau_age=1000.0)
    row = table.iloc[0]
    assert row["channel"] == "det5" and row["n"] == n and row["mean_delay"] == 5.0
    assert row["l2_ratio"] > 1.2
    assert row["cos_rac"] > row["cos_control"] + 0.5
    assert row["fraction_lost"] == pytest.approx(5 / n)


def test_probe_l2_ratio_below_one_without_mean_offset():
    # Equal means: a shifted correction adds an independent residual, error ~ sqrt(2) x control.
    n = 500
    df = synthetic_pairs(n, -0.53, 42)
    row = run_probe(df, {"det5": delays_from("deterministic", n, 42)}).iloc[0]
    assert 0.6 < row["l2_ratio"] < 0.8
    assert row["cos_rac"] > row["cos_control"]


def test_run_probe_rows_match_metrics():
    df = synthetic_pairs(300, -0.53, 8, **PAPER_LIKE_MOMENTS)
    ch = paper_delays(300, 8)
    table = run_probe(df, ch, tau_age=50.0)
    assert list(table["channel"]) == list(CHANNELS)
    for _, row in table.iterrows():
        m = probe_metrics(probe_advantages(df["r_fast"], df["r_slow"], ch[row["channel"]], 50.0))
        for k, v in m.items():
            assert row[k] == pytest.approx(v, rel=1e-15)
    with pytest.raises(ValueError, match="r_slow"):
        run_probe(df.rename(columns={"r_slow": "x"}), ch)


def test_probe_metrics_edge_cases():
    f = np.array([1.0, 2.0, 3.0])
    adv = probe_advantages(f, f, np.zeros(3, dtype=int))
    m = probe_metrics(adv)
    assert m["l2_control"] == 0.0 and m["l2_rac"] == 0.0 and math.isnan(m["l2_ratio"])
    s = f + 1.0
    m = probe_metrics(probe_advantages(f, s, np.zeros(3, dtype=int)))
    assert m["l2_ratio"] == math.inf and m["cos_rac"] == pytest.approx(1.0)
