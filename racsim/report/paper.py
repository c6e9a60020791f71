"""racsim beside the paper: one section per paper table, with figures.

The paper's numbers are data (``racsim/data/paper_values.csv``, each with the
table and row it comes from), and so is the prose that reads them
(``racsim/data/paper_sections.yaml``: titles, the paragraph under each table,
figure captions); this module computes. For every quantity
:func:`comparison_tables` sets racsim's figure (from the exact expectation of
the finite-T estimator, the Monte-Carlo figure beside it) next to the paper's,
with the ratio, one data frame per paper table (whether the paper's value is
what its own procedure yields is judged by :func:`static_report` only); each RAC bias is decomposed into (a) the slack
Theorem 2.1 predicts, (b) the truncation / initial-state bias of the finite-T
estimator (the synchronous oracle's whole bias), (c) Monte-Carlo noise (the
standard error). A ratio whose denominator sits at the noise floor is flagged,
not celebrated. :func:`paper_report` renders the frames, the decompositions,
the figures and the prose as markdown.

The confidence intervals are percentile bootstraps over cells (seeds), by
``scipy.stats.bootstrap``; a ratio of mean biases resamples its numerator and
denominator cells together (``paired=True``). (BCa was tried: on skewed cells
like these it covers no better than the percentile interval at 4 to 50 cells,
and a little worse at 50.) Each section draws from its own random stream, so
its intervals do not depend on which other sections are in the results.
"""

from __future__ import annotations

import ast
import copy
import functools
import warnings
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np
import pandas as pd
import yaml
from scipy import stats

from racsim.config.schema import LatencyConf
from racsim.io import fmt
from racsim.learner.theory import kl_crossover
from racsim.pipeline.kernels import distribution_kernel
from racsim.report.plots import _plt, _save, scale_from_data

CI_RESAMPLES = 2000  # bootstrap resamples over cells (seeds) for ratios of mean biases
MEAN_CI_RESAMPLES = 10_000  # for Table 6's mean reduction (the paper's B)

# The comparison frame's columns, in order (a section may add its own after
# them: K, eta, ...); row and metric name the paper's value in paper_values.csv.
COLUMNS = ["quantity", "racsim", "racsim_mc", "ci_lo", "ci_hi", "paper", "paper_ci_lo", "paper_ci_hi", "ratio",
           "note", "row", "metric"]
# report.md's header (the two CIs are rendered as "[lo, hi]")
# (no "paper in CI?" here: racsim's CI is over cells of the pipeline's exact ratios, the paper's figure a
# Monte-Carlo ratio of another experiment; static_report judges the paper against its own procedure)
HEADERS = ["quantity", "racsim (exact)", "racsim (MC)", "racsim 95% CI", "paper", "paper CI", "racsim / paper",
           "note"]


@functools.lru_cache(maxsize=None)
def _paper_values() -> pd.DataFrame:
    with resources.files("racsim.data").joinpath("paper_values.csv").open() as f:
        return pd.read_csv(f)


def paper_values() -> pd.DataFrame:
    """The paper's numbers: study, row, metric, value, ci_lo, ci_hi, source."""
    return _paper_values().copy()


@functools.lru_cache(maxsize=None)
def _paper_sections() -> dict:
    with resources.files("racsim.data").joinpath("paper_sections.yaml").open() as f:
        return yaml.safe_load(f)


def paper_sections() -> dict:
    """The report's prose (racsim/data/paper_sections.yaml): heading, intro,
    templates, and per section id its title, figure and reading."""
    return copy.deepcopy(_paper_sections())


def _paper(study: str, row: str, metric: str) -> Tuple[float, float, float]:
    p = _paper_values()
    hit = p[(p.study == study) & (p.row == row) & (p.metric == metric)]
    if hit.empty:
        return (np.nan, np.nan, np.nan)
    h = hit.iloc[0]
    return float(h.value), float(h.ci_lo), float(h.ci_hi)


def _ratio(num, den) -> float:
    """mean(num) / mean(den) over cells (inf when the denominator's mean is not positive)."""
    num, den = np.asarray(num, float), np.asarray(den, float)
    return num.mean() / den.mean() if den.mean() > 0 else np.inf


def _ratio_of_means(num: np.ndarray, den: np.ndarray, axis: int = -1) -> np.ndarray:
    return num.mean(axis) / np.maximum(den.mean(axis), 1e-300)


def _bootstrap_ci(data: Tuple[np.ndarray, ...], statistic: Callable, rng: np.random.Generator,
                  n_resamples: int, paired: bool = False) -> Tuple[float, float]:
    """95% percentile bootstrap interval of ``statistic`` over cells."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        res = stats.bootstrap(data, statistic, n_resamples=n_resamples, paired=paired, vectorized=True,
                              confidence_level=0.95, method="percentile", rng=rng)
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def _ratio_ci(num, den, rng: np.random.Generator) -> Tuple[float, float, float]:
    """mean(num) / mean(den) over cells, with a paired (num and den of a cell
    together) bootstrap 95% CI over cells."""
    num, den = np.asarray(num, float), np.asarray(den, float)
    point = _ratio(num, den)
    if len(num) < 2:
        return point, np.nan, np.nan
    return (point, *_bootstrap_ci((num, den), _ratio_of_means, rng, CI_RESAMPLES, paired=True))


def _mean_ci(x, rng: np.random.Generator) -> Tuple[float, float]:
    """Bootstrap 95% CI of the mean over cells."""
    return _bootstrap_ci((np.asarray(x, float),), np.mean, rng, MEAN_CI_RESAMPLES)


def _compare(label: str, ours: float, study: str, prow: str, metric: str, lo=np.nan, hi=np.nan,
             mc=np.nan, note: str = "", **extra: Any) -> Dict[str, Any]:
    """One line of a comparison table: racsim's figure beside the paper's
    (``extra``: the section's own columns)."""
    paper, plo, phi = _paper(study, prow, metric)
    return dict(quantity=label, racsim=ours, racsim_mc=mc, ci_lo=lo, ci_hi=hi, paper=paper, paper_ci_lo=plo,
                paper_ci_hi=phi, ratio=(ours / paper) if np.isfinite(paper) and paper not in (0.0,) else np.nan,
                note=note, row=prow, metric=metric, **extra)


def _frame(rows: List[Dict[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    return pd.DataFrame(columns=COLUMNS) if df.empty else df


def _interval(lo, hi) -> str:
    return f"[{fmt(lo)}, {fmt(hi)}]" if np.isfinite(lo) else "-"


def _table(frame: pd.DataFrame) -> str:
    """A comparison frame as a markdown table."""
    if frame.empty:
        return "(no rows)"
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for _, r in frame.iterrows():
        cells = [r.quantity, r.racsim, r.racsim_mc, _interval(r.ci_lo, r.ci_hi), r.paper,
                 _interval(r.paper_ci_lo, r.paper_ci_hi), r.ratio, r.note]
        lines.append("| " + " | ".join(fmt(c) for c in cells) + " |")
    return "\n".join(lines)


def _cell_reductions(part: pd.DataFrame, corrector: str = "rac") -> np.ndarray:
    """Per cell: naive's exact bias over the corrector's (rows in cell order)."""
    return part[part.corrector == "naive"].bias_exact.to_numpy() / part[part.corrector == corrector].bias_exact.to_numpy()


def _decompose(rows: pd.DataFrame, corrector: str = "rac") -> Dict[str, Any]:
    """The corrector's bias split into (a) slack, (b) truncation, (c) Monte-Carlo
    s.e. (means over cells), the largest of the three, and the number of cells
    whose Monte-Carlo bias is at the noise floor. Empty without the corrector."""
    r = rows[rows.corrector == corrector]
    if r.empty:
        return {}
    parts = {"slack": r.bias_vs_sync_exact.mean(), "truncation": r.bias_truncation.mean(), "mc_se": r.mc_se.mean()}
    return dict(corrector=corrector, **parts, largest=max(parts, key=parts.get),
                at_noise_floor=int(r.at_noise_floor.sum()), cells=len(r))


def _k_label(v: str) -> int:
    return len(ast.literal_eval(v)) if isinstance(v, str) else int(v)


def _fast_counted(rows: pd.DataFrame):
    """1 where K counts the fast channel (the paper's split, learner.reward_split total), else 0."""
    if "learner.reward_split" not in rows:
        return 0
    return (rows["learner.reward_split"] == "total").astype(int)


class Section(NamedTuple):
    """A paper table computed from racsim's results."""

    frame: pd.DataFrame  # the comparison table (see COLUMNS)
    decomposition: Optional[Dict[str, Any]] = None  # see _decompose; None: the section has none
    draw: Optional[Callable[[Path], None]] = None  # writes the section's figure to a path


def section_table1_top(rows: pd.DataFrame, rng) -> Section:
    rows = rows.copy()
    rows["K_cfg"] = rows["pipeline.delay_steps"].map(_k_label) + _fast_counted(rows)
    rows["sat"] = rows["pipeline.drain"].astype(bool) if "pipeline.drain" in rows else False
    if "corrector.row_normalize" in rows:  # the saturated row: the row-normalised gain
        rows["sat"] = rows["sat"] | rows["corrector.row_normalize"].astype(bool)
    out_rows = []
    for noise, part in rows.groupby("learner.fast_noise_std", sort=False):
        for (K, sat), cell in part.groupby(["K_cfg", "sat"], sort=True):
            n, r = cell[cell.corrector == "naive"], cell[cell.corrector == "rac"]
            red, lo, hi = _ratio_ci(n.bias_exact.to_numpy(), r.bias_exact.to_numpy(), rng)
            red_mc = _ratio(n.bias_mc.to_numpy(), r.bias_mc.to_numpy())
            label = f"K={K}{' (sat)' if sat else ''}"
            eta, floor = r.slack_eta.mean(), bool(r.at_noise_floor.mean() > 0.5)
            flag = " (MC at noise floor)" if floor else ""
            cols = dict(K=K, sat=bool(sat), sigma_f=noise)
            out_rows.append(_compare(f"{label}, sigma_f={noise}: naive bias", n.bias_exact.mean(), "table1_top", label,
                                     "naive_bias", mc=n.bias_mc.mean(), **cols))
            out_rows.append(_compare(f"{label}, sigma_f={noise}: RAC bias", r.bias_exact.mean(), "table1_top", label,
                                     "rac_bias", mc=r.bias_mc.mean(), **cols))
            out_rows.append(_compare(f"{label}, sigma_f={noise}: reduction", red, "table1_top", label, "reduction",
                                     lo, hi, red_mc, note=f"eta={fmt(eta)}{flag}", eta=eta, mc_at_noise_floor=floor,
                                     **cols))
    return Section(_frame(out_rows), _decompose(rows))


def section_table1_bottom(rows: pd.DataFrame, rng) -> Section:
    out_rows = []
    for (steps, noise), cell in rows.groupby(["pipeline.steps", "learner.fast_noise_std"], sort=False):
        for name in ("naive", "wait_for_slow", "retrace_a", "rac", "sync_oracle"):
            r = cell[cell.corrector == name]
            if r.empty:
                continue
            r = r.iloc[0]
            tag = f"steps={int(steps)}, sigma_f={noise}: {name}"
            note = "racsim's own simulated point" if name in ("wait_for_slow", "retrace_a") else ""
            cols = dict(steps=int(steps), sigma_f=noise, corrector=name)
            out_rows.append(_compare(f"{tag} wall-clock x", r.wallclock_ratio, "table1_bottom", name,
                                     "wallclock_ratio", note=note, **cols))
            out_rows.append(_compare(f"{tag} reduction", r.reduction_exact, "table1_bottom", name, "reduction",
                                     r.get("reduction_ci_lo", np.nan), r.get("reduction_ci_hi", np.nan),
                                     r.reduction_mc, note=("MC at noise floor" if r.at_noise_floor else note),
                                     mc_at_noise_floor=bool(r.at_noise_floor), **cols))
    return Section(_frame(out_rows), _decompose(rows), lambda path: _pareto_figure(rows, path))


def section_table4(rows: pd.DataFrame, rng) -> Section:
    out_rows = []
    for drain, part in rows.groupby("pipeline.drain", sort=False):
        for name in ("rac", "rac_no_age", "bare_additive"):
            n, r = part[part.corrector == "naive"], part[part.corrector == name]
            red, lo, hi = _ratio_ci(n.bias_exact.to_numpy(), r.bias_exact.to_numpy(), rng)
            mc = _ratio(n.bias_mc.to_numpy(), r.bias_mc.to_numpy())
            eta = r.slack_eta.mean()
            out_rows.append(_compare(f"drain={drain}: {name} reduction (mean over Delta in 5, 20, 50)", red,
                                     "table4", name, "reduction", lo, hi, mc, note=f"eta={fmt(eta)}",
                                     drain=bool(drain), corrector=name, eta=eta))
    return Section(_frame(out_rows), _decompose(rows))


def section_table3(rows: pd.DataFrame, rng) -> Section:
    rows = rows.copy()
    rows["K_cfg"] = rows["pipeline.delay_steps"].map(_k_label) + _fast_counted(rows)
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
        out_rows.append(_compare(f"{label}: peak K (band {band})", peak, "table3", label, "peak_K", topology=label))
        out_rows.append(_compare(f"{label}: reduction at peak", reds[peak][0], "table3", label, "red_peak",
                                 reds[peak][1], reds[peak][2], topology=label, K=peak))
        for K, metric in ((15, "red_K15"), (2, "red_K2")):
            if K in reds:
                out_rows.append(_compare(f"{label}: reduction at K={K}", reds[K][0], "table3", label, metric,
                                         reds[K][1], reds[K][2], topology=label, K=K))
    return Section(_frame(out_rows), _decompose(rows), lambda path: _heatmap_figure(heat, path))


def section_table5(rows: pd.DataFrame, rng) -> Section:
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
            _compare(f"{kind}: red-mean (tau_age={tau:g})", red.mean(), "table5", kind, "red_mean", kind=kind),
            _compare(f"{kind}: red-min", red.min(), "table5", kind, "red_min", kind=kind),
            _compare(f"{kind}: VIF mean", vif.mean(), "table5", kind, "vif_mean", kind=kind),
            _compare(f"{kind}: VIF max", vif.max(), "table5", kind, "vif_max", kind=kind),
            _compare(f"{kind}: realised mean delay (steps)", float((np.arange(len(kernel)) * kernel).sum()),
                     "table5", kind, "realised_mean", kind=kind),
        ]
    return Section(_frame(out_rows), _decompose(rows), lambda path: _delay_figure(kinds, path))


def section_table6(rows: pd.DataFrame, rng) -> Section:
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
                lo, hi = _mean_ci(red, rng)
            tag = f"{label}{', drained' if drain else ''}"
            cols = dict(size=label, drain=bool(drain))
            out_rows += [
                _compare(f"{tag}: mean reduction", red.mean(), "table6", label, "red_mean", lo, hi, **cols),
                _compare(f"{tag}: median", float(np.median(red)), "table6", label, "red_median", **cols),
                _compare(f"{tag}: min", red.min(), "table6", label, "red_min", **cols),
                _compare(f"{tag}: max", red.max(), "table6", label, "red_max", **cols),
            ]
    return Section(_frame(out_rows), _decompose(rows), lambda path: _box_figure(boxes, path))


def section_appendix_b(rows: pd.DataFrame, rng) -> Section:
    r = rows[rows.corrector == "rac"].copy()
    eta = r.slack_eta.to_numpy()
    out_rows = [
        _compare("pointwise ratio empirical/predicted (mean over eta > 0)",
                 float(r.theorem_ratio_mean[eta > 0].mean()), "appendix_b", "all", "ratio_mean"),
        _compare("std of the pointwise ratio (max over eta)", float(r.theorem_ratio_std[eta > 0].max()),
                 "appendix_b", "all", "ratio_std"),
    ]
    return Section(_frame(out_rows), None, lambda path: _slack_figure(r, path))


def section_identity(rows: pd.DataFrame, rng) -> Section:
    r = rows[rows.corrector == "rac"]
    linf = float(r.linf_vs_sync.max()) if "linf_vs_sync" in r else np.nan
    return Section(_frame([_compare("l_inf(RAC - synchronous), estimator, float64", linf, "identity", "all",
                                    "linf")]))


def section_prop22(rows: pd.DataFrame, rng) -> Section:
    out_rows = [_compare("bound violations", int(rows.violated.sum()), "prop22", "all", "violations"),
                _compare("KL* (root finder)", kl_crossover(), "prop22", "all", "kl_star")]
    for _, r in rows.iterrows():
        out_rows.append(_compare(f"KL={fmt(r.kl)}: TV {fmt(r.tv)} <= bound {fmt(r.bound)} ({r.tight} tight)",
                                 r.tv, "prop22", "-", "-", kl=r.kl, bound=r.bound, tight=r.tight))
    return Section(_frame(out_rows))


def section_table7(rows: pd.DataFrame, rng) -> Section:
    out_rows = []
    for _, r in rows.iterrows():
        ch = r.channel
        out_rows += [_compare(f"{ch}: l2 ratio", r.l2_ratio, "table7", ch, "l2_ratio", channel=ch),
                     _compare(f"{ch}: cos(ctrl, oracle)", r.cos_control, "table7", ch, "cos_control", channel=ch),
                     _compare(f"{ch}: cos(RAC, oracle)", r.cos_rac, "table7", ch, "cos_rac", channel=ch)]
    return Section(_frame(out_rows))


# study id (results' ``study`` column, paper_values.csv's and paper_sections.yaml's) -> its computation, in
# report order
SECTIONS: Dict[str, Callable[[pd.DataFrame, np.random.Generator], Section]] = {
    "table1_top": section_table1_top,
    "table1_bottom": section_table1_bottom,
    "table4": section_table4,
    "table3": section_table3,
    "table5": section_table5,
    "table6": section_table6,
    "appendix_b": section_appendix_b,
    "identity": section_identity,
    "prop22": section_prop22,
    "table7": section_table7,
}


def _sections(df: pd.DataFrame, seed: int = 0) -> Dict[str, Any]:
    """Every paper study in ``df``: its Section, or the KeyError / AttributeError
    that computing it raised (results written by an older racsim lack a column)."""
    if "study" not in df:
        return {}
    streams = np.random.SeedSequence(seed).spawn(len(SECTIONS))
    built: Dict[str, Any] = {}
    if "mode" in df:  # these sections read the pipeline's rows; the static ones: static_report
        df = df[df["mode"].fillna("pipeline") == "pipeline"]
    for (study, fn), stream in zip(SECTIONS.items(), streams, strict=True):
        rows = df[df.study == study]
        if rows.empty:
            continue
        rows = rows.dropna(axis=1, how="all")
        try:
            built[study] = fn(rows, np.random.default_rng(stream))
        except (KeyError, AttributeError) as ex:
            built[study] = ex
    return built


def comparison_tables(df: pd.DataFrame, seed: int = 0) -> Dict[str, pd.DataFrame]:
    """{study id: comparison frame} for every paper study in ``df`` whose results
    have what it needs (the others are left out; :func:`paper_report` says why).
    Columns: COLUMNS (racsim's figure, its Monte-Carlo figure and 95% CI, the
    paper's figure and CI, racsim / paper, whether the paper's figure is inside
    racsim's CI: NA where either is missing), then the section's own (K, eta...)."""
    return {study: s.frame for study, s in _sections(df, seed).items() if isinstance(s, Section)}


def paper_report(df: pd.DataFrame, out: Path, seed: int = 0, reps: Optional[pd.DataFrame] = None) -> str:
    """Markdown: the static comparison (:func:`static_report`, from the static rows and their
    replications ``reps``), then sections (and PNG figures in ``out``) for every paper study
    in ``df``'s pipeline rows; empty when there is neither."""
    built = _sections(df, seed)
    if "study" not in df:
        return ""
    static = static_report(df, reps)
    if not built:  # no paper study among the pipeline's rows: no section of its own
        return static
    prose = _paper_sections()
    parts = [static, f"## {prose['heading']}", "", prose["intro"], ""]
    for study, s in built.items():
        text = prose["sections"][study]
        if isinstance(s, Section):
            fig = text.get("figure") if s.draw is not None else None
            blocks = [_table(s.frame)]
            if s.decomposition is not None:
                blocks.append(_decomposition(s.decomposition, prose))
            try:
                if fig:
                    s.draw(Path(out) / fig["file"])
                    blocks.append(f"![{fig['alt']}]({fig['file']})")
                body = "\n\n".join(blocks + [text["reading"]])
            except (KeyError, AttributeError) as ex:  # the figure needs a column the results lack
                body = prose["skipped"].format(error=ex)
        else:
            body = prose["skipped"].format(error=s)
        parts += [f"### {text['title']}", "", body, ""]
    return "\n".join(parts)


def _decomposition(d: Dict[str, Any], prose: dict) -> str:
    if not d:
        return ""
    return prose["decomposition"].format(
        corrector=d["corrector"], slack=fmt(d["slack"]), truncation=fmt(d["truncation"]), mc_se=fmt(d["mc_se"]),
        largest=prose["largest"][d["largest"]], at_noise_floor=d["at_noise_floor"], cells=d["cells"])


def _heatmap_figure(heat: Dict[str, Dict[int, float]], path: Path) -> None:
    plt = _plt()
    topos = list(heat)
    Ks = sorted({k for v in heat.values() for k in v})
    M = np.array([[heat[t].get(k, np.nan) for k in Ks] for t in topos])
    fig, ax = plt.subplots(figsize=(1.0 + 0.8 * len(Ks), 0.9 + 0.55 * len(topos)))
    with np.errstate(divide="ignore", invalid="ignore"):  # a reduction of 0 or below, or NaN: a blank cell
        im = ax.imshow(np.where(M > 0, np.log10(np.where(M > 0, M, 1.0)), np.nan), cmap="viridis", aspect="auto")
    for i, t in enumerate(topos):
        if np.isfinite(M[i]).any():
            j = int(np.nanargmax(np.where(np.isfinite(M[i]), M[i], np.nan)))
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
    drawn = rows[rows["learner.fast_noise_std"] == rows["learner.fast_noise_std"].iloc[0]]
    scale_from_data(ax, "x", drawn.wallclock_ratio)
    scale_from_data(ax, "y", drawn.reduction_exact)
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
    scale_from_data(ax, "y", np.concatenate([[], *(np.asarray(v, dtype=float) for v in boxes.values())]))
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
    ax.plot(r.slack_eta, r.bias_vs_sync_theorem, "-", label="predicted: || sum_k eta_k E[X_k] || (Theorem 2.1)")
    ax.plot(r.slack_eta, r.bias_vs_sync_mc, "o", label="empirical: || mean estimate - E[sync] || (Monte Carlo)")
    ax.plot(r.slack_eta, r.bias_vs_sync_exact, "x", label="exact expectation")
    ax.set_xlabel("slack eta")
    ax.set_ylabel("bias from slack")
    ax.set_title("Theorem 2.1: bias linear in the slack")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    _save(fig, path)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------
# The paper's own experiment (study.mode static): paper value | static exact | static MC at the
# paper's trial counts with the replication interval of its procedure | pipeline steady-state.

STATIC_HEADERS = ["paper number", "paper", "static exact (paper agg.)", "static exact (ratio of means)",
                  "static MC (paper agg.)", "95% replication interval", "paper in interval?",
                  "static MC (ratio of means)", "pipeline (exact)", "reason for a difference"]

_AGG = {"red_mean": np.mean, "reduction": np.mean, "red_min": np.min, "red_max": np.max, "red_median": np.median,
        "red_K2": np.mean, "red_K15": np.mean}


@functools.lru_cache(maxsize=None)
def _static_prose() -> dict:
    with resources.files("racsim.data").joinpath("paper_static.yaml").open() as f:
        return yaml.safe_load(f)


def _cell_keys(rows: pd.DataFrame) -> List[str]:
    return [c for c in ("job_dir", "cell") if c in rows]


def _per_cell(rows: pd.DataFrame, corrector: str, column: str) -> pd.Series:
    """naive's ``column`` over the corrector's, one value per cell (job_dir, cell)."""
    keys = _cell_keys(rows)
    n = rows[rows.corrector == "naive"].set_index(keys)[column] if keys else rows[rows.corrector == "naive"][column]
    c = rows[rows.corrector == corrector].set_index(keys)[column] if keys else rows[rows.corrector == corrector][column]
    if not keys:
        n, c = n.reset_index(drop=True), c.reset_index(drop=True)
    return (n / c.where(c > 0)).fillna(np.inf)


def replication_interval(rows: pd.DataFrame, reps: Optional[pd.DataFrame], corrector: str,
                         agg: Callable = np.mean) -> Tuple[float, float]:
    """95% interval of ``agg`` over the cells of ``rows`` of the per-cell Monte-Carlo ratio naive /
    corrector, over the replications of the paper's procedure (static_replicates: cells of one MDP
    and Monte-Carlo seed share their resamples, so a replication's cells are a joint draw)."""
    if reps is None or reps.empty:
        return np.nan, np.nan
    keys = _cell_keys(rows)
    cells = rows[rows.corrector == corrector][keys].drop_duplicates()
    r = reps.merge(cells, on=keys)
    if r.empty:
        return np.nan, np.nan
    wide = r.pivot_table(index=keys + ["replication"], columns="corrector", values="bias_mc")
    if corrector not in wide or "naive" not in wide:
        return np.nan, np.nan
    ratio = (wide["naive"] / wide[corrector].where(wide[corrector] > 0)).fillna(np.inf)
    per_rep = ratio.groupby(level="replication").agg(agg)
    lo, hi = np.percentile(per_rep.to_numpy(), [2.5, 97.5])
    return float(lo), float(hi)


def _static_line(label: str, study: str, prow: str, metric: str, srows: pd.DataFrame, prows: pd.DataFrame,
                 reps: Optional[pd.DataFrame], corrector: str = "rac") -> Dict[str, Any]:
    agg = _AGG.get(metric, np.mean)
    paper = _paper(study, prow, metric)[0]
    out: Dict[str, Any] = dict(quantity=label, study=study, row=prow, metric=metric, paper=paper, corrector=corrector)
    s = srows[srows.corrector.isin(["naive", corrector])]
    if len(s):
        out["static_exact"] = float(agg(_per_cell(s, corrector, "bias_exact")))
        out["static_mc"] = float(agg(_per_cell(s, corrector, "bias_mc")))
        n, c = s[s.corrector == "naive"], s[s.corrector == corrector]
        out["static_exact_rom"] = _ratio(n.bias_exact.to_numpy(), c.bias_exact.to_numpy())
        out["static_mc_rom"] = _ratio(n.bias_mc.to_numpy(), c.bias_mc.to_numpy())
        out["rep_lo"], out["rep_hi"] = replication_interval(s, reps, corrector, agg)
    p = prows[prows.corrector.isin(["naive", corrector])] if len(prows) else prows
    if len(p):
        out["pipeline_exact"] = float(agg(_per_cell(p, corrector, "bias_exact")))
    lo, hi = out.get("rep_lo", np.nan), out.get("rep_hi", np.nan)
    out["paper_in_interval"] = (bool(lo <= paper <= hi) if np.isfinite(paper) and np.isfinite(lo) and np.isfinite(hi)
                                else pd.NA)
    reasons = _static_prose()["reasons"]
    out["reason"] = reasons.get(f"{study}/{prow}/{metric}", reasons.get(study, ""))
    return out


def static_comparison(df: pd.DataFrame, reps: Optional[pd.DataFrame] = None) -> pd.DataFrame:
    """One line per paper number that has a static reading in ``df`` (see STATIC_HEADERS)."""
    if "mode" not in df or not (df["mode"] == "static").any():
        return pd.DataFrame()
    st, pl = df[df["mode"] == "static"], df[df["mode"] == "pipeline"]
    lines: List[Dict[str, Any]] = []

    def part(rows, study):
        return rows[rows.study == study].dropna(axis=1, how="all")

    s, p = part(st, "table1_top"), part(pl, "table1_top")  # (its saturated pipeline row is drained)
    if "pipeline.drain" in pl:  # elsewhere the pipeline's plain runs (drain is an ablation there)
        pl = pl[~pl["pipeline.drain"].fillna(False).astype(bool)]
    if len(s):
        s = s.assign(K_paper=s["pipeline.delay_steps"].map(_k_label) + _fast_counted(s),
                     sat=s["corrector.row_normalize"].astype(bool))
        for (K, sat), cell in s.groupby(["K_paper", "sat"], sort=True):
            row = f"K={K}{' (sat)' if sat else ''}"
            pc = p
            if len(p):
                p_k = p["pipeline.delay_steps"].map(_k_label) + _fast_counted(p)
                pc = p[(p_k == K) & (p["corrector.row_normalize"].astype(bool) == sat)]
            lines.append(_static_line(f"Table 1 top, {row}: RAC reduction", "table1_top", row, "reduction",
                                      cell, pc, reps))
    s, p = part(st, "table4"), part(pl, "table4")
    for noise in sorted(set(s.get("learner.fast_noise_std", pd.Series([0.0])))) if len(s) else []:
        sn = s[s["learner.fast_noise_std"] == noise]
        pn = p[p["learner.fast_noise_std"] == noise] if len(p) else p
        for name in ("rac", "rac_no_age", "bare_additive"):
            lines.append(_static_line(f"Table 4, sigma_f={noise:g}: {name} reduction (mean over Delta 5/20/50)",
                                      "table4", name, "reduction", sn, pn, reps, name))
        for name in ("wait_for_slow", "retrace_a", "rac"):
            lines.append(_static_line(f"Table 1 bottom (K=2 cells of Table 4), sigma_f={noise:g}: {name} reduction",
                                      "table1_bottom", name, "reduction", sn, pn.iloc[:0], reps, name))
    s, p = part(st, "table3"), part(pl, "table3")
    if len(s):
        s = s.assign(K_paper=s["pipeline.delay_steps"].map(_k_label) + _fast_counted(s))
        if len(p):
            p = p.assign(K_paper=p["pipeline.delay_steps"].map(_k_label) + _fast_counted(p))
        names = {"random": "canonical"}
        for topo, cell in s.groupby("learner.topology", sort=False):
            label = names.get(topo, topo)
            pt = p[p["learner.topology"] == topo] if len(p) else p
            for K, metric in ((2, "red_K2"), (15, "red_K15")):
                c = cell[cell.K_paper == K]
                if len(c):
                    lines.append(_static_line(f"Table 3, {label}: reduction at K={K}", "table3", label, metric,
                                              c, pt[pt.K_paper == K] if len(pt) else pt, reps))
            ex = {K: float(np.mean(_per_cell(c, "rac", "bias_exact"))) for K, c in cell.groupby("K_paper")}
            mc = {K: float(np.mean(_per_cell(c, "rac", "bias_mc"))) for K, c in cell.groupby("K_paper")}
            lines.append(dict(quantity=f"Table 3, {label}: peak K (exact / MC)", study="table3", row=label,
                              metric="peak_K", paper=_paper("table3", label, "peak_K")[0],
                              static_exact=max(ex, key=ex.get), static_mc=max(mc, key=mc.get),
                              reason=_static_prose()["reasons"].get("table3/peak_K", "")))
    s, p = part(st, "table5"), part(pl, "table5")
    if len(s):
        tau = 200.0
        s = s[s["corrector.tau_age"] == tau]
        p = p[p["corrector.tau_age"] == tau] if len(p) else p
        for dist, cell in s.groupby("pipeline.delay_distribution", sort=False):
            conf = ast.literal_eval(dist) if isinstance(dist, str) else dist
            kind = conf["kind"] + (" (clipped)" if conf.get("cauchy_bounds") == "clip" else "")
            pc = p[p["pipeline.delay_distribution"] == dist] if len(p) else p
            for metric in ("red_mean", "red_min"):
                lines.append(_static_line(f"Table 5, {kind}: {metric} (tau_age=200)", "table5", conf["kind"], metric,
                                          cell, pc, reps))
    s, p = part(st, "table6"), part(pl, "table6")
    if len(s):
        for (S, A), cell in s.groupby(["learner.n_states", "learner.n_actions"], sort=False):
            label = f"{int(S)}x{int(A)}"
            pc = p[(p["learner.n_states"] == S) & (p["learner.n_actions"] == A)] if len(p) else p
            for metric in ("red_mean", "red_median", "red_min", "red_max"):
                lines.append(_static_line(f"Table 6, {label}: {metric}", "table6", label, metric, cell, pc, reps))
    return pd.DataFrame(lines)


def canonical_cells(df: pd.DataFrame) -> pd.DataFrame:
    """The canonical static cell (3x2, mdp_seed 1337, theta seed 7, K = 2, tau_age 1000, noise-free
    expectation) at Delta = 5/20/50: RAC's and -w_age's exact reductions (Table 4's cells)."""
    if "mode" not in df:
        return pd.DataFrame()
    s = df[(df["mode"] == "static") & (df.study == "table4")]
    if s.empty or "learner.mdp_seed" not in s:
        return pd.DataFrame()
    s = s[s["learner.mdp_seed"] == 1337]
    if "corrector.tau_age" in s:  # a grid over tau_age: its default's cells (NaN: not a grid axis)
        s = s[s["corrector.tau_age"].isna() | (s["corrector.tau_age"] == 1000.0)]
    out = []
    for steps, cell in s.groupby("pipeline.delay_steps", sort=False):
        first = cell.drop_duplicates("corrector")
        row = {"Delta": ast.literal_eval(steps)[0] if isinstance(steps, str) else list(steps)[0]}
        for name in ("rac", "rac_no_age", "retrace_a"):
            r = first[first.corrector == name]
            if len(r):
                row[f"{name} exact reduction"] = float(r.reduction_exact.iloc[0])
                row[f"{name} exact bias"] = float(r.bias_exact.iloc[0])
        row["naive exact bias"] = float(first[first.corrector == "naive"].bias_exact.iloc[0])
        out.append(row)
    return pd.DataFrame(out).sort_values("Delta") if out else pd.DataFrame()


def static_report(df: pd.DataFrame, reps: Optional[pd.DataFrame] = None) -> str:
    """Markdown: the four-column comparison of every paper number with a static reading."""
    table = static_comparison(df, reps)
    if table.empty:
        return ""
    prose = _static_prose()
    lines = [f"## {prose['heading']}", "", prose["intro"], "",
             "| " + " | ".join(STATIC_HEADERS) + " |", "|" + "---|" * len(STATIC_HEADERS)]
    for _, r in table.iterrows():
        inside = r.get("paper_in_interval", pd.NA)
        inside = "-" if pd.isna(inside) else ("yes" if inside else "no")
        cells = [r.quantity, r.paper, r.get("static_exact", np.nan), r.get("static_exact_rom", np.nan),
                 r.get("static_mc", np.nan), _interval(r.get("rep_lo", np.nan), r.get("rep_hi", np.nan)), inside,
                 r.get("static_mc_rom", np.nan), r.get("pipeline_exact", np.nan), r.get("reason", "")]
        lines.append("| " + " | ".join("-" if isinstance(c, float) and np.isnan(c) else fmt(c) for c in cells) + " |")
    canon = canonical_cells(df)
    if len(canon):
        lines += ["", f"### {prose['canonical']['title']}", "", prose["canonical"]["intro"], "",
                  "| " + " | ".join(canon.columns) + " | paper (MC, mean over Delta) |",
                  "|" + "---|" * (len(canon.columns) + 1)]
        paper = _paper("table4", "rac", "reduction")[0]
        for _, r in canon.iterrows():
            lines.append("| " + " | ".join(fmt(v) for v in r.to_numpy()) + f" | {fmt(paper)} |")
        lines += ["", prose["canonical"]["reading"]]
    lines += ["", prose["not_reproducible"]]
    return "\n".join(lines) + "\n"
