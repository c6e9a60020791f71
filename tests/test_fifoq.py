"""racsim/pipeline/fifoq.py: the FIFO waiting list the lanes engine's autoscaled pools use.

It must dispatch exactly what the batcher's rule (:class:`_Waiting`, a loop over the
waiting requests and one service-model call per batch) dispatches, batch by batch and bit
by bit: driven side by side through random arrivals, idle replicas and instants, on padded
and packed batches, budgets that cut, ``max_batch`` 1, bursts factors, flushes of batches
the limits did not cut, and requests over the budget (which run alone).
"""

from __future__ import annotations

import numpy as np
import pytest

from racsim.pipeline.batcher import GpuSpec, _Waiting
from racsim.pipeline.fifoq import FifoWaiting, limit_sizes


class Affine:
    """seconds = o + a * tokens + b * squares + c * count + d * longest: every statistic counts."""

    def __init__(self, rng, padded):
        self.padded = padded
        self.w = rng.uniform([0.0, 1e-4, 1e-7, 0.0, 1e-5], [0.05, 1e-3, 1e-6, 0.01, 1e-4])

    def seconds(self, count, tok_sum, sq_sum, max_len):
        o, a, b, c, d = (float(x) for x in self.w)
        return o + a * np.asarray(tok_sum) + b * np.asarray(sq_sum) + c * np.asarray(count) + d * np.asarray(max_len)


def case(seed):
    rng = np.random.default_rng(seed)
    padded = bool(seed % 2)
    spec = GpuSpec(replicas=int(rng.integers(1, 4)), max_batch=int(rng.choice([1, 2, 5, 8, 32])),
                   budget=float(rng.integers(300, 4000)), max_wait=float(rng.choice([0.0, 0.3])), order="fifo",
                   padded=padded, model=Affine(rng, padded), seqs=1)
    G, groups = int(rng.integers(1, 40)), int(rng.integers(3, 12))
    tok = np.maximum(np.rint(rng.lognormal(5.5, 0.8, G * groups)), 1.0)
    slow = rng.choice([1.0, 2.5], groups) if seed % 3 == 0 else None
    return rng, spec, G, groups, tok, slow


def drive(seed):
    """Both waiting lists through the same random admissions and dispatch instants; the batches
    each dispatched, as plain tuples, and a tally of the paths taken."""
    rng, spec, G, groups, tok, slow = case(seed)
    plain, fast = _Waiting(spec, tok.tolist(), G, None if slow is None else slow.tolist()), FifoWaiting(spec, tok, G, slow)
    arrival, tau, g = [], 0.0, 0
    out = {"plain": [], "fast": []}
    seen = {"formed": 0, "flushed": 0, "budget": 0}
    while g < groups or len(plain):
        tau += float(rng.exponential(0.2))
        if g < groups and rng.random() < 0.4:
            arrival.append(tau)
            plain.admit(g)
            fast.admit(g)
            g += 1
        idle = sorted(rng.choice(spec.replicas, int(rng.integers(0, spec.replicas + 1)), replace=False).tolist())
        if rng.random() < 0.2:
            tau += 1.0  # past every flush deadline
        assert len(plain) == len(fast)
        if len(plain):
            assert plain.deadline(arrival) == fast.deadline(arrival)
        for name, q in (("plain", plain), ("fast", fast)):
            got = q.dispatch(idle, tau, arrival)
            out[name] += [(b.replica, list(b.ids), b.seconds, b.billed, b.group) for b in got]
            if name == "fast":
                seen["formed"] += sum(type(b.ids) is range for b in got)
                seen["flushed"] += sum(type(b.ids) is not range for b in got)
                seen["budget"] += sum(type(b.ids) is range and len(b.ids) < spec.max_batch for b in got)
        assert len(plain) == len(fast)
    return out, seen, spec


@pytest.mark.parametrize("seed", range(24))
def test_fifo_waiting_dispatches_what_the_rule_does(seed):
    out, _, _ = drive(seed)
    assert out["fast"] == out["plain"]
    assert sum(len(b[1]) for b in out["fast"]) == len({j for b in out["fast"] for j in b[1]})  # each request once


def test_cases_reach_every_branch():
    seen = dict(formed=False, full=False, flushed=False, budget=False, padded=False, packed=False, single=False,
                over_budget=False, slow=False)
    for seed in range(24):
        out, s, spec = drive(seed)
        seen["formed"] |= s["formed"] > 0
        seen["flushed"] |= s["flushed"] > 0
        seen["budget"] |= s["budget"] > 0
        seen["full"] |= s["formed"] > s["budget"]
        seen["padded" if spec.padded else "packed"] = True
        seen["single"] |= spec.max_batch == 1
        seen["over_budget"] |= any(b[3] > spec.budget for b in out["fast"])
        seen["slow"] |= seed % 3 == 0
    assert all(seen.values()), seen


@pytest.mark.parametrize("seed", range(24))
def test_limit_sizes_is_the_rule_at_every_head(seed):
    """limit_sizes against :meth:`_Waiting.candidate` from each head, every request waiting
    (the batch then stops at a limit or at the last request)."""
    _, spec, G, groups, tok, _ = case(seed)
    size, longest = limit_sizes(spec, tok)
    rule = _Waiting(spec, tok.tolist(), G)
    for h in range(tok.size):
        rule.keys = list(range(h, tok.size))
        _, n, _, _, mx, _ = rule.candidate()
        assert (size[h], longest[h]) == (n, mx), h


@pytest.mark.parametrize("top", [9, 2 ** 16 + 5, 2 ** 24 + 7, 2 ** 30])
def test_range_max_is_the_slice_maximum(top):
    """RangeMax against max(x[lo:lo + n]) on random integers either side of each storage width."""
    from racsim.pipeline.rangemax import RangeMax

    rng = np.random.default_rng(top)
    x = rng.integers(0, top, 300).astype(np.float64)
    longest = int(rng.integers(1, 70))
    lo = rng.integers(0, x.size, 2000)
    n = np.minimum(rng.integers(0, longest + 1, lo.size), x.size - lo)
    want = [x[a:a + k].max() if k else 0.0 for a, k in zip(lo, n)]
    np.testing.assert_array_equal(RangeMax(x, longest)(lo, n).astype(np.float64), want)
