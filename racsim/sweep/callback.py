"""Sweeps that scale out and survive faults.

- **Completion marker.** A job's last write is ``done.json`` (atomic, after
  every result file): its cell (the job's overrides, and their typed values),
  its runtime, and the size and SHA-256 of every file it wrote. A folder
  without it holds no complete result, whatever else is in it.
- **Resume.** ``resume=true`` skips every job whose marker says it is complete
  for the same cell, and runs the rest. The folder of an interrupted sweep is
  found again from the command alone: the ``racsim.sweep_dir`` resolver (the
  default ``hydra.sweep.dir``) gives a new timestamped folder, or with
  ``resume=true`` the interrupted one under ``outputs/<name>/`` whose sweep had the
  same overrides (:func:`find_sweep`). ``hydra.sweep.dir=...`` pins it by hand.
- **The callback** (``hydra.callbacks`` in conf/config.yaml): each job logs its
  cell and its runtime; the sweep prints jobs done/running/left with a time
  estimate (it watches the folder, so it works with any launcher that shares a
  file system); at the end it gathers every job into the sweep's
  ``results.parquet`` / ``results.csv`` / ``report.md`` and prints the table averaged over
  seeds (see ``racsim.sweep.gather``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import sys
import time
import traceback
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from racsim.config.defaults import replace_grid
from racsim.config.names import what_if_name
from racsim.config.spec import scenario
from racsim.config.validate import check_name
from racsim.errors import ConfigError, JobError, WriteFailure, reason, say, write_failure
from racsim.io import pin_blas_threads, usable_cores
from racsim.progress import Progress, hms
from racsim.sweep.detached import detach_submitit_local, keep_sigterm_under_ray
from racsim.sweep.markers import (
    DONE,
    OWNED,
    RESUME_KEY,
    cell_overrides,
    LOCK,
    cell_values,
    foreign,
    hold_folder,
    is_complete,
    job_dirs,
    numbered_folders,
    owned_names,
    publish,
    read_marker,
    record_owned,
    sha256,
    transient,
    write_marker,
)

log = logging.getLogger("racsim.sweep")




def _hydra_cfg() -> Optional[DictConfig]:
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get()
    except Exception:  # not under Hydra (a direct call)
        return None


def in_multirun() -> bool:
    hc = _hydra_cfg()
    if hc is None:
        return False
    from hydra.types import RunMode

    return hc.mode == RunMode.MULTIRUN


RACSIM_LAUNCHER = "RacsimLauncher"  # hydra_plugins/racsim_sweeper: the launcher whose jobs are lean by default


def lean_job(cfg: Any) -> bool:
    """Whether this run writes the lean folder (``output.job_files``): ``lean``, or ``auto``
    in a sweep job run by racsim's launcher (other launchers and single runs: full)."""
    mode = OmegaConf.select(cfg, "output.job_files", default="full")
    if mode != "auto":
        return mode == "lean"
    hc = _hydra_cfg()
    return in_multirun() and str(OmegaConf.select(hc, "launcher._target_", default="")).endswith(RACSIM_LAUNCHER)


class Job:
    """Bookkeeping of one run or sweep job: decides whether ``resume`` skips it,
    and writes its completion marker once everything else is on disk."""

    def __init__(self, cfg: Any, out_dir: Path):
        hc = _hydra_cfg()
        self.out_dir = Path(out_dir)
        raw = list(hc.overrides.task) if hc is not None else []
        self.overrides = cell_overrides(raw)
        self.num = OmegaConf.select(hc, "job.num", default=None) if in_multirun() else None
        self.cell = cell_values(cfg, self.overrides)
        self.t0 = time.perf_counter()
        self._threads = None
        self.skip = bool(cfg.get(RESUME_KEY, False)) and is_complete(self.out_dir, self.overrides)
        if self.skip:  # else the old marker goes when the new results land (racsim.sweep.markers.publish), not before
            log.info("%s: complete, skipped (resume)", self.label)

    def computing(self) -> None:
        """The job computes its results here (a sweep job of the racsim launcher's batch does not): pin BLAS."""
        self._threads = pin_blas_threads()

    @property
    def label(self) -> str:
        return "run" if self.num is None else f"job {self.num}"

    def finish(self, written: Iterable[Path], digests: Optional[Dict[str, dict]] = None) -> Path:
        """Write ``done.json``: the job's last act (``digests``: racsim.sweep.markers.write_marker). Its
        ``runtime_s``: the job's seconds here and, for a sweep job racsim's launcher computed ahead with its
        batch, its share of the batch's (:data:`SHARE`), as the job's racsim.log says."""
        share = SHARE.get(self.num, 0.0) if self.num is not None else 0.0
        path = write_marker(self.out_dir, written, overrides=self.overrides, cell=self.cell, job=self.num,
                            runtime_s=time.perf_counter() - self.t0 + share, digests=digests)
        if self.num is None:  # a single run is complete: what it made stays, whatever stops the process now
            CREATED.clear()
            if "dir" in _SINGLE:
                _SINGLE["done"] = True
        self.close()
        return path

    def close(self) -> None:
        """Give BLAS back its own thread count."""
        limits, self._threads = self._threads, None
        if limits is not None:
            limits.restore_original_limits()


def _stamp() -> str:
    return datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


# What this process made for its run's output (path, whole tree?), in order: taken away
# again when the run stops before it starts (remove_created); nothing else ever is.
CREATED: List[tuple] = []
_RELEASE: List[Any] = []  # gives back the folder this process holds (racsim.sweep.markers.hold_folder)


def _note_new(path: Path) -> None:
    """Record the folders above ``path`` that do not exist yet (they will be made here)."""
    missing = []
    for d in [path, *path.parents]:
        if d.exists() or str(d) in ("", "."):
            break
        missing.append(d)
    CREATED.extend((d, False) for d in reversed(missing))


def unique_dir(path: str) -> str:
    """Resolver ``racsim.unique_dir``: make the folder ``path`` now, or ``path_2``,
    ``path_3``... when another run took it (two runs started in the same second):
    a folder belongs to one run."""
    base = Path(str(path))
    _note_new(base.parent)
    base.parent.mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        cand = base if n == 1 else base.with_name(f"{base.name}_{n}")
        try:
            cand.mkdir()
        except FileExistsError:
            n += 1
            continue
        CREATED.append((cand, True))
        return str(cand)


def remove_created() -> None:
    """Take away what this process made for a run that stopped before it started
    (its folder, or Hydra's .hydra/ and racsim.log in a folder that existed), and
    give its folder back; nothing that was there before."""
    while _RELEASE:
        _RELEASE.pop()()
    for path, tree in reversed(CREATED):
        try:
            if tree and path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.is_dir() and not path.is_symlink():
                path.rmdir()  # a folder above the run's: only when left empty
            else:
                path.unlink(missing_ok=True)
        except OSError:
            pass
    CREATED.clear()


def keep_created() -> None:
    """Keep what this process made for a run once its files are published: nothing that
    happens after (a failure, a closed pipe, Ctrl-C) takes away finished work."""
    CREATED.clear()


def publish_run(out_dir: Path, cfg: Any, write) -> List[Path]:
    """Write a run's files into ``out_dir`` through a staging folder (racsim.sweep.markers.publish):
    a ConfigError, and nothing touched, when one would replace a file racsim did not write, or
    (a single run) one the user edited since an earlier run wrote it there.
    A single run notes the files it adds (:data:`CREATED`), for an interrupt before it completes."""
    force = bool(OmegaConf.select(cfg, "output.force", default=False))

    def staged(stage: Path) -> List[Path]:
        paths = write(stage)
        if not in_multirun():
            new = [n for n in (OWNED, *(p.name for p in stage.iterdir())) if not os.path.lexists(out_dir / n)]
            CREATED.extend((out_dir / n, False) for n in new)
        return paths

    try:
        return publish(out_dir, staged, force=force, also=[DONE], edits_by_marker=not in_multirun())
    except FileExistsError as ex:
        raise ConfigError("output.force", force, f"true to replace them: {ex}") from None


def refuse(ex: ConfigError, also: Optional[ConfigError] = None) -> None:
    """Stop the command from a Hydra callback (which turns an exception into a warning and
    goes on): one line (with ``also``, a bad value of the run's config found beside it), exit
    status 2, and what this process made taken away."""
    remove_created()
    say(f"racsim: error: {ex}" + (f"; also {also}" if also is not None else ""), sys.stderr)
    raise SystemExit(2)


def hold(folder: Path, what: str) -> None:
    """Take ``folder`` for this process; a ConfigError naming the run that holds it."""
    try:
        _RELEASE.append(hold_folder(folder, what))
    except FileExistsError as ex:
        raise ConfigError(f"hydra.{what}.dir", str(folder), str(ex)) from None


def holding() -> bool:
    """Whether this process holds a run's or a sweep's folder (:func:`hold`), until :func:`release`."""
    return bool(_RELEASE)


def release() -> None:
    while _RELEASE:
        _RELEASE.pop()()


def _recorded_overrides(sweep: Path) -> Optional[List[str]]:
    import yaml

    try:
        doc = yaml.safe_load((sweep / "multirun.yaml").read_text())
        return cell_overrides(doc["hydra"]["overrides"]["task"])
    except Exception:
        return None


def sweeps_of(base: str, task_overrides: Iterable[str]) -> List[Path]:
    """The ``base/multirun_*`` folders whose sweep had these overrides, newest first."""
    want = cell_overrides(task_overrides)
    root = Path(base)
    if not root.is_dir():
        return []
    return [d for d in sorted(root.glob("multirun_*"), reverse=True)  # timestamps sort as text
            if d.is_dir() and _recorded_overrides(d) == want]


def jobs_done(sweep: Path) -> int:
    """Jobs of ``sweep`` that wrote their completion marker."""
    return sum(read_marker(d) is not None for d in job_dirs(sweep))


def interrupted(sweep: Path) -> bool:
    """A sweep that never gathered its jobs (its last act): stopped, killed, or still running."""
    return not (sweep / GATHERED[0]).is_file()


def find_sweep(base: str, task_overrides: Iterable[str]) -> Optional[Path]:
    """The sweep of this command that ``resume=true`` continues: of its interrupted ones
    (:func:`interrupted`), the one with the most jobs done, the newest of those (a rerun
    without ``resume=true``, stopped early, leaves a newer folder with fewer); else its newest."""
    found = sweeps_of(base, task_overrides)
    stopped = [d for d in found if interrupted(d)]
    if stopped:
        return max(stopped, key=jobs_done)  # max keeps the first (newest) of equals
    return found[0] if found else None


def sweep_dir(base: str, task_overrides: Any, resume: Any) -> str:
    """Resolver ``racsim.sweep_dir``: ``base/multirun_<now>``, or when ``resume`` is true the
    earlier sweep of the same command under ``base`` that :func:`find_sweep` picks. A new sweep
    says where an interrupted one of the same command with jobs done is (resume=true continues it)."""
    overrides = [str(o) for o in (task_overrides or [])]
    if resume is True or str(resume).lower() == "true":
        found = find_sweep(str(base), overrides)
        if found is not None:
            return str(found)
        log.warning("resume: no earlier sweep of these overrides under %s; starting a new one", base)
    earlier = find_sweep(str(base), overrides)
    new = unique_dir(f"{base}/multirun_{_stamp()}")
    if earlier is not None and interrupted(earlier) and jobs_done(earlier):
        say(f"racsim: sweep: an interrupted sweep of this command, {jobs_done(earlier)} jobs done, is in "
            f"{earlier}: add resume=true to continue it; starting a new one")
    return new


def what_if_folder(*, _root_: Any) -> str:
    """Resolver ``racsim.what_if``: :func:`~racsim.config.names.what_if_name` of the run's task overrides as
    written (an override holding an interpolation, ``seed=${nope}``, is named, not resolved: its own check
    refuses it, naming its key)."""
    task = OmegaConf.select(_root_, "hydra.overrides.task", default=None)
    return what_if_name(OmegaConf.to_container(task, resolve=False) if task is not None else [])


def register_resolvers() -> None:
    # Cached, like ${now:}: every job of the sweep sees the value the launcher saw
    # (the cache travels with the config to joblib, submitit and Ray workers).
    if not OmegaConf.has_resolver("racsim.sweep_dir"):
        OmegaConf.register_new_resolver("racsim.sweep_dir", sweep_dir, use_cache=True)
    if not OmegaConf.has_resolver("racsim.unique_dir"):
        OmegaConf.register_new_resolver("racsim.unique_dir", unique_dir, use_cache=True)
    if not OmegaConf.has_resolver("racsim.what_if"):  # a single run's folder named after its overrides
        OmegaConf.register_new_resolver("racsim.what_if", what_if_folder)


register_resolvers()  # at import: workers unpickle the callback (this module) before composing


def count_jobs(config: DictConfig) -> Optional[int]:
    """How many jobs Hydra's basic sweeper (or racsim's, the same grid) makes of this command
    (None for another sweeper)."""
    try:
        target = str(OmegaConf.select(config, "hydra.sweeper._target_", default=""))
        if not target.endswith(("BasicSweeper", "RacsimSweeper")):
            return None
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.override_parser.overrides_parser import OverridesParser

        params = OmegaConf.select(config, "hydra.sweeper.params", default=None) or {}
        args = [f"{k}={v}" for k, v in params.items()] + [str(o) for o in config.hydra.overrides.task]
        batches = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(args), None)
        return sum(len(b) for b in batches)
    except Exception:
        return None


PREPARED: Dict[int, Any] = {}  # job number -> (its spec, its RunResult), computed ahead with others by the racsim launcher


def take_prepared(num: Optional[int]) -> Optional[Tuple[Any, Any]]:
    """(the spec, the results) the racsim launcher computed ahead for sweep job ``num`` (None: run it).
    The spec is the job's config as racsim.config.spec.scenario gives it (racsim.sweep.sweeper.Composer.cell_object)."""
    return None if num is None else PREPARED.pop(num, None)


_FAILURES: List[Tuple[int, str, str]] = []  # (job, cell, reason): the failed jobs of the sweep in this process


def record_failures(failures: Iterable[Tuple[int, str]], labels: List[str]) -> None:
    """The racsim sweeper's failed jobs (number, reason), for the callback to list when the sweep ends."""
    _FAILURES[:] = [(i, labels[i], why) for i, why in failures]


def failures_line(failures: List[Tuple[int, str, str]], total: Optional[int], shown: int = 5) -> str:
    """One line: how many jobs failed and, for the first few, which and why."""
    parts = [f"job {i} ({cell}): {why}" for i, cell, why in failures[:shown]]
    more = f"; and {len(failures) - shown} more" if len(failures) > shown else ""
    of = f" of {total}" if total is not None else ""
    return (f"racsim: sweep: {len(failures)}{of} jobs failed (see each job's racsim.log; resume=true reruns them): "
            + "; ".join(parts) + more)


def job_failure(error: BaseException) -> Exception:
    """What a failed job hands back to the sweep: its ConfigError (it pickles), or any other error
    as a JobError of its one-line reason, made here: a launcher pickles the job's return to the
    sweep's process (joblib, submitit, Ray), where an error that does not unpickle would lose every
    job of the batch, and its cause (the key it names) would not come along."""
    return error if isinstance(error, ConfigError) else JobError(reason(error))


def log_to_files(title: str, error: BaseException) -> None:
    """``error``'s traceback into the log files of this process (a job's racsim.log) only, not
    its console: Hydra's job log writes to stdout, which a sweep shares with all its jobs."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__)).rstrip()
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, "%s:\n%s", (title, text), None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


# job number -> since when (time.time()) racsim's launcher computes it ahead: its batch's start, or the end of the
# batch's job before it (a batch computes its jobs one after another)
AHEAD: Dict[int, float] = {}
SHARE: Dict[int, float] = {}  # job number -> its own seconds of the batch that computed it ahead
# the batch racsim's launcher computes now: [its Progress (units: trials), when it began, its jobs]
BATCH: List[Any] = []


def _mtime(path: Path) -> Optional[float]:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


class JobCounts:
    """A sweep's jobs, from its folder (any launcher that shares a file system) and from racsim's
    launcher in this process: done (marker present; ``fresh``: written since the sweep began, as a sweep
    that computes its jobs again needs), running (started since the sweep began and no marker yet, or
    computed ahead here: :data:`AHEAD`, then :data:`PREPARED` until written) and left; and the time left
    (:meth:`left_s`) from the finished jobs' seconds and how many run side by side."""

    def __init__(self, sweep: Path, total: Optional[int], started: float, fresh: bool = False):
        self.sweep, self.total, self.started, self.fresh = Path(sweep), total, started, fresh
        self.took: Dict[Path, Tuple[float, float]] = {}  # a job finished in this sweep -> (its own seconds, its share)
        self.side_by_side = 1  # the most jobs seen computing at once (a batch computed ahead is one process)

    def counts(self, now: Optional[float] = None) -> Dict[str, Any]:
        """``done``, ``running``, ``left`` (None: the total is not known) and ``left_s`` (None: no job finished yet)."""
        now = time.time() if now is None else now
        done, ages = 0, []
        for d in job_dirs(self.sweep):
            began = _mtime(d / ".hydra" / "overrides.yaml")  # Hydra's run_job and racsim's launcher write it first
            ended = _mtime(d / DONE)
            if ended is not None and not (self.fresh and ended < self.started):
                done += 1
                if ended >= self.started and d not in self.took:
                    self.took[d] = self._seconds(d, began, ended)
            elif began is not None and began >= self.started:
                ages.append(now - began)
        ahead, prepared = list(AHEAD.values()), len(PREPARED)
        self.side_by_side = max(self.side_by_side, len(ages) + (1 if ahead else 0))
        running = len(ages) + len(ahead) + prepared
        left = None if self.total is None else max(self.total - done - running, 0)
        return {"done": done, "running": running, "left": left,
                "left_s": self.left_s(now, ages, ahead, prepared, left)}

    @staticmethod
    def _seconds(d: Path, began: Optional[float], ended: float) -> Tuple[float, float]:
        """A finished job's own seconds (from its folder's start to its marker) and its share of a batch
        computed ahead."""
        marker = read_marker(d) or {}
        share = SHARE.get(marker.get("job"), 0.0)  # done.json's runtime_s counts it too (Job.finish)
        own = (ended - began if began is not None and ended >= began
               else max(0.0, float(marker.get("runtime_s") or 0.0) - share))
        return own, share

    def left_s(self, now: float, ages: List[float], ahead: List[float], prepared: int,
               left: Optional[int]) -> Optional[float]:
        """The seconds left: every job left at the finished jobs' mean seconds, each running one's rest of
        it (a batch computed ahead: its jobs' mean share, less what it has run), divided among the jobs
        seen running side by side. Before any job has finished, from the batch computing now: its
        seconds so far over the share of its trials done, per job (:func:`batch_left_s`)."""
        if left is None:
            return None
        if not self.took:
            return batch_left_s(now, left + len(ages))
        own = sum(o for o, _ in self.took.values()) / len(self.took)
        shares = [s for _, s in self.took.values() if s > 0]
        share = sum(shares) / len(shares) if shares else own
        each = own + sum(s for _, s in self.took.values()) / len(self.took)
        work = left * each + sum(max(each - a, 0.0) for a in ages) + (len(ahead) + prepared) * own
        if ahead:
            work += max(len(ahead) * share - (now - min(ahead)), 0.0)
        return work / self.side_by_side


def batch_left_s(now: float, jobs: int) -> Optional[float]:
    """The seconds left: the rest of the batch racsim's launcher computes now (:data:`BATCH`: its seconds
    so far over the share of its trials done), then ``jobs`` more jobs at its pace per job. None without
    such a batch, or before a trial of it is done."""
    if not BATCH:
        return None
    meter, began, size = BATCH
    p = meter.phase
    if p is None or not p.done or not p.total:
        return None
    whole = (now - began) * p.total / p.done
    return max(whole - (now - began), 0.0) + jobs * whole / size


class _Poll:
    """The sweep's progress refreshed from its :class:`JobCounts` (at most every ``every_s`` seconds,
    and 20 times less often than a count takes: a folder of 10,000 jobs is not walked every second)."""

    def __init__(self, counts: JobCounts, every_s: float):
        self.counts, self.every_s = counts, every_s
        self.last, self.cost_s, self.key = -math.inf, 0.0, None

    def __call__(self, progress: Progress, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < max(self.every_s, 20 * self.cost_s):
            return
        try:
            c = self.counts.counts()
        except Exception:  # a folder that moved under the walk: the next poll
            return
        self.last, self.cost_s = now, time.monotonic() - now
        key = (c["done"], c["running"], c["left_s"] is not None)  # a line too when the first estimate comes
        note = f"{c['running']} running" + ("" if c["left"] is None else f", {c['left']} left")
        progress.update(c["done"], note, line=key != self.key, left_s=c["left_s"])
        self.key = key


# what the end of a sweep writes in its folder (and a sweep_<knob>.png per swept numeric knob)
GATHERED = ("results.parquet", "results.csv", "aggregate.parquet", "aggregate.csv", "report.md")


def check_sweep_folder(sweep: Path, config: DictConfig) -> None:
    """A sweep folder holds one sweep: refuse one that holds another sweep's jobs (other
    overrides), one that another live sweep holds, and one where gathering would replace
    a file racsim did not write (``output.force=true`` allows that)."""
    check_writable("hydra.sweep.dir", sweep)
    want = cell_overrides(config.hydra.overrides.task)
    had = _recorded_overrides(sweep) if (sweep / "multirun.yaml").is_file() else None
    if had is not None and had != want:
        raise ConfigError("hydra.sweep.dir", str(sweep),
                          f"a folder of its own: it holds another sweep ({' '.join(had) or 'no overrides'})")
    force = OmegaConf.select(config, "output.force", default=False)
    finished = jobs_done(sweep) if had is not None and sweep.is_dir() else 0
    if finished and not force and not OmegaConf.select(config, RESUME_KEY, default=False):
        raise ConfigError("hydra.sweep.dir", str(sweep), rerun_refusal(sweep, finished, count_jobs(config)))
    clash = foreign(sweep, GATHERED)
    if clash and not force:
        raise ConfigError("hydra.sweep.dir", str(sweep), f"a folder where racsim would not replace the user's "
                          f"{', '.join(clash)} (or output.force=true)")
    users = [] if force else users_in_job_folders(sweep, config)
    if users:
        raise ConfigError("hydra.sweep.dir", str(sweep), f"a folder whose job folders hold only racsim's files "
                          f"(Hydra and the jobs would write beside the user's {', '.join(users[:3])}"
                          f"{' and more' if len(users) > 3 else ''}): choose another folder, or output.force=true")
    n_jobs = OmegaConf.select(config, "hydra.launcher.n_jobs", default=None)
    if n_jobs is not None:  # joblib: n_jobs processes, or all cores + 1 + n_jobs when negative
        cores = usable_cores()
        ok = isinstance(n_jobs, int) and not isinstance(n_jobs, bool) and n_jobs != 0 and -cores - 1 < n_jobs < 2**15
        _need_launcher(ok, n_jobs, cores)
    _note_new(sweep)  # a sweep refused before its first job (its cells checked) leaves no empty folder behind
    sweep.mkdir(parents=True, exist_ok=True)
    _RELEASE.clear()
    hold(sweep, "sweep")


def rerun_refusal(sweep: Path, finished: int, total: Optional[int]) -> str:
    """Why a sweep is not run again into its own folder without ``resume=true``: it holds finished jobs
    of this very sweep (each would be computed again and replaced), and the command that continues it."""
    import shlex

    again = shlex.join(["racsim", *sys.argv[1:], f"{RESUME_KEY}=true"])
    of = f" of {total}" if total is not None else ""
    state = "gathered" if not interrupted(sweep) else "interrupted"
    return (f"a folder without finished jobs of this sweep, unless resume=true: it holds this sweep ({state}, "
            f"{finished}{of} jobs done); continue it with: {again} (its finished jobs kept), or compute every "
            f"job again with output.force=true, or choose another folder")


def users_in_job_folders(sweep: Path, config: DictConfig) -> List[str]:
    """What a user keeps in the folders the sweep's jobs would write into (``sweep/0`` ... when
    job folders are numbered; a custom ``hydra.sweep.subdir`` is not resolved before the jobs
    run): files racsim did not write, a file where a job folder goes, and anything in Hydra's
    ``hydra.output_subdir`` but Hydra's three files. An earlier run of racsim's, complete or
    stopped at any moment, leaves only its own files there (``resume=true`` relies on it)."""
    total = count_jobs(config)
    if not sweep.is_dir() or total is None or not numbered_folders(config):
        return []
    sub = OmegaConf.select(config, "hydra.output_subdir", default=None)
    racsims = {OWNED, LOCK, f"{config.hydra.job.name}.log", *([] if sub is None else [str(sub)])}
    out = []
    for i in range(total):
        job = sweep / str(i)
        if not os.path.lexists(job):
            continue
        if not job.is_dir():
            out.append(f"{i} (a file)")
            continue
        mine = racsims | owned_names(job)
        out += [f"{i}/{p.name}" for p in sorted(job.iterdir()) if p.name not in mine and not transient(p.name)]
        hyd = job / str(sub) if sub is not None else None
        if hyd is not None and hyd.is_dir():
            out += [f"{i}/{sub}/{p.name}" for p in sorted(hyd.iterdir()) if p.name not in HYDRA_FILES]
        elif hyd is not None and os.path.lexists(hyd):
            out.append(f"{i}/{sub} (a file)")
    return out


def _need_launcher(ok: bool, n_jobs: Any, cores: int) -> None:
    if not ok:
        raise ConfigError("hydra.launcher.n_jobs", n_jobs, f"a number of processes >= 1 (or -1 for all {cores} "
                                                           f"cores, -2 for all but one...)")


HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")  # what Hydra writes in a run's hydra.output_subdir


def hydra_files(run: Path, config: DictConfig) -> List[Tuple[Path, List[str]]]:
    """(folder, names) of the files Hydra writes into a single run's folder: the job's log,
    and its ``hydra.output_subdir`` (``.hydra``, unless set otherwise or null) of three."""
    out = [(run, [f"{config.hydra.job.name}.log"])]
    sub = OmegaConf.select(config, "hydra.output_subdir", default=None)
    if sub is not None:
        out.append((run / str(sub), list(HYDRA_FILES)))
    return out


def check_writable(key: str, folder: Path) -> None:
    """``folder`` (given as ``key``) must be a folder, or one that can be made: not a file, nor
    under one, and writable by this user where it begins to exist; else a ConfigError naming it."""
    for d in (folder, *folder.parents):
        if d.exists():  # the nearest folder that exists (a link followed)
            if not d.is_dir():
                raise ConfigError(key, str(folder), "a folder, not a file" if d == folder else
                                  f"a folder: {d} is a file, so nothing can be made under it")
            if not os.access(d, os.W_OK | os.X_OK):
                raise ConfigError(key, str(folder), f"a folder you can write to ({d} is not writable)")
            return


def check_run_folder(run: Path, config: DictConfig) -> None:
    """A single run's ``hydra.run.dir`` must be a folder (not a file, nor under one) that this
    user can write, where Hydra would replace no file of the user's (its log and its
    ``.hydra/`` files: racsim's own, :func:`own_hydra_files`, are replaced) unless
    ``output.force``: else a ConfigError naming it, before anything is written."""
    where = str(run)
    check_writable("hydra.run.dir", run)
    clash = []
    for folder, names in hydra_files(run, config):
        if os.path.lexists(folder) and not folder.is_dir():
            raise ConfigError("hydra.run.dir", where, f"a folder where Hydra can make {folder.name}/ "
                                                      f"({folder} is a file of the user's)")
        clash += [(folder / n).relative_to(run).as_posix() for n in foreign(folder, names)] if folder.is_dir() else []
    if clash and not OmegaConf.select(config, "output.force", default=False):
        raise ConfigError("hydra.run.dir", where, f"a folder where Hydra would not replace the user's "
                                                  f"{', '.join(clash)} (choose another folder, or output.force=true)")


def _note_hydra_files(run: Path, config: DictConfig) -> None:
    """Note (:data:`CREATED`) what Hydra and racsim are about to make in a single run's folder
    and is not there yet: the ``hydra.output_subdir`` folder (whole), else each file."""
    for folder, names in hydra_files(run, config):
        if folder != run and not os.path.lexists(folder):
            CREATED.append((folder, True))
        else:
            CREATED.extend((folder / n, False) for n in (*names, OWNED) if not os.path.lexists(folder / n))


def own_hydra_files(run: Path, config: DictConfig) -> None:
    """Record Hydra's files of a single run as racsim's (``.racsim-files``), with the SHA-256 of
    the ``.hydra/`` ones: the next run in the folder may replace them while they are unchanged."""
    for folder, names in hydra_files(run, config):
        log = folder == run
        record_owned(folder, {n: None if log else sha256(folder / n) for n in names if (folder / n).is_file()})


def config_error(config: DictConfig) -> Optional[ConfigError]:
    """The first bad value of a run's own config (what the run would refuse), or None:
    so that a refusal of the run's folder reports it too."""
    import copy

    from omegaconf import open_dict, read_write

    from racsim.analyses.grid import expand  # lazy: the simulator loads only when needed

    task = copy.deepcopy(config)
    with read_write(task), open_dict(task):
        del task["hydra"]
    try:
        expand(scenario(replace_grid(task, config.hydra.overrides.task)))
    except ConfigError as ex:
        return ex
    except Exception:  # not a bad value (the run reports the rest itself)
        pass
    return None


class Stopped(KeyboardInterrupt):
    """SIGTERM during a run or a sweep: it ends them as Ctrl-C does (racsim.app.cli.main)."""


def _stop(signum: int, frame: Any) -> None:
    _SINGLE["sigterm"] = True  # what ends the process, even where a library re-raises a plain KeyboardInterrupt (Ray)
    raise Stopped()


REPEAT_S = 1.0  # Ctrl-C pressed again within this many seconds is the same interrupt (a swallowed one is raised again after)


def _interrupt(signum: int, frame: Any) -> None:
    now = time.monotonic()
    if now - _SINGLE.get("sigint", -REPEAT_S) < REPEAT_S:  # the first is being answered: not a second inside its clean-up
        return
    _SINGLE["sigint"] = now  # kept: Python swallows an exception raised inside a weakref callback or a __del__
    raise KeyboardInterrupt()


def raise_pending_interrupt() -> None:
    """Raise the interrupt a signal handler raised where Python swallowed it (it prints "Exception
    ignored in ..." and runs on), so that a Ctrl-C or SIGTERM at any instant ends a sweep at the
    next job's edge; a no-op when none came."""
    if _SINGLE.get("sigterm"):
        raise Stopped()
    if _SINGLE.get("sigint"):
        raise KeyboardInterrupt()


def stopped_by_sigterm(ex: BaseException) -> bool:
    """Whether the interrupt ``ex`` came of SIGTERM (exit 143) rather than Ctrl-C (130)."""
    return isinstance(ex, Stopped) or bool(_SINGLE.get("sigterm"))


_SINGLE: Dict[str, Any] = {}  # this process's single run (its folder, whether it finished), the signals' old handlers, which signal came


def catch_sigterm(again: bool = False) -> None:
    """From now on SIGTERM ends this process as Ctrl-C does (racsim.app.cli.main cleans up and says
    what was kept), and both are remembered (:func:`raise_pending_interrupt`), until
    :func:`end_single_run` gives them their handlers back (``again``: SIGTERM taken back from a
    library that replaced it meanwhile, whose handler is not the one to restore). A SIGINT that
    this process ignores (started in the background) stays ignored."""
    import signal

    try:
        before = signal.signal(signal.SIGTERM, _stop)
    except ValueError:  # not the main thread: the signals keep their handlers
        return
    if again:
        return
    _SINGLE.setdefault("term", before)
    catch_sigint()


def catch_sigint() -> None:
    """From now on a Ctrl-C is remembered as well as raised (:func:`raise_pending_interrupt`), until
    :func:`end_single_run` gives SIGINT its handler back; a SIGINT this process ignores, or one a
    library handles, is left as it is (as is any outside the main thread)."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        _SINGLE.setdefault("int", signal.signal(signal.SIGINT, _interrupt))


def start_single_run(run: Path) -> None:
    """A single run began in ``run``: SIGTERM now ends it as Ctrl-C does."""
    _SINGLE.update(dir=run, done=False)
    catch_sigterm()


def single_run() -> Optional[Dict[str, Any]]:
    """{dir, done} of this process's single run, or None (a sweep, or before the run began)."""
    return dict(_SINGLE) if "dir" in _SINGLE else None


def end_single_run() -> None:
    """Give SIGTERM and SIGINT back their handlers; the process runs no single run any more."""
    import signal

    for key, signum in (("term", signal.SIGTERM), ("int", signal.SIGINT)):
        if key in _SINGLE:
            signal.signal(signum, _SINGLE[key])
    _SINGLE.clear()


@contextlib.contextmanager
def refusing_os_errors(key: str, config: DictConfig):
    """A callback's folder work, where a folder that cannot be made, taken or written stops the command
    with one line naming ``key`` (``hydra.run.dir``, ``hydra.sweep.dir``): Hydra would turn the error
    into a two-line warning, go on, and fail later on a file it blames instead."""
    try:
        yield
    except OSError as ex:
        folder = OmegaConf.select(config, key, default="?")
        where = f"{ex.filename}: " if ex.filename and str(ex.filename) != str(folder) else ""
        refuse(ConfigError(key, str(folder), f"a folder this user can make and write into ({where}"
                                             f"{ex.strerror or ex})"))


class SweepCallback(Callback):
    """Hydra callback (conf/config.yaml ``hydra.callbacks.racsim``)."""

    def __init__(self, progress_every_s: float = 2.0, gather: bool = True) -> None:
        self.progress_every_s = float(progress_every_s)
        self.gather = bool(gather)
        self._progress: Optional[Progress] = None
        self._job_t0: Optional[float] = None
        self._started = time.time()

    def __getstate__(self) -> Dict[str, Any]:  # workers get the settings, not the progress and its thread
        state = dict(self.__dict__)
        state["_progress"] = None
        return state

    # -- a single run: its folder is made (or taken) here, before Hydra writes into it
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        with refusing_os_errors("hydra.run.dir", config):
            self._run_start(config)

    def _run_start(self, config: DictConfig) -> None:
        raise_pending_interrupt()  # a Ctrl-C that Hydra swallowed while composing (its get_mode does): no run starts
        CREATED.clear()
        _RELEASE.clear()
        try:
            check_name(config.name)  # before the default folder, whose path holds the name, is made
            run = Path(str(config.hydra.run.dir))  # the default is made now (racsim.unique_dir)
            check_run_folder(run, config)
        except ConfigError as ex:
            refuse(ex, None if ex.key == "name" else config_error(config))
        if not any(p == run for p, _ in CREATED):
            _note_new(run)
            if not run.exists():
                CREATED[-1] = (run, True)
        _note_hydra_files(run, config)
        try:
            run.mkdir(parents=True, exist_ok=True)
        except OSError as ex:
            refuse(ConfigError("hydra.run.dir", str(run), f"a folder that can be made ({ex.strerror})"),
                   config_error(config))
        try:
            hold(run, "run")
        except ConfigError as ex:
            CREATED[:] = [(p, t) for p, t in CREATED if run not in (p, *p.parents)]  # the folder is another run's
            refuse(ex)
        start_single_run(run)

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        release()
        raise_pending_interrupt()  # swallowed during the run: exit 130 (or 143), "interrupted after the run finished"

    # -- the sweep, in the process that launches it
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        with refusing_os_errors("hydra.sweep.dir", config):
            self._multirun_start(config)

    def _multirun_start(self, config: DictConfig) -> None:
        raise_pending_interrupt()  # as for a single run: no sweep starts
        catch_sigterm()  # a sweep stopped by SIGTERM ends as by Ctrl-C: its launcher's workers with it, the resume hint
        self._started = time.time()
        _FAILURES.clear()
        SHARE.clear()  # an earlier sweep's in this process
        detach_submitit_local(config)
        keep_sigterm_under_ray(config, lambda: catch_sigterm(again=True))
        try:
            check_name(config.name)  # before the default folder, whose path holds the name, is made
            sweep = Path(str(config.hydra.sweep.dir))  # resolves (and caches) the folder now
            check_sweep_folder(sweep, config)
        except ConfigError as ex:
            refuse(ex)
        total = count_jobs(config)
        if total == 0:  # a swept key given no values (seed=range(0)): nothing to run, nothing made
            refuse(ConfigError("the sweep", "0 jobs", "at least one job: a swept key was given no values"))
        if OmegaConf.select(config, "output.progress", default=True):  # lines: the jobs' own lines come between
            resume = bool(OmegaConf.select(config, RESUME_KEY, default=False))  # else every job is computed again
            poll = _Poll(JobCounts(sweep, total, self._started, fresh=not resume), self.progress_every_s)
            self._progress = Progress("sweep", mode="lines", poll=poll)
            self._progress.start("sweep", total, "job")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        release()
        raise_pending_interrupt()  # the sweep's last job swallowed it: the sweep is not gathered
        progress, self._progress = self._progress, None
        if progress is not None:
            progress.stop()
            progress.poll(progress, force=True)  # the last count
            progress.finish(progress.what)
            progress.close()
        if self.gather:
            self._gather(config)
        if _FAILURES:  # the jobs that completed are gathered; the sweep still says it did not all run
            say(failures_line(_FAILURES, count_jobs(config)), sys.stderr)
            sys.exit(1)

    def _gather(self, config: DictConfig) -> None:
        # lazy: the report stack (pandas, scipy, the paper report) loads in the launching
        # process only when the sweep ends, not with Hydra's callback at start-up
        from racsim.sweep.gather import answer_text, gather_and_write  # lazy

        sweep = Path(str(config.hydra.sweep.dir))
        shown = OmegaConf.select(config, "output.progress", default=True)
        try:
            with Progress("sweep", mode="lines" if shown else "off") as progress:
                g = gather_and_write(sweep, force=bool(OmegaConf.select(config, "output.force", default=False)),
                                     plots=bool(OmegaConf.select(config, "output.plots", default=True)),
                                     progress=progress)
        except FileExistsError as ex:
            say(f"racsim: sweep: the jobs are complete but not gathered: {ex} (output.force=true, or "
                f"racsim-report {sweep} --out DIR)", sys.stderr)
            sys.exit(1)
        except FileNotFoundError as ex:
            say(f"racsim: sweep: nothing to gather ({ex})", sys.stderr)
            return
        except Exception as ex:  # every job's results are safe on disk; say so rather than end in a traceback
            say(f"racsim: sweep: the jobs are complete but gathering them failed ({write_failure(ex) or f'{type(ex).__name__}: {ex}'}); "
                f"run racsim-report {sweep} to try again", sys.stderr)
            sys.exit(1)
        say(f"racsim: sweep: {g.table['job_dir'].nunique()} jobs gathered in {sweep} "
            f"({hms(time.time() - self._started)}), {answer_text(g)}")

    # -- each job, in the process that runs it
    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        raise_pending_interrupt()  # one swallowed in the job before (this process launches them: basic)
        if not in_multirun():  # a single run says what it ran in its own output; Hydra's files are racsim's
            with contextlib.suppress(WriteFailure):  # a full disk: the run's own files fail next, in one line
                own_hydra_files(Path(str(config.hydra.runtime.output_dir)), config)
            return
        self._job_t0 = time.perf_counter()
        num = OmegaConf.select(config, "hydra.job.num", default=None)
        cell = " ".join(cell_overrides(config.hydra.overrides.task)) or "(defaults)"
        log.info("job %s: cell %s", num, cell)

    def on_job_end(self, config: DictConfig, job_return: Any = None, **kwargs: Any) -> None:
        if self._job_t0 is None:
            return
        dt = time.perf_counter() - self._job_t0
        self._job_t0 = None
        num = OmegaConf.select(config, "hydra.job.num", default=None)
        status = getattr(getattr(job_return, "status", None), "name", "DONE")
        ahead = SHARE.get(num, 0.0)  # computed ahead with its batch (racsim's launcher): its seconds there count
        log.info("job %s: %s in %.2f s%s", num, status.lower(), dt + ahead,
                 f" ({ahead:.2f} s computing with its batch, then {dt:.2f} s writing)" if ahead else "")
        error = getattr(job_return, "_return_value", None) if status == "FAILED" else None
        if isinstance(error, BaseException):  # the sweep goes on; the job's log keeps the whole story
            job_return._return_value = job_failure(error)
            log.error("job %s: failed: %s", num, job_return._return_value)
            log_to_files(f"job {num}: the failure's traceback", error)
