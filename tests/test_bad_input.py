"""Bad input (issue 10): each class that ended in a traceback, a hang, a memory blow-up or
a silent NaN/inf is refused before anything starts with one line naming the key or file
(exit status 2) and no folder left. In-process through ``racsim.app.cli.main`` (fast); the
fuzz (tests/test_fuzz_generated.py) generates many more."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import messages
from racsim.app import cli
from racsim.analyses.grid import expand
from racsim.config.defaults import compose_config
from racsim.config.spec import scenario
from racsim.config.validate import cauchy_window_mass, check_limits, run_estimate
from racsim.errors import ConfigError

TINY = ["learner.trials=4", "learner.bootstrap=0", "learner.train.enabled=false", "pipeline.steps=3",
        "output.plots=false", "output.progress=false"]


def refused(tmp_path, monkeypatch, capsys, *args, config_dir=None):
    """Run ``racsim ARGS`` in-process in an empty folder: the one error line (asserting exit 2,
    one stderr line, no traceback, nothing left in the folder)."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "keep.txt").write_bytes(b"the user's")
    monkeypatch.chdir(work)
    extra = ["--config-dir", str(config_dir)] if config_dir else []
    flags = [a for a in args if a.startswith("-")]  # Hydra's options come before the overrides
    monkeypatch.setattr(sys, "argv", ["racsim", *extra, *flags, *TINY, *[a for a in args if a not in flags]])
    capsys.readouterr()
    with pytest.raises(SystemExit) as ex:
        cli.main()
    out, err = capsys.readouterr()
    lines = messages(err)
    assert ex.value.code == 2, (out, err)
    assert len(lines) == 1 and lines[0].startswith("racsim: error: "), err
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt"] and (work / "keep.txt").read_bytes() == b"the user's"
    return lines[0]


@pytest.mark.parametrize("key", ["seed", "pipeline.steps", "learner.trials", "learner.mdp_seed",
                                 "pipeline.channels.judge.workers", "study.workers", "capacity.counts"])
def test_integers_past_int64_are_refused(tmp_path, monkeypatch, capsys, key):
    value = "[99999999999999999999]" if key == "capacity.counts" else "99999999999999999999"
    line = refused(tmp_path, monkeypatch, capsys, f"{key}={value}")
    assert key in line


@pytest.mark.parametrize("override,key", [
    ("learner.mdp_seed=-1", "learner.mdp_seed"),
    ("learner.theta_seed=-1", "learner.theta_seed"),
    ("study.probe.slow_mean=inf", "study.probe.slow_mean"),
    ("study.probe.fast_mean=-inf", "study.probe.fast_mean"),
    ("corrector.alpha=1e300", "corrector.alpha"),
    ("learner.horizon=10000000", "learner.horizon"),
    ("pipeline.fast_rm.gpus=4", "pipeline.fast_rm"),
    ("seed=${nope}", "seed=${nope}"),
    ("learner.train.each_cell=maybe", "learner.train.each_cell"),
    ("pipeline.generation.lag={kind: geometric, mean: 0.5, high: inf}", "pipeline.generation.lag.high"),
])
def test_listed_classes_are_refused_naming_the_key(tmp_path, monkeypatch, capsys, override, key):
    assert key in refused(tmp_path, monkeypatch, capsys, override)


def test_a_cauchy_median_far_outside_its_window(tmp_path, monkeypatch, capsys):
    lat = "pipeline.channels.judge.latency"
    line = refused(tmp_path, monkeypatch, capsys, f"{lat}.kind=cauchy", f"{lat}.median=1e300", f"{lat}.low=1",
                   f"{lat}.high=200")
    assert f"{lat}.median" in line
    # the mass the check uses, against a Monte-Carlo draw of the Cauchy
    rng = np.random.default_rng(0)
    for med, scale, lo, hi in [(18, 4, 1, 200), (-50, 2, 0, 10), (5, 0.1, 4.9, 5.3)]:
        x = med + scale * rng.standard_cauchy(400_000)
        assert abs(cauchy_window_mass(med, scale, lo, hi) - np.mean((x >= lo) & (x <= hi))) < 4e-3


def test_hydra_launcher_n_jobs_zero(tmp_path, monkeypatch, capsys):
    line = refused(tmp_path, monkeypatch, capsys, "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=0")
    assert "hydra.launcher.n_jobs" in line


def test_a_scenario_that_includes_itself_and_an_alias_bomb(tmp_path, monkeypatch, capsys):
    conf = tmp_path / "conf"
    (conf / "scenario").mkdir(parents=True)
    (conf / "scenario" / "loop.yaml").write_text("# @package _global_\ndefaults:\n  - /scenario/loop\n")
    rows = ["# @package _global_", "a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    rows += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]  # 10**9 values
    (conf / "scenario" / "bomb.yaml").write_text("\n".join(rows) + "\n")
    assert "scenario=loop" in refused(tmp_path, monkeypatch, capsys, "scenario=loop", config_dir=conf)
    assert "scenario/bomb" in refused(tmp_path, monkeypatch, capsys, "scenario=bomb", config_dir=conf)


def test_data_files_must_be_regular_and_small(tmp_path, monkeypatch, capsys):
    lat = "pipeline.channels.judge.latency"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo), str(tmp_path)):
        line = refused(tmp_path, monkeypatch, capsys, f"{lat}.kind=empirical", f"{lat}.path={path}",
                       f"{lat}.column=x")
        assert f"{lat}.path" in line and "regular file" in line
    big = tmp_path / "big.csv"
    big.write_text("x\n" + "1\n" * 600_000)  # 1.2 MB
    line = refused(tmp_path, monkeypatch, capsys, f"{lat}.kind=empirical", f"{lat}.path={big}", f"{lat}.column=x",
                   "limits.file_mb=1")
    assert "limits.file_mb" in line


@pytest.mark.parametrize("rows", [["1,abc,0.1", "2,64,0.2"], ["0,64,0.1", "0,128,0.2", "4,64,0.3", "4,128,0.5"],
                                  ["1,64,nope"], ["1.5,64,0.1"]])
def test_a_bad_profile_csv(tmp_path, monkeypatch, capsys, rows):
    prof = tmp_path / "prof.csv"
    prof.write_text("batch_size,seq_len,seconds\n" + "\n".join(rows) + "\n")
    rm = "pipeline.channels.judge.rm"
    line = refused(tmp_path, monkeypatch, capsys, "channel@pipeline.channels.judge=judge_gpu_rm", f"{rm}.service=profiled",
                   f"{rm}.profile={prof}")
    assert f"{rm}.profile" in line


def test_a_constant_probe_pairs_file(tmp_path, monkeypatch, capsys):
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("r_fast,r_slow\n1,2\n1,3\n1,4\n")
    line = refused(tmp_path, monkeypatch, capsys, "study.kind=probe", f"study.probe.pairs={pairs}")
    assert "study.probe.pairs" in line and "constant" in line


# ---------------------------------------------------------------- the budget's estimate


def test_the_estimate_scales_with_every_size_and_names_the_biggest():
    base = run_estimate(compose_config())
    for key, factor in (("learner.trials", 10), ("pipeline.steps", 10), ("pipeline.batch_size", 10),
                        ("learner.horizon", 10)):
        cfg = compose_config(f"{key}={factor * int(compose_config()[key.split('.')[0]][key.split('.')[1]])}")
        est = run_estimate(cfg)
        assert est["seconds"] == pytest.approx(factor * base["seconds"])
        assert est["memory"] > base["memory"]
    grid = compose_config("+study.grid={seed:[0,1,2],learner.horizon:[50,500]}")
    # an upper bound: 3 x 2 cells, each counted at the largest horizon of the grid
    assert run_estimate(grid)["seconds"] == pytest.approx(6 * 10 * base["seconds"])
    with pytest.raises(ConfigError) as ex:
        check_limits(compose_config("learner.horizon=10000000"))
    assert ex.value.key == "learner.horizon" and "limits.memory_gb" in str(ex.value)
    with pytest.raises(ConfigError) as ex:
        check_limits(compose_config("learner.trials=2000", "limits.hours=0.0001"))
    assert ex.value.key == "learner.trials" and "limits.hours" in str(ex.value)
    check_limits(compose_config())  # the default run fits


def test_a_grid_of_a_million_cells_is_refused_before_it_is_built():
    axes = [f"{k}:[{','.join(map(str, range(1, 11)))}]" for k in
            ("seed", "learner.mdp_seed", "learner.theta_seed", "corrector.tau_age", "corrector.rho_bar",
             "learner.slow_bump")]
    with pytest.raises(ConfigError) as ex:
        expand(scenario(compose_config("+study.grid={" + ",".join(axes) + "}")))
    assert ex.value.key == "study.grid" and "1000000 cells" in str(ex.value)


def test_a_thousand_capacity_counts_are_refused():
    counts = ",".join(map(str, range(1, 1001)))
    with pytest.raises(ConfigError) as ex:
        check_limits(compose_config("capacity.enabled=true", f"capacity.counts=[{counts}]"))
    assert ex.value.key == "capacity.counts"


def test_racsim_profile_bad_arguments(tmp_path, capsys):
    from racsim.tools import profile

    for args, key in ((["seed=99999999999999999999"], "seed"), (["out=/dev/null/x.csv"], "out"),
                      (["batch_sizes=[100000]"], "batch_sizes"), (["repeats=0"], "repeats"), (["oops"], "oops")):
        with pytest.raises(SystemExit) as ex:
            profile.main(args)
        err = capsys.readouterr().err
        assert ex.value.code == 2 and len(messages(err)) == 1 and key in err, err


def test_racsim_bench_bad_arguments(capsys):
    from racsim.tools import bench

    for args, says in ((["--trials", "0"], "--trials 0"), (["--json", "/nonexistent/folder/x.json"], "--json"),
                       (["--bogus"], "--bogus"), (["--gpu-rm", "fast"], "--gpu-rm")):
        with pytest.raises(SystemExit) as ex:
            bench.main(args)
        err = capsys.readouterr().err
        assert ex.value.code == 2 and len(messages(err)) == 1 and says in err, err  # one line, not argparse's usage block
        assert err.startswith("racsim-bench: error: ") and "racsim-bench --help" in err


def test_racsim_report_bad_arguments_are_one_line(capsys):
    from racsim.sweep import gather

    for args in ([], ["--bogus", "x"]):
        with pytest.raises(SystemExit) as ex:
            gather.main(args)
        err = capsys.readouterr().err
        assert ex.value.code == 2 and len(messages(err)) == 1 and err.startswith("racsim-report: error: "), err


# ---------------------------------------------------------------- an RM block set key by key

FAST = "pipeline.fast_rm"


@pytest.mark.long
def test_an_incomplete_fast_rm_block_names_the_keys_it_lacks(tmp_path, monkeypatch, capsys):
    line = refused(tmp_path, monkeypatch, capsys, f"{FAST}.gpus=4")
    assert f"{FAST}.model and {FAST}.gpu" in line and "incomplete" in line
    assert f"+rm/model@{FAST}.model=8b +rm/gpu@{FAST}.gpu=H100" in line
    for given, lacking, other in (("model", "gpu", "model"), ("gpu", "model", "gpu")):
        pick = {"model": "8b", "gpu": "H100"}[given]
        line = refused(tmp_path, monkeypatch, capsys, f"{FAST}.gpus=4", f"+rm/{given}@{FAST}.{given}={pick}")
        assert f"{FAST}.{lacking} = " in line and f"{FAST}.{other} " not in line, line
        assert f"+rm/{lacking}@{FAST}.{lacking}=" in line
    # a channel's rm block the same way
    line = refused(tmp_path, monkeypatch, capsys, "pipeline.channels.judge.rm.gpus=2")
    assert "pipeline.channels.judge.rm.model and pipeline.channels.judge.rm.gpu" in line


def test_the_fast_rm_block_is_set_key_by_key():
    from racsim.config.defaults import catalog
    from racsim.config.schema import null_rm_block
    from racsim.config.validate import validate

    picked = compose_config(f"+rm/model@{FAST}.model=8b", f"+rm/gpu@{FAST}.gpu=H100", f"{FAST}.gpus=4",
                            f"{FAST}.tp=2", f"{FAST}.max_batch=8")
    rm = picked.pipeline.fast_rm
    assert (rm.gpus, rm.tp, rm.max_batch, rm.model.name, rm.gpu.name) == (4, 2, 8, "8B", "H100")
    # every key one by one, the catalog's values typed in: the same block as the groups give
    keys = [f"{FAST}.{g}.{k}={v}" for g, name in (("model", "8B"), ("gpu", "H100"))
            for k, v in catalog(g)[name].items()]
    by_keys = compose_config(f"{FAST}.gpus=4", *keys, f"{FAST}.tp=2", f"{FAST}.max_batch=8")
    assert by_keys.pipeline.fast_rm == rm
    validate(by_keys)
    # the block is created only where it is null, and only for an RM block
    assert null_rm_block(compose_config(), f"{FAST}.gpus") == FAST
    assert null_rm_block(picked, f"{FAST}.gpus") is None
    assert null_rm_block(compose_config(), "pipeline.channels.judge.rm.model.name") == "pipeline.channels.judge.rm"
    assert null_rm_block(compose_config(), "pipeline.delay_distribution.mean") is None
    assert null_rm_block(compose_config(), "pipeline.steps") is None


def test_a_run_with_the_fast_rm_set_key_by_key(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["racsim", *TINY, f"{FAST}.gpus=2", f"+rm/model@{FAST}.model=1_5b",
                                      f"+rm/gpu@{FAST}.gpu=H100", "hydra.run.dir=out"])
    cli.main()
    import yaml

    rm = yaml.safe_load((tmp_path / "out" / "config.yaml").read_text())["pipeline"]["fast_rm"]
    assert rm["gpus"] == 2 and rm["model"]["name"] == "1.5B" and rm["gpu"]["name"] == "H100"
    assert (tmp_path / "out" / "done.json").is_file()


@pytest.mark.parametrize("value, hint", [
    ("/tmp/dé.csv", "'pipeline.channels.judge.latency.path=\"/tmp/dé.csv\"'"),  # a letter the grammar lacks
    ("/tmp/a=b.csv", "'pipeline.channels.judge.latency.path=\"/tmp/a=b.csv\"'"),  # an '='
    ("~/x.csv", "write the full path"),  # a '~', which quotes keep as it is
])
def test_a_value_to_quote_says_how(tmp_path, monkeypatch, capsys, value, hint):
    line = refused(tmp_path, monkeypatch, capsys, f"pipeline.channels.judge.latency.path={value}")
    assert "Hydra cannot read this value unquoted" in line and hint in line


def test_a_malformed_override_gets_no_quoting_advice(tmp_path, monkeypatch, capsys):
    line = refused(tmp_path, monkeypatch, capsys, "pipeline.steps=[1")
    assert line.startswith("racsim: error: pipeline.steps=[1: Hydra cannot read this override") and "quote" not in line


@pytest.mark.parametrize("args, key", [
    (["learner.fast_noise_std=1e308"], "learner.fast_noise_std"),
    (["learner.channel_noise_std=1e300"], "learner.channel_noise_std"),
    (["learner.lm.lr=1e308"], "learner.lm.lr"),
    (["scenario=capacity/code_verifier", "capacity.price_per_unit_hour=1e308"], "capacity.price_per_unit_hour"),
])
def test_a_value_that_cannot_give_a_finite_run_is_refused_before_it_runs(tmp_path, monkeypatch, capsys, args, key):
    """These ran, wrote their files and then failed the finite-values check: refused up front now."""
    line = refused(tmp_path, monkeypatch, capsys, *args)
    assert line.startswith(f"racsim: error: {key} = ") and ("overflow" in line or "no number" in line)


@pytest.mark.parametrize("intrude, named", [
    (lambda sw: (sw / "0" / "notes.txt").write_text("the user's"), "0/notes.txt"),
    (lambda sw: (shutil.rmtree(sw / "1"), (sw / "1").write_text("the user's")), "1 (a file)"),
    (lambda sw: (sw / "1" / ".hydra" / "mine.yaml").write_text("the user's"), "1/.hydra/mine.yaml"),
])
def test_a_sweep_whose_job_folders_hold_the_users_files_is_refused(tmp_path, monkeypatch, capsys, intrude, named):
    """A sweep into a folder whose 0/, 1/ ... hold a user's files is refused before Hydra writes its
    .hydra/ and log there; everything of the user's stays as it was."""
    sw = tmp_path / "sw"
    for i in ("0", "1"):
        (sw / i / ".hydra").mkdir(parents=True)
    intrude(sw)
    before = {p: p.read_bytes() for p in sw.rglob("*") if p.is_file()}
    line = refused(tmp_path, monkeypatch, capsys, "-m", f"hydra.sweep.dir={sw}", "seed=0,1")
    assert "hydra.sweep.dir" in line and named in line and "output.force=true" in line, line
    assert {p: p.read_bytes() for p in sw.rglob("*") if p.is_file()} == before
    assert not any(p.name in ("racsim.log", "config.yaml", ".racsim.lock", "multirun.yaml") for p in sw.rglob("*"))
