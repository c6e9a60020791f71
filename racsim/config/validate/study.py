"""The study run (:class:`~racsim.config.schema.StudyConf`): its kind and mode, replications,
KL targets and slacks, workers, the grid of cells and the reward probe (:class:`ProbeConf`).
racsim.config.validate.top interleaves these groups with the learner's, in the order the first
error of a config has always been named."""

from __future__ import annotations

from typing import Any

from omegaconf import ListConfig

from racsim.config.schema import STUDIES, STUDY_MODES
from racsim.config.validate.common import finite, int_at_least, need, need_file, need_one_of, positive


def grid_cells(grid: Any) -> int:
    """How many cells ``study.grid`` expands to (the product of its axes' lengths)."""
    n = 1
    for values in dict(grid or {}).values():
        n *= max(len(values), 1) if isinstance(values, (list, tuple, ListConfig)) else 1
    return n


def validate_study_kind(st: Any) -> None:
    need_one_of("study.kind", st.kind, STUDIES)


def validate_study_runs(st: Any) -> None:
    """How the study's runs are made: its mode and replications."""
    need_one_of("study.mode", st.mode, STUDY_MODES)
    int_at_least("study.replications", st.replications, 0)


def validate_study_targets(st: Any) -> None:
    """The KL levels and slacks the study reports at, and its worker processes."""
    need(len(st.kl_targets) >= 1 and all(finite(k) and k > 0 for k in st.kl_targets), "study.kl_targets",
         list(st.kl_targets), "a non-empty list of KL levels > 0")
    need(all(finite(e) and 0 <= e <= 1 for e in st.etas), "study.etas", list(st.etas), "slacks in [0, 1]")
    int_at_least("study.workers", st.workers, 0)


def validate_probe(st: Any) -> None:
    """``study.probe``: its pairs (a file for a probe study, else drawn from a bivariate normal's moments)."""
    pr = st.probe
    int_at_least("study.probe.n", pr.n, 2)
    if st.kind == "probe" and pr.pairs:
        need_file("study.probe.pairs", pr.pairs, "the path of a CSV or Parquet file of (r_fast, r_slow) pairs, or null")
    need(finite(pr.correlation) and -1 < pr.correlation < 1, "study.probe.correlation", pr.correlation,
         "a Pearson correlation in (-1, 1)")
    for key in ("slow_std", "fast_std"):
        positive(f"study.probe.{key}", getattr(pr, key))
    for key in ("slow_mean", "fast_mean"):
        need(finite(getattr(pr, key)), f"study.probe.{key}", getattr(pr, key), "a finite number")
