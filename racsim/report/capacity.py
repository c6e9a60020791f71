"""The capacity search as a user reads it: the curve, the recommendation, summary.md and the files."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional, Sequence

import pandas as pd

from racsim.analyses.capacity import CapacityResult
from racsim.config.schema import warmup_steps
from racsim.io import atomic_write, fmt, write_text
from racsim.report.finite import Unwritable, checked, non_finite, summary_lines, undefined_notes
from racsim.report.plots import capacity_curve
from racsim.report.trace import write_timeline


def speed_scope(res: CapacityResult) -> str:
    """What the speed figure times: the pipeline's draws and schedules of every count evaluated, or,
    for an autoscaled channel, of the autoscaled pool's run alone."""
    return ("the draws and schedules of the autoscaled pool's run" if res.autoscale is not None
            else "the draws and schedules of every count evaluated")


def speed_line(res: CapacityResult) -> str:
    """The one-line speed figure a capacity run prints (:func:`speed_scope` says what it times)."""
    s = res.speed
    return (f"speed: {s['lanes_requests_per_s']:.3g} simulated requests/s in the lanes engine ({speed_scope(res)}, "
            f"{s['lanes_s']:.2f} s) vs {s['raw_simpy_requests_per_s']:.3g} raw SimPy timed here "
            f"({s['speedup_vs_raw_simpy']:.1f}x)")


def format_curve(res: CapacityResult) -> str:
    """One line per count: the chosen corrector's figures and every corrector's bias."""
    c = res.curve
    chosen = res.targets["corrector"]
    base = c[c.corrector == chosen].set_index("count")
    table = pd.DataFrame({
        res.unit: base.index,
        "delay p50": base.delay_p50_steps.values,
        "delay p95": base.delay_p95_steps.values,
        "dropped": base.dropped_frac.values,
        "sojourn p95 s": base.sojourn_p95_s.values,
        f"eta ({chosen})": base.eta.values,
        "util": base.utilisation.values,
        "$/h": base.cost_per_hour.values,
    })
    if "availability" in base:  # faults: fraction of replica-seconds up, share of results lost to failures
        table.insert(4, "avail", base.availability.values)
        table.insert(5, "lost to failure", base.lost_to_failure_frac.values)
    for name in c.corrector.unique():
        sub = c[c.corrector == name].set_index("count").reindex(base.index)
        table[f"bias {name}"] = sub.bias_exact.values
    for name in c.corrector.unique():
        if name in ("naive", chosen) or name == "wait_for_slow":
            sub = c[c.corrector == name].set_index("count").reindex(base.index)
            table[f"s/step {name}"] = sub.step_s.values
    table["meets"] = ["yes" if v else "no" for v in base.feasible.values]
    return table.map(fmt).to_string(index=False)


def recommendation_text(res: CapacityResult) -> str:
    t = res.targets
    goals = []
    if t.get("max_bias") is not None:
        goals.append(f"exact bias <= {t['max_bias']:g}")
    if t.get("max_bias_vs_naive") is not None:
        goals.append(f"bias <= {t['max_bias_vs_naive']:g} x naive's")
    if t.get("max_step_s") is not None:
        goals.append(f"<= {t['max_step_s']:g} s per step")
    goal = " and ".join(goals) or "no target set (every count qualifies)"
    chosen = t["corrector"]
    if res.recommended is None:
        return (f"No evaluated count of {res.channel}'s {res.unit} meets the targets for {chosen} ({goal}); "
                f"evaluate larger counts or relax the targets.")
    row = res.curve[(res.curve.corrector == chosen) & (res.curve["count"] == res.recommended)].iloc[0]
    return (f"Recommended: {res.recommended} {res.unit} for {res.channel} with {chosen} ({goal}): "
            f"bias {row.bias_exact:.4g} ({row.bias_vs_naive:.3g} x naive's), {row.step_s:.3g} s per step, "
            f"delay p50/p95 {row.delay_p50_steps:g}/{row.delay_p95_steps:g} steps, "
            f"sojourn p95 {row.sojourn_p95_s:.3g} s, eta {row.eta:.3g}, "
            f"utilisation {row.utilisation:.0%}, ${row.cost_per_hour:.2f} per training hour "
            f"(${row.cost_per_1000_steps:.2f} per 1000 steps).")


def autoscale_verdict(table: pd.DataFrame, corrector: str) -> str:
    """One sentence: the autoscaled pool against the cheapest fixed pool meeting the targets, for
    the capacity search's corrector (rows of the what-if table)."""
    rows = table[table.corrector == corrector]
    auto = rows[rows.pool == "autoscaled"].iloc[0]
    fixed = rows[(rows.pool != "autoscaled") & rows.meets]
    cost = ("an unmeasured amount (a blocking corrector; its cost is measured on the asynchronous pipeline)"
            if pd.isna(auto.cost_per_1000_steps) else f"${auto.cost_per_1000_steps:.2f} per 1000 steps")
    head = (f"For {corrector}, the autoscaled pool costs {cost} ({auto.servers:.2f} servers billed on average) "
            f"and {'meets' if auto.meets else 'misses'} the targets")
    if fixed.empty:
        return head + "; no evaluated fixed pool meets them."
    best = fixed.sort_values(["cost_per_1000_steps", "servers"]).iloc[0]
    return (head + f"; the cheapest fixed pool meeting them, {best.pool.split()[1]} servers, costs "
            f"${best.cost_per_1000_steps:.2f} per 1000 steps.")


def autoscale_section(cfg: Any, res: CapacityResult) -> List[str]:
    """The autoscaled pool against the fixed pools evaluated, per corrector."""
    a = cfg.pipeline.channels[res.channel].autoscale
    table = res.autoscale.rename(columns={
        "servers": "servers (mean billed)", "bias_exact": "bias", "bias_vs_naive": "x naive", "step_s": "s/step",
        "delay_p95_steps": "delay p95", "sojourn_p95_s": "sojourn p95 s", "dropped_frac": "dropped",
        "cost_per_1000_steps": "$/1000 steps"})
    return ["## Autoscaling what-if", "",
            f"{res.channel}'s pool sized by its rule (from {a.min} to {a.max} servers; one more after more than "
            f"{a.queue_above} requests waited {a.for_s:g} s, serving {a.startup_s:g} s later; one released after "
            f"{a.idle_s:g} s idle) against every fixed pool the search evaluated (always {a.min} and {a.max}), "
            "on the same draws. `servers`: "
            "servers billed on average over the measured steps (a server counts from its request to its release); "
            "`bias` the exact bias, `x naive` its ratio to naive's, `s/step` the wall-clock per step, delays "
            "in steps and sojourn in seconds of the asynchronous pipeline, `$/1000 steps` the pool's cost per "
            "1000 optimizer steps (autoscaled: billed server-seconds of the asynchronous pipeline, so - for "
            "blocking correctors), `meets` whether the row meets the capacity targets.", "",
            autoscale_verdict(res.autoscale, res.targets["corrector"]), "",
            "```", table.map(fmt).to_string(index=False), "```", ""]


def capacity_summary_markdown(cfg: Any, res: CapacityResult, files: List[str]) -> str:
    lines = [f"# racsim capacity plan: {cfg.name}", "", str(cfg.description or ""), "",
             "## Recommendation", "", recommendation_text(res), ""]
    per = res.per_corrector
    lines += ["Fewest units meeting the same targets, per corrector (- : none of the evaluated counts):", "", "```",
              per.assign(fewest=per.fewest.map(lambda v: "-" if v is None or pd.isna(v) else str(int(v))))
              .to_string(index=False), "```", ""]
    lines += ["## Capacity curve", "",
              f"Per count of {res.channel}'s {res.unit} ({res.key}); delays in optimizer steps of the "
              "asynchronous pipeline and sojourn (submit to result) in seconds, both measured from step "
              f"{warmup_steps(cfg.pipeline)} on (`pipeline.warmup_steps`), `eta` the slack of the chosen corrector's "
              "effective kernel, bias the exact bias of each corrector, `util` the pool's busy fraction, "
              "`$/h` the pool's price per training hour"
              + ("; `avail` the fraction of replica-seconds up and `lost to failure` the share of results lost to "
                 "failures (faults)." if "availability" in res.curve else "."),
              "", "```", format_curve(res), "```", ""]
    if res.autoscale is not None:
        lines += autoscale_section(cfg, res)
    if res.speed:
        s = res.speed
        lines += ["## Simulator speed", "",
                  f"{s['requests']:.3g} requests simulated by the lanes engine in {s['lanes_s']:.2f} s "
                  f"({speed_scope(res)}, timed as it ran them; not the bias, tables and plots): "
                  f"{s['lanes_requests_per_s']:.3g} requests/s. Raw SimPy (a process per request on a Resource, "
                  f"{s['raw_simpy_sample']:.0f} requests, same run): {s['raw_simpy_requests_per_s']:.3g} requests/s, "
                  f"so {s['raw_simpy_s_for_all']:.1f} s for the same requests ({s['speedup_vs_raw_simpy']:.1f}x). "
                  f"racsim's SimPy engine of record (batcher process, replica resources): "
                  f"{s['simpy_engine_requests_per_s']:.3g} requests/s.", ""]
    t = res.timings
    lines += ["## Time", "", ", ".join(f"{k.replace('_s', '')} {v:.2f} s" for k, v in t.items()), ""]
    lines += ["## Files", ""] + [f"- `{f}`" for f in files] + [""]
    return "\n".join(lines)


def write_capacity(out_dir: Path, cfg: Any, res: CapacityResult, cfg_yaml: str, plots: bool = True,
                   found: Optional[List[Unwritable]] = None, about: Sequence[str] = ()) -> list:
    """Write a capacity run's files into ``out_dir``; returns the paths written. ``found``,
    ``about``: as racsim.report.writers.write_outputs's."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    tables = [("capacity", res.curve), ("results", res.best.results), ("channels", res.best.channels)]
    if res.autoscale is not None:
        tables.append(("autoscale", res.autoscale))
    bad: List[Unwritable] = [] if found is None else found
    notes: List[str] = []
    for stem, df in tables:
        bad.extend(non_finite(df, stem))
        notes.extend(undefined_notes(df, stem))
        p = out_dir / f"{stem}.csv"
        atomic_write(p, lambda t, df=df: df.to_csv(t, index=False))
        written.append(p)
    p = out_dir / "capacity.parquet"
    atomic_write(p, lambda t: res.curve.to_parquet(t, index=False))
    written.append(p)
    write_text(out_dir / "config.yaml", cfg_yaml)
    written.append(out_dir / "config.yaml")
    if plots:
        if capacity_curve(res, out_dir / "capacity.png"):
            written.append(out_dir / "capacity.png")
    sched = (res.best.schedules or {}).get("async")
    if sched is not None:
        written += write_timeline(out_dir, sched, png=plots)
    summary = out_dir / "summary.md"
    write_text(summary, capacity_summary_markdown(cfg, res, [p.name for p in written])
               + "\n".join([*about, *summary_lines(notes, bad)]))
    written.append(summary)
    return checked(written, bad, found, cfg_yaml, out_dir)
