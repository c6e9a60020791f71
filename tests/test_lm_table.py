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
