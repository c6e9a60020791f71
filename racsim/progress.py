"""What moves while racsim computes: one progress model for every run, search, sweep and tool.

Work is a series of phases, named up front (:meth:`Progress.plan`; ``tail``: those that always
come last, as writing a run's files). Each phase announces its total as it starts
(:meth:`Progress.start`: counts, trials, variants, replicated steps, jobs), an upper bound when
``upto`` (a search that may stop early: the phase then ends short of it, and says so). A total
that must grow is announced as a new total with its reason (:meth:`Progress.grow`; work past
the total grows it the same way), so the count never passes it. The share shown never passes
100%, and reads at most 99% while the phase runs (once every unit is done and the phase still runs,
"finishing"). The time left is the current phase's: its
units left at its pace so far (or, for a sweep, the estimate its job counter gives).

Shown on stderr: on a terminal as one line redrawn in place, its clock moving between updates
(a thread redraws it every :data:`REDRAW_S`), taken away at the end; through a pipe as lines:
each one the work asks for (a count evaluated, a run doubled, a sweep's jobs moving), and once
the work has run :data:`QUIET_S` (before, held back: said then if it still runs), one as each
phase starts, at each tenth of it and as it ends;
whatever runs inside one unit, a line at least every :data:`EVERY_S` seconds says where the phase
stands and what runs. ``mode="off"`` (``output.progress=false``) shows nothing and keeps the count.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, TextIO

from racsim.errors import WIDTH, say

EVERY_S = 10.0  # through a pipe: the longest silence while a phase runs
QUIET_S = 2.0  # through a pipe: before the work has run this long, only the lines it asks for
REDRAW_S = 0.5  # on a terminal: how often the line is redrawn (its clock, a poll)
BAR = 20  # characters of the bar


def hms(seconds: float) -> str:
    """``m:ss``, or ``h:mm:ss`` from an hour on."""
    s = max(0, int(round(seconds)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def terminal_width(stream: TextIO) -> int:
    """Columns of the terminal ``stream`` writes to: ``COLUMNS`` when set (as shutil honours it), else the
    size of ``stream``'s own terminal (a bar drawn on stderr: not stdout's, which may be another terminal
    or a pipe), else :data:`~racsim.errors.WIDTH`."""
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(stream.fileno()).columns or WIDTH
    except (AttributeError, OSError, ValueError):  # not a file, not a terminal, closed
        return WIDTH


@dataclass
class Phase:
    """One phase: ``done`` of ``total`` units (``upto``: a bound the phase may stop short of; None:
    not known, as a sweep's under another sweeper)."""

    name: str
    total: Optional[int]
    unit: str
    started: float
    upto: bool = False
    done: int = 0
    ended: Optional[float] = None
    left_s: Optional[float] = None  # an estimate the phase's owner gives (a sweep's), else from its pace

    def units(self, n: int) -> str:
        return f"{n:,} {self.unit}{'' if n == 1 else 's'}"

    def percent(self) -> int:
        """The share done, in whole percent: at most 99 while the phase runs."""
        if self.total is None:
            return 0
        pct = 100 * min(self.done, self.total) // max(self.total, 1)
        return pct if self.ended is not None else min(pct, 99)

    def share(self) -> str:
        """The share done as shown: ``N%`` (:meth:`percent`), or ``finishing`` once every unit is done while
        the phase still runs (what comes after its last unit: never "1,000/1,000 (99%)")."""
        running_on = self.ended is None and self.total is not None and self.done >= self.total > 0
        return "finishing" if running_on else f"{self.percent()}%"

    def left(self, now: float) -> Optional[float]:
        """Seconds left: the owner's estimate, else the units left at the phase's pace so far."""
        if self.ended is not None:
            return None
        if self.left_s is not None:
            return self.left_s
        spent = now - self.started
        if self.done <= 0 or spent <= 0 or self.total is None:
            return None
        return max(self.total - self.done, 0) * spent / self.done


class Progress:
    """The progress of one piece of work titled ``title`` (a run's name, ``sweep``), its lines headed ``prog``.

    ``mode``: ``auto`` (a redrawn line on a terminal, lines through a pipe), ``bar``, ``lines`` or
    ``off``; ``stream``: where it writes (stderr); ``every_s``: through a pipe, the longest silence;
    ``quiet_s``: through a pipe, before the work has run that long, only the lines it asks for (quick
    work says little; what it held back is said at the first tick past it, if the work still runs);
    ``poll(progress)``: called at each tick to refresh the count from outside (a sweep's folder);
    ``clock``: the time (a fake one in tests); ``ticking``: a thread ticks (tests call :meth:`tick`)."""

    def __init__(self, title: str = "", *, prog: str = "racsim", mode: str = "auto", stream: Optional[TextIO] = None,
                 every_s: float = EVERY_S, quiet_s: float = QUIET_S, tail: Sequence[str] = (),
                 poll: Optional[Callable[["Progress"], None]] = None, clock: Callable[[], float] = time.monotonic,
                 ticking: bool = True):
        if mode not in ("auto", "bar", "lines", "off"):
            raise ValueError(f"mode = {mode!r}: auto, bar, lines or off")
        self.stream = stream if stream is not None else sys.stderr
        if mode == "auto":
            mode = "bar" if getattr(self.stream, "isatty", lambda: False)() else "lines"
        self.title, self.prog, self.mode, self.every_s, self.quiet_s = title, prog, mode, float(every_s), quiet_s
        self.poll, self.clock = poll, clock
        self.born = clock()
        self.order: List[str] = list(tail)  # the phases' names, in order: planned ones go before the tail
        self.tail = len(self.order)
        self.phase: Optional[Phase] = None
        self.what = ""  # what runs now (the last note)
        self._lock = threading.RLock()
        self._last = clock()  # when something was last written
        self._tenth = 0
        self._owed = False  # a line held back while the work was young (quiet_s), owed at the next tick
        self._spoke = False  # a line of the running phase was written: its end is written too
        self._drawn = 0  # the bar's width on the terminal
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._ticking = ticking and mode != "off"

    @classmethod
    def off(cls) -> "Progress":
        """A progress that counts and shows nothing (a caller that asked for none)."""
        return cls(mode="off", ticking=False)

    # -- what the work says
    def plan(self, *names: str, last: bool = False) -> None:
        """The phases to come, in order, before the tail; a name planned already stays where it is.
        ``last``: they join the tail, after whatever is planned later (a search's sensitivity table,
        planned before the search plans its own phases)."""
        with self._lock:
            for name in names:
                if name not in self.order:
                    self.order.insert(len(self.order) - self.tail, name)
                    self.tail += last

    def start(self, name: str, total: Optional[int], unit: str = "step", *, upto: bool = False,
              note: str = "") -> None:
        """Begin phase ``name`` of ``total`` ``unit``s (``upto``: at most that many; None: a total not
        known); the phase before ends (the same phase started again before any unit: its total restated)."""
        with self._lock:
            p = self.phase
            if p is not None and p.ended is None and not (p.name == name and p.done == 0):
                self.finish()
            if name not in self.order:
                self.plan(name)
            began = p.started if p is not None and p.ended is None else self.clock()
            self.phase = Phase(name, None if total is None else max(int(total), 0), unit, began, upto)
            self.what, self._tenth, self._spoke = note, 0, False
            self._show("start")
        if self._ticking and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="racsim-progress", daemon=True)
            self._thread.start()

    def advance(self, k: int = 1, note: str = "") -> None:
        """``k`` more units done; ``note``: what they found (a line of its own through a pipe)."""
        with self._lock:
            if self.phase is not None:  # what ran is done: its note, or none, replaces what runs
                self.update(self.phase.done + k, note, line=bool(note))

    def update(self, done: int, note: Optional[str] = None, line: bool = False,
               left_s: Optional[float] = None) -> None:
        """``done`` units done in all (work past the total grows it, said so); ``note``: what runs
        now (``line``: a line of its own through a pipe); ``left_s``: the owner's estimate of the time left."""
        with self._lock:
            p = self.phase
            if p is None or p.ended is not None:
                return
            p.done = max(int(done), 0)
            if p.total is not None and p.done > p.total:
                planned, p.total = p.total, p.done
                self._say_grown(f"more than the {p.units(planned)} planned")
            p.left_s = left_s
            if note is not None:
                self.what = note
            tenth = 0 if p.total is None else 10 * min(p.done, p.total) // max(p.total, 1)
            self._show("said" if line else "tenth" if tenth > self._tenth else "update")
            self._tenth = max(self._tenth, tenth)

    def grow(self, more: int, why: str, upto: Optional[bool] = None) -> None:
        """The phase's total grows by ``more`` units, for the reason ``why`` (``upto``: it is now a bound)."""
        with self._lock:
            p = self.phase
            if p is None or p.ended is not None or p.total is None or more <= 0:
                return
            p.total += int(more)
            if upto is not None:
                p.upto = upto
            self._tenth = 10 * min(p.done, p.total) // max(p.total, 1)
            self._say_grown(why)

    def note(self, text: str, line: bool = False) -> None:
        """What runs now (on the bar; through a pipe in the next line, or a line of its own with ``line``)."""
        with self._lock:
            self.what = text
            self._show("said" if line else "update")

    def finish(self, note: str = "") -> None:
        """The phase ends (an ``upto`` phase may end short of its total: said so)."""
        with self._lock:
            p = self.phase
            if p is None or p.ended is not None:
                return
            p.ended = self.clock()
            self.what = note
            self._show("end")

    def say(self, text: str, stream: Optional[TextIO] = None) -> None:
        """Print ``text`` (racsim.errors.say, on stdout) past the bar: it is taken away, then drawn again below."""
        with self._lock:
            self._erase()
            say(text, stream or sys.stdout)
            if self.mode == "bar" and self.phase is not None and self.phase.ended is None:
                self._draw()

    def tick(self) -> None:
        """Refresh from outside (``poll``), redraw the bar, and through a pipe write the state when
        nothing was written for ``every_s`` seconds while a phase runs, or a line held back is owed."""
        if self.poll is not None:
            self.poll(self)
        with self._lock:
            if self.phase is None or self.phase.ended is not None:
                return
            if self.mode == "bar":
                self._draw()
            elif self.mode == "lines" and (self.clock() - self._last >= self.every_s or
                                           (self._owed and self.clock() - self.born >= self.quiet_s)):
                self._write()

    def stop(self) -> None:
        """Stop ticking (the thread ends; what the work says is still shown)."""
        self._stop.set()
        t = self._thread  # not alive: ended, or a Ctrl-C came while it started (it ends on its own)
        if t is not None and t is not threading.current_thread() and t.is_alive():
            t.join(timeout=2 * REDRAW_S + 1)

    def close(self) -> None:
        """Stop ticking and take the bar away (what the work printed stays); nothing more is written."""
        self.stop()
        with self._lock:
            self._erase()
            self.mode = "off"

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- what is shown
    def text(self, now: Optional[float] = None) -> str:
        """The state in one line: the phase and its place, units done of the total, the time spent
        and left, and what runs."""
        head, body, note = self._parts(now)
        return f"{head}: {body}{note}"

    def bar(self, now: Optional[float] = None, width: Optional[int] = None) -> str:
        """The terminal's line: :meth:`text` with a bar of the phase's share, cut to ``width``."""
        width = width or min(terminal_width(self.stream), WIDTH)
        head, body, note = self._parts(now)
        p = self.phase
        if p is not None and p.total is not None and (p.total > 1 or p.unit != "step"):
            filled = BAR * min(p.done, p.total) // max(p.total, 1)
            head = f"{head} |{'#' * filled}{' ' * (BAR - filled)}|"
        else:
            head += ":"
        text = f"{head} {body}{note}"
        return text if len(text) < width else text[:max(width - 4, 0)] + "..."

    def _parts(self, now: Optional[float]) -> tuple:
        """(where: the title, the phase and its place; how far: units and times; `` - what runs``)."""
        now = self.clock() if now is None else now
        p = self.phase
        head = f"{self.prog}: {self.title}" if self.title else self.prog
        if p is None:
            return head, "starting", ""
        n = len(self.order)
        where = p.name if n <= 1 else f"{p.name} ({self.order.index(p.name) + 1}/{n})"
        head = f"{head}: {where}" if where != self.title else head
        parts = []
        if p.total is None:
            parts.append(p.units(p.done))
        elif p.total > 1 or p.unit != "step":
            if p.ended is not None and p.upto and p.done < p.total:
                parts.append(f"{p.units(p.done)} of at most {p.total:,} needed")
            elif p.upto:
                parts.append(f"{p.done:,} of at most {p.units(p.total)} ({p.share()})")
            else:
                parts.append(f"{p.done:,}/{p.units(p.total)} ({p.share()})")
        if p.ended is not None:
            parts.append(f"done in {hms(p.ended - p.started)}")
        else:
            spent = hms(now - p.started)
            if parts:
                parts[-1] += f" in {spent}"
            else:
                parts.append(f"running for {spent}")
            left = p.left(now)
            if left is not None:
                parts.append(f"{'at most ' if p.upto and p.left_s is None else '~'}{hms(left)} left")
        return head, ", ".join(parts), f" - {self.what}" if self.what else ""

    def _say_grown(self, why: str) -> None:
        p = self.phase
        self.what = f"total now {p.units(p.total)}{' at most' if p.upto else ''}: {why}"
        self._show("said")

    def _show(self, event: str) -> None:
        """Draw the bar (an update at most every 0.1 s), or write a line: each one the work says
        (``said``), the end of a phase that wrote a line, and once the work has run ``quiet_s``, each
        phase's start, tenths and end."""
        if self.mode == "bar":
            if event != "update" or self.clock() - self._last >= 0.1:
                self._draw()
        elif self.mode == "lines" and event != "update":
            if event == "said" or (event == "end" and self._spoke) or self.clock() - self.born >= self.quiet_s:
                self._write()
            else:  # written at the first tick past quiet_s, if the work still runs
                self._owed = True

    def _write(self) -> None:
        say(self.text(), self.stream)
        self._owed, self._spoke = False, True
        self._last = self.clock()

    def _draw(self) -> None:
        line = self.bar()
        self.stream.write("\r" + line + " " * max(self._drawn - len(line), 0))
        self.stream.flush()
        self._drawn = len(line)
        self._last = self.clock()

    def _erase(self) -> None:
        if self.mode == "bar" and self._drawn:
            self.stream.write("\r" + " " * self._drawn + "\r")
            self.stream.flush()
            self._drawn = 0

    def _run(self) -> None:
        every = REDRAW_S if self.mode == "bar" else min(1.0, self.every_s / 4)
        while not self._stop.wait(every):
            try:
                self.tick()
            except Exception:  # a closed stream, a folder gone: progress never ends the work
                return

