"""The one user-facing error type: a configuration mistake that names the key and what is allowed."""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn, Optional


class ConfigError(ValueError):
    """A user-facing configuration mistake: names the key and what is allowed."""

    def __init__(self, key: str, value: Any, allowed: str, line: Optional[str] = None):
        """``line``: the whole message as worded elsewhere (Hydra's report of a bad override, shortened)."""
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(" ".join((line or f"{key} = {value!r}: {allowed}").split()))  # one line, whatever a reader said

    def __reduce__(self) -> tuple:
        """Pickle by the fields and the message as worded (``BaseException`` would call ``ConfigError(message)``):
        a sweep job's error crosses to the sweep's process under joblib, submitit and Ray."""
        return type(self), (self.key, self.value, self.allowed, str(self)), self.__dict__


class JobError(RuntimeError):
    """A sweep job's failure other than a ConfigError, as its one-line reason (racsim.sweep.job_failure):
    what crosses from the job's process to the sweep's, whatever the error was."""


def reason(ex: BaseException) -> str:
    """One line for a cell's failure: 'key = value: allowed', or Hydra's reason naming the key."""
    if isinstance(ex, ConfigError):
        return str(ex)
    chain, e = [], ex
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    for e in chain:
        key = getattr(e, "full_key", None)
        if key:
            return f"{key}: {str(e).splitlines()[0].strip()}"
    lines = [ln.strip() for ln in str(ex).splitlines() if ln.strip()]
    return " ".join(lines[:2]) or type(ex).__name__


class Parser(argparse.ArgumentParser):
    """argparse for racsim's commands, whose usage mistakes end in one line (``PROG: error: ...
    (PROG --help lists the options)``, exit 2) instead of argparse's usage block."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {' '.join(message.split())} ({self.prog} --help lists the options)", file=sys.stderr)
        sys.exit(2)
