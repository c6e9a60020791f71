"""channel_stats and queue_timeseries against figures worked out by hand on a small
hand-built schedule: two trials of two steps, two results a step, three channels.

* ``a``: a queue with 2 workers (deterministic service, known waits and busy seconds);
* ``b``: no queue (start = submit), nothing injected (its delay figures are NaN);
* ``g``: a gpu_rm pool of 2 replicas with a batch log.

Trial 0 runs from 0 s to 20 s (steps at 0, 10), trial 1 from 2 s to 14 s (steps
at 2, 8): the spans differ (20 s and 12 s) and trial 1 does not begin at 0, so a
utilisation that forgets the run's end, divides by the wrong span, by the wrong
number of workers, or averages ratios the wrong way gives other numbers.
"""

import numpy as np
import pytest

from racsim.pipeline.schedule import DROPPED, INJECTED, PENDING, ArrivalSchedule
from racsim.pipeline.stats import channel_stats, queue_timeseries

I, D, P = INJECTED, DROPPED, PENDING
NAN = np.nan

# (trials, steps, batch): submit, service start, completion of each channel.
SUB = np.array([[[1.0, 1.0], [11.0, 11.0]],
                [[3.0, 3.0], [9.0, 9.0]]])
# a, trial 0: jobs 1-13 and 1-3 (both workers); at 11 one worker is free (since 3): 11-16;
#    the other waits for 13: 13-25, past the run's end (20).
#    trial 1: jobs 3-5 and 3-10; at 9 one worker is free (since 5): 9-13; the other waits for 10: 10-16 (end 14).
A = (SUB, np.array([[[1.0, 1.0], [11.0, 13.0]], [[3.0, 3.0], [9.0, 10.0]]]),
     np.array([[[13.0, 3.0], [16.0, 25.0]], [[5.0, 10.0], [13.0, 16.0]]]))
B = (SUB, SUB.copy(), np.array([[[4.0, 9.0], [12.0, np.inf]], [[4.0, 7.0], [10.0, np.inf]]]))
# g: trial 0, batch 1-5 on replica 0 (step 0), batch 15-30 on replica 0 (step 1, past the end);
#    trial 1, batch 3-6 on replica 0, then sample 0 of step 1 in 9-12 on replica 1, sample 1 in 10-20 on replica 0.
G = (SUB, np.array([[[1.0, 1.0], [15.0, 15.0]], [[3.0, 3.0], [9.0, 10.0]]]),
     np.array([[[5.0, 5.0], [30.0, 30.0]], [[6.0, 6.0], [12.0, 20.0]]]))
GPU_LOG = {"lane": np.array([0, 0, 1, 1, 1]), "replica": np.array([0, 0, 0, 1, 0]),
           "start": np.array([1.0, 15.0, 3.0, 9.0, 10.0]), "end": np.array([5.0, 30.0, 6.0, 12.0, 20.0]),
           "size": np.array([2, 2, 2, 1, 1]), "tokens": np.array([10.0, 10.0, 10.0, 5.0, 5.0]),
           "step": np.array([0, 1, 0, 1, 1]), "replicas": np.array(2)}

# (trials, steps, batch) delay (-1: not injected) and status, per channel
A_DELAY = np.array([[[1, 2], [-1, -1]], [[1, -1], [3, -1]]])
A_STATUS = np.array([[[I, I], [P, P]], [[I, D], [I, P]]])
B_DELAY = np.full((2, 2, 2), -1)
B_STATUS = np.array([[[D, P], [P, P]], [[P, D], [P, P]]])
G_DELAY = np.array([[[0, 0], [-1, -1]], [[1, 1], [2, 4]]])
G_STATUS = np.array([[[I, I], [P, P]], [[I, I], [I, I]]])


def stack(*xs) -> np.ndarray:
    """Channels a, b, g side by side: (trials, steps, batch, 3)."""
    return np.stack(xs, axis=-1)


def schedule() -> ArrivalSchedule:
    return ArrivalSchedule(
        delay=stack(A_DELAY, B_DELAY, G_DELAY), status=stack(A_STATUS, B_STATUS, G_STATUS).astype(np.int8),
        step_start=np.array([[0.0, 10.0, 20.0], [2.0, 8.0, 14.0]]), blocking=False, channel_names=("a", "b", "g"),
        submit_time=stack(A[0], B[0], G[0]), service_start=stack(A[1], B[1], G[1]),
        completion=stack(A[2], B[2], G[2]), gpu_batches={"g": GPU_LOG})


@pytest.fixture
def table():
    return channel_stats(schedule(), {"a": 2, "b": None, "g": None}).set_index("channel")


def test_counts(table):
    assert table.loc["a", ["emitted", "injected", "dropped", "pending"]].tolist() == [8, 4, 1, 3]
    assert table.loc["b", ["emitted", "injected", "dropped", "pending"]].tolist() == [8, 0, 2, 6]
    assert table.loc["g", ["emitted", "injected", "dropped", "pending"]].tolist() == [8, 6, 0, 2]


def test_delay_quantiles(table):
    # a: injected delays 1, 2, 1, 3 -> sorted 1 1 2 3; numpy's linear quantile at (n - 1) q = 1.5, 2.85, 2.97
    a = table.loc["a"]
    assert a.delay_mean_steps == 1.75
    assert a.delay_p50_steps == 1.5
    assert a.delay_p95_steps == pytest.approx(2.85, abs=1e-12)
    assert a.delay_p99_steps == pytest.approx(2.97, abs=1e-12)
    # g: 0 0 1 1 2 4 -> mean 8 / 6, quantiles at 2.5, 4.75, 4.95
    g = table.loc["g"]
    assert g.delay_mean_steps == pytest.approx(8 / 6, abs=1e-12)
    assert g.delay_p50_steps == 1.0
    assert g.delay_p95_steps == pytest.approx(2 + 0.75 * 2, abs=1e-12)
    assert g.delay_p99_steps == pytest.approx(2 + 0.95 * 2, abs=1e-12)
    # b: nothing injected -- no delay figures, not the -1 placeholders
    b = table.loc["b"]
    assert np.isnan([b.delay_mean_steps, b.delay_p50_steps, b.delay_p95_steps, b.delay_p99_steps]).all()


def test_queue_waits(table):
    # a: waits 0 0 0 2 (trial 0) and 0 0 0 1 (trial 1): sorted 0 0 0 0 0 0 1 2, p95 at 6.65 -> 1.65
    assert table.loc["a", "wait_mean_s"] == 3 / 8
    assert table.loc["a", "wait_p95_s"] == pytest.approx(1.65, abs=1e-12)
    # b has no queue: nothing waits
    assert table.loc["b", "wait_mean_s"] == 0.0 and table.loc["b", "wait_p95_s"] == 0.0
    # g (a GPU pool, a queue even without a workers limit): 0 0 4 4 and 0 0 0 1 -> mean 9 / 8, p95 4
    assert table.loc["g", "wait_mean_s"] == 9 / 8
    assert table.loc["g", "wait_p95_s"] == 4.0


def test_utilisation_counts_busy_seconds_inside_each_run(table):
    # a, trial 0: busy 12 + 2 + 5 + (20 - 13) = 26 of 2 workers x 20 s;
    #    trial 1: 2 + 7 + 4 + (14 - 10) = 17 of 2 x 12 s; the mean of the two ratios
    assert table.loc["a", "utilisation"] == pytest.approx((26 / 40 + 17 / 24) / 2, abs=1e-15)
    assert table.loc["a", "workers"] == 2
    # g, trial 0: batches 4 s and (20 - 15) s on 2 replicas x 20 s; trial 1: 3 + 3 + (14 - 10) of 2 x 12 s
    assert table.loc["g", "utilisation"] == pytest.approx((9 / 40 + 10 / 24) / 2, abs=1e-15)
    assert table.loc["g", "workers"] == 2
    assert np.isnan(table.loc["b", "utilisation"]) and np.isnan(table.loc["b", "workers"])  # no workers limit


@pytest.mark.parametrize("wrong", [
    (26 + 17) / (40 + 24),  # ratio of sums
    (31 / 40 + 19 / 24) / 2,  # busy seconds past the run's end counted
    (26 / 40 + 17 / 28) / 2,  # span = end time, not end - start
    (26 / 20 + 17 / 12) / 2,  # one worker
])
def test_utilisation_is_none_of_the_plausible_mistakes(table, wrong):
    """The figures above tell the right formula from each of these slips."""
    assert abs(table.loc["a", "utilisation"] - wrong) > 1e-3


def test_queue_timeseries_by_hand():
    # the grid runs to the median span (20 and 12 s: 16 s), 17 points: whole seconds
    ts = queue_timeseries(schedule(), points=17).set_index("time_s")
    assert list(ts.index) == list(range(17))
    # a (mean over the two trials of jobs submitted - started, started - done, times counted when <= t):
    #   t=3:  trial 0 0 queued, 1 in service (1-3 done at 3); trial 1 0, 2
    #   t=9:  trial 0 0, 1; trial 1 1 queued (the second job of step 1 waits for 10), 2
    #   t=12: trial 0 1 (waits for 13), 2; trial 1 0, 2
    #   t=13: trial 0 0, 2 (13-25 started, 1-13 done); trial 1 0, 1 (9-13 done)
    #   t=16: trial 0 0, 1; trial 1 0, 0
    want = {3: (0, 1.5), 9: (0.5, 1.5), 12: (0.5, 2.0), 13: (0.0, 1.5), 16: (0.0, 0.5), 0: (0, 0)}
    for t, (queued, busy) in want.items():
        assert (ts.loc[t, "a_queued"], ts.loc[t, "a_in_service"]) == (queued, busy), t
    # b never queues; at 9 s trial 0's jobs of step 0 are done (4, 9 s) and trial 1's step-1 jobs run
    assert ts["b_queued"].max() == 0
    assert ts.loc[9, "b_in_service"] == (0 + 2) / 2 and ts.loc[12, "b_in_service"] == (1 + 1) / 2
    # g at 12 s: trial 0 has two samples waiting for 15 s; trial 1's 9-12 sample is done, 10-20 runs
    assert (ts.loc[12, "g_queued"], ts.loc[12, "g_in_service"]) == (1.0, 0.5)
