"""What the schema's types let through, leaf by leaf (:class:`~racsim.config.schema.RacsimConf`
as a tree): a key the schema does not have, a NaN, a MISSING value (``???``), an integer
beyond int64."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from racsim.config.names import key_hint
from racsim.config.schema import RM_BLOCKS
from racsim.config.validate.common import INT64, need, node
from racsim.errors import ConfigError

MISSING_ALLOWED = ("a value: this key has no default in the schema; its default is in conf/ "
                   "(racsim.config.defaults.default_config() composes them), or set it")

RM_PICKS = {"model": "8b", "gpu": "H100"}  # an RM block's catalog groups (conf/rm/GROUP/), with an example each


def first_missing(cfg: Any, key: str = "") -> Optional[str]:
    """The first key (depth first, in field order) whose value is MISSING (``???``) in a
    DictConfig or in dataclasses, or None. A field the schema leaves MISSING has its
    default in conf/ (racsim.config.schema): a config built from the dataclasses alone
    lacks it."""
    if cfg is None or isinstance(cfg, (int, float)):  # most leaves (kernel rows are long lists of floats)
        return None
    if isinstance(cfg, DictConfig):
        for k in cfg.keys():
            sub = f"{key}.{k}" if key else str(k)
            if OmegaConf.is_missing(cfg, k):
                return sub
            found = first_missing(cfg[k], sub)
            if found:
                return found
    elif isinstance(cfg, ListConfig):
        for i in range(len(cfg)):
            if OmegaConf.is_missing(cfg, i):
                return f"{key}[{i}]"
            found = first_missing(cfg[i], f"{key}[{i}]")
            if found:
                return found
    elif isinstance(cfg, str):
        return key if cfg == MISSING else None
    elif hasattr(type(cfg), "__dataclass_fields__"):  # a dataclass instance
        for name in type(cfg).__dataclass_fields__:
            found = first_missing(getattr(cfg, name), f"{key}.{name}" if key else name)
            if found:
                return found
    elif isinstance(cfg, dict):
        for k, v in cfg.items():
            found = first_missing(v, f"{key}.{k}" if key else str(k))
            if found:
                return found
    elif isinstance(cfg, (list, tuple)):
        for i, v in enumerate(cfg):
            found = first_missing(v, f"{key}[{i}]")
            if found:
                return found
    return None


def leaves(cfg: Any, key: str = ""):
    """(dotted key, value) of every leaf of a DictConfig or of dataclasses (MISSING ones skipped)."""
    if isinstance(cfg, DictConfig):
        items = [(k, cfg[k]) for k in cfg.keys() if not OmegaConf.is_missing(cfg, k)]
    elif isinstance(cfg, ListConfig) or isinstance(cfg, (list, tuple)):
        items = [(f"[{i}]", v) for i, v in enumerate(cfg)]
    elif hasattr(type(cfg), "__dataclass_fields__"):
        items = [(name, getattr(cfg, name)) for name in type(cfg).__dataclass_fields__]
    elif isinstance(cfg, dict):
        items = list(cfg.items())
    else:
        yield key, cfg
        return
    for k, v in items:
        sub = f"{key}{k}" if str(k).startswith("[") else (f"{key}.{k}" if key else str(k))
        yield from leaves(v, sub)


def missing_error(key: str, cfg: Any = None) -> ConfigError:
    """The ConfigError for a MISSING value: for a GPU or an RM shape, which catalog option to
    pick; given the whole config ``cfg``, every group of that RM block still to pick
    (``pipeline.fast_rm.model and pipeline.fast_rm.gpu`` after only ``pipeline.fast_rm.gpus=4``)."""
    parent = key.rpartition(".")[0]
    owner, _, group = parent.rpartition(".")
    if group in RM_PICKS and owner.rpartition(".")[2] in RM_BLOCKS:
        block = None if cfg is None else node(cfg, owner)
        groups = [g for g in RM_PICKS if block is None or first_missing(getattr(block, g)) is not None] or [group]
        picks = " ".join(f"+rm/{g}@{owner}.{g}={RM_PICKS[g]}" for g in groups)
        return ConfigError(" and ".join(f"{owner}.{g}" for g in groups), MISSING,
                           f"a value: {owner} is incomplete; pick its {' and '.join(groups)} from conf/rm/ "
                           f"(the catalog), e.g. {picks}")
    return ConfigError(key, MISSING, MISSING_ALLOWED)


def check_leaves(cfg: Any, key: str = "") -> None:
    """validate's first checks, leaf by leaf: no MISSING value (the first named), no integer beyond int64."""
    missing = first_missing(cfg, key)
    if missing is not None:
        raise missing_error(missing, None if key else cfg)
    for k, v in leaves(cfg, key):
        need(not isinstance(v, int) or isinstance(v, bool) or -INT64 <= v < INT64, k, v,
             "an integer within int64 (|value| < 2**63)")


def check_schema(cfg: Any, key: str = "", root: Any = None) -> None:
    """Two mistakes the schema's types let through on the command line: a key
    the schema does not have (``+foo=1`` adds one even to a typed node) and a
    NaN anywhere (a float field takes ``nan``; no racsim setting means it).
    The racsim command runs this on the composed config before
    :func:`~racsim.config.validate.validate`; a MISSING value (``???``) is refused here too
    (:func:`missing_error`)."""
    root = cfg if root is None else root
    if isinstance(cfg, DictConfig):
        t = OmegaConf.get_type(cfg)
        allowed = {f.name for f in dataclasses.fields(t)} if dataclasses.is_dataclass(t) else None
        for k in cfg.keys():
            sub = f"{key}.{k}" if key else str(k)
            if allowed is not None and k not in allowed:
                raise ConfigError(sub, OmegaConf.select(cfg, str(k), default=None),
                                  f"not a racsim setting; {key_hint(sub)}")
            if OmegaConf.is_missing(cfg, k):  # before OmegaConf.to_object, which would say it in its words
                raise missing_error(sub, root)
            check_schema(cfg[k], sub, root)
    elif isinstance(cfg, ListConfig):
        for i in range(len(cfg)):
            check_schema(cfg[i], f"{key}[{i}]", root)
    elif isinstance(cfg, float) and math.isnan(cfg):
        raise ConfigError(key, cfg, "a number, not NaN")
