"""What racsim prints fits a 120-column terminal (issue 27, point 3; issue 43, point 4): every line of a
capacity run (under faults, with every target set so that the `fails` column is at its widest) and of an
LM run, on stdout and stderr; the columns left out are named, and kept in the files. One rule
(racsim.errors.WIDTH, wrapped, say) serves every printed line: a sweep's gathered table, racsim-report's
and racsim-profile's lines, ``racsim --help`` and errors (an unknown scenario's)."""

from __future__ import annotations

import errno
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import main_in_process, messages
from racsim.analyses.capacity import CapacityResult
from racsim.errors import WIDTH as RULE, wrapped
from racsim.io import fmt
from racsim.report.aggregate import HEADERS, METRICS, aggregate, format_aggregate
from racsim.report.capacity import FAILS_SHORT, terminal_curve

WIDTH = 120
SMALL_CAPACITY = ["learner.trials=4", "learner.bootstrap=20", "pipeline.steps=30", "pipeline.warmup_steps=5",
                  "capacity.run_length=fixed", "capacity.resamples=20", "capacity.benchmark=false",
                  "output.plots=false", "capacity.counts=[1,4,8,12]"]
# every target, tight enough that some counts miss several of them at once
TARGETS = ["capacity.max_bias=1e-9", "capacity.max_bias_vs_naive=0.001", "capacity.max_step_s=1",
           "capacity.max_dropped=0", "capacity.max_sojourn_p95_s=0.1", "capacity.max_sojourn_p99_s=0.1",
           "capacity.max_delay_p95_steps=0"]


def _lines(code, out, err, expected=(0, None)):
    assert code in expected, err
    lines = (out + err).splitlines()
    wide = [line for line in lines if len(line) > WIDTH]
    assert not wide, f"{len(wide)} lines over {WIDTH} columns, e.g. {wide[0]!r}"
    return out


@pytest.mark.parametrize("scenario,extra", [pytest.param("capacity/judge_rm_faults", TARGETS, marks=pytest.mark.long),
                                            ("capacity/judge_rm_h100", [])])  # faults: 2.2 CPU s
@pytest.mark.long
def test_a_capacity_run_prints_at_most_120_columns(tmp_path, monkeypatch, capsys, scenario, extra):
    """Every target set at once: no count can meet max_bias=1e-9 (its figure does not fall with the count), so the
    plan ends infeasible, exit 3 (racsim.app.cli.EXIT_INFEASIBLE), after printing its curve and answer."""
    from racsim.app.cli import EXIT_INFEASIBLE

    monkeypatch.chdir(tmp_path)
    out = _lines(*main_in_process(monkeypatch, capsys, [f"scenario={scenario}", *SMALL_CAPACITY, *extra,
                                                        f"hydra.run.dir={tmp_path / 'run'}"]),
                 expected=(EXIT_INFEASIBLE,) if extra else (0, None))
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
    """A fixed seed count, and the seed rule's stages (lm/ranking: its verdicts and the rule's line)."""
    monkeypatch.chdir(tmp_path)
    which = (["scenario=lm/ranking", "learner.lm.max_seeds=8", "learner.lm.seeds=3"] if power
             else ["learner=lm", "learner.lm.seeds=2", "learner.lm.decide=[]"])
    out = _lines(*main_in_process(monkeypatch, capsys, [*which, "learner.lm.policy=bandit", "pipeline.steps=8",
                                                        "pipeline.warmup_steps=2", "output.plots=false",
                                                        f"hydra.run.dir={tmp_path / 'run'}"]))
    assert "rac vs " in out and "left out here:" in out
    assert ("seed rule (" in out) == power and ("seed count fixed" in out) != power


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


def _fits(text: str) -> list:
    lines = text.splitlines()
    wide = [line for line in lines if len(line) > WIDTH and len(line.split()) > 1]  # a lone word cannot break
    assert not wide, f"{len(wide)} lines over {WIDTH} columns, e.g. {wide[0]!r}"
    return lines


WORD = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 8), st.lists(WORD, min_size=1, max_size=40)), min_size=1, max_size=4),
       st.integers(40, 160))
def test_wrapped_fits_any_text_and_keeps_its_words(paragraphs, width):
    """Generated lines of words (some indented, some words long as a path): every line fits ``width``
    unless it is one word, no word is broken or lost, a continuation is indented deeper than its line."""
    text = "\n".join(" " * indent + " ".join(words) for indent, words in paragraphs)
    got = wrapped(text, width)
    assert RULE == WIDTH and got.split() == text.split()
    assert all(len(line) <= width or len(line.split()) == 1 for line in got.splitlines())
    for line in text.splitlines():
        indent = " " * (len(line) - len(line.lstrip(" ")))
        head, *more = wrapped(line, width).splitlines()
        assert head.startswith(indent) and all(m.startswith(indent + "  ") for m in more)


def test_help_fits():
    from racsim.app.guide import help_text

    _fits(help_text())


@settings(max_examples=60, deadline=None)
@given(st.text(st.characters(min_codepoint=97, max_codepoint=122) | st.sampled_from("/_"), min_size=1, max_size=200))
def test_an_unknown_scenario_or_option_fits(option):
    """The unknown-scenario error (once one 575-character line) and any group's, for generated names:
    every line fits, one message that starts with the key and names every allowed option."""
    from racsim.config.names import scenario_names, unknown_option

    for group in ("scenario", "learner", "corrector"):
        text = wrapped(f"racsim: error: {unknown_option(group, option)}")
        lines = _fits(text)
        assert len(messages(text)) == 1 and lines[0].startswith(f"racsim: error: {group}=")
    assert set(scenario_names()) <= set(" ".join(wrapped(unknown_option("scenario", option)).split())
                                        .replace(",", " ").split())


def test_the_command_prints_an_unknown_scenario_in_one_message(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = main_in_process(monkeypatch, capsys, ["scenario=paper/k_swep"])
    assert code == 2 and len(messages(err)) == 1 and "Did you mean paper/k_sweep or" in err
    _fits(out + err)


CELL_VALUE = st.one_of(st.integers(-10**9, 10**9), st.floats(-1e6, 1e6, allow_nan=False),
                       st.text(st.characters(min_codepoint=97, max_codepoint=122), min_size=1, max_size=24))


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.sampled_from(["corrector.tau_age", "pipeline.channels.judge.workers", "pipeline.steps",
                                 "learner.lm.policy", "capacity.sensitivity.spread"]), max_size=3, unique=True),
       st.lists(CELL_VALUE, min_size=1, max_size=3), st.sets(st.sampled_from(METRICS), min_size=1),
       st.randoms(use_true_random=False))
def test_a_sweeps_gathered_table_fits(axes, values, metrics, rnd):
    """A sweep's table (once 169 columns) for generated sweeps (racsim.report.aggregate's columns: each knob,
    corrector, n, each metric's mean and interval): each line fits, every row is there, the columns left out
    are named (aggregate.csv keeps them)."""
    rows = []
    for v in values:
        for corrector in ("naive", "wait_for_slow", "rac"):
            row = {**{f"override:{a}": v for a in axes}, "corrector": corrector, "n": rnd.randint(1, 20)}
            for m in metrics:
                mean, half = rnd.uniform(-1e5, 1e5), rnd.choice([0.0, float("nan"), rnd.uniform(0, 1e4)])
                row.update({m: mean, f"{m}_lo": mean - half, f"{m}_hi": mean + half})
            rows.append(row)
    agg = pd.DataFrame(rows)
    text = format_aggregate(agg, WIDTH)
    lines = _fits(text)
    table = lines[:next((i for i, ln in enumerate(lines) if ln.startswith("(to fit")), len(lines))]
    assert len(table) == len(agg) + 1  # the header, then every row
    shown, left = lines[0], " ".join(text.split()).partition("left out here:")[2]
    for m in metrics:
        assert HEADERS[m] in shown or HEADERS[m] in left
    assert format_aggregate(agg).count("\n") == len(agg)  # report.md: every column


def test_racsim_reports_lines_fit(tmp_path, monkeypatch, capsys):
    """racsim-report's lines (its "wrote" line was 231 columns): the files by folder, the table fitted."""
    from racsim.sweep import gather as G

    deep = tmp_path / ("a_rather_long_folder_name_" * 3) / "outputs" / "tau_sweep"
    written = [deep / n for n in ("results.parquet", "results.csv", "aggregate.parquet", "aggregate.csv",
                                  "sweep_corrector.tau_age.png", "report.md")]
    df = pd.DataFrame([{"job_dir": f"{i}", "override:corrector.tau_age": t, "seed": i, "corrector": c,
                        **{m: 0.1 * i + t for m in METRICS}}
                       for i in range(3) for t in (20, 1000) for c in ("naive", "rac", "rac_adaptive")])
    agg = aggregate(df, ["override:corrector.tau_age", "seed"])
    monkeypatch.setattr(G, "gather_and_write", lambda *a, **k: G.Gathered(df, agg, written))
    G.main([str(deep)])
    out = capsys.readouterr().out
    _fits(out)
    flat = " ".join(out.split())
    assert f"racsim-report: wrote into {deep}: results.parquet, results.csv" in flat and "left out here" in flat


def test_racsim_profiles_lines_fit(tmp_path, monkeypatch, capsys):
    """racsim-profile's lines (its check line was 171 columns), its rows measured by a stand-in."""
    from racsim.tools import profile as P

    rows = [{"batch_size": b, "seq_len": s, "seconds": 0.01 * b * s, "seconds_median": 0.011 * b * s,
             "seconds_max": 0.02 * b * s, "repeats": 3} for b in (1, 4) for s in (64, 256)]
    monkeypatch.setattr(P, "measure", lambda conf, log: (log("batch 1 x seq 64: 1 ms") or
                                                         {"device": "cpu (a long description of the device " * 3,
                                                          "dtype": "float32"}, rows))
    monkeypatch.setattr(P, "check_rows", lambda rows: (True, "times grow with batch and length; " * 6))
    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch") or type(sys)("torch"))
    monkeypatch.setitem(sys.modules, "transformers", sys.modules.get("transformers") or type(sys)("transformers"))
    out = tmp_path / ("a_long_folder_name_" * 4) / "rm.csv"
    P.main([f"out={out}"])
    _fits(capsys.readouterr().out)
    assert out.exists()


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES, errno.EROFS])
def test_a_full_disk_is_one_message_naming_the_folder(tmp_path, monkeypatch, capsys, code):
    """A plot or table that cannot be written (simulated: the writer raises OSError) ends the command in one
    message naming the folder and what to do (issue 43, point 12: once "pkg://racsim.conf: cannot be read"),
    exit 2, the user's file beside it kept; racsim.run raises a ConfigError naming ``out``."""
    import matplotlib.figure

    import racsim
    from racsim.errors import ConfigError

    def full(self, path, *a, **k):
        raise OSError(code, "simulated")  # as a full disk's write: no file named

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full)
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "keep.txt").write_text("the user's")
    small = ["learner.trials=4", "learner.bootstrap=20", "pipeline.steps=8", "pipeline.warmup_steps=2",
             "learner.train.enabled=false", "output.progress=false"]
    code_, out, err = main_in_process(monkeypatch, capsys, [*small, f"hydra.run.dir={run}"])
    lines = messages(err)
    assert code_ == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"racsim: error: cannot write ") and f"into {run} (simulated)" in lines[0]
    assert "hydra.run.dir=DIR" in lines[0] and "cannot be read" not in lines[0]
    assert (run / "keep.txt").read_text() == "the user's"
    _fits(out + err)
    with pytest.raises(ConfigError) as ex:
        racsim.run(overrides=small, out=tmp_path / "api")
    assert ex.value.key == "out" and f"into {tmp_path / 'api'}" in str(ex.value) and "out=" in str(ex.value)
