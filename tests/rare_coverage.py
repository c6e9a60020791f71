"""The coverage study of issue 50: does the dropped share's 95% interval, as the deciding replications
read it, hold the long-run truth on the shipped scenarios, at the counts on either side of their answers?

    python tests/rare_coverage.py                            # every case of CASES, seeds 0-29
    python tests/rare_coverage.py judge_rm_bursts:6 --seeds 30 --jobs 2
    python tests/rare_coverage.py --summarize                 # the stored seeds against the truth stored now

For each case (scenario, count) and seed: the count's settled run as a capacity search makes it (its
asynchronous pipeline at the length and warm-up its regime's chain gives: racsim.analyses.capacity.length),
then the deciding replications of its dropped share (racsim.analyses.capacity.stopping.sequential with
the replications racsim.analyses.capacity.replications makes, sized from the chain, within the
default budget capacity.decide_steps), exactly as the search decides a count its answer depends on;
the bias study is left out (it moves no dropped share). Stored in tests/data/rare_coverage.json: per
case the truth (tests/data/rare_truth.json, made by tests/rare_truth.py), per seed the settled run's
interval and the decided one, the runs, trial-steps and drop episodes they rest on, and their dropped
and sent results (pooled over the seeds: the replications' mean, which a warm-up too short would read
low), the coverage of both intervals, the chain's plan, the command and the commit. tests/test_rare_coverage.py
reads it."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from racsim.analyses.capacity import stopping
from racsim.analyses.capacity.channel import count_key, with_count
from racsim.analyses.capacity.episodes import EPISODES, WARM_TOL, count_episodes
from racsim.analyses.capacity.length import sized_run
from racsim.analyses.capacity.load import channel_loads
from racsim.analyses.capacity.intervals import replicate_figures
from racsim.analyses.capacity.replications import replicate_runs
from racsim.analyses.capacity.targets import targets_of
from racsim.config.defaults import compose_config
from racsim.config.spec import scenario
from racsim.io import cpu_seconds, spawn_pool

HERE = Path(__file__).resolve().parent
TRUTH = HERE / "data" / "rare_truth.json"
OUT = HERE / "data" / "rare_coverage.json"
CASES = ("judge_rm_bursts:6", "judge_rm_bursts:7", "judge_rm_faults:6", "judge_rm_faults:7")
QUIET = ("capacity.benchmark=false", "capacity.sensitivity.enabled=false")


def spec_of(name: str, seed: int, *more: str):
    return scenario(compose_config(f"scenario=capacity/{name}", f"seed={seed}", *QUIET, *more))


def one_seed(case: str, seed: int) -> dict:
    """One seed of a case: the settled run's dropped share and the decided one (module docstring)."""
    t0, c0 = time.perf_counter(), cpu_seconds()
    name, n = case.split(":")[0], int(case.split(":")[1])
    cfg = spec_of(name, seed)
    ch = cfg.capacity.channel
    key = count_key(cfg, ch)
    work = channel_loads(cfg, ch, key, [n])[n]["work_per_s"]
    c = with_count(cfg, key, n)
    run = sized_run(c, ch, work_per_s=work)
    w = run.verdict.warmup
    first = replicate_figures(run.sched, c, ch, w)
    found = count_episodes(c, ch, work)
    targets = targets_of(cfg)
    level = float(cfg.capacity.confidence)
    plan = stopping.Plan(need=stopping.need_of(found.share, found.rate, found.length, targets, ["max_dropped"], level),
                         length=found.length, warmup=w, lanes=int(cfg.learner.trials), first=run.steps - w,
                         cap=max(run.steps, int(cfg.capacity.max_steps)), rate=found.rate)
    settled = stopping.intervals([first], ["max_dropped"], level, found.length)["max_dropped"]
    d = stopping.sequential(first, lambda r, runs: replicate_runs(c, ch, key, n, runs, w, r),
                            ["max_dropped"], targets, level, plan,
                            stopping.Budget(int(cfg.capacity.decide_steps), math.inf))
    v, lo, hi = d.found["max_dropped"]
    return {"seed": seed, "dropped": v, "lo": lo, "hi": hi, "settled": list(settled), "stationary": bool(
        run.verdict.stationary), "steps": run.steps, "warmup": w, "runs": len(d.reps),
            "measured": stopping.exposure(d.reps), "episodes": stopping.episodes_seen(d.reps), "unresolved": d.open,
            "dropped_total": float(sum(r.dropped.sum() for r in d.reps)),
            "sent_total": float(sum(r.sent.sum() for r in d.reps)), "need": plan.need, "length": plan.length,
            "seconds": round(time.perf_counter() - t0, 1), "cpu_s": round(cpu_seconds() - c0, 1)}


def summary(case: str, rows: list, truth: dict) -> dict:
    """A case's coverage and its replications' mean pooled over the seeds (the seeds independent units)."""
    t = truth["dropped_share"]
    num, den = np.array([r["dropped_total"] for r in rows]), np.array([r["sent_total"] for r in rows])
    pooled, n = num.sum() / den.sum(), len(rows)
    se = float(np.sqrt(np.sum((num - pooled * den) ** 2) * n / (n - 1)) / den.sum())
    return {"truth": t, "truth_se": truth["se"], "truth_trial_steps": truth["measured_trial_steps"],
            "seeds": rows, "coverage": float(np.mean([r["lo"] <= t <= r["hi"] for r in rows])),
            "coverage_settled": float(np.mean([r["settled"][1] <= t <= r["settled"][2] for r in rows])),
            "pooled": float(pooled), "pooled_se": se, "episodes": EPISODES, "warm_tol": WARM_TOL,
            "size_cv2": stopping.SIZE_CV2}


def main(argv):
    seeds, jobs, cases, again = 30, 1, [], "--summarize" in argv
    it = iter(a for a in argv if a != "--summarize")
    for a in it:
        if a == "--seeds":
            seeds = int(next(it))
        elif a == "--jobs":
            jobs = int(next(it))
        else:
            cases.append(a)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout.strip()
    for case in cases or CASES:
        stored = json.loads(OUT.read_text()) if OUT.exists() else {}
        if again:  # the stored seeds summarised again, against the truth stored now (none simulated)
            got = stored[case]
        else:
            t0 = time.perf_counter()
            if jobs > 1:  # by its module's name, which a spawned process imports (it does not run this script)
                from rare_coverage import one_seed as by_name
                with spawn_pool(jobs) as pool:
                    rows = list(pool.map(by_name, [case] * seeds, range(seeds)))
            else:
                rows = [one_seed(case, s) for s in range(seeds)]
            got = {"seeds": rows, "command": f"python tests/rare_coverage.py {case} --seeds {seeds}",
                   "commit": commit, "seconds": round(time.perf_counter() - t0, 1)}
        truth = json.loads(TRUTH.read_text()) if TRUTH.exists() else {}
        if case in truth:  # else stored alone: --summarize once tests/rare_truth.py has made it
            got.update(summary(case, got["seeds"], truth[case]))
        stored = json.loads(OUT.read_text()) if OUT.exists() else {}
        stored[case] = got
        OUT.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
        if case in truth:
            print(f"{case}: coverage {got['coverage']:.0%} (settled run alone {got['coverage_settled']:.0%}) of "
                  f"{len(got['seeds'])} seeds; truth {got['truth']:.4%}, replications' mean {got['pooled']:.4%} "
                  f"+- {got['pooled_se']:.4%}", flush=True)
        else:
            print(f"{case}: {len(got['seeds'])} seeds stored; no truth yet", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
