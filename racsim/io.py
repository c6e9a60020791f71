"""Writing files safely, their digests, formatting numbers: leaf helpers with no racsim imports.

Every file is written to a temporary name in the same folder and renamed into
place, so an interrupted run never leaves a half-written result behind.
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import Any, Callable, Dict


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
