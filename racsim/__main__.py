"""``python -m racsim``: the same as the ``racsim`` command."""

from __future__ import annotations

from racsim.app.cli import main

if __name__ == "__main__":  # not when a spawned worker imports it
    main()
