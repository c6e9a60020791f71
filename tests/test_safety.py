"""Data safety (issue 10): racsim deletes nothing it did not make in this process,
replaces no file it did not write, gives each run a folder of its own, and trusts a
completion marker only when the files' SHA-256 and the cell check out.

The rules are tested in-process on racsim.sweep.markers / racsim.sweep.callback; a few real
``racsim`` subprocesses check them end to end (a user's files survive byte for
byte, two runs in one second keep both result sets, a corrupted results file is
rerun on resume)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers import messages
from hypothesis import HealthCheck, given, settings, strategies as st
from omegaconf import OmegaConf

from racsim.sweep import callback as S
from racsim.errors import ConfigError
from racsim.sweep.markers import (
    DONE,
    LOCK,
    OWNED,
    cell_matches,
    hold_folder,
    is_complete,
    owned_names,
    publish,
    record_owned,
    write_marker,
)
from racsim.sweep import gather as G

TINY = ["learner.trials=4", "learner.bootstrap=0", "learner.train.enabled=false", "pipeline.steps=3",
        "output.plots=false", "output.progress=false", "corrector.names=[naive,rac]"]


def racsim(cwd, *args, wait=True):
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    cmd = [sys.executable, "-m", "racsim", *args]
    if not wait:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def snapshot(folder: Path) -> dict:
    """Every file under ``folder`` with its bytes (the user's files must survive byte for byte)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def users_files(folder: Path) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    files = {"done.json": b'{"mine": 1}', "results.csv": b"a,b\n1,2\n", ".notes.txt.tmp-1": b"draft",
             ".hydra-notes": b"x", "report.md": b"# my report\n"}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return snapshot(folder)


# ---------------------------------------------------------------- markers: resume trusts hashes, not sizes


def job_folder(tmp_path, overrides=("seed=3", "corrector.tau_age=20")) -> Path:
    d = tmp_path / "job"
    d.mkdir()
    written = []
    for name, data in (("results.parquet", b"PAR1 0.0445 PAR1"), ("summary.md", b"# run\n")):
        (d / name).write_bytes(data)
        written.append(d / name)
    write_marker(d, written, overrides=list(overrides), cell={"seed": 3, "corrector.tau_age": 20.0}, job=0,
                 runtime_s=1.0)
    return d


def test_an_intact_marker_is_complete(tmp_path):
    d = job_folder(tmp_path)
    assert is_complete(d) and is_complete(d, ["seed=3", "corrector.tau_age=20", "resume=true"])
    assert not is_complete(d, ["seed=4", "corrector.tau_age=20"])  # another cell


def test_a_same_size_corrupted_file_is_not_complete(tmp_path):
    d = job_folder(tmp_path)
    p = d / "results.parquet"
    data = p.read_bytes()
    p.write_bytes(data.replace(b"0.0445", b"0.1235"))
    assert p.stat().st_size == len(data)
    assert not is_complete(d)


def test_a_marker_that_lists_no_file_is_not_complete(tmp_path):
    d = job_folder(tmp_path)
    m = json.loads((d / DONE).read_text())
    m["files"] = {}
    (d / DONE).write_text(json.dumps(m))
    assert not is_complete(d)


@pytest.mark.parametrize("edit", [{"seed": 4}, {"corrector.tau_age": 1000.0}, {"extra": 1}])
def test_a_hand_edited_cell_is_not_complete(tmp_path, edit):
    d = job_folder(tmp_path)
    m = json.loads((d / DONE).read_text())
    m["cell"].update(edit)
    (d / DONE).write_text(json.dumps(m))
    assert not cell_matches(m) and not is_complete(d)


def test_cell_matches_typed_values_against_the_override_text():
    assert cell_matches({"overrides": ["corrector.tau_age=inf", "name=run1", "+x=null", "~y"],
                         "cell": {"corrector.tau_age": float("inf"), "name": "run1", "x": None}})
    assert cell_matches({"overrides": ["corrector=baselines", "seed=2"], "cell": {"corrector": "baselines",
                                                                                    "seed": 2}})
    assert not cell_matches({"overrides": ["seed=2"], "cell": {}})


def test_a_marker_naming_a_file_outside_its_folder_is_not_complete(tmp_path):
    d = job_folder(tmp_path)
    m = json.loads((d / DONE).read_text())
    m["files"]["../results.parquet"] = m["files"].pop("results.parquet")
    (d / DONE).write_text(json.dumps(m))
    assert not is_complete(d)


# ---------------------------------------------------------------- publish: never replaces the user's files


def writer(names, data=b"new"):
    def write(stage: Path):
        for n in names:
            (stage / n).write_bytes(data)
        return [stage / n for n in names]
    return write


def test_publish_refuses_to_replace_a_users_file_and_touches_nothing(tmp_path):
    before = users_files(tmp_path / "out")
    with pytest.raises(FileExistsError, match="results.csv"):
        publish(tmp_path / "out", writer(["results.parquet", "results.csv"]))
    assert snapshot(tmp_path / "out") == before
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".racsim")]
    with pytest.raises(FileExistsError, match="done.json"):  # the marker's name too
        publish(tmp_path / "out", writer(["summary.md"]), also=[DONE])
    assert snapshot(tmp_path / "out") == before


def test_publish_replaces_its_own_files_and_keeps_the_users_others(tmp_path):
    out = tmp_path / "out"
    before = users_files(out)
    paths = publish(out, writer(["a.parquet", "summary.md"], b"one"))
    assert [p.name for p in paths] == ["a.parquet", "summary.md"] and (out / "a.parquet").read_bytes() == b"one"
    assert {"a.parquet", "summary.md"} <= owned_names(out)
    publish(out, writer(["a.parquet"], b"two"))  # racsim's own file: replaced
    assert (out / "a.parquet").read_bytes() == b"two"
    after = snapshot(out)
    assert {k: after[k] for k in before} == before
    publish(out, writer(["results.csv"], b"forced"), force=True)
    assert (out / "results.csv").read_bytes() == b"forced"


def test_publish_clears_only_racsims_own_debris(tmp_path):
    out = tmp_path / "out"
    publish(out, writer(["results.csv"]))
    dead = 2**22 + 12345  # above any pid this machine hands out
    (out / f".results.csv.tmp-{dead}").write_text("partial, its writer was killed")
    (out / f".results.csv.tmp-{os.getpid()}").write_text("a live writer's")
    (out / f".mine.csv.tmp-{dead}").write_text("the user's")
    publish(out, writer(["results.csv"]), also=[DONE])
    left = sorted(p.name for p in out.iterdir())
    assert f".results.csv.tmp-{dead}" not in left
    assert f".results.csv.tmp-{os.getpid()}" in left and f".mine.csv.tmp-{dead}" in left


def test_gathering_into_a_users_folder_refuses_without_force(tmp_path, capsys):
    job = job_folder(tmp_path)
    import pandas as pd

    pd.DataFrame({"corrector": ["rac"], "bias_exact": [0.01]}).to_parquet(job / "results.parquet")
    write_marker(job, [job / "results.parquet"], overrides=["seed=3"], cell={"seed": 3}, job=0, runtime_s=1)
    out = tmp_path / "report"
    before = users_files(out)
    with pytest.raises(SystemExit) as ex:
        G.main([str(job), "--out", str(out)])
    assert ex.value.code == 2
    err = capsys.readouterr().err
    assert len(messages(err)) == 1 and "--force" in err and "report.md" in err and "results.csv" in err
    assert snapshot(out) == before
    G.main([str(job), "--out", str(out), "--force"])
    assert (out / "report.md").read_bytes() != before["report.md"]
    assert (out / "done.json").read_bytes() == before["done.json"]  # not one of its names: untouched


# ---------------------------------------------------------------- one folder, one run


def test_a_folder_held_by_a_live_run_is_refused_naming_it(tmp_path):
    (tmp_path / LOCK).write_text(json.dumps({"pid": 1, "host": os.uname().nodename, "what": "sweep",
                                             "argv": "racsim -m seed=1,2"}))
    with pytest.raises(FileExistsError, match=r"pid 1 .*racsim -m seed=1,2.*output.force does not override"):
        hold_folder(tmp_path)


def test_force_does_not_override_a_live_runs_lock(tmp_path):
    """A sweep pinned to a folder a live racsim holds (pid 1, this host), with output.force=true:
    refused on one line that says force does not override it; the lock and folder untouched."""
    held = tmp_path / "held"
    held.mkdir()
    (held / LOCK).write_text(json.dumps({"pid": 1, "host": socket.gethostname(), "what": "sweep",
                                         "argv": "racsim -m seed=1,2"}))
    before = snapshot(held)
    p = racsim(tmp_path, "-m", f"hydra.sweep.dir={held}", "output.force=true", "seed=1,2", *TINY)
    assert p.returncode == 2 and len(messages(p.stderr)) == 1, p.stderr
    said = " ".join(p.stderr.split())  # one message, wrapped to 120 columns
    assert "output.force does not override a live run's lock" in said and "pid 1" in said
    assert snapshot(held) == before


def test_a_lock_left_by_a_run_that_is_gone_is_taken_over(tmp_path):
    (tmp_path / LOCK).write_text(json.dumps({"pid": 2**22 + 12345, "host": os.uname().nodename}))
    release = hold_folder(tmp_path)
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()
    release()
    assert not (tmp_path / LOCK).exists()


def test_a_stale_lock_of_this_host_is_taken_over_without_alarm(tmp_path, capsys):
    """An interrupted or killed run of this host leaves its lock: the next run takes it over and says
    nothing (issue 49, point 3: "took over ... lock" after every Ctrl-C read as something gone wrong)."""
    (tmp_path / LOCK).write_text(json.dumps({"pid": 2**22 + 12346, "host": socket.gethostname()}))
    os.utime(tmp_path / LOCK, (time.time() - 3 * 3600, time.time() - 3 * 3600))
    release = hold_folder(tmp_path)
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()
    release()
    assert capsys.readouterr() == ("", "")


def test_a_lock_of_another_host_is_refused_naming_host_pid_and_age(tmp_path, capsys):
    lock = tmp_path / LOCK
    lock.write_text(json.dumps({"pid": 2**22 + 12347, "host": "elsewhere-node-7", "argv": "racsim seed=1"}))
    os.utime(lock, (time.time() - 600, time.time() - 600))
    with pytest.raises(FileExistsError) as ex:
        hold_folder(tmp_path)
    msg = str(ex.value)
    assert "\n" not in msg and str(lock) in msg and "elsewhere-node-7" in msg and str(2**22 + 12347) in msg
    assert "10 min old" in msg and f"remove {lock}" in msg
    assert json.loads(lock.read_text())["host"] == "elsewhere-node-7"  # not taken over: its pid may live there
    assert capsys.readouterr().err == ""


def test_a_lock_that_is_not_racsims_is_left_alone(tmp_path):
    (tmp_path / LOCK).write_text("someone's file")
    with pytest.raises(FileExistsError):
        hold_folder(tmp_path)
    assert (tmp_path / LOCK).read_text() == "someone's file"


def test_two_runs_in_the_same_second_get_two_folders(tmp_path, monkeypatch):
    monkeypatch.setattr(S, "_stamp", lambda: "2026-01-01_00-00-00")
    monkeypatch.setattr(S, "CREATED", [])
    a = S.sweep_dir(str(tmp_path / "outputs"), [], False)
    b = S.sweep_dir(str(tmp_path / "outputs"), [], False)
    c = S.unique_dir(str(tmp_path / "outputs" / "run"))
    d = S.unique_dir(str(tmp_path / "outputs" / "run"))
    assert len({a, b, c, d}) == 4 and all(Path(p).is_dir() for p in (a, b, c, d))
    assert b.endswith("multirun_2026-01-01_00-00-00_2") and d.endswith("run_2")


def test_remove_created_takes_only_what_this_process_made(tmp_path, monkeypatch):
    monkeypatch.setattr(S, "CREATED", [])
    mine = Path(S.unique_dir(str(tmp_path / "new" / "deep" / "run")))
    (mine / "x").write_text("made by this run")
    theirs = tmp_path / "new" / "other"  # another run's folder, made meanwhile beside ours
    theirs.mkdir()
    S.remove_created()
    assert not mine.exists() and not (tmp_path / "new" / "deep").exists()
    assert theirs.is_dir() and (tmp_path / "new").is_dir()


def test_a_sweep_folder_holding_another_sweep_is_refused(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("hydra:\n  overrides:\n    task: [seed=0,1]\n")
    cfg = OmegaConf.create({"hydra": {"overrides": {"task": ["seed=2,3"]}}, "output": {"force": False}})
    with pytest.raises(ConfigError, match="another sweep"):
        S.check_sweep_folder(sweep, cfg)
    (sweep / "multirun.yaml").unlink()
    (sweep / "results.csv").write_text("the user's")
    with pytest.raises(ConfigError, match="results.csv"):
        S.check_sweep_folder(sweep, cfg)
    assert not (sweep / LOCK).exists() and (sweep / "results.csv").read_text() == "the user's"


# ---------------------------------------------------------------- end to end, as real commands


@pytest.mark.long
def test_a_failed_run_in_the_users_folders_deletes_nothing(tmp_path):
    """A run failing validation in an existing hydra.run.dir, and with hydra.run.dir=. in an
    empty folder: every file of the user's survives byte for byte, every folder stays."""
    pinned = tmp_path / "pinned"
    before = users_files(pinned)
    p = racsim(tmp_path, f"hydra.run.dir={pinned}", "learner.trials=-1", *TINY[1:])
    assert p.returncode == 2 and len(messages(p.stderr)) == 1 and "learner.trials" in p.stderr, p.stderr
    assert snapshot(pinned) == before and sorted(x.name for x in pinned.iterdir()) == sorted(before)
    empty = tmp_path / "empty"
    empty.mkdir()
    p = racsim(empty, "hydra.run.dir=.", "learner.trials=-1", *TINY[1:])
    assert p.returncode == 2 and empty.is_dir() and not list(empty.iterdir())
    p = racsim(empty, "seed=${nope}")  # an interpolation error: one line, no folder
    assert p.returncode == 2 and len(messages(p.stderr)) == 1 and "nope" in p.stderr, p.stderr
    assert not list(empty.iterdir())


@pytest.mark.long
def test_two_runs_started_in_the_same_second_keep_both_result_sets(tmp_path):
    """Both runs are given the same folder name (as two runs of the default layout started in
    one second are): each gets a folder of its own, with its own results."""
    same = "hydra.run.dir=${racsim.unique_dir:" + str(tmp_path / "outputs" / "same") + "}"
    procs = [racsim(tmp_path, same, f"seed={s}", *TINY, wait=False) for s in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    folders = sorted((tmp_path / "outputs").iterdir())
    assert [f.name for f in folders] == ["same", "same_2"]
    seeds = set()
    for f in folders:
        assert is_complete(f)
        seeds.add(OmegaConf.load(f / "config.yaml").seed)
    assert seeds == {0, 1}


@pytest.mark.long
def test_resume_reruns_a_job_whose_results_were_corrupted_in_place(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", f"hydra.sweep.dir={sweep}", "seed=5", *TINY]
    assert racsim(tmp_path, *args).returncode == 0
    res = sweep / "0" / "results.parquet"
    good = res.read_bytes()
    i = good.index(b"PAR1", 4) - 64  # a byte inside the data, same size
    res.write_bytes(good[:i] + bytes([good[i] ^ 0xFF]) + good[i + 1:])
    assert not is_complete(sweep / "0")
    p = racsim(tmp_path, *args, "resume=true")
    assert p.returncode == 0 and "skipped (resume)" not in p.stdout, p.stdout
    assert res.read_bytes() == good and is_complete(sweep / "0")
    # another sweep pinned to the same folder is refused, and leaves it as it was
    before = snapshot(sweep)
    p = racsim(tmp_path, "-m", f"hydra.sweep.dir={sweep}", "seed=6", *TINY)
    assert p.returncode == 2 and "another sweep" in p.stderr and len(messages(p.stderr)) == 1, p.stderr
    assert snapshot(sweep) == before


# ------------------------------------------------------- a user's files in a sweep's job folders

JOB_CFG = {"hydra": {"sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper", "params": None},
                     "overrides": {"task": ["seed=0,1,2"]}, "sweep": {"subdir": "${hydra.job.num}"},
                     "output_subdir": ".hydra", "job": {"name": "racsim"}}}
USER_NAME = st.from_regex(r"[a-zA-Z][a-zA-Z0-9_\-]{0,8}(\.[a-z]{1,4})?", fullmatch=True)
ENTRY = st.one_of(  # (kind, name) of one thing in a job folder
    st.tuples(st.just("user"), USER_NAME),  # a file of the user's
    st.tuples(st.just("owned"), USER_NAME),  # a file racsim wrote (recorded in .racsim-files)
    st.tuples(st.sampled_from(["log", "lock", "stage", "tmp"]), st.just("")),  # racsim's, or in flight
    st.tuples(st.just("hydra"), st.sampled_from(["config.yaml", "hydra.yaml", "overrides.yaml", "notes.txt"])))
JOB = st.one_of(st.just(None), st.just("file"), st.lists(ENTRY, max_size=6))  # absent, a file, a folder


def _make_job(job: Path, spec) -> list:
    """Make job folder ``job`` as ``spec`` says; the names a user keeps there (the oracle)."""
    if spec is None:
        return []
    if spec == "file":
        job.write_text("the user's")
        return [f"{job.name} (a file)"]
    job.mkdir()
    users, owned = set(), {}
    for kind, name in spec:
        if kind == "user" and name not in owned and not name.startswith("racsim"):
            (job / name).write_text("the user's")
            users.add(f"{job.name}/{name}")
        elif kind == "owned" and f"{job.name}/{name}" not in users and not name.startswith("racsim"):
            (job / name).write_text("racsim's")
            owned[name] = None
        elif kind in ("log", "lock"):
            (job / {"log": "racsim.log", "lock": LOCK}[kind]).write_text("racsim's")
        elif kind == "stage":
            (job / ".racsim-stage-x1y2").mkdir(exist_ok=True)
        elif kind == "tmp":
            (job / ".results.csv.tmp-123").write_text("in flight")
        elif kind == "hydra":
            (job / ".hydra").mkdir(exist_ok=True)
            (job / ".hydra" / name).write_text("x")
            if name == "notes.txt":
                users.add(f"{job.name}/.hydra/notes.txt")
    if owned:
        record_owned(job, owned)
    return sorted(users)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(jobs=st.lists(JOB, min_size=4, max_size=4))
def test_users_files_in_job_folders_against_an_oracle(jobs):
    """Generated job folders 0-3 of a 3-job sweep: the check names exactly the user's files in 0-2
    (folder 3 is no job's), racsim's own files and its writers' in-flight names pass, and it
    touches nothing (every file's bytes and the tree the same after)."""
    cfg = OmegaConf.create(JOB_CFG)
    with tempfile.TemporaryDirectory() as tmp:
        sweep = Path(tmp)
        want = []
        for i, spec in enumerate(jobs):
            users = _make_job(sweep / str(i), spec)
            want += users if i < 3 else []
        before = {p: (p.read_bytes() if p.is_file() else None) for p in sweep.rglob("*")}
        got = S.users_in_job_folders(sweep, cfg)
        assert sorted(got) == sorted(want)
        assert {p: (p.read_bytes() if p.is_file() else None) for p in sweep.rglob("*")} == before
