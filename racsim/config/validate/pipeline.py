"""The optimizer clock (:class:`~racsim.config.schema.PipelineConf`): steps, batch, engine, the
phases of a step, its channels (racsim.config.validate.channel), ``fast_rm`` and
:class:`ArrivalsConf`."""

from __future__ import annotations

from typing import Any

from racsim.config.schema import ARRIVAL_MODES, ENGINES, GENERATION_MODES, PHASES, phase_conf
from racsim.config.validate.channel import validate_channel
from racsim.config.validate.common import int_at_least, need, need_file, need_one_of
from racsim.config.validate.generation import validate_async
from racsim.config.validate.latency import seconds_in_range, validate_latency
from racsim.config.validate.rm import validate_rm


def mean_seconds(x: Any) -> float:
    """A mean duration as the estimates read it: 0 when unset or outside what validation allows
    (the estimate runs before validation, which names such a value)."""
    return float(x) if seconds_in_range(x) else 0.0


def nominal_step(p: Any) -> float:
    """Seconds of one optimizer step from its phases' means (0 for a phase without one)."""
    return sum(mean_seconds(getattr(phase_conf(p, ph), "mean", None)) for ph in PHASES)


def validate_pipeline(p: Any) -> None:
    """``pipeline``, group by group."""
    _clock(p)
    _phases(p)
    _channels(p)
    if getattr(p, "fast_rm", None) is not None:
        validate_rm(p.fast_rm, "pipeline.fast_rm")
        need(not p.fast_rm.chunked_prefill, "pipeline.fast_rm.chunked_prefill", p.fast_rm.chunked_prefill,
             "false: the fast scorer's phase is modelled without chunked prefill (batching=continuous is allowed)")
    if getattr(p, "arrivals", None) is not None:
        validate_arrivals(p)
    if getattr(p, "generation", None) is not None:
        validate_generation(p)


def _clock(p: Any) -> None:
    int_at_least("pipeline.steps", p.steps, 1)
    if p.warmup_steps is not None:
        int_at_least("pipeline.warmup_steps", p.warmup_steps, 0)
        need(p.warmup_steps < p.steps, "pipeline.warmup_steps", p.warmup_steps,
             f"null (a fifth of the steps) or less than pipeline.steps={p.steps}: at least one step is measured")
    int_at_least("pipeline.batch_size", p.batch_size, 1)
    need_one_of("pipeline.engine", p.engine, ENGINES)


def _phases(p: Any) -> None:
    """Each phase's duration law; together they must make the clock advance."""
    for phase in PHASES:
        validate_latency(phase_conf(p, phase), f"pipeline.{phase}")
    need(any(phase_conf(p, ph).mean is None for ph in PHASES) or nominal_step(p) > 0, "pipeline.update.mean",
         phase_conf(p, "update").mean,
         "a number > 0, or another phase's mean: the phases of a step (pipeline.generate, fast_score, submit, "
         "update) all last 0 s, so the optimizer clock never advances")


def _channels(p: Any) -> None:
    """At least one channel, each valid, their shares not all 0."""
    need(len(p.channels) >= 1, "pipeline.channels", dict(p.channels),
         "at least one slow channel (K >= 1), e.g. +channel@pipeline.channels.judge=judge_rm")
    for name, ch in p.channels.items():
        validate_channel(ch, f"pipeline.channels.{name}")
    need(sum(ch.share for ch in p.channels.values()) > 0, "pipeline.channels.*.share",
         [ch.share for ch in p.channels.values()], "at least one channel with share > 0")


def validate_arrivals(p: Any) -> None:
    """pipeline.arrivals: its mode and the mode's own keys."""
    a, key = p.arrivals, "pipeline.arrivals"
    need_one_of(f"{key}.mode", a.mode, ARRIVAL_MODES)
    if a.mode == "stream":
        validate_latency(a.length, f"{key}.length")
    if a.mode == "trace":
        need_file(f"{key}.path", a.path, "the path of a CSV file whose column (pipeline.arrivals.column) holds "
                                         "each sample's offset in seconds from its step's start")
        need(isinstance(a.column, str) and bool(a.column), f"{key}.column", a.column, "the name of a CSV column")


LAG_KINDS = ("deterministic", "geometric", "empirical")  # pipeline.generation.lag: whole policy versions


def validate_generation(p: Any) -> None:
    """pipeline.generation: its mode (async: the engines, trainer, admission and queue) and, with sync,
    the law of the generation lag: whole policy versions >= 0 (its bounds whole numbers too; an
    empirical column's values are checked when it is read, racsim.pipeline.latency.whole_number_law)."""
    g, key = p.generation, "pipeline.generation"
    need_one_of(f"{key}.mode", g.mode, GENERATION_MODES)
    if g.mode == "async":
        validate_async(p)
        need(g.lag is None, f"{key}.lag", "...", "null with mode async: the engines give every sample its lag "
             "(a lag law stands in for them with mode sync)")
        return
    if g.lag is None:
        return
    lag = f"{key}.lag"
    need(g.lag.kind in LAG_KINDS, f"{lag}.kind", g.lag.kind,
         "one of " + ", ".join(LAG_KINDS) + " (a lag is a whole number of policy versions)")
    validate_latency(g.lag, lag)
    if g.lag.kind == "deterministic":
        need(float(g.lag.mean).is_integer(), f"{lag}.mean", g.lag.mean, "a whole number of policy versions >= 0")
    if g.lag.kind == "empirical":
        need(g.lag.mean is None, f"{lag}.mean", g.lag.mean,
             "null: an empirical lag is used as measured (rescaling would leave whole versions)")
    for bound in ("low", "high"):
        v = getattr(g.lag, bound)
        need(v is None or float(v).is_integer(), f"{lag}.{bound}", v, "null or a whole number of policy versions")
