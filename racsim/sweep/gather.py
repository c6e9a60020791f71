"""Gather run and sweep folders into one table; the ``racsim-report`` command.

    racsim-report outputs/default/multirun_2026-01-01_12-00-00   # one sweep
    racsim-report outputs/                                       # everything

:func:`gather` finds every *complete* job under a folder (one holding a
``done.json`` marker whose files are all there, see ``racsim.sweep.callback``) and
stacks their ``results.parquet`` tables, one row per job and corrector, with
the job's cell in front: ``job_dir`` (relative to the folder gathered: a sweep
job's number), then one column per override of the job (``corrector.tau_age``,
``seed``...) holding its typed value, so that
``pandas.read_parquet(...).pivot_table(...)`` works at once; a multi-cell job's
rows carry their study-grid cell's columns as its results do. An override
whose name is already a results column (``seed``, ``corrector=baselines``) is
named ``override:<key>``. The ``resume`` switch is never a column.

The answer (report.md, ``aggregate.parquet``/``.csv``, and what a sweep prints at its end)
is that table averaged over seeds, one row per cell and corrector, with a plot per swept
numeric knob (racsim.report.aggregate).

Jobs are ordered by folder, numbers compared as numbers (2 before 10), so the
same folder always gives the same bytes.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import pandas as pd

from racsim.analyses.capacity import fewest
from racsim.errors import WIDTH, Parser, WriteFailure, interruptible, say, wrapped, write_failure, wrote_line
from racsim.io import atomic_write, fmt, write_text
from racsim.progress import Progress
from racsim.sweep.markers import is_complete, job_dirs, publish, read_marker
from racsim.report.aggregate import (INTERVAL_NOTE, aggregate, fixed, format_aggregate, health_line, seed_axes,
                                     write_knob_plots)
from racsim.report.frontier import format_frontier, frontier_note, frontier_table, write_frontier_plot
from racsim.report.paper import paper_report
from racsim.report.tables import grid_columns, with_health

RESULTS = "results.parquet"
CHANNELS = "channels.parquet"  # a run's slow channels: its health record's steady state, load and drops
CAPACITY = "capacity.parquet"  # a capacity plan's curve: its job gathers as one row per corrector (capacity_rows)
REPLICATES = "static_replicates.parquet"  # the replications of a static study's Monte Carlo
TRAINING = "training.parquet"  # a run's training curves: an async sweep's frontier reads J at equal wall-clock


REPORT_ROWS = 200  # rows of the table in report.md; the full table is in aggregate.csv


def _natural(rel: Path) -> tuple:
    return tuple((0, int(t), "") if t.isdigit() else (1, 0, t)
                 for part in rel.parts for t in re.split(r"(\d+)", part) if t)


def find_jobs(root: Path, progress: Optional[Progress] = None) -> Tuple[List[Tuple[Path, dict]], List[Path]]:
    """(complete jobs with their markers, incomplete job folders) under ``root``, in order
    (``progress``: the phase ``checking the job folders``, each one's files against its marker)."""
    root = Path(root)
    progress = progress or Progress.off()
    complete, incomplete = [], []
    folders = sorted(job_dirs(root, max_depth=6), key=lambda d: _natural(d.relative_to(root)))
    progress.start("checking the job folders", len(folders), "folder")
    for d in folders:
        m = read_marker(d)
        if m is not None and is_complete(d) and ((d / RESULTS).is_file() or (d / CAPACITY).is_file()):
            complete.append((d, m))
        else:
            incomplete.append(d)
        progress.advance()
    return complete, incomplete


def _column(values: List[Any]) -> pd.Series:
    """One type per column, so that Parquet can hold it: ints, floats, bools or
    text; a column that mixes them is written as text."""
    kinds = {type(v) for v in values if v is not None}
    if kinds <= {int}:
        return pd.Series(values, dtype="Int64")
    if kinds <= {int, float}:
        return pd.Series([float("nan") if v is None else float(v) for v in values], dtype="float64")
    if kinds <= {bool}:
        return pd.Series(values, dtype="boolean")
    return pd.Series([None if v is None else str(v) for v in values], dtype="object")


def gather(path) -> pd.DataFrame:
    """Every complete job under ``path`` (a run folder, a sweep folder or any
    folder above them) as one table. Raises FileNotFoundError when there is none."""
    root = Path(path)
    return _gather(root, _jobs(root)[0])[0]


def _jobs(root: Path, progress: Optional[Progress] = None) -> Tuple[List[Tuple[Path, dict]], List[Path]]:
    if not root.exists():
        raise FileNotFoundError(f"{root}: no such folder")
    complete, incomplete = find_jobs(root, progress)
    if not complete:
        raise FileNotFoundError(f"{root}: no complete racsim run (a folder with {RESULTS} or {CAPACITY}, "
                                f"and done.json)")
    return complete, incomplete


def gather_replicates(root: Path, complete) -> pd.DataFrame:
    """Every job's ``static_replicates.parquet`` (static mode), with its ``job_dir``."""
    tables = []
    for d, _ in complete:
        p = d / REPLICATES
        if p.exists():
            t = pd.read_parquet(p)
            t.insert(0, "job_dir", d.relative_to(root).as_posix() or ".")
            tables.append(t)
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()


def training_tables(root: Path, complete, jobs) -> Dict[str, pd.DataFrame]:
    """job_dir -> its ``training.parquet``, for the ``jobs`` (job_dirs, as :func:`gather` names them) that trained."""
    rel = {d: d.relative_to(root).as_posix() or "." for d, _ in complete}
    return {rel[d]: pd.read_parquet(d / TRAINING) for d, _ in complete if rel[d] in jobs and (d / TRAINING).is_file()}


def async_jobs(df: pd.DataFrame) -> set:
    """The job_dirs of a gathered table whose rows carry asynchronous generation's figures."""
    return set(df.job_dir[df.steps_per_hour.notna()]) if "steps_per_hour" in df else set()


def capacity_rows(curve: pd.DataFrame) -> pd.DataFrame:
    """A capacity plan's answer as rows like a run's results, one per corrector (the synchronous
    oracle aside: a reference, not a pipeline): the channel, the fewest count that meets the plan's
    targets (racsim.analyses.capacity.fewest; NaN when none does), its offered load, and the
    corrector's bias, seconds per step and dropped share there."""
    rows = []
    for name in [c for c in curve["corrector"].unique() if c != "sync_oracle"]:
        n = fewest(curve, name)
        at = curve[(curve["corrector"] == name) & (curve["count"] == n)]
        row = {"channel": curve["channel"].iloc[0], "corrector": name,
               "recommended": float("nan") if n is None else float(n), "counts_tried": int(curve["count"].nunique())}
        for col, out in (("load", "recommended_load"), ("bias_exact", "recommended_bias"),
                         ("step_s", "recommended_step_s"), ("dropped_frac", "recommended_dropped")):
            row[out] = float(at[col].iloc[0]) if len(at) else float("nan")
        # the health of the answer: the recommended count's steady state (none: no count meets the targets)
        row.update(stationary=bool(at["stationary"].iloc[0]) if len(at) and "stationary" in at else None,
                   offered_load=row["recommended_load"], dropped_share=row["recommended_dropped"],
                   warnings="" if len(at) else "no count meets the targets")
        rows.append(row)
    return pd.DataFrame(rows).astype({"stationary": "boolean"})


def job_table(d: Path) -> pd.DataFrame:
    """A complete job's rows: its results with their health record (racsim.report.tables.with_health, from
    its channels' table where it has one), or its capacity plan's answer (:func:`capacity_rows`)."""
    if not (d / RESULTS).is_file():
        return capacity_rows(pd.read_parquet(d / CAPACITY))
    channels = pd.read_parquet(d / CHANNELS) if (d / CHANNELS).is_file() else None
    return with_health(pd.read_parquet(d / RESULTS), channels)


def _gather(root: Path, complete, progress: Optional[Progress] = None) -> Tuple[pd.DataFrame, List[str]]:
    """The table, and its axes: the columns of the jobs' overrides, then of their study-grid cells
    (``progress``: the phase ``reading the tables``, a unit per job)."""
    progress = progress or Progress.off()
    progress.start("reading the tables", len(complete), "job")
    tables, cells, rels, grid = [], [], [], []
    for d, m in complete:
        t = job_table(d)
        tables.append(t)
        grid += [k for k, _ in grid_columns(t) if k not in grid]
        cell = m.get("cell") or {}
        cells.append((len(t), cell))
        rels += [d.relative_to(root).as_posix() or "."] * len(t)
        progress.advance()
    results = pd.concat(tables, ignore_index=True)

    keys: List[str] = []
    for _, cell in cells:
        keys += [k for k in cell if k not in keys]
    front: Dict[str, pd.Series] = {"job_dir": pd.Series(rels, dtype="object")}
    for k in keys:
        values = []
        for n, cell in cells:
            values += [cell.get(k)] * n
        name = k if k not in results.columns and k not in front else f"override:{k}"
        front[name] = _column(values)
    return pd.concat([pd.DataFrame(front), results], axis=1), list(front)[1:] + grid


def report_markdown(df: pd.DataFrame, agg: pd.DataFrame, axes: List[str], title: str, incomplete: List[str],
                    plots: List[str], front: Optional[pd.DataFrame] = None) -> str:
    """report.md's head: what was gathered, the aggregated table, the knob plots (none: no section), and an
    asynchronous sweep's frontier (``front``, racsim.report.frontier; none or empty: no section)."""
    seeds = seed_axes(axes)
    names = ", ".join(f"`{a.split(':', 1)[-1]}`" for a in seeds)
    over = (f"averaged over {names}: each figure the {INTERVAL_NOTE}" if seeds
            else "each figure one run's (no seed axis: nothing to average)")
    table = format_aggregate(agg.head(REPORT_ROWS))
    lines = [f"# racsim report: {title}", "",
             f"{df['job_dir'].nunique()} complete job(s), {len(df)} rows (one per job and corrector), in "
             f"`results.parquet` / `results.csv`: the job's cell first (one column per override), then the run's "
             f"results.", ""]
    if incomplete:
        lines += [f"{len(incomplete)} incomplete job folder(s) left out (no `done.json`; "
                  f"rerun the sweep with `resume=true`): " + ", ".join(f"`{p}`" for p in incomplete[:20])
                  + (" ..." if len(incomplete) > 20 else ""), ""]
    shared = fixed(df, axes)
    warning = health_line(agg)
    lines += ["## Results per cell" + (f" (first {REPORT_ROWS} rows)" if len(agg) > REPORT_ROWS else ""), "",
              f"One row per cell and corrector (`aggregate.parquet` / `aggregate.csv`), {over}."
              + (" Every job had " + ", ".join(f"`{k}={fmt(v)}`" for k, v in shared.items()) + "." if shared else ""),
              "", HEALTH_NOTE, "",
              "```", table, "```", ""] + ([warning[0].upper() + warning[1:] + ".", ""] if warning else [])
    knob_plots = [p for p in plots if p != FRONTIER_PNG]
    if knob_plots:
        lines += ["## Swept knobs", "", "Bias and simulated wall-clock against each swept numeric knob, "
                  "one series per corrector, bars the 95% t interval over seeds.", ""]
        lines += [f"![{p}]({p})" for p in knob_plots] + [""]
    if front is not None and len(front):
        lines += ["## Throughput against staleness (asynchronous generation)", "",
                  f"`frontier.parquet` / `frontier.csv`: {frontier_note(front)}.", "",
                  "```", format_frontier(front), "```", ""]
        lines += [f"![{FRONTIER_PNG}]({FRONTIER_PNG})", ""] if FRONTIER_PNG in plots else []
    return "\n".join(lines)


HEALTH_NOTE = ("`health` says whether a cell's figures are steady-state ones, over its seeds (columns `stationary`, "
               "`offered_load`, `dropped_share` and `warnings` of `aggregate.csv`): `ok`, or an offered load at or "
               "above 1 (the slow channel's backlog grows for as long as the run lasts), a channel not stationary "
               "over the measured window, more than 1% of a channel's results dropped, a warm-up too short for "
               "the delays; `?` where a run has no slow channels' statistics.")


class Gathered(NamedTuple):
    table: pd.DataFrame  # one row per job and corrector (results.parquet)
    aggregate: pd.DataFrame  # one row per cell and corrector, over seeds (aggregate.parquet)
    written: List[Path]
    frontier: Optional[pd.DataFrame] = None  # async generation: one row per cell (frontier.parquet); else empty


FRONTIER_PNG = "frontier.png"


def gather_and_write(path, out: Optional[Path] = None, force: bool = False, plots: bool = True,
                     progress: Optional[Progress] = None) -> Gathered:
    """Gather ``path`` and write ``results.parquet``, ``results.csv``, ``aggregate.parquet``,
    ``aggregate.csv``, the knob plots (``plots``) and ``report.md`` into ``out`` (default: ``path``;
    for a single job folder, whose own results are not overwritten, ``report.md`` and plots only).
    A file of the same name there that racsim did not write is never replaced unless ``force``
    (FileExistsError; nothing is written). ``progress``: its phases, planned first."""
    progress = progress or Progress.off()
    progress.plan("checking the job folders", "reading the tables", "writing the report")
    root = Path(path)
    complete, incomplete = _jobs(root, progress)
    df, axes = _gather(root, complete, progress)
    progress.start("writing the report", 1, note="the table averaged over seeds, its plots, report.md")
    agg = aggregate(df, axes)
    front = frontier_table(df, axes, training_tables(root, complete, async_jobs(df)))
    is_job = out is None and any(d == root for d, _ in complete)
    out_dir = Path(out) if out is not None else root
    title = root.resolve().name
    skipped = [d.relative_to(root).as_posix() for d in incomplete]

    def write(stage: Path) -> List[Path]:
        written: List[Path] = []
        if not is_job:
            tables = (("results", df), ("aggregate", agg)) + ((("frontier", front),) if len(front) else ())
            for stem, table in tables:
                p, c = stage / f"{stem}.parquet", stage / f"{stem}.csv"
                atomic_write(p, lambda t, table=table: table.to_parquet(t, index=False))
                atomic_write(c, lambda t, table=table: table.to_csv(t, index=False))
                written += [p, c]
        figures = write_knob_plots(agg, stage) if plots else []
        if plots and len(front):
            write_frontier_plot(front, stage / FRONTIER_PNG)
            figures.append(stage / FRONTIER_PNG)
        md = stage / "report.md"
        paper = paper_report(df, stage, reps=gather_replicates(root, complete))
        head = report_markdown(df, agg, axes, title, skipped, [p.name for p in figures], front)
        write_text(md, head + ("\n" + paper if paper else ""))
        return written + figures + [md]

    written = publish(out_dir, write, force=force, track_edits=True)  # a report the user edits is theirs
    progress.finish()
    return Gathered(df, agg, written, front)


def answer_text(g: Gathered) -> str:
    """What a sweep prints at its end: the aggregated table (the first REPORT_ROWS rows)."""
    more = f" (first {REPORT_ROWS} of {len(g.aggregate)} rows: aggregate.csv)" if len(g.aggregate) > REPORT_ROWS else ""
    warning = health_line(g.aggregate)
    text = (f"one row per cell and corrector{more}:\n{format_aggregate(g.aggregate.head(REPORT_ROWS), WIDTH)}"
            + (f"\n{warning}" if warning else ""))
    if g.frontier is not None and len(g.frontier):
        text += "\n" + wrapped(f"throughput against staleness (frontier.csv), {frontier_note(g.frontier)}:", WIDTH)
        text += "\n" + format_frontier(g.frontier.head(REPORT_ROWS), WIDTH)
    return text


@interruptible("racsim-report")
def main(argv=None) -> None:
    """Console entry point ``racsim-report PATH [--out DIR]``."""
    ap = Parser(prog="racsim-report",
                                 description="Gather racsim run and sweep folders into one table.")
    ap.add_argument("path", help="a run folder, a sweep folder, or any folder above them (e.g. outputs/)")
    ap.add_argument("--out", help="where to write results.parquet, results.csv and report.md (default: PATH)")
    ap.add_argument("--force", action="store_true",
                    help="replace files of the same names in the output folder that racsim did not write")
    ap.add_argument("--no-plots", action="store_true", help="no plot per swept knob")
    args = ap.parse_args(argv)
    try:
        with Progress(prog="racsim-report") as progress:
            g = gather_and_write(Path(args.path), Path(args.out) if args.out else None, force=args.force,
                                 plots=not args.no_plots, progress=progress)
    except FileExistsError as ex:
        say(f"racsim-report: error: {ex}; pass --force to replace them", sys.stderr)
        sys.exit(2)
    except FileNotFoundError as ex:
        say(f"racsim-report: error: {ex}", sys.stderr)
        sys.exit(2)
    except WriteFailure as ex:
        say(f"racsim-report: error: {write_failure(ex, '--out DIR')}", sys.stderr)
        sys.exit(2)
    say(f"racsim-report: {g.table['job_dir'].nunique()} job(s), {len(g.table)} rows, {answer_text(g)}")
    say(wrote_line("racsim-report", g.written))


if __name__ == "__main__":
    main()
