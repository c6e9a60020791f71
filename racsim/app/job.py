"""What one job of the ``racsim`` command does once its config is composed, with everything it
needs imported: the simulator and its reports (numpy, pandas, scipy, ~1-2 s). racsim.app.cli loads
this module when a job runs (its one lazy import), so that ``racsim --help`` and usage errors
answer at once; ``racsim.run`` (racsim.app.api) computes and writes through it too."""

from __future__ import annotations

import time
from typing import Optional

from racsim.analyses.capacity import CapacityResult
from racsim.analyses.dispatch import compute
from racsim.config.defaults import compose_config
from racsim.config.dump import config_yaml
from racsim.config.validate import memory_error
from racsim.config.spec import scenario
from racsim.errors import WIDTH, wrapped
from racsim.report import inputs as report_inputs
from racsim.report.capacity import recommendation_text, sensitivity_text, speed_line, terminal_curve
from racsim.report.finite import failure
from racsim.report.generation import console_text
from racsim.report.lags import first_order_lines, lag_text
from racsim.report.lm import format_paired, share_note, verdict_lines
from racsim.report.tables import answer_line, format_table, stationarity_warning, warmup_warning
from racsim.report.writers import write_run
from racsim.sweep.callback import check_writable, publish_run
from racsim.sweep.markers import DONE, cell_overrides, cell_values, override_key, write_marker

TERMINAL_ROWS = 60  # the rows of a table a run prints (racsim.errors.WIDTH its width); its files hold everything
WRITING = "writing the files"  # a run's last phase (racsim.progress), once it is computed

# what racsim.app.cli and racsim.app.api take from here
__all__ = ["CapacityResult", "DONE", "WRITING", "capacity_text", "cell_overrides", "cell_values", "check_writable",
           "compose_config", "compute", "config_yaml", "failure", "inputs_of", "memory_error", "override_key",
           "publish_run", "run_text", "scenario", "write_marker", "write_run"]


def waited(res, started: Optional[float]) -> str:
    """The seconds a line says a run took: since ``started`` (a perf_counter reading: the command's start,
    what its user waited), else the run's own timings summed."""
    return f"{(time.perf_counter() - started) if started is not None else sum(res.timings.values()):.1f} s"


def run_text(cfg, res, started: Optional[float] = None) -> str:
    """What a single run prints: one line on what ran (in the seconds :func:`waited`), the table, its answer
    (which corrector, why, at what cost: racsim.report.tables.answer_line), the warm-up and stationarity
    warnings if any (learner=lm: what a share outside [0, 1] means)."""

    took = waited(res, started)
    if res.bias is not None:
        r = res.results
        cells = f", {r['cell'].nunique()} cells" if "cell" in r else ""
        ks = f"{r['K'].min()}..{r['K'].max()}" if r["K"].nunique() > 1 else f"{r['K'].iloc[0]}"
        head = (f"racsim: {cfg.name}: K={ks}, {r['trials'].iloc[0]} trials{cells}, "
                f"{res.trajectories} trajectories in {took}")
    elif cfg.learner.kind == "lm":
        seeds = int(res.results["seeds"].iloc[0]) if "seeds" in res.results else cfg.learner.lm.seeds
        head = f"racsim: {cfg.name}: GRPO ({cfg.learner.lm.policy}), {seeds} seeds per corrector in {took}"
    else:
        head = f"racsim: {cfg.name}: {cfg.study.kind} in {took}"
    warnings = ([warmup_warning(res.results), stationarity_warning(res.channels)] if res.bias is not None
                else [share_note(res.results)])
    verdicts, paired = [], []
    if "lm_paired" in res.extra:  # an LM run's answer first: rac against each other corrector, seed by seed
        verdicts = [f"racsim: {v}" for v in verdict_lines(res.extra["lm_paired"], res.extra.get("lm_seed_rule"))]
        paired = [format_paired(res.extra["lm_paired"])]
    if "lags" in res.extra:  # a run across generation lags: its pairs x lags table (every row in results.csv)
        table = lag_text(res.extra["lags"], WIDTH)
    else:
        table = format_table(res.results, width=WIDTH, max_rows=TERMINAL_ROWS)
    laws = [f"racsim: {x}" for x in first_order_lines(res.extra["first_order"])] if "first_order" in res.extra else []
    gen = res.extra.get("generation")  # async generation: the async schedule's figures (the first cell's)
    block = [] if gen is None else [f"racsim: {console_text(gen[gen.schedule == 'async'].iloc[0])}"]
    answer = answer_line(res.results) if res.bias is not None else ""
    said = [f"racsim: {w}" for w in [f"answer: {answer}" if answer else "", *warnings] if w]
    return wrapped("\n".join([head, *verdicts, table, *paired, *laws, *block, *said]), WIDTH)


def capacity_text(cfg, res, started: Optional[float] = None) -> str:
    """What a capacity plan prints: the curve's essential columns (counts and the seconds :func:`waited`, the
    search's alone without ``started``), the recommendation and the simulator's speed, each line at most WIDTH
    wide (the files hold every column)."""

    took = waited(res, started) if started is not None else f"{res.timings.get('search_s', 0.0):.1f} s"
    lines = [f"racsim: {cfg.name}: capacity of {res.channel} ({res.unit}), {len(res.curve['count'].unique())} counts "
             f"in {took}", terminal_curve(res, WIDTH), recommendation_text(res)]
    if res.sensitivity is not None:
        lines.append(sensitivity_text(res, cfg.capacity.sensitivity.spread))
    if res.speed:
        lines.append(f"racsim: {speed_line(res)}")
    return wrapped("\n".join(lines), WIDTH)


def inputs_of(cfg, hc) -> tuple:
    """(summary.md's lines on what the run was given, the changes racsim made to a user's data):
    racsim.report.inputs, from the run's spec (racsim.config.spec.scenario) and Hydra's choices and overrides."""

    overrides = list(hc.overrides.task)
    changes = report_inputs.data_changes(cfg)
    return report_inputs.summary_lines(report_inputs.channel_laws(cfg, hc.runtime.choices, overrides), changes, overrides), changes
