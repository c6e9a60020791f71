"""A study grid expanded into cells: validated configs, one per combination of values.

A scenario's ``study.grid`` maps config keys to lists of values; the cells are
their cartesian product (a key "a,b" takes tuples, so that values that belong
together move together). Each cell has its shortcuts resolved (``delay_steps``,
``delay_distribution``) and is validated before anything runs. Cells with the
same :func:`learner_key` share their trajectories (racsim.analyses.bias_study).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import typing
from typing import Any, Dict, List, Tuple

from racsim.config.schema import ChannelConf, RacsimConf
from racsim.config.spec import typed_node
from racsim.config.validate import check_limits, validate
from racsim.errors import ConfigError
from racsim.pipeline.kernels import distribution_kernel

Values = Dict[str, Any]


def expand(spec: RacsimConf) -> List[Tuple[Values, RacsimConf]]:
    """The cells of ``spec.study.grid`` (one cell, with no values, when it is empty),
    each resolved (:func:`resolve`) and validated, as new :class:`RacsimConf` trees
    (``spec`` is left as it is). Depends on racsim.config.validate (limits, rules) and
    the schema's field types (a grid value's type). A composed Hydra config is converted
    first, at the config boundary (racsim.config.spec.scenario)."""
    if not isinstance(spec, RacsimConf):
        raise TypeError(f"expand takes a RacsimConf (racsim.config.spec.scenario), not {type(spec).__name__}")
    base = copy.deepcopy(spec)
    check_limits(base)  # a run too big for the machine is refused before a cell is built
    grid = dict(base.study.grid)
    base.study.grid = {}
    if base.study.fast:
        base.learner.trials = min(base.learner.trials, 100)
        base.learner.bootstrap = min(base.learner.bootstrap, 200)
    axes = []
    for key, values in grid.items():
        names = [k.strip() for k in key.split(",")]
        if not isinstance(values, list) or not values:
            raise ConfigError(f"study.grid.{key}", values, "a non-empty list of values")
        for name in names:
            _field_type(base, name, f"study.grid.{key}")
        for v in values:
            if len(names) > 1 and (not isinstance(v, list) or len(v) != len(names)):
                raise ConfigError(f"study.grid.{key}", v, f"a list of {len(names)} values per cell")
        if base.study.fast and any(n == "seed" or n.endswith("_seed") for n in names):
            values = values[:2]
        axes.append((names, values))
    cells = []
    typed: Dict[str, Any] = {}
    for combo in itertools.product(*[values for _, values in axes]):
        cell = copy.deepcopy(base)
        values: Values = {}
        for (names, _), v in zip(axes, combo):
            for name, value in zip(names, v if len(names) > 1 else [v]):
                _set(cell, name, value, typed)
                values[name] = value
        cells.append((values, resolve(cell)))
    return cells


def _parent(obj: Any, path: str, key: str):
    """The object holding the last part of a dotted path, and that part."""
    parts = path.split(".")
    for part in parts[:-1]:
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part, _MISSING)
        if obj is _MISSING or obj is None:
            raise ConfigError(key, path, "a config key (e.g. learner.mdp_seed)")
    return obj, parts[-1]


def _field_type(cfg: Any, path: str, key: str):
    """The declared type of a config key (a dataclass for typed nodes), checking it exists."""
    obj, leaf = _parent(cfg, path, key)
    if isinstance(obj, dict):
        if leaf not in obj:
            raise ConfigError(key, path, "a config key (e.g. learner.mdp_seed)")
        return type(obj[leaf])
    hints = typing.get_type_hints(type(obj)) if dataclasses.is_dataclass(obj) else {}
    if leaf not in hints:
        raise ConfigError(key, path, "a config key (e.g. learner.mdp_seed)")
    hint = hints[leaf]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) is typing.Union and len(args) == 1 else hint


def _set(cfg: Any, path: str, value: Any, typed: Dict[str, Any]) -> None:
    """Set a dotted key; a dict fills a typed node (e.g. a LatencyConf) through its
    schema (converted once per distinct value: ``typed`` caches it)."""
    kind = _field_type(cfg, path, path)
    if isinstance(value, dict) and dataclasses.is_dataclass(kind):
        memo = f"{kind.__name__}:{value!r}"
        if memo not in typed:
            try:
                typed[memo] = typed_node(kind, value)
            except Exception as ex:  # an unknown field or a wrong type in the grid value
                raise ConfigError(f"study.grid.{path}", value, f"fields of {kind.__name__}: {ex}") from None
        value = copy.deepcopy(typed[memo])
    obj, leaf = _parent(cfg, path, path)
    if isinstance(obj, dict):
        obj[leaf] = value
    else:
        setattr(obj, leaf, value)


_MISSING = object()


def resolve(cfg: RacsimConf) -> RacsimConf:
    """Turn the pipeline shortcuts into explicit channels (in place), then validate.

    ``pipeline.delay_steps=[d1, ..., dK]``: K channels ch1..chK, equal shares,
    with deterministic delays of d_k steps (one-hot kernels).
    ``pipeline.delay_distribution``: every channel's kernel is the law of the
    rounded draw of that distribution, in steps (mass beyond the 1 - 1e-12
    quantile, if any, never returns).
    """
    p = cfg.pipeline
    if p.delay_steps is not None:
        steps = list(p.delay_steps)
        if len(p.channels):
            raise ConfigError("pipeline.delay_steps", steps, "null when pipeline.channels are given (use one or the other)")
        if not steps or any(not isinstance(d, int) or d < 0 for d in steps):
            raise ConfigError("pipeline.delay_steps", steps, "a non-empty list of integer delays >= 0 (steps)")
        p.channels = {f"ch{k + 1}": ChannelConf(kernel=_one_hot(d), share=1.0) for k, d in enumerate(steps)}
    if p.delay_distribution is not None:
        kernel = distribution_kernel(p.delay_distribution, "pipeline.delay_distribution")
        if not len(p.channels):
            raise ConfigError("pipeline.delay_distribution", "set", "channels to apply it to (pipeline.channels or delay_steps)")
        for ch in p.channels.values():
            ch.kernel = kernel
    p.delay_steps = None
    p.delay_distribution = None
    validate(cfg)
    return cfg


def _one_hot(d: int) -> List[float]:
    k = [0.0] * (d + 1)
    k[d] = 1.0
    return k


def learner_key(cfg: RacsimConf) -> tuple:
    """What fixes a cell's trajectories: cells with equal keys share them. The
    rewards (K, shares, channel and fast noise, bump) are not part of it: the
    gradients are linear in them (see bias.run_bias_cells)."""
    lr, p = cfg.learner, cfg.pipeline
    return (
        lr.kind, lr.topology, lr.n_states, lr.n_actions, lr.mdp_seed, lr.theta_seed, lr.theta_scale, lr.gamma,
        lr.horizon, lr.trials, p.steps, p.batch_size, cfg.seed,
    )
