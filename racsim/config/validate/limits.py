"""The budgets (:class:`~racsim.config.schema.LimitsConf`): a run whose estimate
(racsim.config.validate.estimate) exceeds them, or the memory this process can have, is refused
before it starts; a data file must be a regular file within ``limits.file_mb``."""

from __future__ import annotations

import importlib
import math
import os
import resource
import stat
from typing import Any, Optional, Sequence, Tuple

from racsim.config.validate.common import int_at_least, need, node, positive
from racsim.config.validate.estimate import FAULT_EVENTS_PER_S, biggest_knob, run_estimate
from racsim.config.validate.schema_check import leaves
from racsim.config.validate.study import grid_cells
from racsim.errors import ConfigError


def machine_memory_gb() -> float:
    """Physical memory of this machine in GB (8 when it cannot be told)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):
        return 8.0


def _read_number(path: str) -> Optional[float]:
    """The first number of a one-line file (a cgroup's limit or use), None if absent or 'max'."""
    try:
        with open(path) as f:
            word = f.read(64).split()[0]
        return float(word)
    except (OSError, IndexError, ValueError):
        return None


def _cgroup_headroom(proc: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> Optional[float]:
    """Bytes this process's cgroup may still take: memory.max - memory.current (v2) or
    memory.limit_in_bytes - memory.usage_in_bytes (v1); None when no limit is set or readable."""
    try:
        with open(proc) as f:
            rows = [ln.strip().split(":", 2) for ln in f if ln.count(":") >= 2]
    except OSError:
        return None
    for _, controllers, path in rows:
        v2 = controllers == ""
        if not v2 and "memory" not in controllers.split(","):
            continue
        base = root if v2 else os.path.join(root, "memory")
        limit_f, use_f = ("memory.max", "memory.current") if v2 else ("memory.limit_in_bytes", "memory.usage_in_bytes")
        for d in (base + path.rstrip("/"), base):
            limit = _read_number(os.path.join(d, limit_f))
            if limit is not None and limit < 2**60:  # v1 writes "no limit" as about 2**63
                return max(limit - (_read_number(os.path.join(d, use_f)) or 0.0), 0.0)
    return None


def _mem_available() -> Optional[float]:
    """The machine's MemAvailable (bytes), None when /proc/meminfo cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for ln in f:
                if ln.startswith("MemAvailable:"):
                    return float(ln.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def process_memory() -> Tuple[float, str]:
    """(bytes, what) this process can still allocate: the least of its address-space limit
    (RLIMIT_AS, less what it has mapped), its cgroup's limit (less its use) and the machine's
    MemAvailable; (inf, '') when none can be read."""
    found = []
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    if soft != resource.RLIM_INFINITY:
        mapped = _read_number("/proc/self/statm")
        found.append((max(soft - (mapped or 0.0) * os.sysconf("SC_PAGE_SIZE"), 0.0), "its address-space limit (RLIMIT_AS)"))
    cg = _cgroup_headroom()
    if cg is not None:
        found.append((cg, "its cgroup's memory limit"))
    avail = _mem_available()
    if avail is not None:
        found.append((avail, "the machine's available memory"))
    return min(found) if found else (math.inf, "")


def memory_budget_gb(lim: Any) -> float:
    """limits.memory_gb, or half of this machine's memory when it is null."""
    return machine_memory_gb() / 2 if lim.memory_gb is None else lim.memory_gb


def memory_room(cfg: Any) -> float:
    """Bytes a run may take: limits.memory_gb (:func:`memory_budget_gb`), at most what this
    process can still have (:func:`process_memory`)."""
    return min(memory_budget_gb(cfg.limits) * 1e9, process_memory()[0])


def runs_that_fit(cfg: Any) -> int:
    """How many runs of ``cfg`` fit in memory side by side, each at its estimated peak
    (:func:`run_estimate`), within limits.memory_gb and what this process can have; at least 1
    (:func:`check_limits` refuses a run that does not fit alone)."""
    return max(1, int(memory_room(cfg) // run_estimate(cfg)["memory"]))


def check_limits(cfg: Any) -> None:
    """Refuse, before anything starts, a run whose estimate (:func:`run_estimate`) exceeds a
    ``limits.*`` budget or the memory this process can have (:func:`process_memory`): the error
    names the knob that made it big and the budget."""
    lim = cfg.limits
    mem_gb = memory_budget_gb(lim)
    _budgets(lim)
    _counts(cfg, lim)
    est = run_estimate(cfg)
    knob = biggest_knob(est)
    if knob is not None:
        _memory(cfg, est, knob, mem_gb)
    if est["seconds"] <= lim.hours * 3600:
        return
    _too_long(cfg, est, lim.hours)


def _budgets(lim: Any) -> None:
    """The limits.* values themselves."""
    if lim.memory_gb is not None:
        positive("limits.memory_gb", lim.memory_gb, allow_inf=True)
    positive("limits.hours", lim.hours, allow_inf=True)
    int_at_least("limits.cells", lim.cells, 1)
    int_at_least("limits.capacity_counts", lim.capacity_counts, 1)
    positive("limits.file_mb", lim.file_mb, allow_inf=True)


def _counts(cfg: Any, lim: Any) -> None:
    """The runs one config makes: its grid's cells and its capacity search's counts."""
    n = grid_cells(cfg.study.grid)
    need(n <= lim.cells, "study.grid", f"{n} cells", f"at most limits.cells = {lim.cells} cells in one run "
         f"(sweep the rest with racsim -m, or raise limits.cells)")
    counts = len(cfg.capacity.counts)
    need(not cfg.capacity.enabled or counts <= lim.capacity_counts, "capacity.counts", f"{counts} counts",
         f"at most limits.capacity_counts = {lim.capacity_counts} counts (or raise it)")


def _memory(cfg: Any, est: dict, knob: str, mem_gb: float) -> None:
    """The estimate's bytes within limits.memory_gb and within what this process can have."""
    have, what = process_memory()
    way = "larger (or a smaller faults.mttr_s or faults.max_retries)" if knob.endswith(".mtbf_s") else "smaller"
    longest = (f", at a capacity search's longest run of {est['all_sizes'][knob]} steps"
               if knob == "capacity.max_steps" else "")
    needs = f"{way}: the run needs about {est['memory'] / 1e9:.3g} GB (its largest arrays: {knob}{longest})"
    need(est["memory"] <= mem_gb * 1e9, knob, node(cfg, knob),
         f"{needs} and limits.memory_gb is {mem_gb:.3g} (raise it to run anyway)")
    need(est["memory"] <= have, knob, node(cfg, knob),
         f"{needs} and this process can have about {have / 1e9:.3g} GB more ({what})")


def _too_long(cfg: Any, est: dict, hours: float) -> None:
    """Refuse a run past limits.hours, naming its failures when they make it long, else its largest size."""
    took = f"the run would take about {est['seconds'] / 3600:.3g} h"
    budget = f"and limits.hours is {hours:g} (raise it to run anyway)"
    events = sum(est["faults"].values())
    if events / FAULT_EVENTS_PER_S > est["seconds"] / 2:  # its failures make it long
        knob = max(est["faults"], key=est["faults"].get)
        raise ConfigError(knob, node(cfg, knob), f"larger (or a smaller faults.mttr_s or faults.max_retries): {took} "
                                                 f"to generate about {events:.3g} outages and retries {budget}")
    knob, value = max(est["sizes"].items(), key=lambda kv: kv[1])
    raise ConfigError(knob, value, f"smaller: {took} ({' x '.join(est['sizes'])}) {budget}")


def memory_error(cfg: Any) -> ConfigError:
    """The one-line error for a MemoryError that escaped :func:`check_limits`: the knob of the run's
    largest estimated arrays, its value, and the budgets to lower it under."""
    try:
        est = run_estimate(cfg)
        knob = biggest_knob(est)
    except Exception:  # a config the estimate cannot read: still one line
        knob = None
    if knob is None:
        return ConfigError("limits.memory_gb", cfg.limits.memory_gb, "a run that fits: this one ran out of memory")
    return ConfigError(knob, est["all_sizes"][knob], f"smaller: the run ran out of memory (about "
                       f"{est['memory'] / 1e9:.3g} GB estimated, most of it set by {knob})")


def check_data_files(cfg: Any, keys: Optional[Sequence[str]] = None) -> None:
    """Every data file the config names (empirical latency CSVs, RM profiles, probe pairs) is a
    regular file (not a FIFO or a device, which would hang or never end) within limits.file_mb;
    those at the dotted ``keys`` only, when given."""
    cap = cfg.limits.file_mb * 1e6
    for key, v in (leaves(cfg) if keys is None else ((k, node(cfg, k)) for k in keys)):
        if not (key.endswith(".path") or key.endswith(".profile") or key == "study.probe.pairs"):
            continue
        if not isinstance(v, str) or not v:
            continue
        try:
            st = os.stat(v)
        except OSError:  # missing: refused where the run reads it (common.need_file); unreadable: by its reader
            continue
        need(stat.S_ISREG(st.st_mode), key, v, "a regular file (not a folder, FIFO or device)")
        need(st.st_size <= cap, key, v, f"a file of at most limits.file_mb = {cfg.limits.file_mb:g} MB "
                                        f"(it has {st.st_size / 1e6:.3g} MB)")
        need(not _expands_past(v, cap), key, v, f"a file whose contents are at most limits.file_mb = "
                                                f"{cfg.limits.file_mb:g} MB once decompressed (this one expands past it)")


OPENERS = {".gz": "gzip", ".bz2": "bz2", ".xz": "lzma"}  # what pandas decompresses by the file's name


def _expands_past(path: str, cap: float) -> bool:
    """Whether a compressed file (by its suffix, as pandas reads it) holds more than ``cap`` bytes once
    decompressed: read through, a chunk at a time, never more than ``cap`` + one chunk (a bomb stays
    cheap to refuse). A file that does not decompress is left to its reader's own error."""
    module = OPENERS.get(os.path.splitext(path)[1].lower())
    if module is None:
        return False
    opener = importlib.import_module(module).open
    seen = 0
    try:
        with opener(path, "rb") as f:
            while seen <= cap:
                chunk = f.read(1 << 20)
                if not chunk:
                    return False
                seen += len(chunk)
    except (OSError, EOFError, ValueError):
        return False
    return True
