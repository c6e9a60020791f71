"""Large sweeps: each job's config composed from a cached one, every cell checked
before the first job starts (the logic of the ``racsim`` sweeper and launcher,
hydra_plugins/racsim_sweeper).

Hydra's basic sweeper composes every job's config before the first job starts,
and its launcher composes it again (about 0.1 s each): a 10,000-cell sweep would
wait some 17 minutes. Here a config is composed by Hydra once per *base* (the
job's overrides less the swept ones that set a plain value on an existing leaf,
which is what most sweeps vary); a job's config is a copy of its base with its
swept values applied the way Hydra applies them
(``ConfigLoaderImpl._apply_overrides_to_config``), and its ``hydra`` node given
the job's overrides: the same config, key for key, as Hydra's
``load_sweep_config`` (a test compares them). Any other override (a config
group, ``+key``, ``~key``, a list, a mapping, an interpolation) makes its own
base, composed by Hydra.

:func:`check_cells` validates every cell as its job would (composition, the
schema check, then every grid cell resolved and validated) without composing
each: a swept value is typed once, on a copy of the base, and a cell is its
base's plain dataclasses with the values set, then expanded
(:func:`racsim.analyses.grid.expand`).
"""

from __future__ import annotations

import copy
import pickle
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Sequence, Tuple

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from racsim.analyses.grid import expand
from racsim.config.spec import scenario
from racsim.config.validate import check_data_files, check_leaves, check_schema, validate, validate_changed
from racsim.errors import ConfigError, reason, say
from racsim.sweep.detached import wait_detached
from racsim.sweep.markers import RESUME_KEY, is_complete, numbered_folders, parse_override


def _parse(overrides: Iterable[str]) -> list:
    return [parse_override(o) for o in overrides]


def _is_plain_leaf(base: DictConfig, o: Any) -> bool:
    """A swept override that sets a plain value on a leaf the base already has:
    applying it to a copy of the base is what Hydra's composition does."""
    if o.package is not None or o.is_delete() or o.is_add() or o.is_force_add() or "/" in o.key_or_group:
        return False
    if o.key_or_group.split(".")[0] == "hydra":
        return False
    value = o.value()
    if isinstance(value, (dict, list)) or (isinstance(value, str) and "${" in value):
        return False
    try:
        node = OmegaConf.select(base, o.key_or_group, throw_on_missing=False)
    except Exception:
        return False
    return node is not None and not OmegaConf.is_config(node)


def _has_interpolation(cfg: DictConfig) -> bool:
    """Whether the task part of a config holds an interpolation (a swept value
    could then change another key: such bases are composed per job)."""
    def walk(node) -> bool:
        for k in node.keys() if isinstance(node, DictConfig) else range(len(node)):
            if isinstance(node, DictConfig) and k == "hydra" and node is cfg:
                continue
            if OmegaConf.is_interpolation(node, k):
                return True
            child = node._get_node(k)
            if OmegaConf.is_config(child) and not child._is_none() and not child._is_missing() and walk(child):
                return True
        return False

    return walk(cfg)


class Composer:
    """Job configs of a sweep, as Hydra's ``config_loader.load_sweep_config(master, overrides)``
    gives them, composed by Hydra once per base (see the module's docstring)."""

    def __init__(self, config_loader: Any, master: DictConfig):
        self.loader, self.master = config_loader, master
        self._bases: Dict[Tuple[str, ...], DictConfig] = {}
        self._blobs: Dict[Tuple[str, ...], bytes] = {}  # pickled bases: unpickling copies faster than deepcopy
        self._task_blobs: Dict[Tuple[str, ...], bytes] = {}  # pickled task configs of the bases (no hydra node)
        self._fast: Dict[Tuple[str, ...], bool] = {}  # base -> no interpolation in its task config
        self._plain: Dict[Tuple[Tuple[str, ...], str], bool] = {}
        self._objects: Dict[Tuple[str, ...], Any] = {}  # base -> its plain dataclasses, or the reason it fails
        self._scratch: Dict[Tuple[str, ...], DictConfig] = {}  # base -> a copy of its task config to type values on
        self._values: Dict[Tuple[Tuple[str, ...], str], Any] = {}  # (base, override) -> typed value, or a failure
        self._leaves_ok: Dict[Tuple[str, ...], bool] = {}  # base -> its leaves pass validate's leaf checks

    def base(self, key: Tuple[str, ...]) -> DictConfig:
        if key not in self._bases:
            self._bases[key] = self.loader.load_sweep_config(self.master, list(key))
        return self._bases[key]

    def _plain_leaf(self, rest: Tuple[str, ...], base: DictConfig, o: Any) -> bool:
        key = (rest, o.input_line)
        if key not in self._plain:
            self._plain[key] = _is_plain_leaf(base, o)
        return self._plain[key]

    def split(self, overrides: Sequence[str], swept: Iterable[str]) -> Tuple[Tuple[str, ...], List[Any]]:
        """(the base's overrides, the parsed swept overrides applied on top of it)."""
        swept = set(swept)
        parsed = _parse(overrides)
        keys = [o.key_or_group for o in parsed]
        candidates = [i for i, o in enumerate(parsed)
                      if o.get_key_element() in swept and keys.count(o.key_or_group) == 1]
        rest = tuple(o for i, o in enumerate(overrides) if i not in candidates)
        base = self.base(rest) if candidates else None
        if base is not None and rest not in self._fast:
            self._fast[rest] = not _has_interpolation(base)
        if base is not None and self._fast[rest]:
            fast = [parsed[i] for i in candidates if self._plain_leaf(rest, base, parsed[i])]
        else:
            fast = []
        if len(fast) != len(candidates):  # a candidate that is not a plain leaf: into the base
            fast_ids = {id(o) for o in fast}
            rest = tuple(o for i, o in enumerate(overrides) if i not in candidates or id(parsed[i]) not in fast_ids)
        return rest, fast

    def base_object(self, rest: Tuple[str, ...]) -> Any:
        """The task config of a base as plain dataclasses (checked against the schema once)."""
        if rest not in self._objects:
            self._objects[rest] = _base_object(self.base(rest))
        if isinstance(self._objects[rest], Exception):
            raise self._objects[rest]
        return self._objects[rest]

    def leaves_ok(self, rest: Tuple[str, ...]) -> bool:
        """Whether every leaf of the base ``rest`` passes validate's leaf checks and its data
        files are fine (checked once): a cell on it then needs those checks of its set values only."""
        if rest not in self._leaves_ok:
            try:
                obj = self.base_object(rest)
                check_leaves(obj)
                check_data_files(obj)
                self._leaves_ok[rest] = True
            except Exception:
                self._leaves_ok[rest] = False
        return self._leaves_ok[rest]

    def typed(self, rest: Tuple[str, ...], o: Any) -> Any:
        """The value a plain-leaf override gives its key on the base ``rest``, typed by the schema."""
        k = (rest, o.input_line)
        if k not in self._values:
            if rest not in self._scratch:
                self._scratch[rest] = task_config(self.base(rest))
            self._values[k] = _typed_value(self._scratch[rest], o)
        if isinstance(self._values[k], Exception):
            raise self._values[k]
        return self._values[k]

    def cell_object(self, overrides: Sequence[str], swept: Iterable[str]) -> Any:
        """The job's spec: what racsim.config.spec.scenario gives of its composed config less
        the ``hydra`` node, as a copy of its base's with the swept values set (a cell of the
        in-process grid is built the same way)."""
        rest, fast = self.split(overrides, swept)
        obj = copy.deepcopy(self.base_object(rest))
        for o in fast:
            _put(obj, o.key_or_group, self.typed(rest, o))
        return obj

    def task(self, overrides: Sequence[str], swept: Iterable[str]) -> DictConfig:
        """``task_config(self.compose(overrides, swept))``, from a copy of the base's task config
        (the swept plain values are task keys, never ``hydra``'s: applied alike to either)."""
        from hydra._internal.config_loader_impl import ConfigLoaderImpl

        rest, fast = self.split(overrides, swept)
        if not fast:
            return task_config(self.compose(overrides, swept))
        if rest not in self._task_blobs:
            self._task_blobs[rest] = pickle.dumps(task_config(self.base(rest)))
        cfg = pickle.loads(self._task_blobs[rest])
        ConfigLoaderImpl._apply_overrides_to_config(fast, cfg)
        return cfg

    def compose(self, overrides: Sequence[str], swept: Iterable[str]) -> DictConfig:
        """The job config of ``overrides`` (``swept``: the keys that vary across the sweep)."""
        from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname

        rest, fast = self.split(overrides, swept)
        if rest not in self._blobs:
            self._blobs[rest] = pickle.dumps(self.base(rest))
        cfg = pickle.loads(self._blobs[rest])
        if not fast:
            return cfg
        ConfigLoaderImpl._apply_overrides_to_config(fast, cfg)
        app = _parse(overrides)
        with read_write(cfg.hydra), open_dict(cfg.hydra):
            cfg.hydra.overrides.task = [o.input_line for o in app]
            d = cfg.hydra.job.config.override_dirname
            cfg.hydra.job.override_dirname = get_overrides_dirname(
                overrides=app, kv_sep=d.kv_sep, item_sep=d.item_sep, exclude_keys=d.exclude_keys)
        return cfg


def task_config(cfg: DictConfig) -> DictConfig:
    """A job's config without its ``hydra`` node: what the task function gets (a copy,
    by pickle: a third of deepcopy's time)."""
    task = pickle.loads(pickle.dumps(cfg))
    with read_write(task), open_dict(task):
        del task["hydra"]
    return task


def check_cells(composer: Composer, cells: Sequence[Sequence[str]], swept: Iterable[str]) -> List[Tuple[int, str]]:
    """(index, reason) of every cell whose job would stop on its config; empty when all are valid."""
    swept = list(swept)
    bad: List[Tuple[int, str]] = []
    for i, overrides in enumerate(cells):
        try:
            rest, fast = composer.split(overrides, swept)
            base = composer.base_object(rest)
            _check_values(base, [(o.key_or_group, composer.typed(rest, o)) for o in fast], composer.leaves_ok(rest))
        except Exception as ex:
            bad.append((i, reason(ex)))
    return bad


def _check_values(base: Any, typed: List[Tuple[str, Any]], leaves_ok: bool = False) -> None:
    """Set the values on the base's dataclasses, check the result as its job would,
    and put the base's own values back (no copy of the base per cell). Its job runs
    :func:`racsim.analyses.grid.expand`; without a study grid, the fast trim or a
    delay shortcut to resolve, that is :func:`racsim.config.validate.validate` alone,
    whose walks over every leaf only the set values need when the base's other
    leaves passed them (``leaves_ok``: :meth:`Composer.leaves_ok`)."""
    old = [(path, _get(base, path)) for path, _ in typed]
    try:
        for path, value in typed:
            _put(base, path, value)
        p, st = base.pipeline, base.study
        if st.grid or st.fast or p.delay_steps is not None or p.delay_distribution is not None:
            expand(base)
        elif leaves_ok:
            validate_changed(base, [path for path, _ in typed])
        else:
            validate(base)
    finally:
        for path, value in old:
            _put(base, path, value)


def _get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


def _put(obj: Any, path: str, value: Any) -> None:
    """Set a leaf (its value already typed by the schema) on plain dataclasses."""
    parent, _, leaf = path.rpartition(".")
    node = _get(obj, parent) if parent else obj
    if isinstance(node, dict):
        node[leaf] = value
    else:
        setattr(node, leaf, value)


def _base_object(base: DictConfig) -> Any:
    """The base's task config at the config boundary (racsim.config.spec.scenario), or the error."""
    try:
        return scenario(task_config(base))
    except Exception as ex:
        return ex


def _typed_value(scratch: DictConfig, o: Any) -> Any:
    """The value an override gives its key once composed (typed by the schema), or the
    error composing it; ``scratch`` (a copy of the base's task config) keeps the value."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    try:
        ConfigLoaderImpl._apply_overrides_to_config([o], scratch)
        value = OmegaConf.select(scratch, o.key_or_group)
        check_schema(value, o.key_or_group)
        return value
    except Exception as ex:
        return ex


def swept_keys(overrides: Sequence[Any]) -> List[str]:
    """Key elements of the parsed sweep overrides that take more than one value."""
    return [o.get_key_element() for o in overrides if o.is_sweep_override()]



def cell_label(overrides: Sequence[str], swept: Iterable[str]) -> str:
    """A cell named by its swept overrides only (``seed=3 corrector.tau_age=20``)."""
    swept = set(swept)
    mine = [o for o, p in zip(overrides, _parse(overrides)) if p.get_key_element() in swept]
    return " ".join(mine) or "defaults"


def bad_cells_message(labels: Sequence[str], bad: Sequence[Tuple[int, str]], shown: int = 5) -> str:
    """One line: how many cells are invalid and, for the first few, which and why."""
    parts = [f"job {i} ({labels[i]}): {why}" for i, why in bad[:shown]]
    more = f"; and {len(bad) - shown} more" if len(bad) > shown else ""
    return f"sweep: {len(bad)} of {len(labels)} cells are invalid, nothing was run: " + "; ".join(parts) + more


def jobs_to_run(config: DictConfig, sweep_dir: Path, cells: Sequence[Sequence[str]]) -> List[int]:
    """The job numbers to launch: all, less (with ``resume=true``, when job folders are
    the default ``${hydra.job.num}``) those whose results are complete for their cell."""
    everything = list(range(len(cells)))
    if not OmegaConf.select(config, RESUME_KEY, default=False) or not numbered_folders(config):
        return everything
    done = [i for i in everything if is_complete(sweep_dir / str(i), cells[i])]
    if done:
        say(f"racsim: resume: {len(done)} of {len(cells)} jobs complete in {sweep_dir}, skipped")
    skip = set(done)
    return [i for i in everything if i not in skip]


def unfinished(config: DictConfig, sweep_dir: Path, start: int, chunk: Sequence[Sequence[str]],
               why: str) -> List[Tuple[int, str]]:
    """(job, ``why``) for each job of a batch whose launcher failed as a whole (a worker killed, a
    submitit job cancelled) that did not complete: first the jobs of the batch still running in
    processes this sweep started (submitit_local's) are waited for, then the jobs whose folders hold
    their complete results (the default ``${hydra.job.num}`` folders) are counted as done."""
    wait_detached()
    numbered = numbered_folders(config)
    return [(start + i, why) for i, cell in enumerate(chunk)
            if not (numbered and is_complete(sweep_dir / str(start + i), cell))]


def chunks(todo: Sequence[int], cells: Sequence[Sequence[str]], size: int) -> Iterator[Tuple[int, list]]:
    """(first job number, its cells) for each run of consecutive job numbers in ``todo``, at most ``size`` long."""
    i = 0
    while i < len(todo):
        j = i + 1
        while j < len(todo) and todo[j] == todo[j - 1] + 1 and j - i < size:
            j += 1
        yield todo[i], [list(cells[k]) for k in todo[i:j]]
        i = j
