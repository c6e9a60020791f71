"""Asynchronous generation, one lane (racsim/generation/lane.py, state.py, simpy_lane.py; issue 46): the
SimPy engine of record and the fast event loop equal to the bit on random small configurations that reach
every branch; the bookkeeping of versions, instants and time splits; Little's law on the trainer's queue;
token versions against a slow loop in exact arithmetic."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import fields, replace
from fractions import Fraction

import numpy as np
import pytest

from racsim.generation import state as ST
from racsim.generation.lane import LaneInputs, Starved, simulate_lane
from racsim.generation.simpy_lane import simulate_lane_simpy
from racsim.generation.state import floor_diff

ENGINES = {"fast": simulate_lane, "simpy": simulate_lane_simpy}


def random_inputs(seed: int) -> LaneInputs:
    """A small lane drawn from ``seed``: every rule, policy, adoption and gate; half of them with tied
    lengths and constant times (simultaneous events), half with continuous ones."""
    r = np.random.default_rng(seed)
    G, S, E, C = int(r.integers(1, 4)), int(r.integers(1, 4)), int(r.integers(1, 4)), int(r.integers(1, 6))
    steps, n = int(r.integers(2, 9)), 400
    tied = r.random() < 0.5
    prompt, response = r.integers(1, 4 if tied else 60, n), r.integers(1, 4 if tied else 40, (n, S))
    if tied:
        decode, prefill = (lambda b, X: 0.25), (lambda k, s, s2, m: 0.5)
        trainer, sync = np.full(steps, float(r.choice([0.5, 1.0, 2.0]))), float(r.choice([0.0, 0.25, 1.0]))
    else:
        a, c, p0 = r.uniform(0.01, 0.1), r.uniform(0, 1e-3), r.uniform(0, 0.05)
        decode = lambda b, X: a + 0.002 * b + c * X / 100  # noqa: E731
        prefill = lambda k, s, s2, m: p0 + 1e-3 * s + 1e-6 * s2 + 1e-9 * m  # noqa: E731
        trainer, sync = r.uniform(0.1, 3.0, steps), float(r.choice([0.0, r.uniform(0, 1)]))
    gate = str(r.choice(["fast", "all"]))
    channels = ()
    if gate == "all":
        channels = tuple((None if r.random() < 0.3 else int(r.integers(1, 3)),
                          np.where(r.random(n * S) < 0.1, 0.0, r.exponential(1.0, n * S)),
                          None if r.random() < 0.5 else r.random((n, S)) < 0.6) for _ in range(int(r.integers(1, 3))))
    return LaneInputs(steps=steps, groups_per_step=G, group_size=S, engines=E, concurrency=C, prompt=prompt,
                      response=response, decode_seconds=decode, prefill_seconds=prefill, trainer_seconds=trainer,
                      sync_s=sync, admission=str(r.choice(["none", "areal", "verl", "steps_ahead", "sync"])),
                      eta=int(r.integers(0, 3)), staleness=float(r.choice([0.0, 0.5, 1.0])), ahead=int(r.integers(0, 3)),
                      capacity=None if r.random() < 0.4 else G + int(r.integers(0, 4)),
                      full=str(r.choice(["block", "drop_oldest"])),
                      max_lag=None if r.random() < 0.5 else int(r.integers(0, 3)),
                      adoption=str(r.choice(["inflight", "abort", "drain"])), gate=gate, channels=channels)


SEEDS = range(160)


def outcome(engine: str, x: LaneInputs):
    try:
        return ENGINES[engine](x)
    except ValueError as e:  # "more groups needed" (admission none with fast engines): both must say so
        return str(e)


def differences(a, b) -> list:
    if isinstance(a, str) or isinstance(b, str):
        return [] if a == b else [(a, b)]
    out = []
    for f in fields(a):
        if f.name == "events":  # the fast engine's own count
            continue
        u, v = np.asarray(getattr(a, f.name)), np.asarray(getattr(b, f.name))
        if u.shape != v.shape or not np.array_equal(u, v, equal_nan=u.dtype.kind == "f"):
            out.append(f.name)
    return out


@pytest.mark.parametrize("chunk", range(4))
def test_simpy_engine_of_record_equals_the_fast_engine_to_the_bit(chunk):
    for seed in SEEDS[chunk::4]:
        x = random_inputs(seed)
        assert differences(outcome("fast", x), outcome("simpy", x)) == [], (seed, x.admission, x.adoption, x.gate)


def test_the_random_lanes_reach_every_branch():
    """The lanes above take every rule, queue policy (with drops), max_lag drop, adoption (aborts that waste
    tokens, drained engines that sync, in-flight switches inside a sequence), gate (routed and unrouted
    samples, channels with and without workers), idle engines and queues that empty."""
    seen = set()
    for seed in SEEDS:
        x = random_inputs(seed)
        tr = outcome("fast", x)
        if isinstance(tr, str):
            seen.add("more groups")
            continue
        seen |= {x.admission, x.adoption, x.gate}
        if len(tr.dropped):
            seen.add("drop_oldest drops" if x.full == "drop_oldest" and x.max_lag is None else
                     "max_lag drops" if x.capacity is None or x.full == "block" else "drops")
        seen |= {"wasted"} if tr.wasted_tokens else set()
        seen |= {"stalled"} if (tr.engine_time[:, 2] > 0).any() else set()
        seen |= {"idle"} if (tr.engine_time[:, 3] > 0).any() else set()
        seen |= {"split versions"} if (tr.mean_version != np.floor(tr.mean_version)).any() else set()
        seen |= {"queue empties"} if (tr.queue_length[1:] == 0).any() else set()
        for workers, _, routed in x.channels:
            seen.add("no workers" if workers is None else "workers")
            seen.add("every sample routed" if routed is None else "routing")
        if x.gate == "all" and np.isinf(tr.slow_submit).any():
            seen.add("unrouted trained")
    want = {"none", "areal", "verl", "steps_ahead", "sync", "inflight", "abort", "drain", "fast", "all",
            "drop_oldest drops", "max_lag drops", "wasted", "stalled", "idle", "split versions", "queue empties",
            "no workers", "workers", "every sample routed", "routing", "unrouted trained", "more groups"}
    assert want <= seen, want - seen


def check_invariants(x: LaneInputs, tr) -> None:
    G, S, steps = x.groups_per_step, x.group_size, x.steps
    t = np.arange(steps)
    # the trainer: S_t >= E_{t-1}, P_t = S_t + its seconds, E_t = P_t + sync_s
    assert tr.step_start[0] >= 0 and (tr.step_start[1:] >= tr.sync_end[:-1]).all()
    assert np.array_equal(tr.publish, tr.step_start + x.trainer_seconds)
    assert np.array_equal(tr.sync_end, tr.publish + x.sync_s)
    # each trained group once, its samples side by side, lengths as drawn
    groups = tr.group.reshape(steps, G, S)
    assert (groups == groups[..., :1]).all() and len(np.unique(groups[..., 0])) == steps * G
    assert not set(tr.dropped.tolist()) & set(groups[..., 0].ravel().tolist())
    sample = np.arange(steps * G * S).reshape(steps, G * S) % S
    assert np.array_equal(tr.response, x.response[tr.group, sample]) and np.array_equal(tr.prompt, x.prompt[tr.group])
    # versions: 0 <= start <= mean <= last <= t, so head lag >= mean lag >= last lag >= 0
    assert (0 <= tr.start_version).all() and (tr.start_version <= tr.mean_version).all()
    assert (tr.mean_version <= tr.last_version).all() and (tr.last_version <= t[:, None]).all()
    # instants: taken < finished <= its group's queue entry <= the step that trains it
    assert (tr.taken < tr.finished).all() and (tr.finished <= tr.queue_in).all()
    assert (tr.queue_in <= tr.step_start[:, None]).all()
    made = tr.finished.reshape(steps, G, S).max(axis=2).repeat(S, axis=1)
    if x.gate == "fast":
        assert np.array_equal(tr.queue_in, made)
    else:
        sent = np.isfinite(tr.slow_submit)
        assert np.array_equal(np.where(sent, tr.slow_submit, made), np.broadcast_to(made, sent.shape))
        assert (tr.slow_start[sent] >= tr.slow_submit[sent]).all()
        done = np.where(sent, tr.slow_done, -np.inf).max(axis=0).reshape(steps, G, S).max(axis=2).repeat(S, axis=1)
        assert np.array_equal(tr.queue_in, np.maximum(made, done))  # a group enters once its last result is back
    # every engine's time split covers [0, S_{steps-1}]
    assert np.allclose(tr.engine_time.sum(axis=1), tr.step_start[-1], rtol=1e-12, atol=1e-9)
    assert (tr.engine_time >= -1e-12).all()
    assert (np.diff(tr.dropped_at) >= 0).all() and (np.diff(tr.queue_times) > 0).all()
    assert (tr.queue_length >= 0).all()
    if x.adoption != "drain" and x.admission in ("steps_ahead", "sync"):
        # an engine's version is the global one when it takes work: group j starts at a version >= j // G - k
        k = 0 if x.admission == "sync" else x.ahead
        assert (tr.group // G <= tr.start_version + k).all()


@pytest.mark.parametrize("seed", range(0, 160, 8))
def test_bookkeeping_of_versions_instants_and_time(seed):
    for s in range(seed, seed + 8):
        x = random_inputs(s)
        tr = outcome("fast", x)
        if not isinstance(tr, str):
            check_invariants(x, tr)


def test_littles_law_holds_on_the_trainers_queue():
    """Over [a, b] = [S_w, S_{steps-1}]: the queue's time-average length is the groups that were queued in it
    per second times their mean time queued in it (each group's stay clipped to the window), exactly: every
    group's entry, and its exit when taken (S_t) or dropped, against the recorded length timeline."""
    checked = 0
    for seed in range(60):
        x = random_inputs(seed)
        tr = outcome("fast", x)
        if isinstance(tr, str):
            continue
        end = np.full(tr.entered.shape, np.inf)
        taken = tr.group.reshape(x.steps, -1)[:, ::x.group_size]
        end[taken] = np.repeat(tr.step_start[:, None], taken.shape[1], axis=1)
        end[tr.dropped] = tr.dropped_at
        for a, b in ((0.0, tr.step_start[-1]), (tr.step_start[x.steps // 2], tr.step_start[-1])):
            if b <= a:
                continue
            stay = np.clip(np.minimum(end, b) - np.maximum(tr.entered, a), 0.0, None)
            stay = stay[np.isfinite(tr.entered) & (tr.entered <= b)]
            times = np.concatenate([[a], np.clip(tr.queue_times, a, b), [b]])
            before = np.searchsorted(tr.queue_times, a, side="right")
            lengths = np.concatenate([[tr.queue_length[before - 1] if before else 0], tr.queue_length])
            area = float((np.diff(times) * lengths).sum())
            rate, mean_stay = (stay > 0).sum() / (b - a), stay[stay > 0].mean() if (stay > 0).any() else 0.0
            assert area / (b - a) == pytest.approx(rate * mean_stay, rel=1e-9, abs=1e-12), seed
            checked += 1
    assert checked > 50


def token_versions(switch_k: list, switch_v: list, k0: float, n: int, f: float) -> list:
    """The spec's reading of one sequence's token versions, run by run (racsim.generation.state.version_sums sums them):
    (version, tokens) of each run of a sequence's tokens by the policy version that produced them, in order
    (they sum to ``n``): it started decoding at counter ``k0`` and finished at ``f`` = k0 + n (in floats) on an
    engine that adopted version ``switch_v[i]`` with its counter at ``switch_k[i]`` (non-decreasing; before
    the first switch: version 0). Token m < n is produced when the counter reaches k0 + m (exactly), the
    last at f; a token produced when the counter stands at a switch carries the version before it."""
    j0 = bisect_right(switch_k, k0) - 1
    version = switch_v[j0] if j0 >= 0 else 0
    out, before = [], 0
    for idx in range(j0 + 1, bisect_left(switch_k, f)):
        c = min(floor_diff(switch_k[idx], k0), n)
        if c > before:
            out.append((version, c - before))
            before = c
        version = switch_v[idx]
    out.append((version, n - before))
    return out


def versions_by_loop(switch_k, switch_v, k0, n, f):
    """The slow oracle: token m (1..n) at position k0 + m in exact arithmetic (the last at f), its version
    the one adopted at the last switch strictly before it (version 0 before any)."""
    counts: dict = {}
    order = []
    for m in range(1, n + 1):
        pos = Fraction(f) if m == n else Fraction(k0) + m
        v = 0
        for ks, vs in zip(switch_k, switch_v):
            if Fraction(ks) < pos:
                v = vs
        if v not in counts:
            order.append(v)
        counts[v] = counts.get(v, 0) + 1
    return [(v, counts[v]) for v in order]


def test_token_versions_match_a_slow_loop_in_exact_arithmetic():
    r = np.random.default_rng(7)
    for _ in range(400):
        k0 = float(r.choice([0.0, r.uniform(0, 50), float(r.integers(0, 50))]))
        n = int(r.integers(1, 30))
        f = k0 + n
        ks = np.sort(np.concatenate([r.uniform(0, k0 + n + 5, int(r.integers(0, 6))),
                                     k0 + r.integers(0, n + 1, int(r.integers(0, 3)))])).tolist()
        vs = list(range(1, len(ks) + 1))
        got = token_versions(ks, vs, k0, n, f)
        assert got == versions_by_loop(ks, vs, k0, n, f), (ks, k0, n)
        assert sum(c for _, c in got) == n


def test_floor_diff_is_the_exact_floor():
    r = np.random.default_rng(3)
    x = np.concatenate([r.uniform(-5, 60, 500), np.arange(-3, 30, 0.5)])
    for a, b in zip(x, r.permutation(x)):
        assert floor_diff(float(a), float(b)) == (Fraction(float(a)) - Fraction(float(b))).__floor__()


def test_more_groups_needed_and_bad_inputs_are_refused():
    x = replace(random_inputs(1), admission="none", capacity=None, prompt=np.ones(3, dtype=np.int64),
                response=np.ones((3, random_inputs(1).group_size), dtype=np.int64))
    for engine in ENGINES.values():
        with pytest.raises(ValueError, match="more groups needed"):
            engine(x)
    for bad in (dict(capacity=0), dict(trainer_seconds=np.zeros(x.steps)), dict(adoption="later"),
                dict(gate="fast", channels=random_inputs(3).channels or ((None, np.ones(9), None),))):
        with pytest.raises(ValueError):
            simulate_lane(replace(random_inputs(1), **bad))


def test_a_trainer_left_without_groups_is_named_by_both_engines(monkeypatch):
    """No setting known starves the trainer (the checks keep the queue a step at least, drops take groups
    admitted ahead), so admission is shut by hand: both engines say so instead of returning a trace."""
    monkeypatch.setattr(ST.LaneState, "_admissible", lambda self: False)
    for engine in ENGINES.values():
        with pytest.raises(Starved, match="starves at step 0"):
            engine(random_inputs(2))
