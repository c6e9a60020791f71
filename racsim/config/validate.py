"""Validation of a composed config: one rule per line, each naming the key and what is allowed.

:func:`validate` checks every value's range and the cross-field rules and raises
:class:`~racsim.errors.ConfigError`; :func:`check_schema` catches what the
schema's types let through on the command line. Nothing here builds a model.
"""

from __future__ import annotations

import dataclasses
import math
import os
import resource
import stat
from collections.abc import Mapping
from typing import Any, Optional, Sequence, Tuple

from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from racsim.config.schema import (
    ARRIVAL_MODES,
    BATCH_ORDERS,
    BATCH_POLICIES,
    CAPACITY_SEARCHES,
    CAUCHY_BOUNDS,
    CHANNEL_KINDS,
    CORRECTORS,
    ENGINES,
    JOB_FILES,
    LATENCY_KINDS,
    LEARNERS,
    LM_BACKBONES,
    LM_POLICIES,
    OPTIMIZERS,
    PHASES,
    RM_BLOCKS,
    SERVICE_MODELS,
    REWARD_SPLITS,
    STUDIES,
    STUDY_MODES,
    TOPOLOGIES,
    LatencyConf,
    phase_conf,
)
from racsim.errors import ConfigError
from racsim.config.names import key_hint, missing_extra


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


MAX_GAIN = 1e6  # corrector.alpha, 1 / route_prob, learner.train.lr: past this the gradients overflow to inf/NaN
MAX_SECONDS = 1e12  # a duration's mean, spread, bounds and samples (30,000 years): sums of them stay finite
MAX_SIGMA = 30.0  # a lognormal's sigma: exp(sigma^2 / 2), which matches its mean, stays finite
MAX_ALPHA = 1e6  # a pareto's tail index: past it the draws are its mean and its quantiles overflow
INT64 = 2**63  # every integer key: numpy holds it in an int64


def cauchy_window_mass(median: float, scale: float, low: float, high: float) -> float:
    """P(low <= X <= high) for X ~ Cauchy(median, scale)."""
    return (math.atan((high - median) / scale) - math.atan((low - median) / scale)) / math.pi


def _need(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(key, value, allowed)


def _need_file(key: str, path: Any, what: str) -> None:
    """A data file the run reads: named (``what``: the kind of file), and there, so that a sweep's
    cell check (racsim.sweep.sweeper.check_cells) refuses a missing one before the first job starts;
    an unreadable or malformed one is refused by its reader when the run opens it."""
    _need(isinstance(path, (str, os.PathLike)) and bool(os.fspath(path)), key, path, what)
    where = "" if os.path.isabs(path) else f"; a relative path starts from {os.getcwd()}"
    _need(os.path.exists(path), key, path, f"{what}: there is no such file{where}")


def _positive(key: str, value: Any, *, allow_inf: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 and not math.isnan(value)
    ok = ok and (allow_inf or math.isfinite(value))
    _need(ok, key, value, "a positive number" + (" (or inf)" if allow_inf else ""))


def _nonneg(key: str, value: Any) -> None:
    _need(_finite(value) and value >= 0, key, value, "a finite number >= 0")


def _int_at_least(key: str, value: Any, low: int) -> None:
    _need(isinstance(value, int) and not isinstance(value, bool) and value >= low, key, value, f"an integer >= {low}")


def validate_latency(c: LatencyConf, key: str) -> None:
    """Range checks for one latency distribution (the sampler builds from it)."""
    _need(c.kind in LATENCY_KINDS, f"{key}.kind", c.kind, "one of " + ", ".join(LATENCY_KINDS))
    _need(c.cauchy_bounds in CAUCHY_BOUNDS, f"{key}.cauchy_bounds", c.cauchy_bounds, "one of " + ", ".join(CAUCHY_BOUNDS))
    if c.kind == "cauchy":
        _need(c.low is not None and c.high is not None, f"{key}.low", c.low,
              "cauchy needs finite truncation bounds low < high")
        if c.cauchy_bounds == "clip":
            _need(c.median is not None and _finite(c.median), f"{key}.median", c.median,
                  "a finite number: a clipped cauchy is given by its median (no mean is solved for)")
        elif c.median is None:
            _need(c.mean is not None, f"{key}.median", c.median, "a number, or set mean so it can be solved")
        else:
            _need(_finite(c.median), f"{key}.median", c.median, "a finite number")
        _need(_finite(c.scale) and 0 < c.scale <= MAX_SECONDS, f"{key}.scale", c.scale,
              f"a positive number <= {MAX_SECONDS:g} (seconds)")
        if c.median is not None and _finite(c.low) and _finite(c.high):
            mass = cauchy_window_mass(c.median, c.scale, c.low, c.high)
            _need(mass > 1e-9, f"{key}.median", c.median,
                  f"a median whose Cauchy(scale {c.scale:g}) puts mass on [low, high] = [{c.low:g}, {c.high:g}] "
                  f"(it puts {mass:.3g} there: nothing could be drawn)")
    if c.mean is not None:
        _need(_finite(c.mean) and 0 <= c.mean <= MAX_SECONDS, f"{key}.mean", c.mean,
              f"a finite number >= 0 and <= {MAX_SECONDS:g} (seconds)")
    elif c.kind == "uniform":
        _need(c.high is not None, f"{key}.high", c.high, "a number > low: uniform needs mean, or high (and low)")
    elif c.kind not in ("cauchy", "empirical"):
        raise ConfigError(f"{key}.mean", c.mean, f"a finite number >= 0: {c.kind} is matched to its mean")
    if c.kind == "gaussian":
        _need(_finite(c.std) and 0 <= c.std <= MAX_SECONDS, f"{key}.std", c.std,
              f"a finite number >= 0 and <= {MAX_SECONDS:g} (seconds)")
    if c.kind == "lognormal":
        _need(_finite(c.sigma) and 0 < c.sigma <= MAX_SIGMA, f"{key}.sigma", c.sigma,
              f"a positive number <= {MAX_SIGMA:g} (exp(sigma^2 / 2), which matches the mean, must stay finite)")
    if c.kind == "pareto":
        _need(_finite(c.alpha) and 1 < c.alpha <= MAX_ALPHA, f"{key}.alpha", c.alpha,
              f"a number > 1 (finite mean) and <= {MAX_ALPHA:g} (past it, use kind=deterministic)")
    for b in ("low", "high"):
        v = getattr(c, b)
        if v is not None:
            _need(_finite(v) and 0 <= v <= MAX_SECONDS, f"{key}.{b}", v,
                  f"null or a finite number >= 0 and <= {MAX_SECONDS:g} (seconds)")
    if c.low is not None and c.high is not None:
        _need(c.low < c.high, f"{key}.high", c.high, f"a number > low ({c.low})")
    if c.kind == "uniform" and c.mean is not None:
        lo = 0.0 if c.low is None else c.low
        if c.high is None:
            _need(lo <= c.mean, f"{key}.mean", c.mean, f"a number >= low ({lo}): uniform on [low, 2 mean - low]")
        else:
            mid = 0.5 * (lo + c.high)
            _need(abs(c.mean - mid) <= 1e-9 * max(1.0, mid), f"{key}.mean", c.mean,
                  f"null or the midpoint {mid:g} of [low, high] = [{lo:g}, {c.high:g}]")
    if c.kind == "empirical":
        _need_file(f"{key}.path", c.path, "the path of a CSV file with the latency samples")
        _need(bool(c.column), f"{key}.column", c.column, "the name of a numeric column of that CSV")


def first_missing(cfg: Any, key: str = "") -> Optional[str]:
    """The first key (depth first, in field order) whose value is MISSING (``???``) in a
    DictConfig or in dataclasses, or None. A field the schema leaves MISSING has its
    default in conf/ (racsim.config.schema): a config built from the dataclasses alone
    lacks it."""
    if cfg is None or isinstance(cfg, (int, float)):  # most leaves (kernel rows are long lists of floats)
        return None
    if isinstance(cfg, DictConfig):
        for k in cfg.keys():
            sub = f"{key}.{k}" if key else str(k)
            if OmegaConf.is_missing(cfg, k):
                return sub
            found = first_missing(cfg[k], sub)
            if found:
                return found
    elif isinstance(cfg, ListConfig):
        for i in range(len(cfg)):
            if OmegaConf.is_missing(cfg, i):
                return f"{key}[{i}]"
            found = first_missing(cfg[i], f"{key}[{i}]")
            if found:
                return found
    elif isinstance(cfg, str):
        return key if cfg == MISSING else None
    elif hasattr(type(cfg), "__dataclass_fields__"):  # a dataclass instance
        for name in type(cfg).__dataclass_fields__:
            found = first_missing(getattr(cfg, name), f"{key}.{name}" if key else name)
            if found:
                return found
    elif isinstance(cfg, dict):
        for k, v in cfg.items():
            found = first_missing(v, f"{key}.{k}" if key else str(k))
            if found:
                return found
    elif isinstance(cfg, (list, tuple)):
        for i, v in enumerate(cfg):
            found = first_missing(v, f"{key}[{i}]")
            if found:
                return found
    return None


def leaves(cfg: Any, key: str = ""):
    """(dotted key, value) of every leaf of a DictConfig or of dataclasses (MISSING ones skipped)."""
    if isinstance(cfg, DictConfig):
        items = [(k, cfg[k]) for k in cfg.keys() if not OmegaConf.is_missing(cfg, k)]
    elif isinstance(cfg, ListConfig) or isinstance(cfg, (list, tuple)):
        items = [(f"[{i}]", v) for i, v in enumerate(cfg)]
    elif hasattr(type(cfg), "__dataclass_fields__"):
        items = [(name, getattr(cfg, name)) for name in type(cfg).__dataclass_fields__]
    elif isinstance(cfg, dict):
        items = list(cfg.items())
    else:
        yield key, cfg
        return
    for k, v in items:
        sub = f"{key}{k}" if str(k).startswith("[") else (f"{key}.{k}" if key else str(k))
        yield from leaves(v, sub)


MISSING_ALLOWED = ("a value: this key has no default in the schema; its default is in conf/ "
                   "(racsim.config.defaults.default_config() composes them), or set it")


RM_PICKS = {"model": "8b", "gpu": "H100"}  # an RM block's catalog groups (conf/rm/GROUP/), with an example each


def missing_error(key: str, cfg: Any = None) -> ConfigError:
    """The ConfigError for a MISSING value: for a GPU or an RM shape, which catalog option to
    pick; given the whole config ``cfg``, every group of that RM block still to pick
    (``pipeline.fast_rm.model and pipeline.fast_rm.gpu`` after only ``pipeline.fast_rm.gpus=4``)."""
    parent = key.rpartition(".")[0]
    owner, _, group = parent.rpartition(".")
    if group in RM_PICKS and owner.rpartition(".")[2] in RM_BLOCKS:
        block = None if cfg is None else _node(cfg, owner)
        groups = [g for g in RM_PICKS if block is None or first_missing(getattr(block, g)) is not None] or [group]
        picks = " ".join(f"+rm/{g}@{owner}.{g}={RM_PICKS[g]}" for g in groups)
        return ConfigError(" and ".join(f"{owner}.{g}" for g in groups), MISSING,
                           f"a value: {owner} is incomplete; pick its {' and '.join(groups)} from conf/rm/ "
                           f"(the catalog), e.g. {picks}")
    return ConfigError(key, MISSING, MISSING_ALLOWED)


FAILURE_POLICIES = ("retry", "lose")
FAULT_SECONDS = (1e-6, 1e12)  # faults.mtbf_s and mttr_s: a microsecond to 30,000 years
MIN_UP_VS_REPAIR = 1e-7  # a server's mean up time over its mean repair time, at least


def faults_on(ch: Any) -> bool:
    """Does the channel's replicas fail (``faults.mtbf_s`` or ``faults.schedule`` set)?"""
    f = getattr(ch, "faults", None)
    return getattr(f, "mtbf_s", None) is not None or getattr(f, "schedule", None) is not None


def validate_faults(ch: Any, key: str) -> None:
    """A channel's ``faults``: a gpu_rm channel or a queue channel with workers, positive finite
    MTBF and MTTR, a known policy."""
    f = ch.faults
    on = "mtbf_s" if f.schedule is None else "schedule"  # the key that turned failures on
    gpu_rm = getattr(ch, "kind", "queue") == "gpu_rm"
    _need(gpu_rm or (ch.kernel is None and ch.workers is not None), f"{key}.{on}", getattr(f, on),
          "null here: failures are modelled for gpu_rm channels (their replicas) and queue channels with "
          "workers set (not a kernel)")
    _need(not getattr(ch, "cancel_on_drop", False), f"{key}.{on}", getattr(f, on),
          "null with cancel_on_drop=true (cancelling requests on workers that fail is not modelled): "
          f"unset one of faults.{on}, cancel_on_drop")
    if f.schedule is not None:
        _need(isinstance(f.schedule, str) and f.schedule.strip() != "", f"{key}.schedule", f.schedule,
              "a path to a CSV of outages (columns server, down_s, up_s), or null")
        for k in ("mtbf_s", "mttr_s"):
            _need(getattr(f, k) is None, f"{key}.{k}", getattr(f, k),
                  "null with faults.schedule (the schedule's outages replace the random ones)")
        _need_file(f"{key}.schedule", f.schedule, "a path to a CSV of outages (columns server, down_s, up_s), or null")
    for k in ("mtbf_s", "mttr_s") if f.schedule is None else ():
        _need(_finite(getattr(f, k)) and FAULT_SECONDS[0] <= getattr(f, k) <= FAULT_SECONDS[1], f"{key}.{k}",
              getattr(f, k), f"a number of seconds in [{FAULT_SECONDS[0]:g}, {FAULT_SECONDS[1]:g}] (the mean "
              + ("up time of one GPU or worker" if k == "mtbf_s" else "repair time of a replica or worker") + ")")
    if f.schedule is None:
        tp = int(ch.rm.tp) if gpu_rm else 1
        _need(f.mtbf_s / tp >= MIN_UP_VS_REPAIR * f.mttr_s, f"{key}.mtbf_s", f.mtbf_s,
              f"at least {MIN_UP_VS_REPAIR:g} x faults.mttr_s ({f.mttr_s:g} s)" + (f" x tp ({tp})" if tp > 1 else "")
              + ": a server's up times shorter than that are lost in the clock's rounding once it has been "
              "repaired many times")
    _need(f.on_failure in FAILURE_POLICIES, f"{key}.on_failure", f.on_failure, "one of " + ", ".join(FAILURE_POLICIES))
    _int_at_least(f"{key}.max_retries", f.max_retries, 0)
    _need(getattr(ch, "autoscale", None) is None, f"{key}.{on}", getattr(f, on),
          "null on an autoscaled channel (failures are modelled for fixed pools)")
    _need(not gpu_rm or not ch.rm.chunked_prefill, f"{key}.{on}", getattr(f, on),
          "null with rm.chunked_prefill (a failure cuts whole batches, not chunked iterations)")


def _node(cfg: Any, path: str) -> Any:
    """The node at dotted ``path`` of a DictConfig or of dataclasses (whose channels are a dict)."""
    for part in path.split("."):
        cfg = cfg[part] if isinstance(cfg, Mapping) else getattr(cfg, part)
    return cfg


def validate(cfg: Any) -> None:
    """Check ranges and cross-field rules of a composed config (a DictConfig
    or a :class:`RacsimConf`). Raises :class:`ConfigError` on the first bad value,
    or on the first MISSING one (``???``: a config built from the schema alone)."""
    check_leaves(cfg)
    validate_rules(cfg)


def check_leaves(cfg: Any, key: str = "") -> None:
    """validate's first checks, leaf by leaf: no MISSING value (the first named), no integer beyond int64."""
    missing = first_missing(cfg, key)
    if missing is not None:
        raise missing_error(missing, None if key else cfg)
    for k, v in leaves(cfg, key):
        _need(not isinstance(v, int) or isinstance(v, bool) or -INT64 <= v < INT64, k, v,
              "an integer within int64 (|value| < 2**63)")


def validate_changed(cfg: Any, changed: Sequence[str]) -> None:
    """``validate(cfg)`` for a config that passed :func:`check_leaves` and
    :func:`check_data_files` before the leaves at the dotted keys ``changed`` were set
    (a sweep's cell on its base, racsim.sweep.sweeper.check_cells): the leaf checks and
    data files of those keys only, then every rule (a cross-field rule reads the
    whole config), then the budgets (:func:`check_limits`). A changed ``limits.*`` key rechecks
    every data file."""
    for key in changed:
        check_leaves(_node(cfg, key), key)
    validate_rules(cfg, None if any(k.startswith("limits.") for k in changed) else changed)
    check_limits(cfg)  # a cell's sizes: refused before the first job, as a single run is


def check_name(name: Any) -> None:
    """``name`` names the run's folder under outputs/ (``outputs/NAME/...``): one folder name,
    never a path that leads elsewhere."""
    _need(isinstance(name, str) and name not in ("", ".", "..") and not set(name) & set("/\\")
          and name.isprintable() and len(name.encode()) <= 200, "name", name,
          "a folder name under outputs/: not empty, not '.' or '..', no '/' or '\\', printable, at most 200 bytes")


def validate_rules(cfg: Any, files: Optional[Sequence[str]] = None) -> None:
    """validate's ranges and cross-field rules, then the data files (:func:`check_data_files`;
    only those at the keys ``files`` when given)."""
    check_name(cfg.name)
    p = cfg.pipeline
    _int_at_least("pipeline.steps", p.steps, 1)
    if p.warmup_steps is not None:
        _int_at_least("pipeline.warmup_steps", p.warmup_steps, 0)
        _need(p.warmup_steps < p.steps, "pipeline.warmup_steps", p.warmup_steps,
              f"null (a fifth of the steps) or less than pipeline.steps={p.steps}: at least one step is measured")
    _int_at_least("pipeline.batch_size", p.batch_size, 1)
    _need(p.engine in ENGINES, "pipeline.engine", p.engine, "one of " + ", ".join(ENGINES))
    for phase in PHASES:
        validate_latency(phase_conf(p, phase), f"pipeline.{phase}")
    _need(any(phase_conf(p, ph).mean is None for ph in PHASES) or _nominal_step(p) > 0, "pipeline.update.mean",
          phase_conf(p, "update").mean,
          "a number > 0, or another phase's mean: the phases of a step (pipeline.generate, fast_score, submit, "
          "update) all last 0 s, so the optimizer clock never advances")
    _need(len(p.channels) >= 1, "pipeline.channels", dict(p.channels),
          "at least one slow channel (K >= 1), e.g. +channel@pipeline.channels.judge=judge_rm")
    for name, ch in p.channels.items():
        key = f"pipeline.channels.{name}"
        if ch.workers is not None:
            _int_at_least(f"{key}.workers", ch.workers, 1)
        if ch.max_delay is not None:
            _int_at_least(f"{key}.max_delay", ch.max_delay, 0)
        _need(_finite(ch.share) and ch.share >= 0, f"{key}.share", ch.share, "a finite number >= 0")
        if ch.kernel is not None:
            k = list(ch.kernel)
            _need(len(k) >= 1 and all(_finite(v) and v >= 0 for v in k), f"{key}.kernel", k,
                  "a non-empty list of probabilities >= 0 over Delta = 0, 1, ...")
            _need(sum(k) <= 1 + 1e-12, f"{key}.kernel", k,
                  f"a kernel row must sum to at most 1 (it sums to {sum(k):.6g})")
        else:
            validate_latency(ch.latency, f"{key}.latency")
        validate_channel_kind(ch, key)
        rp = getattr(ch, "route_prob", 1.0)
        _need(_finite(rp) and 1 / MAX_GAIN <= rp <= 1, f"{key}.route_prob", rp,
              f"a probability in [{1 / MAX_GAIN:g}, 1] (a routed result is weighted 1 / route_prob)")
        _need(rp == 1 or getattr(ch, "kind", "queue") == "queue", f"{key}.route_prob", rp,
              "1 for a gpu_rm channel (routing is modelled for queue and kernel channels)")
        f = getattr(ch, "degraded_factor", 1.0)
        _need(_finite(f) and f > 0, f"{key}.degraded_factor", f, "a finite number > 0 (1: no bursts)")
        if f != 1:
            _need(ch.kernel is None, f"{key}.degraded_factor", f,
                  "1 for a kernel channel (bursts scale a queue channel's latency or a gpu_rm channel's batch seconds)")
            _need(ch.rm is None or not ch.rm.chunked_prefill, f"{key}.degraded_factor", f,
                  "1 with rm.chunked_prefill (bursts are modelled on whole batches, not chunked iterations)")
            _need(_finite(ch.p_degrade) and 0 < ch.p_degrade <= 1, f"{key}.p_degrade", ch.p_degrade,
                  "a probability in (0, 1] per step: the chance a normal step is followed by a degraded one")
            _need(_finite(ch.p_recover) and 0 < ch.p_recover <= 1, f"{key}.p_recover", ch.p_recover,
                  "a probability in (0, 1] per step: the chance a degraded step is followed by a normal one")
        if getattr(ch, "cancel_on_drop", False):
            _need(getattr(ch, "kind", "queue") == "queue" and ch.kernel is None and ch.workers is not None,
                  f"{key}.cancel_on_drop", ch.cancel_on_drop,
                  "false here: cancelling frees a worker, so it needs a queue channel with workers set "
                  "(not a kernel, not gpu_rm)")
        if getattr(ch, "autoscale", None) is not None:
            validate_autoscale(ch, f"{key}.autoscale")
        if faults_on(ch):
            validate_faults(ch, f"{key}.faults")
    _need(sum(ch.share for ch in p.channels.values()) > 0, "pipeline.channels.*.share",
          [ch.share for ch in p.channels.values()], "at least one channel with share > 0")
    if getattr(p, "fast_rm", None) is not None:
        validate_rm(p.fast_rm, "pipeline.fast_rm")
        _need(not p.fast_rm.chunked_prefill, "pipeline.fast_rm.chunked_prefill", p.fast_rm.chunked_prefill,
              "false: the fast scorer's phase is modelled without chunked prefill (batching=continuous is allowed)")
    if getattr(p, "arrivals", None) is not None:
        validate_arrivals(p)

    c = cfg.corrector
    names = list(c.names)
    _need(len(names) >= 1, "corrector.names", names, "a non-empty list of " + ", ".join(CORRECTORS))
    for n in names:
        _need(n in CORRECTORS, "corrector.names", n, "each one of " + ", ".join(CORRECTORS))
    _need(len(set(names)) == len(names), "corrector.names", names, "each corrector at most once")
    _positive("corrector.alpha", c.alpha)
    _need(c.alpha <= MAX_GAIN, "corrector.alpha", c.alpha,
          f"a positive number <= {MAX_GAIN:g} (a gain on the slow residual; the paper's is 1)")
    _positive("corrector.tau_age", c.tau_age, allow_inf=True)
    _positive("corrector.rho_bar", c.rho_bar, allow_inf=True)
    _need(_finite(c.retrace_gamma) and 0 <= c.retrace_gamma <= 1, "corrector.retrace_gamma",
          c.retrace_gamma, "a number in [0, 1]")
    _need(_finite(c.adaptive_quantile) and 0 < c.adaptive_quantile <= 1, "corrector.adaptive_quantile",
          c.adaptive_quantile, "a number in (0, 1]")
    _positive("corrector.adaptive_scale", c.adaptive_scale)
    _int_at_least("corrector.adaptive_min_results", c.adaptive_min_results, 1)
    if c.wait_timeout_s is not None:
        _positive("corrector.wait_timeout_s", c.wait_timeout_s)

    lr = cfg.learner
    _need(lr.kind in LEARNERS, "learner.kind", lr.kind, "one of " + ", ".join(LEARNERS))
    _int_at_least("learner.n_states", lr.n_states, 1)
    _int_at_least("learner.n_actions", lr.n_actions, 2)
    _need(_finite(lr.gamma) and 0 <= lr.gamma < 1, "learner.gamma", lr.gamma, "a number in [0, 1)")
    _int_at_least("learner.horizon", lr.horizon, 1)
    _nonneg("learner.theta_scale", lr.theta_scale)
    _need(_finite(lr.slow_bump), "learner.slow_bump", lr.slow_bump, "a finite number")
    _nonneg("learner.fast_noise_std", lr.fast_noise_std)
    _int_at_least("learner.trials", lr.trials, 2)
    _int_at_least("learner.bootstrap", lr.bootstrap, 0)
    _int_at_least("learner.train.lanes", lr.train.lanes, 1)
    _need(_finite(lr.train.lr) and 0 < lr.train.lr <= MAX_GAIN, "learner.train.lr", lr.train.lr,
          f"a positive number <= {MAX_GAIN:g} (a step size: past it theta overflows)")
    _int_at_least("seed", cfg.seed, 0)
    _int_at_least("learner.mdp_seed", lr.mdp_seed, 0)
    _int_at_least("learner.theta_seed", lr.theta_seed, 0)
    st = cfg.study
    _need(st.kind in STUDIES, "study.kind", st.kind, "one of " + ", ".join(STUDIES))
    _need(lr.topology in TOPOLOGIES, "learner.topology", lr.topology, "one of " + ", ".join(TOPOLOGIES))
    _nonneg("learner.channel_noise_std", lr.channel_noise_std)
    _need(lr.reward_split in REWARD_SPLITS, "learner.reward_split", lr.reward_split, "one of " + ", ".join(REWARD_SPLITS))
    _need(st.mode in STUDY_MODES, "study.mode", st.mode, "one of " + ", ".join(STUDY_MODES))
    _int_at_least("study.replications", st.replications, 0)
    validate_lm(lr.lm)  # also when learner.kind is tabular: a bad value is never silently carried
    if lr.kind == "lm" and lr.lm.policy == "transformer":
        _need_packages("learner.lm.policy", lr.lm.policy, ("torch", "transformers"),
                       "learner.lm.policy=bandit for the NumPy stand-in")
    _need(len(st.kl_targets) >= 1 and all(_finite(k) and k > 0 for k in st.kl_targets), "study.kl_targets",
          list(st.kl_targets), "a non-empty list of KL levels > 0")
    _need(all(_finite(e) and 0 <= e <= 1 for e in st.etas), "study.etas", list(st.etas), "slacks in [0, 1]")
    _int_at_least("study.workers", st.workers, 0)
    pr = st.probe
    _int_at_least("study.probe.n", pr.n, 2)
    if st.kind == "probe" and pr.pairs:
        _need_file("study.probe.pairs", pr.pairs, "the path of a CSV or Parquet file of (r_fast, r_slow) pairs, or null")
    _need(_finite(pr.correlation) and -1 < pr.correlation < 1, "study.probe.correlation", pr.correlation,
          "a Pearson correlation in (-1, 1)")
    for key in ("slow_std", "fast_std"):
        _positive(f"study.probe.{key}", getattr(pr, key))
    for key in ("slow_mean", "fast_mean"):
        _need(_finite(getattr(pr, key)), f"study.probe.{key}", getattr(pr, key), "a finite number")
    if getattr(cfg, "output", None) is not None:
        _need(cfg.output.job_files in JOB_FILES, "output.job_files", cfg.output.job_files,
              "one of full, lean (the tables as Parquet only), auto (lean for a sweep job of racsim's launcher)")
    if getattr(cfg, "capacity", None) is not None and cfg.capacity.enabled:
        validate_capacity(cfg)
    if getattr(cfg, "limits", None) is not None:
        check_data_files(cfg, files)


def validate_autoscale(ch: Any, key: str) -> None:
    """An autoscale block: a queue channel with workers (not a kernel, no cancel_on_drop) or a
    gpu_rm channel; 1 <= min <= max; queue_above >= 0; positive seconds; a price >= 0 or null."""
    a = ch.autoscale
    gpu = getattr(ch, "kind", "queue") == "gpu_rm"
    _need(gpu or (ch.kernel is None and ch.workers is not None and not getattr(ch, "cancel_on_drop", False)),
          key, "set", "null here: autoscaling sizes a gpu_rm channel's replicas or a queue channel's workers "
          "(workers set, no kernel, cancel_on_drop false)")
    _need(not (gpu and ch.rm is not None and ch.rm.chunked_prefill), key, "set",
          "null with rm.chunked_prefill (an autoscaled pool serves whole batches)")
    _int_at_least(f"{key}.min", a.min, 1)
    _int_at_least(f"{key}.max", a.max, a.min)
    _int_at_least(f"{key}.queue_above", a.queue_above, 0)
    for k in ("for_s", "startup_s", "idle_s"):
        _positive(f"{key}.{k}", getattr(a, k))
    if a.cost_per_hour is not None:
        _nonneg(f"{key}.cost_per_hour", a.cost_per_hour)


def _need_packages(key: str, value: Any, modules: Sequence[str], instead: str) -> None:
    """A ConfigError naming the extra to install when a module of ``modules`` is not installed."""
    import importlib.util

    absent = [m for m in modules if importlib.util.find_spec(m) is None]
    if absent:
        raise ConfigError(key, value, f"needs {' and '.join(absent)}, not installed: {missing_extra(absent[0])} "
                                      f"(or {instead})")


def validate_lm(lm: Any) -> None:
    """``learner.lm``: GRPO's sizes, the task, the model and the optimizer (checked whatever
    ``learner.kind`` is, so that a bad value is refused, not carried unused)."""
    key = "learner.lm"
    _need(lm.policy in LM_POLICIES, f"{key}.policy", lm.policy, "one of " + ", ".join(LM_POLICIES))
    _int_at_least(f"{key}.seeds", lm.seeds, 2)
    _int_at_least(f"{key}.group_size", lm.group_size, 2)
    for name, low in (("n_prompts", 1), ("prompt_len", 1), ("response_len", 1), ("vocab", 2), ("layers", 1),
                      ("d_model", 1), ("heads", 1), ("n_responses", 0), ("checkpoints", 0), ("sync_batch", 1),
                      ("task_seed", 0), ("init_seed", 0)):
        _int_at_least(f"{key}.{name}", getattr(lm, name), low)
    _need(_finite(lm.proxy_correlation) and -1 <= lm.proxy_correlation <= 1, f"{key}.proxy_correlation",
          lm.proxy_correlation, "a correlation in [-1, 1]")
    _need(lm.backbone in LM_BACKBONES, f"{key}.backbone", lm.backbone, "one of " + ", ".join(LM_BACKBONES))
    _need(lm.d_model % lm.heads == 0, f"{key}.heads", lm.heads, f"a divisor of learner.lm.d_model={lm.d_model}")
    _need(lm.optimizer in OPTIMIZERS, f"{key}.optimizer", lm.optimizer, "one of " + ", ".join(OPTIMIZERS))
    _positive(f"{key}.lr", lm.lr)
    _nonneg(f"{key}.kl_coef", lm.kl_coef)
    dev = str(lm.device)
    _need(dev in ("auto", "cpu", "cuda") or (dev.startswith("cuda:") and dev[5:].isdigit()), f"{key}.device",
          lm.device, "auto (CUDA when present), cpu, cuda or cuda:N")
    if lm.threads is not None:
        _int_at_least(f"{key}.threads", lm.threads, 1)
    _need(lm.pilot_seeds == 0 or (isinstance(lm.pilot_seeds, int) and lm.pilot_seeds >= 3), f"{key}.pilot_seeds",
          lm.pilot_seeds, "0 (the seed count is learner.lm.seeds) or an integer >= 3 (a pilot's variance sets it)")
    _int_at_least(f"{key}.max_seeds", lm.max_seeds, max(lm.pilot_seeds, 2))
    _positive(f"{key}.effect_size", lm.effect_size)
    if lm.policy == "bandit":
        longest = next(n for n in range(64) if lm.vocab ** (n + 1) >= INT64)  # responses are numbered in int64
        _need(lm.response_len <= longest, f"{key}.response_len", lm.response_len,
              f"at most {longest} with the bandit policy and vocab={lm.vocab} (its vocab**response_len responses "
              f"are numbered in int64)")
        space = lm.vocab ** lm.response_len
        _need(lm.n_responses <= space and (lm.n_responses > 0 or space <= 1_000_000), f"{key}.n_responses",
              lm.n_responses, f"at most vocab**response_len={space} (0: all of them, when that is <= 1e6)")


def validate_channel_kind(ch: Any, key: str) -> None:
    """A channel's ``kind`` and its ``rm`` block agree."""
    kind = getattr(ch, "kind", "queue")
    rm = getattr(ch, "rm", None)
    _need(kind in CHANNEL_KINDS, f"{key}.kind", kind, "one of " + ", ".join(CHANNEL_KINDS))
    if kind == "queue":
        _need(rm is None, f"{key}.rm", "{...}", "null unless kind is gpu_rm (set kind=gpu_rm to serve it on GPUs)")
        return
    _need(rm is not None, f"{key}.rm", rm,
          "an RM server (model, gpu, gpus, batcher), e.g. channel=judge_gpu_rm, when kind is gpu_rm")
    _need(ch.kernel is None, f"{key}.kernel", list(ch.kernel or []), "null for a gpu_rm channel")
    _need(ch.workers is None, f"{key}.workers", ch.workers,
          f"null for a gpu_rm channel: its servers are {key}.rm.gpus / {key}.rm.tp replicas")
    validate_rm(rm, f"{key}.rm")


def validate_arrivals(p: Any) -> None:
    """pipeline.arrivals: its mode and the mode's own keys."""
    a, key = p.arrivals, "pipeline.arrivals"
    _need(a.mode in ARRIVAL_MODES, f"{key}.mode", a.mode, "one of " + ", ".join(ARRIVAL_MODES))
    if a.mode == "stream":
        validate_latency(a.length, f"{key}.length")
    if a.mode == "trace":
        _need_file(f"{key}.path", a.path, "the path of a CSV file whose column (pipeline.arrivals.column) holds "
                                          "each sample's offset in seconds from its step's start")
        _need(isinstance(a.column, str) and bool(a.column), f"{key}.column", a.column, "the name of a CSV column")


def validate_rm(rm: Any, key: str) -> None:
    """Range checks of an RM server (whether the model fits the GPU's memory is checked where
    the server is built: racsim.pipeline.service.build_service)."""
    m, g = rm.model, rm.gpu
    for f in ("layers", "d_model", "d_ff", "n_heads", "n_kv_heads", "vocab"):
        _int_at_least(f"{key}.model.{f}", getattr(m, f), 1)
    _need(m.d_model % m.n_heads == 0, f"{key}.model.n_heads", m.n_heads, f"a divisor of d_model ({m.d_model})")
    _need(m.n_heads % m.n_kv_heads == 0, f"{key}.model.n_kv_heads", m.n_kv_heads,
          f"a divisor of n_heads ({m.n_heads})")
    _positive(f"{key}.model.bytes_per_param", m.bytes_per_param)
    for f in ("peak_tflops", "mem_bw_tbs", "memory_gb"):
        _positive(f"{key}.gpu.{f}", getattr(g, f))
    _nonneg(f"{key}.gpu.price_per_hour", g.price_per_hour)
    _int_at_least(f"{key}.gpus", rm.gpus, 1)
    _int_at_least(f"{key}.tp", rm.tp, 1)
    _need(m.n_heads % rm.tp == 0, f"{key}.tp", rm.tp, f"a divisor of model.n_heads ({m.n_heads})")
    _need(rm.gpus % rm.tp == 0, f"{key}.gpus", rm.gpus, f"a multiple of tp ({rm.tp}): the pool is gpus / tp replicas")
    _need(rm.service in SERVICE_MODELS, f"{key}.service", rm.service, "one of " + ", ".join(SERVICE_MODELS))
    _need(_finite(rm.mfu) and 0 < rm.mfu <= 1, f"{key}.mfu", rm.mfu, "a number in (0, 1]")
    _nonneg(f"{key}.overhead_s", rm.overhead_s)
    _need(_finite(rm.mem_util) and 0 < rm.mem_util <= 1, f"{key}.mem_util", rm.mem_util, "a number in (0, 1]")
    if rm.service == "profiled":
        _need_file(f"{key}.profile", rm.profile, "the path of a CSV written by racsim-profile")
    _int_at_least(f"{key}.max_batch", rm.max_batch, 1)
    _int_at_least(f"{key}.token_budget", rm.token_budget, 1)
    _nonneg(f"{key}.max_wait_s", rm.max_wait_s)
    _need(rm.order in BATCH_ORDERS, f"{key}.order", rm.order, "one of " + ", ".join(BATCH_ORDERS))
    _int_at_least(f"{key}.sequences_per_sample", rm.sequences_per_sample, 1)
    _need(rm.batching in BATCH_POLICIES, f"{key}.batching", rm.batching, "one of " + ", ".join(BATCH_POLICIES))
    _need(isinstance(rm.chunked_prefill, bool), f"{key}.chunked_prefill", rm.chunked_prefill, "true or false")
    _need(not rm.chunked_prefill or rm.batching == "continuous", f"{key}.chunked_prefill", rm.chunked_prefill,
          "false unless batching is continuous (static batches are not split)")
    validate_latency(rm.prompt_tokens, f"{key}.prompt_tokens")
    validate_latency(rm.response_tokens, f"{key}.response_tokens")


RUN_LENGTHS = ("auto", "fixed")


def validate_capacity(cfg: Any) -> None:
    """The capacity search's channel, counts and targets."""
    c, chans = cfg.capacity, cfg.pipeline.channels
    if c.channel is None:
        able = [n for n, ch in chans.items() if getattr(ch, "kind", "queue") == "gpu_rm" or ch.workers is not None]
        _need(len(able) == 1, "capacity.channel", c.channel,
              "the name of the channel to size (one of " + ", ".join(chans) + ")")
        name = able[0]
    else:
        _need(c.channel in chans, "capacity.channel", c.channel, "one of " + ", ".join(chans))
        name = c.channel
    ch = chans[name]
    gpu = getattr(ch, "kind", "queue") == "gpu_rm"
    _need(gpu or (ch.kernel is None and ch.workers is not None), "capacity.channel", name,
          "a gpu_rm channel, or a queue channel with workers (not a kernel or unlimited channel)")
    counts = list(c.counts)
    _need(len(counts) >= 1 and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in counts),
          "capacity.counts", counts, "a non-empty list of integers >= 1 (GPUs or workers)")
    if gpu:
        bad = [n for n in counts if n % ch.rm.tp]
        _need(not bad, "capacity.counts", bad, f"multiples of the channel's tp ({ch.rm.tp})")
    _need(c.search in CAPACITY_SEARCHES, "capacity.search", c.search, "one of " + ", ".join(CAPACITY_SEARCHES))
    _need(c.corrector in CORRECTORS, "capacity.corrector", c.corrector, "one of " + ", ".join(CORRECTORS))
    _need(c.corrector in list(cfg.corrector.names), "capacity.corrector", c.corrector,
          "one of corrector.names (" + ", ".join(cfg.corrector.names) + ")")
    for f in ("max_bias", "max_bias_vs_naive", "max_step_s"):
        if getattr(c, f) is not None:
            _positive(f"capacity.{f}", getattr(c, f))
    if c.price_per_unit_hour is not None:
        _nonneg("capacity.price_per_unit_hour", c.price_per_unit_hour)
    _need(_number(c.max_load) and 0 < c.max_load <= 1, "capacity.max_load", c.max_load,
          "a number in (0, 1]: the offered load from which a count is overloaded (default 0.95)")
    _need(_number(c.confidence) and 0 < c.confidence < 1, "capacity.confidence", c.confidence,
          "a number in (0, 1): the level of each figure's interval (default 0.95)")
    _int_at_least("capacity.resamples", c.resamples, 20)
    _need(c.run_length in RUN_LENGTHS, "capacity.run_length", c.run_length, "one of " + ", ".join(RUN_LENGTHS))
    _int_at_least("capacity.max_steps", c.max_steps, 1)
    _need(c.run_length == "fixed" or c.max_steps >= cfg.pipeline.steps, "capacity.max_steps", c.max_steps,
          f"at least pipeline.steps ({cfg.pipeline.steps}): the auto run length starts there and doubles up to it")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_schema(cfg: Any, key: str = "", root: Any = None) -> None:
    """Two mistakes the schema's types let through on the command line: a key
    the schema does not have (``+foo=1`` adds one even to a typed node) and a
    NaN anywhere (a float field takes ``nan``; no racsim setting means it).
    The racsim command runs this on the composed config before :func:`validate`; a
    MISSING value (``???``) is refused here too (:func:`missing_error`)."""
    root = cfg if root is None else root
    if isinstance(cfg, DictConfig):
        t = OmegaConf.get_type(cfg)
        allowed = {f.name for f in dataclasses.fields(t)} if dataclasses.is_dataclass(t) else None
        for k in cfg.keys():
            sub = f"{key}.{k}" if key else str(k)
            if allowed is not None and k not in allowed:
                raise ConfigError(sub, OmegaConf.select(cfg, str(k), default=None),
                                  f"not a racsim setting; {key_hint(sub)}")
            if OmegaConf.is_missing(cfg, k):  # before OmegaConf.to_object, which would say it in its words
                raise missing_error(sub, root)
            check_schema(cfg[k], sub, root)
    elif isinstance(cfg, ListConfig):
        for i in range(len(cfg)):
            check_schema(cfg[i], f"{key}[{i}]", root)
    elif isinstance(cfg, float) and math.isnan(cfg):
        raise ConfigError(key, cfg, "a number, not NaN")



# -- budgets: what a run would take, estimated before it starts (LimitsConf)

TRAJECTORY_STEPS_PER_S = 2e6  # the bias benchmark's rate on one core (README: 1e7 steps in ~4.5 s)
ROLLOUT_CHUNK = 40_000  # trajectories sampled at once (racsim.learner.bias.CHUNK_TRAJECTORIES)


def machine_memory_gb() -> float:
    """Physical memory of this machine in GB (8 when it cannot be told)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):
        return 8.0


def grid_cells(grid: Any) -> int:
    """How many cells ``study.grid`` expands to (the product of its axes' lengths)."""
    n = 1
    for values in dict(grid or {}).values():
        n *= max(len(values), 1) if isinstance(values, (list, tuple, ListConfig)) else 1
    return n


def _largest(cfg: Any, key: str, value: Any) -> int:
    """``value`` of dotted ``key``, or its largest value in ``study.grid`` when the grid varies it."""
    grid = dict(getattr(cfg.study, "grid", None) or {})
    vals = [value] + [v for k, vs in grid.items() if k.strip() == key and isinstance(vs, (list, ListConfig)) for v in vs]
    return max(int(v) for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))


def _blame(sizes: dict, *keys: str) -> str:
    """Of ``keys``, the one whose value in ``sizes`` is largest: the knob an array's size is charged to."""
    return max(keys, key=lambda k: sizes[k])


F8 = 8.0  # bytes of a float64 or int64
PROBE_DRAWS = 200  # landings per pair of the probe's slack sweep (racsim.analyses.probe.slack_sweep)
BASELINE_BYTES = 20e6  # what any run holds beside its sized arrays (tables, configs; measured with tracemalloc)


def memory_terms(cfg: Any, sizes: dict) -> dict:
    """Bytes of a run's largest arrays, summed by the config key that sets their size (one key per
    array: the largest factor of its shape). Each term is a count of float64 arrays of one shape
    as the code allocates them at its peak (tests/test_limits.py holds the sum to the measured
    peak): the arrival schedules (trials x steps x batch x (K + 1)), a queue channel's workers and
    a gpu_rm channel's replicas, tokens and sequences per lane, the MDP (S x A x S transitions;
    S x A tables per trial and per sampled trajectory), the bootstrap's counts, the training lanes
    and the probe's pairs. ``sizes``: every such key's value (largest over study.grid)."""
    S, A = sizes["learner.n_states"], sizes["learner.n_actions"]
    if cfg.study.kind == "probe":
        return {"study.probe.n": F8 * sizes["study.probe.n"] * (4 * PROBE_DRAWS + 12)}
    if cfg.study.kind != "bias" or cfg.learner.kind != "tabular":
        return {}
    trials, steps, batch, horizon = (sizes[k] for k in ("learner.trials", "pipeline.steps", "pipeline.batch_size",
                                                         "learner.horizon"))
    p = cfg.pipeline
    K = max(len(p.channels or {}), len(p.delay_steps or []), 1)
    lanes = max(trials, sizes["learner.train.lanes"] if cfg.learner.train.enabled else 0)
    terms: dict = {}

    def add(key: str, n: float) -> None:
        terms[key] = terms.get(key, 0.0) + n

    sched = ("learner.trials", "pipeline.steps", "pipeline.batch_size")
    add(_blame(sizes, *sched), 200.0 * trials * steps * batch * (K + 1))
    for name, ch in (p.channels or {}).items():
        key = f"pipeline.channels.{name}"
        if getattr(ch, "kind", "queue") == "gpu_rm" and ch.rm is not None:
            seqs = f"{key}.rm.sequences_per_sample"
            add(_blame(sizes, *sched, seqs), 6 * F8 * lanes * steps * batch * sizes[seqs])
            add(f"{key}.rm.gpus", 2 * F8 * lanes * sizes[f"{key}.rm.gpus"] / max(int(ch.rm.tp), 1))
        elif ch.workers is not None and ch.kernel is None:
            add(f"{key}.workers", 1.5 * F8 * lanes * sizes[f"{key}.workers"])
        if getattr(ch, "autoscale", None) is not None:
            add(f"{key}.autoscale.max", 2 * F8 * lanes * sizes[f"{key}.autoscale.max"])
    # rollouts sampled at once: every trial's, at most racsim.learner.bias's budget (a trial at least)
    traj = min(trials * steps * batch, max(steps * batch, 3 * ROLLOUT_CHUNK // max(3, K + 1)))
    add(_blame(sizes, "learner.horizon", *sched), F8 * traj * horizon * (2 + 2 * (K + 1)))
    mdp = _blame(sizes, "learner.n_states", "learner.n_actions")
    names = max(len(cfg.corrector.names), 1) + 1
    add(mdp, F8 * S * A * (3 * S + 2 * names * trials + 2 * traj * (K + 1) + horizon * (K + 1)) + 4 * F8 * S * S)
    add(_blame(sizes, "learner.bootstrap", "learner.trials"), 5 * F8 * sizes["learner.bootstrap"] * trials)
    if cfg.learner.train.enabled:
        L = sizes["learner.train.lanes"]
        add("learner.train.lanes", F8 * L * (steps * batch * horizon * (K + 4) + (batch + 4) * S * A))
    for key, n in fault_events(cfg, sizes).items():
        add(key, FAULT_EVENT_BYTES * n)
    return terms


FAULT_EVENTS_PER_S = 1e6  # outages generated and attempts retried a second (racsim/pipeline/faults.py), an assumption
FAULT_EVENT_BYTES = 64.0  # an outage's (down, up) in the timeline and in the engines' stacked copies


def _seconds(x: Any) -> float:
    """A mean duration as the estimates read it: 0 when unset or outside what validation allows
    (the estimate runs before validation, which names such a value)."""
    return float(x) if _finite(x) and 0 <= x <= MAX_SECONDS else 0.0


def _nominal_step(p: Any) -> float:
    """Seconds of one optimizer step from its phases' means (0 for a phase without one)."""
    return sum(_seconds(getattr(phase_conf(p, ph), "mean", None)) for ph in PHASES)


def fault_events(cfg: Any, sizes: dict) -> dict:
    """Outages and retried attempts a run's failing channels generate, by ``faults.mtbf_s`` key: per
    lane and server, the span it covers over (MTBF + MTTR), where the span is the run's steps of
    nominal time plus, for each of the server's requests, the expected retries (at most
    ``max_retries``) each waiting a repair; a request's attempt fails with probability
    1 - exp(-seconds / MTBF), its seconds the channel's mean latency, or a step's for a gpu_rm
    batch. Lanes: trials and training lanes, once per capacity count."""
    p, out = cfg.pipeline, {}
    step = _nominal_step(p)
    lanes = sizes["learner.trials"] + (sizes["learner.train.lanes"] if cfg.learner.train.enabled else 0)
    runs = max(len(cfg.capacity.counts), 1) if cfg.capacity.enabled else 1
    for name, ch in (p.channels or {}).items():
        f = getattr(ch, "faults", None)
        if f is None or not all(_finite(x) and FAULT_SECONDS[0] <= x <= FAULT_SECONDS[1] for x in (f.mtbf_s, f.mttr_s)):
            continue  # no failures, or values that validate_faults refuses
        key = f"pipeline.channels.{name}"
        gpu = getattr(ch, "kind", "queue") == "gpu_rm"
        if gpu and ch.rm is None:
            continue
        tp = max(int(ch.rm.tp), 1) if gpu else 1
        servers = max(sizes.get(f"{key}.rm.gpus" if gpu else f"{key}.workers", 1) // tp, 1)
        requests = sizes["pipeline.steps"] * sizes["pipeline.batch_size"]
        if gpu:
            requests *= sizes.get(f"{key}.rm.sequences_per_sample", 1) / max(int(ch.rm.max_batch), 1)
        mtbf, mttr = f.mtbf_s / tp, f.mttr_s
        seconds = step if gpu else (_seconds(ch.latency.mean) or step)
        fail = -math.expm1(-min(seconds / mtbf, 700.0))
        retries = min(float(f.max_retries), fail / max(1.0 - fail, 1e-300)) if f.on_failure == "retry" else 0.0
        span = sizes["pipeline.steps"] * step + requests / servers * retries * mttr
        per_server = span / (mtbf + mttr) + requests / servers * retries
        out[f"{key}.faults.mtbf_s"] = runs * lanes * servers * per_server
    return out


SIZE_KEYS = ("learner.trials", "pipeline.steps", "pipeline.batch_size", "learner.horizon", "learner.n_states",
             "learner.n_actions", "learner.bootstrap", "learner.train.lanes", "study.probe.n")
CHANNEL_SIZE_KEYS = ("workers", "rm.gpus", "rm.sequences_per_sample", "autoscale.max")


def run_sizes(cfg: Any) -> dict:
    """Every key that sets an array's size, at its largest value (over study.grid; a capacity search's
    channel at its largest count), null ones left out."""
    keys = [(k, _node(cfg, k)) for k in SIZE_KEYS]
    cap = cfg.capacity
    counts = [n for n in cap.counts if isinstance(n, int)] if cap.enabled else []
    for name, ch in (cfg.pipeline.channels or {}).items():
        for k in CHANNEL_SIZE_KEYS:
            block, _, leaf = k.rpartition(".")
            node = getattr(ch, block) if block else ch
            if node is not None and getattr(node, leaf, None) is not None:
                sized = counts and k in ("workers", "rm.gpus") and cap.channel in (None, name)
                keys.append((f"pipeline.channels.{name}.{k}", max(counts) if sized else getattr(node, leaf)))
    return {k: _largest(cfg, k, v) for k, v in keys}


def run_estimate(cfg: Any) -> dict:
    """Peak memory (bytes, :func:`memory_terms` summed; ``terms`` by key) and time (s) of a run, from
    its sizes. Time goes with the trajectory steps of the bias study (cells x trials x steps x
    batch_size x horizon, and once more per capacity count). A knob varied by study.grid counts at
    its largest value; ``sizes`` holds the four keys of the time's product."""
    every = run_sizes(cfg)
    terms = memory_terms(cfg, every)
    sizes = {k: every[k] for k in ("learner.trials", "pipeline.steps", "pipeline.batch_size", "learner.horizon")}
    trials, steps, batch, horizon = sizes.values()
    runs = grid_cells(cfg.study.grid) * (max(len(cfg.capacity.counts), 1) if cfg.capacity.enabled else 1)
    seconds = runs * float(trials) * steps * batch * horizon / TRAJECTORY_STEPS_PER_S
    faults = fault_events(cfg, every)
    seconds += sum(faults.values()) / FAULT_EVENTS_PER_S
    return {"memory": BASELINE_BYTES + sum(terms.values()), "terms": terms, "seconds": seconds, "sizes": sizes,
            "all_sizes": every, "faults": faults}


def _read_number(path: str) -> Optional[float]:
    """The first number of a one-line file (a cgroup's limit or use), None if absent or 'max'."""
    try:
        with open(path) as f:
            word = f.read(64).split()[0]
        return float(word)
    except (OSError, IndexError, ValueError):
        return None


def _cgroup_headroom(proc: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> Optional[float]:
    """Bytes this process's cgroup may still take: memory.max - memory.current (v2) or
    memory.limit_in_bytes - memory.usage_in_bytes (v1); None when no limit is set or readable."""
    try:
        with open(proc) as f:
            rows = [ln.strip().split(":", 2) for ln in f if ln.count(":") >= 2]
    except OSError:
        return None
    for _, controllers, path in rows:
        v2 = controllers == ""
        if not v2 and "memory" not in controllers.split(","):
            continue
        base = root if v2 else os.path.join(root, "memory")
        limit_f, use_f = ("memory.max", "memory.current") if v2 else ("memory.limit_in_bytes", "memory.usage_in_bytes")
        for d in (base + path.rstrip("/"), base):
            limit = _read_number(os.path.join(d, limit_f))
            if limit is not None and limit < 2**60:  # v1 writes "no limit" as about 2**63
                return max(limit - (_read_number(os.path.join(d, use_f)) or 0.0), 0.0)
    return None


def _mem_available() -> Optional[float]:
    """The machine's MemAvailable (bytes), None when /proc/meminfo cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for ln in f:
                if ln.startswith("MemAvailable:"):
                    return float(ln.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def process_memory() -> Tuple[float, str]:
    """(bytes, what) this process can still allocate: the least of its address-space limit
    (RLIMIT_AS, less what it has mapped), its cgroup's limit (less its use) and the machine's
    MemAvailable; (inf, '') when none can be read."""
    found = []
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    if soft != resource.RLIM_INFINITY:
        mapped = _read_number("/proc/self/statm")
        found.append((max(soft - (mapped or 0.0) * os.sysconf("SC_PAGE_SIZE"), 0.0), "its address-space limit (RLIMIT_AS)"))
    cg = _cgroup_headroom()
    if cg is not None:
        found.append((cg, "its cgroup's memory limit"))
    avail = _mem_available()
    if avail is not None:
        found.append((avail, "the machine's available memory"))
    return min(found) if found else (math.inf, "")


def check_limits(cfg: Any) -> None:
    """Refuse, before anything starts, a run whose estimate (:func:`run_estimate`) exceeds a
    ``limits.*`` budget or the memory this process can have (:func:`process_memory`): the error
    names the knob that made it big and the budget."""
    lim = cfg.limits
    mem_gb = machine_memory_gb() / 2 if lim.memory_gb is None else lim.memory_gb
    if lim.memory_gb is not None:
        _positive("limits.memory_gb", lim.memory_gb, allow_inf=True)
    _positive("limits.hours", lim.hours, allow_inf=True)
    _int_at_least("limits.cells", lim.cells, 1)
    _int_at_least("limits.capacity_counts", lim.capacity_counts, 1)
    _positive("limits.file_mb", lim.file_mb, allow_inf=True)
    n = grid_cells(cfg.study.grid)
    _need(n <= lim.cells, "study.grid", f"{n} cells", f"at most limits.cells = {lim.cells} cells in one run "
          f"(sweep the rest with racsim -m, or raise limits.cells)")
    counts = len(cfg.capacity.counts)
    _need(not cfg.capacity.enabled or counts <= lim.capacity_counts, "capacity.counts", f"{counts} counts",
          f"at most limits.capacity_counts = {lim.capacity_counts} counts (or raise it)")
    est = run_estimate(cfg)
    knob = biggest_knob(est)
    if knob is not None:
        have, what = process_memory()
        way = "larger (or a smaller faults.mttr_s or faults.max_retries)" if knob.endswith(".mtbf_s") else "smaller"
        need = f"{way}: the run needs about {est['memory'] / 1e9:.3g} GB (its largest arrays: {knob})"
        _need(est["memory"] <= mem_gb * 1e9, knob, _node(cfg, knob),
              f"{need} and limits.memory_gb is {mem_gb:.3g} (raise it to run anyway)")
        _need(est["memory"] <= have, knob, _node(cfg, knob),
              f"{need} and this process can have about {have / 1e9:.3g} GB more ({what})")
    if est["seconds"] <= lim.hours * 3600:
        return
    took = f"the run would take about {est['seconds'] / 3600:.3g} h"
    budget = f"and limits.hours is {lim.hours:g} (raise it to run anyway)"
    events = sum(est["faults"].values())
    if events / FAULT_EVENTS_PER_S > est["seconds"] / 2:  # its failures make it long
        knob = max(est["faults"], key=est["faults"].get)
        raise ConfigError(knob, _node(cfg, knob), f"larger (or a smaller faults.mttr_s or faults.max_retries): {took} "
                                                  f"to generate about {events:.3g} outages and retries {budget}")
    knob, value = max(est["sizes"].items(), key=lambda kv: kv[1])
    raise ConfigError(knob, value, f"smaller: {took} ({' x '.join(est['sizes'])}) {budget}")


def biggest_knob(est: dict) -> Optional[str]:
    """The key of the estimate's largest memory term, None when it counts none."""
    return max(est["terms"], key=est["terms"].get) if est["terms"] else None


def memory_error(cfg: Any) -> ConfigError:
    """The one-line error for a MemoryError that escaped :func:`check_limits`: the knob of the run's
    largest estimated arrays, its value, and the budgets to lower it under."""
    try:
        est = run_estimate(cfg)
        knob = biggest_knob(est)
    except Exception:  # a config the estimate cannot read: still one line
        knob = None
    if knob is None:
        return ConfigError("limits.memory_gb", cfg.limits.memory_gb, "a run that fits: this one ran out of memory")
    return ConfigError(knob, est["all_sizes"][knob], f"smaller: the run ran out of memory (about "
                       f"{est['memory'] / 1e9:.3g} GB estimated, most of it set by {knob})")


def check_data_files(cfg: Any, keys: Optional[Sequence[str]] = None) -> None:
    """Every data file the config names (empirical latency CSVs, RM profiles, probe pairs) is a
    regular file (not a FIFO or a device, which would hang or never end) within limits.file_mb;
    those at the dotted ``keys`` only, when given."""
    cap = cfg.limits.file_mb * 1e6
    for key, v in (leaves(cfg) if keys is None else ((k, _node(cfg, k)) for k in keys)):
        if not (key.endswith(".path") or key.endswith(".profile") or key == "study.probe.pairs"):
            continue
        if not isinstance(v, str) or not v:
            continue
        try:
            st = os.stat(v)
        except OSError:  # missing: refused where the run reads it (_need_file); unreadable: by its reader
            continue
        _need(stat.S_ISREG(st.st_mode), key, v, "a regular file (not a folder, FIFO or device)")
        _need(st.st_size <= cap, key, v, f"a file of at most limits.file_mb = {cfg.limits.file_mb:g} MB "
                                         f"(it has {st.st_size / 1e6:.3g} MB)")
