"""racsim beside the paper: one section per paper table, with figures.

The paper's numbers are data (``racsim/data/paper_values.csv``, each with the
table and row it comes from). For every quantity the report sets racsim's
figure (from the exact expectation of the finite-T estimator, the Monte-Carlo
figure beside it) next to the paper's, with the ratio and whether the paper's
value lies inside racsim's 95% CI, and decomposes each RAC bias into
(a) the slack Theorem 2.1 predicts, (b) the truncation / initial-state bias of
the finite-T estimator (the synchronous oracle's whole bias), (c) Monte-Carlo
noise (the standard error). A ratio whose denominator sits at the noise floor
is flagged, not celebrated.
"""

from __future__ import annotations

import ast
from importlib import resources
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import numpy as np
import pandas as pd

from racsim.config.schema import LatencyConf
from racsim.io import fmt
from racsim.learner.theory import kl_crossover
from racsim.pipeline.kernels import distribution_kernel
from racsim.report.plots import _plt, _save

CI_RESAMPLES = 2000  # bootstrap over cells (seeds) for ratios of mean biases


def paper_values() -> pd.DataFrame:
    with resources.files("racsim.data").joinpath("paper_values.csv").open() as f:
        return pd.read_csv(f)


def _paper(study: str, row: str, metric: str) -> Tuple[float, float, float]:
    p = paper_values()
    hit = p[(p.study == study) & (p.row == row) & (p.metric == metric)]
    if hit.empty:
        return (np.nan, np.nan, np.nan)
    h = hit.iloc[0]
    return float(h.value), float(h.ci_lo), float(h.ci_hi)


def _ratio_ci(num: np.ndarray, den: np.ndarray, rng: np.random.Generator) -> Tuple[float, float, float]:
    """mean(num) / mean(den) over cells, with a paired bootstrap 95% CI over cells."""
    num, den = np.asarray(num, float), np.asarray(den, float)
    point = num.mean() / den.mean() if den.mean() > 0 else np.inf
    if len(num) < 2:
        return point, np.nan, np.nan
    idx = rng.integers(0, len(num), (CI_RESAMPLES, len(num)))
    r = num[idx].mean(1) / np.maximum(den[idx].mean(1), 1e-300)
    return point, *np.percentile(r, [2.5, 97.5])


class Row(dict):
    """One line of a comparison table."""


def _compare(label: str, ours: float, study: str, prow: str, metric: str, lo=np.nan, hi=np.nan,
             mc=np.nan, note: str = "") -> Row:
    paper, plo, phi = _paper(study, prow, metric)
    inside = "-" if not (np.isfinite(lo) and np.isfinite(hi) and np.isfinite(paper)) else (
        "yes" if lo <= paper <= hi else "no")
    return Row(quantity=label, racsim=ours, racsim_mc=mc, ci=f"[{fmt(lo)}, {fmt(hi)}]" if np.isfinite(lo) else "-",
               paper=paper, paper_ci=f"[{fmt(plo)}, {fmt(phi)}]" if np.isfinite(plo) else "-",
               ratio=(ours / paper) if np.isfinite(paper) and paper not in (0.0,) else np.nan,
               paper_in_ci=inside, note=note)


def _table(rows: List[Row]) -> str:
    if not rows:
        return "(no rows)"
    df = pd.DataFrame(rows)
    head = ["quantity", "racsim (exact)", "racsim (MC)", "racsim 95% CI", "paper", "paper CI",
            "racsim / paper", "paper in CI?", "note"]
    keys = ["quantity", "racsim", "racsim_mc", "ci", "paper", "paper_ci", "ratio", "paper_in_ci", "note"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(fmt(r[k]) for k in keys) + " |")
    return "\n".join(lines)


def _cell_reductions(part: pd.DataFrame, corrector: str = "rac") -> np.ndarray:
    """Per cell: naive's exact bias over the corrector's (rows in cell order)."""
    return part[part.corrector == "naive"].bias_exact.to_numpy() / part[part.corrector == corrector].bias_exact.to_numpy()


def _decompose(rows: pd.DataFrame, corrector: str = "rac") -> str:
    r = rows[rows.corrector == corrector]
    if r.empty:
        return ""
    a, b, c = r.bias_slack.mean(), r.bias_truncation.mean(), r.mc_se.mean()
    floor = int(r.at_noise_floor.sum())
    biggest = max((a, "the slack of Theorem 2.1 (a)"), (b, "the finite-T truncation and uniform start (b)"),
                  (c, "Monte-Carlo noise (c)"))[1]
    return (f"Decomposition of {corrector}'s bias (mean over cells): (a) slack part {fmt(a)}, "
            f"(b) truncation part {fmt(b)} (the synchronous oracle's whole bias), (c) Monte-Carlo s.e. {fmt(c)}; "
            f"the largest is {biggest}. {floor} of {len(r)} cells have a Monte-Carlo bias at the noise floor "
            f"(below 2 s.e.): their Monte-Carlo ratios are flagged, read the exact ones.")


def _k_label(v: str) -> int:
    return len(ast.literal_eval(v)) if isinstance(v, str) else int(v)


def section_table1_top(rows: pd.DataFrame, out: Path, rng) -> str:
    rows = rows.copy()
    rows["K_cfg"] = rows["pipeline.delay_steps"].map(_k_label)
    rows["sat"] = rows["pipeline.drain"].astype(bool) if "pipeline.drain" in rows else False
    out_rows = []
    for noise, part in rows.groupby("learner.fast_noise_std", sort=False):
        for (K, sat), cell in part.groupby(["K_cfg", "sat"], sort=True):
            n, r = cell[cell.corrector == "naive"], cell[cell.corrector == "rac"]
            red, lo, hi = _ratio_ci(n.bias_exact.to_numpy(), r.bias_exact.to_numpy(), rng)
            red_mc, *_ = _ratio_ci(n.bias_mc.to_numpy(), r.bias_mc.to_numpy(), rng)
            label = f"K={K}{' (sat)' if sat else ''}"
            flag = " (MC at noise floor)" if r.at_noise_floor.mean() > 0.5 else ""
            out_rows.append(_compare(f"{label}, sigma_f={noise}: naive bias", n.bias_exact.mean(), "table1_top", label,
                                     "naive_bias", mc=n.bias_mc.mean()))
            out_rows.append(_compare(f"{label}, sigma_f={noise}: RAC bias", r.bias_exact.mean(), "table1_top", label,
                                     "rac_bias", mc=r.bias_mc.mean()))
            out_rows.append(_compare(f"{label}, sigma_f={noise}: reduction", red, "table1_top", label, "reduction",
                                     lo, hi, red_mc, note=f"eta={fmt(r.slack_eta.mean())}{flag}"))
    return "\n\n".join([
        _table(out_rows),
        _decompose(rows),
        "Why racsim differs: a racsim trial is a run of 50 optimizer steps, and the results of the last Delta_k "
        "steps of each channel are still in flight when it ends. That end-of-run loss is the slack eta of "
        "Theorem 2.1 (about Delta_k / 50 per channel), so RAC's reduction is bounded by about 1/eta "
        "whatever the MDP; the saturated row (every in-flight result lands, gain row-normalised) has eta = 0 "
        "and is left with the truncation bias (b) only, which the synchronous oracle has too. Fast-channel "
        "noise sigma_f changes the Monte-Carlo spread, never the exact expectation. The paper does not say "
        "how its closed-form bias avoids the end-of-run loss.",
    ])


def section_table1_bottom(rows: pd.DataFrame, out: Path, rng) -> str:
    out_rows = []
    for (steps, noise), cell in rows.groupby(["pipeline.steps", "learner.fast_noise_std"], sort=False):
        for name in ("naive", "wait_for_slow", "retrace_a", "rac", "sync_oracle"):
            r = cell[cell.corrector == name]
            if r.empty:
                continue
            r = r.iloc[0]
            tag = f"steps={int(steps)}, sigma_f={noise}: {name}"
            note = "racsim's own simulated point" if name in ("wait_for_slow", "retrace_a") else ""
            out_rows.append(_compare(f"{tag} wall-clock x", r.wallclock_ratio, "table1_bottom", name,
                                     "wallclock_ratio", note=note))
            out_rows.append(_compare(f"{tag} reduction", r.reduction_exact, "table1_bottom", name, "reduction",
                                     r.get("reduction_ci_lo", np.nan), r.get("reduction_ci_hi", np.nan),
                                     r.reduction_mc, note=("MC at noise floor" if r.at_noise_floor else note)))
    _pareto_figure(rows, out / "paper_pareto.png")
    return "\n\n".join([
        _table(out_rows), _decompose(rows), "![Pareto](paper_pareto.png)",
        "The paper's wait-for-slow (26x) and Retrace-A (1.2x) points were not produced by a simulation of those "
        "correctors; racsim's come from its simulated clock: a 1 s step and 23.7 s slow results (E[Delta] = 25). "
        "Wait-for-slow pays the full latency every step. With a 50-step run, half of RAC's corrections are still "
        "in flight at the end (eta ~ 0.5), which caps its reduction near 2x; with 500 steps eta ~ 0.05. "
        "Retrace-A's gamma^Delta = 0.5^25 strips the signal entirely (reduction ~ 1).",
    ])


def section_table4(rows: pd.DataFrame, out: Path, rng) -> str:
    out_rows = []
    for drain, part in rows.groupby("pipeline.drain", sort=False):
        for name in ("rac", "rac_no_age", "bare_additive"):
            n, r = part[part.corrector == "naive"], part[part.corrector == name]
            red, lo, hi = _ratio_ci(n.bias_exact.to_numpy(), r.bias_exact.to_numpy(), rng)
            mc, *_ = _ratio_ci(n.bias_mc.to_numpy(), r.bias_mc.to_numpy(), rng)
            out_rows.append(_compare(f"drain={drain}: {name} reduction (mean over Delta in 5, 20, 50)", red,
                                     "table4", name, "reduction", lo, hi, mc,
                                     note=f"eta={fmt(r.slack_eta.mean())}"))
    return "\n\n".join([
        _table(out_rows), _decompose(rows),
        "In racsim the age kernel can only add slack (w_age <= 1 takes mass out of the effective kernel unless "
        "the gain is row-normalised), so RAC with w_age is never less biased than without it at an identity "
        "actor; the paper reports the opposite (47.9x vs 27.1x) without a mechanism. The clip is inert here "
        "(rho = 1), so -w_age and bare additive coincide, as the paper also finds. Without drain, a delay of "
        "50 steps in a 50-step run lands nothing.",
    ])


def section_table3(rows: pd.DataFrame, out: Path, rng) -> str:
    rows = rows.copy()
    rows["K_cfg"] = rows["pipeline.delay_steps"].map(_k_label)
    names = {"random": "canonical"}
    out_rows = []
    heat = {}
    for topo, part in rows.groupby("learner.topology", sort=False):
        label = names.get(topo, topo)
        reds = {}
        for K, cell in part.groupby("K_cfg"):
            n, r = cell[cell.corrector == "naive"], cell[cell.corrector == "rac"]
            reds[K] = _ratio_ci(n.bias_exact.to_numpy(), r.bias_exact.to_numpy(), rng)
        heat[label] = {K: v[0] for K, v in reds.items()}
        peak = max(reds, key=lambda k: reds[k][0])
        band = [k for k in reds if reds[k][0] >= 0.95 * reds[peak][0]]
        out_rows.append(_compare(f"{label}: peak K (band {band})", peak, "table3", label, "peak_K"))
        out_rows.append(_compare(f"{label}: reduction at peak", reds[peak][0], "table3", label, "red_peak",
                                 reds[peak][1], reds[peak][2]))
        for K, metric in ((15, "red_K15"), (2, "red_K2")):
            if K in reds:
                out_rows.append(_compare(f"{label}: reduction at K={K}", reds[K][0], "table3", label, metric,
                                         reds[K][1], reds[K][2]))
    _heatmap_figure(heat, out / "paper_k_sweep_heatmap.png")
    return "\n\n".join([
        _table(out_rows), _decompose(rows), "![K-sweep heatmap](paper_k_sweep_heatmap.png)",
        "With Delta_k = k, channel k loses its last k steps' results at the end of a 50-step run, so the slack "
        "grows with K and racsim's reduction falls with K after the first channels, rather than peaking at "
        "K = 5. With the noisy split r_k = r_slow/K + eps_k, channels injected at different rates no longer "
        "cancel their eps_k, so at large K RAC can end up more biased than naive (reduction below 1): partial "
        "injection of a noisy decomposition reintroduces its noise as bias. The topologies are racsim's own "
        "constructions (the paper names them only), documented in racsim/mdp.py.",
    ])


def section_table5(rows: pd.DataFrame, out: Path, rng) -> str:
    out_rows = []
    kinds = {}
    tau = 200.0 if 200.0 in set(rows["corrector.tau_age"]) else rows["corrector.tau_age"].iloc[0]
    at_tau = rows[rows["corrector.tau_age"] == tau]
    for dist, part in at_tau.groupby("pipeline.delay_distribution", sort=False):
        conf = ast.literal_eval(dist) if isinstance(dist, str) else dist
        kind = conf["kind"]
        kernel = np.array(distribution_kernel(LatencyConf(**conf), "delay"))
        kinds[kind] = kernel
        red = _cell_reductions(part)
        vif = part[part.corrector == "rac"].vif.to_numpy()
        out_rows += [
            _compare(f"{kind}: red-mean (tau_age={tau:g})", red.mean(), "table5", kind, "red_mean"),
            _compare(f"{kind}: red-min", red.min(), "table5", kind, "red_min"),
            _compare(f"{kind}: VIF mean", vif.mean(), "table5", kind, "vif_mean"),
            _compare(f"{kind}: VIF max", vif.max(), "table5", kind, "vif_max"),
            _compare(f"{kind}: realised mean delay (steps)", float((np.arange(len(kernel)) * kernel).sum()),
                     "table5", kind, "realised_mean"),
        ]
    _delay_figure(kinds, out / "paper_delay_distributions.png")
    return "\n\n".join([
        _table(out_rows), _decompose(rows), "![delay distributions](paper_delay_distributions.png)",
        "The five laws are matched at E[Delta] = 20 and rounded to whole steps. racsim's truncated Cauchy (median "
        "18, scale 4, conditioned on [1, 200]) has mean ~21.25; the paper's ~21.0 matches clipping rather than "
        "truncation. In a 50-step run, every result with Delta > 50 - t is lost, so the reduction depends mostly "
        "on the mean delay, little on the tail shape, as in the paper; VIF is the variance of RAC's estimator "
        "over naive's.",
    ])


def section_table6(rows: pd.DataFrame, out: Path, rng) -> str:
    out_rows = []
    boxes = {}
    drains = rows["pipeline.drain"] if "pipeline.drain" in rows else pd.Series(False, index=rows.index)
    for drain in sorted(set(drains.astype(bool))):
        part_d = rows[drains.astype(bool) == drain]
        for (S, A), part in part_d.groupby(["learner.n_states", "learner.n_actions"], sort=False):
            label = f"{int(S)}x{int(A)}"
            red = _cell_reductions(part)
            boxes[label + (" (drained)" if drain else "")] = red
            lo = hi = np.nan
            if label == "3x2" and len(red) > 1:
                idx = rng.integers(0, len(red), (10_000, len(red)))
                lo, hi = np.percentile(red[idx].mean(1), [2.5, 97.5])
            tag = f"{label}{', drained' if drain else ''}"
            out_rows += [
                _compare(f"{tag}: mean reduction", red.mean(), "table6", label, "red_mean", lo, hi),
                _compare(f"{tag}: median", float(np.median(red)), "table6", label, "red_median"),
                _compare(f"{tag}: min", red.min(), "table6", label, "red_min"),
                _compare(f"{tag}: max", red.max(), "table6", label, "red_max"),
            ]
    _box_figure(boxes, out / "paper_mdp_scaling.png")
    return "\n\n".join([
        _table(out_rows), _decompose(rows), "![MDP sizes](paper_mdp_scaling.png)",
        "Per-cell reductions (five MDP seeds x Delta in {5, 20, 50}); the 3x2 CI is a bootstrap over cells "
        "(B = 10000). Without draining, a delay of Delta steps loses the last Delta steps' results of a 50-step run "
        "(at Delta = 50, everything: those cells sit at 1x); drained, every result lands and what is left is the "
        "age kernel's slack and the truncation bias (b).",
    ])


def section_appendix_b(rows: pd.DataFrame, out: Path, rng) -> str:
    r = rows[rows.corrector == "rac"].copy()
    eta = r.slack_eta.to_numpy()
    out_rows = [
        _compare("pointwise ratio empirical/predicted (mean over eta > 0)",
                 float(r.theorem_ratio_mean[eta > 0].mean()), "appendix_b", "all", "ratio_mean"),
        _compare("std of the pointwise ratio (max over eta)", float(r.theorem_ratio_std[eta > 0].max()),
                 "appendix_b", "all", "ratio_std"),
    ]
    _slack_figure(r, out / "paper_slack.png")
    return "\n\n".join([
        _table(out_rows), "![slack line](paper_slack.png)",
        "Empirical = the exact expectation of RAC's estimator minus the synchronous one; predicted = "
        "-sum_k eta_k E[X_k] (Theorem 2.1), coordinate by coordinate. On the probe's (r_fast, r_slow) pairs "
        "the same sweep is in the advantage_probe job's slack.parquet.",
    ])


def section_identity(rows: pd.DataFrame, out: Path, rng) -> str:
    r = rows[rows.corrector == "rac"]
    linf = float(r.linf_vs_sync.max()) if "linf_vs_sync" in r else np.nan
    return _table([_compare("l_inf(RAC - synchronous), estimator, float64", linf, "identity", "all", "linf")]) + (
        "\n\nAt Lambda = I with rho = 1 and w_age(0) = 1, RAC's weights are exactly 1 and its estimates equal the "
        "synchronous oracle's bit for bit; the advantage-level collapse on (r_fast, r_slow) pairs is checked in "
        "the advantage_probe job (identity.parquet).")


def section_prop22(rows: pd.DataFrame, out: Path, rng) -> str:
    out_rows = [_compare("bound violations", int(rows.violated.sum()), "prop22", "all", "violations"),
                _compare("KL* (root finder)", kl_crossover(), "prop22", "all", "kl_star")]
    for _, r in rows.iterrows():
        out_rows.append(_compare(f"KL={fmt(r.kl)}: TV {fmt(r.tv)} <= bound {fmt(r.bound)} ({r.tight} tight)",
                                 r.tv, "prop22", "-", "-"))
    return _table(out_rows) + (
        "\n\nThe canonical 3x2 MDP cannot reach KL above KL* with exact mean updates (both updates saturate on the "
        "same action; the largest KL is ~1.41), so this scenario uses MDP seed 2, where the Bretagnolle-Huber "
        "branch becomes the tight one above KL*.")


def section_table7(rows: pd.DataFrame, out: Path, rng) -> str:
    out_rows = []
    for _, r in rows.iterrows():
        ch = r.channel
        out_rows += [_compare(f"{ch}: l2 ratio", r.l2_ratio, "table7", ch, "l2_ratio"),
                     _compare(f"{ch}: cos(ctrl, oracle)", r.cos_control, "table7", ch, "cos_control"),
                     _compare(f"{ch}: cos(RAC, oracle)", r.cos_rac, "table7", ch, "cos_rac")]
    return _table(out_rows) + (
        "\n\nOn synthetic pairs at Pearson r = -0.53 whose means and spreads were fitted to the deterministic row's "
        "cos(ctrl) and l2 ratio (racsim/probe.py, PAPER_LIKE_MOMENTS); cos(RAC) is then a prediction. Point "
        "study.probe.pairs at a file of real (r_fast, r_slow) scores to run it on them.")


SECTIONS: Dict[str, Tuple[str, Callable]] = {
    "table1_top": ("Table 1, top block: K-sweep", section_table1_top),
    "table1_bottom": ("Table 1, bottom block: baselines at K = 2", section_table1_bottom),
    "table4": ("Table 4: knob ablation at K = 2", section_table4),
    "table3": ("Table 3: cross-topology K-sweep", section_table3),
    "table5": ("Table 5: heavy-tailed delays", section_table5),
    "table6": ("Table 6: MDP sizes", section_table6),
    "appendix_b": ("Appendix B: slack sweep", section_appendix_b),
    "identity": ("Identity kernel: the V-trace collapse", section_identity),
    "prop22": ("Proposition 2.2: TV bound", section_prop22),
    "table7": ("Appendix G: static-batch advantage probe", section_table7),
}


def paper_report(df: pd.DataFrame, out: Path, seed: int = 0) -> str:
    """Markdown sections (and PNG figures in ``out``) for every paper study in ``df``."""
    if "study" not in df:
        return ""
    rng = np.random.default_rng(seed)
    parts = ["## racsim beside the paper", "",
             "racsim's figures use the exact expectation of the finite-T estimator (noise-free); the Monte-Carlo "
             "figure is beside it. Paper values: racsim/data/paper_values.csv (table and row of each).", ""]
    for study, (title, fn) in SECTIONS.items():
        rows = df[df.study == study]
        if rows.empty:
            continue
        rows = rows.dropna(axis=1, how="all")
        try:
            body = fn(rows, out, rng)
        except (KeyError, AttributeError) as ex:  # results written by an older racsim lack a column
            body = (f"(section skipped: the results lack {ex}; rerun the scenario with this racsim "
                    f"to compare it with the paper)")
        parts += [f"### {title}", "", body, ""]
    return "\n".join(parts)


def _heatmap_figure(heat: Dict[str, Dict[int, float]], path: Path) -> None:
    plt = _plt()
    topos = list(heat)
    Ks = sorted({k for v in heat.values() for k in v})
    M = np.array([[heat[t].get(k, np.nan) for k in Ks] for t in topos])
    fig, ax = plt.subplots(figsize=(1.0 + 0.8 * len(Ks), 0.9 + 0.55 * len(topos)))
    im = ax.imshow(np.log10(M), cmap="viridis", aspect="auto")
    for i, t in enumerate(topos):
        j = int(np.nanargmax(M[i]))
        ax.plot(j, i, marker="*", color="white", ms=14, mec="black")
        for jj in range(len(Ks)):
            ax.text(jj, i, f"{M[i, jj]:.3g}", ha="center", va="center", fontsize=7, color="w")
    ax.set_xticks(range(len(Ks)), [str(k) for k in Ks])
    ax.set_yticks(range(len(topos)), topos)
    ax.set_xlabel("K (slow channels, Delta_k = k)")
    ax.set_title("RAC bias reduction vs naive (exact); star = per-topology peak")
    fig.colorbar(im, ax=ax, label="log10 reduction")
    _save(fig, path)
    plt.close(fig)


def _pareto_figure(rows: pd.DataFrame, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for (steps, noise), cell in rows.groupby(["pipeline.steps", "learner.fast_noise_std"], sort=False):
        if noise != rows["learner.fast_noise_std"].iloc[0]:
            continue
        for _, r in cell.iterrows():
            ax.scatter(r.wallclock_ratio, r.reduction_exact, marker="o" if steps == 50 else "s")
            ax.annotate(f"{r.corrector} ({steps} steps)", (r.wallclock_ratio, r.reduction_exact), fontsize=7,
                        xytext=(4, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("wall-clock relative to naive (simulated)")
    ax.set_ylabel("bias reduction vs naive (exact)")
    ax.set_title("Cost-quality Pareto at K = 2, E[Delta] = 25")
    ax.grid(True, which="both", alpha=0.3)
    _save(fig, path)
    plt.close(fig)


def _delay_figure(kernels: Dict[str, np.ndarray], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for kind, k in kernels.items():
        x = np.arange(len(k))
        ax.plot(x[:80], k[:80], label=f"{kind} (mean {float((x * k).sum()):.2f})",
                drawstyle="steps-mid")
    ax.set_xlabel("delay Delta (steps)")
    ax.set_ylabel("P(Delta)")
    ax.set_title("Five delay laws matched at E[Delta] = 20 (rounded)")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    _save(fig, path)
    plt.close(fig)


def _box_figure(boxes: Dict[str, np.ndarray], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.boxplot(list(boxes.values()), tick_labels=list(boxes))
    ax.scatter(range(1, len(boxes) + 1), [v.mean() for v in boxes.values()], color="red", zorder=3, label="mean")
    ax.set_yscale("log")
    ax.set_xlabel("|S| x |A|")
    ax.set_ylabel("RAC bias reduction (exact)")
    ax.set_title("Bias reduction across MDP sizes")
    ax.legend()
    ax.grid(True, alpha=0.3)
    _save(fig, path)
    plt.close(fig)


def _slack_figure(r: pd.DataFrame, path: Path) -> None:
    plt = _plt()
    r = r.sort_values("slack_eta")
    fig, ax = plt.subplots(figsize=(5.6, 4))
    ax.plot(r.slack_eta, r.bias_slack, "-", label="predicted: || sum_k eta_k E[X_k] || (Theorem 2.1)")
    ax.plot(r.slack_eta, r.bias_vs_sync_mc, "o", label="empirical: || mean estimate - E[sync] || (Monte Carlo)")
    ax.plot(r.slack_eta, r.bias_vs_sync_exact, "x", label="exact expectation")
    ax.set_xlabel("slack eta")
    ax.set_ylabel("bias from slack")
    ax.set_title("Theorem 2.1: bias linear in the slack")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    _save(fig, path)
    plt.close(fig)
