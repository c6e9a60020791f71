"""Deciding with enough evidence (issue 41): the sequential rule of racsim/analyses/capacity/stopping.py on toys
whose truth is known in closed form (an M/M/c/c loss system's blocking probability: Erlang B),
and a capacity search that adds replications to a count its first run leaves undecided."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from helpers import Recorder
from racsim.analyses.capacity import run_capacity
from racsim.analyses.capacity import stopping as D
from racsim.config.defaults import compose_config
from racsim.config.spec import scenario

SENT = 2000  # requests a toy replication sends


def erlang_b(c: int, a: float) -> float:
    """Blocking probability of an M/M/c/c system offered ``a`` erlangs (the recursion B_k = a B / (k + a B))."""
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    return b


def toy(p: float, seed: int):
    """Replications of a loss system blocking with probability ``p``: SENT requests each."""
    rng = np.random.default_rng(seed)
    return lambda r: {"dropped": float(rng.binomial(SENT, p)), "sent": float(SENT)}


def row(lo: float, hi: float) -> dict:
    return {"dropped_frac_lo": lo, "dropped_frac_hi": hi}


def test_erlang_b_closed_form():
    assert erlang_b(1, 1.0) == pytest.approx(0.5)
    assert erlang_b(2, 1.0) == pytest.approx(0.2)  # (a^2 / 2) / (1 + a + a^2 / 2)


def test_open_targets_straddle_or_zero():
    t = {"max_dropped": 0.01, "max_sojourn_p95_s": None}
    assert D.open_targets(row(0.002, 0.02), t) == ["max_dropped"]  # straddles
    assert D.open_targets(row(0.01, 0.02), t) == ["max_dropped"]  # lo on the target
    assert D.open_targets(row(0.0, 0.0), t) == ["max_dropped"]  # a run that saw no event
    assert D.open_targets(row(0.0, 0.0), t, zero=False) == []  # one without slow regimes to miss
    assert D.open_targets(row(0.0, 0.005), t) == []  # passes
    assert D.open_targets(row(0.02, 0.03), t) == []  # fails
    assert D.open_targets(row(0.002, 0.02), {"max_dropped": None}) == []  # no target
    assert D.open_targets(row(0.0, 0.02), {"max_dropped": 0.0}) == []  # an event seen fails a target of 0
    assert D.open_targets(row(0.0, 0.0), {"max_dropped": 0.0}) == []  # and none seen cannot settle it


def test_bias_targets_are_open_only_where_asked():
    r = {**row(0.0, 0.005), "bias_vs_naive_lo": 0.01, "bias_vs_naive_hi": 0.3, "bias_exact_lo": 1.0, "bias_exact_hi": 2.0}
    t = {"max_dropped": 0.01, "max_bias_vs_naive": 0.1, "max_bias": 3.0}
    assert D.open_targets(r, t) == []  # no slow regime: the trials' intervals stand
    assert D.open_targets(r, t, bias=True) == ["max_bias_vs_naive"]  # straddles; the bias is clear


def test_far_from_the_target_stops_early():
    p = erlang_b(5, 2.0)  # 3.7% blocked against a 1% target
    first = toy(p, 1)(0)
    d = D.sequential(first, toy(p, 2), ["max_dropped"], {"max_dropped": 0.01}, 0.95, lambda r: r < 50)
    assert d.decided and len(d.reps) <= 4  # of the 50 the budget allows (t with 1 df: 12.7, with 2: 4.3)
    v, lo, hi = d.found["max_dropped"]
    assert lo > 0.01 and lo <= p <= hi


def test_truth_at_the_target_runs_out_of_budget():
    p = erlang_b(8, 3.0)  # 1.2%: the target set at the truth
    t = {"max_dropped": p}
    calls = []

    def affords(r):
        calls.append(r)
        return r < 12

    d = D.sequential(toy(p, 3)(0), toy(p, 4), ["max_dropped"], t, 0.99, affords)
    assert not d.decided and d.open == ["max_dropped"] and len(d.reps) == 12
    v, lo, hi = d.found["max_dropped"]
    assert lo <= p < hi and hi - lo < 0.01
    assert calls[-1] == 12  # asked for the 13th, refused


def test_zero_reading_is_replicated_and_never_reads_zero_zero():
    seen = []

    def replicate(r):
        seen.append(r)
        return {"dropped": 0.0, "sent": float(SENT)}

    d = D.sequential({"dropped": 0.0, "sent": float(SENT)}, replicate, ["max_dropped"], {"max_dropped": 0.01},
                     0.95, lambda r: r < 10)
    assert seen == [1] and d.decided
    v, lo, hi = d.found["max_dropped"]
    assert v == lo == 0.0 and 0.0 < hi < 0.01
    assert hi == pytest.approx(1 - 0.025 ** (1 / (2 * SENT)))


def test_no_budget_no_replication():
    d = D.sequential({"dropped": 30.0, "sent": float(SENT)}, toy(0.01, 0), ["max_dropped"], {"max_dropped": 0.01},
                     0.95, lambda r: False)
    assert len(d.reps) == 1 and d.open == ["max_dropped"] and d.found == {}


def test_quantile_figure_on_a_student_t_interval():
    rng = np.random.default_rng(5)
    d = D.sequential({"sojourn_p95_s": 10.0}, lambda r: {"sojourn_p95_s": float(rng.normal(10.0, 1.0))},
                     ["max_sojourn_p95_s"], {"max_sojourn_p95_s": 20.0}, 0.95, lambda r: r < 50)
    v, lo, hi = d.found["max_sojourn_p95_s"]
    assert d.decided and hi < 20.0 and lo <= 10.0 <= hi
    values = np.array([r["sojourn_p95_s"] for r in d.reps])
    half = D.t_quantile(0.95, values.size - 1) * values.std(ddof=1) / np.sqrt(values.size)
    assert (lo, hi) == pytest.approx((values.mean() - half, values.mean() + half))


def test_budget_counts_steps_and_seconds():
    b = D.Budget(steps=100, seconds=1e9)
    assert b.affords(60) and not b.affords(60) and b.affords(40) and b.used == 100
    assert not D.Budget(steps=100, seconds=0.0).affords(1)


V = "pipeline.channels.verifier"
# A cheap queue with outages: 3-6 workers, 8 exponential requests every 4 s, results older than 4 steps dropped.
SMALL_QUEUE = ("scenario=capacity/code_verifier", f"latency@{V}.latency=exponential", f"{V}.latency.low=0.0",
               f"{V}.latency.high=null", f"{V}.latency.mean=1.3", "pipeline.generate.kind=deterministic",
               "pipeline.generate.mean=4.0", "pipeline.fast_score.mean=0.0", "pipeline.submit.mean=0.0",
               "pipeline.update.mean=0.0", "pipeline.batch_size=8", f"{V}.max_delay=4",
               f"{V}.faults.mtbf_s=400.0", f"{V}.faults.mttr_s=40.0", "pipeline.steps=40", "pipeline.warmup_steps=8",
               "learner.trials=6", "learner.bootstrap=0", "capacity.run_length=fixed", "capacity.resamples=20",
               "capacity.benchmark=false", "capacity.sensitivity.enabled=false", "capacity.workers=1",
               "capacity.counts=[3,4,5]", "capacity.max_bias_vs_naive=null", "capacity.max_step_s=null",
               "corrector.names=[naive,rac]")


def small_search(*more, progress=None):
    return run_capacity(scenario(compose_config(*SMALL_QUEUE, *more)), progress)


def rac(curve: pd.DataFrame) -> pd.DataFrame:
    return curve[curve.corrector == "rac"].set_index("count")


def test_a_capacity_search_replicates_an_undecided_count():
    first = rac(small_search("capacity.decide_steps=0").curve)  # no replications: the first run's intervals
    assert set(first["replications"]) <= {0, 1}
    n = next(n for n in (5, 6) if first.loc[n, "dropped_frac_lo"] < first.loc[n, "dropped_frac_hi"])
    target = float(first.loc[n, ["dropped_frac_lo", "dropped_frac_hi"]].mean())  # straddled by construction
    rec = Recorder()
    res = small_search(f"capacity.max_dropped={target!r}", "capacity.decide_steps=160",  # 4 replications of 40
                       progress=rec)
    got = rac(res.curve)
    assert got["replications"].max() >= 2 and res.replicated_steps <= 160
    said = [c for c in rec.calls if "replication" in c[4]]  # a line before each replication, its steps done so far
    assert len(said) == int(res.replicated_steps) // 40 == int((got["replications"] - 1).clip(0).sum())
    assert [done for _, _, done, _, _ in said] == [40 * i for i in range(len(said))]
    assert {(phase, total) for _, phase, _, total, _ in said} == {("deciding replications", 160)}  # not a count's
    assert "max_dropped undecided" in said[0][4] and rec.phase.done <= rec.phase.total
    for m in got.index[got["replications"] > 1]:  # each count replicated is one the answer depends on
        assert res.recommended is None or m in (res.recommended, res.recommended - 1) or not (
            got.loc[m, "dropped_frac_lo"] <= target < got.loc[m, "dropped_frac_hi"])
    lines = [t for t in res.notes if "capacity.decide_steps or capacity.decide_s ran out" in t]
    undecided = [m for m in got.index if got.loc[m, "dropped_frac_lo"] <= target < got.loc[m, "dropped_frac_hi"]
                 and got.loc[m, "status"] == "ok" and m in (res.recommended - 1, res.recommended)]
    assert [int(t.split(" or ")[0]) for t in lines] == undecided  # each count left undecided is said
    for t in lines:
        assert "nan" not in t and " replication" in t and f"or {res.recommended}: dropped at" in t
    assert res.recommended is not None and res.recommended not in undecided  # the safe, larger count


def test_budget_zero_leaves_the_first_readings():
    base = small_search("capacity.decide_steps=0")
    assert base.replicated_steps == 0 and set(rac(base.curve)["replications"]) <= {0, 1}


def test_an_undecided_bias_ratio_is_replicated_with_the_bias_study():
    first = rac(small_search("capacity.decide_steps=0", "capacity.max_dropped=null").curve)
    n = next(n for n in (5, 6, 7) if n in first.index and first.loc[n, "bias_vs_naive_lo"] < first.loc[n, "bias_vs_naive_hi"])
    target = float(first.loc[n, ["bias_vs_naive_lo", "bias_vs_naive_hi"]].mean())
    res = small_search("capacity.max_dropped=null", f"capacity.max_bias_vs_naive={target!r}", "capacity.decide_steps=120")
    curve = res.curve.set_index(["count", "corrector"])
    done = [m for m in curve.index.levels[0] if curve.loc[(m, "rac"), "replications"] > 1]
    assert done and res.replicated_steps <= 120
    for m in done:  # the chosen corrector's bias ratio rebuilt on the replications; naive's row keeps its own
        assert curve.loc[(m, "rac"), "bias_vs_naive"] != first.loc[m, "bias_vs_naive"]
        assert curve.loc[(m, "naive"), "bias_vs_naive"] == pytest.approx(1.0)
        assert curve.loc[(m, "naive"), "replications"] == curve.loc[(m, "rac"), "replications"]
