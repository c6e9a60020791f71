"""The capacity answer's sensitivity table (racsim/analyses/sensitivity.py): the search it uses
against an obvious loop, the scaled laws against their exact means, the knob's bad values, and on
small versions of the judge scenario (seconds): the table's directions, its base rows, and each
variant's answer against a plain capacity run of the varied spec."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_module

from helpers import Recorder
from racsim.analyses.capacity import run_capacity, steps_that_fit
from racsim.analyses.capacity import fewest_from
from racsim.analyses.sensitivity import run_capacity_sensitivity, scaled_law, variants, vary
from racsim.config.schema import LatencyConf, register_configs
from racsim.config.spec import replace_at, scenario as spec_of
from racsim.config.validate import check_limits, memory_room, run_estimate, validate
from racsim.errors import ConfigError
from racsim.pipeline.latency import build_latency
from racsim.report.capacity import sensitivity_text

from test_capacity import SMALL, SMALL_JUDGE

JUDGE = ["scenario=capacity/judge_rm_h100", *SMALL_JUDGE, "capacity.counts=[1,2,3,4,6,8,16]",
         "capacity.sensitivity.enabled=true"]
# more load on the harder side: the answer never falls; on the easier side never rises
HARDER = {"mfu": -1, "mfu_scale": -1, "tokens": +1, "batch_size": +1, "mtbf_s": -1, "mttr_s": +1, "service": +1,
          "background_rate": +1}


@pytest.fixture(scope="module")
def hydra_ctx():
    register_configs()
    with initialize_config_module(version_base="1.3", config_module="racsim.conf"):
        yield


def spec(*overrides):
    return spec_of(compose("config", overrides=list(overrides)))


@pytest.mark.parametrize("seed", range(40))
def test_fewest_from_is_the_fewest_passing_count(seed):
    """Against a loop over every count, from any start, with every answer (the first, inside, none)."""
    rng = np.random.default_rng(seed)
    counts = sorted(rng.choice(200, size=int(rng.integers(1, 40)), replace=False).tolist())
    t = int(rng.integers(0, len(counts) + 1))  # counts[t:] pass; t = len: none does
    start = int(rng.integers(0, len(counts)))
    asked = []

    def passes(n):
        asked.append(n)
        return counts.index(n) >= t

    want = next((n for n in counts if passes(n)), None)
    asked.clear()
    assert fewest_from(counts, start, passes) == want
    assert len(asked) == len(set(asked))  # no count asked twice
    d = abs(t - start) + 1
    assert len(asked) <= 2 * int(np.ceil(np.log2(d))) + 2  # exponential search: O(log distance), not O(len)


LAWS = [LatencyConf(kind="deterministic", mean=7.0),
        LatencyConf(kind="gaussian", mean=10.0, std=4.0, low=2.0),
        LatencyConf(kind="lognormal", mean=150.0, sigma=0.5, low=1.0),
        LatencyConf(kind="lognormal", mean=300.0, sigma=0.6, low=1.0, high=900.0),
        LatencyConf(kind="pareto", mean=20.0, alpha=2.5),
        LatencyConf(kind="exponential", mean=5.0, high=30.0),
        LatencyConf(kind="uniform", mean=None, low=1.0, high=40.0),
        LatencyConf(kind="cauchy", mean=21.0, scale=4.0, low=1.0, high=200.0),
        LatencyConf(kind="cauchy", mean=None, median=18.0, scale=4.0, low=1.0, high=200.0, cauchy_bounds="clip")]


@pytest.mark.parametrize("law", LAWS, ids=lambda law: law.kind)
@pytest.mark.parametrize("factor", [0.8, 1.25])
def test_a_scaled_law_is_the_law_of_factor_times_x(law, factor):
    """Its exact mean is factor x the law's, and its CDF at factor x x is the law's at x."""
    base, moved = build_latency(law), build_latency(scaled_law(law, factor))
    assert moved.mean() == pytest.approx(factor * base.mean(), rel=1e-7)
    x = np.asarray(base.quantile(np.linspace(0.05, 0.95, 7)), float)
    np.testing.assert_allclose(moved.cdf(factor * x), base.cdf(x), atol=1e-7)


@pytest.mark.parametrize("over,key", [
    (["capacity.sensitivity.spread=0"], "capacity.sensitivity.spread"),
    (["capacity.sensitivity.spread=1"], "capacity.sensitivity.spread"),
    (["capacity.sensitivity.spread=-0.2"], "capacity.sensitivity.spread"),
    (["capacity.sensitivity.spread=nan"], "capacity.sensitivity.spread"),
    (["capacity.sensitivity.inputs=[gpu_speed]"], "capacity.sensitivity.inputs"),
    (["capacity.sensitivity.inputs=[]"], "capacity.sensitivity.inputs"),
    (["capacity.sensitivity.inputs=[mfu,mfu]"], "capacity.sensitivity.inputs"),
    (["capacity.sensitivity.enabled=true", "capacity.sensitivity.inputs=[mtbf_s]"], "capacity.sensitivity.inputs"),
    (["capacity.sensitivity.enabled=true", "capacity.sensitivity.inputs=[service]"], "capacity.sensitivity.inputs"),
])
def test_sensitivity_config_errors(hydra_ctx, over, key):
    with pytest.raises(ConfigError) as info:
        validate(compose("config", overrides=["scenario=capacity/judge_rm_h100", *over]))
    assert info.value.key == key, info.value


def test_an_input_that_does_not_apply_is_refused_only_when_on(hydra_ctx):
    validate(compose("config", overrides=["scenario=capacity/judge_rm_h100", "capacity.sensitivity.enabled=false",
                                          "capacity.sensitivity.inputs=[mtbf_s]"]))


def test_a_variant_that_is_no_valid_input_is_refused_before_the_search(hydra_ctx):
    """An MTBF moved past faults.mtbf_s's range: the spread is named, before any count is run."""
    cfg = spec(*JUDGE, "capacity.sensitivity.inputs=[mtbf_s]", "capacity.sensitivity.spread=0.5",
               "pipeline.channels.judge.faults.mtbf_s=9e11", "pipeline.channels.judge.faults.mttr_s=30")
    with pytest.raises(ConfigError) as info:
        run_capacity_sensitivity(cfg)
    assert info.value.key == "capacity.sensitivity.spread"


def test_a_variant_whose_longest_run_does_not_fit_is_lowered_as_the_base_is(hydra_ctx):
    """A memory budget that holds the first run but not the longest (capacity.max_steps): the base
    search lowers max_steps with a note, and so does every variant, instead of refusing the spread
    (the 16x deployment of docs/capacity.md was refused so); a variant's runs then fit."""
    cfg = spec("scenario=capacity/judge_rm_h100", "capacity.max_steps=640")
    first = run_estimate(replace_at(cfg, "capacity.max_steps", cfg.pipeline.steps))["memory"]
    tight = replace_at(cfg, "limits.memory_gb", 4 * first / 1e9)
    base, note = steps_that_fit(tight)
    assert note is not None and base.capacity.max_steps < 640
    with pytest.raises(ConfigError):
        check_limits(tight)  # what the variants met before
    planned = variants(tight)
    assert {v.input for v in planned} == {"mfu_scale", "tokens", "batch_size", "kernels"}
    for v in planned:
        assert cfg.pipeline.steps <= v.spec.capacity.max_steps < 640, (v.input, v.value)
        assert run_estimate(v.spec)["memory"] <= memory_room(v.spec)


def test_the_batch_moves_to_the_nearest_other_integer(hydra_ctx):
    """At least one away from the batch as given, at least 1; a move that changes nothing is left out."""
    cfg = spec(*JUDGE)
    for b, down, up in ((32, 26, 38), (16, 13, 19), (2, 1, 3), (1, 1, 2)):
        c = replace_at(cfg, "pipeline.batch_size", b)
        moved = [vary(c, "judge", "batch_size", f).pipeline.batch_size for f in (0.8, 1.2, 1.0)]
        assert moved == [down, up, b + 1]  # a spread too small to move it (1 + 1e-300 is 1.0): up by one
    one = [v for v in variants(replace_at(cfg, "pipeline.batch_size", 1)) if v.input == "batch_size"]
    assert [(v.value, v.base) for v in one] == [(2.0, 1.0)]
    top = [v.value for v in variants(replace_at(cfg, "pipeline.channels.judge.rm.mfu", 0.9)) if v.input == "mfu"]
    assert top == [0.72, 1.0]  # moved up at most to 1


def check_table(res, cfg):
    """The table's base rows, directions and each variant against a plain run of its spec (the kernels
    variant: one, its change the full batch's seconds under the kernels over the roofline's)."""
    t = res.sensitivity
    assert set(t.columns) >= {"input", "key", "change", "value", "recommended", "delta", "simulated"}
    assert (t[t.change == 0].recommended == res.recommended).all()  # the base rows: the plain run's answer
    big = res.top + 1  # none: more than the largest count searched
    for what, rows in t.groupby("input", sort=False):
        rec = rows.sort_values("change").recommended.fillna(big).astype(int).to_numpy()
        if what == "kernels":
            base, moved = rows[rows.change == 0].iloc[0], rows[rows.change != 0].iloc[0]
            assert len(rows) == 2 and moved.change == pytest.approx(moved.value / base.value - 1.0, abs=1e-12)
            continue
        assert len(rec) == 3 and rows.change.is_monotonic_increasing, what
        if HARDER[what] > 0:
            assert rec[0] <= rec[1] <= rec[2], (what, rec)
        else:
            assert rec[0] >= rec[1] >= rec[2], (what, rec)
        want = rows.recommended - res.recommended if res.recommended is not None else rows.recommended * pd.NA
        assert rows.delta.isna().equals(want.isna()) and (rows.delta.fillna(0) == want.fillna(0)).all()
    s = cfg.capacity.sensitivity.spread
    name = res.channel
    for r in t[t.change != 0].itertuples():  # the cheap search agrees with the full one
        v = vary(cfg, name, r.input, 1 - s if r.change < 0 else 1 + s)
        plain = run_capacity(dataclasses.replace(v, capacity=dataclasses.replace(
            v.capacity, sensitivity=dataclasses.replace(v.capacity.sensitivity, enabled=False))))
        want = plain.recommended
        assert (pd.isna(r.recommended) and want is None) or r.recommended == want, (r.input, r.change, want)
        tried = [int(n) for n in r.simulated.split()]
        simulated = plain.curve[~plain.curve.status.str.startswith("overloaded")]["count"].unique()
        assert set(tried) <= set(range(1, res.top + 1)) and len(tried) <= len(simulated)


@pytest.mark.long  # the judge's search and its variants: 4 CPU s
def test_judge_sensitivity(hydra_ctx):
    cfg = spec(*JUDGE)
    res = run_capacity_sensitivity(cfg)
    plain = run_capacity(spec(*JUDGE[:-1]))
    pd.testing.assert_frame_equal(res.curve, plain.curve)  # the table leaves the plain answer as it is
    assert res.recommended == plain.recommended == 5
    t = res.sensitivity
    assert list(dict.fromkeys(t.input)) == ["mfu", "tokens", "batch_size", "kernels"]  # every input a roofline has
    assert t[t.input == "batch_size"].value.tolist() == [13, 16, 19]  # the nearest integers to 16 x 0.8 and x 1.2
    np.testing.assert_allclose(t[t.input == "mfu"].value, [0.32, 0.4, 0.48])
    assert res.timings["sensitivity_s"] > 0
    assert len(t[t.change != 0].simulated.str.split().explode()) <= 2 * 7  # at most two counts a variant
    check_table(res, cfg)
    typed = run_capacity(spec(*JUDGE[:-1], "pipeline.channels.judge.rm.mfu=0.32"))  # as a user would type it
    assert typed.recommended == t[(t.input == "mfu") & (t.change < 0)].recommended.iloc[0]
    text = sensitivity_text(res, 0.2)
    assert text.startswith("How the answer moves") and "5 GPUs; " in text and "if MFU is 0.32" in text
    assert "if measured kernels serve (" in text


def test_the_curve_and_the_kernels_as_inputs(hydra_ctx):
    """The judge as shipped (rm.mfu null): its MFU input moves the curve's scale, 0.8 and 1.2 (no cap: the
    curve's MFU is capped at 1 pass by pass); the kernels variant's value is a full batch's seconds (32
    sequences of the mean 450 tokens, padded) under the kernel model, its base the roofline's, each by hand."""
    from racsim.analyses.sensitivity import full_batch_seconds
    from racsim.pipeline.service import build_service

    cfg = spec("scenario=capacity/judge_rm_h100")
    planned = variants(cfg)
    assert [v.input for v in planned] == ["mfu_scale", "mfu_scale", "tokens", "tokens", "batch_size", "batch_size",
                                          "kernels"]
    assert [(v.value, v.base) for v in planned if v.input == "mfu_scale"] == [(0.8, 1.0), (1.2, 1.0)]
    k = next(v for v in planned if v.input == "kernels")
    rm = cfg.pipeline.channels["judge"].rm
    assert k.spec.pipeline.channels["judge"].rm.service == "kernels" and rm.service == "roofline"
    for spec_, value in ((cfg, k.base), (k.spec, k.value)):
        model = build_service(spec_.pipeline.channels["judge"].rm)
        assert value == pytest.approx(float(model.seconds(32, 32 * 450, 32 * 450 ** 2, 450)), rel=1e-12)
    assert full_batch_seconds(dataclasses.replace(rm, token_budget=900), "x") == pytest.approx(
        float(build_service(rm).seconds(2, 900, 2 * 450 ** 2, 450)), rel=1e-12)  # the budget holds two
    with pytest.raises(ConfigError) as info:
        validate(compose("config", overrides=["scenario=capacity/judge_rm_h100", "capacity.sensitivity.inputs=[mfu]"]))
    assert info.value.key == "capacity.sensitivity.inputs" and "mfu_scale" in info.value.allowed


@pytest.mark.long
def test_judge_with_faults_sensitivity(hydra_ctx):
    """MTBF and MTTR of random failures (up a third to three quarters of the time: the answer moves by
    the load, beyond the outage timelines' noise; the dropped share, noisy there at these short runs,
    no target); the other inputs left out."""
    cfg = spec(*JUDGE, "capacity.counts=[4,6,8,12]", "capacity.max_steps=96", "pipeline.channels.judge.faults.mtbf_s=100",
               "pipeline.channels.judge.faults.mttr_s=50", "capacity.max_dropped=null", "capacity.sensitivity.inputs=[mtbf_s,mttr_s]",
               "capacity.sensitivity.spread=0.5")
    res = run_capacity_sensitivity(cfg)
    t = res.sensitivity
    assert list(dict.fromkeys(t.input)) == ["mtbf_s", "mttr_s"]
    np.testing.assert_allclose(t[t.input == "mttr_s"].value, [25, 50, 75])
    check_table(res, cfg)


def test_queue_service_sensitivity(hydra_ctx):
    """A queue channel: its service-time scale (and the arrival rate)."""
    cfg = spec("scenario=capacity/code_verifier", *SMALL, "capacity.counts=[8,128]", "capacity.max_steps=96",
               "pipeline.batch_size=8", "capacity.sensitivity.enabled=true")
    res = run_capacity_sensitivity(cfg)
    t = res.sensitivity
    assert list(dict.fromkeys(t.input)) == ["batch_size", "service"]
    np.testing.assert_allclose(t[t.input == "service"].value, [16.4, 20.5, 24.6])  # U[1, 40] x 0.8, x 1, x 1.2
    check_table(res, cfg)


@pytest.mark.long
def test_variants_in_a_pool_give_the_same_table(hydra_ctx):
    """capacity.workers=2: the counts and the variants' searches in two spawned processes give the
    same curve and table, to the last bit, as one process; a unit of progress per variant, of the four announced."""
    over = (*JUDGE, "capacity.counts=[4,6,8,12]", "capacity.max_steps=96", "pipeline.channels.judge.faults.mtbf_s=100",
            "pipeline.channels.judge.faults.mttr_s=50", "capacity.max_dropped=null",
            "capacity.sensitivity.inputs=[mfu,mttr_s]")
    one = run_capacity_sensitivity(spec(*over, "capacity.workers=1"))
    rec = Recorder()
    two = run_capacity_sensitivity(spec(*over, "capacity.workers=2"), rec)
    pd.testing.assert_frame_equal(one.curve, two.curve, check_exact=True)
    pd.testing.assert_frame_equal(one.sensitivity, two.sensitivity, check_exact=True)
    t = two.sensitivity
    variant = [c for c in rec.calls if c[1] == "sensitivity" and c[0] == "update"]
    assert [done for _, _, done, _, _ in variant] == list(range(1, (t.change != 0).sum() + 1)) and len(variant) == 4
    assert {total for _, _, _, total, _ in variant} == {4}  # the variants, announced before the first ran


@pytest.mark.long  # 4 CPU s
def test_shared_judge_sensitivity_to_the_other_tenants_rate(hydra_ctx):
    """A judge shared with other tenants: their rate is an input (x 0.5 and x 1.5 here, the answer
    moving by the load), each variant against a plain run of its spec; the sentence names it."""
    cfg = spec(*JUDGE, "+pipeline.channels.judge.background={rate_per_s: 30.0}", "capacity.sensitivity.spread=0.5",
               "capacity.sensitivity.inputs=[background_rate]")
    res = run_capacity_sensitivity(cfg)
    t = res.sensitivity
    assert list(dict.fromkeys(t.input)) == ["background_rate"]
    np.testing.assert_allclose(t.value, [15.0, 30.0, 45.0])
    assert t.key.iloc[0] == "pipeline.channels.judge.background.rate_per_s"
    assert t.recommended.nunique() > 1  # the rate moves the answer
    check_table(res, cfg)
    assert "if other tenants send 45 requests/s" in sensitivity_text(res, 0.5)
