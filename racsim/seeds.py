"""Independent random streams, one per purpose, derived from the config's seed alone
(never from the worker, the time or the order in which things run).
"""

from __future__ import annotations

import numpy as np

# Independent random streams, one per purpose, derived from the config's seed
# alone (never from the worker, the time or the order in which things run).
STREAMS = {"pipeline": 1, "trajectories": 2, "bootstrap": 3, "train_pipeline": 4, "training": 5, "probe": 6,
           "lm": 7, "lm_gradient": 8}


def seed_sequence(seed: int, stream: str) -> np.random.SeedSequence:
    return np.random.SeedSequence([seed, STREAMS[stream]])


def rng_for(seed: int, stream: str) -> np.random.Generator:
    return np.random.default_rng(seed_sequence(seed, stream))
