"""No NaN or inf reaches a results table without a clear account (issues 10, 20, 21): the
final check where tables are written (racsim.report.finite), against a slow loop oracle on
random tables, and through the command: a value undefined by construction is written and
explained in summary.md; any other fails the run in one line, exit 1, after its files are
written (a guard never throws finished work away)."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest

from racsim.app import cli
from racsim.errors import ConfigError
from helpers import unwritable_value as oracle, messages
from racsim.report.finite import MAY_BE_NAN, failure, may_be_nan, non_finite, undefined_notes

TINY = ["learner.trials=4", "learner.bootstrap=0", "learner.train.enabled=false", "pipeline.steps=3",
        "output.plots=false", "output.progress=false"]


COLUMNS = ["bias_mc", "bias_theorem", "eta_ch3", "delay_p95_steps", "utilisation", "reduction_rep_lo", "wallclock_s"]


def random_table(rng):
    n = int(rng.integers(1, 7))
    df = pd.DataFrame({"corrector": [f"c{i}" for i in range(n)]})
    if rng.random() < 0.5:
        df["mode"] = rng.choice(["pipeline", "static"], n)
    for c in rng.choice(COLUMNS, int(rng.integers(1, len(COLUMNS))), replace=False):
        x = rng.normal(size=n)
        kind = rng.integers(0, 4)
        if kind == 1:
            x[rng.random(n) < 0.4] = np.nan
        elif kind == 2:
            x[rng.random(n) < 0.3] = rng.choice([np.inf, -np.inf])
        elif kind == 3 and "mode" in df:  # the structure of a pipeline + static table
            x[(df["mode"] == rng.choice(["pipeline", "static"])).to_numpy()] = np.nan
        df[c] = x
    df["n"] = np.arange(n)  # an integer column: always finite
    return df


def test_the_check_agrees_with_the_loop_oracle_on_random_tables():
    rng = np.random.default_rng(7)
    seen = {"refused": 0, "accepted": 0, "inf in a declared column": 0, "absent by mode": 0, "explained": 0}
    for _ in range(400):
        df = random_table(rng)
        want = oracle(df)
        found = non_finite(df, "results")
        notes = undefined_notes(df, "results")
        declared_nan = [c for c in df.columns if may_be_nan(c) and df[c].isna().any()]
        assert [n.split("`")[1] for n in notes] == [f"results.{c}" for c in declared_nan], (notes, df)
        seen["explained"] += bool(notes)
        if found:
            assert want is not None, df
            c, i = want
            first = found[0]
            assert first.column == c and f"corrector={df['corrector'].iloc[i]}" in first.rows[0], (first, df)
            bad = [u.column for u in found]
            assert len(set(bad)) == len(bad) and all(u.total == len(df) for u in found)
            for u in found:  # every row named: inf anywhere, NaN where the oracle refuses the table without it
                assert len(u.rows) >= int(np.isinf(df[u.column].to_numpy(dtype=float)).sum())
            ex = failure(found, "", "kept")
            assert ex.key == f"results column {c}" and "\n" not in str(ex) and "likely knob: corrector." in str(ex)
            assert str(ex).endswith("; kept") and f"results column {found[0].column}" in str(ex)
            assert all(f"results.{u.column}" in str(ex) for u in found[1:4])  # the others by name, three at most
            assert (f"and {len(found) - 4} more" in str(ex)) == (len(found) > 4)
            seen["refused"] += 1
            seen["inf in a declared column"] += bool(may_be_nan(c))
            continue
        assert want is None, (want, df)
        seen["accepted"] += 1
        if "mode" in df and any(df[c].isna().any() and not may_be_nan(c) for c in df.columns):
            seen["absent by mode"] += 1
    assert all(v >= 5 for v in seen.values()), seen


def test_every_declared_column_has_a_reason_and_matches_its_family():
    assert all(len(why) > 20 for why in MAY_BE_NAN.values())
    assert may_be_nan("eta_ch12") and may_be_nan("delay_p50_steps") and may_be_nan("theorem_ratio_std")
    for must in ("bias_mc", "bias_exact", "reduction_exact", "wallclock_ratio", "mc_se", "seconds"):
        assert may_be_nan(must) is None


def test_a_non_finite_value_fails_the_run_after_its_files_are_written(tmp_path, monkeypatch, capsys):
    import json

    import racsim.analyses.dispatch as dispatch

    real = dispatch.run

    def broken(cfg, progress=None):
        res = real(cfg, progress)
        res.results.loc[res.results["corrector"].isin(["rac", "naive"]), "bias_exact"] = np.inf
        return res

    monkeypatch.setattr(dispatch, "run", broken)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.txt").write_text("mine")
    monkeypatch.setattr(sys, "argv", ["racsim", *TINY, "hydra.run.dir=out"])
    with pytest.raises(SystemExit) as ex:
        cli.main()
    err = capsys.readouterr().err
    lines = messages(err)
    assert ex.value.code == 1 and len(lines) == 1 and len(lines[0]) < 600, err  # 1: failed after writing
    assert "results column bias_exact = inf" in lines[0] and "(2 of" in lines[0]
    assert "corrector=naive, K=2; mode=pipeline, corrector=rac, K=2 (2 of" in lines[0]
    assert "everything computed is written to" in lines[0] and "Traceback" not in err
    assert (tmp_path / "keep.txt").read_text() == "mine"
    out = tmp_path / "out"
    written = pd.read_csv(out / "results.csv")  # the finished run, kept as computed
    assert np.isinf(written.set_index("corrector").loc[["naive", "rac"], "bias_exact"]).all()
    assert np.isfinite(written.set_index("corrector").drop(index=["naive", "rac"])["bias_exact"]).all()
    summary = (out / "summary.md").read_text()
    assert "## Non-finite values where a number must be (the run failed)" in summary
    assert "`results.bias_exact` = inf: mode=pipeline, corrector=naive, K=2; mode=pipeline, corrector=rac" in summary
    assert not (out / "done.json").exists() and not (out / ".racsim.lock").exists()  # failed, and released
    assert set(json.loads((out / ".racsim-files").read_text())) >= {"results.csv", "summary.md"}


def test_a_value_undefined_by_construction_is_written_and_explained(tmp_path, monkeypatch, capsys):
    import racsim.analyses.dispatch as dispatch

    real = dispatch.run

    def undefined(cfg, progress=None):
        res = real(cfg, progress)
        res.extra["lm_gradients"] = pd.DataFrame({"corrector": ["naive", "rac"], "cosine": [np.nan, 0.5]})
        return res

    monkeypatch.setattr(dispatch, "run", undefined)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["racsim", *TINY, "hydra.run.dir=out"])
    cli.main()
    out = tmp_path / "out"
    assert (out / "done.json").exists() and "error" not in capsys.readouterr().err
    assert pd.read_parquet(out / "lm_gradients.parquet")["cosine"].isna().tolist() == [True, False]
    summary = (out / "summary.md").read_text()
    assert "## Undefined values (NaN by construction)" in summary
    assert f"`lm_gradients.cosine`: NaN in 1 of 2 rows: {may_be_nan('cosine', 'lm_gradients')}" in summary


def test_a_writer_without_a_collector_fails_once_everything_is_written(tmp_path):
    from racsim.analyses.result import RunResult
    from racsim.report.writers import write_outputs

    res = RunResult(results=pd.DataFrame({"scenario": ["s"], "study": ["x"], "value": [np.nan]}))
    with pytest.raises(ConfigError, match="results column value = nan.*row 0 .1 of 1 rows.*written to"):
        write_outputs(tmp_path, res, "seed: 0\n", plots=False)
    assert {"results.csv", "results.parquet", "summary.md", "config.yaml"} <= {p.name for p in tmp_path.iterdir()}
    found: list = []
    write_outputs(tmp_path / "b", res, "seed: 0\n", plots=False, found=found)
    assert [(u.table, u.column, u.rows) for u in found] == [("results", "value", ("row 0",))]


def test_the_likely_knob_is_the_most_extreme_setting():
    from racsim.report.finite import extreme_setting

    text = "pipeline:\n  generate:\n    sigma: 1.0e+308\n  steps: 3\ncorrector:\n  alpha: 1.0e-20\nseed: 0\n"
    assert extreme_setting(text) == "pipeline.generate.sigma = 1e+308"
    assert extreme_setting("corrector:\n  alpha: 1.0e-20\n  tau_age: .inf\n") == "corrector.alpha = 1e-20"
    assert extreme_setting("seed: 0\nsteps: 100000\n") is None
    df = pd.DataFrame({"corrector": ["naive"], "bias_mc": [np.nan]})
    ex = failure(non_finite(df, "results"), "corrector:\n  alpha: 1.0e+300\n", "kept")
    assert "likely knob: corrector.alpha = 1e+300" in str(ex)


def test_a_table_qualified_declaration_covers_that_table_only():
    df = pd.DataFrame({"corrector": ["rac", "wait_for_slow"], "cost_per_1000_steps": [1.0, float("nan")]})
    assert non_finite(df, "autoscale") == []  # declared: a blocking corrector has no autoscaled cost
    assert len(undefined_notes(df, "autoscale")) == 1 and undefined_notes(df, "channels") == []
    (u,) = non_finite(df, "channels")
    assert (u.column, u.rows) == ("cost_per_1000_steps", ("corrector=wait_for_slow",))
