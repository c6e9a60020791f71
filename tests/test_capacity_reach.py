"""A capacity target that more capacity cannot meet (issue 43, point 3): rac's bias vs naive's is flat in
the count, so ``capacity.max_bias_vs_naive=0.0001`` is met by no count. The search says so as soon as two
counts far apart show it (racsim.analyses.capacity.reach), names the key and what the counts meet, stops
(no count above the list, no sensitivity variant), and the command exits 3 (EXIT_INFEASIBLE); racsim.run
returns status "infeasible". A target that more capacity does meet, however far above the list, is searched
for as before, and a feasible run's answer is the one it had."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import racsim
from helpers import main_in_process, messages
from racsim.analyses.capacity import reach
from racsim.analyses.capacity.search import counts_above
from racsim.report.capacity import recommendation_text
from test_capacity import SMALL_JUDGE

JUDGE = "capacity/judge_rm_h100"
LISTED = ["capacity.counts=[4,6,12]", "capacity.benchmark=false"]  # 4 overloaded, the load bound 5 added
IMPOSSIBLE = "capacity.max_bias_vs_naive=0.0001"  # rac reads about 0.0165 x naive's at every stable count


def _rows(fig, points, top_load=0.3):
    """Curve rows of rac (and naive) per count from ``points``: count -> (load, estimate, lo, hi) of ``fig``."""
    return {n: [{"corrector": "rac", "status": "ok", "load": load, fig: v, f"{fig}_lo": lo, f"{fig}_hi": hi},
                {"corrector": "naive", "status": "ok", "load": load}]
            for n, (load, v, lo, hi) in points.items()}


def test_a_flat_figure_above_its_target_is_out_of_reach_a_falling_one_is_not():
    """The rule on its own (no simulation): flat and surely failing at two counts far apart: out of reach,
    with what the counts meet; the same figure at two counts close in load, one interval reaching under the
    target, or a figure falling fast enough to reach it by the top: searched on."""
    flat = _rows("bias_vs_naive", {5: (0.89, 0.0163, 0.0149, 0.0177), 16: (0.28, 0.0169, 0.0167, 0.0171)})
    [u] = reach.out_of_reach(flat, "rac", {"max_bias_vs_naive": 1e-4}, top=32)
    assert (u.key, u.fewer, u.more, u.flat, u.met_from) == ("max_bias_vs_naive", 5, 16, True, 0.0171)
    assert reach.out_of_reach(flat, "rac", {"max_bias_vs_naive": 0.0168}, top=32) == []  # lo at 16 under it
    assert reach.out_of_reach(flat, "rac", {"max_bias_vs_naive": None, "max_bias": 1e-9}, top=32) == []  # no figure
    near = _rows("bias_vs_naive", {5: (0.89, 0.0163, 0.0149, 0.0177), 6: (0.74, 0.0169, 0.0167, 0.0171)})
    assert reach.out_of_reach(near, "rac", {"max_bias_vs_naive": 1e-4}, top=32) == []  # not far apart
    # a queue figure: the dropped share falls from 12% to 2% between 5 and 10 GPUs; 1% is reachable above
    falling = _rows("dropped_frac", {5: (0.89, 0.12, 0.09, 0.22), 10: (0.44, 0.03, 0.02, 0.04)})
    assert reach.out_of_reach(falling, "rac", {"max_dropped": 0.01}, top=20) == []
    # falling, but at its steepest not before 92 GPUs, past the top of 20: out of reach there, not flat
    slow = _rows("sojourn_p95_s", {5: (0.89, 10.0, 9.9, 10.1), 10: (0.44, 9.6, 9.5, 9.7)})
    [u] = reach.out_of_reach(slow, "rac", {"max_sojourn_p95_s": 1.0}, top=20)
    assert not u.flat and u.slope == pytest.approx(0.12) and u.needs == 10 + 71


def test_an_impossible_bias_target_stops_the_search_and_names_its_key():
    t = racsim.run(JUDGE, overrides=[*SMALL_JUDGE, *LISTED, IMPOSSIBLE])  # sensitivity on, as the scenario has it
    res = t.raw
    assert t.status == res.status == "infeasible" and t.recommended is None
    assert [u.key for u in res.unreachable] == ["max_bias_vs_naive"]
    evaluated = sorted(int(n) for n in t.curve["count"].unique())
    assert evaluated == [4, 5, 6, 12] and res.top == 24  # the list and its load bound, nothing above
    rows = {n: t.curve[t.curve["count"] == n].to_dict("records") for n in evaluated}
    assert counts_above(rows, "rac", res.targets, 1, res.top) == list(range(13, 25))  # what the old search tried
    assert t.sensitivity is None and "sensitivity_s" not in res.timings and res.replicated_steps == 0
    text = " ".join(recommendation_text(res).split())
    assert text.startswith("Infeasible: capacity.max_bias_vs_naive = 0.0001 cannot be met by more GPUs: rac's bias "
                           "x naive's is ")
    assert "it does not fall with the count" in text and "Relax capacity.max_bias_vs_naive (the counts evaluated " \
                                                         "meet it from 0.01" in text
    assert "stopped at 12 GPUs" in text and "capacity.sensitivity's variants were not run" in text


def test_the_command_exits_3_on_an_impossible_target(tmp_path, monkeypatch, capsys):
    """Through racsim.app.cli.main: the curve and the answer printed, every file written (done.json too: the run is
    complete), no sensitivity variant run, exit status 3."""
    from racsim.app.cli import EXIT_INFEASIBLE, EXIT_USAGE

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    code, out, err = main_in_process(monkeypatch, capsys, [f"scenario={JUDGE}", *SMALL_JUDGE, *LISTED, IMPOSSIBLE,
                                                           "output.plots=false", f"hydra.run.dir={run}"])
    assert code == EXIT_INFEASIBLE == 3 and EXIT_INFEASIBLE not in (0, 1, EXIT_USAGE, 130, 141, 143), err
    said = messages(out)
    assert said[0].startswith(f"racsim: judge_rm_h100: capacity of judge (GPUs), 4 counts in ")
    assert any(m.startswith("Infeasible: capacity.max_bias_vs_naive = 0.0001 cannot be met by more GPUs") for m in said)
    assert said[-1] == f"racsim: results in {run}" and "Traceback" not in err
    assert "sensitivity" not in err and "None" not in out + err  # no variant's progress line
    assert (run / "done.json").is_file() and not (run / "sensitivity.csv").exists()
    assert json.loads((run / "done.json").read_text())  # the marker of a complete run
    assert "cannot be met by more GPUs" in (run / "summary.md").read_text()


def test_a_reachable_queue_target_is_searched_for_above_the_list(monkeypatch):
    """Results dropped past 2 steps: 12% at 5 GPUs, 4% at 6, none from 10; 1% is met above the list [4, 5, 6],
    so the search goes on to 8 as it did, even with any two stable counts taken as far apart (reach.FAR), and
    its answer is the one it has with the rule turned off."""
    over = [*SMALL_JUDGE, "capacity.counts=[4,5,6]", "capacity.benchmark=false", "capacity.sensitivity.enabled=false",
            "pipeline.channels.judge.max_delay=2"]
    monkeypatch.setattr(reach, "FAR", 1.0)
    t = racsim.run(JUDGE, overrides=over)
    rac = t.curve[t.curve.corrector == "rac"].set_index("count")
    assert rac.loc[6, "dropped_frac_lo"] > 0.01 and rac.loc[6, "fails"] == "max_dropped"  # fails surely at 6
    assert t.status == "recommended" and t.recommended == 8 and t.raw.searched == [7, 8]
    import racsim.analyses.capacity.run as run_module

    monkeypatch.setattr(run_module, "out_of_reach", lambda *a, **k: [])
    without = racsim.run(JUDGE, overrides=over)
    pd.testing.assert_frame_equal(t.curve, without.curve, check_exact=True)
    assert without.recommended == 8


def test_a_feasible_plan_is_unchanged(monkeypatch):
    """The judge's reachable targets: the same curve and answer with the rule as without it; the status says
    recommended."""
    over = [*SMALL_JUDGE, *LISTED, "capacity.sensitivity.enabled=false"]
    t = racsim.run(JUDGE, overrides=over)
    assert t.status == "recommended" and t.recommended == 5 and t.raw.unreachable == []
    import racsim.analyses.capacity.run as run_module

    monkeypatch.setattr(run_module, "out_of_reach", lambda *a, **k: [])
    without = racsim.run(JUDGE, overrides=over)
    pd.testing.assert_frame_equal(t.curve, without.curve, check_exact=True)
    assert recommendation_text(t.raw) == recommendation_text(without.raw)


def test_a_variants_answer_never_reads_none():
    """The sensitivity table's progress line for a variant no count satisfies (it read 'None GPUs')."""
    from racsim.analyses.capacity import CapacityResult
    from racsim.analyses.sensitivity import answer_words

    res = CapacityResult(pd.DataFrame(), "judge", "GPUs", "", None, pd.DataFrame(), {"corrector": "rac"}, top=32)
    assert answer_words(None, res) == "no count up to 32 GPUs meets the targets"
    assert answer_words(6, res) == "6 GPUs"


def test_an_infeasible_autoscaled_plan_still_times_the_engine():
    """Issue 49: an infeasible target skips the autoscaled pool's what-if run, and the speed line read that
    run (AttributeError: 'NoneType' object has no attribute 'requests'); it now times the fixed pools' runs."""
    t = racsim.run("capacity/judge_rm_autoscale", overrides=[
        *SMALL_JUDGE, "capacity.benchmark=true", "capacity.workers=1", "capacity.sensitivity.enabled=false",
        "capacity.counts=[2,5,8]", IMPOSSIBLE])
    assert t.status == "infeasible" and t.raw.autoscale is None
    assert t.raw.speed["requests"] > 0 and t.raw.speed["lanes_requests_per_s"] > 0
