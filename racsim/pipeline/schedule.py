"""The arrival schedule: where the pipeline's timing meets the learner.

The SimPy pipeline decides *when* each slow result is usable; correctors and
learners decide *what* the update is. This module holds the one small data
structure they share and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import numpy as np

# Status of one slow result (one trial, step, sample, channel) at the end of a run.
INJECTED = np.int8(0)  # landed at step t + delay and was used by that step's update


DROPPED = np.int8(1)  # older than the channel's admissible delay D_k before it landed


PENDING = np.int8(2)  # still in a queue or in service when the run ended


UNROUTED = np.int8(3)  # never sent to the channel (its route_prob): no slow result from it


@dataclass(frozen=True)
class ArrivalSchedule:
    """Per trial, step, sample and channel: the delay in optimizer steps and the status.

    Shapes: ``delay`` and ``status`` are (trials, steps, batch, K); ``delay`` is
    the number of optimizer steps between the rollout's step t and the step
    t + delay whose update uses the result (0 when the step waited for it), and
    is -1 where the result was not injected. ``step_start`` is (trials, steps + 1):
    the wall-clock second at which each step began, the last column being the
    end of the run. ``blocking`` says the optimizer waited for its own results.
    The optional job arrays (trials, steps, batch, K) give, for clock-driven
    channels, the wall-clock second of submission, service start and
    completion (inf where the job never completes), for queue statistics.
    """

    delay: np.ndarray
    status: np.ndarray
    step_start: np.ndarray
    blocking: bool
    channel_names: Tuple[str, ...]
    submit_time: Optional[np.ndarray] = None
    service_start: Optional[np.ndarray] = None
    completion: Optional[np.ndarray] = None
    # GPU-backed channels (kind gpu_rm): per channel, one entry per batch served,
    # arrays lane, replica, start, end, size (sequences), tokens (as billed by the
    # batcher: padded or packed), step (of its oldest request), sorted by (lane,
    # start, replica); and replicas, the pool's size.
    gpu_batches: Optional[Dict[str, Dict[str, np.ndarray]]] = None
    # Queue channels with cancel_on_drop: results cancelled at their deadline (their
    # completion is then the second they let go of the queue or the worker), (trials, steps, batch, K).
    cancelled: Optional[np.ndarray] = None
    # The optimizer's phase durations (generate, fast_score, submit, update) x (trials, steps), for timelines.
    phase: Optional[np.ndarray] = None
    # Autoscaled channels (racsim/pipeline/autoscale.py): per channel, one entry per server
    # ever billed, arrays lane, server (its slot, 0 .. max - 1: the replica of the batch log), requested, released (inf: still billed when the
    # simulation ended), price_per_hour (USD per server-hour) and max (the pool's largest size).
    pools: Optional[Dict[str, Dict[str, np.ndarray]]] = None
    # gpu_rm channels with faults: results lost to a server failure (counted dropped), (trials, steps,
    # batch, K); and each such channel's outage timeline (racsim.pipeline.faults.Timeline).
    failed: Optional[np.ndarray] = None
    faults: Optional[Dict[str, Any]] = None
    # Queue channels with background traffic: per channel, its served requests (never injected),
    # arrays lane, arrival, start, end (racsim/pipeline/background.py).
    background: Optional[Dict[str, Dict[str, np.ndarray]]] = None

    @property
    def n_trials(self) -> int:
        return self.delay.shape[0]

    @property
    def n_steps(self) -> int:
        return self.delay.shape[1]

    @property
    def batch_size(self) -> int:
        return self.delay.shape[2]

    @property
    def n_channels(self) -> int:
        return self.delay.shape[3]

    @property
    def injected(self) -> np.ndarray:
        return self.status == INJECTED

    @property
    def wallclock(self) -> np.ndarray:
        """Total simulated seconds of each trial's run, shape (trials,)."""
        return self.step_start[:, -1] - self.step_start[:, 0]

    def counts(self) -> dict:
        """Results sent (emitted), injected, dropped, pending and samples not routed, per channel
        (summed over trials)."""
        out = {}
        for k, name in enumerate(self.channel_names):
            s = self.status[..., k]
            out[name] = {
                "emitted": int(np.count_nonzero(s != UNROUTED)),
                "injected": int(np.count_nonzero(s == INJECTED)),
                "dropped": int(np.count_nonzero(s == DROPPED)),
                "pending": int(np.count_nonzero(s == PENDING)),
                "unrouted": int(np.count_nonzero(s == UNROUTED)),
            }
        return out
