"""Rare drop episodes and the regime's chain (issue 50).

Under random outages or latency bursts a channel drops results in episodes: a long degraded spell,
or several replicas down together, builds a backlog that overflows the drop horizon
(``max_delay``), and every result for a while is dropped. A run either holds such an episode or
not, so a figure driven by them is read off independent replications sized from the regime: enough
of them, long enough, that the episodes expected in all let the figure's tail be seen.

The regime is a Markov chain over optimizer steps (:func:`regime_chain`): the burst chain's two
states (normal, degraded: the work a step brings times ``degraded_factor``), the number of servers
up (each an alternating exponential up/repair process, so their count is a birth-death chain), or
both. The backlog it drives is a fluid queue, Lindley's recursion modulated by the chain,

    W_{t+1} = max(0, W_t + a(s_t) - c(s_t)),

with W the work waiting (in steps of the whole pool's work), a(s) the work a step brings in state s
and c(s) the share of the pool serving (:func:`fluid_backlog`: the law of (s_t, W_t) from an empty
queue, iterated on a grid). A step's results wait about W / c steps, plus their own step's work and
the step at whose start a result becomes usable, so its results past the horizon are dropped. From
that law come what the replications are sized by (:class:`Episodes`): the long-run dropped share, the
rate of drop episodes (the chance a step drops after a horizon of steps that did not), so
the steps an episode drops on average, and the warm-up after which the chance of a drop from the
empty start is within :data:`WARM_TOL` of its long-run value."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import numpy as np
from scipy import linalg

from racsim.analyses.capacity.channel import is_gpu, units_per_server
from racsim.analyses.capacity.load import load_basis
from racsim.config.schema import RacsimConf
from racsim.config.validate import faults_on
from racsim.config.validate.pipeline import nominal_step
from racsim.pipeline.draws import stationary_slowdown
from racsim.pipeline.faults import fault_spec

# Drop episodes the replications of a count must expect in all were its dropped share at its target
# (capacity.max_dropped), each as long as the count's chain makes them (:func:`exposure`).
EPISODES = 20
# The warm-up: from the empty start, the chance of a drop and the mean backlog within this share of
# their long-run values (:func:`fluid_backlog`; a window after it reads the share at most this low).
WARM_TOL = 0.05
# A long-run dropped share below this (a result in a million) has no warm-up of its own: the
# mean backlog's sets it.
NEGLIGIBLE = 1e-6
GRID = 400  # grid points of the backlog per drop horizon
SPAN = 4  # drop horizons of backlog the grid holds (beyond it, the mass stays on its last point)
MAX_ITER = 50_000  # steps the law is iterated at most
SETTLED = 1e-6  # the law is stationary when its drop chance and mean backlog move less than this (relative) in
CHECK = 200  # ... this many steps


@dataclass(frozen=True)
class Chain:
    """A slow regime as a Markov chain over optimizer steps driving a fluid backlog: ``move`` (S, S)
    one step's transition matrix, ``law`` (S,) its stationary law, ``arrive`` (S,) the work a step
    brings in each state and ``serve`` (S,) the share of the pool serving (both in steps of the whole
    pool's work), ``horizon`` the drop horizon (``max_delay``, steps)."""

    move: np.ndarray
    law: np.ndarray
    arrive: np.ndarray
    serve: np.ndarray
    horizon: float


@dataclass(frozen=True)
class Episodes:
    """What a regime's chain says of a count's drops (:func:`episodes`): ``share`` its long-run
    dropped share, ``rate`` drop episodes a step, ``length`` steps of results an episode drops on
    average (share / rate; 0 where none can happen), ``warmup`` steps from the empty start."""

    share: float
    rate: float
    length: float
    warmup: int


def stationary_law(move: np.ndarray) -> np.ndarray:
    """The stationary law of the chain with one-step transition matrix ``move`` (its left
    eigenvector of eigenvalue 1, normalised)."""
    vals, vecs = linalg.eig(move.T)
    v = np.abs(np.real(vecs[:, np.argmin(np.abs(vals - 1.0))]))
    return v / v.sum()


def burst_chain(p_degrade: float, p_recover: float, factor: float):
    """The burst chain (racsim.pipeline.draws.regime_path): (move, work factors) of its states normal
    and degraded, leaving normal with probability ``p_degrade`` a step and degraded with ``p_recover``."""
    move = np.array([[1.0 - p_degrade, p_degrade], [p_recover, 1.0 - p_recover]])
    return move, np.array([1.0, factor])


def servers_up_chain(servers: int, mtbf_steps: float, mttr_steps: float):
    """The number of ``servers`` up, each up Exp(``mtbf_steps``) and in repair Exp(``mttr_steps``)
    independently: (move, share of the pool up) of the states 0..servers up, one step of the
    birth-death generator (u fail at rate u / mtbf, servers - u are repaired at (servers - u) / mttr)
    exponentiated."""
    u = np.arange(servers + 1)
    gen = np.diag(u[1:] / mtbf_steps, -1) + np.diag((servers - u[:-1]) / mttr_steps, 1)
    gen -= np.diag(gen.sum(axis=1))
    return np.clip(linalg.expm(gen), 0.0, None), u / servers


def regime_terms(cfg: RacsimConf, name: str, servers: int, work_per_s: float) -> Optional[tuple]:
    """Channel ``name``'s random regimes at ``servers`` servers (replicas of ``tp`` GPUs, or workers)
    as plain numbers (:func:`make_chain` takes them): (the work a calm step brings, in steps of the
    whole pool's work: the long-run ``work_per_s``, server-seconds a second with the bursts' slow-down
    included (racsim.analyses.capacity.load), over the servers and the slow-down; the drop horizon;
    the burst chain's (p_degrade, p_recover, degraded_factor) or None; the outages' (servers, mean up
    and repair steps of one server at the nominal step) or None). None without random outages nor
    bursts, or without a drop horizon (no result is ever dropped)."""
    ch, step = cfg.pipeline.channels[name], nominal_step(cfg.pipeline)
    bursts = ch.degraded_factor != 1 and ch.p_degrade > 0
    outages = faults_on(ch) and ch.faults.mtbf_s is not None
    if not (bursts or outages) or ch.max_delay is None:
        return None
    slow = stationary_slowdown(ch.degraded_factor, ch.p_degrade, ch.p_recover)
    spec = fault_spec(ch.faults, units_per_server(cfg, name)) if outages else None
    return (float(work_per_s) / servers / slow, float(ch.max_delay),
            (float(ch.p_degrade), float(ch.p_recover), float(ch.degraded_factor)) if bursts else None,
            (int(servers), spec.mtbf / step, spec.mttr / step) if outages else None)


def make_chain(calm: float, horizon: float, bursts: Optional[tuple], outages: Optional[tuple]) -> Chain:
    """The :class:`Chain` of :func:`regime_terms`: bursts and outages together as the product of their
    independent chains, a step bringing ``calm`` times the degraded factor in a degraded state, the
    pool serving the share of its servers up."""
    move, arrive, serve = np.ones((1, 1)), np.array([calm]), np.ones(1)
    if bursts is not None:
        m, f = burst_chain(*bursts)
        move, arrive, serve = np.kron(move, m), np.kron(arrive, f), np.kron(serve, np.ones(2))
    if outages is not None:
        m, up = servers_up_chain(*outages)
        move, arrive, serve = np.kron(move, m), np.kron(arrive, np.ones(up.size)), np.kron(serve, up)
    return Chain(move, stationary_law(move), arrive, serve, horizon)


@lru_cache(maxsize=128)
def chain_episodes(terms: tuple) -> Episodes:
    """:func:`episodes` of the chain of ``terms`` (:func:`regime_terms`), computed once per process."""
    return episodes(make_chain(*terms))


def count_episodes(cfg: RacsimConf, name: str, work_per_s: Optional[float] = None) -> Optional[Episodes]:
    """What channel ``name``'s regime's chain says of its drops at the count ``cfg`` holds
    (:class:`Episodes`), its long-run work ``work_per_s`` (None: measured on the scenario's draws as
    the offered load measures it, racsim.analyses.capacity.load); None without a chain (:func:`regime_terms`)."""
    ch = cfg.pipeline.channels[name]
    servers = int(ch.rm.gpus if is_gpu(cfg, name) else ch.workers) // units_per_server(cfg, name)
    if work_per_s is None:
        basis = load_basis(cfg, name)
        work_per_s = basis.work_step / basis.clock_step
    terms = regime_terms(cfg, name, servers, work_per_s)
    return None if terms is None else chain_episodes(terms)


def dropped_share(chain: Chain, w: np.ndarray) -> np.ndarray:
    """(S, points) the share of a step's results dropped in each state with backlog ``w`` (points,):
    its work's last part, past what the pool serves in the horizon less the step at whose start a
    result becomes usable, c (horizon - 1) - W, over the step's work (all of it with no server up)."""
    room = chain.serve[:, None] * (chain.horizon - 1.0) - w[None, :]
    a = chain.arrive[:, None]
    return np.clip((a - room) / a, 0.0, 1.0)


def shifted(f: np.ndarray, by: np.ndarray) -> np.ndarray:
    """(S, points) each state's mass ``f`` moved ``by`` (S,) grid points up or down (a fraction split
    linearly between the two neighbours, which keeps the mean), the mass past an end on that end
    (|by| below the points)."""
    out = np.zeros_like(f)
    n = f.shape[1]
    for s, b in enumerate(by):
        k = int(np.floor(b))
        for j, wgt in ((k, 1.0 - (b - k)), (k + 1, b - k)):
            if j >= 0:
                out[s, j:] += wgt * f[s, : n - j]
                out[s, -1] += wgt * f[s, n - j:].sum()
            else:
                out[s, : n + j] += wgt * f[s, -j:]
                out[s, 0] += wgt * f[s, :-j].sum()
    return out


def fluid_backlog(chain: Chain):
    """The backlog's law from an empty queue, the chain in its stationary law, one step at a time
    until it settles (:data:`SETTLED` over :data:`CHECK` steps, at most :data:`MAX_ITER`): (the chance
    of a drop per step from the start, the mean backlog per step, the last law (S, points), the grid)."""
    points = GRID * SPAN
    dw = max(chain.horizon, 1.0) / GRID
    w = np.arange(points) * dw
    drop = dropped_share(chain, w)
    by = (chain.arrive - chain.serve) / dw
    f = np.zeros((chain.law.size, points))
    f[:, 0] = chain.law
    chance, mean = [], []
    for t in range(MAX_ITER):
        chance.append(float((f * drop).sum()))
        mean.append(float(f.sum(axis=0) @ w))
        if t >= CHECK and all(abs(x[-1] - x[-1 - CHECK]) <= SETTLED * abs(x[-1]) for x in (chance, mean)):
            break
        f = chain.move.T @ shifted(f, by)
    return np.array(chance), np.array(mean), f, w


def episodes(chain: Chain) -> Episodes:
    """The long-run dropped share, the rate and length of drop episodes and the warm-up of ``chain``'s
    backlog (module docstring): an episode starts at a step with a drop after ``horizon`` steps
    without (as :func:`drop_episodes` counts them in a run: drops at most a horizon apart are one
    episode), the stationary law's mass where no result is dropped, moved a step at a time and kept
    where none is dropped for the horizon, then moved once more to where some are."""
    chance, mean, f, w = fluid_backlog(chain)
    drop = dropped_share(chain, w)
    by = (chain.arrive - chain.serve) / (w[1] - w[0])
    calm = np.where(drop == 0.0, f, 0.0)
    for _ in range(max(int(chain.horizon), 1) - 1):
        calm = np.where(drop == 0.0, chain.move.T @ shifted(calm, by), 0.0)
    rate = float(((chain.move.T @ shifted(calm, by)) * (drop > 0)).sum())
    share = chance[-1]
    warm = max(first_within(chance) if share >= NEGLIGIBLE else 0, first_within(mean))
    return Episodes(share, rate, share / rate if rate > 0 else 0.0, warm)


def first_within(x: np.ndarray, tol: float = WARM_TOL) -> int:
    """The steps to cut from a series ``x`` (step 0 the empty start, rising) so that every step left
    is within ``tol`` of its last value."""
    short = np.flatnonzero(x < (1.0 - tol) * x[-1])
    return int(short[-1] + 1) if short.size else 0


def drop_episodes(dropped: np.ndarray, gap: int) -> int:
    """Drop episodes in one lane's per-step counts of dropped results ``dropped`` (steps,): maximal
    runs of steps with a drop, two drop steps at most ``gap`` steps apart in one episode."""
    at = np.flatnonzero(np.asarray(dropped) > 0)
    if at.size == 0:
        return 0
    return int(1 + np.count_nonzero(np.diff(at) > gap))
