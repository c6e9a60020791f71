"""No NaN or inf reaches a results table without a clear error (issue 10): the final check
where tables are written (racsim.report.finite), against a slow loop oracle on random
tables, and through the command (one line, exit 2, nothing published)."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest

from racsim import cli
from racsim.errors import ConfigError
from helpers import unwritable_value as oracle
from racsim.report.finite import MAY_BE_NAN, check_finite, may_be_nan

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
    seen = {"refused": 0, "accepted": 0, "inf in a declared column": 0, "absent by mode": 0}
    for _ in range(400):
        df = random_table(rng)
        want = oracle(df)
        try:
            check_finite(df, "results")
        except ConfigError as ex:
            assert want is not None, df
            c, i = want
            assert ex.key == f"results column {c}" and f"corrector={df['corrector'].iloc[i]}" in str(ex), (ex, df)
            assert "\n" not in str(ex) and "likely knob: corrector." in str(ex)  # no settings given: the table's
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


def test_a_nan_in_a_run_stops_it_naming_column_and_row(tmp_path, monkeypatch, capsys):
    import racsim.analyses.dispatch as dispatch

    real = dispatch.run

    def broken(cfg, progress=None):
        res = real(cfg, progress)
        res.results.loc[res.results["corrector"] == "rac", "bias_exact"] = np.inf
        return res

    monkeypatch.setattr(dispatch, "run", broken)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.txt").write_text("mine")
    monkeypatch.setattr(sys, "argv", ["racsim", *TINY])
    with pytest.raises(SystemExit) as ex:
        cli.main()
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert ex.value.code == 2 and len(lines) == 1, err
    assert "results column bias_exact" in lines[0] and "corrector=rac" in lines[0] and "inf" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]  # nothing published, no folder left


def test_the_likely_knob_is_the_most_extreme_setting():
    from racsim.report.finite import extreme_setting

    text = "pipeline:\n  generate:\n    sigma: 1.0e+308\n  steps: 3\ncorrector:\n  alpha: 1.0e-20\nseed: 0\n"
    assert extreme_setting(text) == "pipeline.generate.sigma = 1e+308"
    assert extreme_setting("corrector:\n  alpha: 1.0e-20\n  tau_age: .inf\n") == "corrector.alpha = 1e-20"
    assert extreme_setting("seed: 0\nsteps: 100000\n") is None
    df = pd.DataFrame({"corrector": ["naive"], "bias_mc": [np.nan]})
    with pytest.raises(ConfigError) as ex:
        check_finite(df, "results", "corrector:\n  alpha: 1.0e+300\n")
    assert "likely knob: corrector.alpha = 1e+300" in str(ex.value)


def test_a_table_qualified_declaration_covers_that_table_only():
    import pandas as pd

    from racsim.report.finite import check_finite

    df = pd.DataFrame({"corrector": ["rac", "wait_for_slow"], "cost_per_1000_steps": [1.0, float("nan")]})
    check_finite(df, "autoscale")  # declared: a blocking corrector has no autoscaled cost
    with pytest.raises(ConfigError, match="channels column cost_per_1000_steps.*corrector=wait_for_slow"):
        check_finite(df, "channels")
