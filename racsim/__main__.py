"""``python -m racsim`` and the ``racsim`` command (pyproject's console script): Ctrl-C is answered
from the first instant. Until the command's own handling takes over (racsim.app.cli.main, once
Hydra and the simulator are imported), a Ctrl-C ends the command with one line and exit 130, not
a KeyboardInterrupt traceback from inside an import."""

from __future__ import annotations

import os
import signal
import sys
import time

STARTED = time.perf_counter()  # the command's start: the times it prints are what its user waited


def _starting(signum, frame) -> None:
    sys.stderr.write("racsim: interrupted while starting: nothing was run, nothing written\n")
    sys.stderr.flush()
    os._exit(130)


def main() -> None:
    """The command: ``racsim.app.cli.main``, imported with Ctrl-C answered by :func:`_starting`."""
    signal.signal(signal.SIGINT, _starting)
    from racsim.app.cli import main as command  # lazy: the heavy import, under the handler above

    signal.signal(signal.SIGINT, signal.default_int_handler)  # a KeyboardInterrupt, which the command handles
    command(started=STARTED)


if __name__ == "__main__":  # not when a spawned worker imports it
    main()
