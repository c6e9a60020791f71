"""channel_stats and queue_timeseries against figures worked out by hand on a tiny
hand-built schedule: one trial, two steps of 10 s, two results a step per channel."""

import numpy as np
import pytest

from racsim.pipeline.schedule import INJECTED, PENDING, ArrivalSchedule
from racsim.pipeline.stats import channel_stats, queue_timeseries

I, P = INJECTED, PENDING


def schedule():
    # channel a: one worker. Step 0 submits two jobs at 1 s (3 s each): served 1-4 and 4-7.
    # Step 1 submits at 11 s (7 s each): served 11-18 and 18-25, the run ending at 20 s.
    # channel b: no queue (start = submit). channel g: a GPU pool with a batch log.
    sub = np.array([[1.0, 1.0], [11.0, 11.0]])
    a = (sub, np.array([[1.0, 4.0], [11.0, 18.0]]), np.array([[4.0, 7.0], [18.0, 25.0]]))
    b = (sub, sub.copy(), np.array([[3.0, 9.0], [12.0, np.inf]]))
    g = (sub, np.array([[1.0, 1.0], [15.0, 15.0]]), np.array([[5.0, 5.0], [30.0, 30.0]]))
    stack = lambda i: np.stack([a[i], b[i], g[i]], axis=-1)[None]  # noqa: E731  (1, 2, 2, 3)
    delay = np.array([[[1, 1, 1], [1, 1, 1]], [[-1, -1, -1], [-1, -1, -1]]])[None]
    status = np.where(delay >= 0, I, P).astype(np.int8)
    gpu = {"g": {"lane": np.array([0, 0]), "replica": np.array([0, 1]), "start": np.array([1.0, 15.0]),
                 "end": np.array([5.0, 30.0]), "size": np.array([2, 2]), "tokens": np.array([10.0, 10.0]),
                 "step": np.array([0, 1]), "replicas": np.array(2)}}
    return ArrivalSchedule(delay=delay, status=status, step_start=np.array([[0.0, 10.0, 20.0]]), blocking=False,
                           channel_names=("a", "b", "g"), submit_time=stack(0), service_start=stack(1),
                           completion=stack(2), gpu_batches=gpu)


@pytest.fixture
def table():
    return channel_stats(schedule(), {"a": 1, "b": None, "g": None}).set_index("channel")


def test_counts_and_delays(table):
    for ch in "abg":
        row = table.loc[ch]
        assert (row.emitted, row.injected, row.dropped, row.pending) == (4, 2, 0, 2)
        assert row.delay_mean_steps == 1.0 and row.delay_p50_steps == 1.0 and row.delay_p99_steps == 1.0


def test_queue_waits(table):
    # waits of channel a: 0, 3, 0, 7 s; p95 interpolates between 3 and 7 at 0.85
    assert table.loc["a", "wait_mean_s"] == 2.5
    assert table.loc["a", "wait_p95_s"] == pytest.approx(3 + 0.85 * 4, abs=1e-12)
    assert table.loc["b", "wait_mean_s"] == 0.0 and table.loc["b", "wait_p95_s"] == 0.0


def test_utilisation_counts_busy_seconds_inside_the_run(table):
    # a: busy 3 + 3 + 7 + (20 - 18) = 15 of 1 worker x 20 s (the job running past the end counts to 20 s only)
    assert table.loc["a", "utilisation"] == 0.75
    assert table.loc["a", "workers"] == 1
    # g: batches 1-5 and 15-30 on 2 replicas: (4 + 5) / (2 x 20)
    assert table.loc["g", "utilisation"] == 9 / 40
    assert table.loc["g", "workers"] == 2
    assert np.isnan(table.loc["b", "utilisation"])


def test_queue_timeseries_by_hand():
    ts = queue_timeseries(schedule(), points=21).set_index("time_s")  # a grid of whole seconds 0..20
    assert list(ts.index) == list(range(21))
    # channel a at 3 s: two submitted, one started -> 1 queued, 1 in service; at 5 s: 0 and 1; at 12 s: 1 and 1
    assert (ts.loc[3, "a_queued"], ts.loc[3, "a_in_service"]) == (1, 1)
    assert (ts.loc[5, "a_queued"], ts.loc[5, "a_in_service"]) == (0, 1)
    assert (ts.loc[12, "a_queued"], ts.loc[12, "a_in_service"]) == (1, 1)
    assert (ts.loc[0, "a_queued"], ts.loc[0, "a_in_service"]) == (0, 0)
    # channel b never queues; at 10 s its first job is done (3 s) and the second (9 s) too
    assert ts["b_queued"].max() == 0 and ts.loc[10, "b_in_service"] == 0 and ts.loc[12, "b_in_service"] == 1
