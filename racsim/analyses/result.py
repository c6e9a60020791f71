"""What one run returns: its tables, and the schedules and curves that the plots need."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional

import pandas as pd

from racsim.learner.bias import BiasRun
from racsim.learner.training import TrainCurve
from racsim.pipeline.schedule import ArrivalSchedule


@dataclass
class RunResult:
    results: pd.DataFrame
    channels: pd.DataFrame = field(default_factory=pd.DataFrame)
    timeline: pd.DataFrame = field(default_factory=pd.DataFrame)
    training: pd.DataFrame = field(default_factory=pd.DataFrame)
    bias: Optional[BiasRun] = None
    schedules: Dict[str, ArrivalSchedule] = field(default_factory=dict)
    curves: Dict[str, TrainCurve] = field(default_factory=dict)
    timings: Dict[str, float] = field(default_factory=dict)
    extra: Dict[str, pd.DataFrame] = field(default_factory=dict)  # further tables, written as NAME.parquet
    trajectories: int = 0  # sampled in all (cells sharing a learner share them)
