"""The longest runs that fit in memory: a search whose runs may double past what fits has
``capacity.max_steps`` lowered to the longest doubling that does (alone, or ``runs`` side by side)."""

from __future__ import annotations

from typing import Optional, Tuple

from racsim.config.schema import RacsimConf
from racsim.config.spec import replace_at
from racsim.config.validate import longest_steps, memory_room, run_estimate


def fitting_steps(cfg: RacsimConf, runs: int = 1) -> Optional[int]:
    """Where ``runs`` runs of a capacity search's longest length (``pipeline.steps`` doubled up to
    ``capacity.max_steps``: :func:`~racsim.config.validate.longest_steps`; ``capacity.run_length=auto``)
    do not fit in memory side by side (:func:`~racsim.config.validate.memory_room`) but ``runs`` of its
    first ones do: the longest doubling that fits; else None (they fit, or not even the first do)."""
    cap, steps = cfg.capacity, int(cfg.pipeline.steps)
    if cap.run_length != "auto":
        return None
    room = memory_room(cfg)
    top = fits = longest_steps(steps, int(cap.max_steps))
    while fits >= steps and runs * run_estimate(replace_at(cfg, "capacity.max_steps", fits))["memory"] > room:
        fits //= 2
    return fits if steps <= fits < top else None


def steps_that_fit(cfg: RacsimConf) -> Tuple[RacsimConf, Optional[str]]:
    """A search whose runs may double (``capacity.run_length=auto``) up to a length that does
    not fit in memory (:func:`fitting_steps`), though its first run does: ``capacity.max_steps``
    lowered to the longest doubling that fits, and a note that says so (a count that would need
    a longer run is then found not stationary, never recommended); else ``cfg`` as it is and None
    (:func:`~racsim.config.validate.check_limits` refuses a first run too big, naming its knob)."""
    fits = fitting_steps(cfg)
    if fits is None:
        return cfg, None
    need = run_estimate(replace_at(cfg, "capacity.max_steps", 2 * fits))["memory"]
    return replace_at(cfg, "capacity.max_steps", fits), (
        f"capacity.max_steps lowered from {cfg.capacity.max_steps} to {fits}: a run of {2 * fits} steps needs about "
        f"{need / 1e9:.3g} GB, past the {memory_room(cfg) / 1e9:.3g} GB a run may take (limits.memory_gb, and what this "
        f"process can have); raise limits.memory_gb or lower learner.trials to allow longer runs")

