"""submitit's local launcher, kept in hand: its job controllers start in process groups of
their own, so that a terminal's Ctrl-C reaches racsim alone, and racsim waits for them or ends
them (racsim.sweep.callback, racsim.sweep.sweeper)."""

from __future__ import annotations

import os
from typing import Any, List

from omegaconf import DictConfig, OmegaConf

_DETACHED: List[Any] = []  # submitit_local's controller processes this process started, each in its own group


class _OwnGroup:
    """``subprocess`` for submitit's local executor (``submitit.local.local.subprocess``): its job
    controllers start in a session and process group of their own, so that a terminal's Ctrl-C
    (SIGINT to the foreground group) reaches racsim alone; racsim then ends them (:func:`end_detached`)."""

    def __getattr__(self, name: str) -> Any:
        import subprocess

        return getattr(subprocess, name)

    @staticmethod
    def Popen(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 (subprocess's name)
        import subprocess

        proc = subprocess.Popen(*args, start_new_session=True, **kwargs)
        _DETACHED.append(proc)
        return proc


def detach_submitit_local(config: DictConfig) -> None:
    """Under ``hydra/launcher=submitit_local``, start its controllers in groups of their own (:class:`_OwnGroup`)."""
    if not str(OmegaConf.select(config, "hydra.launcher._target_", default="")).endswith(".LocalLauncher"):
        return
    try:
        import submitit.local.local as local
    except ImportError:  # the launcher says so itself
        return
    local.subprocess = _OwnGroup()


def wait_detached() -> None:
    """Wait for every controller :class:`_OwnGroup` started to end (its job done or failed)."""
    while _DETACHED:
        _DETACHED.pop().wait()


def end_detached() -> None:
    """Kill the process group of every controller :class:`_OwnGroup` started that still runs (the
    controller and its job's processes: nothing else is in it). A job's files are written atomically,
    done.json last: resume reruns the jobs killed."""
    import signal

    while _DETACHED:
        proc = _DETACHED.pop()
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
