"""How a capacity answer moves with its assumptions: the sensitivity table.

A capacity answer rests on inputs a user guesses: the GPU's MFU, the token lengths, the arrival
rate, the failures' MTBF and MTTR, a queue's service times. With ``capacity.sensitivity.enabled``,
each input that applies to the sized channel (``capacity.sensitivity.inputs``, null: all of
:func:`~racsim.config.validate.sensitivity_inputs`) is moved ``spread`` down and up, the others
as given (a roofline's answer is also found under measured kernels, ``rm.service=kernels``: one
variant, its value a full batch's seconds, :func:`full_batch_seconds`),
and the fewest count meeting the same targets is found for each variant, over the same
range of counts as the plain search (the fewest the channel can have up to the largest it may try,
:func:`~racsim.config.validate.estimate.search_top`; whole servers).

Cheaply: the base answer n and its offered load are known, so each variant's long-run loads
(:func:`~racsim.analyses.capacity.channel_loads`, no simulation) rule out its overloaded counts
and name where to start: the count whose load is nearest the base answer's. From there an
exponential search (:func:`~racsim.analyses.capacity.fewest_from`) brackets the variant's fewest passing count and
bisects inside the bracket (:func:`~racsim.analyses.capacity.search.first_passing`); usually one or two
counts are simulated per variant, all near its answer. The counts above are not simulated: where
one of them fails (not stationary within ``capacity.max_steps``, say), a plain run, which needs
every count it evaluated above its answer to pass, may answer otherwise. Each count is evaluated exactly as the plain capacity run
evaluates it (:func:`~racsim.analyses.capacity.count_rows`: the same seed, draws and settle; only
the correctors its verdict reads, :func:`~racsim.analyses.capacity.judged_only`), so
where meeting the targets is monotone in the count, as the bisect search also assumes, a
variant's answer is the plain run's of the varied spec.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import pandas as pd

from racsim.analyses.capacity import (CapacityResult, channel_loads, channel_of, count_key, count_note, count_rows,
                                      fewest_from, fewest_valid, fixed_pool, judged_only, meets, pool_size, run_capacity,
                                      steps_that_fit, targets_of, units_per_server)
from racsim.config.schema import LatencyConf, RacsimConf
from racsim.config.spec import replace_at
from racsim.config.validate import check_limits, sensitivity_inputs, validate
from racsim.errors import ConfigError
from racsim.progress import Progress
from racsim.io import side_by_side
from racsim.pipeline.latency import build_latency
from racsim.pipeline.service import build_service

# Location and scale fields of a LatencyConf: multiplied together they scale the law (shape kept).
LAW_SCALES = ("mean", "std", "median", "scale", "low", "high")


@dataclass
class Variant:
    """One input moved: its name, the spec with it moved, its value there and as given."""

    input: str
    spec: RacsimConf
    value: float
    base: float


def times(x: float, factor: float) -> float:
    """``x * factor`` to 12 significant digits: 0.4 x 0.8 is 0.32, as a user would type it."""
    return float(f"{x * factor:.12g}")


def scaled_law(law: LatencyConf, factor: float) -> LatencyConf:
    """The law of ``factor`` x X for X ~ ``law``: its location and scale fields (:data:`LAW_SCALES`)
    multiplied, its shape (sigma, alpha) kept; exact for every kind (a clipped or truncated law's
    window scales with it) but a rounded one (``discrete``)."""
    return dataclasses.replace(law, **{f: times(getattr(law, f), factor) for f in LAW_SCALES
                                       if getattr(law, f) is not None})


def input_keys(name: str, what: str) -> str:
    """The config key(s) input ``what`` of channel ``name`` sets."""
    at = f"pipeline.channels.{name}"
    return {"mfu": f"{at}.rm.mfu", "mfu_scale": f"{at}.rm.mfu_scale",
            "tokens": f"{at}.rm.prompt_tokens, {at}.rm.response_tokens",
            "batch_size": "pipeline.batch_size", "mtbf_s": f"{at}.faults.mtbf_s", "mttr_s": f"{at}.faults.mttr_s",
            "service": f"{at}.latency", "background_rate": f"{at}.background.rate_per_s",
            "kernels": f"{at}.rm.service"}[what]


def input_value(cfg: RacsimConf, name: str, what: str) -> float:
    """The value the table shows for input ``what``: the MFU or its scale on the efficiency curve, mean
    tokens per sequence (prompt + response), the batch size, the MTBF or MTTR in seconds, the mean
    service seconds, the other tenants' requests a second; for ``kernels``, the seconds of a full
    batch (:func:`full_batch_seconds`) under the spec's service model."""
    ch = cfg.pipeline.channels[name]
    if what in ("mfu", "mfu_scale"):
        return float(getattr(ch.rm, what))
    if what == "kernels":
        return full_batch_seconds(ch.rm, f"pipeline.channels.{name}.rm")
    if what == "tokens":
        return mean_tokens(ch.rm)
    if what == "batch_size":
        return float(cfg.pipeline.batch_size)
    if what in ("mtbf_s", "mttr_s"):
        return float(getattr(ch.faults, what))
    if what == "background_rate":
        return float(ch.background.rate_per_s)
    return float(build_latency(ch.latency).mean())


def mean_tokens(rm) -> float:
    """Mean tokens of a sequence an RM scores: its prompt's and response's laws' means."""
    return float(build_latency(rm.prompt_tokens).mean() + build_latency(rm.response_tokens).mean())


def full_batch_seconds(rm, key: str) -> float:
    """Seconds of one full batch of sequences of the mean length (rounded) under the RM's service model:
    as many as ``max_batch`` and the token budget allow, at least one."""
    length = max(1.0, round(mean_tokens(rm)))
    count = float(max(1, min(int(rm.max_batch), int(rm.token_budget // length))))
    return float(build_service(rm, key).seconds(count, count * length, count * length * length, length))


def vary(cfg: RacsimConf, name: str, what: str, factor: float) -> RacsimConf:
    """The spec with input ``what`` of channel ``name`` multiplied by ``factor``: the MFU (at most 1) or
    its scale on the efficiency curve, both token laws (:func:`scaled_law`), the batch size (the nearest
    integer, at least one away from the given one, at least 1: the arrival rate, the step's clock
    unchanged), the MTBF or MTTR, the queue's service law, the other tenants' rate; ``kernels``: the
    kernel service model instead of the roofline (``factor`` aside)."""
    at, ch = f"pipeline.channels.{name}", cfg.pipeline.channels[name]
    if what == "mfu":
        return replace_at(cfg, f"{at}.rm.mfu", min(1.0, times(ch.rm.mfu, factor)))
    if what == "mfu_scale":
        return replace_at(cfg, f"{at}.rm.mfu_scale", times(ch.rm.mfu_scale, factor))
    if what == "kernels":
        return replace_at(cfg, f"{at}.rm.service", "kernels")
    if what == "tokens":
        for law in ("prompt_tokens", "response_tokens"):
            cfg = replace_at(cfg, f"{at}.rm.{law}", scaled_law(getattr(ch.rm, law), factor))
        return cfg
    if what == "batch_size":
        b = int(cfg.pipeline.batch_size)
        v = round(b * factor)
        return replace_at(cfg, "pipeline.batch_size", max(b + 1, v) if factor >= 1 else max(1, min(b - 1, v)))
    if what in ("mtbf_s", "mttr_s"):
        return replace_at(cfg, f"{at}.faults.{what}", times(getattr(ch.faults, what), factor))
    if what == "background_rate":
        return replace_at(cfg, f"{at}.background.rate_per_s", times(ch.background.rate_per_s, factor))
    return replace_at(cfg, f"{at}.latency", scaled_law(ch.latency, factor))


def searchable(cfg: RacsimConf) -> RacsimConf:
    """``cfg`` as a capacity search runs it, checked as the search checks it first
    (racsim.analyses.capacity.run_capacity): validated, its longest run lowered to what fits
    (:func:`~racsim.analyses.capacity.steps_that_fit`), within ``limits``; else the ConfigError naming the knob."""
    validate(cfg)
    cfg = steps_that_fit(cfg)[0]
    check_limits(cfg)
    return cfg


def variants(cfg: RacsimConf) -> List[Variant]:
    """Every input of ``capacity.sensitivity`` moved down and up, each variant's spec validated and
    checked against ``limits`` with its longest run lowered to what fits as the base search's is
    (:func:`~racsim.analyses.capacity.steps_that_fit`; before any count is simulated: a bad one is refused naming
    ``capacity.sensitivity.spread``);
    a move that leaves the input as given (an MFU of 1 moved up, a batch of 1 down) is left out. The base
    search is checked first, so that its own mistake (``capacity.resamples`` too large) is named as itself."""
    searchable(cfg)
    name = channel_of(cfg)
    s = cfg.capacity.sensitivity
    out = []
    for what in (s.inputs if s.inputs is not None else sensitivity_inputs(cfg.pipeline.channels[name])):
        base = input_value(cfg, name, what)
        for factor in ((1.0,) if what == "kernels" else (1.0 - s.spread, 1.0 + s.spread)):
            v = vary(cfg, name, what, factor)
            try:
                v = searchable(v)
            except ConfigError as e:
                raise ConfigError("capacity.sensitivity.spread", s.spread,
                                  f"a spread whose moved {what} is still a valid input ({e})") from e
            value = input_value(v, name, what)
            if value != base or what == "kernels":
                out.append(Variant(what, v, value, base))
    return out


def variant_fewest(cfg: RacsimConf, counts: List[int], start_load: float, chosen: str,
                   say: Optional[Callable[[int, str, int], None]] = None) -> Tuple[Optional[int], List[int]]:
    """The fewest of ``counts`` meeting the capacity targets for the spec ``cfg`` (with ``chosen``),
    and the counts simulated to find it: overloaded counts (long-run load, no simulation) fail;
    the search starts at the count whose load is nearest ``start_load`` (the fewest of two as near;
    :func:`~racsim.analyses.capacity.fewest_from`). ``say(n, note, k)``: progress on count ``n`` (k = 1: evaluated, its
    :func:`~racsim.analyses.capacity.count_note`; k = 0: its run doubled)."""
    name = channel_of(cfg)
    key, targets = count_key(cfg, name), targets_of(cfg)
    loads = channel_loads(cfg, name, key, counts)
    able = [n for n in counts if loads[n]["load"] < cfg.capacity.max_load]
    if not able:
        return None, []
    seen = {}

    def passes(n: int) -> bool:
        if n not in seen:
            rows = count_rows(cfg, name, key, n, loads[n], None if say is None else lambda note: say(n, note, 0))[1]
            seen[n] = meets(rows, chosen, targets)
            if say is not None:
                say(n, count_note(rows, chosen, targets), 1)
        return seen[n]

    start = min(range(len(able)), key=lambda i: abs(loads[able[i]]["load"] - start_load))
    return fewest_from(able, start, passes), sorted(seen)


def sensitivity_table(res: CapacityResult, planned: List[Variant], progress: Optional[Progress] = None) -> pd.DataFrame:
    """Per input, by change: the answer with the input moved (each of ``planned``) and as given
    (change 0): the input, the key(s) it sets, the relative change, its value, the recommended
    count, its difference from the base answer and the counts simulated for it. The variants'
    searches run side by side in a pool where that saves time (capacity.workers:
    :func:`~racsim.analyses.capacity.pool_size`, a variant's seconds taken as a count's of the
    base search), with the same answers. ``progress``: the phase ``sensitivity``, a unit per variant."""
    progress = progress or Progress.off()
    name, chosen = res.channel, res.targets["corrector"]
    base_load = res.loads[res.recommended]["load"] if res.recommended is not None else 0.0  # none: from the top
    jobs = []  # (variant, its judged-only spec, the counts it may take, its relative change)
    for v in planned:
        spec = fixed_pool(v.spec, name) if v.spec.pipeline.channels[name].autoscale is not None else v.spec
        units = units_per_server(spec, name)
        lowest = fewest_valid(spec, name, res.key, min(res.listed))  # the fewest may lie below the list
        counts = [n for n in range(lowest, res.top + 1) if n % units == 0]
        jobs.append((v, judged_only(spec, chosen), counts, round(v.value / v.base - 1.0, 12)))
    simulated = res.curve[res.curve.status == "ok"]["count"].nunique()
    workers = pool_size(planned[0].spec, res.timings.get("runs_s", 0.0) / max(simulated, 1), len(jobs)) if jobs else 1
    progress.start("sensitivity", len(jobs), "variant")
    answers: list = [None] * len(jobs)
    if workers > 1:
        progress.note(f"the variants' searches in {workers} processes")
        for i, answer in side_by_side(workers, variant_fewest,
                                      [(spec, counts, base_load, chosen) for _, spec, counts, _ in jobs]):
            answers[i] = answer
            progress.advance(1, f"{jobs[i][0].input} {jobs[i][3]:+.1%}: {answer_words(answers[i][0], res)}")
    else:
        for i, (v, spec, counts, change) in enumerate(jobs):
            def say(n: int, note: str, k: int, what=v.input, change=change) -> None:
                progress.note(f"{what} {change:+.1%}: {n} {res.unit}: {note}", line=True)

            answers[i] = variant_fewest(spec, counts, base_load, chosen, say)
            progress.advance(1, f"{v.input} {change:+.1%}: {answer_words(answers[i][0], res)}")
    rows = []
    for what in dict.fromkeys(v.input for v in planned):
        group = [{"change": 0.0, "value": next(v.base for v in planned if v.input == what),
                  "recommended": res.recommended, "simulated": ""}]
        group += [{"change": change, "value": v.value, "recommended": rec, "simulated": " ".join(map(str, tried))}
                  for (v, _, _, change), (rec, tried) in zip(jobs, answers) if v.input == what]
        rows += [{"input": what, "key": input_keys(name, what), **r} for r in sorted(group, key=lambda r: r["change"])]
    out = pd.DataFrame(rows, columns=["input", "key", "change", "value", "recommended", "simulated"])
    out["recommended"] = out["recommended"].astype("Int64")
    out.insert(5, "delta", (out["recommended"] - res.recommended) if res.recommended is not None
               else pd.Series(pd.NA, index=out.index, dtype="Int64"))
    return out


def answer_words(rec: Optional[int], res: CapacityResult) -> str:
    """A variant's answer in words: '6 GPUs', or that no count up to the search's top meets the targets."""
    return f"{rec} {res.unit}" if rec is not None else f"no count up to {res.top} {res.unit} meets the targets"


def run_capacity_sensitivity(cfg: RacsimConf, progress: Optional[Progress] = None) -> CapacityResult:
    """:func:`~racsim.analyses.capacity.run_capacity`, then, with ``capacity.sensitivity.enabled``,
    the answer with each guessed input moved (``result.sensitivity``, :func:`sensitivity_table`;
    its seconds in ``timings['sensitivity_s']``). The variants are checked before the search.
    ``progress``: the search's phases, then ``sensitivity``, planned before the search starts. A
    search that found a target out of reach of more capacity (status ``infeasible``) moves no
    input: no count meets the targets whose answer could move; a note says so."""
    progress = progress or Progress.off()
    planned = variants(cfg) if cfg.capacity.sensitivity.enabled else []
    if planned:
        progress.plan("sensitivity", last=True)  # after the search's own phases (run_capacity plans them)
    res = run_capacity(cfg, progress)
    if planned and res.status == "infeasible":
        res.notes.append("capacity.sensitivity's variants were not run (no count meets the targets, so there is "
                         "no answer to move)")
    elif planned:
        t0 = time.perf_counter()
        res.sensitivity = sensitivity_table(res, planned, progress)
        res.timings["sensitivity_s"] = time.perf_counter() - t0
    return res
