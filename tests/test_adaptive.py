"""rac_adaptive: RAC whose tau_age comes from the delays landed so far in the run.

Checked against a slow per-step loop written here (a run replayed one update at a
time: take tau from the history, weigh the results landing now, then add them to
the history), on random schedules with drops, pending results and delays of 0;
for causality (changing the delays of results that land later changes no earlier
weight, while changing an earlier one does); and for its long-run value on a
delay kernel (what the theorem's kernel and the row normalisation use).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from racsim.analyses.grid import expand
from racsim.config.defaults import compose_config
from racsim.config.spec import scenario
from racsim.errors import ConfigError
from racsim.learner.bias import corrector_slack
from racsim.learner.correctors import (
    CorrectorParams,
    adaptive_tau_age,
    correction_weight,
    kernel_tau_age,
)
from racsim.learner.theory import measured_kernel
from racsim.pipeline.schedule import DROPPED, INJECTED, PENDING, ArrivalSchedule

SHAPE = (5, 14, 3, 2)  # trials, steps, batch, K


def random_schedule(rng, shape=SHAPE, max_delay=9, p_zero=0.15):
    """Delays 0..max_delay (a share of them 0), some results dropped, some pending."""
    status = rng.choice(np.array([INJECTED, DROPPED, PENDING], dtype=np.int8), size=shape, p=[0.7, 0.15, 0.15])
    d = np.where(rng.random(shape) < p_zero, 0, rng.integers(1, max_delay + 1, size=shape))
    return np.where(status == INJECTED, d, -1).astype(np.int64), status


def replay_tau(delay, status, q, scale, min_results, prior):
    """The rule replayed per trial and channel, one update at a time: before update u the
    history holds the delays of the results landed at updates < u; the results landing at u
    get tau from it, then join it. Returns tau per element (prior where not injected)."""
    trials, steps, batch, K = delay.shape
    out = np.full(delay.shape, float(prior))
    for i in range(trials):
        for k in range(K):
            history = []
            last = max((t + delay[i, t, b, k] for t in range(steps) for b in range(batch)
                        if status[i, t, b, k] == INJECTED), default=-1)
            for u in range(last + 1):
                if len(history) < min_results:
                    tau = float(prior)
                else:
                    ordered = sorted(history)
                    tau = scale * max(1, ordered[math.ceil(q * len(ordered)) - 1])
                landing = [(t, b) for t in range(steps) for b in range(batch)
                           if status[i, t, b, k] == INJECTED and t + delay[i, t, b, k] == u]
                for t, b in landing:
                    out[i, t, b, k] = tau
                history += [int(delay[i, t, b, k]) for t, b in landing]
    return out


KNOBS = [  # (quantile, scale, min_results, prior)
    (0.5, 50.0, 10, 1000.0),
    (0.25, 1.5, 1, 3.0),
    (0.9, 2.0, 4, math.inf),
    (1.0, 0.7, 25, 6.0),
]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tau_and_weights_match_the_per_step_replay(seed):
    rng = np.random.default_rng(seed)
    delay, status = random_schedule(rng)
    inj = status == INJECTED
    ratio = rng.uniform(0.2, 3.0, size=SHAPE)
    reached = {"prior": 0, "quantile 0": 0, "quantile > 0": 0}
    for q, scale, n_min, prior in KNOBS:
        p = CorrectorParams(alpha=0.8, tau_age=prior, rho_bar=1.3, adaptive_quantile=q, adaptive_scale=scale,
                            adaptive_min_results=n_min)
        want_tau = replay_tau(delay, status, q, scale, n_min, prior)
        got_tau = adaptive_tau_age(delay, status, p)
        assert got_tau.dtype == np.float64 and got_tau.shape == SHAPE
        np.testing.assert_array_equal(got_tau, want_tau, err_msg=str((q, scale, n_min, prior)))
        reached["prior"] += int(np.count_nonzero(inj & (want_tau == prior)))
        reached["quantile 0"] += int(np.count_nonzero(inj & (want_tau == scale)))
        reached["quantile > 0"] += int(np.count_nonzero(inj & (want_tau > scale) & (want_tau != prior)))
        for r in (ratio, None):
            got = correction_weight("rac_adaptive", delay, status, r, p)
            rho = np.minimum(1.3, 1.0 if r is None else r)
            want = np.where(inj, 0.8 * np.exp(-np.where(inj, delay, 0) / want_tau) * rho, 0.0)
            np.testing.assert_allclose(got, want, rtol=1e-14, atol=0)
            assert np.all(got[inj] > 0)
    assert all(v > 20 for v in reached.values()), reached  # every branch of the rule is exercised


def test_equals_rac_with_the_tau_it_was_given():
    """With a constant tau_age passed per element, rac_adaptive is rac at that tau, bit for bit."""
    rng = np.random.default_rng(7)
    delay, status = random_schedule(rng)
    ratio = rng.uniform(0.2, 3.0, size=SHAPE)
    for tau in (0.5, 20.0, math.inf):
        p = CorrectorParams(tau_age=tau)
        a = correction_weight("rac_adaptive", delay, status, ratio, p, tau_age=np.full(SHAPE, tau))
        assert np.array_equal(a, correction_weight("rac", delay, status, ratio, p))


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_causal_future_delays_do_not_change_past_weights(seed):
    rng = np.random.default_rng(seed)
    delay, status = random_schedule(rng)
    p = CorrectorParams(tau_age=4.0, adaptive_quantile=0.5, adaptive_scale=2.0, adaptive_min_results=3)
    steps = SHAPE[1]
    origin = np.arange(steps)[None, :, None, None]
    land = np.where(status == INJECTED, origin + delay, np.iinfo(np.int64).max)
    base = correction_weight("rac_adaptive", delay, status, None, p)
    for cut in (4, 7, 10):
        later = land >= cut  # results that land at update `cut` or after (or never)
        # Their delays and statuses redrawn, as long as they still do not land before `cut`.
        d2, s2 = random_schedule(rng)
        d2 = np.where(s2 == INJECTED, np.maximum(d2, cut - origin), -1)
        new_delay, new_status = np.where(later, d2, delay), np.where(later, s2, status)
        assert not np.array_equal(new_delay[later], delay[later])
        got = correction_weight("rac_adaptive", new_delay, new_status, None, p)
        past = land < cut
        assert past.any()
        np.testing.assert_array_equal(got[past], base[past])
        # The results landing at `cut` itself keep their delay: their tau is from before `cut` too.
        at_cut = (land == cut)
        kept = np.where(at_cut, delay, new_delay), np.where(at_cut, status, new_status)
        got = correction_weight("rac_adaptive", *kept, None, p)
        np.testing.assert_array_equal(got[past | at_cut], base[past | at_cut])
    # The history does matter: a longer delay of an early result changes later weights.
    i, t, b, k = next(zip(*np.nonzero((status == INJECTED) & (land < 4))))
    changed = delay.copy()
    changed[i, t, b, k] = delay[i, t, b, k] + 3  # lands later, still inside the run
    diff = correction_weight("rac_adaptive", changed, status, None, p) != base
    own = np.zeros(SHAPE, dtype=bool)
    own[i, t, b, k] = True
    same_run = np.zeros(SHAPE, dtype=bool)
    same_run[i, :, :, k] = True
    assert (diff & ~own).any()
    assert not (diff & ~(own | same_run & (land > land[i, t, b, k]))).any()


def kernel_quantile_loop(row, q):
    """The smallest d with at least q of the row's mass at delays <= d (plain floats)."""
    total = sum(row)
    acc = 0.0
    for d, x in enumerate(row):
        acc += x
        if acc >= q * total:
            return d
    raise AssertionError


def test_kernel_tau_matches_loop_and_the_long_run():
    rng = np.random.default_rng(11)
    p = CorrectorParams(tau_age=123.0, adaptive_quantile=0.7, adaptive_scale=3.0)
    lam = rng.uniform(0, 1, size=(6, 9)) * (rng.random((6, 9)) < 0.6)
    lam[0] = 0.0  # no result of this channel lands: the prior
    lam[1] = [0.9, 0.05] + [0.0] * 7  # quantile 0: tau = scale * 1
    lam /= np.maximum(lam.sum(axis=1, keepdims=True), 1e-300) * rng.uniform(1, 2, size=(6, 1))  # some mass lost
    want = [123.0 if row.sum() == 0 else 3.0 * max(1, kernel_quantile_loop(list(row), 0.7)) for row in lam]
    np.testing.assert_array_equal(kernel_tau_age(lam, p), want)
    assert want[0] == 123.0 and want[1] == 3.0 and len(set(want)) > 3
    # A long run whose delays follow a law: the running tau at the end is the kernel's.
    pmf = np.array([0.0, 0.1, 0.15, 0.3, 0.25, 0.2])  # cdf 0.1, 0.25, 0.55, 0.8, 1.0: q = 0.7 at 4
    trials, steps, batch = 3, 300, 40
    delay = rng.choice(len(pmf), p=pmf, size=(trials, steps, batch, 1))
    status = np.full(delay.shape, INJECTED, dtype=np.int8)
    tau = adaptive_tau_age(delay, status, p)
    last = delay + np.arange(steps)[None, :, None, None] == steps - 1
    np.testing.assert_array_equal(tau[last], kernel_tau_age(pmf[None], p)[0])
    assert kernel_tau_age(pmf[None], p)[0] == 3.0 * 4


def test_theorem_kernel_uses_the_long_run_tau():
    """corrector_slack (Theorem 2.1's eta on the measured kernel) weighs rac_adaptive's kernel
    with kernel_tau_age of that kernel, and so differs from rac at the prior tau_age."""
    rng = np.random.default_rng(2)
    delay, status = random_schedule(rng, shape=(40, 30, 2, 2), max_delay=12)
    sched = ArrivalSchedule(delay=delay, status=status, step_start=np.zeros((40, 31)), blocking=False,
                            channel_names=("a", "b"))
    p = CorrectorParams(tau_age=1000.0, adaptive_scale=2.0)
    lam = measured_kernel(delay, status)
    tau = kernel_tau_age(lam, p)
    want = 1.0 - (np.exp(-np.arange(lam.shape[1])[None] / tau[:, None]) * lam).sum(axis=1)
    np.testing.assert_allclose(corrector_slack("rac_adaptive", sched, p), want, rtol=1e-12)
    assert np.all(corrector_slack("rac_adaptive", sched, p) > corrector_slack("rac", sched, p) + 0.1)


def test_misuse_is_refused():
    d = np.zeros((3, 2), dtype=np.int64)
    with pytest.raises(ValueError, match="trials, steps, batch, K"):
        correction_weight("rac_adaptive", d, d, None, CorrectorParams())  # no history to read
    with pytest.raises(ValueError, match="rac_adaptive"):
        correction_weight("rac", d, d, None, CorrectorParams(), tau_age=np.ones((3, 2)))
    for bad in ({"adaptive_quantile": 0.0}, {"adaptive_quantile": 1.5}, {"adaptive_scale": 0.0},
                {"adaptive_scale": math.inf}, {"adaptive_min_results": 0}, {"adaptive_min_results": 2.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            CorrectorParams(**bad)


@pytest.mark.parametrize("override,key", [
    ("corrector.adaptive_quantile=0", "corrector.adaptive_quantile"),
    ("corrector.adaptive_quantile=1.5", "corrector.adaptive_quantile"),
    ("corrector.adaptive_scale=-1", "corrector.adaptive_scale"),
    ("corrector.adaptive_scale=inf", "corrector.adaptive_scale"),
    ("corrector.adaptive_min_results=0", "corrector.adaptive_min_results"),
])
def test_bad_knobs_name_the_key(override, key):
    with pytest.raises(ConfigError) as e:
        expand(scenario(compose_config(override)))
    assert e.value.key == key


def test_no_landed_result_gives_the_prior():
    shape = (2, 3, 1, 1)
    delay, status = np.full(shape, -1), np.full(shape, PENDING, dtype=np.int8)
    for q, scale, n_min, prior in KNOBS:
        p = CorrectorParams(tau_age=prior, adaptive_quantile=q, adaptive_scale=scale, adaptive_min_results=n_min)
        assert np.array_equal(adaptive_tau_age(delay, status, p), np.full(shape, prior))
        assert not correction_weight("rac_adaptive", delay, status, None, p).any()


def test_a_scale_near_the_largest_float_is_no_age_weighting_without_a_warning():
    """adaptive_scale x the delay quantile past the largest float: tau_age inf (weights of no age
    decay), with no NumPy overflow warning on stderr (a generated extreme config met one)."""
    rng = np.random.default_rng(5)
    delay, status = random_schedule(rng)
    p = CorrectorParams(alpha=0.8, tau_age=3.0, rho_bar=1.3, adaptive_quantile=0.9, adaptive_scale=1e308,
                        adaptive_min_results=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tau = adaptive_tau_age(delay, status, p)
        got = correction_weight("rac_adaptive", delay, status, None, p)
    learned = (status == INJECTED) & (tau != 3.0)
    assert np.all(tau[learned] >= 1e308) and np.isinf(tau[learned]).any()  # a quantile >= 2 overflows
    np.testing.assert_array_equal(got[learned], 0.8)  # exp(-d / inf) = 1, rho capped at 1.3 by ratio 1
