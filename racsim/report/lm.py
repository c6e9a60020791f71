"""Plots and summary of the LM study (learner.kind=lm, racsim/analyses/lm_study.py)."""

from __future__ import annotations

from pathlib import Path

from typing import List

import numpy as np
import pandas as pd

from racsim.analyses.lm_study import SEARCH_SEEDS, Z95, seeds_to_decide
from racsim.report.plots import MARKERS, _plt, _save, figure_legend, legend_outside
from racsim.report.tables import format_table, time_section


def is_lm(res) -> bool:
    return "true_final" in res.results


def value_label(v) -> str:
    """A grid value in a few characters: a latency law by its kind, a key=value text by the value."""
    if isinstance(v, str) and v.startswith("{") and "'kind'" in v:
        return v.split("'kind': '")[1].split("'")[0]
    return str(v)


def cell_labels(r: pd.DataFrame) -> dict:
    """cell -> a short label of its grid values (the columns before ``scenario``)."""
    keys = [c for c in r.columns[: list(r.columns).index("scenario")] if c != "cell"]
    cells = r.drop_duplicates("cell")
    if len(keys) == 1:  # the values alone; the axis title names the key
        return {row.cell: value_label(row[keys[0]]) for _, row in cells.iterrows()}
    return {row.cell: ", ".join(f"{k.split('.')[-1]}={value_label(row[k])}" for k in keys)
            for _, row in cells.iterrows()}


def _band(ax, x, y, lo, hi, name, **kw):
    (line,) = ax.plot(x, y, label=name, marker=MARKERS.get(name, "o"), markevery=max(1, len(x) // 8), ms=4, **kw)
    ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.15)


def training(res, path: Path) -> bool:
    """True and proxy reward per corrector against simulated wall-clock and against
    steps: mean over seeds of a rolling mean, band the 95% CI over seeds."""
    cv = res.extra.get("lm_curves")
    if cv is None or not len(cv):
        return False
    steps = int(cv.step.max())
    window = max(1, steps // 10)
    plt = _plt()
    fig, axes = plt.subplots(2, 2, figsize=(13.5, 8), sharey="row", layout="constrained")
    for name, df in cv.groupby("corrector", sort=False):
        for r, col in enumerate(("true", "proxy")):
            wide = df.pivot(index="seed_lane", columns="step", values=col).to_numpy()
            smooth = pd.DataFrame(wide.T).rolling(window, min_periods=1).mean().to_numpy().T
            m = smooth.mean(axis=0)
            h = Z95 * smooth.std(axis=0, ddof=1) / np.sqrt(smooth.shape[0])
            clock = df.pivot(index="seed_lane", columns="step", values="wallclock_s").to_numpy().mean(axis=0) / 60
            _band(axes[r, 0], clock, m, m - h, m + h, name)
            _band(axes[r, 1], np.arange(len(m)), m, m - h, m + h, name)
    for r, what in enumerate(("true (slow) reward", "proxy (fast) reward")):
        axes[r, 0].set_ylabel(f"{what}, rolling mean of {window} steps")
        axes[r, 0].set_xlabel("simulated wall-clock (min)")
        axes[r, 1].set_xlabel("optimizer step")
    for a in axes.ravel():
        a.grid(True, alpha=0.3)
    figure_legend(fig, axes[0, 0], title="corrector (band: 95% CI)", title_fontsize=8)
    policy = res.results["policy"].iloc[0]
    fig.suptitle(f"GRPO ({policy}) with each corrector: mean over {res.results['seeds'].iloc[0]} seeds, "
                 "band = 95% CI over seeds")
    _save(fig, path)
    plt.close(fig)
    return True


def gradients(res, path: Path) -> bool:
    """Measured missing share of the slow residual's gradient per corrector (95% CI over
    seeds): delivered weights over every step (``missing_share``) and, with gradient
    checkpoints, the projection at them (``grad_missing``), beside the tabular slack eta
    on the same steps (``eta_steady``) and over the run (``slack_eta``). One cell only."""
    r = res.results
    if "cell" in r or not ({"grad_missing", "missing_share"} & set(r)):
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10.5, 4.6), layout="constrained")
    x = np.arange(len(r))
    if "missing_share" in r:
        ax.errorbar(x - 0.15, r.missing_share, yerr=r.missing_share_ci, fmt="s", capsize=3,
                    label="measured, every step: 1 - sum X^2 c / sum X^2 ratio (IS, same policy)")
        ax.plot(x - 0.15, r.eta_steady, "r_", ms=14, mew=2, label="tabular eta on the same steps")
    if "grad_missing" in r:
        ax.errorbar(x + 0.05, r.grad_missing, yerr=r.grad_missing_ci, fmt="o", capsize=3,
                    label="measured at checkpoints: -<E[g] - g_sync, g_res> / ||g_res||^2")
    ax.plot(x + 0.2, r.slack_eta, "k_", ms=14, mew=2, label="tabular eta over the run (Theorem 2.1)")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(x)
    ax.set_xticklabels(r.corrector, rotation=20, fontsize=8)
    ax.set_ylabel("missing share of the slow residual's gradient\n(< 0: more than synchronous GRPO delivers)")
    ax.set_title("Slow gradient missing against synchronous GRPO at the same policy (95% CI over seeds)", fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    legend_outside(ax, fontsize=7)
    _save(fig, path)
    plt.close(fig)
    return True


def sweep(res, path: Path) -> bool:
    """Final true reward per corrector across the grid's cells (e.g. delay laws), 95% CI over seeds."""
    r = res.results
    if "cell" not in r:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(7, 1.6 * r.cell.nunique()) + 2.4, 4.6), layout="constrained")
    cells = r.drop_duplicates("cell")
    labels = [cell_labels(r)[c].replace(", ", "\n") for c in cells.cell]
    names = list(dict.fromkeys(r.corrector))
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        d = r[r.corrector == name].set_index("cell").loc[cells.cell]
        x = np.arange(len(cells)) + (j - (len(names) - 1) / 2) * width
        ax.errorbar(x, d.true_final, yerr=d.true_final_ci, fmt=MARKERS.get(name, "o"), capsize=2, label=name)
    ax.set_xticks(np.arange(len(cells)))
    ax.set_xticklabels(labels, fontsize=8)
    keys = [c for c in r.columns[: list(r.columns).index("scenario")] if c != "cell"]
    ax.set_xlabel(", ".join(keys))
    ax.set_ylabel("final true reward (mean of the last 10% of steps)")
    ax.set_title(f"GRPO ({r.policy.iloc[0]}): final true reward per corrector across cells, 95% CI over seeds")
    ax.grid(True, axis="y", alpha=0.3)
    legend_outside(ax, fontsize=7, ncol=2)
    _save(fig, path)
    plt.close(fig)
    return True


PLOTS = (("lm_training.png", training), ("lm_gradients.png", gradients), ("lm_sweep.png", sweep))


def share_note(r: pd.DataFrame) -> str:
    """One line on what a `slow grad missing` share outside [0, 1] means, naming the correctors whose
    95% interval (the figure +- its half-width) lies wholly outside [0, 1], each with that interval; empty
    when none does (a figure outside [0, 1] whose interval reaches into it is within the estimate's noise)."""
    if "grad_missing" not in r:
        return ""
    lo, hi = r.grad_missing - r.grad_missing_ci, r.grad_missing + r.grad_missing_ci
    out = r[(hi < 0) | (lo > 1)]
    if not len(out):
        return ""
    named = ", ".join(f"{c} {m:.3f} [{m - h:.3f}, {m + h:.3f}]"
                      for c, m, h in zip(out.corrector, out.grad_missing, out.grad_missing_ci))
    return (f"`slow grad missing` outside [0, 1] beyond its noise ({named}; 95% intervals): 0 is synchronous GRPO, "
            "1 an update without the slow signal (naive); below 0 the update carries more of the slow signal's "
            "gradient than synchronous GRPO (its late results over-weighted), above 1 it points against it")


def format_paired(paired: pd.DataFrame) -> str:
    """The paired differences (racsim.analyses.lm_study.paired_differences) as a text table."""
    df = paired.copy()
    df["CI"] = [f"[{a:+.4f}, {b:+.4f}]" for a, b in zip(df.ci_lo, df.ci_hi)]
    df["level"] = [f"{100 * v:.4g}%" for v in df.level]
    keep = [c for c in ("cell", "metric", "pair", "seeds", "diff", "CI", "level", "sd", "answer") if c in df]
    return df[keep].to_string(index=False, float_format=lambda v: f"{v:+.4f}")


def lag_words(r) -> str:
    """Where a pair's seeds were generated, for its verdict: `` at lag 2`` when every sample was that many
    policy versions old, `` at mean lag 1.84`` when the lags varied, nothing without generation lags
    (a row of the paired table: its ``lag`` and ``lag_max``), `` at mean lags 1.84 and 2.13`` when the other
    row's samples (``other_lag``, ``other_lag_max``: another schedule's) were generated at other lags."""
    lag = getattr(r, "lag", None)
    if lag is None or pd.isna(lag):
        return ""
    other, other_max = getattr(r, "other_lag", lag), getattr(r, "other_lag_max", r.lag_max)
    if (other, other_max) != (lag, r.lag_max):
        return f" at mean lags {lag:.3g} and {other:.3g}"
    return f" at lag {r.lag_max}" if lag == r.lag_max else f" at mean lag {lag:.3g}"


def pair_line(r, waited: bool, bound: float, level: float, named: bool = False) -> str:
    """One pair's verdict (a row of the paired table at the last look; the pair named by its rows and the
    :func:`lag_words`): better or worse when its interval excludes 0, the same within the interval's
    farthest end when it is narrower than the bound, identical when every seed's difference is 0, else
    undecided, with the seeds a projection at this mean and spread would take
    (racsim.analyses.lm_study.seeds_to_decide). ``named``: the line says what the figures are."""
    pair = r.pair.replace(" - ", " vs ", 1) + lag_words(r)
    what = " true reward at naive's clock" if named else ""
    ci = f"{r.diff:+.3f} [{r.ci_lo:+.3f}, {r.ci_hi:+.3f}]{what}"
    at = f", decided at {r.seeds} seeds" if waited else f" at {r.seeds} seeds"
    if r.answer in ("better", "worse"):
        return f"{pair}: {r.answer}{at} ({ci})"
    if r.sd == 0 and r.diff == 0:
        return f"{pair}: identical at every one of {r.seeds} seeds (the same updates here)"
    if r.answer == "same":
        return f"{pair}: the same within {max(abs(r.ci_lo), abs(r.ci_hi)):.3g}{at} ({ci})"
    n = seeds_to_decide(r.diff, r.sd, bound, level)
    more = f"about {n} seeds would decide it at this mean and spread" if n < SEARCH_SEEDS else "no seed count in sight"
    return (f"{pair}: undecided after {r.seeds} seeds: [{r.ci_lo:+.3f}, {r.ci_hi:+.3f}] "
            f"({r.diff:+.3f}{what}; {more})")


def listed(items: List[str]) -> str:
    """a, b and c."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def rule_line(rule: pd.DataFrame) -> str:
    """How the seed rule ended (one cell's rows of the rule's record, racsim.analyses.lm_study.rule_table),
    its stages and its intervals' confidence."""
    last = rule.iloc[-1]
    looks = [str(n) for n in dict.fromkeys(rule.seeds)]
    plan = str(last.planned).split(",")
    waited = list(dict.fromkeys(rule.pair[rule.waited]))
    left = [p.replace(" - ", " vs ") for p in waited if (rule[rule.look == last.look].set_index("pair")
                                                         .loc[p, "answer"] == "open")]
    stages = f"stages of {listed(looks)} seeds" if len(looks) > 1 else f"one stage of {looks[0]} seeds"
    level = (f"each interval {100 * last.level:.4g}%, 95% over the {len(plan)} planned looks together"
             if len(plan) > 1 else "95% intervals")
    if last.ended == "fixed":
        return f"seed count fixed at learner.lm.seeds={looks[-1]} (learner.lm.decide=[]): {level}"
    head = f"seed rule ({stages}, doubling up to learner.lm.max_seeds={last.max_seeds}): "
    if last.ended == "decided":
        what = listed([p.replace(" - ", " vs ") for p in waited])
        return head + f"stopped at {looks[-1]} seeds, {what} decided; {level}"
    if last.ended == "max_seeds":
        return head + f"{listed(left)} undecided at learner.lm.max_seeds={last.max_seeds}; {level}"
    return (head + f"the time budget ended it at {looks[-1]} seeds: the next stage, to "
            f"{plan[len(looks)]} seeds, would have ended at about {last.next_would_end_s:.0f} s of training, past "
            f"learner.lm.budget_s={last.budget_s:g} s; {listed(left)} undecided; {level}")


def verdict_lines(paired: pd.DataFrame, rule: pd.DataFrame) -> List[str]:
    """The answer of an LM run (each of rac's rows minus each row it is paired with, true reward at naive's
    wall-clock, seed by seed), per cell: the pairs the seed rule waited for, how the rule ended (at how many
    seeds, why),
    then the other pairs at the same seeds (:func:`pair_line`). A grid's lines start with their cell."""
    cells = paired["cell"].unique() if "cell" in paired else [None]
    lines = []
    for cell in cells:
        p = paired if cell is None else paired[paired.cell == cell]
        r = rule if cell is None else rule[rule.cell == cell]
        p = p[p.metric == "true_at_naive_clock"]
        last = r.iloc[-1]
        waited = set(r.pair[r.waited])
        rows = [row for row in p.itertuples() if row.pair in waited] + \
               [row for row in p.itertuples() if row.pair not in waited]
        said = [pair_line(row, row.pair in waited, last.bound, last.level, i == 0) for i, row in enumerate(rows)]
        said.insert(len(waited), rule_line(r))
        lines += [said_line if cell is None else f"cell {cell}: {said_line}" for said_line in said]
    return lines


def paired_markdown(res) -> list:
    """The sections of an LM run with paired seeds: the answer, the paired differences at the last look and
    the seed rule's record of every look (none without them)."""
    paired = res.extra.get("lm_paired")
    if paired is None:
        return []
    rule = res.extra["lm_seed_rule"]
    whom = ("rac minus each corrector" if paired.pair.str.startswith("rac - ").all()
            else "each of rac's rows minus each row paired with it")
    out = ["## The answer", "", *[f"- {v}" for v in verdict_lines(paired, rule)], "",
           f"## Paired differences: {whom}, seed by seed", "",
           "Every corrector's seed s sees the same prompts, the same uniforms behind every sampled token and the same "
           "delays (common random numbers), so each seed gives one difference; `diff` is their mean, `CI` the "
           "t-interval over seeds (n - 1 degrees of freedom) at `level`, `sd` their standard deviation. "
           "`true_at_naive_clock`: true reward when the seed's naive run has finished; `true_final`: the last 10% "
           f"of steps. `answer`: better or worse (the interval excludes 0), the same (it is narrower than the bound "
           f"{rule.bound.iloc[0]:g}, so it lies within +-{rule.bound.iloc[0]:g}), or open.", "", "```",
           format_paired(paired), "```", "",
           "## The seed rule", "",
           "Stages of seeds: learner.lm.seeds, then doubling up to learner.lm.max_seeds, each stage's seeds of a "
           "corrector trained as one batch; after each stage (a look) every pair's interval on true reward at "
           "naive's clock is read on all the seeds so far, and the rule stops once each pair it waits for "
           "(learner.lm.decide) is answered, or when the next stage would not end within learner.lm.budget_s "
           "seconds of training. Looking again after each stage would make a wrong answer likelier than one "
           "interval's 5%, so each look's interval is at 1 - 0.05 / (the planned looks) (Bonferroni): all of a "
           "pair's intervals hold together with 95% confidence (each pair's own; the pairs are not adjusted for "
           "one another).", "", "```",
           rule.drop(columns=["cell"], errors="ignore").to_string(index=False), "```", ""]
    return out


def summary_markdown(res, files: list) -> str:
    r = res.results
    first = r.iloc[0]
    stand_in = first["policy"] == "bandit"
    lines = [
        f"# racsim run: {first['scenario']} (learner=lm, policy {first['policy']})",
        "",
        f"GRPO, K = {first['K']} slow channels, {first['steps']} steps x {first['prompts']} prompts x "
        f"{first['group_size']} responses, {first['seeds']} seeds per corrector, proxy correlation "
        f"{first['proxy_correlation']}." + (" Policy: the NumPy contextual-bandit stand-in of the transformer "
                                             "(learner.lm.policy=bandit), for speed." if stand_in else ""),
        "",
        "`true @ naive clock`: true (slow) reward of the corrector's policy when the same seed's naive run has "
        "finished (mean over the last 10% of steps completed by then, over seeds); `true final` / `proxy final`: "
        "the last 10% of steps; `+-`: 95% CI over seeds. `slow grad missing`: at the checkpoints, "
        "-<g - g_sync, g_res> / ||g_res||^2 for the update's gradient g, the synchronous gradient g_sync and "
        "the slow residual's gradient g_res (both on a large batch at the same policy): the fraction of the "
        "slow signal's gradient the update lacks, to set beside `eta`, the tabular prediction (Theorem 2.1's "
        "slack of the corrector on the measured delay kernel, share-weighted over channels). `slow missing (IS)`: "
        "1 - the share of the synchronous update that the slow results deliver, over the steps whose results all "
        "land within the run: a response sampled from pi_behaviour and weighted c delivers c / ratio of what "
        "synchronous GRPO at the current policy would (importance sampling on the same responses), estimated "
        "self-normalised as sum w_k X^2 c / sum w_k X^2 ratio (ratio 1 for a result used in its own step or never); "
        "in [0, 1] whenever c <= ratio (naive, wait_for_slow, the clipped correctors), exactly `eta (same steps)` "
        "at a frozen policy; below 0 (bare_additive, no ratio clip) it delivers more than the synchronous update: "
        "responses that lost probability since they were sampled keep weight 1. `mean ratio "
        "(late)`: pi_now / pi_behaviour of the responses whose slow reward landed late.",
        "",
        "```",
        format_table(r),
        "```",
        "",
    ]
    note = share_note(r)
    if note:
        lines += [note[0].upper() + note[1:] + ".", ""]
    lines += paired_markdown(res)
    if "cell" in r:
        for col, what in (("true_final", "Final true reward (mean of the last 10% of steps)"),
                          ("true_at_naive_clock", "True reward at naive's wall-clock")):
            wide = r.pivot(index="corrector", columns="cell", values=col).loc[list(dict.fromkeys(r.corrector))]
            wide.columns = [cell_labels(r)[c] for c in wide.columns]
            lines += [f"## {what} per corrector (columns: grid cells)", "", "```",
                      wide.map(lambda v: f"{v:.3f}").to_string(), "```", ""]
    lines += time_section(res.timings, f"; {first['seconds_per_step']:.4f} s per optimizer step "
                                       "(gradient checkpoints included)")
    lines += ["## Files", ""] + [f"- `{f}`" for f in files] + [""]
    return "\n".join(lines)
