"""Tests of racsim.pipeline.latency: sampling, exact means, CDFs, quantiles, config errors.

Reference values are computed here independently (densities written out by
hand and integrated with scipy.integrate.quad, or scipy.stats distributions),
never copied from the module's output. All randomness uses fixed seeds.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import numpy as np
import pytest
from scipy import integrate, stats

from racsim.config.schema import LatencyConf
from racsim.errors import ConfigError
from racsim.pipeline.latency import (
    TOKEN_CHUNK,
    build_latency,
    cauchy_truncated_mean,
    solve_cauchy_location,
    token_lengths,
)

INF = math.inf
N = 400_000  # draws per distribution for moment/quantile checks
QS = (0.1, 0.5, 0.9, 0.99)


# ----------------------------------------------------------------------------
# Independent densities (not the module's formulas).


def norm_pdf(m, s):
    return lambda x: math.exp(-0.5 * ((x - m) / s) ** 2) / (s * math.sqrt(2 * math.pi))


def logn_pdf(mean, sigma):
    mu = math.log(mean) - sigma**2 / 2
    return lambda x: 0.0 if x <= 0 else math.exp(-((math.log(x) - mu) ** 2) / (2 * sigma**2)) / (
        x * sigma * math.sqrt(2 * math.pi))


def pareto_pdf(mean, alpha):
    xm = mean * (alpha - 1) / alpha
    return lambda x: alpha * xm**alpha / x ** (alpha + 1) if x >= xm else 0.0


def expo_pdf(mean):
    return lambda x: math.exp(-x / mean) / mean if x >= 0 else 0.0


def trunc_cauchy_pdf(loc, s, a, b):
    raw = lambda x: 1.0 / (math.pi * s * (1 + ((x - loc) / s) ** 2))  # noqa: E731
    z = integrate.quad(raw, a, b, epsabs=0, epsrel=1e-13, limit=500, points=[loc] if a < loc < b else None)[0]
    return lambda x: raw(x) / z if a <= x <= b else 0.0


@dataclass
class Case:
    conf: LatencyConf
    pdf: Optional[Callable[[float], float]] = None  # base density, None for point masses
    support: Tuple[float, float] = (-INF, INF)  # where pdf is non-zero
    continuous: bool = False  # no atoms at all (KS-testable)
    exact: bool = False  # no clipping or rounding: mean() is the target mean


C = LatencyConf
CASES = {
    "det": Case(C("deterministic", 20.0)),
    "det_round_clip": Case(C("deterministic", 7.6, discrete=True, low=10.0)),
    "gauss_free": Case(C("gaussian", 100.0, std=5.0), norm_pdf(100, 5), continuous=True, exact=True),
    "gauss_low0": Case(C("gaussian", 2.0, std=3.0), norm_pdf(2, 3)),
    "gauss_clip": Case(C("gaussian", 20.0, std=6.0, low=15.0, high=30.0), norm_pdf(20, 6)),
    "gauss_paper": Case(C("gaussian", 20.0, std=6.0, discrete=True, low=1.0, high=200.0), norm_pdf(20, 6)),
    "logn": Case(C("lognormal", 20.0, sigma=0.5), logn_pdf(20, 0.5), (0, INF), continuous=True, exact=True),
    "logn_clip": Case(C("lognormal", 20.0, sigma=1.0, low=5.0, high=60.0), logn_pdf(20, 1.0), (0, INF)),
    "logn_disc": Case(C("lognormal", 20.0, sigma=1.0, discrete=True, low=2.5, high=100.0), logn_pdf(20, 1.0), (0, INF)),
    "pareto": Case(C("pareto", 20.0, alpha=3.0), pareto_pdf(20, 3), (40 / 3, INF), continuous=True, exact=True),
    "pareto_clip": Case(C("pareto", 20.0, alpha=2.5, low=15.0, high=100.0), pareto_pdf(20, 2.5), (12, INF)),
    "pareto_disc": Case(C("pareto", 20.0, alpha=3.0, discrete=True, high=500.0), pareto_pdf(20, 3), (40 / 3, INF)),
    "pareto_disc_open": Case(C("pareto", 20.0, alpha=3.0, discrete=True), pareto_pdf(20, 3), (40 / 3, INF)),
    "expo": Case(C("exponential", 20.0), expo_pdf(20), (0, INF), continuous=True, exact=True),
    "expo_clip": Case(C("exponential", 20.0, low=2.0, high=50.0), expo_pdf(20), (0, INF)),
    "expo_disc": Case(C("exponential", 5.0, discrete=True, high=30.0), expo_pdf(5), (0, INF)),
    "cauchy_paper": Case(C("cauchy", None, median=18.0, scale=4.0, low=1.0, high=200.0),
                         trunc_cauchy_pdf(18, 4, 1, 200), (1, 200), continuous=True),
    "cauchy_disc": Case(C("cauchy", None, median=3.0, scale=2.0, low=1.3, high=40.0, discrete=True),
                        trunc_cauchy_pdf(3, 2, 1.3, 40), (1.3, 40)),
}
CONTINUOUS = [k for k, c in CASES.items() if c.continuous]


def bounds(conf):
    return (0.0 if conf.low is None else conf.low), (INF if conf.high is None else conf.high)


def quad_mean(case: Case) -> float:
    """E[clip(rint?(X), low, high)] by quad over the pieces on which the map is constant or x."""
    low, high = bounds(case.conf)
    if case.conf.discrete:
        assert math.isfinite(high), "piecewise quad needs a finite high"
        kl, kh = math.floor(low), math.ceil(high)
        pieces = [(-INF, kl + 0.5, low)] + [(k - 0.5, k + 0.5, k) for k in range(kl + 1, kh)] + [(kh - 0.5, INF, high)]
    else:
        pieces = [(-INF, low, low), (low, high, None), (high, INF, high)]
    lo, hi = case.support
    total = 0.0
    for a, b, v in pieces:
        a, b = max(a, lo), min(b, hi)
        if a >= b:
            continue
        f = case.pdf if v is not None else (lambda x: x * case.pdf(x))
        val = integrate.quad(f, a, b, epsabs=1e-14, epsrel=1e-12, limit=500)[0]
        total += val * (v if v is not None else 1.0)
    return total


@pytest.fixture(scope="module")
def draws():
    out = {}
    for i, (name, case) in enumerate(CASES.items()):
        out[name] = build_latency(case.conf).sample(np.random.default_rng(1000 + i), N)
    return out


# ----------------------------------------------------------------------------
# Means.


@pytest.mark.parametrize("name", list(CASES))
def test_sample_mean_within_5_standard_errors(name, draws):
    x = draws[name]
    m = build_latency(CASES[name].conf).mean()
    se = x.std(ddof=1) / math.sqrt(x.size)
    if se == 0:
        assert np.all(x == m)
    else:
        assert abs(x.mean() - m) < 5 * se, (x.mean(), m, se)


@pytest.mark.parametrize("name", [k for k, c in CASES.items() if c.exact])
def test_unclipped_mean_is_the_target(name):
    conf = CASES[name].conf
    assert build_latency(conf).mean() == pytest.approx(conf.mean, rel=1e-12, abs=0)


@pytest.mark.parametrize("name", [k for k, c in CASES.items() if c.pdf is not None and math.isfinite(bounds(c.conf)[1])
                                  or (c.pdf is not None and not c.conf.discrete)])
def test_mean_matches_quad_of_independent_density(name):
    case = CASES[name]
    assert build_latency(case.conf).mean() == pytest.approx(quad_mean(case), rel=1e-9, abs=1e-12)


def test_rounded_open_pareto_mean_matches_direct_atom_sum():
    # sum_k k P(rint X = k) over 2e6 atoms with scipy's Pareto, plus the far tail's integral
    d = stats.pareto(b=3.0, scale=40 / 3)
    k = np.arange(13, 2_000_001, dtype=float)
    p = d.sf(k - 0.5) - d.sf(k + 0.5)
    c = 2_000_000.5  # tail integral of x f(x) over (c, inf), substituting x = c / u
    tail = integrate.quad(lambda u: (c / u) * d.pdf(c / u) * c / u**2, 0, 1, epsabs=0, epsrel=1e-12)[0]
    direct = math.fsum(k * p) + tail
    assert build_latency(CASES["pareto_disc_open"].conf).mean() == pytest.approx(direct, rel=1e-9)


def test_deterministic_rounds_then_clips():
    assert build_latency(CASES["det_round_clip"].conf).mean() == 10.0
    assert build_latency(C("deterministic", 7.6, discrete=True)).mean() == 8.0
    assert build_latency(C("deterministic", 7.6, high=5.0)).mean() == 5.0


# ----------------------------------------------------------------------------
# CDF and quantiles.


@pytest.mark.parametrize("name", list(CASES))
def test_quantiles_match_samples(name, draws):
    x, lat = draws[name], build_latency(CASES[name].conf)
    for q in QS:
        xq = float(lat.quantile(q))
        tol = 5 * math.sqrt(q * (1 - q) / x.size) + 1e-12
        # xq is the generalised inverse of the sample's law: P(Y <= xq) >= q >= P(Y < xq)
        assert np.mean(x <= xq) >= q - tol, (q, xq)
        assert np.mean(x < xq) <= q + tol, (q, xq)
        # and of cdf itself
        assert float(lat.cdf(xq)) >= q - 1e-12
        assert float(lat.cdf(xq - 1e-9 * max(1.0, abs(xq)))) <= q + 1e-12
        if CASES[name].continuous:
            assert float(lat.cdf(np.quantile(x, q))) == pytest.approx(q, abs=tol)
            assert float(lat.cdf(xq)) == pytest.approx(q, abs=1e-10)


@pytest.mark.parametrize("name", CONTINUOUS)
def test_kolmogorov_smirnov(name, draws):
    lat = build_latency(CASES[name].conf)
    assert stats.kstest(draws[name][:200_000], lat.cdf).pvalue > 1e-3


@pytest.mark.parametrize("name", list(CASES))
def test_cdf_matches_sample_frequencies(name, draws):
    x, lat = np.sort(draws[name]), build_latency(CASES[name].conf)
    pts = np.unique(np.quantile(x, np.linspace(0, 1, 41)))
    emp = np.searchsorted(x, pts, side="right") / x.size
    assert np.max(np.abs(emp - lat.cdf(pts))) < 5 * 0.5 / math.sqrt(x.size)


def test_paper_five_cdfs_agree_with_scipy():
    x = np.concatenate([np.linspace(-5, 260, 4001), np.arange(0, 202, 0.5)])
    mu = math.log(20) - 0.5**2 / 2
    c = stats.cauchy(18, 4)
    ref = [
        (C("deterministic", 20.0), (x >= 20).astype(float)),
        (C("gaussian", 20.0, std=6.0, discrete=True, low=1.0, high=200.0),
         np.where(x < 1, 0, np.where(x >= 200, 1, stats.norm(20, 6).cdf(np.floor(x) + 0.5)))),
        (C("lognormal", 20.0, sigma=0.5), stats.lognorm(s=0.5, scale=math.exp(mu)).cdf(x)),
        (C("pareto", 20.0, alpha=3.0), stats.pareto(b=3, scale=2 / 3 * 20).cdf(x)),
        (C("cauchy", None, median=18.0, scale=4.0, low=1.0, high=200.0),
         np.clip((c.cdf(x) - c.cdf(1)) / (c.cdf(200) - c.cdf(1)), 0, 1)),
    ]
    for conf, want in ref:
        np.testing.assert_allclose(build_latency(conf).cdf(x), want, atol=1e-12, rtol=0, err_msg=conf.kind)


def test_quantile_edges_and_shapes():
    lat = build_latency(C("lognormal", 20.0, sigma=0.5, low=3.0, high=90.0))
    assert lat.quantile(0.0) == 3.0 and lat.quantile(1.0) == 90.0
    assert np.isnan(lat.quantile(1.5)) and np.isnan(lat.quantile(-0.1))
    assert lat.quantile(np.full((2, 3), 0.5)).shape == (2, 3)
    assert lat.cdf(np.zeros((4, 1))).shape == (4, 1)
    assert build_latency(C("exponential", 20.0)).quantile(1.0) == INF


# ----------------------------------------------------------------------------
# Bounds, the paper's five distributions, the Cauchy.


@pytest.mark.parametrize("name", list(CASES))
def test_samples_inside_bounds(name, draws):
    low, high = bounds(CASES[name].conf)
    x = draws[name]
    assert x.dtype == np.float64 and np.all(np.isfinite(x))
    assert x.min() >= low and x.max() <= high
    if CASES[name].conf.discrete:
        assert np.all((x == np.rint(x)) | (x == low) | (x == high))


def test_truncated_cauchy_has_no_atoms_at_the_bounds(draws):
    # Clipping would pile ~7.4% of the mass on 1 and ~0.7% on 200; truncation piles none.
    x = draws["cauchy_paper"]
    assert x.min() >= 1 and x.max() <= 200
    assert np.mean(x == 1.0) == 0 and np.mean(x == 200.0) == 0
    assert np.mean(x < 1.5) == pytest.approx(build_latency(CASES["cauchy_paper"].conf).cdf(1.5), abs=5e-3)


def test_truncated_cauchy_agrees_with_scipy_truncate():
    # scipy.stats.truncate (scipy >= 1.15) as an independent implementation of the
    # same law on random windows, near and far from the location. racsim keeps its
    # closed forms because they are more exact: against a 40-digit mpmath reference on
    # these windows its cdf is within 2.2e-16 where truncate's is within 1.5e-9; on the
    # paper's window its quantiles are within 4.5e-15 (truncate: 1.4e-14) and its mean
    # exact to the last bit (truncate's quadrature: 2.7e-15). Hence the tolerances.
    rng = np.random.default_rng(11)
    cauchy = stats.make_distribution(stats.cauchy)
    for _ in range(20):
        loc, scale = rng.normal(20, 30), rng.uniform(0.2, 10)
        low = rng.uniform(0, 50)
        high = low + rng.uniform(1, 500)
        conf = LatencyConf(kind="cauchy", mean=None, median=loc, scale=scale, low=low, high=high)
        ours = build_latency(conf)
        ref = stats.truncate(cauchy() * scale + loc, low, high)
        x = np.linspace(low, high, 33)
        q = np.linspace(0.01, 0.99, 33)
        np.testing.assert_allclose(ours.cdf(x), ref.cdf(x), rtol=0, atol=1e-8)
        np.testing.assert_allclose(ours.quantile(q), ref.icdf(q), rtol=1e-8)
        assert ours.mean() == pytest.approx(float(ref.mean()), rel=1e-9)


PAPER = {
    "deterministic": C("deterministic", 20.0),
    "gaussian": C("gaussian", 20.0, std=6.0, discrete=True, low=1.0, high=200.0),
    "lognormal": C("lognormal", 20.0, sigma=0.5),
    "pareto": C("pareto", 20.0, alpha=3.0),
}


@pytest.mark.parametrize("kind", list(PAPER))
def test_paper_distributions_matched_at_mean_20(kind):
    assert build_latency(PAPER[kind]).mean() == pytest.approx(20.0, rel=0.01)


def test_paper_pareto_x_m_is_two_thirds_of_the_mean():
    lat = build_latency(PAPER["pareto"])
    assert float(lat.quantile(0.0)) == pytest.approx(40 / 3, rel=1e-12)
    assert float(lat.cdf(40 / 3 - 1e-9)) == 0.0


def test_paper_cauchy_realised_mean():
    """Cauchy(18, 4) on [1, 200]: truncated mean 21.246, clipped mean 21.007.

    The paper reports a realised mean of about 21.0 (a 5% shift). That is the
    *clipped* reading (mass piled on 1 and 200); the truncated (conditioned)
    reading, which racsim implements, gives 21.25 (a 6.2% shift).
    """
    lat = build_latency(C("cauchy", None, median=18.0, scale=4.0, low=1.0, high=200.0))
    raw = lambda x: 1.0 / (math.pi * 4 * (1 + ((x - 18) / 4) ** 2))  # noqa: E731
    q = lambda f, a, b: integrate.quad(f, a, b, epsabs=0, epsrel=1e-13, limit=500, points=[18.0])[0]  # noqa: E731
    mass, first = q(raw, 1, 200), q(lambda x: x * raw(x), 1, 200)
    truncated = first / mass
    q_inf = lambda a, b: integrate.quad(raw, a, b, epsabs=0, epsrel=1e-13)[0]  # noqa: E731
    clipped = 1.0 * q_inf(-INF, 1) + 200.0 * q_inf(200, INF) + first
    assert lat.mean() == pytest.approx(truncated, rel=1e-12)
    assert cauchy_truncated_mean(18, 4, 1, 200) == pytest.approx(truncated, rel=1e-12)
    assert 21.24 < truncated < 21.25 and 21.00 < clipped < 21.01
    assert abs(clipped - 21.0) < 0.01 and abs(truncated - 21.0) > 0.2  # the paper's 21.0 is the clipped reading


@pytest.mark.parametrize("target", [20.0, 12.0, 100.0, 150.0])
def test_cauchy_location_solved_for_mean(target):
    conf = C("cauchy", target, median=None, scale=4.0, low=1.0, high=200.0)
    lat = build_latency(conf)
    assert lat.mean() == pytest.approx(target, abs=1e-9)
    loc = solve_cauchy_location(target, 4.0, 1.0, 200.0)
    raw = lambda x: 1.0 / (1 + ((x - loc) / 4) ** 2)  # noqa: E731
    pts = [loc] if 1 < loc < 200 else None
    num = integrate.quad(lambda x: x * raw(x), 1, 200, epsabs=0, epsrel=1e-13, limit=500, points=pts)[0]
    den = integrate.quad(raw, 1, 200, epsabs=0, epsrel=1e-13, limit=500, points=pts)[0]
    assert num / den == pytest.approx(target, abs=1e-9)
    assert abs(loc - target) < 10  # the root near the window, not the far one
    x = lat.sample(np.random.default_rng(5), 200_000)
    assert abs(x.mean() - target) < 5 * x.std() / math.sqrt(x.size)


def test_cauchy_unreachable_mean_is_a_config_error():
    # On [1, 200] with scale 4 the truncated mean never drops below about 10.6.
    with pytest.raises(ConfigError, match=r"pipeline\.channels\.j\.latency\.mean"):
        build_latency(C("cauchy", 5.0, median=None, scale=4.0, low=1.0, high=200.0), "pipeline.channels.j.latency")


# ----------------------------------------------------------------------------
# Empirical.


def write_csv(path, text):
    path.write_text(text)
    return str(path)


def test_empirical_resamples_the_column(tmp_path):
    p = write_csv(tmp_path / "lat.csv", "name,lat\n" + "\n".join(f"r{i},{v}" for i, v in enumerate([1, 2, 2, 5, 10])))
    lat = build_latency(C("empirical", None, path=p, column="lat"))
    assert lat.mean() == pytest.approx(4.0, rel=1e-15)
    x = lat.sample(np.random.default_rng(3), N)
    assert set(np.unique(x)) == {1.0, 2.0, 5.0, 10.0}
    for v, share in [(1, 0.2), (2, 0.4), (5, 0.2), (10, 0.2)]:
        assert abs(np.mean(x == v) - share) < 5 * math.sqrt(share * (1 - share) / N)
    np.testing.assert_array_equal(lat.cdf([0.5, 1, 1.5, 2, 4.9, 5, 10, 11]), [0, .2, .2, .6, .6, .8, 1, 1])
    np.testing.assert_array_equal(lat.quantile([0, 0.2, 0.2000001, 0.6, 0.61, 0.8, 1.0]), [1, 1, 2, 2, 5, 5, 10])


def test_empirical_rescaled_to_mean_and_relative_path(tmp_path, monkeypatch):
    vals = np.random.default_rng(9).gamma(2.0, 3.0, 500)
    (tmp_path / "svc.csv").write_text("t\n" + "\n".join(repr(float(v)) for v in vals))
    monkeypatch.chdir(tmp_path)
    lat = build_latency(C("empirical", 30.0, path="svc.csv", column="t"))
    assert lat.mean() == pytest.approx(30.0, rel=1e-12)
    x = lat.sample(np.random.default_rng(4), N)
    assert abs(x.mean() - 30.0) < 5 * x.std() / math.sqrt(N)
    assert np.allclose(np.unique(x), np.unique(vals * 30.0 / vals.mean()))
    clipped = build_latency(C("empirical", 30.0, path="svc.csv", column="t", discrete=True, low=10.0, high=60.0))
    want = np.clip(np.rint(vals * 30.0 / vals.mean()), 10, 60)
    assert clipped.mean() == pytest.approx(want.mean(), rel=1e-12)


BAD_CSV = {
    "missing file": (None, "path"),
    "missing column": ("other\n1\n2\n", "column"),
    "text column": ("lat\n1\nfast\n3\n", "column"),
    "negative value": ("lat\n1\n-2\n3\n", "column"),
    "nan value": ("lat,b\n1,0\n,0\n3,0\n", "column"),
    "empty column": ("lat\n", "column"),
    "empty file": ("", "path"),
}


@pytest.mark.parametrize("case", list(BAD_CSV))
def test_empirical_bad_input_names_the_key(case, tmp_path):
    text, field = BAD_CSV[case]
    p = tmp_path / "x.csv"
    if text is not None:
        p.write_text(text)
    key = "pipeline.channels.judge.latency"
    with pytest.raises(ConfigError, match=re.escape(f"{key}.{field} =")):
        build_latency(C("empirical", None, path=str(p), column="lat"), key)


def _with_comments(rows, rng, header):
    """The file's lines (``#`` comments and blanks strewn between the rows) and each row's line number."""
    lines, at = (["# measured on the judge, 2026"] if rng.random() < 0.5 else []) + ([header] if header else []), []
    for r in rows:
        while rng.random() < 0.3:
            lines.append(rng.choice(["", "# a comment, 1.5", "   "]))
        lines.append(r)
        at.append(len(lines))  # 1-based: the line just appended
    return "\n".join(lines) + "\n", at


@pytest.mark.parametrize("seed", range(6))
def test_empirical_reads_comments_and_an_optional_header(tmp_path, seed):
    """A header row is optional for one column, '#' lines and blanks are skipped, names are stripped."""
    rng = np.random.default_rng(seed)
    values = np.round(rng.lognormal(2, 0.5, 12), 3)
    header = [None, "lat", " lat "][seed % 3]
    text, _ = _with_comments([repr(float(v)) for v in values], rng, header)
    p = write_csv(tmp_path / "d.csv", text)
    lat = build_latency(C("empirical", None, path=p, column="lat"))
    assert np.array_equal(np.sort(np.unique(lat.sample(np.random.default_rng(0), 4000))), np.unique(values))


@pytest.mark.parametrize("seed", range(8))
def test_a_bad_value_is_named_by_its_line(tmp_path, seed):
    rng = np.random.default_rng(seed)
    rows = [repr(float(v)) for v in rng.uniform(1, 5, 10)]
    bad = int(rng.integers(len(rows)))
    rows[bad] = ["nan", "-3.5", "NaN", "inf"][seed % 4]  # (an empty line is a blank, skipped, not a value)
    header = "lat" if seed % 2 else None
    text, at = _with_comments(rows, rng, header)
    p = write_csv(tmp_path / "d.csv", text)
    with pytest.raises(ConfigError) as info:
        build_latency(C("empirical", None, path=p, column="lat"), "k")
    assert f"on line {at[bad]} of {p}" in str(info.value) and info.value.key == "k.column"


def test_several_columns_need_a_header(tmp_path):
    p = write_csv(tmp_path / "d.csv", "1,2\n3,4\n")
    with pytest.raises(ConfigError, match=r"k\.path = .*a header row naming its 2 columns"):
        build_latency(C("empirical", None, path=p, column="lat"), "k")


def test_empirical_all_zero_column_cannot_be_rescaled(tmp_path):
    p = write_csv(tmp_path / "z.csv", "lat\n0\n0\n")
    with pytest.raises(ConfigError, match=r"k\.mean"):
        build_latency(C("empirical", 3.0, path=p, column="lat"), "k")
    assert build_latency(C("empirical", None, path=p, column="lat"), "k").mean() == 0.0


# ----------------------------------------------------------------------------
# Config errors, reproducibility, misc.


@pytest.mark.parametrize("conf,field", [
    (C("lognormal", -1.0), "mean"),
    (C("gaussian", 20.0, std=-1.0), "std"),
    (C("pareto", 20.0, alpha=1.0), "alpha"),
    (C("pareto", 20.0, alpha=0.5), "alpha"),
    (C("lognormal", 20.0, sigma=0.0), "sigma"),
    (C("lognormal", 20.0, sigma=-0.5), "sigma"),
    (C("exponential", 20.0, low=5.0, high=5.0), "high"),
    (C("exponential", 20.0, low=9.0, high=5.0), "high"),
    (C("exponential", 20.0, low=-1.0), "low"),
    (C("weibull", 20.0), "kind"),
    (C("cauchy", 20.0, median=18.0), "low"),
    (C("cauchy", None, median=None, low=1.0, high=200.0), "median"),
    (C("cauchy", 20.0, scale=0.0, low=1.0, high=200.0), "scale"),
    (C("lognormal", None), "mean"),
])
def test_bad_config_names_the_key(conf, field):
    with pytest.raises(ConfigError, match=rf"^pipeline\.generate\.{field} "):
        build_latency(conf, "pipeline.generate")


@pytest.mark.parametrize("name", list(CASES))
def test_same_seed_same_draws(name):
    lat = build_latency(CASES[name].conf)
    a = lat.sample(np.random.default_rng(77), 1000)
    b = lat.sample(np.random.default_rng(77), 1000)
    np.testing.assert_array_equal(a, b)
    if not name.startswith("det"):
        assert not np.array_equal(a, lat.sample(np.random.default_rng(78), 1000))


@pytest.mark.parametrize("name", list(CASES))
def test_shapes_and_describe(name):
    lat = build_latency(CASES[name].conf)
    rng = np.random.default_rng(0)
    assert lat.sample(rng, (3, 4)).shape == (3, 4)
    assert lat.sample(rng, 0).shape == (0,)
    d = lat.describe()
    assert isinstance(d, str) and d and "\n" not in d
    assert d.startswith(CASES[name].conf.kind)


def test_describe_examples():
    assert build_latency(C("lognormal", 20.0, sigma=0.5, low=1.0, high=200.0)).describe() == (
        "lognormal(mu=2.871, sigma=0.5) clipped to [1, 200]")
    assert "truncated to [1, 200]" in build_latency(CASES["cauchy_paper"].conf).describe()
    assert "solved" in build_latency(C("cauchy", 20.0, scale=4.0, low=1.0, high=200.0)).describe()


def test_a_million_draws_are_fast():
    import time

    for case in (CASES["gauss_paper"], CASES["cauchy_paper"], CASES["pareto"]):
        lat = build_latency(case.conf)
        t = time.perf_counter()
        lat.sample(np.random.default_rng(0), 1_000_000)
        assert time.perf_counter() - t < 1.0


def test_zero_mean_kinds_are_point_masses():
    for kind in ("lognormal", "pareto", "exponential"):
        lat = build_latency(C(kind, 0.0, low=None))
        assert lat.mean() == 0.0 and np.all(lat.sample(np.random.default_rng(0), 10) == 0.0)
    assert build_latency(C("gaussian", 4.0, std=0.0, low=5.0)).mean() == 5.0


@pytest.mark.parametrize("prompt, response", [
    (LatencyConf(kind="lognormal", mean=150.0, sigma=0.5, low=1.0), LatencyConf(kind="lognormal", mean=300.0, sigma=0.6)),
    (LatencyConf(kind="gaussian", mean=3.0, std=4.0, discrete=True, low=0.0, high=6.0),
     LatencyConf(kind="deterministic", mean=0.4)),
    (LatencyConf(kind="uniform", mean=0.7, low=0.0, high=1.4), LatencyConf(kind="pareto", mean=40.0, alpha=1.5,
                                                                          discrete=True, high=90.0)),
    (LatencyConf(kind="deterministic", mean=0.0), LatencyConf(kind="exponential", mean=0.7)),
])
@pytest.mark.parametrize("size", [None, 7, (3, TOKEN_CHUNK + 5), (2, 0)])
def test_token_lengths_equal_the_obvious_formula(prompt, response, size):
    """TokenLengths.sample, settled a chunk at a time in place, equals rint(prompt) + rint(response),
    at least 1, of each law's own sample from the same stream (prompts first): over chunk
    boundaries, rounded and clipped laws, points, a scalar and an empty draw."""
    law = token_lengths(prompt, response, "rm")
    got = law.sample(np.random.default_rng(5), size)
    rng = np.random.default_rng(5)
    p, r = law.prompt.sample(rng, size), law.response.sample(rng, size)
    want = np.maximum(np.rint(p) + np.rint(r), 1.0)
    assert np.shape(got) == np.shape(want) and np.array_equal(got, want)
    assert np.all(got >= 1.0) and np.array_equal(got, np.rint(got))
