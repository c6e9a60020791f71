"""PNG plots of a run (matplotlib, headless). Each returns True if it wrote a file."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from racsim.config.schema import CORRECTORS
from racsim.io import atomic_write


FIRST_USE = ("building the font cache", "generated new fontManager")  # matplotlib's notices of its first run


def _first_use(record: logging.LogRecord) -> bool:
    """Drop matplotlib's one-time notice that it built its font cache (a first run on a machine), keep the rest."""
    return not any(text in record.getMessage() for text in FIRST_USE)


def _plt():
    font_log = logging.getLogger("matplotlib.font_manager")
    if _first_use not in font_log.filters:
        font_log.addFilter(_first_use)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    atomic_write(path, lambda t: fig.savefig(t, dpi=120, bbox_inches="tight", format="png"))


def finite(values) -> np.ndarray:
    """The finite numbers among ``values``, flat: NaN, infinities and what is not a number (text, None) left out."""
    import pandas as pd

    x = pd.to_numeric(pd.Series(np.asarray(values, dtype=object).ravel()), errors="coerce").to_numpy(dtype=float)
    return x[np.isfinite(x)]


def log_fits(values, spread: float = 1.0) -> bool:
    """Whether ``values`` can be drawn on a log axis: at least one finite value, every finite one above 0,
    and the largest at least ``spread`` times the smallest (1: any positive data)."""
    x = finite(values)
    return bool(len(x)) and bool((x > 0).all()) and x.max() >= spread * x.min()


def scale_from_data(ax, which: str, values, log: bool = True) -> bool:
    """The one plotting guard: ``ax``'s ``which`` axis ("x" or "y") on a log scale when one is wanted
    (``log``) and the values drawn on it allow it (:func:`log_fits`), else linear; a panel with no finite
    value to draw says so in its middle instead of standing blank. Returns whether the axis is
    logarithmic. (A log axis chosen from a whole table fails on a panel whose own values are all NaN or
    at most 0: matplotlib's "Data cannot be log-scaled"; here the values drawn decide.)"""
    log = log and log_fits(values)
    (ax.set_xscale if which == "x" else ax.set_yscale)("log" if log else "linear")
    if not len(finite(values)) and not any(t.get_gid() == NO_DATA for t in ax.texts):
        ax.text(0.5, 0.5, "no finite value to draw here", transform=ax.transAxes, ha="center", va="center",
                fontsize=8, color="grey", gid=NO_DATA)
    return log


NO_DATA = "racsim-no-data"  # the gid of a panel's note that it has nothing to draw


# One matplotlib marker per corrector, in the order of config.CORRECTORS (the one list of
# their names): a corrector added there without a marker here fails at import.
MARKERS = dict(zip(CORRECTORS, ("o", "s", "v", "*", "P", "X", "D", "^"), strict=True))
# and one colour each (matplotlib's tab10, in the same order): a corrector looks the same in every panel
COLORS = dict(zip(CORRECTORS, (f"C{i}" for i in range(len(CORRECTORS))), strict=True))


DODGE = 0.05  # markers at one clock step apart by this much of log(clock) (pareto.png)


def dodged(x: np.ndarray, y: np.ndarray, step: float = DODGE) -> np.ndarray:
    """The clock positions of the Pareto plot's markers, those that share a clock (most correctors cost
    naive's, 1x) spread sideways around it in the order of their ``y``, ``step`` of log(x) apart, so that
    markers at nearly the same reduction do not hide one another (five at x = 1 did)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    out = x.copy()
    groups: dict = {}
    for i, v in enumerate(x):
        groups.setdefault(round(float(np.log(v)), 9) if v > 0 else v, []).append(i)
    for members in groups.values():
        ranked = sorted(members, key=lambda i: y[i])
        for rank, i in enumerate(ranked):
            out[i] = x[i] * np.exp(step * (rank - (len(ranked) - 1) / 2))
    return out


def pareto(res, path: Path) -> bool:
    """Cost-quality plane: wall-clock relative to naive vs bias reduction (exact, with its 95% CI). Correctors
    at the same point are one marker named together; those at one clock are spread sideways (:func:`dodged`)."""
    from matplotlib.ticker import FuncFormatter

    r = res.results[np.isfinite(res.results["reduction_exact"].to_numpy(dtype=float))
                    & np.isfinite(res.results["wallclock_ratio"].to_numpy(dtype=float))]
    points: list = []  # (names, their row): correctors at the same point, drawn once
    for _, row in r.iterrows():
        same = next((p for p in points if p[1]["wallclock_ratio"] == row["wallclock_ratio"]
                     and p[1]["reduction_exact"] == row["reduction_exact"]), None)
        if same is None:
            points.append(([row["corrector"]], row))
        else:
            same[0].append(row["corrector"])
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8.6, 4.6), layout="constrained")
    xs = dodged([row["wallclock_ratio"] for _, row in points], [row["reduction_exact"] for _, row in points])
    for (names, row), x in zip(points, xs):
        y = row["reduction_exact"]
        lo, hi = row.get("reduction_ci_lo", np.nan), row.get("reduction_ci_hi", np.nan)
        yerr = [[max(y - lo, 0)], [max(hi - y, 0)]] if np.isfinite(lo) and np.isfinite(hi) else None
        name = names[0]
        ax.errorbar(x, y, yerr=yerr, fmt=MARKERS.get(name, "o"), color=COLORS.get(name), ms=12 if "rac" in names
                    else 8, capsize=3, alpha=0.85, label=f"{', '.join(names)} ({row['wallclock_ratio']:.2g}x, {y:.3g}x)")
    scale_from_data(ax, "x", r["wallclock_ratio"])
    scale_from_data(ax, "y", r["reduction_exact"])
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(plain)
    ax.yaxis.set_major_formatter(plain)
    ax.set_xlabel("wall-clock relative to naive (simulated; markers at one clock spread sideways)")
    ax.set_ylabel("bias reduction vs naive (exact; bars: 95% CI)")
    left_out = [n for n in res.results["corrector"] if n not in set(r["corrector"])]
    head = res.results.iloc[0]
    ax.set_title(f"Cost-quality Pareto, K={head['K']} ({head['scenario']}): up and left is better"
                 + (f"\nnot drawn (no finite reduction or clock): {', '.join(left_out)}" if left_out else ""),
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    legend_outside(ax, title="corrector (clock, reduction)", title_fontsize=8)
    _save(fig, path)
    plt.close(fig)
    return True


def training(res, path: Path) -> bool:
    """J(theta) and distance to the optimal policy against simulated wall-clock."""
    if not res.curves:
        return False
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.2), layout="constrained")
    for name, cv in res.curves.items():
        x = cv.wallclock.mean(axis=0) / 60.0
        a1.plot(x, cv.objective.mean(axis=0), label=name)
        a2.plot(x, cv.distance.mean(axis=0), label=name)
    a1.set_xlabel("simulated wall-clock (min)")
    a1.set_ylabel("J(theta): long-run average reward")
    a2.set_xlabel("simulated wall-clock (min)")
    a2.set_ylabel("|| pi_theta - pi* ||_2")
    a1.set_title("Training with each corrector")
    a2.set_title("Distance to the optimal policy")
    for a in (a1, a2):
        a.grid(True, alpha=0.3)
    figure_legend(fig, a1, title="corrector")
    _save(fig, path)
    plt.close(fig)
    return True


def queue(res, path: Path) -> bool:
    """Mean queue length and jobs in service per slow channel over the run."""
    tl = res.timeline
    names = [c[: -len("_queued")] for c in tl.columns if c.endswith("_queued")]
    if not names:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8.4, 3.8), layout="constrained")
    for nm in names:
        (line,) = ax.plot(tl.time_s / 60.0, tl[f"{nm}_in_service"], label=f"{nm}: in service")
        ax.plot(tl.time_s / 60.0, tl[f"{nm}_queued"], "--", color=line.get_color(), label=f"{nm}: queued")
    ax.set_xlabel("simulated wall-clock (min)")
    ax.set_ylabel("jobs (mean over trials)")
    ax.set_title("Slow channels: queue and service over the run")
    ax.grid(True, alpha=0.3)
    legend_outside(ax)
    _save(fig, path)
    plt.close(fig)
    return True


def lag(res, path: Path) -> bool:
    """Async generation: the trained samples by lag (head and token-weighted mean), lag_histogram.csv."""
    h = res.extra.get("lag_histogram")
    if h is None or not len(h):
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.2, 3.6), layout="constrained")
    ax.bar(h.lag - 0.2, h.head_share, width=0.4, label="head lag (t - start version)")
    ax.bar(h.lag + 0.2, h.mean_share, width=0.4, label="mean lag (t - token-weighted version), floor")
    ax.set_xlabel("lag (policy versions)")
    ax.set_ylabel("share of trained samples")
    ax.set_title("Generation lag of the trained samples (measured window)")
    ax.set_xticks(h.lag)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)
    plt.close(fig)
    return True


def generation_queue(res, path: Path) -> bool:
    """Async generation: the trainer's queue length over the run (lane 0), the trainer's step starts marked."""
    sched = (res.schedules or {}).get("async")
    rec = None if sched is None else sched.generation
    if rec is None:
        return False
    times, lengths = rec.queue[0]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8.4, 3.4), layout="constrained")
    ax.step(np.concatenate([[0.0], times]) / 60.0, np.concatenate([[0], lengths]), where="post",
            label="groups queued (trial 0)")
    for s in rec.step_start[0]:
        ax.axvline(s / 60.0, color="0.8", lw=0.5, zorder=0)
    ax.set_xlabel("simulated wall-clock (min); grey: the trainer's step starts")
    ax.set_ylabel("groups in the queue")
    ax.set_title("The trainer's queue over the run")
    ax.grid(True, axis="y", alpha=0.3)
    _save(fig, path)
    plt.close(fig)
    return True


def legend_outside(ax, fontsize: int = 8, handles=None, **kw):
    """One legend for ``ax`` and its twins (every series they name, or ``handles``), off the data: to the
    right of the axes, past a twin's tick labels and label (measured, in inches, so it holds whatever the
    layout does); a figure made with ``layout="constrained"`` makes room for it inside the figure."""
    from matplotlib.transforms import ScaledTranslation

    fig = ax.figure
    twins = [a for a in fig.axes if a is not ax and a.get_position().bounds == ax.get_position().bounds]
    labels = None if handles is None else [h.get_label() for h in handles]
    if handles is None:
        handles, labels = [], []
        for a in (ax, *twins):
            h, lab = a.get_legend_handles_labels()
            handles, labels = handles + h, labels + lab
    r = fig.canvas.get_renderer()
    right = max((t.get_tightbbox(r).x1 - t.bbox.x1 for t in twins), default=0.0) / fig.dpi
    past = ax.transAxes + ScaledTranslation(right + 0.06, 0, fig.dpi_scale_trans)
    return ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1, 1), bbox_transform=past, borderaxespad=0,
                     fontsize=fontsize, **kw)


def figure_legend(fig, ax, **kw):
    """One legend for every panel of ``fig`` (the series of ``ax``, named alike in each), right of them all
    (``layout="constrained"``: the panels make room)."""
    handles, labels = ax.get_legend_handles_labels()
    return fig.legend(handles, labels, loc="outside right center", fontsize=8, **kw)


def legend_problems(fig) -> list:
    """What is wrong with ``fig``'s legends as drawn: a legend outside the figure, or over an axes' data
    area, a title or another text of the figure (an empty list: none). Tests read every plot with it."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    page = fig.bbox
    legends = [*fig.legends, *(a.get_legend() for a in fig.axes if a.get_legend() is not None)]
    texts = [t for a in fig.axes for t in (a.title, a._left_title, a._right_title, a.xaxis.label, a.yaxis.label)
             if t.get_text()] + ([fig._suptitle] if fig._suptitle is not None else [])
    out = []
    for leg in legends:
        box = leg.get_window_extent(r)
        name = " / ".join(t.get_text() for t in leg.get_texts()[:2])
        if box.x0 < page.x0 - 1 or box.y0 < page.y0 - 1 or box.x1 > page.x1 + 1 or box.y1 > page.y1 + 1:
            out.append(f"legend ({name}) outside the figure")
        out += [f"legend ({name}) over the data of an axes" for a in fig.axes
                if a.get_visible() and a.bbox.overlaps(box)]
        out += [f"legend ({name}) over the text '{t.get_text()}'" for t in texts
                if t.get_visible() and t.get_window_extent(r).overlaps(box)]
    return out


def target_line(ax, y: float, data, log: bool = False, **kw) -> None:
    """A target's horizontal line at ``y`` on ``ax``, drawn where it lies near the plotted ``data`` (at
    most 10x their largest value, and above 0 on a log axis); a target far above (capacity.max_step_s
    = 1e308) only gets its legend entry, marked off the plot, since drawing it would stretch the axis
    until matplotlib overflows and the curve flattens."""
    top = np.nanmax(np.asarray(data, dtype=float), initial=-np.inf)
    if np.isfinite(y) and (not log or y > 0) and (not np.isfinite(top) or y <= 10 * top):
        ax.axhline(y, **kw)
    else:
        ax.plot([], [], **{**kw, "label": f"{kw.get('label', 'target')} (off the plot)"})


def alike(c, column: str) -> list:
    """The correctors of a capacity curve ``c`` grouped by their ``column`` series over the counts: one
    group per distinct series, in the curve's order, so that series lying on one another are drawn once
    and named together ([(names, their rows by count)])."""
    groups: list = []
    for name in c.corrector.unique():
        sub = c[c.corrector == name].sort_values("count")
        y = sub[column].to_numpy(dtype=float)
        same = next((g for g in groups if np.array_equal(g[2], y, equal_nan=True)), None)
        if same is None:
            groups.append(([name], sub, y))
        else:
            same[0].append(name)
    return [(names, sub) for names, sub, _ in groups]


def shaded(base) -> list:
    """(count, colour) of the counts the capacity plot shades, from one corrector's curve rows: red where a
    count has no steady state (overloaded, not stationary), orange where it has one but misses a target,
    whatever the number of targets it misses (``fails``); a count that meets them all is not shaded."""
    out = []
    for r in base.itertuples():
        if r.status != "ok":
            out.append((r.count, "red"))
        elif isinstance(r.fails, str) and r.fails:
            out.append((r.count, "orange"))
    return out


def capacity_curve(res, path: Path) -> bool:
    """Capacity curve: units vs delay (p50/p95, steps) with the share dropped, bias per corrector (the
    chosen one with its interval), wall-clock per step with the slack eta, the offered load with
    utilisation and cost (racsim/analyses/capacity/). Series that coincide are drawn once, named
    together. Counts that are overloaded or not stationary are shaded red: they have no steady-state
    figure."""
    c = res.curve
    chosen = res.targets["corrector"]
    base = c[c.corrector == chosen].sort_values("count")
    x = base["count"].to_numpy()
    plt = _plt()
    fig, axes = plt.subplots(2, 2, figsize=(15, 8.6), layout="constrained")
    a = axes[0, 0]
    a.plot(x, base.delay_p50_steps, "o-", label="delay p50 (steps)")
    a.plot(x, base.delay_p95_steps, "s--", label="delay p95 (steps)")
    a.set_ylim(bottom=0, top=max(1.0, 1.15 * np.nanmax(base.delay_p95_steps, initial=0.0)))  # a constant reads as one
    a.set_ylabel("delay of injected results (optimizer steps)")
    a2 = a.twinx()
    a2.plot(x, 100 * base.dropped_frac, "x:", color="grey", label="dropped (%), as the table")
    a2.set_ylim(bottom=0, top=max(1.0, 1.15 * 100 * np.nanmax(base.dropped_frac, initial=0.0)))
    a2.set_ylabel("results dropped (%)", color="grey")
    a.set_title(f"Delay of {res.channel}'s results")
    a = axes[0, 1]
    for names, sub in alike(c, "bias_exact"):
        name, label = names[0], ", ".join(names)
        if chosen in names and "bias_exact_lo" in sub:
            # a percentile interval may leave the estimate outside it: no bar on that side, never a negative one
            a.errorbar(sub["count"], sub.bias_exact, yerr=np.clip([sub.bias_exact - sub.bias_exact_lo,
                                                                   sub.bias_exact_hi - sub.bias_exact], 0, None),
                       fmt=MARKERS.get(chosen, "o") + "-", ms=9, lw=2.2, capsize=3,
                       label=f"{label} ({res.level:.0%} interval" + (f" of {chosen})" if len(names) > 1 else ")"))
        else:
            a.plot(sub["count"], sub.bias_exact, MARKERS.get(name, "o") + ("--" if name == "sync_oracle" else "-"),
                   ms=6, label=label + (" (reference)" if name == "sync_oracle" else ""), lw=1.2)
    t = res.targets
    naive = c[c.corrector == "naive"].sort_values("count").bias_exact.to_numpy()
    if t.get("max_bias_vs_naive") is not None and np.isfinite(naive).any():
        with np.errstate(over="ignore"):  # a target of 1e308 x naive's: inf, off the plot
            y = t["max_bias_vs_naive"] * np.nanmean(naive)
        target_line(a, y, c.bias_exact, log=True, color="red", ls="--", lw=1,
                    label=f"target: {t['max_bias_vs_naive']:g} x naive")
    if t.get("max_bias") is not None:
        target_line(a, t["max_bias"], c.bias_exact, log=True, color="red", ls=":", lw=1,
                    label=f"target: {t['max_bias']:g}")
    scale_from_data(a, "y", c.bias_exact)
    a.set_ylabel("bias (exact), || E[g] - g* ||")
    a.set_title("Bias per corrector")
    a = axes[1, 0]
    for names, sub in alike(c, "step_s"):
        a.plot(sub["count"], sub.step_s, MARKERS.get(names[0], "o") + "-", ms=6, label=f"s/step {', '.join(names)}")
    if t.get("max_step_s") is not None:
        target_line(a, t["max_step_s"], c.step_s, color="red", ls="--", lw=1, label=f"target: {t['max_step_s']:g} s")
    a.set_ylabel("wall-clock per optimizer step (s)")
    a3 = a.twinx()
    a3.plot(x, base.eta, "k^:", label=f"slack eta ({chosen}, right)")
    # from 0, at least 1% tall (as the dropped share's axis): a slack of 0.0016 to 0.0024 read as a cliff
    a3.set_ylim(bottom=0, top=max(0.01, 1.15 * np.nanmax(base.eta, initial=0.0)))
    a3.set_ylabel(f"slack eta ({chosen})")
    a.set_title("Wall-clock per step; slack")
    a = axes[1, 1]
    a.plot(x, 100 * base.load, "D-", color="C3", label="offered load (%)")
    a.plot(x, 100 * base.utilisation, "o-", label="utilisation: busy (%)")
    a.axhline(100 * res.max_load, color="C3", ls=":", lw=1, label=f"capacity.max_load ({res.max_load:g})")
    a.set_ylabel("load and utilisation of the pool (%)")
    scale_from_data(a, "y", np.r_[base.load.to_numpy(dtype=float), base.utilisation.to_numpy(dtype=float),
                                  res.max_load])
    a4 = a.twinx()
    a4.plot(x, base.cost_per_hour, "s--", color="C1", label="$ per training hour (right)")
    a4.set_ylabel("pool cost ($ per training hour)", color="C1")
    a.set_title("Offered load, utilisation and cost")
    for n, color in shaded(base):
        for ax in axes.ravel():
            ax.axvspan(n - 0.4, n + 0.4, color=color, alpha=0.08 if color == "red" else 0.12, lw=0)
    if res.recommended is not None:
        for ax in axes.ravel():
            ax.axvline(res.recommended, color="green", lw=1.2, alpha=0.6,
                       label=f"recommended: {res.recommended} {res.unit}" if ax is axes[1, 1] else None)
    for ax in axes.ravel():
        ax.set_xlabel(f"{res.channel}: {res.unit}")
        ax.grid(True, alpha=0.3)
        legend_outside(ax)
    fig.suptitle(f"Capacity curve: {res.channel} ({res.unit}); recommendation for {chosen} in green; "
                 "shaded red: overloaded or not stationary (no steady-state figure); shaded orange: misses a target "
                 "(one or more: capacity.csv's fails)", fontsize=10)
    _save(fig, path)
    plt.close(fig)
    return True
