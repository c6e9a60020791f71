"""The config boundary: the composed Hydra config (an OmegaConf DictConfig) becomes the typed
spec (:class:`~racsim.config.schema.RacsimConf`, plain dataclasses) here, once. Below config/
(pipeline, learner, analyses, report) the model takes specs and plain values, never a DictConfig.

* :func:`scenario`: the composed config, checked against the schema, as a RacsimConf;
* :func:`typed_node`: a mapping (a study grid's value) as one of the schema's dataclasses;
* :func:`replace_at`: a spec with one dotted key set, as a new tree (the old one unchanged).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import OmegaConf

from racsim.config.schema import RacsimConf
from racsim.config.validate import check_schema


def scenario(cfg: Any) -> RacsimConf:
    """The composed config ``cfg`` (a DictConfig, without its ``hydra`` node) as plain
    dataclasses, after racsim.config.validate.check_schema (keys the schema lacks, NaNs,
    MISSING values: a ConfigError naming the key). A new tree: ``cfg`` is left as it is."""
    check_schema(cfg)
    return OmegaConf.to_object(cfg)


def typed_node(kind: type, value: Any) -> Any:
    """``value`` (a mapping) as the schema dataclass ``kind`` (a LatencyConf...): its fields
    over ``kind``'s defaults, typed as OmegaConf types them. Raises OmegaConf's error on a
    field ``kind`` lacks or a value of the wrong type."""
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(kind), value))


def replace_at(spec: Any, key: str, value: Any) -> Any:
    """``spec`` with the dotted ``key`` set to ``value``, as a new tree: each node along the
    path is copied (``dataclasses.replace``; a dict level, such as ``pipeline.channels``, as a
    dict), the rest is shared with ``spec``. ``replace_at(cfg, "pipeline.channels.judge.rm.gpus", 5)``."""
    head, _, rest = key.partition(".")
    if isinstance(spec, dict):
        if head not in spec:
            raise KeyError(key)
        return {**spec, head: replace_at(spec[head], rest, value) if rest else value}
    if not dataclasses.is_dataclass(spec) or head not in {f.name for f in dataclasses.fields(spec)}:
        raise KeyError(key)
    return dataclasses.replace(spec, **{head: replace_at(getattr(spec, head), rest, value) if rest else value})
