"""The one user-facing error type: a configuration mistake that names the key and what is allowed."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A user-facing configuration mistake: names the key and what is allowed."""

    def __init__(self, key: str, value: Any, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(" ".join(f"{key} = {value!r}: {allowed}".split()))  # one line, whatever a reader said

    def __reduce__(self) -> tuple:
        """Pickle by the three fields, not the message (``BaseException`` would call ``ConfigError(message)``):
        a sweep job's error crosses to the sweep's process under joblib, submitit and Ray."""
        return type(self), (self.key, self.value, self.allowed), self.__dict__


class JobError(RuntimeError):
    """A sweep job's failure other than a ConfigError, as its one-line reason (racsim.sweep.job_failure):
    what crosses from the job's process to the sweep's, whatever the error was."""
