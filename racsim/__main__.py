"""``python -m racsim``: the same as the ``racsim`` command."""

from __future__ import annotations

from racsim.app.cli import main

main()
