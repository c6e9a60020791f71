"""The paper suite end to end: every paper scenario in one multirun (fast mode),
then the comparison tables (racsim.report.paper.comparison_tables, the frames
report.md renders) checked against the paper's numbers and what the theory
guarantees."""

import fcntl
import json
import os
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import golden
import pytest

from racsim.learner.theory import kl_crossover
from racsim.report.paper import (
    COLUMNS,
    SECTIONS,
    _ratio_ci,
    comparison_tables,
    paper_report,
    paper_sections,
    paper_values,
)

SCENARIOS = ["k_sweep", "baselines_k2", "knob_ablation_k2", "cross_topology", "heavy_tail", "mdp_scaling",
             "slack_sweep", "identity_kernel", "tv_bound", "advantage_probe"]


LONG = pytest.mark.long  # the suite's one multirun takes minutes: the long stage (-m long)


# Once per test session, whichever worker asks first: the others wait on a lock and read its folder (the
# session's temporary root, shared by pytest-xdist's workers). Not by an xdist_group mark: under
# pytest 9.2 and xdist 3.8 it did not keep these tests on one worker, and the suite ran on both at once.
# On the golden runs' CPU profile, with every job's tables written, so that the jobs are compared with
# the golden digests of the same scenarios (tests/golden.py SUITE_RUNS) rather than run twice.
@pytest.fixture(scope="session")
def suite(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the session's, not the user's
    out, done = root / "paper_suite", root / "paper_suite.done"
    with open(root / "paper_suite.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_file():
            out.mkdir(exist_ok=True)
            cmd = [sys.executable, "-m", "racsim", "-m", "scenario=" + ",".join(f"paper/{s}" for s in SCENARIOS),
                   "study.fast=true", "output.plots=false", "output.progress=false", "output.job_files=full",
                   f"hydra.sweep.dir={out}"]
            ran = subprocess.run(cmd, cwd=out, capture_output=True, text=True, timeout=900,
                                 env={**os.environ, **golden.PINNED})
            assert ran.returncode == 0, ran.stderr[-3000:]
            done.touch()
    return out


@LONG
def test_paper_jobs_reproduce_the_golden_tables(suite):
    recorded = json.loads(golden.DIGESTS.read_text())
    why = golden.unreachable(recorded)
    if why:
        pytest.skip(why)
    now = {f"paper/{s}": golden.digest_folder(suite / str(i)) for i, s in enumerate(SCENARIOS)}
    assert golden.compare({n: recorded["runs"][n] for n in now}, now, raw=False) == []


@pytest.fixture(scope="module")
def tables(suite):
    return comparison_tables(pd.read_parquet(suite / "results.parquet"))


def _metric(frame: pd.DataFrame, metric: str) -> pd.Series:
    return frame[frame.metric == metric].racsim


def test_prose_and_computation_cover_the_same_sections():
    prose = paper_sections()
    assert list(prose["sections"]) == list(SECTIONS)  # the data file in report order
    assert set(SECTIONS) <= set(paper_values().study)
    for study, sec in prose["sections"].items():
        assert sec["title"].strip() and sec["reading"].strip(), study
        assert "{" not in sec["title"], study
    files = [s["figure"]["file"] for s in prose["sections"].values() if s.get("figure")]
    assert len(files) == len(set(files)) and all(f.endswith(".png") for f in files)


def test_ratio_ci_resamples_numerator_and_denominator_cells_together():
    rng = np.random.default_rng(0)
    den = np.array([0.001, 0.01, 0.1, 1.0, 10.0])
    # every cell's ratio is exactly 2: a paired resample cannot move it, an unpaired one would
    assert _ratio_ci(2 * den, den, rng) == (2.0, 2.0, 2.0)
    assert _ratio_ci(den, den, rng) == (1.0, 1.0, 1.0)  # all alike: the interval is the point
    point, lo, hi = _ratio_ci(np.array([1.0, 3.0, 2.0, 5.0]), np.array([1.0, 1.0, 2.0, 1.0]), rng)
    assert point == 11.0 / 5.0 and lo < point < hi
    point, lo, hi = _ratio_ci(np.array([3.0]), np.array([1.5]), rng)  # one cell: no interval
    assert point == 2.0 and np.isnan(lo) and np.isnan(hi)


@LONG
def test_every_paper_section_has_a_comparison_table_beside_the_paper(tables):
    assert set(tables) == set(SECTIONS)
    paper = paper_values().set_index(["study", "row", "metric"])
    for study, t in tables.items():
        assert len(t) >= 1, study
        assert list(t.columns[:len(COLUMNS)]) == COLUMNS, study
        assert t.racsim.notna().all(), study
        # the paper's figure and CI are paper_values.csv's (NaN where the paper has none)
        keys = list(zip([study] * len(t), t.row, t.metric))
        want = paper.reindex(keys)
        for col, src in (("paper", "value"), ("paper_ci_lo", "ci_lo"), ("paper_ci_hi", "ci_hi")):
            np.testing.assert_array_equal(t[col].to_numpy(float), want[src].to_numpy(float), err_msg=f"{study} {col}")
        # racsim / paper wherever the paper has a non-zero figure, and nothing elsewhere
        has = np.isfinite(t.paper) & (t.paper != 0)
        np.testing.assert_array_equal(t.ratio[has].to_numpy(float), (t.racsim[has] / t.paper[has]).to_numpy(float))
        assert t.ratio[~has].isna().all(), study
        assert "paper_in_ci" not in t, study  # judged only against the paper's own procedure (static)
        ci = np.isfinite(t.ci_lo)
        assert (t.ci_lo[ci] <= t.ci_hi[ci]).all() and np.isfinite(t.ci_hi[ci]).all(), study
    # the ratio CIs come from a bootstrap over cells (they are not points)
    assert (tables["table1_top"].pipe(lambda t: t[t.metric == "reduction"]).ci_lo.notna()).all()


@LONG
def test_comparison_tables_check_what_theory_guarantees(tables):
    assert _metric(tables["identity"], "linf").tolist() == [0.0]  # bit-identical estimates
    slack = tables["appendix_b"]
    # pointwise ratio exact / predicted: the prediction comes from the configured kernel and the
    # exact figure from the delays drawn from it, so the two agree up to the draws' sampling error
    # (not by construction: a wrong kernel or weight moves it); per channel it is one number (std ~0)
    assert 0 < abs(_metric(slack, "ratio_mean").item() - 1.0) < 0.05
    assert _metric(slack, "ratio_std").item() < 1e-9
    tv = tables["prop22"]
    assert _metric(tv, "violations").item() == 0  # no violation of the bound
    assert abs(_metric(tv, "kl_star").item() - 1.6259) < 1e-4  # KL*
    assert _metric(tv, "kl_star").item() == kl_crossover()
    per_kl = tv[tv.metric == "-"]
    assert len(per_kl) >= 1 and (per_kl.racsim <= per_kl.bound).all()  # TV <= the bound at every KL
    # the saturated kernel (eta = 0) leaves RAC with the synchronous oracle's bias only
    k = tables["table1_top"]
    red = k[k.metric == "reduction"]
    assert red.eta.notna().all()
    sat, plain = red[red.sat.astype(bool)], red[~red.sat.astype(bool)]
    assert len(sat) >= 1 and (sat.eta.abs() < 1e-12).all()  # condition (R): no slack left
    # the age kernel's slack 1 - exp(-Delta / tau_age) only: no end-of-run loss in the steady state
    assert len(plain) >= 1 and ((plain.eta > 0) & (plain.eta < 0.01)).all()


@LONG
def test_report_renders_every_section_from_its_table(suite, tables):
    text = (suite / "report.md").read_text()
    prose = paper_sections()
    assert f"## {prose['heading']}" in text
    body = text.split(f"## {prose['heading']}", 1)[1]
    rendered = {p.splitlines()[0].strip(): p for p in re.split(r"^### ", body, flags=re.M)[1:]}
    assert set(rendered) == {s["title"] for s in prose["sections"].values()}
    for study, sec in prose["sections"].items():
        lines = [ln for ln in rendered[sec["title"]].splitlines() if ln.startswith("|")]
        assert len(lines) - 2 == len(tables[study]), study  # header and rule, then one line per row
        assert " ".join(sec["reading"].split()) in " ".join(rendered[sec["title"]].split()), study


@LONG
def test_sweep_aggregate_has_one_row_per_job_and_corrector(suite):
    df = pd.read_parquet(suite / "results.parquet")
    assert set(df["study"]) >= set(SECTIONS)
    probe = pd.read_parquet(next(suite.glob("*/identity.parquet")))
    assert probe["linf_rac_vs_vtrace"].iloc[0] == 0.0


@LONG
def test_results_from_an_older_racsim_skip_a_section_instead_of_crashing(suite, tmp_path):
    df = pd.read_parquet(suite / "results.parquet").drop(columns=["bias_vs_sync_exact"])
    text = paper_report(df, tmp_path)
    assert "section skipped" in text and "bias_vs_sync_exact" in text
    assert "### Proposition 2.2: TV bound" in text  # sections that do not need the column still render
    tables = comparison_tables(df)
    assert "table1_top" not in tables and "prop22" in tables
