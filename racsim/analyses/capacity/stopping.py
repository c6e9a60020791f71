"""Deciding with enough evidence, then stopping (docs/DESIGN "Answers that hold for a whole run").

A figure driven by rare events (results dropped when two replicas are evicted together, a burst
that overflows the drop horizon, the sojourn's and the delay's upper quantiles) is too narrow or
too wide by chance in one fixed-length run: it holds an episode or not. So the counts the answer
depends on read such figures off independent replications: the trials (lanes) of the settled run
and of more runs of the same count, each lane's measured window one replication, never batches
cut from one lane (they share its episodes). Under a regime with a chain (random outages, bursts:
racsim.analyses.capacity.episodes) the replications are sized from it (:class:`Plan`): enough
measured trial-steps that the chain's long-run dropped share, in episodes as frequent and as long
as the chain makes them, would be settled against its target at :data:`POWER` of seeds
(:func:`need_for`); a figure is resolved once the replications hold that many trial-steps or
:data:`~racsim.analyses.capacity.episodes.EPISODES` episodes are seen, and decided once, resolved,
its interval lies on one side of its target. Elsewhere (no regime, an autoscaler, a schedule) a
figure whose interval straddles its target is replicated until it does not. Either way replications
stop when every figure is decided or the budget ends (or cannot afford the plan); a figure left open
is unresolved, and the answer takes the safe side (:func:`sequential`).

This module is the pure rule: what a replication yields (:class:`Replicate`) and how the
replications are read; the simulation of one replication is the caller's
(racsim.analyses.capacity.replications.replicate_count)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Tuple

import numpy as np
from scipy import special

from racsim.analyses.capacity.episodes import EPISODES
from racsim.pipeline import steady

# Targets whose figure is driven by rare events, and the figure (a column of the capacity curve).
RARE_TARGETS = {"max_dropped": "dropped_frac", "max_sojourn_p95_s": "sojourn_p95_s",
                "max_sojourn_p99_s": "sojourn_p99_s", "max_delay_p95_steps": "delay_p95_steps"}
# A quantile target's samples (Replicate.samples) and level.
QUANTILES = {"max_sojourn_p95_s": ("sojourn", 0.95), "max_sojourn_p99_s": ("sojourn", 0.99),
             "max_delay_p95_steps": ("delay", 0.95)}
# The chosen corrector's bias targets: under outages or bursts the same rare episodes (results lost
# together) drive them, so they are decided the same way there; each replication then runs the
# bias study on its schedule.
BIAS_TARGETS = {"max_bias": "bias_exact", "max_bias_vs_naive": "bias_vs_naive"}
# A pool split's lag caps (capacity.split.*; racsim/analyses/capacity/split.py), decided the same way.
LAG_TARGETS = {"max_mean_lag": "mean_lag", "max_head_lag_p95": "head_lag_p95"}
FIGURES = {**RARE_TARGETS, **BIAS_TARGETS, **LAG_TARGETS}
MIN_REPLICATIONS = 2  # runs an interval on the runs' spread (a bias, a lag) is read from
# A search's stages come in a multiple of this many runs (Plan.together): the cores of the smallest machine
# racsim is sized for, fixed, so that a stage, and every figure read off it, is the same whatever the machine's
# cores or memory and whether the search runs alone or in a pool's worker (a sweep's job, a seeds table);
# the runs then go side by side as the machine allows (racsim.analyses.capacity.pool.pool_size).
STAGE_MULTIPLE = 2


@dataclass
class Replicate:
    """One run's measured windows, each of its lanes (trials) an independent replication: per lane
    the results ``dropped`` and ``sent`` and the drop ``episodes`` seen
    (:func:`~racsim.analyses.capacity.episodes.drop_episodes`); ``steps`` measured a lane; per
    quantile figure's samples (``delay`` of the results injected, ``sojourn`` of those back) their
    values and lane; the run's ``means``, figures read over the runs by :func:`mean_interval`: the bias
    (:data:`BIAS_TARGETS`' columns) and a pool split's lags (:data:`LAG_TARGETS`') where measured."""

    dropped: np.ndarray
    sent: np.ndarray
    episodes: np.ndarray
    steps: int
    samples: Dict[str, Tuple[np.ndarray, np.ndarray]]
    means: Dict[str, float] = field(default_factory=dict)

    @property
    def lanes(self) -> int:
        return int(self.sent.size)


def poisson_interval(events, level: float):
    """The exact (Garwood) central ``level`` interval on the mean of a Poisson count of which ``events``
    were seen (a real count: an effective one; an array, each alike): the gamma quantiles
    Gamma(events).ppf((1 - level) / 2) (0 with none) and Gamma(events + 1).ppf((1 + level) / 2) (with
    none, -ln((1 - level) / 2): 3.69 at 95%)."""
    ev = np.asarray(events, dtype=np.float64)
    lo = np.where(ev > 0, special.gammaincinv(np.maximum(ev, 1e-300), (1.0 - level) / 2.0), 0.0)
    hi = special.gammaincinv(ev + 1.0, (1.0 + level) / 2.0)
    return (float(lo), float(hi)) if ev.ndim == 0 else (lo, hi)


# An episode's size (the results it drops) varies about as an exponential's (coefficient of variation 1:
# the backlog's excursions over the horizon), so a share made of E episodes varies as a Poisson count of
# E / (1 + cv^2) = E / 2 (a compound Poisson sum's variance, rate x E[size^2]).
SIZE_CV2 = 1.0


@dataclass(frozen=True)
class Plan:
    """How a count's replications are sized: ``need`` measured trial-steps they must hold in all
    (0: none, where no chain sizes them; inf: no budget could), the chain's drop episodes at the count
    (``rate`` a trial-step, each ``length`` steps of results long on average; 0: none), ``warmup`` of
    each run, ``lanes`` (trials) and ``first`` the window of a run like the settled one, ``cap`` the
    longest run of ``lanes`` lanes the search made (steps: what fits in memory), ``together`` what a
    stage's number of runs is a multiple of, ``share`` the chain's long-run dropped share."""

    need: float
    length: float
    warmup: int
    lanes: int
    first: int
    cap: int
    rate: float = 0.0
    together: int = 1  # a stage's runs come in a multiple of it (STAGE_MULTIPLE in a search)
    share: float = 0.0

    @property
    def expected(self) -> float:
        """Drop episodes the chain expects in the trial-steps the plan needs."""
        return self.rate * self.need


# The chance, by the chain, that the replications a plan sizes settle the dropped share's target in one
# stage (:func:`decide_chance`): a count decides at this share of seeds.
POWER = 0.99
MAX_NEED = 1e8  # trial-steps past which no plan looks (a share at its target: never settled)


def decide_chance(exposure: float, share: float, rate: float, length: float, target: float, level: float) -> float:
    """The chance that the dropped share's interval read off ``exposure`` measured trial-steps lies on
    the side of ``target`` the chain's long-run ``share`` is on: E ~ Poisson(rate x exposure) drop
    episodes, their sizes (results dropped, in steps) Gamma with mean ``length`` and squared
    coefficient of variation :data:`SIZE_CV2`, the interval's end the Poisson one of
    :func:`ratio_interval` on E / (1 + SIZE_CV2), its upper end at least :func:`episode_upper`'s (its
    spread over the trials, which a few large episodes widen, left aside: an optimistic chance)."""
    m = rate * exposure
    count = np.arange(int(m + 10.0 * math.sqrt(m) + 10.0) + 1)
    weight = np.exp(count * math.log(m) - m - special.gammaln(count + 1.0)) if m > 0 else (count == 0) * 1.0
    e = np.maximum(count, 1) / (1.0 + SIZE_CV2)
    shape, scale = np.maximum(count, 1) / SIZE_CV2, length * SIZE_CV2
    lo, hi = poisson_interval(e, level)
    if share < target:  # settled when the upper end is at most the target, episode_upper's too
        ok = special.gammainc(shape, target * exposure * e / hi / scale)
        ok[0] = 1.0  # none seen: nothing dropped
        ok *= episode_upper(count, level, exposure, length) <= target
    else:  # settled when the lower end is above it
        ok = special.gammaincc(shape, target * exposure * e / np.maximum(lo, 1e-300) / scale)
        ok[0] = 0.0
    return float(weight @ ok)


def need_for(share: float, rate: float, length: float, target: float, level: float) -> float:
    """The fewest measured trial-steps at which the chain's dropped share is settled against ``target``
    with chance :data:`POWER` (:func:`decide_chance`), doubling then bisecting; 0 where the chain drops
    nothing, inf where no exposure up to :data:`MAX_NEED` does (a share at its target)."""
    if rate <= 0 or length <= 0:
        return 0.0
    hi = length / target
    while decide_chance(hi, share, rate, length, target, level) < POWER:
        hi *= 2.0
        if hi > MAX_NEED:
            return math.inf
    lo = hi / 2.0
    while hi - lo > 0.01 * hi:
        mid = (lo + hi) / 2.0
        lo, hi = (lo, mid) if decide_chance(mid, share, rate, length, target, level) >= POWER else (mid, hi)
    return float(math.ceil(hi))


def need_of(share: float, rate: float, length: float, targets: Dict[str, float], keys: List[str],
            level: float) -> float:
    """Trial-steps the replications must measure in all, the most over the rare-event ``keys``: for the
    dropped share, what settles the chain's ``share`` against its target at :data:`POWER`
    (:func:`need_for`); for a quantile, :data:`~racsim.analyses.capacity.episodes.EPISODES` episodes of
    ``length`` steps over its tail (1 - q), the share they would make."""
    out = [0.0]
    for k in keys:
        if k == "max_dropped":
            out.append(need_for(share, rate, length, targets[k], level))
        elif k in QUANTILES and length > 0:
            out.append(EPISODES * length / (1.0 - QUANTILES[k][1]))
    return max(out)


def open_targets(row, targets: Dict[str, float], zero: bool = True, bias: bool = False) -> List[str]:
    """The rare-event targets (:data:`RARE_TARGETS`, and with ``bias`` :data:`BIAS_TARGETS` and a pool split's
    :data:`LAG_TARGETS`) that are
    set above 0 and that ``row``'s interval leaves undecided: its [lo, hi] straddles the target
    (lo <= target < hi) or, with ``zero`` (a channel with a slow random regime, whose rare events a
    run may miss), reads [0, 0] exactly."""
    out = []
    for key, fig in (FIGURES if bias else RARE_TARGETS).items():
        t = targets.get(key)
        if t is None or t <= 0:  # a target of 0: any event seen fails it for sure, and none seen cannot settle it
            continue
        lo, hi = float(row[f"{fig}_lo"]), float(row[f"{fig}_hi"])
        if (lo <= t < hi) or (zero and lo == 0.0 and hi == 0.0):
            out.append(key)
    return out


def set_targets(targets: Dict[str, float]) -> List[str]:
    """The rare-event targets (:data:`RARE_TARGETS`) set above 0 (a target of 0 fails on any event
    seen, and none seen cannot settle it)."""
    return [k for k in RARE_TARGETS if targets.get(k) is not None and targets[k] > 0]


def t_quantile(level: float, df: int) -> float:
    """Student's t quantile of a central ``level`` interval with ``df`` degrees of freedom."""
    return float(special.stdtrit(df, 0.5 + level / 2.0))


def mean_interval(values: np.ndarray, level: float) -> Tuple[float, float, float]:
    """(mean, lo, hi): the Student-t interval on the mean of independent replications' estimates of a
    figure that is never negative (a quantile of seconds or steps, a bias norm or ratio): lo >= 0."""
    v = np.asarray(values, dtype=np.float64)
    m = float(v.mean())
    half = t_quantile(level, v.size - 1) * float(v.std(ddof=1)) / np.sqrt(v.size)
    return m, max(0.0, m - half), m + half


def ratio_interval(num: np.ndarray, den: np.ndarray, level: float, episodes: int = 0, exposure: float = 0.0,
                   length: float = 0.0) -> Tuple[float, float, float]:
    """(r, lo, hi): a share pooled over independent replications, r = sum(num) / sum(den), with the
    delta-method standard error over the R replications (never below the binomial one of sum(den)
    independent requests) and Student's t on R - 1 degrees of freedom, within [0, 1]. Where the events
    came in ``episodes`` (drop episodes seen), the interval is at least as wide as r's share of an exact
    Poisson interval (:func:`poisson_interval`, each end over the count) on their effective count,
    episodes / (1 + :data:`SIZE_CV2`): a share made of a few episodes of random size varies at least as
    that, and its spread read off the same few episodes is as small as their luck (three seen where
    ten were due); and its upper end is at least :func:`episode_upper`'s, that many episodes of the
    chain's ``length`` (a run's few episodes may all be small). No event at all: [0, the Poisson upper end
    with none seen, of episodes ``length`` steps long over the ``exposure`` trial-steps measured] where
    the chain gives a length, else [0, the exact binomial upper end with none in sum(den) sent]
    (optimistic where events cluster in episodes, but never [0, 0])."""
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    total, R = float(den.sum()), num.size
    r = float(num.sum()) / total
    if num.sum() == 0:
        if length > 0 and exposure > 0:
            return 0.0, 0.0, min(1.0, episode_upper(0, level, exposure, length))
        return 0.0, 0.0, float(1.0 - ((1.0 - level) / 2.0) ** (1.0 / total))
    se = max(float(np.sqrt(np.sum((num - r * den) ** 2) * R / (R - 1))) / total if R > 1 else 0.0,
             float(np.sqrt(r * (1 - r) / total)))
    half = t_quantile(level, max(R - 1, 1)) * se
    lo, hi = r - half, r + half
    if episodes > 0:
        e = episodes / (1.0 + SIZE_CV2)
        p_lo, p_hi = poisson_interval(e, level)
        lo, hi = min(lo, r * p_lo / e), max(hi, r * p_hi / e, episode_upper(episodes, level, exposure, length))
    return r, max(0.0, lo), min(1.0, hi)


def episode_upper(episodes, level: float, exposure: float, length: float):
    """The share that Poisson's upper end on ``episodes`` seen makes in episodes ``length`` steps long (the
    chain's) over ``exposure`` trial-steps, while fewer than :data:`~racsim.analyses.capacity.episodes.EPISODES`
    were seen: what an interval's upper end never falls below, so that a few episodes the luck of a run
    made small (one of a step where they average 30) read no narrower than none seen would; 0 from
    EPISODES on (their own sizes then tell), or without a length or an exposure (no chain)."""
    ev = np.asarray(episodes, dtype=np.float64)
    out = (np.where(ev < EPISODES, poisson_interval(ev, level)[1] * length / exposure, 0.0)
           if length > 0 and exposure > 0 else 0.0 * ev)
    return float(out) if out.ndim == 0 else out


def exposure(reps: List[Replicate]) -> int:
    """Measured trial-steps in all (every lane's window)."""
    return int(sum(r.lanes * r.steps for r in reps))


def episodes_seen(reps: List[Replicate]) -> int:
    return int(sum(int(r.episodes.sum()) for r in reps))


def intervals(reps: List[Replicate], keys: List[str], level: float,
              length: float = 0.0) -> Dict[str, Tuple[float, float, float]]:
    """Per target key: (figure, lo, hi) on the replications ``reps``, their lanes pooled: the dropped
    share by :func:`ratio_interval` over the lanes; a quantile by inverting that of the share of values
    above it (:func:`racsim.pipeline.steady.quantile_interval`); a bias or lag figure by :func:`mean_interval`
    over the runs (from :data:`MIN_REPLICATIONS` runs on; absent before). ``length``: a drop episode's
    steps by the chain (0: none), what no drop seen bounds the share by."""
    out = {}
    eps, seen = exposure(reps), episodes_seen(reps)
    for key in keys:
        if key == "max_dropped":
            out[key] = ratio_interval(np.concatenate([r.dropped for r in reps]), np.concatenate([r.sent for r in reps]),
                                      level, seen, eps, length)
        elif key in QUANTILES:
            what, q = QUANTILES[key]
            values, unit = pooled_samples(reps, what)
            share = lambda a, b: ratio_interval(a, b, level)[1:]  # noqa: E731
            x = float(np.quantile(values, q, method="inverted_cdf")) if values.size else float("nan")
            out[key] = (x, *steady.quantile_interval(values, unit, q, None, level, share=share))
        else:
            got = [r.means[FIGURES[key]] for r in reps if FIGURES[key] in r.means]
            if len(got) >= MIN_REPLICATIONS:
                out[key] = mean_interval(np.array(got), level)
    return out


def pooled_samples(reps: List[Replicate], what: str) -> Tuple[np.ndarray, np.ndarray]:
    """(values, lane) of the samples ``what`` of every run, the lanes numbered on across the runs."""
    offset, values, unit = 0, [], []
    for r in reps:
        v, u = r.samples[what]
        values.append(v)
        unit.append(u + offset)
        offset += r.lanes
    return np.concatenate(values), np.concatenate(unit).astype(np.int64)


def resolved(reps: List[Replicate], plan: Plan) -> bool:
    """Do the replications hold enough to see a rare figure's tail: the trial-steps the plan needs,
    or :data:`~racsim.analyses.capacity.episodes.EPISODES` drop episodes seen?"""
    return exposure(reps) >= plan.need or episodes_seen(reps) >= EPISODES


def left_open(found: Dict[str, Tuple[float, float, float]], keys: List[str], targets: Dict[str, float],
              reps: List[Replicate], plan: Plan) -> List[str]:
    """The ``keys`` still open: a bias or lag figure not yet read or whose interval straddles its target
    (lo <= target < hi); a rare-event one straddling, or not resolved (:func:`resolved`)."""
    ok = resolved(reps, plan)
    return [k for k in keys if k not in found or found[k][1] <= targets[k] < found[k][2]
            or (k in RARE_TARGETS and not ok)]


def failing(found: Dict[str, Tuple[float, float, float]], keys: List[str], targets: Dict[str, float],
            reps: List[Replicate], plan: Plan) -> List[str]:
    """The ``keys`` decided failing: read, resolved (a rare-event one: :func:`resolved`), and the lower end
    of the interval above the target. One such key fails the count whatever the others read."""
    ok = resolved(reps, plan)
    return [k for k in keys if k in found and targets[k] < found[k][1] and (k not in RARE_TARGETS or ok)]


def stage(reps: List[Replicate], plan: Plan) -> List[Tuple[int, int]]:
    """The runs of the next stage, each (lanes, steps with the warm-up): measured trial-steps up to the
    plan's need where short of it, else as many as measured so far (each stage doubles them), at least
    a run like the settled one and twice its warm-up a lane. One run of ``plan.lanes`` lanes where it
    holds no more trial-steps than the settled run's longest (``plan.lanes`` x ``plan.cap``: what the
    search showed fits in memory); else equal runs of at most that many trial-steps, each lane at least
    four warm-ups long (a warm-up at most a quarter of a lane), on as many lanes as fit, as many runs as
    a multiple of ``plan.together`` (on as many processes side by side, none idles while another runs a
    last one)."""
    now = exposure(reps)
    add = max(plan.need - now, now, plan.lanes * max(plan.first, 2 * plan.warmup), 1.0)
    room = plan.lanes * plan.cap
    one = plan.warmup + math.ceil(add / plan.lanes)
    if plan.lanes * one <= room:
        return [(plan.lanes, one)]
    steps = max(plan.cap, 4 * plan.warmup)
    lanes = max(1, room // steps)
    runs = math.ceil(add / (lanes * (steps - plan.warmup)))
    runs = math.ceil(runs / plan.together) * plan.together
    return [(lanes, plan.warmup + math.ceil(add / (runs * lanes)))] * runs


@dataclass
class Budget:
    """What the extra replications of a whole answer may take together: ``steps`` simulated steps
    (capacity.decide_steps) and ``seconds`` of this process's wall-clock (capacity.decide_s), from
    its creation; ``used``: the steps granted so far."""

    steps: int
    seconds: float
    used: int = 0
    started: float = field(default_factory=time.perf_counter)

    def affords(self, steps: int) -> bool:
        """Grant ``steps`` more simulated steps when both budgets allow them (and count them)."""
        if self.used + steps > self.steps or time.perf_counter() - self.started >= self.seconds:
            return False
        self.used += steps
        return True


@dataclass
class Decision:
    """What :func:`sequential` found: the replications (the first is the settled run), the intervals
    per target key, the keys left open (unresolved) when it stopped (none where one was decided failing:
    the count fails, whatever they read), and the plan."""

    reps: List[Replicate]
    found: Dict[str, Tuple[float, float, float]]
    open: List[str]
    plan: Plan

    @property
    def decided(self) -> bool:
        return not self.open


def bias_waits(left: List[str], targets: Dict[str, float], plan: Plan) -> bool:
    """Whether the bias study of a count's replications waits for their rare-event figures: a bias
    target and the dropped share both open, and the chain's long-run share (``plan.share``) above its
    target, so that the replications, sized to settle it (``plan.need``), are expected to decide the
    count failing, and then no bias figure is read (:func:`sequential`)."""
    t = targets.get("max_dropped")
    return (t is not None and "max_dropped" in left and plan.share > t
            and any(k in BIAS_TARGETS for k in left))


def sequential(first: Replicate, replicate: Callable[..., List[Replicate]], keys: List[str],
               targets: Dict[str, float], level: float, plan: Plan, budget: Budget) -> Decision:
    """Add runs to ``first`` (the settled run, replication 0), a stage at a time (:func:`stage`), until
    no key is open (:func:`left_open`), or one is decided failing (:func:`failing`: the verdict is known,
    the keys still open are no longer asked about), or the budget refuses a stage (:meth:`Budget.affords`,
    in steps of the plan's lanes: a run's lanes x steps over them, rounded up), or the plan says no exposure
    settles them (``plan.need`` inf); ``replicate(r, runs)``: the :class:`Replicate` of each of a stage's
    ``runs`` ((lanes, steps) each), numbered from r. While the bias waits (:func:`bias_waits`), stages are
    made without their bias study (``replicate(r, runs, False)``); once the dropped share is decided
    passing, they are made again with it (each run is its seed's: the same figures, and the bias)."""
    reps, waiting = [first], []  # waiting: the stages (r, runs) made without their bias study
    while True:
        found = intervals(reps, keys, level, plan.length)
        left = left_open(found, keys, targets, reps, plan)
        if left and failing(found, keys, targets, reps, plan):
            return Decision(reps, found, [], plan)
        if waiting and "max_dropped" not in left:  # the share decided passing: the bias is read now
            for r, runs in waiting:
                reps[r:r + len(runs)] = replicate(r, runs)
            waiting = []
            continue
        runs = stage(reps, plan) if left and math.isfinite(plan.need) else []
        if not runs or not budget.affords(math.ceil(sum(n * s for n, s in runs) / plan.lanes)):
            return Decision(reps, found, left, plan)
        if bias_waits(left, targets, plan):
            waiting.append((len(reps), runs))
            reps += replicate(len(reps), runs, False)
        else:
            reps += replicate(len(reps), runs)
