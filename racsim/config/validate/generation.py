"""Asynchronous generation (``pipeline.generation`` with ``mode: async``; :class:`~racsim.config.schema.
GenerationConf`): the groups, the rollout engines, the trainer, admission, the queue, adoption and the gate,
and how they sit with the rest of the pipeline. Whether the policy fits the engines' GPUs with its KV cache
is checked where the engines are built (racsim.generation.draws), as an RM's memory is."""

from __future__ import annotations

from typing import Any

from racsim.config.schema import (ADMISSION_RULES, ADOPTIONS, ENGINE_SERVICES, GATES, QUEUE_FULL, TRAINER_SERVICES)
from racsim.config.validate.channel import channel_kind, faults_on
from racsim.config.validate.common import finite, fraction, int_at_least, need, need_one_of, nonneg
from racsim.config.validate.latency import seconds_in_range, validate_latency
from racsim.config.validate.rm import _gpu, _model, _pool

KEY = "pipeline.generation"


def validate_async(p: Any) -> None:
    """``pipeline.generation`` in async mode (``p``: the pipeline), block by block, then its cross rules."""
    g = p.generation
    int_at_least(f"{KEY}.group_size", g.group_size, 1)
    need(p.batch_size % g.group_size == 0, "pipeline.batch_size", p.batch_size,
         f"a multiple of pipeline.generation.group_size ({g.group_size}): a step trains whole groups")
    need(g.engines is not None, f"{KEY}.engines", None,
         f"a block in async mode: pick its model and gpu from conf/rm/, e.g. +rm/model@{KEY}.engines.model=8b "
         f"+rm/gpu@{KEY}.engines.gpu=H100")
    validate_engines(g.engines, f"{KEY}.engines")
    _trainer(g.trainer, f"{KEY}.trainer")
    _admission(g.admission, f"{KEY}.admission")
    _queue(g.queue, f"{KEY}.queue", p.batch_size // g.group_size)
    need_one_of(f"{KEY}.adoption", g.adoption, ADOPTIONS)
    need_one_of(f"{KEY}.gate", g.gate, GATES)
    need(p.arrivals.mode == "batch", "pipeline.arrivals.mode", p.arrivals.mode,
         "batch with pipeline.generation.mode=async (the engines decide when each sample is ready)")
    if g.gate == "all":
        for name, ch in p.channels.items():
            gate_all_channel(ch, f"pipeline.channels.{name}", "with pipeline.generation.gate=all")


def validate_engines(e: Any, key: str) -> None:
    """The rollout engines: the policy's shape and GPU (as an RM's), the pool, the service model and the
    token lengths."""
    _model(e.model, f"{key}.model")
    _gpu(e.gpu, f"{key}.gpu")
    _pool(e, key)
    int_at_least(f"{key}.concurrency", e.concurrency, 1)
    need_one_of(f"{key}.service", e.service, ENGINE_SERVICES)
    fraction(f"{key}.mfu", e.mfu)
    nonneg(f"{key}.overhead_s", e.overhead_s)
    fraction(f"{key}.mem_util", e.mem_util)
    validate_latency(e.prompt_tokens, f"{key}.prompt_tokens")
    validate_latency(e.response_tokens, f"{key}.response_tokens")
    int_at_least(f"{key}.max_prompt_tokens", e.max_prompt_tokens, 1)
    int_at_least(f"{key}.max_response_tokens", e.max_response_tokens, 1)


def _trainer(t: Any, key: str) -> None:
    need_one_of(f"{key}.service", t.service, TRAINER_SERVICES)
    int_at_least(f"{key}.gpus", t.gpus, 1)
    fraction(f"{key}.mfu", t.mfu)
    need(seconds_in_range(t.sync_s), f"{key}.sync_s", t.sync_s, "a finite number of seconds >= 0")


def _admission(a: Any, key: str) -> None:
    need_one_of(f"{key}.rule", a.rule, ADMISSION_RULES)
    int_at_least(f"{key}.eta", a.eta, 0)
    need(finite(a.staleness) and 0 <= a.staleness <= 1e6, f"{key}.staleness", a.staleness,
         "a finite number in [0, 1e6]")
    int_at_least(f"{key}.k", a.k, 0)


def _queue(q: Any, key: str, groups: int) -> None:
    if q.capacity is not None:
        int_at_least(f"{key}.capacity", q.capacity, groups)  # a step's groups must fit, or the trainer starves
    need_one_of(f"{key}.full", q.full, QUEUE_FULL)
    if q.max_lag is not None:
        int_at_least(f"{key}.max_lag", q.max_lag, 0)


def gate_all_channel(ch: Any, key: str, why: str) -> None:
    """A slow channel the lane simulates itself (gate all, or the gate-all schedule a blocking corrector
    reads in async mode): a queue channel of a latency law, routing and workers, nothing else."""
    need(channel_kind(ch) == "queue", f"{key}.kind", channel_kind(ch),
         f"queue {why}: a group waits for its slow results inside the generation lane, which simulates "
         "queue channels (a latency law on workers) only, not a gpu_rm pool's batches")
    need(ch.kernel is None, f"{key}.kernel", "[...]",
         f"null {why}: a kernel's delay counts optimizer steps, but the group must wait for its results in seconds")
    for field, off, allowed, what in (("autoscale", None, "null", "an autoscaled pool"),
                                      ("background", None, "null", "other tenants' requests"),
                                      ("cancel_on_drop", False, "false", "cancelling"),
                                      ("degraded_factor", 1.0, "1", "bursts")):
        need(getattr(ch, field, off) == off, f"{key}.{field}", getattr(ch, field),
             f"{allowed} {why}: {what} is not simulated inside the generation lane")
    need(not faults_on(ch), f"{key}.faults.mtbf_s", ch.faults.mtbf_s,
         f"null {why}: failing workers are not simulated inside the generation lane")


def validate_async_run(cfg: Any) -> None:
    """A pool split's block (capacity.split) is read with async generation only."""
    if getattr(cfg, "capacity", None) is None or cfg.pipeline.generation.mode == "async":
        return
    need(not cfg.capacity.enabled or cfg.capacity.split.gpus is None, "capacity.split.gpus", cfg.capacity.split.gpus,
         "null with pipeline.generation.mode=sync: a pool split (engines, trainer, judge) needs async generation; "
         "a lockstep capacity plan sizes one channel (capacity.counts)")
