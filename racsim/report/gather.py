"""Gather run and sweep folders into one table; the ``racsim-report`` command.

    racsim-report outputs/default/multirun_2026-01-01_12-00-00   # one sweep
    racsim-report outputs/                                       # everything

:func:`gather` finds every *complete* job under a folder (one holding a
``done.json`` marker whose files are all there, see ``racsim.sweep``) and
stacks their ``results.parquet`` tables, one row per job and corrector, with
the job's cell in front: ``job`` (Hydra's job number; empty for a single run),
``job_dir`` (relative to the folder gathered), then one column per override
of the job (``corrector.tau_age``, ``seed``...) holding its typed value, so
that ``pandas.read_parquet(...).pivot_table(...)`` works at once. An override
whose name is already a results column (``seed``, ``corrector=baselines``) is
named ``override:<key>``. The ``resume`` switch is never a column.

Jobs are ordered by folder, numbers compared as numbers (2 before 10), so the
same folder always gives the same bytes.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pandas as pd

from racsim.io import atomic_write, fmt, write_text
from racsim.markers import is_complete, job_dirs, publish, read_marker
from racsim.report.paper import paper_report

RESULTS = "results.parquet"
REPLICATES = "static_replicates.parquet"  # the replications of a static study's Monte Carlo


REPORT_ROWS = 200  # rows of the table in report.md; the full table is in results.csv


REPORT_METRICS = ["corrector", "wallclock_ratio", "bias_exact", "reduction_exact", "run_bias_exact", "vif", "slack_eta",
                  "J_at_naive_clock"]


def _natural(rel: Path) -> tuple:
    return tuple((0, int(t), "") if t.isdigit() else (1, 0, t)
                 for part in rel.parts for t in re.split(r"(\d+)", part) if t)


def find_jobs(root: Path) -> Tuple[List[Tuple[Path, dict]], List[Path]]:
    """(complete jobs with their markers, incomplete job folders) under ``root``, in order."""
    root = Path(root)
    complete, incomplete = [], []
    for d in sorted(job_dirs(root, max_depth=6), key=lambda d: _natural(d.relative_to(root))):
        m = read_marker(d)
        if m is not None and is_complete(d) and (d / RESULTS).is_file():
            complete.append((d, m))
        else:
            incomplete.append(d)
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


def _jobs(root: Path) -> Tuple[List[Tuple[Path, dict]], List[Path]]:
    if not root.exists():
        raise FileNotFoundError(f"{root}: no such folder")
    complete, incomplete = find_jobs(root)
    if not complete:
        raise FileNotFoundError(f"{root}: no complete racsim run (a folder with {RESULTS} and done.json)")
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


def _gather(root: Path, complete) -> Tuple[pd.DataFrame, List[str]]:
    """The table, and the names of its cell columns (job, job_dir, overrides)."""
    tables, cells, jobs, rels = [], [], [], []
    for d, m in complete:
        t = pd.read_parquet(d / RESULTS)
        tables.append(t)
        n = len(t)
        cell = m.get("cell") or {}
        cells.append((n, cell))
        job = m.get("job")
        jobs += [job if isinstance(job, int) else None] * n
        rels += [d.relative_to(root).as_posix() or "."] * n
    results = pd.concat(tables, ignore_index=True)

    keys: List[str] = []
    for _, cell in cells:
        keys += [k for k in cell if k not in keys]
    front: Dict[str, pd.Series] = {"job": _column(jobs), "job_dir": pd.Series(rels, dtype="object")}
    for k in keys:
        values = []
        for n, cell in cells:
            values += [cell.get(k)] * n
        name = k if k not in results.columns and k not in front else f"override:{k}"
        front[name] = _column(values)
    return pd.concat([pd.DataFrame(front), results], axis=1), list(front)


def report_markdown(df: pd.DataFrame, cell_cols: List[str], title: str, incomplete: List[str]) -> str:
    cols = cell_cols + [c for c in REPORT_METRICS if c in df.columns and c not in cell_cols]
    shown = df[cols].head(REPORT_ROWS)
    table = pd.DataFrame({c: shown[c].map(fmt) for c in cols}).to_string(index=False)
    n_jobs = df["job_dir"].nunique()
    lines = [f"# racsim report: {title}", "",
             f"{n_jobs} complete job(s), {len(df)} rows (one per job and corrector). "
             f"The full table is `results.parquet` / `results.csv`: the job's cell first (one column per "
             f"override), then the run's results.", ""]
    if incomplete:
        lines += [f"{len(incomplete)} incomplete job folder(s) left out (no `done.json`; "
                  f"rerun the sweep with `resume=true`): " + ", ".join(f"`{p}`" for p in incomplete[:20])
                  + (" ..." if len(incomplete) > 20 else ""), ""]
    lines += ["## Results" + (f" (first {REPORT_ROWS} rows)" if len(df) > REPORT_ROWS else ""), "",
              "```", table, "```", ""]
    return "\n".join(lines)


def gather_and_write(path, out: Optional[Path] = None, force: bool = False) -> Tuple[pd.DataFrame, List[Path]]:
    """Gather ``path`` and write ``results.parquet``, ``results.csv`` and
    ``report.md`` into ``out`` (default: ``path``; for a single job folder,
    whose own results are not overwritten, ``report.md`` only). A file of the
    same name there that racsim did not write is never replaced unless ``force``
    (FileExistsError; nothing is written)."""
    root = Path(path)
    complete, incomplete = _jobs(root)
    df, cell_cols = _gather(root, complete)
    is_job = out is None and any(d == root for d, _ in complete)
    out_dir = Path(out) if out is not None else root
    title = root.resolve().name
    skipped = [d.relative_to(root).as_posix() for d in incomplete]

    def write(stage: Path) -> List[Path]:
        written: List[Path] = []
        if not is_job:
            p = stage / "results.parquet"
            atomic_write(p, lambda t: df.to_parquet(t, index=False))
            c = stage / "results.csv"
            atomic_write(c, lambda t: df.to_csv(t, index=False))
            written += [p, c]
        md = stage / "report.md"
        paper = paper_report(df, stage, reps=gather_replicates(root, complete))
        write_text(md, report_markdown(df, cell_cols, title, skipped) + "\n" + paper)
        return written + [md]

    return df, publish(out_dir, write, force=force, track_edits=True)  # a report the user edits is theirs


def main(argv=None) -> None:
    """Console entry point ``racsim-report PATH [--out DIR]``."""
    ap = argparse.ArgumentParser(prog="racsim-report",
                                 description="Gather racsim run and sweep folders into one table.")
    ap.add_argument("path", help="a run folder, a sweep folder, or any folder above them (e.g. outputs/)")
    ap.add_argument("--out", help="where to write results.parquet, results.csv and report.md (default: PATH)")
    ap.add_argument("--force", action="store_true",
                    help="replace files of the same names in the output folder that racsim did not write")
    args = ap.parse_args(argv)
    try:
        df, written = gather_and_write(Path(args.path), Path(args.out) if args.out else None, force=args.force)
    except FileExistsError as ex:
        print(f"racsim-report: error: {ex}; pass --force to replace them", file=sys.stderr)
        sys.exit(2)
    except FileNotFoundError as ex:
        print(f"racsim-report: error: {ex}", file=sys.stderr)
        sys.exit(2)
    print(f"racsim-report: {df['job_dir'].nunique()} job(s), {len(df)} rows -> "
          + ", ".join(str(p) for p in written))


if __name__ == "__main__":
    main()
