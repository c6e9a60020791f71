"""Completion markers of sweep jobs (``done.json``) and a job's cell.

A job's folder is complete when its marker exists, names the job's overrides
and lists files that are all present with the recorded sizes. The cell of a job
is the part of its overrides that varies across the sweep (``resume`` never is).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

from omegaconf import DictConfig, OmegaConf

from racsim.io import write_text

DONE = "done.json"  # the completion marker, written last
RESUME_KEY = "resume"  # the sweep switch (racsim.sweep); never part of a job's cell


MARKER_VERSION = 1


@functools.lru_cache(maxsize=65536)  # a sweep parses the same overrides for every job (about 1 ms each)
def _parse(override: str):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_override(override)


def override_key(override: str) -> str:
    """``'+a.b=1'`` -> ``'a.b'`` (a group override keeps its ``@package``)."""
    try:
        o = _parse(override)
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
            o = _parse(text)
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


def _digest(path: Path) -> Dict[str, Any]:
    with open(path, "rb") as f:
        sha = hashlib.file_digest(f, "sha256").hexdigest()
    return {"bytes": path.stat().st_size, "sha256": sha}


def read_marker(job_dir: Path) -> Optional[dict]:
    """The parsed ``done.json`` of a job folder, or None when absent or unreadable."""
    try:
        m = json.loads((Path(job_dir) / DONE).read_text())
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and isinstance(m.get("files"), dict) else None


def is_complete(job_dir: Path, overrides: Optional[Iterable[str]] = None) -> bool:
    """True when the job folder holds a marker, every file it lists is there
    with its recorded size, and (if given) the marker's cell is ``overrides``."""
    job_dir = Path(job_dir)
    m = read_marker(job_dir)
    if m is None:
        return False
    if overrides is not None and m.get("overrides") != cell_overrides(overrides):
        return False
    for name, meta in m["files"].items():
        p = job_dir / name
        try:
            if p.stat().st_size != meta.get("bytes"):
                return False
        except OSError:
            return False
    return True


def write_marker(job_dir: Path, written: Iterable[Path], *, overrides: List[str], cell: Dict[str, Any],
                 job: Optional[int], runtime_s: float) -> Path:
    job_dir = Path(job_dir)
    files = {Path(p).name: _digest(Path(p)) for p in written}
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


def clear_partial(job_dir: Path) -> None:
    """Before a job (re)starts: take away its old marker and any temporary file a
    killed writer left (report.atomic_write names them ``.NAME.tmp-PID``)."""
    job_dir = Path(job_dir)
    try:
        (job_dir / DONE).unlink()
    except FileNotFoundError:
        pass
    if job_dir.is_dir():
        for p in job_dir.glob(".*.tmp-*"):
            try:
                p.unlink()
            except OSError:
                pass


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
