"""Issue 43's last traps at the front door: a value of the wrong type refused in its range rule's words,
a misspelt data file's did-you-mean, refusals that name the knob the user set (an LM run's seeds, a
capacity search's own resamples before its sensitivity variants), a CSV of millions of columns read for
its one column, and documented examples that write into outputs/, not the folder they run from."""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from racsim.app import cli
from racsim.config.defaults import compose_config
from racsim.config.spec import scenario
from racsim.config.validate import check_limits, memory_error, validate
from racsim.config.validate.common import need_file
from racsim.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def _refusal(*overrides: str) -> str:
    """The command line's one line for ``overrides`` refused at composition or by the rules."""
    try:
        validate(compose_config(*overrides))
    except Exception as ex:  # noqa: BLE001 - whatever the command line words
        return cli.error_line(ex)
    raise AssertionError(f"accepted: {overrides}")


@pytest.mark.parametrize("key,bad,out_of_range", [("corrector.tau_age", "abc", "0"), ("pipeline.steps", "1.5", "0"),
                                                  ("pipeline.channels.judge.workers", "abc", "0")])
def test_a_value_of_the_wrong_type_names_what_is_allowed(key, bad, out_of_range):
    """``corrector.tau_age=abc`` once printed OmegaConf's "could not be converted to Float": now the key,
    the value and the allowed range in the words the rule uses for an out-of-range value."""
    wrong, ranged = _refusal(f"{key}={bad}"), _refusal(f"{key}={out_of_range}")
    assert "converted" not in wrong and wrong.startswith(f"{key} = ")
    assert wrong.split(": ", 1)[1] == ranged.split(": ", 1)[1], (wrong, ranged)


NAME = st.text(st.characters(min_codepoint=97, max_codepoint=122) | st.sampled_from("_-"), min_size=4, max_size=20)


@settings(max_examples=40, deadline=None)
@given(NAME, st.integers(0, 100), st.sampled_from(["drop", "swap", "add"]))
def test_a_misspelt_data_file_gets_a_did_you_mean(stem, at, how):
    """A generated file name beside the one given, misspelt by one letter (my_delay.csv for my_delays.csv):
    the refusal names the file that is there, written as the path was (its folder kept)."""
    name = f"{stem}.csv"
    i = at % len(stem)
    typo = {"drop": stem[:i] + stem[i + 1:], "swap": stem[:i] + ("x" if stem[i] != "x" else "y") + stem[i + 1:],
            "add": stem[:i] + "q" + stem[i:]}[how] + ".csv"
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / name).write_text("seconds\n1\n")
        (Path(d) / "zzzzzzzzzzzzzzzzzzzz.parquet").write_text("")
        with pytest.raises(ConfigError) as ex:
            need_file("pipeline.channels.judge.latency.path", os.path.join(d, typo), "a CSV file")
    assert f"did you mean {os.path.join(d, name)}" in str(ex.value) and ".parquet" not in str(ex.value)
    assert ex.value.key == "pipeline.channels.judge.latency.path"


def test_no_did_you_mean_where_nothing_is_near(tmp_path):
    with pytest.raises(ConfigError) as ex:
        need_file("k.path", str(tmp_path / "nothing_here" / "x.csv"), "a CSV file")
    assert "did you mean" not in str(ex.value) and "there is no such file" in str(ex.value)


@pytest.mark.parametrize("seeds,key", [("learner.lm.seeds=1000000", "learner.lm.seeds"),
                                       ("learner.lm.max_seeds=100000000",
                                        "learner.lm.max_seeds")])
def test_an_lm_runs_seeds_are_named_as_its_size(seeds, key):
    """``learner.lm.seeds=1000000`` was refused as "limits.memory_gb = None ... ran out of memory": the
    estimate now holds an LM run's schedules (a lane per seed), so the seeds are named, the limit beside."""
    cfg = compose_config("learner=lm", "learner.lm.policy=bandit", *seeds.split())
    with pytest.raises(ConfigError) as ex:
        check_limits(cfg)
    assert ex.value.key == key and "limits.memory_gb" in ex.value.allowed
    assert memory_error(cfg).key == key  # a MemoryError past the estimate names them too
    check_limits(compose_config("learner=lm", "learner.lm.policy=bandit", "learner.lm.seeds=64"))  # a real size fits


def test_a_capacity_searchs_own_limit_comes_before_its_variants():
    """``capacity.resamples`` too large on the judge scenario was refused as "capacity.sensitivity.spread =
    0.2 ...": the base search is checked first (racsim.analyses.sensitivity.searchable)."""
    from racsim.analyses.sensitivity import variants

    cfg = scenario(compose_config("scenario=capacity/judge_rm_h100", "capacity.resamples=100000000"))
    with pytest.raises(ConfigError) as ex:
        variants(cfg)
    assert ex.value.key == "capacity.resamples" and "sensitivity" not in str(ex.value)


def test_a_csv_of_many_columns_reads_its_one_column(tmp_path):
    """A header of 200,000 names (millions ran for minutes: the whole table was parsed) reads the named
    column alone; a missing column is named with the nearest and a count, not every name."""
    from racsim.config.schema import LatencyConf
    from racsim.pipeline.latency import _read_column

    n = 200_000
    path = tmp_path / "wide.csv"
    path.write_text(",".join(f"c{i}" for i in range(n)) + "\n" + "\n".join(",".join(["2"] * n) for _ in range(2))
                    + "\n")
    t0 = time.perf_counter()
    v = _read_column(LatencyConf(kind="empirical", path=str(path), column=f"c{n - 1}"), "k")
    assert list(v) == [2.0, 2.0] and time.perf_counter() - t0 < 1.5
    with pytest.raises(ConfigError) as ex:
        _read_column(LatencyConf(kind="empirical", path=str(path), column="c_1"), "k")
    assert "which has 200,000:" in str(ex.value) and len(str(ex.value)) < 600 and ex.value.key == "k.column"


def test_a_csv_keeps_its_header_rules(tmp_path):
    """Quoted names with spaces, comments, a column picked from the middle; one column without a header."""
    from racsim.config.schema import LatencyConf
    from racsim.pipeline.latency import _read_column

    p = tmp_path / "d.csv"
    p.write_text("# measured\n\"a, b\", seconds ,c\n1,3.5,9\n\n2,4.5,9 # note\n")
    assert list(_read_column(LatencyConf(kind="empirical", path=str(p), column="seconds"), "k")) == [3.5, 4.5]
    q = tmp_path / "one.csv"
    q.write_text("1.5\n2.5\n")
    assert list(_read_column(LatencyConf(kind="empirical", path=str(q), column="x"), "k")) == [1.5, 2.5]


def test_documented_examples_write_into_outputs():
    """The docs' commands that write a file name a path under outputs/ (once tau_sweep.png, rm.csv and
    .racsim-files landed in the repository's root); docs/layout.md names the docs' writer where it is."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "docs/examples/python_quickstart.py"]
    text = "\n".join(p.read_text() for p in pages)
    assert re.findall(r"savefig\(\"([^\"]+)\"", text) == ["outputs/tau_sweep.png"] * 2  # the script and its block
    outs = re.findall(r"racsim-profile out=(\S+)", text) + re.findall(r"rm\.profile=(\S+)", text)
    assert outs and all(o.startswith("outputs/") for o in outs if not o.startswith("PATH")), outs
    from racsim.tools.profile import ProfileConf

    assert ProfileConf().out.startswith("outputs/")
    layout = (ROOT / "docs/layout.md").read_text()
    assert "racsim/docs.py" not in layout and "racsim/app/docs.py" in layout and (ROOT / "racsim/app/docs.py").exists()
