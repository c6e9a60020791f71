"""Typed configuration for racsim.

The dataclasses below are registered with Hydra's ConfigStore as the schema of
the primary config, so Hydra itself rejects wrong types (``pipeline.steps=abc``)
and unknown keys. :func:`validate` then checks every value's range and the
cross-field rules, and raises :class:`ConfigError` naming the key and what is
allowed. Nothing in this module runs a simulation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any, Dict, List, Optional

# Names of everything a user can pick from; the modules that implement them
# assert at import time that they cover exactly these.
LATENCY_KINDS = ("deterministic", "gaussian", "lognormal", "pareto", "cauchy", "exponential", "empirical")
CORRECTORS = (
    "naive",
    "wait_for_slow",
    "retrace_a",
    "rac",
    "rac_no_age",
    "bare_additive",
    "sync_oracle",
)
ENGINES = ("lanes", "simpy")
PHASES = ("generate", "fast_score", "submit", "update")  # one optimizer step, in order
LEARNERS = ("tabular",)


class ConfigError(ValueError):
    """A user-facing configuration mistake: names the key and what is allowed."""

    def __init__(self, key: str, value: Any, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key} = {value!r}: {allowed}")


@dataclass
class LatencyConf:
    """A non-negative duration distribution (seconds), matched to ``mean``.

    kind: deterministic (always ``mean``), gaussian (N(mean, std^2), clipped),
    lognormal (mu = ln(mean) - sigma^2/2), pareto (x_m = mean*(alpha-1)/alpha),
    cauchy (location ``median``, ``scale``, truncated to [low, high]; when
    ``median`` is null it is solved so that the truncated mean equals ``mean``),
    exponential (rate 1/mean), empirical (resampled from a CSV column; rescaled
    to ``mean`` when ``mean`` is set). ``low``/``high`` clip every kind but
    cauchy, which they truncate; ``discrete`` rounds before clipping.
    """

    kind: str = "deterministic"
    mean: Optional[float] = 1.0
    std: float = 0.0
    sigma: float = 0.5
    alpha: float = 3.0
    median: Optional[float] = None
    scale: float = 1.0
    low: Optional[float] = None
    high: Optional[float] = None
    discrete: bool = False
    path: Optional[str] = None
    column: Optional[str] = None


def _fixed(seconds: float) -> Any:
    return field(default_factory=lambda: LatencyConf(kind="deterministic", mean=seconds))


@dataclass
class ChannelConf:
    """One slow reward channel (code verifier, judge RM, human review...).

    A result takes ``latency`` seconds of service on one of ``workers`` servers
    (null: as many as needed, so no queue) behind a FIFO queue. It is usable at
    the first optimizer step that begins after it completes; if that is more
    than ``max_delay`` steps after its rollout's step it is dropped (null: never
    dropped). ``share`` is this channel's relative part of the slow reward.
    ``kernel`` replaces the clock by an explicit delay kernel Lambda[k, Delta]
    over Delta = 0, 1, ... optimizer steps; its missing mass never returns.
    """

    latency: LatencyConf = field(default_factory=lambda: LatencyConf(kind="lognormal", mean=20.0))
    workers: Optional[int] = None
    max_delay: Optional[int] = None
    share: float = 1.0
    kernel: Optional[List[float]] = None


@dataclass
class PipelineConf:
    """The optimizer clock: each of ``steps`` steps generates ``batch_size``
    rollouts, fast-scores them, submits them to every slow channel, then updates."""

    steps: int = 50
    batch_size: int = 4
    generate: LatencyConf = _fixed(6.0)
    fast_score: LatencyConf = _fixed(1.0)
    submit: LatencyConf = _fixed(0.1)
    update: LatencyConf = _fixed(2.0)
    channels: Dict[str, ChannelConf] = field(default_factory=dict)
    engine: str = "lanes"
    # Shortcuts for the paper's studies (resolved into ``channels`` before a run):
    # K channels ch1..chK with deterministic delays of these many steps...
    delay_steps: Optional[List[int]] = None
    # ...or every channel's delay in steps drawn from this distribution (rounded).
    delay_distribution: Optional[LatencyConf] = None
    # Kernel channels only: results still in flight at the end land in a final
    # update (the theorem's setting, where every result within D comes back).
    drain: bool = False


@dataclass
class CorrectorConf:
    """Which correctors to compare and their knobs (paper eq. 1)."""

    names: List[str] = field(default_factory=lambda: list(CORRECTORS))
    alpha: float = 1.0
    tau_age: float = 1000.0
    rho_bar: float = 1.0
    retrace_gamma: float = 0.5
    wait_timeout_s: Optional[float] = None
    # Theorem 2.1's condition (R): scale each kernel channel's gain so that the
    # corrector's effective kernel row sums to 1 (alpha_k = alpha / sum_D w(D) Lambda[k, D]).
    row_normalize: bool = False


@dataclass
class TrainConf:
    """The training loop: theta updated by the corrected gradient every step."""

    enabled: bool = True
    lanes: int = 16
    lr: float = 2.0


@dataclass
class LearnerConf:
    """The paper's tabular MDP and its Monte-Carlo bias benchmark."""

    kind: str = "tabular"
    topology: str = "random"
    n_states: int = 3
    n_actions: int = 2
    mdp_seed: int = 1337
    theta_seed: int = 7
    theta_scale: float = 0.3
    gamma: float = 0.9
    horizon: int = 50
    slow_bump: float = 0.6
    fast_noise_std: float = 0.0
    channel_noise_std: float = 0.0
    trials: int = 1000
    bootstrap: int = 1000
    train: TrainConf = field(default_factory=TrainConf)


@dataclass
class ProbeConf:
    """The static-batch advantage probe: (r_fast, r_slow) pairs from a file, or synthetic."""

    pairs: Optional[str] = None
    fast_col: str = "r_fast"
    slow_col: str = "r_slow"
    n: int = 500
    correlation: float = -0.53


@dataclass
class StudyConf:
    """What a run computes. ``bias``: the bias benchmark over the cells of
    ``grid`` (config key -> list of values; "a,b" keys take tuples); ``probe``:
    the static-batch advantage probe; ``tv_bound``: Proposition 2.2's bound.
    ``paper`` names the paper table that racsim-report sets beside the results."""

    kind: str = "bias"
    grid: Dict[str, Any] = field(default_factory=dict)
    paper: Optional[str] = None
    kl_targets: List[float] = field(default_factory=lambda: [0.01, 0.5, 3.0])
    etas: List[float] = field(default_factory=lambda: [0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5])
    probe: ProbeConf = field(default_factory=ProbeConf)


@dataclass
class OutputConf:
    plots: bool = True
    progress: bool = True


@dataclass
class RacsimConf:
    name: str = "custom"
    description: str = ""
    seed: int = 0
    pipeline: PipelineConf = field(default_factory=PipelineConf)
    corrector: CorrectorConf = field(default_factory=CorrectorConf)
    learner: LearnerConf = field(default_factory=LearnerConf)
    study: StudyConf = field(default_factory=StudyConf)
    output: OutputConf = field(default_factory=OutputConf)
    # Sweeps: skip jobs whose results are already complete (their done.json) and
    # run the rest; the folder of the same earlier sweep is found again (racsim/sweep.py).
    resume: bool = False


def register_configs() -> None:
    """Register the schema so that Hydra type-checks the composed config."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="racsim_schema", node=RacsimConf)


# ----------------------------------------------------------------------------
# Validation: one rule per line, each naming the key and what is allowed.


def phase_conf(pipeline: Any, phase: str) -> LatencyConf:
    """The duration distribution of one optimizer phase. Item access, because a
    DictConfig is a mapping and ``.update`` would find the mapping's method."""
    return pipeline[phase] if isinstance(pipeline, Mapping) else getattr(pipeline, phase)


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _need(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(key, value, allowed)


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
    if c.kind == "cauchy":
        _need(c.low is not None and c.high is not None, f"{key}.low", c.low,
              "cauchy needs finite truncation bounds low < high")
        if c.median is None:
            _need(c.mean is not None, f"{key}.median", c.median, "a number, or set mean so it can be solved")
        else:
            _need(_finite(c.median), f"{key}.median", c.median, "a finite number")
        _positive(f"{key}.scale", c.scale)
    if c.mean is not None:
        _need(_finite(c.mean) and c.mean >= 0, f"{key}.mean", c.mean, "a finite number >= 0 (seconds)")
    elif c.kind not in ("cauchy", "empirical"):
        raise ConfigError(f"{key}.mean", c.mean, f"a finite number >= 0: {c.kind} is matched to its mean")
    if c.kind == "gaussian":
        _nonneg(f"{key}.std", c.std)
    if c.kind == "lognormal":
        _positive(f"{key}.sigma", c.sigma)
    if c.kind == "pareto":
        _need(_finite(c.alpha) and c.alpha > 1, f"{key}.alpha", c.alpha, "a number > 1 (finite mean)")
    for b in ("low", "high"):
        v = getattr(c, b)
        if v is not None:
            _need(_finite(v) and v >= 0, f"{key}.{b}", v, "null or a finite number >= 0")
    if c.low is not None and c.high is not None:
        _need(c.low < c.high, f"{key}.high", c.high, f"a number > low ({c.low})")
    if c.kind == "empirical":
        _need(bool(c.path), f"{key}.path", c.path, "the path of a CSV file with the latency samples")
        _need(bool(c.column), f"{key}.column", c.column, "the name of a numeric column of that CSV")


def validate(cfg: Any) -> None:
    """Check ranges and cross-field rules of a composed config (a DictConfig
    or a :class:`RacsimConf`). Raises :class:`ConfigError` on the first bad value."""
    p = cfg.pipeline
    _int_at_least("pipeline.steps", p.steps, 1)
    _int_at_least("pipeline.batch_size", p.batch_size, 1)
    _need(p.engine in ENGINES, "pipeline.engine", p.engine, "one of " + ", ".join(ENGINES))
    for phase in PHASES:
        validate_latency(phase_conf(p, phase), f"pipeline.{phase}")
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
    _need(sum(ch.share for ch in p.channels.values()) > 0, "pipeline.channels.*.share",
          [ch.share for ch in p.channels.values()], "at least one channel with share > 0")

    c = cfg.corrector
    names = list(c.names)
    _need(len(names) >= 1, "corrector.names", names, "a non-empty list of " + ", ".join(CORRECTORS))
    for n in names:
        _need(n in CORRECTORS, "corrector.names", n, "each one of " + ", ".join(CORRECTORS))
    _need(len(set(names)) == len(names), "corrector.names", names, "each corrector at most once")
    _positive("corrector.alpha", c.alpha)
    _positive("corrector.tau_age", c.tau_age, allow_inf=True)
    _positive("corrector.rho_bar", c.rho_bar, allow_inf=True)
    _need(_finite(c.retrace_gamma) and 0 <= c.retrace_gamma <= 1, "corrector.retrace_gamma",
          c.retrace_gamma, "a number in [0, 1]")
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
    _positive("learner.train.lr", lr.train.lr)
    _int_at_least("seed", cfg.seed, 0)
