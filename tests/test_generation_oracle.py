"""Asynchronous generation (issue 46, point 5): closed forms, Little's law, and an independent oracle.

* The closed forms of docs/generation_theory.md (deterministic lengths and times, a decode step
  tau(b) = a + c*b, a constant prefill), each a small function below naming its equation, held
  EXACTLY (to float rounding) by the oracle of tests/generation_oracle.py and by the implementation
  (racsim.generation.lane), on random parameters inside each regime.
* Little's law on the trainer's queue, an identity on any finite window.
* Agreement: a few dozen seeded random small configurations that reach every branch (each
  admission rule, block and drop_oldest, max_lag, inflight / abort / drain, gate fast and all with
  routed and unrouted channels, idle engines, an empty queue) run through both, equal to 1e-9
  relative (integers exactly). Every time in them is a dyadic rational and every decode step a
  power of two, so both sides compute them exactly whatever the order of their sums, and ties (the
  "one instant" rules) happen as they should.

"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import pytest

from generation_oracle import Inputs, simulate
from racsim.generation.lane import LaneInputs, simulate_lane

RTOL = 1e-12  # closed forms: float rounding only
AGREE = 1e-9  # oracle against implementation


def run_lane(inp: Inputs):
    return simulate_lane(LaneInputs(**{f.name: getattr(inp, f.name) for f in dataclasses.fields(inp)}))


SIMULATORS = {"oracle": simulate, "lane": run_lane}


@pytest.fixture(params=sorted(SIMULATORS))
def sim(request):
    return SIMULATORS[request.param]


# ------------------------------------------------------------------------------------------------
# The closed forms (docs/generation_theory.md; equation numbers (G1)... are that page's).


def full_wave(p: float, n: int, tau_c: float) -> float:
    """D = p + N tau(C): one prefill and N decode steps of C sequences (G1)."""
    return p + n * tau_c


def lockstep_generation(batch: int, engines: int, conc: int, p: float, n: int, tau) -> float:
    """The time to generate one batch from idle engines (G3): q full waves of M = E*C sequences, then
    one wave whose busiest engine holds min(C, rho) sequences, B = q*M + rho."""
    q, rho = divmod(batch, engines * conc)
    return q * full_wave(p, n, tau(conc)) + (full_wave(p, n, tau(min(conc, rho))) if rho else 0.0)


def chained_starts(first: float, trainer: np.ndarray, sync: float, gen: float = 0.0) -> np.ndarray:
    """S_0 = first, S_t = S_{t-1} + T_{t-1} + sigma + gen: each step starts ``gen`` seconds after the
    previous one's sync ends (lockstep (G4) with gen = g; the trainer binding (G9) with gen = 0)."""
    starts = [first]
    for t in range(1, len(trainer)):
        starts.append(starts[-1] + trainer[t - 1] + sync + gen)
    return np.array(starts)


def old_tokens(active: float, p: float, n: int, tau_c: float) -> int:
    """Tokens a wave produced before a publish ``active`` seconds of engine time into it (G2):
    min(N, floor(max(0, active - p) / tau(C)))."""
    return min(n, math.floor(max(0.0, active - p) / tau_c))


def engines_bind_waves(trainer: np.ndarray, sync: float, r: int, p: float, n: int, tau_c: float):
    """Engines bind, B = r*M (G2, G5, G6): step starts, and per step and wave of its batch the head, mean
    and last-token lags. Batch t+1's wave u started before the publish of step t if u <= u*,
    u* = ceil(T_t / D) - 1; wave u* has n* old tokens."""
    d = full_wave(p, n, tau_c)
    steps = len(trainer)
    starts = r * d + np.arange(steps) * (r * d + sync)
    head, mean, last = (np.zeros((steps, r)) for _ in range(3))
    for t in range(steps - 1):
        ustar = math.ceil(trainer[t] / d) - 1
        nstar = old_tokens(trainer[t] - ustar * d, p, n, tau_c)
        head[t + 1, : ustar + 1] = 1
        mean[t + 1, :ustar], last[t + 1, :ustar] = 1, 1
        mean[t + 1, ustar], last[t + 1, ustar] = nstar / n, float(nstar == n)
    return starts, head, mean, last


def engines_bind_batches(steps: int, trainer: float, sync: float, m: int, p: float, n: int, tau_c: float):
    """Engines bind, M = m*B (G7-G8): step starts and per step the head, mean and last-token lags.
    Step t = (w+1)m + i trains wave w+1, started at version w*m; n_q old tokens before its q-th
    publish; head lag m + i, mean lag i + sum_q n_q / N, last lag m + i - #{q: n_q < N}."""
    d = full_wave(p, n, tau_c)
    olds = [old_tokens((q + 1) * trainer, p, n, tau_c) for q in range(m)]
    starts, head, mean, last = [], [], [], []
    for t in range(steps):
        w, i = divmod(t, m)
        starts.append(d + w * (d + m * sync) + i * (trainer + sync))
        if t < m:  # wave 0: version 0, no publish during it
            lag = (t, t, t)
        else:
            lag = (m + i, i + sum(olds) / n, m + i - sum(1 for x in olds if x < n))
        for out, x in zip((head, mean, last), lag):
            out.append(x)
    return np.array(starts), np.array(head), np.array(mean), np.array(last)


def ahead_bind(trainer: np.ndarray, sync: float, k: int, batch: int, conc: int, p: float, n: int, tau):
    """The trainer binds under steps_ahead k >= 1 or areal eta = k (G9): S_0 = p + N tau(min(C, (k+1)B)),
    S_t = S_{t-1} + T_{t-1} + sigma; batch t's lag (head = mean = last) is min(t, k)."""
    starts = chained_starts(full_wave(p, n, tau(min(conc, (k + 1) * batch))), trainer, sync)
    return starts, np.minimum(np.arange(len(trainer)), k)


def engine_loads(samples: int, engines: int, conc: int) -> list:
    """Sequences each engine takes when idle engines pull ``samples`` in index order: min(C, ...)."""
    return [min(conc, max(0, samples - e * conc)) for e in range(engines)]


def ahead_engine_time(steps: int, trainer: np.ndarray, sync: float, k: int, batch: int, engines: int, conc: int,
                      p: float, n: int, tau) -> np.ndarray:
    """Each engine's decoding, prefill, stalled and idle seconds on [0, S_{H-1}] (H = ``steps``) when the
    trainer binds (G10): the first wave of (k+1)B samples, then H-2 batches of B, H-1 stalls of sigma."""
    first, rest = engine_loads((k + 1) * batch, engines, conc), engine_loads(batch, engines, conc)
    window = ahead_bind(trainer, sync, k, batch, conc, p, n, tau)[0][-1]
    out = np.zeros((engines, 4))
    for e in range(engines):
        waves = [(first[e], 1), (rest[e], steps - 2)]
        out[e, 0] = sum(count * n * tau(b) for b, count in waves if b)
        out[e, 1] = sum(count * p for b, count in waves if b)
        out[e, 2] = (steps - 1) * sync
        out[e, 3] = window - out[e, :3].sum()
    return out


def verl_groups(s: float, batch: int, size: int) -> int:
    """Groups verl admits per version: g = floor(floor((1 + s) B) / S) (G11)."""
    return math.floor((1 + s) * batch) // size


def verl_lags(steps: int, groups: int, per_version: int) -> np.ndarray:
    """verl's lag of each trained group when the engines keep up (G12): group j, trained at step
    floor(j/G), was admitted at version floor(j/g), so its lag is floor(j/G) - floor(j/g); (steps, G)."""
    j = np.arange(steps * groups).reshape(steps, groups)
    return j // groups - j // per_version


def verl_bound_from(groups: int, per_version: int) -> int:
    """The first step from which every verl step starts at the previous sync's end (G13):
    ceil(G / (g - G)) (g > G)."""
    return -(-groups // (per_version - groups))


def capped_lags(cap: int, groups: int, per_round: int) -> np.ndarray:
    """admission none, queue cap Q with block, the trainer binding (G14): the lag of the group at
    position q of a batch, ceil((l - floor(q/w)) / n), l = ceil(Q/w), n = G/w; their mean is l/n."""
    ell, n = -(-cap // per_round), groups // per_round
    return np.array([-(-(ell - q // per_round) // n) for q in range(groups)])


# ------------------------------------------------------------------------------------------------
# Lanes with deterministic lengths and times.


@dataclasses.dataclass(frozen=True)
class Linear:
    """tau(b, X) = a + c*b: a decode step without a KV-cache term (``of``: the same as a function of b)."""

    a: float
    c: float

    def of(self, b: int) -> float:
        return self.a + self.c * b

    def __call__(self, b: int, x: float) -> float:
        return self.of(b)


def constant_prefill(p: float):
    return lambda k, tok_sum, sq_sum, max_len: p


def det_inputs(*, steps, G, S, E, C, P, N, a, c, p, trainer, sync, n_groups, **rules) -> Inputs:
    return Inputs(steps=steps, groups_per_step=G, group_size=S, engines=E, concurrency=C,
                  prompt=np.full(n_groups, P, dtype=np.int64), response=np.full((n_groups, S), N, dtype=np.int64),
                  decode_seconds=Linear(a, c), prefill_seconds=constant_prefill(p),
                  trainer_seconds=np.asarray(trainer, dtype=np.float64), sync_s=float(sync), **rules)


def lags(trace, steps):
    """Head, mean and last-token lags of every trained sample, (steps, B) each."""
    t = np.arange(steps)[:, None]
    return t - trace.start_version, t - trace.mean_version, t - trace.last_version


def close(actual, expected, label):
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=RTOL, err_msg=label)


def off_integers(x: float) -> bool:
    """Far from a floor's jump, so float rounding cannot move it."""
    return abs(x - round(x)) > 1e-6


def decode_draw(rng):
    """a and c of tau(b) = a + c*b (c = 0 half the time)."""
    return float(rng.uniform(0.01, 0.05)), float(rng.choice([0.0, rng.uniform(0.0, 0.01)]))


@pytest.mark.parametrize("seed", range(6))
def test_lockstep_sync_has_lag_zero_and_steps_of_generation_plus_trainer(sim, seed):
    """(G3, G4) under each adoption, B below, at or above M."""
    rng = np.random.default_rng(seed)
    G, S, E, C = (int(x) for x in rng.integers(1, 4, 4))
    N, P, steps = int(rng.integers(1, 9)), int(rng.integers(1, 20)), int(rng.integers(3, 8))
    a, c = decode_draw(rng)
    p = float(rng.choice([0.0, rng.uniform(0.0, 0.2)]))
    trainer, sync = rng.uniform(0.05, 1.0, steps), float(rng.choice([0.0, rng.uniform(0, 0.3)]))
    adoption = ("inflight", "abort", "drain")[seed % 3]
    tr = sim(det_inputs(steps=steps, G=G, S=S, E=E, C=C, P=P, N=N, a=a, c=c, p=p, trainer=trainer, sync=sync,
                        n_groups=steps * G + 1, admission="sync", adoption=adoption))
    gen = lockstep_generation(G * S, E, C, p, N, Linear(a, c).of)
    close(tr.step_start, chained_starts(gen, trainer, sync, gen), "S_t")
    close(tr.publish, tr.step_start + trainer, "P_t")
    close(tr.sync_end, tr.step_start + trainer + sync, "E_t")
    for lag in lags(tr, steps):
        close(lag, 0.0, "lag")
    assert tr.wasted_tokens == 0 and len(tr.dropped) == 0


def engines_bind_case(seed):
    """Random parameters with B = r*M and max_t T_t <= r*D, the floors of (G2) off their jumps."""
    rng = np.random.default_rng(100 + seed)
    while True:
        E, S, r = int(rng.integers(1, 4)), int(rng.integers(1, 4)), int(rng.integers(1, 4))
        C = S * int(rng.integers(1, 3))  # S | M, so r | G
        G = r * E * C // S
        N, P, steps = int(rng.integers(2, 9)), int(rng.integers(1, 20)), int(rng.integers(3, 7))
        a, c = decode_draw(rng)
        p = float(rng.choice([0.0, rng.uniform(0.0, 0.1)]))
        tau_c, d = a + c * C, p + N * (a + c * C)
        trainer = rng.uniform(0.02, 1.0, steps) * r * d
        ok = all(off_integers(t / d) and off_integers((t - (math.ceil(t / d) - 1) * d - p) / tau_c) for t in trainer)
        if ok:
            return dict(steps=steps, G=G, S=S, E=E, C=C, P=P, N=N, a=a, c=c, p=p, trainer=trainer,
                        sync=float(rng.choice([0.0, rng.uniform(0, 0.5)])), n_groups=(steps + 2) * G), r


@pytest.mark.parametrize("seed", range(6))
def test_engines_bind_one_batch_per_r_waves(sim, seed):
    """(G2, G5, G6), under each rule that does not bind there, and each engine's time split."""
    kw, r = engines_bind_case(seed)
    rules = [dict(), dict(admission="steps_ahead", ahead=1), dict(admission="areal", eta=1),
             dict(max_lag=1), dict(capacity=kw["G"], full="block"), dict(capacity=kw["G"], full="drop_oldest")]
    tr = sim(det_inputs(**kw, **rules[seed % len(rules)]))
    steps, tau_c = kw["steps"], kw["a"] + kw["c"] * kw["C"]
    starts, head, mean, last = engines_bind_waves(kw["trainer"], kw["sync"], r, kw["p"], kw["N"], tau_c)
    close(tr.step_start, starts, "S_t")
    per_wave = kw["G"] * kw["S"] // r  # the batch holds its waves in order, M samples each
    for got, want, name in zip(lags(tr, steps), (head, mean, last), ("head", "mean", "last")):
        close(got, np.repeat(want, per_wave, axis=1), f"{name} lag")
    split = [r * steps * kw["N"] * tau_c, r * steps * kw["p"], (steps - 1) * kw["sync"], 0]
    close(tr.engine_time, np.tile(split, (kw["E"], 1)), "engine time")


@pytest.mark.parametrize("seed", range(4))
def test_engines_bind_m_batches_per_wave(sim, seed):
    """(G7, G8): m batches a wave, m publishes inside each."""
    rng = np.random.default_rng(200 + seed)
    while True:
        S, m, G, E = int(rng.integers(1, 4)), int(rng.integers(2, 4)), int(rng.integers(1, 3)), int(rng.integers(1, 3))
        C = m * G * S // E
        N, P, steps = int(rng.integers(2, 9)), int(rng.integers(1, 20)), m * int(rng.integers(2, 4)) + 1
        a, c = decode_draw(rng)
        p = float(rng.choice([0.0, rng.uniform(0.0, 0.1)]))
        tau_c, sync = a + c * C, float(rng.choice([0.0, rng.uniform(0, 0.5)]))
        trainer = float(rng.uniform(0.05, 0.95) * (p + N * tau_c) / m)
        if (m * G * S) % E == 0 and all(off_integers(((q + 1) * trainer - p) / tau_c) for q in range(m)):
            break
    tr = sim(det_inputs(steps=steps, G=G, S=S, E=E, C=C, P=P, N=N, a=a, c=c, p=p, trainer=np.full(steps, trainer),
                        sync=sync, n_groups=(steps + m + 1) * G))
    starts, head, mean, last = engines_bind_batches(steps, trainer, sync, m, p, N, tau_c)
    close(tr.step_start, starts, "S_t")
    for got, want, name in zip(lags(tr, steps), (head, mean, last), ("head", "mean", "last")):
        close(got, np.repeat(want[:, None], G * S, axis=1), f"{name} lag")


@pytest.mark.parametrize("seed", range(6))
def test_trainer_binds_under_steps_ahead_and_areal(sim, seed):
    """(G9, G10) under each adoption; max_lag = k drops nothing."""
    rng = np.random.default_rng(300 + seed)
    k, G, S = int(rng.integers(1, 4)), int(rng.integers(1, 3)), int(rng.integers(1, 4))
    B, C = G * S, int(rng.integers(1, 5))
    E = -(-(k + 1) * B // C) + int(rng.integers(0, 2))  # M >= (k+1)B
    N, P, steps = int(rng.integers(1, 9)), int(rng.integers(1, 20)), int(rng.integers(k + 2, k + 6))
    a, c = decode_draw(rng)
    p = float(rng.choice([0.0, rng.uniform(0.0, 0.1)]))
    gen_b = p + N * (a + c * min(C, B))
    trainer, sync = gen_b + rng.uniform(0.0, 1.0, steps), float(rng.choice([0.0, rng.uniform(0, 0.5)]))
    rule = dict(admission="steps_ahead", ahead=k) if seed % 2 else dict(admission="areal", eta=k)
    adoption = ("inflight", "abort", "drain")[seed % 3]
    tau = Linear(a, c).of
    tr = sim(det_inputs(steps=steps, G=G, S=S, E=E, C=C, P=P, N=N, a=a, c=c, p=p, trainer=trainer, sync=sync,
                        n_groups=(steps + k + 1) * G, adoption=adoption, max_lag=k, **rule))
    starts, lag = ahead_bind(trainer, sync, k, B, C, p, N, tau)
    close(tr.step_start, starts, "S_t")
    for got in lags(tr, steps):
        close(got, np.repeat(lag[:, None], B, axis=1), "lag")
    close(tr.engine_time, ahead_engine_time(steps, trainer, sync, k, B, E, C, p, N, tau), "engine time")


@pytest.mark.parametrize("seed", range(5))
def test_verl_lag_grows_as_its_admission_count_says(sim, seed):
    """(G11-G13); s = 0 is lockstep (G4)."""
    rng = np.random.default_rng(400 + seed)
    G, S = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    B = G * S
    s = float(rng.choice([0.0, 0.25, 0.5, 1.0, 1.5]))
    g = verl_groups(s, B, S)
    C = int(rng.integers(1, 5))
    E = -(-g * S // C)
    N, P, steps = int(rng.integers(1, 9)), int(rng.integers(1, 20)), int(rng.integers(4, 9))
    a, c = decode_draw(rng)
    p = float(rng.choice([0.0, rng.uniform(0.0, 0.1)]))
    trainer = p + N * (a + c * min(C, g * S)) + rng.uniform(0.0, 1.0, steps)
    sync = float(rng.choice([0.0, rng.uniform(0, 0.5)]))
    tr = sim(det_inputs(steps=steps, G=G, S=S, E=E, C=C, P=P, N=N, a=a, c=c, p=p, trainer=trainer, sync=sync,
                        n_groups=steps * g + g, admission="verl", staleness=s,
                        adoption=("inflight", "drain")[seed % 2]))
    want = np.repeat(verl_lags(steps, G, g), S, axis=1)
    for got in lags(tr, steps):
        close(got, want, "lag")
    if g > G:
        t1 = max(1, verl_bound_from(G, g))
        close(tr.step_start[t1:], tr.sync_end[t1 - 1: -1], "S_t = E_{t-1}")
    else:  # g = G: lockstep
        gen = lockstep_generation(B, E, C, p, N, Linear(a, c).of)
        close(tr.step_start, chained_starts(gen, trainer, sync, gen), "S_t")


@pytest.mark.parametrize("seed", range(5))
def test_a_queue_cap_sets_the_lag_when_the_trainer_binds(sim, seed):
    """(G14) on the last steps of a run long enough to fill the queue (T >= 2nD: the queue gains at
    least a batch a step until full)."""
    rng = np.random.default_rng(500 + seed)
    S, w, n = int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.integers(1, 4))
    G = w * n
    while True:
        E = int(rng.integers(1, 3))
        if (w * S) % E == 0:
            break
    C = w * S // E
    Q = G + int(rng.integers(0, 2 * G + 1))
    N, P = int(rng.integers(1, 6)), int(rng.integers(1, 20))
    a, c = decode_draw(rng)
    p = float(rng.choice([0.0, rng.uniform(0.0, 0.1)]))
    d = p + N * (a + c * C)
    ell = -(-Q // w)
    steps = ell // n + 10
    trainer = 2 * n * d + rng.uniform(0.0, 1.0, steps)
    sync = float(rng.choice([0.0, rng.uniform(0, 0.5)]))
    tr = sim(det_inputs(steps=steps, G=G, S=S, E=E, C=C, P=P, N=N, a=a, c=c, p=p, trainer=trainer, sync=sync,
                        n_groups=4 * steps * G + Q, capacity=Q, full="block"))
    late = slice(steps - 4, steps)
    want = np.repeat(capped_lags(Q, G, w)[None, :], steps, axis=0)
    for got in lags(tr, steps):
        close(got[:, ::S][late], want[late], "lag")
    assert np.mean(want[0]) == pytest.approx(ell / n, rel=RTOL)  # (G14)'s mean
    close(tr.step_start[late], tr.sync_end[steps - 5: -1], "S_t = E_{t-1}")


# ------------------------------------------------------------------------------------------------
# Random small configurations, dyadic throughout.

ADMISSIONS = ("none", "areal", "verl", "steps_ahead", "sync")
ADOPTIONS = ("inflight", "abort", "drain")
CASES = 48
POOL = 4000  # groups drawn for every case (more than any admits)


def dyadic_decode(kind: str, threshold: int):
    """A decode step that is a power of two: flat; by batch size; by the KV cache's tokens X: a step up
    past a threshold, or a step that jumps between two values as X grows by any count (the
    golden-ratio rotation of X), so that where an engine's decode interval begins, and what X
    counts, show in the times."""
    if kind == "flat":
        return lambda b, x: 0.125
    if kind == "batch":
        return lambda b, x: 0.0625 if b <= 2 else 0.125
    if kind == "kv":
        return lambda b, x: 0.0625 if x < threshold else 0.125
    return lambda b, x: 0.0625 if (x * 0.6180339887498949) % 1 < 0.5 else 0.125


def dyadic_prefill(kind: str):
    """A prefill pass of dyadic seconds: none, constant, by the tokens packed, or padded to the longest."""
    return {"zero": lambda k, tok, sq, mx: 0.0,
            "constant": lambda k, tok, sq, mx: 0.25,
            "packed": lambda k, tok, sq, mx: tok / 32,
            "padded": lambda k, tok, sq, mx: k * mx / 64}[kind]


def agreement_case(i: int) -> Inputs:
    """Case i: the rule, adoption, gate and queue cycle with i (every pair of rule and adoption in each
    15 cases, each gate with each of them in 30), the rest drawn from seed i."""
    rng = np.random.default_rng(7000 + i)
    admission, adoption = ADMISSIONS[i % 5], ADOPTIONS[i % 3]
    gate = ("fast", "all")[(i // 15) % 2] if i < 30 else ("fast", "all")[i % 2]
    G, S, E = (int(x) for x in rng.integers(1, 4, 3))
    C, steps = int(rng.integers(1, 6)), int(rng.integers(3, 8))
    queue = (i // 3) % 3
    capacity = None if queue == 0 else G + int(rng.integers(0, G + 1))
    full = "drop_oldest" if queue == 2 else "block"
    ahead = int(rng.integers(0, 3))
    max_lag = None
    if i % 4 == 1:
        if admission == "steps_ahead":
            max_lag = ahead  # below the rule's own cap, its drops could starve the trainer for good
        elif admission in ("areal", "sync") or (admission == "none" and gate == "fast"):
            # (none under gate all: a slow channel's backlog can outlast every group's max_lag)
            max_lag = int(rng.integers(0, 3))
    decode = ("flat", "batch", "kv", "rotation", "rotation")[int(rng.integers(0, 5))]
    channels = ()
    if gate == "all":
        channels = tuple(
            (None if rng.random() < 0.4 else int(rng.integers(1, 3)), rng.integers(0, 17, POOL * S) / 8,
             None if rng.random() < 0.5 else rng.random((POOL, S)) < 0.6)
            for _ in range(int(rng.integers(1, 3))))
    return Inputs(
        steps=steps, groups_per_step=G, group_size=S, engines=E, concurrency=C,
        prompt=rng.integers(1, 9, POOL), response=rng.integers(1, 7, (POOL, S)),
        decode_seconds=dyadic_decode(decode, int(rng.integers(8, 40))),
        prefill_seconds=dyadic_prefill(("zero", "constant", "packed", "padded")[int(rng.integers(0, 4))]),
        trainer_seconds=rng.integers(1, 17, steps) / 8, sync_s=float(rng.choice([0, 0, 1, 2])) / 8,
        admission=admission, eta=int(rng.integers(0, 3)), staleness=float(rng.choice([0.0, 0.5, 1.0])),
        ahead=ahead, capacity=capacity, full=full, max_lag=max_lag, adoption=adoption, gate=gate,
        channels=channels)


@functools.lru_cache(maxsize=None)
def oracle_case(i: int):
    return simulate(agreement_case(i))


def queue_steps(times, lengths):
    """The queue's length as a step function: one row per instant whose closing length differs from
    the length before it (rows at one instant: the last; the length before time 0 is 0)."""
    last = {}
    for t, n in zip(np.asarray(times, dtype=float), np.asarray(lengths)):
        last[float(t)] = int(n)
    rows, before = [], 0
    for t in sorted(last):
        if last[t] != before:
            rows.append((t, last[t]))
            before = last[t]
    return rows


FLOATS = ("step_start", "publish", "sync_end", "mean_version", "taken", "finished", "queue_in",
          "slow_submit", "slow_start", "slow_done", "dropped_at", "engine_time")
INTS = ("group", "start_version", "last_version", "prompt", "response", "dropped")


def differences(want, got) -> list:
    """What differs between two traces: floats to AGREE relative, integers exactly, the queue as a step function."""
    out = []
    for name in FLOATS:
        a, b = np.asarray(getattr(want, name), dtype=float), np.asarray(getattr(got, name), dtype=float)
        scale = max(1.0, float(np.max(np.abs(a[np.isfinite(a)]), initial=0.0)))
        if a.shape != b.shape or not np.allclose(a, b, rtol=AGREE, atol=AGREE * scale):
            out.append(f"{name}: oracle {a.tolist()} lane {b.tolist()}")
    for name in INTS:
        a, b = np.asarray(getattr(want, name)), np.asarray(getattr(got, name))
        if a.shape != b.shape or not np.array_equal(a, b):
            out.append(f"{name}: oracle {a.tolist()} lane {b.tolist()}")
    qa, qb = queue_steps(want.queue_times, want.queue_length), queue_steps(got.queue_times, got.queue_length)
    if len(qa) != len(qb) or any(x[1] != y[1] or not math.isclose(x[0], y[0], rel_tol=AGREE) for x, y in zip(qa, qb)):
        out.append(f"queue length: oracle {qa} lane {qb}")
    for name in ("wasted_tokens", "groups_admitted"):
        if int(getattr(want, name)) != int(getattr(got, name)):
            out.append(f"{name}: oracle {getattr(want, name)} lane {getattr(got, name)}")
    return out


def describe(inp: Inputs) -> str:
    keys = ("steps", "groups_per_step", "group_size", "engines", "concurrency", "sync_s", "admission", "eta",
            "staleness", "ahead", "capacity", "full", "max_lag", "adoption", "gate")
    return " ".join(f"{k}={getattr(inp, k)}" for k in keys)


@pytest.mark.parametrize("case", range(CASES))
def test_the_implementation_agrees_with_the_oracle(case):
    inp = agreement_case(case)
    got = run_lane(inp)
    diff = differences(oracle_case(case), got)
    assert not diff, describe(inp) + "\n" + "\n".join(diff)


def test_the_random_configurations_reach_every_branch():
    """Each rule with each adoption, each gate, block and drop_oldest each binding, max_lag drops,
    aborts that waste tokens, samples split between versions, drain adoption holding an engine
    back, routed and unrouted samples on bounded and unbounded channels, idle engines, an empty
    queue after a full one: all happen somewhere among the cases."""
    seen = set()
    for case in range(CASES):
        inp, tr = agreement_case(case), oracle_case(case)
        seen.add((inp.admission, inp.adoption))
        seen.add(("gate", inp.gate, inp.adoption))
        rows = queue_steps(tr.queue_times, tr.queue_length)
        if inp.full == "drop_oldest" and len(tr.dropped):
            seen.add("drop_oldest drops")
        if inp.full == "block" and inp.capacity is not None and any(n >= inp.capacity for _, n in rows):
            seen.add("block reaches its cap")
        if inp.max_lag is not None and inp.full == "block" and len(tr.dropped):
            seen.add("max_lag drops")
        if tr.wasted_tokens > 0:
            seen.add("abort wastes tokens")
        if np.any(tr.mean_version != tr.start_version):
            seen.add("samples of several versions")
        if inp.adoption == "drain" and np.any(tr.start_version < np.arange(inp.steps)[:, None] - 1):
            seen.add("drain lags")
        for workers, _, routed in inp.channels:
            seen.add(("channel", workers is None, routed is None))
        if inp.gate == "all" and np.any(np.isinf(tr.slow_done)):
            seen.add("unrouted samples")
        if np.any(tr.engine_time[:, 3] > 0):
            seen.add("idle engines")
        if any(n == 0 for _, n in rows[1:]) and any(n >= 2 * inp.groups_per_step for _, n in rows):
            seen.add("queue empties")
        if np.any(tr.prompt != tr.prompt[0, 0]) and inp.prefill_seconds(2, 3.0, 5.0, 2.0) != 0.25:
            seen.add("prefill by tokens")
    want = {(a, d) for a in ADMISSIONS for d in ADOPTIONS}
    want |= {("gate", g, d) for g in ("fast", "all") for d in ADOPTIONS}
    want |= {("channel", a, b) for a in (True, False) for b in (True, False)}
    want |= {"drop_oldest drops", "block reaches its cap", "max_lag drops", "abort wastes tokens",
             "samples of several versions", "drain lags", "unrouted samples", "idle engines", "queue empties",
             "prefill by tokens"}
    assert want <= seen, sorted(map(str, want - seen))


# ------------------------------------------------------------------------------------------------
# Little's law and the identities every trace keeps.


def queue_area(rows, end: float) -> float:
    """The integral of the queue's length over [0, end], from its step function."""
    area, before, at = 0.0, 0, 0.0
    for t, n in rows:
        if t > end:
            break
        area += before * (t - at)
        before, at = n, t
    return area + before * (end - at)


@pytest.mark.parametrize("case", range(CASES))
def test_littles_law_on_the_trainer_queue(case):
    """On [0, S_last]: time-average queue length = entry rate x mean sojourn (sojourns cut at the
    window's end), the left side from the queue's length record, the right from each group's entry
    and exit: an identity of any finite window."""
    tr = oracle_case(case)
    end = float(tr.step_start[-1])
    sojourns = [(end if out is None else out) - entry for _, entry, out in tr.queue_log]
    assert all(s >= 0 for s in sojourns)
    mean_length = queue_area(queue_steps(tr.queue_times, tr.queue_length), end) / end
    rate = len(sojourns) / end
    assert mean_length == pytest.approx(rate * np.mean(sojourns) if sojourns else 0.0, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("case", range(0, CASES, 3))
def test_littles_law_where_the_queue_empties(sim, case):
    """From a trace alone: at each step start after which the queue is empty, with no group dropped
    before it, the queue's area equals the sum of the sojourns of the groups trained so far."""
    inp = agreement_case(case)
    tr = sim(inp)
    rows = queue_steps(tr.queue_times, tr.queue_length)
    for t, start in enumerate(tr.step_start):
        length = ([n for at, n in rows if at <= start] or [0])[-1]
        if length == 0 and not np.any(np.asarray(tr.dropped_at) <= start):
            sojourns = tr.step_start[: t + 1, None] - tr.queue_in[: t + 1, :: inp.group_size]
            assert queue_area(rows, float(start)) == pytest.approx(sojourns.sum(), rel=1e-9, abs=1e-9), t


@pytest.mark.parametrize("case", range(CASES))
def test_every_trace_keeps_the_model_identities(sim, case):
    inp = agreement_case(case)
    tr = sim(inp)
    T, G, S = inp.steps, inp.groups_per_step, inp.group_size
    t = np.arange(T)[:, None]
    end = tr.step_start[-1]
    close(tr.engine_time.sum(axis=1), end, "an engine's time splits [0, S_last]")
    assert np.all(tr.engine_time >= 0)
    close(tr.publish, tr.step_start + inp.trainer_seconds, "P_t")
    close(tr.sync_end, tr.publish + inp.sync_s, "E_t")
    assert np.all(tr.step_start[1:] >= tr.sync_end[:-1])
    assert np.all(tr.taken < tr.finished) and np.all(tr.finished <= tr.queue_in)
    assert np.all(tr.queue_in <= tr.step_start[:, None])
    assert np.all(tr.start_version <= tr.mean_version + 1e-12) and np.all(tr.mean_version <= tr.last_version + 1e-12)
    assert np.all(tr.last_version <= t)
    if inp.adoption != "inflight":
        assert np.array_equal(tr.start_version, tr.last_version)
    groups = tr.group.reshape(T, G, S)
    assert np.all(groups == groups[:, :, :1])
    trained = groups[:, :, 0].ravel().tolist()
    assert len(set(trained) | set(tr.dropped.tolist())) == len(trained) + len(tr.dropped)
    assert np.array_equal(tr.prompt, inp.prompt[tr.group])
    assert np.array_equal(tr.response, inp.response[tr.group, np.arange(S * G) % S])
    head = t - tr.start_version.reshape(T, G, S).min(axis=2)
    if inp.max_lag is not None:
        assert np.all(head <= inp.max_lag)
    if inp.capacity is not None and inp.full == "drop_oldest":
        assert all(n <= inp.capacity for _, n in queue_steps(tr.queue_times, tr.queue_length))
    assert tr.groups_admitted >= len(trained) + len(tr.dropped)
    if inp.gate == "all":
        generated = tr.finished.reshape(T, G, S).max(axis=2)
        done = np.where(np.isfinite(tr.slow_done), tr.slow_done, -np.inf).reshape(-1, T, G, S).max(axis=(0, 3))
        close(tr.queue_in[:, ::S], np.maximum(generated, done), "a gate-all group enters with its last result")
        routed = np.isfinite(tr.slow_submit)
        close(tr.slow_submit[routed], np.broadcast_to(np.repeat(generated, S, axis=1), tr.slow_submit.shape)[routed],
              "submitted when generated")
        assert np.all(tr.slow_start[routed] >= tr.slow_submit[routed])
        assert np.all(tr.slow_done[routed] >= tr.slow_start[routed])
    else:
        assert tr.slow_done.shape[0] == 0
        close(tr.queue_in, np.repeat(tr.finished.reshape(T, G, S).max(axis=2), S, axis=1), "gate fast")


# ------------------------------------------------------------------------------------------------
# One instant at a time: tiny lanes worked out by hand, one per reading of the spec where it leaves
# a choice (docs/generation_theory.md lists them); each docstring says the reading and what the
# other one would give, so that a disagreement names the rule to settle.


def tiny(responses, *, steps, trainer, sync, G=1, S=1, E=1, C=2, decode=None, prompt=4, **rules) -> Inputs:
    n = len(responses) // S
    return Inputs(steps=steps, groups_per_step=G, group_size=S, engines=E, concurrency=C,
                  prompt=np.full(n, prompt, dtype=np.int64),
                  response=np.array(responses, dtype=np.int64).reshape(n, S),
                  decode_seconds=decode or (lambda b, x: 0.25), prefill_seconds=lambda k, tok, sq, mx: 0.0,
                  trainer_seconds=np.full(steps, float(trainer)), sync_s=float(sync), **rules)


def test_a_completion_due_at_a_publish_happens_at_that_instant(sim):
    """One engine, C = 2, tau 0.25 s. Groups 0 (2 tokens) and 1 (4 tokens) start at 0; group 0 ends at
    0.5, step 0 runs from 0.5 and publishes at 1.0, when group 1's counter reaches its end: group 1 is
    finished at 1.0 (the stall that begins then does not hold it to E_0 = 1.5, which would make its
    finished and queue_in 1.5). Group 2, taken at 0.5, made 2 of its 4 tokens by then."""
    tr = sim(tiny([2, 4, 4] + [1] * 7, steps=2, trainer=0.5, sync=0.5))
    close(tr.step_start, [0.5, 1.5], "S_t")
    assert tr.group.ravel().tolist() == [0, 1]
    close(tr.finished.ravel(), [0.5, 1.0], "finished")
    close(tr.queue_in.ravel(), [0.5, 1.0], "queue_in")
    close(tr.engine_time, [[1.0, 0.0, 0.5, 0.0]], "engine time")


def test_the_token_at_an_inflight_adoption_instant_is_the_old_versions(sim):
    """sync_s = 0: step 0 publishes and syncs at 0.75, the instant groups 1 (3 tokens from 0) and 2
    (2 tokens from 0.25) produce their last tokens: every token is version 0 (counting those as
    version 1 would give group 1 mean 1/3 and group 2 mean 1/2, last version 1)."""
    tr = sim(tiny([1, 3, 2] + [1] * 7, steps=3, trainer=0.5, sync=0.0))
    close(tr.step_start, [0.25, 0.75, 1.25], "S_t")
    assert tr.group.ravel().tolist() == [0, 1, 2]
    assert tr.start_version.ravel().tolist() == [0, 0, 0] and tr.last_version.ravel().tolist() == [0, 0, 0]
    close(tr.mean_version.ravel(), [0, 0, 0], "mean version")


def test_abort_at_a_zero_second_sync_aborts_a_sequence_ending_then(sim):
    """The lane above under abort: at 0.75 = P_0 = E_0 the aborts (step 1) come before the completions
    (step 2), so groups 1 and 2 are aborted with all their 3 + 2 tokens, restart at 0.75 with
    version 1 and end at 1.5 and 1.25; at 1.75 groups 4 and 5, due then, are aborted too (7 tokens
    wasted). Sparing sequences that end at the sync would waste none and start step 1 at 0.75."""
    tr = sim(tiny([1, 3, 2] + [1] * 7, steps=3, trainer=0.5, sync=0.0, adoption="abort"))
    close(tr.step_start, [0.25, 1.25, 1.75], "S_t")
    assert tr.group.ravel().tolist() == [0, 2, 1]
    assert tr.start_version.ravel().tolist() == [0, 1, 1]
    close(tr.taken.ravel(), [0.0, 0.75, 0.75], "taken")
    close(tr.finished.ravel(), [0.25, 1.25, 1.5], "finished")
    assert tr.wasted_tokens == 7


def test_a_decode_interval_ends_at_the_engines_own_events_only(sim):
    """tau(b, X) = 0.125 s while X < 6 else 0.0625 s. Engine 0 decodes group 0 (prompt 4, 8 tokens)
    from 0 with X = 4: it ends at 1.0. Engine 1's completion and step 0's start at 0.25 (X would read
    6 then) are not engine 0's events; re-reading tau there would end group 0 at 0.625."""
    decode = lambda b, x: 0.125 if x < 6 else 0.0625  # noqa: E731
    tr = sim(tiny([8, 2] + [1] * 8, steps=2, trainer=2.0, sync=0.0, E=2, C=1, decode=decode,
                  admission="steps_ahead", ahead=1))
    close(tr.step_start, [0.25, 2.25], "S_t")
    assert tr.group.ravel().tolist() == [1, 0]
    close(tr.finished.ravel(), [0.25, 1.0], "finished")
    close(tr.engine_time, [[1.0, 0.0, 0.0, 1.25], [0.25, 0.0, 0.0, 2.0]], "engine time")


def test_a_stall_ends_a_decode_interval(sim):
    """In flight, tau(b, X) = 0.25 s while X < 6 else 0.125 s, prompts of 4. Engine 1 decodes group 1
    (8 tokens) from 0; step 0 publishes at 0.6875 (counter 2.75: 2 tokens made, X = 6) and syncs
    until 0.9375. The decode resumes in a new interval, tau read again: 6 tokens of version 1 at
    0.125 s, done at 1.59375 (resuming at the old 0.25 s would end it at 2.5 and start step 2 then)."""
    decode = lambda b, x: 0.25 if x < 6 else 0.125  # noqa: E731
    tr = sim(tiny([1, 8, 1] + [1] * 7, steps=3, trainer=0.4375, sync=0.25, E=2, C=1, decode=decode,
                  admission="steps_ahead", ahead=1))
    close(tr.step_start, [0.25, 1.1875, 1.875], "S_t")
    assert tr.group.ravel().tolist() == [0, 2, 1]
    close(tr.finished.ravel(), [0.25, 1.1875, 1.59375], "finished")
    close(tr.mean_version.ravel(), [0, 1, 0.75], "mean version")
    assert tr.start_version.ravel().tolist() == [0, 1, 0] and tr.last_version.ravel().tolist() == [0, 1, 1]
    close(tr.engine_time, [[0.5, 0.0, 0.5, 0.875], [1.34375, 0.0, 0.5, 0.03125]], "engine time")


def test_the_kv_term_counts_whole_tokens(sim):
    """tau(b, X) = 0.25 s while X < 10.5 else 0.125 s, prompts of 4. Group 1 (8 tokens) decodes from 0;
    at E_0 = 0.625 its counter reads 2.5 and group 2 joins it: X = 4 + 2 + 4 = 10 (whole tokens), so
    group 2's one token takes 0.25 s and step 1 starts at 0.875 (0.75 if X counted 2.5 tokens)."""
    decode = lambda b, x: 0.25 if x < 10.5 else 0.125  # noqa: E731
    tr = sim(tiny([1, 8, 1] + [1] * 7, steps=2, trainer=0.375, sync=0.0, C=2, decode=decode,
                  admission="steps_ahead", ahead=1))
    close(tr.step_start, [0.25, 0.875], "S_t")
    assert tr.group.ravel().tolist() == [0, 2] and tr.start_version.ravel().tolist() == [0, 1]
    close(tr.taken.ravel(), [0.0, 0.625], "taken")


def test_drain_a_publish_is_no_event_of_a_decoding_engine(sim):
    """Drain, tau(b, X) = 0.25 s while X < 6 else 0.125 s. Engine 1 decodes group 1 (prompt 4, 8 tokens)
    from 0 and is still at it when step 0 publishes at 0.75 (X would read 7): it goes on at 0.25 s a
    token and ends at 2.0 (1.375 if the publish began a new decode interval). Engine 0 drains at once
    at each publish, stalls sync_s = 0.25 s, adopts, and takes group 2 at 1.0."""
    decode = lambda b, x: 0.25 if x < 6 else 0.125  # noqa: E731
    tr = sim(tiny([1, 8, 1] + [1] * 7, steps=3, trainer=0.5, sync=0.25, E=2, C=1, decode=decode,
                  admission="steps_ahead", ahead=1, adoption="drain"))
    close(tr.step_start, [0.25, 1.25, 2.0], "S_t")
    assert tr.group.ravel().tolist() == [0, 2, 1] and tr.start_version.ravel().tolist() == [0, 1, 0]
    close(tr.finished.ravel(), [0.25, 1.25, 2.0], "finished")
    close(tr.engine_time, [[0.5, 0.0, 0.5, 1.0], [2.0, 0.0, 0.0, 0.0]], "engine time")


def test_an_unrouted_sample_takes_no_service_draw(sim):
    """Gate all, one unbounded channel with service draws 1, 2, 3, ... s; group 0's sample 0 is not
    routed, its sample 1 is: sample 1 is the channel's first job (1 s), so the group enters at 1.25
    (2.25 if sample 0 used up a draw)."""
    routed = np.ones((10, 2), dtype=bool)
    routed[0, 0] = False
    tr = sim(tiny([1] * 20, steps=1, trainer=1.0, sync=0.0, S=2, gate="all",
                  channels=((None, np.arange(1.0, 21.0), routed),)))
    close(tr.step_start, [1.25], "S_0")
    close(tr.slow_submit[0], [[np.inf, 0.25]], "submit")
    close(tr.slow_start[0], [[np.inf, 0.25]], "service start")
    close(tr.slow_done[0], [[np.inf, 1.25]], "done")
    close(tr.queue_in, [[1.25, 1.25]], "queue_in")


def test_the_lane_stops_before_the_pulls_of_the_last_steps_instant(sim):
    """One engine, C = 1: group 0 ends at 0.25, when the only step starts; the engine's pull at that
    instant is not simulated (groups_admitted 1, not 2)."""
    tr = sim(tiny([1] * 4, steps=1, trainer=1.0, sync=0.0, C=1))
    close(tr.step_start, [0.25], "S_0")
    assert tr.groups_admitted == 1


def test_too_few_groups_is_an_error(sim):
    with pytest.raises(ValueError, match="more groups needed"):
        sim(tiny([1, 1], steps=3, trainer=1.0, sync=0.0))
