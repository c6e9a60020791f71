"""Writing files safely and formatting numbers: leaf helpers with no racsim imports.

Every file is written to a temporary name in the same folder and renamed into
place, so an interrupted run never leaves a half-written result behind.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Callable


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
