"""A pool's failures and signals (issue 43, points 9-11), at the one place pools are made
(racsim.io.side_by_side / spawn_pool): a worker that dies is one line naming the setting to change;
Ctrl-C reaches this process alone (the workers ignore it, so none prints a traceback of its own) and
ends the pool at once; workers end when their parent is killed outright, and the folder a killed run
shared numbers in is cleared by the next."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from racsim.errors import ConfigError
from racsim.io import SHARE_PREFIX, clear_dead_shares, pid_alive, side_by_side


def die(i: int) -> int:
    if i == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer does
    time.sleep(0.2)
    return i


def sigint_ignored(_: int) -> bool:
    """Whether a SIGINT never reaches this process: ignored or blocked (its SigIgn and SigBlk masks in /proc)."""
    status = Path("/proc/self/status").read_text()
    return any(int(status.split(f"{field}:")[1].split()[0], 16) & (1 << (signal.SIGINT - 1))
               for field in ("SigIgn", "SigBlk"))


def nap(s: float) -> float:
    time.sleep(s)
    return s


def test_a_worker_that_dies_is_one_line_naming_the_setting():
    with pytest.raises(ConfigError) as ex:
        list(side_by_side(2, die, [(0,), (1,), (2,)]))
    line = str(ex.value)
    assert ex.value.key == "capacity.workers" and "\n" not in line
    assert "a worker process died" in line and "with 2 processes working side by side" in line
    assert "capacity.workers=1" in line


def test_a_dead_worker_counts_this_process_as_the_knob_does():
    # issue 49: capacity.workers=2 is this process and one worker; the line said "a pool of 1"
    with pytest.raises(ConfigError) as ex:
        list(side_by_side(1, die, [(0,), (1,), (2,)], here=nap))
    assert "with 2 processes working side by side" in str(ex.value)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_workers_leave_ctrl_c_to_this_process():
    # as it was here before (ignored already where the suite itself runs as a background job: nohup ... &)
    before, ignored = signal.getsignal(signal.SIGINT), sigint_ignored(0)
    got = dict(side_by_side(2, sigint_ignored, [(0,), (1,)]))
    assert got == {0: True, 1: True}
    assert signal.getsignal(signal.SIGINT) is before and sigint_ignored(0) == ignored


def test_an_interrupt_ends_the_pool_at_once():
    def interrupted(_):
        raise KeyboardInterrupt

    t0 = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        list(side_by_side(2, nap, [(0.0,), (30.0,), (30.0,)], here=interrupted))
    assert time.perf_counter() - t0 < 15  # the workers' 30 s naps are not waited for


KILLED = textwrap.dedent("""
    import os, signal, sys, time
    sys.path.insert(0, {tests!r})
    from multiprocessing import resource_tracker
    from racsim.io import spawn_pool
    from test_pools import nap
    pool = spawn_pool(2)
    jobs = [pool.submit(nap, 60.0) for _ in range(2)]
    while len(pool._processes) < 2 or not all(p.pid for p in pool._processes.values()):
        time.sleep(0.05)
    time.sleep(1.0)
    print(*[p.pid for p in pool._processes.values()], resource_tracker._resource_tracker._pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_workers_end_when_their_parent_is_killed():
    proc = subprocess.run([sys.executable, "-c", KILLED.format(tests=str(Path(__file__).parent))],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    pids = [int(p) for p in proc.stdout.split()]
    assert len(pids) == 3
    deadline = time.time() + 10
    while any(pid_alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if pid_alive(p)], "a worker or the resource tracker outlived its parent"


def test_the_folder_of_a_killed_run_is_cleared_and_a_live_ones_kept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    gone = tmp_path / f"{SHARE_PREFIX}{dead}-abc"
    live = tmp_path / f"{SHARE_PREFIX}{os.getpid()}-def"
    other = tmp_path / "racsim-shared-notapid"
    for d in (gone, live, other):
        d.mkdir()
        (d / "k-1.pending").write_text(dead)
    assert clear_dead_shares(str(tmp_path)) == [gone]
    assert not gone.exists() and live.exists() and other.exists()


TERM_WHILE_SPAWNING = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    from multiprocessing import util
    from racsim.io import side_by_side
    from racsim.sweep.callback import Stopped, catch_sigterm
    from test_pools import nap
    real = util.spawnv_passfds

    def spawned_then_term(path, args, fds):  # SIGTERM at the worst instant: a worker started, not yet told its work
        pid = real(path, args, fds)
        if "spawn_main" in str(args):
            os.kill(os.getpid(), signal.SIGTERM)
        return pid

    util.spawnv_passfds = spawned_then_term
    catch_sigterm()
    try:
        list(side_by_side(2, nap, [(0.1,), (0.1,)]))
    except Stopped:
        print("racsim: interrupted", file=sys.stderr, flush=True)
        sys.exit(143)
""")


def test_sigterm_while_a_worker_is_spawned_leaves_no_traceback():
    # issue 49: SIGTERM 3 s into a capacity search (capacity.workers=2) printed the 'interrupted' line, then a
    # spawned child's `EOFError: Ran out of input` (its parent stopped before it had sent the child its work)
    proc = subprocess.run([sys.executable, "-c", TERM_WHILE_SPAWNING.format(tests=str(Path(__file__).parent))],
                          capture_output=True, text=True, timeout=120)  # waits for the child too: it holds stderr
    assert proc.returncode == 143 and proc.stderr == "racsim: interrupted\n", proc.stderr


def test_a_killed_process_not_yet_reaped_is_not_alive():
    """A run killed outright stays a zombie until its parent reaps it; its lock must not be held that long."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert pid_alive(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.time() + 10
        while pid_alive(child.pid) and time.time() < deadline:  # the kill lands; nothing reaps it meanwhile
            time.sleep(0.01)
        assert not pid_alive(child.pid)
        assert open(f"/proc/{child.pid}/stat").read().split(") ")[1].startswith("Z")  # still there, a zombie
    finally:
        child.kill()
        child.wait()
    assert not pid_alive(child.pid)


def test_a_ctrl_c_while_a_pool_starts_its_processes_is_held_for_this_process_alone():
    """A Ctrl-C that comes while a pool starts its processes ends this process as it ends (it was lost:
    SIGINT was ignored meanwhile), and never reaches the processes started then."""
    from racsim.io import signal_held, spawn_pool

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    ignored = None
    try:
        with spawn_pool(1) as pool:
            with pytest.raises(KeyboardInterrupt):
                with signal_held(signal.SIGINT, block=True):
                    os.kill(os.getpid(), signal.SIGINT)  # as the pool starts its process: nothing raised yet
                    ignored = pool.submit(sigint_ignored, 0).result(timeout=120)
    finally:
        signal.signal(signal.SIGINT, before)
    assert ignored is True


def half_sent(mark: str) -> None:
    """In a pool's process: begin a result's message on the pool's result pipe (1 MB announced, 10 bytes
    written), as a process killed while it sends a large result leaves it; then say so (the file
    ``mark``) and wait."""
    import struct

    queue = sys._getframe().f_back.f_locals["result_queue"]  # concurrent.futures' _process_worker
    os.write(queue._writer.fileno(), struct.pack("!i", 1 << 20) + b"x" * 10)
    Path(mark).touch()
    time.sleep(600)


def test_a_pool_ended_while_a_process_sends_its_result_does_not_wait_for_ever(tmp_path):
    """Ending a pool (Ctrl-C during a capacity run) while a process was sending its result hung the
    command for ever: the pool's thread waited on the rest of the message, and the shutdown on it."""
    import threading

    from racsim.io import spawn_pool

    pool = spawn_pool(1)
    mark = tmp_path / "begun"
    pool.submit(half_sent, str(mark))
    for _ in range(1200):  # until the process has begun its message
        if mark.exists():
            break
        time.sleep(0.05)
    assert mark.exists()
    time.sleep(0.2)  # the pool's thread is reading it
    ender = threading.Thread(target=pool.end, daemon=True)
    ender.start()
    ender.join(timeout=60)
    assert not ender.is_alive()
