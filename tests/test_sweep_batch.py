"""The racsim launcher computes a batch of sweep jobs ahead as one in-process grid
(racsim.analyses.dispatch.run_many, racsim.analyses.bias_study.run_bias_each): each job's results
must be those of the job run alone, byte for byte. In process: run_many against
``run`` of each config (the obvious oracle), on random configs whose rewards, noise,
seeds and correctors differ, with a count of the trajectory groups it shares. Through
the command: a sweep with several bases and a job failing at run time, the racsim
launcher against Hydra's basic one (every job alone, as before batching). And the
YAML a job's configs are written with (libyaml) is OmegaConf's, byte for byte."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

import racsim.analyses.bias_study as B
import racsim.learner.bias as LB
from racsim.config.defaults import compose_config
from racsim.config.dump import config_yaml
from racsim.config.spec import scenario
from racsim.sweep.markers import is_complete
from racsim.analyses.dispatch import run, run_many
from tests.helpers import assert_same_schedule

TINY = ["learner.trials=12", "learner.bootstrap=10", "pipeline.steps=6", "learner.train.enabled=false",
        "output.plots=false", "output.progress=false"]


def table_bytes(res) -> dict:
    """Every table of a RunResult as the Parquet bytes a job folder gets."""
    out = {}
    for name, df in [("results", res.results), ("channels", res.channels), ("timeline", res.timeline),
                     ("training", res.training), *res.extra.items()]:
        buf = io.BytesIO()
        df.to_parquet(buf, index=False)
        out[name] = buf.getvalue()
    return out


def random_configs(rng, n):
    """Specs (racsim.config.spec.scenario) that share the learner in every mixture: the same or
    other rewards (slow_bump), fast noise, seeds, correctors, ages."""
    cfgs, combos = [], set()
    for _ in range(n):
        seed, bump, noise = int(rng.integers(2)), [0.5, 1.0][rng.integers(2)], [0.0, 0.3][rng.integers(2)]
        names = ["[naive,rac]", "[naive,retrace_a,wait_for_slow]", "[rac_no_age,sync_oracle]"][rng.integers(3)]
        tau = ["20", "100", "inf"][rng.integers(3)]
        cfgs.append(scenario(compose_config(*TINY, f"seed={seed}", f"learner.slow_bump={bump}",
                                            f"learner.fast_noise_std={noise}", f"corrector.names={names}",
                                            f"corrector.tau_age={tau}")))
        combos.add((seed, bump, noise))
    return cfgs, len(combos)


@pytest.mark.long
@pytest.mark.parametrize("seed", [0, 1])
def test_run_many_gives_each_config_the_bytes_of_run(seed, monkeypatch):
    # trials in several chunks: a cell sharing with other rewards or noise (the grid's
    # learner_key) would then draw other trajectories or round otherwise than alone
    monkeypatch.setattr(LB, "CHUNK_TRAJECTORIES", 200)
    cfgs, n_groups = random_configs(np.random.default_rng(seed), 7)
    cfgs.append(scenario(compose_config(*TINY, "study.kind=probe")))  # not a bias study: left to run
    cfgs.append(scenario(compose_config(*TINY, "+study.grid={seed: [0, 1]}")))  # a grid of its own: left to run
    groups = []
    real = B._run_group
    monkeypatch.setattr(B, "_run_group", lambda members, *a, **k: groups.append(len(members)) or real(members, *a, **k))
    pairs = list(run_many(cfgs))  # each as soon as computed: a group's cells together, the groups in first order
    many = dict(pairs)
    first = groups_of(cfgs[:-2])
    assert [i for i, _ in pairs] == sorted(range(7), key=lambda i: (first[i], i))  # the probe and the grid: left
    assert len(groups) == n_groups and sum(groups) == 7  # cells share exactly when seed, rewards and noise agree
    monkeypatch.setattr(B, "_run_group", real)
    for i, cfg in enumerate(cfgs[:-2]):
        got = many[i]
        alone = run(cfg)
        assert table_bytes(got) == table_bytes(alone)
        assert got.trajectories == alone.trajectories
        assert got.schedules.keys() == alone.schedules.keys()
        for k in alone.schedules:
            assert_same_schedule(got.schedules[k], alone.schedules[k], k)
        for view, by_name in alone.bias.estimates.items():
            for name, est in by_name.items():
                assert np.array_equal(got.bias.estimates[view][name], est), (view, name)


def groups_of(cfgs) -> list:
    """Each config's trajectory group: the first config of its group (racsim.analyses.bias_study.same_numbers_key)."""
    keys = [B.same_numbers_key(c) for c in cfgs]
    return [keys.index(k) for k in keys]


FAIL_JOB = '''
import os
import racsim.analyses.bias_study as B
import racsim.learner.bias as LB
_build = B.build_mdp
def build_mdp(cfg):  # fails at run time, in the batch and alone (tests/test_sweep_batch.py)
    if cfg.seed == 1 and len(cfg.corrector.names) == 3:
        raise RuntimeError("injected failure at run time")
    return _build(cfg)
B.build_mdp = build_mdp
'''

# two bases (a list value is composed by Hydra), cells sharing trajectories across them
CELLS = ["seed=0,1,2", "corrector.names=[naive,rac],[naive,rac_no_age,retrace_a]"]
COMPARED = ("results.parquet", "results.csv", "channels.parquet", "channels.csv", "timeline.parquet",
            "trace.json", "config.yaml", ".hydra/config.yaml", ".hydra/overrides.yaml")


def sweep(tmp_path: Path, name: str, launcher: list) -> tuple:
    cwd = tmp_path / name
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "site"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "racsim", "-m", *launcher, *TINY, *CELLS,
                           "hydra.sweeper.max_batch_size=2", "hydra.sweep.dir=sweep"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    return cwd / "sweep", proc


LEAN = ("results.parquet", "channels.parquet")  # a lean job folder's tables, beside done.json and .hydra/overrides.yaml


@pytest.mark.long
def test_a_batched_sweep_writes_the_bytes_of_jobs_run_alone(tmp_path):
    """racsim's launcher, its lean folders (the default) and full ones, against Hydra's basic
    launcher (full folders, every job alone): the same bytes in every file both have."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(FAIL_JOB)
    lean, proc_lean = sweep(tmp_path, "racsim", [])
    full, proc = sweep(tmp_path, "racsim_full", ["output.job_files=full"])
    alone, proc_alone = sweep(tmp_path, "basic", ["hydra/launcher=basic", "output.job_files=full"])  # as auto gives it
    for p in (proc_lean, proc, proc_alone):
        assert p.returncode == 1, p.stderr[-3000:]
        assert "Traceback" not in p.stderr
        assert "racsim: sweep: 1 of 6 jobs failed" in p.stderr
        assert "job 3 (seed=1 corrector.names=[naive,rac_no_age,retrace_a]): injected failure" in " ".join(p.stderr.split())
    # the batch holding the failing job ran one by one; the others were computed together
    for p in (proc_lean, proc):
        assert p.stdout.count("run one by one") + p.stderr.count("run one by one") == 1
    done = sorted(d.name for d in full.iterdir() if (d / "done.json").is_file())
    assert done == ["0", "1", "2", "4", "5"]
    assert sorted(d.name for d in lean.iterdir() if (d / "done.json").is_file()) == done
    for job in done:
        for f in COMPARED:
            assert (full / job / f).read_bytes() == (alone / job / f).read_bytes(), (job, f)
        for f in LEAN:
            assert (lean / job / f).read_bytes() == (alone / job / f).read_bytes(), (job, f)
        kept = {p.relative_to(lean / job).as_posix() for p in (lean / job).rglob("*") if p.is_file()}
        assert kept == {*LEAN, "done.json", ".hydra/overrides.yaml", "racsim.log", ".racsim-files"}, kept
        marker = json.loads((lean / job / "done.json").read_text())
        assert OmegaConf.load(lean / job / ".hydra" / "overrides.yaml") == marker["overrides"]  # re-run it alone
        assert sorted(json.loads((lean / job / "done.json").read_text())["files"]) == ["channels.parquet",
                                                                                       "results.parquet"]
        assert is_complete(lean / job)  # the marker's SHA-256, made from the bytes in memory, is the file's
    failed = {p.relative_to(lean / "3").as_posix() for p in (lean / "3").rglob("*") if p.is_file()}
    assert failed == {".hydra/overrides.yaml", "racsim.log"}, failed  # its log holds the traceback
    assert "injected failure at run time" in (lean / "3" / "racsim.log").read_text()
    tables = [pd.read_parquet(d / "results.parquet") for d in (lean, full, alone)]
    assert sorted(tables[0]["job_dir"].unique()) == ["0", "1", "2", "4", "5"]
    cells = ["job_dir", "output.job_files"]  # the folders, and the full sweeps' own override
    for t in tables[:2]:
        pd.testing.assert_frame_equal(t.drop(columns=cells, errors="ignore"), tables[2].drop(columns=cells),
                                      check_exact=True)
    # racsim-report gathers lean folders as it gathers full ones
    report = [subprocess.run([sys.executable, "-m", "racsim.sweep.gather", str(d), "--out", str(tmp_path / f"r{i}")],
                             capture_output=True, text=True, timeout=120) for i, d in enumerate((lean, alone))]
    assert [r.returncode for r in report] == [0, 0], report[0].stderr
    r0, r1 = (pd.read_parquet(tmp_path / r / "results.parquet") for r in ("r0", "r1"))
    pd.testing.assert_frame_equal(r0, r1.drop(columns="output.job_files"), check_exact=True)


TRICKY = ["", " ", "yes", "no", "null", "~", "1e3", "0x1F", "inf", ".nan", "-", "a: b", "#x", "x #y", "'q'", '"d"',
          "line\nbreak", "tab\there", "é ü 日本", "${seed}", "[1, 2]", "{a: 1}", "*alias", "&anchor", "%p", "@at",
          "  lead", "trail  ", "x" * 120, "word " * 30]
ASCII = st.text(st.characters(min_codepoint=0, max_codepoint=127), max_size=30)  # the emitters' fast path
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from(TRICKY), ASCII, st.text(max_size=30))
keys = st.one_of(st.sampled_from(TRICKY), ASCII, st.text(max_size=12))
trees = st.recursive(scalars, lambda sub: st.one_of(st.lists(sub, max_size=4), st.dictionaries(keys, sub, max_size=4)),
                     max_leaves=12)


@pytest.mark.long
@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.dictionaries(keys, trees, max_size=6))
def test_config_yaml_is_omegaconfs_yaml_byte_for_byte(tree):
    try:
        cfg = OmegaConf.create(tree)
    except Exception:  # not a config OmegaConf takes (a key it refuses)
        return
    assert config_yaml(cfg) == OmegaConf.to_yaml(cfg)


def test_config_yaml_of_a_sweep_jobs_configs():
    cfg = compose_config(*TINY)
    assert config_yaml(cfg) == OmegaConf.to_yaml(cfg)
    assert config_yaml(cfg.pipeline) == OmegaConf.to_yaml(cfg.pipeline)


@pytest.mark.long
def test_a_lean_single_run_keeps_the_parquet_tables_and_its_marker(tmp_path):
    """output.job_files=lean on a single run: the tables as Parquet, done.json (its SHA-256 from
    the bytes in memory), no CSV, config.yaml, trace or summary; racsim-report reads it."""
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    run = subprocess.run([sys.executable, "-m", "racsim", *TINY, "output.job_files=lean", "hydra.run.dir=run"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    names = {p.name for p in (tmp_path / "run").iterdir() if p.is_file() and not p.name.startswith(".")}
    assert names == {"results.parquet", "channels.parquet", "done.json", "racsim.log"}, names
    assert is_complete(tmp_path / "run")
    report = subprocess.run([sys.executable, "-m", "racsim.sweep.gather", "run"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0 and (tmp_path / "run" / "report.md").is_file(), report.stderr
