"""racsim.io.recall: numbers that several runs compute alike (a capacity search's counts draw the
same tokens and sample the same trajectories) computed once, in one process and in a pool whose
processes share them through files; the same numbers whichever way, and never a hang or a lost
value when a process dies or the folder has no room."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import pytest
from helpers import recall_logged
from hypothesis import given, settings
from hypothesis import strategies as st

from racsim import io
from racsim.config.schema import LatencyConf
from racsim.io import forget, recall, shared_numbers, side_by_side
from racsim.pipeline.draws import draw_tokens
from racsim.pipeline.latency import token_lengths


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
    forget()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    yield
    forget()


def counted(values):
    calls = []

    def compute():
        calls.append(1)
        return np.array(values, dtype=float), {"n": len(calls)}

    return compute, calls


def test_the_same_key_is_computed_once_in_a_process_and_another_replaces_it():
    compute, calls = counted([1.0, 2.0])
    a = recall("k", "one", compute)
    b = recall("k", "one", compute)
    assert calls == [1] and a[0] is b[0] and a[1] == {"n": 1}
    assert not a[0].flags.writeable  # read-only: a caller cannot change what the next one gets
    other = recall("k", "two", compute)  # another key: computed, and the last value of the kind replaced
    assert calls == [1, 1] and other[1] == {"n": 2}
    recall("k", "one", compute)
    assert len(calls) == 3  # one value kept per kind
    assert recall("j", "one", counted([3.0])[0])[0].tolist() == [3.0]  # kinds are apart
    assert len(calls) == 3 and recall("k", "one", compute)[1] == {"n": 3}
    forget()
    recall("k", "one", compute)
    assert len(calls) == 4


@pytest.mark.long  # a process pool: 2.3 CPU s
def test_a_pool_that_shares_computes_a_value_once(tmp_path):
    """Four jobs asking for one key in a pool of two processes and this one: one computes it (the
    others wait while it does), all get the same numbers, read-only, and the folder goes with the pool."""
    log = tmp_path / "log"
    log.mkdir()
    jobs = [("tokens", "same", str(log), 0.5)] * 4
    got = dict(side_by_side(2, recall_logged, jobs, here=recall_logged, share=True))
    assert len(os.listdir(log)) == 1
    assert sorted(got) == [0, 1, 2, 3]
    assert all(v[:3] == (999 * 1000 / 2 * 4, {"after": "same"}, False) for v in got.values())
    assert os.listdir(tempfile.gettempdir()) == []
    # without share each process computes its own, once
    got = dict(side_by_side(2, recall_logged, [("tokens", "again", str(log), 0.2)] * 3, here=recall_logged))
    assert len(os.listdir(log)) == 1 + len({v[3] for v in got.values()})


def test_shared_values_are_published_and_read_back_mapped():
    compute, calls = counted([5.0, 6.0])
    with shared_numbers() as folder:
        first = recall("k", "x", compute)
        assert sorted(os.listdir(folder)) == sorted(f"{io._entry('k', 'x')}{ext}" for ext in (".npy", ".state"))
        forget()  # another process of the pool: this one's memory gone, the folder's file read
        again = recall("k", "x", compute)
        assert calls == [1] and isinstance(again[0], np.memmap) and again[0].tolist() == [5.0, 6.0]
        assert again[1] == first[1] == {"n": 1} and not again[0].flags.writeable
    assert not os.path.exists(folder) and io._shared is None


def test_ask_early_without_waiting_and_wait_when_it_is_needed():
    """wait=False returns None at once while another process computes the value, and the value
    once it is published; with wait the caller waits for it rather than computing its own."""
    compute, calls = counted([1.0])
    with shared_numbers() as folder:
        pending = Path(folder, io._entry("k", "y") + ".pending")
        pending.write_text(str(os.getpid()))  # "another process" computing it: alive
        assert recall("k", "y", compute, wait=False) is None and calls == []
        pending.unlink()
        assert recall("k", "y", compute, wait=False)[0].tolist() == [1.0] and calls == [1]  # nobody was: computed
        forget()
        assert recall("k", "y", compute, wait=False)[1] == {"n": 1} and calls == [1]  # published: read


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_writer_that_died_is_not_waited_for():
    compute, calls = counted([2.0])
    with shared_numbers() as folder:
        Path(folder, io._entry("k", "z") + ".pending").write_text(str(dead_pid()))
        value = recall("k", "z", compute)  # its writer gone: computed here, no hang
        assert calls == [1] and value[0].tolist() == [2.0]


def test_a_folder_without_room_loses_nothing(monkeypatch):
    def full(path, array):
        Path(path).write_bytes(b"x")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(io, "_save", full)
    compute, calls = counted([3.0, 4.0])
    with shared_numbers() as folder:
        value = recall("k", "w", compute)
        assert calls == [1] and value[0].tolist() == [3.0, 4.0] and not value[0].flags.writeable
        assert [n for n in os.listdir(folder) if not n.endswith(".state")] == []  # no half-written file, no claim
        forget()
        assert recall("k", "w", compute)[0].tolist() == [3.0, 4.0] and calls == [1, 1]  # computed again, not read


def test_no_temporary_folder_no_sharing(monkeypatch, tmp_path):
    """Where no temporary folder can be made, a pool that would share runs as one that does not."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))
    with shared_numbers() as folder:
        assert folder is None and not io.sharing()
    log = tmp_path / "log"
    log.mkdir()
    got = dict(side_by_side(1, recall_logged, [("tokens", "k", str(log))] * 3, here=recall_logged, share=True))
    assert len(got) == 3 and len(os.listdir(log)) == len({v[3] for v in got.values()})  # each process its own


def test_the_heap_is_kept_by_the_outermost_small_pages(monkeypatch):
    """Nested small_pages (a run inside a run, a worker's life): the heap is kept from the first
    opened to the last closed, not reset when an inner one closes."""
    calls = []
    monkeypatch.setattr(io, "_heap_kept", calls.append)
    with io.small_pages():
        with io.small_pages():
            pass
        assert calls == [True]
    assert calls == [True, False]


LAWS = st.sampled_from([LatencyConf(kind="lognormal", mean=150.0, sigma=0.6, low=1.0),
                        LatencyConf(kind="exponential", mean=300.0),
                        LatencyConf(kind="pareto", mean=200.0, alpha=2.5, high=4000.0),
                        LatencyConf(kind="deterministic", mean=64.0)])


@settings(max_examples=30, deadline=None, derandomize=True)
@given(prompt=LAWS, response=LAWS, seed=st.integers(0, 2**32 - 1),
       shape=st.lists(st.integers(0, 5), min_size=1, max_size=4), shared=st.booleans())
def test_recalled_tokens_are_a_fresh_draw(prompt, response, seed, shape, shared):
    """draw_tokens, recalled in this process or read back from a pool's folder, gives the numbers and
    leaves the generator where a draw made without any recall does, for generated laws and shapes."""
    rm = types.SimpleNamespace(prompt_tokens=prompt, response_tokens=response)
    fresh_rng = np.random.default_rng(seed)
    fresh = token_lengths(prompt, response, "rm").sample(fresh_rng, tuple(shape))
    with shared_numbers() if shared else contextlib.nullcontext():
        for _ in range(2):  # computed (and published), then recalled: from memory, or from the file
            rng = np.random.default_rng(seed)
            got = draw_tokens(rm, rng, tuple(shape))
            np.testing.assert_array_equal(got, fresh)
            assert rng.bit_generator.state == fresh_rng.bit_generator.state and not got.flags.writeable
            if shared:
                forget()
