"""Correctors: what a late slow reward does to the advantage.

Small pure functions over NumPy arrays, vectorised over every leading axis
(trials, steps, batch, channels), in the style of rlax. Timing lives elsewhere:
the pipeline produces an :class:`~racsim.pipeline.schedule.ArrivalSchedule` (a delay
and a status per trial, step, sample and channel) and the functions here turn
it into the weights that the learner applies.

Notation follows the paper (``paper/rac-paper.tex``, section "Method"):

* ``X = r_slow - r_fast_bl``, the slow residual of one sample and channel;
* eq. (1), ``eq:rac``: the retroactive correction of a result that lands
  ``Delta`` optimizer steps late is
  ``delta = w_age(Delta) * alpha * rho_clip * X``, with
  ``w_age(Delta) = exp(-Delta / tau_age)`` and
  ``rho_clip = min(rho_bar, pi_current / pi_behaviour)``;
* the corrected advantage is ``A~ = A + delta`` with ``A = r_fast - bl``.

Every corrector is described by one number per element, the weight ``c``
multiplying ``X`` (:func:`correction_weight`); :func:`corrected_advantage`
applies it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from racsim.config.schema import CORRECTORS
from racsim.errors import ConfigError
from racsim.pipeline.schedule import INJECTED

__all__ = [
    "CorrectorParams",
    "age_weight",
    "geometric_weight",
    "clipped_ratio",
    "correction_weight",
    "corrected_advantage",
    "vtrace_advantage",
    "causal_running_mean",
    "BLOCKING",
    "SCHEDULE_FREE",
]


#: Correctors whose optimizer blocks until the slow results of its own rollout
#: are back; the pipeline (not the learner) makes the clock wait for them.
BLOCKING = frozenset({"wait_for_slow"})


#: Correctors that ignore the arrival schedule altogether (their weight does
#: not depend on delay or status).
SCHEDULE_FREE = frozenset({"naive", "sync_oracle"})


@dataclass(frozen=True)
class CorrectorParams:
    """The corrector knobs (paper eq. 1 and the Retrace-A baseline).

    alpha: global gain alpha > 0 of eq. (1).
    tau_age: time constant of the age kernel w_age(Delta) = exp(-Delta/tau_age),
        in optimizer steps; ``inf`` turns the age kernel off (w_age = 1).
    rho_bar: clip level of the importance ratio; ``inf`` disables the clip.
    retrace_gamma: per-step decay gamma of Retrace-A's kernel gamma**Delta.
    """

    alpha: float = 1.0
    tau_age: float = 1000.0
    rho_bar: float = 1.0
    retrace_gamma: float = 0.5

    def __post_init__(self) -> None:
        for key in ("alpha", "tau_age", "rho_bar"):
            v = getattr(self, key)
            if not (isinstance(v, (int, float, np.floating, np.integer)) and v > 0):
                raise ValueError(f"CorrectorParams.{key} = {v!r}: a positive number")
        if not (np.isfinite(self.alpha)):
            raise ValueError(f"CorrectorParams.alpha = {self.alpha!r}: a finite positive number")
        g = self.retrace_gamma
        if not (isinstance(g, (int, float, np.floating, np.integer)) and 0 <= g <= 1):
            raise ValueError(f"CorrectorParams.retrace_gamma = {g!r}: a number in [0, 1]")


def age_weight(delay, tau_age: float) -> np.ndarray:
    """Age kernel of eq. (1): ``w_age(Delta) = exp(-Delta / tau_age)``.

    The paper writes it as gamma**Delta with gamma = exp(-1/tau_age).
    ``tau_age = inf`` gives 1 everywhere (no age discount). float64 out.
    """
    d = np.asarray(delay, dtype=np.float64)
    if not tau_age > 0:
        raise ValueError(f"tau_age = {tau_age!r}: a positive number (or inf)")
    if np.isinf(tau_age):
        return np.ones_like(d)
    return np.exp(-d / float(tau_age))


def geometric_weight(delay, gamma: float) -> np.ndarray:
    """Retrace-A's geometric kernel ``gamma**Delta`` (in place of w_age in eq. 1).

    ``0**0 = 1``: a result used in its own step keeps full weight. float64 out.
    """
    if not 0 <= gamma <= 1:
        raise ValueError(f"gamma = {gamma!r}: a number in [0, 1]")
    d = np.asarray(delay, dtype=np.float64)
    return np.power(np.float64(gamma), d)


def clipped_ratio(ratio, rho_bar: float) -> np.ndarray:
    """V-trace-style clipped importance ratio of eq. (1):
    ``rho_clip = min(rho_bar, pi_current(a|s) / pi_behaviour(a|s))``.

    ``rho_bar = inf`` returns the ratio unchanged (as float64).
    """
    r = np.asarray(ratio, dtype=np.float64)
    if not rho_bar > 0:
        raise ValueError(f"rho_bar = {rho_bar!r}: a positive number (or inf)")
    if np.isinf(rho_bar):
        return r.copy()
    return np.minimum(np.float64(rho_bar), r)


def correction_weight(name: str, delay, status, ratio, params: CorrectorParams) -> np.ndarray:
    """Weight ``c`` multiplying the slow residual ``X = r_slow - r_fast_bl``.

    Paper eq. (1): a RAC correction is ``delta = c * X`` with
    ``c = w_age(Delta) * alpha * rho_clip``. ``delay`` and ``status`` are
    integer arrays of equal shape (for example an
    :class:`~racsim.pipeline.schedule.ArrivalSchedule`'s (trials, steps, batch, K));
    ``ratio`` is the importance ratio pi_current / pi_behaviour at the step
    that uses the result, broadcastable to them, or None for ratio 1 (the
    identity actor). Wherever ``status != INJECTED`` the weight is 0, except
    for the schedule-free correctors. Per corrector:

    * ``naive``: 0 (the slow signal is ignored);
    * ``sync_oracle``: 1 (every slow result at Delta = 0; ignores the schedule);
    * ``wait_for_slow``: 1 where injected (its blocking pipeline uses a
      result in the step that produced it, under the behaviour policy, so no
      ratio);
    * ``rac``: ``alpha * exp(-Delta/tau_age) * min(rho_bar, ratio)`` (eq. 1);
    * ``rac_no_age``: ``alpha * min(rho_bar, ratio)`` (ablation: no w_age);
    * ``bare_additive``: ``alpha`` (ablation: no w_age, no clipped ratio);
    * ``retrace_a``: ``alpha * retrace_gamma**Delta * min(rho_bar, ratio)``.

    Returns a float64 array of the broadcast shape of (delay, status, ratio).
    Raises :class:`~racsim.errors.ConfigError` for an unknown corrector.
    """
    if name not in _KNOWN:
        raise ConfigError("corrector.names", name, "one of " + ", ".join(CORRECTORS))
    delay = np.asarray(delay)
    status = np.asarray(status)
    if delay.shape != status.shape:
        raise ValueError(f"delay shape {delay.shape} != status shape {status.shape}")
    if ratio is None:
        shape = delay.shape
    else:
        ratio = np.asarray(ratio, dtype=np.float64)
        try:
            shape = np.broadcast_shapes(delay.shape, ratio.shape)
        except ValueError:
            raise ValueError(f"ratio shape {ratio.shape} does not broadcast to delay shape {delay.shape}") from None

    if name == "naive":
        return np.zeros(shape, dtype=np.float64)
    if name == "sync_oracle":
        return np.ones(shape, dtype=np.float64)

    injected = status == INJECTED
    if name == "wait_for_slow":
        return np.broadcast_to(injected.astype(np.float64), shape).copy()

    if np.any(delay[injected] < 0):
        raise ValueError("an injected result has a negative delay")
    # Delay -1 marks "not injected": give those elements a harmless delay 0
    # so that no kernel is evaluated at a negative power, then mask them.
    d = np.where(injected, delay, 0)
    alpha = np.float64(params.alpha)
    if name == "bare_additive":
        w = np.full(d.shape, alpha)
    else:
        rho = clipped_ratio(1.0 if ratio is None else ratio, params.rho_bar)
        if name == "rac":
            kern = age_weight(d, params.tau_age)
        elif name == "retrace_a":
            kern = geometric_weight(d, params.retrace_gamma)
        else:  # rac_no_age
            kern = np.ones(d.shape)
        w = alpha * kern * rho
    return np.broadcast_to(np.where(injected, w, 0.0), shape).astype(np.float64, copy=True)


def corrected_advantage(r_fast, r_slow, baseline, weight) -> np.ndarray:
    """Corrected advantage of eq. (1) in replacement form.

    ``A~ = (r_fast - bl) + c * (r_slow - r_fast)`` with ``c`` the weight of
    :func:`correction_weight` and ``r_fast_bl = r_fast`` (the identity
    baseline of the fast estimate). It is evaluated as
    ``((1 - c) * r_fast + c * r_slow) - bl``, algebraically the same, so that
    at ``c = 1`` the result is ``r_slow - bl`` bit for bit: ``1 - 1`` is
    exactly 0, ``0 * r_fast`` is exactly (signed) zero, ``1 * r_slow`` is
    exactly ``r_slow``, and ``0 + y`` is exactly ``y`` in IEEE-754, so the
    final subtraction sees the very operands of :func:`vtrace_advantage`
    (only the sign of an exact zero may differ, which compares equal).
    The literal form ``r_fast - bl + (r_slow - r_fast)`` rounds twice and
    is not bit-identical. Finite inputs are assumed (``0 * inf`` is nan).
    """
    r_fast = np.asarray(r_fast, dtype=np.float64)
    r_slow = np.asarray(r_slow, dtype=np.float64)
    c = np.asarray(weight, dtype=np.float64)
    return ((1.0 - c) * r_fast + c * r_slow) - np.asarray(baseline, dtype=np.float64)


def vtrace_advantage(r_slow, baseline) -> np.ndarray:
    """On-policy V-trace advantage at the identity kernel Lambda = I:
    ``r_slow - bl`` (the boundary case of Theorem 2.1). Kept as a separate
    code path so that RAC's collapse onto it can be checked."""
    return np.asarray(r_slow, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)


def causal_running_mean(x, axis: int = -1) -> np.ndarray:
    """Causal baseline ``bl_t = mean(x_0, ..., x_{t-1})`` along ``axis``, ``bl_0 = 0``.

    Uses only the past, so the baseline of step t is independent of step t's
    own sample. float64 out, same shape as ``x``.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 0:
        raise ValueError("causal_running_mean needs an array with at least one axis")
    xm = np.moveaxis(x, axis, -1)
    n = xm.shape[-1]
    out = np.zeros_like(xm)
    if n > 1:
        cs = np.cumsum(xm[..., :-1], axis=-1)
        out[..., 1:] = cs / np.arange(1, n, dtype=np.float64)
    return np.moveaxis(out, -1, axis)


# The names come from the one list, config.CORRECTORS; that correction_weight implements
# each of them as documented is checked by tests/test_correctors.py against an oracle.
_KNOWN = frozenset(CORRECTORS)


assert BLOCKING <= _KNOWN and SCHEDULE_FREE <= _KNOWN
