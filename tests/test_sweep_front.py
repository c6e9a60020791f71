"""Sweeps that keep finished work and folders that say what is wrong with them (issue 49, points 3, 4 and 7
and its hostile cases), in this process: the racsim launcher writes each job of a batch as soon as the
batch computes it (an interrupt keeps it), the sweep's first time left comes from the batch's trials, a
sweep into its own folder with finished jobs is refused with the command that resumes it, a folder that
cannot be made or written is one line naming its key, a killed writer's staging folder goes, a bar fits
its own terminal, and the engines tick inside a simulation without changing it."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
import termios
import time
import warnings

import numpy as np
import pytest
import yaml
from omegaconf import OmegaConf

from helpers import main_in_process, messages
from racsim.progress import Progress
from racsim.sweep import callback as S
from racsim.sweep.markers import STAGE, publish

TINY = ["learner.trials=4", "learner.bootstrap=10", "pipeline.steps=8", "learner.train.enabled=false",
        "output.plots=false", "output.progress=false"]


class FakeBatch:
    """run_many's stand-in: yields each job's (index, result) and records when, into ``events``."""

    def __init__(self, events: list, fail_at=None):
        self.events, self.fail_at = events, fail_at

    def __call__(self, specs, progress=None):
        progress.start("computing", 2 * len(specs), "trial")
        for k, spec in enumerate(specs):
            if k == self.fail_at:
                raise RuntimeError("the batch failed")
            progress.advance(2)
            self.events.append(("computed", spec))
            yield k, f"result of {spec}"


def launcher(monkeypatch, tmp_path, events, picked, batch, interrupt_at=None):
    """The racsim launcher over jobs 0..n-1, its batch's computing and each job's task replaced by records."""
    from hydra_plugins.racsim_sweeper import racsim_sweeper as R
    import racsim.analyses.dispatch as D

    L = R.RacsimLauncher()
    L.config = OmegaConf.create({"hydra": {"hydra_logging": None, "verbose": False, "sweep": {"dir": str(tmp_path)}}})
    L.hydra_context = L.task_function = object()
    monkeypatch.setattr(R, "configure_log", lambda *a: None)
    monkeypatch.setattr(D, "run_many", batch)
    monkeypatch.setattr(L, "_pick", lambda jobs: (len(jobs), [(i, f"spec {i}") for i, _ in jobs if i in picked]))

    def run_one(idx, overrides):
        if idx == interrupt_at:
            raise KeyboardInterrupt
        events.append(("written", idx, S.PREPARED.get(idx, (None, "computed by its task"))[1], dict(S.AHEAD)))
        return idx

    monkeypatch.setattr(L, "_run_one", run_one)
    return L


def test_a_batch_writes_each_job_as_soon_as_it_is_computed(monkeypatch, tmp_path):
    events: list = []
    L = launcher(monkeypatch, tmp_path, events, picked={0, 1, 3}, batch=FakeBatch(events))
    assert L.launch([[f"seed={i}"] for i in range(4)], 0) == [0, 1, 2, 3]  # in job order, for the sweeper
    kinds = [(e[0], e[1]) for e in events]
    assert kinds == [("computed", "spec 0"), ("written", 0), ("computed", "spec 1"), ("written", 1),
                     ("computed", "spec 3"), ("written", 3), ("written", 2)]  # job 2: its task computes it
    assert [e[2] for e in events if e[0] == "written"] == ["result of spec 0", "result of spec 1",
                                                           "result of spec 3", "computed by its task"]
    assert sorted(events[1][3]) == [1, 3]  # while job 0 is written, the batch's others still run ahead
    assert not S.PREPARED and not S.AHEAD and not S.BATCH and set(S.SHARE) >= {0, 1, 3}


def test_an_interrupt_keeps_the_jobs_written_and_a_failed_batch_runs_the_rest_alone(monkeypatch, tmp_path):
    events: list = []
    L = launcher(monkeypatch, tmp_path, events, picked={0, 1, 2, 3}, batch=FakeBatch(events), interrupt_at=2)
    with pytest.raises(KeyboardInterrupt):
        L.launch([[f"seed={i}"] for i in range(4)], 0)
    assert [e[1] for e in events if e[0] == "written"] == [0, 1]  # written before the interrupt: kept
    assert not S.PREPARED and not S.AHEAD and not S.BATCH  # the batch is closed with the interrupt
    events.clear()
    L = launcher(monkeypatch, tmp_path, events, picked={0, 1, 2, 3}, batch=FakeBatch(events, fail_at=2))
    assert L.launch([[f"seed={i}"] for i in range(4)], 0) == [0, 1, 2, 3]
    assert [e[2] for e in events if e[0] == "written"] == ["result of spec 0", "result of spec 1",
                                                           "computed by its task", "computed by its task"]


def test_the_first_time_left_comes_from_the_batchs_trials(tmp_path):
    """No job finished yet: a batch of 4 jobs that did a quarter of its trials in 5 s takes 20 s, 15 s
    more, then 2 more jobs at 5 s each; without a batch (or before its first trial) no estimate."""
    t0 = time.time()
    counts = S.JobCounts(tmp_path, total=6, started=t0 - 5)
    assert counts.counts(now=t0)["left_s"] is None
    meter = Progress.off()
    meter.start("computing", 100, "trial")
    S.BATCH[:] = [meter, t0 - 5, 4]
    S.AHEAD.update(dict.fromkeys(range(4), t0 - 5))
    try:
        assert counts.counts(now=t0)["left_s"] is None  # not a trial done yet
        meter.update(25)
        c = counts.counts(now=t0)
        assert (c["done"], c["running"], c["left"]) == (0, 4, 2)
        assert c["left_s"] == pytest.approx(15.0 + 2 * 5.0)
    finally:
        S.BATCH.clear()
        S.AHEAD.clear()


def sweep_folder(tmp_path, task: list, done: int):
    """A pinned sweep folder of ``task``'s overrides with ``done`` jobs finished (their markers)."""
    sweep = tmp_path / "pinned"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"overrides": {"task": task}}}))
    for i in range(done):
        (sweep / str(i) / ".hydra").mkdir(parents=True)
        (sweep / str(i) / "done.json").write_text(json.dumps({"files": {}}))
    return sweep


def test_a_rerun_into_a_sweeps_own_folder_resumes_or_is_refused_with_the_command(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    task = ["seed=0,1,2", *TINY]
    sweep = sweep_folder(tmp_path, task, done=2)
    before = sorted(p.relative_to(tmp_path) for p in sweep.rglob("*"))
    code, out, err = main_in_process(monkeypatch, capsys, ["-m", *task, f"hydra.sweep.dir={sweep}"])
    lines = messages(err)
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "it holds this sweep (interrupted, 2 of 3 jobs done); continue it with: racsim -m seed=0,1,2" in lines[0]
    assert f"hydra.sweep.dir={sweep} resume=true (its finished jobs kept)" in lines[0]
    assert "output.force=true" in lines[0]
    assert sorted(p.relative_to(tmp_path) for p in sweep.rglob("*")) == before  # nothing touched


@pytest.mark.parametrize("where", ["a file", pytest.param("under a file", marks=pytest.mark.long), "read-only"])
def test_a_folder_that_cannot_be_made_or_written_is_one_line_naming_its_key(tmp_path, monkeypatch, capsys, where):
    """The sweep's folder (with resume=true too) and a run's: one line naming hydra.sweep.dir or hydra.run.dir
    and why, exit 2, no Hydra callback warning before it, nothing blamed on racsim's config."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("the user's")
    folder = {"a file": "afile", "under a file": "afile/sweep", "read-only": "ro/sweep"}[where]
    if where == "read-only":
        (tmp_path / "ro").mkdir()
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **k: False if str(p).endswith("ro") else real(p, mode, **k))
    for args, key in ((["-m", "seed=0,1", *TINY, f"hydra.sweep.dir={folder}", "resume=true"], "hydra.sweep.dir"),
                      ([*TINY, f"hydra.run.dir={folder}"], "hydra.run.dir")):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # Hydra's "Callback ... raised" warning would fail here
            code, out, err = main_in_process(monkeypatch, capsys, args)
        lines = messages(err)
        assert code == 2 and len(lines) == 1 and lines[0].startswith(f"racsim: error: {key} = '{folder}': "), err
        assert "racsim.conf" not in err and "Traceback" not in err
    assert (tmp_path / "afile").read_text() == "the user's"


def test_an_os_error_outside_the_config_files_is_not_blamed_on_them(monkeypatch):
    """No temporary folder to be found, raised under Hydra's app, whose frame holds ``config_path``:
    once "pkg://racsim.conf: cannot be read (No usable temporary directory ...)"."""
    import tempfile

    from racsim.app.cli import error_line

    def none():
        raise FileNotFoundError(2, "No usable temporary directory found in ['/tmp']")

    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.setattr(tempfile, "_get_default_tempdir", none)

    def hydra_main(config_path="pkg://racsim.conf"):  # the frame of Hydra's run, as the issue saw it
        tempfile.gettempdir()

    with pytest.raises(FileNotFoundError) as ex:
        hydra_main()
    line = error_line(ex.value)
    assert "racsim.conf" not in line and "No usable temporary directory" in line and "TMPDIR" in line


def test_no_temporary_folder_leaves_a_pool_without_shared_numbers(monkeypatch):
    import tempfile

    from racsim import io as IO

    def none(*a, **k):
        raise FileNotFoundError(2, "No usable temporary directory found")

    monkeypatch.setattr(tempfile, "gettempdir", none)
    monkeypatch.setattr(tempfile, "mkdtemp", none)
    with IO.shared_numbers() as folder:
        assert folder is None


def test_a_killed_writers_staging_folder_goes_with_the_next_publish(tmp_path):
    """A staging folder names its writer (pid@host): the next writer into the folder takes away those of
    this host whose writer is gone (a SIGKILL left its partial copies), never a live one's nor another host's."""
    host = socket.gethostname()
    dead = tmp_path / f"{STAGE}{2**22 + 7}@{host}-abcd1234"
    alive = tmp_path / f"{STAGE}{os.getpid()}@{host}-efgh5678"
    other = tmp_path / f"{STAGE}{2**22 + 7}@elsewhere-node-9-ijkl9012"
    for d in (dead, alive, other):
        d.mkdir()
        (d / "capacity.csv").write_text("count,load\n1,")  # half written
    written = publish(tmp_path, lambda stage: [(stage / "summary.md").write_text("x") and stage / "summary.md"])
    assert [p.name for p in written] == ["summary.md"] and (tmp_path / "summary.md").read_text() == "x"
    assert not dead.exists() and alive.exists() and other.exists()
    assert not [p for p in tmp_path.glob(f"{STAGE}*") if str(os.getpid()) in p.name and p != alive]  # its own: gone


def test_the_bar_fits_the_terminal_it_draws_on(monkeypatch):
    """The bar on stderr's terminal of 40 columns, whatever stdout is (a pipe here)."""
    monkeypatch.delenv("COLUMNS", raising=False)
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 40, 0, 0))
    with os.fdopen(slave, "w") as tty:
        p = Progress("a run with a long name", mode="bar", stream=tty, ticking=False)
        p.start("bias benchmark", 1000, "trial", note="simulating the pipeline: 45%")
        assert len(p.bar()) <= 40 and p.bar().endswith("...")
        monkeypatch.setenv("COLUMNS", "100")  # as shutil honours it
        assert 40 < len(p.bar()) <= 100
        p.close()
    os.close(master)


GPU = ["channel@pipeline.channels.judge=judge_gpu_rm"]


SHORTEST = [*GPU, "pipeline.channels.judge.rm.order=shortest"]  # a pool served lane by lane


@pytest.mark.parametrize("engine, over", [("simpy", []), ("lanes", GPU),
                                          *(pytest.param("lanes", o, marks=pytest.mark.long) for o in ([], SHORTEST))])
def test_the_engines_tick_inside_a_simulation_and_change_nothing(engine, over):
    """simpy: after each trial; lanes: after each step, then (a gpu_rm pool served once every submission
    is known) as its serving goes, the pool's part after the steps'; the same schedule with or without."""
    from racsim.config.defaults import default_config
    from racsim.pipeline.draws import draw
    from racsim.pipeline.engines import simulate
    from tests.helpers import assert_same_schedule

    p = default_config("pipeline.steps=12", "learner.trials=5", *over).pipeline
    draws = draw(p, 5, np.random.default_rng(3))
    shares: list = []
    ticked = simulate(p, 5, None, engine=engine, draws=draws, tick=shares.append)
    n = 5 if engine == "simpy" else 12
    if not over:
        assert shares == pytest.approx([(i + 1) / n for i in range(n)])
    else:  # the steps are the first half, the pool's serving the second
        assert shares[:n] == pytest.approx([(i + 1) / (2 * n) for i in range(n)]) and len(shares) > n
    assert all(a <= b for a, b in zip(shares, shares[1:])) and shares[-1] == pytest.approx(1.0)
    assert_same_schedule(ticked, simulate(p, 5, None, engine=engine, draws=draws), engine)


def test_a_runs_progress_note_moves_inside_the_pipelines_simulation():
    from racsim.analyses.bias_study import share_note

    said: list = []
    tick = share_note(said.append, "simulating the pipeline")
    for share in np.linspace(0.001, 1, 5000):
        tick(share)
    assert said[0] == "simulating the pipeline: 0%" and said[-1] == "simulating the pipeline: 100%"
    assert len(said) == 101 and share_note(None, "x") is None  # each whole percent once
