"""Writing files safely, their digests, formatting numbers, the machine a job runs on (its
usable cores, one BLAS thread): leaf helpers with no racsim imports.

Every file is written to a temporary name in the same folder and renamed into
place, so an interrupted run never leaves a half-written result behind.
"""

from __future__ import annotations

import hashlib
import math
import multiprocessing
import os
import sys
import types
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Tuple


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` then rename the result onto ``path``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(str(tmp))
        os.replace(tmp, path)
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
    if v is None or (isinstance(v, float) and math.isnan(v)):
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


@contextmanager
def small_pages() -> Iterator[None]:
    """While it holds, NumPy's large arrays live on ordinary pages: NumPy asks the kernel for
    transparent huge pages, and where the kernel compacts memory to grant them
    (``/sys/kernel/mm/transparent_hugepage/defrag`` = madvise, a common default) every fresh
    array of hundreds of MB pays it in system time; a capacity count allocates dozens
    (``racsim scenario=capacity/judge_rm_faults`` on 2 cores: 18 s of system time with huge
    pages, 9 s without).
    The bits are the same either way."""
    before = _hugepages(False)
    try:
        yield
    finally:
        if before is not None:
            _hugepages(before)


def _worker_start() -> None:
    """A spawned worker's settings, for its life: one BLAS thread (:func:`pin_blas_threads`),
    ordinary pages (:func:`small_pages`)."""
    pin_blas_threads()
    _hugepages(False)


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


class _SpawnPool(ProcessPoolExecutor):
    """A ProcessPoolExecutor that starts its processes (at a submit: spawn starts them as work
    comes) with the caller's script hidden (:func:`caller_script_hidden`)."""

    def submit(self, fn, /, *args, **kwargs):
        with caller_script_hidden():
            return super().submit(fn, *args, **kwargs)


def spawn_pool(workers: int) -> ProcessPoolExecutor:
    """``workers`` fresh (spawned) processes, each with one BLAS thread and ordinary pages (:func:`_worker_start`).
    Never forks of this one: a fork copies the locks its other threads (pyarrow's allocator, BLAS)
    hold at that instant, and a child can wait on one forever; a child that dies raises
    BrokenProcessPool in the caller instead of hanging it. A caller's script without a main
    guard is not run again in the children (:func:`caller_script_hidden`)."""
    return _SpawnPool(workers, mp_context=get_context("spawn"), initializer=_worker_start)


def side_by_side(workers: int, fn: Callable, arglists: Sequence[tuple],
                 here: Optional[Callable] = None) -> Iterator[Tuple[int, Any]]:
    """``fn(*args)`` for each of ``arglists`` in a :func:`spawn_pool` of ``workers``, yielded as each
    finishes: (its index in ``arglists``, its result). ``here``: this process works too, ``here(*args)``
    in place of ``fn``: the first job, then, from the last, each job no process has started yet
    (taken back from the pool). Consume it whole: the pool closes at its end."""
    with spawn_pool(workers) as pool:
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
