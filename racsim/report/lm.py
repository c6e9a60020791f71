"""Plots and summary of the LM study (learner.kind=lm, racsim/analyses/lm_study.py)."""

from __future__ import annotations

from pathlib import Path

from typing import List

import numpy as np
import pandas as pd

from racsim.analyses.lm_study import Z95
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
    """One line on what a `slow grad missing` share outside [0, 1] means, naming the correctors
    that have one; empty when none has."""
    if "grad_missing" not in r:
        return ""
    out = r[(r.grad_missing < 0) | (r.grad_missing > 1)]
    if not len(out):
        return ""
    named = ", ".join(f"{c} {m:.3f} +- {h:.3f}"
                      for c, m, h in zip(out.corrector, out.grad_missing, out.grad_missing_ci))
    return (f"`slow grad missing` outside [0, 1] ({named}): 0 is synchronous GRPO, 1 an update without the slow "
            "signal (naive); below 0 the update carries more of the slow signal's gradient than synchronous GRPO "
            "(its late results over-weighted), above 1 it points against it; where the +- interval reaches into "
            "[0, 1] the difference is within the estimate's noise")


def format_paired(paired: pd.DataFrame) -> str:
    """The paired differences (racsim.analyses.lm_study.paired_differences) as a text table."""
    df = paired.copy()
    df["95% CI"] = [f"[{a:+.4f}, {b:+.4f}]" for a, b in zip(df.ci_lo, df.ci_hi)]
    df["answer"] = np.where(df.excludes_zero, np.where(df["diff"] > 0, "rac ahead", "rac behind"),
                            np.where(df.narrower_than_effect, "tie (CI < effect size)", "unresolved"))
    keep = [c for c in ("cell", "metric", "pair", "seeds", "diff", "95% CI", "sd", "answer") if c in df]
    return df[keep].to_string(index=False, float_format=lambda v: f"{v:+.4f}")


def verdict_lines(paired: pd.DataFrame, rule: pd.DataFrame) -> List[str]:
    """The answer of an LM run, one line per pair (rac minus each other corrector, true reward at
    naive's wall-clock, seed by seed): better or worse when the 95% interval excludes 0; a tie when it
    is narrower than the effect size; else unresolved, with the seeds the seed rule asks for."""
    asks = dict(zip(rule.pair, rule.n_pair)) if rule is not None else {}
    lines = []
    for r in paired[paired.metric == "true_at_naive_clock"].itertuples():
        other = r.pair.split(" - ", 1)[1]
        ci = f"{r.diff:+.3f} [{r.ci_lo:+.3f}, {r.ci_hi:+.3f}]"
        if r.excludes_zero:
            word = "better" if r.diff > 0 else "worse"
            lines.append(f"rac vs {other}: {word} ({ci} true reward at naive's clock, {r.seeds} seeds)")
        elif r.sd == 0 and r.diff == 0:
            lines.append(f"rac vs {other}: identical at every one of {r.seeds} seeds (the same updates here)")
        elif r.narrower_than_effect:
            bound = max(abs(r.ci_lo), abs(r.ci_hi))
            lines.append(f"rac vs {other}: the same within {bound:.3g} with 95% confidence ({ci}, {r.seeds} seeds)")
        else:
            more = asks.get(r.pair)
            ask = f"; the seed rule asks for {int(more)}" if more is not None else ""
            lines.append(f"rac vs {other}: unresolved at {r.seeds} seeds ({ci}{ask})")
    return lines


def paired_markdown(res) -> list:
    """The power study's sections: paired differences and the seed rule's inputs (none without them)."""
    paired = res.extra.get("lm_paired")
    if paired is None:
        return []
    rule = res.extra["lm_seed_rule"]
    out = ["## The answer", "", *[f"- {v}" for v in verdict_lines(paired, rule)], "",
           "## Paired differences: rac minus each corrector, seed by seed", "",
           "Every corrector's seed s sees the same prompts, the same uniforms behind every sampled token and the same "
           "delays (common random numbers), so each seed gives one difference; `diff` is their mean, `95% CI` the "
           "t-interval over seeds (n - 1 degrees of freedom), `sd` their standard deviation. "
           "`true_at_naive_clock`: true reward when the seed's naive run has finished; `true_final`: the last 10% "
           f"of steps. `answer`: the interval excludes 0, or is narrower than the effect size "
           f"{rule.effect_size.iloc[0]:g}, or neither.", "", "```", format_paired(paired), "```", "",
           "## Seed count", "",
           "From a pilot's paired differences (true reward at naive's clock), per pair n = min(n_precision, "
           "n_separation): n_precision the smallest n whose 95% interval is narrower than the effect size at the "
           "pilot's sd, n_separation the smallest n whose interval excludes 0 with 80% power when the difference is "
           "the pilot's |diff| less its own 95% half-width (none when that interval holds 0); the study runs the "
           "largest n (the pilot's seeds among them), at most learner.lm.max_seeds, and applies the rule again on "
           "every seed run so far (stages) until it asks for no more.", "", "```",
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
