"""Generated odd sweeps under a launcher that runs its jobs in other processes (joblib): hypothesis
draws a few cells of odd values (NaN, inf, 1e308, negatives, text) for a handful of keys and data
files of odd content (text, empty, no column, absent), and runs ``racsim -m`` over them. Whatever the
cells: exit 0 (every job complete and gathered), 1 (the good jobs gathered; each failed one named once,
on the one stderr line that lists the failures) or 2 (one stderr line, nothing run, no folder left);
never a traceback on either stream. Small on purpose: each example is a whole sweep."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pandas as pd
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from helpers import messages
from racsim.sweep.markers import is_complete

pytestmark = pytest.mark.long  # a whole sweep per example, under joblib: the long stage (-m long)

SMALL = ["learner.trials=20", "learner.bootstrap=20", "learner.train.enabled=false", "pipeline.steps=8",
         "output.plots=false", "output.progress=false"]
LAT = "pipeline.channels.judge.latency"
JOBLIB = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
KEYS = ["seed", "corrector.tau_age", f"{LAT}.mean", "pipeline.batch_size", "learner.trials"]
VALUES = st.one_of(st.integers(min_value=-3, max_value=40).map(str),
                   st.floats(allow_nan=True, allow_infinity=True).map(repr),
                   st.sampled_from(["1e308", "-1e308", "5e-324", "abc", "null", "0", "2", "true"]))
CSV = {"numbers": "x\n1.0\n2.5\n", "text": "x\nfast\nslow\n", "empty": "", "header_only": "x\n",
       "other_column": "y\n1\n2\n", "negative": "x\n-1\n2\n", "absent": None}


@st.composite
def odd_sweeps(draw):
    """(overrides, the data files to write): two values of a key, two data files."""
    key = draw(st.sampled_from(KEYS))
    values = draw(st.lists(st.one_of(VALUES, st.sampled_from(["1", "3", "30"])), min_size=2, max_size=2, unique=True))
    files = draw(st.lists(st.sampled_from(sorted(CSV)), min_size=2, max_size=2, unique=True))
    return [f"{key}={','.join(values)}", f"{LAT}.path={','.join(f + '.csv' for f in files)}"], files


@settings(max_examples=3, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=odd_sweeps())
@example(case=(["seed=1,3", f"{LAT}.path=numbers.csv"], ["numbers"]))  # every job good: exit 0
@example(case=(["seed=1,3", f"{LAT}.path=numbers.csv,text.csv"], ["numbers", "text"]))  # two fail at run time
def test_generated_sweeps_under_joblib(tmp_path_factory, case):
    swept, files = case
    cwd = tmp_path_factory.mktemp("gen")
    for f in files:
        if CSV[f] is not None:
            (cwd / f"{f}.csv").write_text(CSV[f])
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.run([sys.executable, "-m", "racsim", "-m", *JOBLIB, *SMALL, f"{LAT}.kind=empirical",
                           f"{LAT}.column=x", *swept], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1, 2), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, (proc.stdout + proc.stderr)[-3000:]
    sweeps = list((cwd / "outputs").glob("*/multirun_*")) if (cwd / "outputs").is_dir() else []
    if proc.returncode == 2:
        errors = [ln for ln in messages(proc.stderr) if ln.startswith("racsim: error:")]
        assert len(errors) == 1, proc.stderr
        assert not sweeps and not list(cwd.rglob("done.json")), sweeps
        return
    assert len(sweeps) == 1
    jobs = sorted(int(d.name) for d in sweeps[0].iterdir() if d.name.isdigit())
    n = len(jobs)
    assert jobs == list(range(n)) and n in (2, 4), jobs
    complete = [j for j in jobs if is_complete(sweeps[0] / str(j))]
    failed = [ln for ln in messages(proc.stderr) if "jobs failed" in ln]
    if proc.returncode == 0:
        assert complete == jobs and not failed
    else:
        assert len(failed) == 1 and failed[0].startswith(f"racsim: sweep: {n - len(complete)} of {n} jobs failed")
        named = re.findall(r"job (\d+) \(", failed[0])
        assert sorted(map(int, named)) == sorted(set(jobs) - set(complete)), (failed, complete)
    if complete:  # the good jobs are gathered, and only they
        assert sorted(map(int, pd.read_parquet(sweeps[0] / "results.parquet")["job_dir"].unique())) == complete
