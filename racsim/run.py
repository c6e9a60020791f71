"""One racsim run: the composed config's study grid, dispatched to what computes it.

``study.kind`` picks the computation: ``bias`` (racsim.analyses.bias_study:
pipeline -> arrival schedules -> bias benchmark and training; with
``study.mode`` static or both, racsim.analyses.static_study: the paper's own
one-rollout experiment, its rows marked ``mode``), ``probe``
(racsim.analyses.probe) or ``tv_bound`` (racsim.analyses.tvbound); ``learner.kind=lm``
runs the GRPO study instead of the bias one (racsim.analyses.lm_study). Capacity
planning (``capacity.enabled``) is chosen by the command line (racsim.cli).
"""

from __future__ import annotations

from typing import Any, Optional

import pandas as pd

from racsim.analyses.bias_study import run_bias_study
from racsim.analyses.grid import expand
from racsim.analyses.lm_study import run_lm_study
from racsim.analyses.probe import probe_study
from racsim.analyses.result import RunResult
from racsim.analyses.static_study import run_static_study
from racsim.analyses.tvbound import tv_bound_study

ANALYSES = {"probe": probe_study, "tv_bound": tv_bound_study}  # study.kind -> analysis; "bias" is the default


def run(cfg: Any, progress: Optional[Any] = None) -> RunResult:
    """Run the scenario of a composed config. Every cell of its study grid is
    resolved and validated first (one cell when there is no grid)."""
    cells = expand(cfg)
    kind = cells[0][1].study.kind
    if kind != "bias":
        return ANALYSES[kind](cells[0][1])
    if cells[0][1].learner.kind == "lm":
        return run_lm_study(cells)
    mode = cells[0][1].study.mode
    res = run_bias_study(cells, progress) if mode != "static" else RunResult(results=pd.DataFrame())
    if mode == "pipeline":
        return res
    static = run_static_study(cells, progress)
    res.results = pd.concat([res.results, static["results"]], ignore_index=True)
    if len(static["replicates"]):
        res.extra["static_replicates"] = static["replicates"]
    res.timings["static_s"] = static["seconds"]
    return res
