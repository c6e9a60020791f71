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
(``capacity.max_bias``, ``capacity.max_bias_vs_naive``, ``capacity.max_step_s``, and the
channel's service targets ``capacity.max_dropped``, ``capacity.max_sojourn_p95_s``,
``capacity.max_sojourn_p99_s``, ``capacity.max_delay_p95_steps``), and names the target that
binds: the one the next smaller count fails. The counts the answer depends on (the fewest that
passes and the one below) are then decided with enough evidence: their rare-event figures are read
off independent replications (the trials of their settled run and of more runs), sized under random
outages or bursts from the regime's chain (episodes.py), until each lies on one side of its target,
within a budget; a figure the budget cannot settle is unresolved and its count fails (stopping.py,
replications.py). A target the
counts evaluated show that no count up to ``capacity.max_count`` can meet (a figure that does not fall
with the count, as a corrector's bias past the queue's knee) stops the search there: the answer's
status is ``infeasible`` and it names the target (reach.py).

Why one run that loops, rather than a Hydra multirun: the answer is a
comparison across counts (a curve, a minimum), which a single process can
compute, plot and summarise in one folder without a second "gather" step, and
a bisection needs each answer before choosing the next count, which a
multirun's fixed job list cannot do. A plain Hydra sweep still works for
anyone who wants one folder per count (``racsim -m scenario=...
pipeline.channels.judge.rm.gpus=1,2,4,8 capacity.enabled=false``).

The modules, in the order a search uses them: channel.py (the channel sized, its count's key and
unit), load.py (each count's offered load), episodes.py, regimes.py and length.py (the regime's chain and
its drop episodes; the slow regimes' time scales; the run length that shows a steady state), intervals.py (each figure's interval), targets.py
and rows.py (what a count must meet; its rows of the curve), search.py (where the fewest count
lies), reach.py (the targets more capacity cannot meet), memory.py and pool.py (the runs that fit
in memory; counts side by side), stopping.py and replications.py (the stopping rule; the
replications that decide the answer's counts), result.py (the answer), speed.py (the engine's
speed), run.py (:func:`run_capacity`, the search itself).
"""

from __future__ import annotations

# What the rest of racsim uses of the capacity planner.
from racsim.analyses.capacity.channel import channel_of, count_key, fixed_pool, units_per_server, with_count
from racsim.analyses.capacity.intervals import BATCH_CYCLES
from racsim.analyses.capacity.length import requests_per_schedule
from racsim.analyses.capacity.load import channel_loads
from racsim.analyses.capacity.memory import steps_that_fit
from racsim.analyses.capacity.pool import pool_size
from racsim.analyses.capacity.reach import OutOfReach, out_of_reach
from racsim.analyses.capacity.regimes import slowest_regime
from racsim.analyses.capacity.replications import judged_only
from racsim.analyses.capacity.result import STATUSES, CapacityResult, fewest
from racsim.analyses.capacity.rows import count_note, count_rows
from racsim.analyses.capacity.run import run_capacity
from racsim.analyses.capacity.search import fewest_from, fewest_valid
from racsim.analyses.capacity.speed import benchmark
from racsim.analyses.capacity.targets import TARGET_FIGURES, meets, targets_of
