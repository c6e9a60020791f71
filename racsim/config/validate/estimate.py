"""What a run would take, estimated from its config before it starts: the bytes of its largest
arrays (each charged to the key that sets its size), the outages and retries its failing
channels generate, and its seconds. racsim.config.validate.limits holds them to the budgets."""

from __future__ import annotations

import math
from typing import Any, Optional

from omegaconf import ListConfig

from racsim.config.validate.channel import channel_kind, fault_seconds, has_workers
from racsim.config.validate.common import finite, node
from racsim.config.validate.pipeline import mean_seconds, nominal_step
from racsim.config.validate.study import grid_cells

TRAJECTORY_STEPS_PER_S = 2e6  # the bias benchmark's rate on one core (README: 1e7 steps in ~4.5 s)
ROLLOUT_CHUNK = 40_000  # trajectories sampled at once (racsim.learner.bias.CHUNK_TRAJECTORIES)
# The most bytes of trajectory gradients a bias study keeps for all its trajectories at once, so that
# every run sharing them computes them once (racsim.learner.bias.TrajectoryPlan.gradients); past it,
# each chunk's are computed as it comes.
RECALL_BYTES = 256 * 2**20
F8 = 8.0  # bytes of a float64 or int64
PROBE_DRAWS = 200  # landings per pair of the probe's slack sweep (racsim.analyses.probe.slack_sweep)
BASELINE_BYTES = 20e6  # what any run holds beside its sized arrays (tables, configs; measured with tracemalloc)
FAULT_EVENTS_PER_S = 1e6  # outages generated and attempts retried a second (racsim/pipeline/faults.py), an assumption
FAULT_EVENT_BYTES = 64.0  # an outage's (down, up) in the timeline and in the engines' stacked copies

SIZE_KEYS = ("learner.trials", "pipeline.steps", "pipeline.batch_size", "learner.horizon", "learner.n_states",
             "learner.n_actions", "learner.bootstrap", "learner.train.lanes", "study.probe.n", "capacity.resamples",
             "learner.lm.seeds", "learner.lm.max_seeds")
SCHEDULE_BYTES = 200.0  # the arrival schedules' bytes per lane, step, sample and channel (K + 1)
RESAMPLED_UNITS = 4000  # units a capacity figure's resamples may hold beyond the trials (batches of their windows)
CHANNEL_SIZE_KEYS = ("workers", "rm.gpus", "rm.sequences_per_sample", "autoscale.max")


def _largest(cfg: Any, key: str, value: Any) -> int:
    """``value`` of dotted ``key``, or its largest value in ``study.grid`` when the grid varies it."""
    grid = dict(getattr(cfg.study, "grid", None) or {})
    vals = [value] + [v for k, vs in grid.items() if k.strip() == key and isinstance(vs, (list, ListConfig)) for v in vs]
    return max(int(v) for v in vals if finite(v))


def _capacity_runs(cfg: Any) -> int:
    """How many times the run is made: once per capacity count, once without a search."""
    return max(len(cfg.capacity.counts), 1) if cfg.capacity.enabled else 1


def search_top(max_count: Optional[int], listed: list) -> int:
    """The largest count a capacity search may try (racsim.analyses.capacity.search.counts_above):
    ``capacity.max_count`` (never below the largest of ``listed``), or twice the largest listed."""
    return 2 * max(listed) if max_count is None else max(int(max_count), max(listed))


def longest_steps(steps: int, max_steps: int) -> int:
    """The longest run of a capacity search with ``capacity.run_length=auto``: ``pipeline.steps``
    doubled while the double is at most ``capacity.max_steps`` (racsim.analyses.capacity.length.settle)."""
    while 1 <= steps and steps * 2 <= max_steps:
        steps *= 2
    return steps


def steps_key(sizes: dict) -> str:
    """The key that sets a run's steps: ``capacity.max_steps`` when a capacity search may double its
    runs past ``pipeline.steps`` (:func:`run_sizes` then holds its longest run), else ``pipeline.steps``."""
    return "capacity.max_steps" if "capacity.max_steps" in sizes else "pipeline.steps"


def _blame(sizes: dict, *keys: str) -> str:
    """Of ``keys``, the one whose value in ``sizes`` is largest: the knob an array's size is charged to."""
    return max(keys, key=lambda k: sizes[k])


def memory_terms(cfg: Any, sizes: dict) -> dict:
    """Bytes of a run's largest arrays, summed by the config key that sets their size (one key per
    array: the largest factor of its shape). Each term is a count of float64 arrays of one shape
    as the code allocates them at its peak (tests/test_limits.py holds the sum to the measured
    peak): the arrival schedules (trials x steps x batch x (K + 1)), a queue channel's workers and
    a gpu_rm channel's (and the fast scorer's, pipeline.fast_rm) replicas, tokens and sequences per lane, the MDP (S x A x S transitions;
    S x A tables per trial and per sampled trajectory), the bootstrap's counts, the training lanes
    and the probe's pairs. ``sizes``: every such key's value (largest over study.grid); a capacity
    search's steps are its longest run's (:func:`steps_key`)."""
    S, A = sizes["learner.n_states"], sizes["learner.n_actions"]
    if cfg.study.kind == "probe":
        return {"study.probe.n": F8 * sizes["study.probe.n"] * (4 * PROBE_DRAWS + 12)}
    p = cfg.pipeline
    K = max(len(p.channels or {}), len(p.delay_steps or []), 1)
    if cfg.learner.kind == "lm":  # its schedules: the tabular one's, one lane per seed (racsim.analyses.lm_study)
        lm_seeds = ("learner.lm.seeds", "learner.lm.max_seeds") if cfg.learner.lm.decide else ("learner.lm.seeds",)
        seeds = _blame(sizes, *lm_seeds)  # with the seed rule, its last stage
        return {_blame(sizes, seeds, steps_key(sizes), "pipeline.batch_size"):
                SCHEDULE_BYTES * sizes[seeds] * sizes[steps_key(sizes)] * sizes["pipeline.batch_size"] * (K + 1)}
    if cfg.study.kind != "bias" or cfg.learner.kind != "tabular":
        return {}
    long = steps_key(sizes)
    trials, steps, batch, horizon = (sizes[k] for k in ("learner.trials", long, "pipeline.batch_size",
                                                         "learner.horizon"))
    lanes = max(trials, sizes["learner.train.lanes"] if cfg.learner.train.enabled else 0)
    terms: dict = {}

    def add(key: str, n: float) -> None:
        terms[key] = terms.get(key, 0.0) + n

    sched = ("learner.trials", long, "pipeline.batch_size")
    add(_blame(sizes, *sched), SCHEDULE_BYTES * trials * steps * batch * (K + 1))
    for name, ch in (p.channels or {}).items():
        key = f"pipeline.channels.{name}"
        if channel_kind(ch) == "gpu_rm" and ch.rm is not None:
            seqs = f"{key}.rm.sequences_per_sample"
            add(_blame(sizes, *sched, seqs), 6 * F8 * lanes * steps * batch * sizes[seqs])
            add(f"{key}.rm.gpus", 2 * F8 * lanes * sizes[f"{key}.rm.gpus"] / max(int(ch.rm.tp), 1))
        elif has_workers(ch):
            add(f"{key}.workers", 1.5 * F8 * lanes * sizes[f"{key}.workers"])
        if getattr(ch, "autoscale", None) is not None:
            add(f"{key}.autoscale.max", 2 * F8 * lanes * sizes[f"{key}.autoscale.max"])
    if p.fast_rm is not None:  # its tokens per sequence and its replicas, as a gpu_rm channel's
        seqs = "pipeline.fast_rm.sequences_per_sample"
        add(_blame(sizes, *sched, seqs), 6 * F8 * lanes * steps * batch * sizes[seqs])
        add("pipeline.fast_rm.gpus", 2 * F8 * lanes * sizes["pipeline.fast_rm.gpus"] / max(int(p.fast_rm.tp), 1))
    # rollouts sampled at once: every trial's, at most racsim.learner.bias's budget (a trial at least)
    traj = min(trials * steps * batch, max(steps * batch, 3 * ROLLOUT_CHUNK // max(3, K + 1)))
    add(_blame(sizes, "learner.horizon", *sched), F8 * traj * horizon * (2 + 2 * (K + 1)))
    n = trials * steps * batch
    every = F8 * n * S * A * (min(K + 1, S * A) + (cfg.learner.fast_noise_std > 0))
    if 0 < every <= RECALL_BYTES:  # every trajectory's gradients kept, to be computed once: beyond one chunk's
        add(_blame(sizes, *sched), every * (1 - traj / n))
    mdp = _blame(sizes, "learner.n_states", "learner.n_actions")
    rollout = cfg.corrector.rollout
    rows = max(len(cfg.corrector.names), 1) * (max(len(rollout), 1) if isinstance(rollout, (list, ListConfig)) else 1)
    names = rows + 1
    add(mdp, F8 * S * A * (3 * S + 2 * names * trials + 2 * traj * (K + 1) + horizon * (K + 1)) + 4 * F8 * S * S)
    if getattr(p.generation, "lag", None) is not None:  # a moving policy (racsim.learner.drift): exact figures per
        # trial beside the estimates, and a chunk's terms (their indices, weights and values) for one row at a time
        add(mdp, F8 * S * A * (2 * rows * trials + traj * (K + 1)) + 8 * F8 * traj * (K + 1))
    add(_blame(sizes, "learner.bootstrap", "learner.trials"), 5 * F8 * sizes["learner.bootstrap"] * trials)
    if cfg.capacity.enabled:  # each count's intervals: the resample counts and each unit's residuals
        add("capacity.resamples", F8 * sizes["capacity.resamples"] * (2 * trials + 2 * RESAMPLED_UNITS))
    if cfg.learner.train.enabled:
        L = sizes["learner.train.lanes"]
        add("learner.train.lanes", F8 * L * (steps * batch * horizon * (K + 4) + (batch + 4) * S * A))
    for key, n in fault_events(cfg, sizes).items():
        add(key, FAULT_EVENT_BYTES * n)
    return terms


def fault_events(cfg: Any, sizes: dict) -> dict:
    """Outages and retried attempts a run's failing channels generate, by ``faults.mtbf_s`` key: per
    lane and server, the span it covers over (MTBF + MTTR), where the span is the run's steps of
    nominal time plus, for each of the server's requests, the expected retries (at most
    ``max_retries``) each waiting a repair (``retry``; a ``resend`` waits none); a request's
    attempt fails with probability 1 - exp(-seconds / MTBF), its seconds the channel's mean
    latency, or a step's for a gpu_rm batch. Lanes: trials and training lanes, once per capacity
    count (each at its longest run)."""
    p, out = cfg.pipeline, {}
    step = nominal_step(p)
    lanes = sizes["learner.trials"] + (sizes["learner.train.lanes"] if cfg.learner.train.enabled else 0)
    runs = _capacity_runs(cfg)
    for name, ch in (p.channels or {}).items():
        f = getattr(ch, "faults", None)
        if f is None or not all(fault_seconds(x) for x in (f.mtbf_s, f.mttr_s)):
            continue  # no failures, or values that validate_faults refuses
        key = f"pipeline.channels.{name}"
        gpu = channel_kind(ch) == "gpu_rm"
        if gpu and ch.rm is None:
            continue
        tp = max(int(ch.rm.tp), 1) if gpu else 1
        servers = max(sizes.get(f"{key}.rm.gpus" if gpu else f"{key}.workers", 1) // tp, 1)
        steps = sizes[steps_key(sizes)]
        requests = steps * sizes["pipeline.batch_size"]
        if gpu:
            requests *= sizes.get(f"{key}.rm.sequences_per_sample", 1) / max(int(ch.rm.max_batch), 1)
        mtbf, mttr = f.mtbf_s / tp, f.mttr_s
        seconds = step if gpu else (mean_seconds(ch.latency.mean) or step)
        fail = -math.expm1(-min(seconds / mtbf, 700.0))
        retries = min(float(f.max_retries), fail / max(1.0 - fail, 1e-300)) if f.on_failure != "lose" else 0.0
        resend = f.on_failure == "resend" or (gpu and f.on_failure is None)
        wait = 0.0 if resend else mttr  # a re-sent batch waits for no repair
        span = steps * step + requests / servers * retries * wait
        per_server = span / (mtbf + mttr) + requests / servers * retries
        out[f"{key}.faults.mtbf_s"] = runs * lanes * servers * per_server
    return out


def run_sizes(cfg: Any) -> dict:
    """Every key that sets an array's size, at its largest value (over study.grid; a capacity search's
    channel at the largest count it may try, :func:`search_top`; ``capacity.max_steps``: the longest
    run of a search that doubles its runs, :func:`longest_steps`), null ones left out."""
    keys = [(k, node(cfg, k)) for k in SIZE_KEYS]
    cap = cfg.capacity
    counts = [n for n in cap.counts if isinstance(n, int)] if cap.enabled else []
    for name, ch in (cfg.pipeline.channels or {}).items():
        for k in CHANNEL_SIZE_KEYS:
            block, _, leaf = k.rpartition(".")
            at = getattr(ch, block) if block else ch
            if at is not None and getattr(at, leaf, None) is not None:
                sized = counts and k in ("workers", "rm.gpus") and cap.channel in (None, name)
                keys.append((f"pipeline.channels.{name}.{k}",
                             search_top(cap.max_count, counts) if sized else getattr(at, leaf)))
    if cfg.pipeline.fast_rm is not None:  # the fast scorer's GPUs (a phase of the step, not a channel)
        keys += [(f"pipeline.fast_rm.{k}", getattr(cfg.pipeline.fast_rm, k)) for k in ("gpus", "sequences_per_sample")]
    sizes = {k: _largest(cfg, k, v) for k, v in keys}
    if cap.enabled and cap.run_length == "auto" and finite(cap.max_steps):
        longest = longest_steps(sizes["pipeline.steps"], _largest(cfg, "capacity.max_steps", cap.max_steps))
        if longest > sizes["pipeline.steps"]:
            sizes["capacity.max_steps"] = longest
    return sizes


def run_estimate(cfg: Any) -> dict:
    """Peak memory (bytes, :func:`memory_terms` summed; ``terms`` by key) and time (s) of a run, from
    its sizes. Time goes with the trajectory steps of the bias study (cells x trials x steps x
    batch_size x horizon, and once more per capacity count). A knob varied by study.grid counts at
    its largest value; ``sizes`` holds the four keys of the time's product."""
    every = run_sizes(cfg)
    terms = memory_terms(cfg, every)
    sizes = {k: every[k] for k in ("learner.trials", "pipeline.steps", "pipeline.batch_size", "learner.horizon")}
    trials, steps, batch, horizon = sizes.values()
    runs = grid_cells(cfg.study.grid) * _capacity_runs(cfg)
    seconds = runs * float(trials) * steps * batch * horizon / TRAJECTORY_STEPS_PER_S
    faults = fault_events(cfg, every)
    seconds += sum(faults.values()) / FAULT_EVENTS_PER_S
    return {"memory": BASELINE_BYTES + sum(terms.values()), "terms": terms, "seconds": seconds, "sizes": sizes,
            "all_sizes": every, "faults": faults}


def biggest_knob(est: dict) -> Optional[str]:
    """The key of the estimate's largest memory term, None when it counts none."""
    return max(est["terms"], key=est["terms"].get) if est["terms"] else None
