"""The asynchronous reward pipeline: when is each slow result usable?

Model (DESIGN.md, "The model"). Optimizer step t generates a batch of B
rollouts, fast-scores them, submits them to every slow channel, then updates;
each phase takes a duration drawn from the scenario. Slow channel k serves each
submitted sample for a latency drawn from its distribution, on one of c_k
workers behind a FIFO queue (or on as many as needed). A result is usable by
the first step that begins at or after it completes; its delay Delta is that
step's index minus t. A result older than the channel's admissible delay D_k
is dropped. With a blocking corrector (wait-for-slow) the optimizer instead
waits, after submitting, until its own batch's results are back (or a timeout
passes), and uses them in the same step (Delta = 0). With ``pipeline.arrivals`` other
than ``batch``, each sample is instead sent to the slow channels the second its rollout
is ready, during the generate phase (racsim/pipeline/arrivals.py).

Two engines produce the same :class:`~racsim.pipeline.schedule.ArrivalSchedule` from
the same random draws: ``simpy`` (the engine of record: one SimPy process per
trial's optimizer and per queued job) and ``lanes`` (all trials advance
together as numpy lanes, one vectorised operation per job position). A test
holds them equal to the last bit.

GPU-backed reward models (channel kind ``gpu_rm``, see "GPU-backed channels"
below): each sample is ``sequences_per_sample`` requests with drawn token
lengths; a batcher forms batches (at most ``max_batch`` sequences and
``token_budget`` tokens, padded or packed, in FIFO or shortest-first order) and
dispatches one to an idle replica of ``tp`` GPUs when it is full or when its
oldest waiting request has waited ``max_wait_s``; a service model
(racsim/pipeline/service.py) gives the batch's seconds. A sample's result is back when
all its sequences are scored. Everything that happens at one instant
(arrivals, completions, flush deadlines) is applied before the batcher
decides. In SimPy: a batcher process, one ``Resource`` per replica, one
process per batch. In lanes: a vectorised batch-by-batch recursion for FIFO
batchers (asynchronous, or blocking without a timeout), and a per-lane event
loop otherwise. With arrivals over time the batcher takes one group per sample, at
the second it is ready, numbered in ready order (racsim/pipeline/arrivals.py's ReadyPool).
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from racsim.config.schema import PipelineConf
from racsim.pipeline.draws import PipelineDraws, draw
from racsim.pipeline.lanes import run_lanes
from racsim.pipeline.schedule import ArrivalSchedule
from racsim.pipeline.simpy_engine import run_simpy

ENGINES = {"lanes": run_lanes, "simpy": run_simpy}


def simulate(
    pcfg: PipelineConf,
    n_trials: int,
    rng: np.random.Generator,
    *,
    blocking: bool = False,
    wait_timeout: Optional[float] = None,
    engine: Optional[str] = None,
    draws: Optional[PipelineDraws] = None,
    tick: Optional[Callable[[float], None]] = None,
) -> ArrivalSchedule:
    """Simulate ``n_trials`` independent runs of the pipeline; see the module docstring. ``tick(share)``:
    told as the simulation moves (the share of its trials or steps done), for progress inside it."""
    if draws is None:
        draws = draw(pcfg, n_trials, rng)
    return ENGINES[engine or pcfg.engine](draws, blocking, wait_timeout, tick)
