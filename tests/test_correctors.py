"""Correctors against slow, obvious per-element oracles (paper eq. 1)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from oracles import oracle_adaptive_tau, oracle_weight

from racsim.config.schema import CORRECTORS
from racsim.errors import ConfigError
from racsim.learner.correctors import (
    BLOCKING,
    SCHEDULE_FREE,
    CorrectorParams,
    age_weight,
    causal_running_mean,
    clipped_ratio,
    corrected_advantage,
    correction_weight,
    geometric_weight,
    vtrace_advantage,
)
from racsim.pipeline.schedule import DROPPED, INJECTED, PENDING

SHAPE = (7, 5, 3, 2)


# --------------------------------------------------------------------------
# The oracle: one element at a time, written from the brief, not from the code.




def random_schedule(rng, shape=SHAPE, max_delay=12):
    status = rng.choice(np.array([INJECTED, DROPPED, PENDING], dtype=np.int8), size=shape, p=[0.6, 0.2, 0.2])
    delay = np.where(status == INJECTED, rng.integers(0, max_delay + 1, size=shape), -1).astype(np.int64)
    return delay, status


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("ratio_mode", ["full", "broadcast", "none"])
def test_correction_weight_matches_loop_oracle(seed, ratio_mode):
    rng = np.random.default_rng(seed)
    delay, status = random_schedule(rng)
    if ratio_mode == "full":
        ratio = rng.uniform(0.2, 3.0, size=SHAPE)
    elif ratio_mode == "broadcast":  # one ratio per sample, shared by the K channels
        ratio = rng.uniform(0.2, 3.0, size=SHAPE[:-1] + (1,))
    else:
        ratio = None
    full_ratio = np.ones(SHAPE) if ratio is None else np.broadcast_to(ratio, SHAPE)
    inj = status == INJECTED

    # The random inputs reach every branch.
    assert np.count_nonzero(status == DROPPED) > 0 and np.count_nonzero(status == PENDING) > 0
    assert np.count_nonzero(inj & (delay == 0)) > 0 and np.count_nonzero(inj & (delay > 5)) > 0
    checked = 0
    for rho_bar in (0.5, 1.0, 2.0, math.inf):
        if ratio is not None and math.isfinite(rho_bar):
            assert np.count_nonzero(inj & (full_ratio > rho_bar)) > 0, "clip never active"
            assert np.count_nonzero(inj & (full_ratio < rho_bar)) > 0, "clip never inactive"
        for tau_age in (5.0, 1000.0, math.inf):
            for alpha, gamma in ((1.0, 0.5), (0.7, 0.9), (1.3, 0.0)):
                params = CorrectorParams(alpha=alpha, tau_age=tau_age, rho_bar=rho_bar, retrace_gamma=gamma)
                for name in CORRECTORS:
                    got = correction_weight(name, delay, status, ratio, params)
                    assert got.dtype == np.float64 and got.shape == SHAPE
                    want = np.empty(SHAPE)
                    for idx in np.ndindex(*SHAPE):
                        lane, t, _, k = idx
                        tau = None if name != "rac_adaptive" else oracle_adaptive_tau(
                            delay, status, lane, t + delay[idx], k, params.adaptive_quantile, params.adaptive_scale,
                            params.adaptive_min_results, tau_age)
                        want[idx] = oracle_weight(
                            name, int(delay[idx]), int(status[idx]), float(full_ratio[idx]),
                            alpha, tau_age, rho_bar, gamma, tau,
                        )
                    np.testing.assert_allclose(got, want, rtol=1e-13, atol=0, err_msg=f"{name} {params}")
                    checked += 1
    assert checked == 4 * 3 * 3 * len(CORRECTORS)


def test_weights_zero_off_schedule_and_schedule_free_ignore_it():
    rng = np.random.default_rng(5)
    delay, status = random_schedule(rng)
    ratio = rng.uniform(0.2, 3.0, size=SHAPE)
    p = CorrectorParams()
    for name in CORRECTORS:
        w = correction_weight(name, delay, status, ratio, p)
        if name in SCHEDULE_FREE:
            other = correction_weight(name, np.zeros_like(delay), np.zeros_like(status), None, p)
            assert np.array_equal(w, other)
        else:
            assert np.all(w[status != INJECTED] == 0.0)
            assert np.all(w[status == INJECTED] > 0.0)


def test_corrector_sets_and_unknown_name():
    assert BLOCKING == frozenset({"wait_for_slow"})
    assert SCHEDULE_FREE == frozenset({"naive", "sync_oracle"})
    assert BLOCKING <= set(CORRECTORS) and SCHEDULE_FREE <= set(CORRECTORS)
    d = np.zeros((2, 2), dtype=int)
    with pytest.raises(ConfigError) as e:
        correction_weight("rac_typo", d, d, None, CorrectorParams())
    assert e.value.key == "corrector.names" and "rac_no_age" in str(e.value)


def test_shape_errors():
    d = np.zeros((3, 2), dtype=int)
    with pytest.raises(ValueError, match="shape"):
        correction_weight("rac", d, np.zeros((3, 1), dtype=int), None, CorrectorParams())
    with pytest.raises(ValueError, match="broadcast"):
        correction_weight("rac", d, d, np.ones((4, 2)), CorrectorParams())
    with pytest.raises(ValueError):
        CorrectorParams(tau_age=0.0)
    with pytest.raises(ValueError):
        CorrectorParams(retrace_gamma=1.5)


def test_kernels_and_clip():
    d = np.array([0, 1, 2, 10])
    np.testing.assert_allclose(age_weight(d, 5.0), [1.0, math.exp(-0.2), math.exp(-0.4), math.exp(-2.0)], rtol=1e-15)
    assert np.array_equal(age_weight(d, math.inf), np.ones(4))
    assert age_weight(d, 5.0).dtype == np.float64
    np.testing.assert_allclose(geometric_weight(d, 0.5), [1.0, 0.5, 0.25, 0.5**10], rtol=1e-15)
    assert np.array_equal(geometric_weight(d, 0.0), [1.0, 0.0, 0.0, 0.0])
    r = np.array([0.2, 1.0, 1.7, 3.0])
    assert np.array_equal(clipped_ratio(r, 1.0), [0.2, 1.0, 1.0, 1.0])
    assert np.array_equal(clipped_ratio(r, math.inf), r)
    # tau_age = 1000 is near-unity over the operating grid (the paper's default).
    assert age_weight(np.array([30]), 1000.0)[0] > 0.97


# --------------------------------------------------------------------------
# Identity-kernel collapse onto V-trace, bit for bit.


def many_magnitudes(rng, shape):
    return rng.standard_normal(shape) * 10.0 ** rng.uniform(-8, 8, size=shape)


def identity_data(seed, shape=(8, 40, 6)):
    rng = np.random.default_rng(seed)
    r_fast = many_magnitudes(rng, shape)
    r_slow = np.where(rng.random(shape) < 0.5, r_fast + many_magnitudes(rng, shape), many_magnitudes(rng, shape))
    bl = causal_running_mean(r_fast, axis=1)  # over optimizer steps
    return r_fast, r_slow, bl


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_identity_kernel_collapses_to_vtrace_exactly(seed):
    r_fast, r_slow, bl = identity_data(seed)
    delay = np.zeros(r_fast.shape, dtype=np.int64)  # Lambda = I: every result at Delta = 0
    status = np.full(r_fast.shape, INJECTED)
    target = vtrace_advantage(r_slow, bl)
    for tau_age in (0.5, 5.0, 1000.0, math.inf):
        for rho_bar in (1.0, 2.0, math.inf):
            for ratio in (None, np.ones(r_fast.shape)):
                p = CorrectorParams(alpha=1.0, tau_age=tau_age, rho_bar=rho_bar)
                w = correction_weight("rac", delay, status, ratio, p)
                assert np.array_equal(w, np.ones(r_fast.shape))
                got = corrected_advantage(r_fast, r_slow, bl, w)
                assert got.dtype == np.float64
                assert np.array_equal(got, target)
    # wait_for_slow and the synchronous oracle use the same slow target.
    for name in ("wait_for_slow", "sync_oracle"):
        w = correction_weight(name, delay, status, None, CorrectorParams())
        assert np.array_equal(corrected_advantage(r_fast, r_slow, bl, w), target)
    # And naive is exactly the fast advantage.
    w = correction_weight("naive", delay, status, None, CorrectorParams())
    assert np.array_equal(corrected_advantage(r_fast, r_slow, bl, w), r_fast - bl)


def test_literal_formula_is_not_bit_identical():
    """Makes the previous test meaningful: the textbook form rounds twice."""
    r_fast, r_slow, bl = identity_data(0)
    literal = (r_fast - bl) + (r_slow - r_fast)
    target = vtrace_advantage(r_slow, bl)
    assert not np.array_equal(literal, target)
    assert np.count_nonzero(literal != target) > 100
    np.testing.assert_allclose(literal, target, rtol=1e-6, atol=1e-6 * np.abs(r_fast).max())


def test_corrected_advantage_general_weight():
    rng = np.random.default_rng(3)
    r_fast, r_slow, bl, c = (rng.standard_normal(50) for _ in range(4))
    want = (r_fast - bl) + c * (r_slow - r_fast)
    np.testing.assert_allclose(corrected_advantage(r_fast, r_slow, bl, c), want, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------
# Causal baseline.


def test_causal_running_mean_matches_loop():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 9, 2))
    got = causal_running_mean(x, axis=1)
    want = np.zeros_like(x)
    for i in range(3):
        for j in range(2):
            total = 0.0
            for t in range(9):
                want[i, t, j] = total / t if t > 0 else 0.0
                total += x[i, t, j]
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)
    assert np.array_equal(causal_running_mean(np.array([4.0])), [0.0])
    assert np.array_equal(causal_running_mean(np.arange(4)), [0.0, 0.0, 0.5, 1.0])
    # bl_t does not look at x_t or later.
    y = x.copy()
    y[:, 5:, :] += 100.0
    assert np.array_equal(causal_running_mean(y, axis=1)[:, :6], got[:, :6])
