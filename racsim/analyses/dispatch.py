"""One racsim run: the composed config's study grid, dispatched to what computes it.

``study.kind`` picks the computation: ``bias`` (racsim.analyses.bias_study:
pipeline -> arrival schedules -> bias benchmark and training; with
``study.mode`` static or both, racsim.analyses.static_study: the paper's own
one-rollout experiment, its rows marked ``mode``), ``probe``
(racsim.analyses.probe) or ``tv_bound`` (racsim.analyses.tvbound); ``learner.kind=lm``
runs the GRPO study instead of the bias one (racsim.analyses.lm_study).
:func:`compute` is the one entry of both the command line (racsim.app.cli) and
``racsim.run`` (racsim.app.api): capacity planning (``capacity.enabled``,
racsim.analyses.capacity) or :func:`run`. Every function here takes the typed spec
(:class:`~racsim.config.schema.RacsimConf`): the composed config is checked and converted
at the config boundary (racsim.config.spec.scenario), never here.
"""

from __future__ import annotations

from typing import Iterator, Optional, Sequence, Tuple, Union

import pandas as pd

from racsim.analyses.bias_study import run_bias_each, run_bias_study, trains
from racsim.analyses.capacity import CapacityResult
from racsim.analyses.capacity.split import SplitResult, run_split
from racsim.analyses.grid import expand
from racsim.analyses.lm_study import run_lm_study
from racsim.analyses.probe import probe_study
from racsim.analyses.result import RunResult
from racsim.analyses.sensitivity import run_capacity_sensitivity
from racsim.analyses.static_study import run_static_study
from racsim.analyses.tvbound import tv_bound_study
from racsim.config.schema import RacsimConf
from racsim.io import small_pages
from racsim.progress import Progress

ANALYSES = {"probe": probe_study, "tv_bound": tv_bound_study}  # study.kind -> analysis; "bias" is the default


@small_pages()  # racsim.io.small_pages: the same bits, less system time
def compute(cfg: RacsimConf, progress: Optional[Progress] = None) -> Union[RunResult, CapacityResult, SplitResult]:
    """The results of a scenario's spec (racsim.config.spec.scenario): the capacity search
    when ``capacity.enabled`` (with its sensitivity table when ``capacity.sensitivity.enabled``:
    racsim.analyses.sensitivity; with async generation the pool split, racsim.analyses.capacity.split),
    else :func:`run`. ``progress``: what each phase tells as it runs
    (racsim.progress; None: nothing). Raises ConfigError on a user's mistake."""
    if cfg.capacity.enabled:  # async generation: a pool split between engines, trainer and judge
        return run_split(cfg, progress) if cfg.pipeline.generation.mode == "async" else \
            run_capacity_sensitivity(cfg, progress)
    return run(cfg, progress)


def run(cfg: RacsimConf, progress: Optional[Progress] = None) -> RunResult:
    """Run the scenario of a spec. Every cell of its study grid is
    resolved and validated first (one cell when there is no grid). ``progress``: its phases are
    planned first (the bias benchmark, the training, the static study, as the study has them), each
    with its total as it starts."""
    progress = progress or Progress.off()
    cells = expand(cfg)
    first = cells[0][1]
    kind = first.study.kind
    if kind != "bias":
        progress.start(f"{kind} study", 1)
        res = ANALYSES[kind](first)
        progress.finish()
        return res
    if first.learner.kind == "lm":
        return run_lm_study(cells, progress)
    mode = first.study.mode
    progress.plan(*(["bias benchmark"] if mode != "static" else []),
                  *(["training"] if mode != "static" and trains(cells) else []),
                  *(["static study"] if mode != "pipeline" else []))
    res = run_bias_study(cells, progress) if mode != "static" else RunResult(results=pd.DataFrame())
    if mode == "pipeline":
        return res
    static = run_static_study(cells, progress)
    res.results = pd.concat([res.results, static["results"]], ignore_index=True)
    if len(static["replicates"]):
        res.extra["static_replicates"] = static["replicates"]
    res.timings["static_s"] = static["seconds"]
    return res


def run_many(cfgs: Sequence[RacsimConf], progress: Optional[Progress] = None) -> Iterator[Tuple[int, RunResult]]:
    """(index, ``run(cfg)``, byte for byte) of each config that is one bias-study cell in pipeline mode,
    each as soon as it is computed (computed together: racsim.analyses.bias_study.run_bias_each, whose
    ``progress`` this is); the others are left out. Raises what ``run`` would raise for any of them."""
    with small_pages():  # inside: a generator's body runs at each next(), after a decorator's block ended
        picked = []
        for i, cfg in enumerate(cfgs):
            cells = expand(cfg)
            c = cells[0][1]
            if len(cells) == 1 and c.study.kind == "bias" and c.learner.kind != "lm" and c.study.mode == "pipeline":
                picked.append((i, cells[0]))
        for k, res in run_bias_each([cell for _, cell in picked], progress):
            yield picked[k][0], res
