"""Capacity targets a serving team names (issue 28, point 4) and a capacity search's memory and
progress (point 9): every target met by the upper end of its interval, checked against a slow
loop oracle; the binding target named; bad values refused in one line; the memory estimate
covering the longest run a search may make, held to a measured peak; one progress note per
count and per doubling of a run."""

from __future__ import annotations

import math
import re
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from helpers import Recorder
from racsim.analyses import capacity as C
from racsim.analyses.capacity import TARGET_FIGURES, fewest, run_capacity
from racsim.analyses.capacity import memory as CM
from racsim.analyses.capacity import pool as CP
from racsim.analyses.capacity import result as CResult
from racsim.analyses.capacity import rows as CRows
from racsim.analyses.capacity import run as CR
from racsim.analyses.capacity.length import settle
from racsim.analyses.capacity.load import load_basis
from racsim.analyses.capacity.result import binding
from racsim.analyses.capacity.targets import failed, fails_text, feasible
from racsim.app.cli import error_line
from racsim.config import validate as V
from racsim.config.defaults import compose_config
from racsim.config.schema import CAPACITY_TARGETS
from racsim.config.spec import replace_at, scenario
from racsim.errors import ConfigError
from racsim.pipeline import steady
from racsim.report.capacity import edge_text, recommendation_text

# the oracle's own table: target key, the column of its figure's interval's upper end
ORACLE_COLUMNS = [("max_bias", "bias_exact_hi"), ("max_bias_vs_naive", "bias_vs_naive_hi"),
                  ("max_step_s", "step_s_hi"), ("max_dropped", "dropped_frac_hi"),
                  ("max_sojourn_p95_s", "sojourn_p95_s_hi"), ("max_sojourn_p99_s", "sojourn_p99_s_hi"),
                  ("max_delay_p95_steps", "delay_p95_steps_hi"),
                  ("max_background_sojourn_p95_s", "background_sojourn_p95_s_hi")]
STATUSES = ["ok", "ok", "ok", "overloaded: load 1.2 >= capacity.max_load 0.95",
            "not stationary at 640 steps (capacity.max_steps 640)"]


def oracle_fails(row: dict, targets: dict) -> list:
    """What a row fails, written out one target at a time."""
    if row["status"].startswith("overloaded"):
        return ["load"]
    if row["status"].startswith("not stationary"):
        return ["stationarity"]
    out = []
    for key, col in ORACLE_COLUMNS:
        limit = targets[key]
        if limit is None:
            continue
        hi = row[col]
        if math.isnan(hi) or hi > limit:
            out.append(key)
    return out


def test_every_target_has_an_interval_column():
    assert tuple(TARGET_FIGURES) == CAPACITY_TARGETS
    assert [(k, f"{v}_hi") for k, v in TARGET_FIGURES.items()] == ORACLE_COLUMNS


def test_feasible_matches_a_loop_oracle_on_random_rows():
    rng = np.random.default_rng(28)
    seen = set()
    for _ in range(3000):
        targets = {k: (None if rng.random() < 0.4 else float(rng.choice([0.0, 0.01, 0.5, 1.0, 12.0])))
                   for k, _ in ORACLE_COLUMNS}
        row = {"status": str(rng.choice(STATUSES))}
        for key, col in ORACLE_COLUMNS:
            t = targets[key] if targets[key] is not None else 1.0
            u = rng.random()
            # NaN, exactly on the target, a little under, a little over
            row[col] = np.nan if u < 0.1 else t if u < 0.3 else t * (0.9 if u < 0.65 else 1.1) + (u >= 0.65) * 1e-3
            row[col[:-3]] = t * 2 + 1  # the point estimate, always past the target: only the upper end counts
        want = oracle_fails(row, targets)
        assert failed(row, targets) == want, (row, targets)
        assert feasible(row, targets) == (not want)
        seen.update(want if want else ["none"])
        if row["status"] == "ok":
            seen.update(f"nan {k}" for k, c in ORACLE_COLUMNS if targets[k] is not None and math.isnan(row[c]))
            seen.update(f"tie {k}" for k, c in ORACLE_COLUMNS if targets[k] is not None and row[c] == targets[k])
    assert seen >= {"none", "load", "stationarity", *CAPACITY_TARGETS, *(f"nan {k}" for k in CAPACITY_TARGETS),
                    *(f"tie {k}" for k in CAPACITY_TARGETS)}


def test_the_binding_target_is_what_the_next_fewer_count_fails():
    targets = {k: None for k in CAPACITY_TARGETS} | {"max_dropped": 0.01, "max_sojourn_p95_s": 60.0}
    base = {"corrector": "rac", "status": "ok", **{f"{c}_hi": 0.0 for c in TARGET_FIGURES.values()}}
    rows = [{**base, "count": 3, "status": "overloaded: load 1.1 >= capacity.max_load 0.95"},
            {**base, "count": 4, "status": "not stationary at 640 steps"},
            {**base, "count": 5, "dropped_frac_hi": 0.03, "sojourn_p95_s_hi": 130.0},
            {**base, "count": 6, "dropped_frac_hi": 0.012},
            {**base, "count": 7, "dropped_frac_hi": 0.004},
            {**base, "count": 8}]
    curve = pd.DataFrame(rows)
    curve["fails"] = [fails_text(r, targets) for _, r in curve.iterrows()]
    curve["feasible"] = curve.fails == ""
    assert fewest(curve, "rac") == 7
    assert binding(curve, "rac", 7) == ["max_dropped"]
    assert binding(curve, "rac", 6) == ["max_dropped", "max_sojourn_p95_s"]
    assert binding(curve, "rac", 5) == ["stationarity"] and binding(curve, "rac", 4) == ["load"]
    assert binding(curve, "rac", 3) == [] and binding(curve, "rac", None) == []


def test_what_binds_is_what_the_next_fewer_count_fails_for_sure():
    """With the targets: of the targets the next fewer count fails, those whose interval lies wholly above
    them (a dropped share decided failing), not a bias that fails by its upper end alone (left straddling
    once the share decided the count); where it fails by upper ends alone, all of them."""
    targets = {k: None for k in CAPACITY_TARGETS} | {"max_dropped": 0.01, "max_bias_vs_naive": 0.1}
    base = {"corrector": "rac", "status": "ok",
            **{f"{c}_{e}": 0.0 for c in TARGET_FIGURES.values() for e in ("lo", "hi")}}
    sure = {"dropped_frac_lo": 0.02, "dropped_frac_hi": 0.08, "bias_vs_naive_lo": 0.02, "bias_vs_naive_hi": 0.12}
    edge = {"dropped_frac_lo": 0.004, "dropped_frac_hi": 0.02, "bias_vs_naive_lo": 0.02, "bias_vs_naive_hi": 0.12}
    for below, want in ((sure, ["max_dropped"]), (edge, ["max_bias_vs_naive", "max_dropped"])):
        curve = pd.DataFrame([{**base, "count": 6, **below}, {**base, "count": 7}])
        curve["fails"] = [fails_text(r, targets) for _, r in curve.iterrows()]
        curve["feasible"] = curve.fails == ""
        assert binding(curve, "rac", 7) == ["max_bias_vs_naive", "max_dropped"]  # the row's fails, as they are
        assert binding(curve, "rac", 7, targets) == want


def test_a_count_that_fails_by_its_interval_alone_is_on_the_edge():
    """The edge is said exactly when every failed target's estimate meets it and an upper end does not."""
    targets = {k: None for k in CAPACITY_TARGETS} | {"max_dropped": 0.01, "max_sojourn_p95_s": 60.0}
    res = SimpleNamespace(targets=targets, unit="GPUs", binding=["max_dropped"])
    row = {"count": 7, "status": "ok", "dropped_frac": 0.005, "dropped_frac_lo": 0.001, "dropped_frac_hi": 0.025,
           "sojourn_p95_s": 30.0, "sojourn_p95_s_lo": 20.0, "sojourn_p95_s_hi": 40.0}
    said = edge_text(pd.Series(row), res)
    assert said.startswith(" On the edge: 7 GPUs") and "dropped 0.5% [0.1%, 2.5%] against 1%" in said
    assert "sojourn" not in said  # it meets its p95 target: not named
    assert edge_text(pd.Series({**row, "dropped_frac": 0.02}), res) == ""  # the estimate fails too: no edge
    assert edge_text(pd.Series({**row, "dropped_frac": np.nan}), res) == ""  # not measured: no edge
    assert edge_text(pd.Series({**row, "status": "not stationary at 640 steps"}), res) == ""
    for binds in (["load"], ["stationarity"], []):
        assert edge_text(pd.Series(row), SimpleNamespace(targets=targets, unit="GPUs", binding=binds)) == ""
    both = SimpleNamespace(targets=targets, unit="GPUs", binding=["max_dropped", "max_sojourn_p95_s"])
    two = {**row, "sojourn_p95_s_hi": 70.0}
    assert "; sojourn p95 30 s [20 s, 70 s] against 60 s" in edge_text(pd.Series(two), both)
    assert edge_text(pd.Series({**two, "sojourn_p95_s": 65.0}), both) == ""  # one estimate fails: no edge


def test_the_autoscale_whatif_meets_by_the_same_targets():
    targets = {k: None for k in CAPACITY_TARGETS} | {"max_dropped": 0.01}
    row = {"corrector": "rac", "status": "ok", **{f"{c}_hi": 0.0 for c in TARGET_FIGURES.values()}}
    assert CResult._whatif(row, targets)["meets"] and CResult._whatif(row, targets)["fails"] == ""
    over = CResult._whatif({**row, "dropped_frac_hi": 0.02}, targets)
    assert not over["meets"] and over["fails"] == "max_dropped"


SMALL = ["learner.trials=6", "learner.bootstrap=0", "pipeline.steps=12", "capacity.benchmark=false",
         "capacity.resamples=40", "capacity.max_steps=48", "capacity.counts=[4,8]",
         "pipeline.channels.judge.rm.mfu=0.4"]  # the flat MFU these counts were laid out for


def test_a_search_names_its_binding_target_and_ticks_once_per_count():
    """A sojourn p99 target binds the small judge; the search reports one unit per count it simulates
    (the counts between the listed ones included: its total grows first), a line per overloaded count,
    and a note per doubling of a run."""
    rec = Recorder()
    res = run_capacity(scenario(compose_config("scenario=capacity/judge_rm_h100", *SMALL,
                                               "capacity.max_sojourn_p99_s=6")), rec)
    rac = res.curve[res.curve.corrector == "rac"].set_index("count")
    assert rac.feasible.tolist() == [not f for f in rac.fails] and res.recommended == fewest(res.curve, "rac")
    below = rac.index[rac.index < res.recommended].max()
    assert res.binding == rac.fails[below].split(", ") and "max_sojourn_p99_s" in res.binding
    assert f"Binding: capacity.max_sojourn_p99_s = 6, which {below} GPUs" in recommendation_text(res)
    assert "sojourn p99 <= 6 s" in recommendation_text(res)
    search = [c for c in rec.calls if c[1] == "capacity search"]
    counted = [note.split(" GPUs")[0] for method, _, _, _, note in search if method == "update"]
    simulated = rac[~rac.status.str.startswith("overloaded")].index
    assert sorted(map(int, counted)) == sorted(simulated)  # a unit per count simulated, the unlisted ones included
    assert [done for method, _, done, _, _ in search if method == "update"] == list(range(1, len(simulated) + 1))
    assert all(done <= total for _, _, done, total, _ in search)  # the total grew before the unlisted counts ran
    noted = [note.split(" GPUs")[0] for method, _, _, _, note in search if method == "note" and ": load " in note]
    assert sorted(map(int, noted)) == sorted(set(rac.index) - set(simulated))  # the overloaded: a line, no unit
    for n, r in rac[rac.status == "ok"].iterrows():  # a note before each doubling: log2(steps / pipeline.steps)
        doubled = [note for method, _, _, _, note in rec.calls
                   if method == "note" and note.startswith(f"{n} GPUs: not stationary")]
        assert len(doubled) == round(math.log2(r.steps / 12)), (n, doubled)


@pytest.mark.parametrize("key,value", [
    ("max_dropped", -0.01), ("max_dropped", 1.01), ("max_dropped", "abc"), ("max_dropped", float("nan")),
    ("max_dropped", True), ("max_sojourn_p95_s", 0.0), ("max_sojourn_p95_s", -1.0),
    ("max_sojourn_p95_s", float("inf")), ("max_sojourn_p99_s", "1 minute"), ("max_sojourn_p99_s", -5.0),
    ("max_delay_p95_steps", -1.0), ("max_delay_p95_steps", "x"), ("max_background_sojourn_p95_s", 0.0),
    ("max_background_sojourn_p95_s", 5.0),  # the judge has no other tenants: nothing to time
])
def test_a_bad_target_is_refused_in_one_line(key, value):
    cfg = scenario(compose_config("scenario=capacity/judge_rm_h100"))
    with pytest.raises(ConfigError) as info:
        V.validate(replace_at(cfg, f"capacity.{key}", value))
    assert info.value.key == f"capacity.{key}" and "\n" not in str(info.value)


def test_the_target_edges_and_null_are_accepted_and_a_word_is_refused_at_composition():
    cfg = scenario(compose_config("scenario=capacity/judge_rm_h100"))
    assert cfg.capacity.max_dropped == 0.01 and cfg.capacity.max_sojourn_p95_s is None
    for key, value in [("max_dropped", 0.0), ("max_dropped", 1.0), ("max_dropped", None),
                       ("max_delay_p95_steps", 0.0), ("max_sojourn_p99_s", 0.5)]:
        V.validate(replace_at(cfg, f"capacity.{key}", value))
    with pytest.raises(Exception) as info:
        compose_config("scenario=capacity/judge_rm_h100", "capacity.max_dropped=abc")
    line = error_line(info.value)
    assert line.startswith("capacity.max_dropped") and "\n" not in line


# ---------------------------------------------------------------- memory of the longest run (point 9)

FACTOR = 2.0  # as tests/test_limits.py: the estimate within [peak / FACTOR, peak * FACTOR]
VERIFIER = ["scenario=capacity/code_verifier", "learner.trials=20", "learner.bootstrap=0", "pipeline.steps=10",
            "capacity.max_steps=160", "capacity.resamples=20"]


@pytest.mark.long
def test_the_estimate_covers_a_search_doubled_to_its_longest_run(monkeypatch):
    """settle made to double every time (no verdict stationary) runs 10 -> 160 steps; the capacity
    estimate holds its measured peak, which the estimate at pipeline.steps would miss by 4x."""
    cfg = scenario(compose_config(*VERIFIER))
    est = V.run_estimate(cfg)
    assert V.biggest_knob(est) == "capacity.max_steps" and est["all_sizes"]["capacity.max_steps"] == 160
    short = V.run_estimate(scenario(compose_config(*VERIFIER, "capacity.run_length=fixed")))
    monkeypatch.setattr(steady, "verdict", lambda x, w=None: steady.Verdict(len(x) // 2, False, "forced"))
    name = C.channel_of(cfg)
    tracemalloc.start()
    try:
        run = settle(C.with_count(cfg, C.count_key(cfg, name), 128), name)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert run.steps == 160
    assert peak / FACTOR <= est["memory"] <= peak * FACTOR, (est["memory"] / 1e6, peak / 1e6)
    assert short["memory"] < peak / FACTOR  # charged to pipeline.steps alone, the estimate missed the long run


def test_a_search_too_long_for_memory_runs_shorter(monkeypatch):
    """50 trials up to 1,600 steps (the longest run 40 x 2^5 = 1,280) need about 4 GB: with 3 GB
    capacity.max_steps is lowered, before the first count, to the longest doubling that fits (640),
    where the issue's search was refused (a 16x deployment at the default 640 steps likewise); a
    first run too big is refused naming its knob, nothing simulated."""
    seen = []

    class Simulated(Exception):
        pass

    def first_count(cfg, name, tell=None, note=None, work_per_s=None):
        seen.append(int(cfg.capacity.max_steps))
        raise Simulated

    monkeypatch.setattr(CRows, "settle", first_count)
    over = ["scenario=capacity/judge_rm_h100", "learner.trials=50", "capacity.max_steps=1600", "limits.memory_gb=3",
            "capacity.workers=1"]  # one process: its first count runs with the search's spec
    with pytest.raises(Simulated):
        run_capacity(scenario(compose_config(*over)))
    assert seen == [640]
    fitted, note = C.steps_that_fit(scenario(compose_config(*over)))
    assert fitted.capacity.max_steps == 640 and note.startswith("capacity.max_steps lowered from 1600 to 640: a run "
                                                                  "of 1280 steps needs about")
    assert V.run_estimate(fitted)["memory"] <= 3e9 < V.run_estimate(replace_at(fitted, "capacity.max_steps", 1280))["memory"]
    assert C.steps_that_fit(scenario(compose_config(*over[:3])))[1] is None  # fits as it is: unchanged
    monkeypatch.setattr(CR, "channel_loads", lambda *a, **k: pytest.fail("the loads were drawn"))
    with pytest.raises(ConfigError) as info:  # not even the first run of 40 steps fits
        run_capacity(scenario(compose_config(*over[:3], "limits.memory_gb=0.05")))
    assert info.value.key == "capacity.max_steps" and seen == [640]
    est = V.run_estimate(compose_config(*over))
    at_longest = V.run_estimate(compose_config(*over, "capacity.run_length=fixed", "pipeline.steps=1280"))
    assert est["memory"] == at_longest["memory"] and "capacity.max_steps" not in at_longest["terms"]
    assert V.longest_steps(40, 1600) == 1280 and V.longest_steps(40, 79) == 40 and V.longest_steps(40, 80) == 80


def test_the_answer_says_its_runs_were_shortened(monkeypatch):
    """A small judge whose longest doubling does not fit the room it is given: the answer (and
    summary.md's, the same text) ends with the note naming the lowered capacity.max_steps."""
    cfg = scenario(compose_config("scenario=capacity/judge_rm_h100", *SMALL))
    first = V.run_estimate(replace_at(cfg, "capacity.max_steps", 12))["memory"]
    monkeypatch.setattr(CM, "memory_room", lambda c: first * 1.01)  # 12 steps fit, 24 do not
    res = run_capacity(cfg)
    assert res.notes and res.notes[0].startswith("capacity.max_steps lowered from 48 to 12: a run of 24 steps")
    assert recommendation_text(res).endswith(f"Note: {res.notes[0]}.")
    assert set(res.curve["steps"].dropna()) <= {12.0}


ROOT = Path(__file__).resolve().parents[1]


def test_the_documented_deployment_figures(monkeypatch):
    """docs/capacity.md's 16x deployment: on a 25 GB machine (12.6 GB a run may take) its search is
    shortened to 160 steps with the note the page quotes, and 46 GPUs is its fewest count under
    capacity.max_load at the load the page gives (45 overloaded)."""
    text = " ".join((ROOT / "docs" / "capacity.md").read_text().split())
    cfg = scenario(compose_config("scenario=capacity/judge_rm_h100", "pipeline.batch_size=512",
                                  "capacity.counts=[64,72,80,88,96]"))
    monkeypatch.setattr(CM, "memory_room", lambda c: 12.6e9)
    fitted, note = C.steps_that_fit(cfg)
    assert fitted.capacity.max_steps == 160 and " ".join(note.split()[:17]) in text, note
    # "runs its counts two at a time at 40 steps on 2 cores": two runs fit at the first length, not at 160
    pooled = CP.pooled_spec(fitted, "judge", 2)
    assert "two at a time at 40 steps on 2 cores" in text and fitted.pipeline.steps == 40
    assert 40 <= pooled.capacity.max_steps < 160 and V.runs_that_fit(pooled) >= 2 > V.runs_that_fit(fitted)
    quoted = re.search(r"`racsim scenario=capacity/judge_rm_h100 pipeline.batch_size=512 "
                       r"'capacity.counts=\[64,72,80,88,96\]'`: (\d+) GPUs, load ([\d.]+)\)", text)
    assert quoted, "docs/capacity.md no longer quotes the 16x deployment's answer"
    name = C.channel_of(cfg)
    key = C.count_key(cfg, name)
    n = int(quoted.group(1))
    loads = C.channel_loads(cfg, name, key, [n - 1, n], load_basis(cfg, name))
    assert f"{loads[n]['load']:.3g}" == quoted.group(2) and loads[n - 1]["load"] >= cfg.capacity.max_load
