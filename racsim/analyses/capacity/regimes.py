"""The slow regimes of the sized channel (random outages, bursts, an autoscaler, a schedule of
outages) and the time scales they set: the cycle a run's window must hold, the warm-up in which
the queue forgets its empty start, and the window each trial needs."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np

from racsim.analyses.capacity.channel import is_gpu, units_per_server
from racsim.analyses.capacity.episodes import count_episodes
from racsim.config.schema import RacsimConf
from racsim.config.validate.pipeline import nominal_step
from racsim.pipeline.faults import fault_spec, read_schedule

# Drop horizons (max_delay steps) a cycle of a random regime holds at least (regime_scales' horizon).
HORIZONS = 5


def regime_scales(cfg: RacsimConf, name: str) -> Dict[str, float]:
    """The time scales of channel ``name``'s slow regimes, in optimizer steps of the scenario's
    nominal step (its phases' means, s), one key per regime it has:

    * ``faults`` (random outages): one server's cycle, (mtbf_s / tp + mttr_s) / s. The pool's up
      count is a sum of independent alternating up/repair processes, each with autocorrelation
      exp(-t (1/mtbf + 1/mttr)), so the pool moves on one server's scale whatever its size (its
      failures, n times as frequent, overlap within it); the cycle is at least 4 of those
      relaxation times mtbf mttr / (mtbf + mttr) (AM-GM), so batches of one cycle are nearly
      independent.
    * ``bursts`` (the degrade/recover chain): a normal and a degraded spell, 1/p_degrade +
      1/p_recover steps (the chain's correlation time 1/(p_degrade + p_recover) is at most a
      quarter of it).
    * ``horizon`` (with outages or bursts, and a drop horizon ``max_delay``): :data:`HORIZONS` drop
      horizons. A result is known dropped only max_delay steps after it is sent (until then it is
      pending, out of the dropped share), and the backlog that drops it builds from the run's empty
      start over several horizons: with a window of a few horizons the dropped share reads low
      whatever the regime's own cycle (the bursty judge, 1/0.05 + 1/0.2 = 25 steps, max_delay 20:
      0.0% dropped at 6 GPUs in 75 steps with a 25-step warm-up, 0.3-0.4% in 300, 0.6% in 1200
      with a 100-step warm-up).
    * ``autoscale``: a scale-up and back down, (for_s + startup_s + idle_s) / s.
    * ``schedule`` (known outages, once): its span, up to the last outage's end, / s."""
    ch, step = cfg.pipeline.channels[name], nominal_step(cfg.pipeline)
    out = {}
    if ch.faults.mtbf_s is not None:
        spec = fault_spec(ch.faults, units_per_server(cfg, name))
        out["faults"] = (spec.mtbf + spec.mttr) / step
    if ch.faults.schedule is not None:
        out["schedule"] = schedule_span(cfg, name) / step
    if ch.degraded_factor != 1 and ch.p_degrade > 0:
        out["bursts"] = 1.0 / ch.p_degrade + 1.0 / ch.p_recover
    if {"faults", "bursts"} & set(out) and ch.max_delay is not None:  # the drop horizon under a random regime
        out["horizon"] = float(HORIZONS * ch.max_delay)
    if ch.autoscale is not None:
        a = ch.autoscale
        out["autoscale"] = (a.for_s + a.startup_s + a.idle_s) / step
    return out


def schedule_span(cfg: RacsimConf, name: str) -> float:
    """Seconds from the start to the end of the last outage of channel ``name``'s schedule, read
    for the largest pool the search may hold (its count or the largest listed)."""
    ch, units = cfg.pipeline.channels[name], units_per_server(cfg, name)
    pool = max([int(ch.rm.gpus if is_gpu(cfg, name) else ch.workers or 0), *cfg.capacity.counts]) // units
    ends = [u.max() for _, u in read_schedule(ch.faults.schedule, f"pipeline.channels.{name}.faults.schedule", pool)
            if u.size]
    return float(max(ends, default=0.0))


def slowest_regime(cfg: RacsimConf, name: str) -> Tuple[str, int]:
    """The slowest recurring regime (:func:`regime_scales` but a schedule's span) and its cycle
    in whole steps (a batch of the intervals' batch means holds
    :data:`~racsim.analyses.capacity.intervals.BATCH_CYCLES` of them);
    ('', 0) when there is none or ``capacity.regime_cycles`` is 0."""
    scales = {k: v for k, v in regime_scales(cfg, name).items() if k != "schedule"}
    if not scales or not cfg.capacity.regime_cycles:
        return "", 0
    kind = max(scales, key=scales.get)
    return kind, int(np.ceil(scales[kind]))


def regime_cycle(cfg: RacsimConf, name: str) -> int:
    """The cycle of :func:`slowest_regime`, in whole steps (0: none)."""
    return slowest_regime(cfg, name)[1]


def regime_warmup(cfg: RacsimConf, name: str, work_per_s: Optional[float] = None) -> Optional[int]:
    """The warm-up of a channel whose slow regimes all start in their stationary law (random
    outages, the burst chain: racsim.pipeline.faults, racsim.pipeline.draws.regime_path), in which
    the queue forgets its empty start: with a drop horizon, the one its regime's chain gives at this
    count (racsim.analyses.capacity.episodes: the chance of a drop and the mean backlog within 5% of
    their long-run values; at the count of ``cfg``, its work ``work_per_s`` or its draws'), at least
    the horizon (every result in flight at the start lands or drops within it); without one, one
    cycle of the slowest regime (:func:`regime_cycle`). None (MSER-5 decides) without slow regimes,
    with ``capacity.regime_cycles`` 0, or with an autoscaler or a schedule of outages, whose start
    is not their long run. MSER-5 on a series that slow regimes move takes an early excursion for a
    transient and cuts it: the dropped share read low (a test's queue under outages: 0.0327 against
    0.0354 with one cycle cut, sd 0.0087 against 0.0080 over 60 seeds; tests/test_capacity_regime.py).
    One cycle was short where drops come from a backlog that builds over several horizons: the bursty
    judge at 6 GPUs, whose chance of a drop reaches 95% of its long run after 335 steps, was cut 100
    (issue 50)."""
    kinds = regime_scales(cfg, name)
    if not kinds or not cfg.capacity.regime_cycles or set(kinds) - {"faults", "bursts", "horizon"}:
        return None
    found = count_episodes(cfg, name, work_per_s)
    if found is None:
        return regime_cycle(cfg, name)
    return max(found.warmup, int(cfg.pipeline.channels[name].max_delay))


def regime_window(cfg: RacsimConf, name: str) -> int:
    """Steps each trial's measured window needs (0: no slow regime): together the trials'
    windows hold ``capacity.regime_cycles`` cycles (:func:`regime_cycle`), each trial's at least
    one, max(c, ceil(K c / trials)); and a schedule's span, all of it."""
    if not cfg.capacity.regime_cycles:
        return 0
    c = regime_cycle(cfg, name)
    span = regime_scales(cfg, name).get("schedule", 0.0)
    return int(max(c, np.ceil(cfg.capacity.regime_cycles * c / int(cfg.learner.trials)), np.ceil(span)))
