"""The capacity search (:class:`~racsim.config.schema.CapacityConf`): the channel it sizes, the
counts it tries, the targets a count must meet and how long each count runs."""

from __future__ import annotations

from typing import Any, List

from racsim.config.schema import CAPACITY_SEARCHES, CORRECTORS, SENSITIVITY_INPUTS
from racsim.config.validate.channel import channel_kind, pooled
from racsim.config.validate.common import MAX_PRICE, finite, int_at_least, need, need_one_of, nonneg, positive

RUN_LENGTHS = ("auto", "fixed")
MAX_COUNT = 1_000_000  # GPUs or workers in one pool: past it, a typo


def validate_capacity(cfg: Any) -> None:
    """The capacity search's channel, counts and targets."""
    c = cfg.capacity
    ch = _sized_channel(c, cfg.pipeline.channels)
    counts = list(c.counts)
    need(len(counts) >= 1 and all(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_COUNT
                                  for n in counts),
         "capacity.counts", counts, f"a non-empty list of integers in [1, {MAX_COUNT:,}] (GPUs or workers)")
    if channel_kind(ch) == "gpu_rm":  # a search takes the counts that are whole replicas (and says so)
        need(any(n % ch.rm.tp == 0 for n in counts), "capacity.counts", counts,
             f"at least one multiple of the channel's tp ({ch.rm.tp}): GPUs in whole replicas of tp GPUs")
    if c.max_count is not None:
        need(isinstance(c.max_count, int) and not isinstance(c.max_count, bool)
             and max(counts) <= c.max_count <= MAX_COUNT, "capacity.max_count", c.max_count,
             f"null (twice the largest listed count) or an integer in [{max(counts)}, {MAX_COUNT:,}]: the largest "
             f"count the search tries above capacity.counts")
    _targets(c, cfg.corrector)
    _run_length(c, cfg.pipeline.steps)
    _sensitivity(c, ch)


def _sized_channel(c: Any, chans: Any) -> Any:
    """capacity.channel, or the one channel that can be sized when it is null: a gpu_rm channel or a
    queue channel with workers."""
    if c.channel is None:
        able = [n for n, ch in chans.items() if channel_kind(ch) == "gpu_rm" or ch.workers is not None]
        need(len(able) == 1, "capacity.channel", c.channel,
             "the name of the channel to size (one of " + ", ".join(chans) + ")")
        name = able[0]
    else:
        need_one_of("capacity.channel", c.channel, chans)
        name = c.channel
    ch = chans[name]
    need(pooled(ch), "capacity.channel", name,
         "a gpu_rm channel, or a queue channel with workers (not a kernel or unlimited channel)")
    need(c.max_background_sojourn_p95_s is None or getattr(ch, "background", None) is not None,
         "capacity.max_background_sojourn_p95_s", c.max_background_sojourn_p95_s,
         f"null: channel {name} has no background block (no other tenants' requests to time)")
    return ch


def _targets(c: Any, corrector: Any) -> None:
    """The corrector a count is judged with and the figures it must meet."""
    need_one_of("capacity.search", c.search, CAPACITY_SEARCHES)
    need_one_of("capacity.corrector", c.corrector, CORRECTORS)
    need(c.corrector in list(corrector.names), "capacity.corrector", c.corrector,
         "one of corrector.names (" + ", ".join(corrector.names) + ")")
    for f in ("max_bias", "max_bias_vs_naive", "max_step_s", "max_sojourn_p95_s", "max_sojourn_p99_s",
              "max_background_sojourn_p95_s"):
        if getattr(c, f) is not None:
            positive(f"capacity.{f}", getattr(c, f))
    if c.max_dropped is not None:
        need(finite(c.max_dropped) and 0 <= c.max_dropped <= 1, "capacity.max_dropped", c.max_dropped,
             "a share in [0, 1] of the channel's results dropped (default 0.01), or null for no target")
    if c.max_delay_p95_steps is not None:
        nonneg("capacity.max_delay_p95_steps", c.max_delay_p95_steps)
    if c.price_per_unit_hour is not None:
        nonneg("capacity.price_per_unit_hour", c.price_per_unit_hour, MAX_PRICE, "USD per unit-hour: past it a "
               "plan's cost is no number")
    need(finite(c.max_load) and 0 < c.max_load <= 1, "capacity.max_load", c.max_load,
         "a number in (0, 1]: the offered load from which a count is overloaded (default 0.95)")
    need(finite(c.confidence) and 0.5 <= c.confidence < 1, "capacity.confidence", c.confidence,
         "a number in [0.5, 1): the level of each figure's interval (default 0.95); a target is met by the "
         "interval's upper end, which below 0.5 would sit under the estimate itself")
    int_at_least("capacity.resamples", c.resamples, 20)
    need(isinstance(c.workers, int) and not isinstance(c.workers, bool) and c.workers >= 0, "capacity.workers",
         c.workers, "an integer >= 0: processes simulating the counts side by side (1: one at a time; 0, the "
         "default: every usable core, when that saves time)")


def _run_length(c: Any, steps: int) -> None:
    need_one_of("capacity.run_length", c.run_length, RUN_LENGTHS)
    int_at_least("capacity.max_steps", c.max_steps, 1)
    need(isinstance(c.regime_cycles, int) and not isinstance(c.regime_cycles, bool) and c.regime_cycles >= 0,
         "capacity.regime_cycles", c.regime_cycles, "an integer >= 0: cycles of the slowest regime the measured "
         "windows hold together (default 100; 0: runs and intervals that ignore slow regimes)")
    need(isinstance(c.decide_steps, int) and not isinstance(c.decide_steps, bool) and c.decide_steps >= 0,
         "capacity.decide_steps", c.decide_steps, "an integer >= 0: simulated steps the replications that decide an "
         "answer may take together (default 12000; 0: no replications)")
    need(c.decide_s is None or (finite(c.decide_s) and c.decide_s >= 0), "capacity.decide_s", c.decide_s,
         "null (default: only capacity.decide_steps bounds them, the same answer on any machine) or a number >= 0: "
         "seconds of wall-clock the replications that decide an answer may take")
    need(c.run_length == "fixed" or c.max_steps >= steps, "capacity.max_steps", c.max_steps,
         f"at least pipeline.steps ({steps}): the auto run length starts there and doubles up to it")


def scalable(law: Any) -> bool:
    """Can a duration or length law be multiplied by a factor through its fields (every kind but an
    empirical column used as measured, ``mean`` null)?"""
    return not (law.kind == "empirical" and law.mean is None)


def sensitivity_inputs(ch: Any) -> List[str]:
    """The inputs of :data:`~racsim.config.schema.SENSITIVITY_INPUTS` that apply to the sized
    channel ``ch``: a roofline's MFU and the token laws of a gpu_rm channel, the arrival rate,
    the MTBF and MTTR of random failures, a queue channel's service times, its other tenants' rate."""
    gpu = channel_kind(ch) == "gpu_rm"
    failing = getattr(getattr(ch, "faults", None), "mtbf_s", None) is not None
    applies = {"mfu": gpu and ch.rm.service == "roofline",
               "tokens": gpu and scalable(ch.rm.prompt_tokens) and scalable(ch.rm.response_tokens),
               "batch_size": True, "mtbf_s": failing, "mttr_s": failing,
               "service": not gpu and scalable(ch.latency),
               "background_rate": getattr(ch, "background", None) is not None}
    return [k for k in SENSITIVITY_INPUTS if applies[k]]


def _sensitivity(c: Any, ch: Any) -> None:
    """capacity.sensitivity: a spread in (0, 1), inputs by name; when on, each one applying to the channel."""
    s = c.sensitivity
    need(finite(s.spread) and 0 < s.spread < 1, "capacity.sensitivity.spread", s.spread,
         "a number in (0, 1): each input is moved this share down and up (default 0.2)")
    if s.inputs is None:
        return
    need(len(s.inputs) >= 1, "capacity.sensitivity.inputs", list(s.inputs),
         "null (every input that applies) or a non-empty list of " + ", ".join(SENSITIVITY_INPUTS)
         + " (capacity.sensitivity.enabled=false turns the table off)")
    need(len(set(s.inputs)) == len(s.inputs), "capacity.sensitivity.inputs", list(s.inputs), "each input once")
    able = sensitivity_inputs(ch)
    for x in s.inputs:
        need_one_of("capacity.sensitivity.inputs", x, SENSITIVITY_INPUTS)
        need(not s.enabled or x in able, "capacity.sensitivity.inputs", x,
             "an input that applies to the sized channel: " + ", ".join(able)
             + " (mfu, tokens: a gpu_rm roofline; mtbf_s, mttr_s: faults.mtbf_s set; service: a queue channel)")
