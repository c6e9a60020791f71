"""Fixed-policy bias benchmark on the tabular MDP.

A trial is one simulated training run of ``steps`` optimizer steps with
``batch`` trajectories each; every trajectory's gradient is the score-function
gradient of the fast return plus, for every slow channel, the channel's return
times the corrector's weight c (paper eq. 1; c = 0 for a result dropped or not
back). The policy is fixed (identity actor, rho = 1), so the exact expectation
of an estimate given the arrival schedule is  G_fast + sum_k mean(c_k) G_k,
with G the exact expectation of the finite-T estimator per reward channel; it
is reported beside the Monte-Carlo figure and its standard error. Two views:

* ``steady`` (the headline): the gradient of one update in the pipeline's
  stationary regime. The updates of steps ``warmup .. steps-1`` are averaged:
  each holds its own step's fast gradients and the slow results that land at
  it, whatever step they were generated at. Results dropped (past max_delay,
  timed out) are lost; a result still in flight when the simulation ends is
  not (it would land in a later update).
* ``run``: the whole finite run, every rollout's slow results weighted by
  rollout step, so results in flight at the end count as lost (the end-of-run
  loss of a run this short; it vanishes in a run of thousands of steps).

A schedule with generation lags (samples from older policies) makes the policy
move: racsim.learner.drift measures that case; its BiasRun carries per-view
targets and exact figures per trial (:attr:`BiasRun.targets`,
:attr:`BiasRun.exact_trials`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from racsim.config.validate.estimate import RECALL_BYTES
from racsim.io import recall
from racsim.learner import mdp as M
from racsim.learner.correctors import (
    BLOCKING,
    SCHEDULE_FREE,
    CorrectorParams,
    correction_weight,
    kernel_tau_age,
    split_name,
)
from racsim.learner.rollouts import (
    discounted_returns,
    sample_trajectories,
    score_gradient,
)
from racsim.learner.theory import (
    effective_kernel,
    measured_kernel,
    predicted_bias,
    slack,
)
from racsim.pipeline.schedule import INJECTED, ArrivalSchedule

# Trajectories simulated at once; bounds memory at about (n * T * (K + 1)) floats.
CHUNK_TRAJECTORIES = 40_000


VIEWS = ("steady", "run")  # the headline first


@dataclass
class BiasRun:
    """Raw output: per-trial estimates and exact expectations, flattened over (S, A),
    per view (:data:`VIEWS`) and corrector."""

    target: np.ndarray  # g*, the stationary true gradient
    channel_exact: np.ndarray  # (C, S*A) exact finite-T expectation per reward channel (0 = fast)
    estimates: Dict[str, Dict[str, np.ndarray]] = field(default_factory=dict)  # view -> name -> (trials, S*A)
    mean_weight: Dict[str, Dict[str, np.ndarray]] = field(default_factory=dict)  # view -> name -> (K,)
    # steady view: name -> (trials, steps - warmup, K) the weights landed in each step's update, over the
    # batch (for intervals over trials or batches of steps: racsim.analyses.capacity.intervals.bias_intervals)
    step_weight: Dict[str, np.ndarray] = field(default_factory=dict)
    max_weight: Dict[str, np.ndarray] = field(default_factory=dict)  # name -> (K,) the largest weight of a result
    nominal_slack: Dict[str, np.ndarray] = field(default_factory=dict)  # name -> (K,) eta_k predicted, NaN: no law
    trajectories: int = 0
    # With generation lags (racsim.learner.drift), the policy moves: each view's target (the mean true
    # gradient of its updates) and each row's exact expectation per trial, (trials, S*A), given its schedule.
    targets: Dict[str, np.ndarray] = field(default_factory=dict)  # view -> (S*A,)
    exact_trials: Dict[str, Dict[str, np.ndarray]] = field(default_factory=dict)  # view -> name -> (trials, S*A)

    def target_of(self, view: str) -> np.ndarray:
        """The true gradient a view's estimates are compared with: g*, or with a moving policy the mean
        of g*(theta_u) over the view's updates."""
        return self.targets.get(view, self.target)

    def exact(self, name: str, view: str = "steady") -> np.ndarray:
        """E[estimate | arrival schedule] for corrector ``name``: G_fast + sum_k mean(c_k) G_k,
        from the weights the run applied (with a moving policy: the mean over trials of
        :attr:`exact_trials`)."""
        if name in self.exact_trials.get(view, {}):
            return self.exact_trials[view][name].mean(axis=0)
        return self.channel_exact[0] + self.mean_weight[view][name] @ self.channel_exact[1:]

    def slack(self, name: str, view: str = "steady") -> np.ndarray:
        """Measured slack eta_k = 1 - mean(c_k): the share of channel k's slow
        reward the corrector did not put back (identity actor), within its range
        (:func:`share_in_range`, where the corrector's largest weight is known)."""
        eta = 1.0 - self.mean_weight[view][name]
        return eta if name not in self.max_weight else share_in_range(eta, self.max_weight[name])

    def predicted(self, name: str) -> np.ndarray:
        """Theorem 2.1 (eq. ``eq:thm-unbiased``) from the nominal kernel: the synchronous
        expectation minus sum_k eta_k E[X_k], eta from the configured delay law
        (:func:`racsim.pipeline.kernels.predicted_kernel`), not from the simulation."""
        sync = self.channel_exact.sum(0)
        return sync + predicted_bias(self.nominal_slack[name], self.channel_exact[1:])


def share_in_range(eta: np.ndarray, max_weight: np.ndarray) -> np.ndarray:
    """A measured slack eta_k = 1 - mean(c_k) within the range its expectation lies in,
    [1 - max c_k, 1] (weights c_k >= 0, at most ``max_weight``): the steady view's mean is
    per update, and the results landing in the window's updates (some sent before it) can
    outnumber the window's own, so that a corrector that puts every result back at weight 1
    read eta -1.25e-04 (issue 49)."""
    return np.clip(eta, 1.0 - np.asarray(max_weight, dtype=np.float64), 1.0)


def schedule_for(name: str, schedules: Dict[str, ArrivalSchedule]) -> ArrivalSchedule:
    """The schedule a row (a corrector, or one combined with a rollout-axis corrector) runs on: the
    blocking pipeline's for wait-for-slow, the asynchronous one's otherwise."""
    return schedules["blocking" if split_name(name)[0] in BLOCKING else "async"]


@dataclass
class Cell:
    """One cell of a study: its arrival schedules, correctors and knobs.

    ``mdp``/``fast_noise_std`` override the run's rewards and noise for this cell.
    ``nominal_kernel`` (K, D+1), when given with ``row_normalize``, scales each
    channel's weights of the schedule-driven correctors by 1 / sum_D w(D) Lambda[k, D]
    so that their effective kernel rows sum to one (Theorem 2.1's condition R).
    ``predicted`` holds the kernels the configuration predicts ("async", "blocking":
    (K, D+1), NaN rows where no law does), for the theorem's prediction.
    ``warmup``: the steady view measures the updates of steps warmup .. steps-1.
    """

    schedules: Dict[str, ArrivalSchedule]
    names: List[str]
    params: CorrectorParams
    nominal_kernel: Optional[np.ndarray] = None
    row_normalize: bool = False
    mdp: Optional[M.TabularMDP] = None  # the cell's own rewards (same transitions), if they differ
    fast_noise_std: Optional[float] = None  # the cell's own fast-channel noise, if it differs
    predicted: Optional[Dict[str, np.ndarray]] = None
    warmup: int = 0
    route: Optional[np.ndarray] = None  # (K,) probability that a sample goes to each channel; None: all do


def _delay_weights(name: str, lam: np.ndarray, params: CorrectorParams) -> np.ndarray:
    """The corrector's weight at each delay 0..D of the kernel ``lam`` (K, D+1) (identity actor),
    shape (K, D+1). rac_adaptive, whose tau_age comes from a run's history, takes its long-run
    value for this kernel (:func:`~racsim.learner.correctors.kernel_tau_age`)."""
    K, width = lam.shape
    grid = np.broadcast_to(np.arange(width), (K, width))
    tau = kernel_tau_age(lam, params)[:, None] if name == "rac_adaptive" else None
    return correction_weight(name, grid, np.full(grid.shape, INJECTED), None, params, tau_age=tau)


def kernel_slack(name: str, lam: np.ndarray, params: CorrectorParams, gain) -> np.ndarray:
    """Theorem 2.1's slack eta_k = 1 - sum_D alpha_k w(D) Lambda[k, D] of corrector ``name``
    on the kernel ``lam`` (K, D+1); NaN for a row of NaN (no kernel known)."""
    K = lam.shape[0]
    if name in SCHEDULE_FREE:
        return np.zeros(K) if name == "sync_oracle" else np.ones(K)
    known = ~np.isnan(lam).any(axis=1)
    out = np.full(K, np.nan)
    if known.any():
        w = _delay_weights(name, lam[known], params)
        out[known] = slack(effective_kernel(lam[known], alpha=np.broadcast_to(gain, (K,))[known], weight=w))
    return out


def corrector_slack(name: str, sched: ArrivalSchedule, params: CorrectorParams, gain=1.0) -> np.ndarray:
    """:func:`kernel_slack` on the kernel the schedule realised (:func:`~racsim.learner.theory.measured_kernel`)."""
    return kernel_slack(name, measured_kernel(sched.delay, sched.status), params, gain)


def channel_gain(name: str, cell: Cell) -> np.ndarray:
    """Per-channel factor on the corrector's weights: 1, or the row normalisation
    alpha_k = 1 / sum_D w(D) Lambda[k, D] of the nominal kernel (1 where that is 0)."""
    K = cell.schedules["async"].n_channels
    if not cell.row_normalize or cell.nominal_kernel is None or name in SCHEDULE_FREE or name in BLOCKING:
        return np.ones(K)
    lam = cell.nominal_kernel
    mass = effective_kernel(lam, weight=_delay_weights(name, lam, cell.params)).sum(axis=1)
    return np.where(mass > 0, 1.0 / np.where(mass > 0, mass, 1.0), 1.0)


def routing_gain(name: str, cell: Cell) -> np.ndarray:
    """1 / p_k on channel k's routed results for the schedule-driven correctors (see :class:`Cell`)."""
    K = cell.schedules["async"].n_channels
    if cell.route is None or name in SCHEDULE_FREE:
        return np.ones(K)
    return 1.0 / np.asarray(cell.route, dtype=np.float64)


def landing_step(name: str, sched: ArrivalSchedule) -> np.ndarray:
    """(trials, steps, batch, K) the step whose update a result joins: t + delay (the
    synchronous oracle's: t, its own step's); meaningful where the result is injected."""
    t = np.arange(sched.n_steps)[None, :, None, None]
    return np.broadcast_to(t, sched.delay.shape) if name == "sync_oracle" else t + sched.delay


def steady_mask(name: str, sched: ArrivalSchedule, warmup: int) -> np.ndarray:
    """(trials, steps, batch, K): the results that the updates of steps warmup..steps-1
    use, i.e. that land at one of them (:func:`landing_step`).
    A result landed after the last step (``pipeline.drain``'s final update) is not one."""
    land = landing_step(name, sched)
    if name == "sync_oracle":
        return land >= warmup
    return (sched.status == INJECTED) & (land >= warmup) & (land < sched.n_steps)


def group_sums(index: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """(n, C) the sums of ``values`` (..., C) by group, column by column: entry [..., c] adds to
    row ``index[..., c]`` (``index`` broadcast to ``values``' shape; 0 <= index < n)."""
    C = values.shape[-1]
    idx = np.broadcast_to(index, values.shape) * C + np.arange(C)
    return np.bincount(idx.ravel(), values.ravel(), n * C).reshape(n, C)


def landed_means(weights: np.ndarray, land: np.ndarray, warmup: int) -> np.ndarray:
    """(trials, steps - warmup, K) the weights (trials, steps, batch, K; 0 where not used) summed
    by the update they land in (``land``: :func:`landing_step`), over the batch: each update's
    mean weight per channel. A steady weight lands at warmup..steps-1 (:func:`steady_mask`)."""
    trials, steps, batch, K = weights.shape
    W = steps - warmup
    cell = np.clip(land - warmup, 0, W - 1) + W * np.arange(trials)[:, None, None, None]
    return group_sums(cell, weights, trials * W).reshape(trials, W, K) / batch


def run_bias(
    mdp: M.TabularMDP,
    theta: np.ndarray,
    schedules: Dict[str, ArrivalSchedule],
    names: List[str],
    params: CorrectorParams,
    horizon: int,
    rng: np.random.Generator,
    fast_noise_std: float = 0.0,
    progress: Optional[Callable[[int], None]] = None,
    warmup: int = 0,
) -> BiasRun:
    """Monte-Carlo estimates of every corrector on shared trajectories (common random numbers)."""
    cell = Cell(schedules, names, params, warmup=warmup)
    return run_bias_cells(mdp, theta, [cell], horizon, rng, fast_noise_std, progress)[0]


def _atoms(tables: List[np.ndarray]) -> tuple:
    """Reward "atoms" whose per-trajectory gradients every table combines linearly.

    ``tables``: each cell's (C, S*A) reward channels. When there are fewer
    distinct rows than (s, a) pairs, the atoms are those rows and each channel
    selects one; otherwise the atoms are the (s, a) indicator rewards and each
    channel weighs them by its table. Returns (atoms (R, S*A), [coefficients (C, R)]).
    """
    rows = np.concatenate(tables)
    distinct, inverse = np.unique(rows, axis=0, return_inverse=True)
    SA = rows.shape[1]
    if len(distinct) <= SA:
        eye = np.eye(len(distinct))
        coefs, at = [], 0
        for t in tables:
            coefs.append(eye[inverse.ravel()[at:at + len(t)]])
            at += len(t)
        return distinct, coefs
    return np.eye(SA), [t for t in tables]


def _distinct_weights(w_cell: Dict[str, np.ndarray]) -> Tuple[Dict[str, int], np.ndarray]:
    """Correctors whose weights are equal share one row of the GEMM, so that their
    estimates are equal to the last bit (a BLAS may round two equal rows of one
    product differently). Returns (name -> row, stacked distinct rows (M, trials, steps*batch, K))."""
    rows: List[np.ndarray] = []
    index: Dict[str, int] = {}
    for name, w in w_cell.items():
        index[name] = next((i for i, r in enumerate(rows) if np.array_equal(r, w)), len(rows))
        if index[name] == len(rows):
            rows.append(w)
    return index, np.stack(rows)


def run_bias_cells(
    mdp: M.TabularMDP,
    theta: np.ndarray,
    cells: List[Cell],
    horizon: int,
    rng: np.random.Generator,
    fast_noise_std: float = 0.0,
    progress: Optional[Callable[[int], None]] = None,
) -> List[BiasRun]:
    """:func:`run_bias` for several cells that share the learner (transitions,
    policy, horizon, trials, steps, batch): the trajectories are sampled once and
    every cell's correctors weigh the same per-trajectory gradients. A cell may
    bring its own rewards (``Cell.mdp``: other channel splits, K, noise) and
    fast-channel noise (``Cell.fast_noise_std``); the gradients are linear in the
    reward, so they are combined from shared reward atoms (:func:`_atoms`)."""
    trials, steps, batch = cells[0].schedules["async"].delay.shape[:3]
    S, A = mdp.n_states, mdp.n_actions
    SA = S * A
    pi = M.softmax_policy(theta)
    cell_mdps = [cell.mdp or mdp for cell in cells]
    noise = [fast_noise_std if cell.fast_noise_std is None else cell.fast_noise_std for cell in cells]
    plan = TrajectoryPlan.of(mdp, cell_mdps, noise, trials, steps * batch)
    atoms, coefs, tables = plan.atoms, plan.coefs, plan.tables
    runs, weights = [], []
    for cell, m, table in zip(cells, cell_mdps, tables):
        if cell.schedules["async"].delay.shape[:3] != (trials, steps, batch) or m.P.shape != mdp.P.shape:
            raise ValueError("cells sharing trajectories need the same (trials, steps, batch) and MDP shape")
        K = cell.schedules["async"].n_channels
        exact = M.finite_horizon_expectation(m, theta, horizon, table.reshape(-1, S, A)).reshape(K + 1, SA)
        run = BiasRun(target=M.true_gradient(m, theta).ravel(), channel_exact=exact)
        w_cell = {}
        n_win = (steps - cell.warmup) * batch  # the steady view's trajectories per trial
        for name in cell.names:
            base = split_name(name)[0]  # a fixed policy: every rollout-axis weight is 1 (no sample is stale)
            sched = schedule_for(base, cell.schedules)
            gain = channel_gain(base, cell) * routing_gain(base, cell)
            w = np.broadcast_to(correction_weight(base, sched.delay, sched.status, None, cell.params) * gain,
                                sched.delay.shape)
            ss = np.where(steady_mask(base, sched, cell.warmup), w, 0.0)
            run.step_weight[name] = landed_means(ss, landing_step(base, sched), cell.warmup)
            w_cell["run", name] = w.reshape(trials, steps * batch, K)
            w_cell["steady", name] = ss.reshape(trials, steps * batch, K)
            run.max_weight[name] = w.max(axis=(0, 1, 2))
            run.mean_weight.setdefault("run", {})[name] = w_cell["run", name].mean(axis=(0, 1))
            run.mean_weight.setdefault("steady", {})[name] = ss.sum(axis=(0, 1, 2)) / (trials * n_win)
            for view in VIEWS:
                run.estimates.setdefault(view, {})[name] = np.empty((trials, SA))
            if cell.predicted is not None:
                lam = cell.predicted["blocking" if base in BLOCKING else "async"]
                run.nominal_slack[name] = kernel_slack(base, lam, cell.params, gain)
        runs.append(run)
        weights.append((_distinct_weights(w_cell), cell.warmup))
    per_trial = steps * batch
    every = plan.gradients(mdp, pi, horizon, rng)  # every chunk's at once where they are small enough
    for lo, hi in plan.chunks:
        n = (hi - lo) * per_trial
        g = (every[lo * per_trial:hi * per_trial] if every is not None
             else chunk_gradients(mdp, pi, atoms, n, horizon, rng, plan.noisy))  # (n, R [+1], SA)
        for run, coef, sd, ((rows, stacked), warmup) in zip(runs, coefs, noise, weights):
            gc = np.einsum("nrs,cr->ncs", g[:, : len(atoms)], coef)  # this cell's channels (n, K+1, SA)
            if sd > 0:
                gc[:, 0] += sd * g[:, -1]
            K = gc.shape[1] - 1
            gc = gc.reshape(hi - lo, per_trial, K + 1, SA)
            # per view: the fast gradients of its updates' own rollouts, and the divisor
            fast = {"run": (gc[:, :, 0].mean(axis=1), per_trial),
                    "steady": (gc[:, warmup * batch:, 0].mean(axis=1), (steps - warmup) * batch)}
            # every corrector and view of the cell at once: one (weights x samples) GEMM per trial
            slow = gc[:, :, 1:].reshape(hi - lo, per_trial * K, SA)
            w = stacked[:, lo:hi].reshape(len(stacked), hi - lo, per_trial * K).transpose(1, 0, 2)
            est = np.matmul(w, slow).transpose(1, 0, 2)
            for (view, name), row in rows.items():
                f, denom = fast[view]
                run.estimates[view][name][lo:hi] = f + est[row] / denom
            run.trajectories += n
        if progress is not None:
            progress(hi - lo)
    return runs


def chunk_gradients(mdp: M.TabularMDP, pi: np.ndarray, atoms: np.ndarray, n: int, horizon: int,
                    rng: np.random.Generator, noisy: bool) -> np.ndarray:
    """(n, R [+1], S*A) score-function gradients of n fresh trajectories, one per reward atom
    (:func:`_atoms`), and with ``noisy`` one more for unit fast-channel noise (drawn after them)."""
    S, A = mdp.n_states, mdp.n_actions
    states, actions = sample_trajectories(mdp, pi, n, horizon, rng, time_major=True)  # (T, n)
    r = atoms.reshape(-1, S, A)[:, states, actions]  # (R, T, n)
    if noisy:  # unit noise, scaled per cell: the noise-levels of a grid are paired
        r = np.concatenate([r, rng.standard_normal((n, horizon)).T[None]])
    G = discounted_returns(r, mdp.gamma, axis=1)
    return score_gradient(states, actions, G, pi, time_major=True).reshape(n, -1, S * A)


@dataclass(frozen=True)
class TrajectoryPlan:
    """How :func:`run_bias_cells` samples its trajectories: the reward atoms (:func:`_atoms`) and
    each cell's coefficients on them, whether fast-channel noise is drawn, and the chunks of trials
    (lo, hi) sampled one after the other, ``per_trial`` trajectories a trial."""

    atoms: np.ndarray
    coefs: list
    tables: list
    noisy: bool
    chunks: List[Tuple[int, int]]
    per_trial: int

    @staticmethod
    def of(mdp: M.TabularMDP, cell_mdps: List[M.TabularMDP], noise: List[float], trials: int,
           per_trial: int) -> "TrajectoryPlan":
        SA = mdp.n_states * mdp.n_actions
        tables = [np.concatenate([m.r_fast[None], m.r_slow]).reshape(-1, SA) for m in cell_mdps]
        atoms, coefs = _atoms(tables)
        noisy = any(sd > 0 for sd in noise)
        budget = CHUNK_TRAJECTORIES * 3 // max(3, len(atoms) + noisy)  # bounds the (atoms x T x n) returns
        chunk = max(1, budget // per_trial)
        return TrajectoryPlan(atoms, coefs, tables, noisy,
                              [(lo, min(trials, lo + chunk)) for lo in range(0, trials, chunk)], per_trial)

    def gradients(self, mdp: M.TabularMDP, pi: np.ndarray, horizon: int, rng: np.random.Generator,
                  wait: bool = True) -> Optional[np.ndarray]:
        """Every chunk's :func:`chunk_gradients`, one after the other, stacked (read-only), where they
        take at most :data:`~racsim.config.validate.estimate.RECALL_BYTES` (else None: each chunk's
        are computed as it comes); computed once for the same learner, plan and generator state
        (racsim.io.recall: a capacity search's counts share their trajectories), the generator moved
        on as they moved it. ``wait=False``: None at once where another process of the pool is
        computing them (racsim.analyses.bias_study.prefetch_trajectories)."""
        n = self.chunks[-1][1] * self.per_trial
        if n * (len(self.atoms) + self.noisy) * mdp.n_states * mdp.n_actions * 8 > RECALL_BYTES:
            return None
        sizes = [(hi - lo) * self.per_trial for lo, hi in self.chunks]
        what = repr(([hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
                      for a in (mdp.P, mdp.start, pi, self.atoms)], mdp.gamma, sizes, horizon, self.noisy,
                     rng.bit_generator.state))

        def fresh():
            parts = [chunk_gradients(mdp, pi, self.atoms, k, horizon, rng, self.noisy) for k in sizes]
            return parts[0] if len(parts) == 1 else np.concatenate(parts), rng.bit_generator.state

        got = recall("gradients", what, fresh, wait=wait)
        if got is None:
            return None
        rng.bit_generator.state = got[1]
        return got[0]


def bootstrap_counts(n: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(resamples, n) multinomial counts: each row one bootstrap resample of the trials."""
    idx = rng.integers(0, n, size=(resamples, n)) + n * np.arange(resamples)[:, None]
    return np.bincount(idx.ravel(), minlength=resamples * n).reshape(resamples, n).astype(np.float64)


def _view_figures(run: BiasRun, view: str, name: str, boot: Optional[np.ndarray]) -> dict:
    """Bias of one corrector in one view: Monte Carlo with its s.e. and bootstrap CI, exact."""
    est = run.estimates[view][name]
    g = run.target_of(view)
    row = {
        "bias_mc": float(np.linalg.norm(est.mean(axis=0) - g)),
        "mc_se": float(np.sqrt(est.var(axis=0, ddof=1).sum() / est.shape[0])),
        "bias_exact": float(np.linalg.norm(run.exact(name, view) - g)),
        "slack_eta": float(run.slack(name, view).mean()),
    }
    if boot is not None:
        row["bias_ci_lo"], row["bias_ci_hi"] = map(float, np.percentile(boot, [2.5, 97.5]))
    return row


def summarize(run: BiasRun, resamples: int, rng: np.random.Generator, baseline: str = "naive",
              counts: Optional[np.ndarray] = None,
              exact_boot: Optional[Dict[str, np.ndarray]] = None) -> Dict[str, dict]:
    """Per corrector: the steady-state bias (Monte Carlo, exact, standard error,
    bootstrap CI of the Monte-Carlo figure), its decomposition, Theorem 2.1's prediction
    from the nominal kernel and its gap, VIF, RMSE, the exact bias-reduction ratio against
    ``baseline`` with its 95% interval: the percentiles of the ratio of ``exact_boot``'s
    paired replicates of each exact bias (name -> (R,), the trials resampled:
    racsim.analyses.bias_study.exact_replicates), none without them; and the run-level
    figures as ``run_*``. ``counts`` (from :func:`bootstrap_counts`) may be passed to
    reuse a resample."""
    g = run.target_of("steady")
    names = list(run.estimates["steady"])
    trials = next(iter(run.estimates["steady"].values())).shape[0]
    if counts is None and resamples > 0:
        counts = bootstrap_counts(trials, resamples, rng)
    boot_bias: Dict[Tuple[str, str], np.ndarray] = {}
    if counts is not None:  # every corrector's bootstrap means, both views, from one product
        keys = [(v, nm) for v in VIEWS for nm in names]
        stacked = np.concatenate([run.estimates[v][nm] for v, nm in keys], axis=1)
        means = (counts @ stacked / trials).reshape(len(counts), len(keys), -1)
        boot_bias = {key: np.linalg.norm(means[:, j] - run.target_of(key[0]), axis=1) for j, key in enumerate(keys)}
    sync = run.channel_exact.sum(0)
    out = {}
    for name in names:
        est = run.estimates["steady"][name]
        var = est.var(axis=0, ddof=1)
        row = _view_figures(run, "steady", name, boot_bias.get(("steady", name)))
        exact = run.exact(name)
        row.update({
            "total_variance": float(var.sum()),
            "rmse": float(np.sqrt(np.mean(np.sum((est - g) ** 2, axis=1)))),
            # Decomposition of the exact bias: the corrector's distance to the synchronous
            # expectation (the slack's part), and the finite-T / initial-state truncation
            # every estimator has (the synchronous oracle's whole bias); noise is mc_se.
            "bias_vs_sync_exact": float(np.linalg.norm(exact - sync)),
            "bias_vs_sync_mc": float(np.linalg.norm(est.mean(axis=0) - sync)),
            "bias_truncation": float(np.linalg.norm(sync - g)),
        })
        row.update(_theorem_figures(run, name, row["bias_exact"]))
        if "sync_oracle" in names:
            row["linf_vs_sync"] = float(np.abs(est - run.estimates["steady"]["sync_oracle"]).max())
        row["at_noise_floor"] = bool(row["bias_mc"] < 2.0 * row["mc_se"])
        if exact_boot is not None and name in run.exact_trials.get("steady", {}):  # a moving policy: exact per trial
            row["bias_exact_ci_lo"], row["bias_exact_ci_hi"] = map(float, np.percentile(exact_boot[name], [2.5, 97.5]))
        whole = _view_figures(run, "run", name, boot_bias.get(("run", name)))
        row.update({f"run_{k}": v for k, v in whole.items()})
        # the end-of-run loss: the part of the run's slack a stationary update does not have
        row["eta_end_of_run"] = row["run_slack_eta"] - row["slack_eta"]
        out[name] = row
    if baseline in out:
        base = out[baseline]
        for name, row in out.items():
            row["vif"] = row["total_variance"] / base["total_variance"] if base["total_variance"] > 0 else float("nan")
            for pre in ("", "run_"):
                row[f"{pre}reduction_mc"] = _ratio(base[f"{pre}bias_mc"], row[f"{pre}bias_mc"])
                row[f"{pre}reduction_exact"] = _ratio(base[f"{pre}bias_exact"], row[f"{pre}bias_exact"])
            if exact_boot is not None:
                r = exact_boot[baseline] / np.maximum(exact_boot[name], 1e-300)
                row["reduction_ci_lo"], row["reduction_ci_hi"] = map(float, np.percentile(r, [2.5, 97.5]))
    return out


def _theorem_figures(run: BiasRun, name: str, bias_exact: float) -> dict:
    """Theorem 2.1 from the nominal kernel beside the exact steady-state bias: the predicted
    bias, its gap to the exact one, the predicted slack and the pointwise ratio
    (exact - sync) / (predicted - sync) where the prediction is not ~0. NaN where no
    delay law predicts the kernel (gpu_rm channels, a GPU fast scorer)."""
    nan = float("nan")
    eta = run.nominal_slack.get(name)
    if eta is None or np.isnan(eta).any():
        return {"bias_theorem": nan, "theorem_gap": nan, "eta_nominal": nan, "bias_vs_sync_theorem": nan,
                "theorem_ratio_mean": nan, "theorem_ratio_std": nan}
    sync = run.channel_exact.sum(0)
    pred = run.predicted(name)
    bias_theorem = float(np.linalg.norm(pred - run.target))
    mask = np.abs(pred - sync) > 1e-12 * max(1.0, np.abs(sync).max())
    ratio = (run.exact(name) - sync)[mask] / (pred - sync)[mask]
    return {
        "bias_theorem": bias_theorem,
        "theorem_gap": bias_exact - bias_theorem,
        "eta_nominal": float(eta.mean()),
        "bias_vs_sync_theorem": float(np.linalg.norm(pred - sync)),  # || sum_k eta_k E[X_k] ||
        "theorem_ratio_mean": float(ratio.mean()) if ratio.size else nan,
        "theorem_ratio_std": float(ratio.std()) if ratio.size else nan,
    }


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf")
