"""``racsim.run`` (racsim/api.py): the command line's tables from Python, nothing written unless asked.

The command line runs in a subprocess (tests/test_cli.py's helpers), racsim.run in this process
from an empty working directory; both on reduced sizes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import racsim
from racsim.errors import ConfigError
from test_capacity import SMALL_JUDGE
from test_cli import REPO, SMALL, ok, racsim as racsim_cli, run_dir_args

QUIET = SMALL + ["output.plots=false", "output.progress=false"]
CAPACITY = ["capacity/judge_rm_h100", SMALL_JUDGE + ["capacity.counts=[1,8]", "output.plots=false"]]  # 1: overloaded


def _tree(folder: Path) -> list:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


@pytest.fixture()
def empty_cwd(tmp_path, monkeypatch):
    """An empty working directory; after the test it must still be empty, as must be the repository's outputs/."""
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    outputs = _tree(REPO / "outputs")
    yield here
    assert os.getcwd() == str(here), "racsim.run changed the working directory"
    assert _tree(here) == [], "racsim.run wrote into the working directory"
    assert _tree(REPO / "outputs") == outputs, "racsim.run wrote under outputs/"


HEAVY = "{'numpy', 'pandas', 'scipy', 'hydra', 'omegaconf', 'torch', 'transformers'}"


@pytest.mark.parametrize("touch, api_loaded", [("pass", False), ("from racsim import run; assert run.__module__ == "
                                                             "'racsim.app.api'", True)])
def test_import_racsim_loads_no_simulator(touch, api_loaded):
    code = (f"import sys, racsim; {touch}; print('racsim.app.api' in sys.modules, "
            f"sorted({{m.split('.')[0] for m in sys.modules}} & {HEAVY}))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [str(api_loaded), "[]"], p.stdout  # the simulator loads when racsim.run runs


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory) -> Path:
    """The command's folder for ``QUIET seed=3``, run once for the tests that compare racsim.run with it."""
    tmp = tmp_path_factory.mktemp("cli")
    ok(racsim_cli(tmp, *QUIET, "seed=3", *run_dir_args(tmp / "cli")))
    return tmp / "cli"


@pytest.mark.long
def test_run_returns_the_clis_tables_and_writes_nothing(cli_run, empty_cwd, capsys):
    t = racsim.run(overrides=[*QUIET, "seed=3"])
    assert capsys.readouterr().err == ""  # output.progress=false: no progress
    assert isinstance(t, racsim.Tables) and t.curve is None and t.recommended is None and t.files == []
    for name, got in (("results", t.results), ("channels", t.channels)):
        pd.testing.assert_frame_equal(got, pd.read_parquet(cli_run / f"{name}.parquet"), check_exact=True)
    assert t.config.seed == 3 and t.config.name == "default" and (t.results.seed == 3).all()


@pytest.mark.long  # a capacity search twice (the command, then racsim.run): 5 CPU s
def test_a_capacity_plan_returns_its_curve(tmp_path, empty_cwd, capsys):
    """... and shows its progress on stderr by default, as the command does (issue 43: it said nothing)."""
    scenario, overrides = CAPACITY
    ok(racsim_cli(tmp_path, f"scenario={scenario}", *overrides, *run_dir_args(tmp_path / "cli")))
    capsys.readouterr()
    t = racsim.run(scenario, overrides=overrides)
    said = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("racsim: judge_rm_h100: capacity search (1/")]
    assert len(said) >= len(t.curve["count"].unique()), said  # a line per count evaluated, at least
    pd.testing.assert_frame_equal(t.curve, pd.read_parquet(tmp_path / "cli" / "capacity.parquet"), check_exact=True)
    for name, got in (("results", t.results), ("channels", t.channels)):  # the run at the recommended count
        assert got.to_csv(index=False) == (tmp_path / "cli" / f"{name}.csv").read_text(), name
    assert sorted(t.curve["count"].unique()) == sorted({1, 8} | set(t.raw.searched))  # and the counts between
    assert t.raw.listed == [1, 8] and all(1 < n < 8 for n in t.raw.searched)
    assert t.recommended == t.raw.recommended and (t.recommended is None or t.recommended <= 8)


def test_a_plan_whose_every_count_is_overloaded_returns_empty_run_tables(tmp_path, empty_cwd, capsys):
    """Every count up to twice the largest listed overloaded: nothing simulated, no answer; racsim.run
    returns the curve (the listed counts and 4, where the search above them stopped) and empty results
    and channels (it raised AttributeError), as the command writes capacity.csv alone."""
    scenario, overrides = CAPACITY
    t = racsim.run(scenario, overrides=[*overrides, "capacity.counts=[1,2]", "capacity.sensitivity.enabled=false"],
                   progress=False)
    assert capsys.readouterr().err == ""  # progress=False: none, whatever output.progress says
    assert t.recommended is None and t.raw.best is None and set(t.curve["status"].str[:10]) == {"overloaded"}
    assert t.results.empty and t.channels.empty and sorted(t.curve["count"].unique()) == [1, 2, 4]
    assert t.raw.top == 4 and t.raw.searched == [4]


def test_out_writes_the_clis_folder(cli_run, tmp_path, empty_cwd):
    out = tmp_path / "api"
    t = racsim.run(overrides=[*QUIET, "seed=3"], out=out)
    assert sorted(p.name for p in t.files) == sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    for name in ("results.parquet", "channels.parquet", "results.csv", "channels.csv", "timeline.parquet"):
        assert (out / name).read_bytes() == (cli_run / name).read_bytes(), name
    from racsim.sweep.gather import gather

    assert "## Time" in (out / "summary.md").read_text() and len(gather(out)) == len(t.results)  # done.json last: racsim-report takes it as a complete run


@pytest.mark.parametrize("scenario, overrides, key, says", [
    (None, ["pipline.steps=4"], "pipline.steps", "pipline"),  # a key the schema lacks
    (None, ["pipeline.steps=-4"], "pipeline.steps", "an integer >= 1"),  # a value out of range
    ("capacity/judge_h100", [], "scenario", "judge_h100"),  # a scenario that does not exist
    (None, ["corrector.tau_age=abc"], "corrector.tau_age", "tau_age"),  # a type the schema refuses
])
def test_a_mistake_raises_config_error_naming_the_key(empty_cwd, scenario, overrides, key, says):
    with pytest.raises(ConfigError) as info:
        racsim.run(scenario, overrides=overrides)
    assert info.value.key == key and says in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("args, key, says", [
    ((None, 5), "overrides", "a list of strings"),  # overrides given positionally as a number
    ((None, "seed=3"), "overrides", "a list of strings"),  # one string, not a list of them
    ((5,), "scenario", "a scenario name"),
    ((None, [], ""), "out", "'.' for the current folder"),  # "" would write into the current folder unasked
    ((None, [], "FILE/sub"), "out", "is a file, so nothing can be made under it"),
    ((None, [], "FILE"), "out", "a folder, not a file"),
    ((None, [], None, "yes"), "progress", "True (shown on stderr), False (not shown) or None"),
])
def test_bad_arguments_are_refused_before_anything_runs(tmp_path, empty_cwd, monkeypatch, args, key, says):
    (tmp_path / "FILE").write_text("the user's")
    args = tuple(str(tmp_path / a) if isinstance(a, str) and a.startswith("FILE") else a for a in args)
    monkeypatch.setattr("racsim.app.job.compute", lambda *a, **k: pytest.fail("computed after a bad argument"))
    with pytest.raises(ConfigError) as info:
        racsim.run(*args)
    assert info.value.key == key and says in str(info.value) and "\n" not in str(info.value)
    assert (tmp_path / "FILE").read_text() == "the user's"


@pytest.mark.long
def test_the_cli_words_the_same_mistake_alike(tmp_path):
    with pytest.raises(ConfigError) as info:
        racsim.run(overrides=["pipeline.steps=-4"])
    p = racsim_cli(tmp_path, "pipeline.steps=-4")
    assert p.returncode == 2 and p.stderr.strip() == f"racsim: error: {info.value}"


def test_a_rerun_into_a_folder_keeps_the_users_edit(tmp_path, empty_cwd):
    """A run into the folder of an earlier one replaces racsim's files, but not one the user edited
    since (results.csv here): refused in one line naming it, the edit kept; output.force=true replaces it."""
    out = tmp_path / "run"
    racsim.run(overrides=[*QUIET, "seed=3"], out=out)
    racsim.run(overrides=[*QUIET, "seed=4"], out=out)  # racsim's own files: replaced
    edited = (out / "results.csv").read_text() + "my note\n"
    (out / "results.csv").write_text(edited)
    with pytest.raises(ConfigError) as info:
        racsim.run(overrides=[*QUIET, "seed=5"], out=out)
    assert "results.csv" in str(info.value) and info.value.key == "output.force" and "\n" not in str(info.value)
    assert (out / "results.csv").read_text() == edited
    racsim.run(overrides=[*QUIET, "seed=5", "output.force=true"], out=out)
    assert (out / "results.csv").read_text() != edited
