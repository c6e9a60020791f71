"""Continuous batching of gpu_rm pools (rm.batching=continuous, rm.chunked_prefill).

1. An independent oracle written here from the specification (README, racsim/pipeline/cbatch.py):
   a per-request event loop that, at each instant once arrivals and completions are in,
   lets every free replica (ascending) run one iteration -- its carried request's rest,
   then waiting requests in order up to the token budget and max_batch, the one over
   the budget split when chunking (else run alone if first) -- gives every request's
   first dispatch and completion, and every iteration, as both engines do, on random
   token lengths, arrivals, pools, orders, with and without chunking; the lanes engine
   on its vectorised FIFO paths (racsim/pipeline/cbatch.py's _chunked_lanes when chunked)
   and on its per-lane event loop.
   The rounds of _chunked_lanes (several iterations of a lane per pass, the exact prefix
   kept) on random FIFO chunked pools built to reach each of their branches: budgets below,
   at and above request lengths, max_batch binding, 1-6 replicas, one or several cycles of
   them a round, arrivals per step or over time, blocking waits; every way a round is cut.
2. A chunk's attention term counts its context: a request's chunks add up to L^2.
3. Engine agreement (lanes vectorised, lanes event loop, SimPy) on the random configs of
   tests/test_gpu_rm.py turned continuous, blocking or not, with timeouts.
4. Bad values are refused naming the key.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from helpers import assert_same_schedule
from test_gpu_rm import MODES, random_pcfg

from racsim.config.defaults import compose_config
from racsim.config.validate import validate
from racsim.errors import ConfigError
from racsim.pipeline import cbatch
from racsim.pipeline.batcher import GpuSpec, _prefix, gpu_spec
from racsim.pipeline.cbatch import chunk_squares, serving_spec
from racsim.pipeline.draws import PipelineDraws, draw
from racsim.pipeline.lanes import run_lanes
from racsim.pipeline.simpy_engine import run_simpy


class AffineService:
    """seconds = overhead + a * tokens + b * squares + c * sequences (packed), so that
    chunking (squares) and batch size both matter."""

    padded = False

    def __init__(self, rng):
        self.o, self.a, self.b, self.c = (float(x) for x in rng.uniform([0.0, 1e-4, 1e-7, 0.0], [0.05, 1e-3, 1e-6, 0.01]))

    def seconds(self, count, tok_sum, sq_sum, max_len):
        return self.o + self.a * np.asarray(tok_sum, dtype=np.float64) + self.b * np.asarray(sq_sum) + self.c * count


def oracle(arrival, tokens, R, max_batch, budget, chunked, order, svc):
    """One lane: ``arrival`` (groups,), ``tokens`` (groups, G). Returns (first dispatch,
    completion) per request, the iterations (replica, start, end, sequences, tokens) and
    how many iterations each request took part in."""
    n_groups, G = tokens.shape
    tok = tokens.ravel()
    first = np.full(tok.size, np.nan)
    done_at = np.full(tok.size, np.inf)
    scored = np.zeros(tok.size)  # tokens of each request scored so far
    pieces = np.zeros(tok.size, dtype=int)  # iterations each request took part in
    busy_until = [-math.inf] * R
    carry = [None] * R  # request whose rest replica r scores next
    queue = []  # waiting requests, in service order
    its = []
    admitted, t = 0, float(arrival[0])
    while True:
        while admitted < n_groups and arrival[admitted] <= t:
            queue += list(range(admitted * G, (admitted + 1) * G))
            admitted += 1
        if order == "shortest":
            queue.sort(key=lambda j: (tok[j], j))
        for r in range(R):
            if busy_until[r] > t or (carry[r] is None and not queue):
                continue
            members, chunks, left = [], [], budget
            if carry[r] is not None:
                members.append(carry[r])
                left -= min(tok[carry[r]] - scored[carry[r]], left)
                carry[r] = None
            while len(members) < max_batch and queue and left > 0:
                need = tok[queue[0]]
                if need > left and members and not chunked:
                    break
                members.append(queue.pop(0))
                left -= min(need, left) if chunked else need
            left = budget
            for j in members:
                size = min(tok[j] - scored[j], left) if chunked else tok[j]
                chunks.append((size, scored[j]))
                left -= size
            sq = sum(s * s + 2 * s * c for s, c in chunks)
            ts = sum(s for s, _ in chunks)
            end = t + float(svc.seconds(np.float64(len(members)), ts, sq, max(s for s, _ in chunks)))
            for j, (size, _) in zip(members, chunks):
                if np.isnan(first[j]):
                    first[j] = t
                scored[j] += size
                pieces[j] += 1
                if scored[j] == tok[j]:
                    done_at[j] = end
                else:
                    carry[r] = j
            busy_until[r] = end
            its.append((r, t, end, len(members), ts))
        nxt = [float(arrival[admitted])] if admitted < n_groups else []
        nxt += [b for b in busy_until if b > t]
        if not nxt:
            break
        t = min(nxt)
    assert np.all(scored == tok) and (chunked or np.all(pieces == 1))
    return first, done_at, sorted(its, key=lambda x: (x[1], x[0])), pieces


def random_case(seed):
    rng = np.random.default_rng(700 + seed)
    lanes, steps, B = 3, int(rng.integers(5, 15)), int(rng.integers(1, 6))
    tokens = np.maximum(np.rint(rng.lognormal(5.5, 0.9, (lanes, steps, B, 1))), 1.0)
    gen = rng.exponential(float(rng.uniform(0.2, 1.5)), (lanes, steps))
    zero = np.zeros((lanes, steps))
    svc = AffineService(rng)
    spec = GpuSpec(replicas=int(rng.integers(1, 4)), max_batch=int(rng.integers(1, 9)),
                   budget=float(rng.integers(100, 1500)), max_wait=0.0, order=["fifo", "shortest"][seed % 2],
                   padded=False, model=svc, seqs=1, chunked=seed % 4 < 2)
    draws = PipelineDraws(phase=np.stack([gen, zero, zero, zero]), service={"g": tokens}, kernel_channels=frozenset(),
                          nominal_step=1.0, workers={"g": None}, max_delay={"g": None}, gpu={"g": spec})
    return draws, spec, tokens


@pytest.mark.parametrize("seed", range(12))
def test_engines_follow_the_oracle_request_by_request(seed):
    draws, spec, tokens = random_case(seed)
    runs = {"lanes": run_lanes(draws, False), "lane loop": run_lanes(draws, False, gpu_loop=True),
            "simpy": run_simpy(draws, False)}
    for name, s in runs.items():
        log = s.gpu_batches["g"]
        for i in range(tokens.shape[0]):
            first, done, its, _ = oracle(s.submit_time[i, :, 0, 0], tokens[i, :, :, 0], spec.replicas,
                                         spec.max_batch, spec.budget, spec.chunked, spec.order, spec.model)
            np.testing.assert_array_equal(s.service_start[i, ..., 0].ravel(), first, err_msg=f"{name} lane {i}")
            np.testing.assert_array_equal(s.completion[i, ..., 0].ravel(), done, err_msg=f"{name} lane {i}")
            mine = log["lane"] == i
            got = list(zip(log["replica"][mine], log["start"][mine], log["end"][mine], log["size"][mine],
                           log["tokens"][mine]))
            assert [tuple(map(float, g)) for g in got] == [tuple(map(float, o)) for o in its], f"{name} lane {i}"


def test_oracle_cases_reach_every_branch():
    seen = dict(chunked=False, unchunked=False, shortest=False, fifo=False, split_over_budget=False,
                split_tail=False, alone_over_budget=False, several_replicas=False, queued=False, full=False)
    for seed in range(12):
        draws, spec, tokens = random_case(seed)
        s = run_lanes(draws, False, gpu_loop=True)
        log = s.gpu_batches["g"]
        seen["chunked" if spec.chunked else "unchunked"] = True
        seen[spec.order] = True
        for i in range(tokens.shape[0]):
            _, _, _, pieces = oracle(s.submit_time[i, :, 0, 0], tokens[i, :, :, 0], spec.replicas, spec.max_batch,
                                     spec.budget, spec.chunked, spec.order, spec.model)
            long = tokens[i].ravel() > spec.budget
            seen["split_over_budget"] |= bool((pieces[long] > 1).any())
            seen["split_tail"] |= bool((pieces[~long] > 1).any())  # fitted the budget, not what was left of it
        seen["alone_over_budget"] |= not spec.chunked and bool((log["tokens"] > spec.budget).any())
        seen["several_replicas"] |= bool((log["replica"] > 0).any())
        seen["queued"] |= bool((s.service_start > s.submit_time).any())
        seen["full"] |= bool((log["size"] == spec.max_batch).any() and spec.max_batch > 1)
    assert all(seen.values()), {k: v for k, v in seen.items() if not v}


def chunked_case(seed):
    """A FIFO chunked pool for the rounds of cbatch._chunked_lanes: the budget below (seeds 0
    mod 3), equal to one of (1 mod 3) or above (2 mod 3) the request lengths, max_batch 1..9
    (binding under the larger budgets), 1..6 replicas, each sample ready at a uniform second
    of its generate phase on odd seeds."""
    rng = np.random.default_rng(900 + seed)
    lanes, steps, B = 4, int(rng.integers(4, 12)), int(rng.integers(1, 7))
    tokens = np.maximum(np.rint(rng.lognormal(5.0, 0.8, (lanes, steps, B, 1))), 1.0)
    budget = [float(rng.integers(20, 120)), float(rng.choice(tokens.ravel())), float(rng.integers(300, 3000))][seed % 3]
    gen = rng.exponential(float(rng.uniform(0.05, 1.0)), (lanes, steps))
    zero = np.zeros((lanes, steps))
    spec = GpuSpec(replicas=int(rng.integers(1, 7)), max_batch=int(rng.integers(1, 10)), budget=budget, max_wait=0.0,
                   order="fifo", padded=False, model=AffineService(rng), seqs=1, chunked=True)
    draws = PipelineDraws(phase=np.stack([gen, zero, zero, zero]), service={"g": tokens}, kernel_channels=frozenset(),
                          nominal_step=1.0, workers={"g": None}, max_delay={"g": None}, gpu={"g": spec})
    if seed % 2:
        draws = replace(draws, offset=gen[..., None] * rng.random((lanes, steps, B)))
    return draws, spec, tokens


def round_cuts(seen):
    """A spy on cbatch._exact: counts rounds kept whole, slots kept past the first cycle, and
    for each cut round the condition that cut it: (a) the start moved, (b) arrivals, (c) order."""
    exact = cbatch._exact

    def spy(H, hn, ha, AE, tau, e, R):
        ok = exact(H, hn, ha, AE, tau, e, R)
        kept = ok.sum(axis=0)
        seen["whole"] += int((kept == ok.shape[0]).sum())
        seen["later cycle"] += int((kept > R).sum())
        for i in np.flatnonzero(kept < ok.shape[0]):
            j = kept[i]
            seen["a start"] += bool(ha[j - 1, i] != H[j, i])
            seen["b arrivals"] += bool(hn[j, i] >= AE[i])
            seen["c order"] += bool(e[max(0, j - R + 1):j, i].min(initial=np.inf) <= tau[j, i])
        return ok
    return spy


@pytest.mark.parametrize("rounds", [1, 8, pytest.param(16, marks=pytest.mark.long), pytest.param(40, marks=pytest.mark.long)])
def test_chunked_rounds_follow_the_oracle(monkeypatch, rounds):
    """The lanes engine's chunked rounds (ROUND slots aimed at: one cycle, ~8, ~16 (the default), ~40) against the
    oracle, request by request and iteration by iteration, asynchronous and blocking, and the
    SimPy engine on the same schedule; every branch of the rounds reached."""
    seen = Counter()
    monkeypatch.setattr(cbatch, "ROUND", rounds)
    monkeypatch.setattr(cbatch, "_exact", round_cuts(seen))
    for seed in range(18):
        draws, spec, tokens = chunked_case(seed)
        for blocking in (False, True):
            s = run_lanes(draws, blocking)
            assert_same_schedule(s, run_simpy(draws, blocking), f"seed {seed} blocking {blocking}")
            log = s.gpu_batches["g"]
            for i in range(tokens.shape[0]):
                ready = s.submit_time[i, ..., 0].ravel()
                order = np.argsort(ready, kind="stable")
                first, done, its, _ = oracle(ready[order], tokens[i].reshape(-1, 1)[order], spec.replicas,
                                             spec.max_batch, spec.budget, True, "fifo", spec.model)
                np.testing.assert_array_equal(s.service_start[i, ..., 0].ravel()[order], first, err_msg=f"{seed} {i}")
                np.testing.assert_array_equal(s.completion[i, ..., 0].ravel()[order], done, err_msg=f"{seed} {i}")
                mine = log["lane"] == i
                got = zip(log["replica"][mine], log["start"][mine], log["end"][mine], log["size"][mine],
                          log["tokens"][mine])
                assert [tuple(map(float, g)) for g in got] == [tuple(map(float, o)) for o in its], f"{seed} {i}"
    need = ["whole", "a start", "b arrivals", "c order"] + (["later cycle"] if rounds > 1 else [])
    assert all(seen[k] > 0 for k in need), seen


def test_chunks_add_up_to_the_unchunked_attention_term():
    rng = np.random.default_rng(3)
    for _ in range(200):
        L = float(rng.integers(1, 5000))
        cuts = np.sort(rng.choice(np.arange(1, L), size=min(int(rng.integers(0, 6)), int(L) - 1), replace=False)) \
            if L > 1 else np.array([])
        edges = np.concatenate([[0.0], cuts, [L]])
        total = sum(chunk_squares(b - a, a) for a, b in zip(edges[:-1], edges[1:]))
        assert total == L * L
        # a chunk's term is its tokens times (its own tokens + twice its context)
        a, b = edges[-2], edges[-1]
        assert chunk_squares(b - a, a) == (b - a) * (b - a) + 2 * (b - a) * a


def continuous(pcfg, seed):
    """The random gpu_rm config of tests/test_gpu_rm.py (shortest-first on odd seeds), every
    pool continuous, chunked on seeds 1, 2 mod 4 (so FIFO and shortest-first both chunk)."""
    for ch in pcfg.channels.values():
        if ch.rm is not None:
            ch.rm.batching, ch.rm.chunked_prefill = "continuous", seed % 4 in (1, 2)
            ch.rm.token_budget = min(ch.rm.token_budget, 900)
    if pcfg.fast_rm is not None:
        pcfg.fast_rm.batching = "continuous"
    return pcfg


@pytest.mark.parametrize("seed", range(8))
def test_engines_agree_with_continuous_batching(seed):
    pcfg = continuous(random_pcfg(seed), seed)
    draws = draw(pcfg, 3, np.random.default_rng(seed))
    assert all(spec.chunked == (seed % 4 in (1, 2)) and not spec.padded for spec in draws.gpu.values())
    for blocking, timeout in MODES:
        sim = run_simpy(draws, blocking, timeout)
        assert_same_schedule(run_lanes(draws, blocking, timeout), sim, f"lanes vs simpy, seed {seed} {blocking} {timeout}")
        assert_same_schedule(run_lanes(draws, blocking, timeout, gpu_loop=True), sim, f"lane loop, seed {seed}")


def test_continuous_without_chunks_is_static_with_no_wait_on_packed_batches():
    """The equivalence cbatch.serving_spec relies on, checked on the whole schedule."""
    pcfg = continuous(random_pcfg(0), 0)
    a = draw(pcfg, 3, np.random.default_rng(1))
    for ch in pcfg.channels.values():
        ch.rm.batching, ch.rm.max_wait_s, ch.rm.padded = "static", 0.0, False
    b = draw(pcfg, 3, np.random.default_rng(1))
    assert_same_schedule(run_lanes(a, False), run_lanes(b, False), "continuous vs static max_wait 0 packed")


def test_serving_spec_is_packed_and_does_not_wait():
    """What the oracle's specs assume of a continuous config: packed (the service model
    too), no waiting to fill, chunked as asked; everything else as the static spec, which
    is left as it was."""
    pcfg = random_pcfg(0)
    rm = pcfg.channels["g"].rm
    rm.padded, rm.max_wait_s = True, 1.0
    static = gpu_spec(rm, "k")
    for chunked in (False, True):
        rm.batching, rm.chunked_prefill = "continuous", chunked
        spec = serving_spec(rm, "k")
        assert (spec.max_wait, spec.padded, spec.model.padded, spec.chunked) == (0.0, False, False, chunked)
        keep = ("replicas", "max_batch", "budget", "order", "seqs")
        assert all(getattr(spec, f) == getattr(static, f) for f in keep)
        x = (np.float64(3), 900.0, 300000.0, 400.0)  # packed: 900 tokens, not 3 x 400 padded
        assert spec.model.seconds(*x) < static.model.seconds(*x)
    assert static.model.padded and static.max_wait == 1.0
    rm.batching, rm.chunked_prefill = "static", False
    back = serving_spec(rm, "k")
    assert (back.max_wait, back.padded, back.model.padded, back.chunked) == (1.0, True, True, False)


@pytest.mark.parametrize("override,key", [
    ("pipeline.channels.judge.rm.batching=dynamic", "pipeline.channels.judge.rm.batching"),
    ("pipeline.channels.judge.rm.chunked_prefill=true", "pipeline.channels.judge.rm.chunked_prefill"),
])
def test_bad_values_are_refused_naming_the_key(override, key):
    cfg = compose_config("channel@pipeline.channels.judge=judge_gpu_rm", override)
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert e.value.key == key


def test_fast_scorer_refuses_chunked_prefill():
    cfg = compose_config("+rm/model@pipeline.fast_rm.model=8b", "+rm/gpu@pipeline.fast_rm.gpu=H100",
                         "pipeline.fast_rm.batching=continuous", "pipeline.fast_rm.chunked_prefill=true")
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert e.value.key == "pipeline.fast_rm.chunked_prefill"


def test_heads_without_the_cap_are_the_capped_ones():
    """With B <= (M - 1) tmin, _heads neither caps the heads at M sequences nor searches for kr: the
    same heads, targets, carries and kr, slot by slot, as the capped searches (tmin forced to 0) on
    random rounds (B on both sides of (M - 1) tmin, lanes that run out of requests within the round,
    carries over the budget)."""
    seen = Counter()
    for seed in range(200):
        rng = np.random.default_rng(seed)
        lanes, N, M, R = 5, int(rng.integers(1, 40)), int(rng.integers(1, 12)), int(rng.integers(1, 5))
        t0 = int(rng.integers(1, 50))
        tok = rng.integers(t0, t0 + [2, 200][seed % 2], (lanes, N)).astype(float)
        B = float(rng.integers(1, (M + 1) * tok.min() + 1))
        tab = cbatch._Tables(tok, *_prefix(tok), B, M)
        h = np.arange(lanes) * (N + 1) + rng.integers(0, N + 1, lanes)
        rest0 = np.where(rng.random((R, lanes)) < 0.5, rng.integers(1, 3 * B + 2, (R, lanes)), 0).astype(float)
        K = R * int(rng.integers(1, 6))
        got = cbatch._heads(tab, B, M, h, rest0, K)
        seen[B <= (M - 1) * tab.tmin] += 1
        tab.tmin = 0.0
        for g, w in zip(got, cbatch._heads(tab, B, M, h, rest0, K)):
            np.testing.assert_array_equal(g, w, err_msg=f"seed {seed}")
    assert seen[True] > 50 and seen[False] > 50, seen
