"""The LM study's table says what a `slow grad missing` share outside [0, 1] means (issue 20,
point 5): the correctors that have one are named, in the run's lines and in summary.md."""

from __future__ import annotations

import numpy as np
import pandas as pd

from racsim.analyses.result import RunResult
from racsim.report import lm as LM


def _results(rng, n):
    return pd.DataFrame({
        "scenario": "s", "corrector": [f"c{i}" for i in range(n)], "policy": "bandit", "K": 2, "steps": 10,
        "prompts": 4, "group_size": 8, "seeds": 4, "seed": 0, "proxy_correlation": -0.5, "true_final": 0.1,
        "true_final_ci": 0.01, "seconds_per_step": 0.01,
        "grad_missing": rng.uniform(-0.6, 1.6, n), "grad_missing_ci": rng.uniform(0, 0.3, n)})


def test_the_note_names_exactly_the_shares_outside_0_1():
    rng = np.random.default_rng(0)
    seen = {"note": 0, "none": 0}
    for _ in range(200):
        r = _results(rng, int(rng.integers(1, 7)))
        out = r[(r.grad_missing < 0) | (r.grad_missing > 1)]
        note = LM.share_note(r)
        if not len(out):
            assert note == ""
            seen["none"] += 1
            continue
        seen["note"] += 1
        named = note.split("(", 1)[1].split("):", 1)[0].split(", ")
        assert named == [f"{c} {m:.3f} +- {h:.3f}" for c, m, h in zip(out.corrector, out.grad_missing,
                                                                     out.grad_missing_ci)]
        assert "below 0 the update carries more of the slow signal's gradient" in note
        text = LM.summary_markdown(RunResult(results=r, timings={"training_s": 1.0}), ["results.csv"])
        assert note[0].upper() + note[1:] + "." in text
    assert min(seen.values()) >= 10, seen
    assert LM.share_note(pd.DataFrame({"corrector": ["naive"]})) == ""


def test_every_lm_run_gives_a_verdict_per_pair_that_its_interval_backs():
    """An LM run's answer comes first: rac against each other corrector, one line each, and each
    word follows from the paired interval (better / worse when it excludes 0, the same when it is
    narrower than the effect size or identical, unresolved otherwise, with the seeds the rule asks)."""
    import racsim
    from racsim.report.lm import verdict_lines

    t = racsim.run(overrides=["learner=lm", "learner.lm.policy=bandit", "pipeline.steps=12", "output.plots=false"])
    paired, rule = t.raw.extra["lm_paired"], t.raw.extra["lm_seed_rule"]
    lines = verdict_lines(paired, rule)
    first = paired[paired.metric == "true_at_naive_clock"]
    assert len(lines) == len(first) == len(t.results.corrector.unique()) - 1
    for line, r in zip(lines, first.itertuples()):
        assert line.startswith(f"rac vs {r.pair.split(' - ')[1]}: ")
        if r.ci_lo > 0 or r.ci_hi < 0:
            assert (": better (" in line) == (r.diff > 0) and (": worse (" in line) == (r.diff < 0)
        elif r.sd == 0 and r.diff == 0:
            assert ": identical at every one of" in line
        elif 2 * r.ci_half < 0.05:
            assert ": the same within " in line
        else:
            n = int(rule.set_index("pair").loc[r.pair, "n_pair"])
            assert f": unresolved at {r.seeds} seeds" in line and f"the seed rule asks for {n}" in line
