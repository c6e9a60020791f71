"""learner=lm with power (scenario lm/ranking): paired differences over seeds, the missing
share of the slow gradient, the reduced scenario, device selection and the --lm benchmark
(the seed rule itself: tests/test_lm_seed_rule.py).

Oracles: scipy's paired t-test (ttest_rel) and hand loops; a loop over every slow result
for the missing share; Theorem 2.1's slack on the measured kernel at a frozen policy."""

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from racsim.analyses.lm_study import paired_differences, share_origins, t_halfwidth
from racsim.learner.bandit import BanditPolicy
from racsim.learner.bias import kernel_slack
from racsim.learner.correctors import CorrectorParams, correction_weight
from racsim.learner.grpo import delivered_and_owed, make_task, missing_share, train_lane
from racsim.learner.theory import measured_kernel
from racsim.pipeline.schedule import DROPPED, INJECTED

# ---- paired differences ----------------------------------------------------------------------


def test_paired_differences_against_a_hand_loop_and_ttest_rel():
    rng = np.random.default_rng(4)
    common = rng.standard_normal(12)  # what every corrector's seed shares: pairing removes it
    values = {"naive": common + rng.normal(0.0, 0.1, 12), "rac": common + 0.3 + rng.normal(0.0, 0.1, 12),
              "bare_additive": common + 0.29 + rng.normal(0.0, 0.1, 12)}
    df = paired_differences(values, "rac", bound=0.2).set_index("pair")
    assert list(df.index) == ["rac - naive", "rac - bare_additive"]
    for other in ("naive", "bare_additive"):
        d = [a - b for a, b in zip(values["rac"], values[other])]
        m = sum(d) / len(d)
        sd = math.sqrt(sum((x - m) ** 2 for x in d) / (len(d) - 1))
        lo, hi = stats.ttest_rel(values["rac"], values[other]).confidence_interval(0.95)
        row = df.loc[f"rac - {other}"]
        assert row.seeds == 12 and row["diff"] == pytest.approx(m, abs=1e-12) and row.sd == pytest.approx(sd)
        assert (row.ci_lo, row.ci_hi) == (pytest.approx(lo), pytest.approx(hi))
        want = ("better" if lo > 0 else "worse") if (lo > 0 or hi < 0) else ("same" if hi - lo < 0.2 else "open")
        assert row.answer == want and row.level == 0.95
    assert df.loc["rac - naive"].answer == "better" and df.loc["rac - bare_additive"].answer != "better"
    # marginal intervals of rac and naive overlap (the shared noise), the paired one does not
    marginal = [t_halfwidth(np.std(values[n], ddof=1), 12) for n in ("rac", "naive")]
    assert values["rac"].mean() - marginal[0] < values["naive"].mean() + marginal[1]


# ---- the missing share of the slow gradient -------------------------------------------------

CLIPPED = ("rac", "rac_no_age", "retrace_a", "rac_adaptive")


@pytest.mark.parametrize("name", CLIPPED + ("bare_additive",))
def test_delivered_and_owed_make_a_share_for_the_clipped_correctors(name):
    rng = np.random.default_rng(1)
    R, G = 200, 8
    delay = rng.integers(0, 30, (R, G))
    ratio = np.exp(rng.normal(0, 0.7, (R, G)))
    tau = np.full((R, G), 7.0) if name == "rac_adaptive" else None
    c = correction_weight(name, delay, np.full((R, G), INJECTED), ratio, CorrectorParams(tau_age=10.0),
                          tau_age=tau)
    resid = rng.standard_normal((R, G))
    got, owed = delivered_and_owed(c, ratio, resid)
    for r in range(5):  # by hand
        assert got[r] == pytest.approx(sum(resid[r] ** 2 * c[r])) and owed[r] == pytest.approx(sum(resid[r] ** 2 * ratio[r]))
    share = missing_share(got.reshape(1, R, 1, 1), owed.reshape(1, R, 1, 1), [1.0], np.arange(R))
    assert share == pytest.approx(1 - got.sum() / owed.sum())
    if name == "bare_additive":  # no ratio clip: responses that lost probability are delivered above their due
        assert (got > owed).any()
    else:
        assert (got >= 0).all() and (got <= owed * (1 + 1e-12)).all() and 0 <= share <= 1


def frozen_run(name, N=60, P=4, K=2, G=8, seed=0):
    """A frozen bandit (lr 0: ratio 1 everywhere) through train_lane on a random schedule
    with drops; returns the curve and the schedule."""
    task = make_task(5, 2, 3, 4, -0.5, seed=2)
    rng = np.random.default_rng(seed)
    delay = rng.geometric(0.3, (N, P, K)) - 1
    status = np.where(rng.random((N, P, K)) < 0.15, DROPPED, INJECTED).astype(np.int8)
    delay = np.where(status == INJECTED, delay, -1)
    land = np.where(status == INJECTED, np.arange(N)[:, None, None] + delay, -1)
    if name == "naive":
        land = np.full_like(land, -1)
    b = BanditPolicy(task, 0, "sgd", 0.0, seed=0)
    b.phi[:] = np.random.default_rng(9).standard_normal(b.phi.shape)
    cv = train_lane(b, task, delay, status, land, name, CorrectorParams(tau_age=6.0), [0.3, 0.7], G, 0.0,
                    np.random.default_rng(seed))
    return cv, delay, status


@pytest.mark.parametrize("name", ["naive", "wait_for_slow", "rac", "retrace_a", "rac_no_age", "bare_additive",
                                  "rac_adaptive"])
def test_missing_share_at_a_frozen_policy_is_the_slack(name):
    """At a frozen policy every result delivers the corrector's weight at its delay times its
    group's sum X^2 (0 when dropped or landed after the run) and owes that sum, so the share
    is a loop over the results; with equal sums it is Theorem 2.1's slack on the measured
    kernel of the same steps exactly, and with the groups' own sums within sampling error."""
    from racsim.learner.correctors import adaptive_tau_age

    cv, delay, status = frozen_run(name)
    N, P, K = delay.shape
    w = np.array([0.3, 0.7])
    sched = SimpleNamespace(delay=delay[None], injected=(status == INJECTED)[None])
    origins = share_origins(sched, N)
    assert origins.max() + delay.max() < N and len(origins) > N // 2
    params = CorrectorParams(tau_age=6.0)
    tau = adaptive_tau_age(delay[None], status[None], params)[0] if name == "rac_adaptive" else None
    num = den = 0.0
    for t in origins:
        for b in range(P):
            energy = float(cv.owed[t, b, 0])
            for k in range(K):
                if status[t, b, k] == INJECTED and name != "naive":
                    c = float(correction_weight(name, np.array(delay[t, b, k]), np.array(status[t, b, k]), None,
                                                params, tau_age=None if tau is None else tau[t, b, k]))
                else:
                    c = 0.0
                assert cv.owed[t, b, k] == pytest.approx(energy, rel=1e-12)
                assert cv.delivered[t, b, k] == pytest.approx(c * energy, rel=1e-9, abs=1e-12)
                num, den = num + w[k] * c * energy, den + w[k] * energy
    got = missing_share(cv.delivered[None], cv.owed[None], w, origins)
    assert got == pytest.approx(1 - num / den, abs=1e-9)
    lam = measured_kernel(delay[origins], status[origins])
    eta = float(w @ kernel_slack(name, lam, params, 1.0) / w.sum())
    if name != "rac_adaptive":  # its tau comes from the run's history, eta's from the kernel's long run
        flat = cv.delivered / np.where(cv.owed > 0, cv.owed, 1.0)
        assert missing_share(flat[None], np.ones((1, N, P, K)), w, origins) == pytest.approx(eta, abs=1e-9)
    assert abs(got - eta) < (1e-12 if name == "naive" else 0.05)


def test_missing_share_of_a_learning_policy_is_measured_not_the_slack():
    """A learning policy moves the ratios: RAC's clipped share stays in [0, 1] and departs
    from the frozen one; bare additive's differs from its frozen 0."""
    shares = {}
    for lr in (0.0, 3.0):
        task = make_task(5, 2, 3, 4, -0.5, seed=2)
        N, P, K = 40, 4, 1
        delay = np.full((N, P, K), 3)
        status = np.full((N, P, K), INJECTED)
        land = np.arange(N)[:, None, None] + delay
        for name in ("rac", "bare_additive"):
            cv = train_lane(BanditPolicy(task, 0, "sgd", lr, seed=0), task, delay, status, land, name,
                            CorrectorParams(tau_age=1e6), [1.0], 8, 0.0, np.random.default_rng(0))
            shares[lr, name] = missing_share(cv.delivered[None], cv.owed[None], [1.0], np.arange(N - 3))
    assert shares[0.0, "rac"] == pytest.approx(1 - math.exp(-3 / 1e6), abs=1e-9)
    assert shares[0.0, "bare_additive"] == pytest.approx(0.0, abs=1e-12)
    assert 0.01 < shares[3.0, "rac"] <= 1
    assert shares[3.0, "bare_additive"] != pytest.approx(0.0, abs=1e-3)


# ---- the scenario in a reduced mode, the device, the benchmark -----------------------------


def reduced(*extra):
    from racsim.config.defaults import default_config

    return default_config("scenario=lm/ranking", "pipeline.steps=8", "learner.lm.seeds=3", "learner.lm.policy=bandit",
                          "learner.lm.max_seeds=6", "learner.lm.n_responses=16", "learner.lm.vocab=4",
                          "learner.lm.response_len=3", *extra)


def test_ranking_scenario_runs_reduced_and_its_pairs_are_the_curves_differences(tmp_path):
    from racsim.report.writers import write_outputs
    from racsim.analyses.dispatch import run

    res = run(reduced())
    r = res.results
    assert list(r.corrector) == ["naive", "wait_for_slow", "rac", "rac_adaptive", "bare_additive"]
    n = int(r.seeds.iloc[0])
    assert 3 <= n <= 6 and (r.params == 8 * 16).all()  # 8 prompts x 16 responses
    paired = res.extra["lm_paired"]
    assert set(paired.pair) == {"rac - naive", "rac - wait_for_slow", "rac - rac_adaptive", "rac - bare_additive"}
    assert (paired.seeds == n).all()
    rule = res.extra["lm_seed_rule"]
    assert rule.look.iloc[0] == 0 and rule.seeds.iloc[0] == 3 and rule.seeds.iloc[-1] == n
    assert set(rule.pair[rule.waited]) == set(paired.pair)  # the ranking waits for all four pairs
    # true_final per seed from the curves table, differenced seed by seed
    cv = res.extra["lm_curves"]
    last = cv[cv.step == cv.step.max()].set_index(["corrector", "seed_lane"]).true  # the last 10% of 9 entries
    d = (last["rac"] - last["naive"]).to_numpy()
    row = paired[(paired.metric == "true_final") & (paired.pair == "rac - naive")].iloc[0]
    assert row["diff"] == pytest.approx(d.mean()) and row.sd == pytest.approx(d.std(ddof=1))
    assert (r.missing_share[r.corrector == "naive"] == 1).all() and (r.missing_share[r.corrector != "naive"] < 1).all()
    files = {p.name for p in write_outputs(tmp_path, res, "x: 1\n", plots=False)}
    assert {"lm_paired.parquet", "lm_seed_rule.parquet", "summary.md"} <= files
    assert "rac - naive" in (tmp_path / "summary.md").read_text()
    again = run(reduced())  # the same config and seed: the same numbers
    pd.testing.assert_frame_equal(again.extra["lm_paired"], paired)


def test_ranking_scenario_on_a_tiny_transformer():
    pytest.importorskip("torch")
    from racsim.analyses.dispatch import run

    res = run(reduced("learner.lm.policy=transformer", "learner.lm.layers=1", "learner.lm.d_model=8",
                      "learner.lm.heads=2", "pipeline.steps=2", "learner.lm.max_seeds=3", "corrector.names=[naive,rac]",
                      "learner.lm.decide=[naive]"))
    r = res.results
    assert (r.seeds == 3).all() and (r.layers == 1).all() and (r.d_model == 8).all() and (r.params > 0).all()
    assert (r.seconds_per_step > 0).all() and list(res.extra["lm_paired"].pair) == ["rac - naive"] * 2


@pytest.mark.parametrize("override,key,said", [
    ("learner.lm.max_seeds=4", "learner.lm.max_seeds", "an integer >= 5"),
    ("learner.lm.bound=0", "learner.lm.bound", "a positive number"),
    ("learner.lm.budget_s=-1", "learner.lm.budget_s", "a positive number"),
    ("learner.lm.decide=[rac]", "learner.lm.decide", "correctors other than rac"),
    ("learner.lm.decide=[naive,naive]", "learner.lm.decide", "each corrector at most once"),
])
def test_bad_seed_rule_values_name_the_key(override, key, said):
    from racsim.config.defaults import default_config
    from racsim.config.validate import validate
    from racsim.errors import ConfigError

    with pytest.raises(ConfigError) as ex:
        validate(default_config("learner=lm", "learner.lm.seeds=5", override))
    assert ex.value.key == key and said in ex.value.allowed


@pytest.mark.parametrize("names,absent", [("[naive,wait_for_slow]", "rac"), ("[rac,wait_for_slow]", "naive")])
def test_a_seed_rule_on_pairs_that_do_not_run_is_refused_before_any_work(names, absent):
    from racsim.errors import ConfigError
    from racsim.analyses.dispatch import run

    with pytest.raises(ConfigError) as ex:
        run(reduced(f"corrector.names={names}", "learner.lm.decide=[naive]"))
    assert ex.value.key == "learner.lm.decide" and f"{absent} not in corrector.names" in ex.value.allowed
    assert "learner.lm.decide=[] for a fixed seed count" in ex.value.allowed
    run(reduced(f"corrector.names={names}", "learner.lm.decide=[]"))  # a fixed count runs without rac


def test_device_selection_takes_cuda_when_present(monkeypatch):
    torch = pytest.importorskip("torch")
    from racsim.errors import ConfigError
    from racsim.learner.lm import pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device("auto") == torch.device("cpu") and pick_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError) as ex:
        pick_device("cuda:0")
    assert ex.value.key == "learner.lm.device"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device("auto") == torch.device("cuda") and pick_device("cuda:1") == torch.device("cuda:1")


def test_bench_lm_times_both_loops_and_fits_the_scaling():
    pytest.importorskip("torch")
    from racsim.tools.bench import bench_lm

    out = bench_lm(1, ((1, 8), (1, 16), (2, 16)), repeat=1)
    sizes = [out[f"lm_{s}_params"] for s in ("1x8", "1x16", "2x16")]
    assert sizes == sorted(sizes) and sizes[0] > 0
    assert all(out[f"lm_{s}_racsim_s_per_step"] > 0 and out[f"lm_{s}_plain_s_per_step"] > 0 for s in ("1x8", "2x16"))
    t = [out[f"lm_{s}_racsim_s_per_step"] for s in ("1x8", "1x16", "2x16")]
    slope, intercept = np.polyfit(sizes, t, 1)
    assert out["lm_projected_s_per_step_1B"] == pytest.approx(intercept + slope * 1e9)
