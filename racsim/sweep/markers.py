"""Completion markers of sweep jobs (``done.json``) and a job's cell.

A job's folder is complete when its marker exists, names the job's overrides,
holds the cell those overrides give, and lists at least one file, every one
present with the recorded size and SHA-256. The cell of a job is the part of
its overrides that varies across the sweep (``resume`` never is).

Ownership: racsim replaces only the files it wrote itself. Every folder it
writes into keeps ``.racsim-files``, the names it wrote there (the marker's
files count too), with the SHA-256 of those made to be read and kept (reports,
gathered tables, profiles, Hydra's ``.hydra/`` files); a file of another name,
or one of those changed since racsim wrote it, is the user's and is never
replaced unless forced (:func:`publish`).
A folder is held by one process at a time (``.racsim.lock``, :func:`hold_folder`).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

from omegaconf import DictConfig, OmegaConf

from racsim.io import file_digest, pid_alive, write_text

DONE = "done.json"  # the completion marker, written last
RESUME_KEY = "resume"  # the sweep switch (racsim.sweep.callback); never part of a job's cell


MARKER_VERSION = 1


@functools.lru_cache(maxsize=None)
def _parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


@functools.lru_cache(maxsize=65536)  # a sweep parses the same overrides for every job (about 1 ms each)
def parse_override(override: str):
    """Hydra's parse of one override, by one parser, cached (the parsed object is shared: read it only)."""
    return _parser().parse_override(override)


def override_key(override: str) -> str:
    """``'+a.b=1'`` -> ``'a.b'`` (a group override keeps its ``@package``)."""
    try:
        o = parse_override(override)
        return o.key_or_group if o.package is None else f"{o.key_or_group}@{o.package}"
    except Exception:  # not Hydra syntax: take the text before '='
        return override.split("=", 1)[0].lstrip("~+")


def cell_overrides(overrides: Iterable[str]) -> List[str]:
    """A job's overrides less the ``resume`` switch: what defines its cell."""
    return [str(o) for o in overrides if override_key(str(o)) != RESUME_KEY]


_ABSENT = object()


def cell_values(cfg: Any, overrides: Iterable[str]) -> Dict[str, Any]:
    """The value each override gave, typed as the composed config holds it (an
    int stays an int, ``.inf`` is a float); the override's text for a config
    group choice, a list or a mapping. Deletions are left out."""
    out: Dict[str, Any] = {}
    for text in overrides:
        try:
            o = parse_override(text)
        except Exception:
            out[override_key(text)] = text.split("=", 1)[-1]
            continue
        if o.is_delete():
            continue
        key = override_key(text)
        value: Any = _ABSENT
        if o.package is None:
            value = OmegaConf.select(cfg, o.key_or_group, default=_ABSENT)
        if value is _ABSENT or isinstance(value, (DictConfig, list)) or OmegaConf.is_config(value):
            value = o.get_value_element_as_str()
        out[key] = value
    return out


def read_marker(job_dir: Path) -> Optional[dict]:
    """The parsed ``done.json`` of a job folder, or None when absent or unreadable."""
    try:
        m = json.loads((Path(job_dir) / DONE).read_text())
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and isinstance(m.get("files"), dict) else None


def _same(recorded: Any, given: Any) -> bool:
    """A cell value as the marker holds it (typed by the config) against the override's own value."""
    if recorded == given or str(recorded) == str(given):
        return True
    try:
        return float(recorded) == float(given)
    except (TypeError, ValueError):
        return False


def cell_matches(marker: dict) -> bool:
    """True when the marker's ``cell`` holds exactly the values its ``overrides`` give
    (a hand-edited cell would else change the gathered table)."""
    cell, overrides = marker.get("cell"), marker.get("overrides")
    if not isinstance(cell, dict) or not isinstance(overrides, list):
        return False
    want: Dict[str, Any] = {}
    for text in overrides:
        try:
            o = parse_override(str(text))
        except Exception:
            want[override_key(str(text))] = str(text).split("=", 1)[-1]
            continue
        if o.is_delete():
            continue
        v = o.value()
        want[override_key(str(text))] = v if v is None or isinstance(v, (bool, int, float, str)) \
            else o.get_value_element_as_str()
    return set(cell) == set(want) and all(_same(cell[k], want[k]) for k in want)


def is_complete(job_dir: Path, overrides: Optional[Iterable[str]] = None) -> bool:
    """True when the job folder holds a marker that lists at least one file, every
    file it lists is there with its recorded size and SHA-256, its cell is what its
    overrides give, and (if given) its overrides are ``overrides``."""
    job_dir = Path(job_dir)
    m = read_marker(job_dir)
    if m is None or not m["files"] or not cell_matches(m):
        return False
    if overrides is not None and m.get("overrides") != cell_overrides(overrides):
        return False
    for name, meta in m["files"].items():
        p = job_dir / name
        if not isinstance(meta, dict) or Path(name).name != name or not p.is_file():
            return False
        try:
            if p.stat().st_size != meta.get("bytes") or file_digest(p)["sha256"] != meta.get("sha256"):
                return False
        except OSError:
            return False
    return True


def write_marker(job_dir: Path, written: Iterable[Path], *, overrides: List[str], cell: Dict[str, Any],
                 job: Optional[int], runtime_s: float, digests: Optional[Dict[str, dict]] = None) -> Path:
    """Write ``done.json`` listing ``written`` (``digests``: the records of those files known
    from their bytes, :func:`digest_bytes`; the others are read back)."""
    job_dir = Path(job_dir)
    known = digests or {}
    files = {Path(p).name: known.get(Path(p).name) or file_digest(Path(p)) for p in written}
    marker = {
        "racsim_marker": MARKER_VERSION,
        "job": job,
        "overrides": overrides,
        "cell": cell,
        "runtime_s": round(runtime_s, 4),
        "files": files,
    }
    path = job_dir / DONE
    write_text(path, json.dumps(marker, indent=1, sort_keys=False) + "\n")
    return path


OWNED = ".racsim-files"  # what racsim wrote in a folder (JSON: name -> SHA-256 of what it wrote, or null)
LOCK = ".racsim.lock"  # the process that holds a folder (JSON: pid, host, argv)
STAGE = ".racsim-stage-"  # the prefix of publish's staging folders


def _recorded(folder: Path) -> Dict[str, Optional[str]]:
    """``.racsim-files`` of ``folder``: name -> the SHA-256 racsim wrote (None: not recorded;
    an older folder's list of names has none)."""
    try:
        doc = json.loads((Path(folder) / OWNED).read_text())
    except (OSError, ValueError):
        return {}
    if isinstance(doc, list):
        return {n: None for n in doc if isinstance(n, str)}
    if isinstance(doc, dict):
        return {n: v if isinstance(v, str) else None for n, v in doc.items() if isinstance(n, str)}
    return {}


def _owned(folder: Path, by_marker: bool = False) -> Dict[str, Optional[str]]:
    """The files of ``folder`` that racsim wrote, each with the SHA-256 it wrote where it keeps
    one (None: owned by name alone). ``by_marker``: a complete run's files also by the SHA-256
    its done.json recorded, so that a user's edit of them makes them the user's."""
    own = _recorded(folder)
    m = read_marker(Path(folder))
    for n in [*m["files"], DONE] if m is not None else []:
        own.setdefault(n, None)
        if by_marker and own[n] is None and n in m["files"]:
            own[n] = m["files"][n].get("sha256")
    return own


def owned_names(folder: Path) -> set:
    """The files of ``folder`` that racsim wrote: its ``.racsim-files`` and a valid marker's files."""
    return set(_owned(folder))


def record_owned(folder: Path, files: Dict[str, Optional[str]]) -> None:
    """Add ``files`` (name -> SHA-256 of what racsim wrote, or None) to ``folder``'s ``.racsim-files``."""
    record = {**_recorded(folder), **files}
    write_text(Path(folder) / OWNED, json.dumps(dict(sorted(record.items()))) + "\n")


def sha256(path: Path) -> Optional[str]:
    """The SHA-256 of a file, or None when it cannot be read as one (a folder, gone)."""
    try:
        return file_digest(Path(path))["sha256"]
    except OSError:
        return None


def foreign(folder: Path, names: Iterable[str], by_marker: bool = False) -> List[str]:
    """Those of ``names`` present in ``folder`` that racsim did not write there, or that
    were changed since (their SHA-256 is not the one recorded; ``by_marker``: see :func:`_owned`)."""
    own = _owned(folder, by_marker)
    out = []
    for n in sorted(set(names)):
        p = Path(folder) / n
        if os.path.lexists(p) and (n not in own or (own[n] is not None and sha256(p) != own[n])):
            out.append(n)
    return out


def transient(name: str) -> bool:
    """Whether ``name`` is a racsim writer's file in flight: a staging folder of :func:`publish`, or
    a temporary of racsim.io.atomic_write (``.NAME.tmp-PID``)."""
    return name.startswith(STAGE) or (name.startswith(".") and ".tmp-" in name)


def _clear_stale(folder: Path, names: set) -> None:
    """Before new files of ``names`` land: take away the old marker when it is one of
    them (the folder is not complete until the new one is written), the temporary
    files of them (``.NAME.tmp-PID``, racsim.io.atomic_write) whose writer is gone, and
    the staging folders of writers of this host that are gone (killed while they wrote:
    :func:`stage_prefix`)."""
    if DONE in names and read_marker(folder) is not None:
        (folder / DONE).unlink(missing_ok=True)
    for p in folder.glob(".*.tmp-*"):
        name, _, pid = p.name[1:].rpartition(".tmp-")
        if name in names and pid.isdigit() and not pid_alive(int(pid)):
            p.unlink(missing_ok=True)
    for p in folder.glob(f"{STAGE}*@*"):
        pid, _, host = p.name[len(STAGE):].partition("@")
        if pid.isdigit() and host.rpartition("-")[0] == _host() and not pid_alive(int(pid)) and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)


def _host() -> str:
    """This host's name as a staging folder carries it (no ``/``)."""
    return socket.gethostname().replace(os.sep, "_")


def stage_prefix() -> str:
    """The name a staging folder of :func:`publish` begins with: ``.racsim-stage-PID@HOST-`` (then
    mkdtemp's letters), so that a later writer can tell one whose writer was killed."""
    return f"{STAGE}{os.getpid()}@{_host()}-"


def publish(folder: Path, write, *, force: bool = False, also: Iterable[str] = (),
            track_edits: bool = False, edits_by_marker: bool = False) -> List[Path]:
    """Write a result set into ``folder`` without touching a file racsim did not write.
    ``write(stage)`` writes into a fresh hidden folder and returns the paths it wrote;
    their names (and ``also``'s) must not clash with a file of ``folder`` that racsim
    did not write or that changed since, unless ``force``: else FileExistsError names them
    and nothing in ``folder`` changes. Then the files are moved in and recorded in
    ``.racsim-files``; with ``track_edits``, each with its SHA-256, so that a user's later edit
    makes it theirs (a report, a gathered table, a profile: files made to be read and kept; a
    job's results are judged by its marker instead, and resume reruns a damaged one; a single
    run's by its marker's digests with ``edits_by_marker``, so that a rerun into its folder
    keeps the user's edits). Returns the paths in ``folder``."""
    import tempfile

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=stage_prefix(), dir=folder))
    try:
        staged = [Path(p).name for p in write(stage)]
        names = sorted(p.name for p in stage.iterdir())
        clash = foreign(folder, [*names, *also], by_marker=edits_by_marker)
        if clash and not force:
            raise FileExistsError(f"{folder}: would replace {', '.join(clash)}, which racsim did not write "
                                  f"or which changed since it did (choose another folder, or force it)")
        _clear_stale(folder, set(names) | set(also))
        # first: a file moved in is always known as ours, with the bytes it holds
        digests = {n: sha256(stage / n) if track_edits else None for n in names}
        record_owned(folder, {**dict.fromkeys(also), **digests})
        for n in names:
            os.replace(stage / n, folder / n)
    finally:
        shutil.rmtree(stage, ignore_errors=True)  # made here, by this process
    return [folder / n for n in staged]


def _read_lock(lock: Path) -> Optional[dict]:
    try:
        doc = json.loads(lock.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _age(path: Path) -> str:
    """How long ago ``path`` was last written, as '42 s', '3.5 h'..."""
    import time

    try:
        s = max(0.0, time.time() - path.stat().st_mtime)
    except OSError:
        return "?"
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


def numbered_folders(config: DictConfig) -> bool:
    """Whether the sweep's job folders are the default ``${hydra.job.num}`` (job i's is ``sweep/i``)."""
    return OmegaConf.to_container(config.hydra.sweep, resolve=False).get("subdir") == "${hydra.job.num}"


def hold_folder(folder: Path, what: str = "run"):
    """Take ``folder`` for this process (``.racsim.lock``), or raise FileExistsError
    naming the live racsim process that holds it. A lock left by a process that is
    gone (on this host), or by this very process, is taken over without a word. Returns the
    function that gives the folder back."""
    import sys

    folder = Path(folder)
    lock = folder / LOCK
    me = {"pid": os.getpid(), "host": socket.gethostname(), "what": what, "argv": " ".join(sys.argv)}
    for _ in range(3):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            other = _read_lock(lock)
            if other is None:  # being written this instant, or not racsim's: not ours to remove
                raise FileExistsError(f"{folder} is held by {lock} (not a racsim lock?); remove it if no run uses "
                                      f"the folder") from None
            mine = other.get("host") == me["host"] and other.get("pid") == me["pid"]
            gone = other.get("host") == me["host"] and not pid_alive(other.get("pid"))
            if not (mine or gone):
                raise FileExistsError(
                    f"{folder} belongs to another racsim {other.get('what', 'run')} (pid {other.get('pid')} on "
                    f"{other.get('host')}, lock {_age(lock)} old: {other.get('argv', '?')}); wait for it, choose "
                    f"another folder, or remove {lock} if that run is gone (output.force does not override a "
                    f"live run's lock)") from None
            # racsim's own lock, of this process or of one of this host that is gone (interrupted, killed):
            # nothing to warn of, what it finished is kept and resume=true finds it (issue 49, point 3)
            lock.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        break
    else:
        raise FileExistsError(f"{folder}: could not take {lock}")

    def release() -> None:
        if _read_lock(lock) == me:
            lock.unlink(missing_ok=True)

    return release


def job_dirs(root: Path, max_depth: int = 4) -> List[Path]:
    """Job folders under ``root`` (a folder holding ``.hydra/`` or ``done.json``),
    not descending into a job, Hydra's or submitit's own folders."""
    out: List[Path] = []
    root = Path(root)
    base_depth = len(root.parts)
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if ".hydra" in dirnames or DONE in filenames:
            out.append(here)
            dirnames[:] = []
            continue
        if len(here.parts) - base_depth >= max_depth:
            dirnames[:] = []
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
    return out
