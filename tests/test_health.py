"""A run's health record (issue 49, point 2): the offered load as the run drew it against its closed form,
the record of a run and of a grid's cells against a plain loop over its channels, a cell's over its seeds,
and the few words a table shows."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from racsim.config.defaults import default_config
from racsim.pipeline.draws import draw, sampled_loads
from racsim.report.aggregate import aggregate, health_line, unhealthy
from racsim.report.tables import health_flag, run_health, with_health

DETERMINISTIC = ["pipeline.generate.kind=deterministic", "latency@pipeline.channels.judge.latency=deterministic"]


@pytest.mark.parametrize("workers, mean", [(4, 7.5), (3, 200.0),
                                           *(pytest.param(w, 20.0, marks=pytest.mark.long) for w in (1, 16))])
def test_the_load_of_deterministic_work_is_its_closed_form(workers, mean):
    """Every phase and the judge's service deterministic: rho = B x S / (T x c), T the sum of the phases."""
    cfg = default_config(*DETERMINISTIC, f"pipeline.channels.judge.workers={workers}",
                         f"pipeline.channels.judge.latency.mean={mean}")
    p = cfg.pipeline
    step = p.generate.mean + p.fast_score.mean + p.submit.mean + p.update.mean
    loads = sampled_loads(p, draw(p, 3, np.random.default_rng(0)))
    assert loads["judge"] == pytest.approx(p.batch_size * mean / (step * workers), rel=1e-12)


def test_a_random_load_is_near_its_mean_and_none_without_servers():
    """The verifier's lognormal work over many steps is near B E[S] / (E[T] c); a channel without a worker
    limit has no load."""
    cfg = default_config(*DETERMINISTIC, "pipeline.channels.judge.workers=null")
    p = cfg.pipeline
    step = p.generate.mean + p.fast_score.mean + p.submit.mean + p.update.mean
    loads = sampled_loads(p, draw(p, 40, np.random.default_rng(1)))
    v = p.channels["verifier"]
    assert loads["verifier"] == pytest.approx(p.batch_size * v.latency.mean / (step * v.workers), rel=0.05)
    assert math.isnan(loads["judge"])


def channels(rng, cells=None) -> pd.DataFrame:
    rows = []
    for c in cells or [None]:
        for name in ("verifier", "judge"):
            rows.append({**({"cell": c} if c is not None else {}), "channel": name,
                         "emitted": int(rng.integers(1, 100)), "dropped": int(rng.integers(0, 30)),
                         "stationary": bool(rng.random() < 0.6), "steady_note": "x",
                         "offered_load": float(rng.choice([np.nan, rng.uniform(0, 3)]))})
    return pd.DataFrame(rows)


def by_hand(ch: pd.DataFrame, late: float) -> dict:
    loads = [v for v in ch.offered_load if not math.isnan(v)]
    warnings = (["warm-up too short"] if late > 0.05 else []) + (
        ["not stationary: " + ", ".join(r.channel for r in ch.itertuples() if not r.stationary)]
        if not ch.stationary.all() else [])
    return {"stationary": bool(ch.stationary.all()), "offered_load": max(loads) if loads else math.nan,
            "dropped_share": max(r.dropped / r.emitted for r in ch.itertuples()), "warnings": "; ".join(warnings)}


@pytest.mark.parametrize("seed", range(6))
def test_the_health_of_a_run_and_of_a_grids_cells_is_the_hand_loop(seed):
    rng = np.random.default_rng(seed)
    late = rng.uniform(0, 0.1, 3)
    results = pd.DataFrame({"cell": np.repeat([0, 1, 2], 2), "corrector": ["naive", "rac"] * 3,
                            "delay_past_warmup": np.repeat(late, 2), "warmup_steps": 5, "stationary": True})
    ch = channels(rng, [0, 1, 2])
    got = with_health(results, ch)
    assert list(got.columns[-4:]) == ["stationary", "offered_load", "dropped_share", "warnings"]
    for c in range(3):
        want = by_hand(ch[ch.cell == c], late[c])
        for _, row in got[got.cell == c].iterrows():
            for k, v in want.items():
                assert (isinstance(v, float) and math.isnan(v) and math.isnan(row[k])) or row[k] == v, (c, k)
    one = run_health(results.drop(columns="cell"), ch.drop(columns="cell"))  # a run without cells: all of it
    assert one["stationary"] == bool(ch.stationary.all())
    alone = run_health(results, None)  # no channels' table (an LM run): what the results say
    assert alone["stationary"] is True and math.isnan(alone["offered_load"]) and math.isnan(alone["dropped_share"])
    assert alone["warnings"] == ("warm-up too short" if late.max() > 0.05 else "")


def test_a_cells_health_over_its_seeds_and_the_warning_line():
    rows = pd.DataFrame({"w": [4, 4, 16, 16], "seed": [0, 1, 0, 1], "corrector": "rac", "bias_exact": 1.0,
                         "stationary": pd.array([True, False, True, None], dtype="boolean"),
                         "offered_load": [0.5, 2.5, 0.2, np.nan], "dropped_share": [0.0, 0.4, 0.0, 0.001],
                         "warnings": ["", "warm-up too short; not stationary: judge", "", ""]})
    agg = aggregate(rows, ["w", "seed"])
    four, sixteen = agg.iloc[0], agg.iloc[1]
    assert not four.stationary and four.offered_load == 2.5 and four.dropped_share == 0.4
    assert four.warnings == "warm-up too short; not stationary: judge"
    assert sixteen.stationary and sixteen.offered_load == 0.2 and sixteen.warnings == ""
    assert unhealthy(agg) == [("w=4", "load 2.5, not stationary, 40% dropped, warm-up short")]
    assert health_line(agg).startswith("warning: 1 of 2 cells are not healthy: w=4 (load 2.5,")
    mixed = aggregate(rows.assign(tau=[np.nan, np.nan, 20.0, 20.0]), ["w", "tau", "seed"])  # a knob one job lacks
    assert unhealthy(mixed) == [("w=4", "load 2.5, not stationary, 40% dropped, warm-up short")]


def test_the_flag_in_a_few_words():
    assert health_flag(True, 0.5, 0.0, "") == "ok"
    assert health_flag(True, 1.0, 0.0, "") == "load 1"  # at 1 the backlog grows already
    assert health_flag(True, 0.99, 0.011, "") == "1% dropped"
    assert health_flag(None, math.nan, math.nan, "") == "?" and health_flag(pd.NA, math.nan, math.nan, None) == "?"
    assert health_flag(False, math.nan, math.nan, "warm-up too short") == "not stationary, warm-up short"
