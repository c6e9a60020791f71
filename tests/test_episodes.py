"""The regime's chain and its fluid backlog (issue 50, racsim/analyses/capacity/episodes.py): the chains
against closed forms and a loop over the servers' joint states, the backlog's law against a Monte-Carlo
loop of Lindley's recursion, and the episodes counted in a lane against a slow loop."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from racsim.analyses.capacity import channel_loads
from racsim.analyses.capacity.channel import with_count
from racsim.analyses.capacity.episodes import (Chain, burst_chain, count_episodes, drop_episodes, dropped_share,
                                               episodes, first_within, fluid_backlog, make_chain, regime_terms,
                                               servers_up_chain, shifted, stationary_law)
from racsim.config.defaults import compose_config
from racsim.config.spec import scenario

J = "pipeline.channels.judge"


def spec(*over):
    return scenario(compose_config(*over))


@pytest.mark.parametrize("seed", range(3))
def test_burst_chain_and_its_stationary_law(seed):
    rng = np.random.default_rng(seed)
    pd_, pr, f = rng.uniform(0.01, 0.5), rng.uniform(0.05, 0.9), rng.uniform(1.2, 4.0)
    move, factor = burst_chain(pd_, pr, f)
    np.testing.assert_allclose(move.sum(axis=1), 1.0)
    np.testing.assert_allclose(stationary_law(move), [pr / (pd_ + pr), pd_ / (pd_ + pr)])
    assert list(factor) == [1.0, f]


def server_loop(servers: int, mtbf: float, mttr: float) -> np.ndarray:
    """One step's transition of the number of servers up, by a loop over the servers' joint up/down
    states: each server's own two-state chain over one step, in closed form (leaving up at rate 1/mtbf,
    down at 1/mttr: P(up -> up) = pi_up + pi_down e^{-(1/mtbf + 1/mttr)})."""
    a, b = 1.0 / mtbf, 1.0 / mttr
    up = b / (a + b)
    decay = np.exp(-(a + b))
    one = np.array([[1 - up - (1 - up) * decay, up - up * decay],  # from down: to down, to up
                    [(1 - up) - (1 - up) * decay, up + (1 - up) * decay]])  # from up
    one[0, 0] = 1 - one[0, 1]
    out = np.zeros((servers + 1, servers + 1))
    for start in itertools.product((0, 1), repeat=servers):  # each joint state with u up: the same law
        u = sum(start)
        row = np.zeros(servers + 1)
        for end in itertools.product((0, 1), repeat=servers):
            row[sum(end)] += np.prod([one[s, e] for s, e in zip(start, end)])
        out[u] = row
    return out


@pytest.mark.parametrize("servers", [1, 3, 5])
def test_servers_up_chain_is_the_servers_joint_chain(servers):
    mtbf, mttr = 40.0, 7.0
    move, up = servers_up_chain(servers, mtbf, mttr)
    np.testing.assert_allclose(move, server_loop(servers, mtbf, mttr), atol=1e-12)
    a = mtbf / (mtbf + mttr)  # availability: the stationary count is binomial
    binom = [np.prod([a if i < u else 1 - a for i in range(servers)]) * len(list(itertools.combinations(
        range(servers), u))) for u in range(servers + 1)]
    np.testing.assert_allclose(stationary_law(move), binom, atol=1e-12)
    np.testing.assert_allclose(up, np.arange(servers + 1) / servers)


def test_shifted_keeps_mass_and_mean():
    rng = np.random.default_rng(3)
    f = np.zeros((3, 200))
    f[:, 50:150] = rng.random((3, 100))
    f /= f.sum()
    by = np.array([-7.3, 0.0, 12.6])
    g = shifted(f, by)
    assert g.sum() == pytest.approx(1.0)
    x = np.arange(200)
    for s in range(3):  # no mass reached an end: each state's mean moved by exactly by[s]
        assert g[s] @ x == pytest.approx(f[s] @ x + by[s] * f[s].sum())
    end = shifted(np.eye(1, 200, 2), np.array([-5.5]))  # the mass below 0 lands on 0
    assert end[0, 0] == pytest.approx(1.0)


def lindley_loop(chain: Chain, paths: int, steps: int, seed: int):
    """Monte-Carlo of the modulated Lindley recursion, one step at a time: per step the mean share of
    a step's results dropped, the mean backlog, and the share of paths whose step drops more than a
    horizon of steps after their last drop (an episode's start, as drop_episodes counts them)."""
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(chain.move, axis=1)
    s = rng.choice(chain.law.size, size=paths, p=chain.law)
    w = np.zeros(paths)
    chance, mean, starts = [], [], []
    since = np.full(paths, 10 ** 6)  # steps since the path's last drop
    for _ in range(steps):
        room = chain.serve[s] * (chain.horizon - 1.0) - w
        drop = np.clip((chain.arrive[s] - room) / chain.arrive[s], 0.0, 1.0)
        chance.append(drop.mean())
        mean.append(w.mean())
        starts.append(np.mean((drop > 0) & (since > chain.horizon)))
        since = np.where(drop > 0, 1, since + 1)
        w = np.maximum(0.0, w + chain.arrive[s] - chain.serve[s])
        s = (rng.random(paths)[:, None] > cdf[s]).sum(axis=1)
    return np.array(chance), np.array(mean), np.array(starts)


@pytest.mark.parametrize("case", ["bursts", "outages", "both"])
def test_fluid_backlog_against_a_loop(case):
    terms = {"bursts": (0.62, 6.0, (0.08, 0.25, 2.2), None),
             "outages": (0.55, 5.0, None, (3, 30.0, 8.0)),
             "both": (0.5, 6.0, (0.05, 0.3, 1.8), (2, 40.0, 6.0))}[case]
    chain = make_chain(*terms)
    chance, mean, _, _ = fluid_backlog(chain)
    got = episodes(chain)
    steps = 400
    mc_chance, mc_mean, mc_starts = lindley_loop(chain, 20000, steps, seed=1)
    # from the empty start: the law step by step (the grid's rounding keeps the mean; it spreads the law a little)
    for t in (5, 20, 60):
        assert chance[t] == pytest.approx(mc_chance[t], rel=0.08, abs=1e-3)
        assert mean[t] == pytest.approx(mc_mean[t], rel=0.05, abs=0.02)
    late = slice(steps // 2, steps)
    assert got.share == pytest.approx(mc_chance[late].mean(), rel=0.08)
    assert got.rate == pytest.approx(mc_starts[late].mean(), rel=0.1)
    assert got.length == pytest.approx(got.share / got.rate)
    assert 0 < got.warmup < len(chance)
    assert chance[got.warmup] >= 0.95 * got.share and chance[got.warmup - 1] < 0.95 * got.share or \
        mean[got.warmup - 1] < 0.95 * mean[-1]


def test_a_pool_that_never_backs_up_drops_nothing():
    chain = make_chain(0.4, 10.0, (0.1, 0.3, 2.0), None)  # 0.8 of the pool even degraded
    got = episodes(chain)
    assert got.share == 0.0 and got.rate == 0.0 and got.length == 0.0 and got.warmup == 0


def test_dropped_share_closed_form():
    chain = Chain(np.eye(2), np.array([0.5, 0.5]), np.array([0.8, 1.6]), np.array([1.0, 0.5]), 10.0)
    w = np.array([0.0, 7.0, 8.6, 20.0])
    got = dropped_share(chain, w)
    # state 0: room 9 - w; state 1: room 4.5 - w; the share past the room over the step's work
    want = np.clip([[(0.8 - (9 - x)) / 0.8 for x in w], [(1.6 - (4.5 - x)) / 1.6 for x in w]], 0, 1)
    np.testing.assert_allclose(got, want)


def test_first_within():
    assert first_within(np.array([0.0, 0.5, 0.96, 0.97, 1.0])) == 2
    assert first_within(np.array([0.0, 0.0])) == 0
    assert first_within(np.array([0.2, 0.99, 0.9, 1.0])) == 3  # the last step short of it counts


def episodes_loop(dropped, gap):
    n, last = 0, None
    for t, d in enumerate(dropped):
        if d > 0:
            if last is None or t - last > gap:
                n += 1
            last = t
    return n


@pytest.mark.parametrize("seed", range(5))
def test_drop_episodes_against_a_loop(seed):
    rng = np.random.default_rng(seed)
    d = (rng.random(300) < rng.uniform(0.01, 0.3)) * rng.integers(1, 32, 300)
    gap = int(rng.integers(0, 25))
    assert drop_episodes(d, gap) == episodes_loop(d, gap)
    assert drop_episodes(np.zeros(10), 3) == 0


@pytest.mark.parametrize("scen", ["judge_rm_bursts", "judge_rm_faults"])
def test_the_chain_of_a_shipped_scenario_carries_its_load(scen):
    """The chain's work over its capacity, averaged by its stationary law, is the count's offered load."""
    cfg = spec(f"scenario=capacity/{scen}")
    loads = channel_loads(cfg, "judge", f"{J}.rm.gpus", [6, 7])
    for n in (6, 7):
        terms = regime_terms(cfg, "judge", n, loads[n]["work_per_s"])
        chain = make_chain(*terms)
        assert chain.law @ chain.arrive / (chain.law @ chain.serve) == pytest.approx(loads[n]["load"], rel=1e-9)
        got = count_episodes(with_count(cfg, f"{J}.rm.gpus", n), "judge", loads[n]["work_per_s"])
        assert got == episodes(chain)
    assert regime_terms(spec("scenario=capacity/judge_rm_h100"), "judge", 6, 5.0) is None  # no random regime
    assert regime_terms(spec(f"scenario=capacity/{scen}", f"{J}.max_delay=null"), "judge", 6, 5.0) is None
