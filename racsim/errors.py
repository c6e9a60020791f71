"""The one user-facing error type (a configuration mistake that names the key and what is allowed),
a failure in one line, and the one width every line racsim prints fits (:data:`WIDTH`, :func:`say`)."""

from __future__ import annotations

import argparse
import errno
import functools
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, NoReturn, Optional, TextIO

WIDTH = 120  # every line racsim prints fits a terminal this wide; its files hold everything


def wrapped(text: str, width: int = WIDTH) -> str:
    """``text`` with each line longer than ``width`` broken at spaces (a table fits by leaving columns
    out instead: racsim.report.tables.fitted), the continuation lines indented two spaces more than
    the line's own indent; a word longer than a line (a path) stands on a line of its own."""
    def fill(line: str) -> str:
        indent = " " * (len(line) - len(line.lstrip(" ")) + 2)
        return textwrap.fill(line, width, subsequent_indent=indent, break_on_hyphens=False, break_long_words=False)

    return "\n".join(fill(line) if len(line) > width else line for line in text.splitlines())


def say(text: str, file: Optional[TextIO] = None) -> None:
    """Print ``text`` as racsim prints every line: :func:`wrapped` to :data:`WIDTH`."""
    print(wrapped(text), file=file or sys.stdout, flush=True)


def wrote_line(prog: str, paths: list) -> str:
    """What ``prog`` wrote, by folder (``PROG: wrote into FOLDER: a.csv, b.md``): each path's folder once,
    so that a long folder does not repeat."""
    folders: dict = {}
    for p in map(Path, paths):
        folders.setdefault(p.parent, []).append(p.name)
    return "; ".join(f"{prog}: wrote into {d}: {', '.join(names)}" if i == 0 else f"into {d}: {', '.join(names)}"
                     for i, (d, names) in enumerate(folders.items())) or f"{prog}: wrote nothing"


def listed(items: list, most: int = 30) -> str:
    """``items`` joined by commas, at most ``most`` of them (then how many more)."""
    more = f" ... and {len(items) - most:,} more" if len(items) > most else ""
    return ", ".join(map(str, items[:most])) + more


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


class WriteFailure(OSError):
    """An output file that could not be written (racsim.io.atomic_write): ``filename`` is its path."""


# what only writing fails with (a full disk, a quota, a read-only file system, a file too large)
WRITE_ERRNOS = {errno.ENOSPC: "the disk is full: free some space there", errno.EDQUOT: "over the disk quota: free "
                "some space there", errno.EROFS: "a read-only file system", errno.EFBIG: "a file too large for it"}


def causes(ex: BaseException) -> list:
    """``ex`` and the exceptions it was raised from or during, innermost last."""
    chain, e = [], ex
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    return chain


def write_failure(ex: BaseException, elsewhere: str = "") -> Optional[str]:
    """One line for an output that could not be written (a :class:`WriteFailure`, or an error that only
    writing raises, as Hydra's own files may): the folder (the nearest not hidden: racsim stages files in a
    hidden one inside it), why, and what to do (``elsewhere``: how to write to another folder, e.g.
    ``hydra.run.dir=DIR``); None for any other error."""
    e = next((e for e in causes(ex) if isinstance(e, WriteFailure) or (isinstance(e, OSError) and e.errno in
                                                                       WRITE_ERRNOS)), None)
    if e is None:
        return None
    where = next((d for d in Path(e.filename).parents if not d.name.startswith(".")), None) if e.filename else None
    what = WRITE_ERRNOS.get(e.errno, "make it writable")
    other = f"or write to another folder ({elsewhere})" if elsewhere else "or write to another folder"
    return (f"cannot write {Path(e.filename).name if e.filename else 'a file'} into {where or 'the output folder'} "
            f"({e.strerror or e}): {what}, {other}; nothing there was replaced")


def reason(ex: BaseException) -> str:
    """One line for a cell's failure: 'key = value: allowed', a file that could not be written, or
    Hydra's reason naming the key."""
    if isinstance(ex, ConfigError):
        return str(ex)
    chain = causes(ex)
    wrote = write_failure(ex)
    if wrote:
        return wrote
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
        say(f"{self.prog}: error: {' '.join(message.split())} ({self.prog} --help lists the options)", sys.stderr)
        sys.exit(2)


def exit_interrupted(code: int = 130) -> NoReturn:
    """``sys.exit(code)`` once an interrupt is answered. Under ``python -m``, CPython 3.11 ends the
    process by SIGINT itself (status -2, whatever the code) when a KeyboardInterrupt ended any ``exec``
    of a string during the run, even one caught (dataclasses and namedtuple make their methods so, on
    first import); each string ``exec`` clears that mark, so one is run here."""
    exec("None")
    sys.exit(code)


def interruptible(prog: str, what: str = "interrupted") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A command's ``main``: a Ctrl-C ends it with one line (``PROG: WHAT``) on stderr and exit 130, a
    second one while it ends is ignored; no traceback."""
    def wrap(main: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(main)
        def command(*args: Any, **kwargs: Any) -> Any:
            try:
                return main(*args, **kwargs)
            except KeyboardInterrupt:
                try:
                    signal.signal(signal.SIGINT, signal.SIG_IGN)
                except ValueError:  # not the main thread
                    pass
                say(f"{prog}: {what}", sys.stderr)
                exit_interrupted(130)
        return command
    return wrap
