"""``racsim-bench``: speed figures, each as a ratio against a baseline timed in the same run.

1. Bias benchmark on the canonical 3x2 cell: racsim's vectorised trajectory
   sampling + score-function gradients vs a plain per-trajectory Python loop
   (the way a reference implementation is usually written), trajectories/s.
2. Pipeline: the lanes engine vs the SimPy engine of record on the default
   scenario's pipeline, trials/s (both produce the same schedule).
3. The default scenario end to end (``racsim`` with no arguments), seconds.
4. ``--sweep`` (alone): a 64-cell sweep through the ``racsim`` command,
   serially vs Hydra's joblib launcher on 2 processes: the speed-up, and the
   launcher overhead per job. ``--sweep --cells N``: N tiny cells as a sweep
   (racsim's sweeper) vs as one in-process grid: time to first job, cells/s.
5. ``--gpu-rm static|continuous|chunked`` (alone; ``--token-budget N``: the judge's budget):
   the judge capacity scenario's gpu_rm pipeline with that batching, simulated requests
   (sequences) per second, lanes vs SimPy on the same draws.
6. ``--capacity`` (alone): the capacity search's speed with each capacity knob on (the
   README's capacity commands), lanes requests/s against raw SimPy timed in the same run.
   ``--scale`` (alone): how one count grows with the deployment, the judge with its batch and
   its GPUs times 1, 4, 16 and 64 (the same load): seconds and requests/s against raw SimPy.
7. ``--generation`` (alone): asynchronous generation (racsim/generation/), one lane of 1,000 trainer steps
   with 64 engines x 256 sequences and 16 groups x 64 samples a step, the AReaL-like scenario and an
   engine-bound variant: seconds (wall-clock, and CPU seconds with the load average beside them); samples
   per CPU second against raw SimPy's requests, events against bare SimPy's and the SimPy engine of record's,
   timed in the same run.
8. ``--lm`` (alone): seconds per GRPO step of learner=lm's transformer on CPU at several
   sizes, racsim's loop against a plain PyTorch loop of the same update timed in the same
   run (the ratio), and time per step against parameters fitted and projected to a
   1B-parameter policy; then a scaling table: seconds per GRPO step per seed, one seed at a
   time (train_lane) against S seeds as one batch (train_lanes on BatchedTransformerPolicy),
   at several S and two model sizes, and the throughput ratio.

Machines are noisy: compare the ratios, not the absolute numbers.
"""

from __future__ import annotations

import json
import os
import time
from typing import Callable, Dict

import numpy as np
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from racsim.analyses.capacity import benchmark, channel_of, count_key, requests_per_schedule, with_count
from racsim.analyses.capacity.speed import raw_simpy_rate
from racsim.analyses.lm_study import build_task, make_policy
from racsim.analyses.sensitivity import run_capacity_sensitivity
from racsim.config.defaults import compose_config
from racsim.config.schema import RacsimConf
from racsim.config.spec import scenario
from racsim.config.validate import validate
from racsim.errors import Parser, interruptible
from racsim.generation.figures import binding, engine_split, trainer_split
from racsim.generation.schedule import AsyncRun
from racsim.generation.simpy_lane import simulate_lane_simpy
from racsim.io import small_pages
from racsim.progress import Progress
from racsim.learner import mdp as M
from racsim.learner.correctors import BLOCKING, CorrectorParams
from racsim.learner.grpo import train_lane, train_lanes
from racsim.learner.rollouts import (
    discounted_returns,
    sample_trajectories,
    score_gradient,
)
from racsim.pipeline.draws import draw
from racsim.pipeline.lanes import run_lanes
from racsim.pipeline.schedule import DROPPED, INJECTED
from racsim.pipeline.simpy_engine import run_simpy
from racsim.analyses.dispatch import run


def spec_of(*overrides: str) -> RacsimConf:
    """The spec ``racsim OVERRIDES...`` runs: composed (racsim.config.defaults.compose_config), then
    checked and typed at the config boundary (racsim.config.spec.scenario)."""
    return scenario(compose_config(*overrides))


def _best_of(fn: Callable[[], object], repeat: int) -> float:
    best = np.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def loop_gradients(mdp: M.TabularMDP, pi: np.ndarray, n: int, horizon: int, rng: np.random.Generator) -> np.ndarray:
    """Baseline: one trajectory at a time, one step at a time, in Python; (n, S, A),
    the quantity :func:`vector_gradients` computes (in distribution: other draws)."""
    S, A = pi.shape
    rewards = mdp.reward_total
    out = np.zeros((n, S, A))
    for i in range(n):
        s = rng.choice(S, p=mdp.start)
        traj = []
        for _ in range(horizon):
            a = rng.choice(A, p=pi[s])
            traj.append((s, a, rewards[s, a]))
            s = rng.choice(S, p=mdp.P[s, a])
        G = 0.0
        for s, a, r in reversed(traj):
            G = r + mdp.gamma * G
            out[i, s] -= pi[s] * G / horizon
            out[i, s, a] += G / horizon
    return out


def vector_gradients(mdp: M.TabularMDP, pi: np.ndarray, n: int, horizon: int, rng: np.random.Generator) -> np.ndarray:
    """racsim's way: trajectories sampled in bulk, then the one score gradient; (n, S, A)."""
    states, actions = sample_trajectories(mdp, pi, n, horizon, rng)
    r = mdp.reward_total[states, actions]
    return score_gradient(states, actions, discounted_returns(r, mdp.gamma), pi)


def bench_bias(n_vec: int, n_loop: int, horizon: int = 50) -> Dict[str, float]:
    mdp = M.make_mdp(3, 2, mdp_seed=1337, shares=(0.5, 0.5))
    pi = M.softmax_policy(M.canonical_theta(3, 2))
    t_loop = _best_of(lambda: loop_gradients(mdp, pi, n_loop, horizon, np.random.default_rng(0)), 1)
    t_vec = _best_of(lambda: vector_gradients(mdp, pi, n_vec, horizon, np.random.default_rng(0)), 3)
    loop_rate, vec_rate = n_loop / t_loop, n_vec / t_vec
    return {
        "bias_loop_traj_per_s": loop_rate,
        "bias_vector_traj_per_s": vec_rate,
        "bias_speedup": vec_rate / loop_rate,
        "cell_1000_traj_s": 1000 / vec_rate,
    }


def bench_pipeline(trials: int, overrides=()) -> Dict[str, float]:
    """The default scenario's pipeline (or the one ``overrides`` compose: a capacity scenario,
    ``pipeline.arrivals.mode=stream``...), asynchronous, in both engines on the same draws:
    trials and simulated requests (trials x steps x batch x channels) per second."""
    cfg = spec_of(*overrides)
    validate(cfg)
    draws = draw(cfg.pipeline, trials, np.random.default_rng(0))
    t_simpy = _best_of(lambda: run_simpy(draws, False), 1)
    t_lanes = _best_of(lambda: run_lanes(draws, False), 3)
    requests = draws.phase[0].size * cfg.pipeline.batch_size * len(cfg.pipeline.channels)
    out = {
        "pipeline_simpy_trials_per_s": trials / t_simpy,
        "pipeline_lanes_trials_per_s": trials / t_lanes,
        "pipeline_speedup": t_simpy / t_lanes,
    }
    if overrides:
        out.update({"pipeline_simpy_requests_per_s": requests / t_simpy,
                    "pipeline_lanes_requests_per_s": requests / t_lanes})
    return out


def bench_gpu_rm(trials: int, batching: str = "static", chunked: bool = False, budget: int = None) -> Dict[str, float]:
    """The judge scenario's pipeline (8B RM on 4 H100s, 1024 sequences a step) with
    ``rm.batching``, ``rm.chunked_prefill`` and ``rm.token_budget`` (None: the scenario's) as
    given: simulated requests (sequences scored) per second, lanes engine vs the SimPy engine,
    on the same draws."""
    rm = "pipeline.channels.judge.rm"
    cfg = spec_of("scenario=capacity/judge_rm_h100", f"{rm}.batching={batching}",
                  f"{rm}.chunked_prefill={str(chunked).lower()}",
                  *([f"{rm}.token_budget={budget}"] if budget is not None else []))
    validate(cfg)
    draws = draw(cfg.pipeline, trials, np.random.default_rng(0))
    requests = draws.service["judge"].size
    t_simpy = _best_of(lambda: run_simpy(draws, False), 1)
    t_lanes = _best_of(lambda: run_lanes(draws, False), 3)
    tag = f"gpu_rm_{batching}{'_chunked' if chunked else ''}{'' if budget is None else f'_budget{budget}'}"
    return {
        f"{tag}_simpy_req_per_s": requests / t_simpy,
        f"{tag}_lanes_req_per_s": requests / t_lanes,
        f"{tag}_speedup": t_simpy / t_lanes,
    }


J = "pipeline.channels.judge"
V = "pipeline.channels.verifier"
JUDGE, VERIFIER = "scenario=capacity/judge_rm_h100", "scenario=capacity/code_verifier"
CHUNKED = [f"{J}.rm.batching=continuous", f"{J}.rm.chunked_prefill=true"]
# Every capacity knob of the README's capacity section, as its command composes it (run from the
# repository's root: the preemption scenario reads scenarios/capacity/preemptions.csv).
CAPACITY_KNOBS = {
    "judge, static batches": [JUDGE],
    "judge, continuous batching": [JUDGE, f"{J}.rm.batching=continuous"],
    "judge, chunked prefill, budget 4096": [JUDGE, *CHUNKED, f"{J}.rm.token_budget=4096"],
    "judge, chunked prefill, budget 1024": [JUDGE, *CHUNKED, f"{J}.rm.token_budget=1024"],
    "judge, bursts": [JUDGE, f"{J}.degraded_factor=2", f"{J}.p_degrade=0.05", f"{J}.p_recover=0.2"],
    "judge, poisson arrivals": [JUDGE, "pipeline.arrivals.mode=poisson"],
    "judge, failures": ["scenario=capacity/judge_rm_faults"],
    "judge, preemption schedule": ["scenario=capacity/judge_rm_preempt"],
    "judge, autoscaled": ["scenario=capacity/judge_rm_autoscale"],
    "judge, autoscaled, poisson arrivals": ["scenario=capacity/judge_rm_autoscale", "pipeline.arrivals.mode=poisson"],
    "verifier": [VERIFIER],
    "verifier, routing 0.5": [VERIFIER, f"{V}.route_prob=0.5"],
    "verifier, cancel_on_drop": [VERIFIER, f"{V}.cancel_on_drop=true"],
    "verifier, poisson arrivals": [VERIFIER, "pipeline.arrivals.mode=poisson"],
    "verifier, worker failures": [VERIFIER, f"{V}.faults.mtbf_s=600", f"{V}.faults.mttr_s=60"],
}


def bench_capacity(overrides, trials: int = None) -> Dict[str, float]:
    """The capacity search's speed figures on the config ``overrides`` compose, at the middle of its
    ``capacity.counts`` (an autoscaled pool: its rule): the lanes engine's draws and asynchronous
    (and, with a blocking corrector, blocking) schedules, as the capacity run simulates each count,
    against racsim's SimPy engine and raw SimPy timed in the same call (:func:`benchmark`)."""
    cfg = spec_of(*overrides, *([f"learner.trials={trials}"] if trials else []))
    validate(cfg)
    key = count_key(cfg, channel_of(cfg))
    counts = sorted(set(int(n) for n in cfg.capacity.counts))
    count = counts[len(counts) // 2]
    c = with_count(cfg, key, count)
    blocking = any(n in BLOCKING for n in c.corrector.names)
    with small_pages():  # as racsim.compute runs a count
        t0 = time.perf_counter()
        draws = draw(c.pipeline, int(c.learner.trials), np.random.default_rng(0))
        run_lanes(draws, False)
        if blocking:
            run_lanes(draws, True, c.corrector.wait_timeout_s)
        seconds = time.perf_counter() - t0
    return {"count": float(count), **benchmark(c, key, count, requests_per_schedule(c) * (2 if blocking else 1),
                                               seconds)}


def bench_capacity_knobs(trials: int = None, progress: Progress = None) -> Dict[str, float]:
    """:func:`bench_capacity` on every knob of :data:`CAPACITY_KNOBS`, a table row each as it goes
    (``progress``: a unit per knob; the rows printed past its bar)."""
    progress = progress or Progress.off()
    out: Dict[str, float] = {}
    progress.start("capacity knobs", len(CAPACITY_KNOBS), "knob")
    progress.say(f"{'capacity knob':<38} {'count':>5} {'lanes req/s':>12} {'raw SimPy':>10} {'x raw':>6} "
                 f"{'SimPy engine':>12}  >= 1e6")
    for label, overrides in CAPACITY_KNOBS.items():
        progress.note(label)
        f = bench_capacity(overrides, trials)
        rate, raw, eng = f["lanes_requests_per_s"], f["raw_simpy_requests_per_s"], f["simpy_engine_requests_per_s"]
        progress.say(f"{label:<38} {f['count']:>5.0f} {rate:>12.3g} {raw:>10.3g} {rate / raw:>6.1f} {eng:>12.3g}  "
                     f"{'yes' if rate >= 1e6 else 'no'}")
        progress.advance()
        tag = label.replace(", ", "_").replace(" ", "_")
        out.update({f"capacity_{tag}_{k}": v for k, v in f.items()})
    return out


SCALES = (1, 4, 16, 64)  # --scale: the judge's deployment times these (sequences per step and GPUs)


def bench_capacity_scale(scales=SCALES, trials: int = 10, progress: Progress = None) -> Dict[str, float]:
    """How a capacity count's simulation grows with the deployment: the judge scenario with
    ``pipeline.batch_size`` and the count (5 GPUs, its answer) both times each of ``scales``, so that
    the load stays the same; per scale :func:`bench_capacity`'s figures (lanes requests/s against raw
    SimPy timed in the same call) and the seconds one count takes, a table row each as it goes
    (``progress``: a unit per scale)."""
    progress = progress or Progress.off()
    base = spec_of(JUDGE)
    batch, per = int(base.pipeline.batch_size), int(base.pipeline.channels["judge"].rm.sequences_per_sample)
    out: Dict[str, float] = {}
    progress.start("scales", len(scales), "scale")
    progress.say(f"{'scale':>5} {'sequences/step':>14} {'GPUs':>5} {'requests':>10} {'lanes s':>8} {'lanes req/s':>12} "
                 f"{'raw SimPy':>10} {'x raw':>6}")
    for k in scales:
        progress.note(f"the judge times {k}")
        f = bench_capacity([JUDGE, f"pipeline.batch_size={batch * k}", f"capacity.counts=[{5 * k}]"], trials)
        rate, raw = f["lanes_requests_per_s"], f["raw_simpy_requests_per_s"]
        progress.say(f"{k:>5} {batch * per * k:>14,} {f['count']:>5.0f} {f['requests']:>10.3g} {f['lanes_s']:>8.2f} "
                     f"{rate:>12.3g} {raw:>10.3g} {rate / raw:>6.1f}")
        progress.advance()
        out.update({f"scale_{k}_{key}": v for key, v in f.items()})
    return out


def bench_capacity_workers(scenarios=(JUDGE, "scenario=capacity/judge_rm_faults"), repeat: int = 2,
                           workers: int = 0, progress: Progress = None) -> Dict[str, float]:
    """A whole capacity search's wall-clock (counts, and the sensitivity table where the scenario has
    one; no speed figure), its counts one at a time (capacity.workers=1) against side by side
    (``workers``; 0: every usable core where it pays), alternated ``repeat`` times, best of each: the
    same answer, and the ratio, a table row per scenario (``progress``: a unit per search)."""
    progress = progress or Progress.off()
    out: Dict[str, float] = {}
    progress.start("capacity searches", len(scenarios) * repeat * 2, "search")
    progress.say(f"{'scenario':<34} {'answer':>6} {'one at a time s':>16} {f'workers={workers} s':>12} {'ratio':>6}")
    for scen in scenarios:
        best = {1: np.inf, workers: np.inf}
        answer = set()
        for _ in range(repeat):
            for w in best:
                progress.note(f"{scen.split('/')[-1]}, capacity.workers={w}")
                cfg = spec_of(scen, "capacity.benchmark=false", f"capacity.workers={w}")
                t0 = time.perf_counter()
                answer.add(run_capacity_sensitivity(cfg).recommended)
                best[w] = min(best[w], time.perf_counter() - t0)
                progress.advance()
        tag = scen.split("/")[-1]
        progress.say(f"{tag:<34} {'/'.join(map(str, sorted(answer))):>6} {best[1]:>16.2f} {best[workers]:>12.2f} "
                     f"{best[1] / best[workers]:>6.2f}")
        out.update({f"workers_{tag}_one_s": best[1], f"workers_{tag}_pool_s": best[workers],
                    f"workers_{tag}_ratio": best[1] / best[workers]})
    return out


def bench_default() -> Dict[str, float]:
    cfg = spec_of("output.plots=false")
    t0 = time.perf_counter()
    res = run(cfg)
    return {"default_scenario_s": time.perf_counter() - t0, "default_trajectories": float(res.bias.trajectories)}


# Each cell of the sweep benchmark: a small bias benchmark, no training, no plots.
SWEEP_CELL = ("learner.bootstrap=200", "learner.train.enabled=false", "output.plots=false", "output.progress=false")


def bench_sweep(n_seeds: int = 16, trials: int = 500, n_jobs: int = 2, keep: str = None) -> Dict[str, float]:
    """A sweep of ``4 * n_seeds`` cells (seed x corrector.tau_age) through the
    ``racsim`` command, serially (Hydra's basic launcher) and with the joblib
    launcher on ``n_jobs`` processes. The launcher overhead per job is the
    process time not spent inside jobs: (wall x workers - sum of the jobs'
    own runtimes, from their done.json) / jobs, Hydra's per-job config
    composition and the interpreter start included. ``keep``: a folder to
    leave the two sweeps in (default: a temporary one, removed)."""
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    cells = [f"seed=range({n_seeds})", "corrector.tau_age=20,100,1000,inf"]
    n = 4 * n_seeds
    out: Dict[str, float] = {"sweep_jobs": float(n), "sweep_trials_per_job": float(trials)}
    with tempfile.TemporaryDirectory(prefix="racsim-bench-") as tmp:
        if keep:
            tmp = str(Path(keep).resolve())
            Path(tmp).mkdir(parents=True, exist_ok=True)
        runs = {"serial": (1, []), "joblib": (n_jobs, ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={n_jobs}"])}
        tables = {}
        for name, (workers, launcher) in runs.items():
            sweep = Path(tmp) / name
            cmd = [sys.executable, "-m", "racsim", "-m", *launcher, *cells, f"learner.trials={trials}", *SWEEP_CELL,
                   f"hydra.sweep.dir={sweep}"]
            t0 = time.perf_counter()
            subprocess.run(cmd, cwd=tmp, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wall = time.perf_counter() - t0
            inside = sum(json.loads(p.read_text())["runtime_s"] for p in sweep.glob("*/done.json"))
            out[f"sweep_{name}_s"] = wall
            out[f"sweep_{name}_job_s"] = inside / n
            out[f"sweep_{name}_overhead_per_job_s"] = (wall * workers - inside) / n
            tables[name] = (sweep / "results.parquet").read_bytes()
    out["sweep_speedup"] = out["sweep_serial_s"] / out["sweep_joblib_s"]
    out["sweep_results_identical"] = float(tables["serial"] == tables["joblib"])
    return out


def bench_sweep_cells(cells: int, trials: int = 20, keep: str = None, budget_s: float = None) -> Dict[str, float]:
    """``cells`` tiny cells (seed x 4 values of corrector.tau_age; ``trials`` trials of 8
    steps, no training) two ways, timed in the same run: one ``racsim`` run of an
    in-process ``study.grid`` (one process, ``study.workers=1``), and a sweep of them
    through the ``racsim`` command (racsim's sweeper and launcher, one job per cell).
    The sweep's time to first job is from the command's start to its job 0's folder;
    its cells/s count the whole command (start-up, every cell checked, the jobs, the
    final gathering) and, apart, the jobs alone (first job start to last job end).
    ``budget_s``: stop the sweep (SIGINT, as Ctrl-C) after that many seconds and time
    the in-process grid on as many cells as the sweep completed: the rates then come
    from the cells that ran, the time to first job from the whole sweep's start."""
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    import signal

    n_seeds = max(cells // 4, 1)
    n = 4 * n_seeds
    tiny = [f"learner.trials={trials}", "learner.bootstrap=20", "pipeline.steps=8", *SWEEP_CELL]
    out: Dict[str, float] = {"cells": float(n), "cell_trials": float(trials)}
    with tempfile.TemporaryDirectory(prefix="racsim-bench-") as tmp:
        if keep:
            tmp = str(Path(keep).resolve())
            Path(tmp).mkdir(parents=True, exist_ok=True)
        sweep = Path(tmp) / "sweep"
        cmd = [sys.executable, "-m", "racsim", "-m", f"seed=range({n_seeds})", "corrector.tau_age=20,100,1000,inf",
               *tiny, f"hydra.sweep.dir={sweep}"]
        t0 = time.perf_counter()
        # SIGINT at its default in the sweep (Ctrl-C ends it at the budget), even when this command was
        # started with it ignored (in the background): a Python started so keeps ignoring it
        proc = subprocess.Popen(cmd, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        first = None
        while proc.poll() is None:
            if first is None and (sweep / "0" / ".hydra").is_dir():
                first = time.perf_counter() - t0
            if budget_s is not None and time.perf_counter() - t0 > budget_s:
                proc.send_signal(signal.SIGINT)
                proc.wait()
                break
            time.sleep(0.02)
        wall = time.perf_counter() - t0
        if proc.returncode not in (0, 130):
            raise RuntimeError(f"the sweep failed (exit {proc.returncode}): {' '.join(cmd[:8])} ...")
        markers = sorted(sweep.glob("*/done.json"), key=lambda p: p.stat().st_mtime)
        jobs_s = markers[-1].stat().st_mtime - (sweep / "0" / ".hydra").stat().st_mtime
    ran = len(markers)
    grid_seeds = ",".join(map(str, range(max(ran // 4, 1))))
    grid_cfg = spec_of(*tiny, f"+study.grid={{seed: [{grid_seeds}], corrector.tau_age: [20, 100, 1000, inf]}}")
    t0 = time.perf_counter()
    res = run(grid_cfg)
    grid_s = time.perf_counter() - t0
    grid_rate = int(res.results["cell"].nunique()) / grid_s
    out.update({
        "sweep_cells_completed": float(ran),
        "sweep_first_job_s": first if first is not None else wall,
        "sweep_s": wall,
        "sweep_cells_per_s": ran / wall,
        "sweep_jobs_cells_per_s": ran / jobs_s,
        "grid_in_process_cells": float(res.results["cell"].nunique()),
        "grid_in_process_s": grid_s,
        "grid_in_process_cells_per_s": grid_rate,
        "sweep_vs_grid_rate": (ran / jobs_s) / grid_rate,
    })
    return out


LM_SIZES = ((1, 32), (2, 64), (4, 128), (4, 256))  # (layers, d_model) of --lm's GPT-2 policies
PROJECT_PARAMS = 1e9


def plain_grpo_steps(model, prompts, task, steps: int, P: int, G: int, lr: float, seed: int) -> None:
    """``steps`` synchronous GRPO updates in plain PyTorch, the update racsim's sync_oracle
    makes: P prompts x G responses sampled token by token with the KV cache
    (torch.multinomial), the true reward, group-relative advantages, teacher-forced
    log-probs of the response, loss -sum(A log pi) / PG, Adam."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    table = torch.as_tensor(task.true_table)
    prompt_t = torch.as_tensor(prompts)
    V, L, lp0 = task.vocab, task.response_len, prompts.shape[1]
    for _ in range(steps):
        x = torch.randint(0, len(prompts), (P,), generator=gen).repeat_interleave(G)
        with torch.no_grad():
            out = model(input_ids=prompt_t[x], use_cache=True)
            toks = []
            for j in range(L):
                tok = torch.multinomial(torch.softmax(out.logits[:, -1, :V], -1), 1, generator=gen)
                toks.append(tok)
                if j + 1 < L:
                    out = model(input_ids=tok, past_key_values=out.past_key_values, use_cache=True)
        y = torch.cat(toks, 1)
        r = table[x[:, None], torch.arange(L)[None], y].sum(1).view(P, G)
        adv = (r - r.mean(1, keepdim=True)).view(-1)
        seq = torch.cat([prompt_t[x], y], 1)
        logits = model(input_ids=seq).logits[:, lp0 - 1: -1, :V].float()
        logp = torch.log_softmax(logits, -1).gather(-1, y[..., None]).squeeze(-1).sum(-1)
        opt.zero_grad()
        (-(adv.to(logp.dtype) * logp).sum() / (P * G)).backward()
        opt.step()


def _lm_task(layers: int, width: int):
    """(learner.lm, prompts per step, group size, task) of the default LM scenario at a model size, on the CPU."""
    cfg = spec_of("learner=lm", f"learner.lm.layers={layers}", f"learner.lm.d_model={width}", "learner.lm.device=cpu")
    validate(cfg)
    return cfg.learner.lm, cfg.pipeline.batch_size, cfg.learner.lm.group_size, build_task(cfg.learner.lm)


def bench_lm(steps: int, sizes=LM_SIZES, repeat: int = 3) -> Dict[str, float]:
    """Seconds per GRPO step (the default LM task and batch: learner.lm's prompts, responses
    and group, pipeline.batch_size prompts; sync_oracle, every slow result in its own step)
    of racsim's loop (racsim.learner.grpo.train_lane on the transformer policy) and of
    :func:`plain_grpo_steps` on the same model, alternated ``repeat`` times, best of each;
    then a least-squares line of racsim's time per step against parameters, projected to
    PROJECT_PARAMS, and the slope of log time against log parameters."""
    out: Dict[str, float] = {}
    params, per_step = [], []
    for layers, width in sizes:
        lm, P, G, task = _lm_task(layers, width)
        zero = np.zeros((steps, P, 1), dtype=np.int64)
        land = np.broadcast_to(np.arange(steps)[:, None, None], zero.shape)
        policy = make_policy(lm, task, 0)  # the transformer (learner.lm.policy's default): torch loads here
        ours = plain = np.inf
        for _ in range(repeat):  # alternated: the two share the machine's load
            ours = min(ours, _best_of(lambda: train_lane(policy, task, zero, zero.astype(np.int8), land, "sync_oracle",
                                                         CorrectorParams(), [1.0], G, 0.0, np.random.default_rng(0)), 1))
            plain = min(plain, _best_of(lambda: plain_grpo_steps(policy.model, task.prompts, task, steps, P, G, lm.lr, 0),
                                        1))
        tag = f"lm_{layers}x{width}"
        out.update({f"{tag}_params": float(policy.n_params), f"{tag}_racsim_s_per_step": ours / steps,
                    f"{tag}_plain_s_per_step": plain / steps, f"{tag}_ratio_vs_plain": ours / plain})
        params.append(policy.n_params)
        per_step.append(ours / steps)
    slope, intercept = np.polyfit(params, per_step, 1)
    out["lm_fit_s_per_step_per_million_params"] = slope * 1e6
    out["lm_fit_intercept_s"] = intercept
    out["lm_loglog_slope"] = float(np.polyfit(np.log(params), np.log(per_step), 1)[0])
    out["lm_projected_s_per_step_1B"] = intercept + slope * PROJECT_PARAMS
    return out


LM_BATCH_SIZES = ((2, 64), (4, 128))  # (layers, d_model): the default policy and a wider, deeper one
LM_BATCH_SEEDS = (1, 8, 64)


def _lm_lane_schedule(steps: int, P: int, lane: int):
    """A late schedule (K = 1) for the batch benchmark: delays 0..2 steps, a fifth dropped,
    different per lane (so the batch's late rows are padded)."""

    rng = np.random.default_rng(1000 + lane)
    status = np.where(rng.random((steps, P, 1)) < 0.2, DROPPED, INJECTED).astype(np.int8)
    delay = np.where(status == INJECTED, rng.integers(0, 3, (steps, P, 1)), -1)
    return delay, status, np.where(status == INJECTED, np.arange(steps)[:, None, None] + delay, -1)


def bench_lm_batch(steps: int, sizes=LM_BATCH_SIZES, seeds=LM_BATCH_SEEDS, repeat: int = 2,
                   progress: Progress = None) -> Dict[str, float]:
    """Seconds per GRPO step per seed of learner=lm's transformer (the default task and batch,
    rac on a late schedule with drops, Adam, one thread): one seed at a time (train_lane on
    TransformerPolicy) against S seeds as one batch (train_lanes on BatchedTransformerPolicy:
    time / (steps x S)), and the throughput ratio, per model size and S. The runs alternate
    ``repeat`` times, best of each, timed as the process's CPU time (one thread: the work
    done, less sensitive than wall time to other jobs on a shared machine; wall time is
    recorded too). Building the models and a first step of each run are not timed."""
    from racsim.learner.lm import BatchedTransformerPolicy, TransformerPolicy  # lazy: torch for --lm only

    out: Dict[str, float] = {}
    rows = []
    for layers, width in sizes:
        lm, P, G, task = _lm_task(layers, width)
        scheds = [_lm_lane_schedule(steps, P, lane) for lane in range(max(seeds))]
        first = [(d[:1], st[:1], land[:1]) for d, st, land in scheds]
        single = TransformerPolicy(task.prompts, lm.vocab, lm.response_len, lm, lm.init_seed)
        batches = {S: BatchedTransformerPolicy(task.prompts, lm.vocab, lm.response_len, lm,
                                               [lm.init_seed + s for s in range(S)]) for S in seeds}

        def train(S: int, sched) -> None:
            if S == 0:
                train_lane(single, task, *sched[0], "rac", CorrectorParams(), [1.0], G, 0.0, np.random.default_rng(0))
            else:
                train_lanes(batches[S], task, *zip(*sched[:S]), "rac", CorrectorParams(), [1.0], G, 0.0,
                            [np.random.default_rng(s) for s in range(S)])

        cpu = {S: np.inf for S in (0,) + tuple(seeds)}
        wall = dict(cpu)
        for S in cpu:
            train(S, first)  # untimed: first-call costs
        for _ in range(repeat):  # alternated: the runs share the machine's load
            for S in cpu:
                c0, w0 = time.process_time(), time.perf_counter()
                train(S, scheds)
                per = steps * max(S, 1)
                cpu[S] = min(cpu[S], (time.process_time() - c0) / per)
                wall[S] = min(wall[S], (time.perf_counter() - w0) / per)
        del batches
        tag = f"lm_batch_{layers}x{width}"
        out[f"{tag}_params"] = float(single.n_params)
        out[f"{tag}_one_at_a_time_cpu_s_per_step"] = cpu[0]
        out[f"{tag}_one_at_a_time_wall_s_per_step"] = wall[0]
        for S in seeds:
            out[f"{tag}_S{S}_cpu_s_per_step_per_seed"] = cpu[S]
            out[f"{tag}_S{S}_wall_s_per_step_per_seed"] = wall[S]
            out[f"{tag}_S{S}_ratio"] = cpu[0] / cpu[S]
            rows.append((f"{layers}x{width}", S, cpu[0], cpu[S], cpu[0] / cpu[S], wall[0] / wall[S]))
    say = (progress or Progress.off()).say
    say("learner=lm, CPU seconds per GRPO step per seed: one seed at a time vs S seeds as one batch")
    say(f"{'model':>8} {'S':>4} {'one-at-a-time':>14} {'batched/seed':>13} {'ratio':>7} {'wall ratio':>11}")
    for m, S, a, b, r, rw in rows:
        say(f"{m:>8} {S:>4} {a:>14.4f} {b:>13.4f} {r:>7.2f} {rw:>11.2f}")
    return out


# --generation: the shipped AReaL-like scenario at the size, 64 engines x 256 sequences, 16 groups x 64
# samples a step, 1,000 trainer steps (racsim/generation/); the engine-bound variant has no admission cap, a
# queue of 32 groups and a trainer 4 times faster, so that the engines never wait.
GENERATION = ("scenario=async/areal", "pipeline.batch_size=1024", "pipeline.generation.group_size=64",
              "pipeline.generation.engines.gpus=64", "pipeline.generation.engines.concurrency=256",
              "pipeline.generation.trainer.gpus=64")
ENGINE_BOUND = ("pipeline.generation.admission.rule=none", "pipeline.generation.queue.capacity=32",
                "pipeline.generation.trainer.gpus=256")


def raw_simpy_events(n: int) -> float:
    """Events per CPU second of bare SimPy: one process waiting on ``n`` timeouts (the cheapest event it has)."""
    import simpy

    env = simpy.Environment()

    def proc():
        for _ in range(n):
            yield env.timeout(1.0)

    env.process(proc())
    t0 = time.process_time()
    env.run()
    return n / (time.process_time() - t0)


def bench_generation(steps: int = 1000, simpy_steps: int = 20, overrides=(),
                     tag: str = "generation") -> Dict[str, float]:
    """One lane of asynchronous generation at the issue's size (:data:`GENERATION` and ``overrides``) for
    ``steps`` trainer steps: its draws and the fast engine's event loop in seconds, wall-clock and this
    process's CPU seconds, with the machine's 1-minute load average as it starts; then, per CPU second of
    this process (what a machine busy with other work changes least) and timed in this run, the samples
    (sequences) it simulated against raw SimPy's requests (a process per request on a Resource of one
    engine's slots: the cheapest a per-request SimPy model gets, racsim.analyses.capacity.speed), and the
    events it delivered against bare SimPy timeouts and the SimPy engine of record (on the first
    ``simpy_steps`` steps, the same events); and the regime (which side binds)."""
    cfg = spec_of(*GENERATION, *overrides, f"pipeline.steps={steps}")
    validate(cfg)
    load = os.getloadavg()[0]
    t0, c0 = time.perf_counter(), time.process_time()
    run = AsyncRun(cfg.pipeline, 1, np.random.default_rng(0), "lanes")
    trace = run.run_lane(0, "fast")
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    rec = run.record([trace], "fast")
    short = AsyncRun(spec_of(*GENERATION, *overrides, f"pipeline.steps={simpy_steps}").pipeline, 1,
                     np.random.default_rng(0), "lanes")
    first = short.run_lane(0, "fast")
    x = short.inputs(0, "fast", first.groups_admitted)  # the groups it admitted: the same lane in SimPy
    c1 = time.process_time()
    simulate_lane_simpy(x)
    simpy_rate = first.events / (time.process_time() - c1)
    samples = trace.groups_admitted * run.S
    raw = raw_simpy_rate(50_000, servers=int(cfg.pipeline.generation.engines.concurrency), clock=time.process_time)
    trainer, engines = trainer_split(rec), engine_split(rec)
    return {f"{tag}_steps": float(steps), f"{tag}_s": seconds, f"{tag}_cpu_s": cpu, f"{tag}_load_1min": load,
            f"{tag}_samples": float(samples), f"{tag}_samples_per_cpu_s": samples / cpu,
            f"{tag}_raw_simpy_requests_per_cpu_s": raw, f"{tag}_speedup_vs_raw_simpy": samples / cpu / raw,
            f"{tag}_events": float(trace.events), f"{tag}_events_per_cpu_s": trace.events / cpu,
            f"{tag}_bare_simpy_events_per_cpu_s": raw_simpy_events(200_000),
            f"{tag}_simpy_engine_events_per_cpu_s": simpy_rate,
            f"{tag}_speedup_vs_simpy_engine": trace.events / cpu / simpy_rate,
            f"{tag}_engines_idle": engines["idle"], f"{tag}_trainer_waiting": trainer["waiting"],
            f"{tag}_binds_{binding(trainer['waiting'], engines['idle'])}": 1.0}


PAPER_HEAVY_TAIL_S = 945.0  # the paper's reported time for its heavy-tail grid, one CPU thread


def bench_heavy_tail() -> Dict[str, float]:
    """The paper's heavy-tail grid (225 cells x 1000 trials of 50 steps) end to end,
    against a per-trajectory Python loop timed here on the same trajectories' size."""
    cfg = spec_of("scenario=paper/heavy_tail", "output.progress=false")
    t0 = time.perf_counter()
    res = run(cfg)
    took = time.perf_counter() - t0
    cells = int(res.results["cell"].nunique())
    trials = int(res.results["trials"].iloc[0])
    loop_rate = bench_bias(1_000, 500)["bias_loop_traj_per_s"]
    return {
        "heavy_tail_grid_s": took,
        "heavy_tail_cells": float(cells),
        "heavy_tail_paper_trajectories": float(cells * trials),  # the paper's unit: one 50-step run
        "heavy_tail_paper_trajectories_per_s": cells * trials / took,
        "heavy_tail_sampled_trajectories": float(res.trajectories),
        "heavy_tail_loop_projection_s": res.trajectories / loop_rate,
        "heavy_tail_speedup_vs_loop": res.trajectories / loop_rate / took,
        "heavy_tail_speedup_vs_paper_945s": PAPER_HEAVY_TAIL_S / took,
    }


@interruptible("racsim-bench", "interrupted; no figures written")
def main(argv=None) -> None:
    ap = Parser(prog="racsim-bench", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    ap.add_argument("--sweep", action="store_true",
                    help="only the sweep benchmark: 64 cells serially vs the joblib launcher on 2 processes")
    ap.add_argument("--keep", help="--sweep: leave the two sweeps in this folder")
    ap.add_argument("--trials", type=int, default=None,
                    help="--sweep: trials per cell (default 500; 20 with --cells)")
    ap.add_argument("--cells", type=int, default=None,
                    help="--sweep: a sweep of this many tiny cells through racsim's sweeper, against the same "
                         "cells as one in-process study.grid: time to first job, cells per second")
    ap.add_argument("--budget", type=float, default=None,
                    help="--sweep --cells: stop the sweep after this many seconds; rates from the cells that ran")
    ap.add_argument("--paper", action="store_true", help="only the paper's heavy-tail grid")
    ap.add_argument("--set", nargs="+", default=(), metavar="OVERRIDE",
                    help="only the pipeline benchmark, on the config these overrides compose, e.g. "
                         "--set scenario=capacity/code_verifier pipeline.arrivals.mode=stream")
    ap.add_argument("--gpu-rm", choices=("static", "continuous", "chunked"), default=None,
                    help="only the judge scenario's gpu_rm pipeline with this batching (chunked: continuous with "
                         "chunked prefill): requests/s, lanes vs SimPy")
    ap.add_argument("--token-budget", type=int, default=None,
                    help="--gpu-rm: the judge's rm.token_budget (default: the scenario's 32768)")
    ap.add_argument("--capacity", action="store_true",
                    help="only the capacity search's speed on every capacity knob of the README (each at the "
                         "middle of its scenario's counts): lanes requests/s vs raw SimPy timed in the same run; "
                         "run from the repository's root; --trials N: trials per knob (default: the scenario's)")
    ap.add_argument("--scale", action="store_true",
                    help="only how one capacity count's simulation grows: the judge with its batch and GPUs times "
                         f"{', '.join(map(str, SCALES))} (--quick: 1, 4), seconds and requests/s against raw SimPy "
                         "timed in the same run; --trials N: trials per scale (default 10)")
    ap.add_argument("--workers", action="store_true",
                    help="only a whole capacity search's wall-clock (judge_rm_h100 with its sensitivity table, "
                         "judge_rm_faults; --quick: the judge alone, once), counts one at a time vs side by side "
                         "(capacity.workers=0), alternated in the same run")
    ap.add_argument("--lm", action="store_true",
                    help="only learner=lm's GRPO step on CPU: racsim's loop vs a plain PyTorch loop of the same "
                         "update at several model sizes, and the time per step fitted against parameters and "
                         "projected to 1B parameters; then seconds per step per seed, one seed at a time vs S seeds "
                         "as one batch, at S = 1, 8, 64 and two sizes (needs the rm extra: torch, transformers)")
    ap.add_argument("--generation", action="store_true",
                    help="only asynchronous generation: one lane of 1,000 trainer steps, 64 engines x 256 sequences, "
                         "16 groups x 64 samples a step (--quick: 100 steps), the AReaL-like scenario and an "
                         "engine-bound variant: seconds and events/s against bare SimPy timed in the same run")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    if args.trials is not None and args.trials < 2:
        ap.error(f"--trials {args.trials}: an integer >= 2")
    if args.json and (os.path.isdir(args.json) or not os.path.isdir(os.path.dirname(os.path.abspath(args.json)))):
        ap.error(f"--json {args.json}: a file path in an existing folder")
    n_vec, n_loop, trials = (20_000, 200, 50) if args.quick else (200_000, 2_000, 300)
    if args.set:
        try:
            validate(spec_of(*args.set))
        except (ValueError, HydraException, OmegaConfBaseException) as e:  # ValueError: racsim's ConfigError
            ap.error(f"--set {' '.join(args.set)}: {e}")
    if args.sweep and args.cells is not None:
        if args.budget is not None and not args.budget > 0:
            ap.error(f"--budget {args.budget}: a positive number of seconds")
        if args.cells < 4:
            ap.error(f"--cells {args.cells}: at least 4 (seeds x 4 values of corrector.tau_age)")

    def gpu_rm() -> Dict[str, float]:
        chunked = args.gpu_rm == "chunked"
        try:
            return bench_gpu_rm(10 if args.quick else 50, "continuous" if chunked else args.gpu_rm, chunked,
                                args.token_budget)
        except ValueError as e:  # racsim's ConfigError: a token budget the judge cannot take
            ap.error(f"--token-budget {args.token_budget}: {e}")

    def lm(fn: Callable[[], Dict[str, float]]) -> Callable[[], Dict[str, float]]:
        def run_it() -> Dict[str, float]:
            try:
                return fn()
            except ModuleNotFoundError as e:  # torch or transformers
                ap.error(f"--lm needs torch and transformers ({e.name} is missing): pip install 'racsim[rm]'")
        return run_it

    # what runs, as (the phase, the benchmark): each bench_* that takes ``progress`` starts its phase of that name
    if args.set:
        steps = [("pipeline, lanes vs SimPy", lambda p: bench_pipeline(trials, args.set))]
    elif args.paper:
        steps = [("the paper's heavy-tail grid", lambda p: bench_heavy_tail())]
    elif args.gpu_rm:
        steps = [(f"gpu_rm, {args.gpu_rm} batching", lambda p: gpu_rm())]
    elif args.capacity:
        steps = [("capacity knobs", lambda p: bench_capacity_knobs(args.trials or (5 if args.quick else None), p))]
    elif args.scale:
        steps = [("scales", lambda p: bench_capacity_scale(SCALES[:2] if args.quick else SCALES, args.trials or 10, p))]
    elif args.workers:
        steps = [("capacity searches", lambda p: bench_capacity_workers((JUDGE,), repeat=1, progress=p) if args.quick
                  else bench_capacity_workers(progress=p))]
    elif args.lm:
        steps = [("GRPO step, racsim vs plain PyTorch",
                  lambda p: lm(lambda: bench_lm(3, LM_SIZES[:3], repeat=1) if args.quick else bench_lm(10))()),
                 ("GRPO, seeds as one batch",
                  lambda p: lm(lambda: bench_lm_batch(1, LM_BATCH_SIZES[:1], LM_BATCH_SEEDS[:2], repeat=1, progress=p)
                               if args.quick else bench_lm_batch(4, progress=p))())]
    elif args.generation:
        steps = [("async generation, the AReaL-like scenario",
                  lambda p: bench_generation(100 if args.quick else 1000)),
                 ("async generation, engine-bound",
                  lambda p: bench_generation(100 if args.quick else 1000, overrides=ENGINE_BOUND,
                                             tag="generation_engine_bound"))]
    elif args.sweep and args.cells is not None:
        steps = [(f"{args.cells} cells, sweep vs grid", lambda p: bench_sweep_cells(
            args.cells, trials=args.trials or 20, keep=args.keep, budget_s=args.budget))]
    elif args.sweep:
        steps = [("sweeps, serial vs joblib", lambda p: bench_sweep(n_seeds=2, trials=50, keep=args.keep) if args.quick
                  else bench_sweep(trials=args.trials or 500, keep=args.keep))]
    else:
        steps = [("bias benchmark, vectorised vs loop", lambda p: bench_bias(n_vec, n_loop)),
                 ("pipeline, lanes vs SimPy", lambda p: bench_pipeline(trials))]
        if not args.quick:
            steps.append(("the default scenario end to end", lambda p: bench_default()))
    figures: Dict[str, float] = {}
    with Progress(prog="racsim-bench") as progress:
        progress.plan(*(name for name, _ in steps))
        for name, bench in steps:
            progress.start(name, 1)  # a benchmark with units of its own starts its phase again with them
            figures.update(bench(progress))
        progress.finish()
    width = max(map(len, figures))
    for k, v in figures.items() if not (args.capacity or args.scale or args.workers) else ():  # they printed their tables
        print(f"{k:<{width}}  {v:,.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
