"""The GPU batcher (channel kind gpu_rm) against an independent oracle.

The engine-agreement tests of tests/test_gpu_rm.py compare two engines that share
racsim's batcher code, so a wrong rule there passes both. :class:`Oracle` is a
second batcher written from the specification only (the docstrings of
``RMConf`` and of racsim/pipeline/batcher.py), a slow per-request event loop that
uses nothing of racsim's batcher or engines (this module imports them only to
run the engines and hand them the configuration, a ``GpuSpec``):

* a step's group of ``batch x sequences_per_sample`` requests arrives when the
  optimizer submits it (after generate, fast_score and submit); a blocking
  optimizer then waits until the group's last sequence is scored (or its wait
  times out), updates, and starts the next step;
* a batch holds at most ``max_batch`` requests and ``budget`` tokens, billed as
  count x longest (padded) or the sum (packed); a request alone may exceed it;
* requests are taken in FIFO order (arrival, then index) or shortest first
  (by tokens, then index);
* a batch leaves when it is full (``max_batch`` requests, or the next request
  in order does not fit) or once the oldest waiting request has waited
  ``max_wait`` seconds, on an idle replica, the lowest-numbered first;
* everything that happens at one instant (arrivals, replicas falling free) is
  applied before the batcher decides;
* a sample's result is back when all its sequences are scored.

Every phase duration is a multiple of 1/64 s, every token count an integer and
the service time linear in the billed tokens at a power-of-two rate (so a
multiple of 1/256 s): all arithmetic is exact, whatever the order of the sums,
so the comparison is to the bit, and ties between arrivals, deadlines and
completions happen, as they should for a test of "one instant". The engines'
per-request dispatch and completion times are caught where they hand them to
``_per_sample``.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

import racsim.pipeline.lanes as lanes_mod
import racsim.pipeline.simpy_engine as simpy_mod
from racsim.pipeline.batcher import GpuSpec
from racsim.pipeline.draws import PipelineDraws
from racsim.pipeline.lanes import run_lanes
from racsim.pipeline.simpy_engine import run_simpy


class LinearTokens:
    """A ServiceModel-like service time: ``base + billed tokens / rate`` (see racsim/pipeline/service.py)."""

    def __init__(self, base: float, rate: float, padded: bool):
        self.base, self.rate, self.padded = base, rate, padded

    def seconds(self, count, tok_sum, sq_sum, max_len):
        billed = count * max_len if self.padded else tok_sum
        return self.base + np.asarray(billed, dtype=np.float64) / self.rate


# ----------------------------------------------------------------------------
# The oracle.


class Oracle:
    """One trial's gpu_rm channel, request by request.

    ``tokens``: (steps, G) token counts, a step's G requests numbered t * G + i;
    ``phases``: (4, steps) generate, fast_score, submit, update seconds. After
    :meth:`run`: ``arrival`` (steps,), ``step_start`` (steps + 1,), per request
    ``disp``/``comp`` and ``batch_of``, and ``batches``: (replica, start, end,
    size, billed tokens, step of the oldest request, why it left, arrival of the
    oldest request waiting when it left).
    """

    def __init__(self, tokens, phases, *, replicas, max_batch, budget, max_wait, order, padded, service,
                 blocking=False, timeout=None):
        self.steps, self.G = tokens.shape
        self.tok = [int(x) for x in tokens.ravel()]
        self.gen, self.fast, self.sub, self.upd = ([float(x) for x in row] for row in phases)
        self.replicas, self.max_batch, self.budget, self.max_wait = replicas, max_batch, budget, max_wait
        self.order, self.padded, self.service = order, padded, service
        self.blocking, self.timeout = blocking, timeout
        n = self.steps * self.G
        self.disp = [math.nan] * n
        self.comp = [math.inf] * n
        self.batch_of = [-1] * n
        self.arrival: list = []
        self.busy_until = [-math.inf] * replicas
        self.waiting: list = []  # request numbers not dispatched yet
        self.batches: list = []
        self.now = -math.inf

    # -- the optimizer --------------------------------------------------------

    def step_start(self, t: int):
        """When step t begins; None while that is not known yet."""
        if t == 0:
            return 0.0
        if t > len(self.arrival):
            return None
        a = self.arrival[t - 1]
        if not self.blocking:
            resumed = a
        else:
            group = range((t - 1) * self.G, t * self.G)
            if all(not math.isnan(self.disp[j]) for j in group):
                resumed = max(a, max(self.comp[j] for j in group))
                if self.timeout is not None:
                    resumed = min(resumed, a + self.timeout)
            elif self.timeout is not None and self.now >= a + self.timeout:
                resumed = a + self.timeout
            else:
                return None
        return resumed + self.upd[t - 1]

    def next_arrival(self):
        """(time of the next group's arrival or None, the instant the blocking wait times out or None)."""
        t = len(self.arrival)
        if t == self.steps:
            return None, None
        s = self.step_start(t)
        if s is None:
            return None, (self.arrival[t - 1] + self.timeout if self.timeout is not None else None)
        return s + self.gen[t] + self.fast[t] + self.sub[t], None

    # -- the batcher ----------------------------------------------------------

    def arrived(self, j: int) -> float:
        return self.arrival[j // self.G]

    def in_order(self) -> list:
        if self.order == "fifo":
            return sorted(self.waiting, key=lambda j: (self.arrived(j), j))
        return sorted(self.waiting, key=lambda j: (self.tok[j], j))

    def cost(self, batch) -> int:
        if self.padded:
            return len(batch) * max(self.tok[j] for j in batch)
        return sum(self.tok[j] for j in batch)

    def candidate(self):
        """The batch that would leave now, and whether it is full (why it is)."""
        batch = []
        for j in self.in_order():
            if len(batch) == self.max_batch:
                return batch, "size"
            if batch and self.cost(batch + [j]) > self.budget:
                return batch, "budget"
            batch.append(j)
        return batch, ("size" if len(batch) == self.max_batch else None)

    def deadline_passed(self, tau: float) -> bool:
        return min(self.arrived(j) for j in self.waiting) + self.max_wait <= tau

    def idle_replica(self, tau: float):
        idle = [r for r in range(self.replicas) if self.busy_until[r] <= tau]
        return idle[0] if idle else None

    def decide(self, tau: float) -> None:
        while self.waiting:
            r = self.idle_replica(tau)
            if r is None:
                return
            oldest = min(self.arrived(j) for j in self.waiting)
            batch, full = self.candidate()
            if full is None:
                if not self.deadline_passed(tau):
                    return
                full = "deadline"
            toks = [self.tok[j] for j in batch]
            seconds = float(self.service.seconds(float(len(batch)), float(sum(toks)),
                                                 float(sum(x * x for x in toks)), float(max(toks))))
            end = tau + seconds
            self.busy_until[r] = end
            for j in batch:
                self.waiting.remove(j)
                self.disp[j], self.comp[j], self.batch_of[j] = tau, end, len(self.batches)
            self.batches.append((r, tau, end, len(batch), float(self.cost(batch)), min(batch) // self.G, full, oldest))

    # -- the event loop -------------------------------------------------------

    def run(self) -> Oracle:
        while True:
            arrive, wait_ends = self.next_arrival()
            instants = [x for x in (arrive, wait_ends) if x is not None]
            instants += [b for b in self.busy_until if b > self.now]
            instants += [self.arrived(j) + self.max_wait for j in self.waiting
                         if self.arrived(j) + self.max_wait > self.now]
            if not instants:
                break
            tau = min(instants)
            assert tau > self.now
            self.now = tau
            while True:  # every group that arrives at tau is in before the batcher decides
                arrive, _ = self.next_arrival()
                if arrive is None or arrive > tau:
                    break
                t = len(self.arrival)
                self.arrival.append(arrive)
                self.waiting += range(t * self.G, (t + 1) * self.G)
            self.decide(tau)
        self.step_start_all = [self.step_start(t) for t in range(self.steps + 1)]
        return self


# ----------------------------------------------------------------------------
# Random small cases.


def grid(rng, lo, hi, unit=64):
    """A multiple of 1 / ``unit`` in [lo, hi]."""
    return float(rng.integers(round(lo * unit), round(hi * unit) + 1)) / unit


def random_case(seed: int) -> dict:
    rng = np.random.default_rng(7000 + seed)
    steps, batch, seqs = int(rng.integers(4, 11)), int(rng.integers(1, 4)), int(rng.integers(1, 4))
    trials = 2
    padded = bool(rng.integers(2))
    max_tok = int(rng.choice([16, 64]))
    tokens = rng.integers(1, max_tok + 1, (trials, steps, batch, seqs)).astype(np.float64)
    phases = np.stack([
        np.vectorize(lambda _: grid(rng, 0.25, 2.0))(np.zeros((trials, steps))),
        np.vectorize(lambda _: grid(rng, 0.0, 0.25))(np.zeros((trials, steps))),
        np.full((trials, steps), float(rng.choice([0.0, 1 / 16]))),
        np.vectorize(lambda _: grid(rng, 1 / 16, 0.5))(np.zeros((trials, steps))),
    ])
    service = LinearTokens(base=float(rng.choice([1 / 64, 1 / 8, 1 / 4])), rate=float(rng.choice([32, 64, 128, 256])),
                           padded=padded)
    conf = dict(replicas=int(rng.integers(1, 4)), max_batch=int(rng.integers(1, 7)),
                budget=int(rng.choice([max_tok // 2, max_tok, 2 * max_tok, 4 * max_tok, 10**6])),
                max_wait=float(rng.choice([0.0, 0.25, 0.75, 2.0])), order="shortest" if seed % 2 else "fifo",
                padded=padded, service=service)
    mode = seed % 3
    blocking = mode > 0
    timeout = grid(rng, 0.25, 1.5, 8) if mode == 2 else None
    return dict(tokens=tokens, phases=phases, conf=conf, blocking=blocking, timeout=timeout)


def draws_of(case: dict) -> PipelineDraws:
    c = case["conf"]
    tokens = case["tokens"]
    spec = GpuSpec(replicas=c["replicas"], max_batch=c["max_batch"], budget=float(c["budget"]),
                   max_wait=c["max_wait"], order=c["order"], padded=c["padded"], model=c["service"],
                   seqs=tokens.shape[3])
    return PipelineDraws(phase=case["phases"], service={"g": tokens}, kernel_channels=frozenset(),
                         nominal_step=1.0, workers={"g": None}, max_delay={"g": None}, gpu={"g": spec},
                         offset=case.get("offset"))  # arrivals over time: tests/test_arrivals_gpu.py


def oracles_of(case: dict, cls=None) -> list:
    cls = cls or Oracle
    tokens = case["tokens"]
    n, steps = tokens.shape[:2]
    return [cls(tokens[i].reshape(steps, -1), case["phases"][:, i], blocking=case["blocking"],
                timeout=case["timeout"], **case["conf"]).run() for i in range(n)]


def engine_runs(case: dict, monkeypatch) -> dict:
    """Each engine's schedule and its per-request dispatch and completion times,
    caught where the engines hand them to ``_per_sample``."""
    draws = draws_of(case)
    out = {}
    for label, mod, run in (("lanes", lanes_mod, lambda: run_lanes(draws, case["blocking"], case["timeout"])),
                            ("lane loop", lanes_mod,
                             lambda: run_lanes(draws, case["blocking"], case["timeout"], gpu_loop=True)),
                            ("simpy", simpy_mod, lambda: run_simpy(draws, case["blocking"], case["timeout"]))):
        caught = []
        real = mod._per_sample

        def spy(disp, comp, shape, real=real, caught=caught):
            caught.append((np.array(disp, dtype=np.float64), np.array(comp, dtype=np.float64)))
            return real(disp, comp, shape)

        monkeypatch.setattr(mod, "_per_sample", spy)
        s = run()
        monkeypatch.setattr(mod, "_per_sample", real)
        disp = np.vstack([d.reshape(-1, d.shape[-1]) for d, _ in caught])
        comp = np.vstack([c.reshape(-1, c.shape[-1]) for _, c in caught])
        out[label] = (s, disp, comp)
    return out


def mismatches(case: dict, oracles: list, runs: dict) -> list:
    """Where an engine's schedule differs from the oracles' (empty: none)."""
    bad = []
    _, steps, batch, seqs = case["tokens"].shape
    for label, (s, disp, comp) in runs.items():
        for i, o in enumerate(oracles):
            checks = {
                "dispatch": (disp[i], np.array(o.disp)),
                "completion": (comp[i], np.array(o.comp)),
                "arrival": (s.submit_time[i, :, 0, 0], np.array(o.arrival)) if "offset" not in case else
                           (s.submit_time[i, ..., 0], np.array(o.ready).reshape(steps, batch, seqs)[..., 0]),
                "step start": (s.step_start[i], np.array(o.step_start_all, dtype=np.float64)),
                "sample start": (s.service_start[i, ..., 0], np.array(o.disp).reshape(steps, batch, seqs).min(-1)),
                "sample end": (s.completion[i, ..., 0], np.array(o.comp).reshape(steps, batch, seqs).max(-1)),
            }
            log = s.gpu_batches["g"]
            mine = log["lane"] == i
            got = sorted(zip(log["replica"][mine].tolist(), log["start"][mine].tolist(), log["end"][mine].tolist(),
                             log["size"][mine].tolist(), log["tokens"][mine].tolist(), log["step"][mine].tolist()))
            want = sorted(b[:6] for b in o.batches)
            if got != want:
                bad.append(f"{label}, trial {i}: batch log {got[:4]}... vs oracle {want[:4]}...")
            for what, (x, y) in checks.items():
                if x.shape != y.shape or not np.array_equal(x, y):
                    bad.append(f"{label}, trial {i}: {what} {x.ravel()[:8]} vs oracle {y.ravel()[:8]}")
            # the size of each request's batch: the logged batch with its dispatch and completion instants
            for j, b in enumerate(o.batch_of):
                rows = np.flatnonzero(mine & (log["start"] == disp[i, j]) & (log["end"] == comp[i, j]))
                want_size = o.batches[b][3] if b >= 0 else 0  # 0: never dispatched
                if rows.size == 1 and log["size"][rows[0]] != want_size:
                    bad.append(f"{label}, trial {i}: request {j} in a batch of {log['size'][rows[0]]}, "
                               f"oracle {want_size}")
                    break
    return bad


N_CASES = 48


@pytest.fixture(scope="module")
def cases():
    return [random_case(seed) for seed in range(N_CASES)]


@pytest.fixture(scope="module")
def compared(cases):
    mp = pytest.MonkeyPatch()
    try:
        return [(oracles_of(c), engine_runs(c, mp)) for c in cases]
    finally:
        mp.undo()


@pytest.mark.parametrize("seed", range(N_CASES))
def test_engines_match_the_oracle_request_by_request(cases, compared, seed):
    oracles, runs = compared[seed]
    bad = mismatches(cases[seed], oracles, runs)
    assert not bad, "\n".join(bad[:6])


def test_random_cases_cover_every_rule(cases, compared):
    seen = Counter()
    for case, (oracles, _) in zip(cases, compared):
        c = case["conf"]
        seen["fifo" if c["order"] == "fifo" else "shortest"] += 1
        seen["padded" if c["padded"] else "packed"] += 1
        seen["several sequences"] += case["tokens"].shape[3] > 1
        seen["blocking"] += case["blocking"] and case["timeout"] is None
        for o in oracles:
            why = Counter(b[6] for b in o.batches)
            seen["budget-limited"] += why["budget"] > 0
            seen["size-limited"] += why["size"] > 0 and c["max_batch"] > 1
            seen["deadline flush"] += any(b[6] == "deadline" and c["max_wait"] > 0 and b[1] == b[7] + c["max_wait"]
                                          for b in o.batches)
            seen["lone request over budget"] += any(b[3] == 1 and b[4] > c["budget"] for b in o.batches)
            busy = [(b[1], b[2]) for b in o.batches]
            seen["replicas busy at once"] += any(s2 < e1 and s1 < e2 for k, (s1, e1) in enumerate(busy)
                                                 for s2, e2 in busy[k + 1:])
            seen["queued for a replica"] += any(o.disp[j] > o.arrival[j // o.G] + c["max_wait"]
                                                for j in range(len(o.disp)))
            seen["dispatch at an arrival that frees"] += any(b[1] in o.arrival and b[1] in [x[2] for x in o.batches]
                                                             for b in o.batches)
            if case["timeout"] is not None:
                seen["blocking wait timed out"] += any(
                    max(o.comp[t * o.G:(t + 1) * o.G]) > o.arrival[t] + case["timeout"] for t in range(o.steps))
    need = ["fifo", "shortest", "padded", "packed", "several sequences", "blocking", "budget-limited", "size-limited",
            "deadline flush", "lone request over budget", "replicas busy at once", "queued for a replica",
            "dispatch at an arrival that frees", "blocking wait timed out"]
    assert all(seen[k] > 0 for k in need), str({k: seen[k] for k in need})


# ----------------------------------------------------------------------------
# The oracle can fail: each of these breaks one rule, and the engines disagree.


class DeadlineStrict(Oracle):
    def deadline_passed(self, tau):
        return min(self.arrived(j) for j in self.waiting) + self.max_wait < tau


class ShortestByIndexDesc(Oracle):
    def in_order(self):
        if self.order == "fifo":
            return super().in_order()
        return sorted(self.waiting, key=lambda j: (self.tok[j], -j))


class HighestReplicaFirst(Oracle):
    def idle_replica(self, tau):
        idle = [r for r in range(self.replicas) if self.busy_until[r] <= tau]
        return idle[-1] if idle else None


class BudgetStrict(Oracle):
    def candidate(self):
        self.budget -= 1  # "less than budget" in place of "at most"
        try:
            return super().candidate()
        finally:
            self.budget += 1


class FreeOnlyAfterTheInstant(Oracle):
    def idle_replica(self, tau):
        idle = [r for r in range(self.replicas) if self.busy_until[r] < tau]
        return idle[0] if idle else None


@pytest.mark.parametrize("mutant", [DeadlineStrict, ShortestByIndexDesc, HighestReplicaFirst, BudgetStrict,
                                    FreeOnlyAfterTheInstant])
def test_a_wrong_rule_is_caught(cases, compared, mutant):
    caught = sum(bool(mismatches(case, oracles_of(case, mutant), runs)) for case, (_, runs) in zip(cases, compared))
    assert caught > 0, f"{mutant.__name__} agrees with every engine run: the comparison cannot see that rule"
