"""One slow channel (:class:`~racsim.config.schema.ChannelConf`): a queue channel (latency or
kernel, workers, drops), a gpu_rm channel (its ``rm`` server), routing, latency bursts,
cancelling, and its pool's :class:`AutoscaleConf` and :class:`FaultsConf`."""

from __future__ import annotations

from typing import Any

from racsim.config.schema import CHANNEL_KINDS
from racsim.config.validate.common import (MAX_GAIN, MAX_PRICE, finite, int_at_least, need, need_file, need_one_of,
                                           nonneg, positive)
from racsim.config.validate.latency import validate_latency
from racsim.config.validate.rm import validate_rm

FAILURE_POLICIES = ("resend", "retry", "lose")
FAULT_SECONDS = (1e-6, 1e12)  # faults.mtbf_s and mttr_s: a microsecond to 30,000 years
MIN_UP_VS_REPAIR = 1e-7  # a server's mean up time over its mean repair time, at least


def channel_kind(ch: Any) -> str:
    """``queue`` or ``gpu_rm`` (``queue`` for a channel written before kinds)."""
    return getattr(ch, "kind", "queue")


def has_workers(ch: Any) -> bool:
    """A clock channel (not a kernel) with a fixed number of workers set."""
    return ch.kernel is None and ch.workers is not None


def pooled(ch: Any) -> bool:
    """A channel with servers to size, fail or count: gpu_rm replicas, or a queue channel's workers."""
    return channel_kind(ch) == "gpu_rm" or has_workers(ch)


def faults_on(ch: Any) -> bool:
    """Does the channel's replicas fail (``faults.mtbf_s`` or ``faults.schedule`` set)?"""
    f = getattr(ch, "faults", None)
    return getattr(f, "mtbf_s", None) is not None or getattr(f, "schedule", None) is not None


def fault_seconds(x: Any) -> bool:
    """A mean up or repair time within FAULT_SECONDS."""
    return finite(x) and FAULT_SECONDS[0] <= x <= FAULT_SECONDS[1]


def validate_channel(ch: Any, key: str) -> None:
    """``pipeline.channels.NAME`` (``key``), group by group."""
    _queue(ch, key)
    validate_channel_kind(ch, key)
    _routing(ch, key)
    _bursts(ch, key)
    if getattr(ch, "cancel_on_drop", False):
        need(channel_kind(ch) == "queue" and has_workers(ch), f"{key}.cancel_on_drop", ch.cancel_on_drop,
             "false here: cancelling frees a worker, so it needs a queue channel with workers set "
             "(not a kernel, not gpu_rm)")
    if getattr(ch, "autoscale", None) is not None:
        validate_autoscale(ch, f"{key}.autoscale")
    if faults_on(ch):
        validate_faults(ch, f"{key}.faults")
    if getattr(ch, "background", None) is not None:
        validate_background(ch, f"{key}.background")


def validate_background(ch: Any, key: str) -> None:
    """A background block: on a queue channel with a fixed number of workers, or on a gpu_rm
    pool of static or unchunked continuous batches without bursts; neither autoscaled, with
    faults or with cancel_on_drop. A finite rate > 0; a queue's latency law or a pool's token
    laws, if any (the other null)."""
    b = ch.background
    gpu = channel_kind(ch) == "gpu_rm"
    need((gpu or (channel_kind(ch) == "queue" and has_workers(ch))) and getattr(ch, "autoscale", None) is None
         and not faults_on(ch) and not getattr(ch, "cancel_on_drop", False), key, "{...}",
         "null here: background traffic is modelled on a queue channel with a fixed number of workers or on a "
         "gpu_rm pool (not a kernel, autoscale, faults or cancel_on_drop)")
    positive(f"{key}.rate_per_s", b.rate_per_s)
    if gpu:
        need(not ch.rm.chunked_prefill, key, "{...}",
             "null with rm.chunked_prefill (other tenants' requests are batched whole)")
        need(getattr(ch, "degraded_factor", 1.0) == 1, key, "{...}",
             "null with bursts (degraded_factor != 1: a burst's factor belongs to the learner's steps)")
        need(b.latency is None, f"{key}.latency", "{...}",
             "null on a gpu_rm channel: its requests take the batcher's seconds (set prompt_tokens, response_tokens)")
    for law in ("prompt_tokens", "response_tokens"):
        need(gpu or getattr(b, law) is None, f"{key}.{law}", "{...}",
             "null on a queue channel (token lengths apply to a gpu_rm pool; set latency)")
        if getattr(b, law) is not None:
            validate_latency(getattr(b, law), f"{key}.{law}")
    if b.latency is not None:
        validate_latency(b.latency, f"{key}.latency")


def _queue(ch: Any, key: str) -> None:
    """Workers, drops, share, and the delays: a kernel row or a latency law."""
    if ch.workers is not None:
        int_at_least(f"{key}.workers", ch.workers, 1)
    if ch.max_delay is not None:
        int_at_least(f"{key}.max_delay", ch.max_delay, 0)
    nonneg(f"{key}.share", ch.share)
    if ch.kernel is not None:
        k = list(ch.kernel)
        need(len(k) >= 1 and all(finite(v) and v >= 0 for v in k), f"{key}.kernel", k,
             "a non-empty list of probabilities >= 0 over Delta = 0, 1, ...")
        need(sum(k) <= 1 + 1e-12, f"{key}.kernel", k, f"a kernel row must sum to at most 1 (it sums to {sum(k):.6g})")
    else:
        validate_latency(ch.latency, f"{key}.latency")


def validate_channel_kind(ch: Any, key: str) -> None:
    """A channel's ``kind`` and its ``rm`` block agree."""
    kind = channel_kind(ch)
    rm = getattr(ch, "rm", None)
    need_one_of(f"{key}.kind", kind, CHANNEL_KINDS)
    if kind == "queue":
        need(rm is None, f"{key}.rm", "{...}", "null unless kind is gpu_rm (set kind=gpu_rm to serve it on GPUs)")
        return
    need(rm is not None, f"{key}.rm", rm,
         "an RM server (model, gpu, gpus, batcher), e.g. channel=judge_gpu_rm, when kind is gpu_rm")
    need(ch.kernel is None, f"{key}.kernel", list(ch.kernel or []), "null for a gpu_rm channel")
    need(ch.workers is None, f"{key}.workers", ch.workers,
         f"null for a gpu_rm channel: its servers are {key}.rm.gpus / {key}.rm.tp replicas")
    validate_rm(rm, f"{key}.rm")


def _routing(ch: Any, key: str) -> None:
    rp = getattr(ch, "route_prob", 1.0)
    need(finite(rp) and 1 / MAX_GAIN <= rp <= 1, f"{key}.route_prob", rp,
         f"a probability in [{1 / MAX_GAIN:g}, 1] (a routed result is weighted 1 / route_prob)")
    need(rp == 1 or channel_kind(ch) == "queue", f"{key}.route_prob", rp,
         "1 for a gpu_rm channel (routing is modelled for queue and kernel channels)")


def _bursts(ch: Any, key: str) -> None:
    """degraded_factor and, when it is not 1, the two-state chain's p_degrade and p_recover."""
    f = getattr(ch, "degraded_factor", 1.0)
    need(finite(f) and f > 0, f"{key}.degraded_factor", f, "a finite number > 0 (1: no bursts)")
    if f == 1:  # the chain is off, but its probabilities are still probabilities
        for k in ("p_degrade", "p_recover"):
            p = getattr(ch, k)
            need(finite(p) and 0 <= p <= 1, f"{key}.{k}", p, "a probability in [0, 1] per step")
        return
    need(ch.kernel is None, f"{key}.degraded_factor", f,
         "1 for a kernel channel (bursts scale a queue channel's latency or a gpu_rm channel's batch seconds)")
    need(ch.rm is None or not ch.rm.chunked_prefill, f"{key}.degraded_factor", f,
         "1 with rm.chunked_prefill (bursts are modelled on whole batches, not chunked iterations)")
    for k, what in (("p_degrade", "a normal step is followed by a degraded one"),
                    ("p_recover", "a degraded step is followed by a normal one")):
        p = getattr(ch, k)
        need(finite(p) and 0 < p <= 1, f"{key}.{k}", p, f"a probability in (0, 1] per step: the chance {what}")


def validate_autoscale(ch: Any, key: str) -> None:
    """An autoscale block: a queue channel with workers (not a kernel, no cancel_on_drop) or a
    gpu_rm channel; 1 <= min <= max; queue_above >= 0; positive seconds; a price >= 0 or null."""
    a = ch.autoscale
    gpu = channel_kind(ch) == "gpu_rm"
    need(gpu or (has_workers(ch) and not getattr(ch, "cancel_on_drop", False)),
         key, "set", "null here: autoscaling sizes a gpu_rm channel's replicas or a queue channel's workers "
         "(workers set, no kernel, cancel_on_drop false)")
    need(not (gpu and ch.rm is not None and ch.rm.chunked_prefill), key, "set",
         "null with rm.chunked_prefill (an autoscaled pool serves whole batches)")
    int_at_least(f"{key}.min", a.min, 1)
    int_at_least(f"{key}.max", a.max, a.min)
    int_at_least(f"{key}.queue_above", a.queue_above, 0)
    for k in ("for_s", "startup_s", "idle_s"):
        positive(f"{key}.{k}", getattr(a, k))
    if a.cost_per_hour is not None:
        nonneg(f"{key}.cost_per_hour", a.cost_per_hour, MAX_PRICE, "USD per server-hour: past it a pool's cost is "
               "no number")


def validate_faults(ch: Any, key: str) -> None:
    """A channel's ``faults``: a gpu_rm channel or a queue channel with workers, positive finite
    MTBF and MTTR, a known policy."""
    f = ch.faults
    on = "mtbf_s" if f.schedule is None else "schedule"  # the key that turned failures on
    gpu_rm = channel_kind(ch) == "gpu_rm"
    need(pooled(ch), f"{key}.{on}", getattr(f, on),
         "null here: failures are modelled for gpu_rm channels (their replicas) and queue channels with "
         "workers set (not a kernel)")
    need(not getattr(ch, "cancel_on_drop", False), f"{key}.{on}", getattr(f, on),
         "null with cancel_on_drop=true (cancelling requests on workers that fail is not modelled): "
         f"unset one of faults.{on}, cancel_on_drop")
    if f.schedule is not None:
        _fault_schedule(f, key)
    else:
        _fault_rates(ch, key)
    need(f.on_failure is None or f.on_failure in FAILURE_POLICIES, f"{key}.on_failure", f.on_failure,
         "one of " + ", ".join(FAILURE_POLICIES) + ", or null (resend on a gpu_rm channel, retry on workers)")
    need(gpu_rm or f.on_failure != "resend", f"{key}.on_failure", f.on_failure,
         "retry, lose or null on a queue channel's workers (resend re-sends a gpu_rm channel's batches; "
         "a worker keeps its request)")
    int_at_least(f"{key}.max_retries", f.max_retries, 0)
    need(getattr(ch, "autoscale", None) is None, f"{key}.{on}", getattr(f, on),
         "null on an autoscaled channel (failures are modelled for fixed pools)")
    need(not gpu_rm or not ch.rm.chunked_prefill, f"{key}.{on}", getattr(f, on),
         "null with rm.chunked_prefill (a failure cuts whole batches, not chunked iterations)")


def _fault_schedule(f: Any, key: str) -> None:
    """Outages read from a CSV, which replace the random ones."""
    what = "a path to a CSV of outages (columns server, down_s, up_s), or null"
    need(isinstance(f.schedule, str) and f.schedule.strip() != "", f"{key}.schedule", f.schedule, what)
    for k in ("mtbf_s", "mttr_s"):
        need(getattr(f, k) is None, f"{key}.{k}", getattr(f, k),
             "null with faults.schedule (the schedule's outages replace the random ones)")
    need_file(f"{key}.schedule", f.schedule, what)


def _fault_rates(ch: Any, key: str) -> None:
    """Random outages: MTBF and MTTR in range, a server (a replica of tp GPUs) up long enough against its repairs."""
    f = ch.faults
    for k in ("mtbf_s", "mttr_s"):
        need(fault_seconds(getattr(f, k)), f"{key}.{k}", getattr(f, k),
             f"a number of seconds in [{FAULT_SECONDS[0]:g}, {FAULT_SECONDS[1]:g}] (the mean "
             + ("up time of one GPU or worker" if k == "mtbf_s" else "repair time of a replica or worker") + ")")
    tp = int(ch.rm.tp) if channel_kind(ch) == "gpu_rm" else 1
    need(f.mtbf_s / tp >= MIN_UP_VS_REPAIR * f.mttr_s, f"{key}.mtbf_s", f.mtbf_s,
         f"at least {MIN_UP_VS_REPAIR:g} x faults.mttr_s ({f.mttr_s:g} s)" + (f" x tp ({tp})" if tp > 1 else "")
         + ": a server's up times shorter than that are lost in the clock's rounding once it has been "
         "repaired many times")
