"""The LM study's table says what a `slow grad missing` share outside [0, 1] means (issue 20,
point 5): the correctors that have one are named, in the run's lines and in summary.md."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from racsim.analyses.result import RunResult
from racsim.report import lm as LM


def _results(rng, n):
    return pd.DataFrame({
        "scenario": "s", "corrector": [f"c{i}" for i in range(n)], "policy": "bandit", "K": 2, "steps": 10,
        "prompts": 4, "group_size": 8, "seeds": 4, "seed": 0, "proxy_correlation": -0.5, "true_final": 0.1,
        "true_final_ci": 0.01, "seconds_per_step": 0.01,
        "grad_missing": rng.uniform(-0.6, 1.6, n), "grad_missing_ci": rng.uniform(0, 0.3, n)})


def test_the_note_names_exactly_the_shares_outside_0_1_beyond_their_noise():
    # issue 49: the note quoted "rac 2.283 +- 2.406", a figure whose interval reaches into [0, 1]
    rng = np.random.default_rng(0)
    seen = {"note": 0, "none": 0, "within noise": 0}
    for _ in range(200):
        r = _results(rng, int(rng.integers(1, 7)))
        out = [row for row in r.itertuples() if row.grad_missing + row.grad_missing_ci < 0
               or row.grad_missing - row.grad_missing_ci > 1]
        note = LM.share_note(r)
        if not out:
            assert note == ""
            noisy = ((r.grad_missing < 0) | (r.grad_missing > 1)).any()
            seen["within noise" if noisy else "none"] += 1
            continue
        seen["note"] += 1
        named = note.split("(", 1)[1].split("; 95% intervals):", 1)[0].split("], ")
        assert [n.rstrip("]") + "]" for n in named] == [
            f"{row.corrector} {row.grad_missing:.3f} [{row.grad_missing - row.grad_missing_ci:.3f}, "
            f"{row.grad_missing + row.grad_missing_ci:.3f}]" for row in out]
        assert "+-" not in note
        assert "below 0 the update carries more of the slow signal's gradient" in note
        text = LM.summary_markdown(RunResult(results=r, timings={"training_s": 1.0}), ["results.csv"])
        assert note[0].upper() + note[1:] + "." in text
    assert min(seen.values()) >= 10, seen
    assert LM.share_note(pd.DataFrame({"corrector": ["naive"]})) == ""


def _said(line, r, bound):
    """The verdict ``line`` says of a pair follows from its row ``r`` of the paired table (at the last look)."""
    if r.ci_lo > 0 or r.ci_hi < 0:
        return (": better" in line) == (r.diff > 0) and (": worse" in line) == (r.diff < 0)
    if r.sd == 0 and r.diff == 0:
        return ": identical at every one of" in line
    if r.ci_hi - r.ci_lo < bound:
        return f": the same within {max(abs(r.ci_lo), abs(r.ci_hi)):.3g}" in line
    said = f": undecided after {r.seeds} seeds: [{r.ci_lo:+.3f}, {r.ci_hi:+.3f}]"
    return said in line and "seeds would decide" in line


@pytest.mark.parametrize("extra,ended", [(["learner.lm.max_seeds=8", "pipeline.steps=12"], "max_seeds"),
                                         (["learner.lm.decide=[]", "learner.lm.seeds=3", "pipeline.steps=12"], "fixed"),
                                         (["learner.lm.bound=10", "pipeline.steps=6"], "decided")])
def test_every_lm_run_gives_a_verdict_per_pair_that_its_interval_backs(extra, ended):
    """An LM run's answer comes first: the pair the seed rule waited for (rac vs naive), then how the rule
    ended (at how many seeds, why), then every other pair at the same seeds; each word follows from the
    pair's interval (better / worse when it excludes 0, the same when it is narrower than the bound or
    identical, undecided otherwise, with a projection of the seeds that would decide it)."""
    import racsim
    from racsim.report.lm import verdict_lines

    t = racsim.run(overrides=["learner=lm", "learner.lm.policy=bandit", "output.plots=false", *extra])
    paired, rule = t.raw.extra["lm_paired"], t.raw.extra["lm_seed_rule"]
    lines = verdict_lines(paired, rule)
    first = paired[paired.metric == "true_at_naive_clock"]
    seeds = int(t.results.seeds.iloc[0])
    assert (first.seeds == seeds).all() and rule.ended.iloc[-1] == ended and rule.seeds.iloc[-1] == seeds
    assert len(lines) == len(first) + 1 == len(t.results.corrector.unique())
    waited = 0 if ended == "fixed" else 1
    assert lines[waited].startswith("seed " + ("count fixed at learner.lm.seeds=3" if ended == "fixed" else "rule ("))
    pairs = [ln for i, ln in enumerate(lines) if i != waited]
    assert pairs[0].startswith("rac vs naive: ") and "true reward at naive's clock" in pairs[0]
    bound = float(rule.bound.iloc[0])
    for line, r in zip(pairs, first.itertuples()):
        assert line.startswith(f"rac vs {r.pair.split(' - ')[1]}: ") and _said(line, r, bound), line
    assert (f"decided at {seeds} seeds" in pairs[0]) == (ended == "decided")
    said = {"max_seeds": "rac vs naive undecided at learner.lm.max_seeds=8", "fixed": "(learner.lm.decide=[])",
            "decided": f"stopped at {seeds} seeds, rac vs naive decided"}
    assert said[ended] in lines[waited]
    if ended != "fixed":  # the looks: the plan's doubling counts, each at the split level
        assert list(dict.fromkeys(rule.seeds)) == [8, 16, 32][:rule.look.max() + 1]
        assert rule.level.iloc[0] == pytest.approx(1 - 0.05 / len(str(rule.planned.iloc[0]).split(",")))


def test_the_budget_line_says_the_budget_ended_the_rule():
    from racsim.report.lm import verdict_lines

    rule = pd.DataFrame({"pair": ["rac - naive", "rac - other"] * 2, "seeds": [8, 8, 16, 16], "level": 0.9833,
                         "diff": 0.1, "ci_lo": -0.1, "ci_hi": 0.3, "sd": 0.4, "answer": "open",
                         "look": [0, 0, 1, 1], "waited": [True, False] * 2, "bound": 0.05, "max_seeds": 32,
                         "budget_s": 150.0, "planned": "8,16,32", "ended": "budget", "next_would_end_s": 212.4})
    paired = rule[rule.look == 1].drop(columns="look").assign(metric="true_at_naive_clock")
    lines = verdict_lines(paired, rule)
    assert lines[0].startswith("rac vs naive: undecided after 16 seeds: [-0.100, +0.300]")
    assert ("the time budget ended it at 16 seeds: the next stage, to 32 seeds, would have ended at about 212 s of "
            "training, past learner.lm.budget_s=150 s; rac vs naive undecided") in lines[1]
    assert lines[2].startswith("rac vs other: undecided after 16 seeds")


def test_a_half_width_is_never_shown_without_its_value():
    """Issue 49: the LM run's table fitted to 120 columns left out `slow grad missing` and `slow missing (IS)` but
    kept their `+-` columns. At every width, each `+-` column shown follows its value's column."""
    from racsim.report.tables import format_table

    rng = np.random.default_rng(1)
    r = _results(rng, 5).assign(true_at_naive_clock=0.2, true_at_naive_clock_ci=0.1, proxy_final=0.3,
                                proxy_final_ci=0.05, missing_share=0.1, missing_share_ci=0.02, slack_eta=0.5,
                                wallclock_ratio=1.0)
    qualified = ("slow grad missing", "slow missing (IS)", "proxy final", "true final")  # each with a +- column
    seen = set()
    for width in range(40, 320, 8):
        header = format_table(r, width=width).splitlines()[0]
        left = [c for c in qualified if c not in header.replace(f"{c} +-", "")]
        seen.add(len(left))
        assert not any(f"{c} +-" in header for c in left), (width, header)
    assert {0, 4} <= seen, seen
