"""Evidence on disk: tables (Parquet and CSV), config.yaml, summary.md, plots and the trace of a run.

Every file is written to a temporary name in the same folder and renamed into
place, so an interrupted run never leaves a half-written result behind.
"""

from __future__ import annotations

import functools
import io
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Union

import pandas as pd

from racsim.analyses.capacity import CapacityResult
from racsim.analyses.result import RunResult
from racsim.config.schema import RacsimConf
from racsim.io import atomic_write, write_text
from racsim.io import digest_bytes
from racsim.report import lm as LM
from racsim.report import plots as P
from racsim.report.capacity import write_capacity
from racsim.report.finite import Unwritable, checked, non_finite, summary_lines, undefined_notes
from racsim.report.lags import first_order_lines, lag_markdown, lags_plot
from racsim.report.tables import answer_line, format_table, stationarity_warning, time_section, warmup_warning
from racsim.report.trace import write_timeline


def write_run(out_dir: Path, cfg: RacsimConf, res: Union[RunResult, CapacityResult],
              cfg_yaml: Union[str, Callable[[], str]], lean: bool = False,
              digests: Optional[Dict[str, dict]] = None, found: Optional[List[Unwritable]] = None,
              about: Sequence[str] = ()) -> list:
    """Every file of what racsim.analyses.dispatch.compute returned for the spec ``cfg`` (a run,
    or a capacity plan) into ``out_dir``; returns the paths written. ``cfg_yaml``: config.yaml's
    text, or a function giving it (read at most once; the caller dumps the composed config,
    racsim.config.dump.config_yaml). See :func:`write_outputs`, also for ``found`` and ``about``."""
    yaml_text = functools.cache(cfg_yaml) if callable(cfg_yaml) else (lambda: cfg_yaml)
    if isinstance(res, CapacityResult):
        return write_capacity(out_dir, cfg, res, yaml_text(), plots=cfg.output.plots, found=found, about=about)
    return write_outputs(out_dir, res, yaml_text, plots=cfg.output.plots, lean=lean, digests=digests, found=found,
                         about=about)


def write_outputs(out_dir: Path, res: RunResult, cfg_yaml: Union[str, Callable[[], str]], plots: bool = True,
                  lean: bool = False, digests: Optional[Dict[str, dict]] = None,
                  found: Optional[List[Unwritable]] = None, about: Sequence[str] = ()) -> list:
    """Write every artifact of a run into ``out_dir``; returns the paths written. ``lean``
    (``output.job_files``): the tables as Parquet only, without their CSV copies, the
    timeline and trace, config.yaml, plots and summary.md. ``cfg_yaml``: the config's
    YAML, or a function giving it (read only for config.yaml or an error message).
    ``digests`` gets the size and SHA-256 of each table, from the bytes written.
    A non-finite value where a number must be (racsim.report.finite) is written as it is
    and named in summary.md; ``found`` gets them, for the caller to fail the run once the
    files are published; without ``found``, a ConfigError once everything is written.
    ``about``: summary.md's lines on the run's inputs (racsim.report.inputs)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    yaml_text = cfg_yaml if callable(cfg_yaml) else (lambda: cfg_yaml)
    bad: List[Unwritable] = [] if found is None else found
    notes: List[str] = []

    def table(df: pd.DataFrame, stem: str, csv: bool = True) -> None:
        bad.extend(non_finite(df, stem))
        notes.extend(undefined_notes(df, stem))
        p = out_dir / f"{stem}.parquet"
        data = parquet_bytes(df)
        atomic_write(p, lambda t: Path(t).write_bytes(data))
        if digests is not None:
            digests[p.name] = digest_bytes(data)
        written.append(p)
        if csv and not lean:
            c = out_dir / f"{stem}.csv"
            atomic_write(c, lambda t: df.to_csv(t, index=False))
            written.append(c)

    table(res.results, "results")
    for name, df in res.extra.items():
        table(df, name)
    if len(res.channels):
        table(res.channels, "channels")
    if len(res.timeline) and not lean:
        table(res.timeline, "timeline", csv=False)
    if len(res.training):
        table(res.training, "training", csv=False)
    if lean:
        return checked(written, bad, found, yaml_text, out_dir)
    write_text(out_dir / "config.yaml", yaml_text())
    written.append(out_dir / "config.yaml")
    if plots and "corrector" in res.results:
        figures = (("pareto.png", P.pareto), ("training.png", P.training), ("queue.png", P.queue),
                   ("lag.png", P.lag), ("generation_queue.png", P.generation_queue))
        if LM.is_lm(res):  # learner=lm: its own figures
            figures = LM.PLOTS + (("queue.png", P.queue),)
        if "lags" in res.extra:  # a run across generation lags: bias and J against the lag, in place of the Pareto
            figures = (("lags.png", lags_plot),) + figures[3:]
        for name, fn in figures:
            path = out_dir / name
            if fn(res, path):
                written.append(path)
    if (res.schedules or {}).get("async") is not None:  # trace.json (Perfetto) and gantt.png of lane 0
        written += write_timeline(out_dir, res.schedules["async"], png=plots)
    summary = out_dir / "summary.md"
    md = LM.summary_markdown if LM.is_lm(res) else summary_markdown
    write_text(summary, md(res, [p.name for p in written]) + "\n".join([*about, *summary_lines(notes, bad)]))
    written.append(summary)
    return checked(written, bad, found, yaml_text, out_dir)


def parquet_bytes(df: pd.DataFrame) -> bytes:
    """The bytes ``df.to_parquet(path, index=False)`` writes, made in memory (to hash them there)."""
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


def summary_markdown(res: RunResult, files: list) -> str:
    r = res.results
    first = r.iloc[0]
    if "corrector" not in r:
        lines = [f"# racsim run: {first['scenario']}", "", "```", format_table(r), "```", ""]
        for name, df in res.extra.items():
            lines += [f"## {name}", "", "```", format_table(df), "```", ""]
        lines += ["## Files", ""] + [f"- `{f}`" for f in files] + [""]
        return "\n".join(lines)
    if "mode" in r and (r["mode"] == "static").all():
        return _static_summary(res, files)
    static = r[r["mode"] == "static"] if "mode" in r else r.iloc[:0]
    r = r.drop(index=static.index)  # the pipeline's rows; the static ones get their own section
    first = r.iloc[0]
    lines = [
        f"# racsim run: {first['scenario']}",
        "",
        f"K = {first['K']} slow channels, {first['steps']} optimizer steps x {first['batch_size']} trajectories "
        f"per trial (the first {first['warmup_steps']} a warm-up), {first['trials']} trials, seed {first['seed']}.",
        "",
        "## Correctors",
        "",
        "Bias = || mean estimate - true gradient ||_2 of one update's gradient in the pipeline's steady state: "
        "the updates after the warm-up, each with the slow results that land at it (dropped results are lost, "
        "results still in flight when the simulation ends are not). `bias (MC)` is the Monte-Carlo figure with "
        "its standard error; `bias (exact)` its exact expectation given the simulated arrival schedule; "
        "`bias (thm)` is Theorem 2.1's prediction from the configured delay law alone (no queueing, no "
        "simulation), so it can disagree (`theorem_gap` in results.csv). `reduction` is naive's exact bias over "
        "the corrector's; its 95% CI resamples the trials (paired), whose arrival schedules are all the exact figure "
        "depends on. `run bias` is the exact bias of "
        "the whole finite run instead, where results in flight at the end are lost (`eta_end_of_run` is that "
        "loss's part of the slack). `clock x` is simulated wall-clock relative to naive. `J @ naive clock` is the "
        "true objective reached by training with that corrector within naive's wall-clock.",
        "",
        "```",
        format_table(r),
        "```",
        "",
    ]
    answer = answer_line(r)
    if answer:
        lines += [f"Answer: {answer}.", ""]
    for warning in (warmup_warning(r), stationarity_warning(res.channels)):
        if warning:
            lines += [warning[0].upper() + warning[1:] + ".", ""]
    if "first_order" in res.extra:
        lines += LAGS_NOTE + [""]
        lines += lag_markdown(res.extra["lags"]) if "lags" in res.extra else []
        lines += [f"- {x[0].upper()}{x[1:]}." for x in first_order_lines(res.extra["first_order"])] + [""]
    if len(static):
        lines += STATIC_NOTE + ["", "```", format_table(static), "```", ""]
    floor = r[r.get("at_noise_floor", False) == True]  # noqa: E712
    if len(floor):
        lines += [
            "Monte-Carlo bias at the noise floor (below 2 standard errors) for: "
            + ", ".join(floor.corrector) + ". Their Monte-Carlo ratios say little; read the exact column.",
            "",
        ]
    lines += ["## Results accounting (all channels, all trials)", "", "```",
              r[["corrector", "emitted", "injected", "dropped", "pending"]].to_string(index=False), "```", ""]
    if "generation" in res.extra:
        lines += GENERATION_NOTE + ["", "```", res.extra["generation"].T.to_string(header=False), "```", ""]
    lines += ["## Slow channels (asynchronous pipeline)", "", "```", res.channels.to_string(index=False), "```", ""]
    lines += time_section(res.timings)
    lines += ["## Files", ""] + [f"- `{f}`" for f in files] + [""]
    return "\n".join(lines)


GENERATION_NOTE = [
    "## Generation (asynchronous engines)",
    "",
    "pipeline.generation.mode=async (docs/generation.md): rollout engines ran ahead of the trainer. Per schedule "
    "(`async`: what the non-blocking correctors read; `blocking`: wait_for_slow's, gate all), over the trained "
    "samples of the measured window: `mean_lag` is the step t minus the token-weighted policy version of a "
    "sample (split into versions that passed before its group entered the queue and in it), `head_lag_*` t minus "
    "its start version (the lag AReaL caps), `last_lag_mean` t minus its last token's; `generation_s`, "
    "`reward_wait_s` (gate all) and `queue_s` the seconds from its start to its end, to its group's queue entry "
    "and to its training step. The engines' and the trainer's time splits are shares of the run; `binds` names "
    "the side that waits less (`admission` where both wait more than a quarter of the time). generation.csv and "
    "lag_histogram.csv hold these; lag.png and generation_queue.png plot them.",
]

LAGS_NOTE = [
    "## Both lags",
    "",
    "A sample trained at step t was generated by the policy of version t - L (its generation lag, "
    "pipeline.generation.lag), so the policy moves: the versions are the path of expected policy-gradient "
    "ascent on the true gradient from the learner's theta at learner.train.lr, each update scored under its "
    "own version, each slow result under the version of the step it lands at, and the bias is that of the "
    "steady updates' mean against the mean of their true gradients (docs/correctors.md, \"Both lags\"). "
    "A row named `rac+tis` is a reward-axis corrector with a rollout-axis one (corrector.rollout). "
    "Theorem 2.1's columns are empty: its condition (U) fails once the behaviour policy is older. The "
    "first-order law: the staleness part of the bias (samples L versions old against fresh ones, every "
    "reward at Delta = 0) grows as slope x lr x L for small steps; `first_order.csv` holds it lag by lag.",
]


STATIC_NOTE = [
    "## Static mode (the paper's experiment)",
    "",
    "Fixed policy, one rollout of horizon T per trial; every slow result lands with its corrector's weight at "
    "a delay drawn from its channel's kernel, none is lost at the end. `bias (MC)` is || mean of the trials' "
    "estimates - true gradient ||_2 with its standard error; `bias (exact)` the same for the exact expectation; "
    "`reduction` is naive's exact bias over the corrector's; `95% rep.` is the 2.5-97.5% range of the Monte-Carlo "
    "ratio naive / corrector over replications of this Monte Carlo at the same trial count.",
]


def _static_summary(res: RunResult, files: list) -> str:
    r = res.results
    first = r.iloc[0]
    lines = [f"# racsim run: {first['scenario']}", "",
             f"K = {first['K']} slow channels, {first['trials']} one-rollout trials, seed {first['seed']}.", ""]
    lines += STATIC_NOTE + ["", "```", format_table(r), "```", ""]
    lines += time_section(res.timings)
    lines += ["## Files", ""] + [f"- `{f}`" for f in files] + [""]
    return "\n".join(lines)
