"""The fast path of asynchronous generation (issue 46, point 6) changes no result: the token versions summed
at the end (version_sums) against token_versions, sequence by sequence; a folded prefill pass against the plain
one on the random lanes that reach every branch (the same trace to the bit, the same events); the decode step
the engines call (Roofline.decode_step) against decode_seconds and a hand-worked roofline."""

from __future__ import annotations

import math
import sys
from collections import Counter

import numpy as np
import pytest
from test_generation_lane import SEEDS, differences, outcome, random_inputs, token_versions

from racsim.config.defaults import catalog
from racsim.config.schema import GpuConf, RMConf, RMModelConf
from racsim.generation import state as ST
from racsim.generation.state import version_sums
from racsim.pipeline.service import Roofline, model_size


def switches(r: np.random.Generator, starts: np.ndarray, lengths: np.ndarray) -> tuple:
    """An engine's switch counters (non-decreasing) and versions (rising, some by more than one, as drained
    engines adopt): at random counters, at the sequences' starts, at their token positions exactly, and
    repeated."""
    picks = [r.uniform(0, float(starts.max() + lengths.max()) + 3, int(r.integers(0, 12)))]
    i = r.integers(0, len(starts), int(r.integers(0, 6)))
    picks += [starts[i], starts[i] + r.integers(0, lengths[i] + 1)]
    ks = np.sort(np.concatenate(picks))
    ks = np.repeat(ks, r.integers(1, 3, len(ks)))
    return ks.tolist(), np.cumsum(r.integers(1, 4, len(ks))).tolist()


def test_version_sums_are_token_versions_summed():
    r = np.random.default_rng(5)
    for trial in range(300):
        m = int(r.integers(1, 30))
        offset = float(r.choice([0.0, 2.0**20, 1e6 + 0.1]))  # large counters: k0 + n rounds
        starts = offset + np.where(r.random(m) < 0.4, r.integers(0, 60, m).astype(float), r.uniform(0, 60, m))
        lengths = r.integers(1, 40, m)
        ks, vs = switches(r, starts, lengths) if trial % 10 else ([], [])
        mean, last = version_sums(ks, vs, starts, lengths)
        for i in range(m):
            k0, n = float(starts[i]), int(lengths[i])
            runs = token_versions(ks, vs, k0, n, k0 + n)
            assert mean[i] == sum(v * c for v, c in runs) / n and last[i] == runs[-1][0], (trial, i)


def plain_prefill(self, g, now):
    """The pass as the spec states it, an event at its end: what LaneState._fold stands in for."""
    self._set_state(g, now)


@pytest.mark.parametrize("chunk", range(4))
def test_a_folded_prefill_changes_nothing(chunk, monkeypatch):
    """The random lanes, with prefill passes folded and plain: the same trace to the bit and the same events."""
    seeds = SEEDS[chunk::4]
    folded = [outcome("fast", random_inputs(s)) for s in seeds]
    monkeypatch.setattr(ST.LaneState, "_fold", plain_prefill)
    for seed, a in zip(seeds, folded):
        b = outcome("fast", random_inputs(seed))
        assert differences(a, b) == [] and (isinstance(a, str) or a.events == b.events), seed


def test_the_random_lanes_fold_and_unfold(monkeypatch):
    """They reach every path of a folded pass: its end met by the engine's next event, by a publish after it,
    by the last step's start; a publish before its end, and at its end, that unfolds it."""
    seen: Counter = Counter()
    unfold, resume = ST.LaneState._unfold, ST.LaneState._resume

    def unfolding(self, g):
        seen["unfold at the end" if self.publish_at[self.published - 1] == g.resume else "unfold before"] += 1
        unfold(self, g)

    def resuming(self, g):
        seen[{"end_of_round": "by the last step", "publish": "by a publish", "engine_event": "by its next event"}[
            sys._getframe(1).f_code.co_name]] += 1
        resume(self, g)

    monkeypatch.setattr(ST.LaneState, "_unfold", unfolding)
    monkeypatch.setattr(ST.LaneState, "_resume", resuming)
    for seed in SEEDS[:60]:
        outcome("fast", random_inputs(seed))
    assert set(seen) == {"unfold at the end", "unfold before", "by the last step", "by a publish",
                         "by its next event"}, seen


def test_the_decode_step_is_the_roofline_by_hand():
    """One decode step of the 8B shape on an H100 (tests/test_service.py's hand-worked model): 2 x N_ne FLOPs
    a sequence and 4 x layers x d_model a cached token, against the weights and the KV cache read (8 KV heads of
    128, 2 bytes); memory-bound for 256 sequences of 1,500 tokens, and for one; decode_step the same to the
    bit as decode_seconds, of numbers and of arrays."""
    gpu, shape = catalog("gpu")["H100"], catalog("model")["8B"]
    model = Roofline(RMConf(model=RMModelConf(**shape), gpu=GpuConf(**gpu), mfu=0.4, overhead_s=0.005))
    n_ne = model_size(RMModelConf(**shape)).non_embedding
    assert n_ne == 6_979_592_192
    for b, x in ((256, 256 * 1500.0), (1, 100.0), (64, 0.0)):
        compute = (2 * n_ne * b + 4 * 32 * 4096 * x) / (989.5e12 * 0.4)
        memory = (n_ne * 2 + 2 * 32 * 1024 * 2 * x) / 3.35e12
        assert memory > compute
        assert model.decode_step(b, x) == pytest.approx(max(compute, memory) + 0.005, rel=1e-12)
        assert model.decode_step(b, x) == model.decode_seconds(b, x)
    b, x = np.array([1, 64, 256, 4096]), np.array([100.0, 5e4, 384000.0, 1e6])
    many = model.decode_seconds(b, x)
    assert [model.decode_step(int(i), float(j)) for i, j in zip(b, x)] == many.tolist()
    assert math.isclose(many[-1], (2 * n_ne * 4096 + 4 * 32 * 4096 * 1e6) / (989.5e12 * 0.4) + 0.005, rel_tol=1e-12)
