"""Arrivals over time (issue 11, knob 2): when each sample of a step reaches the slow channels.

``pipeline.arrivals.mode=batch`` (the default) sends a step's B samples to every slow
channel at one instant, after generate, fast_score and submit. The other modes send
sample b of step t at ``step_start[t] + offset[t, b]``, the second its rollout is ready;
the fast score, submit and update stay per step, after the generate phase, so the
optimizer's clock is a step of generate + fast_score + submit (+ wait) + update as before:

* ``stream``: offset ~ ``arrivals.length`` (iid per sample), the generate phase is the
  step's largest offset (all rollouts start with the step, it ends with the last);
* ``poisson``: offset = L_t x U, U ~ U(0, 1) iid, L_t the step's length on the asynchronous
  clock (the sum of its drawn phases): given its B arrivals in [0, L_t], a Poisson process's
  arrival times are B iid uniforms on it, and the steps' intervals tile the clock, so the
  samples arrive as a Poisson process of rate B / E[L] conditioned on B per step (gaps of mean
  E[L] / B and variance ratio B / (B + 2) for a fixed length, -> 1, the exponential law's);
* ``uniform``: offset = G_t x U, each uniform on the drawn generate phase G_t alone (no arrival
  while the optimizer scores and updates: gaps' variance ratio well above 1);
* ``trace``: the CSV column's offsets in order over (step, sample), cycled, the same in
  every trial; the generate phase is the step's largest offset;
* ``open_poisson``: an open Poisson stream of rate B / E[L] (E[L] the nominal step) that never
  waits for the optimizer (:func:`open_stream`): the count in a stretch of clock is random, not
  B a step. The learner takes the stream's samples in order, B a step (samples t B ... t B + B - 1
  are step t's); the step's generate phase lasts until its last one is ready (0 if that was
  before the step began), so the optimizer's clock follows the stream. A sample beyond the batch
  belongs to the next step: one that is ready while the optimizer still scores or updates the
  step before is sent at once (a negative offset) and counts as its own step's, like any other
  (injected, dropped or pending), so every request of the stream is one sample of the learner.
  A blocking optimizer holds the stream while it waits: a sample ready before its step begins
  is sent at the step's start.

The queue then sees the samples in the order they are ready (ties in sample order). A
gpu_rm pool's batcher takes each sample's requests as one group the second it is ready
(:class:`ReadyPool`), a fixed pool's or an autoscaled one's; an autoscaled queue channel
takes each sample as a group of one job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

import numpy as np

from racsim.pipeline.latency import _read_column, build_latency


def draw_offsets(arrivals: Any, phase: np.ndarray, batch: int,
                 rng: np.random.Generator, mean_step: float = 0.0) -> Tuple[Optional[np.ndarray], np.ndarray]:
    """(offset, generate phase): offset (trials, steps, batch) seconds from the step's start at
    which each sample is ready (None in batch mode), and the generate phase (trials, steps)
    that goes with it. ``phase``: the drawn phases (4, trials, steps), generate first;
    ``mean_step``: the nominal step (open_poisson's rate is batch / mean_step). Draws only in
    stream, poisson, uniform and open_poisson mode."""
    mode, gen = arrivals.mode, phase[0]
    if mode == "batch":
        return None, gen
    if mode == "open_poisson":
        gaps = rng.exponential(mean_step / batch, gen.shape + (batch,))
        return open_stream(np.cumsum(gaps.reshape(gen.shape[0], -1), axis=1).reshape(gaps.shape), phase)
    if mode in ("poisson", "uniform"):
        span = phase.sum(axis=0) if mode == "poisson" else gen
        return span[..., None] * rng.random(gen.shape + (batch,)), gen
    if mode == "stream":
        offset = build_latency(arrivals.length, "pipeline.arrivals.length").sample(rng, gen.shape + (batch,))
    else:
        offset = trace_offsets(_read_column(arrivals, "pipeline.arrivals"), gen.shape, batch)
    return offset, offset.max(axis=2)


def open_stream(ready: np.ndarray, phase: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(offset, generate phase) of samples ready at the absolute seconds ``ready`` (trials, steps,
    batch; non-decreasing over (step, sample)) on the asynchronous clock that follows them: step
    t begins at S_t (S_0 = 0), its generate phase G_t = max(last ready - S_t, 0), and
    S_{t+1} = S_t + G_t + fast_score + submit + update, summed in the engines' order so that
    their step starts are these S_t to the bit. offset = ready - S_t (negative: ready before
    its step began). A Lindley recursion: S_{t+1} - F_t = max(last ready, S_t)."""
    gen = np.empty(phase.shape[1:])
    offset = np.empty_like(ready)
    start = np.zeros(ready.shape[0])
    for t in range(ready.shape[1]):
        offset[:, t] = ready[:, t] - start[:, None]
        gen[:, t] = np.maximum(offset[:, t, -1], 0.0)
        start = start + gen[:, t] + phase[1, :, t] + phase[2, :, t] + phase[3, :, t]
    return offset, gen


def async_starts(phase: np.ndarray) -> np.ndarray:
    """(trials, steps) start S_t of each step on the asynchronous clock: S_0 = 0, S_{t+1} = S_t +
    generate + fast_score + submit + update, added in that order, as the engines add them."""
    out = np.zeros(phase.shape[1:])
    for t in range(1, out.shape[1]):
        out[:, t] = out[:, t - 1] + phase[0, :, t - 1] + phase[1, :, t - 1] + phase[2, :, t - 1] + phase[3, :, t - 1]
    return out


def trace_offsets(values: np.ndarray, shape: Tuple[int, int], batch: int) -> np.ndarray:
    """(trials, steps, batch) offsets: ``values`` in order over (step, sample), cycled, every trial alike."""
    n, steps = shape
    flat = np.resize(np.asarray(values, dtype=np.float64), steps * batch)
    return np.broadcast_to(flat.reshape(steps, batch), (n, steps, batch)).copy()


def in_ready_order(serve: Callable[..., tuple], arrival: np.ndarray, *per_job: Optional[np.ndarray]) -> tuple:
    """``serve(arrival, *per_job)`` on each lane's jobs sorted by arrival (a stable sort: ties keep
    the sample order, as SimPy sees them), its outputs put back in sample order. ``per_job``
    arrays are (lanes, jobs) like ``arrival``, or None (passed on as None)."""
    order = np.argsort(arrival, axis=1, kind="stable")
    rows = np.arange(arrival.shape[0])[:, None]
    outs = serve(arrival[rows, order], *(None if a is None else a[rows, order] for a in per_job))
    back = tuple(np.empty_like(o) for o in outs)
    for b, o in zip(back, outs):
        b[rows, order] = o
    return back


@dataclass(frozen=True)
class ReadyPool:
    """How a gpu_rm pool is fed by arrivals over time: one group per sample (its
    ``sequences_per_sample`` requests), the groups numbered in the order the samples are
    ready. Within a step by offset, ties in sample order (a stable sort); every sample of
    step t is ready by step t + 1's start (offset <= generate phase), so this is the order
    over the whole run and group g belongs to step g // ``per``. The batcher's rule is
    unchanged: FIFO serves the groups in this order, shortest-first breaks ties of length
    by it, a flush counts from each request's own arrival, a burst's factor is that of the
    earliest step among a batch's requests (``slow``, repeated over the step's groups)."""

    order: np.ndarray  # (lanes, steps * batch): ready position -> sample index t * batch + b
    per: int  # groups per step (the batch size)

    def to_ready(self, x: np.ndarray, lanes=slice(None)) -> np.ndarray:
        """Per-request (or per-sample) values (lanes, samples * k), sample-major, in ready order."""
        order = self.order[lanes]
        n = x.shape[0]
        return x.reshape(n, order.shape[1], -1)[np.arange(n)[:, None], order].reshape(x.shape)

    def from_ready(self, x: np.ndarray, lanes=slice(None)) -> np.ndarray:
        """The inverse of :meth:`to_ready`: values in ready order back in sample order."""
        order = self.order[lanes]
        n = x.shape[0]
        out = np.empty((n, order.shape[1], x.size // (n * order.shape[1])), dtype=x.dtype)
        out[np.arange(n)[:, None], order] = x.reshape(out.shape)
        return out.reshape(x.shape)

    def slow(self, factor: Optional[np.ndarray]) -> Optional[np.ndarray]:
        """Bursts' per-step factor (lanes, steps) as a factor per group (lanes, steps * per), or None."""
        return None if factor is None else np.repeat(factor, self.per, axis=1)


def groups_per_step(feed: Optional[ReadyPool]) -> int:
    """A pool's groups per step: one (the step's samples at once), or with ``feed`` one per sample."""
    return 1 if feed is None else feed.per


def group_arrivals(feed: Optional[ReadyPool], submit: np.ndarray) -> np.ndarray:
    """(lanes, groups) arrival of each group of a pool fed by ``feed`` (None: one group per step)
    from the samples' submission times (lanes, steps, batch)."""
    return submit[:, :, 0] if feed is None else feed.to_ready(submit.reshape(submit.shape[0], -1))


def step_arrivals(feed: Optional[ReadyPool], t: int, now: np.ndarray, ready: Optional[np.ndarray]) -> np.ndarray:
    """(lanes, the step's groups) arrival of step t's groups: ``now`` (lanes,), the step's one
    group, or with ``feed`` its samples' ready times ``ready`` (lanes, batch) in ready order."""
    if feed is None:
        return now[:, None]
    lo = t * feed.per
    return np.take_along_axis(ready, feed.order[:, lo:lo + feed.per] - lo, axis=1)


def ready_pool(offset: np.ndarray) -> ReadyPool:
    """The :class:`ReadyPool` of the drawn offsets (trials, steps, batch)."""
    n, steps, batch = offset.shape
    order = (np.argsort(offset, axis=2, kind="stable") + (np.arange(steps) * batch)[None, :, None]).reshape(n, -1)
    return ReadyPool(order, batch)
