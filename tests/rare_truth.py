"""The long-run dropped share of the shipped slow-regime scenarios, computed once and stored
(issue 50): the truth the coverage study (tests/rare_coverage.py) holds the capacity search's
intervals to, and the long run the replications' warm-up is checked against.

    python tests/rare_truth.py                       # every entry of CASES, one after another
    python tests/rare_truth.py judge_rm_bursts:6     # one (scenario, count), merged into the file
    python tests/rare_truth.py --jobs 2              # the chunks two at a time (the same figures)

How it is made: for each (scenario, count) of :data:`CASES`, ``chunks`` independent runs of the
scenario's asynchronous pipeline at that count (racsim's lanes engine, ``lanes`` trials each,
``steps`` steps), every run drawn from ``numpy.random.default_rng([TRUTH_SEED, count, chunk])``,
a stream no capacity search uses. Each lane is measured after a warm-up of ``warmup`` steps,
several times the warm-up the regime's chain asks for (racsim/analyses/capacity/episodes.py), as the
capacity curve measures a count: the results dropped over those sent by the steps after the
warm-up. The measured trial-steps are at least 50 times those of a default capacity run of the
scenario (its 50 trials' windows). Stored per case in tests/data/rare_truth.json: the pooled share,
its standard error (the lanes are independent replications: the ratio estimator's), the drop
episodes seen (:func:`~racsim.analyses.capacity.episodes.drop_episodes`), per lane its dropped,
sent and episodes, and per step of the first ``profile`` steps the dropped and sent summed over
the lanes (the drop share's rise from the empty start: what a warm-up must cut), with the
command, the racsim commit and the seconds it took.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from racsim.analyses.capacity.channel import count_key, with_count
from racsim.analyses.capacity.episodes import drop_episodes
from racsim.config.defaults import compose_config
from racsim.config.spec import replace_at, scenario
from racsim.io import spawn_pool
from racsim.pipeline.draws import draw
from racsim.pipeline.engines import simulate
from racsim.pipeline.schedule import DROPPED, UNROUTED

HERE = Path(__file__).resolve().parent
OUT = HERE / "data" / "rare_truth.json"
TRUTH_SEED = 5005  # the truth's own stream: default_rng([TRUTH_SEED, count, chunk])
PROFILE = 1000  # steps from the empty start whose drops are kept summed over the lanes
# (scenario, counts): chunks x lanes x (steps - warmup) measured trial-steps per count
CASES = {"judge_rm_bursts": {"counts": [6, 7, 8], "chunks": 10, "lanes": 10, "steps": 7000, "warmup": 1000},
         "judge_rm_faults": {"counts": [6, 7, 8], "chunks": 44, "lanes": 4, "steps": 8000, "warmup": 1000}}


def lane_figures(sched, name: str, warmup: int, max_delay: int):
    """Per lane: (dropped, sent, episodes) of channel ``name`` from step ``warmup``; and per step of the
    first :data:`PROFILE` steps the dropped and sent summed over the lanes."""
    k = sched.channel_names.index(name)
    st = sched.status[:, :, :, k]
    dropped, sent = (st == DROPPED).sum(axis=2), (st != UNROUTED).sum(axis=2)
    eps = [drop_episodes(dropped[i, warmup:], max_delay) for i in range(sched.n_trials)]
    return (dropped[:, warmup:].sum(axis=1), sent[:, warmup:].sum(axis=1), np.array(eps),
            dropped[:, :PROFILE].sum(axis=0), sent[:, :PROFILE].sum(axis=0))


def chunk(name: str, n: int, j: int, lanes: int, steps: int, warmup: int):
    """Chunk ``j`` of a case: per lane (dropped, sent, episodes), and its first steps' drops (lane_figures)."""
    cfg = scenario(compose_config(f"scenario=capacity/{name}"))
    ch = cfg.capacity.channel
    c = replace_at(with_count(cfg, count_key(cfg, ch), n), "pipeline.steps", steps)
    d = draw(c.pipeline, lanes, np.random.default_rng([TRUTH_SEED, n, j]))
    sched = simulate(c.pipeline, lanes, None, draws=d)
    dr, se, ep, pd_, ps = lane_figures(sched, ch, warmup, int(c.pipeline.channels[ch].max_delay))
    return [[int(a), int(b), int(e)] for a, b, e in zip(dr, se, ep)], np.stack([pd_, ps])


def truth(name: str, n: int, chunks: int, lanes: int, steps: int, warmup: int, jobs: int = 1) -> dict:
    """The long-run dropped share of scenario ``name`` at ``n`` units (module docstring); ``jobs`` > 1:
    the chunks in that many processes (the same figures)."""
    t0 = time.perf_counter()
    per = []
    prof = np.zeros((2, PROFILE), dtype=np.int64)
    args = [(name, n, j, lanes, steps, warmup) for j in range(chunks)]
    if jobs > 1:  # by its module's name, which a spawned process imports (it does not run this script)
        from rare_truth import chunk as by_name
        with spawn_pool(jobs) as pool:
            done = list(pool.map(by_name, *zip(*args)))
    else:
        done = [chunk(*a) for a in args]
    for j, (lanes_got, p) in enumerate(done):
        per += lanes_got
        prof += p
        a = np.array(lanes_got, dtype=np.float64)
        print(f"{name} {n}: chunk {j + 1}/{chunks}: {a[:, 0].sum() / a[:, 1].sum():.4%} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    a = np.array(per, dtype=np.float64)
    share = a[:, 0].sum() / a[:, 1].sum()
    r = a.shape[0]
    se = float(np.sqrt(np.sum((a[:, 0] - share * a[:, 1]) ** 2) * r / (r - 1)) / a[:, 1].sum())
    return {"scenario": name, "count": n, "dropped_share": float(share), "se": se, "episodes": int(a[:, 2].sum()),
            "lanes": r, "steps": steps, "warmup": warmup, "measured_trial_steps": r * (steps - warmup),
            "seed": [TRUTH_SEED, n, "chunk"], "per_lane": per, "profile_dropped": prof[0].tolist(),
            "profile_sent": prof[1].tolist(), "seconds": round(time.perf_counter() - t0, 1),
            "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                     cwd=HERE).stdout.strip(),
            "command": f"python tests/rare_truth.py {name}:{n}"}


def main(argv):
    jobs = int(argv[argv.index("--jobs") + 1]) if "--jobs" in argv else 1
    named = [a for i, a in enumerate(argv) if a != "--jobs" and (i == 0 or argv[i - 1] != "--jobs")]
    todo = [(a.split(":")[0], int(a.split(":")[1])) for a in named] or [
        (s, n) for s, case in CASES.items() for n in case["counts"]]
    for s, n in todo:
        case = {k: v for k, v in CASES[s].items() if k != "counts"}
        got = truth(s, n, **case, jobs=jobs)
        stored = json.loads(OUT.read_text()) if OUT.exists() else {}
        stored[f"{s}:{n}"] = got
        OUT.parent.mkdir(exist_ok=True)
        OUT.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
        print(f"{s} {n}: {got['dropped_share']:.4%} +- {got['se']:.4%} ({got['episodes']} episodes, "
              f"{got['measured_trial_steps']} trial-steps, {got['seconds']:.0f} s)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
