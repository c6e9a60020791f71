"""The capacity search as a user reads it: the curve, the recommendation, summary.md and the files."""

from __future__ import annotations

import itertools

from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence

import numpy as np
import pandas as pd

from racsim.analyses.capacity import BATCH_CYCLES, TARGET_FIGURES, CapacityResult, slowest_regime
from racsim.config.schema import RacsimConf
from racsim.pipeline.steady import N_BATCHES, TREND_P
from racsim.io import atomic_write, fmt, write_text
from racsim.report.finite import Unwritable, checked, non_finite, summary_lines, undefined_notes
from racsim.report.plots import capacity_curve
from racsim.errors import wrapped
from racsim.report.tables import fitted, time_section
from racsim.report.trace import write_timeline


def speed_scope(res: CapacityResult) -> str:
    """What the speed figure times: the pipeline's draws and schedules of every count evaluated (the
    token lengths, the same for every count, drawn once: racsim.io.recall), or, for an autoscaled
    channel, of the autoscaled pool's run alone."""
    return ("the draws and schedules of the autoscaled pool's run" if res.autoscale is not None
            else "the schedules of every count evaluated and their draws, tokens drawn once for all")


def speed_line(res: CapacityResult) -> str:
    """The one-line speed figure a capacity run prints (:func:`speed_scope` says what it times)."""
    s = res.speed
    return (f"speed: {s['lanes_requests_per_s']:.3g} simulated requests/s in the lanes engine ({speed_scope(res)}, "
            f"{s['lanes_s']:.2f} s of simulation, summed over the processes that ran them) vs "
            f"{s['raw_simpy_requests_per_s']:.3g} raw SimPy timed here "
            f"({s['speedup_vs_raw_simpy']:.1f}x)")


def _steady(row) -> str:
    """The status column: ok with the run's length and warm-up, or why there is no steady state."""
    if row.status == "ok":
        return f"ok {int(row.steps)} (w {int(row.warmup_steps)})"
    return row.status.split(":")[0]


def format_curve(res: CapacityResult) -> str:
    """One line per count: the offered load and steady-state status first, the chosen corrector's
    figures (bias with its interval, step seconds), the channel's, then every other corrector's
    bias; units in the headers."""
    c = res.curve
    chosen = res.targets["corrector"]
    base = c[c.corrector == chosen].set_index("count")
    pct = lambda v: v * 100.0  # noqa: E731
    table = pd.DataFrame({
        res.unit: base.index,
        "load": base.load.values,
        "steady: steps (warm-up)": [_steady(r) for r in base.itertuples()],
        f"bias {chosen}": base.bias_exact.values,
        f"{res.level:.0%} interval": [f"[{fmt(lo)}, {fmt(hi)}]" if pd.notna(lo) else "-"
                                     for lo, hi in zip(base.get("bias_exact_lo", base.bias_exact),
                                                       base.get("bias_exact_hi", base.bias_exact))],
        "x naive (upper)": base.get("bias_vs_naive_hi", base.bias_vs_naive).values,
        "s/step (upper)": base.get("step_s_hi", base.step_s).values,
        "delay p95 (steps)": base.delay_p95_steps.values,
        "sojourn p95 (s)": base.sojourn_p95_s.values,
        "sojourn p99 (s)": base.sojourn_p99_s.values,
        "dropped (%)": pct(base.dropped_frac.values),
        "busy (%)": pct(base.utilisation.values),
        "useful (%)": pct(base.useful.values) if "useful" in base else np.nan,
    })
    if "availability" in base:  # faults: fraction of replica-seconds up, share of results lost to failures
        table["up (%)"] = pct(base.availability.values)  # the simulated run's, not the load's assumption
        table["lost to failure (%)"] = pct(base.lost_to_failure_frac.values)
    if "load_background" in base:  # a shared channel: its other tenants' part of the load and their sojourn
        table["load of others"] = base.load_background.values
        table["others' sojourn p95 (s)"] = base.background_sojourn_p95_s.values
    table["$/h"] = base.cost_per_hour.values
    for name in c.corrector.unique():
        if name != chosen:
            sub = c[c.corrector == name].set_index("count").reindex(base.index)
            table[f"bias {name}" + (" (ref.)" if name == "sync_oracle" else "")] = sub.bias_exact.values
    if "wait_for_slow" in set(c.corrector) and chosen != "wait_for_slow":
        sub = c[c.corrector == "wait_for_slow"].set_index("count").reindex(base.index)
        table["s/step wait_for_slow"] = sub.step_s.values
    table["meets"] = ["yes" if v else "no" for v in base.feasible.values]
    table["fails"] = [f or "-" for f in base.fails.values]
    return table.map(fmt).to_string(index=False)


# The terminal's capacity table drops these columns first, in this order, when it is wider than the terminal
# (curve.csv and summary.md's table keep every column).
CURVE_LEAST_ESSENTIAL = ("lost %", "up %", "others p95 s", "p95 s", "busy %", "drop %", "$/h")
CURVE_SHORT = {"p95 s": "p95 s: sojourn p95", "drop %": "drop %: dropped", "lost %": "lost %: lost to failure",
               "up %": "up %: share of server-seconds up", "others p95 s": "others p95 s: other tenants' sojourn p95"}
# the terminal's `fails` column names a missed target by its figure
FAILS_SHORT = {"max_bias": "bias", "max_bias_vs_naive": "xnaive", "max_step_s": "step", "max_dropped": "drop",
               "max_sojourn_p95_s": "p95", "max_sojourn_p99_s": "p99", "max_delay_p95_steps": "delay",
               "max_background_sojourn_p95_s": "others"}


def terminal_curve(res: CapacityResult, width: int) -> str:
    """The capacity curve for a terminal at most ``width`` wide: per count the offered load, the steady
    state, the chosen corrector's bias with its interval, seconds per step, sojourn p95, dropped, busy,
    (under faults) up and lost to failure, price per hour and what the count fails (a target by its
    figure); less of these (:data:`CURVE_LEAST_ESSENTIAL`) if it is still wider, and a line saying
    where the rest is."""
    c = res.curve
    chosen = res.targets["corrector"]
    base = c[c.corrector == chosen].set_index("count")
    pct = lambda v: v * 100.0  # noqa: E731
    lo, hi = base.get("bias_exact_lo", base.bias_exact), base.get("bias_exact_hi", base.bias_exact)
    table = pd.DataFrame({
        res.unit: base.index,
        "load": base.load.values,
        "steady": [_steady(r).split(" at ")[0] for r in base.itertuples()],
        f"bias {chosen} [{res.level:.0%}]": [f"{fmt(b)} [{fmt(a)}, {fmt(z)}]" if pd.notna(a) else fmt(b)
                                             for b, a, z in zip(base.bias_exact, lo, hi)],
        "s/step": base.step_s.values,
        "p95 s": base.sojourn_p95_s.values,
        "drop %": pct(base.dropped_frac.values),
        "busy %": pct(base.utilisation.values),
    })
    if "availability" in base:
        table["up %"] = pct(base.availability.values)  # the measured window's share, as capacity.csv
        table["lost %"] = pct(base.lost_to_failure_frac.values)
    if "load_background" in base:
        table["others p95 s"] = base.background_sojourn_p95_s.values
    table["$/h"] = base.cost_per_hour.values
    fails = [f.split(", ") if f else [] for f in base.fails.values]
    table["fails"] = [",".join(FAILS_SHORT.get(k, k) for k in f) or "-" for f in fails]
    table, dropped = fitted(table.map(fmt), width, CURVE_LEAST_ESSENTIAL)
    shown = [CURVE_SHORT.get(h, h) for h in table.columns[4:] if h not in ("$/h", "fails")]
    named = sorted({k for f in fails for k in f if k in FAILS_SHORT}, key=list(FAILS_SHORT).index)
    left = ", ".join(dropped + ["the intervals' upper ends", "every other corrector"])
    note = (f"({', '.join(shown)}: point estimates; the targets are met by the intervals' upper ends"
            + (f"; fails: {', '.join(f'{FAILS_SHORT[k]} = capacity.{k}' for k in named)}" if named else "")
            + f". Left out here: {left}; in capacity.csv and summary.md)")
    return "\n".join([table.to_string(index=False), wrapped(note, width)])


def goals_text(res: CapacityResult) -> str:
    """The targets in words, each met by its figure's interval's upper end."""
    t = res.targets
    goals = []
    if t.get("max_bias") is not None:
        goals.append(f"exact bias <= {t['max_bias']:g}")
    if t.get("max_bias_vs_naive") is not None:
        goals.append(f"bias <= {t['max_bias_vs_naive']:g} x naive's")
    if t.get("max_step_s") is not None:
        goals.append(f"<= {t['max_step_s']:g} s per step")
    if t.get("max_dropped") is not None:
        goals.append(f"<= {100 * t['max_dropped']:g}% dropped")
    for q in (95, 99):
        if t.get(f"max_sojourn_p{q}_s") is not None:
            goals.append(f"sojourn p{q} <= {t[f'max_sojourn_p{q}_s']:g} s")
    if t.get("max_delay_p95_steps") is not None:
        goals.append(f"delay p95 <= {t['max_delay_p95_steps']:g} steps")
    if t.get("max_background_sojourn_p95_s") is not None:
        goals.append(f"other tenants' sojourn p95 <= {t['max_background_sojourn_p95_s']:g} s")
    return " and ".join(goals) or "no target set (every steady count qualifies)"


def _ci(row, col: str, f=lambda v: f"{v:.3g}") -> str:
    lo, hi = row.get(f"{col}_lo"), row.get(f"{col}_hi")
    return f"{f(row[col])} [{f(lo)}, {f(hi)}]" if lo is not None and pd.notna(lo) else f(row[col])


def without_steady_state(rows: pd.DataFrame, max_load: float) -> str:
    """The counts of ``rows`` (one corrector's curve rows whose status is not ok) without a steady state, in
    one phrase: each run of adjacent overloaded counts as one range with its loads ('1 to 4 (4 counts):
    overloaded, load 4.44 down to 1.11, each >= capacity.max_load 0.95'), each run of adjacent counts with
    one other status as their list and that status ('8, 10, 12 (3 counts): not stationary at 640 steps ...')."""
    said: List[str] = []
    for kind, group in itertools.groupby(rows.sort_values("count").itertuples(),
                                         key=lambda r: "overloaded" if str(r.status).startswith("overloaded")
                                         else str(r.status)):
        run = [(int(r.count), float(r.load)) for r in group]
        if kind != "overloaded":
            said.append(", ".join(str(c) for c, _ in run) + (f" ({len(run)} counts)" if len(run) > 1 else "")
                        + f": {kind}")
        elif len(run) == 1:
            said.append(f"{run[0][0]}: overloaded: load {run[0][1]:.3g} >= capacity.max_load {max_load:g}")
        else:
            said.append(f"{run[0][0]} to {run[-1][0]} ({len(run)} counts): overloaded, load {run[0][1]:.3g} down to "
                        f"{run[-1][1]:.3g}, each >= capacity.max_load {max_load:g}")
    return "; ".join(said)


# A pool whose busy share reaches this runs hot: a queue's wait grows as rho / (1 - rho), fivefold its
# service time from here on, so a burst or a slower batch than modelled lengthens it steeply.
HOT = 0.85


def margin_text(res: CapacityResult) -> str:
    """' Margin: ...' after a recommendation: what the next count evaluated above it buys (its sojourn p95,
    dropped share, bias and busy share, each with its interval, and its price), and a warning when the
    recommended pool runs hot (its busy share's upper end, or its offered load, at :data:`HOT` or more); ''
    when no count above it was evaluated with a steady state."""
    c = res.curve[res.curve.corrector == res.targets["corrector"]].set_index("count")
    above = c[(c.index > res.recommended) & (c.status == "ok")]
    if above.empty:
        return ""
    here, n = c.loc[res.recommended], int(above.index.min())
    nxt = above.loc[n]
    pct = lambda v: f"{100 * v:.1f}%"  # noqa: E731
    buys = (f" Margin: {n} {res.unit}, the next count evaluated, give sojourn p95 {_ci(nxt, 'sojourn_p95_s')} s "
            f"(against {_ci(here, 'sojourn_p95_s')}), dropped {_ci(nxt, 'dropped_frac', pct)} (against "
            f"{_ci(here, 'dropped_frac', pct)}), bias {_ci(nxt, 'bias_exact', lambda v: f'{v:.4g}')} and busy "
            f"{_ci(nxt, 'utilisation', pct)} for ${nxt.cost_per_hour - here.cost_per_hour:.2f} more per training hour.")
    busy = here.get("utilisation_hi", here.utilisation)
    if not (busy >= HOT or here.load >= HOT):
        return buys
    return buys + (f" Warning: at {res.recommended} {res.unit} the pool runs hot, busy {_ci(here, 'utilisation', pct)}"
                   f" at an offered load of {here.load:.3g}: a burst, a slower batch or more traffic than modelled "
                   f"lengthens its queue steeply; {n} {res.unit} leave room.")


def recommendation_text(res: CapacityResult) -> str:
    """The answer in one paragraph: the count, its offered load and headroom, each figure with
    its interval, its margin (:func:`margin_text`); or why no count qualifies."""
    chosen = res.targets["corrector"]
    goal = goals_text(res)
    over = res.curve[(res.curve.corrector == chosen) & (res.curve.status != "ok")]
    why = without_steady_state(over, res.max_load)
    if res.status == "infeasible":
        return unreachable_text(res) + notes_text(res)
    if res.recommended is None:
        return (f"No count of {res.channel}'s {res.unit} up to {res.top} meets the targets for {chosen} ({goal}, "
                f"each by the upper end of its {res.level:.0%} interval); raise capacity.max_count or relax the "
                f"targets"
                + _largest_fails(res) + "."
                + (f" Without a steady state: {why}." if why else "") + notes_text(res))
    row = res.curve[(res.curve.corrector == chosen) & (res.curve["count"] == res.recommended)].iloc[0]
    pct = lambda v: f"{100 * v:.1f}%"  # noqa: E731
    return (f"Recommended: {res.recommended} {res.unit} for {res.channel} with {chosen} ({goal}, each met by the "
            f"upper end of its {res.level:.0%} interval): offered load {row.load:.3g} (headroom {pct(row.headroom)}"
            + (f"; other tenants' {row.load_background:.3g} of it" if "load_background" in row else "") + "), "
            f"bias {_ci(row, 'bias_exact', lambda v: f'{v:.4g}')} ({_ci(row, 'bias_vs_naive')} x naive's), "
            f"{_ci(row, 'step_s')} s per step, delay p95 {_ci(row, 'delay_p95_steps', lambda v: f'{v:g}')} steps, "
            f"sojourn p95 {_ci(row, 'sojourn_p95_s')} s, p99 {_ci(row, 'sojourn_p99_s')} s, "
            f"dropped {_ci(row, 'dropped_frac', pct)}, "
            + (f"other tenants' sojourn p95 {_ci(row, 'background_sojourn_p95_s')} s "
               f"({int(row.background_jobs)} requests), " if "load_background" in row else "")
            + f"busy {_ci(row, 'utilisation', pct)}, ${row.cost_per_hour:.2f} per training hour "
            f"(${row.cost_per_1000_steps:.2f} per 1000 steps). Steady state: warm-up {int(row.warmup_steps)} of "
            f"{int(row.steps)} steps, stationary" + replications_text(row) + ". " + binding_text(res)
            + (f" Fewer {res.unit} have no steady state: {why}." if why else "")
            + margin_text(res) + searched_text(res) + notes_text(res))


def unreachable_text(res: CapacityResult) -> str:
    """The answer of a search stopped by a target out of reach of more capacity (status ``infeasible``,
    racsim.analyses.capacity.reach): per such target, its key and value, the figure at the two counts
    that show it, and what would be met; what else the user may change; where the search stopped."""
    chosen, u0 = res.targets["corrector"], res.unreachable[0]
    said = []
    for u in res.unreachable:
        name, unit, scale = FIGURE_WORDS[u.figure]
        v = lambda x: f"{scale * x:.3g}{unit}"  # noqa: E731
        ci = lambda t: f"{v(t[0])} [{v(t[1])}, {v(t[2])}]"  # noqa: E731
        whose = chosen if u.figure.startswith("bias") or u.figure == "step_s" else res.channel  # a queue figure
        seen = (f"{whose}'s {name} is {ci(u.at_fewer)} at {u.fewer} {res.unit} (load {u.load_fewer:.3g}) and "
                f"{ci(u.at_more)} at {u.more} (load {u.load_more:.3g}), above the target by each interval's lower end")
        if u.flat:
            said.append(f"capacity.{u.key} = {u.target:g} cannot be met by more {res.unit}: {seen}; it does not fall "
                        f"with the count, so no count up to {u.top} (capacity.max_count) brings it to {v(u.target)}. "
                        f"Relax capacity.{u.key} (the counts evaluated meet it from {u.met_from:.3g})")
        else:
            said.append(f"capacity.{u.key} = {u.target:g} cannot be met by up to {u.top} {res.unit} "
                        f"(capacity.max_count): {seen}; falling at most {v(u.slope)} a {res.unit.rstrip('s')} "
                        f"(the steepest the two intervals allow), it would not reach {v(u.target)} before "
                        f"{u.needs} {res.unit}. Relax capacity.{u.key} (the counts evaluated meet it from "
                        f"{u.met_from:.3g}) or raise capacity.max_count")
    others = [(r.corrector, int(r.fewest)) for r in res.per_corrector.itertuples()
              if r.corrector != chosen and r.fewest is not None and pd.notna(r.fewest)]
    if others:
        change = ("; or change the corrector: " + ", ".join(f"{c} meets every target from {n} {res.unit}"
                                                              for c, n in others) + " (capacity.corrector)")
    elif any(u.figure.startswith("bias") for u in res.unreachable):  # the corrector makes the bias, not the queue
        change = "; no other corrector evaluated meets every target either"
    else:
        change = ""
    return ("Infeasible: " + ". ".join(said) + change + f". The search stopped at {u0.more} {res.unit} and tried "
            f"no count above it.")


def replications_text(row) -> str:
    """'; its rare-event figures on the trials of R runs (N trial-steps, E drop episodes)' where the
    answer's count was decided by replications (racsim.analyses.capacity.stopping), else ''."""
    r = row.get("replications", 1)
    if not (r == r and r > 1):
        return ""
    return (f"; its rare-event figures on the trials of {int(r)} runs ({int(row['measured_steps']):,} trial-steps, "
            f"{int(row['drop_episodes'])} drop episodes)")


def notes_text(res: CapacityResult) -> str:
    """What the search changed to run (:func:`racsim.analyses.capacity.steps_that_fit`), a sentence each."""
    return "".join(f" Note: {n}." for n in res.notes)


def _largest_fails(res: CapacityResult) -> str:
    """' (the largest count evaluated fails ...)' when no count qualifies ('' when none was evaluated)."""
    rows = res.curve[res.curve.corrector == res.targets["corrector"]]
    if rows.empty:
        return ""
    top = rows.loc[rows["count"].idxmax()]
    return f" ({int(top['count'])} {res.unit} fail {top.fails.replace(', ', ' and ')})"




def binding_text(res: CapacityResult) -> str:
    """Which target binds the recommended count, in one sentence: what the next smaller count evaluated
    fails (a target's key, or its load, or its stationarity)."""
    below = res.curve[(res.curve.corrector == res.targets["corrector"]) & (res.curve["count"] < res.recommended)]
    if below.empty:
        return f"Binding: none (no fewer {res.unit} were evaluated)."
    binds = {"load": f"load (an offered load under capacity.max_load = {res.max_load:g})",
             "stationarity": "stationarity (a steady state within capacity.max_steps)"}
    what = " and ".join(binds.get(b) or f"capacity.{b} = {res.targets[b]:g}" for b in res.binding)
    fewer = below.loc[below["count"].idxmax()]
    return (f"Binding: {what}, which {int(fewer['count'])} {res.unit}, the next fewer evaluated, fail."
            + edge_text(fewer, res))


# Each target figure in words: its name, unit and scale (a share in percent).
FIGURE_WORDS = {"bias_exact": ("exact bias", "", 1), "bias_vs_naive": ("bias x naive's", "", 1),
                "step_s": ("step", " s", 1), "dropped_frac": ("dropped", "%", 100),
                "sojourn_p95_s": ("sojourn p95", " s", 1), "sojourn_p99_s": ("sojourn p99", " s", 1),
                "delay_p95_steps": ("delay p95", " steps", 1),
                "background_sojourn_p95_s": ("other tenants' sojourn p95", " s", 1)}


def figure_text(row, fig: str, limit: float) -> str:
    """One target figure with its interval against its limit, in words (FIGURE_WORDS)."""
    name, unit, scale = FIGURE_WORDS[fig]
    v = [scale * row[c] for c in (fig, f"{fig}_lo", f"{fig}_hi")]
    return f"{name} {v[0]:.3g}{unit} [{v[1]:.3g}{unit}, {v[2]:.3g}{unit}] against {scale * limit:g}{unit}"


def edge_text(row, res: CapacityResult) -> str:
    """' On the edge: ...' when a count fails its targets by its intervals alone (every estimate
    meets its target, an upper end does not): the run cannot tell whether it would pass; '' else."""
    over = [(k, fig) for k, fig in TARGET_FIGURES.items() if k in res.binding]
    if row["status"] != "ok" or not over or any(not row[fig] <= res.targets[k] for k, fig in over):
        return ""
    said = "; ".join(figure_text(row, fig, res.targets[k]) for k, fig in over)
    return (f" On the edge: {int(row['count'])} {res.unit} meet every target by the estimate, not by the "
            f"interval's upper end ({said}); a longer run (capacity.regime_cycles, learner.trials) may settle it.")


def searched_text(res: CapacityResult) -> str:
    """What the search tried beyond the listed counts, in one sentence ('' when nothing)."""
    if not res.searched:
        return ""
    tried = ", ".join(map(str, res.searched))
    return (f" Besides the listed counts ({', '.join(map(str, res.listed))}), the search tried {tried} to find "
            f"the fewest count that meets the targets.")


# input -> how the summary names a variant's value (racsim/analyses/sensitivity.py)
SENSITIVITY_PHRASES = {"mfu": "MFU is {:.3g}", "mfu_scale": "MFU is {:.3g}x the efficiency curve's",
                       "kernels": "measured kernels serve ({:.3g} s a full batch)",
                       "tokens": "sequences average {:.0f} tokens",
                       "batch_size": "pipeline.batch_size is {:.0f}", "mtbf_s": "MTBF is {:.4g} s",
                       "mttr_s": "MTTR is {:.4g} s", "service": "service averages {:.3g} s",
                       "background_rate": "other tenants send {:.3g} requests/s"}


def sensitivity_text(res: CapacityResult, spread: float) -> str:
    """The sensitivity table in one sentence: the answer, then the answer at each input moved
    ("5 GPUs; 6 if MFU is 0.32, 4 if MFU is 0.48, ..."); '' without a table."""
    t = res.sensitivity
    if t is None or t.empty:
        return ""
    count = lambda v: f"more than {res.top}" if pd.isna(v) else str(int(v))  # noqa: E731
    moved = [f"{count(r.recommended)} if {SENSITIVITY_PHRASES[r.input].format(r.value)}"
             for r in t.itertuples() if r.change != 0]
    return (f"How the answer moves with its assumptions (each input {100 * spread:.3g}% down and up, the others as given; "
            f"sensitivity.csv): {count(res.recommended)} {res.unit}; " + ", ".join(moved) + ".")


def method_text(res: CapacityResult, cfg: RacsimConf) -> str:
    """How the figures were found, for summary.md."""
    cap = cfg.capacity
    length = ("found by the simulator (`capacity.run_length=auto`): the run starts at `pipeline.steps` and doubles, "
              f"up to `capacity.max_steps` = {cap.max_steps}, until the window after the warm-up is stationary"
              if cap.run_length == "auto" else "fixed (`capacity.run_length=fixed`): `pipeline.steps` as given")
    warm = ("MSER-5 on that series (the truncation minimising the marginal standard error of the remaining batches "
            "of 5)" if cfg.pipeline.warmup_steps is None else f"`pipeline.warmup_steps` = {cfg.pipeline.warmup_steps}")
    return (f"Offered load first: the work each step brings {res.channel} (server-seconds: the service model's "
            "seconds for full batches, or the workers' service times) per second of the asynchronous optimizer's "
            "clock, over the servers up, each figure the model's long-run one where it knows it (a burst chain's "
            "stationary slow-down; random failures' availability mtbf / (mtbf + mttr)), not a sample of it "
            "(`load_sampled` in capacity.csv is the sample, as a check). A count whose load reaches "
            f"`capacity.max_load` = {res.max_load:g} is overloaded: its queue has no steady state, so it is not "
            "simulated and never recommended. Each other count is simulated; its steady state is read off the "
            f"requests in {res.channel} at each step's start (mean over the trials). Warm-up: {warm}. Run length: "
            f"{length}: at least {2 * N_BATCHES} steps after the warm-up, and its {N_BATCHES} batch means show no "
            f"trend (least-squares slope p >= {TREND_P:g}). Intervals: every figure's {res.level:.0%} interval "
            f"over {cap.resamples} resamples of {interval_units_text(res, cfg)}: the exact bias from the mean "
            "correction weights of the updates in the resampled units, each channel's mean by a bootstrap-t "
            "(studentized) replicate pushed through eq. (2)'s norm (paired with naive's for the ratio); the dropped "
            "share by a bootstrap-t of its ratio; a delay or sojourn quantile by inverting that of the share of "
            "values above it; the busy share (whole trials resampled) and the seconds per step by percentiles. "
            "A count meets a "
            "target when the upper end of the figure's interval does, and its status is ok (load below max_load, "
            "stationary).")


def interval_units_text(res: CapacityResult, cfg: RacsimConf) -> str:
    """What a count's intervals resample (racsim.analyses.capacity.intervals.interval_units), in words."""
    trials = f"the {cfg.learner.trials} trials (independent replications of the pipeline from empty"
    kind, cycle = slowest_regime(cfg, res.channel)
    if not cycle:
        return trials + ")"
    return (f"batches of at least {BATCH_CYCLES} cycles of the slowest regime ({kind}: {cycle} steps a cycle) cut "
            f"from the steady windows of {trials}; a window that holds fewer is one batch), but for the channel's "
            "figures that rare episodes drive (dropped share, delay and sojourn quantiles), which rest on the trials "
            "alone (independent replications; under outages or bursts a share never narrower than a Poisson count "
            "of its drop episodes allows)")


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


def autoscale_section(cfg: RacsimConf, res: CapacityResult) -> List[str]:
    """The autoscaled pool against the fixed pools evaluated, per corrector."""
    a = cfg.pipeline.channels[res.channel].autoscale
    table = res.autoscale.rename(columns={
        "servers": "servers (mean billed)", "bias_exact": "bias", "bias_exact_hi": "bias (upper)",
        "bias_vs_naive": "x naive", "bias_vs_naive_hi": "x naive (upper)", "step_s": "s/step",
        "step_s_hi": "s/step (upper)",
        "delay_p95_steps": "delay p95", "delay_p95_steps_hi": "delay p95 (upper)", "sojourn_p95_s": "sojourn p95 s",
        "sojourn_p95_s_hi": "sojourn p95 s (upper)", "sojourn_p99_s": "sojourn p99 s",
        "sojourn_p99_s_hi": "sojourn p99 s (upper)", "dropped_frac": "dropped", "dropped_frac_hi": "dropped (upper)",
        "cost_per_1000_steps": "$/1000 steps"})
    return ["## Autoscaling what-if", "",
            f"{res.channel}'s pool sized by its rule (from {a.min} to {a.max} servers; one more after more than "
            f"{a.queue_above} requests waited {a.for_s:g} s, serving {a.startup_s:g} s later; one released after "
            f"{a.idle_s:g} s idle) against every fixed pool the search evaluated (always {a.min} and {a.max}), "
            "on the same draws. `servers`: "
            "servers billed on average over the measured steps (a server counts from its request to its release); "
            "`bias` the exact bias, `x naive` its ratio to naive's, `s/step` the wall-clock per step, delays "
            "in steps and sojourn in seconds of the asynchronous pipeline (each figure a target reads with its "
            "interval's upper end), `$/1000 steps` the pool's cost per 1000 optimizer steps (autoscaled: billed "
            "server-seconds of the asynchronous pipeline, so - for blocking correctors), `meets` whether the row "
            "meets the capacity targets and `fails` which it misses.", "",
            autoscale_verdict(res.autoscale, res.targets["corrector"]), "",
            "```", table.map(fmt).to_string(index=False), "```", ""]


def capacity_summary_markdown(cfg: RacsimConf, res: CapacityResult, files: List[str]) -> str:
    lines = [f"# racsim capacity plan: {cfg.name}", "", str(cfg.description or ""), "",
             "## Recommendation", "", recommendation_text(res), "",
             *([sensitivity_text(res, cfg.capacity.sensitivity.spread), ""] if res.sensitivity is not None else []),
             "## How the steady state was found, and how sure the answer is", "", method_text(res, cfg), ""]
    per = res.per_corrector
    lines += ["Fewest units meeting the same targets, per corrector (- : none of the evaluated counts), and what "
              "binds it (what the next smaller count fails):", "", "```",
              per.assign(fewest=per.fewest.map(lambda v: "-" if v is None or pd.isna(v) else str(int(v))),
                         binds=per.binds.map(lambda v: v or "-"))
              .to_string(index=False), "```", ""]
    lines += ["## Capacity curve", "",
              f"Per count of {res.channel}'s {res.unit} ({res.key}): `load` the offered load, `steady` ok with the "
              "run's length and warm-up in steps (or overloaded / not stationary: no steady-state figure), "
              f"the bias of {res.targets['corrector']} with its interval, its ratio to naive's and its seconds per "
              "step at the interval's upper end, delays in optimizer steps of the asynchronous pipeline, sojourn "
              "(submit to result) in seconds, `dropped` the share of results dropped, `busy` the share of server-"
              "seconds holding work (waiting out a failure or a partly filled batch included), `useful` the share "
              "whose work delivered results (the batches' service seconds in the same run, not an attempt a "
              "failure cut; never above `busy`), `$/h` the pool's price per training hour, then each other corrector's exact bias "
              "(sync_oracle: the synchronous reference, not a pipeline), `meets` whether the count meets every target "
              "and `fails` what it misses (a target's key; `load`: overloaded; `stationarity`: no steady state)"
              + ("; `up` the share of server-seconds up in the simulated run (its outage timeline over the measured window) and `lost to "
                 "failure` the share of results lost to failures." if "availability" in res.curve else "."),
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
    lines += time_section(res.timings)
    lines += ["## Files", ""] + [f"- `{f}`" for f in files] + [""]
    return "\n".join(lines)


def csv_tables(out_dir: Path, tables: Sequence[tuple], bad: List[Unwritable], notes: List[str]) -> List[Path]:
    """Each (stem, table) of ``tables`` checked (its non-finite values into ``bad``, the NaNs it may hold
    into ``notes``: racsim.report.finite) and written as ``out_dir/STEM.csv``; the paths written."""
    written = []
    for stem, df in tables:
        bad.extend(non_finite(df, stem))
        notes.extend(undefined_notes(df, stem))
        p = out_dir / f"{stem}.csv"
        atomic_write(p, lambda t, df=df: df.to_csv(t, index=False))
        written.append(p)
    return written


def write_capacity(out_dir: Path, cfg: RacsimConf, res: CapacityResult, cfg_yaml: str, plots: bool = True,
                   found: Optional[List[Unwritable]] = None, about: Sequence[str] = ()) -> list:
    """Write a capacity run's files into ``out_dir``; returns the paths written. ``cfg``: the
    run's spec (summary.md reads it); ``cfg_yaml``: config.yaml's text. ``found``, ``about``:
    as racsim.report.writers.write_outputs's."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    tables = [("capacity", res.curve)]
    if res.best is not None:  # the run at the recommended (or largest simulated) count
        tables += [("results", res.best.results), ("channels", res.best.channels)]
    if res.autoscale is not None:
        tables.append(("autoscale", res.autoscale))
    if res.sensitivity is not None:
        tables.append(("sensitivity", res.sensitivity))
    bad: List[Unwritable] = [] if found is None else found
    notes: List[str] = []
    written += csv_tables(out_dir, tables, bad, notes)
    p = out_dir / "capacity.parquet"
    atomic_write(p, lambda t: res.curve.to_parquet(t, index=False))
    written.append(p)
    if res.sensitivity is not None:
        p = out_dir / "sensitivity.parquet"
        atomic_write(p, lambda t: res.sensitivity.to_parquet(t, index=False))
        written.append(p)
    write_text(out_dir / "config.yaml", cfg_yaml)
    written.append(out_dir / "config.yaml")
    if plots:
        if capacity_curve(res, out_dir / "capacity.png"):
            written.append(out_dir / "capacity.png")
    return closed(out_dir, res.best, lambda files: capacity_summary_markdown(cfg, res, files), written, bad, notes,
                  found, cfg_yaml, about, plots)


def closed(out_dir: Path, best: Any, summary: Callable[[List[str]], str], written: list, bad: List[Unwritable],
           notes: List[str], found: Optional[List[Unwritable]], cfg_yaml: str, about: Sequence[str],
           plots: bool) -> list:
    """What a plan's folder ends with (a capacity search's, a pool split's): the trace of ``best``, the run at
    its answer (if any), then summary.md (``summary(files)``: its text, given the files written, with
    ``about`` and the notes on ``notes`` and ``bad`` after it), and the check of what was written (as
    racsim.report.writers.write_outputs's ``found``). Returns the paths written."""
    sched = (best.schedules or {}).get("async") if best is not None else None
    if sched is not None:
        written += write_timeline(out_dir, sched, png=plots)
    path = out_dir / "summary.md"
    write_text(path, summary([p.name for p in written]) + "\n".join([*about, *summary_lines(notes, bad)]))
    written.append(path)
    return checked(written, bad, found, cfg_yaml, out_dir)
