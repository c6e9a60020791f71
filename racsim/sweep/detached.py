"""submitit's local launcher, kept in hand: its job controllers start in process groups of
their own, so that a terminal's Ctrl-C reaches racsim alone, and racsim waits for them or ends
them (racsim.sweep.callback, racsim.sweep.sweeper)."""

from __future__ import annotations

import os
from pathlib import Path
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
    def Popen(cmd: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N802 (subprocess's name)
        """A controller (``python -m submitit.local._local FOLDER``) in a group of its own, its own
        stderr appended to ``controllers.err`` beside the jobs' folders (its jobs log to their
        files): a controller that a Ctrl-C caught before submitit made its job's folder fails
        there, not on the terminal under racsim's one line."""
        import subprocess

        err = None
        if "stderr" not in kwargs and isinstance(cmd, list) and cmd:
            try:
                err = open(Path(str(cmd[-1])).parent / "controllers.err", "ab")
            except OSError:  # the terminal then, as submitit has it
                err = None
        try:
            proc = subprocess.Popen(cmd, *args, start_new_session=True, **({"stderr": err} if err else {}), **kwargs)
        finally:
            if err is not None:
                err.close()  # the controller holds its own copy
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


def keep_sigterm_under_ray(config: DictConfig, catch: Any) -> None:
    """Under ``hydra/launcher=ray``, call ``catch`` (racsim's SIGTERM handler) again once the
    launcher's ``ray.init`` has taken SIGTERM for itself (an exit that skips racsim's one line and
    resume hint, and Ray's native crash dump on stderr): SIGTERM then ends the sweep as Ctrl-C does,
    and Ray's local cluster shuts down with the process."""
    if not str(OmegaConf.select(config, "hydra.launcher._target_", default="")).endswith(".RayLauncher"):
        return
    try:
        from hydra_plugins.hydra_ray_launcher import _core
    except ImportError:  # the launcher says so itself
        return
    start = getattr(_core.start_ray, "racsim_start", _core.start_ray)  # the launcher's own, wrapped once

    def start_ray(init_cfg: Any) -> None:
        start(init_cfg)
        catch()

    start_ray.racsim_start = start
    _core.start_ray = start_ray
