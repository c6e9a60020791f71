"""The plain answers a run prints (issue 49, point 10): which corrector to use, why and at what cost
(job 1's line after its table); a capacity plan's margin (what the next count buys, how busy the pool
runs) and its counts without a steady state folded into ranges; a what-if's output folder named after
its overrides. Each checked against a slow loop over random inputs that reach every branch."""

from __future__ import annotations

import numpy as np
import pandas as pd

from racsim.io import fmt
from racsim.report.tables import FREE_CLOCK, answer_line

NAMES = ["naive", "wait_for_slow", "retrace_a", "rac", "rac_no_age", "sync_oracle"]


def _results(rng, names):
    n = len(names)
    bias = rng.uniform(1e-4, 0.05, n)
    clock = np.where(rng.random(n) < 0.7, 1.0, rng.uniform(1.5, 6.0, n))
    out = pd.DataFrame({"corrector": names, "mode": "pipeline", "bias_exact": bias, "wallclock_ratio": clock,
                        "J_at_naive_clock": rng.uniform(0.2, 0.35, n)})
    naive = out.bias_exact[out.corrector == "naive"]
    out["reduction_exact"] = (naive.iloc[0] if len(naive) else 0.05) / out.bias_exact
    out["reduction_ci_lo"], out["reduction_ci_hi"] = 0.9 * out.reduction_exact, 1.1 * out.reduction_exact
    return out


def test_the_answer_names_the_least_biased_corrector_that_costs_no_clock():
    rng = np.random.default_rng(49)
    seen = {"a corrector": 0, "naive": 0, "none free": 0, "no wait": 0, "no training": 0}
    for _ in range(300):
        names = [n for n in NAMES if n == "naive" or rng.random() < 0.7]
        r = _results(rng, names)
        if rng.random() < 0.2:
            r = r.drop(columns="J_at_naive_clock")
        said = answer_line(r)
        best, low = None, np.inf  # the oracle: a plain loop over the rows
        for row in r.itertuples():
            if row.corrector != "sync_oracle" and row.wallclock_ratio <= FREE_CLOCK and row.bias_exact < low:
                best, low = row, row.bias_exact
        if best is None:
            assert said == ""
            seen["none free"] += 1
            continue
        if best.corrector == "naive":
            assert said.startswith("use naive: no corrector that costs no wall-clock has less bias")
            seen["naive"] += 1
        else:
            assert said.startswith(f"use {best.corrector}: the least-biased corrector at naive's wall-clock, "
                                   f"{fmt(best.reduction_exact)}x [{fmt(best.reduction_ci_lo)}, "
                                   f"{fmt(best.reduction_ci_hi)}] less bias than naive"), said
            seen["a corrector"] += 1
        wait = r[r.corrector == "wait_for_slow"]
        if not len(wait):
            assert "wait_for_slow" not in said
            seen["no wait"] += 1
            continue
        w = wait.iloc[0]
        assert f"wait_for_slow removes {fmt(w.reduction_exact)}x but takes {fmt(w.wallclock_ratio)}x" in said
        trains = "J_at_naive_clock" in r and best.corrector != "wait_for_slow"
        assert ("trains to J = " in said) == trains, said
        seen["no training"] += "J_at_naive_clock" not in r
    assert min(seen.values()) >= 5, seen
    assert answer_line(_results(rng, NAMES).assign(cell=0)) == ""  # a grid: per cell, in its table


def test_the_run_prints_its_answer_after_its_table(tmp_path):
    import racsim
    from racsim.app.job import run_text
    from racsim.config.defaults import compose_config

    over = ["learner.trials=40", "learner.train.enabled=false", "output.plots=false"]
    t = racsim.run(overrides=over)
    text = run_text(compose_config(*over), t.raw)
    lines = text.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("racsim: answer: use "))
    assert lines[at - 1].startswith("(to fit") or lines[at - 1].split()[0] in set(t.results.corrector)
    assert " ".join(text[text.index("racsim: answer: "):].split()).startswith(
        "racsim: answer: " + " ".join(answer_line(t.results).split()))
