"""Independent random streams, one per purpose, derived from the config's seed alone
(never from the worker, the time or the order in which things run).
"""

from __future__ import annotations

import numpy as np

# Independent random streams, one per purpose, derived from the config's seed
# alone (never from the worker, the time or the order in which things run).
STREAMS = {"pipeline": 1, "trajectories": 2, "bootstrap": 3, "train_pipeline": 4, "training": 5, "probe": 6,
           "static": 7, "static_replication": 8, "lm": 9, "lm_gradient": 10,
           "capacity_intervals": 20, "capacity_load": 21, "capacity_batches": 27, "capacity_replication": 28,
           "generation_lag": 29}


def seed_sequence(seed: int, stream: str, *keys: int) -> np.random.SeedSequence:
    """The stream's seed sequence; ``keys`` (non-negative ints) split it further."""
    return np.random.SeedSequence([seed, STREAMS[stream], *keys])


def rng_for(seed: int, stream: str, *keys: int) -> np.random.Generator:
    return np.random.default_rng(seed_sequence(seed, stream, *keys))
