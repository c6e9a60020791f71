"""What a run prints fits a 120-column terminal (issue 27, point 3): every line of a capacity run
(under faults, with every target set so that the `fails` column is at its widest) and of an LM run,
on stdout and stderr; the columns left out are named, and kept in the files."""

from __future__ import annotations

import pandas as pd
import pytest

from helpers import main_in_process
from racsim.analyses.capacity import CapacityResult
from racsim.io import fmt
from racsim.report.capacity import FAILS_SHORT, terminal_curve
from racsim.report.tables import wrapped

WIDTH = 120
SMALL_CAPACITY = ["learner.trials=4", "learner.bootstrap=20", "pipeline.steps=30", "pipeline.warmup_steps=5",
                  "capacity.run_length=fixed", "capacity.resamples=20", "capacity.benchmark=false",
                  "output.plots=false", "capacity.counts=[1,4,8,12]"]
# every target, tight enough that some counts miss several of them at once
TARGETS = ["capacity.max_bias=1e-9", "capacity.max_bias_vs_naive=0.001", "capacity.max_step_s=1",
           "capacity.max_dropped=0", "capacity.max_sojourn_p95_s=0.1", "capacity.max_sojourn_p99_s=0.1",
           "capacity.max_delay_p95_steps=0"]


def _lines(code, out, err):
    assert code in (0, None), err
    lines = (out + err).splitlines()
    wide = [line for line in lines if len(line) > WIDTH]
    assert not wide, f"{len(wide)} lines over {WIDTH} columns, e.g. {wide[0]!r}"
    return out


@pytest.mark.parametrize("scenario,extra", [("capacity/judge_rm_faults", TARGETS), ("capacity/judge_rm_h100", [])])
def test_a_capacity_run_prints_at_most_120_columns(tmp_path, monkeypatch, capsys, scenario, extra):
    monkeypatch.chdir(tmp_path)
    out = _lines(*main_in_process(monkeypatch, capsys, [f"scenario={scenario}", *SMALL_CAPACITY, *extra,
                                                        f"hydra.run.dir={tmp_path / 'run'}"]))
    head = out.splitlines()[1].split()
    assert head[:3] == ["GPUs", "load", "steady"] and head[-1] == "fails"
    text = " ".join(out.split())
    assert ("up" in head or "Left out here: lost %, up %" in text) == (scenario == "capacity/judge_rm_faults")
    assert "in capacity.csv and summary.md" in text
    curve = pd.read_csv(tmp_path / "run" / "capacity.csv")
    for n in curve["count"].unique():  # one row per count on screen
        assert sum(line.split()[:1] == [str(n)] for line in out.splitlines()) == 1
    if extra:  # the fails column names what each count misses, targets by their figure
        rac = curve[curve.corrector == "rac"].assign(fails=lambda d: d.fails.fillna(""))
        row = rac.sort_values("fails", key=lambda f: f.str.len()).iloc[-1]
        shown = next(line for line in out.splitlines() if line.split()[:1] == [str(row["count"])]).split()[-1]
        assert shown == ",".join(FAILS_SHORT[k] for k in row.fails.split(", "))
        assert shown.count(",") >= 3
        for k in row.fails.split(", "):
            assert f"{FAILS_SHORT[k]} = capacity.{k}" in " ".join(out.split())
    summary = (tmp_path / "run" / "summary.md").read_text()
    assert "sojourn p99 (s)" in summary  # the file keeps every column
    if "availability" in curve:  # on a wide terminal the up column is the measured window's share (issue 41)
        res = CapacityResult(curve, "judge", "GPUs", "", None, pd.DataFrame(), {"corrector": "rac"})
        wide = terminal_curve(res, 10_000).splitlines()
        end = wide[0].index("up %") + len("up %")  # right-aligned under its header
        rows = {int(line.split()[0]): line[:end].split()[-1] for line in wide[1:] if line.split()[0].isdigit()}
        rac = curve[curve.corrector == "rac"].set_index("count")
        assert rows == {n: fmt(100 * rac.availability[n]) for n in rows} and len(rows) == rac.shape[0]
        assert rac.availability.nunique() > 1  # measured per count, not the long-run figure repeated


@pytest.mark.parametrize("power", [False, True])
def test_an_lm_run_prints_at_most_120_columns(tmp_path, monkeypatch, capsys, power):
    """A plain LM run, and a power study (lm/ranking: the seed rule's lines at each stage)."""
    monkeypatch.chdir(tmp_path)
    which = ["scenario=lm/ranking", "learner.lm.max_seeds=8", "learner.lm.pilot_seeds=3"] if power else ["learner=lm", "learner.lm.seeds=2"]
    out = _lines(*main_in_process(monkeypatch, capsys, [*which, "learner.lm.policy=bandit", "pipeline.steps=8",
                                                        "pipeline.warmup_steps=2", "output.plots=false",
                                                        f"hydra.run.dir={tmp_path / 'run'}"]))
    assert "rac vs " in out and "left out here:" in out
    assert ("seed rule on " in out) == power


def test_wrapped_breaks_only_long_lines_and_keeps_every_word():
    text = "\n".join(["short line", "word " * 60, "   a table   row  kept   as is"])
    got = wrapped(text, 40)
    assert got.splitlines()[0] == "short line" and got.splitlines()[-1] == "   a table   row  kept   as is"
    assert all(len(line) <= 40 for line in got.splitlines())
    assert got.split() == text.split()
    assert all(line.startswith("  word") for line in got.splitlines()[2:-1])


def test_the_time_section_says_what_each_timing_measures():
    """A search's wall-clock and its processes' summed seconds are told apart (both once read "runs",
    "search"); a timing without words keeps its key's name."""
    from racsim.report.tables import time_section

    lines = time_section({"runs_s": 12.5, "search_s": 8.25, "other_s": 1.0}, "; tail")
    assert lines == ["## Time", "", "counts simulated (summed over processes) 12.50 s, search (wall-clock) 8.25 s, "
                                    "other 1.00 s; tail", ""]
