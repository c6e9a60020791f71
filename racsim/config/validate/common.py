"""What every rule is written with: ``need`` (raise a :class:`~racsim.errors.ConfigError` naming
the key, the value and what is allowed) and the shapes of value the rules ask for."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any, Collection, Optional

from racsim.config.names import closest
from racsim.errors import ConfigError

MAX_GAIN = 1e6  # corrector.alpha, 1 / route_prob, learner.train.lr: past this the gradients overflow to inf/NaN
MAX_PRICE = 1e9  # USD per unit- or server-hour: past it a plan's or a pool's cost is no number
INT64 = 2**63  # every integer key: numpy holds it in an int64


def finite(x: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def need(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(key, value, allowed)


def need_one_of(key: str, value: Any, choices: Collection[str]) -> None:
    need(value in choices, key, value, "one of " + ", ".join(choices))


def need_file(key: str, path: Any, what: str) -> None:
    """A data file the run reads: named (``what``: the kind of file), and there, so that a sweep's
    cell check (racsim.sweep.sweeper.check_cells) refuses a missing one before the first job starts;
    an unreadable or malformed one is refused by its reader when the run opens it."""
    need(isinstance(path, (str, os.PathLike)) and bool(os.fspath(path)), key, path, what)
    where = "" if os.path.isabs(path) else f"; a relative path starts from {os.getcwd()}"
    near = nearby(os.fspath(path))
    hint = f" (did you mean {' or '.join(near)}?)" if near else ""
    need(os.path.exists(path), key, path, f"{what}: there is no such file{hint}{where}")


def nearby(path: str) -> list:
    """The files beside a missing ``path`` whose names are closest to its name (racsim.config.names.closest,
    the did-you-mean of keys), as paths written the way ``path`` is."""
    folder, name = os.path.split(path)
    try:
        names = sorted(e.name for e in os.scandir(folder or ".") if e.is_file())
    except OSError:  # no such folder either, or one that cannot be listed
        return []
    return [os.path.join(folder, n) for n in closest(name, names)] if name else []


def positive(key: str, value: Any, *, allow_inf: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 and not math.isnan(value)
    ok = ok and (allow_inf or math.isfinite(value))
    need(ok, key, value, "a positive number" + (" (or inf)" if allow_inf else ""))


def nonneg(key: str, value: Any, most: Optional[float] = None, why: str = "") -> None:
    """A finite number >= 0, and at most ``most`` when a run past it cannot stay finite (``why``)."""
    need(finite(value) and value >= 0, key, value, "a finite number >= 0")
    if most is not None:
        need(value <= most, key, value, f"a number in [0, {most:g}] ({why})")


def fraction(key: str, value: Any) -> None:
    need(finite(value) and 0 < value <= 1, key, value, "a number in (0, 1]")


def int_at_least(key: str, value: Any, low: int) -> None:
    need(isinstance(value, int) and not isinstance(value, bool) and value >= low, key, value, f"an integer >= {low}")


def node(cfg: Any, path: str) -> Any:
    """The node at dotted ``path`` of a DictConfig or of dataclasses (whose channels are a dict)."""
    for part in path.split("."):
        cfg = cfg[part] if isinstance(cfg, Mapping) else getattr(cfg, part)
    return cfg
