"""The one user-facing error type: a configuration mistake that names the key and what is allowed."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A user-facing configuration mistake: names the key and what is allowed."""

    def __init__(self, key: str, value: Any, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(" ".join(f"{key} = {value!r}: {allowed}".split()))  # one line, whatever a reader said
