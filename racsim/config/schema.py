"""Typed configuration for racsim.

The dataclasses below are registered with Hydra's ConfigStore as the schema of
the primary config, so Hydra itself rejects wrong types (``pipeline.steps=abc``)
and unknown keys. :func:`validate` then checks every value's range and the
cross-field rules, and raises :class:`ConfigError` naming the key and what is
allowed. Nothing in this module runs a simulation.

One place per default value: a field that a config group of conf/ sets
(pipeline/default.yaml, corrector/all.yaml, learner/tabular.yaml, rm/gpu/*.yaml,
rm/model/*.yaml) is ``MISSING`` (``???``) here, and its default is the YAML's;
the other fields keep their default here. The default config as the ``racsim``
command composes it is :func:`racsim.config.defaults.default_config`
(tests/test_config.py checks that no field has a default in both places).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

# Names of everything a user can pick from. CORRECTORS is the one list of the
# correctors' names: racsim.learner.correctors' set, the plots' markers and the
# default corrector.names derive from it (tests/test_correctors.py checks that
# each one is implemented as documented).
LATENCY_KINDS = ("deterministic", "gaussian", "lognormal", "pareto", "cauchy", "exponential", "empirical", "uniform")


# GPU-backed reward-model scoring (racsim/pipeline/service.py, the gpu_rm channel in racsim/pipeline/).
CHANNEL_KINDS = ("queue", "gpu_rm")


SERVICE_MODELS = ("roofline", "profiled")


BATCH_ORDERS = ("fifo", "shortest")


BATCH_POLICIES = ("static", "continuous")  # racsim/pipeline/batcher.py; racsim/pipeline/cbatch.py


CAPACITY_SEARCHES = ("grid", "bisect")
# The capacity targets (capacity.<name>; null: not a target), each met by the upper end of its figure's interval.
CAPACITY_TARGETS = ("max_bias", "max_bias_vs_naive", "max_step_s", "max_dropped", "max_sojourn_p95_s",
                    "max_sojourn_p99_s", "max_delay_p95_steps", "max_background_sojourn_p95_s")
# The inputs a capacity answer's sensitivity table varies (capacity.sensitivity.inputs;
# racsim/analyses/sensitivity.py): the sized gpu_rm channel's MFU and token lengths, the arrival
# rate (pipeline.batch_size), its failures' MTBF and MTTR, a queue channel's service-time scale,
# its other tenants' rate (background.rate_per_s).
SENSITIVITY_INPUTS = ("mfu", "tokens", "batch_size", "mtbf_s", "mttr_s", "service", "background_rate")


CORRECTORS = (
    "naive",
    "wait_for_slow",
    "retrace_a",
    "rac",
    "rac_no_age",
    "bare_additive",
    "sync_oracle",
    "rac_adaptive",  # last: adding it left the other correctors' random streams (training) as they were
)


ENGINES = ("lanes", "simpy")


PHASES = ("generate", "fast_score", "submit", "update")  # one optimizer step, in order


LEARNERS = ("tabular", "lm")


# pipeline.arrivals.mode (racsim/pipeline/arrivals.py): when a step's samples reach the slow channels
# (open_poisson: an open stream across steps, the count per step random).
ARRIVAL_MODES = ("batch", "stream", "poisson", "uniform", "trace", "open_poisson")


# learner.kind=lm (racsim/learner/grpo.py): the policy, its model and its optimizer.
LM_POLICIES = ("transformer", "bandit")


LM_BACKBONES = ("gpt2", "llama")


OPTIMIZERS = ("adam", "sgd")


TOPOLOGIES = ("random", "chain", "cyclic", "dense", "terminal")  # racsim/learner/mdp.py builds them


REWARD_SPLITS = ("slow", "total")  # how make_mdp splits the reward into channels


CAUCHY_BOUNDS = ("truncate", "clip")  # a cauchy latency's [low, high]: conditioned on, or clipped to


JOB_FILES = ("auto", "full", "lean")  # output.job_files
STUDY_MODES = ("pipeline", "static", "both")  # the bias study's reading(s): racsim.analyses.static_study


STUDIES = ("bias", "probe", "tv_bound")


@dataclass
class LatencyConf:
    """A non-negative duration distribution (seconds), matched to ``mean``.

    kind: deterministic (always ``mean``), gaussian (N(mean, std^2), clipped),
    lognormal (mu = ln(mean) - sigma^2/2), pareto (x_m = mean*(alpha-1)/alpha),
    cauchy (location ``median``, ``scale``, truncated to [low, high]; when
    ``median`` is null it is solved so that the truncated mean equals ``mean``;
    with ``cauchy_bounds: clip`` clipped to [low, high] instead, as the paper's
    Table 5 draws it, and ``median`` is required),
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
    cauchy_bounds: str = "truncate"


@dataclass
class GpuConf:
    """One GPU kind (conf/rm/gpu/NAME.yaml, the values' one source; racsim.pipeline.service.GPU_CATALOG
    loads them): dense bf16 peak (no sparsity), HBM bandwidth and size, and a
    price per GPU-hour, an editable assumption (set your own contract's)."""

    name: str = MISSING
    peak_tflops: float = MISSING
    mem_bw_tbs: float = MISSING
    memory_gb: float = MISSING
    price_per_hour: float = MISSING


@dataclass
class RMModelConf:
    """A reward model's transformer shape (conf/rm/model/NAME.yaml, the values' one source;
    racsim.pipeline.service.RM_CATALOG loads them): parameter counts, weight bytes and FLOPs
    follow from it (racsim.pipeline.service)."""

    name: str = MISSING
    layers: int = MISSING
    d_model: int = MISSING
    d_ff: int = MISSING
    n_heads: int = MISSING
    n_kv_heads: int = MISSING
    vocab: int = MISSING
    bytes_per_param: float = MISSING


def _tokens(mean: float, sigma: float) -> Any:
    return field(default_factory=lambda: LatencyConf(kind="lognormal", mean=mean, sigma=sigma, low=1.0))


@dataclass
class RMConf:
    """A reward model served on a pool of ``gpus`` GPUs (``gpus / tp`` replicas of
    ``tp`` GPUs each) behind a batcher: batches of at most ``max_batch`` sequences
    and ``token_budget`` tokens (padded to the longest when ``padded``), flushed
    ``max_wait_s`` after the oldest waiting request arrived, taken in ``order``
    (fifo or shortest first). A batch's seconds come from the ``service`` model:
    ``roofline`` (FLOPs at ``mfu`` of the GPU's peak, a memory-bound floor, plus
    ``overhead_s``) or ``profiled`` (the CSV ``profile`` written by racsim-profile).
    Each pipeline sample is ``sequences_per_sample`` sequences (a GRPO group, say),
    scored when all of them are; lengths in tokens are drawn from ``prompt_tokens``
    + ``response_tokens`` (assumption: about 150 + 300, UltraFeedback's scale).
    ``model`` and ``gpu`` have no default here: pick them from conf/rm/ (e.g.
    ``+rm/model@pipeline.fast_rm.model=8b +rm/gpu@pipeline.fast_rm.gpu=H100``)."""

    model: RMModelConf = field(default_factory=RMModelConf)
    gpu: GpuConf = field(default_factory=GpuConf)
    gpus: int = 1
    tp: int = 1
    service: str = "roofline"
    mfu: float = 0.4
    overhead_s: float = 0.01
    mem_util: float = 0.9
    profile: Optional[str] = None
    max_batch: int = 32
    token_budget: int = 32768
    max_wait_s: float = 0.05
    order: str = "fifo"
    padded: bool = True
    sequences_per_sample: int = 1
    # "static" (the above) or "continuous": iteration-level scheduling, packed, no waiting to fill;
    # with chunked_prefill the request over the budget left is split across iterations (cbatch.py).
    batching: str = "static"
    chunked_prefill: bool = False
    prompt_tokens: LatencyConf = _tokens(150.0, 0.5)
    response_tokens: LatencyConf = _tokens(300.0, 0.6)


@dataclass
class AutoscaleConf:
    """An autoscaled pool (racsim/pipeline/autoscale.py) of a queue channel's workers or a
    gpu_rm channel's replicas (tp GPUs each), replacing ``workers`` / ``rm.gpus``: it starts
    with ``min`` servers; one more is requested when more than ``queue_above`` requests have
    waited for ``for_s`` seconds and no server is idle, serving ``startup_s`` later, up to
    ``max``; one idle for ``idle_s`` is released, down to ``min``. Billed from request to
    release at ``cost_per_hour`` per server (null: a gpu_rm replica's catalog GPU price x tp;
    a queue worker's 0)."""

    min: int = 1
    max: int = 4
    queue_above: int = 0
    for_s: float = 1.0
    startup_s: float = 30.0
    idle_s: float = 60.0
    cost_per_hour: Optional[float] = None


@dataclass
class FaultsConf:
    """Server failures of a gpu_rm channel (racsim/pipeline/faults.py): each GPU fails after
    Exp(``mtbf_s``) seconds up (a replica of tp GPUs when any of them does) and is repaired
    after Exp(``mttr_s``); a batch cut by a failure loses its work and is re-sent at once to the
    first replica free and up, ahead of the queue (``on_failure: resend``, as serving stacks
    do), or restarts on its own replica once repaired (``retry``), at most ``max_retries``
    times, or is lost (``lose``, or past the cap). On a queue channel with ``workers``, each
    worker fails so, and so do its requests (racsim/pipeline/workers.py; ``retry`` or ``lose``
    there). ``on_failure`` null (the default): resend on a gpu_rm channel, retry on workers.
    ``mtbf_s`` null (the default): no failures. ``schedule``: a CSV of known outages (columns
    server, down_s, up_s; the same in every lane), used instead of random ones (with
    ``mtbf_s`` and ``mttr_s`` null)."""

    mtbf_s: Optional[float] = None
    mttr_s: Optional[float] = None
    on_failure: Optional[str] = None  # resend | retry | lose; null: resend (gpu_rm), retry (workers)
    max_retries: int = 3  # restarts of a cut batch (resend or retry) before its results are lost
    schedule: Optional[str] = None


@dataclass
class BackgroundConf:
    """Other tenants' requests on a shared channel (racsim/pipeline/background.py): an
    independent Poisson stream of ``rate_per_s`` requests a second over the whole run. On a
    queue channel each is served ``latency`` seconds (null: the channel's own latency law) by
    its workers, FIFO with the learner's samples; on a gpu_rm channel each is one sequence of
    ``prompt_tokens`` + ``response_tokens`` tokens (null: the channel's rm laws), batched by
    the channel's batcher with the learner's sequences. Never injected into training; the
    channel table counts them apart (background_jobs, background_wait_mean_s,
    background_wait_p95_s, background_sojourn_p95_s) and their busy seconds count in its
    utilisation."""

    rate_per_s: float = MISSING
    latency: Optional[LatencyConf] = None
    prompt_tokens: Optional[LatencyConf] = None
    response_tokens: Optional[LatencyConf] = None


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
    # A result that can no longer be used (past max_delay, or past a blocking
    # wait's timeout) is cancelled: it leaves the queue, or frees its worker, then.
    cancel_on_drop: bool = False
    # Probability that a sample is sent to this channel (code prompts to the verifier, a
    # sampled 5% to human review); an unrouted sample gets no slow result from it.
    route_prob: float = 1.0
    # Correlated latency bursts: a hidden two-state Markov chain per run, one state per
    # optimizer step (normal -> degraded with probability p_degrade, back with p_recover),
    # multiplies the latency of every sample submitted in a degraded step by
    # degraded_factor (1: off); on a gpu_rm channel, the seconds of every batch whose
    # oldest request was submitted in a degraded step. Started from its stationary law.
    degraded_factor: float = 1.0
    p_degrade: float = 0.0
    p_recover: float = 1.0
    # "queue" (the above) or "gpu_rm": a reward model on GPUs behind a batcher (``rm``).
    kind: str = "queue"
    rm: Optional[RMConf] = None
    # null: a fixed pool (``workers`` / ``rm.gpus``); else a pool sized by a rule (AutoscaleConf).
    autoscale: Optional[AutoscaleConf] = None

    # gpu_rm replicas or queue workers fail and are repaired (faults.mtbf_s null: never); see FaultsConf.
    faults: FaultsConf = field(default_factory=FaultsConf)
    # Other tenants' requests sharing a queue channel's workers (null: none); see BackgroundConf.
    background: Optional[BackgroundConf] = None


@dataclass
class ArrivalsConf:
    """When each sample of a step is sent to the slow channels (racsim/pipeline/arrivals.py).
    ``batch``: all at once, after generate, fast_score and submit (the paper's clock).
    The other modes send each sample the second it is ready, measured from its step's
    start, and the fast score, submit and update stay per step, after the generate phase:
    ``stream``: each rollout takes a time drawn from ``length`` (response tokens / decode
    rate) and the generate phase lasts until the step's last one is done (it replaces
    ``pipeline.generate``); ``poisson``: the samples arrive as a Poisson process of the step's
    mean rate over the whole clock (given the step's B arrivals, each uniform on the step's
    length: generate + fast_score + submit + update, as from generation that never pauses);
    ``uniform``: each uniform on the drawn generate phase alone (no arrivals while the
    optimizer scores and updates: burstier than Poisson); ``trace``: the
    offsets (seconds from the step's start) of the CSV ``path``'s ``column``, read in order
    over steps x samples and cycled, the generate phase ending at the step's last one;
    ``open_poisson``: an open Poisson stream of rate B / nominal step that never waits for the
    optimizer (a random count per stretch of clock, where ``poisson`` holds B a step); the
    learner takes its samples in order, B a step, the generate phase lasting until the step's
    last one is ready, and a sample ready before its step begins is sent then (a blocking
    optimizer sends it at the step's start)."""

    mode: str = "batch"
    length: LatencyConf = field(default_factory=lambda: LatencyConf(kind="lognormal", mean=6.0, sigma=0.5))
    path: Optional[str] = None
    column: str = "offset_s"


# pipeline.generation.mode (racsim/generation/): lockstep generation inside each optimizer step (sync,
# the paper's clock), or rollout engines that run ahead of the trainer (async).
GENERATION_MODES = ("sync", "async")


@dataclass
class GenerationConf:
    """How the samples a step trains on were generated (DESIGN.md, "Asynchronous generation and the
    two lags"). ``mode``: ``sync``, each step's batch generated by the current policy inside the step
    (the generate phase); ``async``, rollout engines that run ahead of the trainer (the rest of this
    node, racsim/generation/). ``lag``: with ``sync``, a law of the generation lag L (policy versions
    between the one that generated a sample and the step that trains on it), drawn per sample, for
    the learner's bias without the engines (null: L = 0, every sample on-policy)."""

    mode: str = "sync"
    lag: Optional[LatencyConf] = None


@dataclass
class PipelineConf:
    """The optimizer clock: each of ``steps`` steps generates ``batch_size``
    rollouts, fast-scores them, submits them to every slow channel, then updates.
    Defaults of the clock and the phases: conf/pipeline/default.yaml."""

    steps: int = MISSING
    # Steps at the start of a run that are simulated but not measured (queues
    # filling from empty): steady-state figures use the updates after them.
    # null: a fifth of ``steps`` (see :func:`warmup_steps`).
    warmup_steps: Optional[int] = MISSING
    batch_size: int = MISSING
    generate: LatencyConf = MISSING
    fast_score: LatencyConf = MISSING
    submit: LatencyConf = MISSING
    update: LatencyConf = MISSING
    channels: Dict[str, ChannelConf] = field(default_factory=dict)
    engine: str = MISSING
    # Shortcuts for the paper's studies (resolved into ``channels`` before a run):
    # K channels ch1..chK with deterministic delays of these many steps...
    delay_steps: Optional[List[int]] = None
    # ...or every channel's delay in steps drawn from this distribution (rounded).
    delay_distribution: Optional[LatencyConf] = None
    # Kernel channels only: results still in flight at the end land in a final
    # update (the theorem's setting, where every result within D comes back).
    drain: bool = False
    # The fast scorer as a reward model on its own GPUs: when set, the fast_score
    # phase of a step lasts as long as this pool takes to score the step's sequences.
    fast_rm: Optional[RMConf] = None
    # When a step's samples reach the slow channels: all at once (batch) or as each is ready.
    arrivals: ArrivalsConf = field(default_factory=ArrivalsConf)
    # How each step's samples were generated: in lockstep (sync) or by engines running ahead (async).
    generation: GenerationConf = field(default_factory=GenerationConf)


@dataclass
class CorrectorConf:
    """Which correctors to compare and their knobs (paper eq. 1). ``names``
    defaults to every corrector (CORRECTORS); the knobs' defaults are in
    conf/corrector/all.yaml."""

    names: List[str] = field(default_factory=lambda: list(CORRECTORS))
    alpha: float = MISSING
    tau_age: float = MISSING
    rho_bar: float = MISSING
    retrace_gamma: float = MISSING
    # rac_adaptive: tau_age(u) = adaptive_scale * max(1, the adaptive_quantile of the delays of the
    # channel's results landed before update u), tau_age until adaptive_min_results have landed.
    adaptive_quantile: float = MISSING
    adaptive_scale: float = MISSING
    adaptive_min_results: int = MISSING
    wait_timeout_s: Optional[float] = MISSING
    # Theorem 2.1's condition (R): scale each kernel channel's gain so that the
    # corrector's effective kernel row sums to 1 (alpha_k = alpha / sum_D w(D) Lambda[k, D]).
    row_normalize: bool = MISSING


@dataclass
class TrainConf:
    """The training loop: theta updated by the corrected gradient every step
    (defaults: conf/learner/tabular.yaml)."""

    enabled: bool = MISSING
    lanes: int = MISSING
    lr: float = MISSING


@dataclass
class LMConf:
    """``learner.kind=lm``: GRPO on a synthetic task with a fast proxy reward and a
    slow true reward (racsim/learner/grpo.py; racsim/analyses/lm_study.py runs it).
    Each of ``pipeline.steps`` steps samples ``pipeline.batch_size`` prompts (the
    pipeline's samples) x ``group_size`` responses. ``policy``: ``transformer`` (a
    causal LM built from ``backbone``/``layers``/``d_model``/``heads`` with random
    weights, or a local ``checkpoint``; torch, on ``device``) or ``bandit`` (its NumPy
    stand-in: a softmax over ``n_responses`` responses per prompt, 0: all of them).
    Every corrector runs on the same seeds (paired: common random numbers); at ``checkpoints``
    evenly spaced steps the update's gradient is compared with the synchronous one on ``sync_batch``
    times as many groups. How many seeds: the seed rule (racsim.analyses.lm_study.sequential_seeds)
    trains ``seeds`` seeds, then stages doubling the count up to ``max_seeds``, and stops as soon as
    rac minus each corrector of ``decide`` (true reward at naive's wall-clock, seed by seed) has an
    interval that excludes 0 (better or worse) or is narrower than ``bound`` (the same, true-reward
    units), or when the next stage would not end within ``budget_s`` seconds of training (null: no
    limit; each cell of a grid has its own); the intervals hold with 95% confidence over all the
    looks together. ``decide=[]``:
    ``seeds`` seeds, no rule. Defaults live here
    (learner/lm.yaml only sets kind)."""

    policy: str = "transformer"
    seeds: int = 8
    group_size: int = 8
    n_prompts: int = 8
    prompt_len: int = 4
    response_len: int = 6
    vocab: int = 16
    proxy_correlation: float = -0.53  # the paper's probe: fast vs slow advantages on real pairs
    task_seed: int = 0
    init_seed: int = 0
    backbone: str = "gpt2"
    layers: int = 1
    d_model: int = 32
    heads: int = 4
    checkpoint: Optional[str] = None
    device: str = "auto"
    threads: Optional[int] = 1
    optimizer: str = "adam"
    lr: float = 0.01
    kl_coef: float = 0.0
    n_responses: int = 64
    checkpoints: int = 2
    sync_batch: int = 4
    decide: List[str] = field(default_factory=lambda: ["naive"])
    max_seeds: int = 32
    bound: float = 0.05
    budget_s: Optional[float] = 150.0


@dataclass
class LearnerConf:
    """The paper's tabular MDP and its Monte-Carlo bias benchmark (defaults:
    conf/learner/tabular.yaml)."""

    kind: str = MISSING
    topology: str = MISSING
    n_states: int = MISSING
    n_actions: int = MISSING
    mdp_seed: int = MISSING
    theta_seed: int = MISSING
    theta_scale: float = MISSING
    gamma: float = MISSING
    horizon: int = MISSING
    slow_bump: float = MISSING
    fast_noise_std: float = MISSING
    channel_noise_std: float = MISSING
    reward_split: str = MISSING
    trials: int = MISSING
    bootstrap: int = MISSING
    train: TrainConf = field(default_factory=TrainConf)
    lm: LMConf = field(default_factory=LMConf)


@dataclass
class ProbeConf:
    """The static-batch advantage probe: (r_fast, r_slow) pairs from a file, or synthetic."""

    pairs: Optional[str] = None
    fast_col: str = "r_fast"
    slow_col: str = "r_slow"
    n: int = 500
    correlation: float = -0.53
    # Moments of the synthetic pairs. Defaults fitted (racsim/analyses/probe.py,
    # PAPER_LIKE_MOMENTS) so that the deterministic channel's cos(ctrl) and l2
    # ratio match the paper's probe; its cos(RAC) is then a prediction.
    slow_mean: float = 2.19
    slow_std: float = 1.0
    fast_mean: float = 0.0
    fast_std: float = 0.465


@dataclass
class StudyConf:
    """What a run computes. ``bias``: the bias benchmark over the cells of
    ``grid`` (config key -> list of values; "a,b" keys take tuples); ``probe``:
    the static-batch advantage probe; ``tv_bound``: Proposition 2.2's bound.
    ``paper`` names the paper table that racsim-report sets beside the results."""

    kind: str = "bias"
    # The bias study's reading: "pipeline" (trials are runs of the simulated pipeline),
    # "static" (the paper's experiment: one rollout per trial, every slow result lands
    # with its weight; racsim/learner/static.py) or "both" (rows carry a "mode" column).
    mode: str = "pipeline"
    # Static mode: replications of its Monte Carlo at learner.trials (the interval of a
    # reduction the paper's procedure yields); 0 turns them off.
    replications: int = 200
    grid: Dict[str, Any] = field(default_factory=dict)
    paper: Optional[str] = None
    # A reduced run for smoke tests and CI: every seed axis of the grid keeps
    # its first two values, trials <= 100 and bootstrap <= 200.
    fast: bool = False
    # Processes for the grid's learner groups (0: every core; one inside a sweep's joblib job,
    # whose siblings hold the cores). Results do not depend on it.
    workers: int = 1
    kl_targets: List[float] = field(default_factory=lambda: [0.01, 0.5, 1.2])
    etas: List[float] = field(default_factory=lambda: [0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5])
    probe: ProbeConf = field(default_factory=ProbeConf)


@dataclass
class SensitivityConf:
    """How the capacity answer moves with its assumptions (racsim/analyses/sensitivity.py): each
    of ``inputs`` (null: every one that applies to the sized channel, of
    :data:`SENSITIVITY_INPUTS`) is moved ``spread`` down and up, the others as given, and the
    fewest count meeting the same targets found for each (sensitivity.csv, one line in summary.md)."""

    enabled: bool = False
    spread: float = 0.2  # the relative change of each input, either way (0.2: -20% and +20%)
    inputs: Optional[List[str]] = None


@dataclass
class CapacityConf:
    """Capacity planning (racsim/analyses/capacity/): the scenario is run once per count
    in ``counts`` of ``channel``'s GPUs (gpu_rm) or workers (queue), all counts
    (``grid``) or a bisection for the fewest that meets the targets (``bisect``):
    ``corrector``'s exact bias at most ``max_bias`` (and at most
    ``max_bias_vs_naive`` times naive's), its mean wall-clock per step at most
    ``max_step_s``, and the channel's service targets (:data:`CAPACITY_TARGETS`). Cost: the
    GPU's price (gpu_rm) or ``price_per_unit_hour``."""

    enabled: bool = False
    channel: Optional[str] = None
    counts: List[int] = field(default_factory=list)
    # The largest count tried above the list where the largest count evaluated fails the targets
    # (galloping up from it in whole servers); null: twice the largest listed count.
    max_count: Optional[int] = None
    search: str = "grid"
    corrector: str = "rac"
    max_bias: Optional[float] = None
    max_bias_vs_naive: Optional[float] = None
    max_step_s: Optional[float] = None
    # Service targets a serving team names for the sized channel, measured after the warm-up
    # (null: not a target): the share of its results dropped (in [0, 1]; default 1%), its
    # sojourn (submit to result, seconds) p95 and p99, its delay in optimizer steps p95.
    max_dropped: Optional[float] = 0.01
    max_sojourn_p95_s: Optional[float] = None
    max_sojourn_p99_s: Optional[float] = None
    max_delay_p95_steps: Optional[float] = None
    # A shared channel's other tenants (its background block): their requests' sojourn p95 (s).
    max_background_sojourn_p95_s: Optional[float] = None
    price_per_unit_hour: Optional[float] = None
    # Offered load (work arriving per second over the capacity up) from which a count is
    # overloaded: its queue has no steady state, so it is not simulated and never recommended.
    max_load: float = 0.95
    # Level of each capacity figure's interval (trials resampled); a count meets a target when
    # the interval's upper end does.
    confidence: float = 0.95
    resamples: int = 200
    # auto: the warm-up found by MSER-5 (unless pipeline.warmup_steps is set) and the run
    # doubled from pipeline.steps until the window after it is stationary, up to max_steps;
    # fixed: pipeline.steps and pipeline.warmup_steps as given (racsim/pipeline/steady.py).
    run_length: str = "auto"
    max_steps: int = 640
    # Slow regimes (random outages, a burst chain, an autoscaler, a preemption schedule): with
    # run_length auto, the trials' measured windows together hold at least this many cycles of
    # the slowest one (a schedule's whole span), each trial's at least one, after the warm-up the
    # regime's chain gives the count where the regimes start stationary (outages, bursts:
    # racsim/analyses/capacity/episodes.py); a run max_steps keeps shorter is not stationary. The
    # stationarity check tests the trials' slopes; the bias's and the step's intervals resample
    # batches of at least two cycles, the channel's the trials (racsim/analyses/capacity/regimes.py); 0: off.
    regime_cycles: int = 100
    # Deciding with enough evidence (racsim/analyses/capacity/stopping.py): the fewest count that passes and
    # the one a server below it read their rare-event figures (dropped share, sojourn p95/p99, delay p95)
    # off independent replications: their settled run's trials and more runs of the count (at its warm-up).
    # Under random outages or bursts they are sized from the regime's chain
    # (racsim/analyses/capacity/episodes.py: enough trial-steps that a figure at its target would show 20
    # drop episodes); elsewhere a figure whose interval straddles its target is replicated. Replications
    # stop when every figure is decided or these budgets end, together for the whole answer: simulated
    # steps (of the scenario's trials) and seconds of wall-clock, null by default: the steps budget alone
    # gives the same answer on any machine (a seconds budget that binds makes the answer depend on the
    # machine's speed). A figure left open is unresolved, and its count fails (the safe side). 0: no
    # replications (the settled runs' figures stand).
    decide_steps: int = 4000
    decide_s: Optional[float] = None
    benchmark: bool = True  # the lanes engine's requests/s in this run beside raw SimPy's, timed in the same run
    # Processes that simulate a grid search's counts side by side (each count's figures are the
    # same in any of them): 1 one at a time; N up to N; 0 (default) up to every usable core beside
    # this process, as many as end the counts soonest (4 counts on 2 cores: two at a time;
    # racsim/analyses/capacity/pool.py soonest), where starting them saves time: at once when a lower
    # bound on a count's seconds says so, else once the first count simulated shows it (one
    # inside a sweep's joblib job, whose siblings hold the cores). Never more than the memory
    # budget (limits.memory_gb) holds at one run's estimated peak each.
    workers: int = 0
    # The answer again with each guessed input (MFU, token lengths, arrival rate, failures, service
    # times) moved -spread and +spread: SensitivityConf.
    sensitivity: SensitivityConf = field(default_factory=SensitivityConf)


@dataclass
class OutputConf:
    plots: bool = True
    progress: bool = True
    # Replace files of the same name that racsim did not write in the output folder
    # (by default a run refuses, and nothing of the user's is touched).
    force: bool = False
    # What a run writes in its folder: full (every table as Parquet and CSV, config.yaml, trace,
    # plots, summary.md), lean (the tables as Parquet, done.json), auto (lean for a sweep job
    # run by racsim's launcher, full otherwise). README "Sweeps".
    job_files: str = "auto"


@dataclass
class LimitsConf:
    """Budgets a run is checked against before it starts (racsim.config.validate.check_limits):
    a run whose estimate exceeds one is refused with one line naming the knob that made it big.
    ``memory_gb`` null: half of this machine's memory. Raise them deliberately for a big run."""

    memory_gb: Optional[float] = None
    hours: float = 24.0  # estimated compute time of the run, at about 2 million trajectory steps a second
    cells: int = 10000  # cells of study.grid in one run (a bigger study is a sweep: racsim -m)
    capacity_counts: int = 256  # entries of capacity.counts
    file_mb: float = 256.0  # size of a data file read (empirical latencies, RM profile, probe pairs)


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
    capacity: CapacityConf = field(default_factory=CapacityConf)
    limits: LimitsConf = field(default_factory=LimitsConf)


def register_configs() -> None:
    """Register the schema so that Hydra type-checks the composed config.

    The ``study`` node is stored open (its struct flag False): OmegaConf refuses to
    delete a field of a typed node, so ``~study.grid`` (remove a scenario's grid) needs
    it. Every value keeps its type; a key the schema lacks under ``study`` is then
    caught by racsim.config.validate.check_schema instead of by the composition."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    node = OmegaConf.structured(RacsimConf)
    OmegaConf.set_struct(node.study, False)
    ConfigStore.instance().store(name="racsim_schema", node=node)
    _rm_blocks_settable()


RM_BLOCKS = ("fast_rm", "rm")  # null RM blocks that a key override creates (pipeline.fast_rm, a channel's rm)


def null_rm_block(cfg: Any, key: str) -> Optional[str]:
    """The RM block above ``key`` (``pipeline.fast_rm`` for ``pipeline.fast_rm.gpus``) when
    it is null in ``cfg``; None otherwise."""
    from omegaconf import OmegaConf

    parts = key.split(".")
    i = next((i for i, part in enumerate(parts[:-1]) if part in RM_BLOCKS), None)
    if i is None:
        return None
    block = ".".join(parts[:i + 1])
    return block if OmegaConf.select(cfg, block, default=0) is None else None


def _rm_blocks_settable() -> None:
    """Let ``pipeline.fast_rm.gpus=4`` (any key of a null RM block) create the block with
    the schema's defaults, as ``+rm/model@pipeline.fast_rm.model=8b`` does: OmegaConf
    cannot set a key under a null typed node, so Hydra's override step first merges an
    empty block into its parent. Its ``model`` and ``gpu`` stay MISSING until picked, and
    racsim.config.validate names them (one line) if they never are. A null block set whole
    (``pipeline.channels.judge.background={rate_per_s: 3}``) is made an empty one first, for the same
    reason."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from omegaconf import OmegaConf

    apply = ConfigLoaderImpl._apply_overrides_to_config
    if getattr(apply, "racsim_rm_blocks", False):
        return

    def apply_in_order(overrides: List[Any], cfg: Any) -> None:
        for o in overrides:
            block = None if o.package is not None or o.is_delete() else null_rm_block(cfg, o.key_or_group)
            if block is None and o.package is None and not o.is_delete() and isinstance(o.value(), dict) \
                    and OmegaConf.select(cfg, o.key_or_group, default=0) is None:
                block = o.key_or_group  # a null block set whole (background={...}): OmegaConf cannot merge into None
            if block is not None:
                parent, _, name = block.rpartition(".")
                OmegaConf.update(cfg, parent, {name: {}}, merge=True)
            apply([o], cfg)

    apply_in_order.racsim_rm_blocks = True  # type: ignore[attr-defined]
    ConfigLoaderImpl._apply_overrides_to_config = staticmethod(apply_in_order)


def phase_conf(pipeline: Any, phase: str) -> LatencyConf:
    """The duration distribution of one optimizer phase. Item access, because a
    DictConfig is a mapping and ``.update`` would find the mapping's method."""
    return pipeline[phase] if isinstance(pipeline, Mapping) else getattr(pipeline, phase)


def warmup_steps(pipeline: Any) -> int:
    """The warm-up of a run in steps: ``pipeline.warmup_steps``, or a fifth of ``steps`` when null."""
    w = pipeline.warmup_steps
    return pipeline.steps // 5 if w is None else int(w)
