"""Sweeps end to end through the real ``racsim`` command: launchers (serial,
joblib, submitit_local, Ray when installed) give byte-identical per-job
results; every job leaves its completion marker; the sweep folder gets one
aggregated results.parquet; a sweep killed part-way and resumed gives the same
aggregate, byte for byte, as an uninterrupted one; racsim-report gathers any
folder again; progress and per-job logs."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pandas as pd
import pytest

from helpers import messages
from racsim.sweep import callback as S
from racsim.sweep.markers import DONE, cell_overrides, is_complete
from racsim.sweep.gather import _column, gather, gather_and_write
from racsim.sweep.gather import main as report_main

# Small cells. output.progress stays on: a sweep's job counter is part of what is tested.
SMALL = ["learner.trials=20", "learner.bootstrap=20", "learner.train.enabled=false", "pipeline.steps=8",
         "output.plots=false"]
CELLS = ["seed=0,1,2", "corrector.tau_age=20,1000"]
N_JOBS = 6
N_CORRECTORS = 8  # every corrector of the default scenario


def racsim(args, cwd, timeout=300, extra_env=None):
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env.update(extra_env or {})
    proc = subprocess.run([sys.executable, "-m", "racsim", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def only_sweep(cwd: Path) -> Path:
    sweeps = sorted((cwd / "outputs" / "default").glob("multirun_*"))
    assert len(sweeps) == 1, sweeps
    return sweeps[0]


def job_tables(sweep: Path) -> dict:
    return {d.name: (d / "results.parquet").read_bytes() for d in sorted(sweep.iterdir()) if (d / "done.json").is_file()}


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    """The reference: the sweep run serially (Hydra's basic launcher), default folder layout."""
    cwd = tmp_path_factory.mktemp("serial")
    proc = racsim(["-m", *SMALL, *CELLS], cwd)
    return only_sweep(cwd), proc


@pytest.mark.long
def test_serial_sweep_writes_every_job_and_one_aggregate(serial):
    sweep, _ = serial
    assert sweep.parent == sweep.parents[1] / "default" and sweep.parents[1].name == "outputs"
    jobs = sorted(d for d in sweep.iterdir() if d.is_dir() and not d.name.startswith("."))
    assert [d.name for d in jobs] == [str(i) for i in range(N_JOBS)]
    for d in jobs:
        assert is_complete(d)
        for name in ("results.parquet", "channels.parquet", "done.json", ".hydra/overrides.yaml"):
            assert (d / name).is_file(), (d, name)
        for name in ("results.csv", "config.yaml", "summary.md", "trace.json", ".hydra/config.yaml"):
            assert not (d / name).exists(), (d, name)  # a lean folder: racsim's launcher, output.job_files=auto
        assert not list(d.glob(".*.tmp-*"))
    df = pd.read_parquet(sweep / "results.parquet")
    assert len(df) == N_JOBS * N_CORRECTORS
    assert (sweep / "results.csv").is_file() and (sweep / "report.md").is_file()
    # the swept values are columns, typed, ready to pivot; 'seed' is also a results column
    assert sorted(df["corrector.tau_age"].unique()) == [20.0, 1000.0]
    assert df["corrector.tau_age"].dtype == "float64"
    assert (df["override:seed"] == df["seed"]).all()
    assert list(df["job_dir"].unique()) == [str(i) for i in range(N_JOBS)] and "job" not in df
    pivot = df.pivot_table(index="corrector.tau_age", columns="corrector", values="bias_exact", aggfunc="mean")
    assert pivot.shape == (2, N_CORRECTORS)
    assert "resume" not in df.columns


def test_progress_and_job_logs(serial):
    sweep, proc = serial
    assert re.search(rf"^racsim: sweep: {N_JOBS}/{N_JOBS} jobs \(100%\), done in \d+:\d\d - 0 running, 0 left$",
                     proc.stderr, re.M), proc.stderr
    assert f"{N_JOBS} jobs gathered in" in proc.stdout
    for i in range(N_JOBS):
        log = (sweep / str(i) / "racsim.log").read_text()
        assert f"job {i}: cell " in log and "corrector.tau_age=" in log
        assert f"job {i}: completed in" in log
        assert json.loads((sweep / str(i) / "done.json").read_text())["runtime_s"] > 0


def test_done_json_counts_a_jobs_share_of_the_batch_that_computed_it(tmp_path, monkeypatch):
    """A sweep job racsim's launcher computed ahead with its batch: done.json's runtime_s is its share of the
    batch plus its own seconds here, as its racsim.log says (it held the writing alone); the time-left
    estimate, which adds the share itself, takes it out again."""
    from omegaconf import OmegaConf

    from racsim.sweep import callback as cb

    monkeypatch.setitem(cb.SHARE, 3, 2.5)
    job = cb.Job(OmegaConf.create({}), tmp_path)
    job.num = 3
    runtime = json.loads(job.finish([]).read_text())["runtime_s"]
    assert 2.5 <= runtime < 3.5
    assert cb.JobCounts._seconds(tmp_path, None, 0.0) == (pytest.approx(runtime - 2.5), 2.5)


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # no hydra_plugins at all
        return False


# Every launcher a sweep may name: racsim's (the default, in this process), Hydra's basic one, and the
# three that run jobs in other processes, where a job's results and errors are pickled back.
RAY = ["hydra/launcher=ray", "+hydra.launcher.ray.init.num_cpus=2", "+hydra.launcher.ray.init.include_dashboard=false"]
LAUNCHERS = {"racsim": [], "basic": ["hydra/launcher=basic"],
             "joblib": ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],
             "submitit_local": ["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=5"], "ray": RAY}
QUIET_RAY = {"RAY_USAGE_STATS_ENABLED": "0"}


# The launchers that start processes of their own (loky workers, submitit jobs, a Ray node) take tens of
# seconds a sweep: their cases run in the long stage (python -m pytest -q -n auto -m long).
# So does Hydra's basic one (in this process, but the reference sweep again: 4.5 CPU s).
LONG_LAUNCHERS = ("joblib", "submitit_local", "ray", "basic")


def launchers(*names):
    needs_ray = pytest.mark.skipif(not _has("hydra_plugins.hydra_ray_launcher"),
                                   reason="the ray extra is not installed (pip install -e '.[test]')")
    return pytest.mark.parametrize("launcher", [
        pytest.param(LAUNCHERS[n], id=n, marks=[needs_ray] * (n == "ray") + [pytest.mark.long] * (n in LONG_LAUNCHERS))
        for n in names])


FAIL_AT_RUN_TIME = '''
import os
if os.environ.get("RACSIM_TEST_FAIL_SEED"):  # a job that fails at run time (tests/test_sweep.py)
    import racsim.analyses.dispatch as R
    _run = R.run
    def run(cfg, progress=None):
        if cfg.seed == int(os.environ["RACSIM_TEST_FAIL_SEED"]):
            raise RuntimeError("injected failure at run time")
        return _run(cfg, progress)
    R.run = run
    _run_many = R.run_many
    def run_many(cfgs, progress=None):  # the racsim launcher computes a batch of jobs at once: the batch fails too
        if any(cfg.seed == int(os.environ["RACSIM_TEST_FAIL_SEED"]) for cfg in cfgs):
            raise RuntimeError("injected failure at run time")
        return _run_many(cfgs, progress)
    R.run_many = run_many
'''
LAT = "pipeline.channels.judge.latency"
# Six jobs, numbered as Hydra's basic sweeper numbers them: 0 and 1 complete; 2 and 5 (seed=2) fail with
# a RuntimeError at run time (FAIL_AT_RUN_TIME); 3 and 4 read bad.csv, whose column holds text: a ConfigError
# only the run finds (a missing file is refused before the first job: tests/test_sweeper.py).
MIXED = [*SMALL, f"{LAT}.kind=empirical", f"{LAT}.column=x", f"{LAT}.path=good.csv,bad.csv", "seed=0,1,2"]
GOOD_JOBS = ["0", "1"]


RAY_NOT_UP = "The current node timed out during startup"  # Ray's own 30 s limit to start its node


def sweep_run(args: list, cwd: Path, env: dict, timeout: int = 600, tick=None) -> tuple:
    """Run ``racsim -m ARGS`` in ``cwd``, calling ``tick(proc)`` every 50 ms while it runs:
    (return code, stdout, stderr). When Ray could not start its node (a machine too busy for
    Ray's 30 s: every job fails with that reason) the command is run again with resume=true,
    as the failure line says, at most twice; then the test is skipped, saying so."""
    for attempt in range(3):
        with open(cwd / "stdout.txt", "w+") as out, open(cwd / "stderr.txt", "w+") as err:
            proc = subprocess.Popen([sys.executable, "-m", "racsim", "-m", *args, *["resume=true"] * (attempt > 0)],
                                    cwd=cwd, env=env, stdout=out, stderr=err, text=True, start_new_session=True)
            deadline = time.time() + timeout
            try:
                while proc.poll() is None and time.time() < deadline:
                    if tick is not None:
                        tick(proc)
                    time.sleep(0.05)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            out.seek(0), err.seek(0)
            text = (out.read(), err.read())
        if RAY_NOT_UP not in text[1]:
            return proc.returncode, *text
    pytest.skip(f"Ray could not start its node in its 30 s, three times: this machine is too busy ({RAY_NOT_UP})")


def mixed_sweep(cwd: Path, launcher: list) -> tuple:
    """Run the MIXED sweep under ``launcher`` in ``cwd``: (return code, stdout, stderr, sweep folder)."""
    (cwd / "good.csv").write_text("x\n1.0\n2.5\n0.5\n4.0\n")
    (cwd / "bad.csv").write_text("x\nfast\nslow\n")
    (cwd / "site").mkdir()
    (cwd / "site" / "sitecustomize.py").write_text(FAIL_AT_RUN_TIME)
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env.update(PYTHONPATH=str(cwd / "site"), RACSIM_TEST_FAIL_SEED="2", **QUIET_RAY)
    return (*sweep_run([*launcher, *MIXED], cwd, env), only_sweep(cwd))


def assert_failures_attributed(code: int, out: str, err: str, sweep: Path) -> None:
    """The good jobs gathered, each bad one named with its reason on one stderr line, exit 1,
    no traceback on either stream (a failed job's is in its own racsim.log)."""
    assert code == 1, out[-2000:] + err[-3000:]
    assert "Traceback" not in err and "Traceback" not in out, out[-3000:] + err
    lines = [ln for ln in messages(err) if "jobs failed" in ln]
    assert len(lines) == 1 and lines[0].startswith("racsim: sweep: 4 of 6 jobs failed"), err[-3000:]
    for job, path in ((2, "good"), (5, "bad")):  # the injected failure comes before the file is read
        assert f"job {job} ({LAT}.path={path}.csv seed=2): injected failure at run time" in lines[0]
    for job, seed in ((3, 0), (4, 1)):
        assert (f"job {job} ({LAT}.path=bad.csv seed={seed}): {LAT}.column = 'x': a numeric column (it has dtype"
                in lines[0]), lines[0]
    assert sorted(job_tables(sweep)) == GOOD_JOBS
    assert sorted(pd.read_parquet(sweep / "results.parquet")["job_dir"].unique()) == ["0", "1"]
    for job, what in ((2, "RuntimeError: injected failure at run time"), (3, "ConfigError: " + LAT)):
        log = (sweep / str(job) / "racsim.log").read_text()
        assert "Traceback" in log and what in log, log[-2000:]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """The MIXED sweep under racsim's launcher: the reference of the others."""
    return mixed_sweep(tmp_path_factory.mktemp("mixed"), [])


@pytest.mark.long  # the mixed sweep: 9 CPU s with its fixture
def test_a_failed_job_is_named_and_the_others_gathered(mixed):
    assert_failures_attributed(*mixed)


@launchers("basic", "joblib", "submitit_local", "ray")
def test_every_launcher_gathers_the_same_bytes_and_names_the_same_failures(mixed, tmp_path, launcher):
    """Under every launcher a run-time error (a ConfigError, or any other) fails its job alone: the
    sweep waits for every job, gathers the good ones, byte for byte those of racsim's own launcher,
    and names each failed job with its reason, the same as in-process."""
    code, out, err, sweep = mixed_sweep(tmp_path, launcher)
    assert_failures_attributed(code, out, err, sweep)
    ref = mixed[-1]
    assert job_tables(sweep) == job_tables(ref)
    assert (sweep / "results.parquet").read_bytes() == (ref / "results.parquet").read_bytes()
    assert [ln for ln in messages(err) if "jobs failed" in ln] == \
        [ln for ln in messages(mixed[2]) if "jobs failed" in ln]
    for name in ("results.csv", "config.yaml", "summary.md", ".hydra/config.yaml"):  # output.job_files=auto: full
        assert (sweep / "0" / name).is_file(), name


@launchers("joblib")
def test_a_complete_sweep_under_another_process_matches_serial(serial, tmp_path, launcher):
    """Every job good: the gathered table is the serial sweep's, byte for byte."""
    sweep, _ = serial
    racsim(["-m", *launcher, *SMALL, *CELLS], tmp_path, timeout=600, extra_env=QUIET_RAY)
    other = only_sweep(tmp_path)
    assert job_tables(other) == job_tables(sweep) and len(job_tables(other)) == N_JOBS
    assert (other / "results.parquet").read_bytes() == (sweep / "results.parquet").read_bytes()


@pytest.mark.long
def test_kill_and_resume_gives_the_same_aggregate(serial, tmp_path):
    sweep_ref, _ = serial
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    cmd = [sys.executable, "-m", "racsim", "-m", *SMALL, *CELLS]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 240
    try:
        while time.time() < deadline:
            done = list((tmp_path / "outputs").glob("default/multirun_*/*/done.json"))
            if len(done) >= 2 or proc.poll() is not None:
                break
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    sweep = only_sweep(tmp_path)
    before = {p.parent.name: p.read_bytes() for p in sweep.glob("*/done.json")}
    assert 2 <= len(before) < N_JOBS, "the sweep was not interrupted part-way"
    assert not (sweep / "results.parquet").exists()  # the aggregate comes only at the end
    # a job killed between its results and its marker: a half-written results file, no done.json
    victim = sweep / sorted(before)[0]
    (victim / "done.json").unlink()
    (victim / "results.parquet").write_bytes(b"PAR1 half a file")
    (victim / ".results.parquet.tmp-12345").write_text("partial")
    del before[victim.name]

    out = racsim(["-m", *SMALL, *CELLS, "resume=true"], tmp_path)
    assert only_sweep(tmp_path) == sweep  # found the interrupted sweep's folder again from the command
    for name, marker in before.items():  # complete jobs were skipped, not rerun (nor launched)
        assert (sweep / name / "done.json").read_bytes() == marker
        assert f"#{name} : " not in out.stderr + out.stdout
    assert f"racsim: resume: {len(before)} of {N_JOBS} jobs complete in outputs/default/{sweep.name}, skipped" \
        in out.stdout
    assert is_complete(victim) and not list(victim.glob(".*.tmp-*"))
    assert job_tables(sweep) == job_tables(sweep_ref)
    assert (sweep / "results.parquet").read_bytes() == (sweep_ref / "results.parquet").read_bytes()
    assert (sweep / "results.csv").read_bytes() == (sweep_ref / "results.csv").read_bytes()


def descendants(pid: int) -> List[int]:
    """Every process below ``pid`` (from /proc)."""
    children: dict = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return sorted(out)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


# The process that runs a job under each launcher: a loky worker, submitit's job process, a Ray worker busy
# with the launcher's task (Ray titles it ray::<task>: ray::IDLE when idle, and its agents have titles too).
WORKER = {"joblib": lambda c: "popen_loky_posix" in c, "submitit_local": lambda c: "submitit.core._submit" in c,
          "ray": lambda c: c.startswith("ray::_run_job")}


@launchers("joblib", "submitit_local", "ray")
def test_a_killed_worker_loses_no_job(serial, tmp_path, launcher, request):
    """SIGKILL one worker while it runs a job: the sweep still ends, with no traceback; each job
    it did not complete is named (a job the launcher retried is not), and resume=true completes
    the sweep to the serial sweep's bytes. Ray retries the task itself: nothing is lost at all."""
    name = request.node.callspec.id
    sweep_ref, _ = serial
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env.update(QUIET_RAY)
    killed = []

    def kill_one(proc) -> None:
        if not killed and list((tmp_path / "outputs").glob("default/multirun_*/*/.hydra/overrides.yaml")):
            busy = [p for p in descendants(proc.pid) if WORKER[name](cmdline(p))]
            if busy:
                os.kill(busy[0], signal.SIGKILL)
                killed.append(busy[0])

    code, out, err = sweep_run([*launcher, *SMALL, *CELLS], tmp_path, env, tick=kill_one)
    assert killed, "no worker ran a job"
    assert code in (0, 1), err[-3000:]
    assert "Traceback" not in err and "Traceback" not in out, (out + err)[-3000:]
    sweep = only_sweep(tmp_path)
    complete = {int(d.name) for d in sweep.iterdir() if d.name.isdigit() and is_complete(d)}
    if code == 1:  # the jobs the kill took are named, and only those
        line = [ln for ln in messages(err) if "jobs failed" in ln]
        assert len(line) == 1, err[-3000:]
        named = {int(j) for j in re.findall(r"job (\d+) \(", line[0])}  # the first five
        lost = set(range(N_JOBS)) - complete
        assert line[0].startswith(f"racsim: sweep: {len(lost)} of {N_JOBS} jobs failed") and named, line
        assert named <= lost and len(named) == min(len(lost), 5), (line, complete)
        racsim(["-m", *launcher, *SMALL, *CELLS, "resume=true"], tmp_path, timeout=600, extra_env=QUIET_RAY)
    else:
        assert complete == set(range(N_JOBS)) and name == "ray", err[-3000:]
    assert job_tables(sweep) == job_tables(sweep_ref)
    assert (sweep / "results.parquet").read_bytes() == (sweep_ref / "results.parquet").read_bytes()


@pytest.mark.long  # sweeps and racsim-report in subprocesses: 4 CPU s
def test_report_command_gathers_any_folder(serial, tmp_path, capsys):
    sweep, _ = serial
    report_main([str(sweep), "--out", str(tmp_path / "again")])
    assert (tmp_path / "again" / "results.parquet").read_bytes() == (sweep / "results.parquet").read_bytes()
    assert "| " not in (tmp_path / "again" / "report.md").read_text().splitlines()[0]
    assert f"{N_JOBS} complete job(s)" in (tmp_path / "again" / "report.md").read_text()
    # the folder above: every job of every sweep below it
    top = gather(sweep.parents[1])
    assert len(top) == N_JOBS * N_CORRECTORS and top["job_dir"].iloc[0].endswith("/0")
    # a single job folder: its own results are left alone, report.md only
    single = sweep / "3"
    own = (single / "results.parquet").read_bytes()
    g = gather_and_write(single)
    df, written = g.table, g.written
    assert [p.name for p in written] == ["report.md"] and (single / "results.parquet").read_bytes() == own
    assert len(df) == N_CORRECTORS and df["corrector.tau_age"].iloc[0] == 1000.0
    capsys.readouterr()  # the gathering's progress, when it took long enough to say any
    with pytest.raises(SystemExit) as ex:
        report_main([str(tmp_path / "nothing")])
    assert ex.value.code == 2
    assert len(messages(capsys.readouterr().err)) == 1


def test_job_counts_from_the_folder(tmp_path):
    """Done: a marker; running: started since the sweep began, no marker; a folder left over from an
    earlier run counts for neither (racsim.sweep.callback.JobCounts; tests/test_progress.py: the estimate)."""
    t0 = time.time() - 10
    for i in range(4):
        (tmp_path / str(i) / ".hydra").mkdir(parents=True)
        (tmp_path / str(i) / ".hydra" / "overrides.yaml").write_text("x")
    for i in range(2):
        (tmp_path / str(i) / DONE).write_text("{}")
    os.utime(tmp_path / "3" / ".hydra" / "overrides.yaml", (t0 - 100, t0 - 100))  # left over from an earlier run
    c = S.JobCounts(tmp_path, total=10, started=t0).counts(now=t0 + 10)
    assert (c["done"], c["running"], c["left"]) == (2, 1, 7) and c["left_s"] is not None


def test_sweep_dir_resolver_finds_the_same_sweep(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = "outputs/x"
    for stamp, task in (("2026-01-01_00-00-00", ["a=1,2"]), ("2026-01-02_00-00-00", ["a=1,2", "resume=true"]),
                        ("2026-01-03_00-00-00", ["a=3"])):
        d = tmp_path / base / f"multirun_{stamp}"
        d.mkdir(parents=True)
        (d / "multirun.yaml").write_text(f"hydra:\n  overrides:\n    task: {json.dumps(task)}\n")
    assert S.sweep_dir(base, ["a=1,2", "resume=true"], True) == f"{base}/multirun_2026-01-02_00-00-00"
    assert S.sweep_dir(base, ["a=3"], True) == f"{base}/multirun_2026-01-03_00-00-00"
    fresh = S.sweep_dir(base, ["a=1,2"], False)  # a new folder, made now: no other sweep can take it
    assert fresh.startswith(f"{base}/multirun_") and not list((tmp_path / fresh).iterdir())
    assert S.sweep_dir(base, ["a=4"], True).startswith(f"{base}/multirun_")  # nothing to resume: a new one


def _sweep(root: Path, stamp: str, task: list, done: int, jobs: int = 4, gathered: bool = False) -> Path:
    """A sweep folder as a sweep leaves it: its overrides, ``jobs`` job folders of which ``done`` finished."""
    d = root / f"multirun_{stamp}"
    d.mkdir(parents=True)
    (d / "multirun.yaml").write_text(f"hydra:\n  overrides:\n    task: {json.dumps(task)}\n")
    for i in range(jobs):
        (d / str(i) / ".hydra").mkdir(parents=True)
        if i < done:
            (d / str(i) / DONE).write_text(json.dumps({"files": {"results.csv": {}}}))
    if gathered:
        (d / "results.parquet").write_bytes(b"")
    return d


@pytest.mark.parametrize("order", range(4))
def test_resume_finds_the_interrupted_sweep_with_most_jobs_done(tmp_path, monkeypatch, capsys, order):
    """Ctrl-C after 4 of 8 jobs, the same command again without resume=true (stopped before any job
    ended), then resume=true: it continues the 4 done, not the newest (empty) folder; an older complete
    sweep, another command's sweep and a newer empty one never win; the rerun names the one to resume."""
    monkeypatch.chdir(tmp_path)
    base = tmp_path / "outputs" / "x"
    task = ["a=1,2,3,4,5,6,7,8"]
    stamps = [f"2026-01-0{i}_00-00-00" for i in range(1, 5)]
    kinds = [dict(task=task, done=8, jobs=8, gathered=True), dict(task=task, done=4, jobs=8),
             dict(task=["a=9"], done=7, jobs=8), dict(task=task, done=0, jobs=8)]
    made = {k: _sweep(base, stamps[(k + order) % 4], **kinds[k]) for k in range(4)}  # each kind at each age
    want = made[1]
    assert S.find_sweep(str(base), task) == want
    assert S.sweep_dir(str(base), [*task, "resume=true"], True) == str(want)
    capsys.readouterr()
    fresh = S.sweep_dir(str(base), task, False)
    line = capsys.readouterr().out
    assert fresh not in map(str, made.values())
    assert f"{want}" in line and "4 jobs done" in line and "resume=true" in line
    assert S.sweep_dir(str(base), ["a=10"], False) and "interrupted" not in capsys.readouterr().out


def test_resume_of_a_command_whose_sweeps_all_finished_takes_the_newest(tmp_path):
    base = tmp_path / "x"
    old = _sweep(base, "2026-01-01_00-00-00", ["a=1,2"], done=2, jobs=2, gathered=True)
    new = _sweep(base, "2026-01-02_00-00-00", ["a=1,2"], done=2, jobs=2, gathered=True)
    assert S.find_sweep(str(base), ["a=1,2"]) == new != old


def test_cell_columns_keep_one_type():
    assert str(_column([1, 2, None]).dtype) == "Int64"
    assert _column([1, 2.5]).tolist() == [1.0, 2.5]
    assert _column([True, False]).dtype == "boolean"
    assert _column([1, "a", None]).tolist() == ["1", "a", None]
    assert cell_overrides(["a=1", "resume=true", "+resume=false", "b=2"]) == ["a=1", "b=2"]


@pytest.mark.long  # two runs at a size where 1 and 2 BLAS threads sum differently: the long stage
def test_blas_thread_count_does_not_change_results(tmp_path):
    """A joblib worker gets cores / n_jobs BLAS threads, a serial job all of them,
    a cluster node its own count; a bootstrap product of this size sums
    differently on 1 and 2 threads. Each job pins BLAS to one thread, so the
    bytes do not depend on it."""
    cell = ["learner.trials=500", "learner.bootstrap=200", "learner.train.enabled=false", "pipeline.steps=8",
            "output.plots=false", "output.progress=false"]
    out = {}
    for n in ("1", "2"):
        racsim([*cell, f"hydra.run.dir=run{n}"], tmp_path,
               extra_env={"OPENBLAS_NUM_THREADS": n, "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n})
        out[n] = (tmp_path / f"run{n}" / "results.parquet").read_bytes()
    assert out["1"] == out["2"]


@pytest.mark.long
def test_racsim_sweeper_matches_hydras_basic_sweeper(serial, tmp_path):
    """The default (racsim's sweeper and launcher) against Hydra's basic ones: the same
    jobs under the same numbers, the same overrides and results, byte for byte (the default's
    lean folders hold no config.yaml; with output.job_files=full they are the same bytes too:
    tests/test_sweep_batch.py)."""
    sweep, _ = serial
    racsim(["-m", "hydra/sweeper=basic", "hydra/launcher=basic", *SMALL, *CELLS], tmp_path)
    other = only_sweep(tmp_path)
    assert job_tables(other) == job_tables(sweep) and len(job_tables(sweep)) == N_JOBS
    assert (other / "results.parquet").read_bytes() == (sweep / "results.parquet").read_bytes()
    for i in range(N_JOBS):
        for name in (".hydra/overrides.yaml", "results.parquet", "channels.parquet"):
            assert (other / str(i) / name).read_bytes() == (sweep / str(i) / name).read_bytes(), (i, name)


def test_an_invalid_cell_stops_the_sweep_before_any_job(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.run([sys.executable, "-m", "racsim", "-m", *SMALL, "seed=0,-1", "corrector.tau_age=20,-5,30"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    errors = [ln for ln in messages(proc.stderr) if ln.startswith("racsim: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr
    assert "sweep: 4 of 6 cells are invalid, nothing was run" in errors[0]
    assert "job 1 (seed=0 corrector.tau_age=-5): corrector.tau_age = -5" in errors[0]
    assert "job 3 (seed=-1 corrector.tau_age=20): seed = -1: an integer >= 0" in errors[0]
    assert not list(tmp_path.rglob("done.json")) and not list(tmp_path.rglob("multirun.yaml"))



@pytest.mark.long
def test_ctrl_c_says_one_line_and_the_sweep_resumes_to_the_same_bytes(serial, tmp_path):
    """SIGINT to the sweep's process group (what Ctrl-C in a terminal sends): no
    KeyboardInterrupt traceback, one line, exit 130; resume=true finishes the sweep and
    gives the bytes of an uninterrupted one."""
    sweep_ref, _ = serial
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    # A terminal's child has SIGINT at its default; a test runner's worker (pytest-xdist) may ignore it,
    # and a Python started with SIGINT ignored keeps ignoring it: restore the default in the child.
    proc = subprocess.Popen([sys.executable, "-m", "racsim", "-m", *SMALL, *CELLS], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if len(list((tmp_path / "outputs").glob("default/multirun_*/*/done.json"))) >= 2:
            break
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert [ln for ln in messages(err) if "interrupt" in ln.lower()] == [
        "racsim: interrupted; rerun the same command with resume=true to finish a sweep"]
    sweep = only_sweep(tmp_path)
    assert 2 <= len(list(sweep.glob("*/done.json"))) < N_JOBS and not (sweep / "results.parquet").exists()
    racsim(["-m", *SMALL, *CELLS, "resume=true"], tmp_path)
    assert job_tables(sweep) == job_tables(sweep_ref)
    assert (sweep / "results.parquet").read_bytes() == (sweep_ref / "results.parquet").read_bytes()


class _Swallows:
    """Raises ``signum``'s interrupt from __del__, where Python prints "Exception ignored" and runs on:
    what a signal landing in a weakref callback or a finalizer does to the handler's exception."""

    def __init__(self, signum: int) -> None:
        self.signum = signum

    def __del__(self) -> None:
        (S._interrupt if self.signum == signal.SIGINT else S._stop)(self.signum, None)


@pytest.mark.parametrize("signum, raised", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, S.Stopped)])
def test_an_interrupt_python_swallows_still_ends_the_sweep_at_the_next_edge(signum, raised, monkeypatch):
    """A Ctrl-C (or SIGTERM) whose exception a finalizer swallowed ends the sweep at the next job's
    start, before gathering at its end, or after a single run: a lost Ctrl-C once let a sweep finish
    with exit 0. None came: the edges raise nothing. The handlers go back to what they were."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # a test worker may ignore SIGINT
    term = signal.getsignal(signal.SIGTERM)
    try:
        S.catch_sigterm()
        assert signal.getsignal(signal.SIGINT) is S._interrupt and signal.getsignal(signal.SIGTERM) is S._stop
        S.raise_pending_interrupt()  # nothing came
        swallowed = []
        monkeypatch.setattr(sys, "unraisablehook", swallowed.append)  # where Python sends it ("Exception ignored")
        _Swallows(signum)  # dropped at once: __del__ raises, Python swallows it
        assert [type(u.exc_value) for u in swallowed] == [raised]
        cb = S.SweepCallback()
        for edge in (lambda: cb.on_job_start(config=None), lambda: cb.on_multirun_end(config=None),
                     lambda: cb.on_run_end(config=None)):
            with pytest.raises(raised):
                edge()
        assert S.stopped_by_sigterm(raised()) == (signum == signal.SIGTERM)
    finally:
        S.end_single_run()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and signal.getsignal(signal.SIGTERM) is term
    S.raise_pending_interrupt()  # forgotten with the run
    signal.signal(signal.SIGINT, before)


def test_a_sigint_the_process_ignores_stays_ignored():
    """A sweep started with SIGINT ignored (nohup, a background job) keeps ignoring it."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        S.catch_sigterm()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        S.end_single_run()
        signal.signal(signal.SIGINT, before)


@pytest.mark.long  # submitit_local's job processes: the long stage, with the launcher matrix
def test_ctrl_c_under_submitit_local_says_one_line_and_ends_its_jobs(tmp_path):
    """SIGINT to the sweep's process group with hydra/launcher=submitit_local: submitit's job
    controllers run in process groups of their own (racsim.sweep._OwnGroup), so the Ctrl-C
    reaches racsim alone: one line, exit 130, none of their tracebacks; racsim then kills
    their groups (the controllers hold the stderr pipe: communicate returns only once they
    are gone), and no job completes afterwards."""
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.Popen([sys.executable, "-m", "racsim", "-m", "hydra/launcher=submitit_local",
                             "hydra.launcher.timeout_min=5", "hydra.sweep.dir=sweep", *SMALL, *CELLS],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:  # the jobs' processes have started
        if list((tmp_path / "sweep").glob("*/.hydra/overrides.yaml")):
            break
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert [ln for ln in messages(err) if "interrupt" in ln.lower()] == [
        "racsim: interrupted; rerun the same command with resume=true to finish a sweep"]
    done = sorted((tmp_path / "sweep").glob("*/done.json"))
    time.sleep(2)
    assert sorted((tmp_path / "sweep").glob("*/done.json")) == done  # nothing ran on


@pytest.mark.long  # a sweep under each launcher, stopped: 2.4 CPU s and more each
@pytest.mark.parametrize("launcher", ["basic", "joblib", "ray"])
def test_sigterm_ends_a_sweep_as_ctrl_c_does_and_leaves_no_process(tmp_path, launcher):
    """SIGTERM to the sweep's process alone (what a scheduler or `kill` sends): one line with the
    resume hint, exit 143, no traceback, and no process of the sweep left (joblib's workers end with it)."""
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    extra = {"basic": [], "joblib": ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], "ray": RAY}[launcher]
    proc = subprocess.Popen([sys.executable, "-m", "racsim", "-m", *extra, "hydra.sweep.dir=sweep", *SMALL, *CELLS],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:  # a job is under way
        if list((tmp_path / "sweep").glob("*/.hydra/overrides.yaml")):
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert [ln for ln in messages(err) if "interrupt" in ln.lower()] == [
        "racsim: interrupted; rerun the same command with resume=true to finish a sweep"]
    deadline = time.time() + 30  # the workers' group: gone once they have shut down
    while time.time() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)


@pytest.mark.parametrize("args, says", [
    (["seed=range(0)"], "the sweep = '0 jobs': at least one job"),  # a swept key given no values
    (["seed=0,-1", "hydra.sweep.dir=pinned/deeper"], "1 of 2 cells are invalid, nothing was run"),  # a pinned folder
])
def test_a_sweep_that_runs_nothing_leaves_nothing(tmp_path, args, says):
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.run([sys.executable, "-m", "racsim", "-m", *SMALL, *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    errors = [ln for ln in messages(proc.stderr) if ln.startswith("racsim: error:")]
    assert proc.returncode == 2 and len(errors) == 1 and says in errors[0], proc.stderr
    assert list(tmp_path.iterdir()) == [], "a folder was left behind"
    assert "sweep of" not in proc.stdout + proc.stderr  # no line names a folder that is not made


@pytest.mark.long
def test_a_sweep_prints_one_line_per_job(serial):
    """Quiet sweeps: one line per job on stdout; the jobs' own log lines (their cell, their time) are in
    their racsim.log only (test_progress_and_job_logs), Hydra's lines on neither stream."""
    _, proc = serial
    jobs = [ln for ln in proc.stdout.splitlines() if re.match(r"racsim: job \d+: ", ln)]
    assert len(jobs) == N_JOBS
    assert not [ln for ln in (proc.stdout + proc.stderr).splitlines() if "[HYDRA]" in ln or "[racsim.sweep]" in ln]
