"""Writing files safely, their digests, formatting numbers, the machine a job runs on (its
usable cores, one BLAS thread), numbers that several runs compute alike computed once (and shared
by a pool's processes, the one place a pool's failures become a user's line): leaf helpers that
import nothing of racsim but its errors.

Every file is written to a temporary name in the same folder and renamed into
place, so an interrupted run never leaves a half-written result behind.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import multiprocessing
import os
import pickle
import resource
import shutil
import signal
import sys
import tempfile
import threading
import time
import types
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager, nullcontext
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from racsim.errors import ConfigError, WriteFailure


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` then rename the result onto ``path``. A file that cannot be written (a
    full disk, a folder without write permission) raises :class:`~racsim.errors.WriteFailure` naming
    ``path``, whatever wrote it (a plot, a table), and leaves ``path`` as it was."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(str(tmp))
        os.replace(tmp, path)
    except OSError as e:
        if isinstance(e, (WriteFailure, FileNotFoundError, FileExistsError, IsADirectoryError)):
            raise  # already named, or not the disk's: a folder taken away or in the way
        raise WriteFailure(e.errno, e.strerror or str(e), str(path)) from e
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda p: Path(p).write_text(text))


def fmt(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, (bool,)):
        return str(v)
    if v is None or (isinstance(v, float) and math.isnan(v)) or type(v).__name__ == "NAType":  # pandas' missing
        return "-"
    if isinstance(v, float):
        if math.isinf(v):
            return "inf"
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e4):
            return f"{v:.2e}"
        return f"{v:.4g}"
    return str(v)


def file_digest(path: Path) -> Dict[str, Any]:
    """A file's size and SHA-256, as done.json records it."""
    with open(path, "rb") as f:
        sha = hashlib.file_digest(f, "sha256").hexdigest()
    return {"bytes": path.stat().st_size, "sha256": sha}


def digest_bytes(data: bytes) -> Dict[str, Any]:
    """A marker's record of a file, from the bytes written to it (:func:`file_digest` without reading it back)."""
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, which a container or ``taskset``
    narrows (``os.cpu_count()`` counts the host's, which a 2-core CI job may see as 64)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # no affinity on this platform (macOS)
        return os.cpu_count() or 1


def auto_workers() -> int:
    """Processes a ``workers: 0`` (auto) setting runs: every usable core, or one when this process
    is itself a worker of a pool (a sweep's jobs under hydra/launcher=joblib, a spawned count):
    its siblings already hold the cores, and a pool in each would put cores x cores processes on them."""
    import multiprocessing

    return 1 if multiprocessing.parent_process() is not None else usable_cores()


def pin_blas_threads():
    """One BLAS thread for the job, whatever runs it. A matrix product summed by
    two threads and by one differs in the last bits, and the count would else
    depend on the launcher (joblib gives each worker cores / n_jobs) and the
    machine: so the same cell gives the same bytes serially, with joblib,
    submitit or Ray, here or on a cluster node. racsim's products are small;
    its speed comes from running jobs side by side. Returns the limiter (or None
    without threadpoolctl)."""
    try:
        import numpy  # noqa: F401  load the BLAS libraries first, so that the limit reaches them
        import scipy.linalg  # noqa: F401
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    return threadpool_limits(limits=1, user_api="blas")


def _hugepages(on: bool) -> Optional[bool]:
    """Whether NumPy asks the kernel for transparent huge pages under its large arrays, set to
    ``on``: the setting before, or None where this NumPy has no such switch."""
    import numpy

    core = getattr(numpy, "_core", None) or getattr(numpy, "core", None)
    switch = getattr(getattr(core, "multiarray", None), "_set_madvise_hugepage", None)
    return None if switch is None else bool(switch(on))


# glibc's mallopt parameters (malloc.h) and their defaults
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_HEAP = {"kept": {_M_MMAP_MAX: 0, _M_TRIM_THRESHOLD: 2**31 - 1}, "default": {_M_MMAP_MAX: 65536, _M_TRIM_THRESHOLD: 128 * 1024}}


def _heap_kept(on: bool) -> None:
    """glibc's malloc set to serve large arrays from its heap and keep what is freed there for the
    next (``on``), or to map each afresh and return it to the kernel when freed (its default,
    ``on=False``): an array of hundreds of MB mapped afresh is zeroed page by page by the kernel,
    in system time. Nothing where the C library is not glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    for k, v in _HEAP["kept" if on else "default"].items():
        mallopt(k, v)


_small_depth = [0]  # small_pages contexts open in this process: the heap's setting is the outermost's


@contextmanager
def small_pages() -> Iterator[None]:
    """While it holds, NumPy's large arrays live on ordinary pages, and freed ones are reused
    (:func:`_heap_kept`): NumPy asks the kernel for transparent huge pages, and where the kernel
    compacts memory to grant them (``/sys/kernel/mm/transparent_hugepage/defrag`` = madvise, a
    common default) every fresh array of hundreds of MB pays it in system time; a capacity count
    allocates dozens (``racsim scenario=capacity/judge_rm_faults`` on 2 cores: 18 s of system time
    with huge pages, 9 s on ordinary ones, 4-5 s with the heap kept too). The bits are the same
    either way."""
    before = _hugepages(False)
    if not _small_depth[0]:
        _heap_kept(True)
    _small_depth[0] += 1
    try:
        yield
    finally:
        _small_depth[0] -= 1
        if not _small_depth[0]:
            _heap_kept(False)
        if before is not None:
            _hugepages(before)


PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies


def _end_with_parent(parent: int) -> None:
    """This process ends when process ``parent`` does (Linux: SIGKILL on its death), so that a worker
    never outlives a run killed outright (and with it the resource tracker, which waits for every
    process that holds its pipe); at once when that parent is already gone."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (AttributeError, OSError):  # not Linux: the pool's own checks end an orphan at its next task
        pass
    if os.getppid() != parent:
        os._exit(1)


def _worker_start(shared: Optional[str] = None, parent: Optional[int] = None) -> None:
    """A spawned worker's settings, for its life: it ends with its parent (:func:`_end_with_parent`),
    one BLAS thread (:func:`pin_blas_threads`), ordinary pages (:func:`small_pages`), and the folder its
    pool shares numbers in (:func:`recall`)."""
    global _shared
    if parent is not None:
        _end_with_parent(parent)
    pin_blas_threads()
    _hugepages(False)
    _small_depth[0] += 1  # as if inside small_pages for its life: one opened and closed in it keeps the heap
    _heap_kept(True)
    _shared = shared


# Numbers that several runs compute alike, computed once. A capacity search's counts differ in
# their GPUs alone: they draw the same tokens and sample the same trajectories, from the same
# generator states. _recalled: this process's last value of each kind, (key, value); _shared: the
# folder where the processes of a pool that shares them (side_by_side(share=True)) publish theirs.
_recalled: Dict[str, Tuple[str, Any]] = {}
_shared: Optional[str] = None
# Seconds between two looks at a value another process of the pool is computing.
POLL_S = 0.01


def recall(kind: str, key: str, compute: Callable[[], Tuple[Any, Any]], wait: bool = True) -> Optional[Tuple[Any, Any]]:
    """``compute()``'s (array, state) computed once: ``key`` names everything it reads (the
    generator's state included; ``state``: what the caller needs besides, such as the state the
    draw left). This process's last value of ``kind`` when its key is the same; else, in a pool
    that shares (:func:`side_by_side`), the one a process of the pool published (waited for while
    one computes it, mapped read-only from its file: one copy in memory for them all); else
    computed here, made read-only, and published to the pool. The same numbers whichever way.
    ``wait=False``: None at once where another process of the pool is computing it (a caller that
    asks early, to have it ready, goes on with other work; the one that needs it waits)."""
    last = _recalled.get(kind)
    if last is not None and last[0] == key:
        return last[1]
    value = _published(kind, key, compute, wait) if _shared is not None else ()
    if value is None:
        return None
    _recalled[kind] = (key, value or _computed(kind, compute))
    return _recalled[kind][1]


def _computed(kind: str, compute: Callable[[], Tuple[Any, Any]]) -> Tuple[Any, Any]:
    """``compute()``'s value, read-only, computed once this process's last value of ``kind`` is freed."""
    _recalled.pop(kind, None)
    value = compute()
    value[0].flags.writeable = False
    return value


def sharing() -> bool:
    """Whether this process is in a pool whose processes share their :func:`recall` values (:func:`shared_numbers`)."""
    return _shared is not None


def forget() -> None:
    """Drop every value :func:`recall` holds in this process (their memory freed)."""
    _recalled.clear()


def _published(kind: str, key: str, compute: Callable[[], Tuple[Any, Any]],
               wait: bool) -> Optional[Tuple[Any, Any]]:
    """:func:`recall`'s value in the pool's folder: read; waited for while another process computes
    it (``wait``; else None at once); or claimed (a ``.pending`` file naming this process), computed
    here and written there, then read back mapped. () where none can be read: its writer died (the
    caller computes its own). A folder with no room for it: this process's own value."""
    import numpy as np

    base = os.path.join(_shared, _entry(kind, key))
    array, state, pending = base + ".npy", base + ".state", base + ".pending"
    if not os.path.exists(array):
        try:
            fd = os.open(pending, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:  # another process is computing it
            if not wait:
                return None
            while not os.path.exists(array) and _alive(pending):
                time.sleep(POLL_S)
        else:
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            try:
                if not os.path.exists(array):  # not published between the look and the claim
                    value = _computed(kind, compute)
                    try:
                        atomic_write(Path(state), lambda t: Path(t).write_bytes(pickle.dumps(value[1])))
                        atomic_write(Path(array), lambda t: _save(t, value[0]))  # its rename publishes it
                    except OSError:
                        return value
            finally:
                os.unlink(pending)
    if not os.path.exists(array):
        return ()
    return np.load(array, mmap_mode="r"), pickle.loads(Path(state).read_bytes())


def _entry(kind: str, key: str) -> str:
    """The name of a value's files in the pool's folder (its .npy, .state and .pending)."""
    return f"{kind}-{hashlib.sha256(key.encode()).hexdigest()[:32]}"


def _save(path: str, array: Any) -> None:
    import numpy as np

    with open(path, "wb") as f:  # a file, not a name: np.save would add ".npy" to the name
        np.save(f, array)


def _alive(pending: str) -> bool:
    """Whether the process named in a ``.pending`` file is still computing (the file there, its
    process running)."""
    try:
        pid = int(Path(pending).read_text() or 0)
    except (OSError, ValueError):
        return os.path.exists(pending)
    if not pid:  # written in a moment
        return True
    return pid_alive(pid) and os.path.exists(pending)


def pid_alive(pid: Any) -> bool:
    """Whether process ``pid`` runs (another user's counts as running; not a positive int: no; a zombie,
    killed and not yet reaped by its parent, no: it holds nothing)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # someone else's process
        return True
    return not zombie(pid)


def zombie(pid: int) -> bool:
    """Whether process ``pid`` has exited and waits for its parent to reap it (Linux's /proc state Z; False
    where /proc cannot tell)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].startswith("Z")


SHARE_PREFIX = "racsim-shared-"  # then the pid of the run that made it, a dash, mkdtemp's letters


def clear_dead_shares(root: Optional[str] = None) -> list:
    """Remove the folders :func:`shared_numbers` made for runs that are gone (killed outright, they
    could not remove their own): those under ``root`` (the temporary folder) named for a pid that no
    longer runs. The removed folders, listed."""
    gone = []
    for d in Path(root or tempfile.gettempdir()).glob(f"{SHARE_PREFIX}*-*"):
        pid = d.name[len(SHARE_PREFIX):].split("-")[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)
            gone.append(d)
    return gone


@contextmanager
def shared_numbers() -> Iterator[Optional[str]]:
    """While it holds, :func:`recall` in this process publishes to (and reads from) a fresh
    temporary folder, yielded to be handed to a pool's workers; removed at the end. None where no
    temporary folder can be made (each process then computes its own)."""
    global _shared
    try:
        clear_dead_shares()  # finding the temporary folder fails too where none can be written
        folder = tempfile.mkdtemp(prefix=f"{SHARE_PREFIX}{os.getpid()}-")
    except OSError:
        yield None
        return
    before, _shared = _shared, folder
    try:
        yield folder
    finally:
        _shared = before
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def caller_script_hidden():
    """While it holds, a ``__main__`` run from a file path (a user's script: ``python plan.py``)
    is replaced by an empty module, so that a process spawned meanwhile does not run that
    script's top level again (spawn re-runs it, and a script without an ``if __name__ ==
    "__main__"`` guard would start the same work, and a pool, in every child). racsim's pools
    run racsim's functions only. A ``__main__`` run as a module (``python -m``) stays: spawn
    imports it by name, as racsim's own tools need. Inside a launcher's worker whose start method
    is its own (joblib's loky), the children start without it, which plain multiprocessing lacks."""
    main = sys.modules.get("__main__")
    hide = main is not None and getattr(main.__spec__, "name", None) is None and hasattr(main, "__file__")
    default = multiprocessing.context._default_context  # a child starts with its parent's start method
    own = default.get_start_method(allow_none=True) not in (None, *multiprocessing.get_all_start_methods())
    actual = default._actual_context
    if hide:
        sys.modules["__main__"] = types.ModuleType("__main__")
    if own:  # a launcher's own method (joblib's loky), which a plain spawned child cannot take: none
        default._actual_context = None
    try:
        yield
    finally:
        if hide:
            sys.modules["__main__"] = main
        default._actual_context = actual


@contextmanager
def signal_held(signum: int, block: bool = False):
    """While it holds (in the main thread), signal ``signum`` is held back, and delivered to this
    process's own handler as it ends (a signal it ignores stays ignored; a handler installed outside
    Python, which could not be put back, is left alone). ``block``: it is blocked in this thread too, so
    that the processes started meanwhile have it blocked for their life (a blocked signal stays blocked
    through exec, and Python never unblocks it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: List[int] = []
    held = signal.getsignal(signum) is not None
    before = signal.signal(signum, lambda s, frame: came.append(s)) if held else None
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signum}) if block else None
    try:
        yield
    finally:
        if block:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # one that came meanwhile reaches the lambda now
        if held:
            signal.signal(signum, before)
            if came:
                signal.raise_signal(signum)


class _SpawnPool(ProcessPoolExecutor):
    """A ProcessPoolExecutor that starts its processes (at a submit: spawn starts them as work
    comes) with the caller's script hidden (:func:`caller_script_hidden`), and both signals held while
    it does (:func:`signal_held`): SIGTERM, answered once they are started (cut short by the handler's
    exception, a process being spawned would read a closed pipe and print EOFError's traceback after the
    run's last line, and not be in the pool that ending it ends); Ctrl-C, blocked in them for their life
    (it goes to the whole process group: only this process answers it, by ending the pool, never a worker
    half started with a traceback of its own; ignoring it instead lost one that came while a pool
    started). Left by an exception, it ends them at once (:meth:`end`)."""

    def submit(self, fn, /, *args, **kwargs):
        with signal_held(signal.SIGTERM), caller_script_hidden(), signal_held(signal.SIGINT, block=True):
            return super().submit(fn, *args, **kwargs)

    def end(self) -> None:
        """Stop at once: the jobs not started cancelled, the processes killed (a run interrupted or
        failing does not wait for its workers' jobs to finish)."""
        for p in list((self._processes or {}).values()):
            p.kill()
        if self._result_queue is not None:  # a process killed while it sent its result left half a message,
            self._result_queue._writer.close()  # which the pool's thread waited on for ever: it reads the end now
        self.shutdown(wait=True, cancel_futures=True)

    def __exit__(self, kind, value, tb):
        """Left by an exception (Ctrl-C, an error): :meth:`end`, not a wait for the running jobs."""
        if kind is not None:
            self.end()
        return super().__exit__(kind, value, tb)


def cpu_seconds() -> float:
    """CPU seconds used so far by this process and by the children it waited for (a closed pool's
    processes included)."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


def spawn_pool(workers: int, shared: Optional[str] = None) -> ProcessPoolExecutor:
    """``workers`` fresh (spawned) processes, each with one BLAS thread and ordinary pages, and
    ``shared``: the folder they share numbers in (:func:`_worker_start`, :func:`shared_numbers`).
    Never forks of this one: a fork copies the locks its other threads (pyarrow's allocator, BLAS)
    hold at that instant, and a child can wait on one forever; a child that dies raises
    BrokenProcessPool in the caller instead of hanging it. A caller's script without a main
    guard is not run again in the children (:func:`caller_script_hidden`)."""
    return _SpawnPool(workers, mp_context=get_context("spawn"), initializer=_worker_start,
                      initargs=(shared, os.getpid()))


def side_by_side(workers: int, fn: Callable, arglists: Sequence[tuple],
                 here: Optional[Callable] = None, share: bool = False,
                 knob: str = "capacity.workers") -> Iterator[Tuple[int, Any]]:
    """``fn(*args)`` for each of ``arglists`` in a :func:`spawn_pool` of ``workers``, yielded as each
    finishes: (its index in ``arglists``, its result). ``here``: this process works too, ``here(*args)``
    in place of ``fn``: the first job, then, from the last, each job no process has started yet
    (taken back from the pool). ``share``: the processes, this one included, compute what they
    :func:`recall` alike once (:func:`shared_numbers`). Consume it whole: the pool closes at its end;
    stopped early (Ctrl-C, an error) it ends its processes at once. A worker that dies (killed, or by
    the out-of-memory killer) is the one place a pool's failure becomes a user's line: a ConfigError
    naming ``knob``, the setting that sizes the pool."""
    with (shared_numbers() if share else nullcontext()) as folder, spawn_pool(workers, folder) as pool:
        try:
            yield from _side_by_side(pool, fn, arglists, here)
        except BrokenProcessPool:
            raise ConfigError(knob, workers, "fewer processes at once", line=(
                f"a worker process died (killed, or by the out-of-memory killer) with {at_once(workers, here)} "
                f"processes working side by side: {knob}=1 runs one at a time, or give the run more memory")) from None


def at_once(workers: int, here: Optional[Callable]) -> int:
    """The processes a :func:`side_by_side` runs at once: the pool's ``workers``, and this one where it works
    too (``here``), as a knob such as capacity.workers counts them."""
    return workers + (here is not None)


def _side_by_side(pool, fn: Callable, arglists: Sequence[tuple], here: Optional[Callable]):
    first = 1 if here is not None and arglists else 0
    jobs = {pool.submit(fn, *args): i for i, args in enumerate(arglists) if i >= first}
    if first:
        yield 0, here(*arglists[0])
        for job in sorted(jobs, key=jobs.get, reverse=True):
            if not job.cancel():  # started: so is every earlier job (the pool starts them in order)
                break
            i = jobs.pop(job)
            yield i, here(*arglists[i])
    for job in as_completed(jobs):
        yield jobs[job], job.result()
