"""The defaults, read from conf/ (shipped as the package racsim.conf): the one source of them.

conf/'s config groups hold the defaults they set (pipeline/default.yaml,
corrector/all.yaml, learner/tabular.yaml, the GPU and RM catalogs rm/gpu/*.yaml
and rm/model/*.yaml); those fields are ``MISSING`` in the schema
(racsim.config.schema), so that a config built from the dataclasses alone is
not a different model from the one the ``racsim`` command runs.

* :func:`compose_config`: the composed config of ``racsim OVERRIDES...``, through
  Hydra's compose API with the command's primary config, schema and search path;
* :func:`default_config`: the same as plain dataclasses (a :class:`RacsimConf`);
* :func:`catalog`: one of conf/rm/'s groups (``gpu``, ``model``) as name -> fields;
* :func:`replace_grid`: a study grid given on the command line replaces the scenario's;
* :func:`measured_as_given`: an empirical law chosen on the command line uses its data as measured.
"""

from __future__ import annotations

import copy
import functools
from importlib.resources import files
from typing import Any, Dict, Iterable, List, Tuple

from omegaconf import DictConfig, OmegaConf, open_dict

from racsim.config.schema import RacsimConf, register_configs

CONFIG_MODULE = "racsim.conf"


def compose_config(*overrides: str) -> DictConfig:
    """The config that ``racsim OVERRIDES...`` runs (without its ``hydra`` node), as a
    typed DictConfig (a fresh copy: change it freely). Works whether or not Hydra is
    already initialised (inside a test's initialize block, or a running app): the
    global Hydra state is set aside for the composition and restored after it."""
    return copy.deepcopy(_composed(tuple(overrides)))


def default_config(*overrides: str) -> RacsimConf:
    """:func:`compose_config` as dataclasses. ``default_config("~scenario")`` is the
    defaults of conf/ with no slow channel (no scenario): the former ``RacsimConf()``."""
    return OmegaConf.to_object(_composed(tuple(overrides)))


@functools.lru_cache(maxsize=64)
def _composed(overrides: Tuple[str, ...]) -> DictConfig:
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    register_configs()
    backup = get_gh_backup()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(version_base="1.3", config_module=CONFIG_MODULE):
            cfg = compose(config_name="config", overrides=list(overrides))
            measured_as_given(replace_grid(cfg, overrides), overrides)
    finally:
        restore_gh_from_backup(backup)
    return cfg  # callers get copies: compose_config deep-copies it, default_config builds new objects


GRID_KEY = "study.grid"


def replace_grid(cfg: DictConfig, overrides: Iterable[str]) -> DictConfig:
    """Set the last ``study.grid=GRID`` of the command line's ``overrides`` as the whole grid
    (in place; returns ``cfg``). Hydra merges a mapping given for a key into the one
    composed there, so the scenario's grid would survive ``study.grid={}`` and keep its
    other axes under ``study.grid={seed:[0,1]}``; a grid is one object, so the one given
    replaces it. ``study.grid.AXIS=[...]`` still changes one axis and ``~study.grid``
    (Hydra's deletion) removes the grid."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    named = [str(o) for o in overrides if GRID_KEY in str(o)]  # parsing is slow (a sweep job has many overrides)
    given = [o for o in OverridesParser.create().parse_overrides(named) if o.key_or_group == GRID_KEY] if named else []
    if given and not given[-1].is_delete():
        with open_dict(cfg):
            cfg.study.grid = given[-1].value()
    return cfg


def empirical_blocks(overrides: Iterable[str]) -> List[str]:
    """The latency blocks (``pipeline.channels.judge.latency``) that the command line's
    ``overrides`` switch to an empirical law (``BLOCK.kind=empirical`` or
    ``latency@BLOCK=empirical``) without setting their ``mean`` (``BLOCK.mean=...``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    texts = [str(o) for o in overrides]
    if not any("empirical" in t for t in texts):  # parsing is slow (a sweep job has many overrides)
        return []
    parsed = OverridesParser.create().parse_overrides(texts)
    keys = {o.key_or_group for o in parsed}
    blocks = []
    for o in parsed:
        if o.is_sweep_override() or o.is_delete() or o.value() != "empirical":
            continue
        if o.key_or_group.endswith(".kind"):
            blocks.append(o.key_or_group[: -len(".kind")])
        elif o.key_or_group == "latency" and o.package:
            blocks.append(o.package)
    return [b for b in blocks if f"{b}.mean" not in keys]


def measured_as_given(cfg: DictConfig, overrides: Iterable[str]) -> DictConfig:
    """Drop the mean of each latency block the command line switches to an empirical law
    without a mean of its own (:func:`empirical_blocks`), in place; returns ``cfg``. That
    mean was set for another law (a channel preset's ``mean: 20``): kept, it would rescale
    the user's data. ``BLOCK.mean=S`` on the command line rescales them to S seconds."""
    for block in empirical_blocks(overrides):
        if OmegaConf.select(cfg, f"{block}.mean", default=None) is not None:
            OmegaConf.update(cfg, f"{block}.mean", None, merge=False)
    return cfg


@functools.lru_cache(maxsize=None)
def _catalog(group: str) -> Dict[str, Dict[str, Any]]:
    folder = files(CONFIG_MODULE).joinpath("rm", group)
    out: Dict[str, Dict[str, Any]] = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            spec = OmegaConf.to_container(OmegaConf.create(entry.read_text()))
            out[str(spec["name"])] = spec
    return out


def catalog(group: str) -> Dict[str, Dict[str, Any]]:
    """conf/rm/GROUP/*.yaml (GROUP ``gpu`` or ``model``) as ``{name: fields}``, keyed by
    each file's ``name`` (H100, 8B, 1.5B...), in file-name order: the fields of a
    :class:`~racsim.config.schema.GpuConf` or :class:`~racsim.config.schema.RMModelConf`."""
    return copy.deepcopy(_catalog(group))
