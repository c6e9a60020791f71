"""``python -m racsim.tools.seeds``: a capacity scenario's answer at N seeds, and what it says
where the seeds disagree.

    python -m racsim.tools.seeds scenario=capacity/judge_rm_faults --seeds 20
    python -m racsim.tools.seeds scenario=capacity/judge_rm_h100 --seeds 5 --first 100 learner.trials=20
    python -m racsim.tools.seeds scenario=capacity/judge_rm_h100 --seeds 20 --jobs 2   # two seeds at a time

Each seed is a whole capacity run (racsim.analyses.capacity.run_capacity, as ``racsim`` runs it,
nothing written); the table gives per seed the recommended count, the CPU seconds it used (its pools
included) and the seconds it took, then
one line: the count that meets the targets at every seed and, where fewer did at some seeds,
how often ("7 GPUs; 6 meets the targets in 4 of 20 seeds"). The edge is not computed inside one
capacity run: each extra seed at the edge count is a whole count's simulation at the run length
its slow regimes need (the run's dominant cost), so k seeds cost about k counts.
"""

from __future__ import annotations

import time
from typing import List, Optional, Sequence

import pandas as pd
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from racsim.analyses.capacity import run_capacity
from racsim.config.defaults import compose_config
from racsim.config.schema import RacsimConf
from racsim.config.spec import replace_at, scenario
from racsim.errors import Parser, interruptible
from racsim.progress import Progress
from racsim.io import cpu_seconds, spawn_pool, usable_cores


def _one_seed(cfg: RacsimConf, seed: int) -> dict:
    t0, c0 = time.perf_counter(), cpu_seconds()
    res = run_capacity(replace_at(cfg, "seed", int(seed)))
    return {"seed": int(seed), "recommended": res.recommended, "unit": res.unit, "cpu_s": cpu_seconds() - c0,
            "seconds": time.perf_counter() - t0}


def seed_answers(cfg: RacsimConf, seeds: Sequence[int], progress: Optional[Progress] = None,
                 jobs: int = 1) -> pd.DataFrame:
    """One row per seed: the capacity run's recommended count (None: no count met the targets),
    its unit, the CPU seconds it used (its pools' processes included) and the seconds it took. ``cfg``: a capacity scenario's spec; only ``seed`` varies.
    ``jobs`` > 1: the seeds run in that many fresh processes (one BLAS thread each, each run's counts
    one at a time: capacity.workers 1), the same rows. ``progress``: the phase ``seeds``, a unit per seed."""
    seeds = [int(s) for s in seeds]
    rows = []
    progress = progress or Progress.off()
    progress.start("seeds", len(seeds), "seed")

    def tell(row: dict) -> None:
        rows.append(row)
        progress.advance(1, f"seed {row['seed']}: {row['recommended']} {row['unit']} ({row['seconds']:.1f} s)")

    if jobs > 1 and len(seeds) > 1:
        cfg = replace_at(cfg, "capacity.workers", 1)  # the seeds fill the cores: each run's counts one at a time
        with spawn_pool(min(jobs, len(seeds))) as pool:
            for row in pool.map(_one_seed, [cfg] * len(seeds), seeds):  # in the seeds' order
                tell(row)
    else:
        for s in seeds:
            tell(_one_seed(cfg, s))
    return pd.DataFrame(rows)


def seed_statement(recommended: Sequence[Optional[int]], unit: str) -> str:
    """The answer over seeds: the fewest count every seed's run found to meet the targets (the
    largest recommendation: feasibility grows with the count), then, for each fewer count some
    seeds recommended, in how many seeds it met them (those that recommended it or fewer):
    "7 GPUs; 6 meets the targets in 4 of 20 seeds". A seed whose run met no target counts
    against every count."""
    n = len(recommended)
    got = [r for r in recommended if r is not None]
    if not got:
        return f"no count meets the targets in any of {n} seeds"
    if len(got) < n:
        head = f"no count meets the targets in {n - len(got)} of {n} seeds; {max(got)} {unit} in the others"
    else:
        head = f"{max(got)} {unit}" + (f" at all {n} seeds" if len(set(got)) == 1 else "")
    edges = [f"{m} meets the targets in {sum(r <= m for r in got)} of {n} seeds"
             for m in sorted(set(got), reverse=True)[1:]]
    return "; ".join([head, *edges])


@interruptible("python -m racsim.tools.seeds", "interrupted; no table written")
def main(argv: Optional[List[str]] = None) -> None:
    ap = Parser(prog="python -m racsim.tools.seeds", description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10, help="how many seeds (default 10)")
    ap.add_argument("--first", type=int, default=0, help="the first seed (default 0)")
    ap.add_argument("--jobs", type=int, default=1, help=f"seeds run side by side in that many processes (default 1; "
                                                        f"this machine has {usable_cores()} cores)")
    ap.add_argument("--csv", help="also write the table to this CSV file")
    ap.add_argument("overrides", nargs="+", metavar="OVERRIDE",
                    help="the capacity scenario and any overrides, as racsim takes them")
    args = ap.parse_intermixed_args(argv)  # overrides before and after the options, as racsim takes them
    if args.seeds < 1 or args.first < 0 or args.jobs < 1:
        ap.error(f"--seeds {args.seeds} --first {args.first} --jobs {args.jobs}: --seeds an integer >= 1, "
                 f"--first >= 0, --jobs >= 1")
    try:
        cfg = scenario(compose_config(*args.overrides))
        if not cfg.capacity.enabled:
            ap.error(f"{' '.join(args.overrides)}: not a capacity scenario (capacity.enabled is false)")
        with Progress("seeds", mode="lines", quiet_s=0) as progress:  # a line per seed on stderr
            table = seed_answers(cfg, range(args.first, args.first + args.seeds), progress, jobs=args.jobs)
            progress.finish()
    except (ValueError, HydraException, OmegaConfBaseException) as e:  # ValueError: racsim's ConfigError
        ap.error(f"{' '.join(args.overrides)}: {e}")
    print(table.to_string(index=False))
    print(seed_statement([None if pd.isna(r) else int(r) for r in table.recommended], table.unit.iloc[0]))
    if args.csv:
        table.to_csv(args.csv, index=False)


if __name__ == "__main__":
    main()
