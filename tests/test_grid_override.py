"""A scenario's study grid can be removed or replaced from the command line.

``~study.grid`` (Hydra's deletion; the schema's ``study`` node is open for it) and
``study.grid={}`` (a grid given on the command line replaces the scenario's instead
of being merged into it) both give the one-cell run of the scenario without its grid,
checked against that scenario written without the grid. The racsim command runs
in-process (tests/test_fuzz.py's helper); a typo'd key still ends in one clean line.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml
from omegaconf import OmegaConf
from test_fuzz import SMALL, check_failure, run_in_process

from racsim.analyses.grid import expand
from racsim.config.defaults import compose_config
from racsim.config.spec import scenario as spec_of

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = ["paper/heavy_tail", "adaptive_tau"]  # shipped scenarios with a grid


def _without_grid(scenario: str, root: Path) -> str:
    """The scenario's YAML with its study.grid taken out, as scenario ``nogrid/NAME`` on ``root``."""
    data = yaml.safe_load((REPO / "scenarios" / f"{scenario}.yaml").read_text())
    assert data["study"].pop("grid"), f"{scenario} has no grid: the test would prove nothing"
    out = root / "scenario" / "nogrid" / f"{Path(scenario).name}.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("# @package _global_\n" + yaml.safe_dump(data, sort_keys=False))
    return f"nogrid/{Path(scenario).name}"


def _run(cwd: Path, name: str, *args: str) -> pd.DataFrame:
    out = cwd / name
    code, stdout, stderr = run_in_process([*SMALL, *args, f"hydra.run.dir={out}"])
    assert code in (0, None), stderr
    return pd.read_parquet(out / "results.parquet")


@pytest.mark.long
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_removed_grid_is_the_scenario_without_it(scenario, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    assert len(expand(spec_of(compose_config(f"scenario={scenario}", "study.fast=true")))) > 1
    plain = _without_grid(scenario, tmp_path)
    search = f"hydra.searchpath=[pkg://racsim.scenarios,file://{tmp_path}]"
    want = _run(tmp_path, "plain", f"scenario={plain}", search)
    modes = want["mode"].nunique() if "mode" in want else 1
    assert "cell" not in want and len(want) == modes * len(set(want.corrector))  # one cell
    for i, form in enumerate(["~study.grid", "study.grid={}"]):
        got = _run(tmp_path, f"form{i}", f"scenario={scenario}", form)
        pd.testing.assert_frame_equal(got, want, check_exact=True, obj=form)


def test_a_grid_given_replaces_and_an_axis_given_changes_one_axis():
    grid = lambda *a: OmegaConf.to_object(compose_config("scenario=paper/heavy_tail", *a)).study.grid  # noqa: E731
    shipped = grid()
    assert len(shipped) > 1 and "seed" in shipped
    assert grid("study.grid={seed:[5]}") == {"seed": [5]}
    assert grid("study.grid.seed=[5]") == {**shipped, "seed": [5]}
    assert grid("~study.grid.seed") == {k: v for k, v in shipped.items() if k != "seed"}
    assert grid("~study.grid", "+study.grid={seed:[5]}") == {"seed": [5]}  # Hydra's delete-then-add
    assert grid("study.grid={seed:[5]}", "~study.grid") == {}  # the last word wins
    assert grid() == shipped  # nothing cached in place


@pytest.mark.parametrize("override,word", [
    ("~study.gird", "study.gird"),
    ("study.gird={}", "study.gird"),
    ("study.grid.sed=[1]", "study.grid.sed"),
    ("+study.workrs=2", "study.workrs"),
    ("study.workers=abc", "study.workers"),
])
def test_typo_under_study_still_fails_cleanly(override, word, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    code, out, err = run_in_process([*SMALL, "scenario=paper/heavy_tail", override])
    check_failure(code, out, err, word, tmp_path)
