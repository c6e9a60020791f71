"""The whole config (:class:`~racsim.config.schema.RacsimConf`): its own keys (``name``,
``output``) and the order in which every spec's rules run. That order decides which error a
config with several bad values gets: keep it when adding a rule."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from racsim.config.schema import JOB_FILES
from racsim.errors import ConfigError
from racsim.config.validate.capacity import validate_capacity, validate_split
from racsim.config.validate.common import need, node
from racsim.config.validate.corrector import validate_corrector, validate_lag_use
from racsim.config.validate.generation import validate_async_run
from racsim.config.validate.learner import (
    validate_channel_rewards,
    validate_lm,
    validate_lm_packages,
    validate_lm_pairs,
    validate_seeds,
    validate_tabular,
)
from racsim.config.validate.limits import check_data_files, check_limits
from racsim.config.validate.pipeline import validate_pipeline
from racsim.config.validate.schema_check import check_leaves
from racsim.config.validate.study import validate_probe, validate_study_kind, validate_study_runs, validate_study_targets


def validate(cfg: Any) -> None:
    """Check ranges and cross-field rules of a composed config (a DictConfig
    or a :class:`RacsimConf`). Raises :class:`ConfigError` on the first bad value,
    or on the first MISSING one (``???``: a config built from the schema alone)."""
    check_leaves(cfg)
    validate_rules(cfg)


def validate_changed(cfg: Any, changed: Sequence[str]) -> None:
    """``validate(cfg)`` for a config that passed :func:`check_leaves` and
    :func:`check_data_files` before the leaves at the dotted keys ``changed`` were set
    (a sweep's cell on its base, racsim.sweep.sweeper.check_cells): the leaf checks and
    data files of those keys only, then every rule (a cross-field rule reads the
    whole config), then the budgets (:func:`check_limits`). A changed ``limits.*`` key rechecks
    every data file."""
    for key in changed:
        check_leaves(node(cfg, key), key)
    validate_rules(cfg, None if any(k.startswith("limits.") for k in changed) else changed)
    check_limits(cfg)  # a cell's sizes: refused before the first job, as a single run is


def check_name(name: Any) -> None:
    """``name`` names the run's folder under outputs/ (``outputs/NAME/...``): one folder name,
    never a path that leads elsewhere."""
    need(isinstance(name, str) and name not in ("", ".", "..") and not set(name) & set("/\\")
         and name.isprintable() and len(name.encode()) <= 200, "name", name,
         "a folder name under outputs/: not empty, not '.' or '..', no '/' or '\\', printable, at most 200 bytes")


def validate_rules(cfg: Any, files: Optional[Sequence[str]] = None) -> None:
    """validate's ranges and cross-field rules, then the data files (:func:`check_data_files`;
    only those at the keys ``files`` when given). The learner's and the study's groups alternate:
    that is the order their first error has always been named in."""
    check_name(cfg.name)
    validate_pipeline(cfg.pipeline)
    validate_async_run(cfg)
    validate_corrector(cfg.corrector)
    lr, st = cfg.learner, cfg.study
    validate_tabular(lr)
    validate_seeds(cfg.seed, lr)
    validate_study_kind(st)
    validate_channel_rewards(lr)
    validate_study_runs(st)
    validate_lm(lr.lm)  # also when learner.kind is tabular: a bad value is never silently carried
    validate_lm_packages(lr)
    validate_lm_pairs(lr, list(cfg.corrector.names), list(cfg.corrector.rollout))
    validate_lag_use(cfg)
    validate_study_targets(st)
    validate_probe(st)
    if getattr(cfg, "output", None) is not None:
        need(cfg.output.job_files in JOB_FILES, "output.job_files", cfg.output.job_files,
             "one of full, lean (the tables as Parquet only), auto (lean for a sweep job of racsim's launcher)")
    if getattr(cfg, "capacity", None) is not None and cfg.capacity.enabled:
        validate_split(cfg) if cfg.pipeline.generation.mode == "async" else validate_capacity(cfg)
    if getattr(cfg, "limits", None) is not None:
        check_data_files(cfg, files)


def allowed_at(cfg: Any, key: str) -> Optional[str]:
    """What the rules allow at the dotted ``key`` of a valid composed config ``cfg``, in their words (the
    ``allowed`` of the ConfigError :func:`validate_rules` raises for NaN there, which no rule accepts): so
    that a value the schema cannot even take (``corrector.tau_age=abc``) is refused as an out-of-range one
    is. None where no rule of ``cfg`` reads the key."""
    from omegaconf import OmegaConf

    probe = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))  # untyped: NaN may go anywhere
    try:
        OmegaConf.update(probe, key, float("nan"), merge=False)
        validate_rules(probe, files=())
    except ConfigError as e:
        return e.allowed if e.key == key else None
    except Exception:  # a rule that cannot read NaN there: no words for it
        return None
    return None
