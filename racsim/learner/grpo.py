"""GRPO with a late slow reward: the training loop shared by the transformer
policy (racsim/learner/lm.py, torch) and its NumPy stand-in (racsim/learner/bandit.py).

The task (:func:`make_task`) is synthetic: a prompt x is a few tokens, a
response y is ``response_len`` tokens of a small vocabulary. The slow, true
reward is a verifier's score of the task's goal, ``r_true(x, y) = sum_t
u[x, t, y_t] / sqrt(L)``; the fast reward is a cheap proxy ``r_fast(x, y) =
sum_t (rho u + sqrt(1 - rho^2) z)[x, t, y_t] / sqrt(L)`` with u, z independent
standard normal tables, so that under the uniform policy the two are
correlated with coefficient ``rho`` on average over the task's draw
(``learner.lm.proxy_correlation``; the paper's probe measured -0.53 between
fast and slow advantages).

One optimizer step t takes P prompts (the pipeline's samples) x G responses
(one GRPO group per sample), scores them with the fast reward and sends each
group to the K slow channels, whose results land by the pipeline's
:class:`~racsim.pipeline.schedule.ArrivalSchedule` (one delay and status per
step, sample and channel: a group's slow scores come back together). The
update ascends ``(1 / PG) sum_rows coef_row * log pi(y_row | x_row)`` where

* a row of the current batch has the group-relative advantage (no division by
  the group's std) of ``(1 - c0) r_fast + c0 r_true``, c0 the share-weighted
  corrector weight of the slow results that land in their own step (Delta = 0;
  ratio 1, the behaviour policy is the current one): c0 = 0 is naive GRPO on the
  proxy, c0 = 1 synchronous GRPO on the true reward, bit for bit;
* a row of an earlier group whose channel-k result lands now, Delta steps
  late, carries paper eq. (1)'s correction ``c * w_k * X`` with X the
  group-relative residual ``r_true - r_fast``, w_k the channel's share and
  ``c = correction_weight(name, Delta, status, pi_now(y|x) / pi_behaviour(y|x))``,
  the sequence-level ratio from the policy's log-probabilities;
* with ``kl_coef`` > 0 the current rows also carry the gradient of
  ``kl_coef * k3``, the sequence-level estimator
  ``k3 = exp(ref - logp) - (ref - logp) - 1`` of KL(pi || pi_ref).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Protocol, Sequence

import numpy as np

from racsim.learner.correctors import CorrectorParams, adaptive_tau_age, corrected_advantage, correction_weight
from racsim.learner.training import landing_step
from racsim.pipeline.schedule import ArrivalSchedule


@dataclass(frozen=True)
class RewardTask:
    """Prompts (n_prompts, prompt_len) tokens and the reward tables (n_prompts, L, V)."""

    prompts: np.ndarray
    true_table: np.ndarray
    fast_table: np.ndarray

    @property
    def n_prompts(self) -> int:
        return self.prompts.shape[0]

    @property
    def response_len(self) -> int:
        return self.true_table.shape[1]

    @property
    def vocab(self) -> int:
        return self.true_table.shape[2]


def make_task(n_prompts: int, prompt_len: int, response_len: int, vocab: int, correlation: float,
              seed: int) -> RewardTask:
    """The synthetic task of the module docstring, drawn from ``default_rng(seed)``:
    prompts, then u, then z."""
    if not -1 <= correlation <= 1:
        raise ValueError(f"correlation = {correlation!r}: a number in [-1, 1]")
    rng = np.random.default_rng(seed)
    prompts = rng.integers(0, vocab, (n_prompts, prompt_len))
    u = rng.standard_normal((n_prompts, response_len, vocab))
    z = rng.standard_normal((n_prompts, response_len, vocab))
    scale = 1.0 / np.sqrt(response_len)
    fast = (correlation * u + np.sqrt(1.0 - correlation**2) * z) * scale
    return RewardTask(prompts=prompts, true_table=u * scale, fast_table=fast)


def task_rewards(task: RewardTask, prompt_idx: np.ndarray, responses: np.ndarray):
    """(r_fast, r_true), each (n,), of responses (n, L) to prompts ``prompt_idx`` (n,)."""
    pos = np.arange(task.response_len)[None]
    x = np.asarray(prompt_idx)[:, None]
    return task.fast_table[x, pos, responses].sum(axis=1), task.true_table[x, pos, responses].sum(axis=1)


def group_relative(r: np.ndarray, group: int) -> np.ndarray:
    """GRPO's group-relative advantage ``r_i - mean_{j in group(i)} r_j`` (consecutive
    groups of ``group`` rows; not divided by the group's std)."""
    g = np.asarray(r, dtype=np.float64).reshape(-1, group)
    return (g - g.mean(axis=1, keepdims=True)).ravel()


class Policy(Protocol):
    """What the loop needs of a policy over responses to the task's prompts."""

    n_params: int  # trainable parameters (the study records the size)

    def sample(self, prompt_idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Responses (n, L), one per prompt index, drawn with ``rng`` alone."""

    def logprob(self, prompt_idx: np.ndarray, responses: np.ndarray) -> np.ndarray:
        """log pi(y | x) of each row, (n,) float64."""

    def ref_logprob(self, prompt_idx: np.ndarray, responses: np.ndarray) -> np.ndarray:
        """log pi_ref(y | x) under the initial policy, (n,) float64."""

    def update(self, prompt_idx: np.ndarray, responses: np.ndarray,
               coefficients: Callable[[np.ndarray], np.ndarray], norm: float, want_grad: bool = False):
        """One optimizer step ascending ``sum coef * log pi / norm``, coef = coefficients(log pi)
        from the same forward pass; returns (log pi (n,), the flat gradient or None)."""

    def gradient(self, prompt_idx: np.ndarray, responses: np.ndarray, coef: np.ndarray,
                 norm: float) -> np.ndarray:
        """The flat gradient of ``sum coef * log pi / norm`` (no step)."""


@dataclass
class LaneCurve:
    """One training run: per step (steps + 1) the mean true and proxy reward of the
    batch generated there (the last entry: an evaluation batch after the last update);
    the ratios pi_now / pi_behaviour of the rows that received a correction, with
    their delays; the gradient-bias records of the checkpoints; and, per step, sample
    and channel, what the slow result delivered of the synchronous update and what it
    owed (:func:`delivered_and_owed`; the inputs of :func:`missing_share`)."""

    true: np.ndarray
    fast: np.ndarray
    ratio: np.ndarray
    ratio_delay: np.ndarray
    gradients: List[Dict[str, float]] = field(default_factory=list)
    delivered: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0)))
    owed: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0)))


class Lanes(Protocol):
    """S policies trained together (racsim.learner.lm.BatchedTransformerPolicy, or one
    :class:`Policy` as :class:`OneLane`): :class:`Policy`'s methods with a leading lane axis
    (prompt indices (S, n), responses (S, n, L), log-probabilities and coefficients (S, n),
    flat gradients (S, n_params)); lane s samples with ``rngs[s]`` alone."""

    n_lanes: int
    n_params: int

    def sample(self, prompt_idx: np.ndarray, rngs: Sequence[np.random.Generator]) -> np.ndarray: ...

    def logprob(self, prompt_idx: np.ndarray, responses: np.ndarray) -> np.ndarray: ...

    def ref_logprob(self, prompt_idx: np.ndarray, responses: np.ndarray) -> np.ndarray: ...

    def update(self, prompt_idx: np.ndarray, responses: np.ndarray,
               coefficients: Callable[[np.ndarray], np.ndarray], norm: float, want_grad: bool = False,
               widths: Optional[Sequence[int]] = None):
        """:meth:`Policy.update` per lane; lane s's rows past ``widths[s]`` (when given) are
        padding, of coefficient 0, which the policy may skip (their log-probabilities unused)."""

    def gradient(self, prompt_idx: np.ndarray, responses: np.ndarray, coef: np.ndarray,
                 norm: float) -> np.ndarray: ...


class OneLane:
    """A :class:`Policy` as a batch of one lane (:class:`Lanes`)."""

    n_lanes = 1

    def __init__(self, policy: Policy):
        self.policy = policy
        self.n_params = policy.n_params

    def sample(self, prompt_idx, rngs):
        return self.policy.sample(prompt_idx[0], rngs[0])[None]

    def logprob(self, prompt_idx, responses):
        return self.policy.logprob(prompt_idx[0], responses[0])[None]

    def ref_logprob(self, prompt_idx, responses):
        return self.policy.ref_logprob(prompt_idx[0], responses[0])[None]

    def update(self, prompt_idx, responses, coefficients, norm, want_grad=False, widths=None):
        lp, g = self.policy.update(prompt_idx[0], responses[0], lambda lp: coefficients(lp[None])[0], norm, want_grad)
        return lp[None], None if g is None else g[None]

    def gradient(self, prompt_idx, responses, coef, norm):
        return self.policy.gradient(prompt_idx[0], responses[0], coef[0], norm)[None]


class _Lane:
    """One lane's history and bookkeeping in :func:`train_lanes` (everything but the policy)."""

    def __init__(self, task: RewardTask, delay: np.ndarray, status: np.ndarray, land: np.ndarray, name: str,
                 params: CorrectorParams, w: np.ndarray, total: float, G: int):
        N, P, K = delay.shape
        self.task, self.delay, self.status, self.land, self.name, self.params = task, delay, status, land, name, params
        self.w, self.total, self.G, self.P, self.K, self.n = w, total, G, P, K, P * G
        self.hist_x = np.zeros((N, P, G), dtype=np.int64)
        self.hist_y = np.zeros((N, P, G, task.response_len), dtype=np.int64)
        self.hist_resid = np.zeros((N, P, G))
        self.hist_logp = np.zeros((N, P, G))
        self.delivered = np.zeros((N, P, K))
        self.owed = np.zeros((N, P, K))
        self.true_m, self.fast_m = np.empty(N + 1), np.empty(N + 1)
        self.ratios: list = []
        self.delays: list = []
        self.records: list = []
        # rac_adaptive's tau_age per result, from the results landed before the update that uses it
        self.tau = adaptive_tau_age(delay[None], status[None], params)[0] if name == "rac_adaptive" else None

    def begin(self, t: int, pidx: np.ndarray, resp: np.ndarray):
        """Step t's batch (pidx, resp): its rewards, c0 and advantages, and the update's rows
        (the batch, then the earlier groups whose slow results land now)."""
        P, G, K, w, status, tau = self.P, self.G, self.K, self.w, self.status, self.tau
        r_fast, r_true = task_rewards(self.task, pidx, resp)
        self.true_m[t], self.fast_m[t] = r_true.mean(), r_fast.mean()
        self.hist_x[t], self.hist_y[t] = pidx.reshape(P, G), resp.reshape(P, G, -1)
        self.hist_resid[t] = group_relative(r_true - r_fast, G).reshape(P, G)
        o_, b_, k_ = np.nonzero(self.land == t)
        same = o_ == t
        c_same = np.zeros((P, K))
        c_same[b_[same], k_[same]] = correction_weight(
            self.name, np.zeros(int(same.sum()), dtype=np.int64), status[o_[same], b_[same], k_[same]], None,
            self.params, tau_age=None if tau is None else tau[o_[same], b_[same], k_[same]])
        num = np.zeros(P)
        for k in range(K):
            num = num + w[k] * c_same[:, k]
        self.c0 = np.repeat(num / self.total, G)
        energy = (self.hist_resid[t] ** 2).sum(axis=1)[:, None]
        # ratio 1 in its own step (and for results never used)
        self.delivered[t], self.owed[t] = c_same * energy, energy
        self.adv = group_relative(corrected_advantage(r_fast, r_true, 0.0, self.c0), G)
        late = ~same
        og, self.inv = np.unique(o_[late] * P + b_[late], return_inverse=True)
        self.go, self.gb = og // P, og % P
        self.lo, self.lb, self.lk = o_[late], b_[late], k_[late]
        self.seen: dict = {}
        rows_x = np.concatenate([pidx, self.hist_x[self.go, self.gb].ravel()])
        rows_y = np.concatenate([resp, self.hist_y[self.go, self.gb].reshape(-1, self.task.response_len)])
        return rows_x, rows_y

    def coefficients(self, logp: np.ndarray, ref: Optional[np.ndarray], kl_coef: float) -> np.ndarray:
        """The update's coefficient per row, from the rows' log-probabilities at the current policy."""
        n, G, lo, lb, lk, tau = self.n, self.G, self.lo, self.lb, self.lk, self.tau
        ratio = np.exp(logp[n:].reshape(len(self.go), G) - self.hist_logp[self.go, self.gb])
        c = correction_weight(self.name, np.broadcast_to(self.delay[lo, lb, lk][:, None], (len(lo), G)),
                              np.broadcast_to(self.status[lo, lb, lk][:, None], (len(lo), G)), ratio[self.inv],
                              self.params, tau_age=None if tau is None else tau[lo, lb, lk][:, None])
        late_coef = np.zeros((len(self.go), G))
        np.add.at(late_coef, self.inv, self.w[lk][:, None] / self.total * c * self.hist_resid[lo, lb])
        self.delivered[lo, lb, lk], self.owed[lo, lb, lk] = delivered_and_owed(c, ratio[self.inv],
                                                                                 self.hist_resid[lo, lb])
        cur = self.adv
        if ref is not None:
            cur = self.adv - kl_coef * (1.0 - np.exp(ref - logp[:n]))
        self.seen["ratio"] = ratio
        return np.concatenate([cur, late_coef.ravel()])

    def finish(self, t: int, logp: np.ndarray) -> None:
        self.hist_logp[t] = logp[: self.n].reshape(self.P, self.G)
        if len(self.go):
            self.ratios.append(self.seen["ratio"].ravel())
            self.delays.append(np.repeat(t - self.go, self.G))

    def curve(self) -> LaneCurve:
        cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0))
        return LaneCurve(true=self.true_m, fast=self.fast_m, ratio=cat(self.ratios), ratio_delay=cat(self.delays),
                         gradients=self.records, delivered=self.delivered, owed=self.owed)


def train_lane(policy: Policy, task: RewardTask, delay: np.ndarray, status: np.ndarray, land: np.ndarray,
               name: str, params: CorrectorParams, shares: Sequence[float], group: int, kl_coef: float,
               rng: np.random.Generator, bias_rng: Optional[np.random.Generator] = None,
               checkpoints: Sequence[int] = (), sync_batch: int = 8,
               progress: Optional[Callable[[int], None]] = None) -> LaneCurve:
    """Train ``policy`` for ``delay.shape[0]`` steps with corrector ``name``: :func:`train_lanes`
    on one lane.

    ``delay``, ``status``, ``land``: (steps, P, K) of one lane of the arrival
    schedule (``land``: :func:`~racsim.learner.training.landing_step`).
    At each step of ``checkpoints`` the update's gradient is compared with the
    synchronous GRPO gradient on ``sync_batch`` times as many groups, drawn
    with ``bias_rng`` (so training itself is unchanged): :func:`missing_fraction`'s
    terms, and the cosine of the update's gradient and g_sync. (With ``kl_coef`` > 0 the KL
    term's gradient counts among the late part.)
    """
    return train_lanes(OneLane(policy), task, [delay], [status], [land], name, params, shares, group, kl_coef,
                       [rng], None if bias_rng is None else [bias_rng], checkpoints, sync_batch, progress)[0]


def train_lanes(policy: Lanes, task: RewardTask, delays: Sequence[np.ndarray], statuses: Sequence[np.ndarray],
                lands: Sequence[np.ndarray], name: str, params: CorrectorParams, shares: Sequence[float],
                group: int, kl_coef: float, rngs: Sequence[np.random.Generator],
                bias_rngs: Optional[Sequence[np.random.Generator]] = None, checkpoints: Sequence[int] = (),
                sync_batch: int = 8, progress: Optional[Callable[[int], None]] = None) -> List[LaneCurve]:
    """:func:`train_lane` on S lanes at once: lane s trains ``policy``'s lane s on
    ``delays[s]``, ``statuses[s]``, ``lands[s]`` (each (steps, P, K)) with ``rngs[s]`` (and
    ``bias_rngs[s]``), exactly as train_lane would alone; one :class:`Lanes` call per step
    serves every lane. An update's rows differ in number between lanes (the late groups
    that land): each lane's rows are padded to the widest with rows of coefficient 0
    (prompt 0, response of token 0), which contribute exactly 0 to its gradient.
    ``progress(S)`` after each step's update (S lane-steps done), when given."""
    S = len(rngs)
    if not len(delays) == len(statuses) == len(lands) == S == policy.n_lanes:
        raise ValueError(f"{policy.n_lanes} policy lanes, {len(delays)} delays, {len(statuses)} statuses, "
                         f"{len(lands)} landing steps and {S} generators: one of each per lane")
    N, P, K = delays[0].shape
    G = group
    n = P * G
    L = task.response_len
    w = np.asarray(shares, dtype=np.float64)
    total = 0.0
    for k in range(K):  # the same additions as c0's numerator: c = 1 on every channel gives c0 = 1 exactly
        total += w[k]
    lanes = [_Lane(task, d, st, ld, name, params, w, total, G) for d, st, ld in zip(delays, statuses, lands)]

    def draw_prompts(generators) -> np.ndarray:
        return np.stack([np.repeat(r.integers(0, task.n_prompts, P), G) for r in generators])

    for t in range(N):
        pidx = draw_prompts(rngs)
        resp = policy.sample(pidx, rngs)
        rows = [lane.begin(t, pidx[s], resp[s]) for s, lane in enumerate(lanes)]
        width = [len(x) for x, _ in rows]
        rows_x = np.zeros((S, max(width)), dtype=np.int64)
        rows_y = np.zeros((S, max(width), L), dtype=np.int64)
        for s, (x, y) in enumerate(rows):
            rows_x[s, : width[s]], rows_y[s, : width[s]] = x, y
        ref = policy.ref_logprob(pidx, resp) if kl_coef > 0 else None

        def coefficients(logp: np.ndarray) -> np.ndarray:
            coef = np.zeros(logp.shape)
            for s, lane in enumerate(lanes):
                coef[s, : width[s]] = lane.coefficients(logp[s, : width[s]], None if ref is None else ref[s], kl_coef)
            return coef

        want = t in checkpoints and bias_rngs is not None
        if want:  # before the update: the current batch's own gradient and the large synchronous batch
            g_cur = policy.gradient(pidx, resp, np.stack([lane.adv for lane in lanes]), float(n))
            g_sync, g_res_a, g_res_b = sync_directions(policy, task, P * sync_batch, G, bias_rngs)
        logp, grad = policy.update(rows_x, rows_y, coefficients, float(n), want_grad=want, widths=width)
        for s, lane in enumerate(lanes):
            lane.finish(t, logp[s, : width[s]])
            if want:
                den = np.linalg.norm(grad[s]) * np.linalg.norm(g_sync[s])  # 0 when every group's rewards tie
                lane.records.append({
                    "step": t, "c0": float(lane.c0.mean()),
                    "late_dot": float((grad[s] - g_cur[s]) @ (g_res_a[s] + g_res_b[s]) / 2),
                    "res_dot": float(g_res_a[s] @ g_res_b[s]),
                    "cosine": float(grad[s] @ g_sync[s] / den) if den > 0 else np.nan})
        if progress is not None:
            progress(S)
    pidx = draw_prompts(rngs)
    resp = policy.sample(pidx, rngs)
    for s, lane in enumerate(lanes):
        r_fast, r_true = task_rewards(task, pidx[s], resp[s])
        lane.true_m[N], lane.fast_m[N] = r_true.mean(), r_fast.mean()
    return [lane.curve() for lane in lanes]


def delivered_and_owed(c: np.ndarray, ratio: np.ndarray, resid: np.ndarray) -> tuple:
    """What late slow results deliver of the synchronous update at the current policy, and
    what that update owes them, per result (rows: results, columns: the G responses of its
    group): (sum_i X_i^2 c_i, sum_i X_i^2 ratio_i).

    A response y drawn from pi_behaviour and weighted c enters the update as
    c X grad log pi(y | x); by importance sampling, E_behaviour[c X grad log pi] =
    E_pi[(c / ratio) X grad log pi], ratio = pi_now / pi_behaviour: the synchronous update
    at the current policy scaled by c / ratio per response. Its self-normalised estimate on
    the group's own responses (the same responses for both: common random numbers), with
    weights X^2, is sum X^2 ratio (c / ratio) / sum X^2 ratio: the two sums returned.
    The first is at most the second when c <= ratio: naive, sync_oracle, wait_for_slow
    and the clipped correctors with alpha w(Delta) <= 1 and rho_bar <= 1
    (c = alpha w min(rho_bar, ratio)); bare_additive (c = alpha, no ratio) delivers more
    where the responses lost probability since they were sampled (ratio < 1)."""
    x2 = np.asarray(resid, dtype=np.float64) ** 2
    return (x2 * np.asarray(c, dtype=np.float64)).sum(axis=-1), (x2 * np.asarray(ratio, dtype=np.float64)).sum(axis=-1)


def missing_share(delivered: np.ndarray, owed: np.ndarray, shares: Sequence[float], origins: np.ndarray) -> float:
    """Share of the slow residual's gradient that the updates lack against synchronous
    GRPO at the same policy: ``1 - sum_r w_k delivered_r / sum_r w_k owed_r`` over the slow
    results r of the steps ``origins`` (every lane: leading axis), with
    :func:`delivered_and_owed`'s sums (a result used in its own step or never: ratio 1,
    owed = its group's sum X^2, delivered = c times that, 0 if it never landed).
    In [0, 1] when c <= ratio on every row. At a frozen policy (ratio 1) it is Theorem
    2.1's slack eta = 1 - sum_k w_k sum_Delta c(Delta) Lambda[k, Delta] / sum w of the
    results measured, weighted by their groups' sum X^2 (exactly eta when those are
    equal). ``delivered``, ``owed``: (lanes, steps, P, K)."""
    w = np.asarray(shares, dtype=np.float64) / np.sum(shares)
    return float(1.0 - (delivered[:, origins] * w).sum() / (owed[:, origins] * w).sum())


def sync_directions(policy: Lanes, task: RewardTask, prompts: int, G: int, rngs: Sequence[np.random.Generator]):
    """On a large batch of ``prompts`` x ``G`` responses from each lane's current policy (lane
    s draws with ``rngs[s]``): the synchronous GRPO gradient g_sync (group-relative r_true) and
    the slow residual's gradient (group-relative r_true - r_fast) on each half of the groups,
    two independent estimates of g_res; each (S, n_params)."""
    pidx = np.stack([np.repeat(r.integers(0, task.n_prompts, prompts), G) for r in rngs])
    resp = policy.sample(pidx, rngs)
    rew = [task_rewards(task, x, y) for x, y in zip(pidx, resp)]
    adv = np.stack([group_relative(r_true, G) for _, r_true in rew])
    res = np.stack([group_relative(r_true - r_fast, G) for r_fast, r_true in rew])
    half = (prompts // 2) * G
    return (policy.gradient(pidx, resp, adv, float(pidx.shape[1])),
            policy.gradient(pidx[:, :half], resp[:, :half], res[:, :half], float(half)),
            policy.gradient(pidx[:, half:], resp[:, half:], res[:, half:], float(pidx.shape[1] - half)))


def missing_fraction(c0: np.ndarray, late_dot: np.ndarray, res_dot: np.ndarray) -> float:
    """Fraction of the slow residual's gradient g_res that the updates lack against
    synchronous GRPO, ``-<E[g] - g_sync, g_res> / ||g_res||^2``, pooled over checkpoints.

    An update is g = g_cur + g_late: its current batch's part, whose expectation is
    g_sync - (1 - c0) g_res (c0 the mean weight of the slow results used in their own
    step), and the late corrections. So the figure is
    ``mean(1 - c0) - sum <g_late, g_res> / sum ||g_res||^2``: 1 for naive, 0 for the sync
    oracle and, when E[g_late] = (1 - eta - c0) g_res, Theorem 2.1's slack eta (the
    tabular prediction). ``late_dot`` holds <g_late, (a + b) / 2> and ``res_dot`` <a, b>
    for two independent estimates a, b of g_res, so that the noise of the estimates
    inflates neither sum (||a||^2 would: an attenuation bias towards 1)."""
    return float(np.mean(1.0 - np.asarray(c0)) - np.sum(late_dot) / np.sum(res_dot))


def lane_slices(sched: ArrivalSchedule, name: str):
    """Per lane: (delay, status, landing step), each (steps, P, K); the sync oracle's
    results all land in their own step."""
    land = landing_step(sched, name)
    delay = np.zeros_like(sched.delay) if name == "sync_oracle" else sched.delay
    return [(delay[lane], sched.status[lane], land[lane]) for lane in range(sched.n_trials)]
