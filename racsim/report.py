"""Evidence on disk: tables (Parquet and CSV), summary.md, plots; and the terminal table.

Every file is written to a temporary name in the same folder and renamed into
place, so an interrupted run never leaves a half-written result behind.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from .run import RunResult

# Columns of the terminal table, in order, with their headers.
TABLE = [
    ("corrector", "corrector"),
    ("wallclock_ratio", "clock x"),
    ("bias_mc", "bias (MC)"),
    ("mc_se", "MC s.e."),
    ("bias_exact", "bias (exact)"),
    ("bias_predicted", "bias (thm)"),
    ("reduction_exact", "reduction"),
    ("reduction_ci", "95% CI (MC)"),
    ("vif", "VIF"),
    ("slack_eta", "eta"),
    ("J_at_naive_clock", "J @ naive clock"),
]


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` then rename the result onto ``path``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(str(tmp))
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda p: Path(p).write_text(text))


def format_table(results: pd.DataFrame) -> str:
    """The results as a fixed-width text table (also used in summary.md)."""
    df = results.copy()
    if "corrector" not in df:  # an analysis (probe, TV bound): every column
        return df.drop(columns=["scenario"], errors="ignore").map(_fmt).to_string(index=False)
    if "reduction_ci_lo" in df:
        df["reduction_ci"] = [f"[{_fmt(a)}, {_fmt(b)}]" for a, b in zip(df.reduction_ci_lo, df.reduction_ci_hi)]
    cols = [(c, h) for c, h in TABLE if c in df]
    out = pd.DataFrame({h: df[c].map(_fmt) for c, h in cols})
    return out.to_string(index=False)


def _fmt(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, (bool,)):
        return str(v)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        if math.isinf(v):
            return "inf"
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e4):
            return f"{v:.2e}"
        return f"{v:.4g}"
    return str(v)


def write_outputs(out_dir: Path, res: RunResult, cfg_yaml: str, plots: bool = True) -> list:
    """Write every artifact of a run into ``out_dir``; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []

    def table(df: pd.DataFrame, stem: str, csv: bool = True) -> None:
        p = out_dir / f"{stem}.parquet"
        atomic_write(p, lambda t: df.to_parquet(t, index=False))
        written.append(p)
        if csv:
            c = out_dir / f"{stem}.csv"
            atomic_write(c, lambda t: df.to_csv(t, index=False))
            written.append(c)

    table(res.results, "results")
    for name, df in res.extra.items():
        table(df, name)
    if len(res.channels):
        table(res.channels, "channels")
    if len(res.timeline):
        table(res.timeline, "timeline", csv=False)
    if len(res.training):
        table(res.training, "training", csv=False)
    write_text(out_dir / "config.yaml", cfg_yaml)
    written.append(out_dir / "config.yaml")
    if plots and "corrector" in res.results:
        from . import plots as P

        for name, fn in (("pareto.png", P.pareto), ("training.png", P.training), ("queue.png", P.queue)):
            path = out_dir / name
            if fn(res, path):
                written.append(path)
    if (res.schedules or {}).get("async") is not None:  # trace.json (Perfetto) and gantt.png of lane 0
        from .timeline import write_timeline

        written += write_timeline(out_dir, res.schedules["async"], png=plots)
    summary = out_dir / "summary.md"
    write_text(summary, summary_markdown(res, [p.name for p in written]))
    written.append(summary)
    return written


def summary_markdown(res: RunResult, files: list) -> str:
    r = res.results
    first = r.iloc[0]
    if "corrector" not in r:
        lines = [f"# racsim run: {first['scenario']}", "", "```", format_table(r), "```", ""]
        for name, df in res.extra.items():
            lines += [f"## {name}", "", "```", format_table(df), "```", ""]
        lines += ["## Files", ""] + [f"- `{f}`" for f in files] + [""]
        return "\n".join(lines)
    lines = [
        f"# racsim run: {first['scenario']}",
        "",
        f"K = {first['K']} slow channels, {first['steps']} optimizer steps x {first['batch_size']} trajectories "
        f"per trial, {first['trials']} trials, seed {first['seed']}.",
        "",
        "## Correctors",
        "",
        "Bias = || mean estimate - true gradient ||_2. `bias (MC)` is the Monte-Carlo figure with its standard "
        "error; `bias (exact)` is the exact expectation of the finite-T estimator given the simulated arrival "
        "schedule; `bias (thm)` is Theorem 2.1's prediction from the measured delay kernel. `reduction` is "
        "naive's exact bias over the corrector's; the CI is a paired bootstrap of the Monte-Carlo ratio. "
        "`clock x` is simulated wall-clock relative to naive. `J @ naive clock` is the true objective reached "
        "by training with that corrector within naive's wall-clock.",
        "",
        "```",
        format_table(r),
        "```",
        "",
    ]
    floor = r[r.get("at_noise_floor", False) == True]  # noqa: E712
    if len(floor):
        lines += [
            "Monte-Carlo bias at the noise floor (below 2 standard errors) for: "
            + ", ".join(floor.corrector) + ". Their Monte-Carlo ratios say little; read the exact column.",
            "",
        ]
    lines += ["## Results accounting (all channels, all trials)", "", "```",
              r[["corrector", "emitted", "injected", "dropped", "pending"]].to_string(index=False), "```", ""]
    lines += ["## Slow channels (asynchronous pipeline)", "", "```", res.channels.to_string(index=False), "```", ""]
    t = res.timings
    lines += ["## Time", "", ", ".join(f"{k.replace('_s', '')} {v:.2f} s" for k, v in t.items()), ""]
    lines += ["## Files", ""] + [f"- `{f}`" for f in files] + [""]
    return "\n".join(lines)
