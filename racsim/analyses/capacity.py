"""Capacity planning: how many GPUs (or workers) behind a slow channel?

A capacity run repeats the scenario for each count of the chosen channel's
GPUs (``rm.gpus`` of a gpu_rm channel) or workers (a queue channel), through
the ordinary run machinery (:func:`racsim.analyses.bias_study.run_bias_study`: the same pipeline, bias
benchmark and tables as any run, the same seed, so the counts are compared on
common random numbers), and collects per count and corrector: the delay in
optimizer steps (p50/p95) and the sojourn in seconds (p95), measured after
``pipeline.warmup_steps`` (the steady state), the slack eta, the exact and Monte-Carlo bias, the
wall-clock per step, the pool's utilisation and its cost. It then recommends
the fewest units for which the chosen corrector meets the targets
(``capacity.max_bias``, ``capacity.max_bias_vs_naive``, ``capacity.max_step_s``).

Why one run that loops, rather than a Hydra multirun: the answer is a
comparison across counts (a curve, a minimum), which a single process can
compute, plot and summarise in one folder without a second "gather" step, and
a bisection needs each answer before choosing the next count, which a
multirun's fixed job list cannot do. A plain Hydra sweep still works for
anyone who wants one folder per count (``racsim -m scenario=...
pipeline.channels.judge.rm.gpus=1,2,4,8 capacity.enabled=false``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np
import pandas as pd
from omegaconf import OmegaConf, open_dict

from racsim.analyses.bias_study import corrector_names, run_bias_study
from racsim.analyses.grid import expand
from racsim.config.validate import validate
from racsim.learner.correctors import BLOCKING
from racsim.pipeline.draws import draw
from racsim.pipeline.simpy_engine import run_simpy


@dataclass
class CapacityResult:
    """One row per (count, corrector) in ``curve``; the recommendation and the run
    at the recommended count (for its timeline)."""

    curve: pd.DataFrame
    channel: str
    unit: str  # "GPUs" or "workers"
    key: str  # the config key varied
    recommended: Optional[int]
    per_corrector: pd.DataFrame  # fewest units meeting the targets, for every corrector
    targets: Dict[str, Any]
    best: Any = None  # RunResult at the recommended (or largest) count
    timings: Dict[str, float] = field(default_factory=dict)
    speed: Dict[str, float] = field(default_factory=dict)
    autoscale: Optional[pd.DataFrame] = None  # the channel's autoscaled pool vs the evaluated fixed pools


def channel_of(cfg: Any) -> str:
    """The channel to size: ``capacity.channel``, or the only sizable one."""
    if cfg.capacity.channel is not None:
        return str(cfg.capacity.channel)
    chans = cfg.pipeline.channels
    return next(n for n, ch in chans.items() if getattr(ch, "kind", "queue") == "gpu_rm" or ch.workers is not None)


def _is_gpu(cfg: Any, name: str) -> bool:
    return getattr(cfg.pipeline.channels[name], "kind", "queue") == "gpu_rm"


def count_key(cfg: Any, name: str) -> str:
    return f"pipeline.channels.{name}.rm.gpus" if _is_gpu(cfg, name) else f"pipeline.channels.{name}.workers"


def unit_price(cfg: Any, name: str) -> float:
    """USD per unit-hour: the GPU's price, or ``capacity.price_per_unit_hour`` (0 when unset)."""
    if _is_gpu(cfg, name):
        return float(cfg.pipeline.channels[name].rm.gpu.price_per_hour)
    p = cfg.capacity.price_per_unit_hour
    return 0.0 if p is None else float(p)


def with_count(cfg: Any, key: str, n: int) -> Any:
    c = cfg.copy()
    with open_dict(c):
        c.capacity.enabled = False
    OmegaConf.update(c, key, int(n), merge=False)
    return c


def units_per_server(cfg: Any, name: str) -> int:
    """GPUs per replica (tp) of a gpu_rm channel, 1 worker per server of a queue channel."""
    return int(cfg.pipeline.channels[name].rm.tp) if _is_gpu(cfg, name) else 1


def fixed_pool(cfg: Any, name: str) -> Any:
    """The config with ``name``'s autoscale rule removed (a fixed pool of its count)."""
    c = cfg.copy()
    OmegaConf.update(c, f"pipeline.channels.{name}.autoscale", None, merge=False)
    return c


def autoscale_whatif(cfg: Any, name: str, fixed_rows: Dict[int, List[dict]], auto, targets: dict) -> pd.DataFrame:
    """Autoscaled pool against every fixed pool the search evaluated (whole servers; the rule's
    min and max are always among them): per pool and corrector, servers (mean billed, autoscaled),
    bias, wall-clock per step, cost per 1000 steps and whether the row meets the capacity targets.
    ``fixed_rows``: capacity rows by unit count; ``auto``: the autoscaled run. The autoscaled
    pool's cost is measured on the asynchronous pipeline, so it is not given for blocking correctors."""
    units = units_per_server(cfg, name)
    out = []
    for n in sorted(c for c in fixed_rows if c % units == 0):
        out += [{"pool": f"fixed {n // units}", "servers": float(n // units), **_whatif(r, targets)}
                for r in fixed_rows[n]]
    ch = auto.channels[auto.channels.channel == name].iloc[0]
    for r in _rows(cfg, name, 0, auto):
        r["cost_per_1000_steps"] = np.nan if r["corrector"] in BLOCKING else float(ch["cost_per_1000_steps"])
        out.append({"pool": "autoscaled", "servers": float(ch["servers_billed_mean"]), **_whatif(r, targets)})
    return pd.DataFrame(out)


def _whatif(r: dict, targets: dict) -> dict:
    keys = ("corrector", "bias_exact", "bias_vs_naive", "step_s", "delay_p95_steps", "sojourn_p95_s",
            "dropped_frac", "cost_per_1000_steps")
    return {**{k: r[k] for k in keys}, "meets": feasible(r, targets)}


def _rows(cfg: Any, name: str, n: int, res) -> List[dict]:
    """The capacity curve's rows for one count, from a run's tables."""
    ch = res.channels[res.channels.channel == name].iloc[0]
    price = unit_price(cfg, name)
    naive = res.results[res.results.corrector == "naive"].iloc[0]
    out = []
    for _, r in res.results.iterrows():
        step_s = float(r["step_s"])
        out.append({
            "count": int(n),
            "corrector": r["corrector"],
            "bias_exact": float(r["bias_exact"]),
            "bias_mc": float(r["bias_mc"]),
            "mc_se": float(r["mc_se"]),
            "bias_vs_naive": float(r["bias_exact"]) / float(naive["bias_exact"]) if naive["bias_exact"] > 0 else np.nan,
            "step_s": step_s,
            "eta": float(r.get(f"eta_{name}", np.nan)),
            "delay_p50_steps": float(ch["delay_p50_steps"]),
            "delay_p95_steps": float(ch["delay_p95_steps"]),
            "dropped_frac": float(ch["dropped"]) / float(ch["emitted"]),
            "pending_frac": float(ch["pending"]) / float(ch["emitted"]),
            "wait_p95_s": float(ch["wait_p95_s"]),
            "sojourn_p95_s": float(ch["sojourn_p95_s"]),
            "utilisation": float(ch["utilisation"]),
            "cost_per_hour": n * price,
            "cost_per_1000_steps": n * price * step_s * 1000.0 / 3600.0,
        })
        if "availability" in ch:  # a channel with faults: its replicas' uptime, results lost to failures
            out[-1].update(availability=float(ch["availability"]),
                           lost_to_failure_frac=float(ch["lost_to_failure"]) / float(ch["emitted"]))
    return out


def feasible(row: Any, targets: Dict[str, Any]) -> bool:
    """Does one (count, corrector) row meet every target that is set?"""
    ok = True
    if targets.get("max_bias") is not None:
        ok &= row["bias_exact"] <= targets["max_bias"]
    if targets.get("max_bias_vs_naive") is not None:
        ok &= row["bias_vs_naive"] <= targets["max_bias_vs_naive"]
    if targets.get("max_step_s") is not None:
        ok &= row["step_s"] <= targets["max_step_s"]
    return bool(ok)


def run_capacity(cfg: Any, progress=None) -> CapacityResult:
    """Evaluate the counts (all of them, or a bisection) and recommend one."""
    validate(cfg)
    cap = cfg.capacity
    name = channel_of(cfg)
    scaled = cfg if getattr(cfg.pipeline.channels[name], "autoscale", None) is not None else None
    if scaled is not None:  # the curve: fixed pools; the autoscaled pool is compared with them below
        cfg = fixed_pool(cfg, name)
    key = count_key(cfg, name)
    counts = sorted(set(int(n) for n in cap.counts))
    targets = {k: getattr(cap, k) for k in ("max_bias", "max_bias_vs_naive", "max_step_s")}
    chosen = str(cap.corrector)
    runs: Dict[int, Any] = {}
    rows: Dict[int, List[dict]] = {}
    timings = {"runs_s": 0.0, "pipeline_s": 0.0}

    def evaluate(n: int) -> bool:
        if n not in rows:
            t0 = time.perf_counter()
            res = run_bias_study(expand(with_count(cfg, key, n)))
            timings["runs_s"] += time.perf_counter() - t0
            timings["pipeline_s"] += float(res.timings.get("pipeline_s", 0.0))
            runs[n], rows[n] = res, _rows(cfg, name, n, res)
            if progress is not None:
                progress(n)
        return feasible(next(r for r in rows[n] if r["corrector"] == chosen), targets)

    if cap.search == "bisect":  # assumes feasibility is monotone in the count
        lo, hi = 0, len(counts) - 1
        if evaluate(counts[hi]):
            while lo < hi:
                mid = (lo + hi) // 2
                if evaluate(counts[mid]):
                    hi = mid
                else:
                    lo = mid + 1
    else:
        for n in counts:
            evaluate(n)

    if scaled is not None:  # the fixed pools of the rule's min and max are on the curve
        a, units = scaled.pipeline.channels[name].autoscale, units_per_server(scaled, name)
        for n in (a.min * units, a.max * units):
            evaluate(n)
    curve = pd.DataFrame([r for n in sorted(rows) for r in rows[n]])
    curve.insert(0, "channel", name)
    curve["feasible"] = [feasible(r, targets) for _, r in curve.iterrows()]
    recommended = _fewest(curve, chosen)
    names = list(curve.corrector.unique())
    per = pd.DataFrame({"corrector": names, "fewest": pd.Series([_fewest(curve, c) for c in names], dtype=object)})
    best_n = recommended if recommended is not None else max(rows)
    result = CapacityResult(curve=curve, channel=name, unit="GPUs" if _is_gpu(cfg, name) else "workers", key=key,
                            recommended=recommended, per_corrector=per, targets={**targets, "corrector": chosen},
                            best=runs[best_n], timings=timings)
    if scaled is not None:
        t0 = time.perf_counter()
        auto = run_bias_study(expand(with_count(scaled, key, a.min * units)))
        timings["runs_s"] += time.perf_counter() - t0
        result.autoscale = autoscale_whatif(scaled, name, rows, auto, targets)
    if cap.benchmark and cfg.pipeline.engine == "lanes":  # the figure is the lanes engine's
        result.speed = (benchmark(cfg, key, sorted(rows), timings["pipeline_s"]) if scaled is None else
                        benchmark(scaled, key, [a.min * units], float(auto.timings["pipeline_s"])))
    return result


def _fewest(curve: pd.DataFrame, corrector: str) -> Optional[int]:
    """The fewest units meeting the targets, above which every evaluated count does too."""
    sub = curve[curve.corrector == corrector].sort_values("count")
    ok = sub.feasible.to_numpy()
    if not ok.any() or not ok[-1]:
        return None
    last_bad = np.flatnonzero(~ok)
    i = last_bad[-1] + 1 if last_bad.size else 0
    return int(sub["count"].iloc[i])


def requests_per_schedule(cfg: Any) -> int:
    """Requests one schedule simulates: trials x steps x batch x sequences, summed over channels."""
    p = cfg.pipeline
    per_sample = sum(int(ch.rm.sequences_per_sample) if getattr(ch, "kind", "queue") == "gpu_rm" else 1
                     for ch in p.channels.values())
    return int(cfg.learner.trials) * int(p.steps) * int(p.batch_size) * per_sample


def raw_simpy_rate(n_requests: int, servers: int, seed: int = 0) -> float:
    """Requests per second of a bare SimPy M/M/c model: a process per request on
    a ``Resource`` of ``servers`` (the cheapest a per-request SimPy model gets)."""
    import simpy

    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0, n_requests).tolist()
    service = (rng.exponential(0.8 * servers, n_requests)).tolist()
    env = simpy.Environment()
    res = simpy.Resource(env, capacity=servers)

    def request(s):
        with res.request() as req:
            yield req
            yield env.timeout(s)

    def source():
        for g, s in zip(gaps, service):
            yield env.timeout(g)
            env.process(request(s))

    t0 = time.perf_counter()
    env.process(source())
    env.run()
    return n_requests / (time.perf_counter() - t0)


def benchmark(cfg: Any, key: str, counts: List[int], pipeline_s: float) -> Dict[str, float]:
    """Simulated requests per second of wall time: the lanes engine as the capacity run
    itself used it (``pipeline_s``: its draws and async and blocking schedules over the
    evaluated ``counts``, nothing re-run), racsim's SimPy engine of record on 2 trials of
    the middle count, and raw SimPy on a bare per-request model, all timed in this run."""
    blocking = any(n in BLOCKING for n in corrector_names(cfg))
    per = requests_per_schedule(cfg) * (2 if blocking else 1)
    total = per * len(counts)
    # racsim's SimPy engine on 2 trials of the middle count, scaled per request
    c = with_count(cfg, key, counts[len(counts) // 2])
    draws = draw(c.pipeline, 2, np.random.default_rng(0))
    t0 = time.perf_counter()
    run_simpy(draws, False)
    simpy_engine_rate = requests_per_schedule(c) / c.learner.trials * 2 / (time.perf_counter() - t0)
    sample = int(min(total, 50_000))
    raw = raw_simpy_rate(sample, servers=max(1, counts[len(counts) // 2]))
    return {
        "requests": float(total),
        "lanes_s": pipeline_s,
        "lanes_requests_per_s": total / pipeline_s,
        "simpy_engine_requests_per_s": simpy_engine_rate,
        "raw_simpy_requests_per_s": raw,
        "raw_simpy_sample": float(sample),
        "raw_simpy_s_for_all": total / raw,
        "speedup_vs_raw_simpy": (total / pipeline_s) / raw,
    }
