"""racsim's Hydra sweeper and launcher (``hydra/sweeper=racsim``, ``hydra/launcher=racsim``,
the defaults of conf/config.yaml). Hydra finds them by scanning the ``hydra_plugins``
namespace package; the logic lives in :mod:`racsim.sweep.sweeper`, imported when a sweep
starts so that the scan (every ``racsim`` start) stays cheap.

The sweeper expands the grid as Hydra's basic sweeper does (same jobs, same numbers),
checks every cell before the first job starts (one line naming the bad cells, nothing
run), skips with ``resume=true`` the jobs already complete without launching them,
hands the rest to the launcher in batches, and goes on past a job that fails (the
sweep gathers what completed, lists the failures and exits non-zero). Any launcher
works (basic, joblib, submitit, Ray); the racsim launcher runs the jobs in this
process, each config composed from a cached one, and computes a batch of one-cell
bias studies ahead as one in-process grid (racsim.analyses.dispatch.run_many), each job's task
then writing the results computed for it: the same files, byte for byte, as the
job run alone, at close to the grid's pace.
"""


import contextlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import (
    JobReturn,
    JobRuntime,
    JobStatus,
    _flush_loggers,
    configure_log,
    env_override,
    filter_overrides,
    run_job,
    setup_globals,
)
from hydra.errors import HydraException
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

log = logging.getLogger(__name__)

# Trajectory slots (trials x steps x batch) the racsim launcher computes ahead at once: a
# batch of small jobs runs as one grid, a large job alone (its schedules stay in memory
# until its task has written them).
PREPARE_SLOTS = 2_000_000
FIRST_BATCH = 4  # jobs in the sweep's first batch


@dataclass
class RacsimSweeperConf:
    _target_: str = "hydra_plugins.racsim_sweeper.racsim_sweeper.RacsimSweeper"
    max_batch_size: int = 64  # jobs handed to the launcher at a time
    check_cells: bool = True  # validate every cell before the first job starts
    params: Optional[Dict[str, str]] = None


@dataclass
class RacsimLauncherConf:
    _target_: str = "hydra_plugins.racsim_sweeper.racsim_sweeper.RacsimLauncher"


ConfigStore.instance().store(group="hydra/sweeper", name="racsim", node=RacsimSweeperConf, provider="racsim")
ConfigStore.instance().store(group="hydra/launcher", name="racsim", node=RacsimLauncherConf, provider="racsim")


def _parsed(config_loader: Any, arguments: Sequence[str]) -> list:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create(config_loader=config_loader).parse_overrides(list(arguments))


class RacsimLauncher(Launcher):
    """Hydra's basic launcher (serial, in this process), with each job's config
    composed by :class:`racsim.sweep.sweeper.Composer` (once per base, then copied) and
    batches of jobs computed ahead as one grid (:meth:`_prepare`)."""

    def __init__(self) -> None:
        super().__init__()
        self.config: Optional[DictConfig] = None
        self.task_function: Optional[TaskFunction] = None
        self.hydra_context: Optional[HydraContext] = None
        self.composer: Any = None
        self.swept: List[str] = []
        self.first = True  # the sweep's first batch is small: its first job starts within seconds

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from racsim.sweep.sweeper import Composer, swept_keys

        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function
        self.composer = Composer(hydra_context.config_loader, config)
        params = OmegaConf.select(config, "hydra.sweeper.params", default=None) or {}
        args = [f"{k}={v}" for k, v in params.items()] + list(config.hydra.overrides.task)
        self.swept = swept_keys(_parsed(hydra_context.config_loader, args))

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        jobs = list(enumerate(job_overrides, start=initial_job_idx))
        runs: List[JobReturn] = []
        at = 0
        while at < len(jobs):
            taken, picked = self._pick(jobs[at:at + FIRST_BATCH] if self.first else jobs[at:])
            self.first = False
            batch = dict(jobs[at:at + taken])
            done: Dict[int, JobReturn] = {}
            with contextlib.closing(self._prepared(picked)) as ready:
                for idx in ready:  # each job written as soon as its batch has computed it
                    done[idx] = self._run_one(idx, batch[idx])
            for idx, overrides in batch.items():  # what the batch left to its task: computed there
                if idx not in done:
                    done[idx] = self._run_one(idx, overrides)
            runs += [done[idx] for idx in batch]
            at += taken
        return runs

    def _pick(self, jobs: Sequence[Tuple[int, Sequence[str]]]) -> Tuple[int, List[Tuple[int, Any]]]:
        """(how many of the first ``jobs`` the next batch takes, as many as PREPARE_SLOTS trajectory slots
        allow and at least one; (job number, spec) of those it computes ahead as one in-process grid:
        the others, a capacity plan, a grid or an empirical mean their task replaces, or a config that
        does not make a spec (its job says why), are computed by their task)."""
        from racsim.config.defaults import GRID_KEY, empirical_blocks
        from racsim.sweep.markers import override_key

        picked: List[Tuple[int, Any]] = []
        taken = slots = 0
        for idx, overrides in jobs:
            try:
                obj = self.composer.cell_object(list(overrides), self.swept)
            except Exception:  # its job says why
                obj = None
            if obj is not None and (obj.capacity.enabled or any(override_key(o) == GRID_KEY for o in overrides)
                                    or empirical_blocks(overrides)):
                obj = None  # capacity planning, or a grid or a mean its task replaces (racsim.config.defaults)
            size = obj.learner.trials * obj.pipeline.steps * obj.pipeline.batch_size if obj is not None else 0
            if taken and slots + size > PREPARE_SLOTS:
                break
            taken, slots = taken + 1, slots + size
            if obj is not None:
                picked.append((idx, obj))
        return taken, picked

    def _prepared(self, picked: Sequence[Tuple[int, Any]]) -> Iterator[int]:
        """Compute the ``picked`` jobs (number, spec) as one in-process grid (racsim.analyses.dispatch.run_many),
        yielding each job's number as soon as its results are computed, for its task to write them
        (racsim.sweep.callback.PREPARED) before the next is computed: an interrupt keeps every job
        written. The batch's count of trials (racsim.sweep.callback.BATCH) gives the sweep a time left
        before any job has finished. If the batch fails, the jobs it has not yielded are each run by
        their task as usual, and only the failing one fails."""
        from racsim.analyses.dispatch import run_many
        from racsim.progress import Progress
        from racsim.sweep.callback import AHEAD, BATCH, PREPARED, SHARE, pin_blas_threads

        if not picked:
            return
        specs = dict(picked)
        threads = pin_blas_threads()  # as each job alone would (racsim.sweep.Job.computing)
        began = last = time.time()
        AHEAD.update({idx: began for idx in specs})  # running, for the sweep's job counter
        BATCH[:] = [Progress.off(), began, len(picked)]
        try:
            for k, res in run_many([obj for _, obj in picked], BATCH[0]):
                idx = picked[k][0]
                PREPARED[idx] = (specs[idx], res)  # run_many leaves the spec as it was
                now = time.time()
                SHARE[idx], last = now - last, now  # its own seconds of the batch
                AHEAD.pop(idx, None)
                yield idx
                last = time.time()  # its writing is its own: counted by its folder
                AHEAD.update(dict.fromkeys(AHEAD, last))  # the rest of the batch runs on from here
        except Exception as ex:
            log.warning(f"jobs {picked[0][0]}..{picked[-1][0]} run one by one: computing them together "
                        f"failed ({type(ex).__name__}: {ex})")
        finally:
            for idx in specs:
                AHEAD.pop(idx, None)
                SHARE.setdefault(idx, 0.0)  # one the batch did not compute runs again alone
            PREPARED.clear()
            BATCH.clear()
            if threads is not None:
                threads.restore_original_limits()

    def _run_one(self, idx: int, overrides: Sequence[str]) -> JobReturn:
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
        try:
            sweep_config = self.composer.compose(list(overrides), self.swept)
        except Exception as ex:  # checked before the sweep by the racsim sweeper; another sweeper may not
            return _failed(overrides, ex)
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = idx
            sweep_config.hydra.job.num = idx
        if sweep_config.hydra.job.chdir is not True:
            task = self.composer.task(list(overrides), self.swept)
            ret = _run_job_here(self.hydra_context, self.task_function, sweep_config, task)
        else:
            ret = run_job(hydra_context=self.hydra_context, task_function=self.task_function, config=sweep_config,
                          job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        return ret


def _run_job_here(hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig,
                  task: DictConfig) -> JobReturn:
    """Hydra's ``run_job`` (hydra.core.utils) for a sweep job, without ``chdir``: the same
    folder, .hydra files, job log, callbacks and JobReturn, with one copy of the job's config
    where ``run_job`` makes five (this config is the job's own, composed for it: nothing
    else reads it; ``task``, its config less the ``hydra`` node, is made by the Composer). A lean job
    (racsim.sweep.lean_job) writes ``.hydra/overrides.yaml`` alone (the sweep's
    ``multirun.yaml`` holds the rest) and its JobReturn's ``hydra_cfg`` is its config itself."""
    from racsim.config.dump import config_yaml
    from racsim.sweep.callback import lean_job

    instance = HydraConfig.instance()
    before = instance.cfg
    OmegaConf.set_readonly(config.hydra, True)
    instance.cfg = config  # HydraConfig.set_config without its masked copy: HydraConfig.get() is config.hydra
    try:
        out = Path(str(config.hydra.sweep.dir)) / str(config.hydra.sweep.subdir)
        with read_write(config.hydra.runtime), open_dict(config.hydra.runtime):
            config.hydra.runtime.output_dir = os.path.abspath(out)
        ret = JobReturn()
        ret.cfg = task
        lean = lean_job(ret.cfg)
        ret.hydra_cfg = config if lean else OmegaConf.masked_copy(config, "hydra")
        ret.overrides = OmegaConf.to_container(config.hydra.overrides.task)
        ret.working_dir = os.getcwd()
        out.mkdir(parents=True, exist_ok=True)
        configure_log(config.hydra.job_logging, config.hydra.verbose)
        if config.hydra.output_subdir is not None:  # Hydra's _save_config, with libyaml's emitter
            saved = out / str(config.hydra.output_subdir)
            saved.mkdir(parents=True, exist_ok=True)
            files = (("config", ret.cfg), ("hydra", ret.hydra_cfg), ("overrides", config.hydra.overrides.task))
            for name, node in files[2:] if lean else files:
                (saved / f"{name}.yaml").write_text(config_yaml(node), encoding="utf-8")
        with env_override(config.hydra.job.env_set):
            hydra_context.callbacks.on_job_start(config=config, task_function=task_function)
            try:
                ret.return_value = task_function(ret.cfg)
                ret.status = JobStatus.COMPLETED
            except Exception as e:
                ret.return_value = e
                ret.status = JobStatus.FAILED
        ret.task_name = JobRuntime.instance().get("name")
        _flush_loggers()
        hydra_context.callbacks.on_job_end(config=config, job_return=ret)
        return ret
    finally:
        instance.cfg = before


def _failed(overrides: Sequence[str], ex: BaseException) -> JobReturn:
    ret = JobReturn(overrides=list(overrides), status=JobStatus.FAILED)
    ret.return_value = ex
    return ret


class RacsimSweeper(Sweeper):
    """Hydra's basic sweeper's grid (cartesian product, same job numbers), for sweeps of any size."""

    def __init__(self, max_batch_size: int = 64, check_cells: bool = True,
                 params: Optional[Dict[str, str]] = None) -> None:
        super().__init__()
        self.max_batch_size, self.check, self.params = int(max_batch_size), bool(check_cells), params or {}
        self.config: Optional[DictConfig] = None
        self.launcher: Optional[Launcher] = None
        self.hydra_context: Optional[HydraContext] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: List[str]) -> Any:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

        from racsim.sweep import sweeper as S
        from racsim.errors import reason
        from racsim.sweep.callback import record_failures

        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        if self.max_batch_size < 1:
            raise HydraException(f"hydra.sweeper.max_batch_size = {self.max_batch_size}: an integer >= 1")
        overrides = _parsed(self.hydra_context.config_loader,
                            [f"{k}={v}" for k, v in self.params.items()] + list(arguments))
        cells = BasicSweeper.split_arguments(overrides, None)[0]
        swept = S.swept_keys(overrides)
        composer = getattr(self.launcher, "composer", None) or S.Composer(self.hydra_context.config_loader,
                                                                          self.config)
        if self.check:
            bad = S.check_cells(composer, cells, swept)
            if bad:
                shown = [S.cell_label(c, swept) for c in cells]
                raise HydraException(S.bad_cells_message(shown, bad))
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        todo = S.jobs_to_run(self.config, sweep_dir, cells)
        returns, failures = [], []
        for start, chunk in S.chunks(todo, cells, self.max_batch_size):
            try:
                results = self.launcher.launch(chunk, initial_job_idx=start)
            except Exception as ex:  # the launcher itself failed (a worker died, a cluster refused)
                failures += S.unfinished(self.config, sweep_dir, start, chunk, reason(ex))
                continue
            failures += [(start + i, reason(r._return_value)) for i, r in enumerate(results)
                         if r.status == JobStatus.FAILED]
            returns.append(results)
        record_failures(failures, [S.cell_label(c, swept) for c in cells])
        return returns
