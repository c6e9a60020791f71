"""The results as a fixed-width terminal table (also used in summary.md)."""

from __future__ import annotations

import pandas as pd

from racsim.io import fmt

# Columns of the terminal table, in order, with their headers.
TABLE = [
    ("corrector", "corrector"),
    ("policy", "policy"),  # learner=lm: transformer, or its NumPy stand-in (bandit)
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
    # learner=lm (racsim/analyses/lm_study.py); a "+-" column follows each with a _ci
    ("true_at_naive_clock", "true @ naive clock"),
    ("true_final", "true final"),
    ("proxy_final", "proxy final"),
    ("ratio_mean", "mean ratio (late)"),
    ("grad_missing", "slow grad missing"),
]


def format_table(results: pd.DataFrame) -> str:
    """The results as a fixed-width text table (also used in summary.md)."""
    df = results.copy()
    if "corrector" not in df:  # an analysis (probe, TV bound): every column
        return df.drop(columns=["scenario"], errors="ignore").map(fmt).to_string(index=False)
    if "reduction_ci_lo" in df:
        df["reduction_ci"] = [f"[{fmt(a)}, {fmt(b)}]" for a, b in zip(df.reduction_ci_lo, df.reduction_ci_hi)]
    cols = [(c, h) for c, h in TABLE if c in df]
    out = pd.DataFrame({h: df[c].map(fmt) for c, h in cols})
    for c, h in cols:
        if f"{c}_ci" in df:
            out.insert(list(out.columns).index(h) + 1, f"{h} +-", df[f"{c}_ci"].map(fmt))
    return out.to_string(index=False)
